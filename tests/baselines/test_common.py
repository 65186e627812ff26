"""The shared helpers: contraction of colocation groups, kinds, integer weights, kind repair."""

from __future__ import annotations

import numpy as np
import pytest

from baselines import _common
from suite.errors import PlacementError
from suite.graph import Op, OpGraph


def grouped_graph() -> OpGraph:
    """a, b in group g; c alone; d in group h. Edges a->b (10 B), a->c (20), b->c (5), c->d (7), b->d (1)."""
    ops = [
        Op("a", "x", output_bytes=1, group="g", flops=1.0),
        Op("b", "x", output_bytes=1, group="g", flops=2.0),
        Op("c", "x", output_bytes=1, flops=4.0, allowed_kinds=("gpu",)),
        Op("d", "x", output_bytes=1, group="h", flops=8.0, allowed_kinds=("cpu",)),
    ]
    edges = [("a", "b", 10), ("a", "c", 20), ("b", "c", 5), ("c", "d", 7), ("b", "d", 1)]
    return OpGraph.build("grouped", ops, edges)


def test_contract_nodes_and_summed_edges():
    con = _common.contract(grouped_graph())
    assert con.num_nodes == 3
    assert con.node_of_op.tolist() == [0, 0, 1, 2]
    assert [m.tolist() for m in con.members] == [[0, 1], [2], [3]]
    u, v, nbytes = con.edges
    assert list(zip(u.tolist(), v.tolist(), nbytes.tolist(), strict=True)) == [(0, 1, 25.0), (0, 2, 1.0), (1, 2, 7.0)]
    assert con.node_sum(np.array([1.0, 2.0, 4.0, 8.0])).tolist() == [3.0, 4.0, 8.0]


def test_edges_count_the_bytes_a_later_node_sends_to_an_earlier_one():
    """A training graph's gradients flow back: b1 (node 1, with f1) sends 20 B to b0 (node 0, with f0). The
    undirected node edge holds both directions, 10 + 20 B (the partitioners' weight of cutting it)."""
    ops = [Op("f0", "x", output_bytes=1, group="l0"), Op("f1", "x", output_bytes=1, group="l1"),
           Op("b1", "x", output_bytes=1, group="l1"), Op("b0", "x", output_bytes=1, group="l0")]
    g = OpGraph.build("back", ops, [("f0", "f1", 10), ("f1", "b1", 5), ("b1", "b0", 20), ("f0", "b0", 3)])
    con = _common.contract(g)
    assert con.node_of_op.tolist() == [0, 1, 1, 0]
    u, v, nbytes = con.edges
    assert list(zip(u.tolist(), v.tolist(), nbytes.tolist(), strict=True)) == [(0, 1, 30.0)]


def test_csr_is_symmetric_and_sorted():
    con = _common.contract(grouped_graph())
    xadj, adj, w = con.csr(np.array([25, 1, 7]))
    assert xadj.tolist() == [0, 2, 4, 6]
    assert adj.tolist() == [1, 2, 0, 2, 0, 1]
    assert w.tolist() == [25, 1, 25, 7, 1, 7]


def test_expand_and_restrict_round_trip():
    con = _common.contract(grouped_graph())
    p = con.expand(np.array([2, 0, 1]))
    assert p.tolist() == [2, 2, 0, 1]
    assert con.restrict(p).tolist() == [2, 0, 1]


def test_allowed_nodes_intersects_kinds(make_cluster):
    con = _common.contract(grouped_graph())
    allowed = _common.allowed_nodes(con, make_cluster(2))  # cpu:0, gpu:0, gpu:1
    assert allowed.tolist() == [[True, True, True], [False, True, True], [True, False, False]]


def test_allowed_nodes_rejects_a_kind_the_cluster_lacks(make_cluster):
    con = _common.contract(grouped_graph())
    with pytest.raises(PlacementError, match="'d'.*cpu"):
        _common.allowed_nodes(con, make_cluster(2, cpu=False))


def test_enforce_kinds_moves_to_the_neighbour_with_most_bytes(make_cluster):
    cluster = make_cluster(2)
    con = _common.contract(grouped_graph())
    allowed = _common.allowed_nodes(con, cluster)
    # node 1 (c, GPU-only) on the CPU: its neighbours are node 0 (25 B, on gpu:1) and node 2 (7 B, on CPU)
    fixed, moved = _common.enforce_kinds(np.array([2, 0, 0]), con, allowed, _common.speed_order(cluster))
    assert fixed.tolist() == [2, 2, 0] and moved == 1
    # already valid: unchanged
    same, moved = _common.enforce_kinds(np.array([1, 2, 0]), con, allowed)
    assert same.tolist() == [1, 2, 0] and moved == 0


def test_scale_to_int_keeps_proportions_and_minimum():
    w = _common.scale_to_int(np.array([0.0, 1.0, 3.0]), total=400)
    assert w.tolist() == [1, 100, 300]
    assert _common.scale_to_int(np.zeros(3)).tolist() == [1, 1, 1]


