"""Profile mode of the cost model: which profile gives which device's time, and damaged profile files."""

from __future__ import annotations

import json
import pickle
from types import MappingProxyType

import pytest

from suite.costmodel import Profile, cost_matrix, load_profile, profiled_mask
from suite.errors import ProfileError
from suite.graph import Op, OpGraph


def _graph() -> OpGraph:
    # 1e9 FLOPs at 1 GFLOP/s (the uniform cluster): 1 s per op on every device before any profile
    return OpGraph.build("g", [Op("a", "x", flops=1e9), Op("b", "x", flops=1e9)], [("a", "b")])


def test_a_profile_without_hash_of_another_workload_is_refused(uniform_cluster):
    """Without a content hash the workload name is all that ties a profile to a graph: a profile of workload
    'other' whose op names happen to exist in graph 'g' must not give g its times."""
    with pytest.raises(ProfileError, match=r"profile for 'other' is not of workload 'g'"):
        cost_matrix(_graph(), uniform_cluster(2), [Profile("other", "gpu", {"a": 5.0})])
    cm = cost_matrix(_graph(), uniform_cluster(2), [Profile("g", "gpu", {"a": 5.0})])
    assert cm.tolist() == [[5.0, 5.0], [1.0, 1.0]]


def test_two_profiles_giving_one_device_a_time_for_the_same_op_are_refused(uniform_cluster):
    """A device-name profile for d0 and a kind profile for every gpu both time op a on d0: which one the
    simulator used depended on the order they were given in (the later silently won)."""
    both = [Profile("g", "d0", {"a": 5.0}), Profile("g", "gpu", {"a": 7.0})]
    for profs in (both, both[::-1]):
        with pytest.raises(ProfileError, match=r"op 'a' on device 'd0' has a time in two profiles "
                                               r"\((applies to 'd0' and to 'gpu'|applies to 'gpu' and to 'd0')\)"):
            cost_matrix(_graph(), uniform_cluster(2), profs)
    # different ops, or different devices, are no conflict
    cm = cost_matrix(_graph(), uniform_cluster(2), [Profile("g", "d0", {"a": 5.0}), Profile("g", "gpu", {"b": 7.0})])
    assert cm.tolist() == [[5.0, 1.0], [7.0, 7.0]]
    cm = cost_matrix(_graph(), uniform_cluster(2), [Profile("g", "d0", {"a": 5.0}), Profile("g", "d1", {"a": 7.0})])
    assert cm.tolist() == [[5.0, 7.0], [1.0, 1.0]]
    # one profile given twice (a file and its copy, `--profile p.json --profile ./p.json`) is no conflict
    twice = [Profile("g", "gpu", {"a": 5.0}, source="p.json"), Profile("g", "gpu", {"a": 5.0}, source="./p.json")]
    assert cost_matrix(_graph(), uniform_cluster(2), twice).tolist() == [[5.0, 5.0], [1.0, 1.0]]


def test_a_profile_made_in_code_with_an_empty_applies_to_matches_no_device(uniform_cluster):
    """The uniform cluster's devices have no model (""): an empty applies_to matched every one of them."""
    assert not Profile("g", "", {"a": 5.0}).matches(uniform_cluster(2).devices[0])
    with pytest.raises(ProfileError, match=r"applies to '', which is no device name, kind or model"):
        cost_matrix(_graph(), uniform_cluster(2), [Profile("g", "", {"a": 5.0})])


@pytest.mark.parametrize("metadata, where", [
    ({"calibration": {"method": "none", "unattributed_s": float("nan")}}, r"metadata\.calibration\.unattributed_s = nan"),
    ({"calibration": {"method": "none", "measured_step_samples_s": [1e-3, float("inf")]}},
     r"metadata\.calibration\.measured_step_samples_s\[1\] = inf"),
    ({"threads": float("-inf")}, r"metadata\.threads = -inf"),
])
def test_a_profile_with_a_non_finite_number_in_its_metadata_is_refused_when_read(tmp_path, metadata, where):
    """NaN and Infinity are not JSON (Profile.save refuses to write them) and a fidelity report cannot hold
    them: such a profile was read without complaint and failed only when the report was written, after every
    placement had been measured."""
    path = tmp_path / "g__cpu.json"
    path.write_text(json.dumps({"format": "placebench.profile", "schema_version": 1, "workload": "g",
                                "applies_to": "cpu", "op_times_s": {"a": 1e-3}, "metadata": metadata}))
    with pytest.raises(ProfileError, match=rf"^{path}: {where} is not a finite number"):
        load_profile(path)


