"""Audit additions for rl.grouping: the single-consumer rule on an op with several consumers, Grouping.check,
grouping names that are coarsening methods, and heavy-edge matching's byte weights and work cap."""

from __future__ import annotations

import pytest

from rl.grouping import (
    Grouping,
    GroupingError,
    coarsen,
    colocation_grouping,
    make_grouping,
    mirhoseini_grouping,
)
from suite import Op, OpGraph

GFLOP = 1e9


def test_single_consumer_rule_leaves_an_op_with_several_consumers_alone(branchy):
    # ops: in a1 a2 b1 b2 c1 join out. "in" feeds three ops: it stays alone; every other op has one
    # consumer and joins it, so the three branches, join and out end in one group.
    assert mirhoseini_grouping(branchy, None).assignment.tolist() == [0, 1, 1, 1, 1, 1, 1, 1]


def test_check_rejects_a_split_colocation_group_and_a_group_without_a_device_kind(train2):
    # ops: data, l0.fwd, l1.fwd, loss, l1.bwd, l1.upd, l0.bwd, l0.upd; colocation: [0, 1, 2, 3, 2, 2, 1, 1]
    colocation_grouping(train2).check(train2)
    with pytest.raises(GroupingError, match="colocation group 'l0.fwd' is split"):
        Grouping.from_labels([0, 1, 2, 3, 2, 2, 1, 4]).check(train2)  # l0.upd alone: split over 2 groups
    with pytest.raises(GroupingError, match="allows no common device kind"):
        Grouping.from_labels([0, 1, 2, 0, 2, 2, 1, 1]).check(train2)  # data (cpu only) with loss (gpu only)
    with pytest.raises(GroupingError, match="covers 7 ops"):
        Grouping.from_labels([0] * 7).check(train2)


def uneven_chain(n: int = 12) -> OpGraph:
    ops = [Op(f"o{i}", "x", flops=(1 + i % 5) * GFLOP, output_bytes=100 * (1 + (i * 7) % 13)) for i in range(n)]
    return OpGraph.build("uneven", ops, [(f"o{i}", f"o{i + 1}") for i in range(n - 1)])


@pytest.mark.parametrize("method", ["topological", "heavy_edge"])
def test_a_coarsening_method_as_grouping_name_coarsens_colocation_groups_that_way(method):
    g = uneven_chain()
    got = make_grouping(g, method, 4)
    assert got.assignment.tolist() == coarsen(g, colocation_grouping(g), 4, method=method).assignment.tolist()
    other = "heavy_edge" if method == "topological" else "topological"
    assert got.assignment.tolist() != coarsen(g, colocation_grouping(g), 4, method=other).assignment.tolist()


def test_heavy_edge_matching_weighs_pairs_by_bytes_not_by_position():
    # a -> b 10 bytes, b -> c 1000, c -> d 10; one merge to reach 3 groups: the heavy pair (b, c), although
    # (a, b) comes first by position.
    ops = [Op(n, "x", flops=1e9, output_bytes=b) for n, b in (("a", 10), ("b", 1000), ("c", 10), ("d", 0))]
    g = OpGraph.build("heavy_middle", ops, [("a", "b"), ("b", "c"), ("c", "d")])
    assert coarsen(g, colocation_grouping(g), 3, method="heavy_edge").assignment.tolist() == [0, 1, 1, 2]


def test_heavy_edge_work_cap_is_twice_the_average_target_group():
    # three equal ops to 2 groups: average target work 1.5 ops, cap 3; the heavy pair (b, c) of work 2 is
    # within the cap and merges (a cap of 1.5 would refuse it, and the topological fallback would cut [a, b | c]).
    ops = [Op(n, "x", flops=1e9, output_bytes=b) for n, b in (("a", 10), ("b", 1000), ("c", 0))]
    g = OpGraph.build("capped", ops, [("a", "b"), ("b", "c")])
    assert coarsen(g, colocation_grouping(g), 2, method="heavy_edge").assignment.tolist() == [0, 1, 1]
    assert coarsen(g, colocation_grouping(g), 2, method="topological").assignment.tolist() == [0, 0, 1]


def test_heavy_edge_work_cap_refuses_the_heaviest_pair_when_it_is_too_much_work():
    # a, b 100 GFLOP; c, d 1: 4 groups to 3, cap 2 x 202 / 3 = 134.7 GFLOP. The heaviest edge (a, b) would make
    # a group of 200: refused; the next, (b, c), of 101 merges. Without the cap a and b were merged.
    ops = [Op(n, "x", flops=f * GFLOP, output_bytes=b) for n, f, b in (("a", 100, 10**9), ("b", 100, 10),
                                                                       ("c", 1, 5), ("d", 1, 0))]
    g = OpGraph.build("capped_heavy", ops, [("a", "b"), ("b", "c"), ("c", "d")])
    assert coarsen(g, colocation_grouping(g), 3, method="heavy_edge").assignment.tolist() == [0, 1, 1, 2]


def alternating_chain(kinds: list[str]) -> OpGraph:
    """A chain o0 -> o1 -> ... whose op i allows only device kind kinds[i] (equal work)."""
    ops = [Op(f"o{i}", "matmul", flops=1e9, output_bytes=1000, allowed_kinds=(k,)) for i, k in enumerate(kinds)]
    return OpGraph.build("alternating", ops, [(f"o{i}", f"o{i + 1}") for i in range(len(kinds) - 1)])


@pytest.mark.parametrize("method", ["topological", "heavy_edge"])
def test_coarsening_reaches_max_groups_when_device_kinds_alternate(method):
    """cpu, gpu, cpu, gpu, cpu in a chain: no two neighbours may share a group, so contiguous runs need 5
    groups; coarsening to 2 used to raise GroupingError although {cpu ops} and {gpu ops} is legal."""
    g = alternating_chain(["cpu", "gpu", "cpu", "gpu", "cpu"])
    grouping = coarsen(g, colocation_grouping(g), 2, method=method)
    grouping.check(g)
    assert grouping.assignment.tolist() == [0, 1, 0, 1, 0]
    assert make_grouping(g, "mirhoseini", 2, coarsen_method=method).assignment.tolist() == [0, 1, 0, 1, 0]


def test_out_of_order_merges_pair_the_lightest_runs_of_a_kind():
    """8 alternating ops of equal work to 4 groups: the lightest compatible pair is merged first (ties: lowest
    runs), giving {o0, o2}, {o1, o3}, {o4, o6}, {o5, o7}, not one heavy group per kind."""
    g = alternating_chain(["cpu", "gpu"] * 4)
    grouping = coarsen(g, colocation_grouping(g), 4, method="topological")
    grouping.check(g)
    assert grouping.assignment.tolist() == [0, 1, 0, 1, 2, 3, 2, 3]


def test_coarsening_to_one_group_with_cpu_only_and_gpu_only_ops_is_impossible():
    g = alternating_chain(["cpu", "gpu", "cpu"])
    with pytest.raises(GroupingError, match="device-kind"):
        coarsen(g, colocation_grouping(g), 1)
