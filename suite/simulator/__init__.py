"""The placement simulator: (workload, cluster, placement) -> step time, busy time, traffic, peak memory, status.

`simulate` is the public entry point. Two engines share one semantics (documented in `reference.py`):
`"reference"`, a short pure-Python event loop, and `"fast"` (the default), a compiled port of it with a
batch API (`simulate_batch`) that evaluates many placements at once; `start_times` gives its schedule's op
start times (features for placers such as Placeto). Property tests check that both agree exactly.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np

from suite.cluster import Cluster
from suite.costmodel import Profile, cost_matrix
from suite.errors import ClusterError, PlacementError, ProfileError
from suite.graph import OpGraph
from suite.placement import all_valid, validate
from suite.simulator import reference

ENGINES = ("fast", "reference")


@dataclass(frozen=True)
class SimInputs:
    """The arrays both engines read; built once per (workload, cluster, profiles)."""

    cost: np.ndarray  # float64 [n, D]
    succ_ptr: np.ndarray
    succ_idx: np.ndarray
    succ_bytes: np.ndarray
    num_preds: np.ndarray
    pred_ptr: np.ndarray
    pred_idx: np.ndarray
    output_bytes: np.ndarray
    send_cap: np.ndarray  # int64 [n]: the most one transfer of op i's output carries (see `send_caps`)
    param_bytes: np.ndarray
    latency_s: np.ndarray  # [D, D]
    bandwidth: np.ndarray  # [D, D]
    capacity_bytes: np.ndarray  # int64 [D]
    ports: tuple[np.ndarray, np.ndarray, int] | None = None  # `Cluster.ports`: None unless a link shares ports

    @classmethod
    def build(cls, graph: OpGraph, cluster: Cluster, profiles: Iterable[Profile] = ()) -> SimInputs:
        a = graph.arrays
        lat, bw = cluster.routes if cluster.num_devices > 1 else (np.zeros((1, 1)), np.full((1, 1), np.inf))
        worst_transfer = _check_transfer_times(graph, cluster, lat, bw)
        cost = cost_matrix(graph, cluster, profiles)
        _check_step_bound(graph, cluster, cost, worst_transfer, bool(profiles))
        num_preds = np.diff(a.pred_ptr)
        capacity = np.array([d.memory_bytes for d in cluster.devices], dtype=np.int64)
        for x in (num_preds, capacity):  # shared by every later simulation, and capacity by each SimResult
            x.setflags(write=False)
        return cls(
            cost=cost,
            succ_ptr=a.succ_ptr,
            succ_idx=a.succ_idx,
            succ_bytes=a.succ_bytes,
            num_preds=num_preds,
            pred_ptr=a.pred_ptr,
            pred_idx=a.pred_idx,
            output_bytes=a.output_bytes,
            send_cap=send_caps(a.output_bytes, a.succ_ptr, a.succ_bytes),
            param_bytes=a.param_bytes,
            latency_s=np.ascontiguousarray(lat, dtype=np.float64),
            bandwidth=np.ascontiguousarray(bw, dtype=np.float64),
            capacity_bytes=capacity,
            ports=cluster.ports,
        )

    def fast_args(self) -> tuple:
        """The fast engine's arguments, index arrays as uint64 (converted once per SimInputs)."""
        return (
            self.cost,
            *self._unsigned_index,
            self.output_bytes,
            self.send_cap,
            self.param_bytes,
            self.latency_s,
            self.bandwidth,
            self._unsigned_ports,
        )

    @cached_property
    def _unsigned_ports(self) -> tuple | None:
        from suite.simulator import fast

        if self.ports is None:
            return None
        ptr, port = fast.unsigned(self.ports[0]), fast.unsigned(self.ports[1])
        for a in (ptr, port):
            a.setflags(write=False)
        return ptr, port, self.ports[2]

    @cached_property
    def _unsigned_index(self) -> tuple:
        from suite.simulator import fast

        index = [fast.unsigned(a) for a in (self.succ_ptr, self.succ_idx, self.pred_ptr, self.pred_idx)]
        for a in index:  # copies shared by every later simulation of this workload and cluster
            a.setflags(write=False)
        return index[0], index[1], self.succ_bytes, index[2], index[3]

    def args(self) -> tuple:
        return (
            self.cost,
            self.succ_ptr,
            self.succ_idx,
            self.succ_bytes,
            self.num_preds,
            self.output_bytes,
            self.send_cap,
            self.param_bytes,
            self.latency_s,
            self.bandwidth,
            self.ports,
        )


