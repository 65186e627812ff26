"""MinCut: Scotch on the GPUs only; ops that forbid GPUs still reach the CPU."""

from __future__ import annotations

import numpy as np

from baselines.mincut import MinCut
from suite.methodology import Budget
from suite.placement import validate


def test_no_cpu_except_for_cpu_only_ops(random_graph, make_problem, haswell_4k80):
    g = random_graph(400, 4, groups=True, kinds=True)
    r = MinCut().place(make_problem(g, haswell_4k80), Budget(), 0)
    validate(r.placement, g, haswell_4k80)
    cpu_only = np.array([op.allowed_kinds == ("cpu",) for op in g.ops])
    assert cpu_only.any()
    assert (r.placement[cpu_only] == 0).all()
    assert (r.placement[~cpu_only] > 0).all()
    assert r.info["devices"] == ["gpu:0", "gpu:1", "gpu:2", "gpu:3"]
    assert len(set(r.placement[~cpu_only].tolist())) == 4


def test_same_seed_same_placement(random_graph, make_problem, haswell_4k80):
    g = random_graph(800, 5)
    a, b = (MinCut().place(make_problem(g, haswell_4k80), Budget(), 3).placement for _ in range(2))
    assert np.array_equal(a, b)


def test_cpu_only_cluster_uses_the_cpu(random_graph, make_problem, make_cluster):
    cluster = make_cluster(0)
    assert (MinCut().place(make_problem(random_graph(30, 1), cluster), Budget(), 0).placement == 0).all()


def test_mincut_hands_scotch_only_the_gpus(monkeypatch, make_problem):
    import baselines.scotch as scotch_module

    from .test_scotch import heterogeneous_cluster, scotch_inputs_graph

    seen = {}

    def fake_map_graph(xadj, adjncy, vw, ew, tw, lc, seed=0):
        seen.update(tw=tw.tolist(), lc=lc.tolist())
        return np.zeros(len(xadj) - 1, dtype=np.int64)

    monkeypatch.setattr(scotch_module, "map_graph", fake_map_graph)
    r = MinCut().place(make_problem(scotch_inputs_graph(), heterogeneous_cluster()), Budget(), 0)
    # candidates gpu:0 (speed 1.6 s vs 0.8 s on gpu:1: 0.5) and gpu:1; terminal 0 is gpu:0 (device 1)
    assert r.info["devices"] == ["gpu:0", "gpu:1"] and seen["tw"] == [500, 1000] and seen["lc"] == [[0, 10], [10, 0]]
    assert r.placement.tolist() == [1, 1, 1, 1] and r.info["kind_moves"] == 0
