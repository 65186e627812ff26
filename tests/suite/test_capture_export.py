"""Capture through torch.export: the same IR, MACs and parameters as the fx capture (nn.Transformer too),
models fx cannot trace (Python branches on sizes), in-place calls, and one clear error where export fails."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from suite import graph_io
from suite.capture import capture_export
from suite.capture import fx as fx_capture
from suite.capture.export import capture
from suite.errors import GraphError
from suite.graph import OpGraph


def by_kind(g: OpGraph, kind: str) -> list:
    return [op for op in g.ops if op.kind == kind]


def edges_into(g: OpGraph, dst: str) -> dict[str, int]:
    d = g.index[dst]
    return {g.ops[e.src].name: e.bytes for e in g.edges if e.dst == d}


class Loss(nn.Module):
    """A training step's loss: the mean square of the model's output."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        return self.model(*xs).square().mean()


class Loss1(Loss):
    def forward(self, x: torch.Tensor) -> torch.Tensor:  # one input, named x (Loss's are xs_0, xs_1, ...)
        return self.model(x).square().mean()


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True), nn.MaxPool2d(2),
                         nn.Conv2d(8, 8, 3, groups=2), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.1),
                         nn.Linear(8, 2))


def encoder_layer() -> nn.Module:
    return nn.TransformerEncoderLayer(16, 2, 32)


SMALL = [(mlp, (3, 8)), (cnn, (2, 3, 8, 8)), (encoder_layer, (5, 2, 16))]


@pytest.mark.parametrize(("make", "shape"), SMALL, ids=["mlp", "cnn", "encoder_layer"])
@pytest.mark.parametrize("evaluation", [False, True], ids=["train_state", "eval_state"])
def test_small_models_have_the_fx_captures_macs_flops_and_parameters(make, shape, evaluation):
    torch.manual_seed(0)
    model = make().train(not evaluation)
    x = (torch.randn(*shape),)
    a = fx_capture.capture(model, x, name="m")
    b = capture(model, x, name="m")
    for key in ("forward_macs", "forward_flops", "params", "param_bytes"):
        assert b.metadata[key] == a.metadata[key], key
    assert b.metadata["capture"] == "torch.export"
    assert "fallback_cost_kinds" not in b.metadata


