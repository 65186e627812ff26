"""Clusters: devices and the links between them, loaded from TOML files.

A cluster file (see `suite/clusters/*.toml`) lists devices and links; every number should carry its
source in the `source` table beside it. A link with more than two devices in `between` connects every
pair of them (a switch such as NVSwitch or a PCIe root complex).

Communication between two devices follows the route with the fewest links: its latency is the sum of the
links' latencies and its bandwidth the smallest of theirs. The simulator treats each ordered device pair as
one channel that carries one transfer at a time. A link's `sharing` says what else a transfer waits for:
"pairs" (the default) only the hops that routes of several links share: a link of several devices is a
crossbar in which transfers between different pairs never contend, but a transfer routed over a hop (u to v)
of it holds that hop, as does every other transfer over it (u's own to v included), so that a link carries
one transfer at a time per direction; "ports" each device's port on the link, one per direction, so that a
transfer also holds the sending device's outgoing port and the receiving device's incoming port on every
such link of its route (a PCIe switch or NVSwitch whose per-device bandwidth is shared by all of that
device's transfers).
"""

from __future__ import annotations

import math
import numbers
import unicodedata
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from suite.errors import ClusterError
from suite.graph import DEVICE_KINDS
from suite.textfile import MAX_SHOWN, as_float, load_toml, short_repr

SCHEMA_VERSION = 1
PRESET_DIR = Path(__file__).parent / "clusters"
MAX_MEMORY_BYTES = 2**62  # fits int64 with room for the simulator's sums


@dataclass(frozen=True)
class Device:
    """One device: its kind, peak FLOP/s and memory bandwidth (with the fractions of them real kernels reach),
    memory capacity and per-op overhead; `source` says where each number comes from."""

    name: str
    kind: str  # "cpu" or "gpu"
    peak_flops: float  # FLOP/s at the precision the workloads use (fp32)
    mem_bandwidth: float  # bytes/s
    memory_bytes: int  # capacity available to the workload
    op_overhead_s: float  # fixed cost per op (kernel launch, framework dispatch)
    compute_efficiency: float = 1.0  # fraction of peak FLOP/s that real kernels reach
    memory_efficiency: float = 1.0  # fraction of peak bandwidth that real kernels reach
    model: str = ""  # e.g. "NVIDIA Tesla K80 (one GK210)"
    source: dict[str, str] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class Link:
    """A link between the devices named in `between` (more than two: every pair of them, as a switch), with
    its bandwidth per direction, latency and `sharing` (see the module docstring)."""

    between: tuple[str, ...]
    bandwidth: float  # bytes/s per direction
    latency_s: float
    name: str = ""
    sharing: str = "pairs"  # "pairs" (a crossbar) or "ports" (see the module docstring)
    source: dict[str, str] = field(default_factory=dict, compare=False)


