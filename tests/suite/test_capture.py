"""Capture of PyTorch modules: exact FLOPs on hand-computable modules, folding, shared weights, training graphs."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections import deque

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from suite.capture.flops import Cost, TensorInfo, einsum_cost, lstm_cell_flops
from suite.capture.fx import capture
from suite.capture.ir import ForwardBuilder
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
def test_cost_op_takes_its_cost_and_outputs():
    """cost_op (shared by the fx and export captures) records the Cost and the outputs' sizes as op() would."""
    b = ForwardBuilder()
    x = b.input("x", 96, (4, 6))
    outs = [TensorInfo((4, 3), 4), TensorInfo((4, 3), 8, floating=False)]  # values (float32), indices (int64)
    cost = Cost("topk", 24.0, 2.0, saved_bytes=5, weight_bytes_read=7)
    v = b.cost_op("s/topk", "s", [x], cost, outs, differentiable=False, after=["x"])
    op = b._ops["s/topk"]
    assert v.deps == {"s/topk": 144}
    assert (op.kind, op.scope, op.flops, op.macs, op.saved_bytes, op.weight_bytes_read) == ("topk", "s", 24.0, 2.0, 5, 7)
    assert (op.output_bytes, op.output_shape, op.output_numel) == (144, (4, 3), 24)
    assert (op.inputs, op.differentiable, op.after) == ({"x": 96}, False, ("x",))


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


