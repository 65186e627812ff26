"""The methodology files that ship with placebench load, and the fidelity variants change only the timing."""

import dataclasses
import re

import numpy as np
import pytest

from suite import methodology
from suite.errors import SpecError
from suite.methodology import Budget


def test_v1_is_the_default_and_has_the_documented_protocol():
    m = methodology.load()
    assert m.version == methodology.load("v1").version
    assert (m.timing.warmup_steps, m.timing.measured_steps, m.timing.statistic) == (3, 10, "median")


@pytest.mark.parametrize("name, measured", [("v1-fidelity-light", 3), ("v1-fidelity-large", 1)])
def test_fidelity_variants_differ_from_v1_only_in_timing(name, measured):
    v1, variant = methodology.load("v1"), methodology.load(name)
    assert (variant.timing.warmup_steps, variant.timing.measured_steps) == (1, measured)
    assert variant.version != v1.version
    same = {f.name for f in dataclasses.fields(v1)} - {"timing", "version"}
    assert {k: getattr(variant, k) for k in same} == {k: getattr(v1, k) for k in same}


def test_an_unknown_methodology_lists_the_built_in_ones_and_a_missing_file_is_named(tmp_path):
    with pytest.raises(SpecError, match=r"unknown methodology 'no-such-rules'; built-in: v1, v1-fidelity-large, "
                                        r"v1-fidelity-light \(or give a .toml file\)"):
        methodology.load("no-such-rules")
    with pytest.raises(SpecError, match="no-such-rules.toml: no such methodology file"):
        methodology.load(str(tmp_path / "no-such-rules.toml"))


def test_every_shipped_file_loads():
    for path in sorted(methodology.METHODOLOGY_DIR.glob("*.toml")):
        assert methodology.load(str(path)).version.startswith("placebench-methodology-")


V1 = (methodology.METHODOLOGY_DIR / "v1.toml").read_text()


@pytest.mark.parametrize(
    "text,message",
    [
        ('version = "x"\nbudget = 3\n', r"field 'budget' must be a table \(\[budget\]\), got 3"),
        ('version = "x"\nseeds = [0, 1]\n', r"field 'seeds' must be a table \(\[seeds\]\), got \[0, 1\]"),
        (V1.replace("max_evaluations =", "max_evaluation ="), r"\[budget\] has unknown key\(s\) \['max_evaluation'\]"),
        (V1 + "\n[scorring]\nfailure_multiple = 5.0\n", r"unknown section\(s\) or key\(s\) \['scorring'\]"),
        ('colour = "red"\n' + V1, r"unknown section\(s\) or key\(s\) \['colour'\]"),
        (V1.replace("synchronize = true", 'synchronize = "no"'), "timing.synchronize: expected true or false, got 'no'"),
        (V1.replace("synchronize = true", "synchronize = 0"), "timing.synchronize: expected true or false, got 0"),
        (V1.replace("max_seconds = 300.0", "max_seconds = 1" + "0" * 400), "budget.max_seconds: expected a finite number"),
        (V1.replace("max_evaluations = 1000", "max_evaluations = 1e3"), r"budget.max_evaluations: expected a whole number in \[1, 2\*\*63 - 1\], got 1000.0"),
        (V1.replace("max_seconds = 300.0", "max_seconds = true"), "budget.max_seconds: expected a finite number, got True"),
        (V1.replace("seeds = [0]", "seeds = [-1]"), r"seeds.seeds must be a non-empty list of integers in \[0, 2\*\*32\)"),
        (V1.replace("seeds = [0]", "seeds = 0"), r"seeds.seeds must be a non-empty list of integers"),
        (V1.replace('statistic = "median"', "statistic = 1"), "timing.statistic 1 is not 'median' or 'mean'"),
        (V1.replace('version = "placebench-methodology-v1"', "version = 1"), "field 'version' must be a non-empty string"),
        ("version = 'x'\na = 1" + "0" * 5000 + "\n", "not valid TOML: Exceeds the limit"),
        (V1.replace("seeds = [0]", "seeds = [1" + "0" * 400 + "]"), r"seeds.seeds must be a non-empty list of integers "
                                                                   r"in \[0, 2\*\*32\); entry 0 is an integer of about 401 digits$"),
        (V1.replace('version = "placebench-methodology-v1"', "version = 1" + "0" * 400),
         "field 'version' must be a non-empty string, got an integer of about 401 digits$"),
        (V1.replace("synchronize = true", "synchronize = 1" + "0" * 400),
         "timing.synchronize: expected true or false, got an integer of about 401 digits$"),
        (V1.replace("failure_multiple = 10.0", "failure_multiple = 1e308"),
         r"scoring.failure_multiple: 1e\+308 is above the maximum 1000000.0 \(accepted: a number in \[1, 1e\+06\]\)$"),
        (V1.replace("max_evaluations = 1000", "max_evaluations = 0"), r"budget.max_evaluations: 0 is below the minimum 1 \(accepted: a whole number in \[1, 2\*\*63 - 1\]\)$"),
        (V1.replace("seeds = [0]", "seeds = 5"), r"seeds.seeds must be a non-empty list of integers in \[0, 2\*\*32\), got 5$"),
        (V1.replace("cell_timeout_s = 900.0", "cell_timeout_s = 0"), r"timeout.cell_timeout_s: 0 is below the minimum 0.001 \(accepted: a number >= 0.001\)$"),
        (V1.replace("max_evaluations = 1000", "max_evaluations = 9223372036854775808"),
         r"budget.max_evaluations: 9223372036854775808 is above the largest allowed count, 2\*\*63 - 1 "
         r"\(accepted: a whole number in \[1, 2\*\*63 - 1\]\)$"),
    ],
    ids=["budget-scalar", "seeds-top-level", "key-typo", "section-typo", "unknown-key", "bool-string", "bool-int",
         "huge-float", "float-count", "bool-number", "negative-seed", "seeds-scalar", "statistic-number", "version-number",
         "5000-digits", "huge-seed", "huge-version", "huge-bool", "huge-failure-multiple", "no-evaluations",
         "seeds-number", "no-timeout", "count-above-int64"],
)
def test_methodology_file_errors(tmp_path, text, message):
    path = tmp_path / "m.toml"
    path.write_text(text)
    with pytest.raises(SpecError, match=message) as err:
        methodology.load(str(path))
    assert str(err.value).startswith(f"{path}: ")


