"""Every baseline gives a valid placement for every zoo workload on every preset of the quick suite, and the
human-expert rules recognise the zoo's scopes (no workload falls back to the generic split)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import pytest

import suite
from suite import registry, zoo
from suite.methodology import Budget
from suite.placement import validate
from suite.placer import Problem, make_placer

QUICK = tomllib.loads((Path(suite.__file__).parent / "specs" / "quick.toml").read_text())
BASELINES = ["human_expert", "human_expert_pipeline", "scotch", "mincut", "metis", "m_etf", "local_search"]
EXPECTED_RULE = {"rnnlm": "lstm_per_gpu", "nmt": "lstm_per_gpu", "inception_v3": "single_gpu",
                 "resnet50": "single_gpu", "bert_base": "layer_blocks"}


@pytest.mark.parametrize("cluster_name", QUICK["clusters"])
@pytest.mark.parametrize("workload", zoo.names())
def test_every_baseline_places_every_zoo_workload(workload, cluster_name):
    graph = zoo.load(workload)
    cluster = registry.load_cluster(cluster_name)
    budget = Budget(max_evaluations=20, max_seconds=10.0)
    for name in BASELINES:
        problem = Problem.make(graph, cluster, budget)
        result = make_placer(name).place(problem, budget, 0)
        validate(result.placement, graph, cluster)
        assert result.evaluations <= budget.max_evaluations, name
        if name == "human_expert":
            assert result.info["rule"] == EXPECTED_RULE[graph.metadata["model"]]
        if name == "human_expert_pipeline":
            assert result.info["rule"] == "block_pipeline"


@pytest.mark.parametrize("workload", [w for w in zoo.names() if w.startswith(("rnnlm", "nmt"))])
def test_lstm_layers_spread_over_the_gpus(workload):
    graph = zoo.load(workload)
    cluster = registry.load_cluster("haswell_4k80")
    result = make_placer("human_expert").place(Problem.make(graph, cluster), Budget(), 0)
    layers = sorted({op.scope for op in graph.ops if ".lstm." in f".{op.scope}" and op.scope.count(".") <= 2})
    devices = {s: {int(result.placement[i]) for i, op in enumerate(graph.ops) if op.scope == s} for s in layers}
    assert all(len(d) == 1 for d in devices.values()), devices
    used = [next(iter(d)) for d in devices.values()]
    assert len(set(used)) == min(len(layers), 4)
    softmax = {int(result.placement[i]) for i, op in enumerate(graph.ops) if op.scope.startswith("softmax")}
    assert softmax == {4}
    free = np.array([not op.allowed_kinds or "gpu" in op.allowed_kinds for op in graph.ops])
    assert np.isin(result.placement[free], [1, 2, 3, 4]).all()
