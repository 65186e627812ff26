"""m-ETF on graphs small enough to schedule by hand (CPU 1e9 FLOP/s, GPUs 1e10 FLOP/s, 1 GB/s, no latency
unless a test says so)."""

from __future__ import annotations

import numpy as np
import pytest

from baselines.m_etf import METF, Timeline, Trial, common_start, m_etf_placement, upward_rank
from suite.cluster import Cluster, Device, Link
from suite.graph import Op, OpGraph
from suite.methodology import Budget
from suite.placement import validate

MB = 10**6


def fork(groups: dict[str, str] | None = None, param_bytes: dict[str, int] | None = None) -> OpGraph:
    """a (1e9 FLOPs) -> b, c (1e10 FLOPs each) -> d (1e9); every output 1 MB (1 ms on the link)."""
    groups, param_bytes = groups or {}, param_bytes or {}
    flops = {"a": 1e9, "b": 1e10, "c": 1e10, "d": 1e9}
    ops = [Op(k, "x", flops=f, output_bytes=MB, group=groups.get(k), param_bytes=param_bytes.get(k, 0))
           for k, f in flops.items()]
    return OpGraph.build("fork", ops, [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")])


def _placed_as(problem, expected: list[int], *, step_s: float) -> None:
    """m-ETF's placement is `expected`, and both its own estimate and the simulator give `step_s`."""
    placement, info = m_etf_placement(problem)
    assert placement.tolist() == expected
    assert info["estimated_step_time_s"] == pytest.approx(step_s)
    assert problem.evaluator.measure(placement).step_time_s == pytest.approx(step_s)


def test_chain_stays_on_one_gpu(make_problem, make_cluster):
    ops = [Op(f"o{i}", "x", flops=1e9, output_bytes=MB) for i in range(3)]
    g = OpGraph.build("chain", ops, [("o0", "o1"), ("o1", "o2")])
    p = make_problem(g, make_cluster(2))
    r = METF().place(p, Budget(), 0)
    assert r.placement.tolist() == [1, 1, 1]
    assert r.info["estimated_step_time_s"] == pytest.approx(0.3)
    assert (r.evaluations, r.info["oom_retries"]) == (1, 0)  # one check that it fits
    assert METF(oom_retries=0).place(make_problem(g, make_cluster(2)), Budget(), 0).evaluations == 0  # single shot


def test_a_variables_weights_received_elsewhere_count_against_memory(make_problem):
    """Two variables of P bytes (output 0: their edges carry the weights) feed c, on GPUs of 1.6 P and 2.5 P.
    v1 and x go to gpu:0, v2 to gpu:1 (by rank, earliest finish). c on gpu:0 would hold v1 and a received
    copy of v2's weights, 2 P > 1.6 P (an estimate that sized copies by output bytes saw 0 and was OOM): it
    goes to gpu:1, with v2 and a copy of v1's weights. The estimate's peaks are the simulator's, byte for
    byte: gpu:0 P + x's 1000, gpu:1 2 P + x's copy + c's output."""
    P = 10**9
    ops = [Op("v1", "variable", output_bytes=0, param_bytes=P, group="v1"),
           Op("v2", "variable", output_bytes=0, param_bytes=P, group="v2"),
           Op("x", "input", output_bytes=1000), Op("c", "matmul", flops=1e9, output_bytes=1000)]
    g = OpGraph.build("weights", ops, [("v1", "c", P), ("v2", "c", P), ("x", "c", 1000)])
    devs = tuple(Device(f"gpu:{k}", "gpu", peak_flops=1e12, mem_bandwidth=1e30, memory_bytes=int(m * P),
                        op_overhead_s=0.0) for k, m in enumerate((1.6, 2.5)))
    c = Cluster("two", devs, (Link(("gpu:0", "gpu:1"), bandwidth=1e10, latency_s=0.0),))
    problem = make_problem(g, c)
    placement, info = m_etf_placement(problem)
    m = problem.evaluator.measure(placement)
    assert placement.tolist() == [0, 1, 0, 1] and m.status == "ok"
    assert info["estimated_peak_bytes"] == [P + 1000, 2 * P + 2000] == list(m.peak_memory_bytes.values())


def test_an_oom_placement_is_made_again_with_the_estimates_error_allowed_for(make_problem, make_cluster, monkeypatch):
    """The feedback rule, with schedules and estimates given: the first (estimated 1.0 GB on gpu:0) measures
    2.0 GB on its 1.5 GB: the room there becomes 0.95 x 1.0 / 2.0 of capacity. The second schedule is the
    same placement with the same estimate (not measured again), already within that room: the room shrinks
    by the overshoot, 0.95 x 1.5 / 2.0 more. The third is another placement, which fits."""
    import baselines.m_etf as m_etf

    g = fork()
    problem = make_problem(g, make_cluster(2, gpu_memory_bytes=1_500_000_000))
    oom, fits = np.array([1, 1, 1, 1]), np.array([1, 1, 2, 1])
    schedules = iter([(oom, 1.0e9), (oom, 1.0e9), (fits, 0.5e9)])
    scales = []

    def fake(problem, capacity_scale=None, reserve_groups=False):
        assert not reserve_groups  # the conservative rule only after the usual one ends OOM
        scales.append(None if capacity_scale is None else capacity_scale.tolist())
        placement, estimate = next(schedules)
        return placement, {"estimated_step_time_s": 1.0, "memory_overflows": 0, "estimated_peak_bytes": [0.0, estimate, 0.0]}

    measured = []

    def measure(placement):
        measured.append(placement.tolist())

        class M:  # what the placer reads of a measurement
            status = "oom" if placement.tolist() == oom.tolist() else "ok"
            oom_devices = ["gpu:0"] if status == "oom" else []
            peak_memory_bytes = {"gpu:0": 2.0e9}
        return M()

    monkeypatch.setattr(m_etf, "m_etf_placement", fake)
    monkeypatch.setattr(problem.evaluator, "evaluate", measure)
    r = METF().place(problem, Budget(), 0)
    first = 0.95 * 1.0e9 / 2.0e9
    assert scales == [None, [1.0, first, 1.0], [1.0, first * 0.95 * 1.5e9 / 2.0e9, 1.0]]
    assert r.placement.tolist() == fits.tolist() and r.info["oom_retries"] == 2
    assert measured == [oom.tolist(), fits.tolist()]


@pytest.mark.parametrize("measured", [1.0e9, 0])
def test_a_device_that_ran_out_below_its_capacity_gets_less_room_not_more(make_problem, make_cluster, monkeypatch,
                                                                          measured):
    """A real device can run out below the cluster's capacity (a smaller card than the file says, or one
    shared by two devices of the map); its measured peak (1.0 GB on a 1.5 GB GPU, or none known: 0) then
    says nothing of the estimate's error. The schedule (estimated 1.0 GB there) stays the same: the room
    shrinks by 5% each time (the overshoot's 0.95 x 1.5 / 1.0 grew it past the capacity, and a peak of 0
    divided by zero)."""
    import baselines.m_etf as m_etf

    g = fork()
    problem = make_problem(g, make_cluster(2, gpu_memory_bytes=1_500_000_000))
    oom = np.array([1, 1, 1, 1])
    scales = []

    def fake(problem, capacity_scale=None, reserve_groups=False):
        scales.append(None if capacity_scale is None else capacity_scale.tolist())
        return oom, {"estimated_step_time_s": 1.0, "memory_overflows": 0, "estimated_peak_bytes": [0.0, 1.0e9, 0.0]}

    def measure(placement):
        class M:
            status = "oom"
            oom_devices = ["gpu:0"]
            peak_memory_bytes = {"gpu:0": measured}
        return M()

    monkeypatch.setattr(m_etf, "m_etf_placement", fake)
    monkeypatch.setattr(problem.evaluator, "evaluate", measure)
    METF(oom_retries=3).place(problem, Budget(), 0)
    rooms = [s[1] for s in scales[1:4]]  # then the conservative rule's own schedules
    assert rooms == pytest.approx([0.95, 0.95**2, 0.95**3])


def test_fork_uses_both_gpus_by_earliest_finish(make_problem, make_cluster):
    """a on gpu:0 (ends 0.1); b on gpu:0 (ends 1.1); c on gpu:1 (starts 0.101 after a's output, ends
    1.101); d on gpu:1: b's output arrives 1.101, so d runs 1.101..1.201 (on gpu:0 it would end 1.202)."""
    g = fork()
    p = make_problem(g, make_cluster(2))
    _placed_as(p, [1, 1, 2, 2], step_s=1.201)


def test_transfers_pay_the_link_latency(make_problem, make_cluster):
    """The fork with 10 ms per transfer (1 MB: 11 ms): c on gpu:1 starts 0.111 and ends 1.111; b's output
    leaves gpu:0 at 1.1 and arrives 1.111, so d runs 1.111..1.211 on gpu:1 (on gpu:0 it would wait for c's
    output until 1.122). The estimate is the simulated step time."""
    g = fork()
    p = make_problem(g, make_cluster(2, latency_s=0.01))
    _placed_as(p, [1, 1, 2, 2], step_s=1.211)


def test_colocation_group_follows_its_first_op(make_problem, make_cluster):
    g = fork(groups={"a": "ad", "d": "ad"})
    placement, _ = m_etf_placement(make_problem(g, make_cluster(2)))
    assert placement.tolist() == [1, 1, 2, 1]


def test_memory_pushes_a_big_op_to_the_cpu(make_problem, make_cluster):
    """a's 8 MB of parameters do not fit the 4 MB GPUs: a runs on the CPU (1 s) although it is slower."""
    g = fork(param_bytes={"a": 8 * MB})
    p = make_problem(g, make_cluster(2, gpu_memory_bytes=4 * MB))
    placement, info = m_etf_placement(p)
    assert placement[0] == 0 and (placement[1:] > 0).all()
    assert info["memory_overflows"] == 0
    assert p.evaluator.measure(placement).status == "ok"


def test_live_outputs_and_received_copies_count_against_memory(make_problem, make_cluster):
    """Outputs of 1 MB on GPUs of 1.5 MB: a (on gpu:0) is live until b and c are placed, and b or c on
    gpu:1 would hold a copy of a next to its own output (2 MB): b, c and d go to the CPU. Without the
    memory check the fork would use both GPUs and be OOM."""
    g = fork()
    p = make_problem(g, make_cluster(2, gpu_memory_bytes=1_500_000))
    placement, info = m_etf_placement(p)
    assert placement.tolist() == [1, 0, 0, 0]
    assert info["memory_overflows"] == 0
    assert p.evaluator.measure(placement).status == "ok"
    assert p.evaluator.measure([1, 1, 2, 2]).status == "oom"


def test_a_received_copy_stays_live_until_its_last_consumer_is_placed(make_problem, make_cluster):
    """a (CPU only, 1 MB) feeds c (GPU only) and d. Once c is placed, a's copy on the 1.5 MB GPU stays live
    until d is placed: d there would hold it next to its own 1 MB output (OOM), so d runs on the CPU
    (0.201..0.301) although the GPU would finish it at 0.211."""
    ops = [Op("a", "x", flops=1e8, output_bytes=MB, allowed_kinds=("cpu",)),
           Op("c", "x", flops=1e9, output_bytes=8, allowed_kinds=("gpu",)), Op("d", "x", flops=1e8, output_bytes=MB)]
    g = OpGraph.build("copy", ops, [("a", "c"), ("a", "d"), ("c", "d")])
    p = make_problem(g, make_cluster(1, gpu_memory_bytes=1_500_000))
    placement, info = m_etf_placement(p)
    assert placement.tolist() == [0, 1, 0]
    assert info["memory_overflows"] == 0
    assert info["estimated_step_time_s"] == pytest.approx(0.301)
    assert p.evaluator.measure(placement).status == "ok"
    assert p.evaluator.measure([0, 1, 1]).status == "oom"


def test_a_sink_output_is_freed_once_placed(make_problem, make_cluster):
    """Two independent ops with 1 MB outputs on a 1.5 MB GPU: an output without consumers does not stay
    live once its op is placed, so both run on the GPU, one after the other."""
    g = OpGraph.build("sinks", [Op(k, "x", flops=1e9, output_bytes=MB) for k in "st"], [])
    p = make_problem(g, make_cluster(1, gpu_memory_bytes=1_500_000))
    placement, info = m_etf_placement(p)
    assert placement.tolist() == [1, 1]
    assert info["estimated_step_time_s"] == pytest.approx(0.2)
    assert p.evaluator.measure(placement).status == "ok"


def test_a_received_copy_is_freed_once_its_producers_last_consumer_is_placed(make_problem, make_cluster):
    """a (CPU only, 0..0.1) sends its 1 MB to c (GPU only, 0.101..0.201), its one consumer: once c is placed,
    the copy no longer counts on the 1.5 MB GPU, so e (1 MB output) fits there, in the idle gap before c
    (0..0.01; the CPU would end it at 0.2)."""
    ops = [Op("a", "x", flops=1e8, output_bytes=MB, allowed_kinds=("cpu",)),
           Op("c", "x", flops=1e9, output_bytes=8, allowed_kinds=("gpu",)), Op("e", "x", flops=1e8, output_bytes=MB)]
    g = OpGraph.build("freed", ops, [("a", "c")])
    p = make_problem(g, make_cluster(1, gpu_memory_bytes=1_500_000))
    placement, info = m_etf_placement(p)
    assert placement.tolist() == [0, 1, 1]
    assert info["memory_overflows"] == 0 and info["estimated_step_time_s"] == pytest.approx(0.201)
    assert info["estimated_peak_bytes"] == [MB, MB + 8]
    assert p.evaluator.measure(placement).status == "ok"


def test_a_second_consumer_on_a_device_adds_nothing_to_a_whole_copy(make_problem, make_cluster):
    """A variable (CPU only, P bytes on each of its edges) feeds c1 and c2 on the 1.5 P GPU: the simulator
    sends its weights there once, P bytes, not P per consumer, and so does the estimate (2 P would not fit):
    no overflow, and the estimate's peaks are the simulator's, byte for byte (the CPU holds the P parameter
    bytes; the GPU the copy and one 1000-byte output at a time)."""
    P = MB
    ops = [Op("v", "variable", output_bytes=0, param_bytes=P, allowed_kinds=("cpu",)),
           Op("c1", "x", flops=1e9, output_bytes=1000, allowed_kinds=("gpu",)),
           Op("c2", "x", flops=1e9, output_bytes=1000, allowed_kinds=("gpu",))]
    g = OpGraph.build("shared_weights", ops, [("v", "c1", P), ("v", "c2", P)])
    p = make_problem(g, make_cluster(1, gpu_memory_bytes=1_500_000))
    placement, info = m_etf_placement(p)
    m = p.evaluator.measure(placement)
    assert placement.tolist() == [0, 1, 1] and m.status == "ok"
    assert info["memory_overflows"] == 0
    assert info["estimated_peak_bytes"] == [P, P + 1000] == list(m.peak_memory_bytes.values())


def test_an_op_forced_by_its_group_onto_a_device_it_overflows_is_counted(make_problem, make_cluster):
    """a and b (GPU only) form a group; a fits the 1.5 MB GPU, but b, which follows it there, also reads y's
    1.6 MB from the CPU: one memory overflow, and the simulator finds the placement OOM."""
    ops = [Op("y", "x", flops=1e8, output_bytes=1_600_000, allowed_kinds=("cpu",)),
           Op("a", "x", flops=1e9, output_bytes=1000, group="g", allowed_kinds=("gpu",)),
           Op("b", "x", flops=1e9, output_bytes=1000, group="g", allowed_kinds=("gpu",))]
    g = OpGraph.build("forced", ops, [("y", "b"), ("a", "b")])
    p = make_problem(g, make_cluster(1, gpu_memory_bytes=1_500_000))
    placement, info = m_etf_placement(p)
    assert placement.tolist() == [0, 1, 1]
    assert info["memory_overflows"] == 1
    assert p.evaluator.measure(placement).status == "oom"


def test_an_exact_fit_fits(make_problem, make_cluster):
    """An op whose 1 MB output exactly fills the 1 MB GPU goes there (the simulator's OOM is peak > capacity)."""
    g = OpGraph.build("exact", [Op("a", "x", flops=1e9, output_bytes=MB)], [])
    p = make_problem(g, make_cluster(1, gpu_memory_bytes=MB))
    placement, info = m_etf_placement(p)
    assert placement.tolist() == [1]
    assert info["memory_overflows"] == 0
    assert p.evaluator.measure(placement).status == "ok"


def test_an_input_already_on_a_device_is_not_sent_again(make_problem, make_cluster):
    """a (gpu:0, ends 0.1) sends 100 MB (0.1 s) to b (1 s, stays on gpu:0), c and e (10 ms each). c goes to
    gpu:1, where a's copy arrives at 0.2, and ends at 0.21. e uses that copy on gpu:1 and ends at 0.22; a
    second transfer would arrive at 0.3 (e would rather run on the CPU, ending at 0.3)."""
    ops = [Op("a", "x", flops=1e9, output_bytes=100 * MB), Op("b", "x", flops=1e10, output_bytes=8),
           Op("c", "x", flops=1e8, output_bytes=8), Op("e", "x", flops=1e8, output_bytes=8)]
    g = OpGraph.build("reuse", ops, [("a", "b"), ("a", "c"), ("a", "e")])
    p = make_problem(g, make_cluster(2))
    _placed_as(p, [1, 1, 2, 2], step_s=1.1)


def test_a_busy_channel_delays_the_data(make_problem, make_cluster):
    """a and p run on the CPU (0..0.1, 0.1..0.11), each with a 100 MB output (0.1 s on the link). a's output
    takes the CPU->GPU channel 0.1..0.2 for c (GPU 0.2..0.23). p's output could only follow it (0.2..0.3),
    so q (15 ms on the GPU, 0.15 s on the CPU) ends earlier on the CPU: 0.11..0.26 (the GPU would give
    0.315; 0.245 if the channel were free)."""
    ops = [Op("a", "x", flops=1e8, output_bytes=100 * MB, allowed_kinds=("cpu",)),
           Op("p", "x", flops=1e7, output_bytes=100 * MB, allowed_kinds=("cpu",)),
           Op("c", "x", flops=3e8, output_bytes=8), Op("q", "x", flops=1.5e8, output_bytes=8)]
    g = OpGraph.build("contention", ops, [("a", "c"), ("p", "q")])
    p = make_problem(g, make_cluster(1))
    _placed_as(p, [0, 0, 1, 0], step_s=0.26)
    assert p.evaluator.measure([0, 0, 1, 1]).step_time_s == pytest.approx(0.315)


def test_nothing_fits_goes_where_most_memory_is_left(make_problem, make_cluster):
    cluster = make_cluster(1, cpu=False, gpu_memory_bytes=100)
    g = fork(param_bytes={"a": 10**6})
    placement, info = m_etf_placement(make_problem(g, cluster))
    assert placement.tolist() == [0, 0, 0, 0] and info["memory_overflows"] >= 1


def test_kinds_are_honoured(make_problem, make_cluster, random_graph):
    cluster = make_cluster(2)
    g = random_graph(300, 3, groups=True, kinds=True)
    r = METF().place(make_problem(g, cluster), Budget(), 0)
    validate(r.placement, g, cluster)


def test_upward_rank_is_a_topological_priority(random_graph, make_cluster):
    g = random_graph(200, 9)
    cluster = make_cluster(2)
    from suite.costmodel import cost_matrix

    lat, bw = cluster.routes
    rank = upward_rank(cost_matrix(g, cluster), np.ones((200, 3), dtype=bool), g, lat, bw)
    for e in g.edges:
        assert rank[e.src] > rank[e.dst]


def test_upward_rank_by_hand():
    """Two devices; c_ij = mean latency (0.1 and 0.3 s: 0.2 s) + bytes x mean 1/bandwidth (1 MB/s and
    0.5 MB/s: 1.5 us per byte). w_i = mean cost over the allowed devices: a (0.5, 1.5) 1, b (1, 1) 1,
    c (2, 6) 4, d (1 on device 0 only; 3 elsewhere is not allowed) 1. Edges a->b and a->c carry 0 bytes
    (0.2 s), b->d 2 MB (0.2 + 3 = 3.2 s). rank d = 1, c = 4 (a sink), b = 1 + 3.2 + 1 = 5.2,
    a = 1 + max(0.2 + 5.2, 0.2 + 4) = 6.4: b's transfer puts it before c (without transfers c's 4 would
    beat b's 2)."""
    ops = [Op(k, "x", flops=1e9, output_bytes=8) for k in "abcd"]
    g = OpGraph.build("ranks", ops, [("a", "b", 0), ("a", "c", 0), ("b", "d", 2 * MB)])
    cost = np.array([[0.5, 1.5], [1.0, 1.0], [2.0, 6.0], [1.0, 3.0]])
    allowed = np.array([[True, True], [True, True], [True, True], [True, False]])
    lat = np.array([[0.0, 0.1], [0.3, 0.0]])
    bw = np.array([[np.inf, 1e6], [0.5e6, np.inf]])
    rank = upward_rank(cost, allowed, g, lat, bw)
    assert rank == pytest.approx([6.4, 5.2, 4.0, 1.0])
    assert np.lexsort((np.arange(4), -rank)).tolist() == [0, 1, 2, 3]  # m-ETF's list order: a, b, c, d


def test_deterministic(random_graph, make_problem, haswell_4k80):
    g = random_graph(500, 1, groups=True)
    a = METF().place(make_problem(g, haswell_4k80), Budget(), 0).placement
    b = METF().place(make_problem(g, haswell_4k80), Budget(), 1).placement
    assert np.array_equal(a, b)


def test_group_lookahead_keeps_a_variable_with_its_heavy_group(make_problem, make_cluster):
    """x (1 s on the GPU) runs first; v (a 1e6-FLOP variable) would finish earlier on the idle CPU
    (1 ms) than after x on the GPU, but its group holds u (10 s on the CPU, 1 s on the GPU): the group
    goes to the GPU and the step takes 2.0001 s instead of 10+ s."""
    ops = [Op("x", "x", flops=1e10, output_bytes=MB), Op("v", "variable", flops=1e6, output_bytes=8, group="v"),
           Op("u", "x", flops=1e10, output_bytes=8, group="v")]
    g = OpGraph.build("lookahead", ops, [("x", "u"), ("v", "u")])
    p = make_problem(g, make_cluster(1))
    placement, info = m_etf_placement(p)
    assert placement.tolist() == [1, 1, 1]
    assert info["estimated_step_time_s"] == pytest.approx(2.0001)


def test_timeline_books_into_idle_gaps():
    """HEFT's insertion policy: a booking takes the first idle gap that fits after its ready time."""
    t = Timeline()
    t.book(0.0, 1.0)
    t.book(3.0, 1.0)  # leaves the gap [1, 3)
    assert t.earliest_start(0.5, 1.5) == 1.0
    assert t.earliest_start(0.5, 2.5) == 4.0
    t.book(1.0, 1.5)
    assert t.gap_start == [2.5] and t.gap_end == [3.0]
    assert t.earliest_start(0.0, 0.5) == 2.5


def test_timeline_looks_past_an_idle_gap_too_short():
    """Gaps [0, 1) and [2, 3.5): 1.5 s from time 0 do not fit the first gap but do fit the second."""
    t = Timeline()
    t.book(1.0, 1.0)
    t.book(3.5, 1.0)
    assert t.gap_start == [0.0, 2.0] and t.gap_end == [1.0, 3.5]
    assert t.earliest_start(0.0, 1.5) == 2.0


def test_transfers_on_one_channel_are_booked_one_after_the_other(make_problem, make_cluster):
    """The contention case above with q GPU-only: a's output holds the CPU->GPU channel 0.1..0.2, so p's
    output (ready at 0.11) is booked after it, 0.2..0.3, and q runs 0.3..0.315 on the GPU. The estimate is the
    simulated step time (booking p's transfer at 0.11, as if the channel were free, would estimate 0.245)."""
    ops = [Op("a", "x", flops=1e8, output_bytes=100 * MB, allowed_kinds=("cpu",)),
           Op("p", "x", flops=1e7, output_bytes=100 * MB, allowed_kinds=("cpu",)),
           Op("c", "x", flops=3e8, output_bytes=8), Op("q", "x", flops=1.5e8, output_bytes=8, allowed_kinds=("gpu",))]
    g = OpGraph.build("booked", ops, [("a", "c"), ("p", "q")])
    _placed_as(make_problem(g, make_cluster(1)), [0, 0, 1, 1], step_s=0.315)


def test_transfers_sharing_a_port_are_booked_one_after_the_other(make_problem, make_cluster):
    """The same graph with both GPUs and the CPU on one link that shares ports: p's output to either GPU
    needs the CPU's outgoing port, which a's output holds 0.1..0.2, so it goes 0.2..0.3 and q (GPU-only)
    runs 0.3..0.315; both GPUs tie and the first is taken. The estimate is the simulated step time. On a
    crossbar p's output takes the free CPU->gpu:1 channel 0.11..0.21 and q ends at 0.225, under c's 0.23."""
    ops = [Op("a", "x", flops=1e8, output_bytes=100 * MB, allowed_kinds=("cpu",)),
           Op("p", "x", flops=1e7, output_bytes=100 * MB, allowed_kinds=("cpu",)),
           Op("c", "x", flops=3e8, output_bytes=8), Op("q", "x", flops=1.5e8, output_bytes=8, allowed_kinds=("gpu",))]
    g = OpGraph.build("ports", ops, [("a", "c"), ("p", "q")])
    _placed_as(make_problem(g, make_cluster(2, sharing="ports")), [0, 0, 1, 1], step_s=0.315)
    _placed_as(make_problem(g, make_cluster(2)), [0, 0, 1, 2], step_s=0.23)


def test_inputs_needing_one_port_are_priced_one_after_the_other(make_problem, make_cluster):
    """Three GPUs on a link with ports. a (gpu:0) and b (gpu:1) run 0..1 s with 100 MB outputs (0.1 s on the
    link); x after a on gpu:0 and y after b on gpu:1 run 1..1.15. c needs both outputs: on gpu:2 they share
    its incoming port (1.0..1.1, then 1.1..1.2) and c ends at 1.21; on gpu:0 b's output arrives at 1.1 and c
    runs 1.15..1.16 after x. Pricing each input as if alone would promise 1.11 on gpu:2 and choose it. On a
    crossbar gpu:2 is right: both copies arrive at 1.1 and c ends at 1.11 (the step is x's and y's 1.15)."""
    ops = [Op("a", "x", flops=1e10, output_bytes=100 * MB), Op("b", "x", flops=1e10, output_bytes=100 * MB),
           Op("x", "x", flops=1.5e9, output_bytes=8), Op("y", "x", flops=1.5e9, output_bytes=8),
           Op("c", "x", flops=1e8, output_bytes=8)]
    g = OpGraph.build("two_inputs", ops, [("a", "x"), ("b", "y"), ("a", "c"), ("b", "c")])
    _placed_as(make_problem(g, make_cluster(3, cpu=False, sharing="ports")), [0, 1, 0, 1, 0], step_s=1.16)
    _placed_as(make_problem(g, make_cluster(3, cpu=False)), [0, 1, 0, 1, 2], step_s=1.15)


def test_a_trial_books_on_top_of_its_timeline_without_changing_it():
    base = Timeline()
    base.book(0.0, 1.0)
    trial = Trial(base)
    assert trial.earliest_start(0.0, 0.5) == 1.0
    trial.book(1.0, 0.5)
    assert trial.earliest_start(0.0, 0.5) == 1.5 and trial.earliest_start(1.2, 0.2) == 1.5
    assert base.earliest_start(0.0, 0.5) == 1.0 and base.free_s == 1.0  # untouched


def test_common_start_finds_a_slot_free_on_every_timeline():
    """A channel busy 0..1 and 2..3, a port busy 1..2.5: a transfer of 0.5 ready at 0 fits neither gap of the
    channel alone with the port ([1, 2) is the port's), so it starts at 3; one of 0.5 ready at 3.2 starts then."""
    chan, port = Timeline(), Timeline()
    chan.book(0.0, 1.0)
    chan.book(2.0, 1.0)
    port.book(1.0, 1.5)
    assert common_start([chan, port], 0.0, 0.5) == 3.0
    assert common_start([chan], 0.0, 0.5) == 1.0
    assert common_start([chan, port], 3.2, 0.5) == 3.2
    assert common_start([], 0.7, 0.5) == 0.7


def test_when_nothing_fits_the_op_goes_where_the_most_memory_is_left(make_problem):
    """a's 1000 parameter bytes fit neither gpu:0 (100 B) nor gpu:1 (200 B): it goes to gpu:1, 800 bytes over
    rather than 900, and the overflow is counted."""
    devs = tuple(Device(f"gpu:{k}", "gpu", peak_flops=1e10, mem_bandwidth=1e30, memory_bytes=m, op_overhead_s=0.0)
                 for k, m in enumerate((100, 200)))
    c = Cluster("small_gpus", devs, (Link(("gpu:0", "gpu:1"), bandwidth=1e9, latency_s=0.0),))
    g = OpGraph.build("big", [Op("a", "x", flops=1e9, output_bytes=8, param_bytes=1000)], [])
    placement, info = m_etf_placement(make_problem(g, c))
    assert placement.tolist() == [1] and info["memory_overflows"] == 1


def test_a_time_budget_spent_between_the_check_and_the_evaluation_ends_the_retries(make_problem, make_cluster):
    """The search time can run out between `exhausted` and `evaluate` (a race with the clock, modelled by an
    evaluator whose check sees time left and whose evaluation finds none): m_etf returns its single-shot
    placement with no evaluation instead of raising BudgetExhausted (which the runner stores as an error)."""
    problem = make_problem(fork(), make_cluster(2))

    class LateClock(type(problem.evaluator)):
        @property
        def exhausted(self) -> bool:
            return False

        @property
        def time_left_s(self) -> float:
            return 0.0

    problem.evaluator.__class__ = LateClock
    r = METF().place(problem, Budget(), 0)
    assert r.evaluations == 0 and r.info["oom_retries"] == 0
    assert r.placement.tolist() == m_etf_placement(problem)[0].tolist()


@pytest.mark.parametrize(("gpus", "seed"), [(2, 44), (4, 0), (4, 42)])
def test_where_the_usual_rule_stays_oom_the_conservative_one_fits(random_graph, make_cluster, make_problem, gpus, seed):
    """Point 6. Random graphs with colocation groups and kind limits on GPUs of 200 MB, on which the usual
    rule and all its retries end OOM: the groups' reserved working sets give a schedule that fits (each is
    measured), counted in the evaluations like the retries."""
    g, c = random_graph(30, seed, groups=True, kinds=True), make_cluster(gpus, gpu_memory_bytes=200 * MB)
    problem = make_problem(g, c)
    alone = make_problem(g, c)
    usual = METF()._retry(alone, reserve_groups=False)
    assert usual[3] == "oom" and usual[2] == 16  # every retry spent, the last schedule measured OOM
    r = METF().place(problem, Budget(), 0)
    assert r.info["reserved_groups"] and make_problem(g, c).evaluator.measure(r.placement).status == "ok"
    assert r.info["oom_retries"] == 16 and 0 <= r.info["reserved_groups_oom_retries"] <= 16
    assert r.evaluations == problem.evaluator.evaluations_used > alone.evaluator.evaluations_used
    validate(r.placement, g, c)


def test_a_conservative_schedule_that_is_oom_too_is_not_taken(make_problem, make_cluster):
    """Point 6 takes the conservative schedule only where it is measured to fit. A group of two GPU-only ops
    whose 2 MB outputs overflow the only (1 MB) GPU under either rule: m_etf keeps the usual schedule, and
    says nothing of reserved groups."""
    ops = [Op("a", "x", flops=1e9, output_bytes=2 * MB, group="g", allowed_kinds=("gpu",)),
           Op("b", "x", flops=1e9, output_bytes=2 * MB, group="g", allowed_kinds=("gpu",))]
    g = OpGraph.build("hopeless", ops, [("a", "b")])
    c = make_cluster(1, gpu_memory_bytes=MB)
    assert METF()._retry(make_problem(g, c), reserve_groups=True)[3] == "oom"
    r = METF().place(make_problem(g, c), Budget(), 0)
    assert r.placement.tolist() == [1, 1] and "reserved_groups" not in r.info
    # the usual rule's 16 retries, then the conservative rule's 16: each counted on its own, neither above the
    # parameter (one count of 32 read as 32 retries of a rule allowed 16)
    assert (r.info["oom_retries"], r.info["reserved_groups_oom_retries"]) == (16, 16)
    r = METF(oom_retries=3).place(make_problem(g, c), Budget(), 0)
    assert (r.info["oom_retries"], r.info["reserved_groups_oom_retries"]) == (3, 3)


def _group_then_one_op() -> OpGraph:
    """Group g = a1 (4 MB out) -> a2 (4 MB out), then b (1 MB out) reading a2."""
    ops = [Op("a1", "x", flops=1e9, output_bytes=4 * MB, group="g"), Op("a2", "x", flops=1e9, output_bytes=4 * MB, group="g"),
           Op("b", "x", flops=1e9, output_bytes=MB)]
    return OpGraph.build("release", ops, [("a1", "a2"), ("a2", "b")])


def test_a_groups_reserved_working_set_is_released_with_its_last_op(make_problem, make_cluster):
    """Point 6 by hand, two GPUs of 10 MB: group g = a1 (4 MB out) -> a2 (4 MB out, reads a1's 4 MB) holds
    its largest working set, 8 MB, on gpu:0 until a2 is placed. Then b (1 MB out, reads a2) needs a2's live
    4 MB + 1 MB there, 5 MB: it fits and stays on gpu:0, next to its input (still holding the 8 MB, it
    would need 13 MB and be sent to gpu:1)."""
    g = _group_then_one_op()
    placement, info = m_etf_placement(make_problem(g, make_cluster(2, cpu=False, gpu_memory_bytes=10 * MB)),
                                      reserve_groups=True)
    assert placement.tolist() == [0, 0, 0] and info["memory_overflows"] == 0


def test_an_op_outside_a_group_reserves_no_working_set(make_problem, make_cluster):
    """Point 6 reserves working sets for groups of several ops only. The graph above on GPUs of 8 MB: the
    group's 8 MB fit gpu:0; then b needs a2's live 4 MB + its own 1 MB output there, 5 MB, and stays. A working
    set reserved for b alone (1 MB out + 4 MB read, on top of the live 4 MB: 9 MB) would send it to gpu:1."""
    g = _group_then_one_op()
    placement, info = m_etf_placement(make_problem(g, make_cluster(2, cpu=False, gpu_memory_bytes=8 * MB)),
                                      reserve_groups=True)
    assert placement.tolist() == [0, 0, 0] and info["memory_overflows"] == 0
    assert info["estimated_peak_bytes"] == [8 * MB, 0.0]


def test_an_oom_that_names_no_device_is_not_retried(make_problem, make_cluster, monkeypatch):
    """A real backend's out of memory on an unknown device names none: no room can shrink, so the schedule
    made again would be the same one. Each rule makes its schedule once, measures it, and stops."""
    import baselines.m_etf as m_etf

    problem = make_problem(fork(), make_cluster(2))
    made = []

    def fake(problem, capacity_scale=None, reserve_groups=False):
        made.append(reserve_groups)
        return np.array([1, 1, 1, 1]), {"estimated_step_time_s": 1.0, "memory_overflows": 0,
                                         "estimated_peak_bytes": [0.0, 1.0, 0.0]}

    class M:
        status, oom_devices, peak_memory_bytes = "oom", (), {}

    monkeypatch.setattr(m_etf, "m_etf_placement", fake)
    monkeypatch.setattr(problem.evaluator, "evaluate", lambda placement: M())
    r = METF().place(problem, Budget(), 0)
    assert made == [False, True]
    assert (r.info["oom_retries"], r.info["reserved_groups_oom_retries"]) == (0, 0)


def test_a_conservative_schedule_left_unmeasured_by_the_budget_is_not_taken(random_graph, make_cluster, make_problem):
    """Point 6 takes the conservative schedule only where it is measured to fit: with the budget spent by the
    usual rule's retries (random graph 44 of the test above, 2 GPUs), it is not measured and m_etf keeps
    the usual rule's last schedule."""
    g, c = random_graph(30, 44, groups=True, kinds=True), make_cluster(2, gpu_memory_bytes=200 * MB)
    alone = make_problem(g, c)
    usual, _, retries, status = METF()._retry(alone, reserve_groups=False)
    assert status == "oom" and retries == 16
    used = alone.evaluator.evaluations_used
    r = METF().place(make_problem(g, c, max_evaluations=used), Budget(max_evaluations=used), 0)
    assert r.placement.tolist() == usual.tolist() and r.evaluations == used
    assert "reserved_groups" not in r.info and r.info["reserved_groups_oom_retries"] == 0
