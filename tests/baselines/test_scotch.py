"""The Scotch placer: valid, seeded, device weights follow speed, kinds and colocation honoured, memory ignored."""

from __future__ import annotations

import numpy as np
import pytest

from baselines import _common
from baselines.scotch import Scotch, link_costs, target_weights
from suite.methodology import Budget
from suite.placement import validate


def test_valid_on_random_graphs_with_groups_and_kinds(random_graph, make_problem, haswell_2k80):
    for seed in range(4):
        g = random_graph(200, seed, groups=True, kinds=True)
        p = make_problem(g, haswell_2k80)
        r = Scotch().place(p, Budget(), seed)
        validate(r.placement, g, haswell_2k80)  # kinds and colocation
        assert r.evaluations == 0 and p.evaluator.evaluations_used == 0


def test_same_seed_same_placement(random_graph, make_problem, haswell_2k80):
    g = random_graph(1500, 3)
    runs = [Scotch().place(make_problem(g, haswell_2k80), Budget(), s).placement for s in (1, 2, 1)]
    assert np.array_equal(runs[0], runs[2])
    assert len({Scotch().place(make_problem(g, haswell_2k80), Budget(), s).placement.tobytes() for s in range(4)}) > 1


def test_load_follows_device_speed(random_graph, make_problem, make_cluster):
    """CPU 10x slower than each of two GPUs: the CPU gets about 1/21 of the work, each GPU 10/21."""
    cluster = make_cluster(2, cpu_flops=1e9, gpu_flops=1e10)
    g = random_graph(2000, 5)
    p = make_problem(g, cluster)
    r = Scotch().place(p, Budget(), 0)
    flops = g.arrays.flops
    share = np.bincount(r.placement, weights=flops, minlength=3) / flops.sum()
    np.testing.assert_allclose(share, [1 / 21, 10 / 21, 10 / 21], atol=0.03)
    assert r.info["device_speeds"] == pytest.approx([0.1, 1.0, 1.0])


def test_kind_constraints_are_honoured(make_problem, make_cluster, random_graph):
    cluster = make_cluster(2)
    g = random_graph(300, 7, kinds=True)
    r = Scotch().place(make_problem(g, cluster), Budget(), 0)
    for i, op in enumerate(g.ops):
        if op.allowed_kinds:
            assert cluster.devices[r.placement[i]].kind in op.allowed_kinds


def test_memory_is_ignored_oom_stays_oom(make_problem, make_cluster, random_graph):
    """GPUs with 1 MiB: Scotch still puts most work on them; the evaluator reports the OOM."""
    cluster = make_cluster(2, gpu_memory_bytes=2**20)
    g = random_graph(300, 8)
    p = make_problem(g, cluster)
    r = Scotch().place(p, Budget(), 0)
    assert (r.placement > 0).mean() > 0.5
    assert p.evaluator.measure(r.placement).status == "oom"


def test_target_description_of_a_preset(haswell_4k80, make_cluster):
    # all five devices on one PCIe crossbar: every route the same cost
    costs = link_costs(haswell_4k80, list(range(5)))
    assert (costs[~np.eye(5, dtype=bool)] == 10).all() and (np.diag(costs) == 0).all()
    assert target_weights(np.array([0.25, 1.0, 1.0])).tolist() == [250, 1000, 1000]


def test_link_costs_follow_route_bandwidth():
    from suite import registry

    dgx = registry.load_cluster("dgx_a100x8")
    costs = link_costs(dgx, list(range(9)))
    assert costs[1, 2] == 10  # NVSwitch, the fastest route
    assert costs[0, 1] == 120  # PCIe 25 GB/s vs 300 GB/s NVSwitch: 12x the cost


def test_single_device_cluster(random_graph, make_problem, make_cluster):
    cluster = make_cluster(1, cpu=False)
    g = random_graph(50, 1)
    assert (Scotch().place(make_problem(g, cluster), Budget(), 0).placement == 0).all()


def test_nodes_are_colocation_groups(random_graph, make_problem, haswell_2k80):
    g = random_graph(100, 2, groups=True)
    r = Scotch().place(make_problem(g, haswell_2k80), Budget(), 0)
    assert r.info["nodes"] == _common.contract(g).num_nodes == 50


def heterogeneous_cluster(cpu_last: bool = False):
    """cpu:0 1 GFLOP/s with 1 GB/s memory; gpu:0 10 GFLOP/s and gpu:1 20 GFLOP/s (the fastest, not the first),
    memory time negligible on the GPUs; one crossbar link. `cpu_last`: the CPU is the last device, not the first."""
    from suite.cluster import Cluster, Device, Link

    devs = (Device("cpu:0", "cpu", peak_flops=1e9, mem_bandwidth=1e9, memory_bytes=2**40, op_overhead_s=0.0),
            Device("gpu:0", "gpu", peak_flops=1e10, mem_bandwidth=1e30, memory_bytes=2**40, op_overhead_s=0.0),
            Device("gpu:1", "gpu", peak_flops=2e10, mem_bandwidth=1e30, memory_bytes=2**40, op_overhead_s=0.0))
    if cpu_last:
        devs = devs[1:] + devs[:1]
    return Cluster(name="het", devices=devs, links=(Link(tuple(d.name for d in devs), bandwidth=1e9, latency_s=0.0),))