def test_conv2d_flops_with_a_bias_and_a_non_square_kernel():
    """Inception-V3's factorised 1x7 and 7x1 convolutions: MACs use both kernel sizes, and a bias adds 1 per
    output element, for the module and for F.conv2d."""
    conv = nn.Conv2d(3, 4, (1, 7), padding=(0, 3))
    out_elems = 2 * 4 * 5 * 9
    expected = 2 * out_elems * 3 * 1 * 7 + out_elems
    g = capture(conv, (torch.randn(2, 3, 5, 9),), name="conv")
    (op,) = by_kind(g, "conv2d")
    assert (op.flops, g.metadata["forward_macs"]) == (expected, out_elems * 3 * 7) == (15480, 7560)

    class Functional(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w, self.b = nn.Parameter(torch.randn(4, 3, 7, 1)), nn.Parameter(torch.randn(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.conv2d(x, self.w, self.b, padding=(3, 0))

    g = capture(Functional(), (torch.randn(2, 3, 5, 9),), name="f")
    (op,) = by_kind(g, "conv2d")
    assert (op.flops, g.metadata["forward_macs"]) == (15480, 7560)


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


def test_attention_step_saves_probabilities_its_concatenation_and_its_output():
    """In training the attention op keeps B S probabilities, [context; h] (2 B H) and tanh's output (B H) for
    its backward pass, held beside its output (B H)."""

    class Loss(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.att = AttentionStep(4)

        def forward(self, h: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
            return self.att(h, memory).sum()

    g = capture(Loss(), (torch.randn(2, 4), torch.randn(2, 6, 4)), name="att", mode="training")
    (op,) = [op for op in by_kind(g, "attention") if op.phase == "forward"]
    assert op.output_bytes == 2 * 4 * 4 + (2 * 6 + 3 * 2 * 4) * 4 == 176


def test_fused_lstm_is_one_op():
    lstm = nn.LSTM(3, 5, num_layers=2, batch_first=True)
    g = capture(lstm, (torch.randn(2, 7, 3),), name="lstm")
    (op,) = by_kind(g, "lstm")
    expected = 7 * (lstm_cell_flops(2, 3, 5)[0] + lstm_cell_flops(2, 5, 5)[0])
    assert op.flops == expected


def test_lstm_without_biases_counts_no_bias_adds():
    """bias=False: the gates are x W_ih^T + h W_hh^T, one add instead of three, 8 B H fewer FLOPs a step."""
    (op,) = by_kind(capture(nn.LSTM(3, 5, bias=False), (torch.randn(7, 2, 3),), name="lstm"), "lstm")
    assert op.flops == 7 * (lstm_cell_flops(2, 3, 5)[0] - 8 * 2 * 5)
    (gru,) = by_kind(capture(nn.GRU(3, 5, bias=False), (torch.randn(7, 2, 3),), name="gru"), "gru")
    assert gru.flops == 7 * (2 * 3 * 2 * 5 * (3 + 5) + 4 * 3 * 2 * 5)  # 2 x MACs + (6 - 2) per gate element


@pytest.mark.filterwarnings("ignore:LSTM with projections is not supported with oneDNN")  # torch's own fallback
def test_lstm_with_projections_counts_the_projected_state():
    """proj_size P: the recurrent input h has P features, and h = W_hr (o * tanh(c)) adds B H P MACs."""
    g = capture(nn.LSTM(3, 5, proj_size=2), (torch.randn(4, 2, 3),), name="lstm")
    (op,) = by_kind(g, "lstm")
    macs = 4 * 2 * 5 * (3 + 2) + 2 * 5 * 2
    assert op.flops == 4 * (2 * macs + 21 * 2 * 5)
    assert g.metadata["forward_macs"] == 4 * macs


class _Unrolled(nn.Module):
    """A torch.nn recurrent cell called for 3 steps, the state fed back."""

    def __init__(self, cell: nn.Module) -> None:
        super().__init__()
        self.cell = cell

    def forward(self, x):
        state = self.cell(x[0])
        for t in (1, 2):
            state = self.cell(x[t], state)
        h = state[0] if isinstance(self.cell, nn.LSTMCell) else state
        return h.sum()


@pytest.mark.parametrize(
    ("cell", "kind", "flops", "macs"),
    [  # B = 2, I = 4, H = 6 per step
        (nn.LSTMCell(4, 6), "lstm_cell", 2 * 480 + 21 * 2 * 6, 4 * 2 * 6 * (4 + 6)),
        (nn.LSTMCell(4, 6, bias=False), "lstm_cell", 2 * 480 + 21 * 2 * 6 - 2 * 4 * 2 * 6, 480),
        (nn.GRUCell(4, 6), "gru_cell", 2 * 360 + 6 * 3 * 2 * 6, 3 * 2 * 6 * (4 + 6)),
        (nn.RNNCell(4, 6), "rnn_cell", 2 * 120 + 6 * 2 * 6, 2 * 6 * (4 + 6)),
    ],
)
def test_torch_recurrent_cells_count_the_cell_formula(cell, kind, flops, macs):
    """nn.LSTMCell / GRUCell / RNNCell get the formula of one step of nn.LSTM / GRU / RNN (they had no rule:
    1 FLOP per output element, 2 B H = 24 for the LSTM cell's (h, c) instead of 1212)."""
    x = torch.randn(3, 2, 4)
    g = capture(_Unrolled(cell), (x,), name="cell")
    steps = [op for op in g.ops if op.name.startswith("cell/") and op.kind != "variable"]
    assert [(op.kind, op.flops) for op in steps] == [(kind, flops)] * 3
    assert g.metadata["forward_macs"] == 3 * macs and "fallback_cost_kinds" not in g.metadata
    if kind == "lstm_cell":  # training keeps the gates and tanh(c'): 5 B H floats beside (h, c)
        t = capture(_Unrolled(cell), (x,), name="cell", mode="training")
        assert t.ops[t.index["cell/1"]].output_bytes == 2 * 2 * 6 * 4 + 5 * 2 * 6 * 4


class _Fn3(nn.Module):
    """A function of three tensors as a module."""

    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, a, b, c):
        return self.fn(a, b, c)


@pytest.mark.parametrize(
    ("fn", "shapes", "macs", "bias"),
    [
        (torch.addmm, [(3, 5), (3, 4), (4, 5)], 3 * 4 * 5, 3 * 5),
        (torch.baddbmm, [(2, 3, 5), (2, 3, 4), (2, 4, 5)], 2 * 3 * 4 * 5, 2 * 3 * 5),
        (torch.addbmm, [(3, 5), (2, 3, 4), (2, 4, 5)], 2 * 3 * 4 * 5, 3 * 5),  # sums the 2 products
    ],
)
def test_add_matmul_functions_count_the_product_and_the_added_input(fn, shapes, macs, bias):
    g = capture(_Fn3(fn), tuple(torch.randn(*s) for s in shapes), name="mm")
    (op,) = by_kind(g, "matmul")
    assert (op.flops, g.metadata["forward_macs"]) == (2 * macs + bias, macs)


def test_attention_with_another_value_width():
    """softmax(q k^T) v: the second product has v's width, not q's."""
    q, k, v = torch.randn(2, 4, 3, 8), torch.randn(2, 4, 5, 8), torch.randn(2, 4, 5, 16)
    g = capture(_Fn3(F.scaled_dot_product_attention), (q, k, v), name="sdpa")
    (op,) = by_kind(g, "attention")
    macs = 2 * 4 * 3 * 5 * 8 + 2 * 4 * 3 * 5 * 16
    assert op.flops == 2 * macs + 5 * 2 * 4 * 3 * 5


def test_multihead_attention_with_other_key_and_value_widths():
    mha = nn.MultiheadAttention(8, 2, kdim=4, vdim=6)
    g = capture(mha, (torch.randn(3, 2, 8), torch.randn(5, 2, 4), torch.randn(5, 2, 6)), name="mha")
    (op,) = by_kind(g, "multihead_attention")
    proj = 2 * 3 * 8 * 8 + 2 * 5 * 4 * 8 + 2 * 5 * 6 * 8 + 2 * 3 * 8 * 8  # q, k, v, out projections
    attn = 2 * 2 * 3 * 5 * 8  # scores and weighted sum, all heads
    bias = 2 * 3 * 8 + 2 * 5 * 8 + 2 * 5 * 8 + 2 * 3 * 8  # q, k, v, out biases: one add per output element
    assert op.flops == 2 * (proj + attn) + bias + 5 * 2 * 2 * 3 * 5


@pytest.mark.parametrize("extra", [{"add_bias_kv": True}, {"add_zero_attn": True}, {"add_bias_kv": True, "add_zero_attn": True}])
def test_multihead_attention_with_added_keys_attends_to_them(extra):
    """add_bias_kv and add_zero_attn each append a key and value (after the projections) that every query
    attends to: torch's own count has 2 x B x Lq x E more multiply-adds for each; they were left out."""
    from torch.utils.flop_counter import FlopCounterMode

    mha = nn.MultiheadAttention(8, 2, **extra)
    q, k = torch.randn(5, 2, 8), torch.randn(7, 2, 8)
    g = capture(mha, (q, k, k), name="mha")
    with FlopCounterMode(display=False) as counter:
        mha(q, k, k)
    added = 1 + ("add_zero_attn" in extra and "add_bias_kv" in extra)
    (op,) = by_kind(g, "multihead_attention")
    assert g.metadata["forward_macs"] == counter.get_total_flops() / 2 == 4192 + added * 2 * 2 * 5 * 8
    scores = 2 * 2 * 5 * (7 + added)
    assert op.flops == 2 * (4192 + added * 160) + 2 * (5 + 2 * 7) * 8 + 2 * 5 * 8 + 5 * scores


@pytest.mark.parametrize("functional", [False, True])
def test_conv_transpose_rule(functional):
    class Functional(nn.ConvTranspose2d):
        def forward(self, x):
            return F.conv_transpose2d(x, self.weight, self.bias, stride=2, groups=2)

    conv = (Functional if functional else nn.ConvTranspose2d)(4, 8, 3, stride=2, groups=2)
    g = capture(conv, (torch.randn(1, 4, 5, 5),), name="ct")
    (op,) = [op for op in g.ops if op.kind.startswith("conv")]
    out_numel = 8 * 11 * 11
    assert op.flops == 2 * (4 * 5 * 5) * (8 // 2) * 3 * 3 + out_numel
    assert "fallback_cost_kinds" not in g.metadata


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


class Twice(nn.Module):
    """One linear layer used twice: its weights become a shared variable."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x):
        return self.fc(torch.relu(self.fc(x)))


def test_shared_module_becomes_a_variable():
    g = capture(Twice(), (torch.randn(3, 6),), name="twice")
    (var,) = by_kind(g, "variable")
    assert var.name == "fc/variable" and var.scope == "fc"
    assert var.param_bytes == (36 + 6) * 4 and var.output_bytes == 0
    assert [op.param_bytes for op in by_kind(g, "linear")] == [0, 0]
    assert edge_bytes(g, "fc/variable", "fc/0") == edge_bytes(g, "fc/variable", "fc/1") == var.param_bytes
    assert g.metadata["params"] == 42


def test_a_variable_reads_nothing_its_users_read_the_weights():
    g = capture(Twice(), (torch.randn(3, 6),), name="twice")
    f = {op.name: op for op in g.ops}
    w = (36 + 6) * 4
    assert (f["fc/variable"].bytes_read, f["fc/variable"].bytes_written) == (0, 0)
    # each use reads its input [3, 6] and the weights
    assert f["fc/0"].bytes_read == f["fc/1"].bytes_read == 3 * 6 * 4 + w


class Lookup(nn.Module):
    """An embedding table of 100 x 8 looked up for 2 x 3 tokens, then summed."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(100, 8)

    def forward(self, ids):
        return self.emb(ids).sum()


@pytest.mark.parametrize("mode", ["inference", "training"])
def test_an_embedding_reads_the_rows_it_gathers_not_its_table(mode):
    g = capture(Lookup(), (torch.zeros(2, 3, dtype=torch.long),), name="lookup", mode=mode)
    (emb,) = by_kind(g, "embedding")
    assert emb.param_bytes == 100 * 8 * 4  # the whole table is resident
    assert emb.output_bytes == 2 * 3 * 8 * 4
    assert emb.bytes_read == 2 * 3 * 8 + 2 * 3 * 8 * 4  # the int64 ids and the 6 rows of 8 floats


class Bags(nn.Module):
    """Bags of rows of a 100 x 8 table: nn.EmbeddingBag (mean) over 6 ids in 2 bags, and F.embedding_bag
    (sum, weighted per id) over the same ids in [2, 3] bags of the same table."""

    def __init__(self) -> None:
        super().__init__()
        self.bag = nn.EmbeddingBag(100, 8, mode="mean")
        self.w = nn.Parameter(torch.randn(100, 8))

    def forward(self, ids, offsets, weights):
        summed = F.embedding_bag(ids.view(2, 3), self.w, mode="sum", per_sample_weights=weights.view(2, 3))
        return (self.bag(ids, offsets) + summed).sum()


@pytest.mark.parametrize("mode", ["inference", "training"])
def test_an_embedding_bag_reads_and_reduces_the_rows_it_looks_up(mode):
    """An embedding bag costs 1 FLOP per looked-up element (6 ids x 8), 1 more with per-sample weights, and
    a mean divides each output element (2 bags x 8); it reads its ids and the 6 rows it looks up, not its
    table. It took the fallback: 1 FLOP per output element (16), reading all 100 rows."""
    ids, offsets, weights = torch.tensor([1, 5, 7, 2, 2, 9]), torch.tensor([0, 2]), torch.rand(6)
    g = capture(Bags(), (ids, offsets, weights), name="bags", mode=mode)
    assert "fallback_cost_kinds" not in g.metadata
    f = {op.name: op for op in g.ops}
    rows = 6 * 8 * 4
    assert (f["bag"].kind, f["bag"].flops) == ("embedding_bag", 6 * 8 + 2 * 8)
    assert f["bag"].param_bytes == 100 * 8 * 4  # the whole table is resident
    assert f["bag"].bytes_read == 6 * 8 + 2 * 8 + rows  # int64 ids and offsets, 6 rows of 8 floats
    assert (f["embedding_bag"].kind, f["embedding_bag"].flops) == ("embedding_bag", 2 * 6 * 8)
    assert f["embedding_bag"].bytes_read == 6 * 8 + 6 * 4 + rows  # ids, weights, rows
    if mode == "training":  # the weight gradient scatters the looked-up elements
        assert f["bag/grad_weight"].flops == 64 and f["bag/grad_weight"].output_bytes == 100 * 8 * 4
        assert "embedding_bag/grad" not in f  # ids and weights are inputs: no gradient
        assert f["embedding_bag/grad_weight"].flops == 96


class _Fc(nn.Module):
    """One layer, fc, for the small models of the tests below."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)


class _FcFc(_Fc):
    """Two layers, fc and fc2, for the small models of the tests below."""

    def __init__(self) -> None:
        super().__init__()
        self.fc2 = nn.Linear(4, 4)


@pytest.mark.parametrize("make", [torch.zeros_like, lambda a: a.new_zeros(2, 4), lambda a: torch.full_like(a, 0.5),
                                  torch.randn_like, torch.rand_like, lambda a: torch.randint_like(a, 5)])
def test_a_tensor_made_like_another_reads_nothing_and_passes_no_gradient(make):
    """zeros_like(a) reads a's shape, not its data: a constant, as torch.zeros(2, 4). It was an op reading
    a's 32 bytes, and in training the gradient of fc2's input flowed through it to fc: a backward op
    fc2/grad of 72 FLOPs that autograd never runs, and a false dependency of fc/grad_weight on it. So are
    randn_like(a) (a VAE's noise), rand_like and randint_like, which had the same backward ops."""

    class Net(_FcFc):
        def forward(self, x):
            a = self.fc(x)
            return (self.fc2(make(a)) + a).sum()

    g = capture(Net(), (torch.randn(2, 4),), name="net")
    assert [op.name for op in g.ops] == ["x", "fc", "fc2", "add", "sum_1"]
    assert g.ops[g.index["fc2"]].bytes_read == 80  # its weights only
    t = capture(Net(), (torch.randn(2, 4),), name="net", mode="training")
    assert [op.name for op in t.ops if op.phase == "backward"] == [
        "sum_1/grad", "add/grad", "fc2/grad_weight", "fc/grad_weight"]
    # forward 72 + 72 + 8 + 8; backward 8 + 8 + 72 + 72; updates 4 x 20 parameters twice
    assert sum(op.flops for op in t.ops) == 160 + 160 + 160


def test_dropout_folded_in_inference_an_op_in_training():
    class Drop(_Fc):
        def __init__(self) -> None:
            super().__init__()
            self.drop = nn.Dropout(0.1)

        def forward(self, x):
            return self.drop(self.fc(x)).sum()

    x = torch.randn(2, 4)
    assert not by_kind(capture(Drop(), (x,), name="d"), "dropout")
    assert len(by_kind(capture(Drop(), (x,), name="d", mode="training"), "dropout")) == 1


class _DropCalls(_Fc):
    """Dropout calls as functions: with training=self.training (by keyword and by position), and always on."""

    def forward(self, x):
        a = F.dropout(self.fc(x), 0.5, training=self.training)
        b = torch.dropout(x, 0.5, self.training)
        return (a + b + F.dropout(x, 0.5)).sum()


def test_a_dropout_call_with_training_false_is_folded_in_a_training_graph():
    """F.dropout(x, p, training=False) returns x in a training step too (a submodule in eval() calls it so):
    it was counted as a dropout op (1 FLOP and 1 saved byte per element)."""
    x = torch.randn(2, 4)
    model = nn.Sequential(_DropCalls())
    g = capture(model, (x,), name="d", mode="training")
    assert [op.name for op in by_kind(g, "dropout")] == ["0/dropout", "0/dropout_1", "0/dropout_2"]
    model[0].eval()
    g = capture(model, (x,), name="d", mode="training")
    assert [op.name for op in by_kind(g, "dropout")] == ["0/dropout_2"]
    assert [op.name for op in g.ops if op.phase == "forward"] == ["input_1", "0.fc", "0/add", "0/dropout_2", "0/add_1",
                                                                  "0/sum_1"]


def test_uncovered_function_uses_fallback_and_says_so():
    class Pinv(nn.Module):
        def forward(self, x):
            return torch.linalg.pinv(x)

    with pytest.warns(UserWarning, match="^c: no FLOP rule for linalg_pinv: counted as 1 FLOP per output element"):
        g = capture(Pinv(), (torch.randn(3, 4),), name="c")
    (op,) = by_kind(g, "linalg_pinv")
    assert op.flops == 12
    assert g.metadata["fallback_cost_kinds"] == ["linalg_pinv"]


def test_bad_mode_and_untraceable_module_are_graph_errors():
    with pytest.raises(GraphError, match="mode 'train'"):
        capture(nn.Linear(2, 2), (torch.randn(1, 2),), name="x", mode="train")

    class DataDependent(nn.Module):
        def forward(self, x):
            return x * 2 if x.sum() > 0 else x

    with pytest.raises(GraphError, match="torch.fx cannot trace DataDependent"):
        capture(DataDependent(), (torch.randn(2),), name="x")


def test_training_mode_needs_a_scalar_loss():
    """The backward pass differentiates one scalar: logits, or two outputs, are an error, not a guess."""
    with pytest.raises(GraphError, match=r"training mode needs Linear to return its loss, one scalar tensor; "
                                         r"it returns \(3, 2\)"):
        capture(nn.Linear(4, 2), (torch.randn(3, 4),), name="x", mode="training")

    class TwoOutputs(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            y = self.fc(x)
            return y.sum(), y.mean()

    with pytest.raises(GraphError, match=r"it returns \(\), \(\)"):
        capture(TwoOutputs(), (torch.randn(3, 4),), name="x", mode="training")

    class DictOutputs(TwoOutputs):  # a dict's entries are named
        def forward(self, x):
            y = self.fc(x)
            return {"sum": y.sum(), "none": None, "both": (y, y.mean())}

    with pytest.raises(GraphError, match=r"it returns \{'sum': \(\), 'none': no tensor, 'both': \(3, 2\), \(\)\} "
                                         r"\(wrap the model in a module that computes the loss"):
        capture(DictOutputs(), (torch.randn(3, 4),), name="x", mode="training")

    class Loss(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            return self.fc(x).square().mean()

    g = capture(Loss(), (torch.randn(3, 4),), name="x", mode="training")
    assert any(op.phase == "backward" for op in g.ops) and any(op.phase == "update" for op in g.ops)
    assert capture(nn.Linear(4, 2), (torch.randn(3, 4),), name="x").metadata["mode"] == "inference"  # any output


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


class UnrolledCell(nn.Module):
    """One LSTMCell(4, 4) applied at 3 time steps: its weights are shared by 3 ops."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = LSTMCell(4, 4)

    def forward(self, x):
        state = None
        for t in range(3):
            out = self.cell(x[:, t], state)
            state = (out[0], out[1])
        return state[0].sum()


def _unrolled_training_graph():
    return capture(UnrolledCell(), (torch.randn(2, 3, 4),), name="rnn", mode="training")


def test_shared_weights_accumulate_then_update_once():
    g = _unrolled_training_graph()
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


# -- exact FLOPs of the fused and attention rules (hand-computed) -----------------------------------------
def test_bidirectional_multilayer_lstm_counts_both_directions():
    g = capture(nn.LSTM(3, 5, num_layers=2, bidirectional=True), (torch.randn(7, 2, 3),), name="bi")
    (op,) = by_kind(g, "lstm")
    # per cell 8BH(I+H) + 21BH, B=2, H=5: layer 0 (I=3) 8*10*8 + 210 = 850; layer 1 reads both directions (I=10)
    # 8*10*15 + 210 = 1410; 7 steps x 2 directions: 14 * (850 + 1410) = 31640
    assert op.flops == 31640 == 14 * (lstm_cell_flops(2, 3, 5)[0] + lstm_cell_flops(2, 10, 5)[0])
    assert g.metadata["forward_macs"] == 14 * (4 * 2 * 5 * 8 + 4 * 2 * 5 * 15)  # 14 * (320 + 600) = 12880


def test_fused_gru_formula_and_lstm_saved_gates_in_training():
    class Gru(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gru = nn.GRU(4, 6)

        def forward(self, x):
            return self.gru(x)[0].sum()

    (gru,) = by_kind(capture(Gru(), (torch.randn(5, 3, 4),), name="gru"), "gru")
    # per step MACs 3 gates B H (I + H) = 3*3*6*10 = 540; FLOPs 2*540 + 6 per gate unit (6*3*3*6 = 324); 5 steps
    assert gru.flops == 5 * (2 * 540 + 324) == 7020

    class Lstm(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm = nn.LSTM(3, 5)

        def forward(self, x):
            return self.lstm(x)[0].sum()

    x = torch.randn(4, 2, 3)
    infer = capture(Lstm(), (x,), name="l")
    train = capture(Lstm(), (x,), name="l", mode="training")
    # outputs: (4,2,5) + h_n (1,2,5) + c_n (1,2,5) fp32 = (40 + 10 + 10) * 4 = 240 B
    assert infer.ops[infer.index["lstm"]].output_bytes == 240
    # training keeps 5 B H per step (4 gates + tanh c): 5*2*5*4 steps*4 B = 800 B
    assert train.ops[train.index["lstm"]].output_bytes == 240 + 800
    assert edge_bytes(train, "lstm", "lstm/grad_weight") == 1040


def test_multihead_attention_formula_by_hand():
    class Cross(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mha = nn.MultiheadAttention(8, 2)

        def forward(self, q, kv):
            return self.mha(q, kv, kv)[0]

    g = capture(Cross(), (torch.randn(3, 2, 8), torch.randn(5, 2, 8)), name="mha")  # Lq=3, Lk=5, B=2, E=8
    (op,) = by_kind(g, "multihead_attention")
    # projections: q B Lq E^2 + k, v 2 B Lk E^2 + out B Lq E^2 = 2*(3+10)*64 + 2*3*64 = 2048 MACs;
    # scores and weighted sum 2 B Lq Lk E = 480 MACs; softmax 5 per score, B heads Lq Lk = 2*2*3*5 = 60 scores;
    # biases, one add per output element of each projection: B (Lq + 2 Lk) E + B Lq E = 208 + 48 = 256
    assert g.metadata["forward_macs"] == 2048 + 480
    assert op.flops == 2 * 2528 + 256 + 5 * 60 == 5612
    no_bias = Cross()
    no_bias.mha = nn.MultiheadAttention(8, 2, bias=False)
    (op,) = by_kind(capture(no_bias, (torch.randn(3, 2, 8), torch.randn(5, 2, 8)), name="mha"), "multihead_attention")
    assert op.flops == 5356
    # unbatched [L, E]: one sequence, half of the batch of two (it was read as Lq=3, B=8)
    (op,) = by_kind(capture(Cross(), (torch.randn(3, 8), torch.randn(5, 8)), name="mha"), "multihead_attention")
    assert op.flops == 5612 / 2

    class Trained(Cross):
        def forward(self, q, kv):
            return self.mha(q, kv, kv)[0].sum()

    # training keeps the attention weights for the backward pass: 60 scores of 4 bytes on top of the outputs
    # (the attended values, 2*3*8 floats, and the weights averaged over heads, 2*3*5)
    train = capture(Trained(), (torch.randn(3, 2, 8), torch.randn(5, 2, 8)), name="mha", mode="training")
    (op,) = by_kind(train, "multihead_attention")
    assert op.output_bytes == 4 * (2 * 3 * 8 + 2 * 3 * 5) + 4 * 60


def test_scaled_dot_product_attention_and_addmm_rules_by_hand():
    class Fns(nn.Module):
        def forward(self, q, k, v, x, w, b):
            return F.scaled_dot_product_attention(q, k, v), torch.addmm(b, x, w)

    args = (torch.randn(2, 2, 3, 4), torch.randn(2, 2, 5, 4), torch.randn(2, 2, 5, 4),
            torch.randn(4, 3), torch.randn(3, 6), torch.randn(6))
    g = capture(Fns(), args, name="fns")
    (att,) = by_kind(g, "attention")
    # q k^T and p v: 2 x (B H Lq) Lk d = 2 * 12 * 5 * 4 = 480 MACs; softmax 5 * 12 * 5 = 300
    assert att.flops == 2 * 480 + 300 == 1260
    (mm,) = by_kind(g, "matmul")
    # addmm(b, x[4,3], w[3,6]): the inner dimension is x's (3), not the bias's (6): 4*6*3 = 72 MACs, plus
    # the bias add (1 per output element, as nn.Linear)
    assert g.metadata["forward_macs"] == 480 + 72 and mm.flops == 2 * 72 + 4 * 6


def test_norm_pool_and_reduction_rules_by_hand():
    class Norms(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bn, self.ln = nn.BatchNorm2d(3), nn.LayerNorm(4)
            self.gap, self.mp = nn.AdaptiveAvgPool2d(1), nn.MaxPool2d(2)

        def forward(self, x):
            a = self.bn(x)
            return self.gap(a).sum() + self.mp(a).sum() + a.mean(dim=(2, 3)).sum() + self.ln(a).sum()

    x = torch.randn(2, 3, 4, 4)  # 96 elements
    for mode, bn_per_element in (("inference", 2), ("training", 4)):
        g = capture(Norms(), (x,), name="norms", mode=mode)
        f = {op.name: op for op in g.ops}
        assert f["bn"].flops == bn_per_element * 96
        assert f["ln"].flops == 5 * 96
        assert f["gap"].flops == 96  # 1 per input element, not per output element (6)
        assert f["mean"].flops == 96
        assert f["mp"].flops == 24 * 2 * 2  # output elements (2*3*2*2) x kernel elements


def test_max_and_min_of_two_tensors_are_elementwise_not_reductions():
    """torch.max(a, b) / torch.min(a, b) (and the methods) are elementwise, 1 per output element; they were
    counted as a reduction of their first argument: 10 FLOPs for a [1, 10] against a [4, 10] (40 elements)."""

    class Pairwise(nn.Module):
        def forward(self, a, b):
            return torch.max(a, b) + torch.min(b, a) + a.max(b) + a.max(dim=1)[0].sum()

    g = capture(Pairwise(), (torch.randn(1, 10), torch.randn(4, 10)), name="pairwise")
    f = {op.kind: [] for op in g.ops}
    for op in g.ops:
        f[op.kind].append(op.flops)
    assert f["max"] == [40, 40, 10] and f["min"] == [40]  # the last max reduces a's 10 elements along dim 1


@pytest.mark.parametrize(
    ("pool", "shape", "kind", "flops"),
    [
        (nn.MaxPool2d(3), (2, 6, 6), "max_pool2d", 2 * 2 * 2 * 9),  # unbatched [C, H, W]: a 3x3 window
        (nn.AvgPool2d(2), (2, 6, 6), "avg_pool2d", 2 * 3 * 3 * 4),
        (nn.MaxPool1d(3), (2, 6), "max_pool1d", 2 * 2 * 3),  # unbatched [C, L]
        (nn.AvgPool3d(2), (1, 4, 4, 4), "avg_pool3d", 1 * 2 * 2 * 2 * 8),  # unbatched [C, D, H, W]
        (nn.MaxPool2d(3), (1, 2, 6, 6), "max_pool2d", 2 * 2 * 2 * 9),  # batched, as before
    ],
)
def test_pooling_modules_count_their_window_on_unbatched_inputs(pool, shape, kind, flops):
    """The window has as many dimensions as the module's class says (MaxPool2d: 2), whatever the input's
    rank: an unbatched input was taken for one of fewer dimensions (MaxPool2d on [C, H, W]: "max_pool1d",
    3 of its 9 elements counted; MaxPool1d on [C, L]: "max_pool0d", 1 of 3)."""
    g = capture(pool, (torch.randn(*shape),), name="pool")
    (op,) = [op for op in g.ops if op.kind != "input"]
    assert (op.kind, op.flops) == (kind, flops)


def test_cross_entropy_cost_and_saved_log_probabilities(mlp_training):
    f = {op.name: op for op in mlp_training.ops}
    # logits [2, 4]: log-softmax 5 * 8 + 1 per sample (2) = 42
    assert f["loss"].flops == 42 and f["loss/grad"].flops == 42
    # training keeps the log-probabilities (8 * 4 B) beside the scalar loss (4 B)
    assert f["loss"].output_bytes == 4 + 32
    infer = capture(MLPLoss(), (torch.randn(2, 8), torch.zeros(2, dtype=torch.long)), name="mlp")
    assert infer.ops[infer.index["loss"]].output_bytes == 4


def test_classification_losses_count_samples_along_dimension_one():
    """Classes are dimension 1: logits [2, 5, 3, 4] are 2 x 3 x 4 = 24 samples (counted as 2 x 5 x 3 = 30
    before, by the last dimension); nn.NLLLoss has the rule of F.nll_loss (it had none: 1 FLOP)."""

    class Losses(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ce, self.nll = nn.CrossEntropyLoss(), nn.NLLLoss()

        def forward(self, x, t):
            return self.ce(x, t), F.cross_entropy(x, t), self.nll(x, t), F.nll_loss(x, t), self.ce(x[:, :, 0, 0], t[:, 0, 0])

    g = capture(Losses(), (torch.randn(2, 5, 3, 4), torch.zeros(2, 3, 4, dtype=torch.long)), name="losses")
    assert [op.flops for op in g.ops if op.kind != "input"] == [5 * 120 + 24, 5 * 120 + 24, 24, 24, 5 * 10 + 2]
    assert "fallback_cost_kinds" not in g.metadata


def test_sizes_follow_the_recorded_dtypes():
    class Mixed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(10, 4)
            self.fc = nn.Linear(4, 3).double()

        def forward(self, tokens, x):
            return self.emb(tokens), self.fc(x)

    g = capture(Mixed(), (torch.zeros(2, 5, dtype=torch.long), torch.randn(2, 4, dtype=torch.float64)), name="dt")
    f = {op.name: op for op in g.ops}
    assert f["tokens"].output_bytes == 10 * 8  # int64 token ids
    assert f["x"].output_bytes == 8 * 8  # float64
    assert f["emb"].output_bytes == 2 * 5 * 4 * 4 and f["emb"].param_bytes == 40 * 4  # fp32 embedding table
    assert f["fc"].output_bytes == 6 * 8 and f["fc"].param_bytes == (12 + 3) * 8  # float64 layer


def test_reading_a_value_twice_reads_its_producer_once_and_single_shared_weight_naming():
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4, bias=False)

        def forward(self, x):
            y = self.fc(x)
            return F.linear(y * y, self.fc.weight)

    g = capture(Tied(), (torch.randn(3, 4),), name="tied")
    assert edge_bytes(g, "fc", "mul") == 3 * 4 * 4  # y * y reads y once: 48 B, not 96
    assert g.ops[g.index["mul"]].bytes_read == 48
    # one shared parameter: the variable is named after its module, not after the parameter
    (var,) = by_kind(g, "variable")
    assert var.name == "fc/variable" and var.param_bytes == 64
    assert edge_bytes(g, "fc/variable", "linear") == 64
    assert g.ops[g.index["linear"]].bytes_read == 48 + 64  # its input and the shared weights it reads


# -- training graphs: exact edges and bytes ---------------------------------------------------------------
def test_backward_ops_read_saved_activations_inputs_and_weights(mlp_training):
    g = mlp_training
    f = {op.name: op for op in g.ops}
    # shapes: x [2,8] 64 B, fc1/relu out [2,16] 128 B, fc2 out [2,4] 32 B, fc2 params (64+4)*4 = 272 B
    # grad weight = grad output x saved inputs: reads the loss gradient, fc2's output and fc2's input (relu)
    assert edge_bytes(g, "loss/grad", "fc2/grad_weight") == 32
    assert edge_bytes(g, "fc2", "fc2/grad_weight") == 32
    assert edge_bytes(g, "relu", "fc2/grad_weight") == 128
    assert edge_bytes(g, "x", "fc1/grad_weight") == 64
    # grad input = grad output x weights: 32 (grad) + 32 (saved output) + 272 (own weights)
    assert f["fc2/grad"].bytes_read == 336 and f["fc2/grad"].output_bytes == 128
    # an op without weights reads its gradient, its output and its inputs: 3 * 128
    assert f["relu/grad"].bytes_read == 384 and edge_bytes(g, "fc1", "relu/grad") == 128
    # the loss's backward op reads its saved output (4 + 32 B) and inputs (logits 32 B, labels 16 B)
    assert edge_bytes(g, "loss", "loss/grad") == 36 and f["loss/grad"].bytes_read == 36 + 32 + 16
    # update: reads weights, gradient, momentum; writes weights and momentum
    assert (f["fc2/update"].bytes_read, f["fc2/update"].bytes_written, f["fc2/update"].output_bytes) == (816, 544, 0)


def test_accumulation_and_variable_update_bytes():
    g = _unrolled_training_graph()
    f = {op.name: op for op in g.ops}
    count = 4 * 4 * 4 + 4 * 4 * 4 + 2 * 16  # 160 parameters
    w = 4 * count  # 640 B
    assert f["cell/variable"].param_bytes == w and f["cell/variable"].group == "cell/variable"
    # the first accumulation (last use) only copies the gradient; the others also read the running sum
    assert (f["cell/variable/acc2"].bytes_read, f["cell/variable/acc1"].bytes_read, f["cell/variable/acc0"].bytes_read) \
        == (w, 2 * w, 2 * w)
    assert all(f[f"cell/variable/acc{i}"].flops == count for i in range(3))
    upd = f["cell/variable/update"]
    assert (upd.flops, upd.bytes_read, upd.bytes_written, upd.param_bytes) == (4 * count, 3 * w, 2 * w, w)
    # grad input of a step reads the shared weights; the first step reads only the (inactive) input: none
    assert edge_bytes(g, "cell/variable", "cell/1/grad") == w and "cell/0/grad" not in f
    assert f["cell/2/grad_weight"].output_bytes == w


def test_embedding_scatter_pass_through_concat_and_inactive_ops():
    class Emb(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(10, 4)
            self.fc = nn.Linear(8, 1)

        def forward(self, tokens, z):
            e = self.emb(tokens)  # [2, 2, 4] = 64 B
            return self.fc(torch.cat([e[:, 0], F.dropout(z, 0.5)], dim=1)).sum()

    g = capture(Emb(), (torch.zeros(2, 2, dtype=torch.long), torch.randn(2, 4)), name="emb", mode="training")
    f = {op.name: op for op in g.ops}
    # the embedding's weight gradient scatters its output gradient: 1 FLOP per output element (2*2*4)
    assert f["emb/grad_weight"].flops == 16 and "emb/grad" not in f
    # the concat (no FLOPs, one consumer) gets no backward op: fc's input gradient flows straight to the
    # embedding, and only for the slice e[:, 0] (32 B) that went into the concat
    assert "cat/grad" not in f and f["cat"].group is None
    assert edge_bytes(g, "fc/grad", "emb/grad_weight") == 32
    # dropout of the model input needs no gradient: no backward op, no group, no mask kept
    assert f["dropout"].group is None and f["dropout"].output_bytes == 2 * 4 * 4
    assert not any(op.name.startswith("dropout/") for op in g.ops)


class _NoGrad(nn.Module):
    """A mask (a comparison), a detached branch and the indices of max: none passes a gradient back to fc."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.fc2, self.emb = nn.Linear(4, 4), nn.Linear(4, 4), nn.Embedding(4, 4)

    def forward(self, x):
        a = self.fc(x)
        mask = (a > 0).float()
        return (self.fc2(a) * mask).sum() + a.detach().sum() + self.emb(a.max(1)[1]).sum()


def test_no_gradient_flows_through_comparisons_detach_or_integer_results():
    """Autograd passes nothing back through `a > 0` (bool), `a.detach()` or the indices of `a.max(1)`:
    they had backward ops (gt/grad, float_1/grad, sum_2/grad, emb/grad: 8 + 8 + 8 + 0 FLOPs) whose
    outputs fc/grad_weight waited for, and mul/grad produced the gradient of the mask too (64 bytes)."""
    g = capture(_NoGrad(), (torch.randn(2, 4),), name="nograd", mode="training")
    f = {op.name: op for op in g.ops}
    backward = [op.name for op in g.ops if op.phase == "backward"]
    assert backward == ["add_1/grad", "sum_3/grad", "emb/grad_weight", "add/grad", "sum_1/grad", "mul/grad",
                        "fc2/grad", "fc2/grad_weight", "fc/grad_weight"]
    assert f["mul/grad"].output_bytes == 32  # the gradient of fc2's output only, not of the mask
    assert f["add/grad"].output_bytes == 4  # of sum_1 only: sum_2 reads a detached tensor
    assert [g.ops[e.src].name for e in g.edges if e.dst == g.index["fc/grad_weight"]] == ["x", "fc", "fc2/grad"]
    # adds 1 + 1, sums 8 + 8, mul 8, embedding scatter 8, fc2 72 + 72, fc 72
    assert sum(op.flops for op in g.ops if op.phase == "backward") == 1 + 1 + 8 + 8 + 8 + 8 + 72 + 72 + 72


class _FrozenBackbone(nn.Module):
    """A backbone run under torch.no_grad() inside forward (linear probing): only the head trains."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone, self.head = nn.Linear(4, 4), nn.Linear(4, 1)

    def forward(self, x):
        with torch.no_grad():
            y = self.backbone(x).relu().view(2, 4)
        return self.head(y).sum()


@pytest.mark.parametrize("outer_no_grad", [False, True])
def test_no_gradient_flows_through_what_forward_computes_under_no_grad(outer_no_grad):
    """Eager autograd gives backbone no gradient (its weights no update); the graph had relu/grad (8 FLOPs),
    backbone/grad_weight (72) and backbone/update (80). Capturing inside torch.no_grad() changes nothing."""
    with torch.no_grad() if outer_no_grad else contextlib.nullcontext():
        g = capture(_FrozenBackbone(), (torch.randn(2, 4),), name="probe", mode="training")
    assert [op.name for op in g.ops if op.phase != "forward"] == ["sum_1/grad", "head/grad_weight", "head/update"]
    assert sum(op.flops for op in g.ops if op.phase == "backward") == 2 + 2 * 2 * 4 * 1 + 2  # sum, head: weight, bias
    assert g.metadata["params"] == 4 * 4 + 4 + 4 + 1


def test_parameters_read_only_under_no_grad_are_counted_as_frozen():
    """The backbone's weights get no gradient and no update, so the graph's metadata counts them as not trained
    (frozen_params 20), as it counts those read only through detach(); both captures. It counted none."""
    from suite.capture.export import capture as capture_export

    for front in (capture, capture_export):
        g = front(_FrozenBackbone(), (torch.randn(2, 4),), name="probe", mode="training")
        assert (g.metadata["params"], g.metadata["frozen_params"]) == (25, 4 * 4 + 4)
        [update] = [op for op in g.ops if op.phase == "update"]
        assert update.param_bytes == 5 * 4  # the head's momentum


def test_ops_that_do_not_reach_the_loss_get_no_backward():
    class Dead(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = nn.Linear(4, 4)
            self.fc2 = nn.Linear(4, 4)

        def forward(self, x):
            self.fc2(x)  # computed, never used
            return self.fc1(x).sum()

    g = capture(Dead(), (torch.randn(2, 4),), name="dead", mode="training")
    names = {op.name for op in g.ops}
    assert "fc2" in names and g.ops[g.index["fc2"]].group is None
    assert not {n for n in names if n.startswith("fc2/")}
    assert {"fc1/grad_weight", "fc1/update"} <= names


@pytest.mark.parametrize("mode", ["inference", "training"])
def test_an_in_place_op_is_read_by_the_ops_after_it(mode):
    """`y.mul_(2)` overwrites y: the ops that read y afterwards depend on the in-place op, never skip it."""

    class InPlace(_Fc):
        def forward(self, x):
            y = self.fc(x)
            y.mul_(2.0)
            torch.relu_(y)
            return y.sum()

    g = capture(InPlace(), (torch.randn(2, 4),), name="inplace", mode=mode)
    assert edge_bytes(g, "fc", "mul_") == edge_bytes(g, "mul_", "relu_") == edge_bytes(g, "relu_", "sum_1") == 32
    s, fc = g.index["sum_1"], g.index["fc"]
    assert not [e for e in g.edges if e.src == fc and e.dst == s]
    if mode == "training":
        assert {"mul_/grad", "relu_/grad"} <= {op.name for op in g.ops}


def test_an_in_place_call_on_an_in_place_result_is_read_by_the_readers_of_the_original():
    """`y.mul_(2).add_(1)` overwrites y twice: the ops after it that read y depend on add_, not on mul_."""

    class Chained(_Fc):
        def forward(self, x):
            y = self.fc(x)
            y.mul_(2.0).add_(1.0)
            return y.sum()

    g = capture(Chained(), (torch.randn(2, 4),), name="chained", mode="inference")
    assert edge_bytes(g, "mul_", "add_") == edge_bytes(g, "add_", "sum_1") == 32
    assert not [e for e in g.edges if e.src == g.index["mul_"] and e.dst == g.index["sum_1"]]


class _Writes(nn.Module):
    """fc, then an in-place call that `how` picks; fc2 reads `y` (or the view `v`) after it."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.fc = nn.Linear(4, 4)
        self.fc2 = nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x)
        if self.how == "through a view":
            y[0].mul_(2.0)  # changes y, which fc2 reads
            return self.fc2(y)
        if self.how == "under a live view":
            v = y.view(-1)
            y.mul_(2.0)  # changes v, which fc2 reads
            return self.fc2(v.view(2, 4))
        if self.how == "through a detached copy":
            y.detach().mul_(2.0)  # changes y: detach() shares its storage, though it is no view
            return self.fc2(y)
        v = y[0]  # "after a dead view": v's last reader runs before the write
        a = v * 3.0
        y.mul_(2.0)
        return self.fc2(y) + a


@pytest.mark.parametrize("how", ["through a view", "under a live view", "through a detached copy"])
def test_an_in_place_write_to_shared_memory_is_refused(how):
    """The graph follows an in-place call only through the tensor it names, so a write that another live value
    sees (through a view) is refused: it used to give a graph without that dependency (fc2 did not depend on
    the write) and, on split placements, outputs unlike eager PyTorch's in 540 of 729 placements."""
    other = {"through a view": "fc", "under a live view": "view", "through a detached copy": "fc"}[how]
    with pytest.raises(GraphError, match=f"^_Writes: the in-place call 'mul_' \\(mul_\\) writes to memory that "
                                         f"'{other}' shares"):
        capture(_Writes(how), (torch.randn(2, 4),), name="writes")


def test_an_in_place_write_after_the_last_reader_of_a_view_is_captured():
    g = capture(_Writes("after a dead view"), (torch.randn(2, 4),), name="writes")
    assert edge_bytes(g, "mul_", "fc2") == 32


class _Gates(nn.Module):
    """LSTM-style gates: in-place calls on parts of one tensor that share its storage but no element."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 8)
        self.fc2 = nn.Linear(2, 4)

    def forward(self, x):
        i, f, g, o = self.fc(x).chunk(4, 1)
        i.sigmoid_()  # f, g and o are still to be read: they share fc's storage, not i's elements
        f.sigmoid_()
        return self.fc2(i * f + g * o)


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_in_place_writes_to_disjoint_parts_of_a_tensor_are_captured(device):
    """The parts of `chunk` are views of one base; writing one leaves the others as they were. They were
    refused as a write to shared memory."""
    with torch.device(device):
        model = _Gates()
        g = capture(model, (torch.randn(2, 4),), name="gates")
    assert edge_bytes(g, "sigmoid_", "mul") == edge_bytes(g, "sigmoid__1", "mul") == 16
    assert edge_bytes(g, "fc", "mul_1") == 32  # g and o


def test_training_mode_with_nothing_to_train_is_an_error():
    class NoParams(nn.Module):
        def forward(self, x):
            return (x * x).sum()

    with pytest.raises(GraphError, match="no trainable parameter reaches the model's output"):
        capture(NoParams(), (torch.randn(2, 4),), name="np", mode="training")
    assert capture(NoParams(), (torch.randn(2, 4),), name="np").num_ops == 3  # inference is fine


class PartlyFrozen(nn.Module):
    """Three linear layers: `a` trainable, `b` frozen, `c` with a frozen weight and a trainable bias."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(2, 2)
        self.b = nn.Linear(2, 2)
        self.c = nn.Linear(2, 1)
        self.b.requires_grad_(False)
        self.c.weight.requires_grad_(False)

    def forward(self, x):
        return self.c(self.b(self.a(x))).sum()


def test_frozen_parameters_get_no_gradient_update_or_optimizer_state():
    """By hand, for x of shape (3, 2): a and b hold 6 parameters (24 bytes) each, c 3 (12 bytes: weight 8,
    bias 4); linear FLOPs = 2 x multiply-adds + bias adds: a, b 30, c 15. b still passes the gradient back
    to a (b/grad reads its weights), but has no weight gradient and no update; c's weight gradient is that of
    its trainable share (4 of 12 bytes: 15 x 4 / 12 = 5 FLOPs) and its update holds one momentum buffer of
    the bias (4 bytes, 4 FLOPs per parameter)."""
    g = capture(PartlyFrozen(), (torch.randn(3, 2),), name="f", mode="training")
    ops = {op.name: op for op in g.ops}
    assert [n for n in ops if "/" in n] == ["sum_1/grad", "c/grad", "c/grad_weight", "c/update", "b/grad",
                                            "a/grad_weight", "a/update"]
    assert [ops[n].param_bytes for n in ("a", "b", "c")] == [24, 24, 12]  # frozen weights stay resident
    assert ops["b/grad"].flops == 30 and edge_bytes(g, "c/grad", "b/grad") == 24
    assert (ops["c/grad_weight"].flops, ops["c/grad_weight"].output_bytes) == (5, 4)
    assert (ops["c/update"].param_bytes, ops["c/update"].flops) == (4, 4)
    assert (ops["a/update"].param_bytes, ops["a/update"].flops) == (24, 24)
    assert g.metadata["params"] == 15 and g.metadata["frozen_params"] == 8
    trainable = PartlyFrozen().requires_grad_(True)
    full = capture(trainable, (torch.randn(3, 2),), name="f", mode="training")
    assert "frozen_params" not in full.metadata and "b/update" in full.index
    assert capture(PartlyFrozen(), (torch.randn(3, 2),), name="f").content_hash == capture(
        trainable, (torch.randn(3, 2),), name="f").content_hash  # inference graphs do not depend on it


class TwiceLoss(Twice):
    def forward(self, x):
        return super().forward(x).sum()


def test_a_frozen_first_layer_and_frozen_shared_weights_get_no_backward_ops():
    """A frozen layer whose input needs no gradient gets no backward op at all; a frozen shared layer is a
    variable op with no accumulation or update, apart from the trainable ones."""
    frozen_first = PartlyFrozen()
    frozen_first.a.requires_grad_(False)
    g = capture(frozen_first, (torch.randn(3, 2),), name="f", mode="training")
    assert not any(n.startswith(("a/", "b/")) for n in g.index)
    twice = TwiceLoss()
    twice.fc.bias.requires_grad_(False)  # the weight is trained, the bias is not: two variables
    g = capture(twice, (torch.randn(3, 6),), name="twice", mode="training")
    ops = {op.name: op for op in g.ops}
    assert {op.name: op.param_bytes for op in by_kind(g, "variable")} == {"fc/variable": 144, "fc/variable2": 24}
    assert [op.name for op in g.ops if op.kind in ("accumulate_grad", "apply_momentum")] == [
        "fc/variable/acc1", "fc/variable/acc0", "fc/variable/update"]
    assert ops["fc/variable/update"].param_bytes == 144 and ops["fc/variable2"].group is None
    assert ops["fc/1/grad_weight"].flops == 234 * 144 / 168 and ops["fc/1/grad_weight"].output_bytes == 144
    inference = capture(twice, (torch.randn(3, 6),), name="twice").content_hash  # one variable, as if trained
    assert inference == capture(TwiceLoss(), (torch.randn(3, 6),), name="twice").content_hash
    twice.fc.requires_grad_(False)
    with pytest.raises(GraphError, match="no trainable parameter reaches the model's output"):
        capture(twice, (torch.randn(3, 6),), name="twice", mode="training")


def test_capturing_something_else_than_a_module_is_an_error():
    with pytest.raises(GraphError, match="capture needs a torch.nn.Module, got function"):
        capture(lambda x: x, (torch.randn(2),), name="f")


def test_an_input_named_like_a_module_gets_a_unique_op_name():
    class Clash(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(2, 2)

        def forward(self, fc):
            return self.fc(fc)

    g = capture(Clash(), (torch.randn(1, 2),), name="clash")
    assert [(op.name, op.kind) for op in g.ops] == [("fc_2", "input"), ("fc", "linear")]
    assert edge_bytes(g, "fc_2", "fc") == 8


def test_an_in_place_write_to_shared_memory_is_refused_on_meta_tensors_too():
    """Meta tensors have storages without addresses: the check goes by the tensors' bases instead."""
    with torch.device("meta"):
        model = _Writes("through a view")
    with pytest.raises(GraphError, match="writes to memory that 'fc' shares"):
        capture(model, (torch.randn(2, 4, device="meta"),), name="writes")
    with torch.device("meta"):
        model = _Writes("after a dead view")
    assert edge_bytes(capture(model, (torch.randn(2, 4, device="meta"),), name="writes"), "mul_", "fc2") == 32


@pytest.mark.parametrize("inplace", [True, False])
def test_a_module_built_in_place_is_read_by_the_ops_after_it(inplace):
    """`nn.ReLU(inplace=True)` overwrites its input: add, which reads that input afterwards, reads the
    module's result; `nn.ReLU()` leaves it, and add reads fc."""

    class Net(_Fc):
        def __init__(self) -> None:
            super().__init__()
            self.act = nn.ReLU(inplace=inplace)

        def forward(self, x):
            a = self.fc(x)
            return self.act(a) + a

    g = capture(Net(), (torch.randn(2, 4),), name="net")
    into_add = sorted(g.ops[e.src].name for e in g.edges if e.dst == g.index["add"])
    assert into_add == (["act"] if inplace else ["act", "fc"])  # both of add's inputs are act's result


@pytest.mark.parametrize("call", ["keyword", "positional", "out of place"])
def test_a_function_called_in_place_is_read_by_the_ops_after_it(call):
    """`F.relu(a, inplace=True)` (or `F.relu(a, True)`) overwrites a, as `torch.relu_(a)` does."""
    import torch.nn.functional as F

    class Net(_Fc):
        def forward(self, x):
            a = self.fc(x)
            b = {"keyword": lambda: F.relu(a, inplace=True), "positional": lambda: F.relu(a, True),
                 "out of place": lambda: F.relu(a)}[call]()
            return b + a

    g = capture(Net(), (torch.randn(2, 4),), name="net")
    into_add = sorted(g.ops[e.src].name for e in g.edges if e.dst == g.index["add"])
    assert into_add == (["fc", "relu"] if call == "out of place" else ["relu"])


def test_a_call_with_out_is_read_by_the_ops_after_it():
    """`torch.add(x, 1, out=a)` overwrites a: fc2, which reads a afterwards, depends on the call."""

    class Net(_FcFc):
        def forward(self, x):
            a = self.fc(x)
            torch.add(x, 1.0, out=a)
            return self.fc2(a)

    g = capture(Net(), (torch.randn(2, 4),), name="net")
    assert [g.ops[e.src].name for e in g.edges if e.dst == g.index["fc2"]] == ["add"]


def test_a_call_writing_several_tensors_through_out_is_refused():
    """`torch.max(a, 1, out=(v, i))` overwrites v and i, which the graph would not follow: refused."""

    class Net(_Fc):
        def forward(self, x):
            a = self.fc(x)
            v = a[:, 0] * 1.0
            torch.max(a, 1, out=(v, torch.zeros(2, dtype=torch.long)))
            return v

    with pytest.raises(GraphError, match="^Net: the call 'max_1' \\(max\\) writes several tensors through out="):
        capture(Net(), (torch.randn(2, 4),), name="net")


@pytest.mark.parametrize(("equation", "shapes", "macs"), [
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)], 2 * 3 * 4 * 5),  # as bmm: out 2x3x5, 4 summed
    ("...ij,...jk->...ik", [(2, 3, 4), (1, 4, 5)], 2 * 3 * 4 * 5),  # the batch of 1 broadcast to 2
    ("i,j->ij", [(3,), (4,)], 12),  # an outer product: one product per output element
    ("bhqd,bhkd->bhqk", [(2, 2, 3, 4), (2, 2, 5, 4)], 2 * 2 * 3 * 5 * 4),  # attention scores
])
def test_einsum_of_two_operands_counts_a_multiply_add_per_index_combination(equation, shapes, macs):
    class Einsum(nn.Module):
        def forward(self, a, b):
            return torch.einsum(equation, a, b)

    g = capture(Einsum(), tuple(torch.randn(*s) for s in shapes), name="einsum")
    (op,) = by_kind(g, "einsum")
    assert (op.flops, g.metadata["forward_macs"]) == (2 * macs, macs)
    assert "fallback_cost_kinds" not in g.metadata


def test_einsum_of_one_operand_counts_its_elements():
    class Trace(nn.Module):
        def forward(self, a):
            return torch.einsum("ii->", a)

    (op,) = by_kind(capture(Trace(), (torch.randn(3, 3),), name="trace"), "einsum")
    assert op.flops == 9


@pytest.mark.parametrize(("equation", "shapes", "macs", "summed"), [
    # i,j,k = 2,3,4 (j summed, k kept for the third) then i,k,l = 2,4,5
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)], 2 * 3 * 4 + 2 * 4 * 5, 0),
    ("ij,jk,kl", [(2, 3), (3, 4), (4, 5)], 2 * 3 * 4 + 2 * 4 * 5, 0),  # implicit output: il
    # the first two share no index: an outer product i,j,k,l = 120 that keeps all four, then 120 again
    ("ij,kl,jk->il", [(2, 3), (4, 5), (3, 4)], 2 * 120, 0),
    # ... broadcast (2 against 1), kept to the end: 2 x (3x4x5) then 2 x (3x5x6)
    ("...ij,...jk,...kl->...il", [(2, 3, 4), (1, 4, 5), (5, 6)], 2 * 3 * 4 * 5 + 2 * 3 * 5 * 6, 0),
    # b is 1 until the third operand: 1x2x3x4, then 64x2x4x5
    ("bij,bjk,bkl->bil", [(1, 2, 3), (1, 3, 4), (64, 4, 5)], 24 + 64 * 40, 0),
    # m, held by the second operand only, is summed out of it first (3x4x50 elements): 2x3x4 + 2x4x5
    ("ij,jkm,kl->il", [(2, 3), (3, 4, 50), (4, 5)], 24 + 40, 3 * 4 * 50),
    ("ij,jk->i", [(2, 3), (3, 50)], 2 * 3, 3 * 50),  # k summed out of the second first, then a product i,j
    ("ii,ij->j", [(3, 3), (3, 4)], 3 * 4, 0),  # the diagonal of the first: i once
])
def test_einsum_of_several_operands_costs_as_torch_computes_it(equation, shapes, macs, summed):
    """torch (without opt_einsum) multiplies the operands in from the left, summing out first an index that
    only one side holds; each product costs as an einsum of two operands (by hand)."""
    cost = einsum_cost(equation, [TensorInfo(s, 4, True) for s in shapes])
    assert (cost.macs, cost.flops) == (macs, 2 * macs + summed)


@pytest.mark.parametrize(("equation", "shapes"), [
    ("bij,bjk,bkl->bil", [(1, 2, 3), (1, 3, 4), (64, 4, 5)]),
    ("ij,jkm,kl->il", [(2, 3), (3, 4, 50), (4, 5)]),
    ("ijm,jk,kl->il", [(2, 3, 50), (3, 4), (4, 5)]),
    ("ij,jk,kl->i", [(2, 3), (3, 4), (4, 50)]),
    ("...ij,...jk,...kl->...il", [(2, 3, 4), (1, 4, 5), (5, 6)]),
    ("bhqd,bhkd,bhkv->bhqv", [(2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 7)]),
])
def test_einsum_multiply_adds_equal_torchs_own_count(equation, shapes):
    """Where every product contracts an index (so torch runs it as a matrix product), the multiply-adds
    equal torch's FlopCounterMode (2 FLOPs per multiply-add of its mm / bmm calls)."""
    from torch.utils.flop_counter import FlopCounterMode

    tensors = [torch.randn(*s) for s in shapes]
    enabled = torch.backends.opt_einsum.enabled
    torch.backends.opt_einsum.enabled = False  # where opt_einsum is installed, torch would pick its own order
    try:
        with FlopCounterMode(display=False) as counter:
            torch.einsum(equation, tensors)
    finally:
        torch.backends.opt_einsum.enabled = enabled
    assert einsum_cost(equation, [TensorInfo(s, 4, True) for s in shapes]).macs == counter.get_total_flops() / 2


def test_einsum_of_three_operands_in_a_captured_graph():
    class Three(nn.Module):
        def forward(self, a, b, c):
            return torch.einsum("ij,jk,kl->il", a, b, c)

    g = capture(Three(), (torch.randn(2, 3), torch.randn(3, 4), torch.randn(4, 5)), name="three")
    (op,) = by_kind(g, "einsum")
    assert (op.flops, g.metadata["forward_macs"]) == (128, 64) and "fallback_cost_kinds" not in g.metadata


class OptionalMask(nn.Module):
    """An optional argument tested against None, and a scalar one, both left at their defaults."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x, mask=None, scale: float = 2.0):
        if mask is not None:
            x = x.masked_fill(mask, 0.0)
        return self.fc(x) * scale


def test_arguments_left_at_their_defaults_are_traced_with_their_values():
    """torch.fx made `mask` a placeholder, so `mask is not None` took the masking branch and running the
    graph without a mask failed; the call capture describes leaves it at None."""
    g = capture(OptionalMask(), (torch.randn(3, 4),), name="default")
    assert [(op.name, op.kind, op.flops) for op in g.ops] == [
        ("x", "input", 0.0), ("fc", "linear", 2 * 3 * 4 * 4 + 3 * 4), ("mul", "mul", 12.0)]
    g = capture(OptionalMask(), (torch.randn(3, 4), torch.zeros(3, 4, dtype=torch.bool)), name="given")
    assert [op.name for op in g.ops] == ["x", "mask", "masked_fill", "fc", "mul"]


def test_keyword_example_inputs_are_traced_like_positional_ones():
    """`model(x=..., mask=...)`: example_kwargs give inputs by name; a keyword input without tensors (scale)
    is traced as that constant, and an argument neither gives keeps its default (mask=None: no masking)."""
    x, mask = torch.randn(3, 4), torch.zeros(3, 4, dtype=torch.bool)
    g = capture(OptionalMask(), example_kwargs={"mask": mask, "x": x}, name="kw")
    assert [(op.name, op.kind, op.flops) for op in g.ops] == [
        ("x", "input", 0.0), ("mask", "input", 0.0), ("masked_fill", "masked_fill", 12.0),
        ("fc", "linear", 2 * 3 * 4 * 4 + 3 * 4), ("mul", "mul", 12.0)]
    assert (edge_bytes(g, "x", "masked_fill"), edge_bytes(g, "mask", "masked_fill")) == (3 * 4 * 4, 3 * 4)
    assert g.content_hash == capture(OptionalMask(), (x, mask), name="kw").content_hash
    g = capture(OptionalMask(), (x,), example_kwargs={"scale": 3.0}, name="scale")
    assert [(op.name, op.kind) for op in g.ops] == [("x", "input"), ("fc", "linear"), ("mul", "mul")]
    assert len(g.edges) == 2 and g.metadata["forward_macs"] == 3 * 4 * 4
    g = capture(nn.Linear(4, 3), example_kwargs={"input": torch.randn(2, 4)}, name="leaf")  # one op, not traced
    assert [(op.kind, op.flops) for op in g.ops] == [("input", 0.0), ("linear", 2 * 2 * 4 * 3 + 2 * 3)]


class _Steps(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x, steps, relu):
        for _ in range(steps):
            x = self.fc(x)
            if relu:
                x = x.relu()
        return x


def test_positional_example_inputs_without_tensors_are_traced_as_constants():
    """`model(x, None)` took the `mask is not None` branch (a placeholder is not None) and the run failed;
    `model(x, 3, True)` was refused (`range(steps)`, `if relu:` on placeholders). Now as given by keyword."""
    x = torch.randn(3, 4)
    expected = capture(OptionalMask(), (x,), name="none").content_hash
    assert capture(OptionalMask(), (x, None), name="none").content_hash == expected
    g = capture(_Steps(), (x, 3, True), name="steps")
    assert [(op.kind, op.flops) for op in g.ops if op.kind != "variable"] == [
        ("input", 0.0), *[("linear", 2 * 3 * 4 * 4 + 3 * 4), ("relu", 12.0)] * 3]
    assert g.content_hash == capture(_Steps(), (x,), example_kwargs={"relu": True, "steps": 3}, name="steps").content_hash


def test_example_inputs_of_a_forward_with_star_args():
    """forward(x, *extra): each input after x is an input op of its own ("extra_0", "extra_1"); naming the
    positional constants failed there ('zip() argument 2 is longer than argument 1')."""

    class Extra(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x, *extra):
            return self.fc(x) + extra[0] + extra[1]

    g = capture(Extra(), (torch.randn(2, 4),) * 3, name="extra")
    assert [(op.name, op.kind, op.flops) for op in g.ops] == [
        ("x", "input", 0.0), ("extra_0", "input", 0.0), ("extra_1", "input", 0.0), ("fc", "linear", 72.0),
        ("add", "add", 8.0), ("add_1", "add", 8.0)]
    assert edge_bytes(g, "extra_0", "add") == edge_bytes(g, "extra_1", "add_1") == 2 * 4 * 4
    with pytest.raises(GraphError, match="keyword example input 'y' is not a keyword-only argument of forward, "
                                         "which takes \\*args; give the others positionally"):
        capture(Extra(), (torch.randn(2, 4),), example_kwargs={"y": 1}, name="extra")


class _StarArgsAndKeyword(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x, *args, c=None):
        y = self.fc(x) + args[0]
        if c is not None:
            y = y * c
        return y


@pytest.mark.parametrize("c", [None, "tensor", 2.0])
def test_star_args_then_a_keyword_only_argument_bind_as_in_eager(c):
    """forward(x, *args, c=None): torch.fx orders the placeholders (x, c, *args), so the second example input
    was bound to c: c became an input, `if c is not None` took its branch, and the graph and the torch
    backend computed fc(x) + args[1] times args[0] instead of fc(x) + args[0] (no error). Now c takes its
    default, or the keyword example input, and *args the inputs after x."""
    from suite.backends.devices import local_cluster
    from suite.backends.torch_exec import TorchExecutor
    from suite.backends.workload import from_module
    from suite.capture.fx import traced_module

    torch.manual_seed(0)
    x, a, b = (torch.randn(2, 4) for _ in range(3))
    kwargs = {} if c is None else {"c": torch.randn(2, 4) if c == "tensor" else c}
    model = _StarArgsAndKeyword()
    g = capture(model, (x, a, b), example_kwargs=kwargs, name="star")
    names = ["x", "c", "args_0", "args_1", "fc", "add", "mul"]
    assert [op.name for op in g.ops] == [n for n in names if not (n == "c" and c != "tensor")
                                          and not (n == "mul" and c is None)]
    assert edge_bytes(g, "args_0", "add") == 2 * 4 * 4  # args[0] alone
    with torch.no_grad():
        expected = model(x, a, b, **kwargs)
        gm, args = traced_module(model, (x, a, b), example_kwargs=kwargs)
        torch.testing.assert_close(gm(*args), expected, rtol=0, atol=0)
        rw = from_module(model, (x, a, b), example_kwargs=kwargs, name="star")
        ex = TorchExecutor(rw, local_cluster(2, gpus=False)[1])
        ex.apply(torch.arange(rw.graph.num_ops).numpy() % 2)
        torch.testing.assert_close(ex.forward(), expected, rtol=0, atol=0)


def test_star_args_with_a_keyword_only_argument_without_default_or_unknown_keyword_is_named():
    """A keyword-only argument without a default that the example inputs do not give, or a keyword input that
    names no keyword-only argument, is named; an argument with a default before *args keeps it."""
    class Needs(nn.Module):
        def forward(self, x, *args, c):
            return x * c

    with pytest.raises(GraphError, match="Needs.forward needs keyword-only argument 'c', which the example inputs "
                                         "do not give"):
        capture(Needs(), (torch.randn(2),), name="needs")
    with pytest.raises(GraphError, match="keyword example input 'd' is not a keyword-only argument of forward"):
        capture(Needs(), (torch.randn(2),), example_kwargs={"c": torch.randn(2), "d": 1}, name="needs")
    g = capture(Needs(), (torch.randn(2), torch.randn(2)), example_kwargs={"c": torch.randn(2)}, name="needs")
    assert [(op.name, op.kind) for op in g.ops] == [("x", "input"), ("c", "input"), ("args_0", "input"),
                                                    ("mul", "mul")]

    class Optional(nn.Module):  # *args after an argument with a default: refused as "needs argument 'args'"
        def forward(self, x, y=None, *args):
            return x * 2.0 if y is None else x * y

    assert [op.name for op in capture(Optional(), (torch.randn(2),), name="opt").ops] == ["x", "mul"]


class _IteratesArgs(nn.Module):
    """forward(x, *args, **kwargs) that iterates over its *args and reads a mask from its **kwargs."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x, *args, **kwargs):
        y = self.fc(x)
        for a in args:
            y = y * a
        mask = kwargs.get("mask")
        return y if mask is None else y * mask


def _structure(g: OpGraph) -> tuple[list, list]:
    """A graph's ops (input names, each op's kind, FLOPs, bytes) and edges, without the other ops' names
    (which differ between the fx and export captures: "fc" and "fc/linear")."""
    ops = [(op.name if op.kind == "input" else "", op.kind, op.flops, op.bytes_read, op.output_bytes, op.param_bytes)
           for op in g.ops]
    return ops, sorted((e.src, e.dst, e.bytes) for e in g.edges)


@pytest.mark.parametrize(("extra", "kwargs", "inputs"), [
    (2, {}, ["x", "args_0", "args_1"]),
    (1, {"mask": "tensor"}, ["x", "args_0", "mask"]),
    (0, {"mask": "tensor"}, ["x", "mask"]),
    (1, {"mask": None}, ["x", "args_0"]),
])
def test_star_args_are_one_input_each_and_take_keyword_inputs_as_export(extra, kwargs, inputs):
    """torch.fx traced *args as one input that cannot be iterated ('Proxy object cannot be iterated' for
    `for a in args:`), and a keyword input was refused where forward takes *args ('not a keyword-only
    argument'). Each input in *args is now an input op ("args_0", ...), keyword inputs reach **kwargs, and
    the graph is the export capture's; the traced module and the torch backend compute as eager."""
    from suite.backends.devices import local_cluster
    from suite.backends.torch_exec import TorchExecutor
    from suite.backends.workload import from_module
    from suite.capture.export import capture as capture_export
    from suite.capture.fx import traced_module

    torch.manual_seed(0)
    model, x = _IteratesArgs(), torch.randn(2, 4)
    args = (x, *(torch.randn(2, 4) for _ in range(extra)))
    kwargs = {k: torch.rand(2, 4) if v == "tensor" else v for k, v in kwargs.items()}
    g = capture(model, args, example_kwargs=kwargs, name="star")
    assert [op.name for op in g.ops if op.kind == "input"] == inputs
    assert [op.kind for op in g.ops if op.kind != "input"] == ["linear", *["mul"] * (len(inputs) - 1)]
    readers = ["mul", "mul_1"][:len(inputs) - 1]  # each extra input read by its own mul, 2 x 4 floats
    assert [edge_bytes(g, name, op) for name, op in zip(inputs[1:], readers, strict=True)] == [32] * len(readers)
    assert _structure(g) == _structure(capture_export(model, args, example_kwargs=kwargs, name="star"))
    with torch.no_grad():
        expected = model(*args, **kwargs)
        gm, values = traced_module(model, args, example_kwargs=kwargs)
        torch.testing.assert_close(gm(*values), expected, rtol=0, atol=0)
        rw = from_module(model, args, example_kwargs=kwargs, name="star")
        ex = TorchExecutor(rw, local_cluster(2, gpus=False)[1])
        ex.apply(torch.arange(rw.graph.num_ops).numpy() % 2)
        torch.testing.assert_close(ex.forward(), expected, rtol=0, atol=0)


def test_star_args_without_tensors_are_constants_and_a_keyword_for_an_earlier_argument_is_named():
    """A value in *args without tensors (a number) is a constant, as a positional one is; a keyword input naming
    an argument before *args, which the positional inputs give, is named as given twice."""
    x, a = torch.randn(2, 4), torch.randn(2, 4)
    g = capture(_IteratesArgs(), (x, 2.0, a), name="const")
    assert [(op.name, op.kind, op.flops) for op in g.ops] == [
        ("x", "input", 0.0), ("args_1", "input", 0.0), ("fc", "linear", 72.0), ("mul", "mul", 8.0),
        ("mul_1", "mul", 8.0)]
    assert edge_bytes(g, "args_1", "mul_1") == 32 and edge_bytes(g, "fc", "mul") == 32
    with pytest.raises(GraphError, match=r"^_IteratesArgs: argument 'x' is given twice, as example input 0 and "
                                         r"by keyword$"):
        capture(_IteratesArgs(), (x, a), example_kwargs={"x": x}, name="twice")


class _ReadsKwargs(nn.Module):
    def __init__(self, reads: bool) -> None:
        super().__init__()
        self.fc, self.reads = nn.Linear(4, 4), reads

    def forward(self, x, **kwargs):
        mask = kwargs.get("mask") if self.reads else None
        y = self.fc(x)
        return y if mask is None else y * mask


def test_a_forward_that_takes_kwargs_gets_the_keyword_inputs_as_eager_does():
    """`kwargs.get("mask")` in forward(x, **kwargs): torch.fx traced **kwargs as one input whose every entry looks
    given, so the graph took the masked branch (eager returns fc(x)); it was refused, and a mask given by
    keyword was refused as 'no argument'. Now **kwargs is the dict the call passes: none (fc alone), or the
    mask as an input named by its key (x -> fc -> mul <- mask, 32 bytes each), as the export capture has it."""
    from suite.capture.export import capture as capture_export
    from suite.capture.fx import traced_module

    x, mask = torch.randn(2, 4), torch.rand(2, 4)
    for reads in (True, False):
        assert [op.name for op in capture(_ReadsKwargs(reads), (x,), name="kw").ops] == ["x", "fc"]
    model = _ReadsKwargs(reads=True)
    for g in (capture(model, (x,), example_kwargs={"mask": mask}, name="kw"),
              capture_export(model, (x,), example_kwargs={"mask": mask}, name="kw")):
        assert [(op.kind, op.flops) for op in g.ops] == [("input", 0.0), ("input", 0.0), ("linear", 72.0),
                                                         ("mul", 8.0)]
        assert g.ops[1].name == "mask"
        assert [(e.src, e.dst, e.bytes) for e in g.edges] == [(0, 2, 32), (1, 3, 32), (2, 3, 32)]
    gm, args = traced_module(model, (x,), example_kwargs={"mask": mask})
    torch.testing.assert_close(gm(*args), model(x, mask=mask), rtol=0, atol=0)


@pytest.mark.parametrize(("inputs", "kwargs", "error"), [
    ((), {"mask": None}, r"OptionalMask.forward needs argument 'x', which the example inputs do not give "
                         r"\(0 positional, keywords: mask\)$"),
    ((torch.randn(3, 4),), {"masks": None}, r"OptionalMask.forward has no argument 'masks' \(keyword example "
                                            r"inputs name its arguments: x, mask, scale\)"),
    ((torch.randn(3, 4),), {"x": None}, r"argument 'x' is given twice, as example input 0 and by keyword"),
    ((torch.randn(3, 4),) * 4, {}, r"OptionalMask.forward takes 3 positional argument\(s\) \(x, mask, scale\); 4 "
                                   r"example inputs were given"),
    ((torch.zeros(3, 4).numpy(),), {}, r"OptionalMask: example input 0 is or holds a numpy array; pass torch "
                                        r"tensors \(torch.from_numpy\)"),
    ((torch.randn(3, 4),), {"mask": [torch.zeros(3, 4).numpy()]}, r"keyword example input 'mask' is or holds a numpy"),
])
def test_example_inputs_that_do_not_fit_forward_name_the_argument(inputs, kwargs, error):
    """A missing, unknown or doubly given argument is named; it was torch.fx's 'Expected positional argument
    for parameter' (or a TypeError about a keyword) from deep inside the run. Example inputs beyond forward's
    arguments were ignored without a word (eager PyTorch raises a TypeError). A numpy array is named too (it was
    torch.fx's 'argument of type: <class 'numpy.ndarray'>' once values without tensors became constants)."""
    with pytest.raises(GraphError, match=error):
        capture(OptionalMask(), inputs, example_kwargs=kwargs, name="bad")


def test_a_dict_of_inputs_is_one_argument_and_the_error_says_how_to_give_keywords():
    class Two(nn.Module):
        def forward(self, x, y):
            return x + y

    inputs = {"x": torch.randn(2), "y": torch.randn(2)}
    with pytest.raises(GraphError, match="needs argument 'y'.*a dict among the example inputs is one argument: "
                                         "give keyword inputs as example_kwargs"):
        capture(Two(), inputs, name="dict")
    assert [op.name for op in capture(Two(), example_kwargs=inputs, name="kw").ops] == ["x", "y", "add"]


class NoiseInTraining(nn.Module):
    """Python control flow on `self.training` (noise added only while training), and a dropout."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.drop = nn.Linear(4, 4), nn.Dropout(0.5)

    def forward(self, x):
        x = self.fc(x)
        if self.training:
            x = x + 1.0
        return self.drop(x).sum()


@pytest.mark.parametrize("mode", ["inference", "training"])
def test_capture_traces_the_module_in_the_modes_state_and_restores_its_flags(mode):
    """A fresh module is in training mode: its inference graph had the training-only add (8 FLOPs); an
    eval() module's training graph lacked it. Each module's own flag is as it was afterwards."""
    model = NoiseInTraining()
    model.train(mode == "inference")  # the other state
    model.fc.train(mode == "training")
    g = capture(model, (torch.randn(2, 4),), name="flags", mode=mode)
    forward = [(op.name, op.kind) for op in g.ops if op.phase == "forward"]
    if mode == "inference":
        assert forward == [("x", "input"), ("fc", "linear"), ("sum_1", "sum")]
    else:
        assert forward == [("x", "input"), ("fc", "linear"), ("add", "add"), ("drop", "dropout"), ("sum_1", "sum")]
    assert (model.training, model.drop.training, model.fc.training) == (mode == "inference",) * 2 + (mode == "training",)


class _FrozenHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm, self.head = nn.BatchNorm1d(4), NoiseInTraining()

    def forward(self, x):
        return self.head(self.norm(x))


def test_a_training_capture_keeps_the_submodules_the_user_put_in_eval():
    """A model in train() with its norm and head in eval() (frozen while fine-tuning) is traced as eager
    training runs it: no training-only add, the dropout module folded, the norm with running statistics (2
    FLOPs per element, not 4); capture put every module in train(). Each flag is as it was afterwards."""
    model = _FrozenHead()
    model.norm.eval()
    model.head.eval()
    g = capture(model, (torch.randn(2, 4),), name="frozen", mode="training")
    forward = [(op.name, op.kind, op.flops) for op in g.ops if op.phase == "forward"]
    assert forward == [("x", "input", 0), ("norm", "batch_norm", 2 * 8), ("head.fc", "linear", 2 * 2 * 4 * 4 + 8),
                       ("head/sum_1", "sum", 8)]
    assert [m.training for m in model.modules()] == [True, False, False, False, False]
    model.eval()  # a model in eval(): a training capture puts every module in train()
    g = capture(model, (torch.randn(2, 4),), name="frozen", mode="training")
    assert [op.kind for op in g.ops if op.phase == "forward"] == ["input", "batch_norm", "linear", "add", "dropout",
                                                                  "sum"]
    assert g.ops[g.index["norm"]].flops == 4 * 8
    assert not any(m.training for m in model.modules())


@dataclasses.dataclass
class _Output:
    """A model output object (as transformers' ModelOutput): the loss and optional logits."""

    loss: torch.Tensor
    logits: torch.Tensor | None = None


class _ReturnsOutput(nn.Module):
    def __init__(self, logits: bool) -> None:
        super().__init__()
        self.fc, self.logits = nn.Linear(4, 2), logits

    def forward(self, x):
        h = self.fc(x)
        return _Output(h.sum(), h) if self.logits else _Output(h.sum())


def test_a_dataclass_output_is_followed_to_its_tensors():
    """The output object's tensors were not seen: a training step of a model returning its loss in one was
    refused with 'it returns no tensor'. Now it is the graph of returning the loss itself."""
    x = torch.randn(3, 4)
    g = capture(_ReturnsOutput(logits=False), (x,), name="out", mode="training")

    class Plain(_ReturnsOutput):
        def forward(self, x):
            return self.fc(x).sum()

    assert g.content_hash == capture(Plain(logits=False), (x,), name="out", mode="training").content_hash
    assert [op.name for op in g.ops if op.phase == "backward"] == ["sum_1/grad", "fc/grad_weight"]
    with pytest.raises(GraphError, match=r"needs _ReturnsOutput to return its loss, one scalar tensor; it returns "
                                         r"\{'loss': \(\), 'logits': \(3, 2\)\} \(wrap the model in a module "
                                         r"that returns its 'loss' entry alone, or capture it in inference mode\)$"):
        capture(_ReturnsOutput(logits=True), (x,), name="out", mode="training")
    g = capture(_ReturnsOutput(logits=True), (x,), name="out")
    assert [(op.name, op.kind) for op in g.ops] == [("x", "input"), ("fc", "linear"), ("sum_1", "sum")]


class _Compiled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.compile(nn.Linear(4, 3))

    def forward(self, x):
        return self.fc(x).relu()


def test_torch_compiled_modules_are_captured_as_the_modules_they_compile():
    """torch.fx cannot trace dynamo's compiled forward: a compiled submodule failed with 'FX to symbolically
    trace a dynamo-optimized function', a compiled model with 'missing the required forward function'."""
    g = capture(_Compiled(), (torch.randn(2, 4),), name="compiled")
    assert [(op.name, op.kind, op.flops) for op in g.ops] == [
        ("x", "input", 0.0), ("fc._orig_mod", "linear", 2 * 2 * 4 * 3 + 2 * 3), ("relu", "relu", 6.0)]
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
    x = torch.randn(2, 4)
    assert capture(torch.compile(model), (x,), name="c").content_hash == capture(model, (x,), name="c").content_hash


def test_a_failing_run_names_the_op_without_fx_internals():
    """Example inputs of the wrong dtype, device or shape: the error names the op that failed and keeps torch's
    message; it also carried fx's node dump, 'Original traceback: None' and a pointer to tlparse."""
    model = nn.Sequential(nn.Linear(4, 3))
    cases = [(torch.zeros(2, 4, dtype=torch.float64), "mat1 and mat2 must have the same dtype"),
             (torch.zeros(2, 5), "mat1 and mat2 shapes cannot be multiplied"),
             (torch.zeros(2, 4, device="meta"), "expected device")]
    for x, why in cases:
        with pytest.raises(GraphError) as err:
            capture(model, (x,), name="bad")
        assert str(err.value).startswith("running Sequential on the example inputs failed at '0' (Linear): ")
        assert why in str(err.value) and "While executing" not in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(GraphError, match=r"failed at 'fc' \(Linear\): .*; a dict among the example inputs is one "
                                         r"argument: give keyword inputs as example_kwargs$"):
        capture(OptionalMask(), {"x": torch.randn(3, 4)}, name="dict")


class WeightPenalty(nn.Module):
    """A loss with a weight penalty over `self.parameters()` (or over the weights read as attributes)."""

    def __init__(self, by_attribute: bool) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 1)
        self.by_attribute = by_attribute

    def forward(self, x, y):
        weights = [self.fc.weight, self.fc.bias] if self.by_attribute else self.parameters()
        return (self.fc(x).squeeze(-1) - y).pow(2).mean() + sum(w.pow(2).sum() for w in weights)


def test_a_value_computed_from_parameters_tracing_did_not_follow_is_refused_in_training():
    """torch.fx does not see parameters read through `parameters()`: the penalty was computed once while
    tracing and added as a constant, so the training graph silently had no gradient for it."""
    inputs = (torch.randn(3, 4), torch.randn(3))
    with pytest.raises(GraphError, match=r"'_tensor_constant0' is a tensor that tracing computed from parameters"):
        capture(WeightPenalty(by_attribute=False), inputs, name="penalty", mode="training")
    capture(WeightPenalty(by_attribute=False), inputs, name="penalty")  # inference: a constant is right
    g = capture(WeightPenalty(by_attribute=True), inputs, name="penalty", mode="training")
    assert [op.name for op in g.ops if op.phase == "forward" and op.kind == "pow"] == ["pow_1", "pow_2", "pow_3"]
    # the weight (read by fc and pow_2) and the bias (by fc and pow_3): two variables, each with two gradients
    assert sorted((op.name, op.param_bytes) for op in g.ops if op.kind in ("variable", "apply_momentum")) == [
        ("fc/variable", 16), ("fc/variable/update", 16), ("fc/variable2", 4), ("fc/variable2/update", 4)]
    assert {"fc/variable/acc0", "fc/variable/acc1", "fc/variable2/acc0", "fc/variable2/acc1"} <= set(g.index)


def test_an_untraceable_module_is_an_error_naming_the_line_tracing_stopped_at():
    """torch.fx's message alone ("'Proxy' object cannot be interpreted as an integer") does not say where."""

    class ShapeLoop(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(2, 2)

        def forward(self, x):
            for _ in range(x.shape[0]):
                x = self.fc(x)
            return x

    with pytest.raises(GraphError) as err:
        capture(ShapeLoop(), (torch.randn(3, 2),), name="loop")
    assert str(err.value).startswith("torch.fx cannot trace ShapeLoop: 'Proxy' object cannot be interpreted as an "
                                     f"integer (at {__file__}:")
    assert str(err.value).endswith(": for _ in range(x.shape[0]):)")


def test_capture_leaves_the_modules_buffers_as_they_were():
    """The shape-recording run updated BatchNorm's running statistics of a module in training mode."""
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)).train()
    model[1].running_mean.fill_(0.5)
    before = {k: b.clone() for k, b in model.named_buffers()}
    capture(model, (torch.randn(8, 3),), name="bn")
    after = dict(model.named_buffers())
    assert after.keys() == before.keys()
    for k, b in before.items():
        torch.testing.assert_close(after[k], b, rtol=0, atol=0)
    assert int(model[1].num_batches_tracked) == 0


class _Counts(nn.Module):
    """Updates a buffer in forward: `how` is "iadd" (self.n += 1), "add_" (self.n.add_(1)), "rebind" (self.run =
    self.run * 0.9 + x.mean(0)) or "copy_" (self.run.copy_(x.mean(0)), which torch.fx records)."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.fc, self.how = nn.Linear(4, 4), how
        self.register_buffer("n", torch.tensor(3.0))
        self.register_buffer("run", torch.ones(4))

    def forward(self, x):
        if self.how == "iadd":
            self.n += 1
        elif self.how == "add_":
            self.n.add_(1)
        elif self.how == "rebind":
            self.run = self.run * 0.9 + x.mean(0)
        else:
            self.run.copy_(x.mean(0))
        return self.fc(x) * self.n + self.run


@pytest.mark.parametrize("how", ["iadd", "add_", "rebind"])
def test_a_buffer_update_that_fx_does_not_record_is_refused_and_undone(how):
    """Tracing ran `self.n += 1` for real (each capture, and each backend trace, added 1 to the user's buffer;
    the graph read it as a constant) and left a torch.fx Proxy bound as the buffer `run` after the rebinding
    (the module no longer ran). Now a GraphError names the buffer, and the buffers are as they were."""
    from suite.backends.workload import from_module
    from suite.capture.fx import traced_module

    model = nn.Sequential(_Counts(how))
    n, run = model[0].n, model[0].run
    x = torch.randn(2, 4)
    what = "assigns its buffer '0.run' a new tensor" if how == "rebind" else "updates its buffer '0.n' in place"
    for attempt in (lambda: capture(model, (x,), name="counts"), lambda: traced_module(model, (x,)),
                    lambda: from_module(model, (x,), name="counts", mode="training")):
        with pytest.raises(GraphError, match=rf"^Sequential.forward {what}"):
            attempt()
        assert dict(model.named_buffers()) == {"0.n": n, "0.run": run}  # the same tensors
        assert n.item() == 3.0 and run.tolist() == [1.0] * 4


class _Ema(nn.Module):
    """A running mean kept from zeros: `mul_(0.9)` runs while tracing (it reads no input) and is not recorded;
    `add_` is."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.register_buffer("ema", torch.zeros(4))

    def forward(self, x):
        y = self.fc(x)
        self.ema.mul_(0.9).add_(y.mean(0), alpha=0.1)
        return y * self.ema


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_a_buffer_update_that_fx_does_not_record_is_refused_even_where_it_leaves_the_values(device):
    """`self.ema.mul_(0.9)` on a zero buffer (and any update on a meta buffer) left the buffer's bytes as they
    were, so the check passed and the graph lacked the update (the backend's runs then decay nothing). The
    tensor's version counter sees it: refused as the other updates that fx does not record."""
    with torch.device(device):
        model = _Ema()
    with pytest.raises(GraphError, match=r"^_Ema.forward updates its buffer 'ema' in place"):
        capture(model, (torch.randn(2, 4, device=device),), name="ema")
    assert device == "meta" or model.ema.tolist() == [0.0] * 4


def test_a_buffer_update_that_fx_records_runs_in_the_graph_and_capture_undoes_it():
    """`self.run.copy_(x.mean(0))` is an op of the graph; neither capture nor the backend's trace changes the
    buffer (the shape-recording run wrote it, and capture restores it)."""
    from suite.capture.fx import traced_module

    model = _Counts("copy_")
    x = torch.randn(2, 4)
    g = capture(model, (x,), name="counts")
    assert [op.name for op in g.ops] == ["x", "mean", "copy_", "fc", "mul", "add"]
    gm, _ = traced_module(model, (x,))
    assert model.n.item() == 3.0 and model.run.tolist() == [1.0] * 4
    with torch.no_grad():
        torch.testing.assert_close(gm(x), model.fc(x) * 3.0 + x.mean(0), rtol=0, atol=0)
    torch.testing.assert_close(model.run, x.mean(0), rtol=0, atol=0)  # running it updates the buffer, as eager


class _RunningMean(nn.Module):
    """Reads, writes, reads and writes again a buffer in forward (torch.fx records both writes); `no_grad`: the
    writes are done without gradients, as a running statistic's usually are."""

    def __init__(self, no_grad: bool = False) -> None:
        super().__init__()
        self.fc, self.no_grad = nn.Linear(4, 4), no_grad
        self.register_buffer("run", torch.zeros(4))

    def forward(self, x):
        y = self.fc(x)  # 2 x 4 fp32: 32 bytes
        old = y * self.run  # reads the buffer before the first write
        with torch.no_grad() if self.no_grad else contextlib.nullcontext():
            self.run.copy_(y.mean(0))  # 16 bytes
        new = old + self.run  # reads the first write
        with torch.no_grad() if self.no_grad else contextlib.nullcontext():
            self.run.add_(y.sum(0))  # reads the first write, after `new` read it
        return (new * self.run.view(1, 4)).sum()  # reads the second write, through a view


def _named_edges(g: OpGraph) -> set[tuple[str, str, int]]:
    return {(g.ops[e.src].name, g.ops[e.dst].name, e.bytes) for e in g.edges}


def test_the_ops_around_a_recorded_buffer_write_keep_forwards_order():
    """A buffer that forward writes in place (`self.run.copy_(m)`) was a constant to all its readers: those
    after the write had no edge from it (the simulator, and split placements, could run them first, on the
    old values). Now a read after a write is an edge carrying the bytes read (the buffer's 16, through a view
    too), and a write follows the reads of the old values by 0-byte edges (an order, no data)."""
    g = capture(_RunningMean(), (torch.randn(2, 4),), name="running")
    assert _named_edges(g) == {
        ("x", "fc", 32), ("fc", "mul", 32), ("fc", "mean", 32), ("fc", "sum_1", 32),
        ("mul", "copy_", 0), ("mean", "copy_", 16),  # the first write: after mul's read, of mean's values
        ("mul", "add", 32), ("copy_", "add", 16),  # add reads the first write
        ("add", "add_", 0), ("copy_", "add_", 16), ("sum_1", "add_", 16),  # the second, after add's read
        ("add", "mul_1", 32), ("add_", "mul_1", 16), ("mul_1", "sum_2", 32),
    }
    ops = {op.name: op for op in g.ops}
    assert ops["add"].bytes_read == 48 and ops["copy_"].bytes_read == 16  # ordering edges read nothing


def test_a_buffer_write_orders_a_training_graph_without_gradients_along_the_order():
    """In training mode the forward ops keep the same edges; no backward op follows an ordering edge, and a
    write done without gradients (a running statistic under torch.no_grad()) passes none back: the ops that
    read the buffer after it get their gradients as for a constant."""
    for no_grad in (False, True):
        g = capture(_RunningMean(no_grad), (torch.randn(2, 4),), name="running", mode="training")
        assert {e for e in _named_edges(g) if e[2] == 0} == {("mul", "copy_", 0), ("add", "add_", 0)}
        assert ("copy_", "add", 16) in _named_edges(g) and ("add_", "mul_1", 16) in _named_edges(g)
        backward = {op.name for op in g.ops if op.phase == "backward"}
        through_writes = {"copy_/grad", "mean/grad", "add_/grad", "sum_1/grad"}
        assert not backward & through_writes if no_grad else through_writes <= backward


class _Overwrites(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("run", torch.zeros(4))

    def forward(self, x):
        self.run.copy_(x.mean(0))
        self.run.copy_(x.sum(0))  # overwrites the first copy unread
        return x * self.run


def test_a_copy_into_a_buffer_follows_the_write_before_and_reads_nothing_of_it():
    g = capture(_Overwrites(), (torch.randn(2, 4),), name="overwrites")
    assert _named_edges(g) == {
        ("x", "mean", 32), ("x", "sum_1", 32), ("x", "mul", 32), ("mean", "copy_", 16),
        ("copy_", "copy__1", 0), ("sum_1", "copy__1", 16), ("copy__1", "mul", 16),
    }


class _EarlyView(nn.Module):
    """Takes a view of a buffer, then writes the buffer, then reads the view (eager: the new values)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("run", torch.zeros(4))

    def forward(self, x):
        v = self.run.view(1, 4)  # a view of the buffer's memory, taken before the write
        self.run.copy_(x.mean(0))  # 16 bytes
        return x * v  # reads the write through the view


def test_a_view_taken_before_a_buffer_write_reads_the_write():
    """The op reading a view of a buffer taken before a write read the buffer's old values in the graph (no
    edge from the write: the simulator and split placements could run it first); eager PyTorch reads the
    written values through the view, so it reads the write: an edge of the view's 16 bytes."""
    g = capture(_EarlyView(), (torch.randn(2, 4),), name="early_view")
    assert _named_edges(g) == {("x", "mean", 32), ("x", "mul", 32), ("mean", "copy_", 16), ("copy_", "mul", 16)}


class _ScaledRun(nn.Module):
    """Writes a buffer, then computes from the buffer alone (`self.run * 2.0`)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.register_buffer("run", torch.ones(4))

    def forward(self, x):
        y = self.fc(x)  # 2 x 4 fp32: 32 bytes
        self.run.copy_(y.mean(0))  # 16 bytes
        return y * (self.run * 2.0)


def test_a_value_computed_from_a_written_buffer_alone_reads_the_write():
    """torch.fx computed `self.run * 2.0` once, while tracing, from the buffer's old values, into a constant:
    the graph had no edge from the write (and no op for the product), and the traced module that the torch
    backend runs returned the stale product at every call. Now the product is an op reading the write, and
    the traced module computes it from the buffer at each call, as eager PyTorch."""
    from suite.capture.fx import traced_module

    x = torch.randn(2, 4)
    g = capture(_ScaledRun(), (x,), name="scaled")
    assert _named_edges(g) == {
        ("x", "fc", 32), ("fc", "mean", 32), ("mean", "copy_", 16),
        ("copy_", "mul", 16), ("fc", "mul_1", 32), ("mul", "mul_1", 16),
    }
    model = _ScaledRun()
    gm, _ = traced_module(model, (x,))
    assert not [n.target for n in gm.graph.nodes if n.op == "get_attr" and str(n.target).startswith("_tensor")]
    with torch.no_grad():
        y = model.fc(x)
        torch.testing.assert_close(gm(x), y * (y.mean(0) * 2.0), rtol=0, atol=0)


def test_the_traced_module_reads_a_written_buffer_where_a_backend_puts_it():
    """torch.fx took `self.run.view(1, 4)` while tracing, a tensor on the buffer's memory: a backend that
    moves the buffer to a device (a new tensor, as `.to("cuda")` makes) left that view on the old memory, so
    every later read of it saw the initial values (the torch backend on a GPU, whatever the placement). The
    view is a node on the buffer now: with the buffer rebound, two calls equal eager's."""
    from suite.capture.fx import traced_module

    torch.manual_seed(0)
    model, x = _RunningMean(), torch.randn(2, 4)
    eager = copy.deepcopy(model)
    gm, _ = traced_module(model, (x,))
    gm.run = gm.run.clone()  # as a backend moving it to its device
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(gm(x), eager(x), rtol=0, atol=0)
    torch.testing.assert_close(gm.run, eager.run, rtol=0, atol=0)


class _TransposedRun(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.register_buffer("run", torch.zeros(4, 4))

    def forward(self, x):
        y = self.fc(x)
        self.run.copy_(y.T @ y)
        return y @ self.run.mT  # an attribute that is a view of the buffer


def test_the_traced_module_reads_an_attribute_view_of_a_written_buffer_where_a_backend_puts_it():
    """`self.run.mT` (an attribute, not a call) was still the tensor torch.fx took while tracing, on the
    buffer's first memory: with the buffer rebound (as a backend moving it to a GPU does), the traced module
    read the initial zeros through it. It is a node on the buffer now: two calls equal eager's."""
    from suite.capture.fx import traced_module

    torch.manual_seed(0)
    model, x = _TransposedRun(), torch.randn(2, 4)
    eager = copy.deepcopy(model)
    gm, _ = traced_module(model, (x,))
    assert [n.target for n in gm.graph.nodes if n.op == "get_attr"] == ["run", "run"]
    gm.run = gm.run.clone()  # as a backend moving it to its device
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(gm(x), eager(x), rtol=0, atol=0)


class _DataRun(nn.Module):
    """Writes its running mean through `.data` (`write`) or reads it back through `.data` after the write."""

    def __init__(self, write: bool) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.write = write
        self.register_buffer("run", torch.zeros(4))

    def forward(self, x):
        y = self.fc(x)
        if self.write:
            self.run.data.copy_(y.mean(0))
            return y + self.run
        self.run.copy_(y.mean(0))
        return y + self.run.data


@pytest.mark.parametrize("write", [True, False], ids=["write", "read"])
def test_a_buffer_written_or_read_through_data_is_the_buffer(write):
    """`self.run.data` is the buffer's memory: a write through it is a write to the buffer, and a read of it
    after a write reads that write. The add reads the 16 bytes of copy_ (as without `.data`), and the traced
    module reads the buffer where a backend puts it. Before, `.data` was a constant that torch.fx took while
    tracing: the graph had no copy_ -> add edge, and with the buffer rebound the traced module read (or
    wrote) the first memory."""
    from suite.capture.fx import traced_module

    torch.manual_seed(0)
    model, x = _DataRun(write), torch.randn(2, 4)
    g = capture(model, (x,), name="data_run")
    names = [op.name for op in g.ops]
    edges = {(names[e.src], names[e.dst], e.bytes) for e in g.edges}
    assert ("copy_", "add", 16) in edges
    eager = copy.deepcopy(model)
    gm, _ = traced_module(model, (x,))
    assert not [n.target for n in gm.graph.nodes if n.op == "get_attr" and n.target != "run"]
    gm.run = gm.run.clone()  # as a backend moving it to its device
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(gm(x), eager(x), rtol=0, atol=0)
        torch.testing.assert_close(gm.run, eager.run, rtol=0, atol=0)


class _BranchOnRun(_ScaledRun):
    def forward(self, x):
        y = self.fc(x)
        self.run.copy_(y.mean(0))
        return y * 2.0 if self.run.sum() > 0 else y  # a branch tracing would take once, on the old values


def test_a_branch_on_a_written_buffers_values_is_refused():
    with pytest.raises(GraphError, match="control flow"):
        capture(_BranchOnRun(), (torch.randn(2, 4),), name="branch")


def test_buffers_that_forward_only_reads_pass_the_check_whatever_they_hold():
    """The check that tracing left the buffers alone compares their bytes: a NaN buffer is unchanged, and a
    sparse buffer is compared by value (its bytes cannot be viewed: a RuntimeError)."""
    model = nn.Sequential(nn.Linear(4, 4))
    model.register_buffer("nan", torch.tensor([float("nan"), 1.0]))
    model.register_buffer("sparse", torch.eye(3).to_sparse())
    g = capture(model, (torch.randn(2, 4),), name="fc")
    assert [op.name for op in g.ops] == ["input_1", "0"]
    assert model.nan[1].item() == 1.0 and model.nan[0].isnan() and model.sparse.is_sparse


def test_capture_leaves_torchs_random_state_alone():
    """A model with dropout in training mode drew from torch's generator when its shapes were recorded, so a
    seeded run after a capture differed from one without it."""
    model = nn.Sequential(nn.Linear(3, 4), nn.Dropout(0.5)).train()
    x = torch.randn(8, 3)
    torch.manual_seed(7)
    expected = torch.rand(5)
    torch.manual_seed(7)
    capture(model, (x,), name="drop")
    assert torch.equal(torch.rand(5), expected)


class _SumLoss(nn.Module):
    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, a, b=None):
        return (self.inner(a) if b is None else self.inner(a, b)).sum()


def test_torch_transformer_layers_are_captured_with_their_attention_and_feed_forward():
    """nn.TransformerEncoderLayer / TransformerEncoder / TransformerDecoderLayer (d_model 16, 2 heads, feed-forward
    32, batch 2, target 5 tokens, memory 4) trace on their plain path; MACs by hand. Per token: QKV 3*16*16 + out
    16*16 + feed-forward 2*16*32 = 2048; self-attention scores and weighted sum 2 * B*heads*L*L*8."""
    from suite.capture.fx import trace

    torch.manual_seed(0)
    src, mem = torch.randn(2, 5, 16), torch.randn(2, 4, 16)

    def layer():
        return nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)

    enc_layer = 2048 * 10 + 2 * (2 * 2 * 5 * 5 * 8)  # 22080
    # decoder: self-attention block as the encoder's (less its feed-forward), then cross-attention: q and out
    # projections per target token, k and v per memory token, scores and weighted sum over 5 x 4
    dec_layer = 1024 * 10 + 1600 + 2 * 256 * 10 + 2 * 256 * 8 + 2 * (2 * 2 * 5 * 4 * 8) + 1024 * 10  # 32576
    cases = [
        (layer(), (src,), enc_layer),
        (nn.TransformerEncoder(layer(), 2, enable_nested_tensor=False), (src,), 2 * enc_layer),
        (nn.TransformerDecoderLayer(16, 2, 32, dropout=0.0, batch_first=True), (src, mem), dec_layer),
    ]
    for module, inputs, macs in cases:
        module.eval()
        g = capture(module, inputs, name="t")
        assert g.metadata["forward_macs"] == macs and "fallback_cost_kinds" not in g.metadata
        assert torch.allclose(trace(module, len(inputs))(*inputs), module(*inputs), atol=1e-6)
        t = capture(_SumLoss(module), inputs, name="t", mode="training")
        assert t.metadata["forward_macs"] == macs
        params = sum(p.numel() for p in module.parameters())
        assert g.metadata["params"] == t.metadata["params"] == params
        # one update op per op that holds weights: attention, the two linears and the layer norms of each layer
        layers = 2 if isinstance(module, nn.TransformerEncoder) else 1
        per_layer = 5 if not isinstance(module, nn.TransformerDecoderLayer) else 7
        assert sum(op.phase == "update" for op in t.ops) == layers * per_layer
    assert torch.backends.mha.get_fastpath_enabled()  # switched off only while tracing


