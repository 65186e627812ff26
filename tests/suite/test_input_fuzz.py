"""Fuzzing the input files: a valid graph (JSON, gzip JSON), cluster TOML, placement file and spec TOML, mutated
one step (a key deleted, a value of another type, NaN, a huge integer, a duplicate key, truncated bytes, ...),
either loads to an object that holds what the file says or raises the loader's documented error with a message;
never another exception type, and never a silent repair (such as `true` read as 1)."""

from __future__ import annotations

import copy
import datetime
import gzip
import io
import json
import math
import os
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from suite import cluster as cluster_mod
from suite import graph_io
from suite.cli import main
from suite.errors import ClusterError, GraphError, PlacementError, SpecError
from suite.graph import Op, OpGraph
from suite.placement import load_placement, validate
from suite.runner import load_spec

FUZZ = settings(max_examples=int(os.environ.get("FUZZ_EXAMPLES", "150")), deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])

# values that replace a field: other types, bools for numbers, out-of-range and non-finite numbers, odd text
WEIRD: list[Any] = [None, True, False, "", "x", "é☃\u200b", [], {}, [1], {"a": 1}, 0, 1, -1, -0.5, 0.5, 1.5,
                    10**400, -(10**400), 2**63, 2**64, 1e308, 1e-320, "1", math.nan, math.inf, -math.inf, -0.0,
                    "nan", "a\x00b", "x" * 5000, [[[[[[[[]]]]]]]]]
MAX_MESSAGE = 1000  # characters: a message names a wrong value, it does not repeat all of it
# TOML has dates and times besides
TOML_WEIRD = [*WEIRD, datetime.date(2024, 2, 29), datetime.time(12, 30),
              datetime.datetime(2024, 1, 1, 0, 0, tzinfo=datetime.UTC)]


# -- emitting JSON and TOML, with one key written twice on request ----------------------------------------------------
def _json(x: Any, dup: int | None = None) -> str:
    """JSON text of `x` (NaN and Infinity as their literals, integers of any size); the dict whose id is `dup`
    has its first key written twice."""
    if isinstance(x, dict):
        items = [f"{_json(k)}: {_json(v, dup)}" for k, v in x.items()]
        if id(x) == dup and items:
            items.append(items[0])
        return "{" + ", ".join(items) + "}"
    if isinstance(x, list):
        return "[" + ", ".join(_json(v, dup) for v in x) + "]"
    if isinstance(x, float) and math.isnan(x):
        return "NaN"
    if isinstance(x, float) and math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    return json.dumps(x)


def _toml_value(x: Any, dup: int | None) -> str:
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, float):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf") if math.isinf(x) else repr(x)
    if isinstance(x, int | str):
        return json.dumps(x)
    if isinstance(x, datetime.date | datetime.time):
        return x.isoformat()  # a JSON string is a TOML basic string for the text used here
    if isinstance(x, list):
        return "[" + ", ".join(_toml_value(v, dup) for v in x if v is not None) + "]"
    items = [f"{json.dumps(k)} = {_toml_value(v, dup)}" for k, v in x.items() if v is not None]
    if id(x) == dup and items:
        items.append(items[0])
    return "{" + ", ".join(items) + "}"


def _toml(data: dict[str, Any], dup: int | None = None) -> str:
    """TOML text of `data` (None, which TOML lacks, left out); every table inline, each top-level key a line."""
    lines = [f"{json.dumps(k)} = {_toml_value(v, dup)}" for k, v in data.items() if v is not None]
    if id(data) == dup and lines:
        lines.append(lines[0])
    return "\n".join(lines) + "\n"


def _drop_none(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _drop_none(v) for k, v in x.items() if v is not None}
    if isinstance(x, list):
        return [_drop_none(v) for v in x if v is not None]
    return x


# -- mutations --------------------------------------------------------------------------------------------------------
def _slots(x: Any) -> list[tuple[Any, Any]]:
    """Every (container, key or index) in `x`."""
    out: list[tuple[Any, Any]] = []
    items = x.items() if isinstance(x, dict) else enumerate(x) if isinstance(x, list) else ()
    for k, v in items:
        out.append((x, k))
        out.extend(_slots(v))
    return out