def scotch_inputs_graph():
    """Nodes: {a, b} (group g, 1e9 + 3e9 FLOPs), c (4e9 FLOPs, 2e10 B read: memory-bound on the CPU), d (8e9
    FLOPs, GPU only). Node edges: (0,1) 20+12 = 32 B, (0,2) 16 B, (1,2) 16 B; a->b (10 B) is inside the group."""
    from suite.graph import Op, OpGraph

    ops = [Op("a", "x", flops=1e9, output_bytes=32, group="g"), Op("b", "x", flops=3e9, output_bytes=32, group="g"),
           Op("c", "x", flops=4e9, bytes_read=int(2e10), output_bytes=16),
           Op("d", "x", flops=8e9, output_bytes=1, allowed_kinds=("gpu",))]
    return OpGraph.build("w", ops, [("a", "b", 10), ("a", "c", 20), ("b", "c", 12), ("c", "d", 16), ("b", "d", 16)])


@pytest.fixture
def scotch_spy(monkeypatch):
    """Replace the Scotch call: record what it is handed, map every node to terminal 0."""
    import baselines.scotch as scotch_module

    seen = {}

    def fake_map_graph(xadj, adjncy, vw, ew, tw, lc, seed=0):
        seen.update(xadj=xadj.tolist(), adjncy=adjncy.tolist(), vw=vw.tolist(), ew=ew.tolist(), tw=tw.tolist(),
                    lc=lc.tolist(), seed=seed)
        return np.zeros(len(xadj) - 1, dtype=np.int64)

    monkeypatch.setattr(scotch_module, "map_graph", fake_map_graph)
    return seen


def test_what_scotch_is_handed_by_hand(scotch_spy, make_problem):
    cluster, g = heterogeneous_cluster(), scotch_inputs_graph()
    r = Scotch().place(make_problem(g, cluster), Budget(), 5)
    seen = scotch_spy
    # node weights: time on the reference device gpu:1 (the fastest): 0.2, 0.2, 0.4 s -> 1:1:2 of 2**28
    # (on the CPU c is memory-bound, 20 s, which would give other proportions)
    assert seen["vw"] == [2**26, 2**26, 2**27]
    # edge weights: bytes 32, 16, 16 of 64 -> 2**27, 2**26, 2**26, in symmetric CSR order
    assert seen["adjncy"] == [1, 2, 0, 2, 0, 1]
    assert seen["ew"] == [2**27, 2**26, 2**27, 2**26, 2**26, 2**26]
    # target: speed = total time on gpu:1 (0.8 s) / total on the device: cpu 4+20+8 = 32 s, gpu:0 1.6 s
    assert r.info["device_speeds"] == [0.025, 0.5, 1.0] and seen["tw"] == [25, 500, 1000]
    assert seen["lc"] == [[0, 10, 10], [10, 0, 10], [10, 10, 0]] and seen["seed"] == 5
    # terminal 0 is the CPU; d (GPU only, neighbours all on the CPU) goes to the fastest GPU, gpu:1
    assert r.placement.tolist() == [0, 0, 0, 2] and r.info["kind_moves"] == 1


def test_target_weights_scale_the_fastest_device_to_1000():
    # a device may be faster on a workload than the reference (e.g. more memory bandwidth): speeds above 1
    assert target_weights(np.array([0.5, 2.0])).tolist() == [250, 1000]
    assert target_weights(np.array([1e-6, 1.0])).tolist() == [1, 1000]  # at least 1


def test_link_costs_are_rounded_to_nearest():
    from suite.cluster import Cluster, Device, Link

    devs = tuple(Device(n, k, peak_flops=1e9, mem_bandwidth=1e9, memory_bytes=2**30, op_overhead_s=0.0)
                 for n, k in (("cpu:0", "cpu"), ("gpu:0", "gpu"), ("gpu:1", "gpu")))
    c = Cluster("links", devs, (Link(("gpu:0", "gpu:1"), bandwidth=3e11, latency_s=0.0),
                                Link(("cpu:0", "gpu:0", "gpu:1"), bandwidth=7e10, latency_s=0.0)))
    # GPU pair on the 300 GB/s link: 10; CPU routes 70 GB/s: 10 * 300 / 70 = 42.86 -> 43
    assert link_costs(c, [0, 1, 2]).tolist() == [[0, 43, 43], [43, 0, 10], [43, 10, 0]]


def test_node_weights_are_times_on_the_fastest_device_not_the_last(scotch_spy, make_problem):
    """The CPU is the last device: the node weights are still the times on gpu:1 (1:1:2), not on the CPU
    (where c is memory-bound: 4, 20 and 8 s)."""
    r = Scotch().place(make_problem(scotch_inputs_graph(), heterogeneous_cluster(cpu_last=True)), Budget(), 0)
    assert scotch_spy["vw"] == [2**26, 2**26, 2**27]
    assert r.info["device_speeds"] == [0.5, 1.0, 0.025] and scotch_spy["tw"] == [500, 1000, 25]
