"""`placebench compare`: the verdicts of two results cell by cell, by hand and as properties, and the CLI gate."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from suite import compare as cmp
from suite.cli import main
from suite.report import ReportError, md_escape


def row(placer="p", status="ok", t=1.0, *, seed=0, workload="w", memory=1000, samples=1, q25=None, q75=None, **kw):
    r = {"cluster": "c", "workload": workload, "placer": placer, "seed": seed, "evaluator": "simulator",
         "workload_hash": "wh", "cluster_hash": "ch", "params_hash": "ph", "methodology": "v1",
         "budget_evaluations": 10, "budget_seconds": 60.0, "status": status,
         "step_time_s": t if status == "ok" else None, "samples": samples, "step_time_q25_s": q25,
         "step_time_q75_s": q75, "max_peak_memory_bytes": memory}
    r.update(kw)
    return r


def verdicts(base, new, factor=1.05):
    (pair,) = cmp.compare([base], [new], factor)
    return pair.verdicts


# -- verdicts by hand -----------------------------------------------------------------------------------------
def test_the_factor_is_a_strict_bound_both_ways():
    assert verdicts(row(t=1.0), row(t=1.05)) == ("same",)  # exactly the factor: not beyond it
    assert verdicts(row(t=1.0), row(t=1.06)) == ("slower",)
    assert verdicts(row(t=1.05), row(t=1.0)) == ("same",)
    assert verdicts(row(t=1.06), row(t=1.0)) == ("faster",)
    assert verdicts(row(t=1.0), row(t=1.06), factor=1.1) == ("same",)
    (pair,) = cmp.compare([row(t=2.0)], [row(t=3.0)])
    assert pair.time_ratio == 1.5 and pair.memory_ratio == 1.0 and pair.regression()


def test_a_value_exactly_the_factor_times_the_other_is_the_same_despite_rounding():
    """1.1 x 1.05 is 1.1550000000000002 as a float, and 1.1 / that x 1.05 rounds below 1: still not beyond."""
    assert verdicts(row(t=1.1 * 1.05), row(t=1.1)) == ("same",)
    assert verdicts(row(t=1.1), row(t=1.1 * 1.05)) == ("same",)


@settings(max_examples=300, deadline=None)
@given(st.floats(1e-9, 1e6), st.integers(1, 10**10), st.integers(0, 128))
def test_exactly_the_factor_is_never_a_verdict(t, units, j):
    factor = 1 + j / 64  # with memory a multiple of 64 bytes, memory x factor is a whole number of bytes
    for base, new in ((t, t * factor), (t * factor, t)):
        assert verdicts(row(t=base), row(t=new), factor) == ("same",)
    memory = 64 * units
    for base, new in ((memory, int(memory * factor)), (int(memory * factor), memory)):
        assert verdicts(row(memory=base), row(memory=new), factor) == ("same",)


def test_repeated_samples_need_disjoint_interquartile_ranges():
    base = row(t=1.0, samples=5, q25=0.9, q75=1.2)
    assert verdicts(base, row(t=1.1, samples=5, q25=1.0, q75=1.3)) == ("same",)  # 10% slower, within the spread
    assert verdicts(base, row(t=1.3, samples=5, q25=1.25, q75=1.4)) == ("slower",)
    assert verdicts(base, row(t=0.8, samples=5, q25=0.7, q75=0.95)) == ("same",)
    assert verdicts(base, row(t=0.8, samples=5, q25=0.7, q75=0.85)) == ("faster",)
    assert verdicts(base, row(t=1.1, samples=1, q25=1.1, q75=1.1)) == ("slower",)  # one sample on a side
    assert verdicts(row(t=1.1, samples=1, q25=1.1, q75=1.1), base) == ("faster",)
    assert verdicts(base, row(t=1.1, samples=5)) == ("slower",)  # no quartiles: the medians decide


def test_memory_is_judged_beside_time():
    assert verdicts(row(memory=1000), row(memory=1100)) == ("more memory",)
    assert verdicts(row(t=2.0, memory=1000), row(t=1.0, memory=1100)) == ("faster", "more memory")
    assert verdicts(row(memory=1000), row(memory=900)) == ("less memory",)
    assert verdicts(row(memory=None), row(memory=5000)) == ("same",)
    pairs = cmp.compare([row(t=2.0, memory=1000)], [row(t=1.0, memory=1100)])
    assert pairs[0].regression()  # faster does not excuse more memory
    assert cmp.summary(pairs, 1.05) == ("1 cells in both, factor 1.05: 1 more memory, 1 faster (a cell with two "
                                        "verdicts counts for both); 1 regression")
    assert cmp.compare([row(memory=1000)], [row(memory=1100)], memory_factor=1.2)[0].verdicts == ("same",)
    assert cmp.compare([row(memory=1000)], [row(memory=1100)], factor=1.2)[0].verdicts == ("same",)  # the default
    assert cmp.compare([row(memory=1000)], [row(memory=1100)], factor=1.2, memory_factor=1.05)[0].verdicts == (
        "more memory",)
    assert cmp.compare([row(memory=1)], [row(memory=10**9)], memory_factor=float("inf"))[0].verdicts == ("same",)
    assert cmp.compare([row(memory=0)], [row(memory=10**9)], memory_factor=float("inf"))[0].verdicts == ("same",)
    # less memory by its own factor too: 1000 is more than 1.05 but not 1.2 times below 1100
    assert cmp.compare([row(memory=1100)], [row(memory=1000)], factor=1.2, memory_factor=1.05)[0].verdicts == (
        "less memory",)
    assert cmp.compare([row(memory=1100)], [row(memory=1000)], factor=1.05, memory_factor=1.2)[0].verdicts == ("same",)


def test_interquartile_ranges_that_touch_overlap():
    """Ranges that share an end point overlap: no verdict either way, however far the medians moved."""
    base = row(t=1.0, samples=5, q25=0.9, q75=1.2)
    assert verdicts(base, row(t=1.3, samples=5, q25=1.2, q75=1.4)) == ("same",)
    assert verdicts(base, row(t=0.8, samples=5, q25=0.7, q75=0.9)) == ("same",)


def test_less_memory_needs_the_factor_too():
    """A peak within the factor below the base is the same, as one within it above is (factor 1.05)."""
    assert verdicts(row(memory=1000), row(memory=960)) == ("same",)  # 0.96 x 1.05 > 1
    assert verdicts(row(memory=1000), row(memory=950)) == ("less memory",)  # 0.95 x 1.05 < 1
    assert verdicts(row(memory=1000), row(memory=1040)) == ("same",)


def test_status_changes():
    assert verdicts(row(), row(status="oom")) == ("broke",)
    assert verdicts(row(status="oom"), row()) == ("fixed",)
    assert verdicts(row(status="oom"), row(status="error")) == ("changed",)
    assert cmp.compare([row(status="oom")], [row(status="error")])[0].regression()  # another failure is one too
    assert verdicts(row(status="error"), row(status="error")) == ("same",)
    assert verdicts(row(status="skipped"), row(status="skipped")) == ("same",)
    assert verdicts(row(), row(status="skipped")) == ("broke",)
    (pair,) = cmp.compare([row(t=1.5, memory=1000)], [row(status="oom", memory=2000)])
    assert (pair.time_ratio, pair.memory_ratio) == (None, 2.0)  # a status change still shows its peaks' ratio
    # programs read a failed side as its status, an ok one as its step time (not the None of a failed row)
    assert cmp.table([pair]).raw == [["c", "w", "p", 0, 1.5, "oom", None, 2.0, "broke: ok -> oom", True]]


def test_zero_step_times():
    assert verdicts(row(t=0.0), row(t=0.0)) == ("same",)
    (pair,) = cmp.compare([row(t=0.0)], [row(t=1e-9)])
    assert pair.verdicts == ("slower",) and pair.time_ratio == float("inf")


def test_another_evaluator_or_budget_is_not_comparable():
    (pair,) = cmp.compare([row()], [row(evaluator="torch", budget_seconds=30.0)])
    assert pair.verdicts == ("not comparable",) and pair.why == "budget_seconds 60.0 -> 30.0; evaluator simulator -> torch"


def test_one_methodology_version_defined_two_ways_is_not_comparable():
    """An edited methodology file that kept its version: the stores' manifests tell the definitions apart."""
    v1 = {"version": "v1", "failure_multiple": 10.0, "seeds": [0]}
    (pair,) = cmp.compare([row()], [row()], methodologies=({"v1": v1}, {"v1": {**v1, "failure_multiple": 1.0}}))
    assert pair.verdicts == ("not comparable",) and pair.why == "methodology v1 defined differently (failure_multiple)"
    for known in (({"v1": v1}, {"v1": dict(v1)}), ({"v1": v1}, {}), ({}, {})):  # the same, or unknown on a side
        assert cmp.compare([row()], [row()], methodologies=known)[0].verdicts == ("same",)


