"""The `placebench` command line: listings, one cell, a run, tables; bad input is one line and exit 2."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from suite.cli import main

README = Path(__file__).resolve().parents[1] / "README.md"


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _ok_row(placer, t):
    """A results row of `placer`, ok in `t` seconds, on workload w and cluster c (seed 0)."""
    return {"cell_id": placer, "cluster": "c", "workload": "w", "placer": placer, "seed": 0, "status": "ok",
            "step_time_s": t}


def _assert_usage_error(code, out, err, message):
    assert code == 2
    assert err.startswith("placebench: error: ") and message in err, err
    assert err.count("\n") == 1 and "Traceback" not in err


# -- listings -------------------------------------------------------------------------------------------------
def test_list_clusters(capsys):
    code, out, _ = _run(capsys, "list", "clusters", "--json")
    clusters = {c["name"]: c for c in json.loads(out)}
    assert code == 0 and clusters["xeon_h100"]["devices"] == ["cpu:0", "gpu:0"]
    assert {"haswell_2k80", "haswell_4k80", "dgx_a100x8"} <= set(clusters)
    code, out, _ = _run(capsys, "list", "clusters")
    assert "xeon_h100  2 devices (cpu:0, gpu:0)" in out


def test_a_broken_or_misnamed_preset_is_listed_as_broken(capsys, monkeypatch, tmp_path):
    from suite import cluster

    for p in cluster.PRESET_DIR.glob("*.toml"):
        shutil.copy(p, tmp_path)
    text = (tmp_path / "xeon_h100.toml").read_text()
    (tmp_path / "renamed.toml").write_text(text)  # still says name = "xeon_h100"
    (tmp_path / "bad.toml").write_text(text.replace('name = "xeon_h100"', 'name = "bad"').replace("peak_flops = ", "peak_flops = nan #", 1))
    monkeypatch.setattr(cluster, "PRESET_DIR", tmp_path)
    code, out, _ = _run(capsys, "list", "clusters", "--json")
    clusters = {c["name"]: c for c in json.loads(out)}
    assert code == 0 and clusters["xeon_h100"]["status"] == "ok"
    assert clusters["renamed"]["status"] == "broken" and "a preset's name must be its file name" in clusters["renamed"]["description"]
    assert clusters["bad"]["status"] == "broken" and "peak_flops" in clusters["bad"]["description"]
    code, out, _ = _run(capsys, "list", "clusters")
    assert code == 0 and "bad  BROKEN" in out
    _assert_usage_error(*_run(capsys, "evaluate", "rnnlm-2x2048-b64", "-c", "renamed", "-p", "single_cpu"),
                        "a preset's name must be its file name")


def test_list_workloads_is_the_zoo(capsys):
    from suite import zoo

    code, out, _ = _run(capsys, "list", "workloads", "--json")
    items = json.loads(out)
    assert code == 0 and [w["name"] for w in items] == zoo.names()
    assert all(w["mode"] in ("training", "inference") for w in items)


def test_list_placers_and_specs(capsys):
    code, out, _ = _run(capsys, "list", "placers", "--json")
    placers = {p["name"]: p for p in json.loads(out)}
    assert code == 0 and placers["single_cpu"]["status"] == "ok"
    assert placers["single_gpu"]["source"] == "baselines.single_device:SingleGPU"
    code, out, _ = _run(capsys, "list", "specs", "--json")
    assert [s["name"] for s in json.loads(out)][:2] == ["full", "quick"]


def test_list_placers_with_a_plugin_file(capsys, harness_plugin):
    code, out, _ = _run(capsys, "list", "placers", "--plugin", harness_plugin, "--json")
    placers = {p["name"]: p for p in json.loads(out)}
    assert code == 0 and placers["harness_raises"]["status"] == "ok" and "single_cpu" in placers
    assert placers["harness_raises"]["source"] == "registered in this process"
    assert placers["harness_raises"]["family"] == "plugin" and placers["m_etf"]["family"] == "heuristic search"
    names = list(placers)  # in table order: built-in by family, then plugins by name
    assert names[:2] == ["single_cpu", "single_gpu"] and names.index("hsdag") < names.index("harness_raises")
    _assert_usage_error(*_run(capsys, "list", "clusters", "--plugin", harness_plugin), "--plugin applies to")


def test_a_broken_spec_is_listed_as_broken(capsys, monkeypatch, tmp_path):
    """As a broken preset: the others are still listed (it stopped `list specs` with an error)."""
    from suite import runner

    shutil.copy(runner.SPEC_DIR / "quick.toml", tmp_path)
    (tmp_path / "bad.toml").write_text("workloads = [\n")
    monkeypatch.setattr(runner, "SPEC_DIR", tmp_path)
    code, out, _ = _run(capsys, "list", "specs", "--json")
    specs = {s["name"]: s for s in json.loads(out)}
    assert code == 0 and specs["quick"]["status"] == "ok" and specs["quick"]["path"] == str(tmp_path / "quick.toml")
    assert specs["bad"]["status"] == "broken" and "bad.toml" in specs["bad"]["description"]
    code, out, _ = _run(capsys, "list", "specs")
    assert code == 0 and "bad  BROKEN - " in out and "\nquick  " in out


def test_list_placers_reports_a_broken_plugin(capsys, broken_entry_point):
    code, out, _ = _run(capsys, "list", "placers", "--json")
    placers = {p["name"]: p for p in json.loads(out)}
    assert code == 0 and placers[broken_entry_point]["status"] == "broken"
    assert "no_such_module_xyz" in placers[broken_entry_point]["description"]
    assert placers["single_cpu"]["status"] == "ok"


CHATTY_PLUGIN = '''\
print("chatty plugin imported")
from suite.placer import BasePlacer, PlacementResult, register_placer

@register_placer("test_chatty")
class Chatty(BasePlacer):
    """Prints when imported and when made."""
    defaults = {"k": 0}

    def __init__(self, **params):
        print("chatty placer made")
        super().__init__(**params)

    def place(self, problem, budget, seed):
        return PlacementResult(placement=[0] * problem.workload.num_ops, evaluations=0, wall_time_s=0.0)
'''


def test_what_a_plugin_prints_in_this_process_does_not_reach_the_json_document(capsys, tiny_files, tmp_path):
    """A plugin imported (and a placer made, to check its parameters) in the command's own process prints to
    stderr, as it does in the runner's workers: stdout is the --json document."""
    from suite import runner
    from suite.placer import unregister_placer

    plugin = tmp_path / "chatty.py"
    plugin.write_text(CHATTY_PLUGIN)
    try:
        code, out, err = _run(capsys, "list", "placers", "--plugin", str(plugin), "--json")
        assert code == 0 and "test_chatty" in {p["name"] for p in json.loads(out)}
        assert "chatty plugin imported" in err
        code, out, err = _run(capsys, "evaluate", str(tiny_files["diamond"]), "-c", str(tiny_files["cluster"]),
                              "-p", "test_chatty", "--param", "k=1", "--plugin", str(plugin), "--json")
        assert code == 0 and json.loads(out)["placement"] == [0, 0, 0, 0] and "chatty placer made" in err
    finally:
        unregister_placer("test_chatty")
        runner._PLUGINS.pop(str(plugin), None)

PLAIN_PLUGIN = '''\
from suite.placer import PlacementResult, register_placer

@register_placer("test_plain_ctor")
class Plain:
    """A placer that is not a BasePlacer: its parameters are its constructor's."""

    def __init__(self, steps=10, rate=0.5, mode=None, order=(1, 2), tag=object):
        self.steps = steps

    def place(self, problem, budget, seed):
        return PlacementResult(placement=[0] * problem.workload.num_ops, evaluations=0, wall_time_s=0.0)
'''


def test_list_placers_shows_a_plain_constructors_parameters(capsys, tmp_path):
    """A plugin placer with a plain constructor (no `defaults`) was listed with no parameters; its keyword
    defaults are listed, as for a BasePlacer (`placer_defaults`). A default that JSON cannot write (a class)
    is shown as text instead of stopping the listing."""
    from suite import runner
    from suite.placer import unregister_placer

    plugin = tmp_path / "plain.py"
    plugin.write_text(PLAIN_PLUGIN)
    try:
        code, out, _ = _run(capsys, "list", "placers", "--plugin", str(plugin), "--json")
        placers = {p["name"]: p for p in json.loads(out)}
        assert code == 0 and placers["test_plain_ctor"]["parameters"] == {
            "steps": 10, "rate": 0.5, "mode": None, "order": [1, 2], "tag": "<class 'object'>"}
        code, out, _ = _run(capsys, "list", "placers", "--plugin", str(plugin))
        line = next(ln for ln in out.splitlines() if ln.startswith("test_plain_ctor"))
        assert code == 0 and line.endswith(
            'parameters: steps=10, rate=0.5, mode=null, order=[1, 2], tag="<class \'object\'>"')
    finally:
        unregister_placer("test_plain_ctor")
        runner._PLUGINS.pop(str(plugin), None)


def test_show_workload(capsys, tiny_files):
    code, out, _ = _run(capsys, "show", str(tiny_files["diamond"]), "--json")
    info = json.loads(out)
    assert code == 0 and info["name"] == "diamond" and info["stats"]["num_ops"] == 4
    assert info["stats"]["num_edges"] == 4 and info["op_kinds"] == {"matmul": 3, "add": 1}
    code, out, _ = _run(capsys, "show", str(tiny_files["diamond"]))
    assert "ops                4 (forward 4" in out and info["published"] == {}  # a file: no published figures
    # the most ops on a path (a-b-d) and the most FLOPs on a path, which may be two paths
    assert "longest path       3 ops; most FLOPs on a path: 3e+09\n" in out
    code, out, _ = _run(capsys, "show", "resnet50-b1-infer")
    assert "published.params            25,557,032" in out and "published.source            torchvision" in out
    assert "resident bytes              97.49 MiB (parameters" in out
    code, out, _ = _run(capsys, "show", "resnet50-b1-infer", "--json")  # the same name as in the text
    assert json.loads(out)["published"]["params"] == 25_557_032


def test_show_cluster_with_its_sources(capsys, tiny_files):
    code, out, _ = _run(capsys, "show", "--cluster", "haswell_2k80", "--json")
    info = json.loads(out)
    assert code == 0 and [d["name"] for d in info["devices"]] == ["cpu:0", "gpu:0", "gpu:1"]
    assert info["devices"][1]["memory_bytes"] == 11996758016 and info["unsourced"] == []
    assert info["devices"][1]["source"]["memory_bytes"].startswith("11441 MiB usable per GK210")
    code, out, _ = _run(capsys, "show", "-c", str(tiny_files["cluster"]))
    lines = out.splitlines()
    assert code == 0 and lines[0] == "cluster tiny: test cluster: a CPU and a small GPU"
    assert "device gpu:0 (gpu): 1e+10 FLOP/s x 1, 1e+30 B/s x 1, 1048576 bytes (1.00 MiB), 0 s per op" in lines
    assert lines[-1] == ("numbers without a source (14): cpu:0.peak_flops, cpu:0.mem_bandwidth, cpu:0.memory_bytes, "
                         "cpu:0.op_overhead_s, cpu:0.compute_efficiency, cpu:0.memory_efficiency, gpu:0.peak_flops, "
                         "gpu:0.mem_bandwidth, gpu:0.memory_bytes, gpu:0.op_overhead_s, gpu:0.compute_efficiency, "
                         "gpu:0.memory_efficiency, links[0].bandwidth, links[0].latency_s")
    _assert_usage_error(*_run(capsys, "show"), "show takes a workload or --cluster C")
    _assert_usage_error(*_run(capsys, "show", "resnet50-b1-infer", "-c", "haswell_2k80"), "one of them")


def test_show_cluster_prints_every_number_as_it_is_in_the_file(capsys):
    """The text prints each number exactly (the Haswell peak, 1.3248e12, was printed as 1.325e+12, and a
    memory capacity only as GiB to two decimals), so it can be checked against its source."""
    code, out, _ = _run(capsys, "show", "--cluster", "haswell_2k80")
    assert code == 0
    assert ("device cpu:0 (cpu, Intel Xeon E5-2699 v3 (Haswell, 18 cores, 2.3 GHz)): 1.3248e+12 FLOP/s x 0.5, "
            "6.8e+10 B/s x 0.7, 137438953472 bytes (128.00 GiB), 5e-06 s per op") in out.splitlines()
    assert "11996758016 bytes (11.17 GiB)" in out


