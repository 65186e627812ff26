"""Step times and peak memory computed by hand for tiny graphs equal the simulator's, for both engines.

Cluster of the `uniform_cluster` fixture: 1e9 FLOPs take 1 s, no per-op overhead, memory time negligible,
links carry 1000 bytes/s with no latency unless stated. Every expected number below is worked out in the
comment beside it.
"""

import numpy as np
import pytest

from suite import Op, OpGraph, simulate
from suite.errors import PlacementError
from suite.simulator import SimInputs, reference, start_times

ENGINES = ["reference", "fast"]
G = 1e9  # FLOPs that take one second


@pytest.mark.parametrize("engine", ENGINES)
def test_chain_across_two_devices(engine, uniform_cluster):
    # a (2 s) on d0 -> b (4 s) on d1 -> c (1 s) on d0; latency 0.5 s, 1000 B/s.
    # a: [0, 2]; a->d1: 0.5 + 1000/1000 = 1.5 s, [2, 3.5]; b: [3.5, 7.5]; b->d0: 0.5 + 0.5, [7.5, 8.5];
    # c: [8.5, 9.5]. Step 9.5 s.
    # Memory d0: a's output (1000) lives [0, 3.5) (until its transfer ends); b's copy (500) [7.5, 9.5).
    # Peak d0 = 1000. d1: a's copy (1000) [2, 7.5), b's output (500) [3.5, 8.5): peak 1500.
    g = OpGraph.build(
        "chain",
        [Op("a", "x", flops=2 * G, output_bytes=1000), Op("b", "x", flops=4 * G, output_bytes=500), Op("c", "x", flops=G)],
        [("a", "b"), ("b", "c")],
    )
    c = uniform_cluster(2, latency_s=0.5)
    r = simulate(g, c, [0, 1, 0], engine=engine)
    assert r.status == "ok"
    assert r.step_time_s == 9.5
    assert r.busy_s.tolist() == [3.0, 4.0]
    assert r.peak_memory_bytes.tolist() == [1000, 1500]
    assert r.link_bytes.tolist() == [[0, 1000], [500, 0]]
    cap = 10**12
    assert r.as_dict() == {"status": "ok", "step_time_s": 9.5, "oom_devices": [], "bytes_transferred": 1500,
                           "devices": {"d0": {"busy_s": 3.0, "peak_memory_bytes": 1000, "capacity_bytes": cap},
                                       "d1": {"busy_s": 4.0, "peak_memory_bytes": 1500, "capacity_bytes": cap}}}


