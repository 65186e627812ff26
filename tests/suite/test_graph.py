"""Graph IR: validation errors name what is wrong, canonical order, statistics, JSON round trip and hash."""

import gzip
import hashlib
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from suite import Op, OpGraph, graph_io, load_cluster, simulate
from suite.errors import GraphError
from suite.graph import MAX_BYTES


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
    assert s.ops_by_phase == {"forward": 4, "backward": 0, "update": 0}


def test_ops_by_phase_counts_each_phase():
    ops = [Op("f", "x"), Op("b1", "x", phase="backward"), Op("b2", "x", phase="backward"), Op("u", "x", phase="update")]
    g = OpGraph.build("phases", ops, [("f", "b1"), ("b1", "b2"), ("b2", "u")])
    assert g.stats.ops_by_phase == {"forward": 1, "backward": 2, "update": 1}


def test_adjacency_arrays_and_neighbours_by_hand():
    # ops a0 b1 c2 d3; edges a->d (5 B), b->c (7 B), a->c (9 B). By (src, dst): a->c, a->d, b->c; by (dst, src):
    # a->c, b->c, a->d.
    g = OpGraph.build("cross", [Op(n, "x") for n in "abcd"], [("a", "d", 5), ("b", "c", 7), ("a", "c", 9)])
    a = g.arrays
    assert (a.succ_ptr.tolist(), a.succ_idx.tolist(), a.succ_bytes.tolist()) == ([0, 2, 3, 3, 3], [2, 3, 2], [9, 5, 7])
    assert (a.pred_ptr.tolist(), a.pred_idx.tolist(), a.pred_bytes.tolist()) == ([0, 0, 0, 2, 3], [0, 1, 0], [9, 7, 5])
    assert [g.successors(i) for i in range(4)] == [[2, 3], [2], [], []]
    assert [g.predecessors(i) for i in range(4)] == [[], [], [0, 1], [0]]


def test_critical_path_takes_the_longest_path_not_the_shortcut():
    # chain a -> b -> c -> d plus the shortcut a -> d: d is reached by 4 ops (a, b, c, d) or by 2 (a, d);
    # the critical path is the longer, 4 ops and 1 + 2 + 3 + 4 = 10 FLOPs (the shortcut has 1 + 4 = 5).
    ops = [Op(n, "x", flops=f) for n, f in (("a", 1.0), ("b", 2.0), ("c", 3.0), ("d", 4.0))]
    s = OpGraph.build("shortcut", ops, [("a", "b"), ("b", "c"), ("c", "d"), ("a", "d")]).stats
    assert s.critical_path_ops == 4
    assert s.critical_path_flops == 10.0


def test_critical_path_over_every_sink_and_isolated_op():
    """Chain a -> b -> c (1 + 2 + 3 FLOPs), isolated e (100 FLOPs) and f (0), last in canonical order: the
    longest path is a -> b -> c (3 ops) and the most FLOPs are e's alone (100), two different paths; edge
    bytes count for neither. Neither is the last op's (1 op, 0 FLOPs)."""
    ops = [Op(n, "x", flops=f) for n, f in (("a", 1.0), ("b", 2.0), ("c", 3.0), ("e", 100.0), ("f", 0.0))]
    g = OpGraph.build("islands", ops, [("a", "b", 10**9), ("b", "c", 10**9)])
    assert [op.name for op in g.ops][-1] == "f"
    s = g.stats
    assert (s.num_ops, s.num_edges, s.average_degree, s.total_flops) == (5, 2, 0.8, 106.0)
    assert (s.critical_path_ops, s.critical_path_flops) == (3, 100.0)


def test_canonical_order_is_topological_and_smallest_index_first():
    ops = [Op("d", "x"), Op("c", "x"), Op("b", "x"), Op("a", "x")]
    g = OpGraph.build("rev", ops, [("a", "b"), ("b", "c"), ("c", "d")])
    assert [op.name for op in g.ops] == ["a", "b", "c", "d"]
    g2 = OpGraph.build("free", [Op("y", "x"), Op("x", "x")], [])
    assert [op.name for op in g2.ops] == ["y", "x"]  # no constraint: file order is kept



