"""Paper tables (suite.paper): the data files load, bad files get errors naming the field, and the
comparison of a paper's figures with placebench's rows is right on a table computed by hand."""

from __future__ import annotations

import itertools
import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from suite import paper
from suite.cli import main
from suite.errors import UnknownNameError
from suite.paper import PaperError, kendall_tau_b


# -- Kendall's tau-b ---------------------------------------------------------------------------------------------
def test_kendall_tau_b_by_hand():
    assert kendall_tau_b([1, 2, 3], [10, 20, 30]) == 1.0
    assert kendall_tau_b([1, 2, 3], [3, 2, 1]) == -1.0
    assert kendall_tau_b([1, 2, 3], [1, 3, 2]) == pytest.approx(1 / 3)  # 2 concordant, 1 discordant
    # x ties on the first pair: 2 concordant, n1 = 1 tie in x, none in y: 2 / sqrt(3 * 2)
    assert kendall_tau_b([1, 1, 2], [1, 2, 3]) == pytest.approx(2 / math.sqrt(6))
    assert kendall_tau_b([1, math.inf], [5, math.inf]) == 1.0  # failures rank as infinitely slow
    assert math.isnan(kendall_tau_b([1, 1], [1, 2]))  # no order on one side


def _tau_reference(x, y):
    """tau-b from its definition with sign products: sum sgn(dx) sgn(dy) / sqrt(pairs not tied in x * in y)."""
    pairs = list(itertools.combinations(range(len(x)), 2))
    sgn = lambda v: (v > 0) - (v < 0)  # noqa: E731
    s = sum(sgn(x[i] - x[j]) * sgn(y[i] - y[j]) for i, j in pairs)
    nx = sum(x[i] != x[j] for i, j in pairs)
    ny = sum(y[i] != y[j] for i, j in pairs)
    return s / math.sqrt(nx * ny) if nx and ny else math.nan


@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 4)), min_size=2, max_size=9))
def test_kendall_tau_b_matches_its_definition(pairs):
    x, y = [a for a, _ in pairs], [b for _, b in pairs]
    got, want = kendall_tau_b(x, y), _tau_reference(x, y)
    assert (math.isnan(got) and math.isnan(want)) or got == pytest.approx(want)
    if not math.isnan(got):
        assert -1 <= got <= 1 and got == pytest.approx(kendall_tau_b(y, x))


# -- the data files ------------------------------------------------------------------------------------------
def test_built_in_papers_load_and_map_to_the_zoo_presets_and_placers():
    names = paper.paper_names()
    assert {"mirhoseini2017", "placeto2019", "hsdag2024"} <= set(names)
    for name in names:
        t = paper.load_paper(name)
        assert t.pairs and t.placers and t.url.startswith("https://")
        spec = paper.spec_for(t)
        assert set(spec.workloads) == {w for w, _ in t.pairs} and [p.name for p in spec.placers] == t.placers
    m = paper.load_paper("mirhoseini2017")
    assert len(m.pairs) == 6 and m.method("MinCut").placer == "mincut" and m.reference == "Single-GPU"
    with pytest.raises(UnknownNameError, match="unknown paper table 'nope'; built-in: .*mirhoseini2017"):
        paper.load_paper("nope")


GOOD = {
    "title": "T", "citation": "Someone et al., 2099", "url": "https://example.org/t", "table": "Table 9",
    "quantity": "seconds per step", "paper_setup": "one CPU, one GPU", "figures_from": "the PDF",
    "reference": "CPU", "headline": "GPU",
    "methods": {"CPU": {"placer": "single_cpu"}, "GPU": {"placer": "single_gpu"},
                "Oracle": {"note": "not in placebench"}},
    "rows": [
        {"label": "ResNet", "workload": "resnet50-b1-infer", "cluster": "xeon_h100",
         "paper": {"CPU": 2.0, "GPU": 1.0, "Oracle": 0.5}},
        {"label": "BERT", "workload": "bert_base-12x768-s128-b1-infer", "cluster": "xeon_h100",
         "paper": {"CPU": 4.0, "GPU": "OOM"}},
        {"label": "NASNet", "note": "not in the zoo", "paper": {"Oracle": 1.0}},
    ],
    "claims": [{"text": "GPU is faster", "source": "abstract", "method": "GPU", "over": "CPU"}],
    "seeds": [0, 1, 2],
}


def _with(path, value):
    """GOOD with the field at `path` (keys and list indices) set to `value` (or removed when value is ...)."""
    data = json.loads(json.dumps(GOOD))
    d = data
    for k in path[:-1]:
        d = d[k]
    if value is ...:
        del d[path[-1]]
    else:
        d[path[-1]] = value
    return data