def _containers(x: Any) -> list[Any]:
    return [x] + [c[k] for c, k in _slots(x) if isinstance(c[k], dict | list)]


@st.composite
def mutated(draw: st.DrawFn, valid: Any, weird: list[Any] = WEIRD) -> tuple[Any, int | None, str]:
    """A deep copy of `valid` with one mutation, the id of a dict to write a key of twice (or None), and what
    was done (for the failure message)."""
    data = copy.deepcopy(valid)
    slots = _slots(data)
    if not slots:  # an empty list or object (after earlier mutations): only a key can be added
        if isinstance(data, dict):
            data["zz_unknown"] = 1
        return data, None, "unknown key" if isinstance(data, dict) else "no change"
    how = draw(st.sampled_from(["replace", "replace", "replace", "delete", "wrap", "unknown key", "duplicate key",
                                "repeat item", "swap"]))
    if not any(isinstance(c, dict) for c in _containers(data)):  # a bare list: no key to add or repeat
        how = "replace" if how in ("unknown key", "duplicate key") else how
    if how == "duplicate key":
        dicts = [c for c in _containers(data) if isinstance(c, dict) and c]
        target = draw(st.sampled_from(dicts))
        return data, id(target), f"duplicate key in {sorted(target)[:3]}"
    if how == "unknown key":
        dicts = [c for c in _containers(data) if isinstance(c, dict)]
        draw(st.sampled_from(dicts))["zz_unknown"] = 1
        return data, None, how
    if how == "repeat item":  # a list entry twice: an op, edge, device or name given again
        lists = [c for c in _containers(data) if isinstance(c, list) and c]
        if lists:
            target = draw(st.sampled_from(lists))
            target.append(copy.deepcopy(draw(st.sampled_from(target))))
            return data, None, f"repeat an item of {target!r:.60}"
        how = "replace"
    container, key = draw(st.sampled_from(slots))
    if how == "swap":  # the value of another field (right type, wrong place)
        other, other_key = draw(st.sampled_from(slots))
        container[key] = copy.deepcopy(other[other_key])
        return data, None, f"{key!r} = the value of {other_key!r}"
    if how == "delete":
        del container[key]
        return data, None, f"delete {key!r}"
    if how == "wrap":
        container[key] = [container[key]]
        return data, None, f"wrap {key!r} in a list"
    value = draw(st.sampled_from(weird))
    container[key] = value
    return data, None, f"{key!r} = {value!r}"


def _truncated(draw: st.DrawFn, raw: bytes) -> bytes:
    how = draw(st.sampled_from(["cut", "flip", "zero"]))
    i = draw(st.integers(0, len(raw) - 1))
    if how == "cut":
        return raw[:i]
    if how == "flip":
        return raw[:i] + bytes([raw[i] ^ draw(st.integers(1, 255))]) + raw[i + 1:]
    return raw[:i] + b"\x00" + raw[i + 1:]


def _expect(loader, error: type[Exception], what: str, *, short: bool = True) -> Any:
    """The loader's result, or None when it raises `error` with a message (`short`: under MAX_MESSAGE
    characters); any other exception fails with `what` (the mutation) in its message."""
    try:
        return loader()
    except error as exc:
        assert str(exc).strip(), f"{what}: {error.__name__} without a message"
        assert not short or len(str(exc)) < MAX_MESSAGE, \
            f"{what}: a message of {len(str(exc))} characters: {str(exc)[:300]}"
        return None
    except Exception as exc:  # noqa: BLE001 - the point of the test
        pytest.fail(f"{what}: {type(exc).__name__} instead of {error.__name__}: {exc}")