def test_the_reasons_pairs_are_not_comparable_are_counted():
    pairs = cmp.compare([row(seed=s) for s in range(3)] + [row(placer="q")],
                        [row(seed=s, budget_evaluations=20) for s in range(3)] + [row(placer="q", evaluator="torch")])
    assert cmp.why_not_comparable(pairs) == ("budget_evaluations 10 -> 20 (3 cells); "
                                             "evaluator simulator -> torch (1 cell)")
    assert cmp.why_not_comparable(pairs, most=1) == "budget_evaluations 10 -> 20 (3 cells); and 1 other reason(s)"
    assert cmp.why_not_comparable(cmp.compare([row()], [row()])) == ""


def test_another_placer_under_the_same_label_is_not_comparable():
    """A label names a placer (a spec may label one itself): another placer with the same parameters (often
    none, so the same params_hash) under that label measured something else, as `run` refuses it in one store."""
    (pair,) = cmp.compare([row(placer="best", placer_name="hsdag")], [row(placer="best", placer_name="placeto", t=9.0)])
    assert pair.verdicts == ("not comparable",) and pair.why == "placer_name hsdag -> placeto"


def test_params_that_differ_only_by_an_int_for_a_float_say_so():
    """A store made before a whole number for a float parameter became that float keeps `{"k":1}` where a new
    run writes `{"k":1.0}`: with a label of the spec's own, a params change named by its params, not hashes;
    with the default labels (`p(k=1)`, `p(k=1.0)`), a missing and a new cell that say why they do not match."""
    old, now = '{"k":1,"on":true}', '{"k":1.0,"on":true}'
    (pair,) = cmp.compare([row("mine", placer_name="p", params=old, params_hash="a")],
                          [row("mine", placer_name="p", params=now, params_hash="b")])
    assert pair.verdicts == ("not comparable",) and pair.why == f"params {old} -> {now}: {cmp.WHOLE_FOR_FLOAT}"
    (pair,) = cmp.compare([row("mine", placer_name="p", params='{"k":1}', params_hash="a")],
                          [row("mine", placer_name="p", params='{"k":2.0}', params_hash="b")])
    assert pair.why == 'params {"k":1} -> {"k":2.0}'  # another number: a change like any other
    (pair,) = cmp.compare([row("mine", placer_name="p", params='{"on":1}', params_hash="a")],
                          [row("mine", placer_name="p", params='{"on":true}', params_hash="b")])
    assert pair.why == 'params {"on":1} -> {"on":true}'  # a boolean is not a number here
    base = [row("p(k=1)", seed=s, placer_name="p", params='{"k":1}') for s in (0, 1)] + [row("q", placer_name="q")]
    new = [row("p(k=1.0)", seed=s, placer_name="p", params='{"k":1.0}') for s in (0, 1)]
    new += [row("p(k=2.0)", placer_name="p", params='{"k":2.0}')]  # another setup: no reason to give
    pairs = cmp.compare(base, new)
    why = f"placer p(k=1) -> p(k=1.0): {cmp.WHOLE_FOR_FLOAT}"
    assert [(p.key[2], p.key[3], p.verdicts, p.why) for p in pairs] == [
        ("p(k=1)", 0, ("missing",), why), ("p(k=1)", 1, ("missing",), why), ("p(k=1.0)", 0, ("new",), why),
        ("p(k=1.0)", 1, ("new",), why), ("p(k=2.0)", 0, ("new",), ""), ("q", 0, ("missing",), "")]
    assert cmp.why_not_comparable(pairs) == f"{why} (2 cells)"  # the base's cells, each once


