"""Trainers shared by the learned placers: REINFORCE, PPO and the cross-entropy method.

Trainers know nothing of graphs or devices. A policy gives, for a batch of sampled actions, their summed
log-probabilities and entropies (torch tensors [B] with gradients); the trainer turns rewards (numpy [B],
higher is better) into a parameter update. Rewards of one-shot placements are bandit rewards; for
iterative placers (Placeto) `discounted_returns` gives per-step returns to use as rewards.
"""

from __future__ import annotations

import numpy as np

from rl.trainers.cem import CEMTrainer, CrossEntropyMethod, device_frequencies, elite_indices
from rl.trainers.common import apply_gradients, build_optimizer, loss_weights, scale_advantages
from rl.trainers.ppo import PPO
from rl.trainers.reinforce import MovingAverageBaseline, Reinforce

__all__ = [
    "PPO",
    "CEMTrainer",
    "CrossEntropyMethod",
    "MovingAverageBaseline",
    "Reinforce",
    "apply_gradients",
    "build_optimizer",
    "device_frequencies",
    "discounted_returns",
    "elite_indices",
    "loss_weights",
    "scale_advantages",
]


def discounted_returns(rewards: np.ndarray, gamma: float) -> np.ndarray:
    """Returns G_t = sum_k gamma^k r_{t+k} along the last axis (episodes of equal length)."""
    r = np.asarray(rewards, dtype=np.float64)
    out = np.zeros_like(r)
    acc = np.zeros(r.shape[:-1])
    for t in range(r.shape[-1] - 1, -1, -1):
        acc = r[..., t] + gamma * acc
        out[..., t] = acc
    return out
