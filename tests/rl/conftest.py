"""Small workloads and budgeted problems for the RL tests (reference simulator: exact and JIT-free)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from rl.reward import RewardEvaluator
from suite import Op, OpGraph, load_cluster
from suite.cluster import Cluster, Device, Link
from suite.evaluator import Evaluator, SimulatorBackend
from suite.methodology import Budget
from suite.placer import Problem
from suite.simulator import simulate

GFLOP = 1e9


def branchy_graph() -> OpGraph:
    """8 ops: an input feeding three branches of uneven work that join; a placement puzzle for 3 devices."""
    ops = [
        Op("in", "input", flops=1e6, output_bytes=4_000_000),
        Op("a1", "matmul", flops=200 * GFLOP, output_bytes=40_000_000, output_shape=(1000, 10000)),
        Op("a2", "matmul", flops=150 * GFLOP, output_bytes=4_000_000, output_shape=(1000, 1000)),
        Op("b1", "conv", flops=180 * GFLOP, output_bytes=40_000_000, output_shape=(10, 100, 100, 100)),
        Op("b2", "conv", flops=120 * GFLOP, output_bytes=4_000_000),
        Op("c1", "matmul", flops=60 * GFLOP, output_bytes=4_000_000),
        Op("join", "add", flops=1e8, output_bytes=4_000_000),
        Op("out", "loss", flops=1e7, output_bytes=4),
    ]
    edges = [("in", "a1"), ("a1", "a2"), ("in", "b1"), ("b1", "b2"), ("in", "c1"), ("a2", "join"),
             ("b2", "join"), ("c1", "join"), ("join", "out")]
    return OpGraph.build("branchy", ops, edges)


def training_graph() -> OpGraph:
    """A 2-layer chain in training mode: forward, backward and update ops in colocation groups; a CPU-only
    input op and a GPU-only op."""
    ops = [Op("data", "input", flops=1e6, output_bytes=1_000_000, allowed_kinds=("cpu",), scope="data")]
    edges = []
    prev = "data"
    for k in range(2):
        f = f"l{k}.fwd"
        ops.append(Op(f, "matmul", flops=50 * GFLOP, output_bytes=2_000_000, param_bytes=8_000_000,
                      group=f, scope=f"layer.{k}", output_shape=(500, 1000)))
        edges.append((prev, f))
        prev = f
    ops.append(Op("loss", "loss", flops=1e7, output_bytes=4, allowed_kinds=("gpu",), scope="head"))
    edges.append((prev, "loss"))
    grad = "loss"
    for k in (1, 0):
        f = f"l{k}.fwd"
        b, u = f"l{k}.bwd", f"l{k}.upd"
        ops.append(Op(b, "matmul_grad", flops=100 * GFLOP, output_bytes=2_000_000, phase="backward", group=f,
                      scope=f"layer.{k}"))
        ops.append(Op(u, "apply_adam", flops=1e8, output_bytes=0, phase="update", group=f, scope=f"layer.{k}"))
        edges += [(grad, b), (f, b), (b, u)]
        grad = b
    return OpGraph.build("train2", ops, edges)


def reference_problem(graph: OpGraph, cluster: Cluster, max_evaluations: int = 200, max_seconds: float = 120.0):
    budget = Budget(max_evaluations, max_seconds)
    ev = Evaluator(graph, cluster, budget, backend=SimulatorBackend(graph, cluster, engine="reference"))
    return Problem(graph, cluster, ev), budget


def two_gpu_cluster() -> Cluster:
    devs = tuple(Device(f"gpu:{i}", "gpu", 1e12, 1e11, 10**10, 1e-5) for i in range(2))
    return Cluster("two_gpus", devs, (Link(("gpu:0", "gpu:1"), 1e10, 1e-5),))


def brute_force_optimum_s(graph: OpGraph, cluster: Cluster) -> float:
    """The best step time over every placement (reference simulator)."""
    everything = itertools.product(range(cluster.num_devices), repeat=graph.num_ops)
    return min(simulate(graph, cluster, p, engine="reference").step_time_s for p in everything)


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Searches built in a test (HSDAGSearch, PlacetoSearch, ...) run on one torch thread, as the placers do
    (`threads` = 1 by default); torch's default of one per core made them 10 to 50 times slower on a busy
    machine, without testing anything more."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def brute_force_optimum():
    return brute_force_optimum_s


@pytest.fixture
def make_problem():
    return reference_problem


@pytest.fixture
def two_gpus() -> Cluster:
    return two_gpu_cluster()


@pytest.fixture
def branchy() -> OpGraph:
    return branchy_graph()


@pytest.fixture
def train2() -> OpGraph:
    return training_graph()


@pytest.fixture
def k80x2() -> Cluster:
    return load_cluster("haswell_2k80")


@pytest.fixture
def evaluated_rows(monkeypatch) -> list[np.ndarray]:
    """Every group placement the learned placers evaluate (`RewardEvaluator`: samples, a start placement, a
    greedy decode), one row each, in order."""
    rows: list[np.ndarray] = []
    inner = RewardEvaluator._evaluate

    def spy(self, gd):
        rows.extend(np.atleast_2d(np.array(gd, copy=True)))
        return inner(self, gd)

    monkeypatch.setattr(RewardEvaluator, "_evaluate", spy)
    return rows
