"""ONNX Runtime's own placements (static rule): ort_cpu on the fastest CPU; ort_gpu with the inputs on the
fastest CPU, every other op on the fastest GPU, colocation groups on their forward op's device."""

from __future__ import annotations

import pytest

from baselines import ort_native
from baselines.ort_native import OrtCPU, OrtGPU
from suite.cluster import Cluster, Device, Link
from suite.errors import PlacebenchError
from suite.graph import Op, OpGraph
from suite.methodology import Budget
from suite.placement import validate
from suite.placer import NotApplicable


def cluster(gpu_flops: list[float], cpu_flops: list[float]) -> Cluster:
    devs = [Device(f"cpu:{k}", "cpu", peak_flops=f, mem_bandwidth=1e30, memory_bytes=2**40, op_overhead_s=0.0)
            for k, f in enumerate(cpu_flops)]
    devs += [Device(f"gpu:{k}", "gpu", peak_flops=f, mem_bandwidth=1e30, memory_bytes=2**40, op_overhead_s=0.0)
             for k, f in enumerate(gpu_flops)]
    links = (Link(tuple(d.name for d in devs), bandwidth=1e9, latency_s=0.0),) if len(devs) > 1 else ()
    return Cluster("ort", tuple(devs), links)


def graph(mode: str = "inference") -> OpGraph:
    """u (an update op, listed first) and x (an input) share group g; w with its backward and update ops."""
    ops = [Op("u", "apply_momentum", flops=1.0, output_bytes=0, phase="update", group="g"),
           Op("x", "input", output_bytes=8, group="g"),
           Op("tok", "input", output_bytes=8),
           Op("w", "matmul", flops=1e6, output_bytes=8, group="w"),
           Op("w/grad", "matmul_grad", flops=1e6, output_bytes=8, phase="backward", group="w"),
           Op("w/update", "apply_momentum", flops=1.0, output_bytes=0, phase="update", group="w")]
    edges = [("x", "w"), ("tok", "w"), ("w", "w/grad"), ("w/grad", "w/update")]
    return OpGraph.build("ort-test", ops, edges, {"mode": mode})


def test_ort_cpu_puts_everything_on_the_fastest_cpu(make_problem):
    c = cluster([1e10], [1e9, 4e9])  # cpu:0, cpu:1 (fastest), gpu:0
    r = OrtCPU().place(make_problem(graph(), c), Budget(), 0)
    assert set(r.placement.tolist()) == {1} and r.info["device"] == "cpu:1" and r.evaluations == 0
    with pytest.raises(NotApplicable, match="no CPU"):
        OrtCPU().place(make_problem(graph(), cluster([1e10], [])), Budget(), 0)


def test_ort_gpu_static_rule_by_hand(make_problem):
    c = cluster([1e10, 3e10], [4e9, 1e9])  # cpu:0 (fastest CPU), cpu:1, gpu:0, gpu:1 (fastest GPU) = device 3
    g = graph()
    r = OrtGPU(assignment="static").place(make_problem(g, c), Budget(), 0)
    got = {op.name: int(r.placement[i]) for i, op in enumerate(g.ops)}
    # inputs on the host; u follows its group's forward op x (not the group's first member); w's group on the GPU
    assert got == {"u": 0, "x": 0, "tok": 0, "w": 3, "w/grad": 3, "w/update": 3}
    assert r.info == {"assignment": "static", "ops_on_cpu": 3, "gpu": "gpu:1", "cpu": "cpu:0"}
    validate(r.placement, g, c)


def test_ort_gpu_group_follows_its_forward_op_wherever_it_is_listed(make_problem):
    """The forward op x sits between two update ops of its group: the group goes to x's device (the host, x
    being an input), not to its first or last member's (the GPU)."""
    c = cluster([1e10], [1e9])  # cpu:0, gpu:0
    ops = [Op("u", "apply_momentum", flops=1.0, output_bytes=0, phase="update", group="g"),
           Op("x", "input", output_bytes=8, group="g"),
           Op("v", "apply_momentum", flops=1.0, output_bytes=0, phase="update", group="g"),
           Op("w", "matmul", flops=1e6, output_bytes=8)]
    g = OpGraph.build("forward-in-the-middle", ops, [("x", "w")], {"mode": "inference"})
    r = OrtGPU(assignment="static").place(make_problem(g, c), Budget(), 0)
    assert r.placement.tolist() == [0, 0, 0, 1]
    validate(r.placement, g, c)