@pytest.mark.parametrize(("path", "value", "message"), [
    (("colour",), "red", "unknown field(s) ['colour']"),
    (("title",), "", "field 'title' must be a non-empty string"),
    (("methods", "CPU", "placer"), "nope", "methods.'CPU': unknown placer 'nope'"),
    (("methods", "Oracle", "note"), ..., "methods.'Oracle': field 'note' must be a non-empty string"),
    (("rows", 0, "paper", "TPU"), 1.0, "rows[0]: paper figure for 'TPU', which is not a method"),
    (("rows", 0, "paper", "CPU"), float("nan"), "rows[0]: paper.'CPU': a paper's time must be a positive number"),
    (("rows", 0, "paper", "CPU"), -1.0, "a paper's time must be a positive number of seconds, got -1.0"),
    (("rows", 0, "paper", "CPU"), "slow", "'slow' is neither a time in seconds nor one of OOM"),
    (("rows", 0, "cluster"), ..., "rows[0]: give both 'workload' and 'cluster', or neither"),
    (("rows", 0, "workload"), "resnet51", "rows[0]: unknown workload 'resnet51'"),
    (("rows", 1, "label"), "ResNet", "rows[1]: label 'ResNet' is used by an earlier row"),
    (("rows", 2, "note"), ..., "rows[2]: field 'note' must be a non-empty string"),
    (("reference",), "TPU", "reference 'TPU' is not a method"),
    (("claims", 0, "over"), ..., "claims[0]: give both 'method' and 'over', or neither"),
    (("claims", 0, "over"), "Oracle", "claims[0]: over 'Oracle' is not a method with a placer"),
    (("seeds",), [0, 0], "seeds: seed 0 is listed twice"),
    (("seeds",), [2**32], "seeds must be a non-empty list of integers in [0, 2**32)"),
    (("methods", "Oracle", "placer"), "single_gpu", "placer 'single_gpu' already stands for method 'GPU'"),
    (("reference",), "Oracle", "reference 'Oracle' is not a method with a placer"),
    (("rows", 0, "workload"), ["resnet50-b1-infer"], "rows[0]: workload must be a name, got ['resnet50-b1-infer']"),
    (("claims", 0, "over"), [], "claims[0]: over must be a method or a non-empty list of methods"),
    (("claims", 0, "over"), ["CPU", "GPU"], "claims[0]: over must be a method or a non-empty list"),
])
def test_bad_paper_files_name_the_field(path, value, message):
    with pytest.raises(PaperError) as exc:
        paper.paper_from_dict(_with(path, value), id="t", source="t.toml")
    assert str(exc.value).startswith("t.toml: ") and message in str(exc.value)


def test_paper_figures_are_shown_with_the_digits_the_file_gives():
    """A string keeps the paper's trailing zeros; a number is shown in full (never cut to 6 digits by :g)."""
    data = _with(("rows", 0, "paper"), {"CPU": "1.30", "GPU": 2, "Oracle": 12345.678})
    data["rows"][1]["paper"] = {"CPU": "4.0e-3", "GPU": "OOM"}
    t = paper.paper_from_dict(data, id="t")
    comp = paper.Comparison.from_rows(t, [])
    assert [comp.theirs["ResNet"][m].text for m in ("CPU", "GPU", "Oracle")] == ["1.30", "2", "12345.678"]
    assert [comp.theirs["ResNet"][m].time_s for m in ("CPU", "GPU", "Oracle")] == [1.3, 2.0, 12345.678]
    assert [(s.text, s.time_s) for s in comp.theirs["BERT"].values()] == [("4.0e-3", 0.004), ("OOM", math.inf),
                                                                         ("-", None)]
    assert paper.long_table(comp).raw[0][5:7] == [1.3, "ok"]  # programs get the number
    for bad in ("1.3 s", " 1.30", "-1.0", "0.0", "nan", "1,30"):
        with pytest.raises(PaperError, match="paper.'CPU'"):
            paper.paper_from_dict(_with(("rows", 0, "paper", "CPU"), bad), id="t")


# -- the comparison, by hand -----------------------------------------------------------------------------------
def _rows(*cells):
    """Result rows: (workload, placer, [status or seconds per seed])."""
    out = []
    for workload, placer, seeds in cells:
        for seed, v in enumerate(seeds):
            ok = not isinstance(v, str)
            out.append({"workload": workload, "cluster": "xeon_h100", "placer": placer, "seed": seed,
                        "status": "ok" if ok else v, "step_time_s": v if ok else None,
                        "methodology": "placebench-methodology-v1"})
    return out


def _comparison():
    t = paper.paper_from_dict(GOOD, id="t")
    rows = _rows(("resnet50-b1-infer", "single_cpu", [3.0, 3.0, 3.0]),
                 ("resnet50-b1-infer", "single_gpu", [1.5, 1.5, "oom"]),
                 ("bert_base-12x768-s128-b1-infer", "single_cpu", [8.0, 8.0, 8.0]),
                 ("bert_base-12x768-s128-b1-infer", "single_gpu", ["oom", "oom", "oom"]))
    rows += [dict(r, seed=7, step_time_s=0.001) for r in rows[:1]]  # a seed the table does not ask for
    return t, paper.Comparison.from_rows(t, rows)


