"""PyTorch backend: split execution equals the eager model (inference and training, every zoo family in its
small shape), copies at device boundaries counted exactly, shared weights, OOM as a status, the timing
protocol, device maps. CPU only: multi-device placements use logical CPU devices; CUDA tests skip without a GPU."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
import time

import numpy as np
import pytest
import torch
import torch.nn as nn

from suite import zoo
from suite.backends.devices import DeviceMap, local_cluster
from suite.backends.torch_exec import ExecGraph, TorchBackend, TorchExecutor
from suite.backends.workload import (
    SMALL_SHAPES,
    for_graph,
    from_module,
    parse_variant_name,
    real_workload,
    small_workload,
)
from suite.errors import ClusterError, PlacebenchError
from suite.evaluator import Evaluator
from suite.fidelity import random_placement, random_split_placement
from suite.methodology import Budget, Timing

FAST = Timing(warmup_steps=1, measured_steps=3)
FAMILY_WORKLOADS = ["resnet50-b32", "inception_v3-b32", "bert_base-12x768-s128-b8", "rnnlm-2x2048-b64",
                    "nmt-2x1024-b64"]
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(scope="module")
def three_cpus():
    return local_cluster(3, gpus=False)  # three logical CPUs, and nothing else on a GPU host


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


def _placement(graph, **devices) -> np.ndarray:
    return np.array([devices[op.name.replace("/", "_")] for op in graph.ops], dtype=np.int64)


def test_copies_at_boundaries_are_counted_exactly(three_cpus):
    _, dmap = three_cpus
    torch.manual_seed(0)
    rw = from_module(Tiny(), (torch.randn(2, 4),), name="tiny")
    assert [op.name for op in rw.graph.ops] == ["x", "fc1", "act", "fc2"]
    ex = TorchExecutor(rw, dmap)
    ex.apply(_placement(rw.graph, x=0, fc1=1, act=1, fc2=0))
    with torch.no_grad():
        out = ex.forward()
    # x (2x4 floats) goes to cpu:1, act's output (2x8 floats) back to cpu:0
    assert (ex.copies.count, ex.copies.bytes) == (2, 2 * 4 * 4 + 2 * 8 * 4)
    torch.testing.assert_close(out, rw.eager(), rtol=0, atol=0)
    ex.copies.count = ex.copies.bytes = 0
    ex.apply(np.zeros(4, dtype=np.int64))
    with torch.no_grad():
        ex.forward()
    assert ex.copies.count == 0
    for bad, what in [(np.full(4, 0.5), "integers"), (np.zeros(3, np.int64), "shape"), (np.full(4, 3), "outside 0..2")]:
        with pytest.raises(PlacebenchError, match=what):  # 0.5 ran as device 0
            ex.apply(bad)


def test_shared_weights_live_on_the_variable_device_and_are_copied_once_per_device(three_cpus, shared_linear):
    _, dmap = three_cpus
    torch.manual_seed(0)
    rw = from_module(shared_linear(), (torch.randn(2, 4),), name="shared", mode="training")
    eg = ExecGraph(rw)
    g = rw.graph
    assert g.ops[eg.param_home_op["fc.weight"]].name == "fc/variable"
    assert g.ops[eg.param_home_op["out.weight"]].name == "out"
    # variable (and its acc/update ops) on cpu:0, both uses of fc and the relu on cpu:1: the weights go
    # to cpu:1 once
    p = np.zeros(g.num_ops, dtype=np.int64)
    for grp in ("fc/0", "act", "fc/1"):
        p[g.groups[grp]] = 1
    ex = TorchExecutor(rw, dmap)
    ex.apply(p)
    ex.copies.count = ex.copies.bytes = 0
    ex.forward()
    weights = 4 * 4 * 4 + 4 * 4  # fc.weight and fc.bias
    x_bytes = 2 * 4 * 4
    fc1_out = 2 * 4 * 4  # fc/1 on cpu:1 -> out on cpu:0
    assert (ex.copies.count, ex.copies.bytes) == (4, weights + x_bytes + fc1_out)


def _two_steps_as_eager(rw, dmap, placement: np.ndarray, concurrent: bool | str = "auto") -> nn.Module:
    """Two training steps of `rw` split by `placement` give eager PyTorch's loss and parameters (SGD with
    momentum over the trainable parameters); the eager module after them."""
    eager = rw.fresh_copy()
    ex = TorchExecutor(rw, dmap, concurrent=concurrent)
    ex.apply(placement)
    opt = torch.optim.SGD([q for q in eager.module.parameters() if q.requires_grad], lr=1e-3, momentum=0.9)
    for _ in range(2):
        loss = ex.step()
        opt.zero_grad()
        ref = eager.module(*eager.inputs, **eager.kwargs)
        ref.backward()
        opt.step()
    ex.close()
    torch.testing.assert_close(loss, ref.detach())
    for name, param in eager.module.named_parameters():
        torch.testing.assert_close(ex.eg.params[name].detach(), param.detach())
    return eager.module


def test_training_step_with_shared_weights_equals_eager(three_cpus, shared_linear):
    _, dmap = three_cpus
    torch.manual_seed(0)
    rw = from_module(shared_linear(), (torch.randn(2, 4),), name="shared", mode="training")
    g = rw.graph
    p = np.zeros(g.num_ops, dtype=np.int64)
    p[g.groups["fc/1"]] = 1
    p[g.groups["act"]] = 2
    _two_steps_as_eager(rw, dmap, p)


def test_training_step_with_frozen_parameters_equals_eager(three_cpus):
    """A frozen layer in the middle and a frozen weight beside a trainable bias: split over three devices,
    the step computes eager PyTorch's loss and updates, and the frozen parameters do not move."""

    class PartlyFrozen(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b, self.c = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 1)
            self.b.requires_grad_(False)
            self.c.weight.requires_grad_(False)

        def forward(self, x):
            return self.c(torch.relu(self.b(torch.relu(self.a(x))))).sum()

    _, dmap = three_cpus
    torch.manual_seed(0)
    rw = from_module(PartlyFrozen(), (torch.randn(2, 4),), name="frozen", mode="training")
    before = {n: q.detach().clone() for n, q in rw.module.named_parameters()}
    g = rw.graph
    assert "b/update" not in g.index and "b/grad" in g.index and g.metadata["frozen_params"] == 24
    p = np.arange(g.num_ops, dtype=np.int64) % 3
    p = p[[g.index[g.ops[i].group] if g.ops[i].group else i for i in range(g.num_ops)]]  # groups kept together
    assert len(set(p.tolist())) == 3
    after = _two_steps_as_eager(rw, dmap, p)
    for name, param in after.named_parameters():
        assert torch.equal(param.detach(), before[name]) == (name in ("b.weight", "b.bias", "c.weight")), name


