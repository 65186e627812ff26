"""Scotch static mapping: the "Scotch" column of Mirhoseini et al. 2017 (Table 1), through pyscotch.

Mirhoseini et al. (ICML 2017, Sec. 4.2, baselines) feed the Scotch static mapper (Pellegrini 2009) the op
graph with each op's compute cost and the bytes flowing between ops, and the devices with their compute
and communication capacities; Scotch balances load and minimises communication. Here:

* Source graph: colocation groups contracted into nodes (see `_common.contract`); node weight = compute
  time of its ops on the reference device (the fastest candidate device, from the cost model); edge weight
  = bytes exchanged between the two nodes (both directions summed). Weights are scaled to integers.
* Target architecture: a Scotch decomposition-defined architecture ("deco 0", see `_scotch_adapter`) over
  the candidate devices: terminal weight = the device's speed on this workload relative to the reference
  (total op time on the reference / total op time on the device; the fastest device weighs 1000);
  distance between two devices = time per byte of the route the simulator uses between them (fastest
  route = 10, others in proportion to 1 / bandwidth); bipartition tree = devices on the cheapest links
  grouped first.
* Part-to-device assignment: Scotch's terminal labelled t is candidate device t; there is no separate
  assignment step.
* Candidate devices: all devices, the CPU included (`scotch`); only the GPUs (`mincut`, see mincut.py).
* Device-kind constraints: Scotch ignores them; a node mapped to a device its ops forbid is moved to the
  allowed device it exchanges the most bytes with (`_common.enforce_kinds`); `info["kind_moves"]` counts
  such moves.
* Memory is ignored: an OOM placement stays OOM (no repair).
* Seeded: Scotch runs in a deterministic context seeded from `seed` (same seed, same placement).

Single shot: no evaluations of the evaluator.
"""

from __future__ import annotations

import time

import numpy as np

from baselines import _common
from baselines._scotch_adapter import map_graph
from suite.cluster import Cluster
from suite.methodology import Budget
from suite.placer import BasePlacer, PlacementResult, Problem

TARGET_WEIGHT_SCALE = 1000  # integer weight of the fastest device
LINK_COST_SCALE = 10  # integer cost of the fastest route


def link_costs(cluster: Cluster, devices: list[int]) -> np.ndarray:
    """[k, k] positive integer link costs between candidate devices: time per byte of their route, scaled."""
    k = len(devices)
    if k < 2:
        return np.zeros((k, k), dtype=np.int64)
    _, bw = cluster.routes
    sub = np.array([[bw[a, b] for b in devices] for a in devices], dtype=np.float64)
    off = ~np.eye(k, dtype=bool)
    fastest = sub[off].max()
    cost = np.zeros((k, k), dtype=np.int64)
    cost[off] = np.maximum(1, np.rint(LINK_COST_SCALE * fastest / sub[off])).astype(np.int64)
    return cost


def target_weights(speeds: np.ndarray) -> np.ndarray:
    return np.maximum(1, np.rint(TARGET_WEIGHT_SCALE * speeds / speeds.max())).astype(np.int64)


def scotch_placement(problem: Problem, devices: list[int], seed: int) -> tuple[np.ndarray, dict]:
    """Map the contracted op graph onto `devices` with Scotch; return (op placement, info)."""
    graph, cluster = problem.workload, problem.cluster
    con = _common.contract(graph)
    allowed = _common.allowed_nodes(con, cluster)
    cost = problem.costs()
    ref = _common.reference_device(cluster, devices)
    speeds = _common.device_speeds(cost, devices, ref)
    vw = _common.scale_to_int(con.node_sum(cost[:, ref]))
    _, _, nbytes = con.edges
    xadj, adjncy, ew = con.csr(_common.scale_to_int(nbytes))
    parts = map_graph(xadj, adjncy, vw, ew, target_weights(speeds), link_costs(cluster, devices), seed=seed)
    node_device = np.asarray(devices, dtype=np.int64)[parts]
    node_device, moved = _common.enforce_kinds(node_device, con, allowed, _common.speed_order(cluster))
    info = {
        "devices": [cluster.devices[d].name for d in devices],
        "device_speeds": [round(float(s), 6) for s in speeds],
        "nodes": con.num_nodes,
        "kind_moves": moved,
    }
    return con.expand(node_device), info


class Scotch(BasePlacer):
    """Scotch static mapping onto every device of the cluster, the CPU included."""

    name = "scotch"
    include_cpu = True

    def candidate_devices(self, cluster: Cluster) -> list[int]:
        return list(range(cluster.num_devices)) if self.include_cpu else _common.gpus_or_all(cluster)

    def place(self, problem: Problem, budget: Budget, seed: int) -> PlacementResult:
        started = time.perf_counter()
        placement, info = scotch_placement(problem, self.candidate_devices(problem.cluster), seed)
        return PlacementResult.from_search(placement, problem, started, **info)
