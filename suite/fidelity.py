"""How far the simulator is from reality: the same placements predicted by the profile-calibrated simulator
and measured on this machine.

`run_fidelity(rw, cluster, device_map, profiles)` evaluates a set of placements of one workload:

* `single:<device>`: every op on one device, for every device of the cluster;
* `split:<k>`: contiguous random splits: the ops, in topological order, cut at random points into pieces
  given to devices in turn (pipeline-like placements, seeded);
* `random:<k>`: every colocation group (or op) on a uniformly random device (seeded);
* baselines: the placements of registered placers (`placers=("metis", "m_etf", ...)`, searching the
  roofline simulator with a small budget); one equal to an earlier placement is not measured again (its row,
  status "skipped", names that placement), and a placer that does not apply or fails gets a row with status
  "skipped" or "error" and why (an unknown name is an error);
* with ONNX Runtime (`native`): `native:ort_cpu` and `native:ort_gpu`, the framework's own placement; the
  CPU one is predicted as every op on the CPU (the GPU one has no prediction);

each predicted by `SimulatorBackend` with the profiles and measured by the real backend (PyTorch or ONNX
Runtime) with the methodology's timing protocol, `rounds` times in interleaved rounds (every placement
and native run once per round), the measured step time being the statistic of all samples: on a shared machine a slow
phase then hits every placement alike instead of one of them. Per placement: relative error (predicted - measured) /
measured; over the placements: the median absolute relative error and Spearman's rank correlation of
predicted against measured (does the simulator order placements as reality does?). Each row records whether
the backend ran it on concurrent threads (the PyTorch backend's `concurrent` setting "auto" chooses per
placement; ONNX Runtime runs sequentially), and the report's `info` both the setting (`concurrent`) and
what ran (`execution`), which the report and the summary show.

Reports: `<out>/<workload>__<cluster>__<backend>[__cpu][__concurrent].md` (the clock where it is not the wall
clock, and concurrent execution forced on; a report of that name of another workload, cluster, backend or
clock, or measured with other rounds, concurrent setting, threads or timing, is replaced only when forced,
`check_replace`; in the file name, a character of
the names other than a letter, a digit or `._+=-` is `_`; its `copied MiB/step`, the backend's copies between devices, is
the forward pass's only in a PyTorch training step, which the table then says), `.png` (predicted vs measured, log-log, with
the y = x line and a +-15 % band) and `.json` (every number); `write_summary(out)` gathers every JSON of a
directory into `summary.md` with the single-device predictions.
"""

from __future__ import annotations

import json
import math
import platform
import re
import sys
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from suite.cluster import Cluster
from suite.costmodel import Profile
from suite.errors import PlacebenchError
from suite.evaluator import SimulatorBackend
from suite.graph import OpGraph
from suite.methodology import Methodology, Timing
from suite.placement import validate
from suite.report import md_escape
from suite.store import atomic_write_files, atomic_write_text
from suite.textfile import first_non_finite, load_json

_REPO_RESULTS = Path(__file__).resolve().parents[1] / "results"
# in a checkout: the committed results/fidelity; in an installed package: results/fidelity under the current directory
DEFAULT_DIR = (_REPO_RESULTS if _REPO_RESULTS.is_dir() else Path("results")) / "fidelity"
TARGET_REL_ERROR = 0.15


@dataclass
class Row:
    label: str
    family: str  # single, split, random, baseline
    predicted_s: float | None
    measured_s: float | None
    status: str
    measured_q25_s: float | None = None
    measured_q75_s: float | None = None
    bytes_transferred: int = 0
    message: str = ""
    predicted_raw_s: float | None = None  # with the uncalibrated profile (no per-op overhead term)
    concurrent: bool | None = None  # its steps ran on concurrent threads (the backend's choice); None: not run

    @property
    def placed(self) -> bool:
        """False for the row of a baseline placer that gave no placement to measure (it does not apply, it
        failed, or it repeats an earlier placement) and for a native run that has no prediction (ort_gpu; a
        failed simulation says "sim-..."): such rows are listed, not counted as placements compared."""
        if self.family == "native":
            return self.predicted_s is not None or self.status.startswith("sim-")
        return not (self.family == "baseline" and self.predicted_s is None and self.status in ("skipped", "error"))

    @property
    def within_target(self) -> bool:
        """The prediction lies in the +-15 % band around the measurement, by products (as the chart draws the
        band): a prediction of exactly 0.85 or 1.15 times the measurement is inside, whatever the rounding
        of (predicted - measured) / measured."""
        if self.predicted_s is None or not self.measured_s:
            return False
        return (1 - TARGET_REL_ERROR) * self.measured_s <= self.predicted_s <= (1 + TARGET_REL_ERROR) * self.measured_s

    @property
    def rel_error(self) -> float | None:
        if self.predicted_s is None or not self.measured_s:
            return None
        return (self.predicted_s - self.measured_s) / self.measured_s

    @property
    def rel_error_raw(self) -> float | None:
        if self.predicted_raw_s is None or not self.measured_s:
            return None
        return (self.predicted_raw_s - self.measured_s) / self.measured_s


