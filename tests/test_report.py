"""Reports from a tiny store built by hand: exact tables, numbers worked out in the comments."""

from __future__ import annotations

import csv
import io
import json
import math

import pytest

from suite import report
from suite.report import Cell, ReportError, format_seconds
from suite.textfile import human_bytes


def _row(w, p, status, t=None, seed=0, cluster="c1"):
    return {"cluster": cluster, "workload": w, "placer": p, "seed": seed, "status": status, "step_time_s": t,
            "methodology": "m-v1", "evaluator": "simulator"}


# w1: everyone ok. w2: a is OOM. w3: a has seeds 0.2 s, 0.4 s and a timeout (median 0.4 s, 2 of 3 ok);
# b errors; the reference is OOM. w4: every placer fails (a invalid, b error; no reference row).
# w5: only a, OOM although its row carries a (simulated) step time: a failure is a status, never a number.
ROWS = [
    _row("w1", "a", "ok", 1.0), _row("w1", "b", "ok", 2.0), _row("w1", "ref", "ok", 2.0),
    _row("w2", "a", "oom"), _row("w2", "b", "ok", 0.5), _row("w2", "ref", "ok", 1.0),
    _row("w3", "a", "ok", 0.2, seed=0), _row("w3", "a", "ok", 0.4, seed=1), _row("w3", "a", "timeout", seed=2),
    _row("w3", "b", "error"), _row("w3", "ref", "oom"),
    {**_row("w4", "a", "invalid"), "message": "colocation group 'g' is split:\n op x on d0"}, _row("w4", "b", "error"),
    _row("w5", "a", "oom", 0.1),
]

# Speedups over ref: w1 a 2/1 = 2, b 2/2 = 1; w2 b 1/0.5 = 2; w3 none (ref failed); w4, w5 none (no ref row:
# a failed placer still shows its status there).
# geomean: a over {w1} = 2.00; b over {w1, w2} = sqrt(1 * 2) = 1.41; ref = 1.00.
# Ranks (failures infinitely slow, ties averaged): w1 a 1, b/ref 2.5; w2 b 1, ref 2, a 3;
# w3 a 1, b/ref 2.5; w4 a/b 1.5; w5 a 1. Mean: a (1 + 3 + 1 + 1.5 + 1) / 5 = 1.50,
# b (2.5 + 1 + 2.5 + 1.5) / 4 = 1.875 -> 1.88, ref 7 / 3 = 2.33; ranked = those 5, 4 and 3 cells.
# best (the fastest *ok* time): a on w1 and w3, b on w2; nobody on w4 or w5, where every placer failed.
# runs/ok/OOM/failed count seeds; failed = invalid + timeout + error:
# a 7 runs, 3 ok, 2 OOM (w2, w5), 2 failed (w3 timeout, w4 invalid); b 4 runs, 2 ok, 2 failed (w3, w4 error).
EXPECTED_TEXT = """\
Step time on c1
workload                  a         b      ref
--------  -----------------  --------  -------
w1                  1.000 s   2.000 s  2.000 s
w2                      OOM  500.0 ms  1.000 s
w3        400.0 ms (2/3 ok)     error      OOM
w4                  invalid     error        -
w5                      OOM         -        -

Speedup over ref on c1
workload        a      b    ref
--------  -------  -----  -----
w1          2.00x  1.00x  1.00x
w2            OOM  2.00x  1.00x
w3        ref OOM  error    OOM
w4        invalid  error      -
w5            OOM      -      -

Summary on c1
placer  runs  ok  OOM  failed  skipped  geomean speedup vs ref  both ok  ranked  mean rank  best
------  ----  --  ---  ------  -------  ----------------------  -------  ------  ---------  ----
a          7   3    2       2        0                   2.00x        1       5       1.50     2
b          4   2    0       2        0                   1.41x        2       4       1.88     1
ref        3   2    1       0        0                   1.00x        2       3       2.33     0

Failed cells (invalid, timeout, error) and why
cluster  workload  placer  seed  status   message
-------  --------  ------  ----  -------  -----------------------------------------
c1       w3        a          2  timeout
c1       w3        b          0  error
c1       w4        a          0  invalid  colocation group 'g' is split: op x on d0
c1       w4        b          0  error
"""


def test_text_report_is_exact():
    assert report.render(ROWS, "text", "ref") == EXPECTED_TEXT


def test_row_order_does_not_matter():
    assert report.render(list(reversed(ROWS)), "text", "ref") == EXPECTED_TEXT


