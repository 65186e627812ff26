"""Audit additions for rl.grouping: the single-consumer rule on an op with several consumers, Grouping.check,
grouping names that are coarsening methods, and heavy-edge matching's byte weights and work cap."""

from __future__ import annotations

import numpy as np
import pytest

from rl.grouping import (
    Grouping,
    GroupingError,
    allowed_mask,
    coarsen,
    colocation_grouping,
    make_grouping,
    mirhoseini_grouping,
    scope_grouping,
)
from suite import Op, OpGraph
from suite.errors import PlacementError

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


# -- mutation round: behaviours no test pinned ------------------------------------------------------------


def test_expand_refuses_more_group_devices_than_groups(train2):
    with pytest.raises(PlacementError, match=r"expected 4 group devices, got shape \(5,\)"):
        colocation_grouping(train2).expand([0, 1, 2, 1, 0])


def test_contract_of_a_split_group_takes_its_first_ops_device(train2):
    # colocation group 1 = l0.fwd (op 1), l0.bwd (op 6), l0.upd (op 7): devices 1, 2, 2 -> 1 (the first op's)
    assert colocation_grouping(train2).contract(np.array([0, 1, 2, 1, 2, 2, 2, 2])).tolist() == [0, 1, 2, 1]


def test_allowed_mask_of_an_unchecked_grouping_names_only_the_narrowing_ops(train2, k80x2):
    # group 0 = data (cpu only), l0.fwd, loss (gpu only), l0.bwd, l0.upd: ops allowing every kind are not named
    g = Grouping.from_labels([0, 0, 2, 0, 2, 2, 0, 0])
    with pytest.raises(PlacementError) as err:
        allowed_mask(train2, g, k80x2)
    assert str(err.value) == ("group 0 allows no common device kind (op 'data' allows only cpu; op 'loss' allows "
                              "only gpu): Grouping.check refuses it")


def test_scope_grouping_leaves_ops_without_a_scope_alone_and_caps_groups(train2):
    ops = [Op("a", "x"), Op("b", "x"), Op("c", "x", scope="m.0"), Op("d", "x", scope="m.0")]
    g = OpGraph.build("scopes", ops, [("a", "b"), ("b", "c"), ("c", "d")])
    assert scope_grouping(g).assignment.tolist() == [0, 1, 2, 2]  # a and b have no scope: not one group
    # depth 1: data | layer (l0, l1) | loss, capped at 2: data (cpu only) joins layer, loss (gpu only) stays
    # apart (ops: data, l0.fwd, l1.fwd, loss, l1.bwd, l1.upd, l0.bwd, l0.upd)
    assert scope_grouping(train2, depth=1).num_groups == 3
    assert scope_grouping(train2, depth=1, max_groups=2).assignment.tolist() == [0, 0, 0, 1, 0, 0, 0, 0]


def _x_zeros_y(delta: float) -> OpGraph:
    """x (1 GFLOP) -> four ops of no FLOPs -> y (1 GFLOP + delta)."""
    flops = [1e9, 0.0, 0.0, 0.0, 0.0, 1e9 + delta]
    ops = [Op(f"o{i}", "x", flops=f) for i, f in enumerate(flops)]
    return OpGraph.build("x_zeros_y", ops, [(f"o{i}", f"o{i + 1}") for i in range(5)])


def test_topological_work_floor_is_one_percent_of_the_mean_flops():
    """FLOPs 1e9, 0, 0, 0, 0, 1.01e9 to 2 groups: the floor is 1% of the mean (2.01e9 / 6 = 3.35e8), 3.35e6 per
    op, so the target (2.01e9 + 6 x 3.35e6) / 2 = 1.01505e9 takes x and three empty ops (1.0134e9) but not the
    fourth (1.01675e9). A floor of 1 FLOP (or none) would put all four empty ops with x."""
    g = _x_zeros_y(1e7)
    assert coarsen(g, colocation_grouping(g), 2).assignment.tolist() == [0, 0, 0, 0, 1, 1]


def test_coarsening_to_as_many_groups_as_there_are_is_no_change_and_zero_groups_is_refused():
    g = _x_zeros_y(1e7)  # uneven work: a target of total / 6 would merge the empty ops
    assert coarsen(g, colocation_grouping(g), 6).assignment.tolist() == [0, 1, 2, 3, 4, 5]
    with pytest.raises(GroupingError, match="max_groups must be at least 1, got 0"):
        coarsen(g, colocation_grouping(g), 0)


def test_a_run_cut_at_a_kind_conflict_keeps_the_new_groups_kinds():
    # cpu-only -> gpu-only -> any, to 2 groups: the third op joins the gpu op's run ({gpu}); had the run kept
    # the empty intersection, the third op would be cut off too and merged out of order with the cpu op
    ops = [Op("c", "x", flops=1e9, allowed_kinds=("cpu",)), Op("g", "x", flops=1e9, allowed_kinds=("gpu",)),
           Op("a", "x", flops=1e9)]
    g = OpGraph.build("kinds", ops, [("c", "g"), ("g", "a")])
    assert coarsen(g, colocation_grouping(g), 2).assignment.tolist() == [0, 1, 1]


def test_heavy_edge_weight_counts_each_edge_beside_its_bytes():
    """u -> v (1 edge) and w -> {b1, b2} (one colocation group, 2 edges), no bytes on any: the pair with two
    edges (weight 2) merges first, although (u, v) comes first by position (weight 1)."""
    ops = [Op("u", "x", flops=1e9), Op("v", "x", flops=1e9), Op("w", "x", flops=1e9),
           Op("b1", "x", flops=1e9, group="B"), Op("b2", "x", flops=1e9, group="B")]
    g = OpGraph.build("edge_count", ops, [("u", "v"), ("w", "b1"), ("w", "b2")])
    assert coarsen(g, colocation_grouping(g), 3, method="heavy_edge").assignment.tolist() == [0, 1, 2, 2, 2]


def test_heavy_edge_round_matches_each_group_once():
    """a -> c 100 bytes, b -> c 50, c -> d 80, to 2 groups. Round 1 merges (a, c); (c, d) and (b, c) wait, c being
    matched. Round 2: ({a, c}, d) at 81 beats ({a, c}, b) at 51. Merging b into c in round 1 gave {a, b, c}, {d}."""
    ops = [Op(n, "x", flops=1e9, output_bytes=b) for n, b in (("a", 100), ("b", 50), ("c", 80), ("d", 0))]
    g = OpGraph.build("star", ops, [("a", "c"), ("b", "c"), ("c", "d")])
    assert coarsen(g, colocation_grouping(g), 2, method="heavy_edge").assignment.tolist() == [0, 1, 0, 0]


def test_heavy_edge_stops_at_max_groups_within_a_round():
    # a -> b -> c -> d, equal bytes, to 3 groups: (a, b) merges and the round stops; (c, d) stays apart
    ops = [Op(n, "x", flops=1e9, output_bytes=10) for n in "abcd"]
    g = OpGraph.build("chain4", ops, [("a", "b"), ("b", "c"), ("c", "d")])
    assert coarsen(g, colocation_grouping(g), 3, method="heavy_edge").assignment.tolist() == [0, 0, 1, 2]