def test_comparison_by_hand():
    t, comp = _comparison()
    assert comp.ours["ResNet"]["GPU"].text == "1.500 s (2/3 ok)" and comp.ours["ResNet"]["CPU"].time_s == 3.0
    assert comp.ours["ResNet"]["Oracle"].text == paper.NO_COUNTERPART and comp.ours["NASNet"]["CPU"].time_s is None
    assert comp.ours["BERT"]["GPU"].text == "OOM" and comp.theirs["BERT"]["GPU"].status == "oom"
    assert comp.compared("ResNet") == ["CPU", "GPU"] and comp.compared("NASNet") == []  # like for like
    tables = {tb.title.split(":")[0].split(" (")[0]: tb for tb in paper.comparison_tables(comp)}
    speed = tables["Speedup over CPU"].rows
    assert speed[0] == ["ResNet", "1.00x / 1.00x", "2.00x / 2.00x", "4.00x / -"]
    assert speed[1] == ["BERT", "1.00x / 1.00x", "OOM / OOM", "- / -"]
    per_row = tables["Per row"]
    assert per_row.columns == ["row", "fastest (paper)", "fastest (placebench)", "Kendall tau-b", "methods ranked",
                               "status agrees", "GPU over the best other (paper)",
                               "GPU over the best other (placebench)"]
    # Oracle (0.5 s in the paper) has no counterpart: it is the paper's fastest (as the paper shows), followed by
    # the fastest of the methods compared; ours, the agreement and the margins are over those (like for like)
    assert per_row.rows[0] == ["ResNet", "Oracle (compared: GPU)", "GPU", "+1.00", "2", "2/2", "+100.0%", "+100.0%"]
    assert per_row.rows[1] == ["BERT", "CPU", "CPU", "+1.00", "2", "2/2", "-", "-"]
    assert per_row.rows[2] == ["NASNet", "Oracle", "-", "-", "0", "-", "-", "-"]  # the paper's only figure there
    assert paper.summary_line(comp) == ("the fastest method agrees in 2 of 2 rows; mean Kendall tau-b +1.00 over 2 "
                                        "rows; the status (ok or OOM) agrees for 4 of 4 (row, method) pairs.")
    # BERT: GPU fails, CPU does not: compared, not faster, no speedup
    assert paper.claim_figure(comp, t.claims[0]) == ("placebench: GPU is faster than CPU in 1 of 2 rows; its speedup "
                                                     "is +100.0% at most (ResNet: step time -50.0%)")
    csv_rows = paper.long_table(comp).raw
    # a failed method has no speedup (not 0.0, which a program would average in): its status says why
    assert ["BERT", "bert_base-12x768-s128-b1-infer", "xeon_h100", "GPU", "single_gpu", None, "oom", None, "oom",
            None, None, 3, 0] in csv_rows
    # the median of 1.5, 1.5 and an OOM seed is 1.5 s: the seed counts say that one seed failed ("(2/3 ok)")
    assert ["ResNet", "resnet50-b1-infer", "xeon_h100", "GPU", "single_gpu", 1.0, "ok", 1.5, "ok", 2.0, 2.0, 3,
            2] in csv_rows
    assert ["NASNet", None, None, "CPU", "single_cpu", None, None, None, None, None, None, None, None] in csv_rows
    md = paper.paper_markdown(comp)
    assert "**The paper's figures** are Someone et al., 2099, Table 9" in md and "Oracle: no counterpart" in md
    assert '- The paper: "GPU is faster" (abstract). placebench: GPU is faster than CPU in 1 of 2 rows' in md
    assert "**Notes on the rows:**\n\n- NASNet: not in the zoo\n" in md
    assert "the paper's fastest method is from all its figures, followed by the fastest of those compared" in md


def test_markdown_tables_escape_underscores_in_method_and_row_names():
    """A method named GPU_only_ or a row named _ResNet_ would render in italics on GitHub."""
    data = json.loads(json.dumps(GOOD).replace('"GPU"', '"GPU_only_"').replace('"ResNet"', '"_ResNet_"'))
    comp = paper.Comparison.from_rows(paper.paper_from_dict(data, id="t"), [])
    md = paper.paper_markdown(comp)
    assert "| row | CPU | GPU\\_only\\_ | Oracle |" in md and "| \\_ResNet\\_ | 2.0 | 1.0 | 0.5 |" in md
    assert "| GPU\\_only\\_ over the best other (paper) |" in md


