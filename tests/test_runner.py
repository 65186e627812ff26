"""The runner: specs, planning, crash isolation (raise / hang / die / invalid), re-measurement, resume."""

from __future__ import annotations

import dataclasses
import datetime
import json
import multiprocessing
import os
import pickle
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import suite
from suite import graph_io, methodology, numerics, report, runner
from suite.errors import ClusterError, SpecError, UnknownNameError
from suite.graph import Op, OpGraph
from suite.store import Store, cpu_simd, read_table


# -- specs ------------------------------------------------------------------------------------------------
def _spec(**kw):
    data = {"name": "t", "workloads": ["w.json"], "clusters": ["tiny"], "placers": ["single_cpu"], **kw}
    return runner.spec_from_dict(data, source="t.toml")


def test_spec_fields_are_read(tmp_path):
    s = runner.spec_from_dict(
        {
            "name": "t",
            "workloads": ["g/w.json", "zoo_name"],
            "clusters": ["c.toml"],
            "placers": ["a", {"name": "b", "params": {"k": 1}}, {"name": "b", "params": {"k": 2}, "label": "b2"}],
            "seeds": [3, 4],
            "budget": {"max_evaluations": 7},
            "cell_timeout_s": 9,
            "plugins": ["my_plugin", "p.py"],
        },
        source="t.toml",
        base=tmp_path,
    )
    assert s.workloads == (str(tmp_path / "g/w.json"), "zoo_name")  # files relative to the spec
    assert s.clusters == (str(tmp_path / "c.toml"),)
    assert [p.shown for p in s.placers] == ["a", "b(k=1)", "b2"]
    assert s.seeds == (3, 4) and s.budget == {"max_evaluations": 7} and s.cell_timeout_s == 9.0
    assert s.plugins == ("my_plugin", str(tmp_path / "p.py"))


@pytest.mark.parametrize(
    "change, message",
    [
        ({"colour": "red"}, r"unknown field\(s\) \['colour'\]"),
        ({"name": ""}, "field 'name' is missing"),
        ({"name": datetime.date(1979, 5, 27)}, r"field 'name' must be a string, got datetime.date\(1979, 5, 27\)$"),
        ({"workloads": []}, "workloads: expected a non-empty list"),
        ({"seeds": [0, "1"]}, "seeds must be a non-empty list of integers"),
        ({"seeds": [-1]}, r"seeds must be a non-empty list of integers in \[0, 2\*\*32\)"),
        ({"evaluator": 3}, "evaluator must be a name, got 3"),
        ({"budget": {"max_evaluations": 0}}, "budget.max_evaluations: 0 is below the minimum 1"),
        ({"budget": {"evals": 3}}, "budget must be a table with max_evaluations"),
        ({"budget": {"evals": 10**400}}, r"max_seconds, got unknown key\(s\) \['evals'\]$"),
        ({"cell_timeout_s": -1}, "cell_timeout_s must be a positive number"),
        ({"placers": [{"name": "x", "parms": {}}]}, r"placers\[0\]: unknown field\(s\) \['parms'\]"),
        ({"placers": [{"name": "x", "params": 3}]}, r"placers\[0\].params: expected a table, got 3"),
        # stored as JSON: a TOML date or time was a TypeError traceback when the cell's key was made
        ({"placers": [{"name": "x", "params": {"at": [datetime.time(7, 32)]}}]},
         r"placers\[0\].params.at\[0\]: datetime.time\(7, 32\) is not a parameter value .* write a date or time as a string$"),
        ({"simulator_engine": "turbo"}, "simulator_engine 'turbo'"),
        ({"budget": {"max_evaluations": 99999999999999999999}}, "above the largest allowed count, 2\\*\\*63 - 1"),
        ({"cell_timeout_s": 10**400}, "cell_timeout_s must be a finite number of seconds, got an integer of about "
                                      "401 digits"),
        ({"seeds": [0, 1, 0]}, "seeds: seed 0 is listed twice"),
        # a huge number is shown by its size, not by its hundreds of digits
        ({"seeds": [0, 10**400]}, r"seeds must be a non-empty list of integers in \[0, 2\*\*32\); entry 1 is an "
                                  "integer of about 401 digits$"),
        ({"workloads": ["w.json", 10**400]}, r"workloads\[1\]: expected a name, got an integer of about 401 digits$"),
        ({"evaluator": 10**400}, "evaluator must be a name, got an integer of about 401 digits$"),
        ({"description": -(10**400)}, "description must be a string, got a negative integer of about 401 digits$"),
        ({"placers": [{"name": "x", "label": 10**400}]}, r"placers\[0\].label: expected a string, got an integer "
                                                         "of about 401 digits$"),
        ({"workloads": ["a", "b", "a"]}, "workloads: 'a' is listed twice"),
        ({"placers": ["a", {"name": "a"}]}, r"placers\[1\]: the same placer entry as placers\[0\]"),
        ({"name": "../../escaped"}, "name '../../escaped' must be a plain name"),
        ({"name": "/tmp/abs"}, "name '/tmp/abs' must be a plain name"),
        ({"workloads": ["ok", "bad\x00.json"]}, r"t.toml\.workloads\[1\]: 'bad\\x00.json' contains a NUL character"),
        ({"profiles": "p.json"}, "profiles must be a list of profile files, got 'p.json'"),
        ({"profiles": ["p.json"], "evaluator": "torch"}, "profiles are per-op times for the simulator; evaluator "
                                                         "'torch' measures its own"),
    ],
)
def test_bad_specs_name_file_field_and_value(change, message):
    with pytest.raises(SpecError, match=message) as exc:
        _spec(**change)
    assert str(exc.value).startswith("t.toml")


HUGE = "x" * 100_000


@pytest.mark.parametrize(
    "change, field",
    [
        ({"plugins": [HUGE, 3]}, "plugins"),
        ({"plugins": {"a" * 50_000: 1}}, "plugins"),
        ({"placers": [{"name": "x", "params": {"a\nb": datetime.time(7, 32)}}]}, "placers[0].params"),
        ({"placers": [{"name": "x", "params": {HUGE: datetime.time(7, 32)}}]}, "placers[0].params"),
        ({"placers": [{"name": "x", "params": {"k": {"c\rd": [datetime.date(1979, 5, 27)]}}}]},
         "placers[0].params.k"),
        ({"workloads": [HUGE, HUGE]}, "workloads"),
        ({"name": "/" + HUGE}, "name"),
        ({"workloads": ["ok", HUGE + "\x00"]}, "workloads[1]"),
        ({"placers": [{"name": "x", "params": {HUGE + "\x00": 1}}]}, "placers[0].params"),
        ({"placers": [{"name": "x", HUGE: 1}]}, "placers[0]"),
        ({HUGE: 1}, "unknown field"),
        ({"budget": {HUGE: 1}}, "budget"),
        ({"profiles": ["p.json"], "evaluator": HUGE}, "evaluator"),
    ],
)
def test_spec_errors_are_one_bounded_line_naming_the_field(change, field):
    """A huge value or key is cut (textfile.short_repr) and a key with a newline or NUL is escaped: the message
    stays one line of bounded length that names the field (the plugins error repeated 100 KB; a params key with a
    newline split the line)."""
    with pytest.raises(SpecError) as exc:
        _spec(**change)
    text = str(exc.value)
    assert "\n" not in text and "\r" not in text and "\x00" not in text
    assert len(text) < 1000, len(text)
    assert text.startswith("t.toml") and field in text

def test_missing_field_and_unknown_spec():
    with pytest.raises(SpecError, match="field 'placers' is missing"):
        runner.spec_from_dict({"name": "t", "workloads": ["w"], "clusters": ["c"]}, source="t.toml")
    with pytest.raises(UnknownNameError, match="unknown spec 'nope'; built-in: full, quick"):
        runner.load_spec("nope")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"workloads": "mlp"}, r"^t.toml: workloads: expected a list of names, got the string 'mlp': write \['mlp'\]$"),
        ({"clusters": "tiny"}, r"^t.toml: clusters: expected a list of names, got the string 'tiny': write \['tiny'\]$"),
        ({"placers": "single_cpu"}, r"^t.toml: placers: expected a list of placer names or tables, got the string "
                                    r"'single_cpu': write \['single_cpu'\]$"),
        ({"placers": {"name": "random"}}, r"^t.toml: placers: expected a list of placer names or tables, got a "
                                          r"single table \{'name': 'random'\}: put it in a list, \[\{name = ...\}\]$"),
        ({"workloads": "x" * 100_000}, r"got the string 'x+\.\.\. \(a string of 100000 characters\): put it in a list$"),
    ],
)
def test_a_bare_name_or_table_where_a_list_is_documented_is_refused(change, message):
    """workloads, clusters and placers are lists (README, the built-in specs): a bare string or table was
    silently read as a list of it; now it is refused saying how to write it (no committed spec used it)."""
    with pytest.raises(SpecError, match=message) as exc:
        _spec(**change)
    assert len(str(exc.value)) < 1000