def test_edges_are_ordered_by_source_then_destination_and_hashed_in_that_order():
    """The order of `edges` is part of a graph's hash: the zoo's recorded hashes depend on it."""
    g = OpGraph.build("cross", [Op(n, "x", output_bytes=1) for n in "abcd"], [("b", "c"), ("a", "d")])
    assert [op.name for op in g.ops] == ["a", "b", "c", "d"]
    assert [(e.src, e.dst, e.bytes) for e in g.edges] == [(0, 3, 1), (1, 2, 1)]
    op = {"kind": "x", "flops": 0.0, "bytes_read": 0, "bytes_written": 0, "output_bytes": 1, "param_bytes": 0,
          "phase": "forward", "group": None, "allowed_kinds": [], "output_shape": [], "scope": ""}
    body = {"name": "cross", "metadata": {}, "ops": [{"name": n, **op} for n in "abcd"],
            "edges": [["a", "d", 1], ["b", "c", 1]]}
    canon = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    assert g.content_hash == "sha256:" + hashlib.sha256(canon).hexdigest()
    assert g.content_hash == "sha256:3f20b579cae875d8ecf933089dbf8587d4c41ebca47658fda54c5f11c1f07867"

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
        ("flops", True, r"'a'.flops: expected a number, got True$"),  # not 1: JSON true is no count
        ("output_bytes", False, r"'a'.output_bytes: expected a number, got False$"),
        ("param_bytes", 1.5, "not a whole number of bytes"),
        ("bytes_read", "3", "expected a number"),
        ("phase", "sideways", "'a'.phase: 'sideways' is not one of"),
        ("allowed_kinds", ("tpu",), "'a'.allowed_kinds: 'tpu'"),
        ("group", "", r"ops\[0\] 'a'.group: expected a non-empty string or null, got ''"),
        ("output_shape", (-1,), r"ops\[0\] 'a'.output_shape: \(-1,\) is not a tuple of sizes"),
        ("output_shape", (True, 2), r"ops\[0\] 'a'.output_shape: \(True, 2\) is not a tuple of sizes"),
        ("output_shape", (2, 2**64), r"ops\[0\] 'a'.output_shape: size 18446744073709551616 is above the limit of 2\*\*53"),
        ("scope", 5, r"ops\[0\] 'a'.scope: expected a string, got 5"),
        ("bytes_read", 10**30, "'a'.bytes_read: 10{30} is above the limit of 2\\*\\*53 bytes"),
        ("output_bytes", 2**63, "'a'.output_bytes: 9223372036854775808 is above the limit"),
        ("param_bytes", 2**53 + 1, "'a'.param_bytes: 9007199254740993 is above the limit"),
        ("bytes_written", 1e300, "'a'.bytes_written: 1e\\+300 is above the limit"),
        pytest.param("flops", 10**400, "'a'.flops: a 1329-bit integer is too large for a float", id="flops-10**400"),
        pytest.param("output_bytes", -(10**400), "'a'.output_bytes: a 1329-bit integer is negative",
                     id="output_bytes--10**400"),
    ],
)
def test_bad_numbers_and_fields_are_named(field, value, message):
    with pytest.raises(GraphError, match=message):
        OpGraph.build("bad", [Op("a", "x", **{field: value})], [])


