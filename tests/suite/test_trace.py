"""The timeline of a placement (`suite.simulator.trace`): exact on a hand-computed chain, and consistent with
the fast engine's results on random graphs."""

import json
from collections import defaultdict
from dataclasses import replace

import numpy as np
from hypothesis import HealthCheck, given, settings

from suite import Op, OpGraph, simulate
from suite.cluster import Cluster
from suite.simulator.trace import chrome_trace, memory_series, schedule, write_chrome_trace

from .test_simulator_equivalence import problems

G = 1e9  # FLOPs that take one second on the uniform cluster


def _chain() -> OpGraph:
    return OpGraph.build(
        "chain",
        [Op("a", "x", flops=2 * G, output_bytes=1000), Op("b", "x", flops=4 * G, output_bytes=500, param_bytes=70),
         Op("c", "x", flops=G)],
        [("a", "b"), ("b", "c")],
    )


def test_the_timeline_of_a_chain_across_two_devices(uniform_cluster, tmp_path):
    # as in test_simulator_hand: a [0, 2] on d0; a -> d1 [2, 3.5]; b [3.5, 7.5] on d1; b -> d0 [7.5, 8.5];
    # c [8.5, 9.5] on d0. Memory d0: a's output 1000 [0, 3.5), b's copy 500 [7.5, 9.5).
    # d1: b's 70 parameter bytes always, a's copy 1000 [2, 7.5), b's output 500 [3.5, 8.5).
    g, c = _chain(), uniform_cluster(2, latency_s=0.5)
    doc = chrome_trace(g, c, [0, 1, 0], metadata={"placer": "by hand"})
    ev = doc["traceEvents"]
    slices = [(e["name"], e["pid"], e["tid"], e["ts"], e["dur"]) for e in ev if e["ph"] == "X"]
    assert slices == [
        ("a", 0, 0, 0.0, 2e6), ("b", 1, 0, 3.5e6, 4e6), ("c", 0, 0, 8.5e6, 1e6),  # compute
        ("a", 0, 2, 2e6, 1.5e6), ("b", 1, 1, 7.5e6, 1e6),  # transfers, on the track of their destination
    ]
    assert [e["args"]["bytes"] for e in ev if e.get("cat") == "transfer"] == [1000, 500]
    memory = defaultdict(list)
    for e in ev:
        if e["ph"] == "C":
            memory[e["pid"]].append((e["ts"], e["args"]["bytes"]))
    assert memory[0] == [(0.0, 1000), (3.5e6, 0), (7.5e6, 500), (9.5e6, 0)]
    assert memory[1] == [(0.0, 70), (2e6, 1070), (3.5e6, 1570), (7.5e6, 570), (8.5e6, 70)]
    tracks = {(e["pid"], e.get("tid")): e["args"]["name"] for e in ev if e["name"] in ("process_name", "thread_name")}
    assert tracks[(0, 0)] == tracks[(1, 0)] == "compute"
    assert (tracks[(0, 2)], tracks[(1, 1)]) == ("to d1", "to d0")
    assert tracks[(0, None)] == "d0 (gpu, 931.32 GiB)"  # 10**12 bytes, as the OOM messages write sizes
    small = Cluster("small", tuple(replace(d, memory_bytes=2**20) for d in c.devices), c.links)
    assert chrome_trace(g, small, [0, 1, 0])["traceEvents"][0]["args"]["name"] == "d0 (gpu, 1.00 MiB)"  # was 0.0 GiB
    other = doc["otherData"]
    assert (other["step_time_s"], other["status"], other["bytes_transferred"], other["placer"]) == (9.5, "ok", 1500, "by hand")
    assert other["peak_memory_bytes"] == {"d0": 1000, "d1": 1570}
    # written as JSON that loads back to the same document
    path = write_chrome_trace(tmp_path / "t.json", g, c, [0, 1, 0], metadata={"placer": "by hand"})
    assert json.loads(path.read_text()) == json.loads(json.dumps(doc))


