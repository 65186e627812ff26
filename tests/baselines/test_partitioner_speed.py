"""Speed of the partitioners on a 10,000-op graph, and of Scotch's target tree on 200 devices (pytest-benchmark;
run with `-m benchmark`)."""

from __future__ import annotations

import numpy as np
import pytest

from baselines._scotch_adapter import decomposition_tree
from baselines.metis import Metis
from baselines.scotch import Scotch
from suite import registry
from suite.methodology import Budget

pytestmark = pytest.mark.benchmark


@pytest.mark.parametrize("cluster_name", ["haswell_4k80", "dgx_a100x8"])
@pytest.mark.parametrize("placer", [Scotch, Metis], ids=["scotch", "metis"])
def test_place_10k_ops(benchmark, placer, cluster_name, random_graph, make_problem):
    """A random 10,000-op DAG (up to 3 inputs per op) on a 5- or 9-device cluster."""
    graph = random_graph(10_000, 0)
    problem = make_problem(graph, registry.load_cluster(cluster_name))
    result = benchmark.pedantic(lambda: placer().place(problem, Budget(), 0), rounds=5, iterations=1, warmup_rounds=1)
    assert len(result.placement) == 10_000


@pytest.mark.parametrize("pattern", ["random", "graded", "equal"])
def test_decomposition_tree_200_devices(benchmark, pattern):
    """Scotch's target tree over 200 devices: random symmetric link costs 1..100, costs graded by device index
    (a chain of joins, then the balanced fallback) or all equal (every join a tie). 26 s in its O(k^4) form."""
    k = 200
    rng = np.random.default_rng(0)
    costs = {"random": np.triu(rng.integers(1, 101, (k, k)), 1),
             "graded": np.triu(np.maximum.outer(np.arange(k), np.arange(k)) + 1, 1),
             "equal": np.triu(np.ones((k, k), dtype=np.int64), 1)}[pattern]
    costs = costs + costs.T
    weights = rng.integers(1, 1001, k)
    heap = benchmark.pedantic(lambda: decomposition_tree(weights, costs), rounds=5, iterations=1, warmup_rounds=1)
    assert sorted(heap) == sorted(set(heap)) and len(heap) == k
