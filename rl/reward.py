"""Rewards of learned placers, and budgeted evaluation of group placements.

Reward = -sqrt(score), where score is the step time in seconds of a placement that runs (Mirhoseini et al.
2017 minimise the square root of the running time). Placements that fail get a penalty score:

* by default the methodology's (`Evaluator.score`: failure_multiple x serial bound, plus the simulated step
  time for OOM, so that among failing placements the less bad still ranks better);
* or a fixed score (`oom_score_s`, `invalid_score_s`), as Mirhoseini et al. did, who gave failing
  placements a large fixed running time (100 s in the authors' released controller, `failing_signal`);
  `invalid_score_s` also scores a placement a real backend failed to run (status "error"), which the
  methodology scores as invalid;
* and, for OOM (`oom_shaping`, ours, on by default), the failure score times the fraction by which memory
  overflows is added, so that the policy can tell nearly-fitting placements from hopeless ones.

What these scores do and do not guarantee: the serial bound counts compute only, so a transfer-bound
placement that runs can score above an OOM one; the shaping term is not capped, so an OOM placement that
overflows by much can score above an invalid one; and it needs the simulator's peak memory (a real backend's
OOM has none, so there it adds nothing). Adding the simulated step time ranks fast OOM placements (often the
GPU-heavy ones that overflow) above slow ones. Which default works better depends on the workload (a
reviewer's 3-seed runs, on the crossbar links the presets had before d0b28ba: nmt-4x4096-b64 on haswell_4k80
ends OOM with the default and runs with `oom_score_s=100, oom_shaping=false`; rnnlm-4x6144-b64 the other way
round), so both are parameters; the
authors' configuration is `seq2seq(oom_score_s=100, invalid_score_s=100, oom_shaping=false)`.

`RewardEvaluator` is what every learned placer samples through: it turns group placements into op
placements, evaluates them in one `evaluate_batch` (each counted against the methodology's budget by the
evaluator), and never asks for more than is left. The learning curve (best and mean score against
evaluations) is recorded by the evaluator itself and returned with the placement.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from rl.grouping import Grouping
from suite.errors import BudgetExhausted, PlacebenchError
from suite.evaluator import Evaluator, Measurement
from suite.placer import check_choice
from suite.textfile import as_float, short_repr

TRANSFORMS = ("neg_sqrt", "neg", "neg_log", "inv")
FINAL_CHOICES = ("best_or_greedy", "best", "greedy")


@dataclass(frozen=True)
class RewardConfig:
    """How a measurement becomes a reward. `None` penalties take the methodology's scoring."""

    transform: str = "neg_sqrt"  # reward = -sqrt(score) | -score | -log(score) | 1 / score (HSDAG)
    oom_score_s: float | None = None
    invalid_score_s: float | None = None
    oom_shaping: bool = True  # add failure score x memory overflow fraction to OOM scores (ours)

    def __post_init__(self) -> None:
        if self.transform not in TRANSFORMS:
            raise ValueError(f"unknown reward transform {self.transform!r}; choose from {', '.join(TRANSFORMS)}")
        for name in ("oom_score_s", "invalid_score_s"):
            v = getattr(self, name)
            if v is not None and not (v > 0 and math.isfinite(v)):
                raise ValueError(f"{name} must be a positive number of seconds, got {v!r}")


def overflow_fraction(m: Measurement, evaluator: Evaluator) -> float:
    """Bytes above capacity summed over devices, over the capacity of the devices that overflow."""
    excess = capacity = 0
    for dev in evaluator.cluster.devices:
        peak = m.peak_memory_bytes.get(dev.name, 0)
        if peak > dev.memory_bytes:
            excess += peak - dev.memory_bytes
            capacity += dev.memory_bytes
    return excess / capacity if capacity else 0.0


def score_s(m: Measurement, evaluator: Evaluator, config: RewardConfig = RewardConfig()) -> float:
    """The seconds to minimise for one measurement, failures penalised.

    With `oom_shaping`, an OOM placement scores its penalty plus the methodology's failure score times
    its memory overflow fraction, so that among failing placements those closer to fitting rank better
    (see the module docstring for what this does not guarantee).
    """
    if m.status == "oom":
        base = config.oom_score_s if config.oom_score_s is not None else evaluator.score(m)
        if config.oom_shaping:
            base += evaluator.failure_score_s * overflow_fraction(m, evaluator)
        return base
    if m.status in ("invalid", "error") and config.invalid_score_s is not None:  # the evaluator scores both alike
        return config.invalid_score_s
    return evaluator.score(m)


