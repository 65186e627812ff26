"""Placements: one device index per op, validated against a workload and a cluster.

A placement is valid when it has one entry per op, every entry names a device of the cluster, every op is
on a device kind it allows, and all ops of a colocation group share one device. Validation never repairs:
the first problem found is raised as a `PlacementError` that names the op, the device and the rule.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from suite.cluster import Cluster
from suite.errors import PlacementError
from suite.graph import OpGraph
from suite.textfile import load_json, short_repr


def as_placement(placement: Any, graph: OpGraph, cluster: Cluster) -> np.ndarray:
    """Convert ints, device names or an {op name: device} mapping to an int64 array; check the form only.

    Raises `PlacementError` for a wrong length, an unknown device or op name, or a non-integer entry.
    """
    n, d = graph.num_ops, cluster.num_devices
    if isinstance(placement, Mapping):
        missing = [op.name for op in graph.ops if op.name not in placement]
        unknown = [k for k in placement if k not in graph.index]
        if unknown:
            raise PlacementError(f"placement names op {short_repr(unknown[0])}, which is not in workload {graph.name!r}")
        if missing:
            raise PlacementError(
                f"placement has no device for {len(missing)} op(s) of {graph.name!r}, e.g. {missing[0]!r}"
            )
        placement = [placement[op.name] for op in graph.ops]
    if isinstance(placement, np.ndarray) and placement.ndim != 1:
        raise PlacementError(f"placement must be one-dimensional, got shape {placement.shape}")
    if not isinstance(placement, np.ndarray | Sequence) or isinstance(placement, str | bytes | bytearray):
        raise PlacementError(f"placement must be a sequence of device indices or names, got {type(placement).__name__}")
    if len(placement) != n:
        raise PlacementError(f"placement has {len(placement)} entries, but workload {graph.name!r} has {n} ops")
    ints = _integer_array(placement)
    if ints is not None:  # the common case, checked in one pass
        bad = (ints < 0) | (ints >= d)
        if not bad.any():
            return ints
        placement = ints  # the loop below names the first bad entry
    out = np.empty(n, dtype=np.int64)
    for i, v in enumerate(placement):
        if isinstance(v, str):
            if v not in cluster.index:
                raise PlacementError(
                    f"placement[{i}] (op {graph.ops[i].name!r}): unknown device {short_repr(v)}; "
                    f"cluster {cluster.name!r} has {', '.join(cluster.index)}"
                )
            out[i] = cluster.index[v]
            continue
        if isinstance(v, bool) or not isinstance(v, int | np.integer):
            if not (isinstance(v, float | np.floating) and float(v).is_integer()):
                raise PlacementError(f"placement[{i}] (op {graph.ops[i].name!r}): {short_repr(v)} is not a device index")
        if not 0 <= v < d:  # shown as written: a huge one (1e300, 10**400) by its size, not its digits
            raise PlacementError(
                f"placement[{i}] (op {graph.ops[i].name!r}): device "
                f"{short_repr(v.item() if isinstance(v, np.generic) else v)} does not exist; "
                f"cluster {cluster.name!r} has devices 0..{d - 1}"
            )
        out[i] = int(v)
    return out


def _integer_array(placement: Any) -> np.ndarray | None:
    """A new int64 array of the entries if they are all integers (an integer array, or a list of ints and
    no bools), else None."""
    if isinstance(placement, np.ndarray):
        return placement.astype(np.int64) if placement.dtype.kind in "iu" and placement.dtype != np.uint64 else None
    if all(type(v) is int for v in placement):
        try:
            return np.array(placement, dtype=np.int64)
        except OverflowError:
            return None
    return None


@dataclass(frozen=True)
class _Rules:
    allowed: np.ndarray | None  # bool [n, D]: op i may run on device d (None: every op allows every device)
    leader: np.ndarray | None  # int [n]: the first op of each op's colocation group, else the op (None: no groups)
    group_of: dict[int, str]  # op index -> its group's name


@lru_cache(maxsize=32)
def _rules(graph: OpGraph, cluster: Cluster) -> _Rules:
    allowed = None
    kinds = np.array([dev.kind for dev in cluster.devices])
    for i, op in enumerate(graph.ops):
        if op.allowed_kinds:
            if allowed is None:
                allowed = np.ones((graph.num_ops, cluster.num_devices), dtype=bool)
            allowed[i] = np.isin(kinds, op.allowed_kinds)
    leader, group_of = None, {}
    if graph.groups:
        leader = np.arange(graph.num_ops)
        for group, members in graph.groups.items():
            leader[members] = members[0]
            group_of.update(dict.fromkeys(members, group))
    return _Rules(allowed, leader, group_of)


def check_placement(placement: np.ndarray, graph: OpGraph, cluster: Cluster) -> None:
    """Check device-kind constraints, then colocation groups; raise `PlacementError` on the first violation
    (the lowest op index) of the first rule broken."""
    rules = _rules(graph, cluster)
    if rules.allowed is not None:
        ok = rules.allowed[np.arange(graph.num_ops), placement]
        if not ok.all():
            i = int(np.argmin(ok))
            op, dev = graph.ops[i], cluster.devices[placement[i]]
            raise PlacementError(
                f"op {op.name!r} is placed on {dev.name} ({dev.kind}), but allows only {', '.join(op.allowed_kinds)}"
            )
    if rules.leader is not None:
        split = placement != placement[rules.leader]
        if split.any():
            j = int(np.argmax(split))
            first = int(rules.leader[j])
            raise PlacementError(
                f"colocation group {rules.group_of[j]!r} is split: op {graph.ops[first].name!r} on "
                f"{cluster.devices[placement[first]].name}, op {graph.ops[j].name!r} on "
                f"{cluster.devices[placement[j]].name}"
            )


def all_valid(placements: np.ndarray, graph: OpGraph, cluster: Cluster) -> bool:
    """Whether every row of an integer [B, n] array passes `validate`, in a few whole-batch passes. False
    says only that some row fails: `validate` on each row names what is wrong."""
    if placements.ndim != 2 or placements.shape[1] != graph.num_ops or placements.dtype.kind not in "iu":
        return False
    if placements.size == 0:
        return True
    if placements.min() < 0 or placements.max() >= cluster.num_devices:
        return False
    rules = _rules(graph, cluster)
    if rules.allowed is not None and not rules.allowed[np.arange(graph.num_ops), placements].all():
        return False
    return rules.leader is None or bool((placements == placements[:, rules.leader]).all())


def validate(placement: Any, graph: OpGraph, cluster: Cluster) -> np.ndarray:
    """`as_placement` then `check_placement`; returns the read-only int64 placement array."""
    arr = as_placement(placement, graph, cluster)
    check_placement(arr, graph, cluster)
    arr.setflags(write=False)
    return arr


def _units(graph: OpGraph, cluster: Cluster) -> tuple[np.ndarray, np.ndarray]:
    """Each op's unit (its colocation group's first op, or itself) and the devices each unit may use,
    bool [n, D] (rows of ops that lead no unit are unused); PlacementError if a unit may use none."""
    rules = _rules(graph, cluster)
    unit = rules.leader if rules.leader is not None else np.arange(graph.num_ops)
    allowed = np.ones((graph.num_ops, cluster.num_devices), dtype=bool)
    if rules.allowed is not None:  # a unit allows the devices every one of its ops allows
        np.logical_and.at(allowed, unit, rules.allowed)
    if not allowed[unit].any(axis=1).all():
        i = int(np.flatnonzero(~allowed[unit].any(axis=1))[0])
        kinds = ", ".join(sorted({d.kind for d in cluster.devices}))
        raise PlacementError(f"{graph.name!r} cannot be placed on {cluster.name!r}: op {graph.ops[i].name!r} (or its "
                             f"colocation group) allows none of its device kinds ({kinds})")
    return unit, allowed


def check_placeable(graph: OpGraph, cluster: Cluster) -> None:
    """PlacementError unless some placement of `graph` on `cluster` is valid (every op, or colocation group,
    has a device of a kind it allows)."""
    _units(graph, cluster)


def random_placements(graph: OpGraph, cluster: Cluster, rng: np.random.Generator, k: int = 1) -> np.ndarray:
    """k uniformly random valid placements, int64 [k, n]: every colocation group (and every op outside one)
    gets one device drawn among those of a kind all its ops allow. For baselines and examples."""
    unit, allowed = _units(graph, cluster)
    # a uniform draw among the allowed devices of each unit: the argmax of random keys over allowed columns
    keys = np.where(allowed[None, :, :], rng.random((k, graph.num_ops, cluster.num_devices)), -1.0)
    return keys.argmax(axis=2)[:, unit].astype(np.int64)


def placement_hash(placement: np.ndarray) -> str:
    return "sha256:" + hashlib.sha256(np.ascontiguousarray(placement, dtype=np.int64).tobytes()).hexdigest()[:16]


def save_placement(placement: np.ndarray, graph: OpGraph, cluster: Cluster, path: str | Path) -> Path:
    """Write {op name: device name} as JSON, with the workload and cluster it belongs to."""
    path = Path(path)
    data = {
        "format": "placebench.placement",
        "schema_version": 1,
        "workload": graph.name,
        "workload_hash": graph.content_hash,
        "cluster": cluster.name,
        "placement": {op.name: cluster.devices[int(d)].name for op, d in zip(graph.ops, placement, strict=True)},
    }
    from suite.store import atomic_write_text

    return atomic_write_text(path, json.dumps(data, indent=1))


_PLACEMENT_KEYS = frozenset({"format", "schema_version", "workload", "workload_hash", "cluster", "placement"})


def load_placement(path: str | Path, graph: OpGraph, cluster: Cluster) -> np.ndarray:
    """Read a placement file (an object with a 'placement' field: a list or an {op: device} object)."""
    path = Path(path)
    data = load_json(path, PlacementError, "placement")
    if isinstance(data, dict) and "placement" not in data:
        raise PlacementError(f"{path}: no field 'placement'")
    raw = data["placement"] if isinstance(data, dict) else data
    if raw is None:
        what = "field 'placement'" if isinstance(data, dict) else "the file"
        raise PlacementError(f"{path}: {what} is null, not a list of devices or an object of op name -> device")
    if isinstance(data, dict):  # a saved placement names what it belongs to: it must be this workload and cluster
        unknown = sorted(set(data) - _PLACEMENT_KEYS)
        if unknown:
            raise PlacementError(f"{path}: unknown field(s) {short_repr(unknown)}; known: {', '.join(sorted(_PLACEMENT_KEYS))}")
        version = data.get("schema_version", 1)
        if type(version) is not int or version != 1:
            raise PlacementError(f"{path}: schema_version {short_repr(version)} is not supported (this placebench reads 1)")
        expected = {"format": "placebench.placement", "workload": graph.name, "workload_hash": graph.content_hash,
                    "cluster": cluster.name}
        for key, want in expected.items():
            if key in data and data[key] != want:
                raise PlacementError(f"{path}: {key} is {short_repr(data[key])}, but this is {want!r}")
    try:
        return validate(raw, graph, cluster)
    except PlacementError as exc:
        raise PlacementError(f"{path}: {exc}") from None