class _FrozenBackbone(nn.Module):
    """A backbone run under torch.no_grad() (its weights require grad all the same), a head trained on its
    features, and a trained branch that reads the activation the frozen layer reads."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.backbone, self.head, self.side = (nn.Linear(4, 4) for _ in range(4))

    def forward(self, x):
        h = self.stem(x)
        with torch.no_grad():
            feats = torch.relu(self.backbone(h))
        return (self.head(feats) * self.side(h)).square().mean()


@pytest.mark.parametrize("concurrent", [False, True])
@pytest.mark.parametrize("split", [False, True])
def test_training_step_with_a_forward_under_no_grad_equals_eager(three_cpus, concurrent, split):
    """What forward computes under torch.no_grad() gets no gradient and no update (it did: the backend ran
    every node with gradients on, so the backbone trained and the second step's loss differed from eager's).
    Split: the frozen layer copies stem's output to cpu:1 first, and side reuses that copy there, with its
    gradient (stem still trains)."""
    _, dmap = three_cpus
    torch.manual_seed(0)
    rw = from_module(_FrozenBackbone(), (torch.randn(2, 4),), name="frozen_backbone", mode="training")
    before = {n: q.detach().clone() for n, q in rw.module.named_parameters()}
    g = rw.graph
    assert "backbone/update" not in g.index and "stem/update" in g.index
    p = np.zeros(g.num_ops, dtype=np.int64)
    if split:
        for op in ("backbone", "relu", "side"):
            p[g.groups.get(op, [g.index[op]])] = 1
    after = _two_steps_as_eager(rw, dmap, p, concurrent)
    for name, param in after.named_parameters():
        assert torch.equal(param.detach(), before[name]) == name.startswith("backbone."), name


def test_frozen_and_trained_shared_weights_live_on_their_own_variable_ops_devices(three_cpus):
    """Capture splits a layer called twice, with a frozen bias, into a trained and a frozen variable op:
    each parameter lives where its own variable op is placed."""

    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(6, 6)

        def forward(self, x):
            return self.fc(torch.relu(self.fc(x))).sum()

    _, dmap = three_cpus
    model = Twice()
    model.fc.bias.requires_grad_(False)
    rw = from_module(model, (torch.randn(3, 6),), name="twice", mode="training")
    g = rw.graph
    p = np.zeros(g.num_ops, dtype=np.int64)
    p[g.groups["fc/variable"]] = 1  # the weight, its accumulation and update ops
    p[g.index["fc/variable2"]] = 2  # the bias
    ex = TorchExecutor(rw, dmap)
    ex.apply(p)
    assert ex.param_dev == {"fc.weight": 1, "fc.bias": 2}
    _two_steps_as_eager(rw, dmap, p)


@pytest.mark.parametrize("name", FAMILY_WORKLOADS)
def test_split_inference_equals_eager_for_every_family(name, three_cpus):
    cluster, dmap = three_cpus
    rw = small_workload(name, mode="inference")
    ref = rw.eager()
    ex = TorchExecutor(rw, dmap)
    rng = np.random.default_rng(1)
    for p in (random_placement(rw.graph, 3, rng), random_split_placement(rw.graph, 3, rng)):
        ex.apply(p)
        ex.copies.count = 0
        with torch.no_grad():
            out = ex.forward()
        assert ex.copies.count > 0
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", FAMILY_WORKLOADS)
def test_split_training_step_equals_eager_for_every_family(name, three_cpus):
    cluster, dmap = three_cpus
    rw = small_workload(name, mode="training")
    eager = rw.fresh_copy()
    p = random_placement(rw.graph, 3, np.random.default_rng(2))
    ex = TorchExecutor(rw, dmap)
    ex.apply(p)
    loss = ex.step()
    opt = torch.optim.SGD(eager.module.parameters(), lr=1e-3, momentum=0.9)
    ref = eager.module(*eager.inputs)
    ref.backward()
    opt.step()
    torch.testing.assert_close(loss, ref.detach(), rtol=1e-5, atol=1e-6)
    for pname, param in eager.module.named_parameters():
        torch.testing.assert_close(ex.eg.params[pname].detach(), param.detach(), rtol=1e-4, atol=1e-5)


def test_concurrent_and_sequential_execution_agree(three_cpus):
    _, dmap = three_cpus
    rw = small_workload("nmt-2x1024-b64", mode="inference")
    p = random_placement(rw.graph, 3, np.random.default_rng(3))
    outs = []
    for concurrent in (True, False, "auto"):
        ex = TorchExecutor(rw, dmap, concurrent=concurrent)
        ex.apply(p)
        with torch.no_grad():
            outs.append(ex.forward())
        ex.close()
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)
    torch.testing.assert_close(outs[0], outs[2], rtol=0, atol=0)


class _SlowShared(nn.Module):
    """One leaf op (it has a capture rule) that holds each call open and records, for calls on this very
    module object, whether its weight was its own parameter at the start and at the end of the call."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 4))
        self.seen: list[tuple[bool, bool]] = []

    def capture_cost(self, inputs, outputs, training):
        from suite.capture.flops import Cost

        return Cost("slow_linear", 2 * 4 * 4 * inputs[0].shape[0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        time.sleep(0.1)  # the other lane calls the same module meanwhile
        own = self._parameters["weight"]
        self.seen.append((w is own, self.weight is own))
        return x @ w


class _TwoCalls(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.f = _SlowShared()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.f(a) + self.f(b)


def test_concurrent_lanes_never_see_another_lanes_weight_copies(three_cpus):
    """A module shared by ops on two devices runs at the same time in two lanes: the lane away from the
    weights calls it with copies, which must never show through to the other lane's call (on CPU + GPU
    they did: "mat1 is on cuda:0, different from other tensors on cpu")."""
    _, dmap = three_cpus
    torch.manual_seed(0)
    module = _TwoCalls()
    rw = from_module(module, (torch.randn(2, 4), torch.randn(2, 4)), name="two_calls", mode="inference")
    g = rw.graph
    p = np.zeros(g.num_ops, dtype=np.int64)
    p[g.index["b"]] = 1
    p[g.index["f/1"]] = 1  # f/variable and f/0 stay on cpu:0: f/1 gets a copy of the weight
    ex = TorchExecutor(rw, dmap, concurrent=True)
    ex.apply(p)
    shared = ex.eg.gm.get_submodule("f")
    shared.seen.clear()
    with torch.no_grad():
        out = ex.forward()
    ex.close()
    assert shared.seen == [(True, True)]  # one direct call (f/0), its weight untouched throughout
    torch.testing.assert_close(out, rw.eager(), rtol=0, atol=0)


class _TwoLinear(nn.Module):
    """fc1 and fc2, for the in-place models below."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 4)
        self.fc2 = nn.Linear(4, 4)


class _InPlace(_TwoLinear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc1(x)
        early = y + 1  # reads y before it is overwritten (and keeps nothing of it for the backward pass)
        y.mul_(2)
        y.add_(1)
        return (self.fc2(y) * early).sum()  # reads y after both in-place calls


def _assert_step_as_eager(model: type[nn.Module], dmap, devices: dict[str, int], concurrent: bool,
                          mode: str = "inference", runs: int = 1) -> None:
    """`model` on a 2 x 4 input with the ops named in `devices` on those devices (in training, their backward
    ops with them), the rest on 0: the forward output (inference), or the loss and the updated parameters
    (training) equal eager PyTorch's, in each of `runs` runs."""
    torch.manual_seed(0)
    rw = from_module(model(), (torch.randn(2, 4),), name=model.__name__.strip("_").lower(), mode=mode)
    g = rw.graph
    p = np.zeros(g.num_ops, dtype=np.int64)
    for op, d in devices.items():
        p[g.groups.get(op, [g.index[op]])] = d
    for _ in range(runs):
        eager = rw.fresh_copy()
        ex = TorchExecutor(rw, dmap, concurrent=concurrent)
        ex.apply(p)
        if mode == "inference":
            with torch.no_grad():
                out = ex.forward()
            ex.close()
            torch.testing.assert_close(out, eager.eager(), rtol=0, atol=0)
            continue
        loss = ex.step()
        ex.close()
        ref = eager.module(*eager.inputs)
        ref.backward()
        torch.optim.SGD(eager.module.parameters(), lr=1e-3, momentum=0.9).step()
        torch.testing.assert_close(loss, ref.detach(), rtol=1e-6, atol=1e-6)
        for pname, param in eager.module.named_parameters():
            torch.testing.assert_close(ex.eg.params[pname].detach(), param.detach(), rtol=1e-6, atol=1e-6)


IN_PLACE_PLACEMENTS = {
    "away": {"mul_": 1, "add_": 2, "add": 1},  # the in-place calls overwrite copies of y
    "home": {"mul_": 0, "add_": 0, "add": 2},  # they overwrite y itself, which another lane reads first
}


@pytest.mark.parametrize("concurrent", [False, True])
@pytest.mark.parametrize("mode", ["inference", "training"])
@pytest.mark.parametrize("where", sorted(IN_PLACE_PLACEMENTS))
def test_in_place_calls_are_seen_by_later_readers_only(three_cpus, concurrent, mode, where):
    """`y.mul_(2)` on another device than y's producer overwrites a copy there: the later readers of y read
    that copy (as capture's graph has them read the in-place op). On y's own device it overwrites y, and
    waits for the earlier readers on other lanes, which copy y when they run."""
    _, dmap = three_cpus
    _assert_step_as_eager(_InPlace, dmap, IN_PLACE_PLACEMENTS[where], concurrent, mode)


class _Chained(_TwoLinear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc1(x)
        y.mul_(2).add_(1)  # add_ overwrites mul_'s result, which is y
        return self.fc2(y)


@pytest.mark.parametrize("concurrent", [False, True])
def test_in_place_call_on_an_in_place_result_is_seen_by_the_readers_of_the_original(three_cpus, concurrent):
    """`y.mul_(2).add_(1)` with mul_ and add_ on two other devices: fc2, which reads y, reads add_'s copy."""
    _, dmap = three_cpus
    _assert_step_as_eager(_Chained, dmap, {"mul_": 1, "add_": 2}, concurrent)


class _InPlaceModule(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 4)
        self.act = nn.ReLU(inplace=True)  # overwrites a, which add reads afterwards
        self.fc2 = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.fc1(x)
        b = self.act(a)
        return (self.fc2(b) + a).sum()


@pytest.mark.parametrize("concurrent", [False, True])
@pytest.mark.parametrize("mode", ["inference", "training"])
@pytest.mark.parametrize("act, add", [(1, 0), (1, 2), (0, 1)])
def test_a_module_built_in_place_is_an_in_place_call(three_cpus, concurrent, mode, act, add):
    """`nn.ReLU(inplace=True)` overwrites its input as `torch.relu_` does: add, which reads that input after
    it, reads the module's result. It was taken for an out-of-place op, and placed away from fc1 it overwrote
    a copy: 108 of the 243 placements of this model computed unlike eager PyTorch."""
    _, dmap = three_cpus
    _assert_step_as_eager(_InPlaceModule, dmap, {"act": act, "add": add, "sum_1": add}, concurrent, mode)


class _OutKeyword(_TwoLinear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.fc1(x)
        early = a * 3.0  # reads a before it is overwritten
        torch.add(x, 1.0, out=a)
        return self.fc2(a) + early  # reads a after


@pytest.mark.parametrize("concurrent", [False, True])
@pytest.mark.parametrize("add, mul", [(1, 0), (0, 1), (1, 2)])
def test_a_call_with_out_overwrites_that_tensor(three_cpus, concurrent, add, mul):
    """`torch.add(x, 1, out=a)` overwrites a: fc2, which reads a afterwards, reads the call's result. It was
    taken for a call that only reads a: 378 of the 729 placements of this model computed unlike eager
    PyTorch (523 concurrent)."""
    _, dmap = three_cpus
    _assert_step_as_eager(_OutKeyword, dmap, {"add": add, "mul": mul}, concurrent)


class _Halves(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc1(x)
        a, b = y[:, :4], y[:, 4:]  # slices, not chunk: autograd refuses in-place calls on chunk's parts
        a.relu_()  # b, still to be read, shares y's storage but none of a's elements
        return (self.fc2(a) * b).sum()


@pytest.mark.parametrize("concurrent", [False, True])
@pytest.mark.parametrize("mode", ["inference", "training"])
@pytest.mark.parametrize("relu, mul", [(0, 1), (1, 0), (1, 2)])
def test_an_in_place_call_on_one_part_of_a_tensor_leaves_the_others(three_cpus, concurrent, mode, relu, mul):
    """Capture refused it as a write to shared memory; on every placement it computes as eager PyTorch."""
    _, dmap = three_cpus
    _assert_step_as_eager(_Halves, dmap, {"relu_": relu, "mul": mul, "sum_1": mul}, concurrent, mode)


class _GateWrite(_TwoLinear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc1(x)
        early = y * 3.0  # reads y before the write through a view of it
        a, b = y.chunk(2, 1)
        a.sigmoid_()  # writes y's memory
        return self.fc2(torch.cat([a, b], 1)) + early


def test_a_write_through_a_view_waits_for_the_earlier_readers_of_what_it_views(three_cpus):
    """`a.sigmoid_()` on a chunk of y writes y's memory: with early (which reads y) on another lane, which
    copies y when it runs, the write waits for it. It waited only for the readers of a, and early read the
    written y in 34 of 40 concurrent runs."""
    _, dmap = three_cpus
    _assert_step_as_eager(_GateWrite, dmap, {"mul": 1}, concurrent=True, runs=5)


class _ViewReadThenWrite(_TwoLinear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc1(x)
        z = self.fc2(x)
        z.index_add_(0, torch.tensor([0]), y[1:])  # reads y through a view
        y.clamp_(min=0.1)  # writes y
        return z + y


def test_a_write_waits_for_the_earlier_readers_of_a_view_of_what_it_writes(three_cpus):
    """`y.clamp_()` writes y, which index_add_ read through the view `y[1:]` on another lane, copying it when
    it runs: the write waits for it. It waited only for the readers of y itself: 71 of 300 concurrent runs of
    random placements of a like program computed unlike eager PyTorch (found by fuzzing)."""
    _, dmap = three_cpus
    _assert_step_as_eager(_ViewReadThenWrite, dmap, {"index_add_": 1}, concurrent=True, runs=5)


class _Slow(nn.Module):
    """A leaf op (it has a capture rule) that holds its lane for `delay` seconds: an op of another lane that
    does not wait for it runs first."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay

    def capture_cost(self, inputs, outputs, training):
        from suite.capture.flops import Cost

        return Cost("slow", 1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.delay)
        return x * 1.0


class _BufferWrites(_TwoLinear):
    """Reads, overwrites, reads, updates and reads a buffer in forward, the writes without gradients (as a
    running statistic's)."""

    def __init__(self, delay: float = 0.2) -> None:
        super().__init__()
        self.slow_read, self.slow_write = _Slow(delay), _Slow(delay)
        self.register_buffer("run", torch.arange(4.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        old = self.slow_read(h) + self.run  # reads the old values (and saves none for backward)
        with torch.no_grad():
            self.run.copy_(h.mean(0))  # after old's read
        new = self.fc2(x) + self.run  # reads the first write
        with torch.no_grad():
            self.run.add_(self.slow_write(h).sum(0))  # reads the first write, after new's read
        return (old * new * self.run.view(1, 4)).sum()  # reads the second, through a view


def test_buffer_writes_and_reads_wait_for_each_other_as_capture_orders_them():
    """The backend orders a buffer's nodes by capture's rule (`suite.capture.fx.BufferOrder`): a get_attr of
    the buffer after a write waits for the write, a write for the nodes that read the buffer since the write
    before."""
    torch.manual_seed(0)
    rw = from_module(_BufferWrites(), (torch.randn(2, 4),), name="buffer_writes")
    eg = ExecGraph(rw)
    got = {n.name: sorted(eg.nodes[j].name for j in eg.buffer_after[i]) for i, n in enumerate(eg.nodes)
           if eg.buffer_after[i]}
    gets = [n.name for n in eg.nodes if n.op == "get_attr"]
    assert gets == ["run", "run_1", "run_2", "run_3", "run_4"]  # run_4: the view's (a node, not tracing's tensor)
    assert got == {
        "copy_": ["add"],  # reads nothing of old's add, follows its read of the old values
        "run_2": ["copy_"],  # new's read (add_1) of the first write
        "add_": ["add_1"],  # after new's read (and after copy_, through its get_attr run_3)
        "run_3": ["copy_"],
        "run_4": ["add_"],  # the view of the buffer reads the second write
    }
    # copy_ and add_ on lanes of their own wait for exactly these nodes (and for their inputs)
    g = rw.graph
    p = np.zeros(g.num_ops, dtype=np.int64)
    p[[g.index["mean"], g.index["copy_"]]] = 1
    p[[g.index["slow_write"], g.index["sum_1"], g.index["add_"]]] = 2
    ex = TorchExecutor(rw, local_cluster(3, gpus=False)[1], concurrent=True)
    ex.apply(p)
    waits = {eg.nodes[i].name: sorted(eg.nodes[j].name for j in w) for lane in ex._lanes.values()
             for i, _, w in lane}
    ex.close()
    assert waits["copy_"] == ["add"] and waits["add_"] == ["add_1"]
    assert waits["run_2"] == ["copy_"] and waits["run_3"] == ["copy_"] and waits["run_4"] == ["add_"]


def _eager_steps(rw, steps: int) -> tuple[list[torch.Tensor], nn.Module]:
    """`steps` eager steps of a fresh copy of `rw` (training: SGD with momentum as the backend's): each step's
    output, and the module after them."""
    eager = rw.fresh_copy()
    if not rw.training:
        return [eager.eager() for _ in range(steps)], eager.module
    opt = torch.optim.SGD(eager.module.parameters(), lr=1e-3, momentum=0.9)
    outs = []
    for _ in range(steps):
        opt.zero_grad()
        loss = eager.module(*eager.inputs)
        loss.backward()
        opt.step()
        outs.append(loss.detach())
    return outs, eager.module


def _assert_steps_as_eager(rw, dmap, placement: np.ndarray, concurrent: bool, steps: int = 2) -> None:
    """`steps` steps of a fresh copy of `rw` on `placement`: each step's output (training: loss), and the
    parameters and buffers after them, equal eager PyTorch's."""
    want, module = _eager_steps(rw, steps)
    run = rw.fresh_copy()
    ex = TorchExecutor(run, dmap, concurrent=concurrent)
    ex.apply(placement)
    got = [ex.step() for _ in range(steps)]
    ex.close()
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    for name, t in [*module.named_parameters(), *module.named_buffers()]:
        torch.testing.assert_close(_fetch(run.module, name).detach(), t.detach(), rtol=1e-6, atol=1e-6)


def _fetch(module: nn.Module, name: str) -> torch.Tensor:
    *path, last = name.split(".")
    return getattr(module.get_submodule(".".join(path)), last)


BUFFER_RACES = {
    "read late": {"slow_read": 2, "add": 2, "mean": 1, "copy_": 1},  # copy_ at once, add after 0.2 s
    "write late": {"slow_read": 1, "add": 1, "mean": 1, "copy_": 1},  # copy_ after 0.2 s, add_1 at once
}


@pytest.mark.parametrize("mode", ["inference", "training"])
@pytest.mark.parametrize("race", sorted(BUFFER_RACES))
def test_a_write_to_a_buffer_and_its_readers_on_other_lanes_compute_as_eager(three_cpus, mode, race):
    """copy_ on lane 1 while old's add, on lane 2 after a slow op, is still to read the old values, or after
    a slow op on its lane while new's add_1, on lane 0, is to read what it writes. The lanes did not order a
    buffer's reads and writes: copy_ overwrote the buffer before add read it, or add_1 read it before copy_
    wrote it (with a copy_ into a buffer, 2 of 4 placements computed unlike eager PyTorch, concurrent only)."""
    _, dmap = three_cpus
    torch.manual_seed(0)
    rw = from_module(_BufferWrites(), (torch.randn(2, 4),), name="buffer_writes", mode=mode)
    g = rw.graph
    p = np.zeros(g.num_ops, dtype=np.int64)  # backward ops with their forward ops (groups)
    for op, d in BUFFER_RACES[race].items():
        p[g.groups.get(op, [g.index[op]])] = d
    _assert_steps_as_eager(rw, dmap, p, concurrent=True)


@pytest.mark.parametrize("mode", ["inference", "training"])
def test_buffer_writes_compute_as_eager_on_random_placements(three_cpus, mode):
    """Two steps (the second starts from the buffer the first wrote) on random placements, concurrent and
    sequential: outputs, parameters and the buffer equal eager PyTorch's."""
    _, dmap = three_cpus
    torch.manual_seed(0)
    rw = from_module(_BufferWrites(delay=0.0), (torch.randn(2, 4),), name="buffer_writes", mode=mode)
    rng = np.random.default_rng(0)
    for _ in range(3):
        p = random_placement(rw.graph, 3, rng)
        for concurrent in (True, False):
            _assert_steps_as_eager(rw, dmap, p, concurrent)


class _ChainedBufferWrite(_TwoLinear):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("run", torch.arange(4.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            self.run.mul_(self.fc1(x).mean(0)).add_(1.0)  # add_ overwrites mul_'s result: the buffer
        return (self.fc2(x) * self.run).sum()


@pytest.mark.parametrize("concurrent", [False, True])
@pytest.mark.parametrize("mode", ["inference", "training"])
@pytest.mark.parametrize("mul_, add_", [(0, 1), (1, 2)])
def test_a_write_on_another_device_than_the_write_before_writes_the_buffer(three_cpus, concurrent, mode, mul_,
                                                                           add_):
    """`self.run.mul_(m).add_(1)` with add_ on another device than mul_: add_ got a copy of the buffer,
    which it overwrote, and the buffer kept mul_'s values (fc2's product and the next step read them)."""
    _, dmap = three_cpus
    torch.manual_seed(0)
    rw = from_module(_ChainedBufferWrite(), (torch.randn(2, 4),), name="chained_buffer_write", mode=mode)
    g = rw.graph
    p = np.zeros(g.num_ops, dtype=np.int64)
    p[g.index["mul_"]], p[g.index["add_"]] = mul_, add_
    _assert_steps_as_eager(rw, dmap, p, concurrent)


class _EarlyBufferView(_TwoLinear):
    def __init__(self) -> None:
        super().__init__()
        self.slow_write = _Slow(0.2)
        self.register_buffer("run", torch.arange(4.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v = self.run.view(1, 4)  # taken before the write: eager reads the written values through it
        with torch.no_grad():
            self.run.copy_(self.slow_write(self.fc1(x)).mean(0))
        return (self.fc2(x) * v).sum()


@pytest.mark.parametrize("mode", ["inference", "training"])
def test_a_view_of_a_buffer_taken_before_a_write_is_read_after_it_on_another_lane(three_cpus, mode):
    """The product reading the view, on a lane of its own, waits for copy_, which a slow op holds back on
    its lane: it did not (the view's get_attr came before the write) and read the old values."""
    _, dmap = three_cpus
    torch.manual_seed(0)
    rw = from_module(_EarlyBufferView(), (torch.randn(2, 4),), name="early_buffer_view", mode=mode)
    g = rw.graph
    p = np.zeros(g.num_ops, dtype=np.int64)  # backward ops with their forward ops (groups)
    for op in ("slow_write", "mean", "copy_"):
        p[g.groups.get(op, [g.index[op]])] = 1
    p[g.groups.get("mul", [g.index["mul"]])] = 2
    _assert_steps_as_eager(rw, dmap, p, concurrent=True)


class _BufferAlone(_TwoLinear):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("run", torch.arange(4.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        old = self.run * 2.0  # from the buffer alone, before the write: the last step's values
        with torch.no_grad():
            self.run.copy_(self.fc1(x).mean(0))
        return (self.fc2(x) * old + self.run.sum()).sum()  # self.run.sum(): from the buffer alone, after it


@pytest.mark.parametrize("concurrent", [False, True])
@pytest.mark.parametrize("mode", ["inference", "training"])
def test_values_computed_from_a_written_buffer_alone_compute_as_eager(three_cpus, concurrent, mode):
    """torch.fx computed `self.run * 2.0` and `self.run.sum()` once, while tracing, into constants: every step
    read the initial buffer's (old: [0, 2, 4, 6] at each step, the sum 6), where eager reads the buffer that
    the write (this step's, or the last step's) left. Three steps on 3 devices equal eager's."""
    _, dmap = three_cpus
    torch.manual_seed(0)
    rw = from_module(_BufferAlone(), (torch.randn(2, 4),), name="buffer_alone", mode=mode)
    g = rw.graph
    p = np.zeros(g.num_ops, dtype=np.int64)
    for op, d in {"fc1": 1, "mean": 1, "copy_": 1, "fc2": 2}.items():
        p[g.groups.get(op, [g.index[op]])] = d
    _assert_steps_as_eager(rw, dmap, p, concurrent, steps=3)


class _SharedBuffer(_TwoLinear):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("scale", torch.arange(4.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc1(x) * self.scale + self.fc2(x) * self.scale  # two reads of the buffer: two get_attrs


def test_a_buffer_read_on_two_torch_devices_lives_on_one_and_the_other_reads_a_copy(three_cpus):
    """Each get_attr of the buffer moved it to its reader's torch device in turn: it ended on the last one's,
    and the first reader got it there (on CPU + GPU: "Expected all tensors to be on the same device"). It
    lives with its first reader now, and the other reads a counted copy. The meta device stands for the
    second torch device (its tensors have shapes, no values)."""
    _, dmap = three_cpus
    torch.manual_seed(0)
    rw = from_module(_SharedBuffer(), (torch.randn(2, 4),), name="shared_buffer")
    g = rw.graph
    p = np.zeros(g.num_ops, dtype=np.int64)
    p[[g.index["mul_1"], g.index["add"]]] = 1
    ex = TorchExecutor(rw, dmap, concurrent=False)
    ex.tdevs = [torch.device("cpu"), torch.device("meta"), torch.device("cpu")]
    ex.apply(p)
    assert rw.gm.scale.device.type == "cpu"  # with mul, its first reader
    with torch.no_grad():
        out = ex.forward()
    assert out.device.type == "meta" and out.shape == (2, 4)
    assert (ex.copies.count, ex.copies.bytes) == (3, 32 + 16 + 32)  # fc2's output and the buffer to mul_1, mul's to add


@cuda
def test_a_buffer_read_on_the_cpu_and_the_gpu_computes_as_eager():
    _, dmap = local_cluster(1)
    torch.manual_seed(0)
    rw = from_module(_SharedBuffer(), (torch.randn(2, 4),), name="shared_buffer")
    g = rw.graph
    p = np.zeros(g.num_ops, dtype=np.int64)
    p[[g.index["mul_1"], g.index["add"]]] = 1
    ex = TorchExecutor(rw, dmap)
    ex.apply(p)
    with torch.no_grad():
        out = ex.forward()
    torch.testing.assert_close(out.cpu(), rw.eager(), rtol=1e-5, atol=1e-6)


@cuda
def test_buffer_writes_on_the_gpu_compute_as_eager():
    """On the GPU the buffer is moved there (a new tensor): the view of it that tracing took stayed on the
    CPU tensor, and the step read its initial values (see test_capture)."""
    _, dmap = local_cluster(1)
    torch.manual_seed(0)
    rw = from_module(_BufferWrites(delay=0.0), (torch.randn(2, 4),), name="buffer_writes")
    want, _ = _eager_steps(rw, 2)
    run = rw.fresh_copy()
    ex = TorchExecutor(run, dmap)
    ex.apply(np.ones(rw.graph.num_ops, dtype=np.int64))
    got = [ex.step() for _ in range(2)]
    ex.close()
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-5, atol=1e-5)


class _HalvesItsInput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(0.5)  # overwrites the caller's tensor
        return self.fc(x)


@pytest.mark.parametrize("concurrent", [False, True])
@pytest.mark.parametrize("mul_", [0, 1])
def test_every_step_reads_the_staged_inputs_whatever_writes_them_in_place(three_cpus, concurrent, mul_):
    """`x.mul_(0.5)` on x's device overwrote the staged input, so each step halved it again (its output
    drifted, and after some 126 steps it computed on denormal numbers); on another device it overwrote a copy
    and every step read the same input. Now every placement's steps read the staged values: each step's
    output is eager PyTorch's first call's."""
    _, dmap = three_cpus
    torch.manual_seed(0)
    rw = from_module(_HalvesItsInput(), (torch.randn(2, 4),), name="halves_its_input")
    want = rw.fresh_copy().eager()
    p = np.zeros(rw.graph.num_ops, dtype=np.int64)
    p[rw.graph.index["mul_"]] = mul_
    ex = TorchExecutor(rw, dmap, concurrent=concurrent)
    ex.apply(p)
    staged = ex._staged[0].clone()
    for _ in range(3):
        torch.testing.assert_close(ex.step(), want, rtol=0, atol=0)
    ex.close()
    torch.testing.assert_close(ex._staged[0], staged, rtol=0, atol=0)


def test_backend_measures_with_the_timing_protocol(three_cpus):
    cluster, dmap = three_cpus
    rw = small_workload("rnnlm-2x2048-b64", mode="inference")
    be = TorchBackend(rw, cluster, dmap, timing=FAST)
    single = be.measure(np.zeros(rw.graph.num_ops, dtype=np.int64))
    assert single.status == "ok" and len(single.samples_s) == 3
    assert single.step_time_s == pytest.approx(float(np.median(single.samples_s)))
    assert single.bytes_transferred == 0
    assert set(single.peak_memory_bytes) == {"cpu:0", "cpu:1", "cpu:2"}
    # the devices it puts nothing on report 0, not the process's resident set (they reported it)
    assert single.peak_memory_bytes["cpu:0"] > 0
    assert (single.peak_memory_bytes["cpu:1"], single.peak_memory_bytes["cpu:2"]) == (0, 0)
    split = be.measure(random_placement(rw.graph, 3, np.random.default_rng(0)))
    assert split.status == "ok" and split.bytes_transferred > 0


def test_evaluator_runs_the_torch_backend(three_cpus):
    cluster, dmap = three_cpus
    rw = small_workload("bert_base-12x768-s128-b8", mode="inference")
    ev = Evaluator(rw.graph, cluster, Budget(max_evaluations=2), backend=TorchBackend(rw, cluster, dmap, timing=FAST))
    m = ev.evaluate(np.zeros(rw.graph.num_ops, dtype=np.int64))
    assert m.status == "ok" and ev.remaining == 1
    bad = ev.evaluate(np.full(rw.graph.num_ops, 7))
    assert bad.status == "invalid"


class Hungry(nn.Module):
    """A leaf op whose allocation size is set after capture (capture runs the module once)."""

    capture_kind = "hungry"

    def __init__(self) -> None:
        super().__init__()
        self.extra = 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + x.new_zeros(self.extra).sum()

    def capture_cost(self, inputs, outputs, training):
        from suite.capture.flops import Cost

        return Cost("hungry", 1.0)


class WithHungry(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.hungry = Hungry()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.hungry(self.fc(x))


def test_allocation_failure_is_status_oom_and_the_run_goes_on(three_cpus):
    cluster, dmap = three_cpus
    model = WithHungry()
    rw = from_module(model, (torch.randn(2, 4),), name="hungry")
    be = TorchBackend(rw, cluster, dmap, timing=FAST)
    p = np.zeros(rw.graph.num_ops, dtype=np.int64)
    model.hungry.extra = 2**60  # an allocation no machine can make: a real allocator failure
    m = be.measure(p)
    assert m.status == "oom" and m.step_time_s is None
    assert m.oom_devices == ("cpu:0",)  # of the logical devices sharing the CPU, the one in use
    model.hungry.extra = 1
    assert be.measure(p).status == "ok"


def test_host_memory_running_out_names_only_the_cpu_devices_the_placement_uses(three_cpus):
    """The host's allocator failing named every CPU device of the cluster (cpu:1 too, which this placement
    leaves idle), and m_etf's OOM retries then took cpu:1 for full: now the devices holding something."""
    cluster, dmap = three_cpus
    model = WithHungry()
    rw = from_module(model, (torch.randn(2, 4),), name="hungry")
    assert [op.name for op in rw.graph.ops] == ["x", "fc", "hungry"]
    model.hungry.extra = 2**60
    m = TorchBackend(rw, cluster, dmap, timing=FAST).measure(np.array([0, 2, 0]))
    assert m.status == "oom" and m.oom_devices == ("cpu:0", "cpu:2")
    assert set(m.peak_memory_bytes) == {"cpu:0", "cpu:2"}
    assert m.message.startswith("out of memory on cpu:0, cpu:2: ")
    from suite.backends.timing import held_by

    assert held_by(("gpu:0",), [0], ["cpu:0", "gpu:0"]) == ("gpu:0",)  # none in use: still where it happened


def test_an_out_of_memory_measurement_reports_what_the_placement_needs_and_m_etf_retries(three_cpus):
    """An OOM measurement had no peak memory: m_etf's OOM retries read the peak of each device it names, a
    KeyError ('cpu:0') that ended the placer. It now reports for each named device at least what it held
    when the allocation failed plus the allocation (2**60 floats: 2**62 bytes, from torch's message)."""
    from suite.placer import Problem, make_placer

    cluster, dmap = three_cpus
    model = WithHungry()
    rw = from_module(model, (torch.randn(2, 4),), name="hungry")
    be = TorchBackend(rw, cluster, dmap, timing=FAST)
    model.hungry.extra = 2**60
    m = be.measure(np.zeros(rw.graph.num_ops, dtype=np.int64))
    assert m.status == "oom" and set(m.peak_memory_bytes) == {"cpu:0"}
    assert all(2**62 < v < 2**62 + 2**40 for v in m.peak_memory_bytes.values())
    budget = Budget(max_evaluations=4)
    result = make_placer("m_etf").place(Problem.make(rw.graph, cluster, budget, backend=be), budget, 0)
    assert result.info["oom_retries"] >= 1


def test_cuda_out_of_memory_error_is_status_oom(three_cpus, monkeypatch):
    cluster, dmap = three_cpus
    model = WithHungry()
    rw = from_module(model, (torch.randn(2, 4),), name="hungry")

    def boom(self, x):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 1 GiB total)")

    monkeypatch.setattr(Hungry, "forward", boom)
    m = TorchBackend(rw, cluster, dmap, timing=FAST).measure(np.zeros(rw.graph.num_ops, dtype=np.int64))
    assert m.status == "oom" and "out of memory" in m.message


def test_other_failures_are_status_error(three_cpus, monkeypatch):
    cluster, dmap = three_cpus
    rw = from_module(WithHungry(), (torch.randn(2, 4),), name="hungry")
    monkeypatch.setattr(Hungry, "forward", lambda self, x: x @ torch.ones(3, 3))
    m = TorchBackend(rw, cluster, dmap, timing=FAST).measure(np.zeros(rw.graph.num_ops, dtype=np.int64))
    assert m.status == "error" and "RuntimeError" in m.message


def test_unused_gpus_report_no_peak_from_earlier_placements(monkeypatch):
    """CUDA peak statistics are per process: a placement that leaves a GPU unused must not report what an
    earlier placement allocated there. Mocked (no CUDA here): two fake GPUs whose used ones peak at 5 GiB."""
    import suite.backends.devices as devices
    import suite.backends.timing as timing
    import suite.backends.torch_exec as tx
    from suite.cluster import Cluster, Device, Link

    monkeypatch.setattr(devices, "check_torch_device", lambda *a, **k: None)  # pretend cuda:0 and cuda:1 exist
    peak = {"cuda:0": 0, "cuda:1": 0}
    monkeypatch.setattr(tx, "reset_peak_memory", lambda devs: [peak.__setitem__(str(d), 0) for d in devs])
    monkeypatch.setattr(tx, "peak_memory_bytes", lambda d: peak[str(d)])
    monkeypatch.setattr(timing, "synchronize", lambda devs: None)

    class FakeExecutor:
        copies, concurrent_now, used = tx.Copies(), False, []

        def apply(self, p):
            self.used = sorted({f"cuda:{int(x)}" for x in p})
            self.used_devices = sorted({int(x) for x in p})

        @property
        def devices(self):
            return [torch.device(u) for u in self.used]

        def step(self):
            for u in self.used:
                peak[u] = 5 * 2**30

    gpus = tuple(Device(f"gpu:{i}", "gpu", 1e12, 1e11, 10**10, 1e-5) for i in range(2))
    backend = TorchBackend.__new__(TorchBackend)
    backend.cluster = Cluster("2gpu", gpus, (Link(("gpu:0", "gpu:1"), 1e10, 1e-5),))
    backend.device_map, backend.clock = DeviceMap(("gpu:0", "gpu:1"), ("cuda:0", "cuda:1")), "wall"
    backend.timing, backend.executor = Timing(warmup_steps=1, measured_steps=2), FakeExecutor()
    backend.threads = torch.get_num_threads()
    assert backend.measure(np.array([0, 1])).peak_memory_bytes == {"gpu:0": 5 * 2**30, "gpu:1": 5 * 2**30}
    assert backend.measure(np.array([0, 0])).peak_memory_bytes == {"gpu:0": 5 * 2**30, "gpu:1": 0}


def test_device_maps():
    cluster = zoo_cluster = __import__("suite").load_cluster("xeon_h100")
    dmap = DeviceMap.parse(cluster, ["gpu:0=cpu"])
    assert dmap.as_dict() == {"cpu:0": "cpu", "gpu:0": "cpu"}
    with pytest.raises(ClusterError, match="not a device of cluster"):
        DeviceMap.parse(zoo_cluster, ["gpu:7=cpu"])
    with pytest.raises(ClusterError, match="form"):
        DeviceMap.parse(cluster, ["gpu:0"])
    with pytest.raises(ClusterError, match="'cpu' or 'cuda:N'"):
        DeviceMap.parse(cluster, {"gpu:0": "tpu"})
    with pytest.raises(ClusterError, match="'gpu:0' is mapped twice \\('cuda:0' and 'cpu'\\)"):
        DeviceMap.parse(cluster, ["gpu:0=cuda:0", "gpu:0=cpu"])  # the last one won
    if not torch.cuda.is_available():
        with pytest.raises(ClusterError, match="not available"):
            DeviceMap.default(cluster)


def test_gpus_left_out_of_a_device_map_take_the_cuda_devices_it_does_not_name(monkeypatch):
    """gpu:0=cuda:0 given, gpu:1 left to the default got cuda:0 too (two cluster GPUs on one real GPU without
    being asked); now the next CUDA device that the map does not name."""
    import suite

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    cluster = suite.load_cluster("haswell_2k80")
    cpu, g0, g1 = (d.name for d in cluster.devices)
    assert DeviceMap.default(cluster).as_dict() == {cpu: "cpu", g0: "cuda:0", g1: "cuda:1"}
    assert DeviceMap.parse(cluster, [f"{g0}=cuda:0"]).as_dict() == {cpu: "cpu", g0: "cuda:0", g1: "cuda:1"}
    assert DeviceMap.parse(cluster, [f"{g1}=cuda:0"]).as_dict() == {cpu: "cpu", g0: "cuda:1", g1: "cuda:0"}
    assert DeviceMap.parse(cluster, [f"{g0}=cpu"]).as_dict() == {cpu: "cpu", g0: "cpu", g1: "cuda:0"}
    assert DeviceMap.parse(cluster, [f"{g1}=cuda:1"]).as_dict() == {cpu: "cpu", g0: "cuda:0", g1: "cuda:1"}
    shared = DeviceMap.parse(cluster, [f"{g0}=cuda:1", f"{g1}=cuda:1"])  # logical devices, when asked for
    assert shared.as_dict() == {cpu: "cpu", g0: "cuda:1", g1: "cuda:1"}


def test_a_gpu_cluster_runs_with_its_gpu_mapped_to_the_cpu():
    import suite

    cluster = suite.load_cluster("xeon_h100")
    dmap = DeviceMap.parse(cluster, ["gpu:0=cpu"])
    rw = small_workload("resnet50-b32", mode="inference")
    p = random_split_placement(rw.graph, 2, np.random.default_rng(0))
    ex = TorchExecutor(rw, dmap)
    ex.apply(p)
    with torch.no_grad():
        torch.testing.assert_close(ex.forward(), rw.eager(), rtol=1e-5, atol=1e-5)


def test_local_cluster_describes_this_machine():
    cluster, dmap = local_cluster(2)
    assert [d.name for d in cluster.devices][:2] == ["cpu:0", "cpu:1"]
    assert dmap.torch_devices[:2] == ("cpu", "cpu")
    n_gpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert cluster.num_devices == 2 + n_gpu
    assert cluster.routes[1][0, 1] > 0


def test_a_measured_local_device_predicts_the_copy_it_was_measured_with(monkeypatch):
    """measure_device's bandwidth is the copy's traffic (64 MiB read + 64 MiB written in 10 ms: 12.8 GiB/s), and
    an op's memory time is its bytes read + written over mem_bandwidth: a 64 MiB copy op is predicted at the
    10 ms it took. The device's mem_bandwidth was half the traffic: memory-bound ops predicted twice as slow."""
    import suite.backends.devices as devices
    from suite.costmodel import roofline_time_s

    copy_bytes, copy_s = 64 * 2**20, 0.01
    measured = {"peak_flops": 1e11, "mem_bandwidth": 2 * copy_bytes / copy_s, "copy_latency_s": 1e-6,
                "clone_bandwidth": 1e9}
    monkeypatch.setattr(devices, "measure_device", lambda device: measured)
    cluster, _ = local_cluster(2, measure=True, gpus=False)
    cpu = cluster.devices[0]
    assert cpu.mem_bandwidth == 2 * copy_bytes / copy_s
    t = roofline_time_s(np.array([0.0]), np.array([2.0 * copy_bytes]), cpu)[0]
    assert t == pytest.approx(cpu.op_overhead_s + copy_s, rel=1e-12)


def test_variants_and_the_zoo_graph():
    rw = real_workload("rnnlm-2x2048-b64", mode="inference", **SMALL_SHAPES["rnnlm"])
    assert rw.graph.name.startswith("rnnlm-2x2048-b64+") and "mode=inference" in rw.graph.name
    assert rw.graph.metadata["variant_of"] == "rnnlm-2x2048-b64"
    assert for_graph(rw.graph).graph.content_hash == rw.graph.content_hash
    with pytest.raises(PlacebenchError, match="unknown shape parameter"):
        real_workload("rnnlm-2x2048-b64", depth=3)


@pytest.mark.parametrize("family", sorted(SMALL_SHAPES))
def test_a_variant_name_loads_the_graph_of_the_module_that_runs(family):
    """`suite.load_workload(variant name)` builds on the meta device, without weights: the same graph as the
    one captured from the real module, by name too, and from a name with the overrides in it."""
    import suite

    base = next(n for n in zoo.names() if zoo.spec(n).family == family)
    rw = real_workload(base, mode="inference", **SMALL_SHAPES[family])
    graph = suite.load_workload(rw.graph.name)
    assert (graph.name, graph.content_hash) == (rw.graph.name, rw.graph.content_hash)
    again = real_workload(rw.graph.name)  # a variant's name is a name real_workload takes
    assert (again.name, again.graph.content_hash) == (rw.graph.name, rw.graph.content_hash)


def test_variant_names_are_checked():
    import suite

    assert parse_variant_name("nmt-2x1024-b64+batch_size=1+mode=inference") == (
        "nmt-2x1024-b64", {"batch_size": 1, "mode": "inference"})
    assert parse_variant_name("nmt-2x1024-b64") == ("nmt-2x1024-b64", {})
    for name, message in (
        ("nmt-2x1024-b64+mode=inference+batch_size=1", "write this variant as 'nmt-2x1024-b64+batch_size=1+mode"),
        ("nmt-2x1024-b64+batch_size=64", "write this variant as 'nmt-2x1024-b64'"),  # the zoo's own value
        ("nmt-2x1024-b64+batch_size", "'batch_size' is not KEY=VALUE"),
        ("nmt-2x1024-b64+batch_size=1+batch_size=2", "'nmt-2x1024-b64+batch_size=1+batch_size=2': batch_size is "
                                                     "given twice"),
        ("nmt-2x1024-b64+batch_size=x", "batch_size='x' must be a positive integer"),
        ("nmt-2x1024-b64+batch_size=0", "batch_size=0 must be a positive integer"),
        ("nmt-2x1024-b64+depth=2", "'nmt-2x1024-b64+depth=2': unknown shape parameter"),
        ("nmt-2x1024-b64+mode=eval", "mode 'eval' is not"),
        ("nope+batch_size=1", "unknown workload 'nope'"),
    ):
        with pytest.raises(PlacebenchError, match=re.escape(message)):
            suite.load_workload(name)
    with pytest.raises(PlacebenchError, match="disagree on batch_size"):
        real_workload("nmt-2x1024-b64+batch_size=1", batch_size=2)


def test_a_shape_torch_cannot_build_is_an_error_naming_the_workload(capsys):
    """A huge shape parameter (beyond int64, or a tensor size that overflows) is a PlacebenchError, by name
    (meta device) and when run (real weights), and one line with exit 2 at the CLI: not torch's traceback."""
    import suite
    from suite.cli import main

    for name, message in (
        ("rnnlm-2x2048-b64+batch_size=99999999999999999999", "TypeError: zeros(): argument 'size' failed to unpack"),
        ("rnnlm-2x2048-b64+batch_size=9223372036854775807", "RuntimeError: Storage size calculation overflowed"),
    ):
        with pytest.raises(PlacebenchError, match=re.escape(
                f"workload {name!r}: torch cannot build the model with these shape parameters ({message}")):
            suite.load_workload(name)
        with pytest.raises(PlacebenchError, match="torch cannot build the model"):
            real_workload(name)
    assert main(["show", "rnnlm-2x2048-b64+batch_size=99999999999999999999"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("placebench: error: workload 'rnnlm-2x2048-b64+batch_size=99999999999999999999': torch "
                          "cannot build") and err.count("\n") == 1


def test_registered_workload_captured_from_the_real_module_is_the_zoo_graph():
    rw = real_workload("resnet50-b1-infer", capture=True)
    assert rw.graph.content_hash == zoo.load("resnet50-b1-infer").content_hash


@cuda
def test_cpu_gpu_split_equals_eager_on_cuda():
    cluster, dmap = local_cluster(1)
    rw = small_workload("resnet50-b32", mode="inference")
    ref = rw.eager()
    p = random_split_placement(rw.graph, cluster.num_devices, np.random.default_rng(0))
    ex = TorchExecutor(rw, dmap)
    ex.apply(p)
    with torch.no_grad():
        out = ex.forward()
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-3, atol=1e-3)
    m = TorchBackend(rw, cluster, dmap, timing=FAST).measure(p)
    assert m.status == "ok" and m.peak_memory_bytes["gpu:0"] > 0


@cuda
@pytest.mark.parametrize("name", ["rnnlm-2x2048-b64", "nmt-2x1024-b64", "bert_base-12x768-s128-b8"])
def test_cpu_gpu_training_step_equals_eager_on_cuda(name):
    """Per-op random placements over the CPU and a GPU, run concurrently (one lane per device): the shared
    weights of the recurrent cells are called from both lanes at once."""
    cluster, dmap = local_cluster(1)
    rw = small_workload(name, mode="training")
    eager = rw.fresh_copy()
    ex = TorchExecutor(rw, dmap)
    ex.apply(random_placement(rw.graph, cluster.num_devices, np.random.default_rng(2)))
    assert ex.concurrent_now
    loss = ex.step()
    opt = torch.optim.SGD(eager.module.parameters(), lr=1e-3, momentum=0.9)
    ref = eager.module(*eager.inputs)
    ref.backward()
    opt.step()
    ex.close()
    torch.testing.assert_close(loss.cpu(), ref.detach(), rtol=1e-3, atol=1e-4)
    for pname, param in eager.module.named_parameters():
        torch.testing.assert_close(ex.eg.params[pname].detach().cpu(), param.detach(), rtol=1e-3, atol=1e-4)


@cuda
def test_cli_fidelity_on_this_machines_cpu_and_gpu(tmp_path, capsys):
    """`placebench fidelity` with its defaults on a GPU host: one logical CPU and the GPU, every placement
    measured (none an error), a single-GPU row among them."""
    from suite.cli import main

    args = ["fidelity", "rnnlm-2x2048-b64", *(f"--set={k}={v}" for k, v in SMALL_SHAPES["rnnlm"].items()),
            "--profiles", str(tmp_path / "p"), "--out", str(tmp_path / "f"), "--splits", "2", "--random", "2",
            "--rounds", "1", "--no-png"]
    assert main(args) == 0
    (report,) = (tmp_path / "f").glob("*__local_1cpu_1gpu__torch.json")
    rows = json.loads(report.read_text())["rows"]
    assert [r["status"] for r in rows] == ["ok"] * len(rows), [(r["label"], r["message"]) for r in rows]
    assert {"single:cpu:0", "single:gpu:0"} <= {r["label"] for r in rows}


FULL_SIZE_INFERENCE = ["resnet50-b1-infer", "inception_v3-b1-infer", "bert_base-12x768-s128-b1-infer",
                       "rnnlm-2x2048-b64", "nmt-2x1024-b64"]  # the last two: their inference step at batch 1


def full_size_inference(name: str):
    if zoo.spec(name).mode == "inference":
        return real_workload(name)
    return real_workload(name, mode="inference", batch_size=1)


@pytest.mark.slow
@pytest.mark.parametrize("name", FULL_SIZE_INFERENCE)
def test_full_size_workloads_batch_one_inference(name, three_cpus):
    """Every zoo model at full size (not the large variants), batch 1, inference, split over logical CPUs."""
    _, dmap = three_cpus
    rw = full_size_inference(name)
    ex = TorchExecutor(rw, dmap)
    ex.apply(random_split_placement(rw.graph, 3, np.random.default_rng(0)))
    with torch.no_grad():
        torch.testing.assert_close(ex.forward(), rw.eager(), rtol=1e-4, atol=1e-4)


def test_runner_evaluator_entry_points_build_real_backends(tmp_path):
    from suite import methodology, runner
    from suite.backends.devices import cluster_to_toml
    from suite.cluster import load

    cluster, _ = local_cluster(2)
    path = tmp_path / "local.toml"
    path.write_text(cluster_to_toml(cluster))
    loaded = load(path)
    assert loaded.content_hash == cluster.content_hash
    assert {"torch", "onnxruntime"} <= set(runner.evaluator_names())
    graph = small_workload("rnnlm-2x2048-b64", mode="inference").graph
    meth = methodology.load()
    for name in ("torch", "onnxruntime"):
        backend = runner._evaluator_factory(name)(graph, loaded, meth)
        assert backend.name == name
        m = backend.measure(np.zeros(graph.num_ops, dtype=np.int64))
        assert m.status == "ok" and len(m.samples_s) == meth.timing.measured_steps


@pytest.mark.parametrize("preset", ["haswell_4k80", "dgx_a100x8", "hgx_a100x4"])
def test_cluster_to_toml_writes_back_every_field(preset, tmp_path):
    """A link's sharing and the cluster's own sources were left out: a "ports" cluster read back as a crossbar
    (another content hash, other step times)."""
    from suite.backends.devices import cluster_to_toml
    from suite.cluster import load
    from suite.registry import load_cluster

    cluster = load_cluster(preset)
    path = tmp_path / "c.toml"
    path.write_text(cluster_to_toml(cluster))
    back = load(path)
    assert back.content_hash == cluster.content_hash and back.source == cluster.source
    assert [(lk.sharing, lk.source) for lk in back.links] == [(lk.sharing, lk.source) for lk in cluster.links]


def test_cpu_clock_times_only_one_thread_runs(three_cpus):
    from suite.backends.timing import check_cpu_clock, time_steps

    cluster, dmap = three_cpus
    rw = small_workload("rnnlm-2x2048-b64", mode="inference")
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        be = TorchBackend(rw, cluster, dmap, timing=FAST, clock="cpu")
        m = be.measure(np.zeros(rw.graph.num_ops, dtype=np.int64))
        assert m.status == "ok" and all(s > 0 for s in m.samples_s)
        with pytest.raises(PlacebenchError, match="concurrent"):
            TorchBackend(rw, cluster, dmap, timing=FAST, clock="cpu", concurrent=True).measure(
                random_placement(rw.graph, 3, np.random.default_rng(0)))
        with pytest.raises(PlacebenchError, match="CUDA"):
            check_cpu_clock("cpu", [torch.device("cuda", 0)], False)
        with pytest.raises(PlacebenchError, match="one intra-op thread"):
            TorchBackend(rw, cluster, dmap, timing=FAST, clock="cpu", threads=2).measure(
                np.zeros(rw.graph.num_ops, dtype=np.int64))
    finally:
        torch.set_num_threads(before)
    with pytest.raises(PlacebenchError, match="clock 'sundial'"):
        time_steps(lambda: None, FAST, [], clock="sundial")


def test_an_unknown_clock_fails_when_the_backend_is_made_before_the_executor_is_built(three_cpus, monkeypatch):
    """Not at the first measurement, after the model was built and moved onto its devices."""
    import suite.backends.torch_exec as tx

    cluster, dmap = three_cpus
    rw = small_workload("rnnlm-2x2048-b64", mode="inference")

    def built(*a, **k):
        raise AssertionError("the executor was built before the clock was checked")

    monkeypatch.setattr(tx, "TorchExecutor", built)
    with pytest.raises(PlacebenchError, match="clock 'sundial' is not one of wall, cpu"):
        TorchBackend(rw, cluster, dmap, timing=FAST, clock="sundial")


def test_time_steps_runs_the_warm_up_untimed_then_times_each_measured_step_between_synchronisations(monkeypatch):
    """The timing protocol of both real backends, on a fake clock: warm-up steps untimed, then one sample per
    measured step, each bracketed by a synchronisation of the CUDA devices alone (none with synchronize
    false, but the one after the warm-up); the statistic is the median or the mean of the samples."""
    import suite.backends.timing as timing
    from suite.backends.timing import statistic_s, time_steps

    now, events = [0.0], []
    monkeypatch.setattr(timing, "clock_function", lambda clock: lambda: now[0])
    monkeypatch.setattr(timing, "synchronize", lambda devs: events.append(("sync", [str(d) for d in devs])))

    def step():
        events.append("step")
        now[0] += 2.0 ** sum(e == "step" for e in events)

    devices = [torch.device("cpu"), torch.device("cuda", 1)]
    assert time_steps(step, Timing(warmup_steps=2, measured_steps=3), devices) == [8.0, 16.0, 32.0]
    sync = ("sync", ["cuda:1"])
    assert events == ["step", "step", sync, *[sync, "step", sync] * 3]
    events.clear()
    assert time_steps(step, Timing(warmup_steps=0, measured_steps=2, synchronize=False), devices) == [2.0, 4.0]
    assert events == [sync, "step", "step"]
    assert statistic_s([8.0, 16.0, 48.0], Timing()) == 16.0
    assert statistic_s([8.0, 16.0, 48.0], Timing(statistic="mean")) == 24.0


def test_steps_run_with_the_threads_the_backend_was_made_with(three_cpus):
    """The learned placers search inside `torch_threads(1)`: their evaluations must not run with that one
    thread while the other placers' and the final re-measurement run with the backend's."""
    from rl.learned import torch_threads

    cluster, dmap = three_cpus
    rw = from_module(Tiny(), (torch.randn(2, 4),), name="tiny")
    seen = []

    def recording(be):
        step = be.executor.step
        be.executor.step = lambda: (seen.append(torch.get_num_threads()), step())[1]
        return be

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        be = recording(TorchBackend(rw, cluster, dmap, timing=FAST))
        with torch_threads(1):
            assert be.measure(np.zeros(4, dtype=np.int64)).status == "ok"
            assert torch.get_num_threads() == 1  # the caller's, restored
        assert seen == [2] * 5  # the counting step, 1 warm-up and 3 measured steps
        seen.clear()
        be = recording(TorchBackend(rw, cluster, dmap, timing=FAST, threads=3))
        assert be.measure(np.zeros(4, dtype=np.int64)).status == "ok" and seen == [3] * 5
        assert torch.get_num_threads() == 2
        with pytest.raises(PlacebenchError, match="threads 0"):
            TorchBackend(rw, cluster, dmap, threads=0)
    finally:
        torch.set_num_threads(before)


def test_an_argument_left_at_its_default_runs_with_its_default(three_cpus):
    """A scalar argument that the example inputs leave out takes its default on the backend (it ran as None:
    TypeError), split over two devices too."""

    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x, scale: float = 2.0):
            return self.fc(x) * scale

    _, dmap = three_cpus
    torch.manual_seed(0)
    rw = from_module(Scaled(), (torch.randn(2, 4),), name="scaled")
    ex = TorchExecutor(rw, dmap)
    ex.apply(_placement(rw.graph, x=0, fc=1, mul=0))
    with torch.no_grad():
        torch.testing.assert_close(ex.forward(), rw.eager(), rtol=0, atol=0)


class _Options(nn.Module):
    """A forward whose arguments without tensors (None, a step count, a flag) decide what it computes, with
    a keyword tensor input, and a loss in training mode (`if self.training`)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x, mask=None, steps=1, relu=False, shift=None):
        for _ in range(steps):
            x = self.fc(x)
        if mask is not None:
            x = x * mask
        if relu:
            x = torch.relu(x)
        if shift is not None:
            x = x + shift
        return x.square().mean() if self.training else x


@pytest.mark.parametrize("mode", ["inference", "training"])
def test_the_backend_runs_the_graph_capture_traced_for_constants_and_keyword_inputs(three_cpus, mode):
    """`from_module(model, (x, None, 2, True), example_kwargs={'shift': s})`: the backend traces the module as
    capture does (the values without tensors as constants, `shift` an input), so its nodes are the graph's
    ops and a measured step runs split over two devices, equal to eager PyTorch. The backend traced with
    every argument a traced input (range(steps): TypeError) and took no keyword inputs."""
    cluster, dmap = three_cpus
    torch.manual_seed(0)
    x, shift = torch.randn(2, 4), torch.randn(2, 4)
    rw = from_module(_Options(), (x, None, 2, True), example_kwargs={"shift": shift}, name="options", mode=mode)
    g = rw.graph
    forward = ["x", "shift", "fc/0", "fc/1", "relu", "add"] + (["square", "mean"] if mode == "training" else [])
    assert [op.name for op in g.ops if op.phase == "forward" and op.kind != "variable"] == forward
    eg = ExecGraph(rw)
    assert [g.ops[k].name for k in eg.op_of if k >= 0] == forward
    p = np.zeros(g.num_ops, dtype=np.int64)
    for op in ("fc/1", "relu", "add"):
        p[g.groups.get(op, [g.index[op]])] = 1
    if mode == "inference":
        ex = TorchExecutor(rw, dmap)
        ex.apply(p)
        with torch.no_grad():
            out = ex.forward()
        torch.testing.assert_close(out, torch.relu(rw.module.fc(rw.module.fc(x))) + shift, rtol=0, atol=0)
        torch.testing.assert_close(out, rw.eager(), rtol=0, atol=0)
    else:
        _two_steps_as_eager(rw, dmap, p)
    m = TorchBackend(rw, cluster, dmap, timing=FAST).measure(p)
    # to cpu:1: fc's weights (shared by its two calls; 4 x 4 + 4 floats), fc/0's output and shift (2 x 4 each);
    # in training add's output back to cpu:0, to square
    assert m.status == "ok" and m.bytes_transferred == (16 + 4) * 4 + 2 * 32 + (32 if mode == "training" else 0)


def test_a_single_example_input_is_the_one_positional_input(three_cpus):
    """As capture takes it: `from_module(model, x)` runs model(x) (tuple(x) made each row an input)."""
    _, dmap = three_cpus
    torch.manual_seed(0)
    rw = from_module(Tiny(), torch.randn(2, 4), name="tiny")
    assert [op.name for op in rw.graph.ops] == ["x", "fc1", "act", "fc2"] and rw.inputs[0].shape == (2, 4)
    ex = TorchExecutor(rw, dmap)
    ex.apply(_placement(rw.graph, x=0, fc1=1, act=1, fc2=0))
    with torch.no_grad():
        torch.testing.assert_close(ex.forward(), rw.eager(), rtol=0, atol=0)


@dataclasses.dataclass
class _Output:
    loss: torch.Tensor
    logits: torch.Tensor | None = None


class _LossIn(nn.Module):
    """Returns its loss alone in a container, as capture accepts for training (one scalar tensor)."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 1)
        self.kind = kind

    def forward(self, x):
        loss = self.fc(x).square().mean()
        return {"dict": {"loss": loss}, "tuple": (loss,), "list": [loss], "output": _Output(loss)}[self.kind]


@pytest.mark.parametrize("kind", ["dict", "tuple", "list", "output"])
def test_a_training_step_finds_the_loss_in_the_output(three_cpus, kind):
    """A training module returning {'loss': loss}, (loss,), [loss] or Output(loss=loss) steps as one returning
    loss (every measurement was status error: "'immutable_dict' object has no attribute 'backward'")."""
    cluster, dmap = three_cpus
    torch.manual_seed(0)
    rw = from_module(_LossIn(kind), (torch.randn(2, 4),), name="loss_in", mode="training")
    eager = rw.fresh_copy().module
    opt = torch.optim.SGD(eager.parameters(), lr=1e-3, momentum=0.9)
    ex = TorchExecutor(rw, dmap)
    ex.apply(np.arange(rw.graph.num_ops, dtype=np.int64) % 2)
    for _ in range(2):
        loss = ex.step()
        opt.zero_grad()
        ref = eager.fc(rw.inputs[0]).square().mean()
        ref.backward()
        opt.step()
        torch.testing.assert_close(loss, ref.detach(), rtol=0, atol=0)
    for name, param in eager.named_parameters():
        torch.testing.assert_close(ex.eg.params[name].detach(), param.detach(), rtol=0, atol=0)
    assert TorchBackend(rw, cluster, dmap, timing=FAST).measure(np.zeros(rw.graph.num_ops, np.int64)).status == "ok"



class _Extra(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x, *extra):
        return self.fc(x) * extra[0] + extra[1]


def test_a_forward_with_star_args_gets_the_extra_inputs_as_a_tuple(three_cpus):
    """forward(x, *extra): the *extra placeholder gets the inputs after x as a tuple, as in eager PyTorch
    (it got the second input alone, so extra[0] was its first row and extra[1] its second: a wrong result
    without an error). Capture makes each of them a placeholder of its own, so no placeholder is *extra (the
    backends stage one value per placeholder)."""
    _, dmap = three_cpus
    torch.manual_seed(0)
    x, a, b = (torch.randn(2, 4) for _ in range(3))
    rw = from_module(_Extra(), (x, a, b), name="extra")
    assert [n.target for n in rw.gm.graph.nodes if n.op == "placeholder"] == ["x", "extra_0", "extra_1"]
    ex = TorchExecutor(rw, dmap)
    ex.apply(np.arange(rw.graph.num_ops, dtype=np.int64) % 2)
    with torch.no_grad():
        out = ex.forward()
        torch.testing.assert_close(out, rw.module.fc(x) * a + b, rtol=0, atol=0)
        torch.testing.assert_close(out, rw.eager(), rtol=0, atol=0)


class _DictHead(nn.Module):
    """A leaf op (it has a capture rule) that reads a dict of tensors."""

    def capture_cost(self, inputs, outputs, training):
        from suite.capture.flops import Cost

        return Cost("dict_head", 8)

    def forward(self, d):
        return d["a"] * d["b"]


class _ReadsDict(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head = _DictHead()

    def forward(self, d):
        return self.head(d)


def test_a_dict_of_tensors_read_on_another_device_is_copied_and_counted(three_cpus):
    """An op on cpu:1 reading a dict input staged on cpu:0 gets a copy of each of its tensors, counted (the
    dict went across uncopied and uncounted: on CUDA a device mismatch)."""
    _, dmap = three_cpus
    torch.manual_seed(0)
    d = {"a": torch.randn(2, 4), "b": torch.randn(2, 4)}
    rw = from_module(_ReadsDict(), (d,), name="reads_dict")
    assert [op.name for op in rw.graph.ops] == ["d", "head"]
    ex = TorchExecutor(rw, dmap)
    ex.apply(np.array([0, 1]))
    with torch.no_grad():
        out = ex.forward()
    assert (ex.copies.count, ex.copies.bytes) == (2, 2 * (2 * 4 * 4))
    torch.testing.assert_close(out, d["a"] * d["b"], rtol=0, atol=0)


class _FrozenNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.norm = nn.BatchNorm1d(4)
        self.out = nn.Linear(4, 1)

    def forward(self, x):
        return self.out(self.norm(self.fc(x))).square().mean()


def test_a_submodule_in_eval_stays_in_eval_in_training_steps(three_cpus):
    """A model in train() whose BatchNorm the user put in eval() (frozen statistics while fine-tuning) trains
    as in eager PyTorch: the norm reads its running statistics and leaves them alone. from_module put every
    module in train() for good, so the backend normalized with batch statistics, updated the running ones
    and computed another loss; the model's flags stayed changed."""
    cluster, dmap = three_cpus
    torch.manual_seed(0)
    model = _FrozenNorm()
    model.norm.eval()
    model.norm.running_mean.fill_(0.5)
    model.norm.running_var.fill_(2.0)
    x = torch.randn(3, 4)
    eager = copy.deepcopy(model)
    rw = from_module(model, (x,), name="frozen_norm", mode="training")
    assert (model.training, model.norm.training) == (True, False)
    ex = TorchExecutor(rw, dmap)
    ex.apply(np.arange(rw.graph.num_ops, dtype=np.int64) % 2)
    opt = torch.optim.SGD(eager.parameters(), lr=1e-3, momentum=0.9)
    for _ in range(2):
        loss = ex.step()
        opt.zero_grad()
        ref = eager(x)
        ref.backward()
        opt.step()
        torch.testing.assert_close(loss, ref.detach(), rtol=0, atol=0)
    assert model.norm.running_mean.tolist() == [0.5] * 4 and model.norm.running_var.tolist() == [2.0] * 4
    assert int(model.norm.num_batches_tracked) == 0
    assert TorchBackend(rw, cluster, dmap, timing=FAST).measure(np.zeros(rw.graph.num_ops, np.int64)).status == "ok"
    assert (model.training, model.norm.training) == (True, False)
    model.eval()  # a root in eval(): a training step puts every module in train(), as capture traced it
    ex.apply(np.zeros(rw.graph.num_ops, dtype=np.int64))
    ex.step()
    assert int(model.norm.num_batches_tracked) == 1 and not model.training and not model.norm.training


def test_a_device_holding_only_inputs_or_shared_weights_is_a_device_the_step_uses(three_cpus, shared_linear):
    """The devices a step synchronises and reports peak memory of: a GPU that holds only the staged input, or
    only the shared weights of a variable op (updated there in training), is used. The variable's device was
    left out: on a GPU, 0 peak memory and its SGD update outside the timed step."""
    _, dmap = three_cpus
    torch.manual_seed(0)
    for mode in ("inference", "training"):
        rw = from_module(shared_linear(), (torch.randn(2, 4),), name="shared", mode=mode)
        g = rw.graph
        ex = TorchExecutor(rw, dmap)
        p = np.zeros(g.num_ops, dtype=np.int64)
        p[g.index["x"]] = 1
        ex.apply(p)
        assert ex.used_devices == [0, 1]
        p[:] = 0
        p[g.groups.get("fc/variable", [g.index["fc/variable"]])] = 2  # the shared fc weights (their update)
        ex.apply(p)
        assert ex.used_devices == [0, 2]
        ex.step()
        assert (ex.copies.count, ex.copies.bytes) == (2, 4 * 4 * 4 + 4 * 4)  # fc's weights, to cpu:0 once
        assert ex.devices == [torch.device("cpu")]


class _TinyLoss(Tiny):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x).sum()


def test_copied_bytes_are_the_forward_passes_and_the_simulator_charges_the_backwards_too():
    """The relu on cpu:1, the rest on cpu:0: forward copies fc1's output there and the relu's back (2x8 floats
    each, 128 bytes). Inference: the simulator charges the same. Training: the backend still counts the
    forward's 128 bytes (autograd's gradient copies back are not counted), the simulator charges the two
    gradients' edges too, 256 bytes: the two numbers are not comparable in training."""
    from suite.simulator import simulate

    cluster, dmap = local_cluster(2, gpus=False)
    for mode, simulated in (("inference", 128), ("training", 256)):
        torch.manual_seed(0)
        rw = from_module(_TinyLoss(), (torch.randn(2, 4),), name="tiny", mode=mode)
        g = rw.graph
        p = np.zeros(g.num_ops, dtype=np.int64)
        p[g.groups.get("act", [g.index["act"]])] = 1
        m = TorchBackend(rw, cluster, dmap, timing=FAST).measure(p)
        assert m.status == "ok", m.message
        assert m.bytes_transferred == 2 * (2 * 8 * 4)
        assert int(simulate(g, cluster, p).link_bytes.sum()) == simulated


def test_a_cuda_call_out_of_memory_names_the_gpu_not_the_cpu(monkeypatch):
    """A CUDA call that runs out of memory raises a RuntimeError ("CUDA error: out of memory"), not torch's
    OutOfMemoryError, and names no device index: it named every CPU device, which m_etf's retries then took
    for full."""
    import suite.backends.devices as devices
    from suite.backends.torch_exec import _oom_devices

    monkeypatch.setattr(devices, "check_torch_device", lambda *a, **k: None)  # pretend cuda:0, cuda:1 exist
    one = DeviceMap(("cpu:0", "gpu:0"), ("cpu", "cuda:0"))
    two = DeviceMap(("cpu:0", "gpu:0", "gpu:1"), ("cpu", "cuda:0", "cuda:1"))
    cuda_call = RuntimeError("CUDA error: out of memory\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side "
                             "assertions.")
    assert _oom_devices(cuda_call, one) == ("gpu:0",)
    assert _oom_devices(cuda_call, two) == ()  # which one is not known
    assert _oom_devices(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a "
                                               "total capacity of 79.10 GiB"), two) == ("gpu:1",)
    cpu = RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 123 bytes.")
    assert _oom_devices(cpu, two) == ("cpu:0",)


class _FanOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 3), nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x) + self.b(x)


def test_a_value_read_on_two_other_devices_is_copied_to_each(three_cpus, shared_linear):
    """x on cpu:0 read by a on cpu:1 and by b on cpu:2: one copy to each device (sharing one copy went
    unnoticed: logical devices are one torch device); likewise shared weights used on two other devices."""
    _, dmap = three_cpus
    torch.manual_seed(0)
    rw = from_module(_FanOut(), (torch.randn(2, 4),), name="fan_out")
    assert [op.name for op in rw.graph.ops] == ["x", "a", "b", "add"]
    ex = TorchExecutor(rw, dmap)
    ex.apply(np.array([0, 1, 2, 0], dtype=np.int64))
    with torch.no_grad():
        out = ex.forward()
    # x (2x4 floats) to cpu:1 and to cpu:2; a's and b's outputs (2x3 floats) back to cpu:0
    assert (ex.copies.count, ex.copies.bytes) == (4, 2 * (2 * 4 * 4) + 2 * (2 * 3 * 4))
    torch.testing.assert_close(out, rw.eager(), rtol=0, atol=0)
    rw = from_module(shared_linear(), (torch.randn(2, 4),), name="shared")
    g = rw.graph
    ex = TorchExecutor(rw, dmap)
    p = np.zeros(g.num_ops, dtype=np.int64)
    p[g.index["fc/0"]], p[g.index["fc/1"]] = 1, 2  # the variable (fc's weights) on cpu:0
    ex.apply(p)
    with torch.no_grad():
        ex.forward()
    weights = 4 * 4 * 4 + 4 * 4  # fc.weight and fc.bias, to cpu:1 and to cpu:2
    # x to cpu:1; fc/0's output to cpu:0 (act); act's to cpu:2; fc/1's to cpu:0 (out)
    assert (ex.copies.count, ex.copies.bytes) == (2 * 2 + 4, 2 * weights + 4 * (2 * 4 * 4))


class _TwoLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def test_a_device_holding_only_an_input_gets_no_lane_of_its_own():
    """The input alone on cpu:1, every op on cpu:0: cpu:1 runs no node, so one lane runs the step, not a
    worker thread per device with an empty lane for cpu:1 (which made the row say it ran concurrently, and
    "auto" chose threads where an input alone was on another torch device). The input still stages on cpu:1
    and is copied to cpu:0 each step."""
    cluster, dmap = local_cluster(2)
    torch.manual_seed(0)
    rw = from_module(_TwoLinear().eval(), (torch.randn(2, 4),), name="two_linear")
    g = rw.graph
    ex = TorchExecutor(rw, dmap, concurrent=True)
    p = np.zeros(g.num_ops, dtype=np.int64)
    p[[i for i, op in enumerate(g.ops) if op.kind == "input"]] = 1
    ex.apply(p)
    assert list(ex._lanes) == [0] and ex.concurrent_now is False and ex.used_devices == [0, 1]
    ex.copies = ex.copies.__class__()
    with torch.no_grad():
        torch.testing.assert_close(ex.step(), rw.eager(), rtol=0, atol=0)
    assert ex.copies.bytes == 2 * 4 * 4  # x, 2x4 floats, from cpu:1 to cpu:0
    p[g.index["b"]] = 1  # a node on cpu:1 too: two lanes, threads
    ex.apply(p)
    assert list(ex._lanes) == [0, 1] and ex.concurrent_now is True
    ex.close()


def test_a_windows_cpu_allocation_failure_is_status_oom(three_cpus, monkeypatch):
    """On Windows torch's CPU allocator says "not enough memory" (alloc_cpu.cpp's _aligned_malloc branch), not
    Linux's "can't allocate memory": it was status "error", so m_etf's OOM retries never saw it."""
    cluster, dmap = three_cpus
    rw = from_module(WithHungry(), (torch.randn(2, 4),), name="hungry")

    def boom(self, x):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough memory: "
                           "you tried to allocate 911360 bytes.")

    monkeypatch.setattr(Hungry, "forward", boom)
    m = TorchBackend(rw, cluster, dmap, timing=FAST).measure(np.zeros(rw.graph.num_ops, dtype=np.int64))
    assert m.status == "oom" and m.oom_devices == ("cpu:0",)
    assert m.message.startswith("out of memory on cpu:0: ")
    assert m.peak_memory_bytes["cpu:0"] >= 911360  # at least the allocation that failed


def _without_proc(monkeypatch) -> None:
    """This process as on macOS or Windows: no /proc (so no resettable peak resident set, no VmRSS)."""
    import builtins

    import suite.backends.devices as devices

    def no_proc(path, *args, **kwargs):
        if str(path).startswith("/proc/"):
            raise FileNotFoundError(path)
        return builtins.open(path, *args, **kwargs)

    monkeypatch.setattr(devices, "open", no_proc, raising=False)


def test_without_a_resettable_peak_the_cpu_peak_is_unknown_not_an_earlier_placements(three_cpus, monkeypatch):
    """Without /proc (macOS, Windows) the CPU peak was getrusage's ru_maxrss, the process's lifetime maximum:
    every placement measured after a larger one reported the larger one's peak. Every CPU device is now left out of
    `peak_memory_bytes` (unknown; m_etf's OOM retries and the RL reward read a missing peak as none known).
    An OOM's need is then the failed allocation alone (2**60 floats: 2**62 bytes), not the lifetime maximum
    plus it."""
    _without_proc(monkeypatch)
    cluster, dmap = three_cpus
    model = WithHungry()
    rw = from_module(model, (torch.randn(2, 4),), name="hungry")
    be = TorchBackend(rw, cluster, dmap, timing=FAST)
    m = be.measure(np.array([0, 0, 0]))
    assert m.status == "ok" and m.peak_memory_bytes == {}  # unknown: not cpu:0's, nor 0 for the idle CPUs
    model.hungry.extra = 2**60
    m = be.measure(np.array([0, 0, 0]))
    assert m.status == "oom" and m.peak_memory_bytes == {"cpu:0": 2**62}


class _Fragmenting(nn.Module):
    """400 tensors of 256 KiB, every other one freed at once: freed blocks below glibc's mmap threshold stay in
    the heap, between live ones, and stay resident after the step."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        keep = [x * float(i) if i % 2 == 0 else (x * float(i)).sum(0, keepdim=True) for i in range(400)]
        return sum(k.sum() for k in keep)


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs a resettable peak (Linux)")
def test_a_cpu_peak_does_not_hold_what_an_earlier_placement_left_in_the_allocator():
    """The peak resident set is reset to the resident set, which held the heap memory that an earlier
    placement freed but the C allocator kept (100 MiB after `_Fragmenting`): a tiny placement measured after
    it reported its peak (382 MiB against 272 MiB measured before it). Freed heap memory now goes back to the OS
    (malloc_trim) before the peak is reset."""
    cluster, dmap = local_cluster(1, gpus=False)
    tiny = TorchBackend(from_module(Tiny(), (torch.randn(2, 4),), name="tiny"), cluster, dmap, timing=FAST)
    on_cpu0 = np.zeros(tiny.rw.graph.num_ops, dtype=np.int64)
    alone = tiny.measure(on_cpu0).peak_memory_bytes["cpu:0"]
    big = TorchBackend(from_module(_Fragmenting(), (torch.randn(64, 1024),), name="frag"), cluster, dmap,
                       timing=FAST)
    grown = big.measure(np.zeros(big.rw.graph.num_ops, dtype=np.int64)).peak_memory_bytes["cpu:0"] - alone
    assert grown > 50 * 2**20  # the big placement's own peak is well above the tiny one's
    after = tiny.measure(on_cpu0).peak_memory_bytes["cpu:0"]
    assert after < alone + grown / 4
