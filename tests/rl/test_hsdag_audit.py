"""Audit additions for rl.hsdag: the GCN's normalised adjacency by hand, the episode's state updates, its
dropout stream (the search's own, advancing), the moving baseline and the weight it gives the update, and the
cluster counts it reports."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import rl.hsdag
from rl.hsdag import HSDAGPlacer, HSDAGSearch, episode_return, normalized_adjacency
from rl.nets import masked_categorical
from rl.reward import RewardEvaluator
from suite.errors import BudgetExhausted, PlacebenchError


def test_normalized_adjacency_by_hand():
    # path 0 - 1 - 2 with self-loops: degrees 2, 3, 2; entry (i, j) = 1 / sqrt(d_i d_j) where joined
    adj = np.array([[0, 1, 0], [1, 0, 1], [0, 1, 0]], dtype=bool)
    a, b = 1 / 2, 1 / math.sqrt(6)
    expected = [[a, b, 0], [b, 1 / 3, b], [0, b, a]]
    np.testing.assert_allclose(normalized_adjacency(adj).numpy(), expected, rtol=1e-6)


def _search(problem, seed=0, **params):
    return HSDAGSearch(problem, {**HSDAGPlacer.defaults, "grouping": "colocation", **params}, seed=seed)


def test_each_placement_of_an_episode_is_parsed_from_features_plus_the_last_embeddings(branchy, k80x2,
                                                                                      make_problem):
    problem, _ = make_problem(branchy, k80x2, max_evaluations=50)
    s = _search(problem, steps=3, dropout=0.0)
    calls = []
    forward = s.policy.forward

    def spy(x):
        out = forward(x)
        calls.append((x.detach().clone(), out[1].detach().clone(), out[2].copy()))
        return out

    s.policy.forward = spy
    assert s.episode(reserve=0)
    assert len(calls) == 3 and torch.equal(calls[0][0], s.x0)
    for (x, emb, cluster_of), (nxt, _, _) in zip(calls[:-1], calls[1:], strict=True):
        torch.testing.assert_close(nxt, x + emb[torch.as_tensor(cluster_of)])


def _params_after_one_episode(problem_maker, global_seed):
    problem, _ = problem_maker()
    torch.manual_seed(global_seed)  # the caller's global RNG must not matter
    s = _search(problem, steps=4)  # dropout 0.2
    assert s.episode(reserve=0)
    return [p.detach().clone() for p in s.policy.parameters()], s


def test_dropout_draws_from_the_search_stream_not_the_callers(branchy, k80x2, make_problem):
    make = lambda: make_problem(branchy, k80x2, max_evaluations=50)  # noqa: E731
    a, s = _params_after_one_episode(make, 1)
    b, _ = _params_after_one_episode(make, 2)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    before = s.rng_state.clone()
    assert s.episode(reserve=0)
    assert not torch.equal(s.rng_state, before)  # the stream advances: the next episode draws new masks


def test_moving_baseline_and_the_weight_of_the_update(branchy, k80x2, make_problem, monkeypatch):
    """baseline "moving": the first return is the baseline (weight 0); the second episode's weight is
    (R2 - R1) / |R1|, the gradient reaching every log-probability is -weight; the baseline moves to
    0.9 R1 + 0.1 R2."""
    rewards = []
    inner = RewardEvaluator.__call__

    def spy(self, gd):
        r = inner(self, gd)
        rewards.append(r.rewards.copy())
        return r

    monkeypatch.setattr(RewardEvaluator, "__call__", spy)
    grads = []
    real = rl.hsdag.masked_categorical

    def hooked(*args, **kw):
        a, logp, ent = real(*args, **kw)
        if logp.requires_grad:
            logp.register_hook(lambda g: grads.append(g.clone()))
        return a, logp, ent

    monkeypatch.setattr(rl.hsdag, "masked_categorical", hooked)
    problem, _ = make_problem(branchy, k80x2, max_evaluations=50)
    s = _search(problem, steps=3, baseline="moving")
    assert s.episode(reserve=0)
    r1 = episode_return(rewards[0], 0.95)
    assert s.baseline == pytest.approx(r1, rel=1e-12)
    assert all(torch.all(g == 0) for g in grads)  # weight (R1 - R1) / |R1| = 0
    grads.clear()
    assert s.episode(reserve=0)
    r2 = episode_return(rewards[1], 0.95)
    weight = (r2 - r1) / abs(r1)
    assert abs(weight) > 1e-6 and len(grads) == 3
    for g in grads:
        torch.testing.assert_close(g, torch.full_like(g, -weight), rtol=1e-5, atol=1e-9)
    assert s.baseline == pytest.approx(0.9 * r1 + 0.1 * r2, rel=1e-12)


def test_clusters_are_reported_only_for_sampled_placements(train2, k80x2, make_problem):
    """With a budget of one evaluation (kept for the greedy placement) nothing is sampled: no cluster count (it
    said 0 clusters); with one episode of 3 placements, their mean and the last one's."""
    problem, budget = make_problem(train2, k80x2, max_evaluations=1)
    info = HSDAGPlacer(steps=3).place(problem, budget, seed=0).info
    assert (info["episodes"], info["clusters_mean"], info["clusters_last"]) == (0, None, None)
    problem, _ = make_problem(train2, k80x2, max_evaluations=4)
    search = HSDAGSearch(problem, {**HSDAGPlacer.defaults, "steps": 3}, seed=0)
    assert search.episode(reserve=1)
    assert len(search.clusters) == 3 and all(c >= 1 for c in search.clusters)
    info = search.info()
    assert (info["clusters_mean"], info["clusters_last"]) == (sum(search.clusters) / 3, search.clusters[-1])