def test_placer_columns_are_in_family_order_then_plugins_by_name():
    """suite/placers.toml orders the built-in placers (single device, expert, ..., learned by year); a placer
    it does not list (a plugin) comes after them, by name; the summary is by mean rank whatever the columns."""
    names = ["zplugin", "hsdag", "seq2seq", "m_etf", "metis", "scotch", "human_expert", "single_gpu", "aplugin"]
    rows = [_row("w1", p, "ok", 1.0 + i) for i, p in enumerate(names)]
    text = report.render(rows, "text", "single_gpu")
    header = text.splitlines()[1].split()
    assert header == ["workload", "single_gpu", "human_expert", "scotch", "metis", "m_etf", "seq2seq", "hsdag",
                      "aplugin", "zplugin"]
    summary = text.split("Summary on c1\n")[1].splitlines()[2:2 + len(names)]
    assert [line.split()[0] for line in summary] == names  # by mean rank: the order of their times


def test_markdown_comparison_table():
    md = report.render(ROWS, "md", "ref")
    assert md.startswith("## c1\n\n**Step time on c1**\n\n| workload | a | b | ref |\n|:---|---:|---:|---:|\n")
    assert "| w3 | 400.0 ms (2/3 ok) | error | OOM |" in md
    assert "| b | 4 | 2 | 0 | 2 | 0 | 1.41x | 2 | 4 | 1.88 | 1 |" in md


def test_csv_is_the_long_table_with_numbers():
    rows = list(csv.DictReader(io.StringIO(report.render(ROWS, "csv", "ref"))))
    assert len(rows) == 12
    w3a = next(r for r in rows if r["workload"] == "w3" and r["placer"] == "a")
    assert w3a == {"cluster": "c1", "workload": "w3", "placer": "a", "seeds": "3", "ok_seeds": "2", "status": "ok",
                   "step_time_s": "0.4", "shown": "400.0 ms (2/3 ok)", "speedup_vs_ref": "",
                   "reference_status": "oom"}
    w1a = next(r for r in rows if r["workload"] == "w1" and r["placer"] == "a")
    assert (w1a["step_time_s"], w1a["speedup_vs_ref"], w1a["reference_status"]) == ("1.0", "2.0", "ok")
    w2a = next(r for r in rows if r["workload"] == "w2" and r["placer"] == "a")
    assert (w2a["status"], w2a["step_time_s"]) == ("oom", "")
    w5a = next(r for r in rows if r["workload"] == "w5" and r["placer"] == "a")  # its row had a time: no number
    assert (w5a["status"], w5a["step_time_s"], w5a["shown"]) == ("oom", "", "OOM")
    assert (w5a["speedup_vs_ref"], w5a["reference_status"]) == ("", "")  # no reference row there


def test_json_report_is_valid_json_when_a_speedup_overflows():
    # 1e300 s / 1e-10 s overflows to inf: written as null, not as Infinity (which jq and JavaScript refuse)
    rows = [{"cluster": "c", "workload": "w", "placer": "ref", "seed": 0, "status": "ok", "step_time_s": 1e300},
            {"cluster": "c", "workload": "w", "placer": "a", "seed": 0, "status": "ok", "step_time_s": 1e-10}]
    text = report.render(rows, "json", "ref")

    def refuse(name):
        raise ValueError(f"not JSON: {name}")

    data = json.loads(text, parse_constant=refuse)
    assert [c["speedup_vs_ref"] for c in data["cells"]] == [None, 1.0]  # a, ref
    assert data["cells"][0]["step_time_s"] == 1e-10


def test_json_report():
    data = json.loads(report.render(ROWS, "json", "ref"))
    assert data["reference"] == "ref" and data["methodologies"] == ["m-v1"]
    section, failures = data["sections"]
    summary = section["tables"][2]
    assert summary["rows"][1][:6] == ["b", 4, 2, 0, 2, 0] and summary["rows"][1][6] == pytest.approx(math.sqrt(2))
    assert failures["name"] == "failures" and len(data["failures"]) == 4
    speedups = {row[0]: row[1:] for row in section["tables"][1]["rows"]}  # placers a, b, ref
    assert speedups["w3"] == ["ref oom", "error", "oom"]  # the reference failed: said so, not a bare null
    assert speedups["w4"] == ["invalid", "error", None]  # no reference row: the failures are still results
    assert data["failures"][2] == {"cluster": "c1", "workload": "w4", "placer": "a", "seed": 0, "status": "invalid",
                                   "message": "colocation group 'g' is split: op x on d0"}


def test_latex_and_html_escape_and_mark_failures():
    rows = [_row("net_1", "p&q", "ok", 2.5e-5), _row("net_1", "x<y>", "oom")]
    tex = report.render(rows, "latex")
    assert r"net\_1 & 25.00 $\mu$s & OOM \\" in tex and r"p\&q" in tex and r"\begin{tabular}{lrr}" in tex
    assert tex.startswith("% placebench tables: the document needs \\usepackage{booktabs}")  # \toprule is booktabs'
    page = report.render(rows, "html")
    assert "<th>x&lt;y&gt;</th>" in page and '<td class="oom" style="text-align:right">OOM</td>' in page


