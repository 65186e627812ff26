"""What the simulator refuses: inputs under which a step would take forever, and backends that say `ok`
without a finite time. A failure is a status or an error, never an infinite number."""

from __future__ import annotations

import math

import numpy as np
import pytest

from suite import simulate
from suite.errors import ClusterError
from suite.evaluator import Measurement
from suite.graph import Op, OpGraph


def _pair(nbytes: int) -> OpGraph:
    return OpGraph.build("pair", [Op("a", "matmul", flops=1e9, output_bytes=nbytes), Op("b", "matmul", flops=1e9)],
                         [("a", "b", nbytes)])


def test_a_route_too_slow_for_the_largest_tensor_is_an_error(uniform_cluster):
    slow = uniform_cluster(2, link_bandwidth=5e-324)  # finite and positive, so the cluster itself is valid
    with pytest.raises(ClusterError, match=r"a 1000-byte tensor of 'pair' takes an infinite time from d0 to d1"):
        simulate(_pair(1000), slow, [0, 1])
    assert simulate(_pair(0), slow, [0, 1]).step_time_s == 2.0  # nothing to send: 1 s + 0 s + 1 s
    # the check is on the largest edge, whatever the others carry (a 0-byte one crosses in 0 s)
    three = OpGraph.build("three", [Op("a", "matmul", flops=1e9, output_bytes=1000), Op("b", "matmul", flops=1e9),
                                    Op("c", "matmul", flops=1e9)], [("a", "b", 0), ("a", "c", 1000)])
    with pytest.raises(ClusterError, match=r"a 1000-byte tensor of 'three' takes an infinite time from d0 to d1"):
        simulate(three, slow, [0, 1, 0])


def test_an_unknown_engine_is_refused(uniform_cluster):
    with pytest.raises(ValueError, match=r"unknown simulator engine 'refernce'; choose from fast, reference"):
        simulate(_pair(1000), uniform_cluster(2), [0, 1], engine="refernce")


@pytest.mark.parametrize("t", [math.inf, math.nan, -1.0, None])
def test_an_ok_measurement_needs_a_finite_time(t):
    with pytest.raises(ValueError, match="status ok needs a finite step time"):
        Measurement("ok", t)
    assert Measurement("oom", None).status == "oom"


def test_the_cached_fast_engine_inputs_cannot_be_changed(uniform_cluster):
    """The uint64 index arrays are converted once per (workload, cluster) and shared by every later call."""
    from suite.simulator import inputs_for

    for sharing in ("pairs", "ports"):  # the last argument: None, or the ports' index arrays and their number
        g, c = _pair(1000), uniform_cluster(2, sharing=sharing)
        before = simulate(g, c, [0, 0]).step_time_s
        *arrays, ports = inputs_for(g, c).fast_args()
        assert (ports is None) == (sharing == "pairs")
        for a in arrays + ([] if ports is None else [*ports[:2], *c.ports[:2]]):
            with pytest.raises(ValueError, match="read-only"):
                a.flat[0] = 0
        assert simulate(g, c, [0, 0]).step_time_s == before == simulate(g, c, [0, 0], engine="reference").step_time_s


def test_a_result_cannot_change_the_capacities_of_later_results(uniform_cluster):
    """Every SimResult of a (workload, cluster) holds the cached inputs' capacity array: a write to one result's
    capacity_bytes would turn later results of that pair to "oom". It is read-only, like the reference engine's
    other inputs (num_preds too)."""
    from suite import simulate_batch
    from suite.simulator import inputs_for

    g, c = _pair(1000), uniform_cluster(2)
    r = simulate(g, c, [0, 1])
    assert r.status == "ok"
    with pytest.raises(ValueError, match="read-only"):
        r.capacity_bytes[0] = 1
    for a in inputs_for(g, c).args()[:-1]:
        with pytest.raises(ValueError, match="read-only"):
            a.flat[0] = 0
    assert [simulate(g, c, [0, 1], engine=e).status for e in ("fast", "reference")] == ["ok", "ok"]
    assert simulate_batch(g, c, np.array([[0, 1]]))[0].status == "ok"


