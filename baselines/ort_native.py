"""ONNX Runtime's own placements as baselines: `ort_cpu` (CPU provider only) and `ort_gpu` (CUDA provider with
CPU fallback): the framework's own device choice, as OpenVINO's would be in the setting of HSDAG (Duan et al.,
NeurIPS 2024), which runs placements through OpenVINO. Whether that paper's tables report OpenVINO's own CPU / GPU
choice as columns is not checked: only its abstract could be read (suite/papers/hsdag2024.toml).

No search, no evaluations: the framework decides.

* ort_cpu: every op on the fastest CPU device.
* ort_gpu: where ONNX Runtime with the CUDA provider and CPU fallback runs each op. With a CUDA device and
  onnxruntime-gpu on this machine the assignment is read from a real session
  (`suite.backends.ort_exec.native_assignment`: an op is on the GPU when at least half of its ONNX nodes
  that compute floating-point tensors are, a tie going to the GPU; the shape computations ONNX Runtime keeps
  on the CPU do not count;
  `info["assignment"] = "measured"`). Without them it is ONNX Runtime's documented rule for these models
  (`info["assignment"] = "static"`): every compute op on the fastest GPU, since the CUDA provider has
  kernels for every op type the zoo models export to, and the model inputs in host memory (ONNX Runtime is
  fed host tensors and copies them to the GPU), i.e. the input ops on the fastest CPU; an op whose allowed
  kinds exclude the GPU falls back to the CPU, as an op without a CUDA kernel does. Shape computations
  that ONNX Runtime keeps on the CPU are constants in our graphs, not ops. In both cases an op whose
  allowed kinds exclude the CPU (an input too) runs on the GPU, with its colocation group.

Training graphs: backward and update ops follow their forward op (colocation groups). A cluster without a
GPU makes ort_gpu not applicable. A training graph uses the static rule (ONNX Runtime runs inference only),
and so does a graph without a model to run (a graph file that is neither a zoo workload nor a variant of
one), unless `assignment="measured"` asks for a session.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from suite.errors import PlacebenchError
from suite.graph import OpGraph
from suite.methodology import Budget
from suite.placer import BasePlacer, NotApplicable, PlacementResult, Problem


def _colocate(graph: OpGraph, placement: np.ndarray) -> np.ndarray:
    """Every op of a colocation group on the device of the group's forward op."""
    out = placement.copy()
    for members in graph.groups.values():
        fwd = [i for i in members if graph.ops[i].phase == "forward"]
        out[members] = out[(fwd or members)[0]]
    return out


class OrtCPU(BasePlacer):
    """ONNX Runtime's CPU provider: every op on the fastest CPU (the framework's own CPU choice)."""

    name = "ort_cpu"

    def place(self, problem: Problem, budget: Budget, seed: int) -> PlacementResult:
        started = time.perf_counter()
        if not problem.cluster.device_indices("cpu"):
            raise NotApplicable(f"cluster {problem.cluster.name!r} has no CPU device")
        cpu = problem.cluster.fastest("cpu")
        placement = np.full(problem.workload.num_ops, cpu, dtype=np.int64)
        return PlacementResult.from_search(placement, problem, started, device=problem.cluster.devices[cpu].name)


class OrtGPU(BasePlacer):
    """ONNX Runtime's CUDA provider with CPU fallback: where ONNX Runtime runs each op (the framework's own GPU choice)."""

    name = "ort_gpu"
    defaults = {"assignment": "auto"}  # "auto": measured where CUDA and a model to run are, else static; or force one
    ASSIGNMENTS = ("auto", "measured", "static")

    def __init__(self, **params: Any):
        super().__init__(**params)
        if self.params["assignment"] not in self.ASSIGNMENTS:  # at construction: a spec fails before it runs
            raise PlacebenchError(f"placer 'ort_gpu': parameter assignment={self.params['assignment']!r}: expected "
                                  f"one of {', '.join(self.ASSIGNMENTS)}")

    def place(self, problem: Problem, budget: Budget, seed: int) -> PlacementResult:
        started = time.perf_counter()
        cluster, graph = problem.cluster, problem.workload
        if not cluster.device_indices("gpu"):
            raise NotApplicable(f"cluster {cluster.name!r} has no GPU device")
        if not cluster.device_indices("cpu"):
            raise NotApplicable(f"cluster {cluster.name!r} has no CPU device for ONNX Runtime's CPU fallback")
        gpu, cpu = cluster.fastest("gpu"), cluster.fastest("cpu")
        mode = self.params["assignment"]
        if mode == "auto":
            from suite.backends.workload import has_model

            training = graph.metadata.get("mode") == "training"  # ONNX Runtime runs inference graphs only
            mode = "measured" if _cuda_ort_available() and not training and has_model(graph) else "static"
        placement = np.full(graph.num_ops, gpu, dtype=np.int64)
        if mode == "static":
            no_kernel = np.array([bool(op.allowed_kinds) and "gpu" not in op.allowed_kinds for op in graph.ops])
            host = np.array([op.kind == "input" for op in graph.ops])
            placement[no_kernel | host] = cpu  # host inputs, and ops without a CUDA kernel: the CPU fallback
            for members in graph.groups.values():  # a group with such an op falls back as a whole
                if no_kernel[members].any():
                    placement[members] = cpu
        else:
            from suite.backends.ort_exec import OrtModel, native_assignment
            from suite.backends.workload import for_graph

            where = native_assignment(OrtModel(for_graph(graph)))
            for i, op in enumerate(graph.ops):
                if op.kind == "input" or where.get(i) == "cpu":
                    placement[i] = cpu
        gpu_only = np.array([bool(op.allowed_kinds) and "cpu" not in op.allowed_kinds for op in graph.ops], dtype=bool)
        placement[gpu_only] = gpu  # an op that forbids the CPU stays on the GPU, an input too, with its group
        for members in graph.groups.values():
            if gpu_only[members].any():
                placement[members] = gpu
        placement = _colocate(graph, placement)
        on_cpu = int((placement == cpu).sum())
        return PlacementResult.from_search(placement, problem, started, assignment=mode, ops_on_cpu=on_cpu,
                                           gpu=cluster.devices[gpu].name, cpu=cluster.devices[cpu].name)


def _cuda_ort_available() -> bool:
    try:
        import onnxruntime as ort
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available() and "CUDAExecutionProvider" in ort.get_available_providers()
