"""Graph IR: validation errors name what is wrong, canonical order, statistics, JSON round trip and hash."""

import gzip
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from suite import Op, OpGraph, graph_io
from suite.errors import GraphError


def diamond() -> OpGraph:
    ops = [
        Op("a", "matmul", flops=10.0, output_bytes=4, param_bytes=100),
        Op("b", "relu", flops=1.0, output_bytes=4),
        Op("c", "matmul", flops=20.0, output_bytes=8, param_bytes=50),
        Op("d", "add", flops=2.0),
    ]
    return OpGraph.build("diamond", ops, [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")], {"model": "toy"})


def test_stats_by_hand():
    s = diamond().stats
    assert (s.num_ops, s.num_edges) == (4, 4)
    assert s.average_degree == 2.0  # 2 * 4 / 4
    assert s.total_flops == 33.0
    assert s.param_bytes == 150
    assert s.critical_path_ops == 3
    assert s.critical_path_flops == 32.0  # a -> c -> d = 10 + 20 + 2


def test_canonical_order_is_topological_and_smallest_index_first():
    ops = [Op("d", "x"), Op("c", "x"), Op("b", "x"), Op("a", "x")]
    g = OpGraph.build("rev", ops, [("a", "b"), ("b", "c"), ("c", "d")])
    assert [op.name for op in g.ops] == ["a", "b", "c", "d"]
    g2 = OpGraph.build("free", [Op("y", "x"), Op("x", "x")], [])
    assert [op.name for op in g2.ops] == ["y", "x"]  # no constraint: file order is kept


def test_edge_defaults_to_producer_output_bytes():
    g = diamond()
    assert {(g.ops[e.src].name, g.ops[e.dst].name): e.bytes for e in g.edges}[("c", "d")] == 8


def test_cycle_is_named():
    ops = [Op("a", "x"), Op("b", "x"), Op("c", "x"), Op("z", "x")]
    with pytest.raises(GraphError, match=r"cycle: (a -> b -> c -> a|b -> c -> a -> b|c -> a -> b -> c)"):
        OpGraph.build("cyc", ops, [("z", "a"), ("a", "b"), ("b", "c"), ("c", "a")])
    with pytest.raises(GraphError, match="self-loop on op 'a'"):
        OpGraph.build("self", ops, [("a", "a")])


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("flops", -1.0, "ops\\[0\\] 'a'.flops: -1.0 is negative"),
        ("flops", math.nan, "'a'.flops: nan is not a finite number"),
        ("flops", math.inf, "'a'.flops: inf is not a finite number"),
        ("output_bytes", -5, "'a'.output_bytes: -5 is negative"),
        ("param_bytes", 1.5, "not a whole number of bytes"),
        ("bytes_read", "3", "expected a number"),
        ("phase", "sideways", "'a'.phase: 'sideways' is not one of"),
        ("allowed_kinds", ("tpu",), "'a'.allowed_kinds: 'tpu'"),
    ],
)
def test_bad_numbers_and_fields_are_named(field, value, message):
    with pytest.raises(GraphError, match=message):
        OpGraph.build("bad", [Op("a", "x", **{field: value})], [])


def test_unknown_endpoint_and_duplicates():
    with pytest.raises(GraphError, match=r"edges\[0\].dst: unknown op 'nope'"):
        OpGraph.build("g", [Op("a", "x")], [("a", "nope")])
    with pytest.raises(GraphError, match="duplicate op name 'a'"):
        OpGraph.build("g", [Op("a", "x"), Op("a", "y")], [])
    with pytest.raises(GraphError, match="duplicate edge 'a' -> 'b'"):
        OpGraph.build("g", [Op("a", "x"), Op("b", "x")], [("a", "b"), ("a", "b")])


def test_group_with_no_common_device_kind():
    ops = [Op("a", "x", group="g", allowed_kinds=("cpu",)), Op("b", "x", group="g", allowed_kinds=("gpu",))]
    with pytest.raises(GraphError, match="group 'g'"):
        OpGraph.build("g", ops, [])


def test_json_round_trip_and_hash(tmp_path):
    g = diamond()
    for name in ("g.json", "g.json.gz"):
        path = graph_io.save(g, tmp_path / name)
        back = graph_io.load(path)
        assert back.content_hash == g.content_hash
        assert back.ops == g.ops and back.edges == g.edges and dict(back.metadata) == {"model": "toy"}
    # the hash depends on content, not on object identity
    assert diamond().content_hash == g.content_hash
    changed = OpGraph.build("diamond", [*g.ops[:3], Op("d", "add", flops=3.0)], [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")], {"model": "toy"})
    assert changed.content_hash != g.content_hash


def test_edited_file_fails_hash_check(tmp_path):
    path = graph_io.save(diamond(), tmp_path / "g.json")
    data = json.loads(path.read_text())
    data["ops"][0]["flops"] = 11.0
    path.write_text(json.dumps(data))
    with pytest.raises(GraphError, match="content hash mismatch"):
        graph_io.load(path)


@pytest.mark.parametrize(
    "mutate,message",
    [
        (lambda d: d.update(schema_version=99), "schema_version 99 is not supported"),
        (lambda d: d.update(format="other"), "field 'format'"),
        (lambda d: d["ops"][1].update(flops=-2), "'b'.flops: -2 is negative"),
        (lambda d: d["ops"][1].update(colour="red"), "unknown field"),
        (lambda d: d["edges"].append(["a", "ghost", 1]), "unknown op 'ghost'"),
        (lambda d: d["edges"].append(["d", "a", 1]), "cycle"),
        (lambda d: d.pop("ops"), "field 'ops' is missing"),
    ],
)
def test_malformed_file_errors_name_file_and_field(tmp_path, mutate, message):
    data = graph_io.to_dict(diamond())
    data.pop("hash")
    mutate(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(GraphError, match=message) as info:
        graph_io.load(path)
    assert str(path) in str(info.value)


def test_not_json_and_truncated_gzip(tmp_path):
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(GraphError, match="not valid JSON"):
        graph_io.load(tmp_path / "x.json")
    blob = gzip.compress(json.dumps(graph_io.to_dict(diamond())).encode())
    (tmp_path / "x.json.gz").write_bytes(blob[: len(blob) // 2])
    with pytest.raises(GraphError, match="cannot read graph file"):
        graph_io.load(tmp_path / "x.json.gz")
    with pytest.raises(GraphError, match="no such graph file"):
        graph_io.load(tmp_path / "missing.json")


@settings(max_examples=50, deadline=None)
@given(st.integers(2, 25), st.data())
def test_random_dags_are_ordered_and_round_trip(n, data):
    perm = data.draw(st.permutations(range(n)))
    edges = [(f"o{perm[i]}", f"o{perm[j]}") for j in range(n) for i in range(j) if data.draw(st.booleans())]
    g = OpGraph.build("r", [Op(f"o{k}", "x", flops=float(k)) for k in range(n)], edges)
    pos = {op.name: i for i, op in enumerate(g.ops)}
    assert all(pos[s] < pos[d] for s, d in edges)
    assert graph_io.from_dict(json.loads(json.dumps(graph_io.to_dict(g)))).content_hash == g.content_hash