def test_numpy_numbers_are_the_python_numbers_of_the_same_value():
    """A graph built from numpy scalars (as a program computing sizes with numpy makes it) is the graph of
    the same Python numbers, hash included; numpy's bool, NaN and negatives are refused as Python's are."""
    def build(num):
        ops = [Op("a", "x", flops=num(10.0), output_bytes=num(4), output_shape=(num(1), num(4))),
               Op("b", "x", flops=num(2.5), bytes_read=num(4))]
        return OpGraph.build("np", ops, [("a", "b", num(4))])

    plain = build(lambda v: v)
    for cast in (lambda v: np.int64(v) if isinstance(v, int) else np.float64(v),
                 lambda v: np.int32(v) if isinstance(v, int) else np.float32(v)):
        g = build(cast)
        assert g.content_hash == plain.content_hash and g.ops == plain.ops
        assert type(g.ops[0].output_bytes) is int and type(g.ops[0].output_shape[1]) is int
    with pytest.raises(GraphError, match="expected a number, got np.True_"):
        OpGraph.build("np", [Op("a", "x", output_bytes=np.bool_(True))], [])
    with pytest.raises(GraphError, match="flops: nan is not a finite number"):
        OpGraph.build("np", [Op("a", "x", flops=np.float64("nan"))], [])
    with pytest.raises(GraphError, match="param_bytes: -4 is negative"):
        OpGraph.build("np", [Op("a", "x", param_bytes=np.int64(-4))], [])


def test_an_op_needs_a_kind():
    with pytest.raises(GraphError, match=r"ops\[0\] 'a'.kind: expected a non-empty string, got ''"):
        OpGraph.build("bad", [Op("a", "")], [])


def test_byte_counts_stay_inside_int64():
    """Two ops of 2**62 parameter bytes once wrapped the total to a negative number; now each value and
    each total over the graph is at most 2**53, so every derived sum fits int64."""
    with pytest.raises(GraphError, match=r"ops\[0\] 'a'.param_bytes: 4611686018427387904 is above the limit"):
        OpGraph.build("big", [Op("a", "x", param_bytes=2**62), Op("b", "x", param_bytes=2**62)], [])
    half = MAX_BYTES // 2
    with pytest.raises(GraphError, match=r"graph 'big': param_bytes over all ops total \d+, above the limit"):
        OpGraph.build("big", [Op(f"o{i}", "x", param_bytes=half) for i in range(3)], [])
    with pytest.raises(GraphError, match=r"graph 'big': bytes over all edges total \d+, above the limit"):
        OpGraph.build("big", [Op("a", "x"), Op("b", "x"), Op("c", "x")], [("a", "b", half), ("a", "c", half + 1)])
    with pytest.raises(GraphError, match=r"edges\[0\].bytes: 18446744073709551616 is above the limit"):
        OpGraph.build("big", [Op("a", "x"), Op("b", "x")], [("a", "b", 2**64)])
    with pytest.raises(GraphError, match="graph 'big': flops over all ops total more than a float can hold"):
        OpGraph.build("big", [Op("a", "x", flops=1e308), Op("b", "x", flops=1e308)], [])


@pytest.mark.parametrize("engine", ["reference", "fast"])
def test_totals_at_the_limit_are_exact(engine):
    half = MAX_BYTES // 2
    g = OpGraph.build("edge", [Op("a", "x", output_bytes=half, param_bytes=half), Op("b", "x", param_bytes=half)],
                      [("a", "b")])
    assert g.stats.param_bytes == MAX_BYTES
    c = load_cluster("haswell_2k80")
    r = simulate(g, c, np.zeros(2, dtype=np.int64), engine=engine)
    assert r.peak_memory_bytes[0] == MAX_BYTES + half and r.status == "oom"


def test_edge_endpoints_must_be_op_names():
    ops = [Op("a", "x"), Op("b", "x")]
    with pytest.raises(GraphError, match=r"edges\[0\].src: expected an op name \(a string\), got \{'a': 1\}"):
        OpGraph.build("g", ops, [({"a": 1}, "b")])
    with pytest.raises(GraphError, match=r"edges\[0\].dst: expected an op name \(a string\), got \['a'\]"):
        OpGraph.build("g", ops, [("a", ["a"])])
    with pytest.raises(GraphError, match=r"edges\[0\]: expected \(src, dst\[, bytes\]\), got 5"):
        OpGraph.build("g", ops, [5])
    with pytest.raises(GraphError, match=r"edges\[0\].src: expected an op name \(a string\), got 0$"):
        OpGraph.build("g", ops, [(0, "b")])  # an op index is not an op name
    with pytest.raises(GraphError, match=r"edges\[0\]: expected \(src, dst\[, bytes\]\), got \('a', 'b', 1, 2\)"):
        OpGraph.build("g", ops, [("a", "b", 1, 2)])  # not read as ('a', 'b', 1) with a value dropped
    with pytest.raises(GraphError, match=r"edges\[0\].bytes: expected a number, got True$"):
        OpGraph.build("g", ops, [("a", "b", True)])


