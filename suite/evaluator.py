"""The evaluator: the only way a placer learns how good a placement is, with its budget counted.

A placer is handed an `Evaluator` in its `Problem`. Each call of `evaluate` (or each placement of
`evaluate_batch`) costs one evaluation of the methodology's budget; past the budget the evaluator raises
`BudgetExhausted`. The evaluator records the learning curve (best and mean step time against evaluations)
so that every placer reports it the same way.

`measure` is the harness's call for the final re-measurement: it does not count against the budget.
"""

from __future__ import annotations

import math
import numbers
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from suite.cluster import Cluster
from suite.costmodel import Profile
from suite.errors import BudgetExhausted, GraphError, PlacementError, ProfileError
from suite.graph import OpGraph
from suite.methodology import Budget, Methodology
from suite.placement import validate
from suite.textfile import human_bytes


@dataclass(frozen=True)
class Measurement:
    """What an evaluation of one placement gives, for every backend."""

    status: str  # "ok", "oom", "invalid", or "error" (a real backend that failed to run it; scored as invalid)
    step_time_s: float | None  # statistic of the samples (median by default); None when invalid
    samples_s: tuple[float, ...] = ()
    # peak bytes per cluster device name (0: a device the placement leaves unused). A device may be absent:
    # its peak is unknown, as for the CPUs of a real backend where the OS cannot reset the process's peak
    # resident set (macOS, Windows; `suite.backends.devices._reset_cpu_peak`), rather than a lifetime peak
    peak_memory_bytes: dict[str, int] = field(default_factory=dict)
    oom_devices: tuple[str, ...] = ()
    message: str = ""
    # bytes a step moves between devices: the simulator's every link byte (a training step's backward edges
    # included); the PyTorch backend's forward copies only (a training step's gradient copies are not
    # counted, see suite.backends.torch_exec), so in training the two are not comparable
    bytes_transferred: int = 0
    busy_s: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        t = self.step_time_s
        if self.status == "ok" and (t is None or not math.isfinite(t) or t < 0):
            raise ValueError(f"a measurement with status ok needs a finite step time >= 0, got {t!r}")

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def spread_s(self) -> tuple[float, float] | None:
        """(25th, 75th) percentile of the samples."""
        if not self.samples_s:
            return None
        q = np.percentile(self.samples_s, [25, 75])
        return float(q[0]), float(q[1])


class Backend(Protocol):
    """Measures placements: the simulator, or real execution on PyTorch / ONNX Runtime."""

    name: str

    def measure(self, placement: np.ndarray) -> Measurement: ...

    def measure_batch(self, placements: np.ndarray) -> list[Measurement]: ...


def _over_capacity(device: str, need: int, capacity: int) -> str:
    """`device needs X of Y`; when the two round to the same text, the bytes over are added
    (`needs 11.17 GiB of 11.17 GiB (4096 bytes over)`), so the message shows that need exceeds capacity."""
    a, b = human_bytes(need), human_bytes(capacity)
    extra = f" ({human_bytes(need - capacity)} over)" if a == b else ""
    return f"{device} needs {a} of {b}{extra}"


class SimulatorBackend:
    """The built-in simulator as a backend (deterministic: one sample per measurement)."""

    name = "simulator"
    deterministic = True  # measured once whatever the methodology's repetitions (a subclass must say so itself)

    def __init__(
        self, workload: OpGraph, cluster: Cluster, profiles: Iterable[Profile] = (), engine: str | None = None
    ):
        self.workload = workload
        self.cluster = cluster
        self.profiles = tuple(profiles)
        self.engine = engine or "fast"

    def _to_measurement(self, r) -> Measurement:
        names = r.device_names
        msg = ""
        if r.status == "oom":
            over = [
                _over_capacity(n, int(p), int(c))
                for n, p, c in zip(names, r.peak_memory_bytes, r.capacity_bytes, strict=True)
                if p > c
            ]
            msg = "out of memory: " + "; ".join(over)
        return Measurement(
            status=r.status,
            step_time_s=r.step_time_s,
            samples_s=(r.step_time_s,),
            peak_memory_bytes={n: int(p) for n, p in zip(names, r.peak_memory_bytes, strict=True)},
            oom_devices=r.oom_devices,
            message=msg,
            bytes_transferred=int(r.link_bytes.sum()),
            busy_s={n: float(b) for n, b in zip(names, r.busy_s, strict=True)},
        )

    def measure(self, placement: np.ndarray) -> Measurement:
        from suite.simulator import simulate

        r = simulate(self.workload, self.cluster, placement, profiles=self.profiles, engine=self.engine)
        return self._to_measurement(r)

    def measure_batch(self, placements: np.ndarray) -> list[Measurement]:
        from suite.simulator import simulate_batch

        if self.engine != "fast":
            return [self.measure(p) for p in placements]
        rs = simulate_batch(self.workload, self.cluster, placements, profiles=self.profiles, validate_each=False)
        return [self._to_measurement(r) for r in rs]


