"""The cross-entropy method (Rubinstein 1999), in two forms.

* `CrossEntropyMethod`: a tabular search distribution, one categorical over devices per group. Sample,
  keep the best `elite_frac`, move the probabilities toward the elites' frequencies with `smoothing`.
  A learning-free baseline. (Post, `rl.post`, has its own tabular step: the elites' frequencies mixed
  with the uniform distribution, as its paper does.)
* `CEMTrainer`: the cross-entropy update of a parametric policy, where there is no closed form: maximise
  the log-likelihood of the elite samples of a batch, i.e. loss = -mean over elites of log pi(a) (Post's
  update for a neural policy instead of its tables).

Both take rewards (higher is better); masks forbid devices (probability 0).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from rl.trainers.common import apply_gradients, build_optimizer


def elite_indices(rewards: np.ndarray, elite_frac: float) -> np.ndarray:
    """Indices of the best ceil(elite_frac * B) rewards (at least one), best first; ties by index."""
    rewards = np.asarray(rewards, dtype=np.float64)
    k = max(1, int(np.ceil(elite_frac * len(rewards))))
    return np.argsort(-rewards, kind="stable")[:k]


def device_frequencies(samples: np.ndarray, num_devices: int) -> np.ndarray:
    """samples [N, G] group devices -> [G, D]: the share of samples that put each group on each device (the
    maximum-likelihood categoricals of the samples; rows sum to 1)."""
    samples = np.asarray(samples, dtype=np.int64)
    freq = np.zeros((samples.shape[1], num_devices))
    np.add.at(freq, (np.broadcast_to(np.arange(samples.shape[1]), samples.shape), samples), 1.0)
    return freq / len(samples)


class CrossEntropyMethod:
    """Independent categorical distributions over devices, one per group ([G, D] probabilities)."""

    def __init__(
        self,
        mask: np.ndarray,
        *,
        elite_frac: float = 0.1,
        smoothing: float = 0.7,
        min_prob: float = 1e-3,
        seed: int = 0,
        init_probs: np.ndarray | None = None,
    ):
        self.mask = np.asarray(mask, dtype=bool)
        if not self.mask.any(axis=1).all():
            raise ValueError("every group needs at least one allowed device")
        if not 0 < elite_frac <= 1 or not 0 < smoothing <= 1:
            raise ValueError(f"elite_frac and smoothing must be in (0, 1], got {elite_frac}, {smoothing}")
        self.elite_frac = elite_frac
        self.smoothing = smoothing
        self.min_prob = min_prob
        self.rng = np.random.default_rng(seed)
        probs = self.mask.astype(np.float64) if init_probs is None else np.asarray(init_probs, dtype=np.float64)
        self.probs = self._normalised(probs)

    def _normalised(self, p: np.ndarray) -> np.ndarray:
        p = np.where(self.mask, np.maximum(p, self.min_prob), 0.0)
        return p / p.sum(axis=1, keepdims=True)

    def sample(self, k: int) -> np.ndarray:
        """[k, G] device indices."""
        cdf = np.cumsum(self.probs, axis=1)
        # u scaled to each row's total (which rounding may leave just below 1): a masked device, whose cdf
        # step is zero, is never drawn, not even the last one
        u = self.rng.random((k, len(self.probs), 1)) * cdf[None, :, -1:]
        return (u >= cdf[None]).sum(axis=2).astype(np.int64)

    def update(self, samples: np.ndarray, rewards: np.ndarray) -> dict[str, Any]:
        elite = np.asarray(samples, dtype=np.int64)[elite_indices(rewards, self.elite_frac)]
        freq = device_frequencies(elite, self.probs.shape[1])
        self.probs = self._normalised(self.smoothing * freq + (1.0 - self.smoothing) * self.probs)
        return {"elites": len(elite), "entropy": float(-(self.probs * np.log(self.probs + 1e-300)).sum())}

    def mode(self) -> np.ndarray:
        return self.probs.argmax(axis=1).astype(np.int64)


class CEMTrainer:
    """Cross-entropy update of a parametric policy: raise the likelihood of the batch's elites."""

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        *,
        lr: float = 1e-3,
        elite_frac: float = 0.1,
        entropy_coef: float = 0.0,
        grad_clip: float | None = 1.0,
        optimizer: str = "adam",
    ):
        if not 0 < elite_frac <= 1:
            raise ValueError(f"elite_frac must be in (0, 1], got {elite_frac}")
        self.optimizer = build_optimizer(params, lr, optimizer)
        self.elite_frac = elite_frac
        self.entropy_coef = entropy_coef
        self.grad_clip = grad_clip
        self.updates = 0

    def step(self, log_prob: torch.Tensor, entropy: torch.Tensor, rewards: np.ndarray) -> dict[str, Any]:
        idx = torch.as_tensor(elite_indices(rewards, self.elite_frac))
        loss = -log_prob[idx].mean() - self.entropy_coef * entropy.mean()
        norm = apply_gradients(self.optimizer, loss, self.grad_clip)
        self.updates += 1
        return {"loss": float(loss.detach()), "grad_norm": norm, "elites": len(idx)}