def test_graph_name_ops_and_metadata_are_checked():
    with pytest.raises(GraphError, match="graph name: expected a non-empty string, got ''"):
        OpGraph.build("", [Op("a", "x")], [])
    with pytest.raises(GraphError, match=r"ops\[1\].name: expected a non-empty string, got ''$"):
        OpGraph.build("g", [Op("a", "x"), Op("", "x")], [])
    with pytest.raises(GraphError, match="graph 'g' has no ops"):
        OpGraph.build("g", [], [])
    with pytest.raises(GraphError, match=r"metadata\['x'\]: not valid JSON"):
        OpGraph.build("g", [Op("a", "x")], [], {"model": "toy", "x": {"y": [math.inf]}})
    with pytest.raises(GraphError, match=r"metadata\['s'\]: not valid JSON"):
        OpGraph.build("g", [Op("a", "x")], [], {"s": {1, 2}})


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
    # an op without allowed kinds allows every kind: it narrows nothing
    ops = [Op("a", "x", group="g", allowed_kinds=("cpu",)), Op("b", "x", group="g"), Op("c", "x", group="g")]
    assert OpGraph.build("g", ops, []).groups == {"g": [0, 1, 2]}


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
    # so does an edge's own byte count
    ops = [Op("a", "x", output_bytes=8), Op("b", "x")]
    assert OpGraph.build("g", ops, [("a", "b", 4)]).content_hash != OpGraph.build("g", ops, [("a", "b", 8)]).content_hash
    # and the graph's name and metadata (a workload's shape parameters live there)
    base = OpGraph.build("g", ops, [("a", "b", 4)], {"batch": 1})
    assert len({base.content_hash, OpGraph.build("h", ops, [("a", "b", 4)], {"batch": 1}).content_hash,
                OpGraph.build("g", ops, [("a", "b", 4)], {"batch": 2}).content_hash}) == 3


def test_saving_a_graph_touches_no_other_file(tmp_path):
    """save() wrote through a temporary file of a fixed name, PATH.tmp: a file of that name was overwritten and
    renamed over PATH, two saves at once shared one temporary file, and a failed save left it behind."""
    (tmp_path / "g.json.tmp").write_text("mine")
    assert graph_io.load(graph_io.save(diamond(), tmp_path / "g.json")).content_hash == diamond().content_hash
    assert (tmp_path / "g.json.tmp").read_text() == "mine"
    (tmp_path / "d.json.gz").mkdir()
    with pytest.raises(OSError, match=r"d.json.gz: it is a directory"):
        graph_io.save(diamond(), tmp_path / "d.json.gz")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.json.gz", "g.json", "g.json.tmp"]


