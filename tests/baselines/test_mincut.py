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