@dataclass
class FidelityResult:
    workload: str
    workload_hash: str
    cluster: str
    backend: str
    device_map: dict[str, str]
    rows: list[Row]
    profiles: list[dict[str, Any]] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)

    def ok_rows(self) -> list[Row]:
        return [r for r in self.rows if r.status == "ok" and r.rel_error is not None]

    def stats(self) -> dict[str, Any]:
        rows = self.ok_rows()
        errs = [abs(r.rel_error) for r in rows]
        raw = [abs(r.rel_error_raw) for r in rows if r.rel_error_raw is not None]
        pred = [r.predicted_s for r in rows]
        meas = [r.measured_s for r in rows]
        return {
            "placements": sum(r.placed for r in self.rows),
            "measured_ok": len(rows),
            "median_abs_rel_error": float(np.median(errs)) if errs else None,
            "max_abs_rel_error": float(max(errs)) if errs else None,
            "spearman": spearman(pred, meas) if len(rows) >= 3 else None,
            "within_15pct": int(sum(r.within_target for r in rows)),
            "median_abs_rel_error_uncalibrated": float(np.median(raw)) if raw else None,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": "placebench.fidelity",
            "schema_version": 1,
            "workload": self.workload,
            "workload_hash": self.workload_hash,
            "cluster": self.cluster,
            "backend": self.backend,
            "device_map": self.device_map,
            "stats": self.stats(),
            "rows": [{**asdict(r), "rel_error": r.rel_error, "rel_error_raw": r.rel_error_raw} for r in self.rows],
            "profiles": self.profiles,
            "info": self.info,
        }


def _ranks(x: Sequence[float]) -> np.ndarray:
    """Ranks from 1, ties sharing their average rank."""
    a = np.asarray(x, dtype=np.float64)
    order = np.argsort(a, kind="mergesort")
    ranks = np.empty(len(a))
    i = 0
    while i < len(a):
        j = i
        while j + 1 < len(a) and a[order[j + 1]] == a[order[i]]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's rank correlation (Pearson correlation of average ranks); None when undefined."""
    if len(x) != len(y) or len(x) < 2:
        return None
    rx, ry = _ranks(x), _ranks(y)
    rx -= rx.mean()
    ry -= ry.mean()
    den = math.sqrt(float((rx * rx).sum() * (ry * ry).sum()))
    return float((rx * ry).sum() / den) if den > 0 else None


# -- placements ------------------------------------------------------------------------------------------
def _group_consistent(graph: OpGraph, placement: np.ndarray) -> np.ndarray:
    """Every op of a colocation group on the device of the group's first op."""
    out = placement.copy()
    for members in graph.groups.values():
        out[members] = out[members[0]]
    return out


def single_device_placements(graph: OpGraph, cluster: Cluster) -> list[tuple[str, np.ndarray]]:
    out = []
    for d, dev in enumerate(cluster.devices):
        p = np.full(graph.num_ops, d, dtype=np.int64)
        try:
            out.append((f"single:{dev.name}", validate(p, graph, cluster)))
        except PlacebenchError:
            continue
    return out


def random_split_placement(graph: OpGraph, num_devices: int, rng: np.random.Generator,
                           pieces: int | None = None) -> np.ndarray:
    """The forward ops in topological order cut at random points, piece k on device (offset + k) mod D;
    backward and update ops follow their forward op (colocation groups)."""
    n = graph.num_ops
    fwd = np.array([i for i, op in enumerate(graph.ops) if op.phase == "forward"] or list(range(n)))
    m = len(fwd)
    pieces = pieces or int(rng.integers(2, 5))
    cuts = np.sort(rng.choice(np.arange(1, m), size=min(pieces - 1, m - 1), replace=False)) if m > 1 else []
    offset = int(rng.integers(num_devices))
    p = np.zeros(n, dtype=np.int64)
    for k, (a, b) in enumerate(zip(np.r_[0, cuts], np.r_[cuts, m], strict=True)):
        p[fwd[int(a):int(b)]] = (offset + k) % num_devices
    last = 0
    for i in range(n):  # ops outside the forward pass and outside any group: with the op before them
        if graph.ops[i].phase == "forward":
            last = p[i]
        elif graph.ops[i].group is None:
            p[i] = last
    return _group_consistent(graph, p)


def random_placement(graph: OpGraph, num_devices: int, rng: np.random.Generator) -> np.ndarray:
    return _group_consistent(graph, rng.integers(0, num_devices, graph.num_ops).astype(np.int64))


def placements_for(graph: OpGraph, cluster: Cluster, *, n_split: int = 3, n_random: int = 2, seed: int = 0,
                   placers: Sequence[str] = ()) -> tuple[list[tuple[str, str, np.ndarray]], list[tuple[str, str, str]]]:
    """The fidelity set (see the module docstring): (label, family, placement) of the distinct valid placements
    (invalid or repeated single, split and random ones are left out), and (placer, status, message) of the
    placers with no placement of their own to measure (status "skipped" where the placer does not apply or
    repeats an earlier placement, else "error")."""
    from suite.placer import NotApplicable

    check_placers(placers)
    rng = np.random.default_rng(seed)
    out = [(label, "single", p) for label, p in single_device_placements(graph, cluster)]
    if cluster.num_devices > 1:
        for k in range(n_split):
            out.append((f"split:{k}", "split", random_split_placement(graph, cluster.num_devices, rng)))
        for k in range(n_random):
            out.append((f"random:{k}", "random", random_placement(graph, cluster.num_devices, rng)))
    failed: list[tuple[str, str, str]] = []
    for name in placers:
        try:
            out.append((name, "baseline", validate(_placer_placement(name, graph, cluster, seed), graph, cluster)))
        except NotApplicable as exc:
            failed.append((name, "skipped", f"does not apply: {exc}"))
        except Exception as exc:  # noqa: BLE001 - a failing placer is a row of the report, not the end of the study
            failed.append((name, "error", f"{type(exc).__name__}: {exc}"))
    valid: list[tuple[str, str, np.ndarray]] = []
    for label, fam, p in out:
        try:
            p = validate(p, graph, cluster)
        except PlacebenchError:
            continue
        same = next((other for other, _, q in valid if np.array_equal(p, q)), None)
        if same is None:
            valid.append((label, fam, p))
        elif fam == "baseline":  # a placer that returns a single-device placement: said, not measured twice
            failed.append((label, "skipped", f"same placement as {same} (measured once, in that row)"))
    return valid, failed


