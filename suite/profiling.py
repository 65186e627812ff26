"""Per-op profiles measured on a device of this machine, for the simulator's profile-based cost model.

`profile_workload(rw, device)` runs the workload with every op on one torch device (the PyTorch backend's
executor, so exactly the code the real measurements run) and times each op:

* forward: each fx node is timed (the run's clock: perf_counter, or process CPU time with `clock="cpu"`; on
  CUDA also CUDA events, the op's time being the larger of issue time and GPU time); a node that capture
  folded (view, getitem, ...) counts for the op it is attributed to (its producer's, see
  `suite.backends.torch_exec`);
* backward (training): every autograd function created by a node's forward is owned by that node's op
  (the AccumulateGrad of a parameter by the parameter's owner op or variable op); pre- and post-hooks
  record a clock (CUDA: an event) at each of them, and each interval between consecutive records goes to
  the function whose record ends it. An op's backward time is split between its `{op}/grad` and
  `{op}/grad_weight` ops in proportion to their FLOPs; a variable's AccumulateGrad time is shared equally
  by its `acc` ops. Backward time of an op that has no backward op in the graph goes to the op itself;
* update: the optimizer step (SGD, momentum 0.9) is timed as a whole and shared by the update ops in
  proportion to their parameter bytes.

Each op's time is the median over `timing.measured_steps` profiled steps, after `timing.warmup_steps`.
An op that ran too briefly for the clock (or that ran in no fx node: folded into its producer) takes 0 s,
which the simulator uses as its time; a run in which every op took 0 s measured nothing and is an error.

Calibration. The simulator's single-device step time is the sum of the op times; the real step also pays
framework work between ops (argument handling, zero_grad, autograd engine start, the output) and the
instrumentation slows ops a little. The profiler therefore also measures the uninstrumented step time T
with the methodology's protocol and compares it with the sum S of the raw op times: if T > S the gap is
spread as an additive per-op overhead over the ops that ran (`metadata.calibration.op_overhead_s`); if
T < S all times are scaled by T / S. Raw op times are the calibrated ones minus the overhead (or divided
by the factor); both numbers are in the profile's metadata, with the threads, device and versions, and the
backend that measured it (`backend`: "torch", the only profiler; `measured_backend`).

Profiles are written as `results/profiles/<workload>__<device>.json`, the device without its colon
(`cuda0`), in the workload's name a character other than a letter, a digit or `._+=-` as `_` (`profile_path`)
(`suite.costmodel.Profile`);
`applies_to` is the device kind ("cpu", "gpu") unless given.
"""

from __future__ import annotations

import glob
import numbers
import platform
import re
import time
from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

from suite.backends.devices import DeviceMap, check_torch_device, cpu_model_name, synchronize
from suite.backends.timing import check_cpu_clock, clock_function, statistic_s, time_steps
from suite.backends.torch_exec import ExecGraph, TorchExecutor
from suite.backends.workload import RealWorkload
from suite.costmodel import Profile, load_profile, raw_op_times
from suite.errors import PlacebenchError, ProfileError
from suite.graph import OpGraph
from suite.methodology import Methodology, Timing

_REPO_RESULTS = Path(__file__).resolve().parents[1] / "results"
# in a checkout: the committed results/profiles; in an installed package: results/profiles under the current directory
DEFAULT_DIR = (_REPO_RESULTS if _REPO_RESULTS.is_dir() else Path("results")) / "profiles"


def profile_path(directory: str | Path, workload: str, device: str) -> Path:
    """`<directory>/<workload>__<device>.json`, the device without its colon; in the workload's name a
    character other than a letter, a digit or `._+=-` is `_` (as in fidelity reports' names), so that a name
    holding `/` ("lab/bert", "../x") is one file in `directory`, not a path into or out of it."""
    return Path(directory) / f"{_file_part(workload)}__{device.replace(':', '')}.json"


def _file_part(name: str) -> str:
    return re.sub(r"[^\w.+=-]", "_", name)


MAX_THREADS = 4096


def set_threads(threads: int | None) -> int:
    """Set torch's intra-op threads (None or 0: leave torch's default; at most MAX_THREADS); returns the
    number in use."""
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, numbers.Integral)
                                or not 0 <= threads <= MAX_THREADS):
        raise PlacebenchError(f"threads {threads!r}: expected a whole number in [0, {MAX_THREADS}]")
    if threads:
        torch.set_num_threads(int(threads))
    return torch.get_num_threads()


