"""The seq2seq placer: it learns, respects budget and constraints (in every sample), and checks its parameters
(the contract it shares with Post is in test_learned.py)."""

from __future__ import annotations

import numpy as np
import pytest

from rl.seq2seq import Seq2SeqPlacer
from suite.errors import PlacebenchError
from suite.placement import validate
from suite.placer import make_placer, placer_names


def test_policy_learns(branchy, k80x2, make_problem):
    # Sampled placements get better as the policy trains: mean score of the last 64 samples against the
    # first 64 (the learning curve stores the running mean, so recover per-batch means from it).
    problem, budget = make_problem(branchy, k80x2, max_evaluations=400)
    Seq2SeqPlacer(grouping="colocation", lr=0.01).place(problem, budget, seed=0)
    curve = problem.evaluator.curve
    sums = np.array([c.mean_score_s * c.evaluations for c in curve])
    first = sums[63] / 64
    last = (sums[-1] - sums[-65]) / 64
    assert last < 0.8 * first


def test_constraints_budget_and_info(train2, k80x2, make_problem, evaluated_rows):
    sampled = evaluated_rows  # every evaluation: the samples and the greedy decode
    problem, budget = make_problem(train2, k80x2, max_evaluations=37)
    result = Seq2SeqPlacer(batch_size=8).place(problem, budget, seed=1)
    validate(result.placement, train2, k80x2)  # colocation groups whole, data on the CPU, loss on a GPU
    # groups: data with layer 0 (CPU only), layer 1 with the loss (GPU only); every sample obeys that
    assert len(sampled) == 37 and all(g[0] == 0 and g[1] in (1, 2) for g in sampled)
    assert result.evaluations == 37  # 4 batches of 8, a batch of 4, and the greedy decode
    assert result.info["groups"] == 2 and result.info["updates"] == 5
    assert result.info["final"] in ("best_sampled", "greedy")
    assert [c.evaluations for c in result.curve] == list(range(1, 38))


def test_registered_and_parameters_checked(train2, k80x2, make_problem):
    assert "seq2seq" in placer_names()
    assert isinstance(make_placer("seq2seq", hidden_size=32), Seq2SeqPlacer)
    with pytest.raises(PlacebenchError, match=r"unknown parameter\(s\) \['nonsense'\]"):
        make_placer("seq2seq", nonsense=1)
    problem, budget = make_problem(train2, k80x2, max_evaluations=5)
    with pytest.raises(PlacebenchError, match="grouping"):
        Seq2SeqPlacer(grouping="bogus").place(problem, budget, seed=0)
    for bad, match in (({"lr": 0.0}, "lr=0.0: must be in"), ({"batch_size": 2.0}, "batch_size=2.0: expected an integer"),
                       ({"max_groups": 0}, "max_groups"), ({"reward": "pos"}, "reward 'pos'"),
                       ({"oom_score_s": float("nan")}, "oom_score_s"),
                       ({"oom_score_s": 0}, "oom_score_s must be None or a finite number > 0, got 0"), ({"bidirectional": 1}, "expected a bool"),
                       ({"oom_score_s": 10**400}, "oom_score_s must be None or a finite number > 0, got an integer of"),
                       ({"lr": 10**400}, "lr=an integer of about 401 digits: expected a finite number"),
                       ({"baseline_decay": 1.0}, "baseline_decay must be below 1"),
                       ({"hidden_size": 33}, "bidirectional encoder needs an even hidden_size")):
        with pytest.raises(PlacebenchError, match=match):  # at construction, so a spec fails before it runs
            make_placer("seq2seq", **bad)
