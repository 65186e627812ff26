"""The methodology files that ship with placebench load, and the fidelity variants change only the timing."""

import dataclasses

import pytest

from suite import methodology
from suite.errors import SpecError


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


def test_unknown_methodology_names_the_file():
    with pytest.raises(SpecError, match="no-such-rules.toml: no such methodology file"):
        methodology.load("no-such-rules")