@dataclass(frozen=True, eq=False)
class Cluster:
    """Devices and the links between them, validated when made (`suite.load_cluster` loads a preset or file)."""

    name: str
    devices: tuple[Device, ...]
    links: tuple[Link, ...]
    description: str = ""
    source: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _validate(self, where=f"cluster {short_repr(self.name)}")

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @cached_property
    def index(self) -> dict[str, int]:
        return {d.name: i for i, d in enumerate(self.devices)}

    def device_indices(self, kind: str) -> list[int]:
        return [i for i, d in enumerate(self.devices) if d.kind == kind]

    @property
    def routes(self) -> tuple[np.ndarray, np.ndarray]:
        """(latency_s [D, D], bandwidth [D, D]) of the fewest-link route between every pair.

        The diagonal has latency 0 and infinite bandwidth (no transfer within a device).
        """
        lat, bw, _ = self._route_table
        return lat, bw

    def route(self, src: int, dst: int) -> list[tuple[int, int, int]]:
        """The hops of the route from device src to device dst: (from device, to device, link index)."""
        return self._route_table[2][src][dst]

    @cached_property
    def _route_table(self) -> tuple[np.ndarray, np.ndarray, list[list[list[tuple[int, int, int]]]]]:
        n = self.num_devices
        adj: dict[int, list[tuple[int, int]]] = {i: [] for i in range(n)}  # device -> (neighbour, link)
        for j, link in enumerate(self.links):
            ids = [self.index[d] for d in link.between]
            for a in ids:
                adj[a] += [(b, j) for b in ids if b != a]
        for edges in adj.values():
            edges.sort()
        lat = np.zeros((n, n))
        bw = np.full((n, n), np.inf)
        hops: list[list[list[tuple[int, int, int]]]] = [[[] for _ in range(n)] for _ in range(n)]
        for s in range(n):
            # a fewest-link route to every device; among those, the widest (highest bottleneck bandwidth), then
            # the one with the least latency. Fewest-link routes are the paths of the BFS layers' DAG; a
            # route's width is decided by all its links, so the least latency to a target is found among the
            # DAG's links at least as wide as that target's widest route
            dist = {s: 0}
            dag: list[tuple[int, int, int]] = []  # its links (v, w, link), v in BFS order (each layer sorted)
            layer = [s]
            while layer:
                nxt = []
                for v in layer:
                    step = dist[v] + 1
                    for w, j in adj[v]:
                        if w not in dist:
                            dist[w] = step
                            nxt.append(w)
                        if dist[w] == step:
                            dag.append((v, w, j))
                layer = sorted(nxt)
            width = {s: math.inf}
            for v, w, j in dag:  # in BFS order: every predecessor of w comes before w
                width[w] = max(width.get(w, 0.0), min(width[v], self.links[j].bandwidth))
            for t in range(n):
                if t not in dist:
                    raise ClusterError(
                        f"cluster {self.name!r}: no link route from {self.devices[s].name!r} to {self.devices[t].name!r}"
                    )
            for floor in set(width.values()):  # one pass per width a route must keep (few: the link classes)
                least = {s: 0.0}  # device -> least latency of a route to it on links at least `floor` wide
                back: dict[int, tuple[int, int]] = {}  # device -> (previous device, link) on that route
                for v, w, j in dag:
                    link = self.links[j]
                    if v in least and link.bandwidth >= floor:
                        cand = least[v] + link.latency_s
                        if w not in least or cand < least[w]:  # ties: the first, in BFS order
                            least[w], back[w] = cand, (v, j)
                for t in (t for t, wt in width.items() if wt == floor):
                    lat[s, t], bw[s, t] = least[t], floor
                    v = t
                    while v != s:
                        u, j = back[v]
                        hops[s][t].insert(0, (u, v, j))
                        v = u
        lat.setflags(write=False)
        bw.setflags(write=False)
        return lat, bw, hops

    @cached_property
    def ports(self) -> tuple[np.ndarray, np.ndarray, int] | None:
        """The ports each ordered pair's transfers hold besides their channel, or None where none holds any:
        (ptr int64 [D * D + 1], port int64 [...], number of ports), the ports of pair (a, b) being
        port[ptr[a * D + b]:ptr[a * D + b + 1]]. Each device on a "ports" link has two: its outgoing one (even
        id) and its incoming one (the next id). After them, one per hop (u to v on a "pairs" link) that a route
        of several links takes, held by every transfer whose route takes it."""
        n = self.num_devices
        shared = sorted({(j, u, v) for a in range(n) for b in range(n) if len(self.route(a, b)) > 1
                         for u, v, j in self.route(a, b) if self.links[j].sharing == "pairs"})
        if not shared and not any(lk.sharing == "ports" for lk in self.links):
            return None
        first: dict[tuple[int, int], int] = {}  # (link, device) -> its outgoing port's id
        for j, lk in enumerate(self.links):
            if lk.sharing == "ports":
                for name in lk.between:
                    first[(j, self.index[name])] = 2 * len(first)
        hop = {h: 2 * len(first) + k for k, h in enumerate(shared)}  # (link, from, to) -> its port's id
        ptr = np.zeros(n * n + 1, dtype=np.int64)
        held: list[int] = []
        for a in range(n):
            for b in range(n):
                if a != b:
                    for u, v, j in self.route(a, b):
                        if (j, u) in first:
                            held += [first[(j, u)], first[(j, v)] + 1]
                        if (j, u, v) in hop:
                            held.append(hop[(j, u, v)])
                ptr[a * n + b + 1] = len(held)
        port = np.array(held, dtype=np.int64)
        for x in (ptr, port):
            x.setflags(write=False)
        return ptr, port, 2 * len(first) + len(hop)

    def transfer_time_s(self, src: int, dst: int, nbytes: float) -> float:
        if src == dst:
            return 0.0
        lat, bw = self.routes
        return float(lat[src, dst] + nbytes / bw[src, dst])

    def fastest(self, kind: str) -> int:
        """Index of the device of this kind with the highest effective peak FLOP/s (first on ties)."""
        ids = self.device_indices(kind)
        if not ids:
            raise ClusterError(f"cluster {self.name!r} has no device of kind {kind!r}")
        return max(ids, key=lambda i: (self.devices[i].peak_flops * self.devices[i].compute_efficiency, -i))

    @cached_property
    def content_hash(self) -> str:
        import hashlib
        import json

        def number(k: str, v: Any) -> Any:
            """-0.0 hashes as 0.0, and an integer of memory (a numpy one too) as a plain int; other numpy
            numbers as the Python ones. An integer written for a float field (`peak_flops = 1`) still
            hashes apart from 1.0, as it always has."""
            if k == "memory_bytes":
                return int(v)
            if isinstance(v, numbers.Integral) and not isinstance(v, bool):
                return int(v)
            return float(v) + 0.0 if isinstance(v, numbers.Real) and not isinstance(v, bool) else v

        body = {
            "name": self.name,
            "devices": [{k: number(k, v) for k, v in d.__dict__.items() if k != "source"} for d in self.devices],
            # a default `sharing` is left out, so that the hashes of clusters from before it stay as they were
            "links": [{k: number(k, v) for k, v in lk.__dict__.items()
                       if k != "source" and (k, v) != ("sharing", "pairs")} for lk in self.links],
        }
        return "sha256:" + hashlib.sha256(json.dumps(body, sort_keys=True, default=list).encode()).hexdigest()

    def __repr__(self) -> str:
        return f"Cluster({self.name!r}, devices={[d.name for d in self.devices]})"