def test_an_op_or_transfer_of_0_s_is_a_marker_on_a_track_of_its_own(uniform_cluster):
    # z (0 FLOPs, no overhead) runs [0, 0] on d0, then a [0, 2]: as a slice of no width z was drawn inside a.
    # z's 0-byte output reaches d1 at once (latency 0): that transfer takes 0 s too; a's 1000 bytes take 1 s.
    g = OpGraph.build("zero", [Op("z", "x"), Op("a", "x", flops=2 * G, output_bytes=1000), Op("b", "x", flops=G)],
                      [("z", "a"), ("z", "b"), ("a", "b")])
    ev = chrome_trace(g, uniform_cluster(2), [0, 0, 1])["traceEvents"]
    marks = [(e["ph"], e["name"], e["cat"], e["pid"], e["tid"], e["ts"]) for e in ev if e["ph"] in ("X", "i")]
    assert marks == [
        ("i", "z", "forward", 0, 3, 0.0), ("X", "a", "forward", 0, 0, 0.0), ("X", "b", "forward", 1, 0, 3e6),
        ("i", "z", "transfer", 0, 5, 0.0), ("X", "a", "transfer", 0, 2, 2e6),
    ]
    assert [e["s"] for e in ev if e["ph"] == "i"] == ["t", "t"]  # thread-scoped: drawn on their track
    tracks = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev if e["name"] == "thread_name"}
    assert tracks == {(0, 0): "compute", (1, 0): "compute", (0, 3): "compute (0 s)", (0, 2): "to d1",
                      (0, 5): "to d1 (0 s)"}


def test_a_slice_ends_at_the_nanosecond_the_next_one_starts(uniform_cluster):
    # a [0, 1/6 s], b [1/6, 1/3], c [1/3, 4/3] on d0. Written as start * 1e6 and (finish - start) * 1e6, b ended
    # 1 ns after c started once a viewer rounds ts and dur to nanoseconds (Perfetto: llround(us * 1000)), and c
    # was drawn nested in b. Now every time is a whole number of nanoseconds.
    g = OpGraph.build("sixths", [Op("a", "x", flops=G / 6), Op("b", "x", flops=G / 6), Op("c", "x", flops=G)],
                      [("a", "b"), ("b", "c")])
    ev = chrome_trace(g, uniform_cluster(2), [0, 0, 0])["traceEvents"]
    slices = [(e["name"], e["ts"], e["dur"]) for e in ev if e["ph"] == "X"]
    assert slices == [("a", 0.0, 166666.667), ("b", 166666.667, 166666.666), ("c", 333333.333, 1e6)]
    ns = [(round(ts * 1000), round(dur * 1000)) for _, ts, dur in slices]
    assert [ts + dur for ts, dur in ns[:-1]] == [ts for ts, _ in ns[1:]]


def test_an_oom_placement_has_a_timeline_with_its_status(uniform_cluster):
    g = _chain()
    c = uniform_cluster(2, memory_bytes=1200)
    doc = chrome_trace(g, c, [0, 0, 0])
    assert doc["otherData"]["status"] == "oom" == simulate(g, c, [0, 0, 0]).status
    top = max(e["args"]["bytes"] for e in doc["traceEvents"] if e["ph"] == "C" and e["pid"] == 0)
    assert top == doc["otherData"]["peak_memory_bytes"]["d0"] == 1570 > 1200


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_the_timeline_agrees_with_the_fast_engine(problem):
    g, c, placements = problem
    for p in placements:
        fast = simulate(g, c, p)
        sched = schedule(g, c, p)
        doc = chrome_trace(g, c, p)
        ev = doc["traceEvents"]
        assert doc["otherData"]["step_time_s"] == fast.step_time_s == sched.step_time_s
        assert doc["otherData"]["status"] == fast.status
        # each device's memory series peaks at the engine's peak memory, starting from its resident bytes
        series = memory_series(sched)
        resident = np.bincount(np.asarray(p), weights=g.arrays.param_bytes, minlength=c.num_devices)
        assert sched.resident_bytes.tolist() == resident.tolist()
        for d, points in enumerate(series):
            assert points[0][0] == 0.0 and points[0][1] >= resident[d]  # what starts at 0 is allocated at 0
            assert max(b for _, b in points) == fast.peak_memory_bytes[d]
            assert all(t0 < t1 and b0 != b1 for (t0, b0), (t1, b1) in zip(points, points[1:], strict=False))
        # every op once, on its device; transfers carry the engine's bytes per channel, one at a time
        compute = [e for e in ev if e["ph"] in ("X", "i") and e["cat"] != "transfer"]
        assert all((e["ph"], e["tid"]) == ("X", 0) and e["dur"] > 0 or (e["ph"], e["tid"]) == ("i", 1 + c.num_devices)
                   for e in compute)
        # times are whole nanoseconds, and slices on one track never overlap once a viewer reads them as such
        track = defaultdict(list)
        for e in ev:
            if e["ph"] != "M":
                assert abs(e["ts"] * 1000 - round(e["ts"] * 1000)) < 1e-6
            if e["ph"] == "X":
                track[(e["pid"], e["tid"])].append((round(e["ts"] * 1000), round(e["dur"] * 1000)))
        for slices in track.values():
            slices.sort()
            assert all(a + d <= b for (a, d), (b, _) in zip(slices, slices[1:], strict=False))
        assert sorted((e["name"], e["pid"]) for e in compute) == sorted((op.name, int(d)) for op, d in zip(g.ops, p, strict=True))
        link = np.zeros((c.num_devices, c.num_devices), dtype=np.int64)
        for e in ev:
            if e.get("cat") == "transfer":
                dst = int(e["args"]["to"][1:])  # devices d0, d1, ...
                assert e["tid"] == (1 + dst if e["ph"] == "X" else 2 + c.num_devices + dst)
                link[e["pid"], dst] += e["args"]["bytes"]
        assert link.tolist() == fast.link_bytes.tolist()
        spans = defaultdict(list)  # in seconds, as the schedule has them (microseconds round)
        for _, src, dst, start, end, _ in sched.transfers:
            spans[(src, dst)].append((start, end))
        for channel in spans.values():
            assert all(a[1] <= b[0] for a, b in zip(channel, channel[1:], strict=False))


