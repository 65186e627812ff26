"""Trainers learn simple bandits; baselines, returns and elites computed by hand."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

from rl.nets import masked_categorical
from rl.trainers import (
    PPO,
    CEMTrainer,
    CrossEntropyMethod,
    MovingAverageBaseline,
    Reinforce,
    apply_gradients,
    build_optimizer,
    discounted_returns,
    elite_indices,
    loss_weights,
    scale_advantages,
)
from suite.errors import PlacebenchError

# A 3-group, 3-device bandit: reward = -(number of groups not on their best device); best = [2, 0, 1].
BEST = np.array([2, 0, 1])
MASK = torch.ones(3, 3, dtype=torch.bool)


def bandit_reward(actions: np.ndarray) -> np.ndarray:
    return -(actions != BEST).sum(axis=1).astype(float)


def sample(logits: torch.Tensor, k: int, gen: torch.Generator, actions=None):
    a, lp, ent = masked_categorical(logits.expand(k, -1, -1).reshape(-1, 3), MASK[0], generator=gen,
                                    actions=None if actions is None else actions.reshape(-1))
    return a.reshape(k, 3), lp.reshape(k, 3).sum(1), ent.reshape(k, 3).sum(1)


def test_moving_average_baseline():
    b = MovingAverageBaseline(0.5)
    assert b.advantages(np.array([1.0, 3.0])).tolist() == [-1.0, 1.0]  # first batch: its own mean
    b.update(np.array([1.0, 3.0]))
    assert b.value == 2.0
    b.update(np.array([4.0]))
    assert b.value == 3.0
    assert b.advantages(np.array([5.0])).tolist() == [2.0]


def test_moving_average_baseline_keeps_decay_of_the_old_value():
    b = MovingAverageBaseline(0.9)
    b.update(np.array([2.0]))
    b.update(np.array([3.0, 5.0]))  # batch mean 4
    assert b.value == pytest.approx(0.9 * 2.0 + 0.1 * 4.0, rel=1e-12)  # 2.2
    assert b.advantages(np.array([3.2])).tolist() == pytest.approx([1.0], rel=1e-12)


def test_scale_advantages_divides_by_the_batch_std():
    assert scale_advantages(np.array([0.0, 4.0]), True).tolist() == [0.0, 2.0]  # std 2
    assert scale_advantages(np.array([0.0, 4.0]), False).tolist() == [0.0, 4.0]
    assert scale_advantages(np.array([3.0, 3.0]), True).tolist() == [3.0, 3.0]  # std 0: left alone
    assert scale_advantages(np.array([4.0]), True).tolist() == [4.0]  # one sample: no std


def test_scale_advantages_of_huge_penalties_does_not_overflow():
    """The squares of 1e300 overflow: the std was inf, every advantage became 0 and the policy never learned."""
    adv = np.array([-1e300, 1e300])  # std 1e300
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert scale_advantages(adv, True).tolist() == [-1.0, 1.0]


def test_reinforce_step_loss_by_hand():
    """Rewards [0, 4]: first-batch baseline 2, advantages [-2, 2], scaled by std 2 to [-1, 1]."""
    lp = torch.tensor([-1.0, -3.0], requires_grad=True)
    stats = Reinforce([lp], normalize=True).step(lp, torch.zeros(2), np.array([0.0, 4.0]))
    assert stats["loss"] == -(-1.0 * -1.0 + 1.0 * -3.0) / 2  # 1.0
    assert stats["baseline"] == 2.0
    lp = torch.tensor([-1.0, -3.0], requires_grad=True)
    stats = Reinforce([lp], normalize=False).step(lp, torch.zeros(2), np.array([0.0, 4.0]))
    assert stats["loss"] == -(-2.0 * -1.0 + 2.0 * -3.0) / 2  # 2.0


def test_entropy_bonus_lowers_the_loss():
    """loss = -mean(A log pi) - coef * mean(H): with zero advantages, -0.5 * mean([1, 3]) = -1."""
    ent = torch.tensor([1.0, 3.0], requires_grad=True)
    tr = Reinforce([ent], entropy_coef=0.5)
    loss = tr.loss(torch.zeros(2), ent, np.zeros(2))
    assert loss.item() == -1.0
    loss.backward()
    assert ent.grad.tolist() == [-0.25, -0.25]
    ppo = PPO([ent], entropy_coef=0.5)
    assert ppo.loss(torch.zeros(2), torch.zeros(2), ent, torch.zeros(2))[0].item() == -1.0
    assert CEMTrainer([ent], entropy_coef=0.5).step(torch.zeros(2), ent, np.zeros(2))["loss"] == -1.0


def test_entropy_bonus_spreads_a_policy_when_rewards_are_equal():
    logits = torch.tensor([[2.0, 0.0, 0.0]], requires_grad=True)
    tr = Reinforce([logits], lr=0.1, entropy_coef=1.0, optimizer="sgd")
    actions = torch.tensor([0, 1])
    _, lp, ent = masked_categorical(logits.expand(2, -1), MASK[0], actions=actions)
    before = ent[0].item()
    tr.step(lp, ent, np.array([1.0, 1.0]))  # zero advantages: only the entropy bonus moves the logits
    after = masked_categorical(logits.detach(), MASK[0], actions=actions[:1])[2].item()
    assert after > before


def test_discounted_returns():
    assert discounted_returns(np.array([1.0, 0.0, 2.0]), 0.5).tolist() == [1.5, 1.0, 2.0]
    assert discounted_returns(np.ones((2, 2)), 1.0).tolist() == [[2.0, 1.0], [2.0, 1.0]]


def test_elite_indices():
    assert elite_indices(np.array([0.0, 3.0, 1.0, 3.0]), 0.5).tolist() == [1, 3]
    assert elite_indices(np.array([1.0, 2.0]), 0.01).tolist() == [1]


def test_reinforce_learns_bandit():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    logits = torch.zeros(3, 3, requires_grad=True)
    tr = Reinforce([logits], lr=0.1, entropy_coef=0.0)
    for _ in range(60):
        a, lp, ent = sample(logits, 16, gen)
        tr.step(lp, ent, bandit_reward(a.numpy()))
    assert logits.argmax(1).tolist() == BEST.tolist()
    assert torch.softmax(logits, 1).max(1).values.min() > 0.9


def test_reinforce_rejects_mismatched_shapes():
    logits = torch.zeros(3, requires_grad=True)
    with pytest.raises(ValueError, match=r"log_prob has shape \(3,\), rewards \(2,\)"):
        Reinforce([logits]).step(logits, logits, np.zeros(2))


def test_ppo_learns_bandit():
    gen = torch.Generator().manual_seed(1)
    logits = torch.zeros(3, 3, requires_grad=True)
    tr = PPO([logits], lr=0.05, epochs=4, minibatch_size=8, clip=0.2)
    for _ in range(40):
        with torch.no_grad():
            a, lp, _ = sample(logits, 16, gen)
        stats = tr.step(lambda acts: sample(logits, len(acts), gen, acts)[1:], a, lp, bandit_reward(a.numpy()))
    assert logits.argmax(1).tolist() == BEST.tolist()
    assert 0.0 <= stats["clip_fraction"] <= 1.0


def test_ppo_clipping_stops_gradient_outside_the_trust_region():
    tr = PPO([torch.zeros(1, requires_grad=True)], clip=0.2)
    lp = torch.tensor([np.log(1.5)], requires_grad=True)  # ratio 1.5 > 1.2 with positive advantage
    loss, frac = tr.loss(lp, torch.zeros(1), torch.zeros(1), torch.ones(1))
    loss.backward()
    assert lp.grad.item() == 0.0 and frac.item() == 1.0


def test_cem_tabular_finds_optimum():
    cem = CrossEntropyMethod(np.ones((3, 3), dtype=bool), elite_frac=0.2, smoothing=0.7, seed=0)
    for _ in range(15):
        s = cem.sample(30)
        cem.update(s, bandit_reward(s))
    assert cem.mode().tolist() == BEST.tolist()


def test_cem_update_by_hand():
    """Elites (the best half) [0, 1] and [0, 0]: frequencies [1, 0] and [1/2, 1/2]; with smoothing 0.7 the
    uniform start moves to 0.7 * freq + 0.3 * [1/2, 1/2]."""
    cem = CrossEntropyMethod(np.ones((2, 2), dtype=bool), elite_frac=0.5, smoothing=0.7, seed=0)
    samples = np.array([[1, 1], [0, 1], [1, 0], [0, 0]])
    stats = cem.update(samples, np.array([-1.0, 2.0, 0.0, 1.0]))
    assert stats["elites"] == 2
    assert np.allclose(cem.probs, [[0.85, 0.15], [0.5, 0.5]], rtol=1e-12, atol=0)
    # a second update starts from these probabilities: elites [1, 1] twice
    cem.update(np.array([[1, 1], [1, 1], [0, 0]]), np.array([1.0, 1.0, 0.0]))
    assert np.allclose(cem.probs, [[0.3 * 0.85, 0.7 + 0.3 * 0.15], [0.15, 0.85]], rtol=1e-12, atol=0)


def test_cem_update_keeps_min_prob_on_allowed_devices():
    cem = CrossEntropyMethod(np.array([[True, True, False]]), elite_frac=1.0, smoothing=1.0, min_prob=1e-3)
    cem.update(np.array([[0]]), np.array([0.0]))
    assert np.allclose(cem.probs, [[1 / 1.001, 1e-3 / 1.001, 0.0]], rtol=1e-12, atol=0)


def test_cem_respects_mask():
    mask = np.array([[True, False], [False, True]])
    cem = CrossEntropyMethod(mask, seed=0)
    s = cem.sample(100)
    assert (s[:, 0] == 0).all() and (s[:, 1] == 1).all()
    with pytest.raises(ValueError, match="every group needs at least one allowed device"):
        CrossEntropyMethod(np.zeros((1, 2), dtype=bool))


@pytest.mark.parametrize("u", [0.0, 1.0 - 2.0**-53])
def test_cem_never_draws_a_masked_device_at_the_edges_of_the_unit_interval(u):
    """The row's cdf can end at 0.9999999999999998; the largest draw then must not fall past the last allowed
    device, and a draw of exactly 0 must not pick a masked first device."""
    mask = np.array([[True, True, True, True, True, False], [False, True, True, True, True, True]])
    cem = CrossEntropyMethod(mask, seed=0)
    row = [0.1465147241904673, 0.30421738506123214, 0.030096550931734904, 0.24559111422382107, 0.2735802255927444]
    cem.probs = np.array([row + [0.0], [0.0] + row])
    assert np.cumsum(cem.probs[0])[-1] < 1.0 - 2.0**-53  # the rounding this test is about
    cem.rng = type("FixedDraws", (), {"random": lambda self, shape: np.full(shape, u)})()
    assert mask[np.arange(2), cem.sample(1)[0]].all()


def test_cem_trainer_learns_bandit():
    gen = torch.Generator().manual_seed(2)
    logits = torch.zeros(3, 3, requires_grad=True)
    tr = CEMTrainer([logits], lr=0.1, elite_frac=0.25)
    for _ in range(40):
        a, lp, ent = sample(logits, 16, gen)
        tr.step(lp, ent, bandit_reward(a.numpy()))
    assert logits.argmax(1).tolist() == BEST.tolist()


def test_loss_weights_beyond_float32_are_an_error_naming_the_cause():
    """float32 holds up to 3.4e38: a larger advantage became inf, the loss inf or NaN, and the next logits NaN."""
    w = loss_weights(np.array([-3e38, 1.0]))
    assert w.dtype == torch.float32 and w.tolist() == [np.float32(-3e38), 1.0]
    with pytest.raises(PlacebenchError, match=r"reach 4e\+38, beyond torch.float32's range .*lower oom_score_s"):
        loss_weights(np.array([1.0, -4e38]))
    with pytest.raises(PlacebenchError, match="reach nan"):
        loss_weights(float("nan"))
    assert loss_weights(np.array([4e38]), torch.float64).tolist() == [4e38]


@pytest.mark.parametrize("grad_clip", [1.0, None])
def test_an_update_whose_gradient_norm_overflows_float32_is_refused(grad_clip):
    """Weights of 1e20, inside loss_weights' range, give a gradient norm whose square passes float32's 3.4e38:
    clipped, the update was scaled by 1 / inf = 0 and did nothing without a word; unclipped, Adam's squared
    gradients overflowed and the logits became NaN. The update is now refused and the parameters kept."""
    logits = torch.zeros(3, 3, requires_grad=True)
    actions = torch.tensor([[2, 0, 1], [0, 1, 2]])
    rewards = np.array([1e20, -1e20])
    trainer = Reinforce([logits], lr=0.1, normalize=False, grad_clip=grad_clip)
    _, lp, ent = sample(logits, 2, torch.Generator().manual_seed(0), actions)
    with pytest.raises(PlacebenchError, match="gradient norm is (inf|nan).*too large"):
        trainer.step(lp, ent, rewards)
    assert torch.equal(logits, torch.zeros(3, 3)) and trainer.updates == 0
    _, lp, ent = sample(logits, 2, torch.Generator().manual_seed(0), actions)
    info = trainer.step(lp, ent, rewards / 1e3)  # 1e17: the norm (about 1e17) stays in range; the update moves
    assert math.isfinite(info["grad_norm"]) and info["grad_norm"] > 1e16
    assert torch.isfinite(logits).all() and not torch.equal(logits, torch.zeros(3, 3))


def test_apply_gradients_refuses_a_norm_whose_square_overflows_even_when_the_norm_is_finite():
    """One parameter with gradient 2e19: its norm is 2e19 (finite), but Adam's squared gradient 4e38 is beyond
    float32, so the second moment became inf and the parameter stopped moving for good, without a word."""
    p = torch.nn.Parameter(torch.zeros(1))
    opt = build_optimizer([p], 0.1)
    with pytest.raises(PlacebenchError, match=r"gradient norm is 2e\+19, whose square is beyond .*float32"):
        apply_gradients(opt, 2e19 * p.sum(), None)
    assert p.item() == 0.0 and not opt.state
    assert apply_gradients(opt, 1e18 * p.sum(), None) == pytest.approx(1e18)  # within range: one Adam step of lr
    assert p.item() == pytest.approx(-0.1)