def test_a_byte_count_of_exactly_the_limit_is_accepted():
    g = OpGraph.build("g", [Op("a", "x", param_bytes=MAX_BYTES, output_bytes=MAX_BYTES)], [])
    assert g.stats.param_bytes == MAX_BYTES and g.ops[0].output_bytes == 2**53


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
        (lambda d: d.update(schema_version=True), "schema_version True is not supported"),
        (lambda d: d.update(schema_version=1.0), "schema_version 1.0 is not supported"),
        (lambda d: d.update(name=""), "graph name: expected a non-empty string"),
        (lambda d: d.update(ops=[], edges=[]), "graph 'diamond' has no ops"),
        (lambda d: d["edges"].append([{"a": 1}, "b", 1]), r"edges\[4\].src: expected an op name"),
        (lambda d: d["edges"].append(["a", ["a"], 1]), r"edges\[4\].dst: expected an op name"),
        (lambda d: d.update(metadata={"x": math.nan}), r"metadata\['x'\]: not valid JSON"),
        (lambda d: d["ops"][0].update(bytes_read=10**30), r"ops\[0\] 'a'.bytes_read: 10{30} is above the limit"),
        (lambda d: d["ops"][0].update(output_bytes=2**63), r"ops\[0\] 'a'.output_bytes: \d+ is above the limit"),
        (lambda d: d["ops"][0].update(flops=10**400), r"ops\[0\] 'a'.flops: a 1329-bit integer is too large"),
        (lambda d: [op.update(param_bytes=2**62) for op in d["ops"]], r"ops\[0\] 'a'.param_bytes: \d+ is above"),
        (lambda d: d.update(metdata={"batch": 2}), r"unknown field\(s\) \['metdata'\]; known: edges, format"),
        (lambda d: d["ops"][0].update(output_shape=5), r"ops\[0\].output_shape is not a list"),
        (lambda d: d["ops"][0].update(allowed_kinds="gpu"), r"ops\[0\].allowed_kinds is not a list"),
        (lambda d: d["ops"][0].pop("name"), r"ops\[0\] has no field 'name'"),
        (lambda d: d["ops"][0].pop("kind"), r"ops\[0\] has no field 'kind'"),
        (lambda d: d["ops"].__setitem__(0, 5), r"ops\[0\] is not an object"),
        (lambda d: d.update(schema_version=10**400), "schema_version an integer of about 401 digits is not supported"),
        (lambda d: d.update(format=-(10**400)), "field 'format' is a negative integer of about 401 digits, expected"),
        (lambda d: d.update(hash=10**400), r"hash mismatch \(file says an integer of about 401 digits, contents"),
        (lambda d: d["ops"][0].update(kind=10**400), r"'a'.kind: expected a non-empty string, got a 1329-bit integer$"),
        (lambda d: d["ops"][0].update(phase=10**400), r"'a'.phase: a 1329-bit integer is not one of"),
        (lambda d: d["ops"][0].update(group=10**400), r"'a'.group: expected a non-empty string or null, got a 1329-bit"),
        (lambda d: d["ops"][0].update(allowed_kinds=[10**400]), r"'a'.allowed_kinds: a 1329-bit integer is not one"),
        (lambda d: d["ops"][0].update(scope=10**400), r"'a'.scope: expected a string, got a 1329-bit integer$"),
        (lambda d: d["ops"][0].update(flops=True), r"ops\[0\] 'a'.flops: expected a number, got True$"),
        (lambda d: d["edges"][0].pop(), r"edges\[0\] is not \[src, dst, bytes\]: \['a', 'b'\]$"),  # a file has the bytes
        (lambda d: d["edges"][0].append(1), r"edges\[0\] is not \[src, dst, bytes\]: \['a', 'b', 4, 1\]$"),
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
    assert str(path) in str(info.value) and len(str(info.value)) < 300


def test_a_key_given_twice_is_an_error_not_the_last_one(tmp_path):
    text = json.dumps(graph_io.to_dict(diamond()), indent=1)
    path = tmp_path / "twice.json"
    path.write_text(text.replace('"name": "diamond",', '"name": "diamond", "name": "other",', 1))
    with pytest.raises(GraphError, match=r"twice.json: key 'name' appears twice in one object"):
        graph_io.load(path)


