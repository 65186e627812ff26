"""Features of ops, groups and devices for learned placers.

Everything is derived from the workload and the cluster alone (never from evaluations), as numpy arrays,
so that any policy (LSTM, GNN, MLP) can take what it needs:

* `op_features`: per op: kind (an index into the graph's kind vocabulary), numeric features (log-scaled
  FLOPs, bytes accessed, output bytes, parameter bytes; phase; position in the topological order; depth;
  in/out degree), the output shape (log-scaled dims, padded), and the adjacency (edge list with bytes).
* `group_features`: the same aggregated over a `Grouping`, after Mirhoseini et al. (2017): each op kind's
  share of the group's ops, the mean output shape of its ops (log-scaled dims), and the group adjacency
  (log-scaled edge counts to every other group), plus summed numeric features and the group's size. The
  authors' code sums raw kind counts and output shapes and divides each row by its maximum + 1; shares and
  means keep every feature in [0, 1] with no per-row rescaling (a deviation, also listed in rl/seq2seq.py).
* `device_features`: per device: kind, log effective FLOP/s and memory bandwidth (peak x the device's
  efficiency, what the cost model uses), and log memory capacity, each scaled by the cluster's largest.
* `cost_features`: the cost model's time of every op on every device (what Placeto-style policies use).

Scales: quantities spanning many orders of magnitude are taken as log1p and divided by the largest value
in the graph, so every feature lies in [0, 1].
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from rl.grouping import Grouping
from suite.cluster import Cluster
from suite.costmodel import Profile, cost_matrix
from suite.graph import PHASES, OpGraph

MAX_RANK = 4  # output-shape dims kept (Mirhoseini et al. pad the output shape to a fixed size)
NUMERIC_NAMES = (
    "log_flops",
    "log_bytes_accessed",
    "log_output_bytes",
    "log_param_bytes",
    *(f"phase_{p}" for p in PHASES),
    "topo_position",
    "depth",
    "log_in_degree",
    "log_out_degree",
)


def scaled_log(x: np.ndarray) -> np.ndarray:
    """log1p(x) divided by its largest value (0 stays 0): many orders of magnitude into [0, 1]."""
    y = np.log1p(np.asarray(x, dtype=np.float64))
    top = y.max() if y.size else 0.0
    return y / top if top > 0 else y


@dataclass(frozen=True, eq=False)
class OpFeatures:
    """Per-op features of one workload (arrays indexed by op, in the graph's topological order)."""

    kinds: tuple[str, ...]  # vocabulary: the graph's op kinds, sorted
    kind_ids: np.ndarray  # int64 [n]
    numeric: np.ndarray  # float32 [n, len(NUMERIC_NAMES)], each column in [0, 1]
    output_shape: np.ndarray  # float32 [n, MAX_RANK]: log1p of the first dims / the largest, 0-padded
    edge_index: np.ndarray  # int64 [2, E] (src, dst)
    edge_bytes: np.ndarray  # float64 [E]

    @property
    def num_ops(self) -> int:
        return len(self.kind_ids)

    @cached_property
    def kind_onehot(self) -> np.ndarray:
        out = np.zeros((self.num_ops, len(self.kinds)), dtype=np.float32)
        out[np.arange(self.num_ops), self.kind_ids] = 1.0
        return out

    def matrix(self) -> np.ndarray:
        """[n, K + F + MAX_RANK]: kind one-hot, numeric features, output shape."""
        return np.concatenate([self.kind_onehot, self.numeric, self.output_shape], axis=1)


def depths(graph: OpGraph) -> np.ndarray:
    """Longest path (in edges) from any source to each op."""
    a = graph.arrays
    d = np.zeros(graph.num_ops, dtype=np.int64)
    for v in range(graph.num_ops):  # topological order
        preds = a.pred_idx[a.pred_ptr[v] : a.pred_ptr[v + 1]]
        if len(preds):
            d[v] = d[preds].max() + 1
    return d


def op_features(graph: OpGraph) -> OpFeatures:
    a = graph.arrays
    n = graph.num_ops
    kinds = tuple(sorted({op.kind for op in graph.ops}))
    kind_index = {k: i for i, k in enumerate(kinds)}
    phase = np.zeros((n, len(PHASES)))
    for i, op in enumerate(graph.ops):
        phase[i, PHASES.index(op.phase)] = 1.0
    depth = depths(graph).astype(np.float64)
    numeric = np.column_stack(
        [
            scaled_log(a.flops),
            scaled_log(a.bytes_accessed),
            scaled_log(a.output_bytes),
            scaled_log(a.param_bytes),
            phase,
            np.arange(n) / max(n - 1, 1),
            depth / max(depth.max() if n else 0.0, 1.0),
            scaled_log(np.diff(a.pred_ptr)),
            scaled_log(np.diff(a.succ_ptr)),
        ]
    ).astype(np.float32)
    shape = np.zeros((n, MAX_RANK))
    for i, op in enumerate(graph.ops):
        dims = op.output_shape[:MAX_RANK]
        shape[i, : len(dims)] = np.log1p(dims)
    if shape.size and shape.max() > 0:
        shape /= shape.max()
    src = np.repeat(np.arange(n), np.diff(a.succ_ptr))
    return OpFeatures(
        kinds=kinds,
        kind_ids=np.array([kind_index[op.kind] for op in graph.ops], dtype=np.int64),
        numeric=numeric,
        output_shape=shape.astype(np.float32),
        edge_index=np.stack([src, a.succ_idx]).astype(np.int64),
        edge_bytes=a.succ_bytes.astype(np.float64),
    )


@dataclass(frozen=True, eq=False)
class GroupFeatures:
    """Per-group features under a grouping (Mirhoseini et al. 2017's group embedding, plus numeric)."""

    kind_counts: np.ndarray  # float32 [G, K]: ops of each kind in the group / the group's op count
    numeric: np.ndarray  # float32 [G, 6]: scaled log of summed FLOPs, bytes, output, params; size; position
    output_shape: np.ndarray  # float32 [G, MAX_RANK]: mean of the members' scaled output shapes
    adjacency: np.ndarray  # float32 [G, G]: edges from row group to column group (scaled log1p count)
    edge_index: np.ndarray  # int64 [2, E_g]: group-level edges (no self-loops)
    edge_bytes: np.ndarray  # float64 [E_g]: bytes on each group-level edge

    @property
    def num_groups(self) -> int:
        return len(self.numeric)

    def matrix(self, *, adjacency: bool = True) -> np.ndarray:
        """[G, K + 6 + MAX_RANK (+ 2G)]: the encoder input of the seq2seq placer.

        With `adjacency`, the out- and in-edge rows of the group adjacency are appended, as in Mirhoseini et
        al. (their group embedding concatenates kind counts, output shapes and adjacency).
        """
        parts = [self.kind_counts, self.numeric, self.output_shape]
        if adjacency:
            parts += [self.adjacency, self.adjacency.T]
        return np.concatenate(parts, axis=1).astype(np.float32)


def group_features(graph: OpGraph, grouping: Grouping, ops: OpFeatures | None = None) -> GroupFeatures:
    ops = ops or op_features(graph)
    a = graph.arrays
    G = grouping.num_groups
    asg = grouping.assignment
    size = np.bincount(asg, minlength=G).astype(np.float64)
    counts = np.zeros((G, len(ops.kinds)))
    np.add.at(counts, (asg, ops.kind_ids), 1.0)

    def gsum(x: np.ndarray) -> np.ndarray:
        return np.bincount(asg, weights=np.asarray(x, dtype=np.float64), minlength=G)

    first = np.array([m[0] for m in grouping.members], dtype=np.float64)
    numeric = np.column_stack(
        [
            scaled_log(gsum(a.flops)),
            scaled_log(gsum(a.bytes_accessed)),
            scaled_log(gsum(a.output_bytes)),
            scaled_log(gsum(a.param_bytes)),
            scaled_log(size),
            first / max(graph.num_ops - 1, 1),
        ]
    )
    shape = np.zeros((G, MAX_RANK))
    np.add.at(shape, asg, ops.output_shape)
    shape /= size[:, None]
    edge_index, ebytes, ecount = group_edges(graph, grouping)
    adj = np.zeros((G, G))
    adj[edge_index[0], edge_index[1]] = ecount
    return GroupFeatures(
        kind_counts=(counts / size[:, None]).astype(np.float32),
        numeric=numeric.astype(np.float32),
        output_shape=shape.astype(np.float32),
        adjacency=scaled_log(adj).astype(np.float32),
        edge_index=edge_index,
        edge_bytes=ebytes,
    )


def group_edges(graph: OpGraph, grouping: Grouping) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The group-level edges: (edge_index int64 [2, E] of distinct (src, dst) group pairs, src != dst, in
    increasing src * G + dst; bytes float64 [E] and op edges int64 [E] on each)."""
    a, asg, G = graph.arrays, grouping.assignment, grouping.num_groups
    gs = asg[np.repeat(np.arange(graph.num_ops), np.diff(a.succ_ptr))]
    gd = asg[np.asarray(a.succ_idx, dtype=np.int64)]
    cross = gs != gd
    pairs, inv, count = np.unique(gs[cross] * G + gd[cross], return_inverse=True, return_counts=True)
    ebytes = np.bincount(inv, weights=np.asarray(a.succ_bytes, np.float64)[cross], minlength=len(pairs))
    return np.stack([pairs // G, pairs % G]).astype(np.int64).reshape(2, -1), ebytes.astype(np.float64), count


def device_features(cluster: Cluster) -> np.ndarray:
    """float32 [D, 2 + 3]: kind one-hot (cpu, gpu), then scaled log effective FLOP/s, effective bandwidth
    (peak x efficiency) and memory."""
    kinds = np.array([[d.kind == "cpu", d.kind == "gpu"] for d in cluster.devices], dtype=np.float64)
    flops = np.array([d.peak_flops * d.compute_efficiency for d in cluster.devices])
    bw = np.array([d.mem_bandwidth * d.memory_efficiency for d in cluster.devices])
    mem = np.array([d.memory_bytes for d in cluster.devices], dtype=np.float64)
    return np.column_stack([kinds, scaled_log(flops), scaled_log(bw), scaled_log(mem)]).astype(np.float32)


def cost_features(graph: OpGraph, cluster: Cluster, grouping: Grouping | None = None,
                  profiles: Iterable[Profile] = ()) -> np.ndarray:
    """float32 [n or G, D]: time of each op (or summed over each group) on each device, scaled log; with
    `profiles`, the measured times (pass the evaluator's: `Problem.profiles`)."""
    cost = np.asarray(cost_matrix(graph, cluster, profiles), dtype=np.float64)
    if grouping is not None:
        out = np.zeros((grouping.num_groups, cost.shape[1]))
        np.add.at(out, grouping.assignment, cost)
        cost = out
    # seconds are small: scale to microseconds before the log so that differences survive
    return scaled_log(cost * 1e6).astype(np.float32)
