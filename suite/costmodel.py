"""Cost model: how long an op takes on a device, and a tensor on a link.

Analytic mode (a roofline): on device d, op i takes

    t[i, d] = op_overhead_s[d] + max(flops[i] / (peak_flops[d] * compute_efficiency[d]),
                                      bytes_accessed[i] / (mem_bandwidth[d] * memory_efficiency[d]))

Profile mode: a `Profile` holds measured per-op times for one device (by device name, or for every
device of a kind or model); where it has a time for an op, that time replaces the estimate, 0 s included
(an op below the clock's resolution). An op it has no time for keeps the roofline estimate, so a profile
of some ops mixes measured and estimated times in one step: `profiled_mask` says which are measured. A profile
belongs to one workload: its content hash must be the graph's, and one without a hash (written by hand)
must name the graph's workload. Two profiles that both give one device a time for the same op are an
error (which one counted would depend on the order they were given in), not the later one silently
winning; a profile for a kind and another for one device of that kind may time different ops. A profile given
twice (equal times, workload and metadata) counts once.

A transfer of b bytes from device a to device c takes latency[a, c] + b / bandwidth[a, c] along the
fewest-link route (see `Cluster.routes`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from suite.cluster import Cluster, Device
from suite.errors import ClusterError, ProfileError
from suite.graph import OpGraph
from suite.textfile import as_float, first_non_finite, load_json, short_repr

PROFILE_FORMAT = "placebench.profile"
PROFILE_SCHEMA_VERSION = 1
_PROFILE_KEYS = {"format", "schema_version", "workload", "workload_hash", "applies_to", "metadata", "op_times_s"}


def roofline_time_s(flops: np.ndarray, bytes_accessed: np.ndarray, device: Device) -> np.ndarray:
    compute = flops / (device.peak_flops * device.compute_efficiency)
    memory = bytes_accessed / (device.mem_bandwidth * device.memory_efficiency)
    return device.op_overhead_s + np.maximum(compute, memory)


@dataclass(frozen=True)
class Profile:
    """Measured per-op times on one device. `applies_to` matches a device name, kind or model."""

    workload: str
    applies_to: str
    op_times_s: Mapping[str, float]
    workload_hash: str = ""
    metadata: Mapping[str, Any] = field(default_factory=dict)
    source: str = field(default="", compare=False)  # the file it was read from, for messages; not saved

    def __post_init__(self) -> None:
        # read-only copies: the simulator caches its inputs per profile, so a profile must not change
        object.__setattr__(self, "op_times_s", MappingProxyType(dict(self.op_times_s)))
        object.__setattr__(self, "metadata", MappingProxyType(dict(self.metadata)))

    def __hash__(self) -> int:
        """Cheap (equal profiles hash equal; equality compares the times): profiles key the simulator's cache."""
        return hash((self.workload, self.applies_to, self.workload_hash, len(self.op_times_s)))

    def __reduce__(self) -> tuple:
        # a read-only mapping does not pickle; fidelity runs hand profiles to worker processes
        return Profile, (self.workload, self.applies_to, dict(self.op_times_s), self.workload_hash,
                         dict(self.metadata), self.source)

    def matches(self, device: Device) -> bool:
        # an empty applies_to (a profile made in code) is no device: not every device without a model
        return bool(self.applies_to) and self.applies_to in (device.name, device.kind, device.model)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": PROFILE_FORMAT,
            "schema_version": PROFILE_SCHEMA_VERSION,
            "workload": self.workload,
            "workload_hash": self.workload_hash,
            "applies_to": self.applies_to,
            "metadata": dict(self.metadata),
            "op_times_s": dict(self.op_times_s),
        }

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=1, allow_nan=False))
        tmp.replace(path)
        return path


def _seconds(value: Any) -> float | None:
    """value as a finite non-negative float, or None."""
    t = as_float(value)
    return t if math.isfinite(t) and t >= 0 else None


