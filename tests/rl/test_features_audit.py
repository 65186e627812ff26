"""Audit additions for rl.features: the degree columns, the orientation of the group adjacency, and the exact
device and cost features (values by hand on train2 / haswell_2k80)."""

from __future__ import annotations

import numpy as np

from rl.features import NUMERIC_NAMES, cost_features, device_features, group_features, op_features
from rl.grouping import colocation_grouping
from suite.costmodel import cost_matrix
from suite.graph import Op, OpGraph


def test_degree_columns(train2):
    # ops: data, l0.fwd, l1.fwd, loss, l1.bwd, l1.upd, l0.bwd, l0.upd
    f = op_features(train2)
    col = {n: i for i, n in enumerate(NUMERIC_NAMES)}
    in_degree = np.array([0, 1, 1, 1, 2, 1, 2, 1])  # the backward ops read the gradient and the forward output
    out_degree = np.array([1, 2, 2, 1, 2, 0, 1, 0])  # the forward ops feed the next op and their backward op
    np.testing.assert_allclose(f.numeric[:, col["log_in_degree"]], np.log1p(in_degree) / np.log1p(2), rtol=1e-6)
    np.testing.assert_allclose(f.numeric[:, col["log_out_degree"]], np.log1p(out_degree) / np.log1p(2), rtol=1e-6)


def test_group_adjacency_rows_are_sources(train2):
    # groups {data}, {l0.*}, {l1.*}, {loss}: data -> l0.fwd is an edge, nothing goes back to data
    f = group_features(train2, colocation_grouping(train2))
    assert f.adjacency[0, 1] > 0 and f.adjacency[1, 0] == 0
    assert f.adjacency[3, 2] > 0 and f.adjacency[0, 3] == 0  # loss -> l1.bwd
    # l0 <-> l1: l0.fwd -> l1.fwd and l1.bwd -> l0.bwd, one op edge each way: log1p(1) / log1p(1) = 1
    assert f.adjacency[1, 2] == f.adjacency[2, 1] == 1.0
    m = f.matrix()
    K = len(op_features(train2).kinds)
    out_rows, in_rows = m[:, K + 10 : K + 14], m[:, K + 14 :]
    assert out_rows.tolist() == f.adjacency.tolist() and in_rows.tolist() == f.adjacency.T.tolist()


def test_device_features_by_hand(k80x2):
    # effective FLOP/s: cpu 1.3248e12 x 0.5, K80 4.37e12 x 0.6; bandwidth 68e9 x 0.7, 240e9 x 0.75
    d = device_features(k80x2)
    np.testing.assert_allclose(d[0, 2], np.log1p(1.3248e12 * 0.5) / np.log1p(4.37e12 * 0.6), rtol=1e-6)
    np.testing.assert_allclose(d[0, 3], np.log1p(68e9 * 0.7) / np.log1p(240e9 * 0.75), rtol=1e-6)
    np.testing.assert_allclose(d[0, 4], 1.0)  # the host has the most memory
    np.testing.assert_allclose(d[1, 4], np.log1p(11996758016) / np.log1p(137438953472), rtol=1e-6)


def test_cost_features_are_log_microseconds(train2, k80x2):
    cost_us = np.asarray(cost_matrix(train2, k80x2)) * 1e6
    c = cost_features(train2, k80x2)
    np.testing.assert_allclose(c, np.log1p(cost_us) / np.log1p(cost_us.max()), rtol=1e-5)
    # the input op: about 6.5 us on the CPU and 10.4 us on a K80, on a log scale (not 6.5e-6 s, ~linear)
    assert 0.15 < c[0, 0] < 0.2 and 0.2 < c[0, 1] < 0.25


# -- mutation round: behaviours no test pinned ------------------------------------------------------------


def _two_ops() -> OpGraph:
    """a -> b; a: 10 bytes read, 1000 output bytes; b: 1000 bytes read and written, 10 output bytes."""
    ops = [Op("a", "matmul", bytes_read=10, output_bytes=1000), Op("b", "add", bytes_read=500, bytes_written=500,
                                                                  output_bytes=10)]
    return OpGraph.build("two", ops, [("a", "b")])


def test_op_matrix_is_one_hot_then_numeric_then_shape_and_edges_run_source_to_destination():
    f = op_features(_two_ops())
    assert f.kinds == ("add", "matmul")
    m = f.matrix()
    assert m[:, :2].tolist() == [[0, 1], [1, 0]]  # a matmul, b add: exactly one 1 per row
    np.testing.assert_array_equal(m[:, 2 : 2 + len(NUMERIC_NAMES)], f.numeric)
    np.testing.assert_array_equal(m[:, 2 + len(NUMERIC_NAMES) :], f.output_shape)
    assert f.edge_index.tolist() == [[0], [1]]  # a -> b


def test_op_byte_columns_and_the_depth_of_a_two_op_graph():
    f = op_features(_two_ops())
    col = {n: i for i, n in enumerate(NUMERIC_NAMES)}
    # bytes accessed 10 and 1000; output bytes 1000 and 10; each log1p over the column's largest
    np.testing.assert_allclose(f.numeric[:, col["log_bytes_accessed"]], [np.log1p(10) / np.log1p(1000), 1.0],
                               rtol=1e-6)
    np.testing.assert_allclose(f.numeric[:, col["log_output_bytes"]], [1.0, np.log1p(10) / np.log1p(1000)],
                               rtol=1e-6)
    assert f.numeric[:, col["depth"]].tolist() == [0.0, 1.0]  # depths 0 and 1 over the largest, 1


def test_kind_shares_count_every_op_of_a_kind():
    # one group of two matmuls and an add: shares 1/3 add, 2/3 matmul
    ops = [Op("m1", "matmul", group="g"), Op("m2", "matmul", group="g"), Op("s", "add", group="g")]
    g = OpGraph.build("shares", ops, [("m1", "m2"), ("m2", "s")])
    f = group_features(g, colocation_grouping(g))
    np.testing.assert_allclose(f.kind_counts, [[1 / 3, 2 / 3]], rtol=1e-6)


def test_group_cost_features_sum_the_member_ops(train2, k80x2):
    # groups {data}, {l0.fwd, l0.bwd, l0.upd}, {l1.*}, {loss}: each group's seconds are its ops' sum
    grouping = colocation_grouping(train2)
    cost_us = np.asarray(cost_matrix(train2, k80x2)) * 1e6
    summed = np.stack([cost_us[m].sum(axis=0) for m in grouping.members])
    np.testing.assert_allclose(cost_features(train2, k80x2, grouping), np.log1p(summed) / np.log1p(summed.max()),
                               rtol=1e-5)
