"""The graph IR: an immutable DAG of operations with costs, and its validation and statistics.

An `OpGraph` always stores its ops in a topological order (the canonical order: Kahn's algorithm taking
the smallest original index first). Op indices are positions in that order; placements, cost matrices and
the simulator's priority among ready ops all use them.

Every op produces one output tensor of `output_bytes`; an edge `src -> dst` says that `dst` reads `src`'s
output and carries `bytes` (normally equal to the producer's `output_bytes`).
"""

from __future__ import annotations

import heapq
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from suite.errors import GraphError
from suite.textfile import MAX_SHOWN, short_repr

PHASES = ("forward", "backward", "update")
DEVICE_KINDS = ("cpu", "gpu")
# Limit on every byte count and on each byte field's total over a graph: every sum formed from them
# (bytes_read + bytes_written, per-device memory, totals over ops and edges) stays far inside int64.
MAX_BYTES = 2**53
_BYTE_FIELDS = ("bytes_read", "bytes_written", "output_bytes", "param_bytes")
MAX_METADATA_DEPTH = 100  # lists and objects in one metadata value


@dataclass(frozen=True)
class Op:
    """One operation. FLOPs are floating-point operations (a multiply-add counts 2)."""

    name: str
    kind: str
    flops: float = 0.0
    bytes_read: int = 0
    bytes_written: int = 0
    output_bytes: int = 0
    param_bytes: int = 0  # resident for the whole step on the op's device (weights, optimizer state)
    phase: str = "forward"
    group: str | None = None  # colocation group: all ops of a group go to one device
    allowed_kinds: tuple[str, ...] = ()  # empty: any device kind
    output_shape: tuple[int, ...] = ()
    scope: str = ""  # dotted module path in the model ("encoder.layers.1"), for expert rules and grouping

    @property
    def bytes_accessed(self) -> int:
        return self.bytes_read + self.bytes_written


@dataclass(frozen=True)
class Edge:
    """A data dependency between ops, by their indices in the graph's order: `bytes` go from `src` to `dst`
    (by default the producer's `output_bytes`)."""

    src: int
    dst: int
    bytes: int


def _shown(value: Any) -> str:
    """`repr`, abbreviated for huge integers (whose repr Python may even refuse) and, as `short_repr` does, for
    long strings, lists and objects."""
    if isinstance(value, int):
        return f"a {value.bit_length()}-bit integer" if value.bit_length() > 256 else repr(value)
    return short_repr(value)


def _plain_number(value: Any) -> Any:
    """A numpy integer or float as the Python number of the same value (so it validates and hashes like
    one); anything else as it is."""
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    return value


