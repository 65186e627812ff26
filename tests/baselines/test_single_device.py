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