def test_a_claim_whose_best_row_is_a_tie_says_plus_zero():
    """A tie is a speedup of +0.0% and a step time change of +0.0%, not "-0.0%"."""
    t = paper.paper_from_dict(GOOD, id="t")
    comp = paper.Comparison.from_rows(t, _rows(("resnet50-b1-infer", "single_cpu", [2.0, 2.0, 2.0]),
                                               ("resnet50-b1-infer", "single_gpu", [2.0, 2.0, 2.0])))
    assert paper.claim_figure(comp, t.claims[0]) == ("placebench: GPU is faster than CPU in 0 of 1 rows; its speedup "
                                                     "is +0.0% at most (ResNet: step time +0.0%)")


def test_huge_margins_and_claim_speedups_print_in_powers_of_ten():
    """A 1e300 s figure against 1 s is a margin of +1.00e+302%, not a percentage of 300 digits; below a million
    percent the usual +23.5% stays."""
    data = _with(("rows", 0, "paper", "CPU"), 1e300)
    t = paper.paper_from_dict(data, id="t")
    comp = paper.Comparison.from_rows(t, _rows(("resnet50-b1-infer", "single_cpu", [1e300] * 3),
                                               ("resnet50-b1-infer", "single_gpu", [1.0] * 3)))
    per_row = {tb.title: tb for tb in paper.comparison_tables(comp)}["Per row"]
    assert per_row.rows[0][-2:] == ["+1.00e+302%", "+1.00e+302%"]
    assert paper.claim_figure(comp, t.claims[0]) == ("placebench: GPU is faster than CPU in 1 of 1 rows; its speedup "
                                                     "is +1.00e+302% at most (ResNet: step time -100.0%)")
    assert [paper._pct(x) for x in (9999.9994, 9999.9995, 0.235, -0.5)] == ["+999999.9%", "+1.00e+06%", "+23.5%",
                                                                           "-50.0%"]


def test_a_margin_that_overflows_is_missing_not_infinite():
    """1e300 s against 1e-10 s is a ratio past the largest float: the margin is no figure (the missing mark,
    None in the raw table), not +inf%. A large finite one still prints in powers of ten."""
    data = _with(("rows", 0, "paper", "CPU"), 1e300)
    data["rows"][0]["paper"]["GPU"] = 1e-10
    t = paper.paper_from_dict(data, id="t")
    comp = paper.Comparison.from_rows(t, _rows(("resnet50-b1-infer", "single_cpu", [1e300] * 3),
                                               ("resnet50-b1-infer", "single_gpu", [1e-10] * 3)))
    assert paper._margin(comp.ours["ResNet"], "GPU", ["CPU", "GPU"]) is None
    per_row = {tb.title: tb for tb in paper.comparison_tables(comp)}["Per row"]
    assert per_row.rows[0][-2:] == [paper.MISSING, paper.MISSING] and per_row.raw[0][-2:] == [None, None]
    ours = comp.ours["ResNet"]  # the speedup and the claim's figure are no figure either, not inf
    assert paper._speedup(ours["GPU"], ours["CPU"]) is None
    assert paper._speedup_text(ours["GPU"], ours["CPU"]) == paper.UNDEFINED
    assert paper.claim_figure(comp, t.claims[0]) == "placebench: GPU is faster than CPU in 1 of 1 rows"


def test_a_claim_naming_no_method_says_why_it_has_no_figure():
    data = _with(("claims",), [*GOOD["claims"], {"text": "better than others", "source": "abstract"}])
    comp = paper.Comparison.from_rows(paper.paper_from_dict(data, id="t"), [])
    assert ('- The paper: "better than others" (abstract). placebench: no figure, since the claim names no method '
            "of this table to compare.\n") in paper.paper_markdown(comp)


def test_our_crash_does_not_agree_with_the_papers_oom():
    t = paper.paper_from_dict(GOOD, id="t")
    comp = paper.Comparison.from_rows(t, _rows(("bert_base-12x768-s128-b1-infer", "single_cpu", [8.0]),
                                               ("bert_base-12x768-s128-b1-infer", "single_gpu", ["error"])))
    assert comp.failures_agree("BERT") == (1, 2) and comp.ours["BERT"]["GPU"].text == "error [1 seed]"