def test_the_cli_says_why_cells_relabelled_by_an_int_for_a_float_do_not_match(capsys, tmp_path):
    header = "cell_id,workload,cluster,placer,placer_name,params,seed,status,step_time_s\n"
    (tmp_path / "base.csv").write_text(header + 'a,w,c,p(k=1),p,"{""k"":1}",0,ok,1.0\n')
    (tmp_path / "new.csv").write_text(header + 'b,w,c,p(k=1.0),p,"{""k"":1.0}",0,ok,1.0\n')
    code, out, err = _run(capsys, "compare", str(tmp_path / "base.csv"), str(tmp_path / "new.csv"))
    assert code == 2 and out == ""
    assert err == (f"placebench: error: nothing to compare: no cell of {tmp_path / 'base.csv'} was measured the "
                   f"same way in {tmp_path / 'new.csv'} (1 missing, 1 new): placer p(k=1) -> p(k=1.0): "
                   f"{cmp.WHOLE_FOR_FLOAT} (1 cell)\n")


@pytest.mark.parametrize("field", ["workload_hash", "cluster_hash", "placer_name", "params_hash", "methodology",
                                   "budget_evaluations", "budget_seconds", "evaluator"])  # not SAME_SETUP: its own check
def test_a_pair_measured_another_way_is_not_comparable(field):
    other = {"budget_evaluations": 11, "budget_seconds": 301.0}.get(field, "other")  # the budget: numbers
    (pair,) = cmp.compare([row()], [row(**{field: other})])
    assert pair.verdicts == ("not comparable",) and pair.time_ratio is None and pair.why.startswith(field + " ")


def test_unlike_setups_are_not_compared_and_unmatched_cells_are_listed():
    (pair,) = cmp.compare([row(t=1.0)], [row(t=9.0, workload_hash="a" * 64, methodology="v2",
                                              cluster_hash="sha256:" + "b" * 64)])
    assert pair.verdicts == ("not comparable",) and pair.time_ratio is None
    assert pair.why == ("workload_hash wh -> aaaaaaaaaaaa; cluster_hash ch -> sha256:bbbbbbbbbbbb; "
                        "methodology v1 -> v2")  # hashes cut to 12 digits
    assert pair.regression() and not pair.regression(lenient=True)
    pairs = cmp.compare([row("a"), row("b")], [row("b"), row("c")])
    assert [(p.key[2], p.verdicts) for p in pairs] == [("a", ("missing",)), ("b", ("same",)), ("c", ("new",))]
    assert [p.regression() for p in pairs] == [True, False, False]
    assert [p.regression(lenient=True) for p in pairs] == [False, False, False]
    assert cmp.counts(pairs) == {"same": 1, "missing": 1, "new": 1} and cmp.comparable(pairs) == 1
    assert cmp.summary(pairs, 1.05) == "1 cells in both, factor 1.05: 1 same, 1 missing, 1 new; 1 regression"
    assert cmp.summary(pairs, 1.05, lenient=True).endswith("lenient: 1 same, 1 missing, 1 new; 0 regressions")
    data = cmp.as_json(pairs, 1.05)
    assert (data["regressions"], data["lenient"], [c["regression"] for c in data["cells"]]) == (1, False, [True, False, False])
    assert cmp.as_json(pairs, 1.05, lenient=True)["regressions"] == 0
    # as the table: only the cells that changed, unless all are asked for; the counts cover every cell
    changed = cmp.as_json(pairs, 1.05, show_all=False)
    assert [c["placer"] for c in changed["cells"]] == ["a", "c"] and changed["counts"] == data["counts"]