def _tagged(x: Any) -> Any:
    """`x` with bools told apart from numbers and ints from equal floats kept equal: True != 1, 1 == 1.0;
    NaN equal to NaN."""
    if isinstance(x, bool):
        return ("bool", x)
    if isinstance(x, float) and math.isnan(x):
        return "NaN"  # equal to itself
    if isinstance(x, dict):
        return {k: _tagged(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_tagged(v) for v in x]
    return x


# -- graph files ------------------------------------------------------------------------------------------------------
def _valid_graph() -> OpGraph:
    ops = [Op("a", "matmul", flops=2e6, bytes_read=64, bytes_written=32, output_bytes=32, param_bytes=16,
              output_shape=(2, 4), scope="enc.0"),
           Op("b", "relu", flops=8.0, output_bytes=32, group="g", allowed_kinds=("gpu",)),
           Op("c", "add", flops=1.0, output_bytes=8, phase="backward", group="g")]
    return OpGraph.build("tiny", ops, [("a", "b", 32), ("b", "c", 32), ("a", "c", 32)], {"batch_size": 2})


GRAPH_DICT = graph_io.to_dict(_valid_graph())
UNHASHED = {k: v for k, v in GRAPH_DICT.items() if k != "hash"}  # hash optional: mutations reach the fields


def _same_graph_as_file(g: OpGraph, data: dict[str, Any]) -> None:
    """The loaded graph holds what the file says: every op field given, every edge, name and metadata."""
    assert g.name == data["name"]
    assert _tagged(dict(g.metadata)) == _tagged(data.get("metadata", {}))
    ops = {op.name: graph_io._op_to_dict(op) for op in g.ops}
    assert len(ops) == len(data["ops"])
    for raw in data["ops"]:
        got = ops[raw["name"]]
        assert {k: _tagged(got[k]) for k in raw} == _tagged(raw), raw["name"]
    edges = {(s, d): b for s, d, b in graph_io._body(g)["edges"]}
    assert {(s, d): _tagged(b) for s, d, b in data["edges"]} == {k: _tagged(v) for k, v in edges.items()}


@FUZZ
@given(case=mutated(UNHASHED))
def test_fuzzed_graph_json_loads_as_written_or_raises_graph_error(tmp_path, case):
    data, dup, what = case
    path = tmp_path / "g.json"
    path.write_text(_json(data, dup), encoding="utf-8")
    g = _expect(lambda: graph_io.load(path), GraphError, what)
    if g is not None:
        assert dup is None, f"{what}: a duplicate key was accepted"
        _same_graph_as_file(g, data)


@FUZZ
@given(case=mutated(GRAPH_DICT))
def test_fuzzed_hashed_graph_loads_only_unchanged(tmp_path, case):
    """With its hash, a graph file loads only if the mutation left the graph as it was (e.g. an equal-meaning
    value); else a GraphError."""
    data, dup, what = case
    path = tmp_path / "g.json"
    path.write_text(_json(data, dup), encoding="utf-8")
    g = _expect(lambda: graph_io.load(path), GraphError, what)
    if g is not None:
        assert g.content_hash == GRAPH_DICT["hash"], what
        _same_graph_as_file(g, data)


@FUZZ
@given(data=st.data())
def test_fuzzed_gzip_graph_loads_or_raises_graph_error(tmp_path, data):
    """A gzip graph file whose bytes are cut short or changed: a GraphError, never a zlib, EOF or decode error."""
    src = tmp_path / "ok.json.gz"
    graph_io.save(_valid_graph(), src)
    raw = src.read_bytes()
    bad = _truncated(data.draw, raw)
    path = tmp_path / "g.json.gz"
    path.write_bytes(bad)
    g = _expect(lambda: graph_io.load(path), GraphError, f"gzip bytes {len(bad)} of {len(raw)}")
    if g is not None:
        assert g.content_hash == GRAPH_DICT["hash"]


@FUZZ
@given(case=mutated(UNHASHED))
def test_fuzzed_graph_inside_gzip_loads_as_written_or_raises_graph_error(tmp_path, case):
    data, dup, what = case
    path = tmp_path / "g.json.gz"
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as f:
        f.write(_json(data, dup).encode("utf-8"))
    path.write_bytes(buf.getvalue())
    g = _expect(lambda: graph_io.load(path), GraphError, what)
    if g is not None:
        assert dup is None, what
        _same_graph_as_file(g, data)


@FUZZ
@given(data=st.data())
def test_fuzzed_graph_text_loads_or_raises_graph_error(tmp_path, data):
    raw = _json(GRAPH_DICT).encode("utf-8")
    path = tmp_path / "g.json"
    path.write_bytes(_truncated(data.draw, raw))
    _expect(lambda: graph_io.load(path), GraphError, "damaged graph text")


# -- cluster files ----------------------------------------------------------------------------------------------------
CLUSTER_DICT: dict[str, Any] = {
    "schema_version": 1,
    "name": "fuzz2",
    "description": "two devices",
    "source": {"all": "made up"},
    "devices": [
        {"name": "cpu0", "kind": "cpu", "peak_flops": 1e11, "mem_bandwidth": 5e10, "memory_bytes": 2**34,
         "op_overhead_s": 1e-5, "compute_efficiency": 0.5, "model": "x", "source": {"peak_flops": "spec sheet"}},
        {"name": "gpu0", "kind": "gpu", "peak_flops": 1e13, "mem_bandwidth": 9e11, "memory_bytes": 2**33,
         "op_overhead_s": 0.0, "memory_efficiency": 0.8},
    ],
    "links": [{"between": ["cpu0", "gpu0"], "bandwidth": 1.2e10, "latency_s": 1e-5, "name": "pcie",
               "sharing": "ports", "source": {"bandwidth": "measured"}}],
}


def _same_cluster_as_file(c: cluster_mod.Cluster, data: dict[str, Any]) -> None:
    assert c.name == data["name"]
    assert len(c.devices) == len(data["devices"]) and len(c.links) == len(data.get("links", []))
    for dev, raw in zip(c.devices, data["devices"], strict=True):
        assert {k: _tagged(getattr(dev, k)) for k in raw} == _tagged(raw)
    for link, raw in zip(c.links, data.get("links", []), strict=True):
        assert {k: _tagged(getattr(link, k)) for k in raw} == _tagged(raw)


@FUZZ
@given(case=mutated(CLUSTER_DICT, TOML_WEIRD))
def test_fuzzed_cluster_toml_loads_as_written_or_raises_cluster_error(tmp_path, case):
    data, dup, what = case
    path = tmp_path / "c.toml"
    path.write_text(_toml(data, dup), encoding="utf-8")
    c = _expect(lambda: cluster_mod.load(path), ClusterError, what)
    if c is not None:
        assert dup is None, what
        _same_cluster_as_file(c, _drop_none(data))


@FUZZ
@given(data=st.data())
def test_fuzzed_cluster_text_loads_or_raises_cluster_error(tmp_path, data):
    path = tmp_path / "c.toml"
    path.write_bytes(_truncated(data.draw, _toml(CLUSTER_DICT).encode("utf-8")))
    _expect(lambda: cluster_mod.load(path), ClusterError, "damaged cluster text")


# -- placement files --------------------------------------------------------------------------------------------------
def _placement_forms() -> dict[str, Any]:
    g, c = _valid_graph(), cluster_mod.from_dict(CLUSTER_DICT)
    p = validate([1, 1, 1], g, c)
    names = [c.devices[int(d)].name for d in p]
    return {
        "indices": [1, 1, 1],
        "names": names,
        "object with indices": {"placement": [1, 1, 1]},
        "object with names": {"placement": names},
        "object with a mapping": {"placement": {op.name: n for op, n in zip(g.ops, names, strict=True)}},
        "saved": {"format": "placebench.placement", "schema_version": 1, "workload": g.name,
                  "workload_hash": g.content_hash, "cluster": c.name,
                  "placement": {op.name: n for op, n in zip(g.ops, names, strict=True)}},
    }


PLACEMENTS = _placement_forms()


@pytest.mark.parametrize("form", sorted(PLACEMENTS))
def test_each_placement_form_loads(tmp_path, form):
    g, c = _valid_graph(), cluster_mod.from_dict(CLUSTER_DICT)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(PLACEMENTS[form]))
    assert load_placement(path, g, c).tolist() == [1, 1, 1]