def test_a_failure_of_ours_that_is_a_tie_of_statuses_neither_agrees_nor_disagrees_with_the_papers_oom():
    """Our GPU cell on BERT failed one seed each with OOM, error and invalid: it shows OOM (the tie-break), but
    that is not what it did most, so the paper's OOM is not compared with it (the pair was counted as agreeing).
    On ResNet, where the paper's GPU ran, the same tie is a failure and disagrees."""
    t = paper.paper_from_dict(GOOD, id="t")
    tie = ["oom", "error", "invalid"]
    comp = paper.Comparison.from_rows(t, _rows(("bert_base-12x768-s128-b1-infer", "single_cpu", [8.0] * 3),
                                               ("bert_base-12x768-s128-b1-infer", "single_gpu", tie),
                                               ("resnet50-b1-infer", "single_cpu", [3.0] * 3),
                                               ("resnet50-b1-infer", "single_gpu", tie)))
    assert comp.ours["BERT"]["GPU"].text == "OOM" and comp.ours["BERT"]["GPU"].tied
    assert comp.failures_agree("BERT") == (1, 1) and comp.failures_agree("ResNet") == (1, 2)
    per_row = {tb.title: tb for tb in paper.comparison_tables(comp)}["Per row"]
    assert [r[5] for r in per_row.rows[:2]] == ["1/2", "1/1"]
    assert paper.summary_line(comp).endswith("the status (ok or OOM) agrees for 2 of 3 (row, method) pairs.")
    # two seeds OOM and one error is no tie: it agrees with the paper's OOM
    comp = paper.Comparison.from_rows(t, _rows(("bert_base-12x768-s128-b1-infer", "single_cpu", [8.0] * 3),
                                               ("bert_base-12x768-s128-b1-infer", "single_gpu", ["oom", "error", "oom"])))
    assert not comp.ours["BERT"]["GPU"].tied and comp.failures_agree("BERT") == (2, 2)


def test_a_row_where_every_method_of_ours_fails_has_no_fastest_and_no_margin():
    """Fastest and margins are over finite times of the methods with a figure on both sides: all of ours
    failing is no winner (not a tie of failures), and a headline method the paper gives no figure for has no
    margin on either side."""
    data = _with(("rows", 0, "paper"), {"CPU": 2.0, "Oracle": 0.5})  # no paper figure for GPU, the headline
    t = paper.paper_from_dict(data, id="t")
    comp = paper.Comparison.from_rows(t, _rows(("resnet50-b1-infer", "single_cpu", [3.0, 3.0, 3.0]),
                                               ("resnet50-b1-infer", "single_gpu", [1.0, 1.0, 1.0]),
                                               ("bert_base-12x768-s128-b1-infer", "single_cpu", ["oom"] * 3),
                                               ("bert_base-12x768-s128-b1-infer", "single_gpu", ["error"] * 3)))
    per_row = {tb.title: tb for tb in paper.comparison_tables(comp)}["Per row"]
    # GPU: no paper figure; the paper's fastest is Oracle, with no counterpart
    assert per_row.rows[0] == ["ResNet", "Oracle (compared: CPU)", "CPU", "-", "1", "1/1", "-", "-"]
    assert per_row.rows[1] == ["BERT", "CPU", "-", "-", "2", "0/2", "-", "-"]  # ours all tie: no tau
    speed = {tb.title: tb for tb in paper.comparison_tables(comp)}["Speedup over CPU: from the paper's figures / placebench's"]
    assert speed.rows[1] == ["BERT", "1.00x / ref OOM", "OOM / ref OOM", "- / -"]  # the reference failed: said first
    # a claim leaves out a row where every method it names failed (BERT): nothing to compare there
    assert paper.claim_figure(comp, t.claims[0]) == ("placebench: GPU is faster than CPU in 1 of 1 rows; its speedup "
                                                     "is +200.0% at most (ResNet: step time -66.7%)")


def test_a_skipped_cell_of_ours_has_no_figure_it_is_not_ranked_as_a_failure():
    """As in the leaderboard: a placer that does not apply is left out of the ranks, the status agreement and
    the claims (it is not an infinitely slow failure), and its cells say "skipped"."""
    t = paper.paper_from_dict(GOOD, id="t")
    comp = paper.Comparison.from_rows(t, _rows(("resnet50-b1-infer", "single_cpu", [3.0, 3.0, 3.0]),
                                               ("resnet50-b1-infer", "single_gpu", ["skipped"] * 3),
                                               ("bert_base-12x768-s128-b1-infer", "single_cpu", ["skipped"] * 3),
                                               ("bert_base-12x768-s128-b1-infer", "single_gpu", [2.0, 2.0, 2.0])))
    assert comp.ours["ResNet"]["GPU"].text == "skipped" and comp.ours["ResNet"]["GPU"].time_s is None
    assert math.isnan(comp.tau("ResNet")[0]) and comp.tau("ResNet")[1] == 1  # was -1.00 over 2
    assert comp.failures_agree("ResNet") == (1, 1) and comp.failures_agree("BERT") == (0, 1)  # were (1, 2), (0, 2)
    assert paper.claim_figure(comp, t.claims[0]) == "placebench: no row where GPU and CPU can be compared"
    tables = {tb.title.split(":")[0].split(" (")[0]: tb for tb in paper.comparison_tables(comp)}
    speed = tables["Speedup over CPU"].rows
    assert speed[0][1:3] == ["1.00x / 1.00x", "2.00x / skipped"]
    assert speed[1][1:3] == ["1.00x / skipped", "OOM / ref skipped"]
    csv_rows = paper.long_table(comp).raw
    assert ["ResNet", "resnet50-b1-infer", "xeon_h100", "GPU", "single_gpu", 1.0, "ok", None, "skipped", 2.0, None,
            3, 0] in csv_rows