class _Recorder:
    """Per-op time accumulators for one profiled step."""

    def __init__(self, n_ops: int, cuda: torch.device | None, now=time.perf_counter):
        self.now = now
        self.fwd = np.zeros(n_ops)
        self.bwd = np.zeros(n_ops)  # by forward op (or variable op)
        self.unattributed_s = 0.0
        self.cuda = cuda
        self._pending: list[tuple[int, Any, Any, float]] = []

    def node_timer(self, attr: list[int]):
        def timer(i: int, thunk):
            a = attr[i]
            if self.cuda is None:
                t0 = self.now()
                v = thunk()
                dt = self.now() - t0
                if a >= 0:
                    self.fwd[a] += dt
                else:
                    self.unattributed_s += dt
                return v
            e0 = torch.cuda.Event(enable_timing=True)
            e1 = torch.cuda.Event(enable_timing=True)
            t0 = self.now()
            e0.record()
            v = thunk()
            e1.record()
            self._pending.append((a, e0, e1, self.now() - t0))
            return v

        return timer

    def finish_forward(self) -> None:
        if self.cuda is None:
            return
        torch.cuda.synchronize(self.cuda)
        for a, e0, e1, cpu_dt in self._pending:
            dt = max(e0.elapsed_time(e1) / 1e3, cpu_dt)
            if a >= 0:
                self.fwd[a] += dt
            else:
                self.unattributed_s += dt
        self._pending.clear()


class _BackwardTracer:
    """Owns autograd functions by op (see the module docstring) and times them with hooks."""

    def __init__(self, eg: ExecGraph):
        self.eg = eg
        self.owner: dict[Any, int] = {}
        self.events: list[tuple[int, Any]] = []
        self.cuda: torch.device | None = None
        self.now = time.perf_counter

    def reset(self, cuda: torch.device | None, now=time.perf_counter) -> None:
        self.owner = {}
        self.events = []
        self.cuda = cuda
        self.now = now

    def own(self, i: int, value: Any) -> None:
        a = self.eg.attr[i]
        for t in _tensors(value):
            if t.grad_fn is None:
                continue
            stack = [t.grad_fn]
            while stack:
                f = stack.pop()
                if f is None or f in self.owner:
                    continue
                var = getattr(f, "variable", None)
                if isinstance(var, torch.nn.Parameter):
                    key = self.eg.key_of.get(id(var))
                    self.owner[f] = self.eg.param_home_op.get(key, a)
                else:
                    self.owner[f] = a
                self._hook(f, self.owner[f])
                stack.extend(nf for nf, _ in f.next_functions if nf is not None)

    def _mark(self, owner: int) -> None:
        if self.cuda is None:
            self.events.append((owner, self.now()))
        else:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.events.append((owner, e))

    def _hook(self, f: Any, owner: int) -> None:
        f.register_prehook(lambda grad_outputs: self._mark(owner))
        f.register_hook(lambda grad_inputs, grad_outputs: self._mark(owner))

    def times(self, start: Any, end: Any, n_ops: int) -> tuple[np.ndarray, float]:
        """(backward seconds per owner op, unattributed seconds: intervals ending at a mark of no op, and the
        rest after the last mark) from the recorded marks."""
        out = np.zeros(n_ops)
        rest = 0.0
        prev = start
        for owner, mark in self.events:
            dt = _elapsed(prev, mark, self.cuda)
            if owner >= 0:
                out[owner] += dt
            else:
                rest += dt
            prev = mark
        return out, rest + _elapsed(prev, end, self.cuda)


def _elapsed(a: Any, b: Any, cuda: torch.device | None) -> float:
    if cuda is None:
        return max(0.0, b - a)
    return max(0.0, a.elapsed_time(b) / 1e3)


def _tensors(v: Any) -> list[torch.Tensor]:
    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, list | tuple):
        return [t for x in v for t in _tensors(x)]
    return []


def _clock(cuda: torch.device | None, now=time.perf_counter) -> Any:
    if cuda is None:
        return now()
    e = torch.cuda.Event(enable_timing=True)
    e.record()
    return e