def check_placers(names: Sequence[str]) -> None:
    """Every name is an available placer (UnknownNameError otherwise): before anything is measured."""
    from suite.placer import placer_class

    for name in names:
        placer_class(name)


def check_clock(clock: str, cluster: Cluster, device_map: Any, *, backend: str = "torch",
                concurrent: bool | str = "auto") -> None:
    """Refuse, before anything is profiled or measured, CPU time where the study would time CUDA work (a device
    mapped to CUDA), concurrent threads (forced on over several devices) or more than one intra-op thread
    (torch's count now, which both backends run with): the backend refuses such a placement only at its turn,
    after the placers searched and other placements were measured, and the study then writes nothing."""
    import torch

    from suite.backends.timing import clock_function

    clock_function(clock)  # an unknown clock
    if clock != "cpu":
        return
    cuda = [n for n, t in zip(device_map.cluster_devices, device_map.torch_devices, strict=True)
            if t.startswith("cuda")]
    if cuda:
        raise PlacebenchError(f"fidelity: clock 'cpu' cannot time CUDA work, and {', '.join(cuda)} "
                              f"{'is' if len(cuda) == 1 else 'are'} mapped to CUDA (use the wall clock)")
    if backend == "torch" and concurrent is True and cluster.num_devices > 1:
        raise PlacebenchError("fidelity: clock 'cpu' cannot time concurrent execution (threads add up their CPU "
                              "time): run it sequentially, or with the wall clock")
    if torch.get_num_threads() != 1:
        raise PlacebenchError(f"fidelity: clock 'cpu' needs one intra-op thread, torch uses "
                              f"{torch.get_num_threads()} (threads add up their CPU time): set one thread "
                              f"(--threads 1), or use the wall clock")


def _placer_placement(name: str, graph: OpGraph, cluster: Cluster, seed: int) -> np.ndarray:
    """A registered placer's placement (simulator-backed search with a small budget)."""
    from suite.methodology import Budget
    from suite.placer import Problem, make_placer

    budget = Budget(max_evaluations=200, max_seconds=60.0)
    placer = make_placer(name)
    return np.asarray(placer.place(Problem.make(graph, cluster, budget), budget, seed).placement, dtype=np.int64)


# -- the study -------------------------------------------------------------------------------------------
def _summarise(ms: list[Any], timing: Timing) -> tuple[Any, float | None, tuple[float | None, float | None]]:
    """The measurements of one placement over the rounds -> (the one to report status and message from: the
    first failed, else the last; the step time, the statistic of every sample; their 25th and 75th
    percentiles), step and percentiles None where a round failed."""
    bad = [m for m in ms if not m.ok]
    if bad:
        return bad[0], None, (None, None)
    samples = [x for m in ms for x in m.samples_s]
    step = float(np.mean(samples) if timing.statistic == "mean" else np.median(samples))
    q = np.percentile(samples, [25, 75])
    return ms[-1], step, (float(q[0]), float(q[1]))