@pytest.mark.parametrize(
    "seconds, text",
    [(1.234, "1.234 s"), (4.0, "4.000 s"), (0.4, "400.0 ms"), (0.01234, "12.34 ms"), (2.5e-5, "25.00 µs"),
     (1234.0, "1234 s"), (0.0, "0.000 µs"),
     # rounding to four digits may reach the next unit or decade: the rounded value decides
     (0.99996, "1.000 s"), (9.99996, "10.00 s"), (0.00099996, "1.000 ms"), (0.099996, "100.0 ms"),
     (9999.4, "9999 s"), (9999.6, "10000 s"), (12345.6, "12346 s"), (999999.4, "999999 s"),
     (999999.6, "1.000e+06 s"), (12345678.0, "1.235e+07 s"), (3.8e288, "3.800e+288 s")],
)
def test_format_seconds(seconds, text):
    assert format_seconds(seconds) == text


@pytest.mark.parametrize(
    "n, text",
    [(0, "0 bytes"), (1023, "1023 bytes"), (1024, "1.00 KiB"), (1536, "1.50 KiB"),
     # the unit follows the rounded value: just under 1 MiB or 1 GiB rounds up to it
     (2**20 - 6, "1.00 MiB"), (2**20 - 1, "1.00 MiB"), (2**20, "1.00 MiB"),
     (2**20 - 5300, "1018.82 KiB"), (2**30 - 1, "1.00 GiB"), (2**30 - 6 * 2**20, "1018.00 MiB"),
     (5 * 2**30, "5.00 GiB")],
)
def test_human_bytes(n, text):
    assert human_bytes(n) == text


def test_seed_aggregation():
    inf = math.inf
    assert Cell(("ok", "ok"), (1.0, 3.0)).value_s == 2.0
    assert Cell(("ok", "oom"), (1.0, inf)).status == "oom"  # half failed: the median is infinite
    three = Cell(("ok", "timeout", "error"), (1.0, inf, inf))
    assert (three.ok, three.status, three.text) == (False, "timeout", "timeout (1/3 ok)")  # tie: oom, invalid, timeout
    assert Cell(("oom", "oom"), (inf, inf)).text == "OOM"
    assert Cell(("oom", "ok", "oom"), (inf, 2.0, inf)).text == "OOM (1/3 ok)"  # a failed cell still shows its ok seeds
    assert Cell(("error", "ok", "ok"), (inf, 0.5, 0.7)).text == "700.0 ms (2/3 ok)"
    assert Cell(("timeout", "error", "error"), (inf, inf, inf)).status == "error"  # the most frequent failure
    # a tie between failures shows the first of FAILURE_ORDER: oom, invalid, timeout, error, skipped
    assert [Cell(pair, (inf, inf)).status for pair in (("invalid", "oom"), ("timeout", "invalid"),
                                                        ("error", "timeout"), ("skipped", "error"))] == [
        "oom", "invalid", "timeout", "error"]


def test_the_median_of_two_huge_ok_times_is_a_number():
    """Two ok seeds near the largest float: their sum overflows, their median does not (the cell is ok, not a
    failure with no failed seed, which had no status to show)."""
    cell = Cell(("ok", "ok"), (1e308, 1.5e308))
    assert (cell.value_s, cell.ok, cell.status) == (1.25e308, True, "ok")
    rows = [_row("w", "a", "ok", 1e308, seed=0), _row("w", "a", "ok", 1.5e308, seed=1)]
    assert "1.250e+308 s" in report.render(rows, "text")


def test_skipped_cells_are_not_ranked():
    rows = [_row("w", "a", "ok", 1.0), _row("w", "b", "skipped"), _row("w", "c", "error")]
    summary = report.tables(report.Results.from_rows(rows))[0][1][-1]
    # rows by mean rank, best first; a placer with no ranked cell last
    assert [(r[0], r[8], r[9]) for r in summary.raw] == [("a", 1, 1.0), ("c", 1, 2.0), ("b", 0, None)]
    assert [r[5] for r in summary.raw] == [0, 0, 1]  # b's skipped row


def test_several_clusters_get_an_overall_summary():
    rows = ROWS + [_row("w1", "a", "ok", 1.0, cluster="c2"), _row("w1", "ref", "ok", 3.0, cluster="c2")]
    sections = report.tables(report.Results.from_rows(rows), "ref")
    assert [name for name, _ in sections] == ["c1", "c2", "all clusters", "failures"]
    overall = sections[-2][1][0]
    a = next(r for r in overall.raw if r[0] == "a")
    assert a[6] == pytest.approx(math.sqrt(2 * 3)) and a[7] == 2  # speedups 2 (c1 w1) and 3 (c2 w1)


