"""Capture of PyTorch modules: exact FLOPs on hand-computable modules, folding, shared weights, training graphs."""

from __future__ import annotations

import math
from collections import deque

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from suite.capture.flops import lstm_cell_flops
from suite.capture.fx import capture
from suite.errors import GraphError
from suite.graph import OpGraph
from suite.zoo.layers import AttentionStep, LSTMCell


def by_kind(g: OpGraph, kind: str) -> list:
    return [op for op in g.ops if op.kind == kind]


def edge_bytes(g: OpGraph, src: str, dst: str) -> int:
    s, d = g.index[src], g.index[dst]
    (e,) = [e for e in g.edges if e.src == s and e.dst == d]
    return e.bytes


# -- exact FLOPs -----------------------------------------------------------------------------------------
def test_linear_flops_bytes_params():
    g = capture(nn.Linear(8, 16), (torch.randn(4, 8),), name="lin")
    (op,) = by_kind(g, "linear")
    assert op.flops == 2 * 4 * 8 * 16 + 4 * 16  # multiply-adds x2, plus the bias add
    assert op.param_bytes == (8 * 16 + 16) * 4
    assert op.output_bytes == 4 * 16 * 4
    assert op.bytes_read == 4 * 8 * 4 + op.param_bytes
    assert op.output_shape == (4, 16)
    assert g.metadata["forward_macs"] == 4 * 8 * 16
    assert g.metadata["params"] == 8 * 16 + 16


