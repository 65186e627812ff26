"""METIS k-way partitioning of the op graph, parts sized in proportion to device speed (pymetis).

* Graph: colocation groups contracted into nodes (`_common.contract`); vertex weight = compute time of the
  node's ops on the reference device (the fastest candidate, from the cost model); edge weight = bytes
  exchanged between the two nodes (both directions summed). Weights are scaled to integers that sum to
  about 2^28, within a 32-bit idx_t (this pymetis's is 64-bit).
* Target part weights (`tpwgts`): part k gets the share speed_k / sum(speeds), where speed_k is candidate
  device k's speed on this workload relative to the reference (total op time on the reference / total op
  time on device k). METIS refuses a share of 0 (a device of speed 0, where the reference runs the workload
  in 0 s), so shares are at least `MIN_SHARE` times the largest.
* Part-to-device assignment: part k is candidate device k. METIS sizes part k by tpwgts[k], so the
  assignment is fixed by construction: the fastest devices get the largest parts.
* Candidate devices: every device, the CPU included (`include_cpu=False` keeps only the GPUs).
* METIS_PartGraphKway (`recursive=False`; pymetis would default to recursive bisection for <= 8 parts),
  METIS's default imbalance (ufactor 30, i.e. 3%, for k-way; 1 for recursive bisection), seeded through
  METIS's options with a hash of `seed` (`_common.library_seed`: METIS gave seeds 0 and 1 one partition).
* Device-kind constraints: METIS ignores them; a node on a device its ops forbid is moved to the allowed
  device it exchanges the most bytes with (`_common.enforce_kinds`; counted in `info["kind_moves"]`).
* Memory is ignored: an OOM placement stays OOM.
* What METIS prints (with C's printf, to stdout: "***Cannot bisect a graph with 0 vertices!", "***You are
  trying to partition a graph into too many parts!" where its bisections leave a part empty, as small
  graphs with parts of very different sizes do) is caught, not let into the command's output: its distinct
  lines are `info["metis_messages"]` (absent where METIS printed nothing). The partition is still used.

Single shot: no evaluations of the evaluator.
"""

from __future__ import annotations

import time
from typing import ClassVar

import numpy as np
import pymetis

from baselines import _common
from suite.methodology import Budget
from suite.placer import BasePlacer, PlacementResult, Problem

MIN_SHARE = 1e-6  # smallest target part weight handed to METIS, relative to the largest


def metis_parts(
    xadj: np.ndarray,
    adjncy: np.ndarray,
    vertex_weights: np.ndarray,
    edge_weights: np.ndarray,
    part_shares: np.ndarray,
    seed: int,
    recursive: bool = False,
    messages: list[str] | None = None,
) -> np.ndarray:
    """Part of every vertex (int64), k = len(part_shares) parts sized by the shares. The distinct lines that
    METIS prints are appended to `messages` (when given) instead of reaching stdout."""
    n = len(xadj) - 1
    k = len(part_shares)
    if k == 1 or n == 0:
        return np.zeros(n, dtype=np.int64)
    if n <= k:  # no more vertices than parts, where METIS would leave parts empty or fail: the heaviest
        # vertex first, each to the part where its load per share ends lowest (ties: the larger share, then
        # the lower part); edges are not looked at
        shares = np.asarray(part_shares, dtype=np.float64)
        load = np.zeros(k)
        out = np.zeros(n, dtype=np.int64)
        for v in np.argsort(-np.asarray(vertex_weights), kind="stable").tolist():
            end = np.where(shares > 0, (load + vertex_weights[v]) / np.where(shares > 0, shares, 1.0), np.inf)
            part = min(range(k), key=lambda q: (end[q], -shares[q], q))
            out[v] = part
            load[part] += vertex_weights[v]
        return out
    shares = np.asarray(part_shares, dtype=np.float64)
    shares = np.maximum(shares, MIN_SHARE * shares.max())
    shares = shares / shares.sum()
    with _common.c_stdout() as printed:
        _, parts = pymetis.part_graph(
            k,
            adjacency=pymetis.CSRAdjacency(np.asarray(xadj, dtype=np.int64), np.asarray(adjncy, dtype=np.int64)),
            vweights=np.asarray(vertex_weights, dtype=np.int64),
            eweights=np.asarray(edge_weights, dtype=np.int64) if len(adjncy) else None,
            tpwgts=shares.tolist(),
            recursive=recursive,
            options=pymetis.Options(seed=_common.library_seed(seed)),
        )
    if messages is not None:
        messages += [line for line in dict.fromkeys(printed) if line not in messages]
    return np.asarray(parts, dtype=np.int64)


class Metis(BasePlacer):
    """METIS k-way partitioning with parts in proportion to device speed."""

    name = "metis"
    defaults: ClassVar[dict] = {"include_cpu": True, "recursive": False}

    def place(self, problem: Problem, budget: Budget, seed: int) -> PlacementResult:
        started = time.perf_counter()
        graph, cluster = problem.workload, problem.cluster
        devices = list(range(cluster.num_devices)) if self.params["include_cpu"] else _common.gpus_or_all(cluster)
        con = _common.contract(graph)
        allowed = _common.allowed_nodes(con, cluster)
        cost = problem.costs()
        ref = _common.reference_device(cluster, devices)
        speeds = _common.device_speeds(cost, devices, ref)
        _, _, nbytes = con.edges
        xadj, adjncy, ew = con.csr(_common.scale_to_int(nbytes))
        vw = _common.scale_to_int(con.node_sum(cost[:, ref]))
        said: list[str] = []
        parts = metis_parts(xadj, adjncy, vw, ew, speeds, seed, recursive=self.params["recursive"], messages=said)
        node_device = np.asarray(devices, dtype=np.int64)[parts]
        node_device, moved = _common.enforce_kinds(node_device, con, allowed, _common.speed_order(cluster))
        return PlacementResult.from_search(
            con.expand(node_device),
            problem,
            started,
            devices=[cluster.devices[d].name for d in devices],
            device_speeds=[round(float(s), 6) for s in speeds],
            nodes=con.num_nodes,
            kind_moves=moved,
            **({"metis_messages": said} if said else {}),
        )