def test_zero_times_give_undefined_speedups_not_errors():
    t = paper.paper_from_dict(_with(("claims", 0, "over"), ["CPU"]), id="t")
    comp = paper.Comparison.from_rows(t, _rows(("resnet50-b1-infer", "single_cpu", [0.0, 0.0, 0.0]),
                                               ("resnet50-b1-infer", "single_gpu", [0.0, 0.0, 0.0])))
    speed = {tb.title.split(":")[0]: tb for tb in paper.comparison_tables(comp)}["Speedup over CPU"].rows[0]
    assert speed[1:3] == ["1.00x / n/a", "2.00x / n/a"]
    assert paper.claim_figure(comp, t.claims[0]) == "placebench: GPU is faster than CPU in 0 of 1 rows"
    assert paper._margin(comp.ours["ResNet"], "GPU", ["CPU", "GPU"]) is None


def test_rows_of_another_methodology_or_seed():
    t = paper.paper_from_dict(GOOD, id="t")
    rows = _rows(("resnet50-b1-infer", "single_cpu", [3.0]))
    other = [dict(rows[0], seed=9, methodology="mine")]  # not a seed of the table: ignored
    assert paper.rows_for(t, rows + other) == rows
    assert paper.Comparison.from_rows(t, rows + other).ours["ResNet"]["CPU"].text == "3.000 s [1 seed]"
    with pytest.raises(PaperError, match="resnet50-b1-infer / xeon_h100 / single_cpu / seed 0: made under "
                                         "methodology mine; .* asks for placebench-methodology-v1"):
        paper.Comparison.from_rows(t, [dict(rows[0], methodology="mine")])


def test_rows_of_another_placer_or_parameters_under_the_placers_name_are_refused():
    """A spec may label an entry with non-default parameters (or another placer) as the placer's own name; the
    table's columns are the placers with their defaults, which `placebench paper` runs."""
    t = paper.paper_from_dict(GOOD, id="t")
    rows = [dict(r, placer_name="single_cpu", params="{}") for r in _rows(("resnet50-b1-infer", "single_cpu", [3.0]))]
    assert paper.Comparison.from_rows(t, rows).ours["ResNet"]["CPU"].time_s == 3.0
    with pytest.raises(PaperError, match=r"resnet50-b1-infer / xeon_h100 / single_cpu / seed 0: made by single_cpu "
                                         r'with params \{"threads": 2\}, under the label \'single_cpu\''):
        paper.Comparison.from_rows(t, [dict(rows[0], params='{"threads":2}')])
    with pytest.raises(PaperError, match=r"made by single_gpu with params \{\}, under the label 'single_cpu'"):
        paper.Comparison.from_rows(t, [dict(rows[0], placer_name="single_gpu")])


def test_results_of_another_setup_are_named_in_the_report():
    t, comp = _comparison()
    assert (comp.seeds, comp.budgets, comp.setup_warning()) == ((0, 1, 2), [], None)
    budget = {"budget_evaluations": 1000, "budget_seconds": 300.0}  # the v1 methodology's
    rows = [dict(r, **budget) for r in _rows(("resnet50-b1-infer", "single_cpu", [3.0, 3.0, 3.0]))]
    # the table's GPU column has no row at all: said so, and its claim says why it has no figure
    comp = paper.Comparison.from_rows(t, rows)
    assert comp.not_run() == ["GPU"]
    assert comp.setup_warning() == "these results have no rows of GPU (not run into this store)"
    assert paper.claim_figure(comp, t.claims[0]) == ("placebench: no row where GPU and CPU can be compared (GPU: not "
                                                     "run into this store)")
    rows += [dict(r, **budget) for r in _rows(("resnet50-b1-infer", "single_gpu", [1.0, 1.0, 1.0]))]
    assert paper.Comparison.from_rows(t, rows).setup_warning() is None
    small = [dict(r, budget_evaluations=200, budget_seconds=60.0) for r in rows[::3]]
    comp = paper.Comparison.from_rows(t, small)
    assert comp.setup_warning() == ("these results have seeds 0 where the table asks for 0, 1, 2 and a search budget "
                                    "of 200 evaluations / 60 s where the v1 methodology gives 1000 evaluations / 300 s")
    md = paper.paper_markdown(comp)
    assert "the v1 methodology, a search budget per cell of 200 evaluations / 60 s and seeds 0 (those of the stored " \
           "rows), each" in md


