"""PPO with clipping (Schulman et al. 2017) for placement policies.

Post (Gao et al., NeurIPS 2018) trains its placement policy with PPO; Placeto and HSDAG variants use it
too. Each update takes a batch of sampled actions with the log-probabilities they had when sampled, and
runs `epochs` passes (optionally in minibatches) of

    loss = -mean[min(ratio * A, clip(ratio, 1 - clip, 1 + clip) * A)] - entropy_coef * mean[H]

where ratio = pi_new(a) / pi_old(a) and A = (R - baseline) (moving average), scaled by the batch standard
deviation when `normalize`. The policy is re-evaluated on the stored actions through `evaluate_actions`,
a callable that maps actions to (log_prob [B], entropy [B]) with gradients.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch

from rl.trainers.common import apply_gradients, build_optimizer, loss_weights, scale_advantages
from rl.trainers.reinforce import MovingAverageBaseline

EvaluateActions = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class PPO:
    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        *,
        lr: float = 1e-3,
        clip: float = 0.2,
        epochs: int = 4,
        minibatch_size: int | None = None,
        baseline_decay: float = 0.9,
        entropy_coef: float = 0.0,
        grad_clip: float | None = 1.0,
        normalize: bool = True,
        optimizer: str = "adam",
        seed: int = 0,
    ):
        if clip <= 0:
            raise ValueError(f"PPO clip must be positive, got {clip}")
        if epochs < 1:
            raise ValueError(f"PPO epochs must be at least 1, got {epochs}")
        self.optimizer = build_optimizer(params, lr, optimizer)
        self.baseline = MovingAverageBaseline(baseline_decay)
        self.clip = clip
        self.epochs = epochs
        self.minibatch_size = minibatch_size
        self.entropy_coef = entropy_coef
        self.grad_clip = grad_clip
        self.normalize = normalize
        self.rng = np.random.default_rng(seed)
        self.updates = 0

    def loss(
        self, log_prob: torch.Tensor, old_log_prob: torch.Tensor, entropy: torch.Tensor, adv: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        ratio = torch.exp(log_prob - old_log_prob)
        clipped = torch.clamp(ratio, 1.0 - self.clip, 1.0 + self.clip)
        surrogate = torch.minimum(ratio * adv, clipped * adv)
        clip_frac = ((ratio - 1.0).abs() > self.clip).float().mean()
        return -surrogate.mean() - self.entropy_coef * entropy.mean(), clip_frac

    def step(
        self,
        evaluate_actions: EvaluateActions,
        actions: torch.Tensor,
        old_log_prob: torch.Tensor,
        rewards: np.ndarray,
    ) -> dict[str, Any]:
        """`epochs` clipped updates on one batch; returns the last loss and the fraction clipped."""
        rewards = np.asarray(rewards, dtype=np.float64)
        old = old_log_prob.detach()
        adv = loss_weights(scale_advantages(self.baseline.advantages(rewards), self.normalize), old.dtype)
        n = len(rewards)
        mb = self.minibatch_size or n
        loss = torch.zeros(())
        clip_frac = torch.zeros(())
        norm = 0.0
        for _ in range(self.epochs):
            order = self.rng.permutation(n) if mb < n else np.arange(n)
            for lo in range(0, n, mb):
                idx = torch.as_tensor(order[lo : lo + mb])
                log_prob, entropy = evaluate_actions(actions[idx])
                loss, clip_frac = self.loss(log_prob, old[idx], entropy, adv[idx])
                norm = apply_gradients(self.optimizer, loss, self.grad_clip)
        self.baseline.update(rewards)
        self.updates += 1
        return {"loss": float(loss.detach()), "grad_norm": norm, "clip_fraction": float(clip_frac.detach()),
                "baseline": self.baseline.value}