def test_a_batch_without_per_placement_checks_still_refuses_unknown_devices(uniform_cluster):
    """`validate_each=False` skips kind and colocation checks only: an index the engine would read out of
    bounds (negative, or past the last device) is an error naming it."""
    import numpy as np

    from suite import simulate_batch
    from suite.errors import PlacementError

    g, c = _pair(1000), uniform_cluster(2)
    assert [r.step_time_s for r in simulate_batch(g, c, np.array([[0, 1], [1, 1]]), validate_each=False)] == [3.0, 2.0]
    with pytest.raises(PlacementError, match=r"placement 1 of the batch, entry 0 \(op 'a'\): device -1 does not"):
        simulate_batch(g, c, np.array([[0, 1], [-1, 1]]), validate_each=False)
    with pytest.raises(PlacementError, match=r"entry 1 \(op 'b'\): device 2 does not exist; .* devices 0..1"):
        simulate_batch(g, c, np.array([[0, 2]]), validate_each=False)
    with pytest.raises(PlacementError, match="integer device indices, got dtype float64"):
        simulate_batch(g, c, np.array([[0.0, 1.5]]), validate_each=False)
    for short_or_long in ([[0]], [[0, 1, 1]]):  # the engine would read past the end of a short row
        with pytest.raises(PlacementError, match=r"batch of placements must have shape \[B, 2\], got \(1, [13]\)"):
            simulate_batch(g, c, np.array(short_or_long), validate_each=False)


@pytest.mark.parametrize("field, value", [("op_overhead_s", 1e308), ("latency_s", 1e308)])
def test_times_that_would_add_up_to_infinity_are_refused(uniform_cluster, field, value):
    """Each op and transfer time is finite, but a step adds them up: refused before any simulation."""
    import dataclasses

    c = uniform_cluster(2)
    if field == "op_overhead_s":
        c = dataclasses.replace(c, devices=tuple(dataclasses.replace(d, op_overhead_s=value) for d in c.devices))
    else:
        c = dataclasses.replace(c, links=tuple(dataclasses.replace(lk, latency_s=value) for lk in c.links))
    chain = OpGraph.build("chain", [Op(x, "matmul", flops=1e9, output_bytes=1000) for x in "abc"],
                          [("a", "b"), ("b", "c")])
    with pytest.raises(ClusterError, match=r"'chain' on 'uniform2': its op and transfer times add up to more than"):
        simulate(chain, c, [0, 1, 0])
    assert simulate(chain, uniform_cluster(2), [0, 1, 0]).step_time_s == 5.0


def test_the_step_bound_takes_each_ops_slowest_device(uniform_cluster):
    """Only d1's overhead is huge: three ops placed there take 3e308 s, an infinite step, though on d0 they
    would take 3 s; the bound adds each op's slowest time, so the cluster is refused."""
    import dataclasses

    c = uniform_cluster(2)
    c = dataclasses.replace(c, devices=(c.devices[0], dataclasses.replace(c.devices[1], op_overhead_s=1e308)))
    chain = OpGraph.build("chain", [Op(x, "matmul", flops=1e9, output_bytes=1000) for x in "abc"],
                          [("a", "b"), ("b", "c")])
    with pytest.raises(ClusterError, match=r"'chain' on 'uniform2': its op and transfer times add up to more than"):
        simulate(chain, c, [0, 0, 0])


def test_send_caps_by_hand():
    """The larger of an op's output and its largest edge; an op without consumers keeps its output bytes."""
    from suite.simulator import send_caps

    succ_ptr = np.array([0, 2, 2, 3])  # op 0 -> two edges, op 1 none, op 2 -> one edge
    caps = send_caps(np.array([1000, 70, 0]), succ_ptr, np.array([400, 1500, 300]))
    assert caps.tolist() == [1500, 70, 300]
    # each op's own edges only, the largest wherever it is among them: op 0 [1500, 400], op 2 [300, 200]
    caps = send_caps(np.array([1000, 70, 0]), np.array([0, 2, 2, 4]), np.array([1500, 400, 300, 200]))
    assert caps.tolist() == [1500, 70, 300]


def test_a_batch_is_validated_placement_by_placement_by_default(uniform_cluster):
    """`simulate_batch` and `start_times` check each placement as `simulate` does (device kinds, colocation)
    unless the caller says it already did (`validate_each=False`)."""
    from suite import simulate_batch
    from suite.errors import PlacementError
    from suite.simulator import start_times

    g = OpGraph.build("kinds", [Op("a", "matmul", flops=1e9, output_bytes=1000),
                                Op("b", "matmul", flops=1e9, allowed_kinds=("gpu",))], [("a", "b")])
    c = uniform_cluster(2, kinds=("cpu", "gpu"))
    assert [r.step_time_s for r in simulate_batch(g, c, np.array([[0, 1], [1, 1]]))] == [3.0, 2.0]
    for run in (simulate_batch, start_times):
        with pytest.raises(PlacementError, match="'b'"):
            run(g, c, np.array([[0, 1], [1, 0]]))  # b on the CPU, which it forbids
    assert [r.step_time_s for r in simulate_batch(g, c, np.array([[1, 0]]), validate_each=False)] == [3.0]