def _distribute(graph: OpGraph, fwd: np.ndarray, bwd: np.ndarray, update_s: float) -> np.ndarray:
    """Per graph op seconds of one step from forward, backward (by forward/variable op) and update time."""
    out = fwd.copy()
    index = graph.index
    ops = graph.ops
    acc_ops: dict[str, list[int]] = defaultdict(list)
    for i, op in enumerate(ops):
        if op.kind == "accumulate_grad" and op.group:
            acc_ops[op.group].append(i)
    for a in np.nonzero(bwd)[0]:
        name = ops[a].name
        if ops[a].kind == "variable":
            targets = acc_ops.get(name, [])
            if targets:
                out[targets] += bwd[a] / len(targets)
            else:
                out[a] += bwd[a]
            continue
        targets = [index[t] for t in (f"{name}/grad", f"{name}/grad_weight") if t in index]
        if not targets:
            out[a] += bwd[a]
            continue
        flops = np.array([max(ops[t].flops, 1.0) for t in targets])
        out[targets] += bwd[a] * flops / flops.sum()
    upd = [i for i, op in enumerate(ops) if op.phase == "update"]
    if upd and update_s > 0:
        w = np.array([max(ops[i].param_bytes, 1) for i in upd], dtype=np.float64)
        out[upd] += update_s * w / w.sum()
    return out


def profile_workload(
    rw: RealWorkload,
    device: str = "cpu",
    *,
    methodology: Methodology | None = None,
    timing: Timing | None = None,
    applies_to: str | None = None,
    threads: int | None = None,
    calibrate: bool = True,
    clock: str = "wall",
) -> Profile:
    """Measure per-op times of `rw` on torch device `device` (see the module docstring); `clock` as in
    `suite.backends.timing` ("cpu": CPU time, for one-thread CPU profiles on a shared machine)."""
    from suite import methodology as _m

    check_torch_device(device, where="profile --device")
    clock_function(clock)  # an unknown clock fails here, before the executor is built and the model moved
    timing = timing or (methodology or _m.load()).timing
    before = torch.get_num_threads()
    n_threads = set_threads(threads)
    try:
        if device.startswith("cuda"):  # CUDA events record on the current device's stream
            with torch.cuda.device(torch.device(device)):
                return _profile(rw, device, timing, applies_to, n_threads, calibrate, clock)
        return _profile(rw, device, timing, applies_to, n_threads, calibrate, clock)
    finally:
        torch.set_num_threads(before)


def _profile(rw: RealWorkload, device: str, timing: Timing, applies_to: str | None, n_threads: int,
             calibrate: bool, clock: str) -> Profile:
    check_cpu_clock(clock, [torch.device(device)], False)
    ex = TorchExecutor(rw, DeviceMap(("profiled",), (device,)))
    try:
        return _profile_with(ex, rw, device, timing, applies_to, n_threads, calibrate, clock)
    finally:
        # the workload's parameters are shared with whatever runs next (a fidelity measurement): their
        # gradients and the optimizer state must not outlive the profile (6 GB each on the large variants)
        ex.release()
        ex.close()