def test_malformed_spec_file(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text("name = [unclosed")
    with pytest.raises(SpecError, match="bad.toml: not valid TOML"):
        runner.load_spec(str(p))


def test_built_in_specs_parse():
    quick, full = runner.load_spec("quick"), runner.load_spec("full")
    for spec in (quick, full):  # as_dict round-trips (it wrote "@all" as a table, which a spec refuses)
        assert runner.spec_from_dict(spec.as_dict(), source=spec.source).as_dict() == spec.as_dict()
    assert quick.workloads == ("@zoo",) and len(quick.clusters) == 2 and quick.placers[0].name == "@all"
    assert quick.budget["max_evaluations"] < 1000 and quick.cell_timeout_s <= 120
    assert full.clusters == ("@presets",) and full.seeds == (0, 1, 2) and not full.budget


# -- planning ---------------------------------------------------------------------------------------------
def test_plan_is_the_cross_product_with_stable_keys(tiny_files, write_spec):
    spec = runner.load_spec(str(write_spec(
        workloads=[str(tiny_files["diamond"]), str(tiny_files["chain"])],
        clusters=[str(tiny_files["cluster"]), "xeon_h100"],
        placers=["single_cpu", "single_gpu"],
        seeds=[0, 1],
    )))
    plan = runner.make_plan(spec)
    assert len(plan.cells) == 2 * 2 * 2 * 2
    assert len({c.cell_id for c in plan.cells}) == 16
    assert [c.cell_id for c in runner.make_plan(spec).cells] == [c.cell_id for c in plan.cells]
    first = plan.cells[0].key
    assert (first["workload"], first["cluster"], first["placer"], first["seed"]) == ("diamond", "tiny", "single_cpu", 0)
    assert first["methodology"] == "placebench-methodology-v1" and first["evaluator"] == "simulator"
    # a different budget is a different experiment: different keys
    other = runner.make_plan(runner.spec_from_dict({**spec.as_dict(), "budget": {"max_evaluations": 5}}))
    assert not {c.cell_id for c in other.cells} & {c.cell_id for c in plan.cells}
    slower = runner.make_plan(runner.spec_from_dict({**spec.as_dict(), "budget": {"max_seconds": 7.0}}))
    assert not {c.cell_id for c in slower.cells} & {c.cell_id for c in plan.cells}


def test_one_graph_listed_under_two_references_is_one_set_of_cells(tiny_files, write_spec, tmp_path):
    """A zoo name and its graph file, or two copies of one file, are the same workload: its cells are planned
    and run once, not once per reference (twice the work, and two writes of each cell file)."""
    copy = tmp_path / "copy.json"
    copy.write_bytes(tiny_files["diamond"].read_bytes())
    spec = runner.load_spec(str(write_spec(workloads=[str(tiny_files["diamond"]), str(copy)],
                                           clusters=[str(tiny_files["cluster"])], placers=["single_cpu"], seeds=[0, 1])))
    assert [(c.key["workload"], c.seed) for c in runner.make_plan(spec).cells] == [("diamond", 0), ("diamond", 1)]
    result = runner.run(spec, tmp_path / "store")
    assert (result.ran, len(result.rows), Store(tmp_path / "store").manifest()["runs"][-1]["cells_run"]) == (2, 2, 2)


def test_unknown_names_are_reported_before_running(tiny_files, write_spec):
    good = {"workloads": [str(tiny_files["diamond"])], "clusters": ["xeon_h100"], "placers": ["single_cpu"]}
    with pytest.raises(UnknownNameError, match="unknown placer 'nope'"):
        runner.make_plan(runner.load_spec(str(write_spec(**{**good, "placers": ["nope"]}))))
    with pytest.raises(UnknownNameError, match="unknown cluster 'nope'"):
        runner.make_plan(runner.load_spec(str(write_spec(**{**good, "clusters": ["nope"]}))))
    with pytest.raises(UnknownNameError, match="unknown evaluator 'gpu'; available: .*simulator"):
        runner.make_plan(runner.load_spec(str(write_spec(**{**good, "evaluator": "gpu"}))))
    with pytest.raises(SpecError, match="plugin .*missing.py: no such file"):
        runner.make_plan(runner.load_spec(str(write_spec(**{**good, "plugins": ["missing.py"]}))))


def test_one_definition_per_workload_name(tiny_files, write_spec, tmp_path):
    """Tables group rows by name, so two graphs under one name (in a spec, or a store and a later run) are
    refused instead of merged."""
    other = graph_io.save(OpGraph.build("diamond", [Op("a", "matmul", flops=1e9)], []), tmp_path / "other.json")
    both = {"workloads": [str(tiny_files["diamond"]), str(other)], "clusters": ["xeon_h100"], "placers": ["single_cpu"]}
    with pytest.raises(SpecError, match="are both named 'diamond' but differ; rename one of them"):
        runner.make_plan(runner.load_spec(str(write_spec(**both))))
    store = tmp_path / "store"
    runner.run(runner.load_spec(str(write_spec("a", **{**both, "workloads": both["workloads"][:1]}))), store)
    before = sorted(p.name for p in (store / "cells").iterdir()), (store / "manifest.json").read_text()
    with pytest.raises(SpecError, match="different definition .* use another --out"):
        runner.run(runner.load_spec(str(write_spec("b", **{**both, "workloads": both["workloads"][1:]}))), store)
    assert (sorted(p.name for p in (store / "cells").iterdir()), (store / "manifest.json").read_text()) == before


def test_one_setup_per_store(tiny_files, write_spec, tmp_path):
    """Rows of another search budget would be tabled as extra seeds of the same cells: refused."""
    spec = {"workloads": [str(tiny_files["diamond"])], "clusters": ["xeon_h100"], "placers": ["single_cpu"]}
    store = tmp_path / "store"
    runner.run(runner.load_spec(str(write_spec("a", **spec, budget={"max_evaluations": 5}))), store)
    with pytest.raises(SpecError, match="budget_evaluations 5.*this run has .*budget_evaluations 6.* use another --out"):
        runner.run(runner.load_spec(str(write_spec("b", **spec, budget={"max_evaluations": 6}))), store)
    assert len(Store(store).cell_ids()) == 1
    rows = Store(store).rows()
    with pytest.raises(report.ReportError, match="seed 0 has several rows"):
        report.Results.from_rows(rows + [{**rows[0], "budget_evaluations": 6}])


def test_one_setup_per_store_across_workloads(tiny_files, write_spec, tmp_path):
    """A run of another workload than the stored rows' must still share their budget: tables put every
    workload of a store in one table, as one experiment."""
    spec = {"clusters": [str(tiny_files["cluster"])], "placers": ["single_cpu"]}
    store = tmp_path / "store"
    runner.run(runner.load_spec(str(write_spec("a", **spec, workloads=[str(tiny_files["diamond"])],
                                               budget={"max_evaluations": 5}))), store)
    chain = {**spec, "workloads": [str(tiny_files["chain"])]}
    with pytest.raises(SpecError, match=r"its rows were made with methodology placebench-methodology-v1, "
                                        r"budget_evaluations 5, .*; this run has .*budget_evaluations 6, .*use another --out"):
        runner.run(runner.load_spec(str(write_spec("b", **chain, budget={"max_evaluations": 6}))), store)
    assert runner.run(runner.load_spec(str(write_spec("c", **chain, budget={"max_evaluations": 5}))), store).ran == 1


def test_profiles_in_a_spec_give_their_workload_measured_op_times(tiny_files, write_spec, tmp_path):
    """single_cpu runs the diamond's ops one after another, so b measured at 0.5 s (its estimate: 1 s) makes
    the step 0.5 s shorter; the chain, which no profile is for, is unchanged. The profiled cells name the
    profiled simulator as their evaluator, so they never share a store with the analytic simulator's."""
    prof = tmp_path / "diamond__cpu.json"
    prof.write_text(json.dumps({"format": "placebench.profile", "schema_version": 1, "workload": "diamond",
                                "applies_to": "cpu", "op_times_s": {"b": 0.5}}))
    spec = {"workloads": [str(tiny_files["diamond"]), str(tiny_files["chain"])], "clusters": [str(tiny_files["cluster"])],
            "placers": ["single_cpu"]}
    plain = runner.run(runner.load_spec(str(write_spec("plain", **spec))), tmp_path / "plain").rows
    profiled_spec = runner.load_spec(str(write_spec("prof", **spec, profiles=[prof.name])))
    assert profiled_spec.profiles == (str(prof),) and profiled_spec.as_dict()["profiles"] == [str(prof)]
    rows = runner.run(profiled_spec, tmp_path / "prof").rows
    by = {r["workload"]: r for r in plain}
    got = {r["workload"]: r for r in rows}
    assert got["diamond"]["step_time_s"] == pytest.approx(by["diamond"]["step_time_s"] - 0.5)
    assert got["diamond"]["evaluator"].startswith("simulator+profiles:")
    assert got["chain"]["evaluator"] == "simulator" and got["chain"]["step_time_s"] == by["chain"]["step_time_s"]
    with pytest.raises(SpecError, match="its rows of diamond were made with .*evaluator simulator; this run has "
                                        ".*evaluator simulator\\+profiles:"):  # not mixed into the analytic store
        runner.run(profiled_spec, tmp_path / "plain")
    # a profiled store takes its own spec again (resumes), in either workload order: each workload keeps its
    # evaluator, profiled or not, so the chain's analytic rows may join it too
    for order in (spec["workloads"], spec["workloads"][::-1]):
        again = runner.load_spec(str(write_spec("prof", **{**spec, "workloads": order}, profiles=[prof.name])))
        assert (runner.run(again, tmp_path / "prof").ran, len(Store(tmp_path / "prof").rows())) == (0, 2)
    chain_only = runner.load_spec(str(write_spec("chain", **{**spec, "workloads": [str(tiny_files["chain"])]})))
    assert runner.run(chain_only, tmp_path / "prof").reused == 1
    lone = runner.load_spec(str(write_spec("lone", **{**spec, "workloads": [str(tiny_files["chain"])]},
                                           profiles=[str(prof)])))
    with pytest.raises(SpecError, match=f"profile {prof} was measured on workload 'diamond' \\(no hash\\), which "
                                        "is not the workload 'chain' \\(sha256:"):
        runner.make_plan(lone)
    both = runner.load_spec(str(write_spec("both", **{**spec, "workloads": [str(tiny_files[w]) for w in ("chain", "big")]},
                                           profiles=[str(prof)])))
    with pytest.raises(SpecError, match="which is none of the spec's workloads"):
        runner.make_plan(both)
    # of the diamond's name but another graph (captured anew since): said so, not just two hashes
    stale = tmp_path / "stale.json"
    stale.write_text(json.dumps({**json.loads(prof.read_text()), "workload_hash": "sha256:0123"}))
    with pytest.raises(SpecError, match=f"profile {stale} was measured on workload 'diamond' \\(sha256:0123\\), which "
                                        "is another graph than the workload 'diamond' \\(sha256:[0-9a-f]+\\) has now: "
                                        "profile it again$"):
        runner.make_plan(runner.load_spec(str(write_spec("stale", **spec, profiles=[stale.name]))))
    # the same profile given twice (here a copy) counts once: the label of one, not a conflict with itself
    copy = tmp_path / "copy.json"
    copy.write_text(prof.read_text())
    twice = runner.load_spec(str(write_spec("twice", **spec, profiles=[prof.name, copy.name, f"./{prof.name}"])))
    assert {c.key["evaluator"] for c in runner.make_plan(twice).cells} == {r["evaluator"] for r in rows}


def _profile_file(path: Path, applies_to: str, times: dict[str, float]) -> Path:
    path.write_text(json.dumps({"format": "placebench.profile", "schema_version": 1, "workload": "diamond",
                                "applies_to": applies_to, "op_times_s": times}))
    return path


def test_the_manifest_says_how_many_op_times_the_profiles_give_each_device(tiny_files, write_spec, tmp_path):
    """A profile of 1 of the diamond's 4 ops on the CPU: its rows' evaluator label alone read like a fully
    profiled result. The manifest says, by label and cluster, 1 of 4 ops on cpu:0 and 0 of 4 on gpu:0."""
    prof = _profile_file(tmp_path / "diamond__cpu.json", "cpu", {"b": 0.5})
    spec = {"workloads": [str(tiny_files["diamond"]), str(tiny_files["chain"])], "clusters": [str(tiny_files["cluster"])],
            "placers": ["single_cpu"], "profiles": [prof.name]}
    rows = runner.run(runner.load_spec(str(write_spec("prof", **spec))), tmp_path / "store").rows
    label = next(r["evaluator"] for r in rows if r["workload"] == "diamond")
    assert runner.run(runner.load_spec(str(write_spec("prof", **spec))), tmp_path / "store").ran == 0  # a rerun keeps it
    entry = Store(tmp_path / "store").manifest()["profiles"]
    assert entry == {label: {"workload": "diamond", "files": [str(prof)], "clusters": {"tiny": {
        "ops": 4, "profiled_ops": {"cpu:0": 1, "gpu:0": 0},
        "summary": "op times from profiles: 1 of 4 ops on cpu:0; 0 of 4 ops on gpu:0 (the others are roofline "
                   "estimates)"}}}}  # the chain has no profile: no entry


def test_profiles_that_make_every_op_0_s_everywhere_are_refused_before_any_cell_runs(
        tiny_files, write_spec, tmp_path, capsys):
    """All four ops at 0 s on the CPU and on the GPU made the failure penalty 0 s: an OOM or invalid
    placement scored as well as the best one during every search. The run is refused, as a one-line error of
    the CLI, naming the profiles."""
    from suite.cli import main
    from suite.errors import ProfileError

    zeros = {op: 0.0 for op in "abcd"}
    profs = [_profile_file(tmp_path / f"diamond__{k}.json", k, zeros) for k in ("cpu", "gpu")]
    spec = write_spec("zero", workloads=[str(tiny_files["diamond"])], clusters=[str(tiny_files["cluster"])],
                      placers=["single_cpu"], profiles=[p.name for p in profs])
    with pytest.raises(ProfileError, match=rf"^profile\(s\) {profs[0]}, {profs[1]} make every op of workload "
                                           r"'diamond' take 0 s on every device of cluster 'tiny'"):
        runner.run(runner.load_spec(str(spec)), tmp_path / "store")
    assert not (tmp_path / "store" / "cells").exists() or not any((tmp_path / "store" / "cells").iterdir())
    code = main(["run", str(spec), "--out", str(tmp_path / "cli"), "--quiet"])
    out, err = capsys.readouterr()
    assert code == 2 and err.startswith(f"placebench: error: profile(s) {profs[0]}, {profs[1]} make every op")
    assert err.count("\n") == 1 and "Traceback" not in err
    # 0 s on the CPU only: the GPU's roofline times (0.1 s each) remain, and so does a penalty
    only_cpu = write_spec("cpu0", workloads=[str(tiny_files["diamond"])], clusters=[str(tiny_files["cluster"])],
                          placers=["single_cpu"], profiles=[profs[0].name])
    [row] = runner.run(runner.load_spec(str(only_cpu)), tmp_path / "cpu0").rows
    assert (row["status"], row["step_time_s"]) == ("ok", 0.0)


def test_a_label_keeps_its_placer_and_parameters_in_a_store(tiny_files, write_spec, tmp_path):
    """Retuning a labelled placer and rerunning into the same store would put two setups in one column:
    refused before anything is written, naming the label and both parameter sets."""
    spec = {"workloads": [str(tiny_files["diamond"])], "clusters": ["xeon_h100"]}
    store = tmp_path / "store"
    ls = {"name": "local_search", "params": {"batch_size": 4}, "label": "ls"}
    runner.run(runner.load_spec(str(write_spec("a", **spec, placers=[ls]))), store)
    before = sorted(p.name for p in (store / "cells").iterdir())
    for other in ({**ls, "params": {"batch_size": 16}}, {"name": "m_etf", "label": "ls"}):
        with pytest.raises(SpecError, match=r"placer label 'ls' is stored for local_search with params "
                                            r"\{\"batch_size\":4\}; this run gives it to .* another label"):
            runner.run(runner.load_spec(str(write_spec("b", **spec, placers=[other]))), store)
    assert sorted(p.name for p in (store / "cells").iterdir()) == before
    runner.run(runner.load_spec(str(write_spec("c", **spec, placers=[{**ls, "params": {"batch_size": 16},
                                                                       "label": "ls16"}]))), store)
    assert len(Store(store).cell_ids()) == 2
    # a store written before the manifest kept labels: its cells tell them
    manifest = json.loads((store / "manifest.json").read_text())
    del manifest["placers"]
    (store / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(SpecError, match="placer label 'ls' is stored for local_search"):
        runner.run(runner.load_spec(str(write_spec("b", **spec, placers=[{**ls, "params": {"batch_size": 16}}]))), store)


def test_a_methodology_is_known_by_its_content_not_only_its_version(tiny_files, write_spec, tmp_path, monkeypatch):
    spec = {"workloads": [str(tiny_files["diamond"])], "clusters": ["xeon_h100"], "placers": ["single_cpu"]}
    store = tmp_path / "store"
    runner.run(runner.load_spec(str(write_spec("a", **spec))), store)
    v1 = (Path(suite.__file__).parent / "methodology" / "v1.toml").read_text()
    changed = tmp_path / "fake_v1.toml"
    changed.write_text(re.sub(r"failure_multiple = [0-9.]+", "failure_multiple = 1.0", v1))
    assert changed.read_text() != v1
    # a file may not take the built-in's name with other rules
    with pytest.raises(SpecError, match=r"fake_v1.toml: version 'placebench-methodology-v1' is the built-in "
                                        r"methodology 'v1', but its rules differ: failure_multiple 1.0 \(built-in"):
        runner.run(runner.load_spec(str(write_spec("b", **spec, methodology=str(changed)))), store)
    # nor may the built-in change its rules under the same name (a store from an older placebench): the store
    # knows the rules it was run under
    monkeypatch.setattr(methodology, "_check_not_built_in", lambda meth, source: None)
    with pytest.raises(SpecError, match=r"another methodology named 'placebench-methodology-v1' \(differs in "
                                        r"failure_multiple\)"):
        runner.run(runner.load_spec(str(write_spec("b", **spec, methodology=str(changed)))), store)
    assert json.loads((store / "manifest.json").read_text())["methodologies"]["placebench-methodology-v1"][
        "failure_multiple"] != 1.0


def test_a_store_without_rows_takes_another_budget_of_the_spec(tiny_files, write_spec, tmp_path):
    """The manifest's methodology holds the last run's budget (a spec's): once the rows are removed, a spec with
    another budget runs; it was refused as 'rows made under another methodology' of the same rules."""
    spec = {"workloads": [str(tiny_files["diamond"])], "clusters": [str(tiny_files["cluster"])],
            "placers": ["single_cpu"]}
    store = tmp_path / "store"
    runner.run(runner.load_spec(str(write_spec("a", **spec, budget={"max_evaluations": 10}))), store)
    for cell in (store / "cells").glob("*.json"):
        cell.unlink()
    result = runner.run(runner.load_spec(str(write_spec("a", **spec, budget={"max_evaluations": 20}))), store)
    assert [(r["status"], r["budget_evaluations"]) for r in result.rows] == [("ok", 20)]
    assert json.loads((store / "manifest.json").read_text())["methodologies"]["placebench-methodology-v1"][
        "budget"]["max_evaluations"] == 20


def test_a_store_that_fills_up_mid_run_keeps_what_was_written_and_resumes(tiny_files, write_spec, tmp_path,
                                                                          monkeypatch):
    """The disk fills up at the third cell: the error reaches the caller, the two cells written are kept, the
    run is recorded as stopped after 2 of its 6 cells, the results tables hold exactly those 2, and the same
    run resumes with the other 4."""
    import errno

    spec = write_spec(workloads=[str(tiny_files["diamond"])], clusters=[str(tiny_files["cluster"])],
                      placers=["single_cpu", "single_gpu"], seeds=[0, 1, 2])
    store = tmp_path / "store"
    real, writes = Store.write_cell, []

    def full_disk(self, record):
        writes.append(record["cell_id"])
        if len(writes) >= 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, record)

    monkeypatch.setattr(Store, "write_cell", full_disk)
    with pytest.raises(OSError, match="No space left on device"):
        runner.run(str(spec), store, jobs=1)
    monkeypatch.setattr(Store, "write_cell", real)
    assert sorted(Store(store).cell_ids()) == sorted(writes[:2])
    run = Store(store).manifest()["runs"][-1]
    assert (run["cells_to_run"], run["cells_run"], run["complete"]) == (6, 2, False)
    for table in ("results.csv", "results.parquet"):
        assert sorted(r["cell_id"] for r in read_table(store / table)) == sorted(writes[:2])
    resumed = runner.run(str(spec), store, jobs=1)
    assert (resumed.ran, resumed.reused, len(resumed.rows)) == (4, 2, 6)
    assert [(r["placer"], r["seed"], r["step_time_s"]) for r in read_table(store / "results.csv")] == [
        ("single_cpu", 0, 4.0), ("single_cpu", 1, 4.0), ("single_cpu", 2, 4.0),
        ("single_gpu", 0, 0.4), ("single_gpu", 1, 0.4), ("single_gpu", 2, 0.4)]  # 4 ops of 1e9 FLOPs


def test_a_definition_whose_rows_were_all_removed_binds_nothing(tiny_files, write_spec, tmp_path, monkeypatch):
    """A placer label, a workload or cluster name and a methodology version bind a store only while it holds
    rows of them: once they are moved out (to redo them), a run with a retuned label, a changed graph or
    cluster, or changed rules under the same version runs; it was refused as if rows of the old ones were
    still there ("its rows ... were made from a different definition")."""
    store = tmp_path / "store"
    ls = {"name": "local_search", "params": {"batch_size": 4}, "label": "ls"}
    spec = {"workloads": [str(tiny_files["diamond"]), str(tiny_files["chain"])], "clusters": [str(tiny_files["cluster"])],
            "placers": ["single_cpu", ls], "budget": {"max_evaluations": 10}}
    assert runner.run(runner.load_spec(str(write_spec("a", **spec))), store).ran == 4

    def remove(**which):
        for r in Store(store).records():
            if all(r[k] == v for k, v in which.items()):
                Store(store).cell_path(r["cell_id"]).unlink()

    remove(placer="ls")
    retuned = {**spec, "placers": ["single_cpu", {**ls, "params": {"batch_size": 8}}]}
    result = runner.run(runner.load_spec(str(write_spec("b", **retuned))), store)
    assert (result.ran, result.reused) == (2, 2)
    assert sorted((r["workload"], r["placer"], r["params"]) for r in Store(store).records() if r["placer"] == "ls") == [
        ("chain", "ls", '{"batch_size":8}'), ("diamond", "ls", '{"batch_size":8}')]

    other = graph_io.save(OpGraph.build("diamond", [Op("a", "matmul", flops=2e9)], []), tmp_path / "other.json")
    changed = {**retuned, "workloads": [str(other), str(tiny_files["chain"])]}
    with pytest.raises(SpecError, match="its rows for workload 'diamond' were made from a different definition"):
        runner.run(runner.load_spec(str(write_spec("c", **changed))), store)
    remove(workload="diamond")
    result = runner.run(runner.load_spec(str(write_spec("c", **changed))), store)
    assert (result.ran, result.reused) == (2, 2)
    assert [r["step_time_s"] for r in result.rows if r["workload"] == "diamond" and r["placer"] == "single_cpu"] == [
        2.0]  # 2e9 FLOPs at 1e9 FLOP/s

    faster = tmp_path / "tiny.toml"
    faster.write_text(tiny_files["cluster"].read_text().replace("peak_flops = 1e9", "peak_flops = 2e9"))
    with pytest.raises(SpecError, match="its rows for cluster 'tiny' were made from a different definition"):
        runner.run(runner.load_spec(str(write_spec("d", **{**changed, "clusters": [str(faster)]}))), store)
    remove(cluster="tiny")
    result = runner.run(runner.load_spec(str(write_spec("d", **{**changed, "clusters": [str(faster)]}))), store)
    assert (result.ran, result.reused) == (4, 0)
    assert [r["step_time_s"] for r in result.rows if r["workload"] == "diamond" and r["placer"] == "single_cpu"] == [
        1.0]  # at 2e9 FLOP/s

    v1 = (Path(suite.__file__).parent / "methodology" / "v1.toml").read_text()
    rules = tmp_path / "other_v1.toml"
    rules.write_text(re.sub(r"failure_multiple = [0-9.]+", "failure_multiple = 2.0", v1))
    monkeypatch.setattr(methodology, "_check_not_built_in", lambda meth, source: None)
    other_rules = {**changed, "clusters": [str(faster)], "methodology": str(rules)}
    with pytest.raises(SpecError, match=r"another methodology named 'placebench-methodology-v1' \(differs in "
                                        r"failure_multiple\)"):
        runner.run(runner.load_spec(str(write_spec("e", **other_rules))), store)
    remove()
    assert runner.run(runner.load_spec(str(write_spec("e", **other_rules))), store).ran == 4
    assert Store(store).manifest()["methodologies"]["placebench-methodology-v1"]["failure_multiple"] == 2.0


# -- running: every way a cell can end --------------------------------------------------------------------
ALL_PLACERS = [
    "single_cpu",
    "single_gpu",
    "harness_raises",
    {"name": "harness_raises", "params": {"what": "exit"}, "label": "harness_sys_exit"},
    "harness_hangs",
    "harness_invalid",
    "harness_dies",
    {"name": "harness_dies", "params": {"how": "exit"}, "label": "harness_exits"},
    "harness_search",
    "harness_not_applicable",
    "harness_over_budget",
    "harness_cheats",
    "harness_misreports",
    "harness_patches_class",
    "harness_names",
    {"name": "harness_from_search", "params": {"what": "half"}, "label": "harness_half"},
    {"name": "harness_from_search", "params": {"what": "nan"}, "label": "harness_nan"},
    {"name": "harness_from_search", "params": {"what": "names"}, "label": "harness_names_from_search"},
]


@pytest.fixture(scope="module")
def outcome_run(tiny_files, spec_writer, harness_plugin, tmp_path_factory):
    """One run (shared by the tests below) of every outcome on two workloads."""
    tmp_path = tmp_path_factory.mktemp("outcomes")
    spec = spec_writer(
        tmp_path,
        "outcomes",
        workloads=[str(tiny_files["diamond"]), str(tiny_files["big"])],
        clusters=[str(tiny_files["cluster"])],
        placers=ALL_PLACERS,
        plugins=[harness_plugin],
        cell_timeout_s=1.5,
        budget={"max_evaluations": 10},
    )
    result = runner.run(str(spec), tmp_path / "store", jobs=2)
    return spec, result


def _by(rows, workload, placer):
    [row] = [r for r in rows if r["workload"] == workload and r["placer"] == placer]
    return row


def test_every_outcome_is_a_row_with_its_status(outcome_run):
    _, result = outcome_run
    rows = result.rows
    assert len(rows) == 2 * len(ALL_PLACERS) and result.ran == len(rows)
    # hand-computed: 4 ops of 1e9 FLOPs; CPU 1e9 FLOP/s serial = 4 s; GPU 1e10 FLOP/s = 0.4 s
    assert (_by(rows, "diamond", "single_cpu")["status"], _by(rows, "diamond", "single_cpu")["step_time_s"]) == ("ok", 4.0)
    assert _by(rows, "diamond", "single_gpu")["step_time_s"] == pytest.approx(0.4)
    oom = _by(rows, "big", "single_gpu")
    assert (oom["status"], oom["step_time_s"], oom["oom_devices"]) == ("oom", None, "gpu:0")
    assert "gpu:0 needs 2.00 MiB of 1.00 MiB" in oom["message"]
    assert json.loads(oom["peak_memory_bytes"])["gpu:0"] > 2**21
    expected = {
        "harness_raises": ("error", "RuntimeError: boom from a test placer"),
        "harness_hangs": ("timeout", "did not finish within the cell timeout of 1.5 s"),
        "harness_invalid": ("invalid", "placement has 3 entries, but workload"),
        "harness_dies": ("error", "worker killed by signal 9 (SIGKILL; the host's out-of-memory killer sends this); "
                                  "--retry-failed reruns the cell"),
        "harness_exits": ("error", "worker died (exit code 7); --retry-failed reruns the cell"),
        "harness_not_applicable": ("skipped", "needs at least 3 devices"),
        "harness_over_budget": ("error", "placer went past its search budget"),
    }
    for w in ("diamond", "big"):
        for placer, (status, message) in expected.items():
            row = _by(rows, w, placer)
            assert row["status"] == status, (w, placer, row)
            assert message in row["message"], (w, placer, row["message"])
            assert row["step_time_s"] is None


def test_search_statistics_come_from_the_evaluator(outcome_run):
    _, result = outcome_run
    row = _by(result.rows, "diamond", "harness_search")
    assert row["status"] == "ok" and row["evaluations"] == 5 and row["search_wall_time_s"] >= 0
    record = result.store.read_cell(row["cell_id"])
    assert [p["evaluations"] for p in record["curve"]] == [1, 2, 3, 4, 5]
    assert len(record["placement"]) == 4 and row["placement_hash"].startswith("sha256:")
    assert _by(result.rows, "diamond", "harness_over_budget")["evaluations"] == 10


def test_final_placement_is_re_measured_not_taken_from_the_search(outcome_run):
    _, result = outcome_run
    row = _by(result.rows, "diamond", "harness_cheats")  # its evaluator said 1 microsecond
    assert (row["status"], row["step_time_s"]) == ("ok", 4.0)
    # a placement of device names is a placement like any other
    assert (_by(result.rows, "diamond", "harness_names")["status"], _by(result.rows, "diamond", "harness_names")[
        "step_time_s"]) == ("ok", 4.0)


def test_sys_exit_in_a_placer_is_an_error_row_with_its_traceback_and_evaluations(outcome_run):
    """It was caught only by the worker: the row had no evaluations, search time or traceback."""
    _, result = outcome_run
    row = _by(result.rows, "diamond", "harness_sys_exit")
    assert (row["status"], row["message"], row["evaluations"]) == ("error", "SystemExit: 3", 1)
    assert row["search_wall_time_s"] >= 0 and row["cell_wall_time_s"] >= row["search_wall_time_s"]
    assert "sys.exit(3)" in result.store.read_cell(row["cell_id"])["traceback"]


def test_a_placement_of_floats_from_search_is_invalid_not_truncated(outcome_run):
    """`PlacementResult.from_search` keeps what is not an integer placement for the harness to validate: device
    1.5 made device 1 (an ok row of a placement the placer did not return), and NaN an error row."""
    _, result = outcome_run
    half, nan = _by(result.rows, "diamond", "harness_half"), _by(result.rows, "diamond", "harness_nan")
    assert (half["status"], half["message"]) == ("invalid", "placement[3] (op 'd'): 1.5 is not a device index")
    assert (nan["status"], nan["message"]) == ("invalid", "placement[0] (op 'a'): nan is not a device index")
    names = _by(result.rows, "diamond", "harness_names_from_search")  # names are a placement, as validate says
    assert (names["status"], names["step_time_s"]) == ("ok", 4.0)


def test_a_placer_that_patches_the_simulator_class_is_caught_by_the_runner(outcome_run):
    """harness_patches_class makes every re-measurement in its worker say 1 microsecond: the runner's own
    simulation disagrees, so its rows are errors, and no other cell saw the patch (its worker is replaced)."""
    _, result = outcome_run
    for w in ("diamond", "big"):
        row = _by(result.rows, w, "harness_patches_class")
        assert row["status"] == "error" and row["step_time_s"] is None
        assert row["message"].startswith("the worker measured ok 1e-06 s") and "changed the evaluator" in row["message"]
    ok = [r for r in result.rows if r["status"] == "ok"]
    assert ok and all(r["step_time_s"] >= 0.4 - 1e-9 for r in ok)  # 0.4 s on the GPU is the fastest there is


def test_a_placers_child_process_dies_with_its_timed_out_cell(tiny_files, spec_writer, harness_plugin, tmp_path):
    """The child ignores SIGINT and SIGTERM and would hang for an hour: killing the worker's process group
    at the timeout ends it too."""
    pid_file = tmp_path / "child.pid"
    spec = spec_writer(tmp_path, "child", workloads=[str(tiny_files["diamond"])], clusters=[str(tiny_files["cluster"])],
                       placers=[{"name": "harness_child_hangs", "params": {"pid_file": str(pid_file)}}],
                       plugins=[harness_plugin], cell_timeout_s=1.5)
    [row] = runner.run(str(spec), tmp_path / "store", jobs=1).rows
    assert row["status"] == "timeout"
    pid = int(pid_file.read_text())
    for _ in range(100):  # SIGKILL is delivered at once; the child is then reaped by init
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        pytest.fail(f"the placer's child {pid} outlived its cell")


def test_what_a_placer_prints_does_not_reach_the_json_document(tiny_files, spec_writer, harness_plugin, tmp_path, capfd):
    from suite.cli import main

    spec = spec_writer(tmp_path, "prints", workloads=[str(tiny_files["diamond"])], clusters=[str(tiny_files["cluster"])],
                       placers=["harness_prints"], plugins=[harness_plugin])
    assert main(["run", str(spec), "--out", str(tmp_path / "store"), "--json", "--jobs", "1"]) == 0
    out, err = capfd.readouterr()
    assert json.loads(out)["rows"][0]["status"] == "ok" and "hello from a placer" in err


def test_the_row_is_the_returned_placement_with_the_evaluators_count(outcome_run):
    """harness_misreports evaluated [0,0,0,0] (4 s, its search's best), then returned [1,1,1,1] and claimed
    0 evaluations."""
    _, result = outcome_run
    row = _by(result.rows, "diamond", "harness_misreports")
    assert (row["status"], row["step_time_s"], row["evaluations"]) == ("ok", pytest.approx(0.4), 1)  # on the GPU
    record = result.store.read_cell(row["cell_id"])
    assert record["placement"] == [1, 1, 1, 1]
    assert [(p["evaluations"], p["best_score_s"]) for p in record["curve"]] == [(1, 4.0)]


def test_the_table_shows_failed_cells_as_their_status(outcome_run):
    _, result = outcome_run
    text = report.render(result.rows, "text")
    diamond = next(line for line in text.splitlines() if line.startswith("diamond"))
    big = next(line for line in text.splitlines() if line.startswith("big"))
    for word in ("error", "timeout", "invalid", "skipped", "4.000 s", "400.0 ms"):
        assert word in diamond
    assert "OOM" in big


def test_manifest_describes_the_run(outcome_run):
    _, result = outcome_run
    m = result.store.manifest()
    assert m["workloads"]["diamond"]["hash"].startswith("sha256:")
    assert m["clusters"]["tiny"]["devices"] == ["cpu:0", "gpu:0"]
    assert m["methodologies"]["placebench-methodology-v1"]["budget"]["max_evaluations"] == 10
    run = m["runs"][-1]
    assert run["machine"]["cpus"] >= 1 and run["packages"]["numpy"] and "commit" in run["git"]
    # the spec's timeout is what the cells ran under; the methodology's entry keeps its own default
    assert (run["cell_timeout_s"], run["seeds"]) == (1.5, [0])
    assert m["methodologies"]["placebench-methodology-v1"]["cell_timeout_s"] == 900.0
    assert (result.store.root / "results.parquet").exists() and (result.store.root / "results.csv").exists()


def test_rerun_skips_stored_cells_and_force_redoes_them(outcome_run):  # last of these: it adds runs
    spec, first = outcome_run
    store = first.store.root
    again = runner.run(str(spec), store, jobs=2)
    assert (again.ran, again.reused) == (0, len(first.rows))
    assert again.rows == first.rows
    # --retry-failed reruns only error and timeout cells; --force all (here: restricted to fast placers)
    base = runner.load_spec(str(spec)).as_dict()
    with_hangs = runner.spec_from_dict({**base, "placers": ["single_cpu", "harness_raises", "harness_hangs"]})
    retried = runner.run(with_hangs, store, jobs=2, retry_failed=True)
    rerun = sorted((r["workload"], r["placer"], r["status"]) for r in retried.rows if r["run_id"] == retried.run_id)
    assert rerun == [
        ("big", "harness_hangs", "timeout"), ("big", "harness_raises", "error"),
        ("diamond", "harness_hangs", "timeout"), ("diamond", "harness_raises", "error"),
    ]
    spec2 = runner.spec_from_dict({**base, "placers": ["single_cpu", "harness_raises"]})
    forced = runner.run(spec2, store, jobs=1, force=True)
    assert forced.ran == 4
    rows = Store(store).rows()
    assert len(rows) == len(first.rows) and len({r["cell_id"] for r in rows}) == len(rows)
    manifest = Store(store).manifest()
    assert [r["cells_run"] for r in manifest["runs"]] == [len(first.rows), 0, 4, 4]
    assert all(r["complete"] for r in manifest["runs"])


def test_a_stored_cell_whose_placer_code_changed_is_run_again(tiny_files, write_spec, tmp_path, monkeypatch):
    spec = runner.load_spec(str(write_spec(workloads=[str(tiny_files["diamond"])], clusters=[str(tiny_files["cluster"])],
                                           placers=["single_cpu", "single_gpu"], seeds=[0, 1])))
    store = tmp_path / "store"
    first = runner.run(spec, store)
    codes = {r["placer"]: r["placer_code"] for r in Store(store).records()}
    assert first.ran == 4 and codes == {p: runner.placer_code(p) for p in ("single_cpu", "single_gpu")}
    assert runner.run(spec, store).ran == 0  # same code: reused
    real = runner.placer_code
    monkeypatch.setattr(runner, "placer_code", lambda name: "0123456789ab" if name == "single_gpu" else real(name))
    told = []
    again = runner.run(spec, store, on_plan=lambda *a: told.append(a))
    assert told == [(4, 2, 2, 0)] and again.ran == 2  # the single_gpu cells, and only they
    records = Store(store).records()
    assert len(records) == 4 and {r["placer"]: r["placer_code"] for r in records}["single_gpu"] == "0123456789ab"
    assert Store(store).manifest()["runs"][-1]["cells_stale"] == 2
    # a cell stored without a fingerprint (an older store) cannot be judged: it is kept
    for path in (store / "cells").glob("*.json"):
        cell = json.loads(path.read_text())
        cell.pop("placer_code")
        path.write_text(json.dumps(cell))
    monkeypatch.setattr(runner, "placer_code", lambda name: "ba9876543210")
    assert runner.run(spec, store).ran == 0


# -- a killed run ---------------------------------------------------------------------------------------------
def test_sigkill_mid_run_then_resume_loses_and_duplicates_nothing(tiny_files, write_spec, harness_plugin, tmp_path):
    """Seeds 0-2 of the first workload finish, the next cell waits for a gate opened only for the resume: the
    kill comes mid-run however late a loaded machine lets this test send it."""
    gate = tmp_path / "gate"
    spec = write_spec(
        "killed",
        workloads=[str(tiny_files["diamond"]), str(tiny_files["chain"])],
        clusters=[str(tiny_files["cluster"])],
        placers=[{"name": "harness_gated", "params": {"gate": str(gate), "free_below": 3}}],
        plugins=[harness_plugin],
        seeds=list(range(8)),
    )
    out = tmp_path / "store"
    total = 16
    proc = subprocess.Popen(
        [sys.executable, "-m", "suite.cli", "run", str(spec), "--out", str(out), "--jobs", "1", "--quiet"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    cells = out / "cells"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not cells.is_dir() or len(list(cells.glob("*.json"))) < 3):
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the runner and its workers, at once
    proc.wait(timeout=10)
    stored = len(list(cells.glob("*.json")))
    assert 3 <= stored < total, "the run was not killed mid-way"

    gate.touch()
    resumed = runner.run(str(spec), out, jobs=2)
    assert resumed.reused == stored and resumed.ran == total - stored
    rows = Store(out).rows()
    keys = [(r["workload"], r["seed"]) for r in rows]
    assert len(rows) == total and len(set(keys)) == total
    assert {r["status"] for r in rows} == {"ok"}
    assert len(list(cells.iterdir())) == total  # no temporary files left behind


def _default_stop_signals() -> None:
    """In the child: a shell starts a background job (`pytest &`, a CI runner's) with SIGINT ignored, `nohup`
    with SIGHUP ignored, and Python keeps an ignored signal ignored, as a background job should: the run under
    test must get them as from a terminal."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)]
                         + ([(signal.SIGHUP, 129)] if hasattr(signal, "SIGHUP") else []))
def test_sigterm_sigint_or_sighup_to_the_group_stops_like_ctrl_c(sig, code, tiny_files, write_spec, harness_plugin, tmp_path):
    """A scheduler's SIGTERM (to the whole process group), or a closed terminal's SIGHUP, stops the run as Ctrl-C
    does: the finished cells, the results tables and the manifest (with the run's cell count) are written, no
    worker reports a bogus error, and it resumes. Seeds 0-2 finish, the others wait for a gate opened only for
    the resume: the signal comes mid-run however late a loaded machine lets this test send it."""
    gate = tmp_path / "gate"
    spec = write_spec(
        "termed",
        workloads=[str(tiny_files["diamond"])],
        clusters=[str(tiny_files["cluster"])],
        placers=[{"name": "harness_gated", "params": {"gate": str(gate), "free_below": 3}}],
        plugins=[harness_plugin],
        seeds=list(range(24)),
    )
    out = tmp_path / "store"
    proc = subprocess.Popen(
        [sys.executable, "-m", "suite.cli", "run", str(spec), "--out", str(out), "--jobs", "2", "--quiet"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
        preexec_fn=_default_stop_signals,
    )
    cells = out / "cells"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not cells.is_dir() or len(list(cells.glob("*.json"))) < 3):
        time.sleep(0.05)
    os.killpg(proc.pid, sig)
    _, err = proc.communicate(timeout=60)
    rows = Store(out).rows()
    # if it fails, say whether the run had finished before the signal came
    assert proc.returncode == code and "interrupted; finished cells are stored" in err, (proc.returncode, len(rows), err)
    assert 3 <= len(rows) < 24 and {r["status"] for r in rows} == {"ok"}
    assert (out / "results.csv").exists() and (out / "results.parquet").exists()
    run = json.loads((out / "manifest.json").read_text())["runs"][-1]
    assert run["finished_at"] is not None and run["complete"] is False and run["cells_run"] == len(rows)
    gate.touch()
    assert runner.run(str(spec), out, jobs=2).ran == 24 - len(rows)


@pytest.mark.skipif(not hasattr(signal, "pthread_sigmask"), reason="no signal masks")
def test_a_second_interrupt_while_a_run_records_its_end_waits_for_the_record(tiny_files, write_spec, tmp_path,
                                                                               monkeypatch):
    """A second Ctrl-C (or a closed terminal's second SIGHUP) that comes while a run writes its manifest entry
    and tables arrives after them: the manifest records the run's cells, and the run still stops."""
    spec = write_spec(workloads=[str(tiny_files["diamond"])], clusters=[str(tiny_files["cluster"])],
                      placers=["single_cpu"])
    real, calls = runner._manifest_update, []

    def update(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # the record at the run's end: Ctrl-C now
            signal.raise_signal(signal.SIGINT)
        real(*args, **kwargs)

    monkeypatch.setattr(runner, "_manifest_update", update)
    out = tmp_path / "store"
    with pytest.raises(KeyboardInterrupt):
        runner.run(str(spec), out)
    run = json.loads((out / "manifest.json").read_text())["runs"][-1]
    assert (run.get("cells_run"), run["complete"]) == (1, True) and run["finished_at"] is not None
    assert len(Store(out).rows()) == 1 and (out / "results.csv").exists()


def _workers_of(pid: int) -> list[int]:
    """The worker processes (spawned Pythons) the process `pid` has started, from /proc."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid and b"spawn_main" in cmdline:
            found.append(int(stat.parent.name))
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the runner's workers in /proc")
def test_ctrl_c_while_the_first_worker_starts_stops_cleanly(tiny_files, write_spec, harness_plugin, tmp_path):
    """Ctrl-C (to the process group, as a terminal sends it) while the run's first worker is still importing:
    exit 130 with the interrupt message, no traceback from the runner or the worker, the stored cells kept.
    The cells left wait for a gate that never opens: on a loaded machine this test may send its Ctrl-C late,
    and fast cells had then finished (exit 0, or every cell stored) before it came."""
    gate = tmp_path / "gate"
    spec = write_spec("early", workloads=[str(tiny_files["diamond"])], clusters=[str(tiny_files["cluster"])],
                      placers=[{"name": "harness_gated", "params": {"gate": str(gate)}}], plugins=[harness_plugin],
                      seeds=[0, 1, 2])
    out = tmp_path / "store"
    gate.touch()
    runner.run(str(spec), out, select=lambda c: c.seed == 0)
    gate.unlink()
    proc = subprocess.Popen(
        [sys.executable, "-m", "suite.cli", "run", str(spec), "--out", str(out), "--jobs", "1", "--quiet"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as in the test above
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not _workers_of(proc.pid) and proc.poll() is None:
        time.sleep(0.005)
    assert _workers_of(proc.pid), "no worker was seen starting"
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in err, (proc.returncode, err)
    assert err.endswith("placebench: interrupted; finished cells are stored, rerun the same command to resume\n"), err
    assert [r["seed"] for r in Store(out).rows()] == [0]
    run = json.loads((out / "manifest.json").read_text())["runs"][-1]
    assert (run["complete"], run["cells_run"]) == (False, 0)


def test_a_worker_interrupted_while_it_starts_runs_its_cell(tiny_files, write_spec, capfd):
    """A worker holds Ctrl-C and SIGTERM from its start until it ignores them: one that comes while it imports
    does not kill it (which would print a traceback on the run's stderr)."""
    spec = write_spec(workloads=[str(tiny_files["diamond"])], clusters=[str(tiny_files["cluster"])],
                      placers=["single_cpu"])
    [cell] = runner.make_plan(runner.load_spec(str(spec))).cells
    w = runner._Worker(multiprocessing.get_context("spawn"), 1, {})
    try:
        os.kill(w.proc.pid, signal.SIGINT)  # just started: still importing
        assert w.submit(cell)
        kind = None
        while kind != "done":
            assert w.conn.poll(120)
            kind, record = w.conn.recv()
        assert record["status"] == "ok"
    finally:
        w.stop()
    assert w.proc.exitcode == 0 and "Traceback" not in capfd.readouterr().err


def test_a_cell_that_does_not_pickle_leaves_no_worker_behind(tiny_files, write_spec):
    """The error reaches the caller and the worker started for the cell is gone: left running, it waited for
    its cell and the interpreter's exit waited for it, for ever (a Profile that did not pickle did that)."""
    spec = write_spec(workloads=[str(tiny_files["diamond"])], clusters=[str(tiny_files["cluster"])],
                      placers=["single_cpu"])
    [cell] = runner.make_plan(runner.load_spec(str(spec))).cells
    bad = dataclasses.replace(cell, key={**cell.key, "unpicklable": lambda: None})
    with pytest.raises((pickle.PicklingError, AttributeError)):
        runner.execute([bad], jobs=1, on_done=lambda record: None)
    assert multiprocessing.active_children() == []


def test_an_interrupt_after_every_cell_is_stored_leaves_a_complete_run(tiny_files, write_spec, monkeypatch, tmp_path):
    """Ctrl-C while the worker pool shuts down, once every cell is stored: the run is complete (a table
    must not warn that '2 of its 2 cells' were run), and the interrupt still reaches the caller."""
    spec = write_spec(workloads=[str(tiny_files["diamond"])], clusters=[str(tiny_files["cluster"])],
                      placers=["single_cpu", "single_gpu"])
    real = runner.execute

    def then_interrupted(cells, **kw):
        real(cells, **kw)
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "execute", then_interrupted)
    with pytest.raises(KeyboardInterrupt):
        runner.run(str(spec), tmp_path / "store", jobs=1)
    run = json.loads((tmp_path / "store" / "manifest.json").read_text())["runs"][-1]
    assert (run["complete"], run["cells_run"], run["cells_to_run"]) == (True, 2, 2)
    assert len(Store(tmp_path / "store").rows()) == 2


def test_a_broken_plugin_is_an_error_row_not_a_failed_run(tiny_files, write_spec, broken_entry_point, tmp_path):
    spec = write_spec(workloads=[str(tiny_files["diamond"])], clusters=[str(tiny_files["cluster"])],
                      placers=["single_cpu", broken_entry_point])
    rows = runner.run(str(spec), tmp_path / "store", jobs=1).rows
    assert [(r["placer"], r["status"]) for r in rows] == [(broken_entry_point, "error"), ("single_cpu", "ok")]
    assert "failed to load: ModuleNotFoundError" in rows[0]["message"]


def test_an_evaluator_plugin_measures_the_cells(tiny_files, write_spec, harness_plugin, tmp_path):
    spec = write_spec(workloads=[str(tiny_files["diamond"])], clusters=[str(tiny_files["cluster"])],
                      placers=["single_cpu"], plugins=[harness_plugin], evaluator="harness_double")
    [row] = runner.run(str(spec), tmp_path / "store", jobs=1).rows
    assert (row["evaluator"], row["status"], row["step_time_s"]) == ("harness_double", "ok", 8.0)  # 2 x 4 s


def _numerics_run(spec, store):
    """(what the harness_numerics worker computed with, the run's recorded `numerics`)."""
    result = runner.run(str(spec), store, jobs=1)
    [row] = result.rows
    return result.store.read_cell(row["cell_id"])["info"], result.store.manifest()["runs"][-1]["numerics"]


@pytest.mark.skipif(cpu_simd() not in numerics.PINNED_SIMD, reason="the pins are for x86-64 hosts with AVX2")
def test_workers_of_a_simulated_run_compute_with_pinned_math(tiny_files, write_spec, harness_plugin, tmp_path,
                                                              monkeypatch):
    """torch in the worker runs its AVX2 kernels whatever the host's widest extension; the manifest says so."""
    for v in numerics.VARIABLES:
        monkeypatch.delenv(v, raising=False)
    spec = write_spec(workloads=[str(tiny_files["diamond"])], clusters=[str(tiny_files["cluster"])],
                      placers=["harness_numerics"], plugins=[harness_plugin])
    pins = numerics.pins(cpu_simd())
    assert set(pins) >= {"ATEN_CPU_CAPABILITY", "MKL_CBWR", "OPENBLAS_CORETYPE"}
    assert _numerics_run(spec, tmp_path / "store") == ({"env": pins, "torch_kernels": "AVX2"}, pins)


def test_the_callers_math_settings_win_and_timed_runs_are_not_pinned(tiny_files, write_spec, harness_plugin,
                                                                      tmp_path, monkeypatch):
    """A variable the caller set reaches the worker as it is (here torch's plain kernels) and is recorded; a
    run whose evaluator is not the simulator (it may time real execution) gets no pins."""
    for v in numerics.VARIABLES:
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    common = {"workloads": [str(tiny_files["diamond"])], "clusters": [str(tiny_files["cluster"])],
              "placers": ["harness_numerics"], "plugins": [harness_plugin]}
    info, recorded = _numerics_run(write_spec("sim", **common), tmp_path / "sim")
    assert info["torch_kernels"] == "DEFAULT" and info["env"] == recorded
    assert recorded == {**numerics.pins(cpu_simd()), "ATEN_CPU_CAPABILITY": "default"}
    info, recorded = _numerics_run(write_spec("timed", evaluator="harness_double", **common), tmp_path / "timed")
    assert info == {"env": {"ATEN_CPU_CAPABILITY": "default"}, "torch_kernels": "DEFAULT"}
    assert recorded == {"ATEN_CPU_CAPABILITY": "default"}


def test_stored_cells_made_with_other_cpu_kernels_are_run_again(tiny_files, write_spec, tmp_path, monkeypatch):
    """A resumed run on the same kind of host reuses its cells; cells whose run recorded another vector
    extension or other math settings are redone (a learned placer may have searched differently); a run that
    recorded no extension (an older store, or an unknown host) cannot be judged and is kept."""
    spec = runner.load_spec(str(write_spec(workloads=[str(tiny_files["diamond"])], clusters=[str(tiny_files["cluster"])],
                                           placers=["single_cpu", "single_gpu"], seeds=[0])))
    store = tmp_path / "store"
    host = cpu_simd()
    if not host:
        pytest.skip("this host's vector extension is unknown")
    for v in numerics.VARIABLES:
        monkeypatch.delenv(v, raising=False)
    assert runner.run(spec, store).ran == 2
    told = []
    assert runner.run(spec, store, on_plan=lambda *a: told.append(a)).ran == 0 and told == [(2, 2, 0, 0)]

    def set_simd(simd, runs=slice(0, 1)):  # of the first run (the one that made the cells), or of others
        manifest = json.loads((store / "manifest.json").read_text())
        for run in manifest["runs"][runs]:
            run["machine"]["simd"] = simd
            if simd is None:
                del run["machine"]["simd"]
        (store / "manifest.json").write_text(json.dumps(manifest))

    set_simd("SVE" if host != "SVE" else "AVX2")  # made on another kind of host
    again = runner.run(spec, store, on_plan=lambda *a: told.append(a))
    assert again.ran == 2 and told[-1] == (2, 0, 0, 2)
    assert Store(store).manifest()["runs"][-1]["cells_stale_kernels"] == 2
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")  # the caller's own math settings: other kernels
    assert runner.run(spec, store).ran == 2
    assert runner.run(spec, store).ran == 0  # and the same settings again: reused
    monkeypatch.delenv("ATEN_CPU_CAPABILITY")
    set_simd(None, slice(None))  # not recorded (an older store)
    assert runner.run(spec, store).ran == 0


# -- one cell, in process ------------------------------------------------------------------------------------
def test_a_workload_changed_after_planning_is_an_error_row(tiny_files, write_spec, tmp_path):
    workload = tmp_path / "w.json"
    workload.write_bytes(tiny_files["diamond"].read_bytes())
    spec = write_spec(workloads=[str(workload)], clusters=[str(tiny_files["cluster"])], placers=["single_cpu"])
    [cell] = runner.make_plan(runner.load_spec(str(spec))).cells
    graph_io.save(OpGraph.build("diamond", [Op("a", "matmul", flops=1e9)], []), workload)  # edited: not planned
    record = runner.run_cell(cell)
    message = f"workload {str(workload)!r} changed since the run was planned"
    assert (record["status"], record["message"]) == ("error", message)
    assert "step_time_s" not in record and "placement" not in record


def test_a_cluster_changed_after_planning_is_an_error_row(tiny_files, write_spec, tmp_path):
    """As a workload: the row would name the planned cluster's hash but be measured on the edited one (here a
    CPU 10x faster: 0.4 s where the planned cluster gives 4 s)."""
    cluster = tmp_path / "c.toml"
    cluster.write_text(tiny_files["cluster"].read_text())
    spec = write_spec(workloads=[str(tiny_files["diamond"])], clusters=[str(cluster)], placers=["single_cpu"])
    [cell] = runner.make_plan(runner.load_spec(str(spec))).cells
    cluster.write_text(cluster.read_text().replace("peak_flops = 1e9", "peak_flops = 1e10", 1))  # edited
    record = runner.run_cell(cell)
    message = f"cluster {str(cluster)!r} changed since the run was planned"
    assert (record["status"], record["message"]) == ("error", message)
    assert "step_time_s" not in record and "placement" not in record


def test_only_the_simulator_is_warmed_up_before_the_timed_part(tiny_files, write_spec, tmp_path, monkeypatch):
    """The warm-up before the cell timeout compiles the simulator. A real-execution backend (any backend that
    is not a SimulatorBackend) is not warmed up: that was two real measurements of the whole model on one
    device (measure, then measure_batch) per workload and cluster, outside the cell timeout. Here the only
    measurement is the final placement's re-measurement."""
    from suite.evaluator import SimulatorBackend

    calls = []

    class Real:  # a real-execution backend, as far as the runner sees one
        name = "count_real"

        def __init__(self, workload, cluster):
            self.sim = SimulatorBackend(workload, cluster)

        def measure(self, placement):
            calls.append(("measure", placement.tolist()))
            return self.sim.measure(placement)

        def measure_batch(self, placements):
            calls.append(("measure_batch", placements.tolist()))
            return self.sim.measure_batch(placements)

    monkeypatch.setitem(runner._EVALUATORS, "count_real", lambda workload, cluster, methodology: Real(workload, cluster))
    workload = tmp_path / "w.json"  # a workload and cluster this process has not warmed up
    workload.write_bytes(tiny_files["diamond"].read_bytes())
    spec = write_spec(workloads=[str(workload)], clusters=[str(tiny_files["cluster"])], placers=["single_cpu"],
                      evaluator="count_real")
    [cell] = runner.make_plan(runner.load_spec(str(spec))).cells
    record = runner.run_cell(cell)
    assert (record["status"], record["step_time_s"], record["evaluations"]) == ("ok", 4.0, 0)
    assert calls == [("measure", [0, 0, 0, 0])]


def test_evaluate_one(tiny_files):
    rec = runner.evaluate_one(str(tiny_files["big"]), str(tiny_files["cluster"]), "single_cpu")
    assert (rec["status"], rec["step_time_s"], rec["placement"]) == ("ok", 4.0, [0, 0, 0, 0])


def test_each_cell_runs_its_placer_with_its_own_seed(tiny_files, write_spec, harness_plugin):
    """harness_search's one evaluation is its seed's first random placement (numpy's default_rng, 2 devices):
    seed 1 gives [0, 1, 1, 1], seed 2 [1, 0, 0, 0]; the row of each seed holds its own."""
    spec = write_spec("seeds", workloads=[str(tiny_files["diamond"])], clusters=[str(tiny_files["cluster"])],
                      placers=[{"name": "harness_search", "params": {"evaluations": 1}}], seeds=[1, 2],
                      plugins=[harness_plugin])
    records = [runner.run_cell(c) for c in runner.make_plan(runner.load_spec(str(spec))).cells]
    assert [(r["seed"], r["placement"]) for r in records] == [(1, [0, 1, 1, 1]), (2, [1, 0, 0, 0])]


def test_the_same_spec_gives_the_same_cells_on_one_or_two_workers(tiny_files, write_spec, harness_plugin, tmp_path):
    """Each cell's search depends only on its own seed: one worker running every cell in turn, or two sharing
    them, store the same records (placements, statuses, times, learning curves), but for when and how long."""
    spec = write_spec("jobs", workloads=[str(tiny_files["diamond"]), str(tiny_files["chain"])],
                      clusters=[str(tiny_files["cluster"])], seeds=[0, 1, 2], plugins=[harness_plugin],
                      placers=["local_search", {"name": "harness_search", "params": {"evaluations": 3}}],
                      budget={"max_evaluations": 12})
    timed = {"run_id", "finished_at", "cell_wall_time_s", "search_wall_time_s"}

    def cells(jobs):
        runner.run(str(spec), tmp_path / f"jobs{jobs}", jobs=jobs)
        out = {}
        for r in Store(tmp_path / f"jobs{jobs}").records():
            r = {k: v for k, v in r.items() if k not in timed}
            r["curve"] = [{k: v for k, v in p.items() if k != "wall_time_s"} for p in r["curve"]]
            out[r["cell_id"]] = r
        return out

    one, two = cells(1), cells(2)
    assert len(one) == 12 and one == two
    assert len({json.dumps(r["placement"]) for r in one.values() if r["placer_name"] == "harness_search"}) > 1  # seeds differ


def test_a_placement_file_is_measured_under_the_methodology_given(tiny_files, tmp_path):
    (tmp_path / "p.json").write_text("[0, 0, 0, 0]")
    rec = runner.measure_placement(str(tiny_files["diamond"]), str(tiny_files["cluster"]), tmp_path / "p.json",
                                   methodology="v1-fidelity-light")
    assert (rec["status"], rec["step_time_s"], rec["methodology"]) == ("ok", 4.0, "placebench-methodology-v1-fidelity-light")


def test_a_worker_gone_before_its_first_cell_arrives_gives_an_error_row(tiny_files, write_spec, monkeypatch):
    """A fresh worker that is gone when its first cell is sent (its pipe closed by `kill`): the cell is an error
    row saying how the worker ended; the run raised OSError ('handle is closed') from waiting on that pipe."""

    def send_to_a_dead_worker(self, cell):
        self.cell, self.submitted, self.started = cell, time.perf_counter(), None
        self.kill()
        return False

    monkeypatch.setattr(runner._Worker, "submit", send_to_a_dead_worker)
    spec = write_spec(workloads=[str(tiny_files["diamond"])], clusters=[str(tiny_files["cluster"])], placers=["single_cpu"])
    records = []
    runner.execute(runner.make_plan(runner.load_spec(str(spec))).cells, on_done=records.append, rerun_hint="")
    assert [(r["status"], r["message"]) for r in records] == [
        ("error", "worker killed by signal 9 (SIGKILL; the host's out-of-memory killer sends this)")]


def test_a_setup_timeout_says_how_long_setup_was_given(tiny_files, monkeypatch):
    """Setup (before the placer starts) may take the boot allowance plus the cell timeout; the row said "took
    over {boot allowance} s", short by the whole cell timeout (180 s said where 1080 s had passed)."""
    monkeypatch.setattr(runner, "BOOT_TIMEOUT_S", 0.0)  # a worker cannot even start in 0.25 s
    rec = runner.evaluate_one(str(tiny_files["big"]), str(tiny_files["cluster"]), "single_cpu", cell_timeout_s=0.25)
    assert (rec["status"], rec["message"]) == (
        "timeout", "setup (worker start, plugins, workload, placer, evaluator) took over 0.25 s")


def test_evaluate_one_says_how_a_worker_died_without_the_runs_retry_hint(tiny_files, harness_plugin):
    """evaluate stores nothing and has no --retry-failed: its row says how the worker ended, and only that."""
    rec = runner.evaluate_one(str(tiny_files["big"]), str(tiny_files["cluster"]), "harness_dies",
                              params={"how": "exit"}, plugins=[harness_plugin])
    assert (rec["status"], rec["message"]) == ("error", "worker died (exit code 7)")


def test_a_placer_info_that_cannot_be_pickled_does_not_lose_the_result(tiny_files, tmp_path):
    """The worker sends the record as the store writes it (JSON-safe): a function in `info` becomes text."""
    plugin = tmp_path / "odd_info.py"
    plugin.write_text("import time\nimport numpy as np\nfrom suite.placer import BasePlacer, PlacementResult, register_placer\n\n"
                      "@register_placer('odd_info')\nclass OddInfo(BasePlacer):\n"
                      "    def place(self, problem, budget, seed):\n"
                      "        p = np.zeros(problem.workload.num_ops, dtype=np.int64)\n"
                      "        return PlacementResult.from_search(p, problem, time.perf_counter(), fn=lambda: 0)\n")
    rec = runner.evaluate_one(str(tiny_files["big"]), str(tiny_files["cluster"]), "odd_info", plugins=[str(plugin)])
    assert (rec["status"], rec["step_time_s"]) == ("ok", 4.0), rec["message"]
    assert rec["info"]["fn"].startswith("<function OddInfo.place.<locals>.<lambda>")


# -- the quick suite's wall time (run with: python -m pytest -m benchmark tests/test_runner.py) ---------------
@pytest.mark.benchmark
def test_quick_suite_wall_time(benchmark, tmp_path):
    """The default suite, as `placebench run` runs it, on 2 workers; the issue asks for at most 5 minutes."""
    result = benchmark.pedantic(lambda: runner.run("quick", tmp_path / "quick", jobs=2), rounds=1, iterations=1)
    assert result.ran == len(result.plan.cells) == len(result.rows)
    assert all(r["status"] in ("ok", "oom", "invalid", "timeout", "error", "skipped") for r in result.rows)


def test_a_workload_no_device_of_a_cluster_can_run_is_refused_when_planned(write_spec, tmp_path):
    g = graph_io.save(OpGraph.build("gpu_only", [Op("a", "matmul", flops=1e9, allowed_kinds=("gpu",))], []),
                      tmp_path / "gpu_only.json")
    from suite.errors import PlacementError

    cpu = tmp_path / "cpu.toml"
    cpu.write_text('schema_version = 1\nname = "cpu_only"\n[[devices]]\nname = "cpu:0"\nkind = "cpu"\npeak_flops = 1e9\n'
                   'mem_bandwidth = 1e30\nmemory_bytes = 1073741824\nop_overhead_s = 0.0\n')
    spec = write_spec(workloads=[str(g)], clusters=[str(cpu)], placers=["single_cpu", "m_etf"])
    with pytest.raises(PlacementError, match=r"'gpu_only' cannot be placed on 'cpu_only': op 'a' \(or its colocation "
                                             r"group\) allows none of its device kinds \(cpu\)"):
        runner.make_plan(runner.load_spec(str(spec)))
    assert len(runner.make_plan(runner.load_spec(str(write_spec("ok", workloads=[str(g)], clusters=["xeon_h100"],
                                                                  placers=["single_gpu"])))).cells) == 1


def _without_onnxruntime(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnxruntime" else real(name, *a))


def test_an_onnxruntime_spec_without_it_installed_is_refused_when_planned(tiny_files, write_spec, tmp_path,
                                                                          monkeypatch, capsys):
    """ONNX Runtime is an optional extra: a spec that times on it is refused before any cell runs, naming the
    extra to install; it was an error row per cell ("No module named 'onnxruntime'"), stored, so that a run
    after installing it reused them."""
    from suite.backends import make_real_backend
    from suite.cli import main
    from suite.errors import PlacebenchError

    _without_onnxruntime(monkeypatch)
    spec = write_spec(workloads=[str(tiny_files["diamond"])], clusters=[str(tiny_files["cluster"])],
                      placers=["single_cpu"], evaluator="onnxruntime")
    with pytest.raises(PlacebenchError, match=r"evaluator 'onnxruntime' needs ONNX Runtime, which is not installed: "
                                              r'pip install -e "\.\[cpu\]" \(or "\.\[gpu\]" with CUDA'):
        runner.make_plan(runner.load_spec(str(spec)))
    assert main(["run", str(spec), "--out", str(tmp_path / "store"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("placebench: error: ") and "needs ONNX Runtime" in err and "Traceback" not in err
    assert not (tmp_path / "store").exists()
    with pytest.raises(PlacebenchError, match=r"the onnxruntime backend needs ONNX Runtime"):
        make_real_backend("onnxruntime", None, None)


def test_a_real_evaluator_spec_this_machine_cannot_run_is_refused_before_any_cell(
        tiny_files, write_spec, tmp_path, monkeypatch, capsys):
    """A real evaluator on a cluster with a GPU where no CUDA device is visible, or on a workload without a zoo
    model, failed every cell alike: one error row per cell, stored, and exit 0. Now refused when planned,
    exit 2, with a store's cells kept."""
    import torch

    from suite.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    store = tmp_path / "store"
    sim = write_spec("sim", workloads=[str(tiny_files["diamond"])], clusters=[str(tiny_files["cluster"])],
                     placers=["single_cpu"])
    assert runner.run(str(sim), store).ran == 1
    real = write_spec("real", workloads=[str(tiny_files["diamond"])], clusters=[str(tiny_files["cluster"])],
                      placers=["single_cpu", "single_gpu"], evaluator="torch")
    for out in (tmp_path / "new", store):  # a new store is not made; a store's cell is kept
        assert main(["run", str(real), "--out", str(out), "--quiet"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("placebench: error: ") and "Traceback" not in err
        assert (f"evaluator 'torch' cannot run cluster {tiny_files['cluster']}: device map: gpu:0: 'cuda:0' is not "
                "available on this machine (0 CUDA device(s) visible)" in err) if out != store else \
            "tables would mix them" in err  # the simulator's store: that refusal comes first
    assert not (tmp_path / "new").exists() and len(Store(store, create=False).cell_ids()) == 1
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a GPU here: the workload is the next error
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(SpecError, match=r"evaluator 'torch' runs zoo workloads and their variants; workload "
                                        r".*diamond.json \('diamond'\) has no model in the zoo"):
        runner.run(str(real), tmp_path / "new2")
    assert not (tmp_path / "new2").exists()


def test_a_real_evaluator_store_with_nothing_left_to_run_resumes_on_a_machine_that_cannot_run_it(
        tiny_files, write_spec, tmp_path, monkeypatch):
    """The plan check looks only at the cells that would run: a store whose cells are all stored (here error
    rows, made with the check switched off) reruns with nothing to do on a machine without the GPU; it was
    refused (exit 2) although no cell would run. With --retry-failed its cells would run: refused."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    real = write_spec("real", workloads=[str(tiny_files["diamond"])], clusters=[str(tiny_files["cluster"])],
                      placers=["single_gpu"], evaluator="torch")
    store = tmp_path / "store"
    with monkeypatch.context() as m:
        m.setattr(runner, "_check_runnable", lambda plan, cells: None)
        assert runner.run(str(real), store).ran == 1
    assert [r["status"] for r in Store(store, create=False).rows()] == ["error"]
    assert runner.run(str(real), store).ran == 0
    with pytest.raises(ClusterError, match=r"evaluator 'torch' cannot run cluster .*'cuda:0' is not available"):
        runner.run(str(real), store, retry_failed=True)
    assert len(Store(store, create=False).cell_ids()) == 1

def test_stored_measurement_fields_by_hand():
    """The row's spread, peak and traffic columns come from the measurement: five samples 1..5 s have
    quartiles 2 and 4 s (numpy's linear rule); the largest device peak is 9 bytes."""
    from suite.evaluator import Measurement

    m = Measurement(status="ok", step_time_s=3.0, samples_s=(5.0, 1.0, 4.0, 2.0, 3.0),
                    peak_memory_bytes={"a": 5, "b": 9}, bytes_transferred=1234)
    f = runner._measurement_fields(m)
    assert (f["step_time_s"], f["step_time_q25_s"], f["step_time_q75_s"]) == (3.0, 2.0, 4.0)
    assert (f["step_time_min_s"], f["step_time_max_s"], f["samples"]) == (1.0, 5.0, 5)
    assert (f["max_peak_memory_bytes"], json.loads(f["peak_memory_bytes"]), f["bytes_transferred"]) == (9, {"a": 5, "b": 9}, 1234)
    oom = runner._measurement_fields(Measurement(status="oom", step_time_s=3.0, samples_s=(3.0,),
                                                 peak_memory_bytes={"a": 5}, oom_devices=("a",), bytes_transferred=7))
    assert "step_time_s" not in oom and (oom["oom_devices"], oom["bytes_transferred"]) == ("a", 7)  # no number


def test_max_peak_is_unknown_when_a_used_device_has_no_known_peak(tiny_files, write_spec, monkeypatch):
    """A real backend leaves out a CPU whose peak this OS cannot measure: the row's largest peak is then
    unknown (None), not another device's peak passing for the step's largest. Here a backend that drops cpu:0's
    peak: a CPU placement's row had its GPU's 0 B as the max before; a device left idle does not count."""
    import dataclasses as dc

    make = runner.make_backend

    class NoCpuPeak:
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def measure(self, p):
            m = self.inner.measure(p)
            return dc.replace(m, peak_memory_bytes={k: v for k, v in m.peak_memory_bytes.items() if k != "cpu:0"})

        def measure_batch(self, ps):
            return [self.measure(p) for p in ps]

    monkeypatch.setattr(runner, "make_backend", lambda cell, g, c: NoCpuPeak(make(cell, g, c)))
    spec = write_spec(workloads=[str(tiny_files["diamond"])], clusters=[str(tiny_files["cluster"])],
                      placers=["single_cpu", "single_gpu"])
    cpu, gpu = (runner.run_cell(c) for c in runner.make_plan(runner.load_spec(str(spec))).cells)
    assert cpu["status"] == "ok" and json.loads(cpu["peak_memory_bytes"]) == {"gpu:0": 0}
    assert cpu["max_peak_memory_bytes"] is None
    assert gpu["status"] == "ok" and gpu["max_peak_memory_bytes"] == json.loads(gpu["peak_memory_bytes"])["gpu:0"] > 0

def test_long_learning_curves_are_thinned_evenly_keeping_both_ends():
    curve = [{"evaluations": i + 1, "best_score_s": 1.0 / (i + 1)} for i in range(1000)]
    thin = runner._thin_curve(curve)
    evals = [p["evaluations"] for p in thin]
    assert len(thin) == runner.MAX_CURVE_POINTS and evals[0] == 1 and evals[-1] == 1000
    assert all(3 <= b - a <= 5 for a, b in zip(evals, evals[1:], strict=False))  # about 999 / 255 apart
    assert runner._thin_curve(curve[:10]) == curve[:10]


def test_a_second_run_on_a_store_in_use_is_refused_before_it_writes(tiny_files, write_spec, tmp_path):
    from suite.store import StoreError

    spec = write_spec(workloads=[str(tiny_files["diamond"])], clusters=[str(tiny_files["cluster"])], placers=["single_cpu"])
    store = tmp_path / "store"
    with Store(store).writing():  # another run holds it
        with pytest.raises(StoreError, match="another run is writing to this store"):
            runner.run(str(spec), store)
        assert not Store(store, create=False).cell_ids() and not (store / "manifest.json").exists()
    assert runner.run(str(spec), store).ran == 1
