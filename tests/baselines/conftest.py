"""Fixtures of the baseline tests: hand-built graphs following the zoo's scope conventions, random DAGs,
small clusters with round numbers."""

from __future__ import annotations

import numpy as np
import pytest

from suite import registry
from suite.cluster import Cluster, Device, Link
from suite.graph import Op, OpGraph
from suite.methodology import Budget
from suite.placer import Problem


def _make_cluster(
    num_gpus: int = 2,
    *,
    cpu: bool = True,
    gpu_flops: float = 1e10,
    cpu_flops: float = 1e9,
    gpu_memory_bytes: int = 2**30,
    bandwidth: float = 1e9,
    latency_s: float = 0.0,
    sharing: str = "pairs",
) -> Cluster:
    """A CPU (optional) and `num_gpus` GPUs on one link (`latency_s` per transfer, none by default; a
    crossbar unless `sharing` is "ports"); no overheads, memory time negligible."""
    devices = []
    if cpu:
        devices.append(Device("cpu:0", "cpu", peak_flops=cpu_flops, mem_bandwidth=1e30, memory_bytes=2**40, op_overhead_s=0.0))
    devices += [
        Device(f"gpu:{k}", "gpu", peak_flops=gpu_flops, mem_bandwidth=1e30, memory_bytes=gpu_memory_bytes, op_overhead_s=0.0)
        for k in range(num_gpus)
    ]
    links = (Link(tuple(d.name for d in devices), bandwidth=bandwidth, latency_s=latency_s,
                  sharing=sharing),) if len(devices) > 1 else ()
    return Cluster(name=f"test_{'cpu_' if cpu else ''}{num_gpus}gpu", devices=tuple(devices), links=links)


def _layered_training_graph(model: str, scopes: list[str], *, flops: float = 1e9, out_bytes: int = 1000,
                           param_bytes: int = 0, metadata: dict | None = None) -> OpGraph:
    """A chain of forward ops (one per scope), their backward chain and one update op each.

    As in zoo training graphs, forward op f, its backward op and its update op form the colocation group f
    and share f's scope.
    """
    ops, edges = [], []
    names = [f"fwd{k}" for k in range(len(scopes))]
    for k, s in enumerate(scopes):
        ops.append(Op(names[k], "matmul", flops=flops, output_bytes=out_bytes, param_bytes=param_bytes,
                      phase="forward", group=names[k], scope=s))
        ops.append(Op(f"bwd{k}", "matmul", flops=2 * flops, output_bytes=out_bytes, phase="backward",
                      group=names[k], scope=s))
        ops.append(Op(f"upd{k}", "sgd", flops=flops / 10, output_bytes=8, phase="update", group=names[k], scope=s))
        edges.append((f"bwd{k}", f"upd{k}"))
        edges.append((names[k], f"bwd{k}"))
        if k:
            edges.append((names[k - 1], names[k]))
            edges.append((f"bwd{k}", f"bwd{k - 1}"))
    meta = {"model": model, "mode": "training", **(metadata or {})}
    return OpGraph.build(f"{model}-test", ops, edges, meta)


def _random_dag(n: int, seed: int, *, max_preds: int = 3, groups: bool = False, kinds: bool = False) -> OpGraph:
    """A random DAG: op i reads 0..max_preds random earlier ops; FLOPs and bytes span two decades.

    groups: consecutive op pairs share a colocation group. kinds: about one op in eight is CPU-only and
    one in eight GPU-only (kept consistent within a group).
    """
    rng = np.random.default_rng(seed)
    ops = []
    for i in range(n):
        allowed: tuple[str, ...] = ()
        if kinds:
            r = rng.random()
            allowed = ("cpu",) if r < 0.125 else ("gpu",) if r < 0.25 else ()
        group = f"g{i // 2}" if groups else None
        if groups and i % 2 == 1:
            allowed = ops[-1].allowed_kinds
        ops.append(Op(f"o{i}", "op", flops=float(rng.uniform(1e8, 1e10)), bytes_read=int(rng.integers(1e5, 1e8)),
                      output_bytes=int(rng.integers(1e5, 1e8)), param_bytes=int(rng.integers(0, 1e6)),
                      group=group, allowed_kinds=allowed))
    edges = set()
    for i in range(1, n):
        k = int(rng.integers(0, max_preds + 1))
        for j in rng.choice(i, size=min(i, k), replace=False):
            edges.add((f"o{int(j)}", f"o{i}"))
    return OpGraph.build(f"random-{n}-{seed}", ops, sorted(edges), {"model": "random"})


@pytest.fixture
def cluster2() -> Cluster:
    """cpu:0 (1e9 FLOP/s) + gpu:0, gpu:1 (1e10 FLOP/s), 1 GB/s crossbar."""
    return _make_cluster(2)


@pytest.fixture
def haswell_2k80() -> Cluster:
    return registry.load_cluster("haswell_2k80")


@pytest.fixture
def haswell_4k80() -> Cluster:
    return registry.load_cluster("haswell_4k80")


def _problem(graph: OpGraph, cluster: Cluster, max_evaluations: int = 1000, max_seconds: float = 300.0) -> Problem:
    return Problem.make(graph, cluster, Budget(max_evaluations=max_evaluations, max_seconds=max_seconds))


@pytest.fixture
def make_cluster():
    return _make_cluster


@pytest.fixture
def layered_graph():
    return _layered_training_graph


@pytest.fixture
def random_graph():
    return _random_dag


@pytest.fixture
def make_problem():
    """make_problem(graph, cluster, max_evaluations=1000, max_seconds=300.0) -> Problem (simulator backend)."""
    return _problem