def test_default_reference_is_single_gpu_when_present():
    rows = [_row("w", "single_gpu", "ok", 2.0), _row("w", "x", "ok", 1.0)]
    assert "Speedup over single_gpu on c1" in report.render(rows, "text")
    assert "Speedup over" not in report.render([_row("w", "x", "ok", 1.0)], "text")


def test_report_errors():
    with pytest.raises(ReportError, match="reference placer 'nope' has no rows; placers: a, b, ref"):
        report.render(ROWS, "text", "nope")
    with pytest.raises(ReportError, match="no result rows"):
        report.render([], "md")
    with pytest.raises(ReportError, match="unknown format 'doc'"):
        report.render(ROWS, "doc")


def test_leaderboard_files_say_they_are_generated(tmp_path):
    md, csv_path = report.write_leaderboard(ROWS, tmp_path, "ref", source="runs/x")
    text = md.read_text()
    assert text.splitlines()[0] == f"<!-- {report.GENERATED_NOTE} (runs/x) -->"
    assert "# placebench leaderboard" in text and "| w2 | OOM | 500.0 ms | 1.000 s |" in text
    assert "commit" not in text  # no manifest given: no provenance line
    rows = list(csv.DictReader(io.StringIO(csv_path.read_text())))  # plain CSV: the header is the first line
    assert len(rows) == 12 and rows[0]["cluster"] == "c1"


def test_leaderboard_names_the_runs_that_made_it(tmp_path):
    run = {"run_id": "r1", "spec": "full", "cells_run": 9, "jobs": 2, "git": {"commit": "abcdef1234567890", "dirty": True},
           "packages": {"placebench": "0.1.0", "numba": "0.68.1"}, "machine": {"cpu": "EPYC", "cpus": 2, "python": "3.11.7"}}
    md, _ = report.write_leaderboard(ROWS, tmp_path, "ref", runs=[run])
    assert ("Run r1 (spec full, 9 cells, 2 worker(s)): commit abcdef123456 (uncommitted changes); placebench 0.1.0, "
            "numba 0.68.1; EPYC x2, Python 3.11.7.") in md.read_text()  # a run from before `simd` was recorded
    run["machine"]["simd"] = "AVX2"
    md, _ = report.write_leaderboard(ROWS, tmp_path, "ref", runs=[run])
    assert "numba 0.68.1; EPYC (AVX2) x2, Python 3.11.7." in md.read_text()
    run["numerics"] = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "AVX2",
                       "OPENBLAS_CORETYPE": "Haswell"}
    md, _ = report.write_leaderboard(ROWS, tmp_path, "ref", runs=[run])
    assert "numba 0.68.1; EPYC (AVX2, math pinned) x2, Python 3.11.7." in md.read_text()
    run["numerics"] = {**run["numerics"], "MKL_CBWR": "AUTO"}  # a library not pinned: the run is not said to be
    md, _ = report.write_leaderboard(ROWS, tmp_path, "ref", runs=[run])
    assert "numba 0.68.1; EPYC (AVX2) x2, Python 3.11.7." in md.read_text()
    # with run ids in the rows, only the runs that made them are named: not one whose cells were all rerun
    # since, nor one that found every cell stored
    rows = [{**r, "run_id": "r2" if i % 2 else "r3"} for i, r in enumerate(ROWS)]
    runs = [{**run, "run_id": rid, "cells_run": n} for rid, n in (("r1", 9), ("r2", 5), ("r3", 4), ("r4", 0))]
    text = report.write_leaderboard(rows, tmp_path, "ref", runs=runs)[0].read_text()
    assert [line.split(" (")[0] for line in text.splitlines() if line.startswith("Run ")] == ["Run r2", "Run r3"]


def test_bar_chart_is_a_png(tmp_path):
    path = report.bar_chart(ROWS, tmp_path / "chart.png", "ref")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"Description\x00" + report.GENERATED_NOTE.encode() in data  # says it is generated, as the md and csv do


def test_leaderboard_states_the_budget_and_the_simulator_caveat(tmp_path):
    caveat = "With the simulator evaluator a step time is a prediction from an analytic cost model"
    rows = [{**r, "budget_evaluations": 500, "budget_seconds": 3600.0} for r in ROWS]
    text = report.leaderboard_markdown(rows, "ref")
    assert ("Methodology: m-v1; evaluator: simulator; search budget per cell: 500 evaluations / 3600 s; "
            "seeds: 0, 1, 2. ") in text
    assert caveat in text
    assert "search budget per cell: unknown; seeds: 0, 1, 2." in report.leaderboard_markdown(ROWS, "ref")
    measured = report.leaderboard_markdown([{**r, "evaluator": "torch"} for r in rows], "ref")
    assert "evaluator: torch; search budget per cell: 500 evaluations / 3600 s;" in measured
    assert caveat not in measured  # a measured step time is not a prediction


