"""Shared helpers of the classical placers: colocation contraction, device-kind constraints, graph weights.

Every placer here works on *nodes*: a node is one colocation group (all its ops must share a device) or
one op without a group. `contract` builds the node graph once; a node placement is expanded back to ops
with `Contraction.expand`, so colocation holds by construction. Device-kind constraints become a boolean
matrix `allowed[node, device]` (the intersection of the kinds its ops allow).

Weights for the partitioners (Scotch, METIS) are integers: `scale_to_int` keeps proportions and keeps
totals far below 2^31, so that a METIS or Scotch built with 32-bit integers would not overflow either (the
pymetis 2025.2 and pyscotch 7.0 wheels used here are built with 64-bit ones).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from suite.cluster import Cluster
from suite.errors import PlacementError
from suite.graph import OpGraph

INT_WEIGHT_TOTAL = 1 << 28  # target sum of integer weights handed to Scotch / METIS


def library_seed(seed: int) -> int:
    """A 31-bit seed for a partitioning library (Scotch, METIS) from a placer's seed, spread by a hash:
    both libraries turn nearby seeds into the same random choices (seeds 0 and 1 gave one partition).

    Seeds are non-negative: the suite accepts only [0, 2**32) (`suite.methodology.check_seeds`, the CLI's
    --seed), as numpy's generators do. A negative seed is refused (ValueError) rather than folded onto
    another (abs() gave -s the partition of s). The 2**32 accepted seeds map onto 2**31 library seeds, so
    some pairs of seeds give one partition (kept: a wider map would change committed results)."""
    seed = int(seed)
    if seed < 0:
        raise ValueError(f"seed {seed} is negative: placer seeds are integers in [0, 2**32)")
    return int(np.random.SeedSequence(seed).generate_state(1, dtype=np.uint32)[0] >> 1)


def _flush_c_streams() -> None:
    """fflush(NULL): C's stdout is block-buffered when it is not a terminal, so a library's printf stays in
    the C buffer (and would come out later, wherever stdout then points) until flushed."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).fflush(None)


@contextlib.contextmanager
def c_stdout() -> Iterator[list[str]]:
    """Catch what is written to file descriptor 1 inside the block (a C library's printf: METIS prints its
    complaints there), instead of letting it into the command's stdout; yields a list that holds the
    caught non-blank lines, stripped, once the block ends. Process-wide while it lasts (file descriptors
    are): only for short calls into a library."""
    lines: list[str] = []
    sys.stdout.flush()
    _flush_c_streams()
    saved = os.dup(1)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 1)
        try:
            yield lines
        finally:
            _flush_c_streams()
            os.dup2(saved, 1)
            os.close(saved)
            caught.seek(0)
            lines += [t.strip() for t in caught.read().decode(errors="replace").splitlines() if t.strip()]


