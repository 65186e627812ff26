"""Audit additions for rl.post: the CE step's frequencies when elites and groups differ in number, and what
a search does around a CE step (the window it reads, Adam's moments, the baseline) and in a PPO step."""

from __future__ import annotations

import numpy as np
import torch

from rl.post import PostPlacer, PostSearch, cross_entropy_step


def test_cross_entropy_step_with_more_elites_than_groups():
    # 1 group, 2 devices; elites (elite_frac 0.75 of 4 -> 3): samples 0, 2, 3 -> devices 1, 1, 0
    probs = cross_entropy_step(np.array([[1], [0], [1], [0]]), np.array([3.0, 0.0, 2.0, 1.0]),
                               np.ones((1, 2), dtype=bool), elite_frac=0.75, epsilon=0.0)
    np.testing.assert_allclose(probs, [[1 / 3, 2 / 3]], rtol=1e-12)


def _search(problem, **kw):
    return PostSearch(problem, {**PostPlacer.defaults, "grouping": "colocation", "batch_size": 8, **kw}, seed=0)


def test_ce_step_reads_every_batch_since_the_last_one_and_resets_adam(branchy, k80x2, make_problem):
    problem, _ = make_problem(branchy, k80x2, max_evaluations=100)
    s = _search(problem, ce_interval=16, elite_frac=0.25, epsilon=0.1)
    r1 = s.step(8)  # a PPO update: Adam has moments
    assert s.trainer.updates == 1 and len(s.trainer.optimizer.state) > 0
    b1 = s.trainer.baseline.value
    assert b1 == r1.rewards.mean()
    r2 = s.step(8)  # 16 samples: a CE step on both batches
    assert len(set(np.concatenate([r1.rewards, r2.rewards]).tolist())) > 4  # elites by reward, not by ties
    assert s.ce_steps == 1 and s.trainer.updates == 1
    expected = cross_entropy_step(np.concatenate([r1.group_devices, r2.group_devices]),
                                  np.concatenate([r1.rewards, r2.rewards]), s.mask, 0.25, 0.1)
    np.testing.assert_allclose(s.policy.probabilities(), expected, atol=1e-6)
    assert len(s.trainer.optimizer.state) == 0  # the moments of the replaced distribution are gone
    # the CE batch still moves the baseline (the moving average as rl.trainers.reinforce writes it, 1 - 0.9 != 0.1)
    assert s.trainer.baseline.value == 0.9 * b1 + (1.0 - 0.9) * r2.rewards.mean()


def test_ppo_step_raises_the_advantage_weighted_log_likelihood(branchy, k80x2, make_problem):
    problem, _ = make_problem(branchy, k80x2, max_evaluations=100)
    s = _search(problem, ce_interval=64, ppo_epochs=2, lr=0.01)
    before = [p.detach().clone() for p in s.policy.parameters()]
    r = s.step(8)
    assert s.trainer.updates == 1 and len(set(r.rewards.tolist())) > 1
    adv = r.rewards - r.rewards.mean()  # first batch: the baseline is its own mean
    actions = torch.as_tensor(r.group_devices)
    with torch.no_grad():
        after = float((torch.as_tensor(adv, dtype=torch.float32) * s.policy(actions=actions).log_prob).sum())
        for p, b in zip(s.policy.parameters(), before, strict=True):
            p.copy_(b)
        start = float((torch.as_tensor(adv, dtype=torch.float32) * s.policy(actions=actions).log_prob).sum())
    assert after > start


def test_ce_step_comes_every_ce_interval_samples_when_batch_size_does_not_divide_it(branchy, k80x2, make_problem):
    """ce_interval 40, batches of 16: the third batch of an interval is cut to 8, so the CE step reads exactly
    40 samples (16, 16, 8) and the next interval starts at sample 41. It came at the first multiple of 16 at or
    past 40 (48 samples, then 96), so the interval was 48."""
    problem, _ = make_problem(branchy, k80x2, max_evaluations=200)
    s = _search(problem, batch_size=16, ce_interval=40, elite_frac=0.25, epsilon=0.1)
    rs = [s.step(16), s.step(16)]
    assert s.ce_steps == 0 and s.trainer.updates == 2
    rs.append(s.step(16))
    assert [len(r.rewards) for r in rs] == [16, 16, 8] and problem.evaluator.evaluations_used == 40
    assert s.ce_steps == 1 and s.trainer.updates == 2
    expected = cross_entropy_step(np.concatenate([r.group_devices for r in rs]),
                                  np.concatenate([r.rewards for r in rs]), s.mask, 0.25, 0.1)
    np.testing.assert_allclose(s.policy.probabilities(), expected, atol=1e-6)
    assert [len(s.step(16).rewards) for _ in range(3)] == [16, 16, 8] and s.ce_steps == 2  # at sample 80
    assert s.trainer.updates == 4


def test_placer_runs_ce_steps_at_multiples_of_ce_interval(train2, k80x2, make_problem, monkeypatch):
    """60 evaluations, final "best": batches 16, 16, 8 (CE at 40), 16, 4: 4 PPO updates and 1 CE step (it was
    16, 16, 16 (CE at 48), 12: 3 PPO updates; the CE step read 48 samples)."""
    problem, budget = make_problem(train2, k80x2, max_evaluations=60)
    seen = []
    inner = PostSearch.step

    def spy(self, k):
        r = inner(self, k)
        seen.append((len(r.rewards), self.ce_steps))
        return r

    monkeypatch.setattr(PostSearch, "step", spy)
    result = PostPlacer(batch_size=16, ce_interval=40, final="best").place(problem, budget, seed=0)
    assert seen == [(16, 0), (16, 0), (8, 1), (16, 1), (4, 1)]
    assert (result.info["ppo_updates"], result.info["ce_steps"], result.evaluations) == (4, 1, 60)
