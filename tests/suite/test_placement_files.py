"""A saved placement belongs to one workload and cluster: loading it elsewhere is an error, not a guess."""

from __future__ import annotations

import json

import pytest

from suite import load_cluster
from suite.errors import PlacementError
from suite.graph import Op, OpGraph
from suite.placement import load_placement, save_placement, validate


def _graph(name: str = "three", flops: float = 1e9) -> OpGraph:
    ops = [Op(f"o{i}", "matmul", flops=flops, output_bytes=10) for i in range(3)]
    return OpGraph.build(name, ops, [("o0", "o1"), ("o1", "o2")])


@pytest.fixture
def saved(tmp_path):
    g, c = _graph(), load_cluster("haswell_2k80")
    return g, c, save_placement(validate([0, 1, 1], g, c), g, c, tmp_path / "p.json")


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("workload", "other", "workload is 'other', but this is 'three'"),
        ("workload_hash", "0" * 64, "workload_hash is '0000"),
        ("cluster", "xeon_h100", "cluster is 'xeon_h100', but this is 'haswell_2k80'"),
        ("format", "placebench.opgraph", "format is 'placebench.opgraph'"),
    ],
)
def test_a_placement_saved_for_something_else_is_refused(saved, field, value, message):
    g, c, path = saved
    assert load_placement(path, g, c).tolist() == [0, 1, 1]
    data = json.loads(path.read_text())
    data[field] = value
    path.write_text(json.dumps(data))
    with pytest.raises(PlacementError, match=f"p.json: {message}"):
        load_placement(path, g, c)


def test_a_changed_graph_with_the_same_name_is_refused(saved):
    g, c, path = saved
    with pytest.raises(PlacementError, match="workload_hash"):
        load_placement(path, _graph(flops=2e9), c)


@pytest.mark.parametrize("raw", ["gpu:0", b"\x00\x01\x01", "abc"])
def test_a_string_is_not_a_placement(raw):
    with pytest.raises(PlacementError, match="must be a sequence of device indices or names, got (str|bytes)"):
        validate(raw, _graph(), load_cluster("haswell_2k80"))


def test_unreadable_files_are_placement_errors(tmp_path):
    g, c = _graph(), load_cluster("haswell_2k80")
    bad = tmp_path / "bad.json"
    bad.write_bytes(b'{"placement": ["\xff"]}')
    with pytest.raises(PlacementError, match=r"bad\.json: not valid UTF-8 text \(byte 0xff"):
        load_placement(bad, g, c)
    with pytest.raises(PlacementError, match="cannot read the placement file"):
        load_placement(tmp_path, g, c)
    bad.write_text('{"placement": [1' + "0" * 5000 + "]}")  # json's ValueError, not a JSONDecodeError
    with pytest.raises(PlacementError, match=r"bad\.json: not valid JSON: Exceeds the limit"):
        load_placement(bad, g, c)


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"placement": [1e300, 0, 0]}', r"placement\[0\] \(op 'o0'\): device 1e\+300 does not exist"),
        ('{"placement": [0, 1%s, 0]}' % ("0" * 400), r"placement\[1\] \(op 'o1'\): device an integer of about 401 "
                                                      r"digits does not exist"),
        ('{"placement": [0, 1, 1], "schema_version": 1%s}' % ("0" * 400), "schema_version an integer of about 401"),
        ('{"placement": [0, 1, 1], "workload": 1%s}' % ("0" * 400), "workload is an integer of about 401 digits"),
        ('{"placement": null}', "field 'placement' is null, not a list of devices or an object of op name -> device"),
        ("null", "the file is null"),
        ('{"workload": "three"}', "no field 'placement'"),
    ],
)
def test_a_bad_placement_file_is_named_in_one_short_line(tmp_path, text, message):
    """A huge number is shown by its size (not hundreds of digits), and a null placement is called null."""
    path = tmp_path / "p.json"
    path.write_text(text)
    with pytest.raises(PlacementError, match=r"p\.json: .*" + message) as info:
        load_placement(path, _graph(), load_cluster("haswell_2k80"))
    assert len(str(info.value)) < 200