# -- one cell -------------------------------------------------------------------------------------------------
def test_evaluate(capsys, tiny_files):
    args = ["evaluate", str(tiny_files["big"]), "--cluster", str(tiny_files["cluster"])]
    code, out, _ = _run(capsys, *args, "--placer", "single_gpu", "--json")
    rec = json.loads(out)
    assert code == 1 and (rec["status"], rec["oom_devices"], rec["placement"]) == ("oom", "gpu:0", [1, 1, 1, 1])
    assert isinstance(rec["peak_memory_bytes"], dict) and rec["params"] == {}  # objects, not JSON text
    code, out, _ = _run(capsys, *args, "--placer", "single_cpu")
    assert "status          ok" in out and "step time       4.000 s" in out


def test_evaluate_a_placement_file(capsys, tiny_files, tmp_path, harness_plugin):
    args = ["evaluate", str(tiny_files["diamond"]), "--cluster", str(tiny_files["cluster"])]
    path = tmp_path / "p.json"
    # a on the CPU (0-1 s), b after it (1-2 s); c on the GPU once a's 1000 bytes crossed (1 ms at 1 MB/s):
    # 1.001-1.101 s, back at 1.102 s; d waits for b: 2-3 s
    path.write_text(json.dumps({"placement": {"a": "cpu:0", "b": "cpu:0", "c": "gpu:0", "d": "cpu:0"}}))
    code, out, _ = _run(capsys, *args, "--placement", str(path), "--json")
    rec = json.loads(out)
    assert code == 0 and (rec["status"], rec["step_time_s"], rec["placement"]) == ("ok", 3.0, [0, 0, 1, 0])
    assert rec["bytes_transferred"] == 2000 and rec["placement_file"] == str(path)
    # a placer's final placement, saved and measured again, gives the same result
    saved = tmp_path / "saved.json"
    code, out, _ = _run(capsys, *args, "--placer", "m_etf", "--save-placement", str(saved), "--json")
    searched = json.loads(out)
    code, out, _ = _run(capsys, *args, "--placement", str(saved), "--json")
    again = json.loads(out)
    assert code == 0 and json.loads(saved.read_text())["workload"] == "diamond"
    assert (again["status"], again["step_time_s"], again["placement_hash"]) == \
        (searched["status"], searched["step_time_s"], searched["placement_hash"])
    code, out, _ = _run(capsys, *args, "--placement", str(path))
    assert "placement       from " in out and "step time       3.000 s" in out
    # bad input: one line, exit 2
    path.write_text(json.dumps({"placement": [0, 1, 1]}))
    _assert_usage_error(*_run(capsys, *args, "--placement", str(path)), "3 entries")
    path.write_text(json.dumps({"placement": {"a": "cpu:0", "b": "cpu:0", "c": "tpu:0", "d": "cpu:0"}}))
    _assert_usage_error(*_run(capsys, *args, "--placement", str(path)), "tpu:0")
    _assert_usage_error(*_run(capsys, *args, "--placement", str(saved).replace("saved", "nope")), "nope.json")
    for extra in (["--param", "x=1"], ["--seed", "0"], ["--timeout", "5"], ["--save-placement", "x.json"]):
        _assert_usage_error(*_run(capsys, *args, "--placement", str(saved), *extra),
                            f"{extra[0]} applies to a placer's search, not to --placement")
    _assert_usage_error(*_run(capsys, *args, "--placement", ""), "--placement is empty")
    # --save-placement is checked before the search: not a directory, not an input file
    for target, message in ((tmp_path, "is a directory"), (tiny_files["diamond"], "is an input of this command")):
        _assert_usage_error(*_run(capsys, *args, "-p", "m_etf", "--save-placement", str(target)), message)
    assert json.loads(tiny_files["diamond"].read_text())["format"] == "placebench.opgraph"
    code, out, _ = _run(capsys, *args, "-p", "m_etf", "--save-placement", str(tmp_path / "new" / "p.json"))
    assert code == 0 and json.loads((tmp_path / "new" / "p.json").read_text())["workload"] == "diamond"
    # a path no file can be written at is refused before the search (here a placer whose search is an error
    # row, exit 0, if it ran): a long search is not thrown away at the end
    _assert_usage_error(*_run(capsys, *args, "-p", "harness_raises", "--plugin", harness_plugin,
                              "--save-placement", "/proc/placebench/p.json"),
                        "--save-placement: cannot write /proc/placebench/p.json: No such file or directory")
    _assert_usage_error(*_run(capsys, *args, "-p", "harness_raises", "--plugin", harness_plugin,
                              "--trace", str(tiny_files["diamond"]) + "/t.json"),
                        "--trace: cannot write")


def test_evaluate_with_a_profile_takes_its_op_times(capsys, tiny_files, tmp_path):
    """The diamond of test_evaluate_a_placement_file with b measured at 0.5 s on the CPU (a hand-written
    profile, matched by the workload's name): d starts when b ends, at 1.5 s, and ends at 2.5 s."""
    args = ["evaluate", str(tiny_files["diamond"]), "--cluster", str(tiny_files["cluster"])]
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"placement": {"a": "cpu:0", "b": "cpu:0", "c": "gpu:0", "d": "cpu:0"}}))
    prof = tmp_path / "diamond__cpu.json"
    prof.write_text(json.dumps({"format": "placebench.profile", "schema_version": 1, "workload": "diamond",
                                "applies_to": "cpu", "op_times_s": {"b": 0.5}}))
    code, out, _ = _run(capsys, *args, "--placement", str(path), "--profile", str(prof), "--json")
    rec = json.loads(out)
    assert code == 0 and (rec["status"], rec["step_time_s"]) == ("ok", 2.5)
    assert rec["evaluator"].startswith("simulator+profiles:") and len(rec["evaluator"]) == len("simulator+profiles:") + 12
    # a placer's search and its re-measurement use it too (single_cpu runs the ops in turn: b 0.5 s shorter)
    code, out, _ = _run(capsys, *args, "--placer", "single_cpu", "--profile", str(prof), "--json")
    searched = json.loads(out)
    assert code == 0 and searched["evaluator"] == rec["evaluator"]
    code, out, _ = _run(capsys, *args, "--placer", "single_cpu", "--json")
    assert searched["step_time_s"] == pytest.approx(json.loads(out)["step_time_s"] - 0.5)
    # a profile of another workload, or one that applies to no device, is an error naming the file
    other = tmp_path / "other.json"
    other.write_text(prof.read_text().replace('"diamond"', '"chain"'))
    _assert_usage_error(*_run(capsys, *args, "--placement", str(path), "--profile", str(other)),
                        f"placebench: error: --profile: profile {other} was measured on workload 'chain' (no hash), "
                        "which is not the workload 'diamond' (sha256:")  # the command's name once, the flag named
    # the profile is an input: not written over by the command's outputs (checked before any work)
    before = prof.read_text()
    for flag in ("--save-placement", "--trace"):
        _assert_usage_error(*_run(capsys, *args, "--placer", "single_cpu", "--profile", str(prof), flag, str(prof)),
                            f"{flag} {prof} is an input of this command")
    _assert_usage_error(*_run(capsys, *args, "--placement", str(path), "--profile", str(prof), "--trace", str(prof)),
                        f"--trace {prof} is an input of this command")
    assert prof.read_text() == before
    other.write_text(prof.read_text().replace('"cpu"', '"tpu"'))
    _assert_usage_error(*_run(capsys, *args, "--placer", "single_cpu", "--profile", str(other)),
                        f"{other}: profile for 'diamond' applies to 'tpu'")


def test_evaluate_writes_the_timeline_of_the_final_placement(capsys, tiny_files, tmp_path, harness_plugin):
    args = ["evaluate", str(tiny_files["diamond"]), "--cluster", str(tiny_files["cluster"])]
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"placement": {"a": "cpu:0", "b": "cpu:0", "c": "gpu:0", "d": "cpu:0"}}))
    trace = tmp_path / "out" / "trace.json"
    code, out, err = _run(capsys, *args, "--placement", str(path), "--trace", str(trace), "--json")
    assert code == 0 and f"trace: {trace}" in err
    doc = json.loads(trace.read_text())
    # the times of test_evaluate_a_placement_file: c on the GPU 1.001-1.101 s, d 2-3 s
    ops = {e["name"]: (e["pid"], e["ts"], e["dur"]) for e in doc["traceEvents"] if e["ph"] == "X" and e["tid"] == 0}
    assert ops["c"][0] == 1 and ops["c"][1] == pytest.approx(1.001e6) and ops["d"][1:] == (2e6, 1e6)
    assert (doc["otherData"]["step_time_s"], doc["otherData"]["status"]) == (json.loads(out)["step_time_s"], "ok")
    # a placer's search: the trace names it, its seed and its parameters (an object, as in evaluate --json)
    code, out, _ = _run(capsys, *args, "-p", "m_etf", "--seed", "3", "--param", "oom_retries=2", "--trace", str(trace),
                        "--json")
    other = json.loads(trace.read_text())["otherData"]
    assert code == 0 and (other["placer"], other["seed"], other["params"]) == ("m_etf(oom_retries=2)", 3, {"oom_retries": 2})
    assert other["params"] == json.loads(out)["params"]
    # checked before any work: not a directory, not an input, not the --save-placement file
    for target, message in ((tmp_path, "is a directory"), (tiny_files["diamond"], "is an input of this command")):
        _assert_usage_error(*_run(capsys, *args, "-p", "m_etf", "--trace", str(target)), message)
    _assert_usage_error(*_run(capsys, *args, "-p", "m_etf", "--trace", str(trace), "--save-placement", str(trace)),
                        "name the same file")
    # nor any other input: the placement measured, the cluster file (each left as it was)
    inputs = {f: f.read_text() for f in (path, tiny_files["cluster"])}
    _assert_usage_error(*_run(capsys, *args, "--placement", str(path), "--trace", str(path)),
                        f"--trace {path} is an input of this command")
    for flag in ("--trace", "--save-placement"):
        _assert_usage_error(*_run(capsys, *args, "-p", "m_etf", flag, str(tiny_files["cluster"])),
                            f"{flag} {tiny_files['cluster']} is an input of this command")
    assert {f: f.read_text() for f in inputs} == inputs
    # a cell without a placement has nothing to trace: a warning, and the file is left as it was
    before = trace.read_text()
    code, _, err = _run(capsys, *args, "-p", "harness_raises", "--plugin", harness_plugin, "--trace", str(trace))
    assert code == 1 and "no placement to trace" in err and trace.read_text() == before


def test_evaluate_a_failing_placer_is_a_result_not_an_error(capsys, tiny_files, harness_plugin):
    code, out, _ = _run(capsys, "evaluate", str(tiny_files["diamond"]), "-c", str(tiny_files["cluster"]),
                        "-p", "harness_raises", "--plugin", harness_plugin, "--json")
    rec = json.loads(out)
    # a row, not a usage error (2); exit 1 as for any status but ok, so a CI step fails on it
    assert code == 1 and rec["status"] == "error" and rec["message"] == "RuntimeError: boom from a test placer"