def _check_number(where: str, field_name: str, value: Any, *, integer: bool) -> float | int:
    value = _plain_number(value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise GraphError(f"{where}.{field_name}: expected a number, got {_shown(value)}")
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        raise GraphError(f"{where}.{field_name}: {value!r} is not a finite number")
    if value < 0:
        raise GraphError(f"{where}.{field_name}: {_shown(value)} is negative")
    if integer:
        if isinstance(value, float) and not value.is_integer():
            raise GraphError(f"{where}.{field_name}: {value!r} is not a whole number of bytes")
        if value > MAX_BYTES:
            raise GraphError(f"{where}.{field_name}: {_shown(value)} is above the limit of 2**53 bytes")
        return int(value)
    try:
        return float(value) + 0.0  # + 0.0: -0.0 is 0.0, so it hashes (and is written) as 0.0
    except OverflowError:
        raise GraphError(f"{where}.{field_name}: {_shown(value)} is too large for a float") from None


def _check_totals(name: str, ops: Sequence[Op], edge_bytes: Iterable[int]) -> None:
    """Each byte field's total over the graph is at most MAX_BYTES and the total FLOPs are finite."""
    totals = {f"{f} over all ops": sum(getattr(op, f) for op in ops) for f in _BYTE_FIELDS}
    totals["bytes over all edges"] = sum(edge_bytes)
    for what, total in totals.items():
        if total > MAX_BYTES:
            raise GraphError(f"graph {name!r}: {what} total {total}, above the limit of 2**53 bytes")
    if not math.isfinite(sum(op.flops for op in ops)):
        raise GraphError(f"graph {name!r}: flops over all ops total more than a float can hold")


def _check_keys(where: str, value: Any) -> None:
    """Every object key in `value` (at any depth) is a string: JSON would turn another key into a string
    without a word (1 -> "1"), or fail on sorting mixed keys."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise GraphError(f"{where}: key {key!r} is not a string")
            _check_keys(f"{where}[{key!r}]", item)
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _check_keys(f"{where}[{i}]", item)


def _nested_deeper_than(value: Any, limit: int) -> bool:
    """Whether lists and mappings in `value` nest more than `limit` levels (True for a circular one);
    iterative, so it never hits Python's recursion limit."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, Mapping) else item if isinstance(item, list | tuple) else None
        if children is not None:
            if depth == limit:
                return True
            stack.extend((child, depth + 1) for child in children)
    return False


def _check_metadata(metadata: Mapping[str, Any]) -> None:
    """Metadata is hashed as JSON, so every value must be valid JSON (no NaN or Infinity, string keys) and nest
    at most MAX_METADATA_DEPTH levels (deeper or circular, it would exhaust the recursion limit)."""
    for key, value in metadata.items():
        if _nested_deeper_than(value, MAX_METADATA_DEPTH):
            raise GraphError(f"metadata[{key!r}]: nested more than {MAX_METADATA_DEPTH} levels deep")
    _check_keys("metadata", metadata)
    for key, value in metadata.items():
        try:
            json.dumps(value, sort_keys=True, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise GraphError(f"metadata[{key!r}]: not valid JSON ({exc})") from None


def _checked_op(op: Op, index: int) -> Op:
    if not isinstance(op, Op):
        raise GraphError(f"ops[{index}]: expected an Op, got {type(op).__name__}")
    where = f"ops[{index}] {_shown(op.name)}"
    if not isinstance(op.name, str) or not op.name:
        raise GraphError(f"ops[{index}].name: expected a non-empty string, got {_shown(op.name)}")
    if not isinstance(op.kind, str) or not op.kind:
        raise GraphError(f"{where}.kind: expected a non-empty string, got {_shown(op.kind)}")
    if op.phase not in PHASES:
        raise GraphError(f"{where}.phase: {_shown(op.phase)} is not one of {', '.join(PHASES)}")
    if not isinstance(op.allowed_kinds, tuple | list):
        raise GraphError(f"{where}.allowed_kinds: expected a tuple of device kinds, got {_shown(op.allowed_kinds)}")
    for k, kind in enumerate(op.allowed_kinds):
        if kind not in DEVICE_KINDS:
            raise GraphError(f"{where}.allowed_kinds: {_shown(kind)} is not one of {', '.join(DEVICE_KINDS)}")
        if kind in op.allowed_kinds[:k]:
            raise GraphError(f"{where}.allowed_kinds: {kind!r} is listed twice")
    if op.group is not None and (not isinstance(op.group, str) or not op.group):
        raise GraphError(f"{where}.group: expected a non-empty string or null, got {_shown(op.group)}")
    if not isinstance(op.output_shape, tuple | list):
        raise GraphError(f"{where}.output_shape: {_shown(op.output_shape)} is not a tuple of sizes")
    shape = tuple(_plain_number(d) for d in op.output_shape)
    for d in shape:
        if isinstance(d, bool) or not isinstance(d, int) or d < 0:
            raise GraphError(f"{where}.output_shape: {_shown(op.output_shape)} is not a tuple of sizes")
        if d > MAX_BYTES:  # no tensor has more elements than bytes; numpy (RL features) needs int64 sizes
            raise GraphError(f"{where}.output_shape: size {_shown(d)} is above the limit of 2**53")
    return Op(
        name=op.name,
        kind=op.kind,
        flops=_check_number(where, "flops", op.flops, integer=False),
        bytes_read=_check_number(where, "bytes_read", op.bytes_read, integer=True),
        bytes_written=_check_number(where, "bytes_written", op.bytes_written, integer=True),
        output_bytes=_check_number(where, "output_bytes", op.output_bytes, integer=True),
        param_bytes=_check_number(where, "param_bytes", op.param_bytes, integer=True),
        phase=op.phase,
        group=op.group,
        allowed_kinds=tuple(op.allowed_kinds),
        output_shape=shape,
        scope=op.scope if isinstance(op.scope, str) else _bad_scope(where, op.scope),
    )


def _bad_scope(where: str, value: Any) -> str:
    raise GraphError(f"{where}.scope: expected a string, got {_shown(value)}")


def _cycle_text(names: list[str]) -> str:
    """A cycle's op names on one line, "a -> b -> a": a name with a character that does not print (a newline)
    escaped, a long one cut as `short_repr` cuts it, and a cycle of more than 10 ops by its first and last 4 and
    its length."""
    shown = [n if n.isprintable() and len(n) <= MAX_SHOWN else short_repr(n) for n in names]
    if len(shown) > 10:
        return f"{' -> '.join(shown[:4])} -> ... -> {' -> '.join(shown[-4:] + shown[:1])} (a cycle of {len(shown)} ops)"
    return " -> ".join(shown + shown[:1])


def find_cycle(n: int, edges: Sequence[tuple[int, int]]) -> list[int] | None:
    """Return the op indices of one directed cycle (in order), or None if the graph is acyclic."""
    succ: list[list[int]] = [[] for _ in range(n)]
    for s, d in edges:
        succ[s].append(d)
    color = [0] * n  # 0 new, 1 on stack, 2 done
    parent = [-1] * n
    for root in range(n):
        if color[root]:
            continue
        stack = [(root, 0)]
        color[root] = 1
        while stack:
            v, i = stack[-1]
            if i < len(succ[v]):
                stack[-1] = (v, i + 1)
                w = succ[v][i]
                if color[w] == 0:
                    color[w] = 1
                    parent[w] = v
                    stack.append((w, 0))
                elif color[w] == 1:
                    cycle = [v]
                    while cycle[-1] != w:
                        cycle.append(parent[cycle[-1]])
                    return cycle[::-1]
            else:
                color[v] = 2
                stack.pop()
    return None


def canonical_order(n: int, edges: Sequence[tuple[int, int]]) -> list[int]:
    """Kahn's algorithm taking the smallest index first; assumes the graph is acyclic."""
    indeg = [0] * n
    succ: list[list[int]] = [[] for _ in range(n)]
    for s, d in edges:
        succ[s].append(d)
        indeg[d] += 1
    heap = [i for i in range(n) if indeg[i] == 0]
    heapq.heapify(heap)
    order = []
    while heap:
        v = heapq.heappop(heap)
        order.append(v)
        for w in succ[v]:
            indeg[w] -= 1
            if indeg[w] == 0:
                heapq.heappush(heap, w)
    return order


@dataclass(frozen=True)
class GraphStats:
    """Placement-independent statistics. The two critical-path numbers are each the longest over all paths
    (every source to every sink, an isolated op being a path of one), counting ops or op FLOPs only: edge
    bytes (communication) count for neither, and the two may come from different paths."""

    num_ops: int
    num_edges: int
    average_degree: float  # 2|E| / |V|
    total_flops: float
    param_bytes: int
    critical_path_ops: int  # ops on the longest path
    critical_path_flops: float  # FLOPs on the path with the most FLOPs
    ops_by_phase: dict[str, int]

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True, eq=False)
class OpGraph:
    """An immutable, validated DAG of ops in canonical topological order.

    Build one with `OpGraph.build(name, ops, edges)`, which validates and orders; the plain constructor is
    for internal use on already-canonical data.
    """

    name: str
    ops: tuple[Op, ...]
    edges: tuple[Edge, ...]
    metadata: Mapping[str, Any] = field(default_factory=dict)

    # -- construction --------------------------------------------------------------------------------
    @classmethod
    def build(
        cls,
        name: str,
        ops: Iterable[Op],
        edges: Iterable[tuple[str, str, int] | tuple[str, str]],
        metadata: Mapping[str, Any] | None = None,
    ) -> OpGraph:
        """Validate ops and named edges `(src, dst[, bytes])` and return the canonical graph.

        An edge without bytes carries the producer's `output_bytes`. Duplicate edges are an error.
        """
        if not isinstance(name, str) or not name:
            raise GraphError(f"graph name: expected a non-empty string, got {_shown(name)}")
        if isinstance(ops, AbstractSet):  # no order: the op indices would change with the hash seed
            raise GraphError(f"graph {name!r}: ops: expected a sequence of Op, got a set")
        if not isinstance(ops, Iterable) or isinstance(ops, str | Mapping):
            raise GraphError(f"graph {name!r}: ops: expected a sequence of Op, got {_shown(ops)}")
        if not isinstance(edges, Iterable) or isinstance(edges, str | Mapping):
            raise GraphError(f"graph {name!r}: edges: expected a sequence of edges, got {_shown(edges)}")
        ops = [_checked_op(op, i) for i, op in enumerate(ops)]
        if not ops:
            raise GraphError(f"graph {name!r} has no ops (a workload needs at least one op to place)")
        if metadata is not None and not isinstance(metadata, Mapping):
            raise GraphError(f"graph {name!r}: metadata: expected an object (a mapping), got {_shown(metadata)}")
        metadata = dict(metadata or {})
        _check_metadata(metadata)
        index: dict[str, int] = {}
        for i, op in enumerate(ops):
            if op.name in index:
                raise GraphError(f"ops[{i}].name: duplicate op name {op.name!r} (also ops[{index[op.name]}])")
            index[op.name] = i
        raw: list[tuple[int, int, int]] = []
        seen: set[tuple[int, int]] = set()
        for j, e in enumerate(edges):
            if not isinstance(e, tuple | list) or len(e) not in (2, 3):
                raise GraphError(f"edges[{j}]: expected (src, dst[, bytes]), got {_shown(e)}")
            src, dst = e[0], e[1]
            for end, label in ((src, "src"), (dst, "dst")):
                if not isinstance(end, str):
                    raise GraphError(f"edges[{j}].{label}: expected an op name (a string), got {_shown(end)}")
                if end not in index:
                    raise GraphError(f"edges[{j}].{label}: unknown op {_shown(end)}")
            s, d = index[src], index[dst]
            if s == d:
                raise GraphError(f"edges[{j}]: self-loop on op {src!r} (a cycle)")
            if (s, d) in seen:
                raise GraphError(f"edges[{j}]: duplicate edge {src!r} -> {dst!r}")
            seen.add((s, d))
            nbytes = ops[s].output_bytes if len(e) == 2 else _check_number(f"edges[{j}]", "bytes", e[2], integer=True)
            raw.append((s, d, int(nbytes)))
        _check_totals(name, ops, (b for _, _, b in raw))
        pairs = [(s, d) for s, d, _ in raw]
        cycle = find_cycle(len(ops), pairs)
        if cycle is not None:
            raise GraphError(f"graph {name!r} has a cycle: {_cycle_text([ops[i].name for i in cycle])}")
        order = canonical_order(len(ops), pairs)
        pos = {old: new for new, old in enumerate(order)}
        new_ops = tuple(ops[i] for i in order)
        new_edges = tuple(sorted((Edge(pos[s], pos[d], b) for s, d, b in raw), key=lambda e: (e.src, e.dst)))
        graph = cls(name=name, ops=new_ops, edges=new_edges, metadata=metadata)
        graph._check_groups()
        return graph

    def _check_groups(self) -> None:
        """Ops of one colocation group must allow at least one common device kind."""
        allowed: dict[str, set[str]] = {}
        for op in self.ops:
            if op.group is None or not op.allowed_kinds:
                continue
            kinds = allowed.setdefault(op.group, set(DEVICE_KINDS))
            kinds &= set(op.allowed_kinds)
            if not kinds:
                raise GraphError(
                    f"group {op.group!r}: op {op.name!r} narrows the allowed device kinds to none"
                )

    # -- derived arrays (cached; the graph is immutable) ----------------------------------------------
    @property
    def num_ops(self) -> int:
        return len(self.ops)

    @property
    def num_edges(self) -> int:
        return len(self.edges)

    @cached_property
    def index(self) -> dict[str, int]:
        return {op.name: i for i, op in enumerate(self.ops)}

    @cached_property
    def arrays(self) -> GraphArrays:
        return GraphArrays.from_graph(self)

    def predecessors(self, i: int) -> list[int]:
        a = self.arrays
        return a.pred_idx[a.pred_ptr[i] : a.pred_ptr[i + 1]].tolist()

    def successors(self, i: int) -> list[int]:
        a = self.arrays
        return a.succ_idx[a.succ_ptr[i] : a.succ_ptr[i + 1]].tolist()

    @cached_property
    def groups(self) -> dict[str, list[int]]:
        """Colocation groups: group name -> op indices."""
        out: dict[str, list[int]] = {}
        for i, op in enumerate(self.ops):
            if op.group is not None:
                out.setdefault(op.group, []).append(i)
        return out

    @cached_property
    def stats(self) -> GraphStats:
        a = self.arrays
        n = self.num_ops
        longest_ops = np.ones(n, dtype=np.int64)
        longest_flops = a.flops.copy()
        # dynamic programming over the topological order
        for v in range(n):
            preds = a.pred_idx[a.pred_ptr[v] : a.pred_ptr[v + 1]]
            if len(preds):
                longest_ops[v] = 1 + longest_ops[preds].max()
                longest_flops[v] = a.flops[v] + longest_flops[preds].max()
        phases = {p: 0 for p in PHASES}
        for op in self.ops:
            phases[op.phase] += 1
        return GraphStats(
            num_ops=n,
            num_edges=self.num_edges,
            average_degree=(2.0 * self.num_edges / n) if n else 0.0,
            total_flops=float(a.flops.sum()),
            param_bytes=int(a.param_bytes.sum()),
            critical_path_ops=int(longest_ops.max()) if n else 0,
            critical_path_flops=float(longest_flops.max()) if n else 0.0,
            ops_by_phase=phases,
        )

    @cached_property
    def content_hash(self) -> str:
        from suite.graph_io import content_hash

        return content_hash(self)

    def __repr__(self) -> str:
        return f"OpGraph({self.name!r}, ops={self.num_ops}, edges={self.num_edges})"


@dataclass(frozen=True, eq=False)
class GraphArrays:
    """Numpy views of a graph for the cost model and simulators (CSR adjacency in both directions)."""

    flops: np.ndarray  # float64 [n]
    bytes_accessed: np.ndarray  # int64 [n]
    output_bytes: np.ndarray  # int64 [n]
    param_bytes: np.ndarray  # int64 [n]
    succ_ptr: np.ndarray  # int64 [n+1]
    succ_idx: np.ndarray  # int64 [E], sorted by (src, dst)
    succ_bytes: np.ndarray  # int64 [E]
    pred_ptr: np.ndarray  # int64 [n+1]
    pred_idx: np.ndarray  # int64 [E], sorted by (dst, src)
    pred_bytes: np.ndarray  # int64 [E]

    @classmethod
    def from_graph(cls, g: OpGraph) -> GraphArrays:
        n = g.num_ops
        src = np.fromiter((e.src for e in g.edges), dtype=np.int64, count=len(g.edges))
        dst = np.fromiter((e.dst for e in g.edges), dtype=np.int64, count=len(g.edges))
        nbytes = np.fromiter((e.bytes for e in g.edges), dtype=np.int64, count=len(g.edges))
        order_s = np.lexsort((dst, src))
        order_d = np.lexsort((src, dst))
        succ_ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(src, minlength=n), out=succ_ptr[1:])
        pred_ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(dst, minlength=n), out=pred_ptr[1:])
        arrays = cls(
            flops=np.array([op.flops for op in g.ops], dtype=np.float64),
            bytes_accessed=np.array([op.bytes_accessed for op in g.ops], dtype=np.int64),
            output_bytes=np.array([op.output_bytes for op in g.ops], dtype=np.int64),
            param_bytes=np.array([op.param_bytes for op in g.ops], dtype=np.int64),
            succ_ptr=succ_ptr,
            succ_idx=dst[order_s],
            succ_bytes=nbytes[order_s],
            pred_ptr=pred_ptr,
            pred_idx=src[order_d],
            pred_bytes=nbytes[order_d],
        )
        for a in arrays.__dict__.values():
            a.setflags(write=False)
        return arrays
