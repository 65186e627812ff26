"""The driver shared by learned placers that sample whole placements of op groups in batches (seq2seq, Post).

A placer names its search class (`make_search`); the search owns the grouping, the policy, its trainer and
a `RewardEvaluator`, and offers `step(k)` (sample, evaluate and learn from k placements), `greedy()` (the
policy's most likely group devices) and `info()` (its counters for the result). The driver checks the
parameters every such placer has, runs batches until the budget is spent, keeps one evaluation back for
the greedy placement, picks the final placement (`RewardEvaluator.final`), and restores torch's thread count.
Placeto (one group per step) and HSDAG (episodes of placements parsed in turn) have their own loops but
share `grouped_problem`, `check_group_params`, `torch_threads` and `finish`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import numpy as np
import torch

from rl.grouping import COARSEN_METHODS, GROUPINGS, Grouping, allowed_mask, make_grouping
from rl.reward import RewardConfig, RewardEvaluator, Rollout, check_reward_params
from suite.errors import PlacebenchError
from suite.methodology import Budget
from suite.placer import BasePlacer, PlacementResult, Problem, check_choice

# The parameters every learned placer has after its "reward" transform (`rl.reward`), in this order.
COMMON_DEFAULTS = {
    "oom_score_s": None,  # None: the methodology's penalty; a number: a fixed score (Mirhoseini et al.: large)
    "invalid_score_s": None,
    "oom_shaping": True,  # OOM score grows with the memory overflow (ours; see rl.reward)
    "final": "best_or_greedy",  # best_or_greedy | best | greedy
    "threads": 1,  # torch intra-op threads while searching
}
COMMON_BOUNDS = {"threads": (1, 4096)}


class Search(Protocol):
    """What `finish` needs of any learned placer's search."""

    grouping: Grouping
    rollouts: RewardEvaluator

    def greedy(self) -> np.ndarray: ...

    def info(self) -> dict[str, Any]: ...


class GroupSearch(Search, Protocol):
    """A batched search: `step(k)` samples, evaluates and learns from k placements."""

    def step(self, k: int) -> Rollout | None: ...


def grouped_problem(problem: Problem, params: dict[str, Any]) -> tuple[Grouping, np.ndarray, RewardEvaluator]:
    """What a search samples over: the grouping (`max_groups` None: min(256, 20 x devices), the cap of
    Mirhoseini et al.'s controller), the devices each group may use (bool [G, D]), and the budgeted reward
    evaluator of the placer's reward parameters."""
    p, graph, cluster = params, problem.workload, problem.cluster
    max_groups = p["max_groups"] if p["max_groups"] is not None else min(256, 20 * cluster.num_devices)
    grouping = make_grouping(graph, p["grouping"], max_groups, coarsen_method=p["coarsen"])
    config = RewardConfig(p["reward"], p["oom_score_s"], p["invalid_score_s"], bool(p["oom_shaping"]))
    return grouping, allowed_mask(graph, grouping, cluster), RewardEvaluator(problem.evaluator, grouping, config)


def check_group_params(name: str, p: dict[str, Any]) -> None:
    """Raise `PlacebenchError` for a bad grouping (grouping, max_groups, coarsen) or reward parameter."""
    g = p["max_groups"]
    if g is not None and (not isinstance(g, int) or isinstance(g, bool) or g < 1):
        raise PlacebenchError(f"{name}: max_groups must be None or an integer >= 1, got {g!r}")
    check_choice(name, "grouping", p["grouping"], GROUPINGS)
    check_choice(name, "coarsen", p["coarsen"], COARSEN_METHODS)
    check_reward_params(name, p)


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run with torch's intra-op thread count at n, then restore the caller's."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def finish(search: Search, problem: Problem, started: float, params: dict[str, Any]) -> PlacementResult:
    """The final choice (`RewardEvaluator.final`: best sampled or greedy) and the result of a learned placer.

    Its info: `best_search_score_s`, the best score of the sampled placements (None if none was sampled), and
    `greedy_score_s`, the greedy placement's (None if it was not evaluated); both are the placer's own scores
    (`rl.reward.score_s`). The reported step time is the harness's re-measurement of the final placement.
    """
    rollouts = search.rollouts
    final, source, greedy_score = rollouts.final(search.greedy(), params["final"])
    best = rollouts.best_score_s if rollouts.best_group_devices is not None else None
    return PlacementResult.from_search(
        search.grouping.expand(final),
        problem,
        started,
        final=source,
        groups=search.grouping.num_groups,
        **search.info(),
        best_search_score_s=best,
        greedy_score_s=greedy_score,
        hyperparameters=dict(params),
    )


class GroupPolicyPlacer(BasePlacer):
    """Base of the batched learned placers; subclasses set `name`, `defaults`, `bounds` and `make_search`.

    `defaults` must hold grouping, max_groups, coarsen, batch_size, baseline_decay, reward and
    `COMMON_DEFAULTS`.
    """

    def __init__(self, **params: Any):
        super().__init__(**params)
        self._check()

    def make_search(self, problem: Problem, seed: int) -> GroupSearch:  # pragma: no cover
        raise NotImplementedError

    def _check(self) -> None:
        """Checked at construction, not at the first update: a spec fails before it runs."""
        check_group_params(self.name, self.params)
        if self.params["baseline_decay"] >= 1.0:
            raise PlacebenchError(f"{self.name}: baseline_decay must be below 1 (1 never moves the baseline), got "
                                  f"{self.params['baseline_decay']!r}")

    def place(self, problem: Problem, budget: Budget, seed: int) -> PlacementResult:
        started = time.perf_counter()
        with torch_threads(int(self.params["threads"])):
            return self._place(problem, seed, started)

    def _place(self, problem: Problem, seed: int, started: float) -> PlacementResult:
        p = self.params
        search = self.make_search(problem, seed)
        reserve = 0 if p["final"] == "best" else 1  # one evaluation kept for the greedy placement
        while (k := search.rollouts.allowance(int(p["batch_size"]), reserve=reserve)) > 0:
            if search.step(k) is None:
                break
        return finish(search, problem, started, p)
