"""Gymnasium environments for device placement, so that agents from any RL library can be benchmarked.

Registered by explicit import (`import suite.envs`):

* "placebench/OneShot-v0" (`OneShotPlacementEnv`): one step per episode; the action (MultiDiscrete, one
  device per group) is a whole placement; reward = -sqrt(score) of that placement. The env keeps no state:
  a step without a reset in between is another one-step episode.
* "placebench/Iterative-v0" (`IterativePlacementEnv`): one group's device per step, groups in topological
  order, starting from an initial placement, as Placeto does. With reward="improvement" (Placeto's
  incremental reward) every step evaluates the current placement and the reward is the gain in
  R = -sqrt(score) over the previous one (Placeto's paper takes R = -run time, as `rl.placeto` does by
  default), so an episode of G groups costs G + 1 evaluations (the start placement's too); with
  reward="final" only the complete placement is evaluated, at the last step. After the last step the
  observation's cursor and `info["action_mask"]` are group 0's: the episode has ended.
  `reset(options={"placement": ...})` starts that episode from the given group devices instead of
  `initial`; the one-shot env takes no options, and an option an env does not know is refused.

Both take a workload and a cluster (objects or names) and an optional `Budget`, or an evaluator (whose
workload, cluster and budget they use; a different workload or cluster, or a budget beside it, is
refused); an argument of another type is refused when the env is made. Every evaluation goes through the evaluator and counts against its budget: past it, `step`
raises `BudgetExhausted` (the benchmark's rule; an agent must stop) and the episode stays as it was; so
does an improvement-mode `reset` (which evaluates the start placement): the previous episode, if any, stays
the env's state, and no new one starts (a "final"-mode reset evaluates nothing and always starts one). A
reset that raises leaves the env's random generator as it was too (its `seed` is not taken, and the draws of
a random start placement are undone), so a caller that catches the error goes on from the same stream. A
vector env made with `gym.make_vec(..., budget=...)` gives each sub-env an evaluator and budget of its own
(num_envs times the budget in all); to share one budget pass one `evaluator=` with the synchronous vector
mode (the asynchronous mode copies it into each worker process, whose evaluations it then does not see).
Score is `Evaluator.score` (the methodology's penalty for OOM and invalid placements, such as a group on a
device its mask forbids). An action outside the action space (a device index out of range, a wrong shape,
a non-integer) raises `PlacebenchError` and costs nothing; so does an iterative step before the first
reset or after the last step.

Decisions are per group: by default the workload's colocation groups (and one group per other op); a
caller may pass `groups` (an op -> group label array, e.g. the `assignment` of an `rl.grouping.Grouping`)
that keeps colocation groups whole. Observations are per-group features in [0, 1]: scaled log FLOPs, output
bytes, parameter bytes and op count, topological position, the scaled log time on each device (the cost
model's, with the measured op times of the evaluator's profiles where it has them, as `Problem.costs`), and
which devices the group allows.
`info["action_mask"]` gives the allowed devices (per group, or for the current group when iterative).
"""

from __future__ import annotations

import math
import operator
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from suite.cluster import Cluster
from suite.costmodel import cost_matrix
from suite.errors import PlacebenchError
from suite.evaluator import Evaluator, Measurement
from suite.graph import DEVICE_KINDS, OpGraph
from suite.methodology import Budget
from suite.textfile import short_repr

ONE_SHOT_ID = "placebench/OneShot-v0"
ITERATIVE_ID = "placebench/Iterative-v0"


def _array_or_none(x: Any) -> np.ndarray | None:
    """`np.asarray(x)`, or None where numpy cannot make an array of it (a ragged list)."""
    try:
        return np.asarray(x)
    except (TypeError, ValueError):
        return None


def _scaled_log(x: np.ndarray) -> np.ndarray:
    y = np.log1p(np.asarray(x, dtype=np.float64))
    top = y.max() if y.size else 0.0
    return y / top if top > 0 else y