def test_a_file_cannot_take_a_built_in_name_with_other_rules(tmp_path):
    """Rows name the methodology's version only: a file that says v1 must hold v1's rules."""
    path = tmp_path / "m.toml"
    path.write_text(V1)
    assert methodology.load(str(path)) == methodology.load("v1")  # a copy is v1
    path.write_text(V1.replace("max_evaluations = 1000", "max_evaluations = 5").replace("seeds = [0]", "seeds = [0, 1]"))
    with pytest.raises(SpecError, match=re.escape(
            f"{path}: version 'placebench-methodology-v1' is the built-in methodology 'v1', but its rules differ: "
            "budget.max_evaluations 5 (built-in 1000), seeds [0, 1] (built-in [0]); give the file its own version")):
        methodology.load(str(path))
    path.write_text(V1.replace("placebench-methodology-v1", "mine-v1").replace("max_evaluations = 1000",
                                                                                 "max_evaluations = 5"))
    assert methodology.load(str(path)).budget.max_evaluations == 5


def test_methodology_unreadable_files(tmp_path):
    (tmp_path / "latin1.toml").write_bytes(b'version = "caf\xe9"\n')
    with pytest.raises(SpecError, match=r"latin1.toml: not valid UTF-8 text \(byte 0xe9 at offset 14\)"):
        methodology.load(str(tmp_path / "latin1.toml"))
    (tmp_path / "dir.toml").mkdir()
    with pytest.raises(SpecError, match="dir.toml: cannot read the methodology file: Is a directory"):
        methodology.load(str(tmp_path / "dir.toml"))


