"""Pieces shared by the trainers: the optimizer step with gradient clipping, and advantage scaling."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import torch

from suite.errors import PlacebenchError


def build_optimizer(params: Iterable[torch.nn.Parameter], lr: float, kind: str = "adam") -> torch.optim.Optimizer:
    params = list(params)
    if kind == "adam":
        return torch.optim.Adam(params, lr=lr)
    if kind == "sgd":
        return torch.optim.SGD(params, lr=lr)
    raise ValueError(f"unknown optimizer {kind!r}; choose adam or sgd")


def apply_gradients(optimizer: torch.optim.Optimizer, loss: torch.Tensor, grad_clip: float | None) -> float:
    """Backpropagate `loss`, clip the global gradient norm to `grad_clip` (None or 0: no clipping), step; return
    the norm.

    A `PlacebenchError`, and no step, if the norm's square is beyond the gradient's dtype (float32: a norm of
    about 1.8e19, which weights (advantages or returns) from about 1e19 reach, well inside `loss_weights`'
    range). The norm then comes out inf and the step would do nothing silently (clipping scales the gradient
    by max_norm / inf = 0) or make the weights NaN unclipped; and Adam's squared gradients overflow, which
    stops the weights concerned for good.
    """
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
    norm = float(torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip else float("inf")))
    limit = math.sqrt(torch.finfo(params[0].grad.dtype).max) if params else math.inf
    if not norm < limit:  # NaN too
        raise PlacebenchError(f"the policy's gradient norm is {norm:.3g}, whose square is beyond the range of its "
                              f"{params[0].grad.dtype} (from {limit:.3g}; the update would be lost): the update's "
                              "weights (advantages or returns) are too large, or the policy diverged: lower "
                              "oom_score_s or invalid_score_s, normalize the advantages, or lower lr")
    optimizer.step()
    return norm


def scale_advantages(adv: np.ndarray, normalize: bool) -> np.ndarray:
    """Divide by the batch standard deviation (if asked and not ~0): step-time scales differ by 10^4.

    Penalty scores as large as 1e300 s (`oom_score_s`) make the squares in the standard deviation overflow; it
    is then taken of the advantages over their largest magnitude, times that magnitude.
    """
    adv = np.asarray(adv, dtype=np.float64)
    if normalize and len(adv) > 1:
        with np.errstate(over="ignore"):
            std = float(adv.std())
        if math.isinf(std):
            top = float(np.abs(adv).max())
            std = float((adv / top).std()) * top
        if std > 1e-12:
            adv = adv / std
    return adv


def loss_weights(weights: np.ndarray | float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Per-sample weights of an update (advantages, returns) as a tensor of the policy's dtype.

    A `PlacebenchError` if one is beyond that dtype's range (float32: 3.4e38), where the loss and gradients
    would become inf or NaN and the next logits NaN (penalty scores that large, `oom_score_s` or
    `invalid_score_s`, unnormalized). Smaller weights can still overflow the gradient's norm (from about
    1e19): `apply_gradients` refuses that update.
    """
    w = np.asarray(weights, dtype=np.float64)
    top = float(np.abs(w).max()) if w.size else 0.0
    if not top <= torch.finfo(dtype).max:  # NaN too
        raise PlacebenchError(f"an update's weights (advantages or returns) reach {top:.3g}, beyond {dtype}'s range "
                              f"({torch.finfo(dtype).max:.3g}), where the update becomes inf or NaN: lower "
                              f"oom_score_s or invalid_score_s, or normalize the advantages")
    return torch.as_tensor(w, dtype=dtype)
