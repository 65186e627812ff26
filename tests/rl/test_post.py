"""The Post placer: its CE step and tabular policy computed by hand, its schedule of PPO and CE steps, and
its parameters (the contract it shares with seq2seq is in test_learned.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rl.post import PostPlacer, TabularPolicy, cross_entropy_step
from suite.errors import PlacebenchError
from suite.placement import validate
from suite.placer import make_placer, placer_names


def test_cross_entropy_step_by_hand():
    # 2 groups, 3 devices; group 1 may not use device 0. The 2 best of 5 samples (elite_frac 0.4) are
    # samples 3 and 0: group 0 went to devices 2 and 1, group 1 to device 2 twice.
    samples = np.array([[1, 2], [0, 1], [0, 1], [2, 2], [0, 1]])
    rewards = np.array([-1.0, -3.0, -2.5, -0.5, -4.0])
    mask = np.array([[True, True, True], [False, True, True]])
    probs = cross_entropy_step(samples, rewards, mask, elite_frac=0.4, epsilon=0.1)
    expected = np.array([[0.1 / 3, 0.9 * 0.5 + 0.1 / 3, 0.9 * 0.5 + 0.1 / 3],
                         [0.0, 0.1 / 2, 0.9 + 0.1 / 2]])
    np.testing.assert_allclose(probs, expected, rtol=0, atol=1e-15)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0)


def test_tabular_policy_starts_uniform_and_takes_set_probabilities():
    mask = torch.tensor([[True, True, True], [False, True, True]])
    policy = TabularPolicy(mask)
    np.testing.assert_allclose(policy.probabilities(), [[1 / 3] * 3, [0, 0.5, 0.5]], atol=1e-7)
    actions = torch.tensor([[2, 1], [0, 2]])
    out = policy(actions=actions)
    np.testing.assert_allclose(out.log_prob.detach().numpy(), [math.log(1 / 6)] * 2, rtol=1e-6)
    np.testing.assert_allclose(out.entropy.detach().numpy(), [math.log(6)] * 2, rtol=1e-6)
    target = np.array([[0.2, 0.3, 0.5], [0.0, 0.9, 0.1]])
    policy.set_probabilities(target)
    np.testing.assert_allclose(policy.probabilities(), target, atol=1e-6)
    assert policy(1, greedy=True).actions.tolist() == [[2, 1]]
    sampled = policy(2000, generator=torch.Generator().manual_seed(0)).actions
    assert (sampled[:, 1] != 0).all()  # a masked device is never drawn
    assert abs(float((sampled[:, 0] == 2).float().mean()) - 0.5) < 0.05


def test_policy_learns(branchy, k80x2, make_problem):
    # Sampled placements get better: mean score of the last 64 samples against the first 64 (uniform ones).
    problem, budget = make_problem(branchy, k80x2, max_evaluations=320)
    PostPlacer(grouping="colocation").place(problem, budget, seed=0)
    sums = np.array([c.mean_score_s * c.evaluations for c in problem.evaluator.curve])
    first = sums[63] / 64
    last = (sums[-1] - sums[-65]) / 64
    assert last < 0.8 * first


def test_schedule_constraints_budget_and_info(train2, k80x2, make_problem):
    # 37 evaluations, batches of 8, a CE step every 16 samples: 8 (PPO), 8 (CE), 8 (PPO), 8 (CE), 4 (PPO),
    # and the greedy placement.
    problem, budget = make_problem(train2, k80x2, max_evaluations=37)
    result = PostPlacer(batch_size=8, ce_interval=16).place(problem, budget, seed=1)
    validate(result.placement, train2, k80x2)  # colocation groups whole, data on the CPU, loss on a GPU
    assert result.evaluations == 37
    assert (result.info["ppo_updates"], result.info["ce_steps"], result.info["groups"]) == (3, 2, 2)
    assert result.info["final"] in ("best_sampled", "greedy")
    assert [c.evaluations for c in result.curve] == list(range(1, 38))


def test_ce_step_replaces_the_distribution(train2, k80x2, make_problem):
    # With ce_interval = batch_size every batch is a CE step: no PPO update, and the policy is exactly the
    # mixed elite frequencies of the last batch.
    from rl.post import PostSearch

    problem, _ = make_problem(train2, k80x2, max_evaluations=100)
    params = {**PostPlacer.defaults, "batch_size": 10, "ce_interval": 10, "elite_frac": 0.2, "epsilon": 0.3}
    search = PostSearch(problem, params, seed=0)
    r = search.step(10)
    assert search.trainer.updates == 0 and search.ce_steps == 1
    expected = cross_entropy_step(r.group_devices, r.rewards, search.mask, 0.2, 0.3)
    np.testing.assert_allclose(search.policy.probabilities(), expected, atol=1e-6)


def test_registered_and_parameters_checked():
    assert "post" in placer_names()
    assert isinstance(make_placer("post", epsilon=0.2), PostPlacer)
    for bad, match in (({"nonsense": 1}, "nonsense"), ({"epsilon": 1.5}, "epsilon=1.5: must be in"),
                       ({"elite_frac": 0.0}, "elite_frac=0.0: must be in"), ({"max_groups": 0}, "max_groups"),
                       ({"grouping": "bogus"}, "grouping 'bogus'"), ({"reward": "pos"}, "post: reward 'pos'"),
                       ({"final": "worst"}, "post: final 'worst'"),
                       ({"oom_score_s": float("nan")}, "post: oom_score_s must be None or a finite number"),
                       ({"baseline_decay": 1.0}, "baseline_decay must be below 1"),
                       ({"batch_size": 32, "ce_interval": 16}, "ce_interval \\(16\\) must be at least batch_size")):
        with pytest.raises(PlacebenchError, match=match):  # at construction, so a spec fails before it runs
            make_placer("post", **bad)


def test_pure_cross_entropy_keeps_the_policy_finite(train2, k80x2, make_problem):
    # epsilon = 0: devices no elite chose keep a tiny probability, so the PPO steps after a CE step see finite
    # logits (a zero probability would make the entropy and the gradients NaN).
    problem, budget = make_problem(train2, k80x2, max_evaluations=48)
    result = PostPlacer(batch_size=8, ce_interval=16, epsilon=0.0).place(problem, budget, seed=0)
    assert result.info["ce_steps"] == 2 and result.info["ppo_updates"] == 4
    validate(result.placement, train2, k80x2)
    assert all(math.isfinite(c.best_score_s) for c in result.curve)
