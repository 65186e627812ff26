"""Audit additions for rl.features: the degree columns, the orientation of the group adjacency, and the exact
device and cost features (values by hand on train2 / haswell_2k80)."""

from __future__ import annotations

import numpy as np

from rl.features import NUMERIC_NAMES, cost_features, device_features, group_features, op_features
from rl.grouping import colocation_grouping
from suite.costmodel import cost_matrix


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