def test_a_budget_part_that_rows_leave_out_is_unknown_not_a_traceback():
    """A hand-made table may leave budget_seconds (or budget_evaluations) empty on some rows: the leaderboard
    names those budgets with '?' (sorted after the known ones) instead of failing on None."""
    rows = [{**r, "budget_evaluations": 500, "budget_seconds": None if r["workload"] == "w1" else 3600.0} for r in ROWS]
    rows[-1] = {**rows[-1], "budget_evaluations": None}  # w5: seconds only
    assert report.budgets_of(rows) == [(500, 3600.0), (500, None), (None, 3600.0)]
    text = report.leaderboard_markdown(rows, "ref")
    assert ("search budget per cell: 500 evaluations / 3600 s; 500 evaluations / ? s; ? evaluations / 3600 s; "
            "seeds: 0, 1, 2. ") in text


def test_long_failure_messages_are_cut_to_the_table_width():
    """failures_table shows at most 100 characters: a longer message is cut to 97 and "..."; the raw row
    (CSV, JSON) keeps it whole."""
    rows = [{**_row("w", "a", "error"), "message": "x" * 100}, {**_row("w", "b", "error"), "message": "y" * 101}]
    table = report.failures_table(report.Results.from_rows(rows))
    assert [r[5] for r in table.rows] == ["x" * 100, "y" * 97 + "..."]
    assert [r[5] for r in table.raw] == ["x" * 100, "y" * 101]
    md = report.leaderboard_markdown(rows)
    assert "| c1 | w | b | 0 | error | " + "y" * 97 + "... |" in md and "y" * 98 not in md
    assert json.loads(report.render(rows, "json"))["failures"][1]["message"] == "y" * 101


def test_on_a_tie_the_usual_number_of_seeds_is_the_larger():
    """Two cells with 3 seeds and two with 1: the cluster's usual count is 3, so the 1-seed cells say so."""
    rows = [_row("w1", "a", "ok", 1.0, seed=s) for s in (0, 1, 2)] + [_row("w1", "b", "ok", 2.0)]
    rows += [_row("w2", "a", "ok", 1.0)] + [_row("w2", "b", "ok", 2.0, seed=s) for s in (0, 1, 2)]
    assert report.Results.from_rows(rows).seeds("c1") == 3
    assert report.render(rows, "text").startswith(
        "Step time on c1\n"
        "workload                 a                 b\n"
        "--------  ----------------  ----------------\n"
        "w1                 1.000 s  2.000 s [1 seed]\n"
        "w2        1.000 s [1 seed]           2.000 s\n\n")


def test_best_counts_only_the_fastest_time():
    """best = cells where the placer equals the fastest ok time: a and c tie at 1 s; b (1.2 s) is close
    but not the fastest; d (2 s) is not."""
    rows = [_row("w", "a", "ok", 1.0), _row("w", "b", "ok", 1.2), _row("w", "c", "ok", 1.0), _row("w", "d", "ok", 2.0)]
    summary = report.tables(report.Results.from_rows(rows))[0][1][-1]
    assert [(r[0], r[10]) for r in summary.raw] == [("a", 1), ("c", 1), ("b", 0), ("d", 0)]  # a, c tie: by name


def test_bar_chart_bars_are_speedups_and_failed_cells_are_labelled(monkeypatch):
    """Placers a, b, ref (bar width 0.8 / 3, offsets -w, 0, +w around each workload). w1: a 1 s, b 4 s,
    ref 2 s: bars 2, 0.5, 1. w2: a OOM (label "OOM"), b 0.5 s, ref 1 s: bars 2 (b), 1 (ref). w3: ref
    OOM: a (1 s) gets "ref OOM", ref itself "OOM", b has no row (nothing drawn)."""
    from matplotlib.axes import Axes

    bars, labels = [], []
    bar, text = Axes.bar, Axes.text

    def spy_bar(self, x, height, *args, **kwargs):
        bars.append((float(x), kwargs["bottom"] + float(height), kwargs.get("color")))  # drawn from 1x to here
        assert kwargs["bottom"] == 1.0
        return bar(self, x, height, *args, **kwargs)

    def spy_text(self, x, y, s, *args, **kwargs):
        labels.append((float(x), s, kwargs.get("color")))
        return text(self, x, y, s, *args, **kwargs)

    monkeypatch.setattr(Axes, "bar", spy_bar)
    monkeypatch.setattr(Axes, "text", spy_text)
    rows = [_row("w1", "a", "ok", 1.0), _row("w1", "b", "ok", 4.0), _row("w1", "ref", "ok", 2.0),
            _row("w2", "a", "oom"), _row("w2", "b", "ok", 0.5), _row("w2", "ref", "ok", 1.0),
            _row("w3", "a", "ok", 1.0), _row("w3", "ref", "oom")]
    limits = []
    set_ylim = Axes.set_ylim

    def spy_ylim(self, *args, **kwargs):
        if len(args) == 2 and not kwargs:  # the chart's own call, not matplotlib's internal ones
            limits.append(args)
        return set_ylim(self, *args, **kwargs)

    monkeypatch.setattr(Axes, "set_ylim", spy_ylim)
    assert report.chart_png(rows, "ref")[:8] == b"\x89PNG\r\n\x1a\n"
    assert limits == [(0.4, 2.5)]  # the widest bars 0.5x and 2x, with room: 0.5x, 1x and 2x labelled
    w = 0.8 / 3
    assert [x for x, _, _ in bars] == pytest.approx([-w, 0.0, 1.0, w, 1 + w])
    assert [h for _, h, _ in bars] == pytest.approx([2.0, 0.5, 2.0, 1.0, 1.0])
    assert [x for x, _, _ in labels] == pytest.approx([1 - w, 2 - w, 2 + w])
    assert [s for _, s, _ in labels] == ["OOM", "ref OOM", "OOM"]
    colour = {"a": bars[0][2], "b": bars[1][2], "ref": bars[3][2]}
    assert len({tuple(c) for c in colour.values()}) == 3
    assert [c for _, _, c in labels] == [colour["a"], colour["a"], colour["ref"]]  # in the placer's colour