def serial_bound_s(workload: OpGraph, cluster: Cluster, profiles: Iterable[Profile] = ()) -> float:
    """Sum over ops of their slowest device time: an upper bound of any single-device step."""
    from suite.simulator import inputs_for

    return float(inputs_for(workload, cluster, profiles).cost.max(axis=1).sum())


def profiled_serial_bound_s(workload: OpGraph, cluster: Cluster, profiles: Iterable[Profile] = ()) -> float:
    """`serial_bound_s`, refused when it is 0 s (every op 0 s on every device): every step would take 0 s,
    and the failure penalty, a multiple of the bound, would score an OOM or invalid placement as well as the
    best one. A `ProfileError` when profiles make it 0 s; a `GraphError` when the roofline does (every op
    0 FLOPs and 0 bytes on devices without a per-op overhead). The Evaluator and the runner's plan check
    both call this, so a run refuses such a workload before any placer runs."""
    profiles = tuple(profiles)
    bound = serial_bound_s(workload, cluster, profiles)
    if bound > 0:
        return bound
    penalty = ("every step would take 0 s, and the penalty of an OOM or invalid placement (a multiple of the "
               "slowest single-device step) would be 0 s, scoring it as well as the best placement")
    if profiles:
        files = ", ".join(p.source or f"(for {p.applies_to!r}, not from a file)" for p in profiles)
        raise ProfileError(
            f"profile(s) {files} make every op of workload {workload.name!r} take 0 s on every device of cluster "
            f"{cluster.name!r}: {penalty}; give profiles with measured (non-zero) times"
        )
    raise GraphError(
        f"every op of workload {workload.name!r} takes 0 s on every device of cluster {cluster.name!r} (0 FLOPs "
        f"and 0 bytes accessed, and no device has an op_overhead_s): {penalty}; give the ops their FLOPs or "
        "bytes, a device an op_overhead_s > 0, or measured profiles"
    )


@dataclass
class CurvePoint:
    evaluations: int
    wall_time_s: float
    best_score_s: float
    mean_score_s: float  # mean score of the evaluations so far

    def as_dict(self) -> dict[str, float]:
        return dict(self.__dict__)


