"""Speed of the partitioners on a 10,000-op graph (pytest-benchmark; run with `-m benchmark`)."""

from __future__ import annotations

import pytest

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
