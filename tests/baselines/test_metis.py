"""METIS: k-way parts in proportion to device speed, seeded, kinds and colocation honoured, memory ignored."""

from __future__ import annotations

import numpy as np
import pytest

from baselines.metis import Metis, metis_parts
from suite.graph import Op, OpGraph
from suite.methodology import Budget
from suite.placement import validate

MB = 10**6


def test_valid_on_random_graphs_with_groups_and_kinds(random_graph, make_problem, haswell_4k80):
    for seed in range(4):
        g = random_graph(200, seed, groups=True, kinds=True)
        p = make_problem(g, haswell_4k80)
        r = Metis().place(p, Budget(), seed)
        validate(r.placement, g, haswell_4k80)
        assert r.evaluations == 0


def test_same_seed_same_placement(random_graph, make_problem, haswell_2k80):
    g = random_graph(1500, 3)
    runs = [Metis().place(make_problem(g, haswell_2k80), Budget(), s).placement for s in (1, 2, 1)]
    assert np.array_equal(runs[0], runs[2])
    assert len({Metis().place(make_problem(g, haswell_2k80), Budget(), s).placement.tobytes() for s in range(4)}) > 1


def test_the_suites_seeds_give_distinct_partitions(make_problem, haswell_4k80):
    """Seeds 0, 1, 2 (the full suite's) are three runs, not two: METIS maps seeds 0 and 1 alike, so they are
    hashed first."""
    from suite import load_workload

    g = load_workload("nmt-2x1024-b64")
    runs = {Metis().place(make_problem(g, haswell_4k80), Budget(), s).placement.tobytes() for s in (0, 1, 2)}
    assert len(runs) == 3


def test_parts_follow_device_speed(random_graph, make_problem, make_cluster):
    cluster = make_cluster(2, cpu_flops=1e9, gpu_flops=1e10)
    g = random_graph(2000, 5)
    r = Metis().place(make_problem(g, cluster), Budget(), 0)
    flops = g.arrays.flops
    share = np.bincount(r.placement, weights=flops, minlength=3) / flops.sum()
    np.testing.assert_allclose(share, [1 / 21, 10 / 21, 10 / 21], atol=0.03)


def test_gpu_only_variant(random_graph, make_problem, make_cluster):
    cluster = make_cluster(2)
    r = Metis(include_cpu=False).place(make_problem(random_graph(300, 1), cluster), Budget(), 0)
    assert set(r.placement.tolist()) == {1, 2}


def test_kind_constraints_are_honoured(make_problem, make_cluster, random_graph):
    cluster = make_cluster(2)
    g = random_graph(300, 7, kinds=True)
    r = Metis().place(make_problem(g, cluster), Budget(), 0)
    for i, op in enumerate(g.ops):
        if op.allowed_kinds:
            assert cluster.devices[r.placement[i]].kind in op.allowed_kinds


def test_memory_is_ignored_oom_stays_oom(make_problem, make_cluster, random_graph):
    cluster = make_cluster(2, gpu_memory_bytes=2**20)
    p = make_problem(random_graph(300, 8), cluster)
    r = Metis().place(p, Budget(), 0)
    assert p.evaluator.measure(r.placement).status == "oom"


def test_vertex_weights_are_compute_times(make_problem, make_cluster):
    """A chain o0..o7 on two equal GPUs, o0 with 3x the FLOPs of the others: equal compute halves are
    o0..o2 (3+1+1) and o3..o7 (5x1), not four ops each."""
    ops = [Op(f"o{i}", "x", flops=3e9 if i == 0 else 1e9, output_bytes=10) for i in range(8)]
    g = OpGraph.build("chain", ops, [(f"o{i}", f"o{i + 1}") for i in range(7)])
    cluster = make_cluster(2, cpu=False)
    for seed in range(4):
        r = Metis().place(make_problem(g, cluster), Budget(), seed)
        assert r.placement.tolist() == [0, 0, 0, 1, 1, 1, 1, 1]


def test_edge_weights_are_bytes(make_problem, make_cluster):
    """A ring a-b-c-d-e-f-a of equal ops, every edge 1 MB except c->d (1 byte): the halves are cut at c->d
    (and f-a): {a, b, c} on one GPU, {d, e, f} on the other."""
    ops = [Op(k, "x", flops=1e9, output_bytes=MB) for k in "abcdef"]
    g = OpGraph.build("ring", ops, [("a", "b"), ("b", "c"), ("c", "d", 1), ("d", "e"), ("e", "f"), ("a", "f")])
    cluster = make_cluster(2, cpu=False)
    for seed in range(4):
        placement = Metis().place(make_problem(g, cluster), Budget(), seed).placement.tolist()
        assert len(set(placement[:3])) == len(set(placement[3:])) == 1 and placement[0] != placement[3], placement