def reward_of(score: float, transform: str = "neg_sqrt") -> float:
    if transform == "neg_sqrt":
        return -math.sqrt(score)
    if transform == "neg":
        return -score
    if transform == "inv":
        return 1.0 / max(score, 1e-12)
    return -math.log(max(score, 1e-12))


@dataclass
class Rollout:
    """The outcome of evaluating a batch of group placements."""

    group_devices: np.ndarray  # int64 [B, G]
    measurements: list[Measurement]
    scores_s: np.ndarray  # float64 [B]
    rewards: np.ndarray  # float64 [B]

    @property
    def statuses(self) -> list[str]:
        return [m.status for m in self.measurements]


class RewardEvaluator:
    """Budgeted evaluation of group placements for one placer run; keeps the best one seen."""

    def __init__(self, evaluator: Evaluator, grouping: Grouping, config: RewardConfig = RewardConfig()):
        self.evaluator = evaluator
        self.grouping = grouping
        self.config = config
        self.best_score_s = math.inf
        self.best_group_devices: np.ndarray | None = None
        self.batches = 0

    def allowance(self, wanted: int, *, reserve: int = 0) -> int:
        """How many placements may be evaluated now (at most `wanted`), keeping `reserve` evaluations back: of
        the evaluations left, and of the time left at the seconds per evaluation measured so far."""
        return max(0, self.evaluator.affordable(wanted + reserve) - reserve)

    def __call__(self, group_devices: np.ndarray) -> Rollout | None:
        """Evaluate [B, G] sampled group placements and keep the best; None if the budget ran out (e.g. its
        wall clock)."""
        r = self._evaluate(group_devices)
        if r is None:
            return None
        b = int(np.argmin(r.scores_s))
        if r.scores_s[b] < self.best_score_s:
            self.best_score_s = float(r.scores_s[b])
            self.best_group_devices = r.group_devices[b].copy()
        self.batches += 1
        return r

    def _evaluate(self, group_devices: np.ndarray) -> Rollout | None:
        gd = np.atleast_2d(np.asarray(group_devices, dtype=np.int64))
        try:
            ms = self.evaluator.evaluate_batch(self.grouping.expand(gd))
        except BudgetExhausted:
            return None
        scores = np.array([score_s(m, self.evaluator, self.config) for m in ms], dtype=np.float64)
        rewards = np.array([reward_of(s, self.config.transform) for s in scores], dtype=np.float64)
        return Rollout(gd, ms, scores, rewards)

    def final(self, greedy: np.ndarray, mode: str) -> tuple[np.ndarray, str, float | None]:
        """The placer's final group devices, where it came from, and the greedy decode's score (or None).

        `mode`: "best" = the best placement sampled; "greedy" = the policy's most likely placement;
        "best_or_greedy" = the greedy one if it scores at least as well as the best sampled. The greedy
        placement is evaluated once (one evaluation of the budget, which the caller keeps back) unless the
        mode is "best"; with nothing sampled the greedy one is the answer. The greedy placement is not a sample:
        `best_score_s` and `best_group_devices` stay the best sampled. Either way the harness re-measures the
        final placement, and that is the number reported.
        """
        score = None
        if mode != "best" and self.allowance(1) > 0:
            r = self._evaluate(greedy[None])
            score = None if r is None else float(r.scores_s[0])
        if mode == "greedy" or self.best_group_devices is None:
            return greedy, "greedy", score
        if mode == "best_or_greedy" and score is not None and score <= self.best_score_s:
            return greedy, "greedy", score
        return self.best_group_devices, "best_sampled", score


def check_reward_params(placer: str, params: dict) -> None:
    """Raise `PlacebenchError` naming the placer and parameter for a bad reward or final-choice setting.

    Checked when a placer is built, so that a suite spec fails before it runs.
    """
    for key in ("oom_score_s", "invalid_score_s"):
        v = params[key]
        if v is not None and (not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(as_float(v))
                              or v <= 0):
            raise PlacebenchError(f"{placer}: {key} must be None or a finite number > 0, got {short_repr(v)}")
    check_choice(placer, "reward", params["reward"], TRANSFORMS)
    check_choice(placer, "final", params["final"], FINAL_CHOICES)