def test_device_speeds_are_relative_to_the_reference(make_cluster):
    cost = np.array([[10.0, 1.0, 2.0], [10.0, 1.0, 2.0]])
    assert _common.device_speeds(cost, [0, 1, 2], ref=1).tolist() == [0.1, 1.0, 0.5]


def test_device_speeds_a_device_that_takes_0_s_is_the_fastest():
    # totals 0, 2, 4 s with ref 1: device 0 runs the workload in no time, so it is the fastest and ref and
    # device 2 are 0 relative to it (they were 1.0 and 0.5, device 0 as fast as ref)
    cost = np.array([[0.0, 1.0, 2.0], [0.0, 1.0, 2.0]])
    assert _common.device_speeds(cost, [0, 1, 2], ref=1).tolist() == [1.0, 0.0, 0.0]
    # two 0 s devices are equally fast
    assert _common.device_speeds(np.array([[0.0, 3.0, 0.0]]), [0, 1, 2], ref=1).tolist() == [1.0, 0.0, 1.0]
    # ref itself 0 s: the same rule, as before
    assert _common.device_speeds(np.array([[5.0, 0.0]]), [0, 1], ref=1).tolist() == [0.0, 1.0]


def test_metis_and_scotch_put_a_0_s_workload_on_the_device_that_runs_it_in_0_s():
    """40 ops of 0 FLOPs and 0 bytes in a chain: gpu:0 has a 10 us op overhead, gpu:1 none, so gpu:1 runs
    the graph in 0 s. Both partitioners split it 20 + 20 while gpu:1 counted as fast as gpu:0."""
    from baselines.metis import Metis
    from baselines.scotch import Scotch
    from suite.cluster import Cluster, Device, Link
    from suite.methodology import Budget
    from suite.placer import Problem

    devs = tuple(Device(f"gpu:{k}", "gpu", peak_flops=1e10, mem_bandwidth=1e9, memory_bytes=2**30,
                        op_overhead_s=o) for k, o in enumerate((1e-5, 0.0)))
    cluster = Cluster(name="zero", devices=devs, links=(Link(("gpu:0", "gpu:1"), bandwidth=1e9, latency_s=0.0),))
    ops = [Op(f"o{i}", "x", output_bytes=0, flops=0.0) for i in range(40)]
    graph = OpGraph.build("zero", ops, [(f"o{i}", f"o{i + 1}", 0) for i in range(39)])
    problem = Problem.make(graph, cluster, Budget())
    assert problem.costs().sum(axis=0).tolist() == [pytest.approx(4e-4), 0.0]
    for placer in (Metis(), Scotch()):
        assert placer.place(problem, Budget(), 0).placement.tolist() == [1] * 40, placer.name


def test_library_seed_refuses_a_negative_seed():
    # abs() gave seed -3 the partition of seed 3; the suite accepts only seeds in [0, 2**32)
    from suite.errors import SpecError
    from suite.methodology import check_seeds

    for bad in (-3, -1):
        with pytest.raises(ValueError, match=rf"seed {bad} is negative"):
            _common.library_seed(bad)
    with pytest.raises(SpecError, match=r"integers in \[0, 2\*\*32\)"):
        check_seeds("seeds", [-3])


def test_library_seed_keeps_the_values_of_the_suites_seeds():
    # the committed results' seeds 0, 1, 2 hash to these (as before negative seeds were refused)
    assert [_common.library_seed(s) for s in (0, 1, 2)] == [1484405855, 917752063, 1417063493]
    assert _common.library_seed(2**32 - 1) < 2**31


def test_scale_to_int_rounds_to_nearest():
    # 1 and 2 of 3, total 4: 1.33 -> 1, 2.67 -> 3 (rounded, not truncated)
    assert _common.scale_to_int(np.array([1.0, 2.0]), total=4).tolist() == [1, 3]


def test_reference_device_and_speed_order_use_effective_flops():
    from suite.cluster import Cluster, Device, Link

    devs = (Device("cpu:0", "cpu", peak_flops=1e9, mem_bandwidth=1e9, memory_bytes=2**30, op_overhead_s=0.0),
            # a higher peak but 25% efficiency: 5e9 effective FLOP/s
            Device("gpu:0", "gpu", peak_flops=2e10, compute_efficiency=0.25, mem_bandwidth=1e9, memory_bytes=2**30,
                   op_overhead_s=0.0),
            Device("gpu:1", "gpu", peak_flops=1e10, mem_bandwidth=1e9, memory_bytes=2**30, op_overhead_s=0.0),
            Device("gpu:2", "gpu", peak_flops=1e10, mem_bandwidth=1e9, memory_bytes=2**30, op_overhead_s=0.0))
    c = Cluster("eff", devs, (Link(tuple(d.name for d in devs), bandwidth=1e9, latency_s=0.0),))
    assert _common.reference_device(c, [1, 2, 3]) == 2  # 1e10 effective beats 5e9; gpu:1 before its twin gpu:2
    assert _common.reference_device(c, [3, 2]) == 2  # ties go to the lowest index, whatever the list order
    assert _common.speed_order(c).tolist() == [2, 3, 1, 0]  # fastest first, ties by index