# -- run, table, leaderboard ---------------------------------------------------------------------------------
def test_run_table_leaderboard(capsys, tiny_files, write_spec, tmp_path):
    spec = write_spec(workloads=[str(tiny_files["diamond"]), str(tiny_files["big"])],
                      clusters=[str(tiny_files["cluster"])], placers=["single_cpu", "single_gpu"])
    store = tmp_path / "store"
    code, out, err = _run(capsys, "run", str(spec), "--out", str(store), "--jobs", "2")
    assert code == 0
    assert "big          4.000 s         OOM" in out  # the plain-text table (stdout is not a terminal)
    assert "4 cells (4 run now, 0 from the store)" in err
    code, out, _ = _run(capsys, "run", str(spec), "--out", str(store), "--json")
    data = json.loads(out)
    assert (data["ran"], data["reused"], len(data["rows"])) == (0, 4, 4)
    code, out, _ = _run(capsys, "table", str(store), "--format", "md", "--reference", "single_cpu")
    assert "| big | 4.000 s | OOM |" in out and "Speedup over single\\_cpu" in out
    code, out, _ = _run(capsys, "table", str(store), "--placers", "single_cpu", "--workloads", "big")
    assert code == 0 and "single_cpu  single_gpu" in out and "diamond" not in out  # the reference is kept
    _assert_usage_error(*_run(capsys, "table", str(store), "--placers", "nope"), "--placers 'nope' has no rows")
    for flag in ("--placers", "--workloads"):  # an empty filter is a mistake, not "everything"
        _assert_usage_error(*_run(capsys, "table", str(store), flag, " , "), f"{flag} ' , ' names nothing")
    code, out, _ = _run(capsys, "table", str(store / "results.csv"), "-f", "csv")
    assert out.splitlines()[0].startswith("cluster,workload,placer,seeds,ok_seeds,status,step_time_s")
    # the format follows --output's suffix; --format, --json and the suffix must agree; the chart is a PNG
    code, _, _ = _run(capsys, "table", str(store), "--output", str(tmp_path / "t.csv"))
    assert code == 0 and (tmp_path / "t.csv").read_text() == out
    for extra, message in ((["-f", "md", "--output", str(tmp_path / "t.csv")], "ask for different formats (md, csv)"),
                           (["-f", "md", "--json"], "--format md and --json ask for different formats"),
                           (["--chart", str(tmp_path / "c.jpg")], "the chart is a PNG"),
                           (["--chart", str(tmp_path / "c.png"), "-o", str(tmp_path / "c.png")], "are the same file")):
        _assert_usage_error(*_run(capsys, "table", str(store), *extra), message)
    assert not (tmp_path / "c.png").exists()
    shutil.copy(store / "results.csv", tmp_path / "r.csv")
    _assert_usage_error(*_run(capsys, "compare", str(store), str(tmp_path / "r.csv"), "-o", str(tmp_path / "c.html")),
                        "this command writes text, md, csv, json, not html")
    code, out, _ = _run(capsys, "leaderboard", str(store), "--out", str(tmp_path / "results"))
    assert code == 0 and "(spec " in (tmp_path / "results" / "leaderboard.md").read_text()  # names its run
    assert (tmp_path / "results" / "leaderboard.png").exists() and (tmp_path / "results" / "leaderboard.csv").exists()
    chart = (tmp_path / "results" / "leaderboard.png").read_bytes()
    code, out, err = _run(capsys, "leaderboard", str(store), "--out", str(tmp_path / "results"), "--no-chart")
    assert code == 0 and "leaderboard.png" not in out and (tmp_path / "results" / "leaderboard.png").read_bytes() == chart
    assert f"{tmp_path / 'results' / 'leaderboard.png'} is from an earlier leaderboard, not of these rows" in err
    _assert_usage_error(*_run(capsys, "leaderboard", str(store), "--out", str(tmp_path / "t.csv")),
                        f"--out: cannot write {tmp_path / 't.csv'}: {tmp_path / 't.csv'} is a file, not a directory")


def test_run_json_rows_have_objects_or_null(capsys, tiny_files, write_spec, tmp_path, harness_plugin):
    """A row's peak memory per device and parameters are objects in --json (stored as JSON text), or null for a
    row without them (a placer that raised), as a missing number is; never the stored empty text."""
    spec = write_spec(workloads=[str(tiny_files["diamond"])], clusters=[str(tiny_files["cluster"])],
                      placers=["single_cpu", "harness_raises"], plugins=[harness_plugin])
    code, out, _ = _run(capsys, "run", str(spec), "--out", str(tmp_path / "store"), "--json", "--jobs", "1")
    rows = {r["placer"]: r for r in json.loads(out)["rows"]}
    assert code == 0 and rows["single_cpu"]["peak_memory_bytes"] == {"cpu:0": 3000, "gpu:0": 0}
    assert rows["harness_raises"]["status"] == "error" and rows["harness_raises"]["peak_memory_bytes"] is None
    assert rows["harness_raises"]["max_peak_memory_bytes"] is None and rows["harness_raises"]["params"] == {}


# -- bad input: one line, exit 2, nothing lost -----------------------------------------------------------------
def test_a_stored_cell_whose_json_text_is_damaged_is_one_line_not_a_traceback(capsys, tiny_files, write_spec,
                                                                               tmp_path):
    """run --json shows peak_memory_bytes as an object: a stored cell with bad JSON text there was a
    JSONDecodeError traceback after the run; now it is named before any work."""
    spec = write_spec(workloads=[str(tiny_files["diamond"])], clusters=[str(tiny_files["cluster"])],
                      placers=["single_cpu"])
    store = tmp_path / "store"
    assert _run(capsys, "run", str(spec), "--out", str(store), "--quiet")[0] == 0
    [cell] = (store / "cells").glob("*.json")
    cell.write_text(json.dumps({**json.loads(cell.read_text()), "peak_memory_bytes": "{cpu:0: 3000}"}))
    code, out, err = _run(capsys, "run", str(spec), "--out", str(store), "--json")
    _assert_usage_error(code, out, err, f"{cell}: peak_memory_bytes must be empty or the JSON text of an object, "
                                        f'got "{{cpu:0: 3000}}" (a damaged cell: move it out of')
    assert out == ""


def test_unknown_names(capsys, tiny_files):
    d, c = str(tiny_files["diamond"]), str(tiny_files["cluster"])
    _assert_usage_error(*_run(capsys, "evaluate", d, "-c", "nope", "-p", "single_cpu"), "unknown cluster 'nope'; presets:")
    _assert_usage_error(*_run(capsys, "evaluate", d, "-c", c, "-p", "nope"), "unknown placer 'nope'; available:")
    _assert_usage_error(*_run(capsys, "evaluate", "missing.json", "-c", c, "-p", "single_cpu"), "missing.json")
    _assert_usage_error(*_run(capsys, "run", "nope"), "unknown spec 'nope'; built-in: full, quick")
    _assert_usage_error(*_run(capsys, "table", "no/such/store"), "no such store directory or results table")
    _assert_usage_error(*_run(capsys, "evaluate", d, "-c", c, "-p", "single_cpu", "--param", "x"), "expected KEY=VALUE")
    _assert_usage_error(*_run(capsys, "evaluate", d, "-c", c, "-p", "single_cpu", "--param", "k=1"),
                        "placer 'single_cpu': bad parameters")


def test_a_param_value_python_cannot_hold_is_an_error_not_a_string(capsys, tiny_files):
    d, c = str(tiny_files["diamond"]), str(tiny_files["cluster"])
    for value, message in (("1" * 5000, "--param batch_size: not valid JSON: Exceeds the limit"),
                           ("[" * 100000, "--param batch_size: not valid JSON: maximum recursion depth"),
                           ('{"a": 1, "a": 2}', "--param batch_size: key 'a' appears twice in one object")):
        _assert_usage_error(*_run(capsys, "evaluate", d, "-c", c, "-p", "local_search", "--param", f"batch_size={value}"),
                            message)


def test_malformed_files(capsys, tmp_path, tiny_files):
    bad_spec = tmp_path / "bad.toml"
    bad_spec.write_text("name = 'x'\nworkloads = [\n")
    _assert_usage_error(*_run(capsys, "run", str(bad_spec)), "bad.toml: not valid TOML")
    bad_spec.write_text("name = 'x'\nworkloads = ['a']\nclusters = ['b']\nplacers = ['c']\nseeds = 'zero'\n")
    _assert_usage_error(*_run(capsys, "run", str(bad_spec)), "seeds must be a non-empty list of integers in [0, 2**32), got 'zero'")
    bad_cluster = tmp_path / "c.toml"
    bad_cluster.write_text("name = 'c'\n[[devices]]\nname = 'd'\nkind = 'tpu'\n")
    _assert_usage_error(*_run(capsys, "evaluate", str(tiny_files["diamond"]), "-c", str(bad_cluster), "-p", "single_cpu"),
                        "c.toml")
    bad_graph = tmp_path / "g.json"
    bad_graph.write_text('{"format": "placebench.opgraph", "schema_version": 1')
    _assert_usage_error(*_run(capsys, "show", str(bad_graph)), "g.json")
    data = json.loads(tiny_files["diamond"].read_text())
    del data["hash"]
    bad_graph.write_text(json.dumps({**data, "name": "\ud800"}))  # json writes the lone surrogate as its escape
    _assert_usage_error(*_run(capsys, "show", str(bad_graph)), "g.json: name = '\\ud800': a lone surrogate escape")


def test_a_cluster_file_whose_op_times_overflow_is_named(capsys, tiny_files, tmp_path):
    text = tiny_files["cluster"].read_text()
    slow = tmp_path / "slow.toml"  # 1e9 FLOPs at 1e-300 FLOP/s: an infinite op time, found when costs are built
    slow.write_text(text.replace("peak_flops = 1e9", "peak_flops = 1e-300"))
    _assert_usage_error(*_run(capsys, "evaluate", str(tiny_files["diamond"]), "-c", str(slow), "-p", "single_cpu"),
                        f"{slow}: cluster 'tiny': op 'a' of workload 'diamond' on device 'cpu:0' takes inf s")
    placement = tmp_path / "p.json"
    placement.write_text(json.dumps({"placement": [0, 0, 0, 0]}))
    _assert_usage_error(*_run(capsys, "evaluate", str(tiny_files["diamond"]), "-c", str(slow), "--placement", str(placement)),
                        f"{slow}: cluster 'tiny': op 'a' of workload 'diamond' on device 'cpu:0' takes inf s")
    huge = tmp_path / "huge.toml"
    huge.write_text(text.replace("peak_flops = 1e9", "peak_flops = 1" + "0" * 400))
    _assert_usage_error(*_run(capsys, "evaluate", str(tiny_files["diamond"]), "-c", str(huge), "-p", "single_cpu"),
                        "peak_flops: an integer of about 401 digits must be a finite positive number")
    huge.write_text(text.replace("peak_flops = 1e9", "peak_flops = -1" + "0" * 400))
    _assert_usage_error(*_run(capsys, "evaluate", str(tiny_files["diamond"]), "-c", str(huge), "-p", "single_cpu"),
                        "peak_flops: a negative integer of about 401 digits must be a finite positive number")
    huge.write_text(text.replace("memory_bytes = 1073741824", "memory_bytes = 1" + "0" * 400))
    _assert_usage_error(*_run(capsys, "evaluate", str(tiny_files["diamond"]), "-c", str(huge), "-p", "single_cpu"),
                        "memory_bytes: an integer of about 401 digits must be between 1 and 2**62")


def test_bad_run_arguments_fail_before_any_cell_runs(capsys, tiny_files, write_spec, tmp_path):
    spec = write_spec(workloads=[str(tiny_files["diamond"])], clusters=[str(tiny_files["cluster"])],
                      placers=["single_cpu"])
    store = tmp_path / "store"
    _assert_usage_error(*_run(capsys, "run", str(spec), "--out", str(store), "--reference", "nope"),
                        "--reference 'nope' is not a placer of spec 'test': single_cpu")
    assert not store.exists()
    with pytest.raises(SystemExit) as exc:  # an argparse error: usage line, then the message
        main(["evaluate", str(tiny_files["diamond"]), "-c", str(tiny_files["cluster"]), "-p", "single_cpu",
              "--seed", "-1"])
    assert exc.value.code == 2 and "argument --seed: '-1' must be in [0, 2**32)" in capsys.readouterr().err
    _assert_usage_error(*_run(capsys, "evaluate", str(tiny_files["diamond"]), "-c", str(tiny_files["cluster"]),
                              "-p", "local_search", "--param", "batch_size=0"), "batch_size=0: must be in [1, 4096]")


def test_paper_refuses_jobs_with_no_run(capsys, tmp_path):
    """--no-run runs nothing: a --jobs with it was ignored without a word."""
    _assert_usage_error(*_run(capsys, "paper", "placeto2019", "--no-run", "--jobs", "4", "--store", str(tmp_path / "s"),
                              "--out", str(tmp_path / "p")), "--jobs applies to running the cells, not to --no-run")
    assert list(tmp_path.iterdir()) == []