def test_json_is_valid_where_a_ratio_or_the_memory_factor_is_infinite():
    from suite.store import dumps

    pairs = cmp.compare([row(t=0.0, memory=0)], [row(t=2.0, memory=4096)])
    assert pairs[0].verdicts == ("slower", "more memory") and pairs[0].time_ratio == float("inf")

    def refuse(name):
        raise ValueError(f"not JSON: {name}")

    data = json.loads(dumps(cmp.as_json(pairs, 1.05, memory_factor=float("inf"))), parse_constant=refuse)
    assert data["memory_factor"] is None  # inf: memory not judged
    (cell,) = data["cells"]
    assert (cell["time_ratio"], cell["base_step_time_s"], cell["new_step_time_s"]) == (None, 0.0, 2.0)
    # the memory ratio over 0 bytes is null too, and the cell carries both peaks that say why
    assert (cell["memory_ratio"], cell["base_max_peak_memory_bytes"], cell["new_max_peak_memory_bytes"]) == (None, 0, 4096)


def test_the_table_lists_regressions_first_and_only_changes():
    pairs = cmp.compare([row("a"), row("b"), row("c", t=2.0), row("d")], [row("b"), row("c"), row("d", t=2.0)])
    t = cmp.table(pairs)
    assert [(r[2], r[-1]) for r in t.rows] == [("a", "yes"), ("d", "yes"), ("c", "")]  # b is the same: not shown
    assert [r[8] for r in t.rows] == ["missing", "slower", "faster"]
    assert [r[2] for r in cmp.table(pairs, show_all=True).rows] == ["a", "d", "b", "c"]
    assert [(r[2], r[-1]) for r in cmp.table(pairs, lenient=True).rows] == [("d", "yes"), ("a", ""), ("c", "")]


def test_a_cell_thousands_of_times_faster_is_not_shown_as_a_ratio_of_0():
    """10 s -> 2.5 ms is a time ratio of 0.00025, which three decimals showed as 0.000x; a peak of 0 bytes is 0."""
    (pair,) = cmp.compare([row(t=10.0, memory=4096)], [row(t=0.0025, memory=0)])
    (line,) = cmp.table([pair]).rows
    assert line[6:9] == ["0.00025x", "0.000x", "faster, less memory"]


def test_seeds_are_matched_one_by_one():
    base = [row(seed=0, t=1.0), row(seed=1, t=1.0)]
    new = [row(seed=0, t=1.0), row(seed=1, t=2.0)]
    assert [(p.key[3], p.verdicts) for p in cmp.compare(base, new)] == [(0, ("same",)), (1, ("slower",))]


def test_seeds_are_listed_in_numeric_order_and_failures_by_their_status():
    base = [row(seed=10, t=1.0), row(seed=2, t=1.0), row(seed=1, status="oom"), row(seed=3, status="timeout")]
    new = [row(seed=10, t=1.0), row(seed=2, t=1.0), row(seed=1, status="error"), row(seed=3, status="oom")]
    pairs = cmp.compare(base, new)
    assert [p.key[3] for p in pairs] == [1, 2, 3, 10]  # not "10" before "2"
    t = cmp.table(pairs, show_all=True)
    assert [r[3:6] + [r[8]] for r in t.rows] == [
        ["1", "OOM", "error", "changed: oom -> error"],  # an OOM is shown as OOM, as in every table
        ["3", "timeout", "OOM", "changed: timeout -> oom"],
        ["2", "1.000 s", "1.000 s", "same"],
        ["10", "1.000 s", "1.000 s", "same"],
    ]


def test_bad_input_is_refused():
    with pytest.raises(ReportError, match="^old.csv: c / w / p / seed 0 has several rows"):
        cmp.compare([row(), row(methodology="v2")], [row()], names=("old.csv", "new.csv"))
    for field, value, need in (("max_peak_memory_bytes", "lots", "a whole number"),
                               ("step_time_q25_s", float("nan"), "a finite number"),
                               ("max_peak_memory_bytes", -1, "a whole number")):
        with pytest.raises(ReportError, match=f"^new: c / w / p / seed 0: {field} must be null or {need} >= 0"):
            cmp.compare([row()], [row(**{field: value})])
    for value in ("many", 2.0, True, 0):  # a count of timed samples: a whole number, at least 1 for an ok row
        with pytest.raises(ReportError, match="^new: c / w / p / seed 0: samples must be null or a whole number at "
                                              "least 1 for status ok"):
            cmp.compare([row()], [row(samples=value)])
    with pytest.raises(ReportError, match="factor must be a finite number >= 1"):
        cmp.compare([row()], [row()], factor=0.9)
    with pytest.raises(ReportError, match="^base: .*status must be one of"):
        cmp.compare([row(status="fine")], [row()])
    with pytest.raises(ReportError, match="memory factor must be a number >= 1"):
        cmp.compare([row()], [row()], memory_factor=0.5)