def test_torch_transformer_is_captured_with_its_size_checks_run_on_the_example_inputs():
    """nn.Transformer (d_model 16, 2 heads, feed-forward 32, one encoder and one decoder layer, batch 2, source 5
    tokens, target 4) was refused: its forward checks its inputs' sizes in Python. MACs by hand: the encoder
    layer as above (22080); the decoder layer: self-attention projections 1024 per target token (8 tokens),
    scores and weighted sum 2 * 2*2*4*4*8, cross-attention q and out 512 per target token, k and v 512 per
    source token (10), scores and weighted sum 2 * 2*2*4*5*8, feed-forward 1024 per target token (27904)."""
    from suite.capture.fx import trace

    torch.manual_seed(0)
    src, tgt = torch.randn(2, 5, 16), torch.randn(2, 4, 16)
    module = nn.Transformer(16, 2, 1, 1, 32, dropout=0.0, batch_first=True).eval()
    macs = 22080 + 1024 * 8 + 2 * (2 * 2 * 4 * 4 * 8) + 512 * 8 + 512 * 10 + 2 * (2 * 2 * 4 * 5 * 8) + 1024 * 8
    mask = nn.Transformer.generate_square_subsequent_mask(4)
    for kwargs in [{}, {"tgt_mask": mask}]:  # a mask given as an input is applied as given
        g = capture(module, (src, tgt), example_kwargs=kwargs, name="t")
        assert g.metadata["forward_macs"] == macs == 49984 and "fallback_cost_kinds" not in g.metadata
        assert [op.name for op in g.ops if op.kind == "input"] == ["src", "tgt", *kwargs]
        expected = module(src, tgt, **kwargs)
        assert torch.allclose(trace(module, 2, list(kwargs))(src, tgt, **kwargs), expected, atol=1e-6)
    t = capture(_SumLoss(module), (src, tgt), name="t", mode="training")
    assert t.metadata["forward_macs"] == macs
    assert sum(op.phase == "update" for op in t.ops) == 5 + 7 + 2  # encoder and decoder layers, their final norms
    assert nn.Transformer.forward.__module__ == "torch.nn.modules.transformer"  # patched only while tracing
    # the checks torch makes in Python run on the example inputs
    with pytest.raises(GraphError, match="failed at '_assert.*: the batch number of src and tgt must be equal"):
        capture(module, (src, torch.randn(3, 4, 16)), name="t")
    with pytest.raises(GraphError, match="the feature number of src and tgt must be equal to d_model"):
        capture(module, (src, torch.randn(2, 4, 8)), name="t")