def test_profiled_inputs_are_built_once_and_cannot_go_stale(uniform_cluster):
    """Profiled simulations reuse their cost matrix (it was rebuilt on every call: 7.3 ms against 0.17 ms per
    `simulate` of nmt-2x1024-b64), so a profile is read-only: changing the dict it was made from changes
    nothing, and an equal profile made anew finds the same inputs."""
    from suite.simulator import inputs_for, simulate

    g, c = _graph(), uniform_cluster(2)
    times = {"a": 5.0}
    prof = Profile("g", "gpu", times)
    first = inputs_for(g, c, [prof])
    assert inputs_for(g, c, [prof]) is first and inputs_for(g, c, [Profile("g", "gpu", {"a": 5.0})]) is first
    times["a"] = 1.0
    assert prof.op_times_s == {"a": 5.0} and simulate(g, c, [0, 0], profiles=[prof]).step_time_s == 6.0
    with pytest.raises(TypeError):
        prof.op_times_s["a"] = 1.0  # type: ignore[index]
    assert inputs_for(g, c, [Profile("g", "gpu", {"a": 2.0})]).cost[0, 0] == 2.0  # another profile, other inputs
    assert hash(prof) == hash(Profile("g", "gpu", {"a": 5.0}))
    copy = pickle.loads(pickle.dumps(prof))  # for worker processes
    assert copy == prof and isinstance(copy.op_times_s, MappingProxyType)


@pytest.mark.parametrize("version", [1.0, True, "1"])
def test_a_profile_schema_version_must_be_the_integer_1(tmp_path, version):
    path = tmp_path / "g__cpu.json"  # as graph, cluster and placement files: 1.0 is not taken for 1
    path.write_text(json.dumps({"format": "placebench.profile", "schema_version": version, "workload": "g",
                                "applies_to": "cpu", "op_times_s": {"a": 1e-3}}))
    with pytest.raises(ProfileError, match=rf"^{path}: schema_version {version!r} is not supported"):
        load_profile(path)


def test_load_matching_refuses_a_profile_without_hash_of_another_workload(tmp_path):
    """As the cost model does: without a content hash, the workload name must be the graph's."""
    from suite.profiling import load_matching

    path = tmp_path / "other.json"
    Profile("other", "cpu", {"a": 1.0}).save(path)
    with pytest.raises(ProfileError, match=r"other.json: profile for 'other' is not of workload 'g'"):
        load_matching([path], _graph())
    Profile("g", "cpu", {"a": 1.0}).save(path)
    assert [p.op_times_s["a"] for p in load_matching([path], _graph())] == [1.0]


def test_profiled_mask_says_which_times_are_measured_and_the_rest_stay_estimated(uniform_cluster):
    # a profile of op a on the kind "gpu" (d0, d1) and one of b on d2 alone, on a cluster of two GPUs and a CPU:
    # a's time is measured on d0 and d1 (0 s is a time), b's on d2; every other time is the roofline's
    # (1e9 FLOPs at 1 GFLOP/s: 1 s).
    g = _graph()
    c = uniform_cluster(3, kinds=("gpu", "gpu", "cpu"))
    profs = [Profile("g", "gpu", {"a": 0.0}), Profile("g", "d2", {"b": 4.0})]
    assert [op.name for op in g.ops] == ["a", "b"]
    assert profiled_mask(g, c, profs).tolist() == [[True, True, False], [False, False, True]]
    assert cost_matrix(g, c, profs).tolist() == [[0.0, 0.0, 1.0], [1.0, 1.0, 4.0]]
    assert profiled_mask(g, c).tolist() == [[False] * 3] * 2
    with pytest.raises(ProfileError, match="'nosuch' is not in graph"):  # checked as cost_matrix checks them
        profiled_mask(g, c, [Profile("g", "gpu", {"nosuch": 1.0})])


def test_profile_coverage_counts_each_devices_measured_op_times(uniform_cluster):
    """The manifest's summary of what profiles measured: per device, and no 'roofline' note when all are."""
    from suite.costmodel import profile_coverage

    g, c = _graph(), uniform_cluster(3, kinds=("gpu", "gpu", "cpu"))
    assert profile_coverage(g, c, [Profile("g", "gpu", {"a": 0.0})]) == {
        "ops": 2, "profiled_ops": {"d0": 1, "d1": 1, "d2": 0},
        "summary": "op times from profiles: 1 of 2 ops on d0, d1; 0 of 2 ops on d2 (the others are roofline estimates)"}
    full = profile_coverage(g, uniform_cluster(1), [Profile("g", "gpu", {"a": 1.0, "b": 2.0})])
    assert full["summary"] == "op times from profiles: 2 of 2 ops on d0"