def test_a_table_that_lists_its_seeds_out_of_order_gets_no_warning_for_them():
    """seeds = [2, 1, 0] asks for the same seeds as [0, 1, 2]: rows of all three are not "seeds 0, 1, 2 where
    the table asks for 2, 1, 0"."""
    t = paper.paper_from_dict(_with(("seeds",), [2, 1, 0]), id="t")
    budget = {"budget_evaluations": 1000, "budget_seconds": 300.0}
    rows = [dict(r, **budget) for r in _rows(("resnet50-b1-infer", "single_cpu", [3.0, 3.0, 3.0]),
                                             ("resnet50-b1-infer", "single_gpu", [1.0, 1.0, 1.0]))]
    assert paper.Comparison.from_rows(t, rows).setup_warning() is None
    assert paper.Comparison.from_rows(t, rows[:1] + rows[3:4]).setup_warning() == (
        "these results have seeds 0 where the table asks for 2, 1, 0")


def test_rows_that_leave_out_part_of_their_budget_are_named_not_a_crash():
    """A hand-made table may leave budget_seconds empty: the warning says '?' (it was a TypeError)."""
    t = paper.paper_from_dict(GOOD, id="t")
    rows = [dict(r, budget_evaluations=1000, budget_seconds=None)
            for r in _rows(("resnet50-b1-infer", "single_cpu", [3.0, 3.0, 3.0]),
                           ("resnet50-b1-infer", "single_gpu", [1.0, 1.0, 1.0]))]
    comp = paper.Comparison.from_rows(t, rows)
    assert comp.setup_warning() == ("these results have a search budget of 1000 evaluations / ? s where the v1 "
                                    "methodology gives 1000 evaluations / 300 s")
    assert "a search budget per cell of 1000 evaluations / ? s" in paper.paper_markdown(comp)

def test_the_report_names_the_evaluator_of_its_rows():
    """A store measured on real devices (--no-run) gives measurements, not the simulator's predictions: the
    report says which evaluator made its figures."""
    t = paper.paper_from_dict(GOOD, id="t")
    rows = _rows(("resnet50-b1-infer", "single_cpu", [3.0]), ("resnet50-b1-infer", "single_gpu", [1.0]))
    comp = paper.Comparison.from_rows(t, [dict(r, evaluator="torch") for r in rows])
    assert comp.evaluators == ["torch"]
    assert "each placer's final placement re-measured by the evaluator (torch). On the simulator" in \
        paper.paper_markdown(comp)
    assert "re-measured by the evaluator (unknown)." in paper.paper_markdown(paper.Comparison.from_rows(t, rows))

def test_the_report_says_how_many_op_times_a_profiled_evaluators_profiles_give():
    """As the leaderboard's footer: "simulator+profiles:<digest>" alone reads like a fully profiled result."""
    t = paper.paper_from_dict(GOOD, id="t")
    label = "simulator+profiles:0123456789ab"
    rows = [dict(r, evaluator=label) for r in _rows(("resnet50-b1-infer", "single_cpu", [3.0] * 3))]
    coverage = {label: {"workload": "resnet50-b1-infer", "clusters": {"xeon_h100": {
        "summary": "op times from profiles: 5 of 9 ops on cpu_0; 0 of 9 ops on gpu_0"}}}}
    md = paper.paper_markdown(paper.Comparison.from_rows(t, rows), profiles=coverage)
    assert (f"\n\nEvaluator {label} (resnet50-b1-infer on xeon\\_h100): op times from profiles: 5 of 9 ops on "
            "cpu\\_0; 0 of 9 ops on gpu\\_0\n\n") in md
    assert "is not recorded (a store made before" in paper.paper_markdown(paper.Comparison.from_rows(t, rows))


def test_without_figures_only_placebench_side_is_shown():
    data = _with(("rows",), [dict(r, paper={}) for r in GOOD["rows"]])
    t = paper.paper_from_dict(data, id="t")
    comp = paper.Comparison.from_rows(t, _rows(("resnet50-b1-infer", "single_cpu", [3.0]),
                                               ("resnet50-b1-infer", "single_gpu", [1.0])))
    titles = [tb.title for tb in paper.comparison_tables(comp)]
    assert not any("paper" in x for x in titles) and "placebench: speedup over CPU" in titles
    assert paper.summary_line(comp) == ("the paper's figures are not transcribed; fastest on placebench's side "
                                        "(rows; a tie counts for every method in it): GPU 1.")
    md = paper.paper_markdown(comp)
    assert "**The paper's figures are not transcribed:** the PDF" in md
    assert "with a figure on both sides) are placebench's, not the paper's.\n" in md  # no word on the paper's fastest