class _DetachedScale(nn.Module):
    """Scales x by a parameter w read through `detach()` or `.data` (no gradient reaches w) and by a trainable v."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.w = nn.Parameter(torch.ones(4))
        self.v = nn.Parameter(torch.ones(4))

    def forward(self, x):
        w = self.w.detach() if self.how == "detach" else self.w.data
        return (x * w * self.v).sum()


@pytest.mark.parametrize("how", ["detach", "data"])
def test_a_parameter_read_only_detached_gets_no_gradient_and_no_update(how):
    """`x * self.w.detach()` (or `.data`) passes no gradient to w: eager training leaves w.grad None, and the
    optimizer skips it. The training graph has v's weight gradient and update only (mul_1); w stays resident
    (params 8), counted as not trained (frozen_params 4). Before, w got a grad-weight and an update op."""
    from suite.capture.export import capture as capture_export

    model, x = _DetachedScale(how), torch.randn(2, 4)
    model(x).backward()
    assert model.w.grad is None and model.v.grad is not None
    fronts = [capture] if how == "data" else [capture, capture_export]  # torch.export refuses .data
    for front in fronts:
        g = front(_DetachedScale(how), (x,), name="detached", mode="training")
        assert sorted(op.name for op in g.ops if op.phase != "forward") == [
            "mul_1/grad_weight", "mul_1/update", "sum_1/grad"]
        assert (g.metadata["params"], g.metadata["frozen_params"]) == (8, 4)
        [update] = [op for op in g.ops if op.phase == "update"]
        assert update.param_bytes == 16  # v's momentum


class _DetachedAndTrained(nn.Module):
    """Reads the parameter w twice: through `detach()` (no gradient) and as itself (a gradient)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(4))

    def forward(self, x):
        return (x * self.w.detach() + self.w).sum()