@FUZZ
@given(form=st.sampled_from(sorted(PLACEMENTS)), data=st.data())
def test_fuzzed_placement_file_loads_as_written_or_raises_placement_error(tmp_path, form, data):
    """A mutated placement file: a PlacementError naming what is wrong, or exactly the devices its entries
    name (a bool is no device index)."""
    case = data.draw(mutated(PLACEMENTS[form]))
    mutated_data, dup, what = case
    g, c = _valid_graph(), cluster_mod.from_dict(CLUSTER_DICT)
    path = tmp_path / "p.json"
    path.write_text(_json(mutated_data, dup), encoding="utf-8")
    p = _expect(lambda: load_placement(path, g, c), PlacementError, f"{form}: {what}")
    if p is not None:
        assert dup is None, what
        raw = mutated_data["placement"] if isinstance(mutated_data, dict) and "placement" in mutated_data \
            else mutated_data
        entries = [raw[op.name] for op in g.ops] if isinstance(raw, dict) else raw
        for got, entry in zip(p.tolist(), entries, strict=True):
            assert not isinstance(entry, bool), f"{what}: {entry!r} read as device {got}"
            assert got == (c.index[entry] if isinstance(entry, str) else entry), what


# -- spec files (their checks are in suite/runner.py) -------------------------------------------------------
SPEC_DICT: dict[str, Any] = {
    "name": "fuzzspec",
    "description": "a spec to mutate",
    "workloads": ["g.json", "mlp"],
    "clusters": ["c.toml", "haswell_2k80"],
    "placers": ["single_gpu", {"name": "random", "params": {"samples": 4}, "label": "rand4"}],
    "seeds": [0, 1],
    "methodology": "v1",
    "evaluator": "simulator",
    "simulator_engine": "fast",
    "cell_timeout_s": 30.0,
    "plugins": [],
    "budget": {"max_evaluations": 20, "max_seconds": 5.0},
}