def test_fewer_ops_than_devices_go_to_the_fastest(make_problem, make_cluster):
    """Two ops, three devices: the GPUs (1e10 FLOP/s) get one op each, the CPU (1e9 FLOP/s) none."""
    g = OpGraph.build("two", [Op("a", "x", flops=1e9, output_bytes=MB), Op("b", "x", flops=1e9, output_bytes=MB)],
                      [("a", "b")])
    r = Metis().place(make_problem(g, make_cluster(2)), Budget(), 0)
    assert sorted(r.placement.tolist()) == [1, 2]


def test_fewer_vertices_than_parts_fill_the_largest_shares():
    """Two vertices, three parts of shares 1:3:2: the heavier vertex gets the largest share, the other the
    second largest."""
    parts = metis_parts(np.array([0, 1, 2]), np.array([1, 0]), np.array([1, 5]), np.array([1, 1]),
                        np.array([1.0, 3.0, 2.0]), seed=0)
    assert parts.tolist() == [2, 1]
    # as many vertices as parts: one each, the heavier in the larger share (METIS itself puts both in part 0)
    parts = metis_parts(np.array([0, 1, 2]), np.array([1, 0]), np.array([1, 5]), np.array([1, 1]),
                        np.array([0.7, 0.3]), seed=0)
    assert parts.tolist() == [1, 0]


def test_two_clusters_joined_by_one_edge_are_cut_there():
    """Two 5-cliques joined by a single light edge: the 2-way cut is that edge."""
    edges = [(a, b) for base in (0, 5) for a in range(base, base + 5) for b in range(a + 1, base + 5)] + [(4, 5)]
    adj: list[list[int]] = [[] for _ in range(10)]
    for a, b in edges:
        adj[a].append(b)
        adj[b].append(a)
    xadj = np.cumsum([0] + [len(r) for r in adj])
    adjncy = np.array([b for r in adj for b in sorted(r)])
    ew = np.array([1 if {a, b} == {4, 5} else 10 for a, r in enumerate(adj) for b in sorted(r)])
    parts = metis_parts(xadj, adjncy, np.ones(10), ew, np.array([1.0, 1.0]), seed=0)
    assert len(set(parts[:5].tolist())) == 1 and len(set(parts[5:].tolist())) == 1 and parts[0] != parts[5]


def test_as_many_vertices_as_parts_go_by_speed_not_one_each():
    """Five equal vertices on a CPU of share 0.1 and four GPUs of share 1: one vertex each would give the
    slow CPU one (10 units of time); by load per share the fifth goes to a GPU (2 units)."""
    xadj = np.zeros(6, dtype=np.int64)
    parts = metis_parts(xadj, np.array([], dtype=np.int64), np.ones(5), np.array([], dtype=np.int64),
                        np.array([0.1, 1.0, 1.0, 1.0, 1.0]), seed=0)
    assert parts.tolist() == [1, 2, 3, 4, 1]


@pytest.mark.parametrize("k", [1, 3])
def test_tiny_graphs(k):
    parts = metis_parts(np.array([0, 1, 2]), np.array([1, 0]), np.array([5, 1]), np.array([1, 1]), np.ones(k), 0)
    assert parts.tolist() == ([0, 0] if k == 1 else [0, 1])


@pytest.mark.parametrize("recursive", [False, True])
def test_the_recursive_parameter_picks_metis_routine(recursive, monkeypatch, random_graph, make_problem, haswell_4k80):
    """k-way (the default) or recursive bisection: the placer passes its choice to METIS, nothing else."""
    import baselines.metis as metis_module

    calls = []
    real = metis_module.pymetis.part_graph
    monkeypatch.setattr(metis_module.pymetis, "part_graph", lambda *a, **kw: calls.append(kw["recursive"]) or real(*a, **kw))
    problem = make_problem(random_graph(40, seed=5), haswell_4k80)
    Metis(recursive=recursive).place(problem, Budget(), seed=0)
    assert calls == [recursive]