def test_a_parameter_read_both_detached_and_trained_gets_one_weight_gradient():
    """`x * self.w.detach() + self.w`: eager autograd gives w the gradient of the add alone. w is a variable op
    (two users); only the add, which reads it with a gradient, gets a grad-weight and an accumulation op. Before,
    the mul (its detached use) got a grad-weight and an accumulation op too (8 + 4 FLOPs, 16 bytes of weight
    gradient more), and an add/grad op passing a gradient to the mul, which needs none."""
    from suite.capture.export import capture as capture_export

    model, x = _DetachedAndTrained(), torch.randn(2, 4)
    model(x).backward()
    torch.testing.assert_close(model.w.grad, torch.full((4,), 2.0))  # the add's, summed over the batch of 2
    for front in (capture, capture_export):
        g = front(_DetachedAndTrained(), (x,), name="detached", mode="training")
        back = {op.name: (op.kind, op.flops, op.bytes_read, op.output_bytes) for op in g.ops if op.phase != "forward"}
        assert back == {
            "sum_1/grad": ("sum_grad", 8.0, 4 + 32, 32),  # saved output, the add's output it reads
            "add/grad_weight": ("add_grad_weight", 8.0, 32 + 32 + 32, 16),  # grad, saved output, the mul's output
            "w/variable/acc0": ("accumulate_grad", 4.0, 16, 16),
            "w/variable/update": ("apply_momentum", 16.0, 3 * 16, 0),
        }
        assert g.metadata["params"] == 4 and "frozen_params" not in g.metadata
        assert sum(op.param_bytes for op in g.ops) == 16 + 16  # w once, its momentum once


