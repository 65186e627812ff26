"""The schedule of one placement as a timeline: every op's run, every transfer and each device's memory.

`schedule` runs the reference engine (`reference.py`, the definition of the semantics), which records what
the fast engine does not keep: each op's start and finish and each transfer's channel, start, end and
bytes. `chrome_trace` turns that into the Trace Event Format that Perfetto (https://ui.perfetto.dev) and
chrome://tracing open, so a user can see why a placement is slow or runs out of memory:

* one process per device, with a `compute` track (one slice per op) and one `to DEVICE` track per
  destination that it sends to (one slice per transfer: the channel carries one at a time);
* an op or transfer that takes 0 s is an instant event (a marker, no slice) on a track of its own,
  `compute (0 s)` or `to DEVICE (0 s)`: as a slice of no width it would be drawn nested in, or over, the
  slice that starts or ends at the same time on its track;
* a `memory` counter per device: resident bytes (parameters, and optimizer state in training) plus live
  tensors (weight gradients among them), after every change; its largest value is the device's peak
  memory, as the simulator reports it, and the device's capacity is in the process's name;
* with profiles, each op's `time` argument says whether its time on its device is the profile's or the
  roofline estimate, and `otherData.profiles` how many of the step's ops (`ops` of `of_ops`) and seconds of
  compute (`compute_s` of `of_compute_s`) the profiles timed.

Times (`ts`, `dur`) are in microseconds of simulated time, from 0 at the start of the step, each a whole
number of nanoseconds: a viewer rounds them to whole nanoseconds (Perfetto does), so a slice that ends when
the next one on its track starts must end at exactly that nanosecond, or the two overlap by one and the next
is drawn nested in it. An op or transfer shorter than half a nanosecond takes 0 s in the trace.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from suite.cluster import Cluster
from suite.costmodel import Profile, profiled_mask
from suite.graph import OpGraph
from suite.placement import validate
from suite.simulator import inputs_for, reference
from suite.textfile import human_bytes


def _us(t: float) -> float:
    """Seconds as microseconds rounded to the nanosecond (the same instant always gives the same value)."""
    return round(t * 1e9) / 1e3


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
    profiles = tuple(dict.fromkeys(profiles))  # one given twice counts once, as in the cost model
    sched = schedule(workload, cluster, place, profiles=profiles)
    names = [d.name for d in cluster.devices]
    events: list[dict[str, Any]] = []
    for d, device in enumerate(cluster.devices):
        label = f"{device.name} ({device.kind}, {human_bytes(device.memory_bytes)})"
        events.append({"ph": "M", "name": "process_name", "pid": d, "args": {"name": label}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": d, "args": {"sort_index": d}})
        events.append({"ph": "M", "name": "thread_name", "pid": d, "tid": 0, "args": {"name": "compute"}})
    ndev = len(names)
    tracks: dict[tuple[int, int], str] = {}  # (pid, tid) -> name of each track below

    def span(name: str, cat: str, pid: int, tid: int, track: str, start: float, end: float, args: dict) -> None:
        ns = round(start * 1e9), round(end * 1e9)
        if ns[1] > ns[0]:
            event = {"ph": "X", "ts": ns[0] / 1e3, "dur": (ns[1] - ns[0]) / 1e3}
        else:  # 0 s: a marker on the track of the same name + " (0 s)", which holds no slices
            tid, track = tid + 1 + ndev, f"{track} (0 s)"
            event = {"ph": "i", "s": "t", "ts": ns[0] / 1e3}
        tracks[(pid, tid)] = track
        events.append({**event, "name": name, "cat": cat, "pid": pid, "tid": tid, "args": args})

    measured = profiled_mask(workload, cluster, profiles)[range(workload.num_ops), place] if profiles else None
    for i, op in enumerate(workload.ops):
        span(op.name, op.phase, int(place[i]), 0, "compute", sched.start_s[i], sched.finish_s[i],
             {"kind": op.kind, "flops": op.flops, "bytes_read": op.bytes_read, "output_bytes": op.output_bytes,
              "param_bytes": op.param_bytes,
              **({"time": "profile" if measured[i] else "roofline"} if measured is not None else {})})
    for p, src, dst, start, end, nbytes in sched.transfers:
        span(workload.ops[p].name, "transfer", src, 1 + dst, f"to {names[dst]}", start, end,
             {"bytes": nbytes, "to": names[dst]})
    for (pid, tid), track in sorted(tracks.items()):
        if tid != 0:  # each device's compute track is named above
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": track}})
    for d, points in enumerate(memory_series(sched)):
        events.extend({"ph": "C", "name": "memory", "pid": d, "ts": _us(t), "args": {"bytes": b}} for t, b in points)
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
            **({"profiles": _profiled_part(workload, cluster, place, profiles, measured)} if profiles else {}),
            **(metadata or {}),
        },
    }


def _profiled_part(workload: OpGraph, cluster: Cluster, place, profiles: tuple[Profile, ...],
                   measured) -> dict[str, Any]:
    """How much of the placement's compute the profiles timed: its ops, and their seconds on their devices."""
    cost = inputs_for(workload, cluster, profiles).cost[range(workload.num_ops), place]
    return {"files": [p.source or "(not from a file)" for p in profiles], "ops": int(measured.sum()),
            "of_ops": workload.num_ops, "compute_s": float(cost[measured].sum()), "of_compute_s": float(cost.sum())}


def write_chrome_trace(path: str | Path, workload: OpGraph, cluster: Cluster, placement, **kwargs: Any) -> Path:
    """Write `chrome_trace(...)` as JSON to `path` (atomically) and return the path."""
    from suite.store import atomic_write_text

    doc = chrome_trace(workload, cluster, placement, **kwargs)
    return atomic_write_text(Path(path), json.dumps(doc, separators=(",", ":")) + "\n")