def run_fidelity(
    rw: Any,
    cluster: Cluster,
    device_map: Any,
    profiles: Sequence[Profile],
    *,
    backend: str = "torch",
    methodology: Methodology | None = None,
    timing: Timing | None = None,
    n_split: int = 3,
    n_random: int = 2,
    seed: int = 0,
    placers: Sequence[str] = (),
    native: bool = True,
    rounds: int = 3,
    clock: str = "wall",
    concurrent: bool | str = "auto",
    engine: str | None = None,
    progress: Any = None,
    warn_backend: bool = True,
) -> FidelityResult:
    """Predict and measure the fidelity set of `rw` on `cluster` (see the module docstring). Unknown placer
    names and bad counts are refused, and every placement predicted, before anything is measured. Profiles of
    another backend than `backend` are warned of first (`backend_mismatch`), unless `warn_backend` is False (a
    caller that said so already, before profiling); the report says so either way."""
    from suite import methodology as _m
    from suite.backends.torch_exec import check_concurrent
    from suite.profiling import measured_backend, uncalibrated

    check_concurrent(concurrent)
    for what, value, low in (("rounds", rounds, 1), ("n_split", n_split, 0), ("n_random", n_random, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise PlacebenchError(f"fidelity: {what} = {value!r} must be a whole number >= {low}")
    check_placers(placers)
    check_clock(clock, cluster, device_map, backend=backend, concurrent=concurrent)
    mismatch = backend_mismatch(backend, [measured_backend(p) for p in profiles]) if warn_backend else ""
    if mismatch:  # before the placers search and anything is measured
        warnings.warn(f"fidelity of {rw.graph.name}: {mismatch}", stacklevel=2)
    timing = timing or (methodology or _m.load()).timing
    graph = rw.graph
    sim = SimulatorBackend(graph, cluster, profiles, engine=engine)
    sim_raw = SimulatorBackend(graph, cluster, [uncalibrated(p) for p in profiles], engine=engine)
    if backend == "torch":
        from suite.backends.torch_exec import TorchBackend

        real: Any = TorchBackend(rw, cluster, device_map, timing=timing, clock=clock, concurrent=concurrent)
    elif backend == "onnxruntime":
        from suite.backends.ort_exec import OrtBackend

        real = OrtBackend(rw, cluster, device_map, timing=timing, clock=clock)
    else:
        raise PlacebenchError(f"fidelity: backend {backend!r} is not 'torch' or 'onnxruntime'")
    rows = []
    chosen, failed = placements_for(graph, cluster, n_split=n_split, n_random=n_random, seed=seed, placers=placers)
    predicted = [(sim.measure(p), sim_raw.measure(p)) for _, _, p in chosen]  # a bad profile fails here, early
    natives: list[tuple[str, Any]] = []  # (which, predictions or None), measured in the same rounds
    if backend == "onnxruntime" and native:
        cpu = cluster.fastest("cpu") if cluster.device_indices("cpu") else None
        # ort_cpu is predicted as every op on the CPU, as a placement row is; ort_gpu has no prediction
        on_cpu = None if cpu is None else np.full(graph.num_ops, cpu, dtype=np.int64)
        natives.append(("ort_cpu", None if on_cpu is None else (sim.measure(on_cpu), sim_raw.measure(on_cpu))))
        if cluster.device_indices("gpu"):
            natives.append(("ort_gpu", None))
    runs = [lambda p=p: real.measure(p) for _, _, p in chosen]
    runs += [lambda w=which: real.measure_native(w) for which, _ in natives]
    measured: list[list[Any]] = [[] for _ in runs]
    ran: list[bool | None] = [None] * len(runs)  # concurrent threads or not, as the backend ran it
    for r in range(rounds):  # interleaved rounds: a slow phase of the machine hits every placement alike
        for k, run in enumerate(runs):
            if r == 0 or measured[k][-1].ok:
                measured[k].append(run())
                ran[k] = getattr(real, "last_concurrent", None) if ran[k] is None else ran[k]
    for (label, family, _), (pred, raw), ms, conc in zip(chosen, predicted, measured[:len(chosen)], ran[:len(chosen)],
                                                         strict=True):
        meas, step, q = _summarise(ms, timing)
        rows.append(Row(label, family, pred.step_time_s if pred.ok else None, step,
                        meas.status if pred.ok else f"sim-{pred.status}", q[0], q[1],
                        int(meas.bytes_transferred), meas.message, raw.step_time_s if raw.ok else None, conc))
        if progress:
            progress(rows[-1])
    for label, status, message in failed:  # a baseline placer that gave no placement: its row says why
        rows.append(Row(label, "baseline", None, None, status, message=message))
        if progress:
            progress(rows[-1])
    for (which, predictions), ms, conc in zip(natives, measured[len(chosen):], ran[len(chosen):], strict=True):
        meas, step, q = _summarise(ms, timing)
        pred_s = raw_s = None
        status = meas.status
        if predictions is not None:
            pred, raw = predictions
            pred_s = pred.step_time_s if pred.ok else None  # an oom simulation's time is no prediction
            raw_s = raw.step_time_s if raw.ok else None
            status = meas.status if pred.ok else f"sim-{pred.status}"
        rows.append(Row(f"native:{which}", "native", pred_s, step, status, q[0], q[1],
                        message=meas.message, predicted_raw_s=raw_s, concurrent=conc))
        if progress:
            progress(rows[-1])
    import torch

    settings = report_settings(backend, rounds, concurrent, torch.get_num_threads(), timing)
    info = {  # this key order is the written JSON's
        "timing": settings["timing"],
        "threads": settings["threads"],
        "machine": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "seed": seed,
        "rounds": settings["rounds"],
        "clock": clock,
        "mode": graph.metadata.get("mode"),  # training: the PyTorch backend counts the forward's copies only
        "concurrent": settings["concurrent"],  # the setting; what ran: "execution"
        "execution": execution(rows),
        "simulator_engine": sim.engine,
    }
    try:
        info["load_average"] = list(__import__("os").getloadavg())
    except OSError:
        pass
    prof_meta = [{"applies_to": p.applies_to, "workload_hash": p.workload_hash, "backend": measured_backend(p),
                  "calibration": {k: v for k, v in p.metadata.get("calibration", {}).items()
                                  if k != "measured_step_samples_s"},
                  "threads": p.metadata.get("threads"), "device": p.metadata.get("device"),
                  "clock": p.metadata.get("clock", "wall"), "path": shown_path(p.source),
                  "machine": p.metadata.get("machine"), "device_model": p.metadata.get("device_model"),
                  "measured_at": p.metadata.get("measured_at"),
                  "ops": sum(name in graph.index for name in p.op_times_s), "graph_ops": graph.num_ops}
                 for p in profiles]
    return FidelityResult(graph.name, graph.content_hash, cluster.name, backend, dict(device_map.as_dict()), rows,
                          prof_meta, info)


def _other_backends(backend: str, profile_backends: Sequence[Any]) -> list[str]:
    """The profiles' backends, where known, other than `backend`."""
    return sorted({b for b in profile_backends if isinstance(b, str) and b and b != backend})


def backend_mismatch(backend: str, profile_backends: Sequence[str | None]) -> str:
    """Why predictions from profiles measured on another backend do not predict `backend`'s steps ("" when
    every profile's backend, where known, is `backend`): the simulator then predicts the other runtime's op
    times, and the errors measure the difference between the two runtimes as much as the simulator's."""
    other = _other_backends(backend, profile_backends)
    if not other:
        return ""
    return (f"the profiles were measured on {', '.join(other)}, this study measures {backend}: the predictions "
            f"are {', '.join(other)}'s op times, so the errors include the difference between the two runtimes "
            "(profiles of this backend cannot be measured yet)")


def execution(rows: Sequence[Row]) -> str:
    """How the measured placements ran: "sequential", "concurrent" (threads, one per device), "concurrent for k
    of n placements" (the setting "auto" chooses per placement), or "not run" when none was."""
    ran = [r.concurrent for r in rows if r.concurrent is not None]
    if not ran:
        return "not run"
    if all(ran) or not any(ran):
        return "concurrent" if ran[0] else "sequential"
    return f"concurrent for {sum(ran)} of {len(ran)} placements"


def shown_path(source: str) -> str | None:
    """A profile's file as a report names it: relative to the working directory when inside it, so a report
    measured in a scratch checkout names `results/profiles/...`, not that checkout's absolute path."""
    if not source:
        return None
    try:
        return str(Path(source).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return source


# -- reports ---------------------------------------------------------------------------------------------
def _ms(x: float | None) -> str:
    """Milliseconds with two decimals; from a billion ms (an absurd prediction) in powers of ten."""
    if x is None:
        return "-"
    return f"{x * 1e3:.3e}" if abs(x * 1e3) >= 1e9 else f"{x * 1e3:.2f}"


def _pct(x: float | None) -> str:
    """A relative error in percent; from +-100,000% on in powers of ten, never a 300-digit number."""
    if x is None:
        return "-"
    return f"{x * 100:+.2e}%" if abs(x * 100) >= 1e5 else f"{x * 100:+.1f}%"


def markdown(result: FidelityResult) -> str:
    s = result.stats()
    forward_only = _copies_forward_only(result)
    lines = [
        f"# Simulator fidelity: {md_escape(result.workload)} on {md_escape(result.cluster)} "
        f"({md_escape(result.backend)})",
        "",
        f"Device map: {', '.join(f'{k} -> {v}' for k, v in result.device_map.items())}. "
        f"Timing: {result.info.get('timing')}, clock {result.info.get('clock', 'wall')}, "
        f"{result.info.get('rounds', 1)} interleaved round(s), {result.info.get('threads')} thread(s), "
        f"{_execution_text(result)}, measured "
        f"{result.info.get('measured_at')} (load average {result.info.get('load_average', '?')}).",
        "",
    ]
    mismatch = backend_mismatch(result.backend, [p.get("backend") for p in result.profiles])
    if mismatch:
        lines += [f"**Warning:** {mismatch}.", ""]
    lines += [
        f"| placement | predicted ms | measured ms ({_statistic(result)}) | IQR ms | rel. error | uncalibrated: predicted ms, "
        f"rel. error | copied MiB/step{' (forward only)' if forward_only else ''} | status |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in result.rows:
        iqr = "-" if r.measured_q25_s is None else f"{_ms(r.measured_q25_s)}-{_ms(r.measured_q75_s)}"
        lines.append(f"| {md_escape(r.label)} | {_ms(r.predicted_s)} | {_ms(r.measured_s)} | {iqr} | {_pct(r.rel_error)} | "
                     f"{_ms(r.predicted_raw_s)}, {_pct(r.rel_error_raw)} | "
                     f"{r.bytes_transferred / 2**20:.2f} | {md_escape(r.status + (': ' + r.message if r.message else ''))} |")
    med = s["median_abs_rel_error"]
    rho = s["spearman"]
    lines += [
        "",
        f"Median absolute relative error: {'-' if med is None else f'{med * 100:.1f}%'} "
        f"(uncalibrated profile: {_pct(s['median_abs_rel_error_uncalibrated']).lstrip('+')}); "
        f"Spearman rank correlation: {'-' if rho is None else f'{rho:.3f}'}; "
        f"{s['within_15pct']} of {s['measured_ok']} placements within 15%.",
        "",
    ]
    if forward_only:
        lines += ["Copied MiB/step counts the forward pass's copies between devices only: in the training step "
                  "autograd copies the gradients back across the same boundaries (about as many bytes again) "
                  "uncounted, where the simulator charges both directions.", ""]
    for p in result.profiles:
        c = p.get("calibration", {})
        lines.append(f"Profile for {p['applies_to']} ({p.get('device')}, {p.get('threads')} thread(s)): raw op sum "
                     f"{_ms(c.get('raw_sum_s'))} ms, measured step {_ms(c.get('measured_step_s'))} ms, calibration "
                     f"{c.get('method')} ({_calib_text(c)}); {_provenance(p)}.")
    return "\n".join(lines) + "\n"


def _copies_forward_only(result: FidelityResult) -> bool:
    """The rows' copied bytes are the forward pass's only: a training step measured by the PyTorch backend
    (see `suite.backends.torch_exec`)."""
    return result.backend == "torch" and result.info.get("mode") == "training"


def _execution_text(result: FidelityResult) -> str:
    """What ran, the setting, and in a mixed study the placements that ran concurrently."""
    ran = result.info.get("execution")
    setting = result.info.get("concurrent", "auto")
    if ran is None:  # a report from before "execution" was recorded: only the setting is known
        return f"concurrent execution {setting}"
    text = f"execution {ran} (concurrent setting {setting})"
    if ran.startswith("concurrent for"):
        text += ": " + ", ".join(r.label for r in result.rows if r.concurrent)
    return text


def _statistic(result: FidelityResult) -> str:
    """The statistic of the samples that a measured step is (the timing protocol's: median or mean)."""
    timing = result.info.get("timing")
    return str(timing.get("statistic", "median")) if isinstance(timing, dict) else "median"


def _provenance(p: dict[str, Any]) -> str:
    """Where a profile came from: file, machine, device model, date, clock, and the ops it covers."""
    parts = [f"file {p['path']}" if p.get("path") else "not from a file"]
    parts += [f"{key.replace('_', ' ')} {p[key]}" for key in ("machine", "device_model", "measured_at", "clock")
              if p.get(key)]
    if p.get("ops") is not None:
        parts.append(f"times for {p['ops']} of {p['graph_ops']} ops")
    return ", ".join(parts)


def _calib_text(c: dict[str, Any]) -> str:
    if c.get("method") == "additive":
        return f"+{c['op_overhead_s'] * 1e6:.1f} us per op over {c.get('ops_timed')} ops"
    if c.get("method") == "scale":
        return f"x{c['factor']:.3f}"
    return "none"


def plot(result: FidelityResult, path: Path) -> Path:
    """Write the predicted-vs-measured chart (PNG) to `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(plot_png(result))
    return path


def plot_png(result: FidelityResult) -> bytes:
    """The predicted-vs-measured chart: log-log, with the y = x line and the +-15 % band, as PNG bytes. A row
    predicted at 0 s (a profile giving every op of its placement 0 s) has no place on log axes: it is left
    out of the chart, which says so (the table lists it)."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result.ok_rows() if r.predicted_s > 0]  # ok rows have a measured step > 0
    undrawn = len(result.ok_rows()) - len(rows)
    fig, ax = plt.subplots(figsize=(5.5, 5))
    colors = {"single": "tab:blue", "split": "tab:orange", "random": "tab:red", "baseline": "tab:green",
              "native": "tab:purple"}
    for fam, color in colors.items():
        pts = [(r.measured_s * 1e3, r.predicted_s * 1e3) for r in rows if r.family == fam]
        if pts:
            xs, ys = zip(*pts, strict=True)
            ax.scatter(xs, ys, label=fam, color=color, s=28, zorder=3)
    vals = [v for r in rows for v in (r.measured_s * 1e3, r.predicted_s * 1e3)]
    if vals:
        lo, hi = min(vals) * 0.8, max(vals) * 1.25
        xs = np.geomspace(lo, hi, 50)
        ax.plot(xs, xs, "k-", lw=0.8, label="y = x", zorder=2)
        ax.fill_between(xs, xs * (1 - TARGET_REL_ERROR), xs * (1 + TARGET_REL_ERROR), color="0.88", label="+-15%",
                        zorder=1)
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
    ax.set_xscale("log")
    ax.set_yscale("log")
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 3.0, 5.0, 7.0)))
        axis.set_major_formatter(ScalarFormatter())
        axis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(f"measured step time (ms, {_statistic(result)})")
    ax.set_ylabel("simulated step time (ms)")
    s = result.stats()
    rho = s["spearman"]
    med = s["median_abs_rel_error"]
    ax.set_title(f"{result.workload}\n{result.cluster}, {result.backend}: median |err| "
                 f"{'-' if med is None else f'{med * 100:.1f}%'}, Spearman {'-' if rho is None else f'{rho:.2f}'}"
                 + (f"\n{undrawn} placement(s) predicted at 0 s not drawn" if undrawn else ""), fontsize=9)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=110)
    finally:
        plt.close(fig)
    return buf.getvalue()