def test_argparse_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["run", "--jobs", "0"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err == ("placebench: error: argument --jobs/-j: '0' must be at least 1 "
                                           "(see placebench run --help)\n")  # one line, no usage block


@pytest.mark.parametrize("where", ["--trace", "--save-placement", "--profile", "--output", "--out", "store"])
def test_a_nul_character_in_any_argument_is_one_line_before_any_work(capsys, tiny_files, tmp_path, where):
    """A command line cannot hold NUL, but a caller of main() can pass one: one line, nothing written."""
    bad = str(tmp_path / "a\x00b")
    cell = [str(tiny_files["diamond"]), "-c", str(tiny_files["cluster"]), "-p", "single_gpu"]
    argv = {"--trace": ["evaluate", *cell, "--save-placement", str(tmp_path / "p.json"), "--trace", bad],
            "--save-placement": ["evaluate", *cell, "--save-placement", bad],
            "--profile": ["evaluate", *cell, "--profile", bad],
            "--output": ["table", str(tmp_path), "--output", bad],
            "--out": ["leaderboard", str(tmp_path), "--out", bad],
            "store": ["compare", bad, str(tmp_path)]}[where]
    _assert_usage_error(*_run(capsys, *argv), f"argument {bad!r} contains a NUL character")
    assert list(tmp_path.iterdir()) == []


def test_an_interrupt_while_the_command_line_is_read_is_clean(capsys, monkeypatch):
    """Building the parser imports much of the suite: a Ctrl-C then is the interrupt message and exit 130."""
    import suite.cli

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(suite.cli, "build_parser", interrupted)
    try:
        result = _run(capsys, "run")
    except KeyboardInterrupt:  # not let through: pytest would stop the whole session
        pytest.fail("the interrupt went through main")
    assert result == (130, "", "placebench: interrupted\n")


def _readme_commands() -> dict[str, str]:
    """The README's "Commands" block: the text of each `placebench COMMAND` synopsis (continuation lines included)."""
    block = README.read_text().split("## Commands", 1)[1].split("```", 2)[1]
    out: dict[str, str] = {}
    command = None
    for line in block.splitlines():
        if m := re.match(r"placebench (\w+)", line):
            command = m.group(1)
        if command is not None:
            out[command] = out.get(command, "") + " " + line
    return out


def test_the_readme_synopsis_names_every_option_of_every_command_and_no_other():
    import argparse

    from suite.cli import build_parser

    readme = _readme_commands()
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert set(readme) == set(sub.choices)
    for name, parser in sub.choices.items():
        options = {s for a in parser._actions for s in a.option_strings if s.startswith("--") and s != "--help"}
        assert set(re.findall(r"--[a-z][a-z-]*", readme[name])) == options, name
        for action in parser._actions:  # an option with choices is shown with exactly those: --engine fast|reference
            if action.choices and action.option_strings:
                flag = next(s for s in action.option_strings if s.startswith("--"))
                shown = re.findall(re.escape(flag) + r" ([\w|:]+)", readme[name])
                assert [set(x.split("|")) for x in shown] == [set(action.choices)] * len(shown) and shown, (name, flag)


def test_the_readme_states_the_exit_codes_the_command_line_returns():
    from suite.cli import EXIT_INTERRUPTED, EXIT_NOT_OK, EXIT_TERMINATED, EXIT_USAGE

    text = " ".join(README.read_text().split("## Commands", 1)[1].split("## Concepts", 1)[0].split())
    assert f"exit code {EXIT_USAGE}" in text and f"and {EXIT_NOT_OK} for any other" in text
    assert f"Ctrl-C exits {EXIT_INTERRUPTED} and SIGTERM {EXIT_TERMINATED}" in text


def test_importing_the_cli_loads_neither_numpy_nor_the_suite():
    """`placebench` reaches `main`, which handles Ctrl-C, before numpy and the suite load: a Ctrl-C while they
    load is the interrupt message, not a traceback."""
    code = "import sys, suite.cli; print([m for m in ('numpy', 'suite.graph', 'suite.runner') if m in sys.modules])"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stdout) == (0, "[]\n"), r.stderr