def test_a_trace_with_profiles_says_which_op_times_are_measured(uniform_cluster):
    """A profile of b alone (3 s on the GPUs): the chain's trace read like a fully profiled step. Each op's
    slice says where its time came from, and otherData how many ops and seconds of compute were measured:
    a [0, 2] and c [5, 6] are roofline estimates, b [2, 5] the profile's; 1 of 3 ops, 3 of 6 s."""
    from suite.costmodel import Profile

    g, c = _chain(), uniform_cluster(2)
    doc = chrome_trace(g, c, [0, 0, 0], profiles=[Profile("chain", "gpu", {"b": 3.0})])
    ops = {e["name"]: (e["ts"], e["dur"], e["args"]["time"]) for e in doc["traceEvents"] if e["ph"] == "X"}
    assert ops == {"a": (0.0, 2e6, "roofline"), "b": (2e6, 3e6, "profile"), "c": (5e6, 1e6, "roofline")}
    assert doc["otherData"]["profiles"] == {"files": ["(not from a file)"], "ops": 1, "of_ops": 3,
                                            "compute_s": 3.0, "of_compute_s": 6.0}
    plain = chrome_trace(g, c, [0, 0, 0])  # without profiles, as before: no such argument
    assert "profiles" not in plain["otherData"]
    assert all("time" not in e["args"] for e in plain["traceEvents"] if e["ph"] == "X")


def test_a_peak_equal_to_the_capacity_fits_and_each_device_keeps_its_own_busy_time(uniform_cluster):
    """The chain's d0 peaks at 1570 bytes on one device: with exactly 1570 bytes the trace says "ok", as
    `simulate` does (only a peak above the capacity is OOM). Across two devices (latency 0.5 s) d0 computes
    a and c (2 + 1 s), d1 b (4 s): busy times stay with their device, and the devices keep their order."""
    g = _chain()
    fits = uniform_cluster(2, memory_bytes=1570)
    doc = chrome_trace(g, fits, [0, 0, 0])
    assert doc["otherData"]["peak_memory_bytes"]["d0"] == 1570
    assert doc["otherData"]["status"] == "ok" == simulate(g, fits, [0, 0, 0]).status
    doc = chrome_trace(g, uniform_cluster(2, latency_s=0.5), [0, 1, 0])
    assert doc["otherData"]["busy_s"] == {"d0": 3.0, "d1": 4.0}
    order = [(e["pid"], e["args"]["sort_index"]) for e in doc["traceEvents"] if e["name"] == "process_sort_index"]
    assert order == [(0, 0), (1, 1)]


def test_a_profile_given_twice_is_listed_once(uniform_cluster):
    """As in the cost model, a profile given twice counts once: one file in otherData, 1 of 3 ops measured."""
    from suite.costmodel import Profile

    g, c = _chain(), uniform_cluster(2)
    b = Profile("chain", "gpu", {"b": 3.0})
    doc = chrome_trace(g, c, [0, 0, 0], profiles=[b, b])
    assert doc["otherData"]["profiles"] == {"files": ["(not from a file)"], "ops": 1, "of_ops": 3,
                                            "compute_s": 3.0, "of_compute_s": 6.0}
