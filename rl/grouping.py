"""Grouping: which ops a learned placer decides together.

A learned placer does not pick a device per op: it picks one per *group*, and every op of a group goes
there. Every grouping here keeps two invariants, checked by `Grouping.check` and by the tests:

* every colocation group of the workload lies inside one group (so expanded placements never split one);
* the ops of a group allow at least one common device kind (so device-kind constraints stay satisfiable).

Builders:

* `colocation_grouping`: one group per colocation group, one per remaining op (the finest legal grouping).
* `mirhoseini_grouping`: the co-location heuristics of Mirhoseini et al. (ICML 2017, Sec. 3.2) -- colocation
  groups, then an op whose output is consumed by exactly one op joins that consumer -- followed by
  `coarsen` down to at most `max_groups`.
* `chain_grouping`: the first coarsening of HSDAG (its authors' `merge_operations`, as its comment states
  it): colocation groups, then an op whose only consumer has no other input joins that consumer (chains).
* `scope_grouping`: ops with the same leading scope components (e.g. "encoder.lstm.0") form one group.
* `coarsen`: generic coarsening of any grouping to at most `max_groups`, either along the topological order
  (contiguous runs of about equal work) or by heavy-edge matching (contract the groups joined by the most
  bytes first, as multilevel partitioners do). Placeto, Post and HSDAG reuse it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from suite.cluster import Cluster
from suite.errors import PlacebenchError, PlacementError
from suite.graph import DEVICE_KINDS, OpGraph

COARSEN_METHODS = ("topological", "heavy_edge")
GROUPINGS = ("mirhoseini", "colocation", "chain", "scope", "topological", "heavy_edge")


class GroupingError(PlacebenchError):
    """A grouping that breaks a colocation group or leaves a group no device kind."""


@dataclass(frozen=True, eq=False)
class Grouping:
    """`assignment[i]` is the group of op i; groups are numbered 0..G-1 by their first op (topological)."""

    assignment: np.ndarray  # int64 [num_ops]

    @classmethod
    def from_labels(cls, labels: Sequence[int] | np.ndarray) -> Grouping:
        """Renumber arbitrary labels so that groups are numbered in order of their first op."""
        labels = np.asarray(labels, dtype=np.int64)
        _, first = np.unique(labels, return_index=True)
        order = labels[np.sort(first)]
        remap = {int(lab): g for g, lab in enumerate(order)}
        out = np.fromiter((remap[int(x)] for x in labels), dtype=np.int64, count=len(labels))
        out.setflags(write=False)
        return cls(out)

    @property
    def num_ops(self) -> int:
        return len(self.assignment)

    @cached_property
    def num_groups(self) -> int:
        return int(self.assignment.max()) + 1 if len(self.assignment) else 0

    @cached_property
    def members(self) -> list[np.ndarray]:
        order = np.argsort(self.assignment, kind="stable")
        bounds = np.searchsorted(self.assignment[order], np.arange(self.num_groups + 1))
        return [order[bounds[g] : bounds[g + 1]] for g in range(self.num_groups)]

    @cached_property
    def sizes(self) -> np.ndarray:
        return np.bincount(self.assignment, minlength=self.num_groups)

    def expand(self, group_devices: Sequence[int] | np.ndarray) -> np.ndarray:
        """Op placement [num_ops] from one device per group [G] (or a batch [B, G] -> [B, num_ops])."""
        gd = np.asarray(group_devices, dtype=np.int64)
        if gd.shape[-1] != self.num_groups:
            raise PlacementError(f"expected {self.num_groups} group devices, got shape {gd.shape}")
        return gd[..., self.assignment]

    def contract(self, group_devices_of_ops: np.ndarray) -> np.ndarray:
        """Group devices [G] from an op placement that keeps every group on one device (first op's device)."""
        first = np.array([m[0] for m in self.members], dtype=np.int64)
        return np.asarray(group_devices_of_ops, dtype=np.int64)[..., first]

    def check(self, graph: OpGraph) -> None:
        """Raise `GroupingError` unless colocation groups are whole and every group has a device kind."""
        if self.num_ops != graph.num_ops:
            raise GroupingError(f"grouping covers {self.num_ops} ops, workload {graph.name!r} has {graph.num_ops}")
        for name, ops in graph.groups.items():
            gs = set(self.assignment[ops].tolist())
            if len(gs) > 1:
                raise GroupingError(f"colocation group {name!r} is split over groups {sorted(gs)}")
        kinds = group_allowed_kinds(graph, self)
        for g, k in enumerate(kinds):
            if not k:
                ops = [graph.ops[i].name for i in self.members[g][:3]]
                raise GroupingError(f"group {g} (ops {ops}...) allows no common device kind")


# -- device kinds ---------------------------------------------------------------------------------------
def _op_kinds(graph: OpGraph) -> list[frozenset[str]]:
    return [frozenset(op.allowed_kinds) if op.allowed_kinds else frozenset(DEVICE_KINDS) for op in graph.ops]


def group_allowed_kinds(graph: OpGraph, grouping: Grouping) -> list[frozenset[str]]:
    """Device kinds every op of each group allows."""
    kinds = [frozenset(DEVICE_KINDS)] * grouping.num_groups
    for i, k in enumerate(_op_kinds(graph)):
        g = int(grouping.assignment[i])
        kinds[g] = kinds[g] & k
    return kinds


def allowed_mask(graph: OpGraph, grouping: Grouping, cluster: Cluster) -> np.ndarray:
    """bool [G, D]: may group g go to device d. Raises `PlacementError` if a group has no device."""
    dev_kinds = [d.kind for d in cluster.devices]
    kinds = group_allowed_kinds(graph, grouping)
    mask = np.array([[dk in k for dk in dev_kinds] for k in kinds], dtype=bool).reshape(len(kinds), len(dev_kinds))
    bad = np.flatnonzero(~mask.any(axis=1))
    if len(bad):
        # name an op that itself allows none of the cluster's kinds (the one that narrows the group), not the
        # group's first op, which may allow every kind
        g = int(bad[0])
        op_kinds = _op_kinds(graph)
        narrow = [i for i in grouping.members[g].tolist() if not op_kinds[i] & set(dev_kinds)]
        if not narrow:  # every op has a kind of the cluster, but not one kind in common: an unchecked grouping
            first: dict[frozenset[str], int] = {}  # the first op of each narrower set of kinds in the group
            for i in grouping.members[g].tolist():
                if op_kinds[i] != frozenset(DEVICE_KINDS):
                    first.setdefault(op_kinds[i], i)
            ops = "; ".join(f"op {graph.ops[i].name!r} allows only {'/'.join(sorted(k))}" for k, i in first.items())
            raise PlacementError(f"group {g} allows no common device kind ({ops}): Grouping.check refuses it")
        op = graph.ops[narrow[0]]
        raise PlacementError(
            f"group {g}: op {op.name!r} allows only {', '.join(op.allowed_kinds)} device kinds, and cluster "
            f"{cluster.name!r} has none of them"
        )
    return mask


# -- union-find -----------------------------------------------------------------------------------------
class _Merger:
    """Union-find over ops that refuses merges leaving a group no common device kind."""

    def __init__(self, graph: OpGraph, labels: np.ndarray | None = None):
        n = graph.num_ops
        self.parent = list(range(n))
        self.kinds = _op_kinds(graph)
        self.count = n
        if labels is not None:
            first: dict[int, int] = {}
            for i, lab in enumerate(labels.tolist()):
                if lab in first:
                    self.union(first[lab], i, force=True)
                else:
                    first[lab] = i

    def find(self, x: int) -> int:
        root = x
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[x] != root:
            self.parent[x], x = root, self.parent[x]
        return root

    def union(self, a: int, b: int, *, force: bool = False) -> bool:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return False
        k = self.kinds[ra] & self.kinds[rb]
        if not k and not force:
            return False
        if ra > rb:
            ra, rb = rb, ra
        self.parent[rb] = ra
        self.kinds[ra] = k
        self.count -= 1
        return True

    def grouping(self) -> Grouping:
        return Grouping.from_labels([self.find(i) for i in range(len(self.parent))])


# -- builders -------------------------------------------------------------------------------------------
def colocation_grouping(graph: OpGraph) -> Grouping:
    """One group per colocation group and one per ungrouped op."""
    m = _Merger(graph)
    for ops in graph.groups.values():
        for j in ops[1:]:
            m.union(ops[0], j, force=True)
    return m.grouping()


def mirhoseini_grouping(
    graph: OpGraph, max_groups: int | None = 256, *, coarsen_method: str = "heavy_edge"
) -> Grouping:
    """Colocation groups, then single-consumer merging, then `coarsen` to `max_groups`.

    The single-consumer rule is Mirhoseini et al.'s first co-location heuristic: an op whose output feeds
    only one op runs where that op runs. It applies here to ops outside colocation groups only: in
    TensorFlow, colocation constraints came first and pinned ops to their variables, while in placebench's
    training graphs a colocation group holds a forward op with its backward ops, and chaining those
    through single-consumer gradient accumulations would fuse every time step of a recurrent layer into one
    group. Their other rules are model-specific (e.g. the ops of one LSTM cell); the final coarsening
    (heavy-edge matching by default) stands in for them generically.
    """
    base = colocation_grouping(graph)
    m = _Merger(graph, base.assignment)
    a = graph.arrays
    for i, op in enumerate(graph.ops):
        if op.group is None and a.succ_ptr[i + 1] - a.succ_ptr[i] == 1:
            m.union(i, int(a.succ_idx[a.succ_ptr[i]]))
    return coarsen(graph, m.grouping(), max_groups, method=coarsen_method)


def chain_grouping(graph: OpGraph) -> Grouping:
    """Colocation groups, then every edge u -> v where u has one consumer and v one input is contracted.

    This is the chain merging HSDAG starts from (Esthesia/HSDAG `merge_operations`: "the node has exactly
    one successor and no other predecessors of successor"). Merges that would leave a group no device kind
    are skipped.
    """
    base = colocation_grouping(graph)
    m = _Merger(graph, base.assignment)
    a = graph.arrays
    out_degree, in_degree = np.diff(a.succ_ptr), np.diff(a.pred_ptr)
    for u in np.flatnonzero(out_degree == 1).tolist():
        v = int(a.succ_idx[a.succ_ptr[u]])
        if in_degree[v] == 1:
            m.union(u, v)
    return m.grouping()


def scope_grouping(graph: OpGraph, depth: int = 2, max_groups: int | None = None) -> Grouping:
    """Ops whose scopes agree on the first `depth` dotted components form one group (then colocation).

    Ops without a scope stay alone. Merges that would leave a group no device kind are skipped.
    """
    base = colocation_grouping(graph)
    m = _Merger(graph, base.assignment)
    first: dict[str, int] = {}
    for i, op in enumerate(graph.ops):
        if not op.scope:
            continue
        key = ".".join(op.scope.split(".")[:depth])
        if key in first:
            m.union(first[key], i)
        else:
            first[key] = i
    g = m.grouping()
    return coarsen(graph, g, max_groups) if max_groups is not None else g


def _group_work(graph: OpGraph, grouping: Grouping) -> np.ndarray:
    """Work of each group for balancing: FLOPs plus a per-op floor, so that tiny ops still count."""
    flops = graph.arrays.flops
    floor = max(float(flops.mean()) * 0.01, 1.0) if len(flops) else 1.0
    return np.bincount(grouping.assignment, weights=flops + floor, minlength=grouping.num_groups)


def coarsen(graph: OpGraph, grouping: Grouping, max_groups: int | None, *, method: str = "topological") -> Grouping:
    """Merge groups until there are at most `max_groups` (no-op if already so); invariants are kept.

    topological: visit groups in order of their first op and cut the sequence into runs of about
      total_work / max_groups each (a cut also falls where device kinds would conflict). If the kinds
      alternate so often that even the fewest such runs are more than `max_groups`, those runs are merged
      out of order, the lightest pair that shares a device kind first; `GroupingError` only when no legal
      grouping has `max_groups` groups (one group for cpu-only and gpu-only ops).
    heavy_edge: rounds of heavy-edge matching: the pairs of neighbouring groups, heaviest exchange of bytes
      first (ties by position), merge when neither is matched yet in this round and the pair stays within
      twice the average work per target group; rounds repeat until `max_groups` is reached, then
      `topological` finishes if needed.
    """
    if method not in COARSEN_METHODS:
        raise GroupingError(f"unknown coarsening method {method!r}; choose from {', '.join(COARSEN_METHODS)}")
    if max_groups is None or grouping.num_groups <= max_groups:
        return grouping
    if max_groups < 1:
        raise GroupingError(f"max_groups must be at least 1, got {max_groups}")
    if method == "heavy_edge":
        grouping = _heavy_edge(graph, grouping, max_groups)
        if grouping.num_groups <= max_groups:
            return grouping
    return _topological(graph, grouping, max_groups)


def _runs(work: np.ndarray, kinds: list[frozenset[str]], target: float) -> np.ndarray:
    """Greedy cut of the group sequence into runs of work <= target (a run also ends on a kind conflict)."""
    labels = np.empty(len(work), dtype=np.int64)
    run, acc, cur = 0, 0.0, frozenset(DEVICE_KINDS)
    for g in range(len(work)):
        k = cur & kinds[g]
        if g > 0 and ((acc > 0 and acc + work[g] > target) or not k):
            run += 1
            acc, k = 0.0, kinds[g]
        labels[g] = run
        acc += work[g]
        cur = k
    return labels


def _topological(graph: OpGraph, grouping: Grouping, max_groups: int) -> Grouping:
    """Contiguous runs in topological order; the smallest run size (bisection) that gives <= max_groups."""
    kinds = group_allowed_kinds(graph, grouping)
    work = _group_work(graph, grouping)
    best = _runs(work, kinds, float("inf"))  # fewest runs possible: cuts only at kind conflicts
    if best[-1] + 1 > max_groups:  # kinds alternate too often for contiguous runs: merge runs out of order
        return Grouping.from_labels(_merge_alike_runs(graph, work, kinds, best, max_groups)[grouping.assignment])
    lo, hi = float(work.sum()) / max_groups, float(work.sum())
    labels = _runs(work, kinds, lo)
    if labels[-1] + 1 > max_groups:
        for _ in range(40):  # the number of runs does not grow with the target
            mid = 0.5 * (lo + hi)
            cand = _runs(work, kinds, mid)
            if cand[-1] + 1 <= max_groups:
                hi, best = mid, cand
            else:
                lo = mid
        labels = best
    return Grouping.from_labels(labels[grouping.assignment])


def _merge_alike_runs(
    graph: OpGraph, work: np.ndarray, kinds: list[frozenset[str]], runs: np.ndarray, max_groups: int
) -> np.ndarray:
    """Run labels of the groups [G] after merging the fewest contiguous runs (`runs`, which no contiguous
    merge can shorten) down to `max_groups`: repeatedly the lightest pair of runs that share a device kind
    (ties: the lowest runs), wherever they lie in the topological order."""
    R = int(runs[-1]) + 1
    run_work = np.bincount(runs, weights=work, minlength=R).tolist()
    run_kinds = [frozenset(DEVICE_KINDS)] * R
    for g, r in enumerate(runs.tolist()):
        run_kinds[r] = run_kinds[r] & kinds[g]
    alive = list(range(R))
    merged_into = list(range(R))
    while len(alive) > max_groups:
        pair: tuple[float, int, int] | None = None
        by_kind: dict[frozenset[str], list[int]] = {}
        for r in alive:
            by_kind.setdefault(run_kinds[r], []).append(r)
        lightest = {k: sorted(rs, key=lambda r: (run_work[r], r))[:2] for k, rs in by_kind.items()}
        for ka, ra in lightest.items():
            for kb, rb in lightest.items():
                if not ka & kb:
                    continue
                for x in ra:
                    for y in rb:
                        if x < y:
                            cand = (run_work[x] + run_work[y], x, y)
                            pair = cand if pair is None or cand < pair else pair
        if pair is None:
            raise GroupingError(
                f"cannot coarsen {graph.name!r} to {max_groups} group(s): device-kind constraints keep "
                f"{' and '.join(sorted('/'.join(sorted(k)) + '-only' for k in by_kind))} ops apart"
            )
        _, x, y = pair
        run_work[x] += run_work[y]
        run_kinds[x] = run_kinds[x] & run_kinds[y]
        alive.remove(y)
        merged_into[y] = x
    root = list(range(R))
    for r in range(R):
        while merged_into[root[r]] != root[r]:
            root[r] = merged_into[root[r]]
    return np.asarray(root, dtype=np.int64)[runs]


def _heavy_edge(graph: OpGraph, grouping: Grouping, max_groups: int) -> Grouping:
    a = graph.arrays
    m = _Merger(graph, grouping.assignment)
    work_cap = 2.0 * float(_group_work(graph, grouping).sum()) / max_groups
    src = np.repeat(np.arange(graph.num_ops), np.diff(a.succ_ptr))
    while m.count > max_groups:
        g = m.grouping()
        work = _group_work(graph, g)
        gs, gd = g.assignment[src], g.assignment[a.succ_idx]
        keep = gs != gd
        if not keep.any():
            break
        lo, hi = np.minimum(gs[keep], gd[keep]), np.maximum(gs[keep], gd[keep])
        pair_bytes: dict[tuple[int, int], float] = {}
        for x, y, b in zip(lo.tolist(), hi.tolist(), a.succ_bytes[keep].tolist(), strict=True):
            pair_bytes[(x, y)] = pair_bytes.get((x, y), 0.0) + b + 1.0
        # heaviest pairs first; ties by position (deterministic)
        ranked = sorted(pair_bytes.items(), key=lambda kv: (-kv[1], kv[0]))
        rep = [int(mem[0]) for mem in g.members]
        matched = np.zeros(g.num_groups, dtype=bool)
        merged = 0
        for (x, y), _b in ranked:
            if m.count <= max_groups:
                break
            if matched[x] or matched[y] or work[x] + work[y] > work_cap:
                continue
            if m.union(rep[x], rep[y]):
                matched[x] = matched[y] = True
                merged += 1
        if merged == 0:
            break
    return m.grouping()


def make_grouping(
    graph: OpGraph, method: str = "mirhoseini", max_groups: int | None = 256, *, coarsen_method: str = "heavy_edge"
) -> Grouping:
    """A grouping by name (one of `GROUPINGS`), coarsened with `coarsen_method` to `max_groups`, checked.

    "topological" and "heavy_edge" as names mean colocation groups coarsened that way. `max_groups=None`
    means no coarsening.
    """
    if method in COARSEN_METHODS:
        method, coarsen_method = "colocation", method
    if method == "mirhoseini":
        g = mirhoseini_grouping(graph, None)
    elif method == "colocation":
        g = colocation_grouping(graph)
    elif method == "chain":
        g = chain_grouping(graph)
    elif method == "scope":
        g = scope_grouping(graph)
    else:
        raise GroupingError(f"unknown grouping {method!r}; choose from {', '.join(GROUPINGS)}")
    g = coarsen(graph, g, max_groups, method=coarsen_method)
    g.check(graph)
    return g