def test_enforce_kinds_ties_follow_the_speed_rank():
    """An isolated node on a forbidden device: no neighbour bytes, so the preference order decides."""
    con = _common.contract(OpGraph.build("one", [Op("x", "x", output_bytes=1)], []))
    allowed = np.array([[True, True, False]])
    # rank [1, 2, 0]: device 1 is the fastest, device 0 the slowest
    fixed, moved = _common.enforce_kinds(np.array([2]), con, allowed, np.array([1, 2, 0]))
    assert fixed.tolist() == [1] and moved == 1
    fixed, _ = _common.enforce_kinds(np.array([2]), con, allowed)  # no rank: lowest index
    assert fixed.tolist() == [0]


def test_enforce_kinds_sees_the_nodes_it_already_moved():
    """n0 -(100 B)- n1 -(1 B)- n2. n0 and n1 sit on device 2, which they forbid; n2 is on device 1. n0 moves
    first (tie: device 0); n1 then follows n0 to device 0 (100 B) rather than n2 to device 1 (1 B)."""
    g = OpGraph.build("chain", [Op(f"n{i}", "x", output_bytes=100) for i in range(3)], [("n0", "n1", 100), ("n1", "n2", 1)])
    con = _common.contract(g)
    allowed = np.array([[True, True, False], [True, True, False], [True, True, True]])
    fixed, moved = _common.enforce_kinds(np.array([2, 2, 1]), con, allowed)
    assert fixed.tolist() == [0, 0, 1] and moved == 2


def test_enforce_kinds_weighs_neighbours_by_bytes_not_by_count():
    """x sits on device 2, which it forbids; it sends 100 B to a (device 1) and 1 B each to b and c (device 0):
    100 B outweigh two neighbours, so x goes to device 1 (counting neighbours would pick device 0)."""
    ops = [Op(n, "x", output_bytes=100) for n in ("x", "a", "b", "c")]
    con = _common.contract(OpGraph.build("star", ops, [("x", "a", 100), ("x", "b", 1), ("x", "c", 1)]))
    names = [con.graph.ops[i].name for i in con.first_op]
    where = {"x": 2, "a": 1, "b": 0, "c": 0}
    allowed = np.array([[True, True, name != "x"] for name in names])
    fixed, moved = _common.enforce_kinds(np.array([where[n] for n in names]), con, allowed)
    assert dict(zip(names, fixed.tolist(), strict=True)) == {**where, "x": 1} and moved == 1


def test_problem_costs_use_the_evaluators_profiles(make_cluster):
    from suite.costmodel import Profile
    from suite.placer import Problem

    g, cluster = grouped_graph(), make_cluster(2)
    p = Problem.make(g, cluster, profiles=[Profile(workload="grouped", applies_to="gpu:1", op_times_s={"c": 0.5})])
    cost = p.costs()
    assert cost[2, 2] == 0.5 and cost[2, 1] == pytest.approx(4.0 / 1e10)  # measured on gpu:1, estimated on gpu:0


def test_a_node_that_allows_no_device_is_named_by_the_op_that_narrows_it(make_cluster):
    """Group g: a allows any kind, b only GPUs; on a CPU-only cluster the message names b and its kind,
    not a (which allows every kind)."""
    ops = [Op("a", "x", flops=1.0, group="g"), Op("b", "x", flops=1.0, group="g", allowed_kinds=("gpu",))]
    con = _common.contract(OpGraph.build("narrowed", ops, [("a", "b")]))
    with pytest.raises(PlacementError, match=r"op 'b' \(group 'g'\) allows only gpu device kinds"):
        _common.allowed_nodes(con, make_cluster(0))


def test_gpus_or_all_is_every_device_of_a_cluster_without_gpus(make_cluster):
    """Two CPUs and no GPU: the GPU-only placers (mincut, metis include_cpu=False) get both CPUs, not one."""
    from suite.cluster import Cluster, Device, Link

    devs = tuple(Device(f"cpu:{k}", "cpu", peak_flops=1e9, mem_bandwidth=1e9, memory_bytes=2**30, op_overhead_s=0.0)
                 for k in range(2))
    cpus = Cluster("cpus", devs, (Link(("cpu:0", "cpu:1"), bandwidth=1e9, latency_s=0.0),))
    assert _common.gpus_or_all(cpus) == [0, 1]
    assert _common.gpus_or_all(make_cluster(2)) == [1, 2]


def test_scale_to_int_of_all_zeros_is_all_ones_even_with_minimum_zero():
    """No proportions to keep: equal weights of 1 (METIS and Scotch refuse edge weights of 0)."""
    assert _common.scale_to_int(np.zeros(2), minimum=0).tolist() == [1, 1]
    assert _common.scale_to_int(np.array([0.0, 2.0]), total=10, minimum=0).tolist() == [0, 10]