def test_rows_a_report_cannot_use_are_errors_naming_them():
    """Rows read from a hand-made CSV or Parquet file: an unknown status or an ok row without a usable time."""
    with pytest.raises(ReportError, match=r'c1 / w / a / seed 0: status must be one of ok, oom, invalid, timeout, '
                                          r'error, skipped, got "crashed"'):
        report.render([_row("w", "a", "crashed")], "text")
    for t, message in ((None, "status ok needs a step_time_s"), ("", 'got ""'), (float("nan"), "got NaN"),
                       (-1.0, "got -1.0"), ("fast", 'got "fast"')):
        if t is not None:
            message = f"step_time_s must be null or a finite number >= 0, {message}"
        with pytest.raises(ReportError, match=rf"^c1 / w / a / seed 0: {message}$"):
            report.render([_row("w", "a", "ok", t)], "text")
    with pytest.raises(ReportError, match=r'^c1 / w /  / seed 0: placer must be a non-empty string, got ""$'):
        report.render([{**_row("w", "a", "ok", 1.0), "placer": ""}], "text")
    with pytest.raises(ReportError, match="seed 0.5: seed must be a 64-bit integer, got 0.5"):
        report.render([_row("w", "a", "ok", 1.0, seed=0.5)], "text")


def test_a_failed_cell_shows_its_status_where_the_reference_has_no_row(monkeypatch):
    """w has no reference row: a's OOM is still a result in the speedup table and on the chart (labelled at the
    foot of the axis, as where the reference failed), not '-' as if a had not run; b (ok) has no speedup."""
    from matplotlib.axes import Axes

    rows = [_row("v", "a", "ok", 1.0), _row("v", "b", "ok", 2.0), _row("v", "ref", "ok", 2.0),
            _row("w", "a", "oom"), _row("w", "b", "ok", 1.0)]
    res = report.Results.from_rows(rows)
    speedups = report.speedup_table(res, "c1", "ref")
    assert speedups.rows[1] == ["w", "OOM", "-", "-"] and speedups.raw[1] == ["w", "oom", None, None]
    labels = []
    text = Axes.text
    monkeypatch.setattr(Axes, "text", lambda self, x, y, s, *a, **k: labels.append(s) or text(self, x, y, s, *a, **k))
    report.chart_png(rows, "ref")
    assert labels == ["OOM"]


def test_a_zero_step_time_has_no_speedup():
    """A workload with no work on a cluster without per-op overhead takes 0 s: n/a, not a division by zero."""
    rows = [_row("w", "a", "ok", 0.0), _row("w", "ref", "ok", 0.0), _row("v", "a", "ok", 0.0),
            _row("v", "ref", "ok", 2.0), _row("u", "a", "ok", 1.0), _row("u", "ref", "ok", 2.0)]
    text = report.render(rows, "text", "ref")
    assert "u         2.00x  1.00x\nv           n/a  1.00x\nw           n/a    n/a" in text
    summary = report.tables(report.Results.from_rows(rows), "ref")[0][1][2]
    assert summary.raw[0][:1] + summary.raw[0][6:8] == ["a", 2.0, 1]  # geomean over u only
    assert report.render(rows, "csv", "ref").count(",0.0,") == 3
    speedups = report.speedup_table(report.Results.from_rows(rows), "c1", "ref")
    assert [r[1] for r in speedups.raw] == [2.0, "undefined", "undefined"]