@pytest.mark.parametrize(("kw", "message"), [
    ({"max_evaluations": "5"}, r"Budget.max_evaluations must be a whole number in \[0, 2\*\*63 - 1\], got '5'"),
    ({"max_evaluations": 2.5}, r"Budget.max_evaluations must be a whole number in \[0, 2\*\*63 - 1\], got 2.5"),
    ({"max_evaluations": True}, r"Budget.max_evaluations must be a whole number in \[0, 2\*\*63 - 1\], got True"),
    ({"max_evaluations": -1}, r"Budget.max_evaluations must be a whole number in \[0, 2\*\*63 - 1\], got -1"),
    ({"max_evaluations": 2**63}, r"Budget.max_evaluations must be a whole number in \[0, 2\*\*63 - 1\], got 9223372036854775808$"),
    ({"max_seconds": float("nan")}, r"Budget.max_seconds must be a number of seconds >= 0, got nan"),
    ({"max_seconds": "60"}, r"Budget.max_seconds must be a number of seconds >= 0, got '60'"),
    ({"max_seconds": -0.5}, r"Budget.max_seconds must be a number of seconds >= 0, got -0.5"),
])
def test_a_budget_made_in_code_is_checked_when_made(kw, message):
    """Budget("5", 60) failed only at a placer's first comparison, deep in a search."""
    with pytest.raises(SpecError, match=message):
        Budget(**kw)
    assert Budget(np.int64(3), np.float64(1.5)) == Budget(3, 1.5) and Budget(0, float("inf")).max_evaluations == 0


@pytest.mark.parametrize(("kw", "message"), [
    ({"measured_steps": 0}, r"Timing.measured_steps must be a whole number in \[1, 2\*\*63 - 1\], got 0"),
    ({"warmup_steps": -1}, r"Timing.warmup_steps must be a whole number in \[0, 2\*\*63 - 1\], got -1"),
    ({"warmup_steps": 1.5}, r"Timing.warmup_steps must be a whole number in \[0, 2\*\*63 - 1\], got 1.5"),
    ({"measured_steps": 2**63}, r"Timing.measured_steps must be a whole number in \[1, 2\*\*63 - 1\], got 9223372036854775808$"),
    ({"statistic": "min"}, r"Timing.statistic must be 'median' or 'mean', got 'min'"),
    ({"synchronize": "yes"}, r"Timing.synchronize must be true or false, got 'yes'"),
])
def test_timing_made_in_code_is_checked_when_made(kw, message):
    """Timing(measured_steps=0) gave a NaN step time (an error row) only when a real backend measured."""
    with pytest.raises(SpecError, match=message):
        methodology.Timing(**kw)
    assert methodology.Timing(warmup_steps=0, measured_steps=1).measured_steps == 1


@pytest.mark.parametrize(("kw", "message"), [
    ({"repetitions": 0}, r"Methodology.repetitions must be a whole number in \[1, 2\*\*63 - 1\], got 0"),
    ({"repetitions": -2}, r"Methodology.repetitions must be a whole number in \[1, 2\*\*63 - 1\], got -2"),
    ({"repetitions": 2.5}, r"Methodology.repetitions must be a whole number in \[1, 2\*\*63 - 1\], got 2.5"),
    ({"repetitions": float("nan")}, r"Methodology.repetitions must be a whole number in \[1, 2\*\*63 - 1\], got nan"),
    ({"repetitions": "3"}, r"Methodology.repetitions must be a whole number in \[1, 2\*\*63 - 1\], got '3'"),
    ({"repetitions": True}, r"Methodology.repetitions must be a whole number in \[1, 2\*\*63 - 1\], got True"),
    ({"repetitions": 2**63}, r"Methodology.repetitions must be a whole number in \[1, 2\*\*63 - 1\], got 9223372036854775808$"),
    ({"seeds": ()}, r"Methodology.seeds must be a non-empty list of integers in \[0, 2\*\*32\), got \[\]"),
    ({"seeds": (1, 1)}, r"Methodology.seeds: seed 1 is listed twice"),
    ({"seeds": (0, 2**32)}, r"Methodology.seeds must be a non-empty list of integers in \[0, 2\*\*32\); entry 1 is 4294967296$"),
    ({"seeds": (0.5,)}, r"Methodology.seeds must be a tuple of integer seeds, got \(0.5,\)"),
    ({"failure_multiple": 0.5}, r"Methodology.failure_multiple must be a number in \[1, 1e\+06\], got 0.5"),
    ({"failure_multiple": float("inf")}, r"Methodology.failure_multiple must be a number in \[1, 1e\+06\], got inf"),
    ({"cell_timeout_s": 0}, r"Methodology.cell_timeout_s must be a finite number of seconds > 0, got 0"),
    ({"version": ""}, r"Methodology.version must be a non-empty string, got ''"),
])
def test_a_methodology_made_in_code_is_checked_when_made(kw, message):
    """replace(methodology, repetitions=0) made in code failed only at the final re-measurement, with an
    IndexError (2.5 or NaN: a TypeError) that named nothing; each field is checked when made, by name."""
    with pytest.raises(SpecError, match=message):
        dataclasses.replace(methodology.load(), **kw)
    m = dataclasses.replace(methodology.load(), repetitions=np.int64(3), seeds=[np.int64(2), 5])
    assert (m.repetitions, type(m.repetitions), m.seeds) == (3, int, (2, 5))
    assert m.as_dict()["repetitions"] == 3 and m.as_dict()["seeds"] == [2, 5]