class _PlacementProblem:
    """What both environments share: the evaluator, the groups, their features and device masks."""

    def __init__(
        self,
        workload: OpGraph | str | None,
        cluster: Cluster | str | None,
        evaluator: Evaluator | None,
        budget: Budget | None,
        groups: Any,
    ):
        for what, value, types in (("workload", workload, (OpGraph, str)), ("cluster", cluster, (Cluster, str)),
                                   ("evaluator", evaluator, (Evaluator,)), ("budget", budget, (Budget,))):
            if value is not None and not isinstance(value, types):
                wanted = " or ".join("a name or path" if t is str else f"a {t.__module__}.{t.__name__}" for t in types)
                raise PlacebenchError(f"{what} must be {wanted}, got {type(value).__name__} {short_repr(value)}")
        if evaluator is not None:
            if budget is not None:
                raise PlacebenchError("give a budget or an evaluator (which has its own budget), not both")
            from suite import load_cluster, load_workload

            for what, given, own, load in (("workload", workload, evaluator.workload, load_workload),
                                           ("cluster", cluster, evaluator.cluster, load_cluster)):
                same = given is None or given is own or given == own.name
                if not same:  # an object, or a file: the same content
                    same = (load(given) if isinstance(given, str) else given).content_hash == own.content_hash
                if not same:
                    name = given if isinstance(given, str) else given.name
                    raise PlacebenchError(f"{what} {name!r} is not the evaluator's ({own.name!r})")
            workload, cluster = evaluator.workload, evaluator.cluster
        if workload is None or cluster is None:
            raise PlacebenchError("a placement environment needs a workload and a cluster (or an evaluator)")
        if isinstance(workload, str):
            from suite import load_workload

            workload = load_workload(workload)
        if isinstance(cluster, str):
            from suite import load_cluster

            cluster = load_cluster(cluster)
        self.workload: OpGraph = workload
        self.cluster: Cluster = cluster
        self.evaluator = evaluator or Evaluator(workload, cluster, budget)
        self.assignment = self._groups(groups)
        self.num_groups = int(self.assignment.max()) + 1 if len(self.assignment) else 0
        self.mask = self._mask()
        self.features = self._features()

    def _groups(self, groups: Any) -> np.ndarray:
        g = self.workload
        if groups is None:
            labels = np.arange(g.num_ops)
            for ops in g.groups.values():
                labels[ops] = ops[0]
        else:
            labels = _array_or_none(groups)
            if labels is None or labels.shape != (g.num_ops,) or not np.issubdtype(labels.dtype, np.integer):
                shape = ("a ragged list" if labels is None else f"shape {labels.shape}" if labels.ndim
                         else f"a {type(groups).__name__}")
                raise PlacebenchError(
                    f"groups must be {g.num_ops} integer labels (one per op of {g.name!r}), got {shape}"
                )
            for name, ops in g.groups.items():
                if len(set(labels[ops].tolist())) > 1:
                    raise PlacebenchError(f"groups split colocation group {name!r} of {g.name!r}")
        _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
        rank = np.argsort(np.argsort(first))  # groups numbered by their first op
        return rank[inverse].astype(np.int64)

    def _mask(self) -> np.ndarray:
        kinds = [set(DEVICE_KINDS) for _ in range(self.num_groups)]
        for i, op in enumerate(self.workload.ops):
            if op.allowed_kinds:
                kinds[self.assignment[i]] &= set(op.allowed_kinds)
        mask = np.array([[d.kind in k for d in self.cluster.devices] for k in kinds], dtype=bool)
        if not mask.any(axis=1).all():
            g = int(np.flatnonzero(~mask.any(axis=1))[0])
            raise PlacebenchError(f"group {g} of {self.workload.name!r} can run on no device of {self.cluster.name!r}")
        return mask

    def _features(self) -> np.ndarray:
        a, G, asg = self.workload.arrays, self.num_groups, self.assignment

        def gsum(x: np.ndarray) -> np.ndarray:
            return np.bincount(asg, weights=np.asarray(x, dtype=np.float64), minlength=G)

        first = np.full(G, self.workload.num_ops, dtype=np.int64)
        np.minimum.at(first, asg, np.arange(self.workload.num_ops))
        cost = np.zeros((G, self.cluster.num_devices))
        profiles = getattr(self.evaluator.backend, "profiles", ())  # the op times it is scored on (`Problem.profiles`)
        np.add.at(cost, asg, np.asarray(cost_matrix(self.workload, self.cluster, profiles)))
        cols = [
            _scaled_log(gsum(a.flops)),
            _scaled_log(gsum(a.output_bytes)),
            _scaled_log(gsum(a.param_bytes)),
            _scaled_log(np.bincount(asg, minlength=G)),
            first / max(self.workload.num_ops - 1, 1),
        ]
        return np.column_stack([*cols, _scaled_log(cost * 1e6), self.mask]).astype(np.float32)

    def check_action(self, action: Any) -> np.ndarray:
        """The G group devices of a one-shot action, or `PlacebenchError` if it is not in MultiDiscrete([D] * G)."""
        G, D = self.num_groups, self.cluster.num_devices
        arr = _array_or_none(action)
        if arr is None or arr.shape != (G,) or not np.issubdtype(arr.dtype, np.integer) or (arr < 0).any() or (arr >= D).any():
            raise PlacebenchError(f"action must be {G} integer device indices in 0..{D - 1}, got {action!r}")
        return arr.astype(np.int64)

    def check_device(self, action: Any) -> int:
        """The device of an iterative action, or `PlacebenchError` if it is not in Discrete(D)."""
        D = self.cluster.num_devices
        try:  # a bool is no device index (True would be device 1), as the one-shot env's check says
            d = None if isinstance(action, bool | np.bool_) else operator.index(action)
        except TypeError:
            d = None
        if d is None or not 0 <= d < D:
            raise PlacebenchError(f"action must be an integer device index in 0..{D - 1}, got {action!r}")
        return d

    def placement(self, group_devices: np.ndarray) -> np.ndarray:
        return np.asarray(group_devices, dtype=np.int64)[self.assignment]

    def evaluate(self, group_devices: np.ndarray) -> tuple[Measurement, float, float]:
        """(measurement, score_s, reward = -sqrt(score)); one evaluation of the budget."""
        m = self.evaluator.evaluate(self.placement(group_devices))
        s = self.evaluator.score(m)
        return m, s, -math.sqrt(s)