# -- the command ---------------------------------------------------------------------------------------------
MINE_TOML = """
title = "T"
citation = "Someone et al., 2099"
url = "https://example.org/t"
table = "Table 9"
quantity = "seconds per step"
paper_setup = "one CPU, one GPU"
figures_from = "the PDF"
reference = "CPU"
seeds = [0]

[methods.CPU]
placer = "single_cpu"
[methods.GPU]
placer = "single_gpu"
[methods.Oracle]
note = "not in placebench"

[[rows]]
label = "ResNet"
workload = "resnet50-b1-infer"
cluster = "xeon_h100"
paper = { CPU = 2.0, GPU = 1.0, Oracle = 0.5 }

[[rows]]
label = "BERT"
workload = "bert_base-12x768-s128-b1-infer"
cluster = "haswell_2k80"
paper = { CPU = 4.0, GPU = "OOM" }

[[rows]]
label = "NASNet"
note = "not in the zoo"
paper = { Oracle = 1.0 }
"""


def test_paper_command_runs_the_cells_then_reports(capsys, tmp_path):
    f = tmp_path / "mine.toml"
    f.write_text(MINE_TOML)
    store, out = tmp_path / "store", tmp_path / "papers"
    code = main(["paper", str(f), "--store", str(store), "--out", str(out), "--jobs", "1", "--quiet"])
    stdout, err = capsys.readouterr()
    assert code == 0, err
    assert "The paper's figures (Table 9" in stdout and "written: " in err
    md, csv = (out / "mine.md").read_text(), (out / "mine.csv").read_text()
    assert "# Someone et al., 2099: Table 9" in md and "| ResNet | 2.0 | 1.0 | 0.5 |" in md  # as the file writes them
    assert len(csv.splitlines()) == 1 + 3 * 3  # header + (3 rows x 3 methods)
    # two (workload, cluster) pairs out of a 2 x 2 product, two placers, one seed; NASNet needs no cell
    cells = [json.loads(p.read_text()) for p in (store / "cells").iterdir()]
    assert sorted((c["workload"], c["cluster"]) for c in cells) == [
        ("bert_base-12x768-s128-b1-infer", "haswell_2k80")] * 2 + [("resnet50-b1-infer", "xeon_h100")] * 2
    run_id = json.loads((store / "manifest.json").read_text())["runs"][-1]["run_id"]
    assert f"Run {run_id} (spec paper-mine, 4 cells" in md
    # the store's own results table reports as its store: the run that made it, and that it lags the cell files
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(store, copy)
    [cell, *_] = sorted((copy / "cells").glob("*.json"))
    (copy / "cells" / "extra.json").write_text(cell.read_text().replace(cell.stem, "extra"))
    code = main(["paper", str(f), "--store", str(copy / "results.csv"), "--no-run", "--out", str(tmp_path / "p2")])
    _, err = capsys.readouterr()
    lags = f"{copy / 'results.csv'} holds 4 rows but {copy} has 5 cell files"
    assert code == 0 and f"placebench: warning: {lags}" in err, err
    md2 = (tmp_path / "p2" / "mine.md").read_text()
    assert f"Run {run_id} (spec paper-mine, 4 cells" in md2 and f"**Warning: {lags}" in md2
    code = main(["paper", str(f), "--store", str(tmp_path / "none"), "--no-run", "--out", str(out)])
    _, err = capsys.readouterr()
    assert code == 2 and "--no-run: no results store at" in err
    # a store without any of the table's cells would only give a report of "not run" cells: refused, the
    # last report kept
    from suite.store import Store

    Store(tmp_path / "empty")
    code = main(["paper", str(f), "--store", str(tmp_path / "empty"), "--no-run", "--out", str(out)])
    _, err = capsys.readouterr()
    assert code == 2 and f"--no-run: {tmp_path / 'empty'} holds no result of mine's cells" in err
    assert (out / "mine.md").read_text() == md
    # a report that cannot be written after the cells ran leaves the old report whole
    f.write_text(f.read_text().replace('citation = "Someone et al., 2099"', 'citation = "Someone else, 2100"'))
    (out / "mine.csv").unlink()
    (out / "mine.csv").mkdir()
    code = main(["paper", str(f), "--store", str(store), "--out", str(out), "--quiet"])
    _, err = capsys.readouterr()
    assert code == 2 and err.startswith("placebench: error: ") and "Traceback" not in err
    assert (out / "mine.md").read_text() == md
    f.write_text(f.read_text().replace('placer = "single_cpu"', 'placer = "single_cpx"'))
    code = main(["paper", str(f), "--store", str(store), "--out", str(out)])
    _, err = capsys.readouterr()
    assert code == 2 and err.startswith(f"placebench: error: {f}: methods.'CPU': unknown placer 'single_cpx'")


def test_list_papers(capsys):
    assert main(["list", "papers", "--json"]) == 0
    listed = {p["name"]: p for p in json.loads(capsys.readouterr().out)}
    assert listed["hsdag2024"]["status"] == "ok" and "Duan et al., NeurIPS 2024" in listed["hsdag2024"]["description"]