# -- the installed console script ------------------------------------------------------------------------------
@pytest.mark.skipif(shutil.which("placebench") is None, reason="console script not installed")
def test_console_script(tmp_path):
    ok = subprocess.run(["placebench", "list", "clusters"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and "haswell_2k80" in ok.stdout
    bad = subprocess.run(["placebench", "show", str(tmp_path / "nope.json")], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.startswith("placebench: error:") and "Traceback" not in bad.stderr


def _with_stdout_gone(args, buffered, gone="stdout"):
    """Run placebench with its stdout (or stderr) a pipe whose reader has already left (`| head` done reading)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if not buffered:
        env["PYTHONUNBUFFERED"] = "1"
    r, w = os.pipe()
    os.close(r)
    streams = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, gone: w}
    try:
        return subprocess.run([sys.executable, "-m", "suite.cli", *args], **streams, text=True, env=env, timeout=300)
    finally:
        os.close(w)


@pytest.mark.parametrize("buffered", [True, False])
def test_a_reader_that_left_changes_neither_the_exit_code_nor_the_files_written(tiny_files, tmp_path, buffered):
    """Python's stdout is block-buffered on a pipe (its final flush failed: exit 120 and "Exception ignored"),
    unbuffered under PYTHONUNBUFFERED (the print failed: exit 0 before --save-placement and --trace were
    written, even for a cell that is not ok)."""
    cell = ["evaluate", str(tiny_files["diamond"]), "-c", str(tiny_files["cluster"]), "-p", "m_etf"]
    saved, trace = tmp_path / "p.json", tmp_path / "t.json"
    r = _with_stdout_gone([*cell, "--save-placement", str(saved), "--trace", str(trace)], buffered)
    assert (r.returncode, r.stderr) == (0, f"trace: {trace} (open it in https://ui.perfetto.dev or chrome://tracing)\n")
    assert set(json.loads(saved.read_text())["placement"]) == {"a", "b", "c", "d"}  # diamond's ops
    assert json.loads(trace.read_text())["otherData"]["placer"] == "m_etf"
    r = _with_stdout_gone(["evaluate", str(tiny_files["big"]), "-c", str(tiny_files["cluster"]), "-p", "single_gpu",
                           "--json"], buffered)
    assert (r.returncode, r.stderr) == (1, "")  # oom: the verdict holds
    r = _with_stdout_gone(["show", "--cluster", str(tiny_files["cluster"])], buffered)
    assert (r.returncode, r.stderr) == (0, "")


def test_a_run_whose_progress_reader_left_runs_every_cell(tiny_files, write_spec, tmp_path):
    """`placebench run 2>&1 | head`: the progress line of the first cell failed, the run stopped there (exit 120,
    "Exception ignored"), its other cells not run."""
    spec = write_spec(workloads=[str(tiny_files["diamond"]), str(tiny_files["chain"])],
                      clusters=[str(tiny_files["cluster"])], placers=["single_cpu", "m_etf"])
    store = tmp_path / "store"
    r = _with_stdout_gone(["run", str(spec), "--out", str(store), "--jobs", "1"], buffered=True, gone="stderr")
    assert (r.returncode, "Step time on tiny" in r.stdout) == (0, True)
    runs = json.loads((store / "manifest.json").read_text())["runs"]
    assert [(run["complete"], run["cells_run"]) for run in runs] == [(True, 4)]


def test_module_entry_point():
    r = subprocess.run([sys.executable, "-m", "suite.cli", "--version"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("placebench ")


def test_readme_starts_with_the_two_commands_and_ci_runs_the_second():
    root = Path(__file__).resolve().parents[1]
    first_two = [line.strip() for line in (root / "README.md").read_text().splitlines()[:2]]
    assert first_two == [
        "python -m pip install -e . && placebench run",
        'python -m pip install -e ".[test]" && python -m pytest',
    ]
    ci = (root / ".ci" / "run").read_text()
    assert ci.startswith("#!/usr/bin/env bash") and "set -euo pipefail" in ci
    assert 'python -m pip install -e ".[test]"' in ci and "python -m pytest" in ci and "-eq 5" in ci
    assert os.access(root / ".ci" / "run", os.X_OK)


def test_the_readme_names_the_torch_range_that_pyproject_admits():
    """GPU users install a CUDA torch before the README's first command; one outside the dependency's range is
    replaced (by torch 2.13, and by the CPU wheel on a machine that offers one), so the README names the range."""
    import tomllib

    root = Path(__file__).resolve().parents[1]
    deps = tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]
    [torch_dep] = [d for d in deps if re.match(r"torch\b", d)]
    low = re.search(r">=\s*(\d+\.\d+)", torch_dep).group(1)
    major, minor = re.search(r"<\s*(\d+)\.(\d+)\b", torch_dep).groups()
    top = f"{major}.{int(minor) - 1}"
    install = " ".join((root / "README.md").read_text().split("# placebench", 1)[0].split())
    assert f"a CUDA build of torch {low} to {top}, the range `pyproject.toml` admits" in install


def test_the_license_is_an_spdx_expression_with_the_setuptools_that_reads_it():
    """setuptools deprecates `project.license` as a table ({ text = ... }) and stops building such projects
    after 2027-02-18; the README's commands build with the newest setuptools. A plain SPDX string needs
    setuptools 77 or newer."""
    import tomllib

    data = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert data["project"]["license"] == "Apache-2.0"
    assert data["build-system"]["requires"] == ["setuptools>=77"]


def test_a_plugin_cannot_take_an_installed_placers_name(capsys, tiny_files, tmp_path):
    plugin = tmp_path / "shadow.py"
    plugin.write_text("from suite.placer import BasePlacer, register_placer\n\n"
                      "@register_placer('m_etf')\nclass Shadow(BasePlacer):\n    pass\n")
    _assert_usage_error(*_run(capsys, "evaluate", str(tiny_files["diamond"]), "-c", str(tiny_files["cluster"]),
                              "-p", "m_etf", "--plugin", str(plugin)),
                        "placer name 'm_etf' is taken by the installed placer baselines.m_etf:")


def test_two_plugins_cannot_share_a_name(capsys, tmp_path):
    """A stale copy of a plugin listed beside it must not silently replace the placer (or evaluator) under
    test; loading the same file twice, under two spellings of its path, is fine."""
    from suite.placer import unregister_placer
    from suite.runner import _EVALUATORS

    body = ("from suite.placer import BasePlacer, register_placer\nfrom suite.runner import register_evaluator\n\n"
            "@register_placer('twin_placer')\nclass Twin(BasePlacer):\n    pass\n\n"
            "@register_evaluator('twin_eval')\ndef twin(workload, cluster, methodology):\n    pass\n")
    first, copy = tmp_path / "first.py", tmp_path / "copy.py"
    first.write_text(body)
    copy.write_text(body)
    try:
        code, out, _ = _run(capsys, "list", "placers", "--plugin", str(first), "--plugin",
                            f"{tmp_path}/../{tmp_path.name}/first.py", "--json")
        assert code == 0 and "twin_placer" in {p["name"] for p in json.loads(out)}
        _assert_usage_error(*_run(capsys, "list", "placers", "--plugin", str(first), "--plugin", str(copy)),
                            "placer name 'twin_placer' is taken by placebench_plugin_first_")
        copy.write_text(body.replace("@register_placer('twin_placer')", "@register_placer('twin_other')"))
        _assert_usage_error(*_run(capsys, "list", "placers", "--plugin", str(first), "--plugin", str(copy)),
                            "evaluator name 'twin_eval' is taken by placebench_plugin_first_")
    finally:
        for name in ("twin_placer", "twin_other"):
            unregister_placer(name)
        _EVALUATORS.pop("twin_eval", None)


def test_a_plugin_cannot_take_the_simulators_name(capsys, tmp_path):
    plugin = tmp_path / "fake_sim.py"
    plugin.write_text("from suite.runner import register_evaluator\n\n"
                      "@register_evaluator('simulator')\ndef fake(workload, cluster, methodology):\n    pass\n")
    _assert_usage_error(*_run(capsys, "list", "placers", "--plugin", str(plugin)),
                        "evaluator name 'simulator' is taken by the built-in simulator")


def test_a_plugin_that_exits_at_import_is_an_error_not_a_success(capsys, tiny_files, tmp_path):
    plugin = tmp_path / "quits.py"
    plugin.write_text("import sys\nsys.exit(0)\n")
    _assert_usage_error(*_run(capsys, "evaluate", str(tiny_files["diamond"]), "-c", str(tiny_files["cluster"]),
                              "-p", "single_cpu", "--plugin", str(plugin)),
                        f"plugin {str(plugin)!r} called sys.exit(0) while being imported")


def test_run_says_when_it_reruns_cells_whose_placer_changed(capsys, tiny_files, write_spec, tmp_path, monkeypatch):
    from suite import runner

    spec = write_spec(workloads=[str(tiny_files["diamond"])], clusters=[str(tiny_files["cluster"])],
                      placers=["single_cpu", "single_gpu"])
    store = tmp_path / "my store"
    code, _, err = _run(capsys, "run", str(spec), "--out", str(store), "--jobs", "1")
    assert code == 0 and err.endswith(f"results in {store}/ (placebench table '{store}')\n")  # a command to paste
    monkeypatch.setattr(runner, "placer_code", lambda name: "0123456789ab" if name == "single_cpu" else None)
    code, _, err = _run(capsys, "run", str(spec), "--out", str(store), "--jobs", "1")
    assert code == 0 and "1 stored cell(s) were made by other code of their placer; running them again" in err
    assert "1 of 2 cells already stored; running 1" in err and "(1 run now, 1 from the store)" in err
    # a warning, not progress: --json (quiet progress, JSON on stdout) still says it on stderr; --quiet does not
    monkeypatch.setattr(runner, "placer_code", lambda name: "ba9876543210" if name == "single_cpu" else None)
    code, out, err = _run(capsys, "run", str(spec), "--out", str(store), "--jobs", "1", "--json")
    assert code == 0 and "1 stored cell(s) were made by other code of their placer" in err and json.loads(out)
    assert "already stored" not in err  # progress stays quiet
    monkeypatch.setattr(runner, "placer_code", lambda name: "0123456789ab" if name == "single_cpu" else None)
    code, _, err = _run(capsys, "run", str(spec), "--out", str(store), "--jobs", "1", "--quiet")
    assert code == 0 and "stored cell(s)" not in err


def test_tables_of_an_incomplete_store_say_so(capsys, tiny_files, write_spec, tmp_path):
    spec = write_spec(workloads=[str(tiny_files["diamond"])], clusters=[str(tiny_files["cluster"])],
                      placers=["single_cpu"])
    store = tmp_path / "store"
    assert _run(capsys, "run", str(spec), "--out", str(store), "--quiet")[0] == 0
    code, _, err = _run(capsys, "table", str(store))
    assert code == 0 and "warning" not in err
    manifest = json.loads((store / "manifest.json").read_text())
    manifest["runs"][-1].update(complete=False, cells_planned=5)  # as a killed run leaves it
    (store / "manifest.json").write_text(json.dumps(manifest))
    code, _, err = _run(capsys, "table", str(store))
    assert code == 0 and "placebench: warning: incomplete store" in err and "spec test: 1 of its 1 cells to run were run (5 planned)" in err
    killed = dict(manifest["runs"][-1], run_id="killed", cells_to_run=3)  # killed outright: no count recorded
    del killed["cells_run"]
    [cell] = (store / "cells").glob("*.json")
    extra = json.loads(cell.read_text().replace(cell.stem, "extra"))
    (store / "cells" / "extra.json").write_text(json.dumps({**extra, "run_id": "killed", "seed": 1}))
    (store / "manifest.json").write_text(json.dumps({**manifest, "runs": [*manifest["runs"], killed]}))
    code, _, err = _run(capsys, "table", str(store))
    assert code == 0 and "spec test: 1 of its 3 cells to run are in the store (5 planned; the run ended without" in err, err
    (store / "cells" / "extra.json").unlink()
    (store / "manifest.json").write_text(json.dumps(manifest))
    assert _run(capsys, "leaderboard", str(store), "--out", str(tmp_path / "lb"), "--no-chart")[0] == 0
    assert "**Warning: incomplete store" in (tmp_path / "lb" / "leaderboard.md").read_text()
    from suite.store import Store

    with Store(store).writing():  # a run is writing it now: rerunning would be refused, so say that instead
        code, _, err = _run(capsys, "table", str(store / "results.csv"))
        assert code == 0 and f"placebench: warning: a run is writing {store} now" in err and "incomplete store" not in err
    # the store's own table says what its store says, and when it lags behind the cell files (a killed run)
    code, _, err = _run(capsys, "table", str(store / "results.csv"))
    assert code == 0 and "placebench: warning: incomplete store" in err and "holds 1 rows" not in err
    [cell] = (store / "cells").glob("*.json")
    (store / "cells" / "extra.json").write_text(cell.read_text().replace(cell.stem, "extra"))
    code, _, err = _run(capsys, "table", str(store / "results.csv"))
    assert code == 0 and f"{store / 'results.csv'} holds 1 rows but {store} has 2 cell files" in err
    shutil.copy(store / "results.csv", tmp_path / "copy.csv")  # a table outside a store is what it is
    code, _, err = _run(capsys, "table", str(tmp_path / "copy.csv"))
    assert code == 0 and "warning" not in err


def test_compare_and_leaderboard_on_a_stores_own_table_warn_as_the_store_would(capsys, tiny_files, write_spec,
                                                                               tmp_path):
    """A store's results.csv holds the store's rows: compare and leaderboard say that its last run stopped early
    and that the table lags the cell files, as table does, and the leaderboard names the runs that made it."""
    spec = write_spec(workloads=[str(tiny_files["diamond"])], clusters=[str(tiny_files["cluster"])],
                      placers=["single_cpu"])
    base, new = tmp_path / "base", tmp_path / "new"
    for store in (base, new):
        assert _run(capsys, "run", str(spec), "--out", str(store), "--quiet")[0] == 0
    manifest = json.loads((new / "manifest.json").read_text())
    manifest["runs"][-1].update(complete=False, cells_planned=5)  # as a killed run leaves it
    (new / "manifest.json").write_text(json.dumps(manifest))
    [cell] = (new / "cells").glob("*.json")
    (new / "cells" / "extra.json").write_text(cell.read_text().replace(cell.stem, "extra"))
    table = new / "results.csv"
    incomplete = "incomplete store: the last run of 1 spec(s) stopped before it finished"
    lags = f"placebench: warning: {table} holds 1 rows but {new} has 2 cell files"
    code, _, err = _run(capsys, "compare", str(base), str(table))
    assert code == 0 and f"placebench: warning: NEW {table}: {incomplete}" in err and lags in err, err
    assert f"BASE {base}" not in err  # the store that stopped early is named, and only it
    incomplete = f"placebench: warning: {incomplete}"
    code, _, err = _run(capsys, "leaderboard", str(table), "--out", str(tmp_path / "lb"), "--no-chart",
                        "--reference", "single_cpu")
    assert code == 0 and incomplete in err and lags in err, err
    md = (tmp_path / "lb" / "leaderboard.md").read_text()
    assert "**Warning: incomplete store" in md and f"**Warning: {table} holds 1 rows" in md
    assert f"Run {manifest['runs'][-1]['run_id']} (spec test, 1 cells" in md


def test_a_run_killed_before_its_first_cell_stored_none(capsys, tiny_files, write_spec, tmp_path):
    """A run killed outright (no count recorded) in a store without a cell: 0 of its cells are stored, not "?"."""
    spec = write_spec(workloads=[str(tiny_files["diamond"])], clusters=[str(tiny_files["cluster"])],
                      placers=["single_cpu", "single_gpu"])
    store = tmp_path / "store"
    assert _run(capsys, "run", str(spec), "--out", str(store), "--quiet")[0] == 0
    manifest = json.loads((store / "manifest.json").read_text())
    run = {k: v for k, v in manifest["runs"][-1].items() if k not in ("cells_run", "finished_at")}
    (store / "manifest.json").write_text(json.dumps({**manifest, "runs": [{**run, "complete": False}]}))
    for cell in (store / "cells").glob("*.json"):
        cell.unlink()
    code, _, err = _run(capsys, "table", str(store))
    assert code == 2 and ("spec test: 0 of its 2 cells to run are in the store (2 planned; the run ended without "
                          "recording how many it ran)") in err, err


def test_a_complete_run_of_another_spec_does_not_hide_an_incomplete_one(capsys, tiny_files, write_spec, tmp_path):
    store = tmp_path / "store"
    for name, placer in (("first", "single_cpu"), ("second", "m_etf")):
        spec = write_spec(name, workloads=[str(tiny_files["diamond"])], clusters=[str(tiny_files["cluster"])],
                          placers=[placer])
        assert _run(capsys, "run", str(spec), "--out", str(store), "--quiet")[0] == 0
        if name == "first":  # as a run stopped part-way leaves it
            manifest = json.loads((store / "manifest.json").read_text())
            manifest["runs"][-1].update(complete=False, cells_planned=4, cells_to_run=4, cells_run=1)
            (store / "manifest.json").write_text(json.dumps(manifest))
    code, _, err = _run(capsys, "table", str(store))
    assert code == 0 and "incomplete store: the last run of 1 spec(s) stopped" in err
    assert "spec first: 1 of its 4 cells to run were run (4 planned)" in err and "second" not in err


def test_a_filtered_table_adds_the_reference_only_where_it_has_rows(capsys, tiny_files, write_spec, tmp_path):
    store = tmp_path / "store"
    spec = write_spec(workloads=[str(tiny_files["diamond"])], clusters=["xeon_h100", str(tiny_files["cluster"])],
                      placers=["single_cpu", "single_gpu"])
    assert _run(capsys, "run", str(spec), "--out", str(store), "--quiet")[0] == 0
    rows = [json.loads(p.read_text()) for p in (store / "cells").iterdir()]
    tiny = next(r["cluster"] for r in rows if r["cluster"] != "xeon_h100")
    for p in (store / "cells").iterdir():  # no single_gpu rows on the tiny cluster
        r = json.loads(p.read_text())
        if r["cluster"] == tiny and r["placer"] == "single_gpu":
            p.unlink()
    code, out, err = _run(capsys, "table", str(store), "--cluster", tiny, "--placers", "single_cpu")
    assert code == 0 and "single_gpu" not in out and "single_cpu" in out, err
    code, out, _ = _run(capsys, "table", str(store), "--cluster", "xeon_h100", "--placers", "single_cpu")
    assert code == 0 and "Speedup over single_gpu on xeon_h100" in out


def test_placers_filter_takes_a_label_whose_parameters_hold_commas(capsys, tmp_path):
    """A placer entry with two parameters is labelled `ls(a=1,b="x,y")` by default: --placers splits at the
    commas between names, not at those inside a label's brackets or JSON strings."""
    from suite.store import write_table

    table = write_table([_ok_row('ls(a=1,b="x,y")', 1.0), _ok_row("ls(a=[1,2])", 2.0), _ok_row("single_cpu", 4.0),
                         _ok_row("other", 8.0)], tmp_path / "t.csv")
    code, out, err = _run(capsys, "table", str(table), "--placers", 'ls(a=1,b="x,y"), ls(a=[1,2]),single_cpu',
                          "--reference", "single_cpu", "--format", "csv")
    assert code == 0, err
    assert [(r["placer"], r["step_time_s"]) for r in csv.DictReader(io.StringIO(out))] == [
        ('ls(a=1,b="x,y")', "1.0"), ("ls(a=[1,2])", "2.0"), ("single_cpu", "4.0")]


def test_a_filter_name_dropped_by_an_earlier_filter_is_named_as_such(capsys, tmp_path):
    """w2 has rows in the table, on cluster c1 only: with --cluster c2 the error says which filter left it
    without rows, instead of claiming that the table has none."""
    from suite.store import write_table

    def row(cluster, workload):
        return {"cell_id": cluster + workload, "cluster": cluster, "workload": workload, "placer": "a", "seed": 0,
                "status": "ok", "step_time_s": 1.0}

    table = write_table([row("c1", "w1"), row("c1", "w2"), row("c2", "w1")], tmp_path / "t.csv")
    _assert_usage_error(*_run(capsys, "table", str(table), "--cluster", "c2", "--workloads", "w2"),
                        f"--workloads 'w2' has no rows in {table} with --cluster c2; workloads: w1")
    _assert_usage_error(*_run(capsys, "table", str(table), "--workloads", "w3"),
                        f"--workloads 'w3' has no rows in {table}; workloads: w1, w2")


def test_a_leaderboard_that_cannot_be_made_leaves_the_old_one(capsys, tiny_files, write_spec, tmp_path):
    store, lb = tmp_path / "store", tmp_path / "lb"
    spec = write_spec(workloads=[str(tiny_files["diamond"])], clusters=["xeon_h100"], placers=["single_cpu"])
    assert _run(capsys, "run", str(spec), "--out", str(store), "--quiet")[0] == 0
    lb.mkdir()
    for name in ("leaderboard.md", "leaderboard.csv", "leaderboard.png"):
        (lb / name).write_text("old")
    _assert_usage_error(*_run(capsys, "leaderboard", str(store), "--out", str(lb)), "no single_gpu rows")
    assert all((lb / name).read_text() == "old" for name in ("leaderboard.md", "leaderboard.csv", "leaderboard.png"))
    _assert_usage_error(*_run(capsys, "table", str(store), "--chart", str(lb / "c.png"), "--output", str(lb / "t.md"),
                              "--format", "md"), "no single_gpu rows")
    assert sorted(p.name for p in lb.iterdir()) == ["leaderboard.csv", "leaderboard.md", "leaderboard.png"]


def test_reports_are_not_written_into_their_store_and_are_replaced_together(capsys, tiny_files, write_spec, tmp_path):
    store, lb = tmp_path / "store", tmp_path / "lb"
    spec = write_spec(workloads=[str(tiny_files["diamond"])], clusters=[str(tiny_files["cluster"])],
                      placers=["single_cpu", "single_gpu"])
    assert _run(capsys, "run", str(spec), "--out", str(store), "--quiet")[0] == 0
    before = {p: p.read_bytes() for p in store.rglob("*") if p.is_file()}
    for argv in (["table", str(store), "-f", "json", "-o", str(store / "manifest.json")],
                 ["table", str(store), "--chart", str(store / "cells" / "x.png")],
                 ["table", str(store / "results.csv"), "-f", "csv", "-o", str(store / "results.csv")],
                 ["leaderboard", str(store), "--out", str(store)]):
        _assert_usage_error(*_run(capsys, *argv), "is inside the results store")
    assert {p: p.read_bytes() for p in store.rglob("*") if p.is_file()} == before
    # the chart cannot be written (a directory is in the way): the table beside it is not written either
    (tmp_path / "c.png").mkdir()
    _assert_usage_error(*_run(capsys, "table", str(store), "-f", "md", "-o", str(tmp_path / "t.md"),
                              "--chart", str(tmp_path / "c.png")), f"--chart: cannot write {tmp_path / 'c.png'}: it is a directory")
    assert not (tmp_path / "t.md").exists() and not list(tmp_path.glob(".*.tmp"))
    lb.mkdir()
    for name in ("leaderboard.md", "leaderboard.csv"):
        (lb / name).write_text("old")
    (lb / "leaderboard.png").mkdir()
    _assert_usage_error(*_run(capsys, "leaderboard", str(store), "--out", str(lb)), "it is a directory")
    assert (lb / "leaderboard.md").read_text() == "old" and (lb / "leaderboard.csv").read_text() == "old"
    _assert_usage_error(*_run(capsys, "table", str(store), "-o", "/proc/placebench.md"), "cannot write /proc/placebench.md")
    # a link is written through, a device directly: neither is replaced by a file
    (tmp_path / "shared.md").write_text("old")
    (tmp_path / "latest.md").symlink_to(tmp_path / "shared.md")
    assert _run(capsys, "table", str(store), "-o", str(tmp_path / "latest.md"))[0] == 0
    assert (tmp_path / "latest.md").is_symlink() and "single\\_gpu" in (tmp_path / "shared.md").read_text()
    _assert_usage_error(*_run(capsys, "table", str(store), "-o", "/dev/full"), "cannot write /dev/full: No space left")
    _assert_usage_error(*_run(capsys, "run", "quick", "--out", "/proc/placebench"),
                        "--out: cannot write /proc/placebench: No such file or directory")
    # a store given as one of its table files is protected the same way
    before = {p: p.read_bytes() for p in store.rglob("*") if p.is_file()}
    for argv in (["table", str(store / "results.csv"), "-f", "json", "-o", str(store / "manifest.json")],
                 ["table", str(store / "results.parquet"), "-f", "csv", "-o", str(store / "results.csv")],
                 ["leaderboard", str(store / "results.csv"), "--out", str(store)]):
        _assert_usage_error(*_run(capsys, *argv), f"{argv[-1]} is inside the results store {store}")
    assert {p: p.read_bytes() for p in store.rglob("*") if p.is_file()} == before


@contextlib.contextmanager
def _read_only(directory: Path):
    """`directory` takes no new file: by its mode, or for root (whom modes do not stop) by the immutable flag,
    or where that is not available (a container) by refusing, as the kernel would, every `os.open` that
    creates a file in it and every `os.mkdir` in it (this process only)."""
    if os.geteuid() != 0:
        directory.chmod(0o555)
        try:
            yield
        finally:
            directory.chmod(0o755)
        return
    if shutil.which("chattr") is not None and not subprocess.run(["chattr", "+i", str(directory)],
                                                                 capture_output=True).returncode:
        try:
            yield
        finally:
            subprocess.run(["chattr", "-i", str(directory)], check=True)
        return
    real_open, real_mkdir, inside = os.open, os.mkdir, os.path.realpath(directory)
    creates = os.O_CREAT | getattr(os, "O_TMPFILE", 0)

    def refused(path, created: bool) -> bool:
        path = os.path.realpath(os.fspath(path))
        return created and (os.path.dirname(path) == inside or path == inside)

    def guarded_open(path, flags, *args, **kwargs):
        if refused(path, bool(flags & creates)):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_open(path, flags, *args, **kwargs)

    def guarded_mkdir(path, *args, **kwargs):
        if refused(path, True):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_mkdir(path, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "open", guarded_open)
        mp.setattr(os, "mkdir", guarded_mkdir)
        yield


@pytest.mark.parametrize("where", ["cells", "."])
def test_run_refuses_a_store_it_cannot_write_before_any_work(capsys, tiny_files, write_spec, tmp_path, where):
    """Found before any placer runs (not at the first cell, after its work) and before the store is changed."""
    store = tmp_path / "store"
    spec = write_spec(workloads=[str(tiny_files["diamond"])], clusters=[str(tiny_files["cluster"])],
                      placers=["single_cpu"], seeds=[0])
    assert _run(capsys, "run", str(spec), "--out", str(store), "--quiet")[0] == 0
    spec = write_spec(workloads=[str(tiny_files["diamond"])], clusters=[str(tiny_files["cluster"])],
                      placers=["single_cpu"], seeds=[0, 1])
    before = {p: p.read_bytes() for p in store.rglob("*") if p.is_file()}
    with _read_only(store / where):
        code, out, err = _run(capsys, "run", str(spec), "--out", str(store), "--quiet")
    _assert_usage_error(code, out, err, f"cannot write {store / where}")
    assert {p: p.read_bytes() for p in store.rglob("*") if p.is_file()} == before


def test_run_refuses_an_empty_out(capsys, tiny_files, write_spec):
    spec = write_spec(workloads=[str(tiny_files["diamond"])], clusters=[str(tiny_files["cluster"])], placers=["single_cpu"])
    _assert_usage_error(*_run(capsys, "run", str(spec), "--out", ""), "--out is empty")


def test_terminal_tables_show_labels_and_messages_as_text(capsys, monkeypatch, tiny_files, write_spec, tmp_path):
    """On a terminal the tables go through rich: brackets in labels are text, not markup."""
    import suite.cli

    store = tmp_path / "store"
    spec = write_spec(workloads=[str(tiny_files["diamond"])], clusters=["xeon_h100"],
                      placers=[{"name": "local_search", "params": {"batch_size": 2}, "label": "ls[b=2]"},
                               {"name": "single_cpu", "label": "cpu[/x]"}])
    assert _run(capsys, "run", str(spec), "--out", str(store), "--quiet")[0] == 0
    monkeypatch.setattr(suite.cli, "_tty", lambda stream: True)
    monkeypatch.setenv("COLUMNS", "200")
    code, out, err = _run(capsys, "table", str(store))
    assert code == 0 and "ls[b=2]" in out and "cpu[/x]" in out and "─" in out, err  # rich's box drawing


def test_tables_say_when_rows_come_from_different_code(capsys, tiny_files, write_spec, tmp_path):
    store, lb = tmp_path / "store", tmp_path / "lb"
    for placer in ("single_cpu", "m_etf"):  # two runs, each leaving rows
        spec = write_spec(workloads=[str(tiny_files["diamond"])], clusters=[str(tiny_files["cluster"])],
                          placers=[placer])
        assert _run(capsys, "run", str(spec), "--out", str(store), "--quiet")[0] == 0
    manifest = json.loads((store / "manifest.json").read_text())

    def table_warns(first, second):
        manifest["runs"][0]["git"], manifest["runs"][1]["git"] = first, second
        (store / "manifest.json").write_text(json.dumps(manifest))
        code, _, err = _run(capsys, "table", str(store))
        assert code == 0
        return "mixed code" in err

    clean_a, clean_b = {"commit": "a" * 40, "dirty": False}, {"commit": "b" * 40, "dirty": False}
    outside_git = {"commit": None, "dirty": None}
    assert not table_warns(clean_a, clean_a)
    assert not table_warns(outside_git, outside_git)  # same placebench version
    assert table_warns(clean_a, outside_git)
    manifest["runs"][1]["packages"]["placebench"] = "0.0.1"
    assert table_warns(outside_git, outside_git)  # outside git the version tells the code apart
    assert table_warns(clean_a, {"commit": "a" * 40, "dirty": True})
    assert table_warns({"commit": "a" * 40, "dirty": True}, {"commit": "a" * 40, "dirty": True})
    assert table_warns(clean_a, clean_b)
    _, _, err = _run(capsys, "table", str(store), "--placers", "m_etf")  # only the second run's rows: one code
    assert "mixed code" not in err
    assert _run(capsys, "leaderboard", str(store), "--out", str(lb), "--no-chart")[0] == 0
    text = (lb / "leaderboard.md").read_text()
    assert "**Warning: mixed code: these rows come from 2 runs of aaaaaaaaaaaa, bbbbbbbbbbbb;" in text
    other = tmp_path / "other"  # compare names the store whose rows are mixed
    shutil.copytree(store, other)
    manifest["runs"][0]["git"] = manifest["runs"][1]["git"] = clean_a
    (other / "manifest.json").write_text(json.dumps(manifest))
    for base, new, side in ((store, other, f"BASE {store}"), (other, store, f"NEW {store}")):
        _, _, err = _run(capsys, "compare", str(base), str(new))
        assert err.count("mixed code") == 1, err
        assert f"placebench: warning: {side}: mixed code: these rows come from 2 runs of aaaaaaaaaaaa, bbbbbbbbbbbb;" in err


def test_an_interrupted_evaluate_does_not_claim_to_have_stored_cells(capsys, monkeypatch):
    import suite.cli

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(suite.cli, "cmd_evaluate", interrupted)
    code, _, err = _run(capsys, "evaluate", "w", "--cluster", "c", "--placer", "p")
    assert code == suite.cli.EXIT_INTERRUPTED and err == "placebench: interrupted\n"


def test_an_interrupted_run_says_what_its_store_keeps(capsys, monkeypatch, tiny_files, write_spec, tmp_path):
    """Ctrl-C exits 130 and SIGTERM 143; a run that redoes stored cells (--force, --retry-failed) says the cells
    not redone yet keep their earlier rows."""
    import suite.cli
    from suite import runner

    spec = write_spec(workloads=[str(tiny_files["diamond"])], clusters=[str(tiny_files["cluster"])],
                      placers=["single_cpu"])
    stop = KeyboardInterrupt

    def interrupted(*args, **kwargs):
        raise stop

    monkeypatch.setattr(runner, "run", interrupted)
    run = ["run", str(spec), "--out", str(tmp_path / "store")]
    resume = "placebench: interrupted; finished cells are stored, rerun the same command to resume\n"
    assert _run(capsys, *run) == (130, "", resume)
    redone = ("placebench: interrupted; the cells redone so far are stored and the others keep their earlier rows: "
              "rerun the same command to redo them all\n")
    assert _run(capsys, *run, "--force") == (130, "", redone)
    assert _run(capsys, *run, "--retry-failed") == (130, "", redone)
    stop = suite.cli.Terminated
    assert _run(capsys, *run) == (143, "", resume)


def test_the_tox_gate_runs_into_an_emptied_store(tmp_path):
    """`tox -e gate` reuses runs/gate: a cell an earlier gate stored there, of a placer or workload the change
    dropped from the quick suite, would match the baseline's cell ("same") instead of being "missing". The
    gate's first command removes the store; the run then writes it afresh."""
    import configparser
    import shlex

    tox = configparser.ConfigParser(interpolation=None)
    tox.read(Path(__file__).parent.parent / "tox.ini")
    commands = [shlex.split(c) for c in tox["testenv:gate"]["commands"].strip().splitlines()]
    assert [c[:2] for c in commands[1:]] == [["placebench", "run"], ["placebench", "compare"]]
    assert commands[1][commands[1].index("--out") + 1] == commands[2][-1] == "runs/gate"
    (tmp_path / "runs" / "gate" / "cells").mkdir(parents=True)
    (tmp_path / "runs" / "gate" / "cells" / "dropped.json").write_text("{}")
    assert commands[0][0] == "python"
    subprocess.run([sys.executable, *commands[0][1:]], cwd=tmp_path, check=True)
    assert not (tmp_path / "runs" / "gate").exists()


def test_tox_installs_the_checkout_for_every_env_that_runs_placebench():
    """tox installs a package built from the checkout unless told otherwise; that copy's zoo reads and traces
    graphs in ~/.cache/placebench, not the committed results/graphs (zoo.DEFAULT_CACHE_DIR in tox's env was
    /root/.cache/placebench/graphs), so `tox -e results` and `tox -e gate` ran on graphs traced anew by the
    env's torch. Every env that installs placebench installs the checkout itself (editable)."""
    import configparser

    tox = configparser.ConfigParser(interpolation=None)
    tox.read(Path(__file__).parent.parent / "tox.ini")
    envs = [s for s in tox.sections() if s.startswith("testenv:")]
    installed = [s for s in envs if tox[s].get("skip_install", "false").strip() != "true"]
    assert {s.split(":")[1] for s in installed} == {"bench", "results", "gate"}
    for section in ["testenv", *installed]:
        assert tox[section].get("package", tox["testenv"].get("package")) == "editable", section


def test_tox_passes_on_the_variables_that_change_what_runs():
    """tox passes few of the caller's variables on: OMP_NUM_THREADS, ATEN_CPU_CAPABILITY=default or
    CUDA_VISIBLE_DEVICES given to `tox -e results` or `tox -e gate` were dropped without a word, and the run
    recorded the math pins as if the caller had set nothing. Every env passes on the runner's thread and
    kernel variables, numba's, the visible GPUs and the zoo's cache folder."""
    import configparser
    import fnmatch

    from suite import numerics, runner

    tox = configparser.ConfigParser(interpolation=None)
    tox.read(Path(__file__).parent.parent / "tox.ini")
    assert [s for s in tox.sections() if s.startswith("testenv:") and "passenv" in tox[s]] == []  # inherited
    passenv = tox["testenv"]["passenv"].split()
    wanted = [*runner._THREAD_VARS, *numerics.VARIABLES, "NUMBA_CACHE_DIR", "CUDA_VISIBLE_DEVICES",
              "XDG_CACHE_HOME", "PLACEBENCH_GRAPH_DIR"]
    assert [v for v in wanted if not any(fnmatch.fnmatchcase(v, p) for p in passenv)] == []


def test_a_real_execution_spec_runs_one_cell_at_a_time(tmp_path, capsys, monkeypatch):
    """`run` started usable-CPUs workers by default: with evaluator torch each cell's steps were timed while
    the others ran theirs on the same cores (each worker on cores / jobs threads)."""
    import suite.store
    from suite import runner

    spec = tmp_path / "real.toml"
    spec.write_text('name = "real"\nworkloads = ["rnnlm-2x2048-b64"]\nclusters = ["haswell_4k80"]\n'
                    'placers = ["single_cpu"]\nevaluator = "torch"\n')
    code, out, err = _run(capsys, "run", str(spec), "--out", str(tmp_path / "store"), "--jobs", "2")
    _assert_usage_error(code, out, err, "--jobs 2: spec 'real' times real execution (evaluator 'torch'); cells "
                                        "run in parallel would time each other: use --jobs 1")
    assert not (tmp_path / "store" / "manifest.json").exists()

    class Ran(Exception):
        pass

    def fake_run(spec, out, *, jobs, **kw):
        raise Ran(jobs)

    monkeypatch.setattr(suite.store, "usable_cpus", lambda: 4)
    monkeypatch.setattr(runner, "run", fake_run)
    with pytest.raises(Ran) as ran:
        main(["run", str(spec), "--out", str(tmp_path / "store")])
    assert ran.value.args == (1,)
    spec.write_text(spec.read_text().replace('"torch"', '"simulator"'))
    with pytest.raises(Ran) as ran:
        main(["run", str(spec), "--out", str(tmp_path / "store")])
    assert ran.value.args == (4,)


def test_a_trace_of_a_cell_measured_for_real_says_it_is_the_simulators(capsys, tiny_files, tmp_path):
    """The timeline is always the simulator's: a cell that a real backend measured must not show the simulated
    step time under that backend's name."""
    from suite.cli import _write_trace

    trace = tmp_path / "t.json"
    record = {"status": "ok", "placement": [0, 0, 0, 0], "evaluator": "torch", "step_time_s": 0.125}
    _write_trace(record, str(tiny_files["diamond"]), str(tiny_files["cluster"]), str(trace))
    other = json.loads(trace.read_text())["otherData"]
    assert (other["evaluator"], other["cell_evaluator"], other["cell_step_time_s"]) == ("simulator", "torch", 0.125)
    assert other["step_time_s"] == 4.0  # the simulator's: 4 ops of 1 s on the CPU
    assert "the trace is the simulator's timeline of the placement, not the torch run" in capsys.readouterr().err
    _write_trace({**record, "evaluator": "simulator"}, str(tiny_files["diamond"]), str(tiny_files["cluster"]), str(trace))
    other = json.loads(trace.read_text())["otherData"]
    assert other["evaluator"] == "simulator" and "cell_evaluator" not in other and "note" not in capsys.readouterr().err


def test_reports_of_results_under_a_path_that_is_not_utf8(capsys, tmp_path):
    """A store in a directory named in Latin-1 ("é" is the byte 0xe9; Python holds it as "\\udce9"): the path
    is in compare's title, the leaderboard's source and the chart's note, which were encoded as UTF-8 (and
    drawn by matplotlib) with it: a UnicodeEncodeError traceback. It is now written as its escape text."""
    from suite.store import write_table

    where = tmp_path / "runs-\udce9"
    base = write_table([_ok_row("a", 1.0), _ok_row("b", 2.0)], where / "base.csv")
    new = write_table([_ok_row("a", 1.0), _ok_row("b", 1.0)], where / "new.csv")
    code, _, err = _run(capsys, "compare", str(base), str(new), "--output", str(tmp_path / "cmp.md"))
    assert code == 0 and "Traceback" not in err
    from suite.report import md_escape  # a title's _ is escaped in Markdown

    assert "**Changes: " + md_escape(str(tmp_path)) + "/runs-\\udce9/new.csv against " in (tmp_path / "cmp.md").read_text()
    code, _, err = _run(capsys, "leaderboard", str(base), "--out", str(tmp_path / "lb"), "--reference", "a")
    assert code == 0 and "Traceback" not in err
    assert str(tmp_path) + "/runs-\\udce9/base.csv" in (tmp_path / "lb" / "leaderboard.md").read_text()
    code, _, err = _run(capsys, "table", str(base), "--reference", "a", "--chart", str(tmp_path / "t.png"))
    assert code == 0 and (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"


def test_a_path_that_is_not_utf8_on_a_strict_stdout_is_printed_as_its_escape(capsys, tmp_path):
    """stdout under a UTF-8 locale other than C refuses a lone surrogate (as capsys's does): compare's title,
    leaderboard's list of files and evaluate's placement file were a UnicodeEncodeError traceback after the
    work was done. They print the escape text, and the stream is strict again afterwards."""
    import sys

    from suite.store import write_table

    where = tmp_path / "runs-\udce9"
    base = write_table([_ok_row("a", 1.0), _ok_row("b", 2.0)], where / "base.csv")
    new = write_table([_ok_row("a", 1.0), _ok_row("b", 1.0)], tmp_path / "new.csv")
    assert sys.stdout.errors == "strict"
    code, out, err = _run(capsys, "compare", str(base), str(new))
    assert code == 0 and f"Changes: {tmp_path}/new.csv against {tmp_path}/runs-\\udce9/base.csv" in out, err
    code, out, err = _run(capsys, "leaderboard", str(new), "--out", str(where / "lb"), "--reference", "a", "--no-chart")
    assert code == 0 and out == f"{tmp_path}/runs-\\udce9/lb/leaderboard.md\n{tmp_path}/runs-\\udce9/lb/leaderboard.csv\n"
    assert sys.stdout.errors == sys.stderr.errors == "strict"


def test_profile_and_fidelity_refuse_to_write_into_a_results_store(tmp_path, capsys, monkeypatch):
    """A profile written into a store's cells/ would be read as a damaged cell (the store's tables stop); one
    in the store, or a fidelity report, would be mixed with its data. Refused before measuring, nothing written."""
    from suite.backends import workload
    from suite.store import Store

    monkeypatch.setattr(workload, "real_workload", lambda *a, **k: pytest.fail("measured before checking"))
    store = Store(tmp_path / "store")
    store.write_manifest({"format": "placebench.store", "schema_version": 1, "runs": []})
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    root = store.root.resolve()
    for argv, flag, what, where in (
            (["profile", "rnnlm-2x2048-b64", "--out", str(store.root)], "--out", "profiles", ""),
            (["profile", "rnnlm-2x2048-b64", "--out", str(store.cells_dir)], "--out", "profiles", "inside "),
            (["fidelity", "rnnlm-2x2048-b64", "--out", str(store.cells_dir)], "--out", "reports", "inside "),
            (["fidelity", "rnnlm-2x2048-b64", "--out", str(tmp_path / "f"), "--profiles", str(store.root)],
             "--profiles", "profiles", "")):
        path = argv[argv.index(flag) + 1]
        _assert_usage_error(*_run(capsys, *argv),
                            f"{flag} {path} is {where}the results store {root}: write {what} elsewhere")
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_fidelity_warns_of_torch_profiles_for_onnxruntime_before_profiling(tmp_path, capsys, monkeypatch, recwarn):
    """Profiles are torch's op times: a study of onnxruntime says so before profiling (minutes), not only after
    it, and once."""
    import warnings

    from suite import fidelity
    from suite.backends import commands
    from suite.errors import PlacebenchError

    said = "placebench: warning: fidelity of rnnlm-2x2048-b64+batch_size=1+mode=inference: the profiles were " \
           "measured on torch, this study measures onnxruntime"

    def profiles_for(*a, **k):
        assert said in capsys.readouterr().err  # before any profile is measured
        return []

    def run_fidelity(rw, *a, warn_backend=True, **k):
        if warn_backend:  # as run_fidelity does: it must not be shown a second time
            warnings.warn(f"fidelity of {rw.graph.name}: {fidelity.backend_mismatch('onnxruntime', ['torch'])}",
                          stacklevel=2)
        raise PlacebenchError("stopped here")

    monkeypatch.setattr(commands, "profiles_for", profiles_for)
    monkeypatch.setattr(fidelity, "run_fidelity", run_fidelity)
    code, out, err = _run(capsys, "fidelity", "rnnlm-2x2048-b64", "--set", "batch_size=1", "--mode", "inference",
                          "--backend", "onnxruntime", "--logical-cpus", "1", "--out", str(tmp_path / "f"),
                          "--profiles", str(tmp_path / "p"))
    assert code == 2 and "stopped here" in err
    assert not [w for w in recwarn if "this study measures onnxruntime" in str(w.message)]


def test_fidelity_warns_of_the_stored_profiles_own_backend_before_profiling(tmp_path, capsys, monkeypatch):
    """The early warning took every profile for torch's: a hand-written one given with --profiles (no
    metadata.backend) was said to be "measured on torch". Stored profiles are read for their recorded backend:
    one of none is unknown (also to a torch study); one of the study's own backend gives no warning."""
    import platform

    from suite import fidelity, profiling
    from suite.backends.workload import real_workload
    from suite.costmodel import Profile
    from suite.errors import PlacebenchError
    from suite.profiling import profile_path

    graph = real_workload("rnnlm-2x2048-b64", batch_size=1, mode="inference").graph
    meta = {"device": "cpu", "threads": 1, "clock": "wall", "machine": platform.node()}
    path = profile_path(tmp_path / "p", graph.name, "cpu")

    def fidelity_of(study, **metadata):
        Profile(graph.name, "cpu", {op.name: 1e-4 for op in graph.ops}, graph.content_hash,
                {**meta, **metadata}).save(path)
        return _run(capsys, "fidelity", "rnnlm-2x2048-b64", "--set", "batch_size=1", "--mode", "inference",
                    "--backend", study, "--logical-cpus", "1", "--out", str(tmp_path / "f"),
                    "--profiles", str(tmp_path / "p"))

    def stop(rw, cluster, dmap, profiles, **k):
        assert [p.source for p in profiles] == [str(path)]  # the stored profile is used, not measured
        raise PlacebenchError("stopped here")

    monkeypatch.setattr(profiling, "profile_workload", lambda *a, **k: pytest.fail("profiled"))
    monkeypatch.setattr(fidelity, "run_fidelity", stop)
    head = f"placebench: warning: fidelity of {graph.name}: "
    unknown = "1 of 1 profile(s) record no backend (metadata.backend; written by hand?): the backend they were " \
              "measured on is unknown, maybe not"
    for backend in ("onnxruntime", "torch"):
        code, _, err = fidelity_of(backend)
        assert code == 2 and err.startswith(f"{head}{unknown} {backend}\n"), err
        assert "measured on torch" not in err
    code, _, err = fidelity_of("onnxruntime", backend="onnxruntime")
    assert code == 2 and "warning" not in err, err
    code, _, err = fidelity_of("onnxruntime", backend="torch")
    assert code == 2 and err.startswith(f"{head}the profiles were measured on torch, this study measures "
                                        "onnxruntime"), err

def test_run_refuses_an_out_inside_a_store(capsys, tiny_files, write_spec, tmp_path):
    """`run --out STORE/cells` of a store with no cells yet made a store inside the store's cells/ folder (exit 0),
    whose files the store then reads as damaged cells. Refused, exit 2, nothing written; --out STORE runs into it."""
    from suite.store import Store

    spec = write_spec(workloads=[str(tiny_files["diamond"])], clusters=[str(tiny_files["cluster"])],
                      placers=["single_cpu"])
    store = Store(tmp_path / "store")
    store.write_manifest({"format": "placebench.store", "schema_version": 1, "runs": []})
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    for out in (store.cells_dir, store.cells_dir / "x"):
        _assert_usage_error(*_run(capsys, "run", str(spec), "--out", str(out), "--quiet"),
                            f"--out {out} is inside the results store {store.root.resolve()}: write a new store "
                            "elsewhere")
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert _run(capsys, "run", str(spec), "--out", str(store.root), "--quiet")[0] == 0

def test_run_given_a_store_where_the_spec_goes_says_how_to_run_into_it(capsys, tiny_files, write_spec, tmp_path,
                                                                        monkeypatch):
    """`placebench run STORE` (or one of its files) names the store and the command that resumes it (the spec its
    last run recorded); a built-in spec's name still wins over a folder of that name (a store made by `run quick
    --out quick`), and a spec file kept in a store's folder is still a spec."""
    from suite import runner

    spec = write_spec(workloads=[str(tiny_files["diamond"])], clusters=[str(tiny_files["cluster"])],
                      placers=["single_cpu"])
    store = tmp_path / "store"
    runner.run(str(spec), store)
    before = (store / "manifest.json").read_text()
    _assert_usage_error(*_run(capsys, "run", str(store)),
                        f"{store} is a results store, not a spec: to resume or extend it, run a spec into it: "
                        f"placebench run {spec} --out {store}\n")
    for own in (store / "results.csv", store / "manifest.json", next((store / "cells").iterdir())):
        _assert_usage_error(*_run(capsys, "run", str(own)),
                            f"{own} is a file of the results store {store}, not a spec: to resume or extend the "
                            f"store, run a spec into it: placebench run {spec} --out {store}\n")
    assert (store / "manifest.json").read_text() == before
    shutil.copy(spec, store / "spec.toml")
    assert runner.load_spec(str(store / "spec.toml")).name == "test"
    made = tmp_path / "made_by_quick"  # a built-in spec's store: named by the spec's name, not its file
    made.mkdir()
    (made / "manifest.json").write_text(json.dumps({
        "format": "placebench.store", "schema_version": 1, "runs": [{"run_id": "r", "spec": "quick"}],
        "specs": {"quick": {"name": "quick", "source": str(runner.SPEC_DIR / "quick.toml")}}}))
    _assert_usage_error(*_run(capsys, "run", str(made)), f"placebench run quick --out {made}\n")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "plain").mkdir()
    _assert_usage_error(*_run(capsys, "run", "plain"), "plain is a directory, not a spec (a built-in name or a spec "
                                                        "file)\n")
    (tmp_path / "quick").mkdir()
    assert runner.load_spec("quick").name == "quick"


@pytest.mark.skipif(not hasattr(__import__("signal"), "SIGHUP"), reason="no SIGHUP on this platform")
def test_a_hangup_stops_a_run_unless_it_runs_under_nohup(capsys, monkeypatch, tiny_files, write_spec, tmp_path):
    """SIGHUP (a closed terminal or ssh session) stops `run` as SIGTERM does (exit 129, the run's cells and count
    stored: tests/test_runner.py sends it); under `nohup` (SIGHUP ignored) it stays ignored, so the run goes on.
    The handlers main() set are put back when it returns."""
    import signal

    import suite.cli
    from suite import runner

    seen = []

    def stopped(*args, **kwargs):  # the handler the run would have, then a Ctrl-C: main() returns
        seen.append(signal.getsignal(signal.SIGHUP))
        raise KeyboardInterrupt

    spec = write_spec(workloads=[str(tiny_files["diamond"])], clusters=[str(tiny_files["cluster"])],
                      placers=["single_cpu"])
    run = ["run", str(spec), "--out", str(tmp_path / "store")]
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        monkeypatch.setattr(runner, "run", stopped)
        assert _run(capsys, *run)[0] == suite.cli.EXIT_INTERRUPTED
        assert seen == [signal.SIG_IGN] and signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
        signal.signal(signal.SIGHUP, signal.SIG_DFL)

        def hung_up(*args, **kwargs):
            if signal.getsignal(signal.SIGHUP) == signal.SIG_DFL:  # raised, it would kill this test's process
                pytest.fail("SIGHUP is not handled during the run: a hangup kills it before it stores its count")
            signal.raise_signal(signal.SIGHUP)
            pytest.fail("SIGHUP did not stop the run")

        monkeypatch.setattr(runner, "run", hung_up)
        assert _run(capsys, *run) == (suite.cli.EXIT_HANGUP, "", "placebench: interrupted; finished cells are "
                                                                 "stored, rerun the same command to resume\n")
        assert suite.cli.EXIT_HANGUP == 129 and signal.getsignal(signal.SIGHUP) == signal.SIG_DFL
    finally:
        signal.signal(signal.SIGHUP, before)


def test_evaluate_refuses_to_write_its_files_into_a_results_store(capsys, tiny_files, write_spec, tmp_path):
    """--trace or --save-placement in a store would replace its manifest (its runs' record) or put a JSON file
    in cells/ that is then read as a damaged cell (the store's tables stop): refused before the search."""
    from suite import runner

    spec = write_spec(workloads=[str(tiny_files["diamond"])], clusters=[str(tiny_files["cluster"])],
                      placers=["single_cpu"])
    store = tmp_path / "store"
    runner.run(str(spec), store)
    before = {p: p.read_bytes() for p in store.rglob("*") if p.is_file()}
    evaluate = ["evaluate", str(tiny_files["diamond"]), "--cluster", str(tiny_files["cluster"]), "--placer",
                "single_cpu"]
    for flag, path in (("--trace", store / "manifest.json"), ("--save-placement", store / "cells" / "p.json")):
        _assert_usage_error(*_run(capsys, *evaluate, flag, str(path)),
                            f"{flag} {path} is inside the results store {store.resolve()}: write it elsewhere\n")
    assert {p: p.read_bytes() for p in store.rglob("*") if p.is_file()} == before
    assert _run(capsys, "table", str(store))[0] == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a pty whose other end is closed gives EIO")
def test_a_run_stopped_by_a_hangup_exits_129_when_its_terminal_is_gone(monkeypatch, tiny_files, write_spec, tmp_path):
    """A closed terminal: writes to it fail (EIO) and a SIGHUP stops the run. Closing the progress bar and
    saying "interrupted" on that terminal must not replace the run's exit code (129) with an error."""
    import pty

    import suite.cli
    from suite import runner

    master, slave = pty.openpty()
    terminal = os.fdopen(slave, "w")
    monkeypatch.setattr(sys, "stderr", terminal)

    def hung_up(spec, out, *, on_plan, **kwargs):
        on_plan(2, 0, 0, 0)  # the progress bar starts on the terminal
        os.close(master)  # the window closes
        raise suite.cli.Terminated(1)  # and its SIGHUP comes

    monkeypatch.setattr(runner, "run", hung_up)
    spec = write_spec(workloads=[str(tiny_files["diamond"])], clusters=[str(tiny_files["cluster"])],
                      placers=["single_cpu"])
    try:
        assert main(["run", str(spec), "--out", str(tmp_path / "store")]) == suite.cli.EXIT_HANGUP
    finally:
        terminal.close()


def test_run_resumes_a_store_whose_folder_is_named_cells(capsys, tiny_files, write_spec, tmp_path):
    """A store named `cells` (`--out runs/cells`) has a cells/ folder of its own, so its parent looked like a store
    (any folder with a cells/ counted as one) and the second `run` into it, a resume, was refused as "inside the
    results store runs" (exit 2). A store is --out's to run into, whatever its name."""
    spec = write_spec(workloads=[str(tiny_files["diamond"])], clusters=[str(tiny_files["cluster"])],
                      placers=["single_cpu"])
    out = tmp_path / "runs" / "cells"
    assert _run(capsys, "run", str(spec), "--out", str(out), "--quiet")[0] == 0
    manifest = (out / "manifest.json").read_text()
    code, _, err = _run(capsys, "run", str(spec), "--out", str(out), "--quiet")
    assert code == 0, err
    assert (out / "manifest.json").read_text() != manifest  # the resume recorded its run


def test_an_output_path_too_long_is_named_by_its_flag(capsys, tiny_files, write_spec, tmp_path):
    """The store-folder check of an output path stat'ed `<path>/cells` first: a name too long was reported as
    "placebench: error: <path>/cells: File name too long", a path the user never gave and no flag. As before
    that check: "--out: File name too long", exit 2, nothing written."""
    spec = write_spec(workloads=[str(tiny_files["diamond"])], clusters=[str(tiny_files["cluster"])],
                      placers=["single_cpu"])
    long = tmp_path / ("x" * 300)
    code, _, err = _run(capsys, "run", str(spec), "--out", str(long / "store"), "--quiet")
    assert (code, err) == (2, "placebench: error: --out: File name too long\n")
    assert _run(capsys, "run", str(spec), "--out", str(tmp_path / "store"), "--quiet")[0] == 0
    code, _, err = _run(capsys, "table", str(tmp_path / "store"), "--output", str(long / "t.md"))
    assert (code, err) == (2, "placebench: error: --output: File name too long\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store", "test.toml"]