def test_a_device_of_speed_zero_gets_no_work_instead_of_a_metis_error(make_problem):
    """Zero-FLOP, zero-byte ops take 0 s on the GPUs (no overhead) and 10 us on the CPU: the CPU's speed on this
    workload is 0, a target part weight METIS refuses ("Incorrect tpwgts"); the placer must still place."""
    from suite.cluster import Cluster, Device, Link

    cpu = Device("cpu:0", "cpu", peak_flops=1e9, mem_bandwidth=1e10, memory_bytes=2**34, op_overhead_s=1e-5)
    gpus = [Device(f"gpu:{k}", "gpu", peak_flops=1e12, mem_bandwidth=1e11, memory_bytes=2**34, op_overhead_s=0.0)
            for k in range(2)]
    cluster = Cluster("zero", (cpu, *gpus), (Link(("cpu:0", "gpu:0", "gpu:1"), bandwidth=1e9, latency_s=0.0),))
    g = OpGraph.build("zeros", [Op(f"o{i}", "reshape", flops=0.0, output_bytes=0) for i in range(12)],
                      [(f"o{i}", f"o{i + 1}") for i in range(11)])
    r = Metis().place(make_problem(g, cluster), Budget(), 0)
    assert r.info["device_speeds"][0] == 0.0
    assert set(validate(r.placement, g, cluster).tolist()) <= {1, 2}


def _flush_c_stdout() -> None:
    import ctypes

    ctypes.CDLL(None).fflush(None)  # METIS's printf output sits in C's buffer until flushed


_PRINTING_CALL = """
import json, sys
import numpy as np
from baselines.metis import metis_parts
xadj, adjncy = np.array([0, 0, 1, 1, 2, 3, 4, 4]), np.array([5, 4, 3, 1])
vw = np.array([277, 954, 218, 796, 345, 671, 651])
said = [] if sys.argv[1] == "list" else None
parts = metis_parts(xadj, adjncy, vw, np.ones(4, dtype=np.int64), np.array([1.0, 0.0, 0.0]), 0, recursive=True,
                    messages=said)
print(json.dumps([parts.tolist(), said]), file=sys.stderr)
"""