def _check_render_mode(render_mode: Any) -> None:
    """Gymnasium passes `render_mode` to every env; these envs render nothing, so only None is accepted."""
    if render_mode is not None:
        raise PlacebenchError(f"render_mode {render_mode!r}: placement environments render nothing (use None)")


def _options(options: Any, known: tuple[str, ...]) -> dict[str, Any]:
    """reset's options as a dict; `PlacebenchError` for another type or a key the env does not know (a typo
    must not pass silently)."""
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise PlacebenchError(f"reset options must be a dict, got {type(options).__name__} {short_repr(options)}")
    unknown = [k for k in options if k not in known]
    if unknown:
        takes = f"takes only {', '.join(map(repr, known))}" if known else "takes none"
        raise PlacebenchError(f"unknown reset option {unknown[0]!r}: this environment {takes}")
    return options


def _info(m: Measurement, score: float, mask: np.ndarray) -> dict[str, Any]:
    """Step info; the evaluation count is `env.unwrapped.evaluator.evaluations_used` (info stays deterministic)."""
    return {"status": m.status, "step_time_s": m.step_time_s, "score_s": score, "action_mask": mask}


class OneShotPlacementEnv(gym.Env):
    """One step per episode: a MultiDiscrete action gives every group its device."""

    metadata = {"render_modes": []}

    def __init__(
        self,
        workload: OpGraph | str | None = None,
        cluster: Cluster | str | None = None,
        *,
        evaluator: Evaluator | None = None,
        budget: Budget | None = None,
        groups: Any = None,
        render_mode: str | None = None,
    ):
        _check_render_mode(render_mode)
        self.problem = _PlacementProblem(workload, cluster, evaluator, budget, groups)
        G, D = self.problem.num_groups, self.problem.cluster.num_devices
        self.observation_space = spaces.Box(0.0, 1.0, shape=self.problem.features.shape, dtype=np.float32)
        self.action_space = spaces.MultiDiscrete(np.full(G, D, dtype=np.int64))

    @property
    def evaluator(self) -> Evaluator:
        return self.problem.evaluator

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        _options(options, ())
        super().reset(seed=seed)
        return self.problem.features.copy(), {"action_mask": self.problem.mask.copy()}

    def step(self, action):
        m, score, reward = self.problem.evaluate(self.problem.check_action(action))
        info = _info(m, score, self.problem.mask.copy())
        return self.problem.features.copy(), float(reward), True, False, info