# -- properties -----------------------------------------------------------------------------------------------
SWAPPED = {"slower": "faster", "faster": "slower", "more memory": "less memory", "less memory": "more memory",
           "broke": "fixed", "fixed": "broke", "missing": "new", "new": "missing"}

rows_strategy = st.lists(
    st.builds(
        row,
        placer=st.sampled_from("abc"),
        status=st.sampled_from(["ok", "ok", "oom", "error", "skipped"]),
        t=st.floats(0, 10),
        seed=st.integers(0, 2),
        memory=st.one_of(st.none(), st.integers(0, 10**6)),
    ),
    max_size=9,
    unique_by=lambda r: (r["placer"], r["seed"]),
)


@settings(max_examples=200, deadline=None)
@given(rows_strategy, rows_strategy, st.floats(1, 2))
def test_swapping_the_sides_swaps_the_verdicts(base, new, factor):
    forward, backward = cmp.compare(base, new, factor), cmp.compare(new, base, factor)
    assert [p.key for p in forward] == [p.key for p in backward]
    for f, b in zip(forward, backward, strict=True):
        assert b.verdicts == tuple(SWAPPED.get(v, v) for v in f.verdicts)
    assert all(cmp.compare(base, base, factor)[i].verdicts == ("same",) for i in range(len(base)))


# -- the command line -----------------------------------------------------------------------------------------
def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def two_stores(capsys, tiny_files, write_spec, harness_plugin, tmp_path, monkeypatch):
    """The same spec run twice, with one placer's behaviour changed between the runs: all on the GPU (fast on
    diamond, OOM on big), then all on the CPU."""
    spec = write_spec(workloads=[str(tiny_files["diamond"]), str(tiny_files["big"])],
                      clusters=[str(tiny_files["cluster"])], placers=["single_cpu", "harness_env_device"],
                      plugins=[harness_plugin])
    stores = []
    for device in ("gpu:0", "cpu:0"):
        monkeypatch.setenv("HARNESS_DEVICE", device)
        stores.append(tmp_path / f"store-{device[:3]}")
        assert _run(capsys, "run", str(spec), "--out", str(stores[-1]), "--jobs", "1", "--quiet")[0] == 0
    return stores


def test_compare_gates_a_changed_placer(capsys, two_stores, tmp_path):
    gpu, cpu = two_stores
    code, out, err = _run(capsys, "compare", str(gpu), str(cpu))
    assert code == 1, err
    lines = out.splitlines()
    assert lines[0] == f"Changes: {cpu} against {gpu}"
    assert "diamond" in lines[3] and "harness_env_device" in lines[3] and "slower" in lines[3]
    assert lines[3].endswith("yes")  # the regression comes first
    assert "big" in lines[4] and "fixed: oom -> ok" in lines[4] and not lines[4].endswith("yes")
    assert "single_cpu" not in out  # unchanged cells are not listed
    assert lines[-1] == "4 cells in both, factor 1.05: 1 slower, 1 fixed, 2 same; 1 regression"
    code, out, err = _run(capsys, "compare", str(cpu), str(gpu), "--json")
    data = json.loads(out)
    assert code == 1 and data["regressions"] == 1 and data["counts"] == {"broke": 1, "faster": 1, "same": 2}
    assert err == f"placebench: compare: {data['summary']}\n"
    broke = next(c for c in data["cells"] if c["verdicts"] == ["broke"])
    assert (broke["workload"], broke["base_status"], broke["new_status"]) == ("big", "ok", "oom")
    assert len(data["cells"]) == 2 and len(json.loads(_run(capsys, "compare", str(cpu), str(gpu), "--json", "--all")[1])["cells"]) == 4
    shutil.copy(cpu / "results.parquet", tmp_path / "cpu.parquet")
    code, out, _ = _run(capsys, "compare", str(cpu), str(tmp_path / "cpu.parquet"), "--all")  # a table file works too
    assert code == 0 and sum(ln.endswith(" same") for ln in out.splitlines()) == 4
    assert out.splitlines()[-1] == "4 cells in both, factor 1.05: 4 same; 0 regressions"
    code, out, _ = _run(capsys, "compare", str(gpu), str(cpu), "--factor", "20")  # all on the CPU is 10x slower
    assert code == 0 and out.splitlines()[-1] == "4 cells in both, factor 20: 1 fixed, 3 same; 0 regressions"
    copy = tmp_path / "copy"
    shutil.copytree(gpu, copy)
    assert _run(capsys, "compare", str(gpu), str(copy))[0] == 0


def test_missing_cells_fail_the_gate_unless_lenient(capsys, two_stores, tmp_path):
    gpu, cpu = two_stores
    lines = (cpu / "results.csv").read_text().splitlines()
    partial = tmp_path / "partial.csv"
    partial.write_text("\n".join(ln for ln in lines if "single_cpu" not in ln) + "\n")  # as a killed run leaves it
    code, out, _ = _run(capsys, "compare", str(cpu), str(partial))
    assert code == 1 and out.splitlines()[-1] == "2 cells in both, factor 1.05: 2 same, 2 missing; 2 regressions"
    code, out, _ = _run(capsys, "compare", str(cpu), str(partial), "--lenient")
    assert code == 0 and out.splitlines()[-1].endswith("lenient: 2 same, 2 missing; 0 regressions")
    header = tmp_path / "header.csv"
    header.write_text(lines[0] + "\n")
    code, _, err = _run(capsys, "compare", str(cpu), str(header), "--lenient")
    assert code == 2 and err == (f"placebench: error: nothing to compare: no cell of {cpu} was measured the same way "
                                 f"in {header} (4 missing)\n")