def test_a_lone_surrogate_escape_is_an_error_a_surrogate_pair_is_text(tmp_path):
    data = graph_io.to_dict(diamond())
    del data["hash"]  # the name changes
    path = tmp_path / "s.json"
    for escape in ("\\ud800", "a\\udc00"):  # half of a UTF-16 pair: no text, it could not be printed or written
        path.write_text(json.dumps(data).replace('"name": "diamond"', f'"name": "{escape}"', 1))
        with pytest.raises(GraphError, match=r"s.json: name = '.*': a lone surrogate escape"):
            graph_io.load(path)
    path.write_text(json.dumps(data).replace('"name": "diamond"', '"name": "\\ud83d\\ude00"', 1))
    assert graph_io.load(path).name == "\U0001f600"


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
    for directory in ("dir.json", "dir.json.gz"):  # the reason, as other files give it: no "[Errno 21] ... 'path'"
        (tmp_path / directory).mkdir()
        with pytest.raises(GraphError, match=rf"^{tmp_path / directory}: cannot read graph file: Is a directory$"):
            graph_io.load(tmp_path / directory)
    (tmp_path / "long.json").write_text('{"format": "placebench.opgraph", "x": ' + "9" * 5000 + "}")
    with pytest.raises(GraphError, match="not valid JSON: Exceeds the limit"):  # not a bare ValueError
        graph_io.load(tmp_path / "long.json")
    (tmp_path / "deep.json").write_text('{"format": "placebench.opgraph", "metadata": ' + "[" * 100000 + "]" * 100000 + "}")
    with pytest.raises(GraphError, match="deep.json: not valid JSON: maximum recursion depth"):  # not a RecursionError
        graph_io.load(tmp_path / "deep.json")


@settings(max_examples=50, deadline=None)
@given(st.integers(2, 25), st.data())
def test_random_dags_are_ordered_and_round_trip(n, data):
    perm = data.draw(st.permutations(range(n)))
    edges = [(f"o{perm[i]}", f"o{perm[j]}") for j in range(n) for i in range(j) if data.draw(st.booleans())]
    g = OpGraph.build("r", [Op(f"o{k}", "x", flops=float(k)) for k in range(n)], edges)
    pos = {op.name: i for i, op in enumerate(g.ops)}
    assert all(pos[s] < pos[d] for s, d in edges)
    assert graph_io.from_dict(json.loads(json.dumps(graph_io.to_dict(g)))).content_hash == g.content_hash


def test_a_corrupt_gzip_file_or_an_unusable_path_is_a_graph_error(tmp_path):
    """Damaged compressed data raises zlib.error (not an OSError), and a NUL in a path a ValueError: both
    are reported as the file's problem, not as a bare traceback."""
    blob = bytearray(gzip.compress(json.dumps(graph_io.to_dict(diamond())).encode()))
    blob[12:30] = bytes(b ^ 0xFF for b in blob[12:30])  # the deflate stream, past the 10-byte header
    (tmp_path / "bad.json.gz").write_bytes(bytes(blob))
    with pytest.raises(GraphError, match=r"bad.json.gz: cannot read graph file: .*decompress"):
        graph_io.load(tmp_path / "bad.json.gz")
    with pytest.raises(GraphError, match="not a usable graph file name"):
        graph_io.load(str(tmp_path / "a\0b.json"))


def test_a_gzipped_graph_file_is_the_same_bytes_whenever_and_wherever_it_is_written(tmp_path):
    """The gzip header holds no time stamp and no (temporary) file name, so saving the same graph twice
    gives the same file, and a committed graph file does not change when it is written again."""
    a = graph_io.save(diamond(), tmp_path / "a.json.gz").read_bytes()
    b = graph_io.save(diamond(), tmp_path / "sub" / "other.json.gz").read_bytes()
    assert a == b
    assert a[4:8] == b"\0\0\0\0" and not a[3] & 0x08  # MTIME 0, no FNAME field (RFC 1952)
    assert graph_io.load(tmp_path / "a.json.gz").content_hash == diamond().content_hash


@pytest.mark.parametrize(
    "metadata,message",
    [
        ({1: "x"}, r"metadata: key 1 is not a string"),  # JSON would turn it into "1" without a word
        ({1: "x", "y": 2}, r"metadata: key 1 is not a string"),  # json.dumps(sort_keys=True): a TypeError
        ({"m": {"a": {2: 3}}}, r"metadata\['m'\]\['a'\]: key 2 is not a string"),
        ({"m": [{None: 1}]}, r"metadata\['m'\]\[0\]: key None is not a string"),
    ],
)
def test_metadata_keys_must_be_strings(metadata, message):
    with pytest.raises(GraphError, match=message):
        OpGraph.build("g", [Op("a", "x")], [], metadata)


