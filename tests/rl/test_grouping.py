"""Groupings keep colocation groups whole and device kinds satisfiable; hand-checked merges."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
from suite.cluster import Cluster, Device, Link
from suite.errors import PlacementError


def test_colocation_grouping_of_training_graph(train2):
    g = colocation_grouping(train2)
    # ops: data, l0.fwd, l1.fwd, loss, l1.bwd, l1.upd, l0.bwd, l0.upd
    assert g.assignment.tolist() == [0, 1, 2, 3, 2, 2, 1, 1]
    assert g.num_groups == 4
    assert [m.tolist() for m in g.members] == [[0], [1, 6, 7], [2, 4, 5], [3]]


def test_mirhoseini_single_consumer_rule(train2):
    # data's only consumer is l0.fwd -> joins its colocation group (and narrows it to cpu);
    # loss's only consumer is l1.bwd -> joins l1's group (narrowed to gpu). Ops in colocation groups
    # (l1.bwd has one consumer, l0.bwd) do not merge further, so two groups remain.
    g = mirhoseini_grouping(train2, max_groups=100)
    assert g.assignment.tolist() == [0, 0, 1, 1, 1, 1, 0, 0]


def test_single_consumer_rule_skips_colocated_ops():
    # f0 (group f0, with b0) -> acc0 -> acc1; f1 (group f1, with b1): b0 has one consumer (acc0) but is in a
    # colocation group, so f0's group does not merge with acc0; acc0 (free) joins acc1.
    ops = [Op("f0", "x", group="f0"), Op("b0", "x", group="f0"), Op("f1", "x", group="f1"),
           Op("b1", "x", group="f1"), Op("acc0", "x"), Op("acc1", "x")]
    g = OpGraph.build("acc", ops, [("f0", "b0"), ("b0", "acc0"), ("f1", "b1"), ("b1", "acc0"), ("acc0", "acc1")])
    names = [op.name for op in g.ops]
    out = mirhoseini_grouping(g, None)
    groups = {names[i]: int(out.assignment[i]) for i in range(len(names))}
    assert groups["f0"] == groups["b0"] != groups["acc0"] == groups["acc1"] != groups["f1"] == groups["b1"]
    assert out.num_groups == 3


def test_single_consumer_merge_refused_when_kinds_conflict():
    ops = [Op("a", "x", allowed_kinds=("cpu",)), Op("b", "x", allowed_kinds=("gpu",)), Op("c", "x")]
    g = OpGraph.build("conflict", ops, [("a", "b"), ("b", "c")])
    # a -> b would leave no kind: refused; b -> c is fine.
    assert mirhoseini_grouping(g, 10).assignment.tolist() == [0, 1, 1]


def test_allowed_mask(train2, k80x2):
    g = mirhoseini_grouping(train2, 100)
    mask = allowed_mask(train2, g, k80x2)  # devices: cpu:0, gpu:0, gpu:1
    assert mask.tolist() == [[True, False, False], [False, True, True]]


def test_allowed_mask_raises_without_device(train2, two_gpus):
    with pytest.raises(PlacementError, match="allows only"):
        allowed_mask(train2, colocation_grouping(train2), two_gpus)


def test_allowed_mask_of_an_unchecked_grouping_names_the_ops_without_a_common_kind(train2, k80x2):
    """A grouping made by hand (not checked) that puts data (cpu only) with loss (gpu only): each op has a device
    in the cluster, the group none. The error said only "allows no common device kind"; no test reached it."""
    g = Grouping.from_labels([0, 1, 2, 0, 2, 2, 1, 1])  # ops: data, l0.fwd, l1.fwd, loss, l1.bwd, ...
    with pytest.raises(PlacementError) as err:
        allowed_mask(train2, g, k80x2)
    assert str(err.value) == ("group 0 allows no common device kind (op 'data' allows only cpu; op 'loss' allows "
                              "only gpu): Grouping.check refuses it")


def test_allowed_mask_error_names_the_op_that_narrows_the_group(train2):
    # mirhoseini: group 1 = l1's colocation group + loss (gpu only); its first op, l1.fwd, allows any kind
    cpus = Cluster("two_cpus", tuple(Device(f"cpu:{i}", "cpu", 1e11, 1e11, 10**10, 1e-5) for i in range(2)),
                   (Link(("cpu:0", "cpu:1"), 1e10, 1e-5),))
    with pytest.raises(PlacementError) as err:
        allowed_mask(train2, mirhoseini_grouping(train2, 100), cpus)
    assert str(err.value) == "group 1: op 'loss' allows only gpu device kinds, and cluster 'two_cpus' has none of them"


def test_expand_and_contract(train2):
    g = colocation_grouping(train2)
    gd = np.array([0, 1, 2, 1])
    assert g.expand(gd).tolist() == [0, 1, 2, 1, 2, 2, 1, 1]
    assert g.contract(g.expand(gd)).tolist() == gd.tolist()
    assert g.expand(np.stack([gd, gd])).shape == (2, 8)
    with pytest.raises(PlacementError, match=r"expected 4 group devices, got shape \(2,\)"):
        g.expand([0, 1])


def test_from_labels_numbers_groups_by_first_op():
    assert Grouping.from_labels([7, 3, 7, 5, 3]).assignment.tolist() == [0, 1, 0, 2, 1]


def test_topological_coarsening_balances_work():
    # 8 equal ops in a chain, 4 groups: runs of two.
    ops = [Op(f"o{i}", "x", flops=1e9) for i in range(8)]
    g = OpGraph.build("chain", ops, [(f"o{i}", f"o{i + 1}") for i in range(7)])
    out = coarsen(g, colocation_grouping(g), 4)
    assert out.assignment.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]


def test_heavy_edge_coarsening_contracts_heaviest_edges():
    # a -> b carries 1000 bytes, b -> c 10, c -> d 1000: to 2 groups, heavy edges go inside groups.
    ops = [Op(n, "x", flops=1e9, output_bytes=b) for n, b in (("a", 1000), ("b", 10), ("c", 1000), ("d", 0))]
    g = OpGraph.build("heavy", ops, [("a", "b"), ("b", "c"), ("c", "d")])
    out = coarsen(g, colocation_grouping(g), 2, method="heavy_edge")
    assert out.assignment.tolist() == [0, 0, 1, 1]


def test_scope_grouping(train2):
    g = scope_grouping(train2, depth=2)
    # scopes: data | layer.0 (l0 group) | layer.1 (l1 group) | head
    assert g.assignment.tolist() == [0, 1, 2, 3, 2, 2, 1, 1]
    assert scope_grouping(train2, depth=1).num_groups == 3  # layer.0 and layer.1 share "layer"


def test_unknown_methods_raise(train2):
    with pytest.raises(GroupingError, match="unknown grouping 'nope'; choose from mirhoseini, "):
        make_grouping(train2, "nope")
    with pytest.raises(GroupingError, match="unknown coarsening method 'nope'; choose from topological, heavy_edge"):
        coarsen(train2, colocation_grouping(train2), 1, method="nope")


@st.composite
def random_graphs(draw):
    n = draw(st.integers(2, 40))
    ops = []
    for i in range(n):
        kinds = draw(st.sampled_from([(), (), (), ("cpu",), ("gpu",)]))
        ops.append(Op(f"o{i}", draw(st.sampled_from(["a", "b", "c"])), flops=draw(st.floats(0, 1e10)),
                      output_bytes=draw(st.integers(0, 10**6)), allowed_kinds=kinds,
                      scope=draw(st.sampled_from(["", "x.0", "x.1", "y"]))))
    edges = {(i, j) for i, j in draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=3 * n))
             if i < j}
    # colocation groups among ops whose kinds agree
    group_of: dict[int, str] = {}
    group_kinds: dict[str, set[str]] = {}
    for i in range(n):
        if draw(st.booleans()) and i > 0:
            j = draw(st.integers(0, i - 1))
            name = group_of.get(j, f"g{j}")
            kinds = group_kinds.get(name, set(ops[j].allowed_kinds or ("cpu", "gpu")))
            both = kinds & set(ops[i].allowed_kinds or ("cpu", "gpu"))
            if both:
                group_of[i] = group_of[j] = name
                group_kinds[name] = both
    ops = [Op(**{**op.__dict__, "group": group_of.get(i)}) for i, op in enumerate(ops)]
    return OpGraph.build("random", ops, [(f"o{i}", f"o{j}") for i, j in sorted(edges)])


@settings(max_examples=60, deadline=None)
@given(graph=random_graphs(), max_groups=st.integers(1, 12),
       method=st.sampled_from(["mirhoseini", "colocation", "chain", "scope", "topological", "heavy_edge"]))
def test_groupings_keep_invariants(graph, max_groups, method):
    try:
        g = make_grouping(graph, method, max_groups)
    except GroupingError as exc:  # only when cpu-only and gpu-only ops cannot share the one group allowed
        assert "device-kind" in str(exc) and max_groups == 1
        return
    g.check(graph)  # colocation whole, kinds satisfiable
    assert g.num_groups <= max_groups
    assert sorted(set(g.assignment.tolist())) == list(range(g.num_groups))
    firsts = [int(m[0]) for m in g.members]
    assert firsts == sorted(firsts)