@FUZZ
@given(case=mutated(SPEC_DICT, TOML_WEIRD))
def test_fuzzed_spec_toml_loads_as_written_or_raises_spec_error(tmp_path, case):
    data, dup, what = case
    path = tmp_path / "s.toml"
    path.write_text(_toml(data, dup), encoding="utf-8")
    spec = _expect(lambda: load_spec(str(path)), SpecError, what)
    if spec is not None:
        assert dup is None, what
        data = _drop_none(data)
        for key in ("seeds", "budget", "cell_timeout_s", "evaluator", "simulator_engine", "description"):
            if key in data:
                got = getattr(spec, key)
                assert _tagged(list(got) if isinstance(got, tuple) else got) == _tagged(data[key]), what
        for key in ("workloads", "clusters"):  # a list of names (a bare name is refused); a file is made absolute
            assert isinstance(data[key], list), f"{what}: {key} = {data[key]!r} was accepted"
            assert [str((tmp_path / r).resolve()) if r.endswith((".json", ".toml")) or "/" in r else r
                    for r in data[key]] == list(getattr(spec, key)), what
        assert isinstance(data["placers"], list), f"{what}: placers = {data['placers']!r} was accepted"
        for entry, item in zip(spec.placers, data["placers"], strict=True):
            item = {"name": item} if isinstance(item, str) else item
            assert (entry.name, _tagged(dict(entry.params)), entry.label) == (
                item["name"], _tagged(item.get("params", {})), item.get("label", "")), what


@FUZZ
@given(data=st.data())
def test_fuzzed_spec_text_loads_or_raises_spec_error(tmp_path, data):
    path = tmp_path / "s.toml"
    path.write_bytes(_truncated(data.draw, _toml(SPEC_DICT).encode("utf-8")))
    _expect(lambda: load_spec(str(path)), SpecError, "damaged spec text")