def send_caps(output_bytes: np.ndarray, succ_ptr: np.ndarray, succ_bytes: np.ndarray) -> np.ndarray:
    """Per op, the whole tensor a transfer of its output can carry: the larger of its output bytes and its
    largest edge (a variable's output is 0 bytes; its edges carry its weights). A transfer carries the sum of
    the edges to its destination's consumers, at most this."""
    cap = np.array(output_bytes, dtype=np.int64)
    has_succ = np.diff(succ_ptr) > 0
    if has_succ.any():
        largest = np.maximum.reduceat(np.asarray(succ_bytes, dtype=np.int64), np.asarray(succ_ptr[:-1])[has_succ])
        cap[has_succ] = np.maximum(cap[has_succ], largest)
    cap.setflags(write=False)  # shared by every simulation of this workload, like the graph's arrays
    return cap


def _check_transfer_times(graph: OpGraph, cluster: Cluster, lat: np.ndarray, bw: np.ndarray) -> float:
    """The largest tensor must cross every route in a finite time (a step time is never infinite); returns
    that worst transfer time."""
    if cluster.num_devices < 2 or graph.arrays.succ_bytes.size == 0:
        return 0.0
    largest = float(graph.arrays.succ_bytes.max())
    with np.errstate(over="ignore", divide="ignore"):
        worst = lat + largest / bw
    off = ~np.eye(cluster.num_devices, dtype=bool)
    if not np.isfinite(worst[off]).all():
        a, b = np.argwhere(off & ~np.isfinite(worst))[0]
        raise ClusterError(
            f"cluster {cluster.name!r}: a {largest:.0f}-byte tensor of {graph.name!r} takes an infinite time from "
            f"{cluster.devices[a].name} to {cluster.devices[b].name} (bandwidth {bw[a, b]:g} B/s)"
        )
    return float(worst[off].max())


def _check_step_bound(graph: OpGraph, cluster: Cluster, cost: np.ndarray, worst_transfer: float,
                      profiled: bool) -> None:
    """Every step time, busy time and event time of any placement is at most the sum of the slowest time of
    every op plus a worst-case transfer per edge (something is always running or in flight): that sum must
    be a finite float, or a simulation could overflow to an infinite step time."""
    with np.errstate(over="ignore"):
        bound = float(cost.max(axis=1).sum()) + graph.num_edges * worst_transfer
    if not np.isfinite(bound):
        error = ProfileError if profiled else ClusterError
        raise error(
            f"{graph.name!r} on {cluster.name!r}: its op and transfer times add up to more than the largest float "
            f"(an op overhead, latency, or profiled op time that large would make step times infinite)"
        )


@dataclass(frozen=True)
class SimResult:
    """One simulated step of a placement: status "ok", or "oom" where a device's peak memory exceeds its
    capacity (`oom_devices` names them), the step time, and per device its compute time, peak memory and
    capacity; `link_bytes` counts the bytes each device sent to each other one."""

    status: str  # "ok" or "oom"
    step_time_s: float
    busy_s: np.ndarray  # [D] seconds of compute per device
    peak_memory_bytes: np.ndarray  # [D] resident + peak live bytes
    capacity_bytes: np.ndarray  # [D]
    link_bytes: np.ndarray  # [D, D] bytes sent from row device to column device
    device_names: tuple[str, ...]

    @property
    def oom_devices(self) -> tuple[str, ...]:
        return tuple(n for n, p, c in zip(self.device_names, self.peak_memory_bytes, self.capacity_bytes, strict=True) if p > c)

    def as_dict(self) -> dict:
        return {
            "status": self.status,
            "step_time_s": self.step_time_s,
            "oom_devices": list(self.oom_devices),
            "devices": {
                name: {
                    "busy_s": float(self.busy_s[d]),
                    "peak_memory_bytes": int(self.peak_memory_bytes[d]),
                    "capacity_bytes": int(self.capacity_bytes[d]),
                }
                for d, name in enumerate(self.device_names)
            },
            "bytes_transferred": int(self.link_bytes.sum()),
        }


@lru_cache(maxsize=32)
def _cached_inputs(graph: OpGraph, cluster: Cluster, profiles: tuple[Profile, ...]) -> SimInputs:
    return SimInputs.build(graph, cluster, profiles)


def inputs_for(graph: OpGraph, cluster: Cluster, profiles: Iterable[Profile] = ()) -> SimInputs:
    """The inputs of (graph, cluster, profiles), built on the first call and then reused (profiles are
    read-only, so a cached cost matrix cannot go stale)."""
    return _cached_inputs(graph, cluster, tuple(profiles))