@pytest.mark.parametrize("engine", ENGINES)
def test_fork_join(engine, uniform_cluster):
    # a (1 s) -> {b (2 s) on d1, c (3 s) on d0} -> d (1 s) on d0.
    # a [0,1]; a->d1 1000 B [1,2]; c [1,4]; b [2,4]; b->d0 2000 B [4,6]; d [6,7]. Step 7.
    # d0: a out 1000 [0,4) (c finishes at 4), c out 500 [1,7), b copy 2000 [4,7): at t=4 the free of a
    #     comes first, so peak = max(1000+500, 500+2000) = 2500.
    # d1: a copy 1000 [1,4), b out 2000 [2,6): peak 3000.
    g = OpGraph.build(
        "forkjoin",
        [
            Op("a", "x", flops=G, output_bytes=1000),
            Op("b", "x", flops=2 * G, output_bytes=2000),
            Op("c", "x", flops=3 * G, output_bytes=500),
            Op("d", "x", flops=G),
        ],
        [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")],
    )
    r = simulate(g, uniform_cluster(2), [0, 1, 0, 0], engine=engine)
    assert r.step_time_s == 7.0
    assert r.busy_s.tolist() == [5.0, 2.0]
    assert r.peak_memory_bytes.tolist() == [2500, 3000]
    assert r.link_bytes.tolist() == [[0, 1000], [2000, 0]]
    # all on one device: serial 1+2+3+1 = 7 s too, but no traffic
    r1 = simulate(g, uniform_cluster(2), [0, 0, 0, 0], engine=engine)
    assert r1.step_time_s == 7.0 and r1.link_bytes.sum() == 0


def test_start_times_of_the_fork_join(uniform_cluster):
    # the schedules of test_fork_join: a [0,1], b [2,4], c [1,4], d [6,7]; all on d0: a, b, c, d in turn
    g = OpGraph.build(
        "forkjoin",
        [Op("a", "x", flops=G, output_bytes=1000), Op("b", "x", flops=2 * G, output_bytes=2000),
         Op("c", "x", flops=3 * G, output_bytes=500), Op("d", "x", flops=G)],
        [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")],
    )
    starts = start_times(g, uniform_cluster(2), np.array([[0, 1, 0, 0], [0, 0, 0, 0]]))
    assert starts.tolist() == [[0.0, 2.0, 1.0, 6.0], [0.0, 1.0, 3.0, 6.0]]
    with pytest.raises(PlacementError, match=r"shape \[B, 4\]"):
        start_times(g, uniform_cluster(2), np.array([0, 1, 0, 0]))


@pytest.mark.parametrize("engine", ENGINES)
def test_transfer_bound_contention_and_one_copy_per_device(engine, uniform_cluster):
    # p1 (1 s, 3000 B) and p2 (1 s, 1000 B) on d0; c1, c2 read p1 and c3 reads p2, all on d1 (1 s each).
    # d0: p1 [0,1], p2 [1,2]. p1->d1 once for both consumers: 3000 B, [1,4]. p2->d1 asked at 2, the
    # channel is busy until 4: [4,5]. d1: c1 [4,5]; at 5 c2 and c3 are ready, c2 has the smaller index:
    # c2 [5,6], c3 [6,7]. Step 7; 4000 bytes moved (not 7000).
    # d1 memory: p1 copy 3000 [1,6), p2 copy 1000 [4,7): peak 4000. d0: p1 out [0,4), p2 out [1,5): 4000.
    g = OpGraph.build(
        "xfer",
        [
            Op("p1", "x", flops=G, output_bytes=3000),
            Op("p2", "x", flops=G, output_bytes=1000),
            Op("c1", "x", flops=G),
            Op("c2", "x", flops=G),
            Op("c3", "x", flops=G),
        ],
        [("p1", "c1"), ("p1", "c2"), ("p2", "c3")],
    )
    r = simulate(g, uniform_cluster(2), [0, 0, 1, 1, 1], engine=engine)
    assert r.step_time_s == 7.0
    assert r.link_bytes.tolist() == [[0, 4000], [0, 0]]
    assert r.peak_memory_bytes.tolist() == [4000, 4000]
    assert r.busy_s.tolist() == [2.0, 3.0]


def test_reference_schedule_details(uniform_cluster):
    # The same transfer-bound case, checked op by op on the reference engine's full schedule.
    g = OpGraph.build(
        "xfer",
        [Op(n, "x", flops=G, output_bytes=b) for n, b in [("p1", 3000), ("p2", 1000), ("c1", 0), ("c2", 0), ("c3", 0)]],
        [("p1", "c1"), ("p1", "c2"), ("p2", "c3")],
    )
    c = uniform_cluster(2)
    s = reference.simulate(np.array([0, 0, 1, 1, 1]), *SimInputs.build(g, c).args())
    assert s.start_s.tolist() == [0, 1, 4, 5, 6]
    assert s.finish_s.tolist() == [1, 2, 5, 6, 7]
    assert [(t[0], t[3], t[4]) for t in s.transfers] == [(0, 1.0, 4.0), (1, 4.0, 5.0)]


@pytest.mark.parametrize("engine", ENGINES)
def test_memory_bound_op_and_oom(engine, uniform_cluster):
    # a reads+writes 8e9 bytes on a device of 1e9 B/s: memory time 8 s beats compute time 1e-6 s.
    # b is a chain successor with 1 s of compute. Step 9 s.
    # Memory on one device: params 600 + 300 = 900; a's output 500 lives [0, 9), b's output 100 [8, 9):
    # peak = 900 + 600 = 1500 > capacity 1400 -> OOM on d0, and the step time is still reported.
    ops = [
        Op("a", "x", flops=1e3, bytes_read=4 * 10**9, bytes_written=4 * 10**9, output_bytes=500, param_bytes=600),
        Op("b", "x", flops=G, output_bytes=100, param_bytes=300),
    ]
    g = OpGraph.build("membound", ops, [("a", "b")])
    c = uniform_cluster(2, mem_bandwidth=1e9, memory_bytes=1400)
    r = simulate(g, c, [0, 0], engine=engine)
    assert r.step_time_s == 9.0
    assert r.peak_memory_bytes.tolist() == [1500, 0]
    assert r.status == "oom" and r.oom_devices == ("d0",)
    # split over two devices: d0 holds 600 + a's 500 = 1100, d1 300 + copy 500 + 100 = 900: fits.
    r2 = simulate(g, c, [0, 1], engine=engine)
    assert r2.status == "ok"
    assert r2.peak_memory_bytes.tolist() == [1100, 900]
    assert r2.step_time_s == 9.0 + 0.5  # 500 B over 1000 B/s
    # OOM means peak > capacity: a peak of exactly the capacity (1500) fits, one byte less does not.
    at_capacity = simulate(g, uniform_cluster(2, mem_bandwidth=1e9, memory_bytes=1500), [0, 0], engine=engine)
    assert at_capacity.peak_memory_bytes.tolist() == [1500, 0]
    assert at_capacity.status == "ok" and at_capacity.oom_devices == ()
    one_short = simulate(g, uniform_cluster(2, mem_bandwidth=1e9, memory_bytes=1499), [0, 0], engine=engine)
    assert one_short.status == "oom" and one_short.oom_devices == ("d0",)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("output, first, second, sent", [
    (2000, 2000, 500, 2000),  # c1 reads the whole output: nothing more to send for c2 (either order)
    (2000, 500, 2000, 2000),
    (1000, 500, 500, 1000),  # two slices (e.g. two time steps) of one output: both cross
    (1000, 300, None, 300),  # one consumer reads a 300-byte slice: only that crosses
    (0, 300, 300, 300),  # a variable (output 0 bytes, its edges carry the weights): the weights cross once
])
def test_transfer_carries_what_the_consumers_there_read_at_most_the_tensor(engine, output, first, second, sent,
                                                                           uniform_cluster):
    # p (1 s) on d0; its consumers (1 s each) on d1. One transfer to d1 carries the sum of their edges'
    # bytes, at most max(output, largest edge): [1, 1 + sent/1000]; then the consumers one after the other.
    # Memory d1: the copy of `sent` bytes from the transfer's start to the end; d0: p's output until the
    # transfer ends.
    ops = [Op("p", "x", flops=G, output_bytes=output), Op("c1", "x", flops=G)]
    edges = [("p", "c1", first)]
    if second is not None:
        ops.append(Op("c2", "x", flops=G))
        edges.append(("p", "c2", second))
    g = OpGraph.build("sentbytes", ops, edges)
    r = simulate(g, uniform_cluster(2), [0] + [1] * (len(ops) - 1), engine=engine)
    assert r.step_time_s == 1.0 + sent / 1000 + (len(ops) - 1)
    assert r.link_bytes.tolist() == [[0, sent], [0, 0]]
    assert r.peak_memory_bytes.tolist() == [output, sent]


@pytest.mark.parametrize("engine", ENGINES)
def test_received_copy_is_allocated_when_its_transfer_starts(engine, uniform_cluster):
    # a (1 s, 1000 B) on d0 -> b on d1; x (1 s, 2000 B) -> y, both on d1; all ops 1 s.
    # a [0, 1] on d0, x [0, 1] on d1; a->d1 1000 B [1, 2]; y [1, 2]; b [2, 3]. Step 3.
    # d1: x's output 2000 [0, 2) (y ends at 2) and a's copy 1000 from the transfer's start: [1, 3).
    # At t=1 both are live: 2000 + 1000 = 3000. (Allocated at the transfer's end, t=2, after x's output
    # is freed, the peak would be only 2000.) d0: a's output 1000 [0, 2).
    g = OpGraph.build(
        "recvstart",
        [Op("a", "x", flops=G, output_bytes=1000), Op("x", "x", flops=G, output_bytes=2000),
         Op("y", "x", flops=G), Op("b", "x", flops=G)],
        [("a", "b"), ("x", "y")],
    )
    assert [op.name for op in g.ops] == ["a", "x", "y", "b"]  # canonical order: the placement's order
    r = simulate(g, uniform_cluster(2), [0, 1, 1, 1], engine=engine)
    assert r.step_time_s == 3.0
    assert r.peak_memory_bytes.tolist() == [1000, 3000]
    assert r.busy_s.tolist() == [1.0, 3.0]
    assert r.link_bytes.tolist() == [[0, 1000], [0, 0]]



@pytest.mark.parametrize("engine", ENGINES)
def test_a_producers_copy_is_freed_when_its_transfer_ends_not_when_the_remote_consumer_does(engine, uniform_cluster):
    # p (1 s, 1000 B), q (1 s), r (1 s, 2000 B) on d0; c (5 s) on d1 reads p.
    # d0: p [0, 1], q [1, 2], r [2, 3]; p->d1 1000 B [1, 2]; c [2, 7]. Step 7.
    # d0: p's output 1000 [0, 2) (its transfer ends at 2; c is on d1), r's output 2000 [2, 3): at 2 the free
    # comes first, so peak 2000. (Held until c ends at 7, it would be 3000.) d1: p's copy 1000 [1, 7).
    g = OpGraph.build(
        "remotefree",
        [Op("p", "x", flops=G, output_bytes=1000), Op("q", "x", flops=G), Op("r", "x", flops=G, output_bytes=2000),
         Op("c", "x", flops=5 * G)],
        [("p", "c")],
    )
    assert [op.name for op in g.ops] == ["p", "q", "r", "c"]
    r = simulate(g, uniform_cluster(2), [0, 0, 0, 1], engine=engine)
    assert r.step_time_s == 7.0
    assert r.peak_memory_bytes.tolist() == [2000, 1000]
    assert r.busy_s.tolist() == [3.0, 5.0]
    assert r.link_bytes.tolist() == [[0, 1000], [0, 0]]

def _same_instant_graph() -> OpGraph:
    """o0 (1 s, 1000 B) -> o1 (2 s); o2 (2 s) and o3 (2 s, 2000 B) independent."""
    return OpGraph.build(
        "instant",
        [Op("o0", "x", flops=G, output_bytes=1000), Op("o1", "x", flops=2 * G), Op("o2", "x", flops=2 * G),
         Op("o3", "x", flops=2 * G, output_bytes=2000)],
        [("o0", "o1")],
    )


@pytest.mark.parametrize("engine", ENGINES)
def test_all_events_of_an_instant_are_handled_before_dispatch(engine, uniform_cluster):
    # Placed [1, 0, 0, 0]: o0 [0, 1] on d1; d0 runs o2 [0, 2] (o1 waits for o0). o0->d0 1000 B [1, 2].
    # At t=2 o2 finishes AND the transfer arrives: both are handled, then d0 picks the smallest ready
    # index, o1 [2, 4], then o3 [4, 6]. Step 6.
    # d0 memory: o0's copy 1000 [1, 4) (o1 ends at 4), o3's output 2000 [4, 6): at 4 the free comes
    # first, so peak 2000. d1: o0's output 1000 [0, 2).
    # (Dispatching after o2's event alone would start o3 at 2, o1 at 4: d0 holds 1000 + 2000 = 3000.)
    r = simulate(_same_instant_graph(), uniform_cluster(2), [1, 0, 0, 0], engine=engine)
    assert r.step_time_s == 6.0
    assert r.peak_memory_bytes.tolist() == [2000, 1000]
    assert r.busy_s.tolist() == [6.0, 1.0]
    assert r.link_bytes.tolist() == [[0, 0], [1000, 0]]


def test_all_events_of_an_instant_are_handled_before_dispatch_schedule(uniform_cluster):
    # The same case op by op: o1 (index 1) wins d0 at t=2 over o3 (index 3).
    inputs = SimInputs.build(_same_instant_graph(), uniform_cluster(2))
    s = reference.simulate(np.array([1, 0, 0, 0]), *inputs.args())
    assert s.start_s.tolist() == [0, 2, 0, 4]
    assert s.finish_s.tolist() == [1, 4, 2, 6]
    assert [(t[0], t[1], t[2], t[3], t[4]) for t in s.transfers] == [(0, 1, 0, 1.0, 2.0)]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_zero_duration_op_ends_after_the_starts_of_its_instant(engine, uniform_cluster):
    # z takes 0 s on d0 and sends 0 bytes to d1 (no latency): b can start at 0. But z's end and the transfer
    # are handled in a further round of t = 0, after d1 started c (the only op ready there when the round
    # began): b waits, [2, 3]. Step 3; with b first it would be 2 (b [0, 1], c [1, 2]).
    g = OpGraph.build("zero", [Op("z", "x", flops=0.0, output_bytes=0), Op("b", "x", flops=G),
                               Op("c", "x", flops=2 * G)], [("z", "b")])
    r = simulate(g, uniform_cluster(2), [0, 1, 1], engine=engine)
    assert r.step_time_s == 3.0 and r.busy_s.tolist() == [0.0, 3.0]
    s = reference.simulate(np.array([0, 1, 1]), *SimInputs.build(g, uniform_cluster(2)).args())
    assert s.start_s.tolist() == [0, 2, 0]


@pytest.mark.parametrize("engine", ENGINES)
def test_parallel_branches_overlap(engine, uniform_cluster):
    # Two independent 2-second ops on two devices finish together at 2 s; on one device at 4 s.
    g = OpGraph.build("par", [Op("a", "x", flops=2 * G), Op("b", "x", flops=2 * G)], [])
    c = uniform_cluster(2)
    assert simulate(g, c, [0, 1], engine=engine).step_time_s == 2.0
    assert simulate(g, c, [1, 1], engine=engine).step_time_s == 4.0


def test_roofline_overhead_and_efficiency():
    from suite.cluster import Device
    from suite.costmodel import roofline_time_s

    dev = Device("d", "gpu", peak_flops=1e12, mem_bandwidth=1e11, memory_bytes=1, op_overhead_s=1e-5,
                 compute_efficiency=0.5, memory_efficiency=0.5)
    t = roofline_time_s(np.array([1e9, 1e3]), np.array([1e3, 1e9]), dev)
    # compute bound: 1e9 / (1e12 * 0.5) = 2 ms; memory bound: 1e9 / (1e11 * 0.5) = 20 ms; plus 10 us each
    assert t.tolist() == pytest.approx([2e-3 + 1e-5, 2e-2 + 1e-5], rel=1e-12)


@pytest.mark.parametrize("engine", ENGINES)
def test_each_direction_of_a_link_is_its_own_channel(engine, uniform_cluster):
    # a (1 s, 1000 B) on d0 -> b on d1; x (1 s, 1000 B) on d1 -> y on d0; all ops 1 s.
    # At t=1 a->d1 and x->d0 leave at once, one per direction of the link: both [1, 2]. b and y [2, 3].
    # Step 3 (one channel shared by both directions would delay one copy to [2, 3]: step 4).
    # Memory d0: a's output [0, 2), x's copy [1, 3): 2000; d1 the mirror image: 2000.
    g = OpGraph.build(
        "bidir",
        [Op("a", "x", flops=G, output_bytes=1000), Op("x", "x", flops=G, output_bytes=1000),
         Op("b", "x", flops=G), Op("y", "x", flops=G)],
        [("a", "b"), ("x", "y")],
    )
    assert [op.name for op in g.ops] == ["a", "x", "b", "y"]
    r = simulate(g, uniform_cluster(2), [0, 1, 1, 0], engine=engine)
    assert r.step_time_s == 3.0
    assert r.link_bytes.tolist() == [[0, 1000], [1000, 0]]
    assert r.peak_memory_bytes.tolist() == [2000, 2000]
    assert r.busy_s.tolist() == [2.0, 2.0]
    if engine == "reference":
        s = reference.simulate(np.array([0, 1, 1, 0]), *SimInputs.build(g, uniform_cluster(2)).args())
        assert [(t[0], t[1], t[2], t[3], t[4]) for t in s.transfers] == [(0, 0, 1, 1.0, 2.0), (1, 1, 0, 1.0, 2.0)]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("placement", [[0, 1, 2, 2], [1, 0, 2, 2]])
def test_a_shared_incoming_port_takes_one_transfer_at_a_time(engine, placement, uniform_cluster):
    # a and b (1 s, 1000 B each) on d0 and d1 (either way round); ca reads a and cb reads b, both 1 s on d2.
    # Both transfers to d2 are asked for at 1. As a crossbar ("pairs") both take [1, 2]: ca [2, 3], then cb
    # [3, 4] (the lower index first). With "ports" they share d2's incoming port, claimed in device order:
    # the one from d0 [1, 2], the one from d1 [2, 3]; the consumer of d0's tensor [2, 3], the other [3, 4].
    # Step 4 either way. Memory d2 with "ports": the first copy [1, 3), the second from its start [2, 4):
    # peak 2000 (as a crossbar both from 1: 2000 too). d0 and d1 hold their output until its transfer ends.
    g = OpGraph.build(
        "join",
        [Op("a", "x", flops=G, output_bytes=1000), Op("b", "x", flops=G, output_bytes=1000),
         Op("ca", "x", flops=G), Op("cb", "x", flops=G)],
        [("a", "ca"), ("b", "cb")],
    )
    assert [op.name for op in g.ops] == ["a", "b", "ca", "cb"]
    from_d0 = "a" if placement[0] == 0 else "b"  # whose transfer leaves d0, first in line for the port
    for sharing, starts in [("pairs", {"ca": 2.0, "cb": 3.0}),
                            ("ports", {"ca": 2.0, "cb": 3.0} if from_d0 == "a" else {"ca": 3.0, "cb": 2.0})]:
        c = uniform_cluster(3, sharing=sharing)
        r = simulate(g, c, placement, engine=engine)
        assert r.step_time_s == 4.0
        assert r.peak_memory_bytes.tolist() == [1000, 1000, 2000]
        assert start_times(g, c, np.array([placement]))[0].tolist() == [0.0, 0.0, starts["ca"], starts["cb"]]
        if engine == "reference":
            s = reference.simulate(np.array(placement), *SimInputs.build(g, c).args())
            ends = [(t[1], t[3], t[4]) for t in s.transfers]  # (from device, start, end)
            assert ends == ([(0, 1.0, 2.0), (1, 1.0, 2.0)] if sharing == "pairs" else [(0, 1.0, 2.0), (1, 2.0, 3.0)])


@pytest.mark.parametrize("engine", ENGINES)
def test_a_shared_outgoing_port_sends_in_destination_order(engine, uniform_cluster):
    # a (1 s, 1000 B) on d0 feeds b on d2 and c on d1 (1 s each). As a crossbar both copies take [1, 2]:
    # b and c [2, 3], step 3. With "ports" d0's outgoing port sends to the lower device first: to d1 (c)
    # [1, 2], to d2 (b) [2, 3]; c [2, 3], b [3, 4], step 4. a's output stays on d0 until its last transfer
    # ends: [0, 2) or [0, 3), 1000 bytes.
    g = OpGraph.build("fork", [Op("a", "x", flops=G, output_bytes=1000), Op("b", "x", flops=G), Op("c", "x", flops=G)],
                      [("a", "b"), ("a", "c")])
    assert [op.name for op in g.ops] == ["a", "b", "c"]
    for sharing, step, starts in [("pairs", 3.0, [0.0, 2.0, 2.0]), ("ports", 4.0, [0.0, 3.0, 2.0])]:
        c = uniform_cluster(3, sharing=sharing)
        r = simulate(g, c, [0, 2, 1], engine=engine)
        assert r.step_time_s == step
        assert r.peak_memory_bytes.tolist() == [1000, 1000, 1000]
        assert r.link_bytes.tolist() == [[0, 1000, 1000], [0, 0, 0], [0, 0, 0]]
        assert start_times(g, c, np.array([[0, 2, 1]]))[0].tolist() == starts


def test_a_two_link_route_holds_the_ports_of_each_shared_link(uniform_cluster):
    # d0 - d1 share a "ports" link, d1 - d2 a crossbar link: d0 -> d2 goes over both. a (1 s, 1000 B) on d0
    # feeds x on d1 and y on d2; b (1.5 s, 1000 B) on d1 feeds z on d0 (all consumers 1 s, links 1000 B/s,
    # no latency). At 1 a's copies leave in destination order: to d1 [1, 2] (d0's outgoing and d1's incoming
    # port), to d2 [2, 3] (the same two ports, and its own channel). At 1.5 b's copy to d0 holds d1's
    # outgoing and d0's incoming port, both free: [1.5, 2.5] (d1's incoming port, busy until 2, is not its).
    # x [2, 3] on d1, z [2.5, 3.5], y [3, 4]: step 4.
    from suite.cluster import Cluster, Link

    devices = uniform_cluster(3).devices
    c = Cluster("line", devices, (Link(("d0", "d1"), 1000.0, 0.0, sharing="ports"), Link(("d1", "d2"), 1000.0, 0.0)))
    _check_two_hop_schedule(c)


def _check_two_hop_schedule(c) -> None:
    """a (1 s, 1000 B) on d0 feeds x on d1 and y on d2, b (1.5 s, 1000 B) on d1 feeds z on d0 (consumers 1 s)
    on a line d0 - d1 - d2 of 1000 B/s links: a's copies [1, 2] to d1 then [2, 3] to d2, b's [1.5, 2.5] to
    d0; x [2, 3], z [2.5, 3.5], y [3, 4]: step 4, in both engines and the batch's start times."""
    g = OpGraph.build("two_hops", [Op("a", "x", flops=G, output_bytes=1000), Op("b", "x", flops=1.5 * G, output_bytes=1000),
                                   Op("x", "x", flops=G), Op("y", "x", flops=G), Op("z", "x", flops=G)],
                      [("a", "x"), ("a", "y"), ("b", "z")])
    assert [op.name for op in g.ops] == ["a", "b", "x", "y", "z"]
    placement = [0, 1, 1, 2, 0]
    for engine in ENGINES:
        assert simulate(g, c, placement, engine=engine).step_time_s == 4.0
    assert start_times(g, c, np.array([placement]))[0].tolist() == [0.0, 0.0, 2.0, 3.0, 2.5]
    s = reference.simulate(np.array(placement), *SimInputs.build(g, c).args())
    assert [(t[1], t[2], t[3], t[4]) for t in s.transfers] == [(0, 1, 1.0, 2.0), (0, 2, 2.0, 3.0), (1, 0, 1.5, 2.5)]


def test_a_crossbar_hop_that_a_longer_route_takes_carries_one_transfer_at_a_time(uniform_cluster):
    # d0 - d1 - d2, both links "pairs" (1000 B/s, no latency). a (1 s, 1000 B) on d0 feeds x on d1 and y on
    # d2 (1 s each). At 1 its copies leave in destination order: to d1 [1, 2] over the hop d0 -> d1, then to
    # d2, whose route takes that hop too: [2, 3] (it went with the first, [1, 2], when a route of two links was
    # a channel of its own: step 3). x [2, 3], y [3, 4]: step 4. The other direction and the other hop are
    # free: b (1.5 s) on d1 feeding z on d0 sends at 1.5, [1.5, 2.5].
    from suite.cluster import Cluster, Link

    devices = uniform_cluster(3).devices
    c = Cluster("chain", devices, (Link(("d0", "d1"), 1000.0, 0.0), Link(("d1", "d2"), 1000.0, 0.0)))
    ptr, port, count = c.ports
    assert count == 4  # the hops d0 -> d1 and d1 -> d2, each way, that routes of two links take
    held = {(a, b): port[ptr[a * 3 + b]:ptr[a * 3 + b + 1]].tolist() for a in range(3) for b in range(3)}
    assert held[(0, 2)] == held[(0, 1)] + held[(1, 2)] and held[(2, 0)] == held[(2, 1)] + held[(1, 0)]
    assert len({*held[(0, 1)], *held[(1, 2)], *held[(1, 0)], *held[(2, 1)]}) == 4
    _check_two_hop_schedule(c)


@pytest.mark.parametrize("engine", ENGINES)
def test_step_time_is_the_latest_finish_not_the_last_ops(engine, uniform_cluster):
    # a (3 s) on d0 and b (1 s) on d1, independent: b is last in the canonical order but ends at 1 s;
    # the step ends when a does, at 3 s.
    g = OpGraph.build("uneven", [Op("a", "x", flops=3 * G), Op("b", "x", flops=G)], [])
    assert [op.name for op in g.ops] == ["a", "b"]
    assert simulate(g, uniform_cluster(2), [0, 1], engine=engine).step_time_s == 3.0


@pytest.mark.parametrize("engine", ENGINES)
def test_a_queued_transfer_starts_when_the_one_ahead_ends(engine, uniform_cluster):
    # p1 (1 s, 3000 B) and p2 (1 s, 1000 B) on d0; c1 (0 s) reads p1 and c2 (1 s) reads p2, both on d1.
    # p1 [0, 1], p2 [1, 2]. p1->d1 [1, 4]; p2->d1 is asked for at 2 but the channel is busy until 4: [4, 5].
    # c1 [4, 4]; d1 is idle when p2's copy arrives, so the wait alone decides: c2 [5, 6]. Step 6 (4 if
    # p2's copy had left at 2). Memory d1: p1's copy 3000 [1, 4), p2's copy 1000 [4, 6): at 4 the free
    # comes first, peak 3000. d0: p1's output [0, 4), p2's [1, 5): 4000.
    g = OpGraph.build(
        "queued",
        [Op("p1", "x", flops=G, output_bytes=3000), Op("p2", "x", flops=G, output_bytes=1000),
         Op("c1", "x", flops=0), Op("c2", "x", flops=G)],
        [("p1", "c1"), ("p2", "c2")],
    )
    assert [op.name for op in g.ops] == ["p1", "p2", "c1", "c2"]
    r = simulate(g, uniform_cluster(2), [0, 0, 1, 1], engine=engine)
    assert r.step_time_s == 6.0
    assert r.peak_memory_bytes.tolist() == [4000, 3000]
    assert r.link_bytes.tolist() == [[0, 4000], [0, 0]]
    assert start_times(g, uniform_cluster(2), np.array([[0, 0, 1, 1]])).tolist() == [[0.0, 1.0, 4.0, 5.0]]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_profile_reaches_both_engines(engine, uniform_cluster):
    # b measured at 7 s where the roofline says 1 s: a [0, 1] on d0, a->d1 1000 B [1, 2], b [2, 9].
    from suite.costmodel import Profile

    g = OpGraph.build("prof", [Op("a", "x", flops=G, output_bytes=1000), Op("b", "x", flops=G)], [("a", "b")])
    prof = Profile(workload="prof", applies_to="gpu", op_times_s={"b": 7.0})
    assert simulate(g, uniform_cluster(2), [0, 1], profiles=[prof], engine=engine).step_time_s == 9.0
    assert simulate(g, uniform_cluster(2), [0, 1], engine=engine).step_time_s == 3.0
