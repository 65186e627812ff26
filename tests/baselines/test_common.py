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