def test_stores_measured_another_way_say_how(capsys, two_stores, tmp_path):
    """Nothing comparable: the error names what differs. A methodology edited under the same version (which
    `run` refuses to mix into one store) is told apart by the stores' manifests."""
    gpu, cpu = two_stores
    other = tmp_path / "other"
    shutil.copytree(cpu, other)
    manifest = json.loads((other / "manifest.json").read_text())
    (version, meth), = manifest["methodologies"].items()
    manifest["methodologies"][version] = {**meth, "failure_multiple": meth["failure_multiple"] + 1}
    (other / "manifest.json").write_text(json.dumps(manifest))
    code, _, err = _run(capsys, "compare", str(cpu), str(other))
    assert code == 2 and err == (f"placebench: error: nothing to compare: no cell of {cpu} was measured the same way "
                                 f"in {other} (4 not comparable): methodology {version} defined differently "
                                 f"(failure_multiple) (4 cells)\n")
    code, _, err = _run(capsys, "compare", str(cpu / "results.csv"), str(other / "results.csv"))  # tables: the same
    assert code == 2 and "(failure_multiple) (4 cells)" in err


def test_compare_warns_when_the_stores_ran_on_cpus_with_other_vector_extensions(capsys, two_stores):
    """Only a warning (the verdicts are the same), and only where both stores recorded it; runs whose math
    was pinned (`suite.numerics`) on hosts with other extensions too, with a word that the pins should make
    them agree (not yet measured)."""
    gpu, cpu = two_stores
    pinned = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "AVX2",
              "OPENBLAS_CORETYPE": "Haswell"}

    def warning(base_simd, new_simd, base_numerics=None, new_numerics=None):
        for store, simd, env in ((gpu, base_simd, base_numerics), (cpu, new_simd, new_numerics)):
            manifest = json.loads((store / "manifest.json").read_text())
            for run in manifest["runs"]:
                run["machine"].pop("simd", None)
                run.pop("numerics", None)
                if simd is not None:
                    run["machine"]["simd"] = simd
                if env is not None:
                    run["numerics"] = env
            (store / "manifest.json").write_text(json.dumps(manifest))
        code, out, err = _run(capsys, "compare", str(gpu), str(cpu))
        assert code == 1 and out.splitlines()[-1].endswith("1 regression")
        return [ln for ln in err.splitlines() if "kernels" in ln]

    assert warning("AVX-512", "AVX2") == [
        "placebench: warning: BASE ran with AVX-512 CPUs and NEW with AVX2 CPUs: the learned placers' floats depend "
        "on the CPU kernels, so they may search differently on the same code and seed; compare stores made alike "
        "to gate code changes"]
    assert warning("AVX2", "AVX2") == []
    assert warning(None, "AVX2") == []  # a store from before `simd` was recorded
    assert warning("", "AVX2") == []  # unknown
    assert warning("AVX-512", "AVX2", pinned, pinned) == [
        "placebench: warning: BASE ran with AVX-512 CPUs, math pinned and NEW with AVX2 CPUs, math pinned: the "
        "learned placers' floats depend on the CPU kernels, so they may search differently on the same code and "
        "seed (the pins should make them agree; that is not yet measured); compare stores made alike to gate code "
        "changes"]
    assert warning("AVX2", "AVX2", pinned, pinned) == []
    assert warning("AVX2", "AVX2", pinned, {}) == [
        "placebench: warning: BASE ran with AVX2 CPUs, math pinned and NEW with AVX2 CPUs: the learned placers' "
        "floats depend on the CPU kernels, so they may search differently on the same code and seed; compare "
        "stores made alike to gate code changes"]
    assert warning("AVX2", "AVX2", pinned, {**pinned, "MKL_CBWR": "AUTO"}) != []  # the caller's own settings count
    assert warning("", "", pinned, {}) == []  # hosts unknown
    warning("AVX-512", "AVX2")
    code, _, err = _run(capsys, "compare", str(gpu / "results.csv"), str(cpu / "results.parquet"))  # table files
    assert code == 1 and "BASE ran with AVX-512 CPUs and NEW with AVX2 CPUs" in err
    manifest = json.loads((cpu / "manifest.json").read_text())  # a run whose cells were all rerun since: not used
    manifest["runs"].append({**manifest["runs"][0], "run_id": "older", "machine": {"simd": "AVX2"}})
    manifest["runs"][0]["machine"]["simd"] = "AVX-512"
    (cpu / "manifest.json").write_text(json.dumps(manifest))
    assert "kernels" not in _run(capsys, "compare", str(gpu), str(cpu))[2]
    manifest["runs"][0]["machine"]["simd"], manifest["runs"][1]["machine"]["simd"] = "AVX2", "AVX-512"
    (cpu / "manifest.json").write_text(json.dumps(manifest))
    assert "NEW with AVX2 CPUs" in _run(capsys, "compare", str(gpu), str(cpu))[2]