def test_ort_gpu_training_graph_uses_the_static_rule_even_with_cuda(make_problem, monkeypatch):
    monkeypatch.setattr(ort_native, "_cuda_ort_available", lambda: True)
    r = OrtGPU().place(make_problem(graph("training"), cluster([1e10], [1e9])), Budget(), 0)
    assert r.info["assignment"] == "static" and r.info["ops_on_cpu"] == 3


def test_ort_gpu_not_applicable_and_bad_assignment(make_problem):
    from suite.errors import PlacebenchError
    from suite.placer import make_placer

    with pytest.raises(NotApplicable, match="no GPU"):
        OrtGPU().place(make_problem(graph(), cluster([], [1e9])), Budget(), 0)
    with pytest.raises(NotApplicable, match="no CPU"):
        OrtGPU().place(make_problem(graph(), cluster([1e10], [])), Budget(), 0)
    # at construction, so a spec with a typo fails before it runs
    with pytest.raises(PlacebenchError, match=r"ort_gpu': parameter assignment='statc': expected one of auto, measured"):
        make_placer("ort_gpu", assignment="statc")
    assert make_placer("ort_gpu", assignment="static").params == {"assignment": "static"}


def test_ort_gpu_static_rule_falls_back_to_the_cpu_for_ops_without_a_gpu_kernel(make_problem):
    c = cluster([1e10], [1e9])  # cpu:0, gpu:0
    ops = [Op("x", "input", output_bytes=8), Op("a", "matmul", flops=1e6, output_bytes=8),
           Op("b", "nms", flops=1e3, output_bytes=8, allowed_kinds=("cpu",)),
           Op("c", "matmul", flops=1e6, output_bytes=8, group="g"),
           Op("d", "sort", flops=1e3, output_bytes=8, group="g", allowed_kinds=("cpu",))]
    g = OpGraph.build("fallback", ops, [("x", "a"), ("a", "b"), ("b", "c"), ("c", "d")], {"mode": "inference"})
    r = OrtGPU(assignment="static").place(make_problem(g, c), Budget(), 0)
    assert r.placement.tolist() == [0, 1, 0, 0, 0]  # b alone, and c with its CPU-only group member d
    validate(r.placement, g, c)


@pytest.mark.parametrize("assignment", ["static", "measured"])
def test_ort_gpu_keeps_ops_that_forbid_the_cpu_on_the_gpu(make_problem, monkeypatch, assignment):
    """A GPU-only input, and an input grouped with a GPU-only op, stay on the GPU with their group (they went
    to the host: an invalid placement); likewise an op the session ran on the CPU that allows only GPUs."""
    c = cluster([1e10], [1e9])  # cpu:0, gpu:0
    ops = [Op("x", "input", output_bytes=8, group="g"),
           Op("a", "matmul", flops=1e6, output_bytes=8, group="g", allowed_kinds=("gpu",)),
           Op("y", "input", output_bytes=8, allowed_kinds=("gpu",)), Op("z", "input", output_bytes=8),
           Op("b", "matmul", flops=1e6, output_bytes=8, allowed_kinds=("gpu",))]
    g = OpGraph.build("gpu_only", ops, [("x", "a"), ("y", "b"), ("z", "b")], {"mode": "inference"})
    monkeypatch.setattr("suite.backends.ort_exec.native_assignment", lambda model: {g.index["b"]: "cpu"})
    monkeypatch.setattr("suite.backends.ort_exec.OrtModel", lambda workload: None)
    monkeypatch.setattr("suite.backends.workload.for_graph", lambda graph: None)
    r = OrtGPU(assignment=assignment).place(make_problem(g, c), Budget(), 0)
    assert {op.name: int(r.placement[i]) for i, op in enumerate(g.ops)} == {"x": 1, "a": 1, "y": 1, "z": 0, "b": 1}
    validate(r.placement, g, c)


def test_ort_gpu_auto_uses_the_static_rule_for_a_graph_without_a_model(make_problem, monkeypatch):
    """With CUDA, "auto" reads a session's assignment only where there is a model to run: a graph file that is no
    zoo workload gets the static rule (it raised 'has no model in the zoo to run for real', an error row)."""
    monkeypatch.setattr(ort_native, "_cuda_ort_available", lambda: True)
    g = graph()
    r = OrtGPU().place(make_problem(g, cluster([1e10], [1e9])), Budget(), 0)
    assert r.info["assignment"] == "static"
    assert {op.name: int(r.placement[i]) for i, op in enumerate(g.ops)} == {
        "u": 0, "x": 0, "tok": 0, "w": 1, "w/grad": 1, "w/update": 1}
    with pytest.raises(PlacebenchError, match="has no model in the zoo"):
        OrtGPU(assignment="measured").place(make_problem(g, cluster([1e10], [1e9])), Budget(), 0)
