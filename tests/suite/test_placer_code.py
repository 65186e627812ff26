"""Placer fingerprints: the placer's module and the modules of its own package it imports, nothing else."""

from __future__ import annotations

import pytest

from suite import runner
from suite.placer import _entry_points, unregister_placer
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


def test_modules_named_by_literal_import_calls_are_followed(package):
    """`importlib.import_module` and `__import__` with a string literal (absolute, or relative to the
    caller's package) are imports too; a name built at run time cannot be read and is not followed."""
    package["a"].write_text('import importlib\nimportlib.import_module("pkgx.e")\n')
    assert sorted(module_closure("pkgx.a", package["a"])) == ["pkgx", "pkgx.a", "pkgx.e"]
    package["a"].write_text('from importlib import import_module\nimport_module(".c.d", __package__)\n')
    assert sorted(module_closure("pkgx.a", package["a"])) == ["pkgx", "pkgx.a", "pkgx.c", "pkgx.c.d"]
    package["a"].write_text('__import__("pkgx.b")\n')
    assert sorted(module_closure("pkgx.a", package["a"])) == ["pkgx", "pkgx.a", "pkgx.b", "pkgx.c", "pkgx.c.d"]
    package["a"].write_text('import importlib\nname = "e"\nimportlib.import_module(f"pkgx.{name}")\n')
    assert sorted(module_closure("pkgx.a", package["a"])) == ["pkgx", "pkgx.a"]
    package["a"].write_text('import importlib\nimportlib.import_module("json")\n')  # another package: not followed
    assert sorted(module_closure("pkgx.a", package["a"])) == ["pkgx", "pkgx.a"]
    package["a"].write_text('import importlib\nimportlib.import_module(None)\n__import__(b"pkgx.e")\n')  # not a name
    assert sorted(module_closure("pkgx.a", package["a"])) == ["pkgx", "pkgx.a"]
    before = fingerprint("pkgx.a", package["a"])
    package["a"].write_text('import importlib\nimportlib.import_module("pkgx.e")\n')
    with_e = fingerprint("pkgx.a", package["a"])
    package["e"].write_text("x = 2\n")  # e is now part of a's fingerprint
    assert len({before, with_e, fingerprint("pkgx.a", package["a"])}) == 3


def test_a_module_that_does_not_parse_is_hashed_not_followed(package):
    package["b"].write_text("def broken(:\n")
    closure = module_closure("pkgx.a", package["a"])
    assert sorted(closure) == ["pkgx", "pkgx.a", "pkgx.b"]  # b is in, its imports are not
    before = fingerprint("pkgx.a", package["a"])
    package["b"].write_text("def broken(:\n    pass\n")
    assert fingerprint("pkgx.a", package["a"]) != before


def test_a_placer_module_includes_its_parent_packages(package):
    """Importing pkgx.c.d runs pkgx/__init__.py and pkgx/c/__init__.py first."""
    assert sorted(module_closure("pkgx.c.d", package["d"])) == ["pkgx", "pkgx.c", "pkgx.c.d"]



def test_a_relative_import_in_a_packages_init_is_relative_to_that_package(package):
    """In pkgx/c/__init__.py, `from .d import f` names pkgx.c.d (the package itself), not pkgx.d."""
    package["c"].write_text("from .d import f\n")
    package["a"].write_text("import pkgx.c\n")
    assert sorted(module_closure("pkgx.a", package["a"])) == ["pkgx", "pkgx.a", "pkgx.c", "pkgx.c.d"]
    before = fingerprint("pkgx.a", package["a"])
    package["d"].write_text("def f():\n    return 2\n")
    assert fingerprint("pkgx.a", package["a"]) != before

PLUGIN = """from suite.placer import BasePlacer, register_placer


@register_placer("file_plugin_placer")
class FilePlugin(BasePlacer):
    def place(self, problem, budget, seed):
        return {}
"""


def test_a_placer_from_a_plugin_file_has_a_fingerprint(tmp_path):
    plugin = tmp_path / "one" / "myplug.py"
    plugin.parent.mkdir()
    plugin.write_text(PLUGIN)
    try:
        runner.load_plugins([str(plugin)])
        code = placer_code("file_plugin_placer")
    finally:
        unregister_placer("file_plugin_placer")
        runner._PLUGINS.pop(str(plugin), None)
    assert code and code == fingerprint("anything", plugin)  # the plugin's own module name is not hashed
    moved = tmp_path / "two" / "myplug.py"
    moved.parent.mkdir()
    moved.write_text(PLUGIN)
    assert fingerprint("placebench_plugin_myplug_other", moved) == code  # same code elsewhere: same print
    moved.write_text(PLUGIN.replace("return {}", "return {'changed': 1}"))
    assert fingerprint("placebench_plugin_myplug_other", moved) != code