class _DetachedAfterLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.w = nn.Parameter(torch.ones(4))

    def forward(self, x):
        return (self.fc(x) * self.w.detach() + self.w).sum()


def test_an_op_that_passes_a_gradient_back_gets_none_for_weights_it_reads_detached():
    """`fc(x) * self.w.detach() + self.w`: the mul passes fc's gradient back (mul/grad, reading w's weights), but
    w's gradient comes from the add alone: one grad-weight and one accumulation op for w, none at the mul."""
    from suite.capture.export import capture as capture_export

    for front, mul, add, fc in ((capture, "mul", "add", "fc"), (capture_export, "mul", "add", "fc/linear")):
        g = front(_DetachedAfterLayer(), (torch.randn(2, 4),), name="detached", mode="training")
        assert sorted(op.name for op in g.ops if op.phase != "forward") == sorted([
            "sum_1/grad", f"{add}/grad", f"{add}/grad_weight", "w/variable/acc0", "w/variable/update",
            f"{mul}/grad", f"{fc}/grad_weight", f"{fc}/update"])
        assert [g.ops[e.src].name for e in g.edges if e.dst == g.index["w/variable/acc0"]] == [f"{add}/grad_weight"]
        assert edge_bytes(g, "w/variable", f"{mul}/grad") == 16  # grad input = grad output x w
        assert g.ops[g.index[f"{mul}/grad"]].output_bytes == 32  # of fc's output only