# -- the command line on bad files ------------------------------------------------------------------------------------
def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("placebench: error: "), err
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize("text, names", [
    (_json({**UNHASHED, "ops": [{**UNHASHED["ops"][0], "flops": math.nan}, *UNHASHED["ops"][1:]]}), "flops"),
    (_json({**UNHASHED, "edges": [["a", "b", 32], ["b", "a", 32]]}), "cycle"),
    (_json({**UNHASHED, "ops": [{**UNHASHED["ops"][0], "bytes_read": 10**400}, *UNHASHED["ops"][1:]]}),
     "bytes_read"),
    (_json(UNHASHED)[:-7], "not valid JSON"),
])
def test_cli_show_on_a_bad_graph_file_exits_2_with_one_line(tmp_path, capsys, text, names):
    path = tmp_path / "g.json"
    path.write_text(text)
    assert main(["show", str(path)]) == 2
    assert names in _one_error_line(capsys)


@pytest.mark.parametrize("mutate, names", [
    (lambda d: d["devices"][0].update(peak_flops=-1.0), "peak_flops"),
    (lambda d: d["devices"][0].update(memory_bytes=True), "memory_bytes"),
    (lambda d: d["links"][0].update(between=["cpu0", "tpu9"]), "tpu9"),
    (lambda d: d["devices"][1].update(kind="fpga"), "fpga"),
])
def test_cli_show_on_a_bad_cluster_file_exits_2_with_one_line(tmp_path, capsys, mutate, names):
    data = copy.deepcopy(CLUSTER_DICT)
    mutate(data)
    path = tmp_path / "c.toml"
    path.write_text(_toml(data))
    assert main(["show", "--cluster", str(path)]) == 2
    assert names in _one_error_line(capsys)


@pytest.mark.parametrize("placement, names", [
    ([1, 1], "2 entries"),
    (["gpu0", "gpu0", "tpu9"], "tpu9"),
    ([True, True, True], "True"),
    ({"placement": None}, "null"),
])
def test_cli_evaluate_with_a_bad_placement_file_exits_2_and_writes_nothing(tmp_path, capsys, placement, names):
    graph, cluster, pfile, out = tmp_path / "g.json", tmp_path / "c.toml", tmp_path / "p.json", tmp_path / "t.json"
    graph_io.save(_valid_graph(), graph)
    cluster.write_text(_toml(CLUSTER_DICT))
    pfile.write_text(json.dumps(placement))
    assert main(["evaluate", str(graph), "--cluster", str(cluster), "--placement", str(pfile),
                 "--trace", str(out)]) == 2
    assert names in _one_error_line(capsys)
    assert not out.exists() and json.loads(pfile.read_text()) == placement


@pytest.mark.parametrize("mutate, names", [
    (lambda d: d.update(seeds=[0, True]), "seeds"),
    (lambda d: d["budget"].update(max_evaluations=10**400), "max_evaluations"),
    (lambda d: d.update(placers=[{"name": "random", "params": [], "label": "x"}]), "params"),
    (lambda d: d.update(cell_timeout_s=math.nan), "cell_timeout_s"),
])
def test_cli_run_on_a_bad_spec_file_exits_2_with_one_line(tmp_path, capsys, mutate, names):
    data = copy.deepcopy(SPEC_DICT)
    mutate(data)
    path = tmp_path / "s.toml"
    path.write_text(_toml(data))
    assert main(["run", str(path), "--out", str(tmp_path / "store"), "-q"]) == 2
    assert names in _one_error_line(capsys)


# -- a long wrong value is named by its start and size, not repeated whole --------------------------------------------
LONG_TEXT, LONG_LIST, LONG_OBJECT = "x" * 100_000, list(range(20_000)), {f"k{i}": i for i in range(5_000)}


def _edit(data: Any, path: tuple, value: Any) -> Any:
    data = copy.deepcopy(data)
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return data


def _graph_file(tmp_path, data):
    path = tmp_path / "g.json"
    path.write_text(_json(data))
    return lambda: graph_io.load(path)


def _cluster_file(tmp_path, data):
    path = tmp_path / "c.toml"
    path.write_text(_toml(data))
    return lambda: cluster_mod.load(path)