def profile_from_dict(data: Any, *, source: str = "<dict>") -> Profile:
    if not isinstance(data, dict) or data.get("format") != PROFILE_FORMAT:
        raise ProfileError(f"{source}: not a placebench profile (field 'format' must be {PROFILE_FORMAT!r})")
    version = data.get("schema_version")
    if type(version) is not int or version != PROFILE_SCHEMA_VERSION:  # not true, not 1.0 (as graph files)
        raise ProfileError(f"{source}: schema_version {short_repr(version)} is not supported")
    unknown = set(data) - _PROFILE_KEYS
    if unknown:
        raise ProfileError(f"{source}: unknown field(s) {sorted(unknown)}; expected {sorted(_PROFILE_KEYS)}")
    for key in ("workload", "applies_to"):
        if key not in data:
            raise ProfileError(f"{source}: field {key!r} is missing")
        if not isinstance(data[key], str) or not data[key]:
            raise ProfileError(f"{source}: field {key!r} must be a non-empty string, got {short_repr(data[key])}")
    if not isinstance(data.get("workload_hash", ""), str):
        raise ProfileError(f"{source}: field 'workload_hash' must be a string, got {short_repr(data['workload_hash'])}")
    if not isinstance(data.get("metadata", {}), dict):
        raise ProfileError(f"{source}: field 'metadata' must be an object, got {short_repr(data['metadata'])}")
    bad = first_non_finite(data.get("metadata", {}), "metadata")
    if bad:  # NaN / Infinity are not JSON: Profile.save cannot write them, nor a fidelity report hold them
        raise ProfileError(f"{source}: {bad} is not a finite number")
    times = data.get("op_times_s")
    if not isinstance(times, dict):
        raise ProfileError(f"{source}: field 'op_times_s' must be an object of op name -> seconds")
    seconds = {name: _seconds(t) for name, t in times.items()}
    for name, t in seconds.items():
        if t is None:
            raise ProfileError(f"{source}: op_times_s[{name!r}] = {short_repr(times[name])} is not a finite non-negative number")
    if not math.isfinite(sum(seconds.values())):
        raise ProfileError(f"{source}: op_times_s add up to more than the largest float (a step time would be infinite)")
    calibration = data.get("metadata", {}).get("calibration")
    if calibration is not None:
        _check_calibration(calibration, source)
        if not math.isfinite(sum(raw_op_times(seconds, calibration).values())):
            raise ProfileError(f"{source}: op_times_s without metadata.calibration (divided by factor "
                               f"{short_repr(calibration['factor'])}) add up to more than the largest float")
    return Profile(
        workload=data["workload"],
        applies_to=data["applies_to"],
        op_times_s=seconds,
        workload_hash=data.get("workload_hash", ""),
        metadata=dict(data.get("metadata", {})),
        source=source if source != "<dict>" else "",
    )


CALIBRATION_METHODS = ("none", "additive", "scale")


def _check_calibration(c: Any, source: str) -> None:
    """`metadata.calibration` as `suite.profiling` writes it: a method, and the number that method needs."""
    where = f"{source}: metadata.calibration"
    if not isinstance(c, dict):
        raise ProfileError(f"{where} must be an object, got {short_repr(c)}")
    if c.get("method") not in CALIBRATION_METHODS:
        raise ProfileError(f"{where}.method = {short_repr(c.get('method'))} is not one of {', '.join(CALIBRATION_METHODS)}")
    needed = {"additive": ["op_overhead_s"], "scale": ["factor"]}.get(c["method"], [])
    for key in needed:
        if key not in c:
            raise ProfileError(f"{where}: method {c['method']!r} needs field {key!r}")
    for key in ("op_overhead_s", "raw_sum_s", "measured_step_s"):
        if key in c and _seconds(c[key]) is None:
            raise ProfileError(f"{where}.{key} = {short_repr(c[key])} is not a finite non-negative number")
    if "factor" in c:
        f = as_float(c["factor"])
        if not (math.isfinite(f) and f > 0):
            raise ProfileError(f"{where}.factor = {short_repr(c['factor'])} is not a finite positive number")


def raw_op_times(times: Mapping[str, float], calibration: Mapping[str, Any]) -> dict[str, float]:
    """The per-op times before `calibration` (a checked `metadata.calibration`): the additive overhead
    subtracted from the ops that ran, or the scale factor divided out."""
    method = calibration.get("method")
    if method == "additive":
        overhead = float(calibration["op_overhead_s"])
        return {k: max(0.0, t - overhead) if t > 0 else t for k, t in times.items()}
    if method == "scale":
        factor = float(calibration["factor"])
        return {k: t / factor for k, t in times.items()}
    return dict(times)


def load_profile(path: str | Path) -> Profile:
    path = Path(path)
    data = load_json(path, ProfileError, "profile")
    return profile_from_dict(data, source=str(path))


def _devices_summary(cluster: Cluster) -> str:
    """The names, kinds and models a profile's `applies_to` can match."""
    names = ", ".join(d.name for d in cluster.devices)
    kinds = ", ".join(dict.fromkeys(d.kind for d in cluster.devices))
    models = ", ".join(repr(m) for m in dict.fromkeys(d.model for d in cluster.devices) if m)
    return f"devices {names}; kinds {kinds}" + (f"; models {models}" if models else "")


def _check_finite(out: np.ndarray, graph: OpGraph, cluster: Cluster) -> None:
    bad = np.argwhere(~(np.isfinite(out) & (out >= 0)))
    if len(bad):
        i, d = bad[0]
        dev = cluster.devices[d]
        raise ClusterError(
            f"cluster {cluster.name!r}: op {graph.ops[i].name!r} of workload {graph.name!r} on device {dev.name!r} "
            f"takes {out[i, d]} s, not a finite non-negative time (peak_flops {dev.peak_flops!r}, "
            f"compute_efficiency {dev.compute_efficiency!r}, mem_bandwidth {dev.mem_bandwidth!r}, "
            f"memory_efficiency {dev.memory_efficiency!r})"
        )