@pytest.mark.parametrize("messages", ["list", "none"])
def test_what_metis_prints_is_caught_not_written_to_stdout(messages):
    """Recursive bisection of 7 uneven vertices into shares 1:0:0 makes METIS print (C printf, to stdout) that
    it cannot bisect an empty part: the lines go to `messages` (dropped without a list), not into the
    command's stdout (--json). In a process of its own, with stdout a pipe and C's stdio buffered (not
    PYTHONUNBUFFERED), as in a run: the buffered lines came out when the process ended."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", _PRINTING_CALL, messages], capture_output=True, text=True,
                          env=env, check=True)
    assert done.stdout == ""
    parts, said = json.loads(done.stderr.strip().splitlines()[-1])
    assert parts == [0] * 7  # the partition is still METIS's
    if messages == "list":
        assert said == ["***Cannot bisect a graph with 0 vertices!",
                        "***You are trying to partition a graph into too many parts!"]
    else:
        assert said is None and "Cannot bisect" not in done.stderr


def test_the_placer_reports_what_metis_printed(monkeypatch, random_graph, make_problem, haswell_4k80, capfd):
    import ctypes

    import baselines.metis as metis_module

    real = metis_module.pymetis.part_graph

    def printing(*a, **kw):
        for text in (b"***METIS says this\n", b"***and this\n", b"***METIS says this\n"):
            ctypes.CDLL(None).printf(text)
        return real(*a, **kw)

    problem = make_problem(random_graph(40, seed=5), haswell_4k80)
    assert "metis_messages" not in Metis().place(problem, Budget(), seed=0).info
    monkeypatch.setattr(metis_module.pymetis, "part_graph", printing)
    r = Metis().place(problem, Budget(), seed=0)
    _flush_c_stdout()
    assert capfd.readouterr().out == ""
    assert r.info["metis_messages"] == ["***METIS says this", "***and this"]  # each distinct line once


@pytest.mark.parametrize("cpu_last", [False, True])
def test_what_metis_is_handed_by_hand(cpu_last, monkeypatch, make_problem):
    """The inputs of tests/baselines/test_scotch.py's hand-made case: node weights = times on the fastest
    device gpu:1 (0.2, 0.2, 0.4 s; on the CPU c is memory-bound), wherever the CPU is in the device list;
    edge weights = bytes (32, 16, 16 of 64); part shares = speeds on this workload (CPU 0.025, gpu:0 0.5)."""
    import baselines.metis as metis_module

    from .test_scotch import heterogeneous_cluster, scotch_inputs_graph

    seen = {}

    def fake_metis_parts(xadj, adjncy, vw, ew, shares, seed, recursive=False, messages=None):
        seen.update(adjncy=adjncy.tolist(), vw=vw.tolist(), ew=ew.tolist(), shares=shares.tolist(), seed=seed)
        return np.zeros(len(xadj) - 1, dtype=np.int64)  # every node in part 0

    monkeypatch.setattr(metis_module, "metis_parts", fake_metis_parts)
    r = Metis().place(make_problem(scotch_inputs_graph(), heterogeneous_cluster(cpu_last)), Budget(), 5)
    assert seen["vw"] == [2**26, 2**26, 2**27] and seen["seed"] == 5
    assert seen["adjncy"] == [1, 2, 0, 2, 0, 1] and seen["ew"] == [2**27, 2**26, 2**27, 2**26, 2**26, 2**26]
    assert seen["shares"] == ([0.5, 1.0, 0.025] if cpu_last else [0.025, 0.5, 1.0])
    if cpu_last:  # part 0 is gpu:0, which d allows
        assert r.placement.tolist() == [0, 0, 0, 0] and r.info["kind_moves"] == 0
    else:  # part 0 is the CPU; d (GPU only, neighbours all on the CPU) goes to the fastest GPU, gpu:1
        assert r.placement.tolist() == [0, 0, 0, 2] and r.info["kind_moves"] == 1


def test_fewer_vertices_than_parts_ties_go_to_the_larger_share():
    """Two vertices of weight 1, shares 1 and 0.5: the first goes to part 0 (ends at 1 against 2); the second
    ends at 2 on either part, and the tie goes to the larger share."""
    parts = metis_parts(np.array([0, 1, 2]), np.array([1, 0]), np.array([1, 1]), np.array([1, 1]),
                        np.array([1.0, 0.5]), seed=0)
    assert parts.tolist() == [0, 0]


def test_pymetis_is_handed_shares_that_sum_to_one():
    """pymetis warns (DeprecationWarning) on target part weights that do not sum to 1 and will stop
    normalising them itself; speeds are handed over normalised."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        parts = metis_parts(np.array([0, 1, 3, 4]), np.array([1, 0, 2, 1]), np.array([1, 1, 1]), np.ones(4),
                            np.array([0.1, 1.0]), seed=0)
    assert len(parts) == 3


def test_messages_already_in_the_list_are_not_added_again(capfd):
    """Two calls that make METIS print the same two lines, into one list: each line is in it once."""
    xadj, adjncy = np.array([0, 0, 1, 1, 2, 3, 4, 4]), np.array([5, 4, 3, 1])
    vw = np.array([277, 954, 218, 796, 345, 671, 651])
    said: list[str] = []
    for _ in range(2):
        metis_parts(xadj, adjncy, vw, np.ones(4, dtype=np.int64), np.array([1.0, 0.0, 0.0]), 0, recursive=True,
                    messages=said)
    _flush_c_stdout()
    assert capfd.readouterr().out == ""
    assert said == ["***Cannot bisect a graph with 0 vertices!",
                    "***You are trying to partition a graph into too many parts!"]


def test_fewer_vertices_than_parts_leave_a_part_of_share_zero_empty():
    """Shares 1 and 0 (a device of speed 0): both vertices go to part 0, though part 1 would end lower by
    load alone."""
    parts = metis_parts(np.array([0, 1, 2]), np.array([1, 0]), np.array([5, 1]), np.array([1, 1]),
                        np.array([1.0, 0.0]), seed=0)
    assert parts.tolist() == [0, 0]


def test_pymetis_takes_weights_past_32_bits():
    """The module docstring's claim: this pymetis's idx_t is 64-bit. A ring of 40 vertices of 2^33 each
    (total 2^38.3) is split 20 + 20, not garbled by overflow."""
    n = 40
    xadj = np.arange(0, 2 * n + 1, 2)
    adjncy = np.array([x for i in range(n) for x in sorted(((i - 1) % n, (i + 1) % n))])
    parts = metis_parts(xadj, adjncy, np.full(n, 2**33), np.ones(2 * n, dtype=np.int64), np.array([1.0, 1.0]), 0)
    assert np.bincount(parts, minlength=2).tolist() == [20, 20]