class IterativePlacementEnv(gym.Env):
    """One group's device per step, in topological order, from an initial placement (Placeto's MDP)."""

    metadata = {"render_modes": []}
    REWARDS = ("improvement", "final")

    def __init__(
        self,
        workload: OpGraph | str | None = None,
        cluster: Cluster | str | None = None,
        *,
        evaluator: Evaluator | None = None,
        budget: Budget | None = None,
        groups: Any = None,
        reward: str = "improvement",
        initial: str | np.ndarray = "random",
        render_mode: str | None = None,
    ):
        _check_render_mode(render_mode)
        if reward not in self.REWARDS:
            raise PlacebenchError(f"reward {reward!r} is not one of {', '.join(self.REWARDS)}")
        self.problem = _PlacementProblem(workload, cluster, evaluator, budget, groups)
        self.reward_mode = reward
        G, D = self.problem.num_groups, self.problem.cluster.num_devices
        self.initial = self._start("initial", initial)
        self.observation_space = spaces.Dict(
            {
                "features": spaces.Box(0.0, 1.0, shape=self.problem.features.shape, dtype=np.float32),
                "placement": spaces.MultiDiscrete(np.full(G, D, dtype=np.int64)),
                "cursor": spaces.Discrete(G),
            }
        )
        self.action_space = spaces.Discrete(D)
        self._placement = np.zeros(G, dtype=np.int64)
        self._cursor = G  # no episode until the first reset
        self._last_reward = 0.0

    @property
    def evaluator(self) -> Evaluator:
        return self.problem.evaluator

    def _obs(self) -> dict[str, Any]:
        return {
            "features": self.problem.features.copy(),
            "placement": self._placement.copy(),
            "cursor": int(self._cursor % self.problem.num_groups),
        }

    def _random_placement(self) -> np.ndarray:
        mask = self.problem.mask
        return np.array([self.np_random.choice(np.flatnonzero(row)) for row in mask], dtype=np.int64)

    def _start(self, what: str, start: Any) -> str | np.ndarray:
        """'random', or G group devices in 0..D-1 (checked: the observation must stay in its space)."""
        G, D = self.problem.num_groups, self.problem.cluster.num_devices
        if isinstance(start, str):
            if start != "random":
                raise PlacebenchError(f"{what} must be 'random' or an array of {G} group devices, got {start!r}")
            return start
        arr = _array_or_none(start)
        if (arr is None or arr.shape != (G,) or not np.issubdtype(arr.dtype, np.integer) or (arr < 0).any()
                or (arr >= D).any()):
            raise PlacebenchError(f"{what} placement must be {G} device indices in 0..{D - 1}, got {start!r}")
        return arr.astype(np.int64)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        options = _options(options, ("placement",))
        start = self._start("reset option 'placement'", options.get("placement", self.initial))
        rng, rng_seed = self._np_random, self._np_random_seed
        rng_state = None if rng is None else rng.bit_generator.state
        super().reset(seed=seed)
        info: dict[str, Any] = {"action_mask": self.problem.mask[0].copy()}
        last_reward = self._last_reward
        try:
            placement = self._random_placement() if isinstance(start, str) else np.array(start, dtype=np.int64)
            if self.reward_mode == "improvement":  # may raise BudgetExhausted
                m, score, last_reward = self.problem.evaluate(placement)
                info.update(_info(m, score, self.problem.mask[0].copy()))
        except BaseException:  # the env stays as it was, its RNG (generator, seed and state) included
            self._np_random, self._np_random_seed = rng, rng_seed
            if rng is not None:
                rng.bit_generator.state = rng_state
            raise
        self._placement, self._cursor, self._last_reward = placement, 0, last_reward
        return self._obs(), info

    def step(self, action):
        G = self.problem.num_groups
        if self._cursor >= G:
            raise PlacebenchError("no episode is running (not reset yet, or over): call reset()")
        placement = self._placement.copy()
        placement[self._cursor] = self.problem.check_device(action)
        cursor = self._cursor + 1
        terminated = cursor == G
        mask = self.problem.mask[cursor % G].copy()
        if self.reward_mode == "improvement" or terminated:
            m, score, r = self.problem.evaluate(placement)  # may raise BudgetExhausted: the episode stays as it was
            reward = r - self._last_reward if self.reward_mode == "improvement" else r
            self._last_reward = r
            info = _info(m, score, mask)
        else:
            reward, info = 0.0, {"action_mask": mask}
        self._placement, self._cursor = placement, cursor
        return self._obs(), float(reward), terminated, False, info


def _register() -> None:
    for env_id, entry in (
        (ONE_SHOT_ID, "suite.envs:OneShotPlacementEnv"),
        (ITERATIVE_ID, "suite.envs:IterativePlacementEnv"),
    ):
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=entry)


_register()