def test_compare_writes_a_file_and_refuses_bad_arguments(capsys, two_stores, tmp_path):
    gpu, cpu = two_stores
    out_file = tmp_path / "changes.md"
    code, out, err = _run(capsys, "compare", str(gpu), str(cpu), "-f", "md", "-o", str(out_file))
    assert code == 1 and out == "" and err.startswith("placebench: compare: ") and err.endswith("1 regression\n")
    text = out_file.read_text()
    title = md_escape(f"Changes: {cpu} against {gpu}")  # the paths' _ escaped, as every name in Markdown
    assert text.startswith(f"**{title}**") and "| diamond | harness\\_env\\_device | 0 |" in text
    shutil.copy(gpu / "results.csv", tmp_path / "gpu.csv")
    code, out, err = _run(capsys, "compare", str(gpu), str(tmp_path / "gpu.csv"), "-f", "csv")
    assert code == 0 and out == "cluster,workload,placer,seed,base,new,time,memory,verdict,regression\n"
    assert err.endswith("4 same; 0 regressions\n")  # the summary is on stderr when stdout has none
    code, _, err = _run(capsys, "compare", str(gpu), str(cpu), "-o", str(cpu / "changes.txt"))
    assert code == 2 and "inside the results store" in err and not (cpu / "changes.txt").exists()
    table = tmp_path / "cpu.csv"
    shutil.copy(cpu / "results.csv", table)
    code, _, err = _run(capsys, "compare", str(gpu), str(table), "-o", str(table))
    assert code == 2 and err == (f"placebench: error: --output {table} is the results file the report is made from: "
                                 f"write reports elsewhere\n") and table.read_bytes() == (cpu / "results.csv").read_bytes()
    code, _, err = _run(capsys, "compare", str(gpu), str(gpu))
    assert code == 2 and "the same results" in err
    code, _, err = _run(capsys, "compare", str(gpu / "results.csv"), str(gpu))  # a store's own table is the store
    assert code == 2 and err == f"placebench: error: BASE {gpu / 'results.csv'} and NEW {gpu} are the same results\n"
    code, _, err = _run(capsys, "compare", str(table), str(cpu))  # a copy of the table elsewhere is another source
    assert code == 0, err
    shutil.copy(table, cpu / "snapshot.csv")  # and so is a snapshot kept in the store's folder
    code, _, err = _run(capsys, "compare", str(cpu / "snapshot.csv"), str(cpu))
    assert code == 0, err
    code, _, err = _run(capsys, "compare", str(gpu), str(tmp_path / "nope"))
    assert code == 2 and "no such store directory" in err
    with pytest.raises(SystemExit) as exc:
        main(["compare", str(gpu), str(cpu), "--factor", "0.5"])
    assert exc.value.code == 2 and capsys.readouterr().err == (
        "placebench: error: argument --factor: '0.5' must be a finite number >= 1 (see placebench compare --help)\n")
    with pytest.raises(SystemExit) as exc:
        main(["compare", str(gpu), str(cpu), "--factor", "inf"])
    assert exc.value.code == 2 and "'inf' must be a finite number >= 1" in capsys.readouterr().err
    code, out, _ = _run(capsys, "compare", str(gpu), str(cpu), "--factor", "20", "--memory-factor", "inf")
    assert code == 0 and out.splitlines()[-1] == "4 cells in both, factor 20, memory factor inf: 1 fixed, 3 same; 0 regressions"


def test_a_csv_row_with_no_seed_is_bad_input_not_a_regression(capsys, tmp_path):
    """An empty seed used to stop the sort of the rows with a TypeError: exit 1, which a CI gate reads as a
    regression."""
    header = "cell_id,workload,cluster,placer,seed,status,step_time_s\n"
    (tmp_path / "base.csv").write_text(header + "a,w,c,p,0,ok,1.0\nb,w,c,p,1,ok,1.0\n")
    (tmp_path / "new.csv").write_text(header + "a,w,c,p,0,ok,1.0\nb,w,c,p,,ok,1.0\n")
    code, out, err = _run(capsys, "compare", str(tmp_path / "base.csv"), str(tmp_path / "new.csv"))
    assert code == 2 and out == ""
    assert err == f"placebench: error: {tmp_path / 'new.csv'}: c / w / p / seed None: seed must be a 64-bit integer, got null\n"


@pytest.mark.parametrize("cells, message", [
    # only an empty field is null: "nan" is a NaN (refused), "NA" not a number (refused), neither a silent null
    ("a,w,c,p,0,ok,nan,", "step_time_s must be null or a finite number >= 0, got NaN"),
    ("a,w,c,p,0,ok,1.0,nan", "step_time_q25_s must be null or a finite number >= 0, got NaN"),
    ("a,w,c,p,0,ok,NA,", 'line 2 (c / w / p / seed 0): step_time_s must be a number or empty, got "NA"'),
    ("a,w,c,p,0,ok,1.0,,0", "samples must be null or a whole number at least 1 for status ok (64-bit), got 0"),
    ("a,w,c,p,0,ok,1.0,,2.5", 'line 2 (c / w / p / seed 0): samples must be a 64-bit whole number or empty, got "2.5"'),
    ("a,w,c,p,0,oom,,,-1", "samples must be null or a whole number >= 0 (64-bit), got -1"),
])
def test_a_hand_made_csv_with_an_unusable_number_is_bad_input(cells, message, capsys, tmp_path):
    header = "cell_id,workload,cluster,placer,seed,status,step_time_s,step_time_q25_s,samples\n"
    (tmp_path / "base.csv").write_text(header + "a,w,c,p,0,ok,1.0,,1\n")
    (tmp_path / "new.csv").write_text(header + cells + ("" if cells.count(",") == 8 else ",") + "\n")
    code, out, err = _run(capsys, "compare", str(tmp_path / "base.csv"), str(tmp_path / "new.csv"))
    assert code == 2 and out == "" and message in err and str(tmp_path / "new.csv") in err, err