def test_cells_with_an_unusual_number_of_seeds_say_so():
    rows = [_row(w, p, "ok", 1.0, seed=s) for w in ("w1", "w2") for p in ("a", "b") for s in (0, 1, 2)]
    rows += [_row("w1", "c", "ok", 2.0), _row("w2", "c", "oom")]
    text = report.render(rows, "text")
    assert "w1        1.000 s  1.000 s  2.000 s [1 seed]\nw2        1.000 s  1.000 s      OOM [1 seed]" in text
    assert "seed]" not in report.render(rows[:12], "text")


def test_markdown_and_latex_escape_what_they_would_interpret():
    rows = [_row("w", "a|b", "error"), {**_row("w", "c", "error"), "message": "<lambda> at *x* `y`"}]
    md = report.render(rows, "md")
    assert "| a\\|b |" in md and "\\<lambda\\> at \\*x\\* \\`y\\`" in md
    tex = report.render(rows, "latex")
    assert r"a\textbar{}b" in tex and r"\textless{}lambda\textgreater{}" in tex


def test_markdown_escapes_underscores_and_the_rest_in_names_titles_and_headings():
    """`_nmt_` and `a~b~` would render as italics and strikethrough on GitHub, `x|y` would split a cell: every
    name shows as written, in the cells, the column heads, the table titles and the cluster headings."""
    rows = [_row("_nmt_", "x|y", "ok", 1.0, cluster="dgx_a100"), _row("_nmt_", "ref_gpu", "ok", 2.0, cluster="dgx_a100"),
            _row("a~b~", "ref_gpu", "ok", 1.0, cluster="dgx_a100")]
    md = report.render(rows, "md", "ref_gpu")
    assert md.startswith("## dgx\\_a100\n\n**Step time on dgx\\_a100**\n\n| workload | ref\\_gpu | x\\|y |\n")
    assert "| \\_nmt\\_ | 2.000 s | 1.000 s |" in md and "| a\\~b\\~ | 1.000 s | - |" in md
    assert "**Speedup over ref\\_gpu on dgx\\_a100**" in md
    assert "_" not in md.replace("\\_", "") and "~" not in md.replace("\\~", "")


def test_a_cell_says_when_its_status_is_a_tie_break():
    assert Cell(("oom", "error", "invalid"), (math.inf,) * 3).status_tied
    assert Cell(("oom", "error", "ok"), (math.inf, math.inf, 1.0)).status_tied  # one each: the shown OOM is a tie-break
    assert not Cell(("oom", "error", "oom"), (math.inf,) * 3).status_tied
    assert not Cell(("ok", "error", "ok"), (1.0, math.inf, 1.0)).status_tied  # ok: no failure status shown
    assert not Cell(("oom",), (math.inf,)).status_tied


def test_the_summary_numbers_for_programs_are_the_ones_shown():
    """The summary's raw rows (JSON) carry what its text shows (see the comment above EXPECTED_TEXT): an OOM
    row counts under OOM, never under ok."""
    summary = report.tables(report.Results.from_rows(ROWS), "ref")[0][1][2]
    assert summary.raw == [["a", 7, 3, 2, 2, 0, pytest.approx(2.0), 1, 5, 1.5, 2],
                           ["b", 4, 2, 0, 2, 0, pytest.approx(math.sqrt(2)), 2, 4, 1.875, 1],
                           ["ref", 3, 2, 1, 0, 0, pytest.approx(1.0), 2, 3, pytest.approx(7 / 3), 0]]


def test_a_zero_second_reference_gives_no_speedup_to_a_slower_placer():
    """ref takes 0 s on w: a's speedup there is undefined (not 0x), and a's geomean is over u alone (2x)."""
    rows = [_row("w", "a", "ok", 1.0), _row("w", "ref", "ok", 0.0), _row("u", "a", "ok", 1.0), _row("u", "ref", "ok", 2.0)]
    res = report.Results.from_rows(rows)
    assert [r[1] for r in report.speedup_table(res, "c1", "ref").raw] == [2.0, "undefined"]
    summary = report.tables(res, "ref")[0][1][2]
    assert summary.raw[0][:1] + summary.raw[0][6:8] == ["a", 2.0, 1]


def test_a_placer_hundreds_of_times_slower_than_the_reference_is_not_shown_as_0x():
    """ref 1 s, a 250 s and 400 s: speedups of 0.004 and 0.0025, which two decimals showed as 0.00x; below
    0.005, two significant digits, in the speedup table and the summary's geomean (sqrt(0.004 * 0.0025))."""
    rows = [_row("w", "a", "ok", 250.0), _row("w", "ref", "ok", 1.0), _row("v", "a", "ok", 400.0), _row("v", "ref", "ok", 1.0)]
    text = report.render(rows, "text", "ref")
    assert "v         0.0025x  1.00x\nw         0.0040x  1.00x" in text
    assert "a          2   2    0       0        0                 0.0032x" in text
    assert [report.format_speedup(x) for x in (0.0042, 0.00499, 0.005, 0.0865, 1e-7, 2.0)] == [
        "0.0042x", "0.0050x", "0.01x", "0.09x", "1.0e-07x", "2.00x"]


