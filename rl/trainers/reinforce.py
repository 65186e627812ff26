"""REINFORCE (Williams 1992) with a moving-average baseline and an entropy bonus.

loss = -mean_b[(R_b - baseline) * log pi(a_b)] - entropy_coef * mean_b[H_b]

The baseline is an exponential moving average of the batch-mean reward, B <- decay * B + (1 - decay) * mean
(Mirhoseini et al. 2017 use a moving-average baseline; the authors' released controller uses decay 0.9).
It starts at the first batch's mean reward. With `normalize`, advantages are divided by the batch
standard deviation (ours: makes one learning rate work for step times of milliseconds and of seconds).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from rl.trainers.common import apply_gradients, build_optimizer, loss_weights, scale_advantages


class MovingAverageBaseline:
    """Exponential moving average of mean rewards; `None` until the first update."""

    def __init__(self, decay: float = 0.9):
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"baseline decay must be in [0, 1), got {decay}")
        self.decay = decay
        self.value: float | None = None

    def advantages(self, rewards: np.ndarray) -> np.ndarray:
        rewards = np.asarray(rewards, dtype=np.float64)
        base = float(rewards.mean()) if self.value is None else self.value
        return rewards - base

    def update(self, rewards: np.ndarray) -> None:
        mean = float(np.mean(rewards))
        self.value = mean if self.value is None else self.decay * self.value + (1.0 - self.decay) * mean


class Reinforce:
    """Policy-gradient updates from sampled actions' log-probabilities, entropies and rewards."""

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        *,
        lr: float = 1e-3,
        baseline_decay: float = 0.9,
        entropy_coef: float = 0.0,
        grad_clip: float | None = 1.0,
        normalize: bool = True,
        optimizer: str = "adam",
    ):
        self.optimizer = build_optimizer(params, lr, optimizer)
        self.baseline = MovingAverageBaseline(baseline_decay)
        self.entropy_coef = entropy_coef
        self.grad_clip = grad_clip
        self.normalize = normalize
        self.updates = 0

    def loss(self, log_prob: torch.Tensor, entropy: torch.Tensor, advantages: np.ndarray) -> torch.Tensor:
        adv = loss_weights(advantages, log_prob.dtype)
        return -(adv * log_prob).mean() - self.entropy_coef * entropy.mean()

    def step(self, log_prob: torch.Tensor, entropy: torch.Tensor, rewards: np.ndarray) -> dict[str, Any]:
        """One update; `log_prob` and `entropy` are [B] tensors with gradients, `rewards` [B]."""
        rewards = np.asarray(rewards, dtype=np.float64)
        if log_prob.shape != (len(rewards),):
            raise ValueError(f"log_prob has shape {tuple(log_prob.shape)}, rewards {rewards.shape}")
        adv = scale_advantages(self.baseline.advantages(rewards), self.normalize)
        loss = self.loss(log_prob, entropy, adv)
        norm = apply_gradients(self.optimizer, loss, self.grad_clip)
        self.baseline.update(rewards)
        self.updates += 1
        return {"loss": float(loss.detach()), "grad_norm": norm, "baseline": self.baseline.value,
                "entropy": float(entropy.detach().mean())}
