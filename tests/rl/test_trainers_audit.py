"""Audit additions for rl.trainers: elite counts, frequencies, clipping, gradient zeroing, the order of the
baseline update, and a PPO step by hand (each hand-checked on a tiny case)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rl.trainers import PPO, Reinforce, apply_gradients, build_optimizer, device_frequencies, elite_indices


def test_elite_count_rounds_up():
    """ceil(0.3 x 4) = 2 elites (not floor = 1), best first."""
    assert elite_indices(np.array([3.0, 1.0, 2.0, 0.0]), 0.3).tolist() == [0, 2]
    assert elite_indices(np.array([3.0, 1.0, 2.0, 0.0]), 0.26).tolist() == [0, 2]  # ceil(1.04) = 2


def test_device_frequencies_are_shares_of_the_samples_not_of_the_groups():
    """1 sample of 2 groups: each group's row is one-hot; 3 samples of 2 groups: shares of 3."""
    assert device_frequencies(np.array([[0, 1]]), 2).tolist() == [[1.0, 0.0], [0.0, 1.0]]
    freq = device_frequencies(np.array([[0, 1], [0, 0], [1, 1]]), 3)
    np.testing.assert_allclose(freq, [[2 / 3, 1 / 3, 0.0], [1 / 3, 2 / 3, 0.0]], rtol=1e-12, atol=0)
    np.testing.assert_allclose(freq.sum(axis=1), 1.0)


def test_apply_gradients_clips_the_global_norm_and_returns_the_norm_before_clipping():
    """grad [3, 4] (norm 5) clipped to norm 1: SGD lr 1 moves w by -[0.6, 0.8]; without a clip by -[3, 4]."""
    w = torch.zeros(2, requires_grad=True)
    opt = build_optimizer([w], 1.0, "sgd")
    norm = apply_gradients(opt, (w * torch.tensor([3.0, 4.0])).sum(), 1.0)
    assert norm == pytest.approx(5.0)
    torch.testing.assert_close(w.detach(), torch.tensor([-0.6, -0.8]))
    w2 = torch.zeros(2, requires_grad=True)
    apply_gradients(build_optimizer([w2], 1.0, "sgd"), (w2 * torch.tensor([3.0, 4.0])).sum(), None)
    torch.testing.assert_close(w2.detach(), torch.tensor([-3.0, -4.0]))


def test_apply_gradients_does_not_accumulate_gradients_across_steps():
    """Two SGD steps (lr 1) on loss = w . [1, 2]: w = -2 x [1, 2], not -(1 + 2) x [1, 2]."""
    w = torch.zeros(2, requires_grad=True)
    opt = build_optimizer([w], 1.0, "sgd")
    for _ in range(2):
        apply_gradients(opt, (w * torch.tensor([1.0, 2.0])).sum(), None)
    torch.testing.assert_close(w.detach(), torch.tensor([-2.0, -4.0]))


def test_reinforce_second_batch_uses_the_baseline_of_earlier_batches():
    """decay 0.5: batch 1 rewards [0, 4] set the baseline to 2; batch 2 rewards [6, 10] get advantages [4, 8]
    against that baseline (not against the baseline already moved by batch 2, 5); log-probs -1: loss =
    mean(advantages) = 6. The baseline then moves to 0.5 x 2 + 0.5 x 8 = 5."""
    lp = torch.tensor([-1.0, -1.0], requires_grad=True)
    tr = Reinforce([lp], baseline_decay=0.5, normalize=False, optimizer="sgd", lr=0.0)
    tr.step(lp, torch.zeros(2), np.array([0.0, 4.0]))
    stats = tr.step(lp, torch.zeros(2), np.array([6.0, 10.0]))
    assert stats["loss"] == 6.0
    assert stats["baseline"] == 5.0


def _ppo_bandit(**kw):
    """A 2-action 'policy' whose log-probabilities are the parameters themselves (theta[a])."""
    theta = torch.zeros(2, requires_grad=True)
    ppo = PPO([theta], optimizer="sgd", grad_clip=None, **kw)
    actions = torch.tensor([0, 1])

    def evaluate(acts):
        return theta[acts], torch.zeros(len(acts))

    return theta, ppo, actions, evaluate


def test_ppo_step_by_hand():
    """Rewards [0, 4]: advantages [-2, 2], divided by their std 2 -> [-1, 1]. loss = -mean(ratio x A) inside the
    trust region, so d loss / d theta_i = -ratio_i A_i / 2 and SGD (lr 0.1) adds 0.05 ratio_i A_i per epoch:
    epoch 1 at ratio 1, epoch 2 at ratio exp(theta_i)."""
    theta, ppo, actions, evaluate = _ppo_bandit(lr=0.1, epochs=2, clip=0.2)
    stats = ppo.step(evaluate, actions, theta.detach()[actions].clone(), np.array([0.0, 4.0]))
    t1 = np.array([-0.05, 0.05])
    expected = t1 + 0.05 * np.exp(t1) * np.array([-1.0, 1.0])
    np.testing.assert_allclose(theta.detach().numpy(), expected, rtol=1e-6)
    assert stats["clip_fraction"] == 0.0  # the last epoch's ratios exp(-0.05), exp(0.05) lie within 1 +- 0.2
    # without normalisation the advantages stay [-2, 2]
    theta, ppo, actions, evaluate = _ppo_bandit(lr=0.1, epochs=1, clip=0.2, normalize=False)
    ppo.step(evaluate, actions, theta.detach()[actions].clone(), np.array([0.0, 4.0]))
    np.testing.assert_allclose(theta.detach().numpy(), [-0.1, 0.1], rtol=1e-6)


def test_ppo_second_batch_uses_the_baseline_of_earlier_batches():
    """Batch 1 [0, 4] sets the baseline to 2; batch 2 [6, 10] has advantages [4, 8] / std 2 = [2, 4] (not against
    the baseline already moved to 0.9 x 2 + 0.1 x 8 = 2.6); one epoch at ratio 1 moves theta by 0.05 x A."""
    theta, ppo, actions, evaluate = _ppo_bandit(lr=0.1, epochs=1, clip=0.2)
    ppo.step(evaluate, actions, theta.detach()[actions].clone(), np.array([0.0, 4.0]))
    before = theta.detach().clone().numpy()
    stats = ppo.step(evaluate, actions, theta.detach()[actions].clone(), np.array([6.0, 10.0]))
    np.testing.assert_allclose(theta.detach().numpy() - before, [0.1, 0.2], rtol=1e-5)
    assert stats["baseline"] == pytest.approx(2.6)


def test_ppo_minibatches_visit_every_sample_once_per_epoch_in_shuffled_order():
    """minibatch_size 1: each epoch re-scores all 5 samples, one at a time, in a fresh permutation (seed 0)."""
    theta, ppo, _, _ = _ppo_bandit(lr=0.0, epochs=4, minibatch_size=1, seed=0)
    seen = []

    def evaluate(idx):  # the "actions" are the sample indices, so the order of the minibatches is visible
        seen.append(int(idx[0]))
        return theta[idx % 2], torch.zeros(len(idx))

    ppo.step(evaluate, torch.arange(5), torch.zeros(5), np.arange(5.0))
    epochs = [seen[5 * e : 5 * e + 5] for e in range(4)]
    assert len(seen) == 20 and all(sorted(e) == [0, 1, 2, 3, 4] for e in epochs)
    assert any(e != [0, 1, 2, 3, 4] for e in epochs)