def test_a_bad_repetitions_methodology_never_reaches_the_re_measurement(tiny_graph, tiny_cluster):
    """The re-measurement of a final placement with repetitions=0 was an IndexError from inside
    `Evaluator.measure`; the methodology is refused where it is made, and the re-measurement's own argument
    is checked by name."""
    from suite.evaluator import Evaluator

    with pytest.raises(SpecError, match="Methodology.repetitions"):
        Evaluator(tiny_graph, tiny_cluster, Budget(), methodology=dataclasses.replace(methodology.load(), repetitions=0))
    with pytest.raises(ValueError, match=r"repetitions must be a positive integer, got nan"):
        Evaluator(tiny_graph, tiny_cluster, Budget()).measure([0, 0, 0, 0], repetitions=float("nan"))


def test_changed_fields_names_a_field_that_either_side_lacks():
    """A manifest written before a rule existed lacks its key: that is a difference, whichever side lacks it."""
    old = {"budget": {"max_evaluations": 5}, "seeds": [0], "timing": {"statistic": "median"}}
    new = {"budget": {"max_evaluations": 5, "max_seconds": 1.0}, "seeds": [1], "timing": {"statistic": "median"},
           "repetitions": 2}
    assert methodology.changed_fields(old, new) == ["budget.max_seconds", "repetitions", "seeds"]
    assert methodology.changed_fields(new, old) == ["budget.max_seconds", "repetitions", "seeds"]
    assert methodology.changed_fields(new, new) == []


def test_a_file_that_leaves_out_sections_gets_the_defaults_of_v1():
    """Every rule left out of a file takes its default, which is v1's value."""
    assert methodology.from_dict({"version": "mine"}).as_dict() == {
        "version": "mine", "budget": {"max_evaluations": 1000, "max_seconds": 300.0}, "seeds": [0], "repetitions": 1,
        "timing": {"warmup_steps": 3, "measured_steps": 10, "statistic": "median", "synchronize": True},
        "failure_multiple": 10.0, "cell_timeout_s": 900.0}
    v1 = methodology.load("v1").as_dict()
    assert {**v1, "version": "mine"} == methodology.from_dict({"version": "mine"}).as_dict()


def test_as_dict_writes_each_rule_under_its_own_name():
    """as_dict is what a store's manifest records; every rule has a different value here, so a value written
    under another rule's name shows."""
    data = {"version": "mine", "budget": {"max_evaluations": 7, "max_seconds": 8.5}, "seeds": {"seeds": [4, 2]},
            "remeasure": {"repetitions": 3}, "timing": {"warmup_steps": 5, "measured_steps": 6, "statistic": "mean",
                                                       "synchronize": False},
            "scoring": {"failure_multiple": 11.0}, "timeout": {"cell_timeout_s": 12.0}}
    assert methodology.from_dict(data).as_dict() == {
        "version": "mine", "budget": {"max_evaluations": 7, "max_seconds": 8.5}, "seeds": [4, 2], "repetitions": 3,
        "timing": {"warmup_steps": 5, "measured_steps": 6, "statistic": "mean", "synchronize": False},
        "failure_multiple": 11.0, "cell_timeout_s": 12.0}