def write_report(result: FidelityResult, out: str | Path = DEFAULT_DIR, *, png: bool = True,
                 force: bool = False) -> dict[str, Path]:
    """Write the report's `.md`, `.json` (and `.png`) and then `summary.md` to `out`. Every output is made
    before any is written, so a report that cannot be made (a number JSON cannot hold) writes nothing; the
    files are replaced whole, all of them or none (`suite.store.atomic_write_files`), in UTF-8. A report of
    the same file name measured with other settings (`check_replace`) is replaced only with `force`."""
    out = Path(out)
    stem = report_stem(result.workload, result.cluster, result.backend, result.info.get("clock", "wall"),
                       result.info.get("concurrent"))
    if not force:
        names = report_names(result.workload, result.cluster, result.backend, result.info.get("clock", "wall"))
        check_replace(out / f"{stem}.json", result.info, names)
    data = result.to_dict()
    bad = None
    for r in data["rows"]:  # a row names the placement
        bad = bad or first_non_finite(r, f"row {r['label']!r}")
    bad = bad or first_non_finite(data, "report")
    if bad:  # e.g. the relative error of an absurd profile's prediction overflows
        raise PlacebenchError(f"fidelity report {stem}: {bad} is not a finite number, which JSON cannot hold; "
                              f"nothing was written (check the profiles)")
    json_text = json.dumps(data, indent=1, allow_nan=False) + "\n"
    contents = {"md": markdown(result).encode(), "json": json_text.encode()}
    if png:
        contents["png"] = plot_png(result)
    paths = {kind: out / f"{stem}.{kind}" for kind in contents}
    atomic_write_files({paths[kind]: data for kind, data in contents.items()})
    paths["summary"] = write_summary(out)
    return paths