class Evaluator:
    """Budgeted access to a backend for one placer run."""

    def __init__(
        self,
        workload: OpGraph,
        cluster: Cluster,
        budget: Budget | None = None,
        *,
        methodology: Methodology | None = None,
        backend: Backend | None = None,
        profiles: Iterable[Profile] = (),
    ):
        from suite import methodology as _m

        self.workload = workload
        self.cluster = cluster
        self.methodology = methodology or _m.load()
        self.budget = budget or self.methodology.budget
        self.backend = backend or SimulatorBackend(workload, cluster, profiles)
        # a simulator backend's own op times, with or without profiles, bound the failure score
        bound_profiles = getattr(self.backend, "profiles", profiles)
        bound = profiled_serial_bound_s(workload, cluster, bound_profiles)
        self.failure_score_s = self.methodology.failure_multiple * bound
        self.evaluations_used = 0
        self.started = time.perf_counter()
        self.curve: list[CurvePoint] = []
        self.best_score_s = math.inf
        self.best_placement: np.ndarray | None = None
        self._score_sum = 0.0
        self._measured = 0  # placements the backend measured during the search, and the seconds it took
        self._measuring_s = 0.0
        self._granted = 0  # evaluations the last `affordable` allowed that are not used yet

    # -- budget ------------------------------------------------------------------------------------
    @property
    def remaining(self) -> int:
        return max(0, self.budget.max_evaluations - self.evaluations_used)

    @property
    def elapsed_s(self) -> float:
        return time.perf_counter() - self.started

    @property
    def time_left_s(self) -> float:
        return max(0.0, self.budget.max_seconds - self.elapsed_s)

    @property
    def exhausted(self) -> bool:
        return self.remaining == 0 or self.time_left_s == 0.0

    @property
    def seconds_per_evaluation(self) -> float | None:
        """The backend's mean time per measured placement so far (None before the first)."""
        return self._measuring_s / self._measured if self._measured else None

    def affordable(self, k: int) -> int:
        """How many of k more evaluations fit now: no more than are left, and no more than the time left
        allows at the seconds per evaluation measured so far (at least one while any time is left). That many
        are then not refused for time by the next evaluations, while any time is left."""
        k = min(k, self.remaining)
        if k <= 0 or self.time_left_s == 0.0:
            self._granted = 0
            return 0
        per = self.seconds_per_evaluation
        self._granted = k if not per else max(1, min(k, int(self.time_left_s / per)))
        return self._granted

    def _check_budget(self, k: int) -> None:
        """Raise `BudgetExhausted` unless k more evaluations fit the budget."""
        if k > self.remaining:
            raise BudgetExhausted(
                f"{k} evaluation(s) asked, {self.remaining} left of {self.budget.max_evaluations}"
            )
        if self.time_left_s == 0.0:
            raise BudgetExhausted(f"search time budget of {self.budget.max_seconds} s is spent")

    # -- scoring -----------------------------------------------------------------------------------
    def score(self, m: Measurement) -> float:
        """Seconds to minimise during search; failures get the methodology's penalty. The penalty's serial
        bound counts compute only, so a transfer-bound placement that runs can score above an OOM one; and it
        is the roofline simulator's even for a real backend, whose measured steps can be slower than the
        penalty (README, "How a result is computed")."""
        if m.status == "ok":
            return float(m.step_time_s)
        if m.status == "oom":
            return self.failure_score_s + float(m.step_time_s or 0.0)
        return 2.0 * self.failure_score_s

    def _record(self, placement: np.ndarray | None, m: Measurement) -> float:
        """Count one evaluation and extend the learning curve. `placement`: the validated placement; for an
        invalid one, its device indices where it has them (a placer that returns `best_placement` after
        only invalid evaluations then returns an invalid placement, and its cell says so), else None."""
        self.evaluations_used += 1
        s = self.score(m)
        self._score_sum += s
        if s < self.best_score_s:
            self.best_score_s = s
            self.best_placement = None if placement is None else np.array(placement, dtype=np.int64)
        self.curve.append(
            CurvePoint(self.evaluations_used, self.elapsed_s, self.best_score_s, self._score_sum / self.evaluations_used)
        )
        return s

    # -- evaluation --------------------------------------------------------------------------------
    def _validated(self, placement: Any) -> tuple[np.ndarray | None, Measurement | None]:
        try:
            return validate(placement, self.workload, self.cluster), None
        except PlacementError as exc:
            return None, Measurement(status="invalid", step_time_s=None, message=str(exc))

    def evaluate(self, placement: Any) -> Measurement:
        """Measure one placement; costs one evaluation. An invalid placement gives status 'invalid'."""
        self._check_budget(1)
        arr, bad = self._validated(placement)
        m = bad if bad is not None else self._timed(lambda: [self.backend.measure(arr)])[0]
        self._record(arr if arr is not None else _indices_or_none(placement), m)
        self._granted = max(0, self._granted - 1)
        return m

    def _timed(self, measure: Any) -> list[Measurement]:
        t0 = time.perf_counter()
        ms = measure()
        self._measuring_s += time.perf_counter() - t0
        self._measured += len(ms)
        return ms

    def evaluate_batch(self, placements: Sequence[Any] | np.ndarray) -> list[Measurement]:
        """Measure many placements; costs one evaluation each. A batch that would not fit the time left (at
        the seconds per evaluation measured so far) is refused before it starts, unless `affordable` allowed
        it (the time the placer took to make the batch since is not held against it): size batches with
        `affordable`."""
        if isinstance(placements, np.ndarray) and placements.ndim == 1 or (
                not isinstance(placements, np.ndarray) and len(placements) > 0
                and all(isinstance(p, numbers.Integral | str) for p in placements)):
            # its n entries would be n invalid placements, n evaluations of the budget spent on nothing
            raise TypeError("evaluate_batch takes a batch (a sequence or 2-D array) of placements; this is one "
                            "placement (device per op): give [placement], or call evaluate")
        placements = list(placements)
        self._check_budget(len(placements))
        checked = [self._validated(p) for p in placements]
        good = [i for i, (a, _) in enumerate(checked) if a is not None]
        per = self.seconds_per_evaluation
        granted = len(placements) <= self._granted
        if len(good) > 1 and per and per * len(good) > self.time_left_s and not granted:
            raise BudgetExhausted(f"{len(good)} evaluations would take about {per * len(good):.3g} s; "
                                  f"{self.time_left_s:.3g} s of the search time budget is left")
        out: list[Measurement | None] = [bad for _, bad in checked]
        if good:
            ms = self._timed(lambda: self.backend.measure_batch(np.stack([checked[i][0] for i in good])))
            for i, m in zip(good, ms, strict=True):
                out[i] = m
        for p, (arr, _), m in zip(placements, checked, out, strict=True):
            self._record(arr if arr is not None else _indices_or_none(p), m)
        self._granted = max(0, self._granted - len(placements))
        return out  # type: ignore[return-value]

    def evaluate_score(self, placement: Any) -> float:
        return self.score(self.evaluate(placement))

    def measure(self, placement: Any, repetitions: int | None = None) -> Measurement:
        """Re-measure a final placement outside the budget (the harness's call, not a placer's): `repetitions`
        measurements (default: the methodology's; one where the backend's class declares `deterministic = True`,
        as the simulator does: repeating it adds equal samples, which rows would count as measurements)."""
        whole = isinstance(repetitions, numbers.Integral) and not isinstance(repetitions, (bool, np.bool_))
        if repetitions is not None and (not whole or repetitions < 1):  # whatever the placement: a caller's error
            raise ValueError(f"repetitions must be a positive integer, got {repetitions!r}")
        arr, bad = self._validated(placement)
        if bad is not None:
            return bad
        if repetitions is None:  # the methodology's, but a deterministic backend would give N equal samples
            reps = 1 if vars(type(self.backend)).get("deterministic") is True else self.methodology.repetitions
        else:
            reps = int(repetitions)
        ms = [self.backend.measure(arr) for _ in range(reps)]
        if reps == 1:
            return ms[0]
        # each repetition's samples; its step time where it gave none (samples_s is optional)
        samples = tuple(s for m in ms for s in (m.samples_s or ((m.step_time_s,) if m.step_time_s is not None else ())))
        worst = next((m for m in ms if m.status != "ok"), ms[0])  # one OOM repetition makes the result OOM
        return Measurement(
            status=worst.status,
            step_time_s=(float(np.mean(samples) if self.methodology.timing.statistic == "mean" else np.median(samples))
                         if samples else None),
            samples_s=samples,
            peak_memory_bytes={k: max(m.peak_memory_bytes.get(k, 0) for m in ms)
                               for k in dict.fromkeys(k for m in ms for k in m.peak_memory_bytes)},
            oom_devices=worst.oom_devices,
            message=worst.message,
            bytes_transferred=worst.bytes_transferred,
            busy_s=worst.busy_s,
        )


def _indices_or_none(placement: Any) -> np.ndarray | None:
    """An invalid placement as an array of device indices, if it is one (of any length); else None."""
    try:
        arr = np.asarray(placement)
    except (TypeError, ValueError):
        return None
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        return None
    return arr.astype(np.int64, copy=True)