def test_greedy_is_parsed_without_dropout_and_leaves_the_policy_training(branchy, k80x2, make_problem):
    problem, _ = make_problem(branchy, k80x2, max_evaluations=10)
    s = _search(problem, dropout=0.9)
    with torch.no_grad():  # larger weights: here dropout would move the most likely device (from gpu:1 to cpu:0)
        for w in s.policy.parameters():
            w.mul_(3.0)
    torch.manual_seed(0)  # the draws dropout would take in train mode
    got = s.greedy()
    assert s.policy.training
    s.policy.eval()
    with torch.no_grad():
        logits, _, cluster_of = s.policy(s.x0)
    want, _, _ = masked_categorical(logits, s._cluster_mask(cluster_of), greedy=True)
    assert got.tolist() == want.numpy()[cluster_of].tolist() == [2] * 8


def test_an_update_whose_gradient_norm_overflows_is_refused(branchy, k80x2, make_problem, monkeypatch):
    """HSDAG steps Adam itself, unclipped by default: returns of about 1e22 (inside loss_weights' range) made
    the gradient's squares overflow and the policy's weights NaN. The update is now refused, weights kept."""
    inner = RewardEvaluator.__call__

    def huge(self, gd):
        r = inner(self, gd)
        r.rewards = r.rewards * 1e20
        return r

    monkeypatch.setattr(RewardEvaluator, "__call__", huge)
    problem, _ = make_problem(branchy, k80x2, max_evaluations=50)
    s = _search(problem, steps=3)
    before = [p.detach().clone() for p in s.policy.parameters()]
    with pytest.raises(PlacebenchError, match="gradient norm"):
        s.episode(reserve=0)
    assert all(torch.equal(p, b) for p, b in zip(s.policy.parameters(), before, strict=True))


def test_clusters_count_only_placements_that_were_evaluated(train2, k80x2, make_problem, monkeypatch):
    """An episode whose batch the evaluator refuses for time (`BudgetExhausted`) evaluates nothing, so its
    placements are not in `clusters_mean`: after one evaluated episode of 3, a refused one of 3 leaves the 3
    counts of the first (they were 6, half of them for placements never run)."""
    problem, _ = make_problem(train2, k80x2, max_evaluations=50)
    s = HSDAGSearch(problem, {**HSDAGPlacer.defaults, "steps": 3}, seed=0)
    assert s.episode(reserve=0)
    evaluated = list(s.clusters)
    assert len(evaluated) == 3

    def refuse(placements):
        raise BudgetExhausted("search time budget of 1 s is spent")

    monkeypatch.setattr(problem.evaluator, "evaluate_batch", refuse)
    assert not s.episode(reserve=0)
    assert s.clusters == evaluated and s.episodes == 1
    assert s.info()["clusters_mean"] == sum(evaluated) / 3 and s.info()["clusters_last"] == evaluated[-1]