def _placement_file(tmp_path, data):
    path = tmp_path / "p.json"
    path.write_text(_json(data))
    return lambda: load_placement(path, _valid_graph(), cluster_mod.from_dict(CLUSTER_DICT))


@pytest.mark.parametrize("make, data, error, names", [
    (_graph_file, _edit(UNHASHED, ("ops", 0, "flops"), LONG_TEXT), GraphError, "ops[0] 'a'.flops"),
    (_graph_file, _edit(UNHASHED, ("ops", 1, "output_shape"), [*LONG_LIST[:-1], -1]), GraphError, "output_shape"),
    (_graph_file, _edit(UNHASHED, ("edges", 0), LONG_LIST), GraphError, "edges[0]"),
    (_graph_file, _edit(UNHASHED, ("edges", 1, 0), LONG_TEXT), GraphError, "edges[1].src: unknown op"),
    (_graph_file, _edit(UNHASHED, ("ops", 2), {**UNHASHED["ops"][2], **LONG_OBJECT}), GraphError,
     "ops[2] has unknown field(s)"),
    (_graph_file, _edit(GRAPH_DICT, ("hash",), LONG_TEXT), GraphError, "content hash mismatch"),
    (_cluster_file, _edit(CLUSTER_DICT, ("name",), LONG_LIST), ClusterError, "field 'name'"),
    (_cluster_file, _edit(CLUSTER_DICT, ("devices", 1, "kind"), LONG_TEXT), ClusterError, "'gpu0'.kind"),
    (_cluster_file, _edit(CLUSTER_DICT, ("links", 0, "between", 1), LONG_TEXT), ClusterError, "unknown device"),
    (_cluster_file, _edit(CLUSTER_DICT, ("links", 0, "latency_s"), LONG_OBJECT), ClusterError, "latency_s"),
    (_cluster_file, _edit(CLUSTER_DICT, ("devices", 0), {**CLUSTER_DICT["devices"][0], **LONG_OBJECT}),
     ClusterError, "devices[0] has unknown field(s)"),
    (_placement_file, ["gpu0", LONG_TEXT, "gpu0"], PlacementError, "placement[1] (op 'b'): unknown device"),
    (_placement_file, [1, LONG_LIST, 1], PlacementError, "placement[1] (op 'b')"),
    (_placement_file, {"placement": [1, 1, 1], **LONG_OBJECT}, PlacementError, "unknown field(s)"),
    (_placement_file, {"placement": {"a": 1, "b": 1, "c": 1, LONG_TEXT: 1}}, PlacementError, "names op"),
])
def test_a_long_wrong_value_is_cut_in_the_message(tmp_path, make, data, error, names):
    """A 100,000-character string, a list of 20,000 numbers or an object of 5,000 keys where a field's value
    belongs: the message names the field and the value's start and size, in under MAX_MESSAGE characters
    (it used to repeat the whole value: 100 KB on one line)."""
    with pytest.raises(error) as info:
        make(tmp_path, data)()
    message = str(info.value)
    assert names in message
    assert len(message) < MAX_MESSAGE, message[:300]
    assert any(size in message for size in ("a string of 100000 characters", "a list of 20000 entries",
                                            "an object of 5000 keys", "a list of 5000 entries")), message[:300]


@pytest.mark.parametrize("path, name", [(("devices", 1, "name"), "gpu\n0"), (("devices", 0, "name"), "cpu\x1b[2J"),
                                        (("name",), "two\rlines"), (("devices", 0, "name"), "cpu\t0")])
def test_a_cluster_or_device_name_with_a_control_character_is_refused(tmp_path, path, name):
    """Names are shown as they are in messages and tables ("placed on gpu0 (gpu)", "cluster 'x' has cpu0,
    gpu0"): a newline in one split the CLI's one error line in two, an escape sequence would reach the
    terminal. Such a name is never meant, so the cluster file is refused, naming the field."""
    data = _edit(CLUSTER_DICT, path, name)
    if path[0] == "devices":  # the link names the device too
        data["links"][0]["between"][path[1]] = name
    with pytest.raises(ClusterError, match="control character") as info:
        _cluster_file(tmp_path, data)()
    assert ("devices[" if path[0] == "devices" else "name") in str(info.value)
    assert "\n" not in str(info.value) and "\r" not in str(info.value) and "\x1b" not in str(info.value)


