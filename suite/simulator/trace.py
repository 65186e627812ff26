"""The schedule of one placement as a timeline: every op's run, every transfer and each device's memory.

`schedule` runs the reference engine (`reference.py`, the definition of the semantics), which records what
the fast engine does not keep: each op's start and finish and each transfer's channel, start, end and
bytes. `chrome_trace` turns that into the Trace Event Format that Perfetto (https://ui.perfetto.dev) and
chrome://tracing open, so a user can see why a placement is slow or runs out of memory:

* one process per device, with a `compute` track (one slice per op) and one `to DEVICE` track per
  destination that it sends to (one slice per transfer: the channel carries one at a time);
* a `memory` counter per device: resident bytes (parameters, and optimizer state in training) plus live
  tensors (weight gradients among them), after every change; its largest value is the device's peak
  memory, as the simulator reports it, and the device's capacity is in the process's name.

Times are in microseconds of simulated time, from 0 at the start of the step.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from suite.cluster import Cluster
from suite.costmodel import Profile
from suite.graph import OpGraph
from suite.placement import validate
from suite.simulator import inputs_for, reference
from suite.textfile import human_bytes

US = 1e6  # microseconds per second


def schedule(workload: OpGraph, cluster: Cluster, placement, *, profiles: Iterable[Profile] = ()) -> reference.Schedule:
    """The reference engine's full schedule of a validated placement (same results as `simulate`)."""
    place = validate(placement, workload, cluster)
    return reference.simulate(place, *inputs_for(workload, cluster, profiles).args())


def memory_series(sched: reference.Schedule) -> list[list[tuple[float, int]]]:
    """Per device, (time, resident + live bytes) at the end of each instant at which that value changes.

    The first point of every device is at time 0; the largest value is its peak memory."""
    series: list[list[tuple[float, int]]] = [[(0.0, int(r))] for r in sched.resident_bytes]
    live = [int(r) for r in sched.resident_bytes]
    for d, t, delta in sched.memory_events:
        live[d] += delta
        if series[d][-1][0] == t:
            series[d][-1] = (t, live[d])  # the value at the end of the instant
        else:
            series[d].append((t, live[d]))
    return [[pt for k, pt in enumerate(points) if k == 0 or pt[1] != points[k - 1][1]] for points in series]


def chrome_trace(
    workload: OpGraph, cluster: Cluster, placement, *, profiles: Iterable[Profile] = (),
    metadata: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The Trace Event Format document of one placement's step (see the module docstring)."""
    place = validate(placement, workload, cluster)
    sched = schedule(workload, cluster, place, profiles=profiles)
    names = [d.name for d in cluster.devices]
    events: list[dict[str, Any]] = []
    for d, device in enumerate(cluster.devices):
        label = f"{device.name} ({device.kind}, {human_bytes(device.memory_bytes)})"
        events.append({"ph": "M", "name": "process_name", "pid": d, "args": {"name": label}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": d, "args": {"sort_index": d}})
        events.append({"ph": "M", "name": "thread_name", "pid": d, "tid": 0, "args": {"name": "compute"}})
    for i, op in enumerate(workload.ops):
        events.append({
            "ph": "X", "name": op.name, "cat": op.phase, "pid": int(place[i]), "tid": 0,
            "ts": sched.start_s[i] * US, "dur": (sched.finish_s[i] - sched.start_s[i]) * US,
            "args": {"kind": op.kind, "flops": op.flops, "bytes_read": op.bytes_read,
                     "output_bytes": op.output_bytes, "param_bytes": op.param_bytes},
        })
    channels = sorted({(src, dst) for _, src, dst, *_ in sched.transfers})
    for src, dst in channels:
        events.append({"ph": "M", "name": "thread_name", "pid": src, "tid": 1 + dst, "args": {"name": f"to {names[dst]}"}})
    for p, src, dst, start, end, nbytes in sched.transfers:
        events.append({
            "ph": "X", "name": workload.ops[p].name, "cat": "transfer", "pid": src, "tid": 1 + dst,
            "ts": start * US, "dur": (end - start) * US, "args": {"bytes": nbytes, "to": names[dst]},
        })
    for d, points in enumerate(memory_series(sched)):
        events.extend({"ph": "C", "name": "memory", "pid": d, "ts": t * US, "args": {"bytes": b}} for t, b in points)
    peak = sched.peak_memory_bytes
    capacity = [d.memory_bytes for d in cluster.devices]
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "workload": workload.name,
            "workload_hash": workload.content_hash,
            "cluster": cluster.name,
            "step_time_s": sched.step_time_s,
            "status": "oom" if any(p > c for p, c in zip(peak, capacity, strict=True)) else "ok",
            "peak_memory_bytes": {n: int(p) for n, p in zip(names, peak, strict=True)},
            "busy_s": {n: float(b) for n, b in zip(names, sched.busy_s, strict=True)},
            "bytes_transferred": int(sched.link_bytes.sum()),
            **(metadata or {}),
        },
    }


def write_chrome_trace(path: str | Path, workload: OpGraph, cluster: Cluster, placement, **kwargs: Any) -> Path:
    """Write `chrome_trace(...)` as JSON to `path` (atomically) and return the path."""
    from suite.store import atomic_write_text

    doc = chrome_trace(workload, cluster, placement, **kwargs)
    return atomic_write_text(Path(path), json.dumps(doc, separators=(",", ":")) + "\n")
