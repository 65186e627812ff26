"""All ops on one device: the single-CPU and single-GPU rows of every placement paper's table.

No search: one placement, no evaluations. The device is the fastest of its kind (by effective peak FLOP/s).
If the model does not fit, the evaluator reports OOM; ops that forbid the device kind make it invalid. A
cluster without a device of the kind gives `skipped`: the row does not apply there, nothing failed.
"""

from __future__ import annotations

import time

import numpy as np

from suite.methodology import Budget
from suite.placer import BasePlacer, NotApplicable, PlacementResult, Problem


class _SingleDevice(BasePlacer):
    kind = "cpu"

    def place(self, problem: Problem, budget: Budget, seed: int) -> PlacementResult:
        started = time.perf_counter()
        if not any(d.kind == self.kind for d in problem.cluster.devices):
            raise NotApplicable(f"cluster {problem.cluster.name!r} has no {self.kind.upper()} device")
        device = problem.cluster.fastest(self.kind)
        placement = np.full(problem.workload.num_ops, device, dtype=np.int64)
        return PlacementResult.from_search(placement, problem, started, device=problem.cluster.devices[device].name)


class SingleCPU(_SingleDevice):
    """Every op on the cluster's fastest CPU."""

    name = "single_cpu"
    kind = "cpu"


class SingleGPU(_SingleDevice):
    """Every op on the cluster's fastest GPU (OOM when the model does not fit)."""

    name = "single_gpu"
    kind = "gpu"