@dataclass(frozen=True, eq=False)
class Contraction:
    """The node graph of a workload: colocation groups contracted into super-nodes.

    Nodes are numbered in the order of their first op in the canonical topological order, so node order is
    deterministic and (for a DAG of groups) close to topological.
    """

    graph: OpGraph
    node_of_op: np.ndarray  # int64 [n_ops]
    first_op: np.ndarray  # int64 [n_nodes]: the lowest op index of each node

    @property
    def num_nodes(self) -> int:
        return len(self.first_op)

    @cached_property
    def members(self) -> list[np.ndarray]:
        order = np.argsort(self.node_of_op, kind="stable")
        bounds = np.searchsorted(self.node_of_op[order], np.arange(self.num_nodes + 1))
        return [order[bounds[k] : bounds[k + 1]] for k in range(self.num_nodes)]

    def node_sum(self, per_op: np.ndarray) -> np.ndarray:
        """Sum a per-op quantity ([n] or [n, D]) over each node's ops."""
        per_op = np.asarray(per_op, dtype=np.float64)
        out = np.zeros((self.num_nodes,) + per_op.shape[1:], dtype=np.float64)
        np.add.at(out, self.node_of_op, per_op)
        return out

    @cached_property
    def edges(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Undirected node edges (u < v) with the summed bytes of all op edges between them."""
        a = self.graph.arrays
        src = np.repeat(np.arange(self.graph.num_ops), np.diff(a.succ_ptr))
        u = self.node_of_op[src]
        v = self.node_of_op[a.succ_idx]
        keep = u != v
        lo, hi, b = np.minimum(u, v)[keep], np.maximum(u, v)[keep], a.succ_bytes[keep].astype(np.float64)
        if not len(lo):
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty, np.zeros(0)
        key = lo * self.num_nodes + hi
        uniq, inv = np.unique(key, return_inverse=True)
        nbytes = np.zeros(len(uniq))
        np.add.at(nbytes, inv, b)
        return uniq // self.num_nodes, uniq % self.num_nodes, nbytes

    def csr(self, edge_weights: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Symmetric CSR (xadj, adjncy, weights) of the node graph, neighbours sorted, for Scotch/METIS."""
        u, v, _ = self.edges
        rows = np.concatenate([u, v])
        cols = np.concatenate([v, u])
        w = np.concatenate([edge_weights, edge_weights])
        order = np.lexsort((cols, rows))
        xadj = np.zeros(self.num_nodes + 1, dtype=np.int64)
        np.cumsum(np.bincount(rows, minlength=self.num_nodes), out=xadj[1:])
        return xadj, cols[order].astype(np.int64), w[order]

    def expand(self, node_device: np.ndarray) -> np.ndarray:
        """Op placement (int64 [n_ops]) from a node placement."""
        return np.asarray(node_device, dtype=np.int64)[self.node_of_op]

    def restrict(self, placement: np.ndarray) -> np.ndarray:
        """Node placement from an op placement that respects colocation (device of each node's first op)."""
        return np.asarray(placement, dtype=np.int64)[self.first_op]


def contract(graph: OpGraph) -> Contraction:
    """Contract the colocation groups of `graph` into nodes (ops without a group stay alone)."""
    key_of: dict[object, int] = {}
    node_of_op = np.empty(graph.num_ops, dtype=np.int64)
    first: list[int] = []
    for i, op in enumerate(graph.ops):
        key = ("g", op.group) if op.group is not None else ("o", i)
        k = key_of.get(key)
        if k is None:
            k = key_of[key] = len(first)
            first.append(i)
        node_of_op[i] = k
    node_of_op.setflags(write=False)
    return Contraction(graph, node_of_op, np.array(first, dtype=np.int64))


def allowed_ops(graph: OpGraph, cluster: Cluster) -> np.ndarray:
    """bool [n_ops, D]: may op i run on device d (its kind allowed)?"""
    kinds = np.array([d.kind for d in cluster.devices])
    out = np.ones((graph.num_ops, cluster.num_devices), dtype=bool)
    for i, op in enumerate(graph.ops):
        if op.allowed_kinds:
            out[i] = np.isin(kinds, op.allowed_kinds)
    return out


def allowed_nodes(con: Contraction, cluster: Cluster) -> np.ndarray:
    """bool [n_nodes, D]: devices every op of the node allows. Raises if a node allows no device."""
    per_op = allowed_ops(con.graph, cluster)
    out = np.ones((con.num_nodes, cluster.num_devices), dtype=bool)
    np.logical_and.at(out, con.node_of_op, per_op)
    bad = np.flatnonzero(~out.any(axis=1))
    if len(bad):
        # name an op of the node that itself allows none of the cluster's devices (the one that narrows the
        # group), not the node's first op, which may allow every kind
        ops = con.members[bad[0]].tolist()
        op = con.graph.ops[next((i for i in ops if not per_op[i].any()), con.first_op[bad[0]])]
        raise PlacementError(
            f"op {op.name!r} (group {op.group!r}) allows only {', '.join(op.allowed_kinds) or 'any'} device kinds; "
            f"cluster {cluster.name!r} has none of them"
        )
    return out


def effective_flops(cluster: Cluster, d: int) -> float:
    dev = cluster.devices[d]
    return dev.peak_flops * dev.compute_efficiency


def gpus_or_all(cluster: Cluster) -> list[int]:
    """The GPUs of the cluster, or every device when it has none."""
    return cluster.device_indices("gpu") or list(range(cluster.num_devices))


def reference_device(cluster: Cluster, devices: list[int]) -> int:
    """The fastest of `devices` (highest effective FLOP/s, first on ties): the unit of node weights."""
    return max(devices, key=lambda d: (effective_flops(cluster, d), -d))


def device_speeds(cost: np.ndarray, devices: list[int], ref: int) -> np.ndarray:
    """Speed of each device relative to `ref` on this workload: total op time on ref / total op time on d.

    Workload-aware (the roofline makes a CPU's speed differ for compute- and memory-bound ops), so the
    partitioners' device weights are in proportion to how fast each device runs *this* graph.

    A device that runs every op in 0 s (a 0 s profile, or 0-FLOP ops on a device without op overhead) is
    the fastest, infinitely faster than the others: speeds are then relative to it, 1.0 for each 0 s device
    and 0.0 for the rest (which the partitioners raise to their smallest share), not 1.0, the speed of ref.
    """
    total = cost.sum(axis=0)
    zero = total[devices] <= 0
    if zero.any():
        return zero.astype(np.float64)
    return total[ref] / total[devices]


def scale_to_int(values: np.ndarray, total: int = INT_WEIGHT_TOTAL, minimum: int = 1) -> np.ndarray:
    """Non-negative floats -> int64 in proportion, summing to about `total`, each at least `minimum`."""
    values = np.asarray(values, dtype=np.float64)
    if not len(values):
        return np.zeros(0, dtype=np.int64)
    s = values.sum()
    if not np.isfinite(s) or s <= 0:
        return np.full(len(values), max(minimum, 1), dtype=np.int64)
    scaled = np.rint(values * (total / s)).astype(np.int64)
    return np.maximum(scaled, minimum)


def enforce_kinds(
    node_device: np.ndarray, con: Contraction, allowed: np.ndarray, speed_rank: np.ndarray | None = None
) -> tuple[np.ndarray, int]:
    """Move each node that sits on a device its ops forbid to an allowed device; return (placement, moved).

    The partitioners (Scotch, METIS) know nothing of device kinds, so their answer is fixed afterwards: a
    node on a forbidden device goes to the allowed device it exchanges the most bytes with (neighbours as
    already placed), ties to the allowed device first in `speed_rank` (fastest first), then lowest index.
    Nodes are visited in node order, so the result is deterministic.
    """
    out = np.array(node_device, dtype=np.int64)
    ndev = allowed.shape[1]
    bad = np.flatnonzero(~allowed[np.arange(len(out)), out])
    if not len(bad):
        return out, 0
    u, v, nbytes = con.edges
    nbr: dict[int, list[tuple[int, float]]] = {}
    for a, b, w in zip(u.tolist(), v.tolist(), nbytes.tolist(), strict=True):
        nbr.setdefault(a, []).append((b, w))
        nbr.setdefault(b, []).append((a, w))
    rank = np.arange(ndev) if speed_rank is None else np.asarray(speed_rank)
    pref = np.empty(ndev, dtype=np.int64)
    pref[rank] = np.arange(ndev)  # position of each device in the preference order
    for k in bad.tolist():
        affinity = np.zeros(ndev)
        for j, w in nbr.get(k, []):
            affinity[out[j]] += w
        cands = np.flatnonzero(allowed[k])
        out[k] = min(cands.tolist(), key=lambda d: (-affinity[d], pref[d], d))
    return out, len(bad)


def speed_order(cluster: Cluster) -> np.ndarray:
    """Device indices, fastest (effective FLOP/s) first, ties by index."""
    return np.array(sorted(range(cluster.num_devices), key=lambda d: (-effective_flops(cluster, d), d)), dtype=np.int64)