@pytest.mark.parametrize(
    "op,message",
    [
        (Op("a", "x", allowed_kinds=None), r"'a'.allowed_kinds: expected a tuple of device kinds, got None"),
        (Op("a", "x", allowed_kinds="gpu"), r"'a'.allowed_kinds: expected a tuple of device kinds, got 'gpu'"),
        (Op("a", "x", allowed_kinds=("gpu", "gpu")), r"'a'.allowed_kinds: 'gpu' is listed twice"),
        (Op("a", "x", output_shape=None), r"'a'.output_shape: None is not a tuple of sizes"),
        ({"name": "a"}, r"ops\[0\]: expected an Op, got dict"),
    ],
)
def test_op_fields_of_the_wrong_type_are_named(op, message):
    with pytest.raises(GraphError, match=message):
        OpGraph.build("g", [op], [])


def test_ops_and_edges_must_be_iterables():
    with pytest.raises(GraphError, match="graph 'g': ops: expected a sequence of Op, got None"):
        OpGraph.build("g", None, [])
    with pytest.raises(GraphError, match="graph 'g': edges: expected a sequence of edges, got None"):
        OpGraph.build("g", [Op("a", "x")], None)


@pytest.mark.parametrize("metadata", [[1], [("a", 1)], "ab"])
def test_metadata_must_be_a_mapping(metadata):
    """Not a bare TypeError ([1]), nor a list of pairs silently read as a dict."""
    with pytest.raises(GraphError, match="graph 'g': metadata: expected an object"):
        OpGraph.build("g", [Op("a", "x")], [], metadata)


def test_ops_in_a_set_are_refused():
    """The order of the ops is what a placement indexes: a set has none (it changes with the hash seed)."""
    with pytest.raises(GraphError, match="graph 'g': ops: expected a sequence of Op, got a set"):
        OpGraph.build("g", {Op("a", "x"), Op("b", "x")}, [])


def test_negative_zero_flops_hash_as_zero(tmp_path):
    """-0.0 FLOPs is 0 FLOPs: the same graph and the same hash as 0.0 (JSON would write "-0.0")."""
    neg, pos = (OpGraph.build("g", [Op("a", "x", flops=f)], []) for f in (-0.0, 0.0))
    assert math.copysign(1.0, neg.ops[0].flops) == 1.0
    assert neg.content_hash == pos.content_hash
    assert graph_io.load(graph_io.save(neg, tmp_path / "g.json")).content_hash == pos.content_hash



def test_deep_or_circular_metadata_is_a_graph_error(tmp_path):
    """Not a bare RecursionError: the metadata checks recursed once per level, so metadata nested a little
    less deeply than json.loads allows (or circular metadata) exhausted the recursion limit."""
    circular: dict = {}
    circular["self"] = circular
    deep: list = []
    for _ in range(2000):
        deep = [deep]
    for value in (circular, deep):
        with pytest.raises(GraphError, match=r"metadata\['m'\]: nested more than 100 levels deep"):
            OpGraph.build("g", [Op("a", "x")], [], {"m": value})
    path = tmp_path / "deep.json"
    for depth, ok in ((100, True), (101, False)):
        path.write_text('{"format": "placebench.opgraph", "schema_version": 1, "name": "g", "metadata": {"m": %s},'
                        ' "ops": [{"name": "a", "kind": "x"}], "edges": []}' % ("[" * depth + "]" * depth))
        if ok:
            assert graph_io.load(path).num_ops == 1
        else:
            with pytest.raises(GraphError, match=r"deep\.json: metadata\['m'\]: nested more than 100 levels deep"):
                graph_io.load(path)
