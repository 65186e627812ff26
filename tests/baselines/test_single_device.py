"""single_cpu / single_gpu: every op on the fastest device of the kind; `skipped` where the kind is absent."""

from __future__ import annotations

import pytest

from baselines.single_device import SingleCPU, SingleGPU
from suite.graph import Op, OpGraph
from suite.methodology import Budget
from suite.placer import NotApplicable


def chain() -> OpGraph:
    ops = [Op(f"o{i}", "matmul", flops=1e6, output_bytes=8) for i in range(3)]
    return OpGraph.build("chain3", ops, [("o0", "o1"), ("o1", "o2")])


def test_every_op_on_the_fastest_device_of_the_kind(make_problem, make_cluster):
    c = make_cluster(3)  # cpu:0, gpu:0..2, all GPUs equally fast: the first wins
    assert SingleGPU().place(make_problem(chain(), c), Budget(), 0).placement.tolist() == [1, 1, 1]
    assert SingleCPU().place(make_problem(chain(), c), Budget(), 0).placement.tolist() == [0, 0, 0]


def test_a_cluster_without_the_kind_is_not_applicable(make_problem, make_cluster):
    with pytest.raises(NotApplicable, match="has no GPU device"):
        SingleGPU().place(make_problem(chain(), make_cluster(0)), Budget(), 0)
    with pytest.raises(NotApplicable, match="has no CPU device"):
        SingleCPU().place(make_problem(chain(), make_cluster(2, cpu=False)), Budget(), 0)


def test_the_fastest_device_by_effective_flops_not_the_first(make_problem):
    """cpu:1 doubles cpu:0; gpu:0 has the higher peak but 25% efficiency (5e9 effective against gpu:1's 1e10)."""
    from suite.cluster import Cluster, Device, Link

    def dev(name, kind, flops, eff=1.0):
        return Device(name, kind, peak_flops=flops, compute_efficiency=eff, mem_bandwidth=1e30, memory_bytes=2**40,
                      op_overhead_s=0.0)

    devs = (dev("cpu:0", "cpu", 1e9), dev("cpu:1", "cpu", 2e9), dev("gpu:0", "gpu", 2e10, 0.25), dev("gpu:1", "gpu", 1e10))
    c = Cluster("mixed", devs, (Link(tuple(d.name for d in devs), bandwidth=1e9, latency_s=0.0),))
    gpu = SingleGPU().place(make_problem(chain(), c), Budget(), 0)
    assert gpu.placement.tolist() == [3, 3, 3] and gpu.info["device"] == "gpu:1"
    assert SingleCPU().place(make_problem(chain(), c), Budget(), 0).placement.tolist() == [1, 1, 1]
