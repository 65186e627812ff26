"""What every learned placer (seq2seq, Post, Placeto, HSDAG) guarantees: near the brute-force optimum on a tiny
graph, the same placement for the same seed, the caller's torch RNG untouched, and an answer within a
budget of one evaluation."""

from __future__ import annotations

import pytest
import torch

from rl.hsdag import HSDAGPlacer
from rl.placeto import PlacetoPlacer
from rl.post import PostPlacer
from rl.seq2seq import Seq2SeqPlacer
from suite.placement import validate

PLACERS = [Seq2SeqPlacer, PostPlacer, PlacetoPlacer, HSDAGPlacer]
SMALL = {HSDAGPlacer: {"steps": 8}}  # placers without batch_size: their own small unit of sampling


@pytest.mark.parametrize("placer", PLACERS)
def test_within_five_percent_of_brute_force_optimum(placer, branchy, k80x2, make_problem, brute_force_optimum):
    optimum = brute_force_optimum(branchy, k80x2)  # 3^8 = 6561 placements
    problem, budget = make_problem(branchy, k80x2, max_evaluations=300)
    result = placer(grouping="colocation").place(problem, budget, seed=0)
    found = problem.evaluator.measure(result.placement)
    assert found.status == "ok"
    assert found.step_time_s <= 1.05 * optimum
    assert result.evaluations == 300 == len(result.curve)


@pytest.mark.parametrize("placer", PLACERS)
def test_same_seed_same_placement(placer, train2, k80x2, make_problem):
    runs = []
    for _ in range(2):
        problem, budget = make_problem(train2, k80x2, max_evaluations=40)
        runs.append(placer(**SMALL.get(placer, {"batch_size": 8})).place(problem, budget, seed=3))
    assert runs[0].placement.tolist() == runs[1].placement.tolist()
    assert [c.best_score_s for c in runs[0].curve] == [c.best_score_s for c in runs[1].curve]


@pytest.mark.parametrize("placer", PLACERS)
def test_global_torch_rng_untouched(placer, train2, k80x2, make_problem):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    problem, budget = make_problem(train2, k80x2, max_evaluations=5)
    placer().place(problem, budget, seed=9)
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("placer", PLACERS)
def test_tiny_budget(placer, train2, k80x2, make_problem):
    problem, budget = make_problem(train2, k80x2, max_evaluations=1)
    result = placer().place(problem, budget, seed=0)
    assert result.evaluations == 1 and result.info["final"] == "greedy"
    validate(result.placement, train2, k80x2)
