"""One timing protocol for every real backend (the methodology's `timing` section), and OOM recognition.

A measurement runs `warmup_steps` untimed steps, then `measured_steps` timed ones. The backends run one
more untimed step before these (the one in which the PyTorch and ONNX Runtime backends count the bytes a
step copies between devices, or the ONNX Runtime session's first run), so the first timed step follows
`warmup_steps + 1` untimed ones. Each timed step is
bracketed by a synchronisation of every CUDA device in use (`torch.cuda.synchronize`) before the clock
(`time.perf_counter`) is read, so asynchronous GPU work is inside the step it belongs to. The step time is
the median (or mean, per the methodology) of the samples; the spread is their interquartile range, from
the samples kept in the `Measurement`.

Clock. "wall" (the default, the methodology's) is `time.perf_counter`. "cpu" is `time.process_time`, the
CPU time of this process: on a machine shared with other work, the wall time of a step grows with the
other processes' load while its CPU time does not, so CPU time is the reproducible measure there. It
equals the wall time of an unloaded machine only when the step keeps exactly one CPU thread busy and waits
for nothing: one intra-op thread, sequential execution, no CUDA. Backends refuse it otherwise.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch

from suite.backends.devices import synchronize
from suite.errors import PlacebenchError
from suite.methodology import Timing

# lower case; torch's CPU allocator (c10/core/impl/alloc_cpu.cpp) says "can't allocate memory" where
# posix_memalign fails (Linux, macOS) and "not enough memory" where _aligned_malloc does (Windows)
_OOM_MESSAGES = ("out of memory", "can't allocate memory", "not enough memory", "failed to allocate", "bad_alloc",
                 "cudaerrormemoryallocation")


CLOCKS = ("wall", "cpu")


def clock_function(clock: str) -> Callable[[], float]:
    if clock not in CLOCKS:
        raise PlacebenchError(f"clock {clock!r} is not one of {', '.join(CLOCKS)}")
    return time.perf_counter if clock == "wall" else time.process_time


def check_cpu_clock(clock: str, devices: Sequence[torch.device], concurrent: bool, *,
                    threads: int | None = None, runtime: str = "torch") -> None:
    """The CPU clock measures a step only when one thread does all of its work (see the module docstring).
    `threads`: the intra-op threads of the runtime that runs the step (torch's own by default)."""
    if clock != "cpu":
        return
    if any(d.type != "cpu" for d in devices):
        raise PlacebenchError("clock 'cpu' cannot time CUDA work (it runs outside this process's CPU time)")
    if concurrent:
        raise PlacebenchError("clock 'cpu' cannot time concurrent execution (threads add up their CPU time)")
    threads = torch.get_num_threads() if threads is None else threads
    if threads != 1:
        raise PlacebenchError(f"clock 'cpu' needs one intra-op thread, {runtime} uses {threads or 'all cores'}")


def time_steps(step: Callable[[], object], timing: Timing, devices: Sequence[torch.device],
               clock: str = "wall") -> list[float]:
    """Warm-up steps, then `measured_steps` synchronised samples in seconds of `clock`."""
    now = clock_function(clock)
    sync = [d for d in devices if d.type == "cuda"]
    for _ in range(timing.warmup_steps):
        step()
    synchronize(sync)
    samples = []
    for _ in range(timing.measured_steps):
        if timing.synchronize:
            synchronize(sync)
        t0 = now()
        step()
        if timing.synchronize:
            synchronize(sync)
        samples.append(now() - t0)
    return samples


def statistic_s(samples: Sequence[float], timing: Timing) -> float:
    return float(np.mean(samples) if timing.statistic == "mean" else np.median(samples))


def is_oom(exc: BaseException) -> bool:
    """An allocation failure: torch.OutOfMemoryError, MemoryError, or an allocator's RuntimeError (CPU
    "DefaultCPUAllocator: can't allocate memory", on Windows "DefaultCPUAllocator: not enough memory", ONNX
    Runtime "Failed to allocate memory")."""
    if isinstance(exc, torch.OutOfMemoryError | MemoryError):
        return True
    text = str(exc).lower()
    return any(m in text for m in _OOM_MESSAGES)


_REQUEST = re.compile(r"(?:tried to allocate|requested buffer of size)\s+([0-9.]+)\s*(bytes|kib|mib|gib|tib)?",
                      re.IGNORECASE)
_UNIT = {"bytes": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def requested_bytes(exc: BaseException) -> int:
    """The size of the allocation that failed, where the message gives it (torch CUDA "Tried to allocate
    2.00 GiB", torch CPU "you tried to allocate 123 bytes", ONNX Runtime "requested buffer of size 123"),
    else 0."""
    m = _REQUEST.search(str(exc))
    if m is None:
        return 0
    return int(float(m.group(1)) * _UNIT[(m.group(2) or "bytes").lower()])


def oom_need_bytes(peak: int, in_use: int, exc: BaseException) -> int:
    """What a placement that ran out of memory on a device is known to need there (a lower bound): the most
    it held (`peak`), or what it held when the allocation failed (`in_use`) plus that allocation, whichever
    is more. It is an out-of-memory measurement's peak memory of the device, which m_etf's OOM retries
    compare with the device's capacity."""
    return max(int(peak), int(in_use) + requested_bytes(exc))


def held_by(oom: Sequence[str], used: Sequence[int], names: Sequence[str]) -> tuple[str, ...]:
    """The devices of an out-of-memory verdict (`oom`, cluster device names) that the placement puts anything
    on (`used`: cluster device indices into `names`): host memory is shared by every CPU device of a cluster,
    and an allocation failure there names them all, but those the placement leaves idle hold nothing. All of
    `oom` where it names none of them (the failure is still reported where it happened)."""
    held = {names[d] for d in used}
    kept = tuple(n for n in oom if n in held)
    return kept or tuple(oom)


def backend_setup(cluster, device_map, methodology, timing):
    """The device map (checked against the cluster) and timing protocol a real backend runs with."""
    from suite import methodology as _m
    from suite.backends.devices import DeviceMap

    device_map = device_map or DeviceMap.default(cluster)
    if list(device_map.cluster_devices) != [d.name for d in cluster.devices]:
        raise PlacebenchError(f"device map {device_map.as_dict()} does not list cluster {cluster.name!r}'s devices")
    return device_map, timing or (methodology or _m.load()).timing
