"""Placer fingerprints: the placer's module and the modules of its own package it imports, nothing else."""

from __future__ import annotations

import pytest

from suite.placer import _entry_points
from suite.placer_code import _module_file, fingerprint, module_closure, placer_code


@pytest.fixture
def package(tmp_path, monkeypatch):
    """pkgx: a imports b (relative) and json; b imports pkgx.c.d (absolute); e is imported by nobody."""
    root = tmp_path / "pkgx"
    (root / "c").mkdir(parents=True)
    files = {
        "__init__": root / "__init__.py",
        "a": root / "a.py",
        "b": root / "b.py",
        "c": root / "c" / "__init__.py",
        "d": root / "c" / "d.py",
        "e": root / "e.py",
    }
    texts = {"__init__": "", "a": "import json\nfrom . import b\n", "b": "from pkgx.c.d import f\n", "c": "",
             "d": "def f():\n    return 1\n", "e": "x = 1\n"}
    for key, path in files.items():
        path.write_text(texts[key])
    monkeypatch.syspath_prepend(str(tmp_path))
    return files


def test_the_closure_follows_imports_within_the_package_only(package):
    closure = module_closure("pkgx.a", package["a"])
    assert sorted(closure) == ["pkgx", "pkgx.a", "pkgx.b", "pkgx.c", "pkgx.c.d"]  # not json, not pkgx.e
    assert closure["pkgx.c.d"] == package["d"] and _module_file("pkgx.c") == package["c"]


def test_the_fingerprint_changes_with_an_imported_module_and_not_with_others(package):
    before = fingerprint("pkgx.a", package["a"])
    assert len(before) == 12 and fingerprint("pkgx.a", package["a"]) == before
    package["e"].write_text("x = 2\n")
    assert fingerprint("pkgx.a", package["a"]) == before
    package["d"].write_text("def f():\n    return 2\n")
    assert fingerprint("pkgx.a", package["a"]) != before


def test_every_installed_placer_has_a_fingerprint():
    codes = {name: placer_code(name) for name in _entry_points()}  # not placers other tests registered
    assert len(codes) >= 12
    assert all(code and len(code) == 12 for code in codes.values()), codes
    assert "rl.grouping" in module_closure("rl.seq2seq", _module_file("rl.seq2seq"))
    assert placer_code("no_such_placer") is None