def test_conv2d_flops_with_groups():
    conv = nn.Conv2d(4, 8, 3, padding=1, groups=2, bias=False)
    g = capture(conv, (torch.randn(2, 4, 5, 5),), name="conv")
    (op,) = by_kind(g, "conv2d")
    out_elems = 2 * 8 * 5 * 5
    assert op.flops == 2 * out_elems * (4 // 2) * 3 * 3
    assert op.param_bytes == 8 * 2 * 3 * 3 * 4


def test_lstm_cell_is_one_op_with_the_formula():
    cell = LSTMCell(3, 5)
    g = capture(cell, (torch.randn(2, 3),), name="cell")
    (op,) = by_kind(g, "lstm_cell")
    assert op.flops == 8 * 2 * 5 * (3 + 5) + 21 * 2 * 5 == lstm_cell_flops(2, 3, 5)[0]
    assert op.param_bytes == (4 * 5 * 3 + 4 * 5 * 5 + 2 * 4 * 5) * 4
    assert op.output_bytes == 2 * (2 * 5 * 4)  # (h, c)


def test_lstm_cell_formula_matches_its_own_code():
    """Tracing through the cell (no leaf) counts its functional ops one by one: the same total."""

    class OpenCell(LSTMCell):
        capture_cost = None  # not a leaf: trace its body

    torch.manual_seed(0)
    x, h, c = torch.randn(2, 3), torch.randn(2, 5), torch.randn(2, 5)
    g = capture(OpenCell(3, 5), (x, (h, c)), name="open")
    assert g.stats.total_flops == lstm_cell_flops(2, 3, 5)[0]


def test_attention_step_formula_matches_its_own_code():
    class OpenAttention(AttentionStep):
        capture_cost = None

    h, memory = torch.randn(2, 4), torch.randn(2, 6, 4)
    leaf = capture(AttentionStep(4), (h, memory), name="leaf")
    opened = capture(OpenAttention(4), (h, memory), name="open")
    assert leaf.num_ops == 3  # two inputs, one attention op
    assert leaf.stats.total_flops == opened.stats.total_flops


def test_fused_lstm_is_one_op():
    lstm = nn.LSTM(3, 5, num_layers=2, batch_first=True)
    g = capture(lstm, (torch.randn(2, 7, 3),), name="lstm")
    (op,) = by_kind(g, "lstm")
    expected = 7 * (lstm_cell_flops(2, 3, 5)[0] + lstm_cell_flops(2, 5, 5)[0])
    assert op.flops == expected


# -- folding and edges -----------------------------------------------------------------------------------
class ShapeOps(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        y = self.fc(x)  # [4, 10, 8]
        y = y.view(4, 10, 2, 4).permute(0, 2, 1, 3).contiguous().reshape(4, 80)
        z = torch.relu(y)
        return torch.tanh(self.fc(x[:, 0])) + z.sum()


def test_shape_only_ops_are_folded_and_dependencies_kept():
    g = capture(ShapeOps(), (torch.randn(4, 10, 8),), name="shapes")
    kinds = sorted(op.kind for op in g.ops)
    assert kinds == ["add", "input", "linear", "linear", "relu", "sum", "tanh", "variable"]
    assert edge_bytes(g, "fc/0", "relu") == 4 * 10 * 8 * 4  # through view/permute/contiguous/reshape
    assert edge_bytes(g, "x", "fc/1") == 4 * 8 * 4  # the slice x[:, 0], not the whole input


def test_shared_module_becomes_a_variable():
    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(6, 6)

        def forward(self, x):
            return self.fc(torch.relu(self.fc(x)))

    g = capture(Twice(), (torch.randn(3, 6),), name="twice")
    (var,) = by_kind(g, "variable")
    assert var.name == "fc/variable" and var.scope == "fc"
    assert var.param_bytes == (36 + 6) * 4 and var.output_bytes == 0
    assert [op.param_bytes for op in by_kind(g, "linear")] == [0, 0]
    assert edge_bytes(g, "fc/variable", "fc/0") == edge_bytes(g, "fc/variable", "fc/1") == var.param_bytes
    assert g.metadata["params"] == 42


def test_dropout_folded_in_inference_an_op_in_training():
    class Drop(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.drop = nn.Dropout(0.1)

        def forward(self, x):
            return self.drop(self.fc(x)).sum()

    x = torch.randn(2, 4)
    assert not by_kind(capture(Drop(), (x,), name="d"), "dropout")
    assert len(by_kind(capture(Drop(), (x,), name="d", mode="training"), "dropout")) == 1


def test_uncovered_function_uses_fallback_and_says_so():
    class Cum(nn.Module):
        def forward(self, x):
            return torch.cumsum(x, dim=0)

    g = capture(Cum(), (torch.randn(3, 4),), name="c")
    (op,) = by_kind(g, "cumsum")
    assert op.flops == 12
    assert g.metadata["fallback_cost_kinds"] == ["cumsum"]


def test_bad_mode_and_untraceable_module_are_graph_errors():
    with pytest.raises(GraphError, match="mode 'train'"):
        capture(nn.Linear(2, 2), (torch.randn(1, 2),), name="x", mode="train")

    class DataDependent(nn.Module):
        def forward(self, x):
            return x * 2 if x.sum() > 0 else x

    with pytest.raises(GraphError, match="torch.fx cannot trace DataDependent"):
        capture(DataDependent(), (torch.randn(2),), name="x")


def test_meta_tensors_capture_without_computing():
    with torch.device("meta"):
        big = nn.Linear(20000, 20000)  # 1.6 GB of weights if it were real
        x = torch.zeros(64, 20000)
    g = capture(big, (x,), name="big")
    assert by_kind(g, "linear")[0].param_bytes == (20000 * 20000 + 20000) * 4


# -- training graphs -------------------------------------------------------------------------------------
class MLPLoss(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)
        self.loss = nn.CrossEntropyLoss()

    def forward(self, x, y):
        return self.loss(self.fc2(F.relu(self.fc1(x))), y)


@pytest.fixture(scope="module")
def mlp_training() -> OpGraph:
    return capture(MLPLoss(), (torch.randn(2, 8), torch.zeros(2, dtype=torch.long)), name="mlp", mode="training")


def test_training_backward_flops(mlp_training):
    g = mlp_training
    f = {op.name: op for op in g.ops}
    # fc2 is inside the network: grad input and grad weight, 1x forward each; fc1 reads the model input
    assert f["fc2/grad"].flops == f["fc2/grad_weight"].flops == f["fc2"].flops
    assert "fc1/grad" not in f and f["fc1/grad_weight"].flops == f["fc1"].flops
    assert f["relu/grad"].flops == f["relu"].flops
    assert f["fc2/update"].flops == 4 * (16 * 4 + 4)
    assert f["fc2/update"].param_bytes == f["fc2"].param_bytes  # one momentum buffer
    assert f["fc2/grad_weight"].output_bytes == f["fc2"].param_bytes  # the weight gradient is a live tensor
    assert edge_bytes(g, "fc2/grad_weight", "fc2/update") == f["fc2"].param_bytes
    assert g.stats.ops_by_phase == {"forward": 6, "backward": 5, "update": 2}


def test_training_groups_and_reachability(mlp_training):
    check_training_structure(mlp_training)


def check_training_structure(g: OpGraph) -> None:
    """Every backward/update op is colocated with its forward op (or variable); updates reachable from the loss."""
    names = g.index
    for op in g.ops:
        if op.phase == "forward":
            continue
        assert op.group is not None, op.name
        owner = g.ops[names[op.group]]
        assert owner.phase == "forward" and owner.group == op.group, op.name
        assert op.scope == owner.scope, op.name
        if op.phase == "backward" and owner.kind != "variable":
            assert op.name.startswith(owner.name + "/grad"), op.name
    loss = [i for i, op in enumerate(g.ops) if op.phase == "forward" and
            any(g.ops[s].phase == "backward" for s in g.successors(i)) and
            not any(g.ops[s].phase == "forward" for s in g.successors(i))]
    seen = set(loss)
    queue = deque(loss)
    while queue:
        v = queue.popleft()
        for w in g.successors(v):
            if w not in seen:
                seen.add(w)
                queue.append(w)
    updates = [i for i, op in enumerate(g.ops) if op.phase == "update"]
    assert updates and all(u in seen for u in updates)
    # every op with parameters is updated exactly once
    owners = {op.group for op in g.ops if op.phase == "update"}
    assert owners == {op.name for op in g.ops if op.param_bytes > 0 and op.phase == "forward"}


def test_shared_weights_accumulate_then_update_once():
    cell = LSTMCell(4, 4)

    class Unrolled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.cell = cell

        def forward(self, x):
            state = None
            for t in range(3):
                out = self.cell(x[:, t], state)
                state = (out[0], out[1])
            return state[0].sum()

    g = capture(Unrolled(), (torch.randn(2, 3, 4),), name="rnn", mode="training")
    w = g.ops[g.index["cell/variable"]].param_bytes
    accs = by_kind(g, "accumulate_grad")
    assert len(accs) == 3 and all(a.group == "cell/variable" for a in accs)
    assert [op.name for op in by_kind(g, "apply_momentum")] == ["cell/variable/update"]
    assert edge_bytes(g, "cell/2/grad_weight", "cell/variable/acc2") == w
    assert edge_bytes(g, "cell/variable/acc2", "cell/variable/acc1") == w
    assert edge_bytes(g, "cell/variable/acc0", "cell/variable/update") == w
    # the cell keeps its gates for the backward pass in training graphs
    assert g.ops[g.index["cell/0"]].output_bytes == 2 * 2 * 4 * 4 + 5 * 2 * 4 * 4
    check_training_structure(g)


def test_grad_input_of_concat_with_many_consumers_sums():
    class Memory(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(3, 3)
            self.b = nn.Linear(3, 3)

        def forward(self, x):
            m = torch.cat([self.a(x), self.a(x) * 0 + 1], dim=1)
            return (torch.tanh(m) + torch.sigmoid(m)).sum() + self.b(x).sum()

    g = capture(Memory(), (torch.randn(2, 3),), name="m", mode="training")
    (cat_grad,) = by_kind(g, "concat_grad")
    assert cat_grad.flops == (2 - 1) * 2 * 6
    assert math.isclose(g.stats.total_flops, sum(op.flops for op in g.ops))
