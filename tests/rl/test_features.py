"""Op, group, device and cost features: shapes, ranges and hand-checked values."""

from __future__ import annotations

import numpy as np

from rl.features import NUMERIC_NAMES, cost_features, depths, device_features, group_features, op_features
from rl.grouping import colocation_grouping
from suite.graph import Op, OpGraph


def test_op_features_values(train2):
    f = op_features(train2)
    assert f.kinds == ("apply_adam", "input", "loss", "matmul", "matmul_grad")
    # ops: data, l0.fwd, l1.fwd, loss, l1.bwd, l1.upd, l0.bwd, l0.upd
    assert f.kind_ids.tolist() == [1, 3, 3, 2, 4, 0, 4, 0]
    assert f.numeric.shape == (8, len(NUMERIC_NAMES))
    assert 0.0 <= f.numeric.min() and f.numeric.max() <= 1.0
    col = {n: i for i, n in enumerate(NUMERIC_NAMES)}
    assert f.numeric[:, col["phase_backward"]].tolist() == [0, 0, 0, 0, 1, 0, 1, 0]
    assert np.allclose(f.numeric[:, col["topo_position"]], np.arange(8) / 7)
    # the backward matmuls have the most FLOPs (1e11)
    assert np.flatnonzero(f.numeric[:, col["log_flops"]] == 1.0).tolist() == [4, 6]
    assert depths(train2).tolist() == [0, 1, 2, 3, 4, 5, 5, 6]
    assert f.edge_index.shape == (2, 9)
    assert f.matrix().shape == (8, 5 + len(NUMERIC_NAMES) + 4)
    # output shape of l0.fwd (500, 1000): log1p dims scaled by the largest
    assert np.allclose(f.output_shape[1, :2], np.log1p([500, 1000]) / np.log1p(1000))


def test_group_features_values(train2):
    g = colocation_grouping(train2)  # groups: {data}, {l0.*}, {l1.*}, {loss}
    f = group_features(train2, g)
    assert np.allclose(f.kind_counts[1], np.array([1, 0, 0, 1, 1]) / 3)
    assert f.edge_index.T.tolist() == [[0, 1], [1, 2], [2, 1], [2, 3], [3, 2]]
    assert f.edge_bytes.tolist() == [1e6, 2e6, 2e6, 2e6, 4.0]
    assert (f.adjacency > 0).sum() == 5 and f.adjacency.max() == 1.0
    m = f.matrix()
    assert m.shape == (4, 5 + 6 + 4 + 2 * 4)
    assert 0.0 <= m.min() and m.max() <= 1.0
    assert f.matrix(adjacency=False).shape == (4, 15)


def test_group_adjacency_counts_op_edges_and_output_shapes_keep_the_first_dims():
    """Groups a = {a1, a2} and b = {b1, b2}, then c: two op edges from a to b, one from b to c, so the adjacency
    is log1p(2) / log1p(2) = 1 and log1p(1) / log1p(2). An output shape of 5 dims keeps its first 4."""
    ops = [Op("a1", "x", group="a", output_shape=(2, 3, 4, 5, 6)), Op("a2", "x", group="a"),
           Op("b1", "x", group="b"), Op("b2", "x", group="b"), Op("c", "x", output_shape=(7,))]
    g = OpGraph.build("pairs", ops, [("a1", "b1"), ("a2", "b2"), ("b2", "c")])
    assert [op.name for op in g.ops] == ["a1", "a2", "b1", "b2", "c"]
    f = group_features(g, colocation_grouping(g))
    assert f.edge_index.T.tolist() == [[0, 1], [1, 2]]
    assert np.allclose(f.adjacency, [[0, 1, 0], [0, 0, np.log(2) / np.log(3)], [0, 0, 0]], rtol=1e-6, atol=0)
    shapes = op_features(g).output_shape
    assert np.allclose(shapes[[0, 4]], [np.log1p([2, 3, 4, 5]) / np.log1p(7), [1, 0, 0, 0]], rtol=1e-6, atol=0)


def test_group_features_sum_numeric_features_and_average_output_shapes(train2):
    g = colocation_grouping(train2)  # groups: {data}, {l0.fwd, l0.bwd, l0.upd}, {l1.*}, {loss}
    f = group_features(train2, g)
    # summed FLOPs: 1e6; 50e9 + 100e9 + 1e8 per layer; 1e7, log1p-scaled by the largest
    layer = 50e9 + 100e9 + 1e8
    assert np.allclose(f.numeric[:, 0], np.log1p([1e6, layer, layer, 1e7]) / np.log1p(layer), rtol=1e-6, atol=0)
    assert f.numeric[:, 1].tolist() == [0, 0, 0, 0]  # no op reads or writes bytes
    out = np.log1p([1e6, 4e6, 4e6, 4]) / np.log1p(4e6)  # output bytes: 1e6; 2e6 + 2e6 + 0; 4
    assert np.allclose(f.numeric[:, 2], out, rtol=1e-6, atol=0)
    assert f.numeric[:, 3].tolist() == [0, 1, 1, 0]  # parameters: only the forward matmuls (8e6 each)
    assert f.numeric[:, 4].tolist() == [0.5, 1, 1, 0.5]  # sizes 1, 3, 3, 1: log1p(1) / log1p(3) = 1/2
    assert np.allclose(f.numeric[:, 5], np.array([0, 1, 2, 3]) / 7)  # first member's topological position
    # output shapes: only l0.fwd and l1.fwd have one, (500, 1000); a layer group averages it over 3 ops
    fwd = np.array([np.log1p(500) / np.log1p(1000), 1.0, 0.0, 0.0])
    assert np.allclose(f.output_shape, [np.zeros(4), fwd / 3, fwd / 3, np.zeros(4)], rtol=1e-6, atol=0)


def test_device_and_cost_features(train2, k80x2):
    d = device_features(k80x2)
    assert d.shape == (3, 5)
    assert d[:, :2].tolist() == [[1, 0], [0, 1], [0, 1]]
    assert d[1, 2] == 1.0 and d[0, 2] < 1.0  # GPUs have the most effective FLOP/s
    c = cost_features(train2, k80x2, colocation_grouping(train2))
    assert c.shape == (4, 3) and c.max() == 1.0
    assert (c[1:3, 0] > c[1:3, 1]).all()  # the layers are slower on the CPU,
    assert c[0, 0] < c[0, 1]  # the tiny input op faster (5 us CPU overhead against 10 us on a K80)
