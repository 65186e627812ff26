"""Workload and cluster references: a preset or zoo name, or a file, also one in the current directory."""

from __future__ import annotations

import pytest

from suite import cluster, registry
from suite.errors import ClusterError, PlacebenchError, UnknownNameError


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


def test_a_graph_file_without_a_suffix_in_the_current_directory_is_a_file(tiny_files, tmp_path, monkeypatch):
    """A name that is an existing file is loaded as one, even without a .json or .gz suffix."""
    (tmp_path / "mygraph").write_bytes(tiny_files["diamond"].read_bytes())
    monkeypatch.chdir(tmp_path)
    assert registry.load_workload("mygraph").name == "diamond"


def test_a_name_with_a_plus_is_a_shape_variant_of_a_zoo_workload():
    """Read as `WORKLOAD+KEY=VALUE` (checked before any capture), not as a zoo name with a '+' in it."""
    with pytest.raises(PlacebenchError, match=r"^workload 'nmt-2x1024-b64\+batch_size=0': shape parameter "
                                              r"batch_size=0 must be a positive integer$"):
        registry.load_workload("nmt-2x1024-b64+batch_size=0")
    with pytest.raises(UnknownNameError, match=r"^unknown workload 'nope'; zoo workloads: "):
        registry.load_workload("nope+batch_size=1")


def test_a_preset_named_otherwise_than_its_file_is_refused(tiny_files, tmp_path, monkeypatch):
    """Rows name a cluster by its `name`: `-c other` loading a cluster named 'tiny' would file them under 'tiny'."""
    (tmp_path / "other.toml").write_bytes(tiny_files["cluster"].read_bytes())
    (tmp_path / "tiny.toml").write_bytes(tiny_files["cluster"].read_bytes())
    monkeypatch.setattr(cluster, "PRESET_DIR", tmp_path)
    assert registry.load_cluster("tiny").name == "tiny"
    with pytest.raises(ClusterError, match=r"other\.toml: name = 'tiny', but a preset's name must be its file name "
                                           r"\('other'\)$"):
        registry.load_cluster("other")