def cost_matrix(graph: OpGraph, cluster: Cluster, profiles: Iterable[Profile] = ()) -> np.ndarray:
    """Time in seconds of every op on every device, float64 [num_ops, num_devices] (read-only)."""
    a = graph.arrays
    out = np.empty((graph.num_ops, cluster.num_devices), dtype=np.float64)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):  # checked at the end
        for d, dev in enumerate(cluster.devices):
            out[:, d] = roofline_time_s(a.flops, a.bytes_accessed.astype(np.float64), dev)
    _apply_profiles(out, graph, cluster, profiles)
    _check_finite(out, graph, cluster)
    out.setflags(write=False)
    return out


def profiled_mask(graph: OpGraph, cluster: Cluster, profiles: Iterable[Profile] = ()) -> np.ndarray:
    """bool [num_ops, num_devices]: True where `cost_matrix` takes the op's time on the device from a profile,
    False where it is the roofline estimate (the profiles are checked as there)."""
    mask = np.zeros((graph.num_ops, cluster.num_devices), dtype=bool)
    for i, d in _apply_profiles(np.zeros(mask.shape), graph, cluster, profiles):
        mask[i, d] = True
    return mask


def profile_coverage(graph: OpGraph, cluster: Cluster, profiles: Iterable[Profile] = ()) -> dict[str, Any]:
    """How many op times the profiles give each device (the rest are roofline estimates): {"ops": n,
    "profiled_ops": {device: k}, "summary": "k of n ops on d0, d1; 0 of n on d2 ..."}."""
    counts = profiled_mask(graph, cluster, profiles).sum(axis=0)
    per = {d.name: int(k) for d, k in zip(cluster.devices, counts, strict=True)}
    groups: dict[int, list[str]] = {}
    for name, k in per.items():
        groups.setdefault(k, []).append(name)
    parts = [f"{k} of {graph.num_ops} ops on {', '.join(names)}" for k, names in groups.items()]
    rest = " (the others are roofline estimates)" if min(per.values()) < graph.num_ops else ""
    summary = f"op times from profiles: {'; '.join(parts)}{rest}"
    return {"ops": graph.num_ops, "profiled_ops": per, "summary": summary}


def _apply_profiles(out: np.ndarray, graph: OpGraph, cluster: Cluster,
                    profiles: Iterable[Profile]) -> dict[tuple[int, int], Profile]:
    """Write the profiles' times into `out` [num_ops, num_devices]; returns (op, device) -> the profile that
    gave that time."""
    timed_by: dict[tuple[int, int], Profile] = {}  # (op, device) -> the profile that gave its time
    for prof in dict.fromkeys(profiles):  # one given twice (a file and its copy) gives its times once
        where = f"{prof.source}: profile" if prof.source else "profile"
        if prof.workload_hash and prof.workload_hash != graph.content_hash:
            raise ProfileError(
                f"{where} for {prof.workload!r} was measured on graph {prof.workload_hash}, "
                f"not on {graph.name!r} ({graph.content_hash})"
            )
        if not prof.workload_hash and prof.workload != graph.name:  # the name is all that ties it to the graph
            raise ProfileError(f"{where} for {prof.workload!r} is not of workload {graph.name!r} (and has no "
                               "workload_hash to say which graph it was measured on)")
        cols = [d for d, dev in enumerate(cluster.devices) if prof.matches(dev)]
        if not cols:
            raise ProfileError(
                f"{where} for {prof.workload!r} applies to {prof.applies_to!r}, which is no device name, kind or "
                f"model of cluster {cluster.name!r} ({_devices_summary(cluster)})"
            )
        for name, t in prof.op_times_s.items():
            i = graph.index.get(name)
            if i is None:
                raise ProfileError(f"{where} for {prof.workload!r}: op {name!r} is not in graph {graph.name!r}")
            if _seconds(t) is None:  # a profile made in code skipped the file reader's check
                raise ProfileError(f"{where} for {prof.workload!r}: op {name!r} takes {short_repr(t)} s, not a finite "
                                   "non-negative time")
            for d in cols:
                other = timed_by.setdefault((i, d), prof)
                if other is not prof:
                    first = f", {other.source}" if other.source else ""
                    raise ProfileError(
                        f"{where} for {prof.workload!r}: op {name!r} on device {cluster.devices[d].name!r} has a "
                        f"time in two profiles (applies to {other.applies_to!r}{first} and to {prof.applies_to!r}): "
                        "give each device's time for an op in one profile only"
                    )
            out[i, cols] = t
    return timed_by
