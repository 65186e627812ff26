"""Training throughput of the learned placers on NMT: evaluations per second, policy updates included.

Run with `python -m pytest tests/rl/test_learned_benchmark.py -m benchmark --benchmark-enable`; the figure
is in the benchmark's extra_info ("evaluations_per_s") and is printed.
"""

from __future__ import annotations

import pytest

from rl.hsdag import HSDAGPlacer, HSDAGSearch
from rl.learned import torch_threads
from rl.placeto import PlacetoPlacer, PlacetoSearch
from rl.post import PostPlacer, PostSearch
from rl.seq2seq import Seq2SeqPlacer, Seq2SeqSearch
from suite import load_cluster, load_workload
from suite.methodology import Budget
from suite.placer import Problem


def report(benchmark, run: str, evaluations: int, groups: int, unit: str) -> None:
    """Record and print evaluations per second: `evaluations` per timed call, whose mean time pytest-benchmark has."""
    rate = evaluations / benchmark.stats.stats.mean
    benchmark.extra_info["evaluations_per_s"] = rate
    benchmark.extra_info["groups"] = groups
    print(f"\n{run}: {rate:.1f} evaluations/s ({groups} groups, {unit})")


@pytest.mark.benchmark
@pytest.mark.parametrize("cluster", ["haswell_4k80"])
@pytest.mark.parametrize(("placer", "search_class"), [(Seq2SeqPlacer, Seq2SeqSearch), (PostPlacer, PostSearch)],
                         ids=["seq2seq", "post"])
def test_training_throughput_nmt(benchmark, cluster, placer, search_class):
    graph, c = load_workload("nmt-2x1024-b64"), load_cluster(cluster)
    problem = Problem.make(graph, c, Budget(10**9, 10**9))
    params = dict(placer.defaults)
    k = int(params["batch_size"])
    with torch_threads(int(params["threads"])):  # as the placer runs
        search = search_class(problem, params, seed=0)
        search.step(k)  # warm-up: numba's simulator and torch's first calls
        benchmark.pedantic(search.step, args=(k,), rounds=20, iterations=1, warmup_rounds=1)
    report(benchmark, f"{placer.name} on {graph.name} / {cluster}", k, search.grouping.num_groups,
           f"batch {k}, policy updates included")
    assert search.rollouts.batches == 22  # every step evaluated a batch and updated the policy
    assert sum(v for key, v in search.info().items() if key in ("updates", "ppo_updates", "ce_steps")) == 22


@pytest.mark.benchmark
def test_placeto_training_throughput_nmt(benchmark):
    """Placeto runs episodes, not batches: one episode of G steps is G evaluations and one update."""
    graph, c = load_workload("nmt-2x1024-b64"), load_cluster("haswell_4k80")
    problem = Problem.make(graph, c, Budget(10**9, 10**9))
    params = {**PlacetoPlacer.defaults, "max_groups": 4 * c.num_devices}
    with torch_threads(int(params["threads"])):  # as the placer runs
        search = PlacetoSearch(problem, params, seed=0)
        assert search.episode(1, reserve=0)  # warm-up, and the one evaluation of the initial placement
        benchmark.pedantic(search.episode, args=(1, 0), rounds=20, iterations=1, warmup_rounds=1)
    G = search.graph.num_groups
    report(benchmark, f"placeto on {graph.name} / haswell_4k80", G, G, "one update per episode")
    assert search.episodes == search.updates == 22
    assert problem.evaluator.evaluations_used == 1 + 22 * G


@pytest.mark.benchmark
def test_hsdag_training_throughput_nmt(benchmark):
    """HSDAG runs episodes of `steps` placements (parsed one after another) and one update each."""
    graph, c = load_workload("nmt-2x1024-b64"), load_cluster("haswell_4k80")
    problem = Problem.make(graph, c, Budget(10**9, 10**9))
    params = dict(HSDAGPlacer.defaults)
    steps = int(params["steps"])
    with torch_threads(int(params["threads"])):  # as the placer runs
        search = HSDAGSearch(problem, params, seed=0)
        assert search.episode(reserve=0)  # warm-up
        benchmark.pedantic(search.episode, args=(0,), rounds=10, iterations=1, warmup_rounds=1)
    report(benchmark, f"hsdag on {graph.name} / haswell_4k80", steps, search.grouping.num_groups,
           f"{steps} placements and one update per episode")
    assert search.episodes == search.updates == 12
    assert problem.evaluator.evaluations_used == 12 * steps