def _result(inputs: SimInputs, cluster: Cluster, step, busy, peak, link) -> SimResult:
    status = "oom" if (peak > inputs.capacity_bytes).any() else "ok"
    return SimResult(
        status=status,
        step_time_s=float(step),
        busy_s=np.asarray(busy, dtype=np.float64),
        peak_memory_bytes=np.asarray(peak, dtype=np.int64),
        capacity_bytes=inputs.capacity_bytes,
        link_bytes=np.asarray(link, dtype=np.int64),
        device_names=tuple(d.name for d in cluster.devices),
    )


def simulate(
    workload: OpGraph,
    cluster: Cluster,
    placement,
    *,
    profiles: Iterable[Profile] = (),
    engine: str = "fast",
) -> SimResult:
    """Simulate one training or inference step of `workload` on `cluster` under `placement`.

    The placement is validated first (`PlacementError` on a wrong length, unknown device, forbidden device
    kind or split colocation group). OOM is a status of the result, not an exception.
    """
    if engine not in ENGINES:
        raise ValueError(f"unknown simulator engine {engine!r}; choose from {', '.join(ENGINES)}")
    place = validate(placement, workload, cluster)
    inputs = inputs_for(workload, cluster, profiles)
    if engine == "reference":
        s = reference.simulate(place, *inputs.args())
        return _result(inputs, cluster, s.step_time_s, s.busy_s, s.peak_memory_bytes, s.link_bytes)
    from suite.simulator import fast

    step, busy, peak, link = fast.simulate_one(place, *inputs.fast_args())
    return _result(inputs, cluster, step, busy, peak, link)


def simulate_batch(
    workload: OpGraph,
    cluster: Cluster,
    placements: np.ndarray,
    *,
    profiles: Iterable[Profile] = (),
    validate_each: bool = True,
) -> list[SimResult]:
    """Simulate many placements ([B, n] array) with the fast engine.

    `validate_each=False` skips the per-placement checks of device kinds and colocation groups (for callers
    that made them already); device indices are still checked, since the engine would read out of bounds.
    """
    from suite.simulator import fast

    placements = _checked_batch(workload, cluster, placements, validate_each)
    inputs = inputs_for(workload, cluster, profiles)
    steps, busy, peak, link = fast.simulate_batch(placements, *inputs.fast_args())
    return [_result(inputs, cluster, steps[b], busy[b], peak[b], link[b]) for b in range(len(placements))]


def start_times(
    workload: OpGraph,
    cluster: Cluster,
    placements: np.ndarray,
    *,
    profiles: Iterable[Profile] = (),
    validate_each: bool = True,
) -> np.ndarray:
    """float64 [B, n]: when each op starts under each placement of a [B, n] batch (the fast engine's
    schedule, equal to the reference's `start_s`). Checks as `simulate_batch`."""
    from suite.simulator import fast

    placements = _checked_batch(workload, cluster, placements, validate_each)
    return fast.simulate_batch(placements, *inputs_for(workload, cluster, profiles).fast_args(), start_times=True)[4]


def _checked_batch(workload: OpGraph, cluster: Cluster, placements: np.ndarray, validate_each: bool) -> np.ndarray:
    """A [B, n] batch of placements as the contiguous int64 array the engine reads, after the checks."""
    placements = np.asarray(placements)
    if placements.ndim != 2 or placements.shape[1] != workload.num_ops:
        raise PlacementError(
            f"batch of placements must have shape [B, {workload.num_ops}], got {placements.shape}"
        )
    if not validate_each:
        _check_device_indices(placements, workload, cluster)
    elif not all_valid(placements, workload, cluster):  # some placement is invalid: `validate` names the first
        placements = np.stack([validate(p, workload, cluster) for p in placements]) if len(placements) else placements
    return np.ascontiguousarray(placements, dtype=np.int64)


def _check_device_indices(placements: np.ndarray, workload: OpGraph, cluster: Cluster) -> None:
    """Every entry of a [B, n] batch is an integer device index of `cluster` (PlacementError naming one that is not)."""
    if placements.size == 0:
        return
    if placements.dtype.kind not in "iu":
        raise PlacementError(f"a batch of placements must hold integer device indices, got dtype {placements.dtype}")
    bad = (placements < 0) | (placements >= cluster.num_devices)
    if bad.any():
        b, i = (int(x) for x in np.argwhere(bad)[0])
        raise PlacementError(
            f"placement {b} of the batch, entry {i} (op {workload.ops[i].name!r}): device {int(placements[b, i])} "
            f"does not exist; cluster {cluster.name!r} has devices 0..{cluster.num_devices - 1}"
        )