def _profile_with(ex: TorchExecutor, rw: RealWorkload, device: str, timing: Timing, applies_to: str | None,
                  n_threads: int, calibrate: bool, clock: str) -> Profile:
    graph = rw.graph
    tdev = torch.device(device)
    cuda = tdev if tdev.type == "cuda" else None
    now = clock_function(clock)
    ex.apply(np.zeros(graph.num_ops, dtype=np.int64))
    eg = ex.eg
    for _ in range(timing.warmup_steps):
        ex.step()
    synchronize([tdev])
    per_step: list[np.ndarray] = []
    unattributed: list[float] = []
    tracer = _BackwardTracer(eg)
    for _ in range(timing.measured_steps):
        rec = _Recorder(graph.num_ops, cuda, now)
        timer = rec.node_timer(eg.attr)
        if not rw.training:
            with torch.no_grad():
                ex.forward(timer=timer)
            rec.finish_forward()
            per_step.append(rec.fwd)
            unattributed.append(rec.unattributed_s)
            continue
        tracer.reset(cuda, now)
        ex.optimizer.zero_grad(set_to_none=True)
        loss = ex.forward(timer=timer, node_hook=tracer.own)
        rec.finish_forward()
        start = _clock(cuda, now)
        loss.backward()
        end = _clock(cuda, now)
        synchronize([tdev])
        bwd, bwd_rest = tracer.times(start, end, graph.num_ops)
        t0 = now()
        ex.optimizer.step()
        synchronize([tdev])
        update_s = now() - t0
        per_step.append(_distribute(graph, rec.fwd, bwd, update_s))
        unattributed.append(rec.unattributed_s + bwd_rest)
        tracer.reset(cuda, now)  # the owner map holds autograd functions, and with them saved activations
        del loss
    raw = np.median(np.stack(per_step), axis=0)
    raw_sum = float(raw.sum())
    if raw_sum == 0:  # every single-device step would be simulated as 0 s, and every failure score 0 too
        raise ProfileError(f"profiling {graph.name} on {device}: every op took 0 s by the {clock!r} clock (below its "
                           "resolution?): nothing was measured, no profile written")
    del tracer
    samples = time_steps(ex.step, timing, [tdev], clock)
    measured = statistic_s(samples, timing)
    if calibrate and measured == 0:  # scaled by 0 / raw_sum: every op 0 s, and a factor 0 no reader takes
        raise ProfileError(f"profiling {graph.name} on {device}: the whole step took 0 s by the {clock!r} clock "
                           "(below its resolution?) while its ops added up to more: no profile written")
    ran = raw > 0
    calibration: dict[str, Any] = {"raw_sum_s": raw_sum, "measured_step_s": measured,
                                   "measured_step_samples_s": [float(s) for s in samples],
                                   "unattributed_s": float(np.median(unattributed)), "ops_timed": int(ran.sum())}
    times = raw.copy()
    if calibrate and raw_sum > 0:
        gap = measured - raw_sum
        if gap >= 0:
            overhead = gap / max(int(ran.sum()), 1)
            times[ran] += overhead
            calibration.update(method="additive", op_overhead_s=overhead)
        else:
            times *= measured / raw_sum
            calibration.update(method="scale", factor=measured / raw_sum)
    else:
        calibration["method"] = "none"
    kind = "gpu" if cuda is not None else "cpu"
    model = torch.cuda.get_device_name(tdev) if cuda is not None else cpu_model_name()
    meta = {
        "backend": "torch",  # the executor that ran the ops: its times are PyTorch's, not another runtime's
        "device": device,
        "device_kind": kind,
        "device_model": model,
        "threads": n_threads,
        "clock": clock,
        "mode": rw.mode,
        "timing": dict(timing.__dict__),
        "calibration": calibration,
        "torch": torch.__version__,
        "machine": platform.node(),
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "method": "per fx node timing (forward), autograd hooks (backward), optimizer step (update)",
    }
    return Profile(
        workload=graph.name,
        applies_to=applies_to or kind,
        op_times_s={op.name: float(t) for op, t in zip(graph.ops, times, strict=True)},
        workload_hash=graph.content_hash,
        metadata=meta,
    )


def uncalibrated(profile: Profile) -> Profile:
    """The raw per-op times of a calibrated profile (overhead subtracted, or the scale undone)."""
    from dataclasses import replace

    c = dict(profile.metadata.get("calibration", {}))
    times = raw_op_times(profile.op_times_s, c)
    c["method"] = "none"
    return replace(profile, op_times_s=times, metadata={**profile.metadata, "calibration": c})


def measured_backend(profile: Profile) -> str | None:
    """The backend whose execution a profile's times are: its metadata's `backend`; "torch" for a profile
    `profile_workload` wrote before that was recorded (its metadata holds the torch version); None when
    unknown (a profile written by hand)."""
    backend = profile.metadata.get("backend")
    if isinstance(backend, str) and backend:
        return backend
    return "torch" if "torch" in profile.metadata else None


def find_profiles(graph: OpGraph, directory: str | Path = DEFAULT_DIR) -> list[Profile]:
    """Profiles of `graph` (same name and content hash) stored in `directory` (`profile_path`'s names). The
    name is escaped in the pattern: `[`, `*` or `?` in it would otherwise match other files, or not its own."""
    directory = Path(directory)
    out = []
    for path in sorted(directory.glob(f"{glob.escape(_file_part(graph.name))}__*.json")):
        prof = load_profile(path)
        if prof.workload == graph.name and prof.workload_hash == graph.content_hash:
            out.append(prof)
    return out


def load_matching(paths: Iterable[str | Path], graph: OpGraph) -> list[Profile]:
    """Load profiles and check that each was measured on `graph` (same content hash; a profile without one:
    same workload name)."""
    out = []
    for path in paths:
        prof = load_profile(path)
        if prof.workload_hash and prof.workload_hash != graph.content_hash:
            raise ProfileError(f"{path}: measured on graph {prof.workload_hash}, not on {graph.name!r} "
                               f"({graph.content_hash})")
        if not prof.workload_hash and prof.workload != graph.name:
            raise ProfileError(f"{path}: profile for {prof.workload!r} is not of workload {graph.name!r} (and has "
                               "no workload_hash to say which graph it was measured on)")
        out.append(prof)
    return out