class _RunningAverage(nn.Module):
    """Keeps a running average of fc's output means: in two in-place steps, or as one write from the inputs."""

    def __init__(self, one_write: bool) -> None:
        super().__init__()
        self.fc, self.one_write = nn.Linear(4, 4), one_write
        self.register_buffer("avg", torch.zeros(4), persistent=False)

    def forward(self, x):
        y = self.fc(x)
        m = y.mean(0).detach()
        if self.one_write:
            self.avg.copy_(0.9 * self.avg + 0.1 * m)
        else:
            self.avg.mul_(0.9).add_(0.1 * m)
        return (y * self.avg).sum()


def test_a_running_average_in_two_steps_is_refused_with_the_form_that_is_recorded():
    """`self.avg.mul_(0.9).add_(0.1 * m)`: the mul_ reads constants only, so both captures refuse it; the error
    names the form they record (one write from the inputs), written with the buffer's name (the export
    capture's said self.n), which captures as eager PyTorch runs it."""
    from suite.capture.export import capture as capture_export
    from suite.capture.fx import traced_module

    x = torch.randn(3, 4)
    for front in (capture, capture_export):
        with pytest.raises(GraphError, match=r"avg\.add_\(1\).*recorded written as one write from them \(self\.avg\.copy_\("):
            front(_RunningAverage(one_write=False), (x,), name="avg")
        g = front(_RunningAverage(one_write=True), (x,), name="avg")
        assert [op.kind for op in g.ops if op.kind.startswith("copy")] in (["copy_"], ["copy"])
    model, eager = _RunningAverage(one_write=True), _RunningAverage(one_write=False)
    eager.load_state_dict(model.state_dict())
    gm, args = traced_module(model, (x,))
    with torch.no_grad():
        for _ in range(2):  # the buffer moves at each step as in eager PyTorch
            torch.testing.assert_close(gm(*args), eager(x))
    torch.testing.assert_close(gm.avg, eager.avg)