def test_cli_error_on_a_placement_for_a_cluster_with_a_newline_in_a_device_name_is_one_line(tmp_path, capsys):
    data = _edit(CLUSTER_DICT, ("devices", 1, "name"), "gpu\n0")
    data["links"][0]["between"][1] = "gpu\n0"
    graph, cluster, pfile = tmp_path / "g.json", tmp_path / "c.toml", tmp_path / "p.json"
    graph_io.save(_valid_graph(), graph)
    cluster.write_text(_toml(data))
    pfile.write_text(json.dumps(["cpu0", "tpu9", "cpu0"]))  # the message lists the cluster's devices
    assert main(["evaluate", str(graph), "--cluster", str(cluster), "--placement", str(pfile)]) == 2
    _one_error_line(capsys)


def test_a_cycle_is_named_on_one_line_and_briefly():
    """A cycle's message lists its ops: an op name with a newline is shown escaped, and a cycle through 1000 ops
    by its first and last ops and its length (the message used to list all 1000 names)."""
    ops = [Op("a", "x"), Op("b\nx", "x")]
    with pytest.raises(GraphError, match="cycle") as info:
        OpGraph.build("g", ops, [("a", "b\nx"), ("b\nx", "a")])
    assert "\n" not in str(info.value) and "'b\\nx'" in str(info.value)
    ops = [Op(f"op{i:04d}", "x") for i in range(1000)]
    edges = [(f"op{i:04d}", f"op{i + 1:04d}") for i in range(999)] + [("op0999", "op0000")]
    with pytest.raises(GraphError, match="cycle of 1000 ops") as info:
        OpGraph.build("g", ops, edges)
    assert len(str(info.value)) < MAX_MESSAGE and "op0000 -> op0001" in str(info.value)


@pytest.mark.parametrize("key", ["peak\nflops", "p" * 5000])
def test_a_source_key_that_does_not_print_or_is_long_is_shown_escaped_and_cut(tmp_path, key):
    """A misspelt key of a device's `source` table is named in the message: escaped when it holds a newline (it
    used to split the error line in two), cut when long."""
    data = _edit(CLUSTER_DICT, ("devices", 0, "source"), {key: "a data sheet"})
    with pytest.raises(ClusterError, match="names no field of a device") as info:
        _cluster_file(tmp_path, data)()
    assert "\n" not in str(info.value) and len(str(info.value)) < MAX_MESSAGE
    assert "devices[0] 'cpu0'.source[" in str(info.value)


def test_a_long_cluster_device_or_op_name_is_cut_where_it_locates_an_error(tmp_path):
    """A valid but long name (5000 characters) that locates a wrong value in the message is cut as a wrong value
    is; the message used to repeat it whole."""
    data = _edit(CLUSTER_DICT, ("name",), "n" * 5000)
    data = _edit(data, ("devices", 0, "peak_flops"), -1.0)
    with pytest.raises(ClusterError, match="peak_flops") as info:
        _cluster_file(tmp_path, data)()
    assert len(str(info.value)) < MAX_MESSAGE
    data = _edit(CLUSTER_DICT, ("devices", 0, "name"), "d" * 5000)
    data["links"][0]["between"][0] = "d" * 5000
    data = _edit(data, ("devices", 0, "memory_bytes"), 0)
    with pytest.raises(ClusterError, match="memory_bytes") as info:
        _cluster_file(tmp_path, data)()
    assert len(str(info.value)) < MAX_MESSAGE
    data = _edit(UNHASHED, ("ops", 0, "name"), "o" * 5000)
    data["edges"] = [["o" * 5000, "b", 32], ["b", "c", 32]]
    data = _edit(data, ("ops", 0, "flops"), -1.0)
    with pytest.raises(GraphError, match="flops") as info:
        _graph_file(tmp_path, data)()
    assert len(str(info.value)) < MAX_MESSAGE