def report_stem(workload: str, cluster: str, backend: str, clock: str, concurrent: Any) -> str:
    """A report's file name without its suffix: workload, cluster and backend, then the clock where it is not
    the wall clock and "concurrent" where concurrent execution was forced on. Other settings (rounds,
    concurrent "auto" or off, threads, timing) are not in the name: see `check_replace`."""
    stem = "__".join(_file_part(x) for x in (workload, cluster, backend))
    stem += "" if clock == "wall" else f"__{clock}"
    return stem + ("__concurrent" if concurrent is True else "")


SETTINGS = ("rounds", "concurrent", "threads", "timing")  # a report's measurement settings (its `info`)


def report_settings(backend: str, rounds: int, concurrent: bool | str, threads: int, timing: Timing) -> dict[str, Any]:
    """A report's `SETTINGS` as its `info` records them (the concurrent setting is False but with the PyTorch
    backend: ONNX Runtime runs sequentially); `run_fidelity` and the CLI's early `check_replace` use it."""
    return {"rounds": rounds, "concurrent": concurrent if backend == "torch" else False, "threads": threads,
            "timing": dict(timing.__dict__)}


def report_names(workload: str, cluster: str, backend: str, clock: str) -> dict[str, str]:
    """What a report is of, as its JSON records it (`clock` in its `info`): two names can give one file name."""
    return {"workload": workload, "cluster": cluster, "backend": backend, "clock": clock}