class _Remembers(nn.Module):
    """Keeps plain attributes across calls: a call count and its last output (not buffers)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.last, self.calls = nn.Linear(4, 4), None, 0

    def forward(self, x):
        self.calls += 1
        y = self.fc(x) if self.last is None else self.fc(x) + self.last
        self.last = y
        return y * 2


def test_tracing_leaves_the_modules_attributes_as_they_were():
    """Tracing ran forward's Python code for real: it left `self.last` bound to a torch.fx Proxy, so the next
    eager call returned a Proxy instead of a tensor, counted the trace in `self.calls` and added torch.fx's
    `_tensor_constant0` to the module. Now the module's attributes are as they were, and it runs as before."""
    from suite.capture.fx import traced_module

    model = _Remembers()
    before = dict(vars(model))
    x = torch.randn(2, 4)
    g = capture(model, (x,), name="remembers")
    assert [op.name for op in g.ops] == ["x", "fc", "mul"]
    gm, _ = traced_module(model, (x,))
    assert vars(model) == before and model.last is None and model.calls == 0
    with torch.no_grad():
        y = model(x)
        torch.testing.assert_close(gm(x), y, rtol=0, atol=0)
    assert isinstance(y, torch.Tensor) and model.calls == 1


class _Shifts(nn.Module):
    """Writes its input in place."""

    def forward(self, x):
        x.add_(1.0)
        return x * 2


def test_capture_leaves_the_example_inputs_as_they_were():
    """The shape-recording run wrote the caller's example input (x.add_(1) made it 2 from 1), so a comparison
    with eager on the same tensor after capture started from other values. The graph is the same."""
    x = torch.ones(2, 4)
    g = capture(_Shifts(), (x,), name="shifts")
    assert [(op.name, op.kind, op.flops) for op in g.ops] == [("x", "input", 0.0), ("add_", "add_", 8.0),
                                                               ("mul", "mul", 8.0)]
    assert [(e.src, e.dst, e.bytes) for e in g.edges] == [(0, 1, 32), (1, 2, 32)]
    assert x.tolist() == [[1.0] * 4] * 2


class _Augmented(nn.Module):
    """`b += 1` changes a too (one tensor, two names); `n *= 2` on a size is a new int, `n` keeps its value."""

    def forward(self, x):
        a = x * 3
        b = a
        b += 1
        n = x.size(1)
        m = n
        m *= 2
        return a * 2, x.reshape(-1, n), x.reshape(-1, m)


def test_an_augmented_assignment_to_a_tensor_is_its_in_place_call():
    """torch.fx recorded `b += 1` as `b + 1`: the graph's `a * 2` read `a * 3`, not the add (the add led nowhere),
    and the traced module that the torch backend runs returned x * 6 where eager returns (x * 3 + 1) * 2. It
    is `b.add_(1)` now; `m *= 2` on a size stays the Python operator (n keeps its value)."""
    from suite.capture.fx import traced_module

    model, x = _Augmented(), torch.randn(2, 4)  # 32 bytes
    g = capture(model, (x,), name="augmented")
    assert [(op.name, op.kind, op.flops, op.output_bytes) for op in g.ops] == [
        ("x", "input", 0.0, 32), ("mul", "mul", 8.0, 32), ("add_", "add_", 8.0, 32), ("mul_1", "mul", 8.0, 32)]
    assert [(e.src, e.dst, e.bytes) for e in g.edges] == [(0, 1, 32), (1, 2, 32), (2, 3, 32)]
    gm, _ = traced_module(model, (x,))
    for got, want in zip(gm(x), model(x), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert [t.shape for t in gm(x)] == [(2, 4), (2, 4), (1, 8)]


class _Counted(nn.Module):
    """A leaf op (it has a capture rule) whose forward has a side effect: it logs its calls in a list that
    outlives capture (capture binds each attribute back as it was, `self.calls += 1` would not show it)."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[int] = []

    def capture_cost(self, inputs, outputs, training):
        return Cost("counted", 8.0)

    def forward(self, x):
        self.log.append(1)
        return x * 2


class _CountedAugmented(nn.Module):
    def __init__(self, augmented: bool) -> None:
        super().__init__()
        self.counted, self.augmented = _Counted(), augmented

    def forward(self, x):
        y = self.counted(x)
        n = x.size(1)
        if self.augmented:
            y += 1
            n += 1
        else:
            y = y + 1
            n = n + 1
        return y, x.new_zeros(n)


@pytest.mark.parametrize("augmented", [False, True])
def test_an_augmented_assignment_costs_no_extra_run_of_forward(augmented):
    """Capture ran the graph twice where forward has an augmented assignment (`y += 1`, `n += 1`): once to tell
    an assignment to a tensor (y.add_(1)) from one to a size (n + 1), once to record the shapes, so a side
    effect of a leaf module's forward (a counter) happened twice. The shape-recording run tells them apart
    now: one call, as without one; the graph is the same (an in-place add_ for y, the size 5). traced_module,
    which does not record shapes, still runs the graph once for it (documented), and not without one."""
    from suite.capture.fx import traced_module

    model, x = _CountedAugmented(augmented), torch.randn(2, 4)
    g = capture(model, (x,), name="counted")
    assert len(model.counted.log) == 1
    gm, args = traced_module(model, (x,))
    assert len(model.counted.log) == 1 + augmented
    for got, want in zip(gm(*args), model(x), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    kinds = [(op.name, op.kind, op.flops, op.output_bytes) for op in g.ops]
    assert kinds == [("x", "input", 0.0, 32), ("counted", "counted", 8.0, 32),
                     ("add_" if augmented else "add", "add_" if augmented else "add", 8.0, 32)]


class _ViewAugmented(nn.Module):
    def forward(self, x):
        v = x.view(-1)
        v += 1
        return x * 2


def test_an_augmented_assignment_through_a_view_is_refused():
    """`v += 1` on a view of x changes x, which `x * 2` reads after: the graph read x (and an add that led
    nowhere), so split placements and the torch backend computed x * 2. Refused as `v.add_(1)` is."""
    with pytest.raises(GraphError, match=r"^_ViewAugmented: the in-place call 'add_' \(add_\) writes to memory "
                                         r"that 'x' shares"):
        capture(_ViewAugmented(), (torch.randn(2, 4),), name="view")


class _PassesKwargs(nn.Module):
    """HF style: forward passes its **kwargs on to a submodule."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = _ReadsKwargs(reads=True)

    def forward(self, x, **kwargs):
        return self.inner(x, **kwargs)


def test_a_forward_that_passes_its_kwargs_on_is_captured():
    """torch.fx could not unpack its **kwargs placeholder ('Proxy object cannot be iterated'), with or without a
    keyword input; a mask given by keyword was refused as 'no argument'."""
    x, mask = torch.randn(2, 4), torch.rand(2, 4)
    assert [op.name for op in capture(_PassesKwargs(), (x,), name="kw").ops] == ["x", "inner.fc"]
    g = capture(_PassesKwargs(), (x,), example_kwargs={"mask": mask}, name="kw")
    assert [op.name for op in g.ops] == ["x", "mask", "inner.fc", "inner/mul"]