class _Transposes(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        return y.T @ y + y.mT @ y + y.unsqueeze(0).mH.squeeze(0) @ y + y.adjoint() @ y


def test_transposes_by_attribute_are_views_as_in_the_fx_capture():
    """`y.T`, `y.mT`, `y.mH` and `y.adjoint()` are views (ATen numpy_T, mT, mH, adjoint): folded, as the fx
    capture folds them. They were ops of the fallback cost (8 FLOPs each here) with a warning."""
    x = (torch.randn(2, 4),)
    a = fx_capture.capture(_Transposes(), x, name="t")
    b = capture(_Transposes(), x, name="t")
    assert [op.kind for op in b.ops] == [op.kind for op in a.ops] == [
        "input", "linear", *["matmul"] * 2, "add", "matmul", "add", "matmul", "add"]
    assert b.metadata["forward_flops"] == a.metadata["forward_flops"] == 72 + 4 * 64 + 3 * 16
    assert "fallback_cost_kinds" not in b.metadata


def test_mlp_by_hand_one_op_per_linear():
    g = capture(mlp(), (torch.randn(3, 8),), name="mlp")
    assert [op.kind for op in g.ops] == ["input", "linear", "relu", "linear"]
    first, second = by_kind(g, "linear")
    assert first.name == "0/linear" and first.scope == "0"
    assert first.flops == 2 * 3 * 8 * 16 + 3 * 16
    assert first.param_bytes == (8 * 16 + 16) * 4
    assert g.metadata["forward_macs"] == 3 * 8 * 16 + 3 * 16 * 4
    assert edges_into(g, second.name) == {"1/relu": 3 * 16 * 4}


def test_encoder_layer_attention_is_its_projections_and_one_attention_op():
    g = capture(encoder_layer(), (torch.randn(5, 2, 16),), name="enc")
    (attn,) = by_kind(g, "attention")
    assert attn.scope == "self_attn"
    s, b, e, heads = 5, 2, 16, 2
    assert attn.flops == 2 * (2 * b * s * s * e) + 5 * b * heads * s * s  # q k^T and probs v; softmax
    in_proj = g.ops[g.index["self_attn/linear"]]
    assert in_proj.param_bytes == (3 * e * e + 3 * e) * 4


def test_training_step_has_the_fx_captures_parameters_and_forward():
    torch.manual_seed(0)
    model = cnn()
    model[0].weight.requires_grad_(False)
    x = (torch.randn(2, 3, 8, 8),)
    a = fx_capture.capture(Loss1(model), x, name="m", mode="training")
    b = capture(Loss1(model), x, name="m", mode="training")
    for key in ("forward_macs", "forward_flops", "params", "param_bytes", "frozen_params"):
        assert b.metadata[key] == a.metadata[key], key
    assert b.metadata["frozen_params"] == 8 * 3 * 3 * 3
    assert sum(op.flops for op in b.ops) == sum(op.flops for op in a.ops)


def test_frozen_norms_in_a_training_step_count_their_running_statistics_as_fx():
    """A BatchNorm in eval() and an InstanceNorm with running statistics in eval() normalise with those (2
    FLOPs per element) in a training step too: the call's own training / use_input_stats, as fx's module
    rule (export counted 4 and 5, from the capture's mode)."""
    model = nn.Sequential(nn.BatchNorm2d(2), nn.InstanceNorm2d(2, track_running_stats=True))
    model[0].eval()
    model[1].eval()
    x = (torch.randn(1, 2, 3, 3),)  # 18 elements
    for g in (fx_capture.capture(Loss1(model), x, name="m", mode="training"),
              capture(Loss1(model), x, name="m", mode="training")):
        forward = {op.kind: op.flops for op in g.ops if op.phase == "forward"}
        assert (forward["batch_norm"], forward["instance_norm"]) == (2 * 18, 2 * 18)


def test_training_attention_differs_from_fx_only_by_its_granularity():
    """fx keeps nn.MultiheadAttention as one op: reading the model input, it gets only a grad-weight op (1x
    its forward FLOPs). Export traces through it: the input projection likewise, the attention (no weights) a
    grad-input op, the output projection both: the out projection's forward FLOPs more."""
    torch.manual_seed(0)
    model = encoder_layer()
    x = (torch.randn(5, 2, 16),)
    a = fx_capture.capture(Loss1(model), x, name="m", mode="training")
    b = capture(Loss1(model), x, name="m", mode="training")
    assert b.metadata["forward_flops"] == a.metadata["forward_flops"]
    out_proj = 2 * 10 * 16 * 16 + 10 * 16
    assert sum(op.flops for op in b.ops) == sum(op.flops for op in a.ops) + out_proj


def transformer() -> nn.Transformer:
    torch.manual_seed(0)
    return nn.Transformer(d_model=16, nhead=2, num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=32)


def transformer_macs(s: int, t: int, b: int, e: int, ff: int) -> int:
    """Multiply-adds of a 1 + 1 layer nn.Transformer, source length s, target length t, batch b."""
    attention = 2 * b * e  # per query and key: q k^T and probs v
    encoder = s * b * 3 * e * e + attention * s * s + s * b * e * e + 2 * s * b * e * ff
    decoder_self = t * b * 3 * e * e + attention * t * t + t * b * e * e
    decoder_cross = t * b * e * e + s * b * 2 * e * e + attention * t * s + t * b * e * e
    return encoder + decoder_self + decoder_cross + 2 * t * b * e * ff


def test_transformer_export_captures_with_hand_counted_macs_as_fx(tmp_path):
    model = transformer()
    src, tgt = torch.randn(5, 2, 16), torch.randn(4, 2, 16)
    g = capture_export(model, (src, tgt), name="transformer")
    assert g.metadata["forward_macs"] == transformer_macs(5, 4, 2, 16, 32) == 49984
    # the torch.fx capture (its size checks run on the example inputs) counts the same
    assert fx_capture.capture(model, (src, tgt), name="t").metadata["forward_macs"] == 49984
    assert g.metadata["params"] == sum(p.numel() for p in model.parameters())
    assert len(by_kind(g, "attention")) == 3
    # cross-attention's packed in-projection is read by its q and its k, v projections: one variable op
    (var,) = by_kind(g, "variable")
    assert var.name == "decoder.layers.0.multihead_attn/variable"
    assert var.param_bytes == (3 * 16 * 16 + 3 * 16) * 4
    path = tmp_path / "t.json"
    graph_io.save(g, path)
    assert graph_io.load(path).content_hash == g.content_hash


def test_transformer_training_step():
    model = transformer()
    g = capture(Loss(model), (torch.randn(5, 2, 16), torch.randn(4, 2, 16)), name="t", mode="training")
    assert g.metadata["params"] == sum(p.numel() for p in model.parameters()) == 5632
    assert {op.phase for op in g.ops} == {"forward", "backward", "update"}
    updated = sum(op.param_bytes for op in g.ops if op.phase == "update")  # one momentum buffer per parameter
    assert updated == 5632 * 4
    assert g.metadata["forward_macs"] == transformer_macs(5, 4, 2, 16, 32)


class SizeBranch(nn.Module):
    """Branches in Python on its input's size: torch.fx cannot trace it, torch.export follows the branch."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.size(0) > 1:
            return self.fc(x).relu()
        return self.fc(x)


def test_a_size_branch_fx_refuses_export_follows():
    with pytest.raises(GraphError, match=r"torch.fx cannot trace SizeBranch: symbolically traced variables cannot be "
                                         r"used as inputs to control flow \(at .*: if x.size\(0\) > 1:\)"):
        fx_capture.capture(SizeBranch(), (torch.randn(3, 4),), name="b")
    assert [op.kind for op in capture(SizeBranch(), (torch.randn(3, 4),), name="b").ops] == ["input", "linear", "relu"]
    assert [op.kind for op in capture(SizeBranch(), (torch.randn(1, 4),), name="b").ops] == ["input", "linear"]


class ValueBranch(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return x * 2
        return x


def test_export_failure_is_one_short_graph_error_naming_model_reason_and_line():
    with pytest.raises(GraphError) as info:
        capture(ValueBranch(), (torch.randn(3),), name="v")
    msg = str(info.value)
    assert msg.startswith("torch.export cannot export ValueBranch: Could not guard on data-dependent expression")
    assert msg.endswith(": if x.sum() > 0:)") and "test_capture_export.py" in msg
    assert "\n" not in msg and len(msg) < 400
    with pytest.raises(GraphError, match="capture needs a torch.nn.Module, got function"):
        capture(lambda x: x, (torch.randn(3),), name="f")
    with pytest.raises(GraphError, match="capture mode 'eval' is not one of inference, training"):
        capture(mlp(), (torch.randn(3, 8),), name="m", mode="eval")


class WriteThroughView(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        y[0].mul_(2)  # changes y, read below
        return y + 1


class InPlace(WriteThroughView):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        y.add_(1)
        v = y.flatten()
        v.relu_()  # y is not read again
        return v * 2


def test_in_place_calls_are_read_by_later_readers_writes_through_views_refused():
    with pytest.raises(GraphError, match=r"WriteThroughView: the in-place call 'mul_' \(mul_\) writes to memory that "
                                         r"'linear' shares"):
        capture(WriteThroughView(), (torch.randn(3, 4),), name="w")
    g = capture(InPlace(), (torch.randn(3, 4),), name="i")
    assert [op.name for op in g.ops] == ["x", "fc/linear", "add_", "relu_", "mul"]
    assert edges_into(g, "relu_") == {"add_": 3 * 4 * 4}
    assert edges_into(g, "mul") == {"relu_": 3 * 4 * 4}


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.out = nn.Linear(4, 10, bias=False)
        self.out.weight = self.emb.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(self.emb(ids))


def test_tied_weights_are_one_variable_with_the_fx_captures_key():
    ids = (torch.tensor([[1, 2, 3]]),)
    a = fx_capture.capture(Tied(), ids, name="t")
    b = capture(Tied(), ids, name="t")
    assert [op.name for op in by_kind(b, "variable")] == [op.name for op in by_kind(a, "variable")] == ["emb/variable"]
    assert b.metadata["params"] == a.metadata["params"] == 40


@pytest.mark.parametrize("kwargs", [{"num_layers": 2}, {"proj_size": 4, "bidirectional": True, "batch_first": True}])
def test_recurrent_layers_are_one_op_with_the_fx_captures_cost(kwargs):
    lstm = nn.LSTM(8, 16, **kwargs)
    x = (torch.randn(5, 3, 8),)
    a = fx_capture.capture(lstm, x, name="l")
    b = capture(lstm, x, name="l")
    (op,) = by_kind(b, "lstm")
    assert op.flops == by_kind(a, "lstm")[0].flops
    assert b.metadata["forward_macs"] == a.metadata["forward_macs"]
    gru = nn.GRU(8, 16, bias=False)
    assert capture(gru, x, name="g").metadata["forward_flops"] == fx_capture.capture(gru, x, name="g").metadata[
        "forward_flops"]


def test_dropout_folded_in_inference_an_op_in_training():
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))
    x = (torch.randn(3, 4),)
    assert [op.kind for op in capture(model, x, name="d").ops] == ["input", "linear"]
    g = capture(Loss1(model), x, name="d", mode="training")
    (drop,) = [op for op in g.ops if op.kind == "dropout" and op.phase == "forward"]
    assert drop.flops == 12


class TrainingBranch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        if self.training:
            y = y * 2
        return y.sum()


def test_exported_in_the_modes_state_flags_restored():
    """As the fx capture: an inference graph has no `if self.training:` branch, a training graph has it,
    whatever state the caller left the module in."""
    x = (torch.randn(3, 4),)
    model = TrainingBranch()  # a fresh module is in training mode
    model.fc.eval()
    g = capture(model, x, name="t")
    assert [op.name for op in g.ops] == ["x", "fc/linear", "sum_1"]
    assert g.metadata["forward_flops"] == 2 * 3 * 4 * 4 + 3 * 4 + 12
    assert model.training and not model.fc.training
    model.eval()
    g = capture(model, x, name="t", mode="training")
    assert [op.name for op in g.ops if op.phase == "forward"] == ["x", "fc/linear", "mul", "sum_1"]
    assert g.metadata["forward_flops"] == 2 * 3 * 4 * 4 + 3 * 4 + 12 + 12
    assert not model.training and not model.fc.training


def test_a_compiled_model_is_exported_as_the_module_it_compiles():
    model = mlp()
    g = capture(torch.compile(model), (torch.randn(3, 8),), name="m")
    plain = capture(model, (torch.randn(3, 8),), name="m")
    assert [op.name for op in g.ops] == [op.name for op in plain.ops] == ["input", "0/linear", "1/relu", "2/linear_1"]
    assert g.content_hash == plain.content_hash


class DictOutput(nn.Module):
    def __init__(self, count_steps: bool = False) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 2)
        self.count_steps = count_steps
        self.register_buffer("steps", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        if self.count_steps:  # a buffer mutation (from the inputs: one from constants is refused), which torch
            self.steps.add_(x.detach().sum())  # may record as an exported output the module does not return
        y = self.fc(x)
        return {"loss": y.sum(), "logits": y}


def test_a_training_step_returning_a_dict_is_told_its_entries_as_in_fx():
    """The message listed bare shapes ((), (3, 2)) and did not say to return the 'loss' entry."""
    msg = ("training mode needs DictOutput to return its loss, one scalar tensor; it returns {'loss': (), "
           "'logits': (3, 2)} (wrap the model in a module that returns its 'loss' entry alone, or capture it in "
           "inference mode)")
    for front_end, model in ((fx_capture.capture, DictOutput()), (capture, DictOutput()),
                             (capture, DictOutput(count_steps=True))):
        with pytest.raises(GraphError) as info:
            front_end(model, (torch.randn(3, 4),), name="d", mode="training")
        assert str(info.value) == msg


class Masked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, scale: float = 1.0) -> torch.Tensor:
        y = self.fc(x) * scale
        return y if mask is None else y * mask


def test_keyword_example_inputs_as_in_fx():
    """capture_export took positional example inputs only (a TypeError for example_kwargs)."""
    x, mask = torch.randn(3, 4), torch.ones(3, 2)
    for front_end in (fx_capture.capture, capture_export):
        g = front_end(Masked(), (x,), example_kwargs={"mask": mask, "scale": 2.0}, name="k")
        assert [op.kind for op in g.ops] == ["input", "input", "linear", "mul", "mul"]
        assert [op.name for op in g.ops if op.kind == "input"] == ["x", "mask"]
        assert g.metadata["forward_flops"] == 2 * 3 * 4 * 2 + 3 * 2 + 6 + 6
    g = capture_export(Masked(), example_kwargs={"x": x}, name="k")
    assert [op.kind for op in g.ops] == ["input", "linear", "mul"]
    with pytest.raises(GraphError, match="torch.export cannot export Masked: .*unexpected keyword argument 'mak'"):
        capture_export(Masked(), (x,), example_kwargs={"mak": mask}, name="k")
    with pytest.raises(GraphError, match=r"torch.export cannot export Masked: .*; a dict among the example inputs "
                                         r"is one argument: give keyword inputs as example_kwargs$"):
        capture_export(Masked(), ({"x": x, "mask": mask},), name="k")


class GridSample(nn.Module):
    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode

    def forward(self, x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.grid_sample(x, grid, mode=self.mode, align_corners=False)


@pytest.mark.parametrize(("mode", "x", "grid", "flops"), [
    ("bilinear", (2, 4, 6, 6), (2, 3, 3, 2), 72 * 7),  # 4 neighbours: 2 n - 1 per output element
    ("nearest", (2, 4, 6, 6), (2, 3, 3, 2), 72 * 1),
    ("bicubic", (2, 4, 6, 6), (2, 3, 3, 2), 72 * 31),
    ("bilinear", (2, 4, 3, 6, 6), (2, 2, 3, 3, 3), 144 * 15),  # of a volume: trilinear, 8 neighbours
])
def test_grid_sample_costs_as_in_fx(mode, x, grid, flops):
    """torch.export calls it aten.grid_sampler, which had no rule: the fallback of 1 FLOP per output element."""
    inputs = (torch.randn(*x), torch.rand(*grid) * 2 - 1)
    for front_end in (fx_capture.capture, capture):
        g = front_end(GridSample(mode), inputs, name="g")
        assert [op.kind for op in g.ops] == ["input", "input", "grid_sample"]
        assert g.metadata["forward_flops"] == flops and "fallback_cost_kinds" not in g.metadata


class Normalize(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.normalize(x)


def test_a_function_torch_writes_from_other_calls_is_those_calls():
    """F.normalize is a norm, a clamp and a division in the exported graph, each costed by its own rule: 51
    FLOPs for a [3, 8] input, where the fx capture's rule for the function gives 3 per element (as documented)."""
    x = (torch.randn(3, 8),)
    g = capture(Normalize(), x, name="n")
    assert [(op.kind, op.flops) for op in g.ops] == [("input", 0), ("linalg_vector_norm", 24), ("clamp_min", 3),
                                                      ("div", 24)]
    assert fx_capture.capture(Normalize(), x, name="n").metadata["forward_flops"] == 72


@pytest.mark.parametrize(("model", "x", "output_bytes"), [
    (nn.EmbeddingBag(10, 4, mode="mean"), torch.tensor([[1, 2, 3], [4, 5, 6]]), 2 * 4 * 4),
    (nn.AdaptiveMaxPool2d(3), torch.randn(2, 4, 6, 6), 72 * 4),
    (nn.AdaptiveMaxPool2d(3, return_indices=True), torch.randn(2, 4, 6, 6), 72 * 4 + 72 * 8),  # int64 indices
], ids=["embedding_bag", "adaptive_max_pool", "with_indices"])
def test_outputs_the_torch_function_drops_are_not_the_ops(model, x, output_bytes):
    """aten.embedding_bag also returns its offsets, bag sizes and indices (80 bytes more here), and adaptive max
    pooling its indices, which the torch function drops: they counted in the op's output bytes."""
    for front_end in (fx_capture.capture, capture):
        (op,) = [op for op in front_end(model, (x,), name="o").ops if op.kind != "input"]
        assert op.output_bytes == output_bytes


class LogAddExp(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.logaddexp(x, x)


def test_an_op_without_a_rule_takes_the_fallback_and_is_named():
    with pytest.warns(UserWarning, match="no FLOP rule for logaddexp"):
        g = capture(LogAddExp(), (torch.randn(3, 4),), name="c")
    assert g.metadata["fallback_cost_kinds"] == ["logaddexp"]
    assert by_kind(g, "logaddexp")[0].flops == 12


class _Convolution(nn.Module):
    """torch.convolution called directly (input, weight, bias, stride, padding, dilation, transposed, ...)."""

    def __init__(self, transposed: bool) -> None:
        super().__init__()
        self.transposed = transposed
        self.w = nn.Parameter(torch.randn(3, 5, 2, 2) if transposed else torch.randn(8, 3, 3, 3))
        self.b = None if transposed else nn.Parameter(torch.randn(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.convolution(x, self.w, self.b, [1, 1], [0, 0], [1, 1], self.transposed, [0, 0], 1)


@pytest.mark.parametrize(("transposed", "kind", "flops", "macs"), [
    (False, "convolution", 2 * 6912 + 256, 2 * 8 * 4 * 4 * 3 * 9),  # out [2, 8, 4, 4]: 256 x 3 x 9, + bias
    (True, "conv_transpose", 2 * 4320, 2 * 3 * 6 * 6 * 5 * 4),  # each input element x 5 channels x 4
], ids=["convolution", "transposed"])
def test_torch_convolution_called_directly_costs_as_a_convolution_in_both_front_ends(transposed, kind, flops, macs):
    """capture_module had no rule for torch.convolution: 1 FLOP per output element (256, 490) and no MACs,
    where capture_export (ATen's convolution) counted the convolution."""
    x = (torch.randn(2, 3, 6, 6),)
    for g in (fx_capture.capture(_Convolution(transposed), x, name="c"), capture(_Convolution(transposed), x, name="c")):
        (op,) = by_kind(g, kind)
        assert (op.flops, g.metadata["forward_macs"]) == (flops, macs)
        assert "fallback_cost_kinds" not in g.metadata


def test_meta_tensors_capture_without_computing():
    with torch.device("meta"):
        model = nn.Transformer(d_model=16, nhead=2, num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=32)
        src, tgt = torch.randn(5, 2, 16), torch.randn(4, 2, 16)
    g = capture(model, (src, tgt), name="meta")
    assert g.metadata["forward_macs"] == transformer_macs(5, 4, 2, 16, 32)
    assert g.metadata["params"] == 5632


class Regions(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            t = self.a(x).relu()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            u = self.b(x)
        return (u + t).square().mean()


def test_no_grad_and_autocast_regions_are_inlined():
    """torch.export wraps them in higher-order ops: their ops are counted (they were one fallback op of 12
    FLOPs each), and no gradient flows back out of the no_grad region."""
    g = capture(Regions(), (torch.randn(3, 4),), name="r")
    assert g.metadata["forward_macs"] == 2 * 3 * 4 * 4
    assert "fallback_cost_kinds" not in g.metadata
    (a,) = [op for op in g.ops if op.scope == "a"]
    (b,) = [op for op in g.ops if op.scope == "b"]
    assert a.name.startswith("a/submod_") and a.name.endswith("/linear")
    assert b.output_bytes == 3 * 4 * 2  # bfloat16 under autocast
    t = capture(Regions(), (torch.randn(3, 4),), name="r", mode="training")
    assert [op.name for op in t.ops if op.phase != "forward" and op.scope == "a"] == []
    assert {op.phase for op in t.ops if op.scope == "b"} == {"forward", "backward", "update"}


class InferenceMode(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():  # a frozen backbone
            t = self.a(x).relu()
        return self.b(t.clone()).sum()


def test_no_gradient_flows_out_of_inference_mode_as_in_fx():
    """torch.export wraps no region around inference_mode: its ops had backward ops and a's weights an
    update, which eager training never computes."""
    x = (torch.randn(3, 4),)
    for front_end in (fx_capture.capture, capture):
        g = front_end(InferenceMode(), x, name="i", mode="training")
        assert [op.scope for op in g.ops if op.phase == "update"] == ["b"]
        assert [op.kind for op in g.ops if op.phase == "backward"] == ["sum_grad", "linear_grad_weight"]
    with torch.inference_mode():  # capturing under the caller's inference_mode: every result is an inference
        g = capture(Loss1(mlp()), (torch.randn(3, 8),), name="m", mode="training")  # tensor, none told apart
    assert [op.scope for op in g.ops if op.phase == "update"] == ["model.2", "model.0"]


class SelfAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 2)

    def forward(self, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        return self.attn(q, kv, kv)[0]  # need_weights=True: the weights averaged over heads are computed too


def test_multihead_attention_returning_weights_counts_its_query_scaling_and_head_average():
    x = (torch.randn(5, 2, 16), torch.randn(6, 2, 16))
    a = fx_capture.capture(SelfAttention(), x, name="a")
    b = capture(SelfAttention(), x, name="a")
    assert b.metadata["forward_macs"] == a.metadata["forward_macs"]
    batch, heads, lq, lk, head_dim = 2, 2, 5, 6, 8
    scaling = batch * heads * lq * head_dim  # q * head_dim ** -0.5
    average = batch * heads * lq * lk  # mean of the weights over heads: 1 per input element
    assert b.metadata["forward_flops"] == a.metadata["forward_flops"] + scaling + average
    assert [op.kind for op in b.ops if op.kind in ("mul", "mean")] == ["mul", "mean"]


SMALL_ZOO = [  # every zoo family, at shapes small enough to export twice in a test
    ("rnnlm", dict(batch_size=2, hidden_size=8, num_layers=2, num_steps=3, vocab_size=11)),
    ("nmt", dict(batch_size=2, hidden_size=8, num_layers=2, src_steps=3, tgt_steps=2, vocab_size=11)),
    ("bert_base", dict(batch_size=2, seq_len=5, num_layers=2, hidden_size=8, heads=2, ffn_size=16, vocab_size=11,
                       max_positions=8)),
    ("resnet50", dict(batch_size=2, image_size=32, num_classes=10)),
    ("inception_v3", dict(batch_size=2, image_size=75, num_classes=10)),
]


@pytest.mark.parametrize(("family", "params"), SMALL_ZOO, ids=[f for f, _ in SMALL_ZOO])
@pytest.mark.parametrize("mode", ["inference", "training"])
def test_zoo_families_have_the_fx_captures_forward_totals(family, params, mode):
    """Each zoo model, exported, has the fx capture's forward MACs, forward FLOPs and parameters (its ops are
    finer: the zoo's LSTM cell and attention step are one op each in the fx capture only)."""
    import importlib

    builder = importlib.import_module(f"suite.zoo.{family}")
    with torch.device("meta"):
        model, inputs = builder.model_and_inputs(**params, with_loss=mode == "training")
    by_fx = fx_capture.capture(model, inputs, name=family, mode=mode).metadata
    by_export = capture(model, inputs, name=family, mode=mode).metadata
    for key in ("forward_macs", "forward_flops", "params"):
        assert by_export[key] == by_fx[key] > 0, key


class _NoiseInTraining(nn.Module):
    """Python control flow on `self.training` (noise added only while training), and a dropout."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.drop = nn.Linear(4, 4), nn.Dropout(0.5)

    def forward(self, x):
        x = self.fc(x)
        if self.training:
            x = x + 1.0
        return self.drop(x).sum()


def test_export_runs_the_module_in_the_modes_state_as_the_fx_capture():
    """A module in train() captured for inference had its training-only add (8 FLOPs) in the exported graph,
    which the fx capture's graph lacks; a training capture of a model with a submodule in eval() counted
    that submodule's dropout (train=False: it returns its input). Each module's flag is as it was after."""
    model = _NoiseInTraining()
    x = torch.randn(2, 4)
    g = capture(model, (x,), name="n")
    assert [(op.name, op.kind) for op in g.ops] == [("x", "input"), ("fc/linear", "linear"), ("sum_1", "sum")]
    assert g.metadata["forward_flops"] == fx_capture.capture(model, (x,), name="n").metadata["forward_flops"]
    assert model.training and model.fc.training and model.drop.training
    wrapped = nn.Sequential(model)
    model.eval()
    g = capture(wrapped, (x,), name="n", mode="training")
    assert [op.name for op in g.ops if op.phase == "forward"] == ["input", "0.fc/linear", "0/sum_1"]
    assert wrapped.training and not any(m.training for m in model.modules())


class _BufferUpdate(nn.Module):
    """Updates a buffer in forward: "iadd" (self.n += 1), "add_" (self.n.add_(1)) or "copy_"
    (self.run.copy_(x.mean(0)), from the inputs)."""

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
        else:
            self.run.copy_(x.mean(0))
        return self.fc(x) * self.n + self.run


@pytest.mark.parametrize("how", ["iadd", "add_"])
def test_export_refuses_a_buffer_update_from_constants_naming_the_buffer(how):
    """`self.n += 1` was refused with a message about a view write, and `self.n.add_(1)` was dropped as a
    constant (the graph would never update the buffer); now both are refused naming the buffer, as in the fx
    capture, and the buffer is left as it was."""
    model = nn.Sequential(_BufferUpdate(how))
    with pytest.raises(GraphError, match=r"^Sequential.forward updates its buffer '0.n' from values that are not "
                                         r"the inputs'.*keep the update in a leaf module"):
        capture_export(model, (torch.randn(2, 4),), name="counts")
    assert model[0].n.item() == 3.0


class _Rebind(nn.Module):
    """Rebinds its buffer in forward (`self.n = self.n + ...`), then reads it."""

    def __init__(self, from_inputs: bool) -> None:
        super().__init__()
        self.fc, self.from_inputs = nn.Linear(4, 4), from_inputs
        self.register_buffer("n", torch.zeros(4))

    def forward(self, x):
        self.n = self.n + (x.mean(0) if self.from_inputs else 1)
        return self.fc(x) * self.n


def test_export_treats_a_buffer_rebinding_as_a_copy_into_it():
    """The module docstring said torch.export does not record `self.n = self.n + 1` read later in forward; it
    records a copy into the buffer: from constants refused naming the buffer (as the fx capture, which refuses
    every rebinding), the buffer left as it was; from the inputs an update whose later reader, the Mul, reads
    the new value (the Add's 16 bytes), not the old buffer."""
    model = _Rebind(from_inputs=False)
    with pytest.raises(GraphError, match=r"^_Rebind.forward updates its buffer 'n' from values that are not the "
                                         r"inputs'.*self.n = self.n \+ 1"):
        capture_export(model, (torch.randn(2, 4),), name="rebind")
    assert model.n.tolist() == [0.0] * 4
    model = _Rebind(from_inputs=True)
    g = capture_export(model, (torch.randn(2, 4),), name="rebind")
    names = [op.name for op in g.ops]
    assert names == ["x", "mean", "add", "fc/linear", "mul", "copy__default"]
    edges = {(names[e.src], names[e.dst]): e.bytes for e in g.edges}
    assert edges[("add", "mul")] == edges[("add", "copy__default")] == 16 and model.n.tolist() == [0.0] * 4


def test_export_keeps_a_buffer_update_from_the_inputs_and_batchnorms_running_statistics():
    """An update computed from the inputs is an op (as in the fx capture); BatchNorm's num_batches_tracked += 1
    (inside a module that the fx capture keeps whole) is not refused."""
    g = capture_export(_BufferUpdate("copy_"), (torch.randn(2, 4),), name="counts")
    assert [op.name for op in g.ops] == ["x", "mean", "copy_", "fc/linear", "mul", "add"]

    class Loss(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bn = nn.BatchNorm1d(4)

        def forward(self, x):
            return self.bn(x).sum()

    g = capture_export(Loss(), (torch.randn(2, 4),), name="bn", mode="training")
    assert "bn/batch_norm" in [op.name for op in g.ops]


class _RunningMean(nn.Module):
    """Reads, writes, reads and writes again a buffer (as test_capture's `_RunningMean`)."""

    def __init__(self, no_grad: bool = False) -> None:
        super().__init__()
        self.fc, self.no_grad = nn.Linear(4, 4), no_grad
        self.register_buffer("run", torch.zeros(4))

    def forward(self, x):
        y = self.fc(x)
        old = y * self.run
        with torch.no_grad() if self.no_grad else contextlib.nullcontext():
            self.run.copy_(y.mean(0))
        new = old + self.run
        with torch.no_grad() if self.no_grad else contextlib.nullcontext():
            self.run.add_(y.sum(0))
        return (new * self.run.view(1, 4)).sum()


class _Overwrites(nn.Module):
    """Copies into a buffer twice, the second copy overwriting the first unread."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("run", torch.zeros(4))

    def forward(self, x):
        self.run.copy_(x.mean(0))
        self.run.copy_(x.sum(0))
        return x * self.run


@pytest.mark.parametrize("no_grad", [False, True])
def test_export_orders_a_buffers_writes_as_the_fx_capture(no_grad):
    """The fx capture's edges around a buffer's writes (reads after a write read it; a write follows the
    earlier reads by 0-byte edges; copy_ follows the write it overwrites, reading nothing of it): torch.export
    had the reads after a write, not the order of a write after reads, and charged copy_ the old value's
    bytes. A write under torch.no_grad() (a region that export wraps) is ordered the same way."""
    def edges(g: OpGraph) -> set[tuple[str, str, int]]:
        name = {op.name: op.name.rsplit("/", 1)[-1] for op in g.ops}  # "submod_1/copy_", "fc/linear": "copy_"
        name.update({"fc/linear": "fc"})
        return {(name[g.ops[e.src].name], name[g.ops[e.dst].name], e.bytes) for e in g.edges}

    for model in (_RunningMean(no_grad), _Overwrites()):
        x = torch.randn(2, 4)
        want = {(g.ops[e.src].name, g.ops[e.dst].name, e.bytes) for g in [fx_capture.capture(model, (x,), name="m")]
                for e in g.edges}
        assert edges(capture(model, (x,), name="m")) == want


class _Picks(nn.Module):
    """Takes columns 0, 2 and 5 of a linear layer's [4, 8] output by an index tensor, then doubles them."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.fc, self.how = nn.Linear(8, 8), how

    def forward(self, x, idx):
        y = self.fc(x)
        return (y.index_select(1, idx) if self.how == "index_select" else y[:, idx]) * 2


@pytest.mark.parametrize("how", ["index_select", "getitem"])
def test_indexing_by_a_tensor_costs_as_index_select_in_both_front_ends(how):
    """`y[:, idx]` copies the columns it takes, as `y.index_select(1, idx)` does (and as ONNX Gather counts
    both): one op of 1 FLOP per output element (4 x 3 = 12) reading the 48 bytes it takes of y (not y's 128)
    and the 24 of the index. Before, the fx and export captures folded `y[:, idx]` as a view (no op, no
    FLOP) and charged index_select all of y."""
    x, idx = torch.randn(4, 8), torch.tensor([0, 2, 5])
    for front, g in (("fx", fx_capture.capture(_Picks(how), (x, idx), name="picks")),
                     ("export", capture(_Picks(how), (x, idx), name="picks"))):
        kind = "index_select" if how == "index_select" else "index"
        [op] = by_kind(g, kind)
        assert (op.flops, op.bytes_read, op.output_bytes) == (12.0, 72, 48)
        producer = "fc" if front == "fx" else "fc/linear"
        assert edges_into(g, op.name) == {producer: 48, "idx": 24}


class _Table(nn.Module):
    """Looks rows of a [100, 8] parameter up by ids [2, 3]: as nn.Embedding, F.embedding, `weight[ids]` or
    `weight.index_select(0, ids)`."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        if how == "module":
            self.emb = nn.Embedding(100, 8)
        else:
            self.weight = nn.Parameter(torch.randn(100, 8))

    def forward(self, ids):
        if self.how == "module":
            return self.emb(ids).sum()
        if self.how == "function":
            return F.embedding(ids, self.weight).sum()
        if self.how == "getitem":
            return self.weight[ids].sum()
        return self.weight.index_select(0, ids.flatten()).sum()


@pytest.mark.parametrize("mode", ["inference", "training"])
@pytest.mark.parametrize("how", ["module", "function", "getitem", "index_select"])
def test_a_lookup_in_a_parameter_costs_as_an_embedding_however_written(how, mode):
    """`self.weight[ids]` and `self.weight.index_select(0, ids)` are the embedding lookup `F.embedding(ids,
    self.weight)`: kind "embedding", no FLOPs, reading the 48 bytes of the ids and the 6 rows of 8 floats it
    gathers (192), not the table's 3200 (resident: its parameter bytes); in training its weight gradient
    scatters 48 elements. Before, indexing the parameter counted 48 FLOPs and read 3248 bytes."""
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    for g in (fx_capture.capture(_Table(how), (ids,), name="t", mode=mode),
              capture(_Table(how), (ids,), name="t", mode=mode)):
        [op] = [op for op in g.ops if op.phase == "forward" and op.kind not in ("input", "sum")]
        assert (op.kind, op.flops, op.bytes_read, op.output_bytes, op.param_bytes) == ("embedding", 0.0, 240, 192, 3200)
        if mode == "training":
            [grad] = by_kind(g, "embedding_grad_weight")
            assert grad.flops == 48.0


class _Part(nn.Module):
    """Reads row 3 of a [10, 4] parameter by a constant index and rows 0:2 of a [6, 4] one by a slice."""

    def __init__(self) -> None:
        super().__init__()
        self.e = nn.Parameter(torch.randn(10, 4))
        self.p = nn.Parameter(torch.randn(6, 4))

    def forward(self, x):
        return ((x + self.e[3]) * self.p[0:2].sum(0)).sum()


@pytest.mark.parametrize("mode", ["inference", "training"])
def test_an_op_reading_a_constant_index_or_slice_of_a_parameter_reads_only_that_part(mode):
    """`x + self.e[3]` reads x (32 bytes) and one row of e (16), not all of e (160: resident, its parameter
    bytes); `self.p[0:2].sum(0)` reads two rows (32) of p's 96, as `self.e[idx]` (a lookup) reads only its
    rows. Before, they read 192 and 96 bytes."""
    x = torch.randn(2, 4)
    for g in (fx_capture.capture(_Part(), (x,), name="t", mode=mode), capture(_Part(), (x,), name="t", mode=mode)):
        f = {op.name: op for op in g.ops if op.phase == "forward"}
        assert (f["add"].bytes_read, f["add"].param_bytes) == (32 + 16, 160)
        assert (f["sum_1"].bytes_read, f["sum_1"].param_bytes) == (32, 96)
        assert f["mul"].bytes_read == 32 + 16


def test_export_reads_a_plain_dataclass_output_as_the_fx_capture_without_registering_it():
    """A `@dataclass` output object that torch's pytree does not know made torch.export fail ("Found <class
    Out> in output, which is not a known type ... register a pytree"). It is read as the dict of its fields,
    as the fx capture reads it (the same ops and FLOPs; in training mode the error names its entries), and
    neither a pytree registration nor the hook that does it stays behind."""
    import dataclasses

    import torch.utils._pytree as pytree

    @dataclasses.dataclass
    class Out:
        loss: torch.Tensor
        logits: torch.Tensor

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            y = self.fc(x)
            return Out(loss=y.square().mean(), logits=y)

    model, x = Model(), torch.randn(2, 4)
    g = capture(model, (x,), name="out")
    assert [op.name for op in g.ops] == ["x", "fc/linear", "square", "mean"]
    assert g.metadata["forward_flops"] == fx_capture.capture(model, (x,), name="out").metadata["forward_flops"]
    assert Out not in pytree.SUPPORTED_NODES and not model._forward_hooks
    assert isinstance(model(x), Out)
    with pytest.raises(GraphError, match=r"it returns \{'loss': \(\), 'logits': \(2, 4\)\}"):
        capture(model, (x,), name="out", mode="training")
    assert not model._forward_hooks


class _TwoArgs(nn.Module):
    def __init__(self, write: bool = False) -> None:
        super().__init__()
        self.fc, self.fc2, self.write = nn.Linear(4, 4), nn.Linear(4, 4), write

    def forward(self, a, b):
        if self.write:
            a.mul_(2)  # eager PyTorch changes b too where both are one tensor
        return self.fc(a) + self.fc2(b)


def test_export_makes_one_tensor_given_twice_two_inputs_as_the_fx_capture():
    """`model(x, x)`: torch.export traced both arguments as one value, read through b (fc read b; a's input op
    had no reader). Each argument is now an input read by its own readers, as in the fx capture; a write to
    one of them in place is refused (the graph would not change the other), as the fx capture refuses it."""
    x = torch.randn(2, 4)
    g = capture(_TwoArgs(), (x, x), name="two")
    assert edges_into(g, "fc/linear") == {"a": 32} and edges_into(g, "fc2/linear_1") == {"b": 32}
    with pytest.raises(GraphError, match=r"^_TwoArgs: the in-place call 'mul_' \(mul_\) writes to input 'a'"):
        capture(_TwoArgs(write=True), (x, x), name="two")
    with pytest.raises(GraphError, match="writes to memory that 'b' shares"):
        fx_capture.capture(_TwoArgs(write=True), (x, x), name="two")
    assert edges_into(capture(_TwoArgs(write=True), (x, x.clone()), name="two"), "fc2/linear_1") == {"b": 32}


class _Positive(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        y = self.fc(x)
        return (y[y > 0] * 2).sum()


def test_export_refuses_a_size_that_depends_on_the_data_naming_the_node():
    """`y[y > 0]` has as many elements as y has positive values: torch.export records a symbolic size, and
    capture raised torch's GuardOnDataDependentSymNode from deep inside (a traceback, no GraphError). Now a
    GraphError names the node and the front end that can capture it (the fx capture, which counts 1 FLOP per
    element it takes: as many as y's positive values)."""
    x = torch.randn(4, 8)
    with pytest.raises(GraphError, match=r"^_Positive: the size of 'index' \(index\) depends on the values"):
        capture(_Positive(), (x,), name="positive")
    model = _Positive()
    [op] = by_kind(fx_capture.capture(model, (x,), name="positive"), "index")
    assert op.flops == int((model.fc(x) > 0).sum())


class _ScaledByData(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("scale", torch.ones(4))

    def forward(self, x):
        return x * self.scale.data


def test_export_names_data_in_forward_when_torch_cannot_export_it():
    """torch.export refuses `.data` in forward with "We found a fake tensor in the exported program constant's
    list ... Please file an issue on github", which names neither `.data` nor a way out; the error now does."""
    with pytest.raises(GraphError, match=r"cannot export _ScaledByData: We found a fake tensor.*cannot follow "
                                         r"`\.data` of a parameter or buffer in forward: use the tensor itself"):
        capture(_ScaledByData(), (torch.randn(2, 4),), name="scaled")
    g = fx_capture.capture(_ScaledByData(), (torch.randn(2, 4),), name="scaled")  # as the error suggests
    assert [op.kind for op in g.ops] == ["input", "mul"]
