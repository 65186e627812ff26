"""Workload and cluster references: a preset or zoo name, or a file, also one in the current directory."""

from __future__ import annotations

import pytest

from suite import registry
from suite.errors import UnknownNameError


def test_a_file_in_the_current_directory_is_a_file_not_a_name(tiny_files, tmp_path, monkeypatch):
    """`-c mine.toml` in the directory that holds it: a file (a .toml, .json or .gz name), not a preset name."""
    (tmp_path / "mine.toml").write_bytes(tiny_files["cluster"].read_bytes())
    (tmp_path / "w.json").write_bytes(tiny_files["diamond"].read_bytes())
    monkeypatch.chdir(tmp_path)
    assert registry.load_cluster("mine.toml").name == "tiny"
    assert registry.load_workload("w.json").name == "diamond"
    assert registry.load_cluster("haswell_2k80").name == "haswell_2k80"
    with pytest.raises(UnknownNameError, match="unknown cluster 'mine'; presets: "):
        registry.load_cluster("mine")