def test_the_exit_code_holds_when_the_reader_leaves(two_stores):
    gpu, cpu = two_stores
    proc = subprocess.Popen([sys.executable, "-m", "suite.cli", "compare", str(gpu), str(cpu)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # before it writes anything (it first imports and reads both stores)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err


@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_the_exit_code_holds_when_the_reader_of_both_streams_leaves(fmt, tmp_path):
    """`compare ... 2>&1 | head` under pipefail: json and csv put the summary on stderr after the output; a
    reader gone by then made it exit 0 (main's broken-pipe exit) with a regression. So did a warning."""
    from suite.store import Store

    header = "cell_id,workload,cluster,placer,seed,status,step_time_s\n"
    (tmp_path / "base.csv").write_text(header + "a,w,c,p,0,ok,1.0\n")
    (tmp_path / "new.csv").write_text(header + "a,w,c,p,0,ok,2.0\n")
    store = Store(tmp_path / "store")  # an incomplete store: a warning on stderr before anything else
    store.write_cell({"cell_id": "a", "workload": "w", "cluster": "c", "placer": "p", "seed": 0, "status": "ok",
                      "step_time_s": 2.0, "samples": 1})
    store.write_manifest({**store.manifest(), "runs": [{"run_id": "r", "spec": "s", "complete": False}]})
    for new in (tmp_path / "new.csv", tmp_path / "store"):
        proc = subprocess.Popen([sys.executable, "-m", "suite.cli", "compare", str(tmp_path / "base.csv"), str(new),
                                 "-f", fmt], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        proc.stdout.close()  # before it writes anything
        assert proc.wait(timeout=120) == 1, new


def test_compare_warns_when_the_stores_ran_with_other_cell_timeouts(capsys, two_stores):
    """A timeout is a run's (not part of a pair's setup): only a warning, and only where both stores recorded
    it."""
    gpu, cpu = two_stores

    def warning(base_timeouts, new_timeouts):
        for store, timeouts in ((gpu, base_timeouts), (cpu, new_timeouts)):
            manifest = json.loads((store / "manifest.json").read_text())
            run = manifest["runs"][0]
            manifest["runs"] = [{**run, "cell_timeout_s": t} for t in timeouts]
            if not timeouts:
                manifest["runs"] = [{k: v for k, v in run.items() if k != "cell_timeout_s"}]
            (store / "manifest.json").write_text(json.dumps(manifest))
        code, out, err = _run(capsys, "compare", str(gpu), str(cpu))
        assert code == 1 and out.splitlines()[-1].endswith("1 regression")  # the verdicts are the same
        return [ln for ln in err.splitlines() if "timeout" in ln]

    assert warning([60], [3600.0]) == [
        "placebench: warning: BASE ran with cell timeouts of 60 s and NEW with 3600 s: a cell that ends as "
        "timeout on one side may have finished on the other for that alone; compare stores run with one timeout "
        "to gate code changes"]
    assert warning([60], [60.0]) == []
    assert warning([], [3600]) == []  # a store that did not record it
    assert "BASE ran with cell timeouts of 60 s / 90 s and NEW with 60 s:" in warning([60, 90], [60])[0]


def to_markdown_of(pairs):
    from suite.report import to_markdown  # what `compare -f md` writes

    return to_markdown(cmp.table(pairs))


def test_the_markdown_table_escapes_underscores_in_names():
    """`compare -f md`: a placer named _x_ would be italics on GitHub, one named a|b would split its cell."""
    from suite.report import to_markdown  # what `compare -f md` writes

    pairs = cmp.compare([row("_x_", t=1.0), row("a|b", t=1.0)], [row("_x_", t=2.0), row("a|b", t=2.0)])
    md = to_markdown(cmp.table(pairs))
    assert "| c | w | \\_x\\_ | 0 | 1.000 s | 2.000 s | 2.000x |" in md and "| c | w | a\\|b | 0 |" in md


def test_a_ratio_of_millions_is_shown_in_powers_of_ten_not_with_every_digit():
    """A base of 1e-300 s and a new time of 1 s: the time ratio was printed with its 300 digits."""
    assert [cmp._ratio_text(x) for x in (999999.9994, 999999.9995, 1.2346e8, 1e300)] == [
        "999999.999x", "1.000e+06x", "1.235e+08x", "1.000e+300x"]
    md = to_markdown_of(cmp.compare([row(t=1e-300)], [row(t=1.0)]))
    assert "| 1.000e+300x |" in md and len(md) < 1000