def check_replace(path: str | Path, info: dict[str, Any], names: dict[str, str]) -> None:
    """Refuse to replace the report `path` (its JSON) when it is of another workload, cluster, backend or clock
    than `names` (`report_names`) says, was measured with other `SETTINGS` than `info` says, or cannot be
    read: clusters "lab/2cpu" and "lab_2cpu" give one file name, and a study with 1 round, or the concurrent
    setting off, writes the same file names as one with 3 rounds, or "auto"; either would replace it unseen.
    A report of the same names measured with the same settings is replaced (measured again). Nothing at
    `path`: nothing to check."""
    path = Path(path)
    if not path.exists():
        return
    hint = "pass --force (write_report's force=True) to replace it, or --out DIR to keep it"
    try:
        data = load_json(path, PlacebenchError, "fidelity report")
        old = data.get("info")
    except (PlacebenchError, AttributeError):
        raise PlacebenchError(f"{path}: a fidelity report that cannot be read would be replaced: {hint}") from None
    if not isinstance(old, dict):
        raise PlacebenchError(f"{path}: a fidelity report without its settings would be replaced: {hint}")
    recorded = {**{k: data[k] for k in ("workload", "cluster", "backend") if k in data},
                **({"clock": old["clock"]} if "clock" in old else {})}
    other = [f"{key} {recorded[key]!r} (this run {names[key]!r})" for key in names
             if key in recorded and recorded[key] != names[key]]
    if other:
        raise PlacebenchError(f"{path} is the report of {', '.join(other)}: {hint}")
    differs = [f"{key} {old[key]!r} (this run {info.get(key)!r})" for key in SETTINGS
               if key in old and old[key] != info.get(key)]
    if differs:
        raise PlacebenchError(f"{path} was measured with {', '.join(differs)}: {hint}")


def _file_part(name: str) -> str:
    """A name as part of a report's file name: a character other than a letter, a digit or one of `._+=-`
    becomes `_`, so that a cluster file named "lab/2cpu" writes `..._lab_2cpu_...` into the report directory
    (the report itself keeps the name)."""
    return re.sub(r"[^\w.+=-]", "_", name)


def _mode(d: dict[str, Any]) -> str:
    """Clock and how the placements ran (`execution`); for a report from before that was recorded, concurrent
    execution when it was forced on."""
    info = d.get("info", {})
    if info.get("execution") is not None:
        return f"{info.get('clock', 'wall')}, {info['execution']}"
    return info.get("clock", "wall") + (", concurrent" if info.get("concurrent") is True else "")