def _positive(where: str, key: str, value: Any, *, allow_zero: bool = False, at_most_one: bool = False) -> None:
    x = as_float(value)
    if math.isnan(x):
        raise ClusterError(f"{where}.{key}: expected a number, got {short_repr(value)}")
    if x < 0 or (x == 0 and not allow_zero) or math.isinf(x):
        need = "non-negative" if allow_zero else "positive"
        raise ClusterError(f"{where}.{key}: {short_repr(value)} must be a finite {need} number")
    if at_most_one and x > 1:
        raise ClusterError(f"{where}.{key}: {short_repr(value)} must be at most 1")


def _memory_bytes(where: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ClusterError(f"{where}.memory_bytes: expected a whole number of bytes (an integer), got {short_repr(value)}")
    if not 1 <= value <= MAX_MEMORY_BYTES:
        raise ClusterError(f"{where}.memory_bytes: {short_repr(value)} must be between 1 and 2**62")


def _string(where: str, value: Any) -> None:
    if not isinstance(value, str):
        raise ClusterError(f"{where}: expected a string, got {short_repr(value)}")


def _sources(where: str, value: Any, fields: tuple[str, ...] = (), what: str = "") -> None:
    """A `source` table: field name -> where its number comes from. With `fields`, each key must be one of
    them (a misspelt key would leave its number without a source)."""
    if not isinstance(value, dict):
        raise ClusterError(f"{where}: must be a table of field name -> source text, got {short_repr(value)}")
    for key, text in value.items():
        at = f"{where}.{key}" if key.isprintable() and len(key) <= MAX_SHOWN else f"{where}[{short_repr(key)}]"
        if fields and key not in fields:
            raise ClusterError(f"{at}: names no field of a {what} (a misspelt field?); fields: {', '.join(fields)}")
        _string(at, text)


def _control_free(where: str, name: str) -> None:
    """A name holds no control character (a newline, a tab, an escape): messages and tables show names as they
    are, on one line, and such a name is never meant."""
    bad = next((ch for ch in name if unicodedata.category(ch) == "Cc"), None)
    if bad is not None:
        raise ClusterError(f"{where}: {short_repr(name)} contains the control character {bad!r}; a name is shown "
                           f"on one line")


def _validate(c: Cluster, where: str) -> None:
    if not isinstance(c.name, str) or not c.name:
        raise ClusterError(f"cluster name: expected a non-empty string, got {short_repr(c.name)}")
    _control_free("cluster name", c.name)
    _string(f"{where}: description", c.description)
    _sources(f"{where}: source", c.source)
    if not c.devices:
        raise ClusterError(f"{where}: no devices")
    names: set[str] = set()
    for i, d in enumerate(c.devices):
        w = f"{where}: devices[{i}]"
        if not isinstance(d.name, str) or not d.name:
            raise ClusterError(f"{w}.name: expected a non-empty string, got {short_repr(d.name)}")
        _control_free(f"{w}.name", d.name)
        if d.name in names:
            raise ClusterError(f"{w}.name: duplicate device name {short_repr(d.name)}")
        names.add(d.name)
        wd = f"{w} {short_repr(d.name)}"  # a long name cut, as in every message
        if d.kind not in DEVICE_KINDS:
            raise ClusterError(f"{wd}.kind: {short_repr(d.kind)} is not one of {', '.join(DEVICE_KINDS)}")
        _positive(wd, "peak_flops", d.peak_flops)
        _positive(wd, "mem_bandwidth", d.mem_bandwidth)
        _memory_bytes(wd, d.memory_bytes)
        _positive(wd, "op_overhead_s", d.op_overhead_s, allow_zero=True)
        _positive(wd, "compute_efficiency", d.compute_efficiency, at_most_one=True)
        _positive(wd, "memory_efficiency", d.memory_efficiency, at_most_one=True)
        _string(f"{wd}.model", d.model)
        _sources(f"{wd}.source", d.source, _SOURCED_DEVICE_FIELDS, "device")
    for j, lk in enumerate(c.links):
        w = f"{where}: links[{j}]"
        _string(f"{w}.name", lk.name)
        _sources(f"{w}.source", lk.source, _SOURCED_LINK_FIELDS, "link")
        if not isinstance(lk.between, tuple | list):
            raise ClusterError(f"{w}.between: expected a list of device names, got {short_repr(lk.between)}")
        if len(lk.between) < 2:
            raise ClusterError(f"{w}.between: a link joins at least two devices, got {short_repr(list(lk.between))}")
        for k, name in enumerate(lk.between):
            if not isinstance(name, str):
                raise ClusterError(f"{w}.between: expected device names, got {short_repr(name)}")
            if name not in names:
                raise ClusterError(f"{w}.between: unknown device {short_repr(name)}")
            if name in lk.between[:k]:
                raise ClusterError(f"{w}.between: device {name!r} is listed twice")
        _positive(w, "bandwidth", lk.bandwidth)
        _positive(w, "latency_s", lk.latency_s, allow_zero=True)
        if lk.sharing not in LINK_SHARING:
            raise ClusterError(f"{w}.sharing: {short_repr(lk.sharing)} is not one of {', '.join(LINK_SHARING)}")
    if len(c.devices) > 1:
        c.routes  # noqa: B018 - raises on a disconnected cluster


DEVICE_NUMBERS = ("peak_flops", "mem_bandwidth", "memory_bytes", "op_overhead_s", "compute_efficiency",
                  "memory_efficiency")
LINK_NUMBERS = ("bandwidth", "latency_s")
LINK_SHARING = ("pairs", "ports")


def unsourced(c: Cluster) -> list[str]:
    """The numbers of `c` without a `source` line beside them, as "device.field" or "links[j].field"
    (an efficiency left out of the file is its default 1.0, and needs a source too)."""
    out = [f"{d.name}.{k}" for d in c.devices for k in DEVICE_NUMBERS if not d.source.get(k)]
    return out + [f"links[{j}].{k}" for j, lk in enumerate(c.links) for k in LINK_NUMBERS if not lk.source.get(k)]


_DEVICE_KEYS = {f for f in Device.__dataclass_fields__}
_LINK_KEYS = {f for f in Link.__dataclass_fields__}
_SOURCED_DEVICE_FIELDS = tuple(f for f in Device.__dataclass_fields__ if f != "source")
_SOURCED_LINK_FIELDS = tuple(f for f in Link.__dataclass_fields__ if f != "source")
_TOP_KEYS = {"schema_version", "name", "description", "source", "devices", "links"}


def _tables(where: str, key: str, raw: Any) -> list[dict[str, Any]]:
    """The array of tables `[[key]]`, each entry checked to be a table."""
    if not isinstance(raw, list):
        got = f"a single table ([{key}])" if isinstance(raw, dict) else short_repr(raw)
        raise ClusterError(f"{where}: field {key!r} must be an array of tables ([[{key}]]), got {got}")
    for i, entry in enumerate(raw):
        if not isinstance(entry, dict):
            raise ClusterError(f"{where}: {key}[{i}] must be a table ([[{key}]]), got {short_repr(entry)}")
    return raw


def from_dict(data: dict[str, Any], *, source: str = "<dict>") -> Cluster:
    where = source
    if not isinstance(data, dict):
        raise ClusterError(f"{where}: expected a table")
    unknown = set(data) - _TOP_KEYS
    if unknown:
        raise ClusterError(f"{where}: unknown top-level field(s) {short_repr(sorted(unknown))}; expected {sorted(_TOP_KEYS)}")
    version = data.get("schema_version", SCHEMA_VERSION)
    if type(version) is not int or version != SCHEMA_VERSION:  # not true, not 1.0 (as graph files)
        raise ClusterError(f"{where}: schema_version {short_repr(version)} is not supported (expected {SCHEMA_VERSION})")
    name = data.get("name")
    if name is not None and not isinstance(name, str):  # a number, a TOML date or table
        raise ClusterError(f"{where}: field 'name' must be a string, got {short_repr(name)}")
    if not name:
        raise ClusterError(f"{where}: field 'name' is missing or empty")
    devices = []
    raw_devices = _tables(where, "devices", data.get("devices", []))
    if not raw_devices:
        raise ClusterError(f"{where}: field 'devices' must be a non-empty array of tables ([[devices]])")
    for i, raw in enumerate(raw_devices):
        unknown = set(raw) - _DEVICE_KEYS
        if unknown:
            raise ClusterError(f"{where}: devices[{i}] has unknown field(s) {short_repr(sorted(unknown))}")
        for key in ("name", "kind", "peak_flops", "mem_bandwidth", "memory_bytes", "op_overhead_s"):
            if key not in raw:
                raise ClusterError(f"{where}: devices[{i}] has no field {key!r}")
        devices.append(Device(**raw))
    links = []
    for j, raw in enumerate(_tables(where, "links", data.get("links", []))):
        unknown = set(raw) - _LINK_KEYS
        if unknown:
            raise ClusterError(f"{where}: links[{j}] has unknown field(s) {short_repr(sorted(unknown))}")
        for key in ("between", "bandwidth", "latency_s"):
            if key not in raw:
                raise ClusterError(f"{where}: links[{j}] has no field {key!r}")
        if not isinstance(raw["between"], list):
            raise ClusterError(f"{where}: links[{j}].between must be an array of device names")
        links.append(Link(**{**raw, "between": tuple(raw["between"])}))
    try:
        return Cluster(
            name=name,
            devices=tuple(devices),
            links=tuple(links),
            description=data.get("description", ""),
            source=data.get("source", {}),
        )
    except ClusterError as exc:
        raise ClusterError(f"{where}: {exc}") from None


def load(path: str | Path) -> Cluster:
    path = Path(path)
    data = load_toml(path, ClusterError, "cluster")
    return from_dict(data, source=str(path))


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.toml"))