def test_a_placer_millions_of_times_faster_than_the_reference_is_not_shown_as_a_300_digit_number():
    """ref 1e300 s, a 1 s: the speedup was printed with all its 301 digits and two decimals."""
    assert [report.format_speedup(x) for x in (999999.994, 999999.995, 1.234e8, 1e300)] == [
        "999999.99x", "1.00e+06x", "1.23e+08x", "1.00e+300x"]
    rows = [_row("w", "a", "ok", 1.0), _row("w", "ref", "ok", 1e300)]
    assert "1.00e+300x" in report.render(rows, "text", "ref") and len(report.render(rows, "text", "ref")) < 1000


# -- profile coverage in the footers ------------------------------------------------------------------------
PROFILED = "simulator+profiles:0123456789ab"
COVERAGE = {PROFILED: {"workload": "w_1", "files": ["w_1__cpu.json"], "clusters": {"c1": {
    "ops": 4, "profiled_ops": {"cpu:0": 1, "gpu:0": 0},
    "summary": "op times from profiles: 1 of 4 ops on cpu:0; 0 of 4 ops on gpu:0 (the others are roofline estimates)"}}}}


def test_a_profiled_evaluator_gets_its_coverage_in_the_footer_of_every_format():
    """The label alone (simulator+profiles:<digest>) read like a fully profiled result: the footer says how many
    op times the profiles gave each device, from the manifest's profiles section."""
    rows = [{**_row("w_1", "a", "ok", 1.0), "evaluator": PROFILED}]
    line = (f"Evaluator {PROFILED} (w_1 on c1): op times from profiles: 1 of 4 ops on cpu:0; 0 of 4 ops on gpu:0 "
            "(the others are roofline estimates)")
    assert report.render(rows, "text", profiles=COVERAGE).endswith(f"\n\n{line}\n")
    assert report.render(rows, "md", profiles=COVERAGE).endswith("\n\n" + line.replace("w_1", "w\\_1") + "\n")
    assert f"% {line}\n" in report.render(rows, "latex", profiles=COVERAGE)
    assert f"<p>{line}</p>" in report.render(rows, "html", profiles=COVERAGE)
    assert json.loads(report.render(rows, "json", profiles=COVERAGE))["profile_coverage"] == [line]
    assert line.replace("w_1", "w\\_1") in report.leaderboard_markdown(rows, profiles=COVERAGE)
    # a store made before the manifest had the section: the tables still render, and say it is not recorded
    old = report.render(rows, "text")
    assert old.endswith(f"\n\nEvaluator {PROFILED}: how many op times the profiles give is not recorded (a store "
                        "made before its manifest had a profiles section)\n")
    # no profiled evaluator: no footer, whatever the manifest holds
    assert report.render([_row("w_1", "a", "ok", 1.0)], "text", profiles=COVERAGE).endswith("1.00     1\n")


def test_table_and_leaderboard_read_the_coverage_from_the_stores_manifest(tiny_files, write_spec, tmp_path, capsys):
    from suite import runner
    from suite.cli import main
    from suite.store import Store

    prof = tmp_path / "diamond__cpu.json"
    prof.write_text(json.dumps({"format": "placebench.profile", "schema_version": 1, "workload": "diamond",
                                "applies_to": "cpu", "op_times_s": {"b": 0.5}}))
    spec = write_spec("prof", workloads=[str(tiny_files["diamond"])], clusters=[str(tiny_files["cluster"])],
                      placers=["single_cpu"], profiles=[prof.name])
    store = tmp_path / "store"
    runner.run(runner.load_spec(str(spec)), store)
    summary = "op times from profiles: 1 of 4 ops on cpu:0; 0 of 4 ops on gpu:0 (the others are roofline estimates)"
    assert main(["table", str(store)]) == 0
    assert capsys.readouterr().out.endswith(f" (diamond on tiny): {summary}\n")
    assert main(["table", str(store / "results.csv"), "-f", "md"]) == 0  # the store's own table: its manifest
    assert capsys.readouterr().out.endswith(f" (diamond on tiny): {summary}\n")
    assert main(["leaderboard", str(store), "--out", str(tmp_path / "lb"), "--no-chart"]) == 0
    assert f" (diamond on tiny): {summary}\n" in (tmp_path / "lb" / "leaderboard.md").read_text()
    manifest = Store(store).manifest()  # a store from before the profiles section
    del manifest["profiles"]
    Store(store).write_manifest(manifest)
    assert main(["table", str(store)]) == 0
    assert capsys.readouterr().out.endswith("is not recorded (a store made before its manifest had a profiles section)\n")