def write_summary(out: str | Path = DEFAULT_DIR) -> Path:
    """`summary.md`: per fidelity JSON in `out`, the single-device rows and the placement-set statistics
    (UTF-8 whatever the locale, replaced whole like the reports).

    A JSON file that cannot be read, or a fidelity report with missing or malformed fields, is listed in the
    summary as left out (and on stderr), with the reason; it is neither skipped silently nor fatal, since the
    report just written is already on disk.
    """
    out = Path(out)
    singles: list[str] = []
    overall: list[str] = []
    left_out: list[str] = []
    stale: list[str] = []
    hashes: dict[str, str | None] = {}
    for path in sorted(out.glob("*.json")):
        try:
            data = load_json(path, PlacebenchError, "fidelity report")
        except PlacebenchError as exc:
            left_out.append(str(exc))
            continue
        if not (isinstance(data, dict) and data.get("format") == "placebench.fidelity"):
            continue  # not a fidelity report
        try:
            mark = ""
            now = hashes.setdefault(data["workload"], _current_hash(data["workload"]))
            if now is not None and now != data["workload_hash"]:
                mark = " †"
                stale.append(f"- {path.name}: measured {str(data['info'].get('measured_at', '?'))[:10]} on graph "
                             f"{str(data['workload_hash'])[:19]}; {data['workload']} is now graph {now[:19]}")
            singles += _single_rows(data, mark)
            overall.append(_overall_row(data, mark))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            left_out.append(f"{path}: a malformed fidelity report ({type(exc).__name__}: {exc})")
    lines = [
        "# Simulator fidelity summary",
        "",
        "Generated by `placebench fidelity`; every number is a measurement on the machine named in each report.",
        "",
        "## Single-device step time: profile-calibrated simulator vs measured",
        "",
        "| workload | backend | clock, execution | device | predicted ms | measured ms | rel. error | uncalibrated predicted ms | "
        "uncalibrated rel. error |",
        "|---|---|---|---|---:|---:|---:|---:|---:|",
        *singles,
        "",
        "## All placements",
        "",
        "| workload | cluster | backend | clock, execution | placements ok | median abs. rel. error | Spearman | within 15% |",
        "|---|---|---|---|---:|---:|---:|---:|",
        *overall,
    ]
    if stale:
        lines += ["", "## † Reports of an earlier graph", "",
                  "These workloads' graphs have changed since they were measured (a capture change: see "
                  "`suite.capture.CAPTURE_VERSION`); `placebench fidelity WORKLOAD ... --reprofile` measures them "
                  "again.", "", *stale]
    if left_out:
        lines += ["", "## Files left out", "", *(f"- {m}" for m in left_out)]
        for m in left_out:
            print(f"warning: the fidelity summary leaves out {m}", file=sys.stderr)
    lines += ["", "## Reading these numbers", "", *NOTES]
    return atomic_write_text(out / "summary.md", "\n".join(lines) + "\n")


def _current_hash(workload: str) -> str | None:
    """The content hash of the workload's graph now (a zoo name or variant name), None if it cannot be loaded
    here (a graph made from a module of one's own)."""
    from suite.registry import load_workload

    try:
        return load_workload(workload).content_hash
    except PlacebenchError:
        return None


def _backend_cell(d: dict[str, Any]) -> str:
    """The report's backend, and the profiles' where they were measured on another (`backend_mismatch`)."""
    other = _other_backends(d["backend"], [p.get("backend") for p in d.get("profiles", []) if isinstance(p, dict)])
    return d["backend"] + (f" ({', '.join(other)} profiles)" if other else "")


def _single_rows(d: dict[str, Any], mark: str = "") -> list[str]:
    return [
        f"| {md_escape(d['workload'])}{mark} | {md_escape(_backend_cell(d))} | {md_escape(_mode(d))} | "
        f"{md_escape(r['label'][7:])} | {_ms(r['predicted_s'])} | "
        f"{_ms(r['measured_s'])} | {_pct(r['rel_error'])} | {_ms(r.get('predicted_raw_s'))} | "
        f"{_pct(r.get('rel_error_raw'))} |"
        for r in d["rows"]
        if r["label"].startswith("single:") and r["status"] == "ok"
    ]


def _overall_row(d: dict[str, Any], mark: str = "") -> str:
    s = d["stats"]
    med = s["median_abs_rel_error"]
    rho = s["spearman"]
    return (f"| {md_escape(d['workload'])}{mark} | {md_escape(d['cluster'])} | {md_escape(_backend_cell(d))} | "
            f"{md_escape(_mode(d))} | {s['measured_ok']}/{s['placements']} | "
            f"{'-' if med is None else f'{med * 100:.1f}%'} | {'-' if rho is None else f'{rho:.3f}'} | "
            f"{s['within_15pct']} |")


NOTES = [
    "- Single-device rows test the profile: the simulator's single-device step is the sum of the op times, "
    "calibrated when profiled to the step time measured then; the error is how well that holds at another "
    "time. The uncalibrated columns use the raw per-op times.",
    "- Logical devices (cpu:0, cpu:1 mapped to one CPU) share cores, caches and memory bandwidth, and a copy "
    "between them is CPU work (a clone into fresh memory, page faults included) that stops compute. The "
    "simulator models independent devices with their own compute streams and asynchronous links, so it is "
    "optimistic for placements with many boundaries or much parallelism (per-op random placements, split "
    "RNNs): expect negative errors there, and a rank correlation that is not meaningful where all placements "
    "measure within noise of each other.",
    "- clock cpu: CPU time of the process (one intra-op thread, sequential execution), robust to other "
    "processes on a shared machine; wall: perf_counter.",
    "- onnxruntime rows use profiles measured with PyTorch: they show how far a PyTorch-calibrated simulator "
    "is from ONNX Runtime (a different framework with fused kernels), not ONNX Runtime's own fidelity.",
]
