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
