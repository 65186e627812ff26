"""FLOP rules of the capture for ops the zoo does not use (embedding bags: test_capture.py): norms, matrix
products, reductions and losses, interpolation, similarities; the warning that names the fallback."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from onnx import TensorProto, helper

import suite.capture
from suite.capture.fx import capture
from suite.capture.onnx_import import import_onnx


class Call(nn.Module):
    """Calls `fn` on its inputs (a fixed-arity forward, as torch.fx traces it)."""

    def __init__(self, fn, **modules) -> None:
        super().__init__()
        self.fn = fn
        for name, m in modules.items():
            setattr(self, name, m)

    def forward(self, a, b=None, c=None):
        args = (a, b, c)[: self.fn.__code__.co_argcount - 1]
        return self.fn(self, *args)


def only_op(model: nn.Module, *inputs):
    """The one forward op (not an input) of `model` captured on `inputs`, and the graph's metadata."""
    g = capture(model, inputs, name="m")
    (op,) = [op for op in g.ops if op.kind != "input"]
    return op, g.metadata


# -- norms -----------------------------------------------------------------------------------------------
X = torch.randn(2, 4, 3, 3)  # 72 elements


@pytest.mark.parametrize(("model", "kind", "flops"), [
    (nn.GroupNorm(2, 4), "group_norm", 5 * 72),
    (Call(lambda s, x: F.group_norm(x, 2)), "group_norm", 5 * 72),
    (nn.InstanceNorm2d(4), "instance_norm", 5 * 72),
    (nn.InstanceNorm2d(4, affine=True), "instance_norm", 5 * 72),
    (nn.InstanceNorm2d(4, track_running_stats=True).eval(), "instance_norm", 2 * 72),  # running statistics
    (Call(lambda s, x: F.instance_norm(x)), "instance_norm", 5 * 72),
    (nn.LayerNorm(3), "layer_norm", 5 * 72),
    (nn.RMSNorm(3), "rms_norm", 3 * 72),
    (Call(lambda s, x: F.rms_norm(x, (3,))), "rms_norm", 3 * 72),
])
def test_norms_that_compute_statistics_in_inference_count_them(model, kind, flops):
    """Group and instance norm compute mean and variance of the input in inference too: 5 FLOPs per element
    as layer norm, not batch norm's 2 of scale and shift (instance norm took the fallback, 1, as did RMS norm,
    which counts layer norm's 5 less the mean and its subtraction)."""
    op, meta = only_op(model, X)
    assert (op.kind, op.flops) == (kind, flops)
    assert "fallback_cost_kinds" not in meta


def test_instance_norm_with_running_statistics_computes_batch_statistics_in_training():
    model = Call(lambda s, x: s.norm(x).sum(), norm=nn.InstanceNorm2d(4, affine=True, track_running_stats=True))
    g = capture(model, (X,), name="m", mode="training")
    f = {op.name: op for op in g.ops}
    assert f["norm"].flops == f["norm/grad_weight"].flops == 5 * 72


def test_onnx_instance_and_group_normalization_count_their_statistics():
    """As the fx capture: 5 FLOPs per element in inference, not batch norm's 2."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 3, 3])
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 4, 3, 3]) for n in ("i", "g")]
    scale = helper.make_tensor("s", TensorProto.FLOAT, [4], [1.0] * 4)
    bias = helper.make_tensor("b", TensorProto.FLOAT, [4], [0.0] * 4)
    gscale = helper.make_tensor("gs", TensorProto.FLOAT, [2], [1.0] * 2)
    gbias = helper.make_tensor("gb", TensorProto.FLOAT, [2], [0.0] * 2)
    nodes = [helper.make_node("InstanceNormalization", ["x", "s", "b"], ["i"], name="inorm"),
             helper.make_node("GroupNormalization", ["x", "gs", "gb"], ["g"], name="gnorm", num_groups=2)]
    graph = helper.make_graph(nodes, "norms", [x], outs, [scale, bias, gscale, gbias])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    g = import_onnx(model, name="norms")
    f = {op.name: op for op in g.ops}
    assert f["inorm"].flops == f["gnorm"].flops == 5 * 72


# -- matrix-vector and tensor products -----------------------------------------------------------------------
A, B, V, W = torch.randn(3, 4), torch.randn(4, 5), torch.randn(4), torch.randn(3)


def flop_counter(fn, *inputs) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    mode = FlopCounterMode(display=False)
    with mode:
        fn(None, *inputs)
    return mode.get_total_flops()


@pytest.mark.parametrize(("fn", "inputs", "macs", "extra"), [
    (lambda s, a, v: torch.mv(a, v), (A, V), 3 * 4, 0),
    (lambda s, a, b: torch.dot(a, b), (V, V), 4, 0),
    (lambda s, a, b: torch.vdot(a, b), (V, V), 4, 0),
    (lambda s, a, b: torch.linalg.vecdot(a, b), (A, A), 3 * 4, 0),
    (lambda s, a, b: torch.linalg.vecdot(a, b, dim=0), (A, torch.randn(3, 1)), 3 * 4, 0),  # broadcast
    (lambda s, a, b: torch.outer(a, b), (W, V), 3 * 4, 0),
    (lambda s, a, b: torch.ger(a, b), (W, V), 3 * 4, 0),
    (lambda s, c, a, v: torch.addmv(c, a, v), (W, A, V), 3 * 4, 3),  # + the added input
    (lambda s, c, a, b: torch.addr(c, a, b), (A, W, V), 3 * 4, 3 * 4),
    (lambda s, a, b: torch.inner(a, b), (A, torch.randn(5, 4)), 3 * 5 * 4, 0),
    (lambda s, a, b: torch.tensordot(a, b, dims=([1], [0])), (A, B), 3 * 5 * 4, 0),
    (lambda s, a, b: torch.tensordot(a, b), (torch.randn(2, 3, 4), torch.randn(3, 4, 5)), 2 * 5 * 3 * 4, 0),
    (lambda s, a, b: torch.tensordot(a, b, 0), (W, V), 3 * 4, 0),
    (lambda s, a, b, c: torch.linalg.multi_dot([a, b, c]), (A, B, torch.randn(5, 2)), 4 * 5 * 2 + 3 * 4 * 2, 0),
    (lambda s, a, b, c: torch.linalg.multi_dot([a, b, c]), (W, A, B), 3 * 4 + 4 * 5, 0),  # row vector first
    (lambda s, a, b, c: torch.linalg.multi_dot([a, b, c]), (A, B, torch.randn(5)), 4 * 5 + 3 * 4, 0),
    (lambda s, a, b: torch.linalg.multi_dot([a, b]), (A, B), 3 * 4 * 5, 0),
])
def test_matrix_vector_and_tensor_products_count_their_multiply_adds(fn, inputs, macs, extra):
    """2 FLOPs per multiply-add (+ 1 per output element of an added input); they took the fallback, 1 FLOP
    per output element (mv: 3 for 12 multiply-adds). Where torch's FlopCounterMode counts them (those it
    computes with mm), the same count, 2 x MACs."""
    op, meta = only_op(Call(fn), *inputs)
    assert (op.kind, op.flops, meta["forward_macs"]) == ("matmul", 2 * macs + extra, macs)
    assert "fallback_cost_kinds" not in meta
    counted = flop_counter(fn, *inputs)
    assert counted in (0, 2 * macs)


def test_flop_counter_counts_the_products_it_computes_with_mm():
    assert flop_counter(lambda s, a, b: torch.inner(a, b), A, torch.randn(5, 4)) == 2 * 60
    assert flop_counter(lambda s, a, b: torch.tensordot(a, b, 1), A, B) == 2 * 60
    assert flop_counter(lambda s, a, b, c: torch.linalg.multi_dot([a, b, c]), A, B, torch.randn(5, 2)) == 2 * 64


def test_bilinear_counts_the_bilinear_form():
    """nn.Bilinear(4, 5, 3) on 2 samples: 2 x 3 outputs x 4 x 5 multiply-adds, + the bias (was the fallback:
    6 FLOPs)."""
    x1, x2 = torch.randn(2, 4), torch.randn(2, 5)
    for model in (nn.Bilinear(4, 5, 3), Call(lambda s, a, b: F.bilinear(a, b, s.w, s.b),
                                             w=nn.Parameter(torch.randn(3, 4, 5)), b=nn.Parameter(torch.randn(3)))):
        op, meta = only_op(model, x1, x2)
        assert (op.kind, op.flops, meta["forward_macs"]) == ("bilinear", 2 * 120 + 6, 120)


def test_a_matrix_vector_product_with_a_weight_has_its_backward_ops():
    model = Call(lambda s, x: torch.mv(s.w, x).sum(), w=nn.Parameter(torch.randn(3, 4)))
    g = capture(model, (V,), name="m", mode="training")
    f = {op.name: op for op in g.ops}
    assert f["mv"].flops == f["mv/grad_weight"].flops == 24
    assert f["mv/update"].param_bytes == 3 * 4 * 4


# -- the fallback ------------------------------------------------------------------------------------------
def test_ops_without_a_rule_are_named_in_one_warning_and_covered_ones_in_none():
    """The fallback's kinds were only in metadata, which a user rarely reads."""
    model = Call(lambda s, x: torch.logaddexp(torch.linalg.pinv(torch.linalg.pinv(x)), x))
    with pytest.warns(UserWarning) as record:
        g = capture(model, (A,), name="m")
    assert [str(w.message) for w in record] == [
        "m: no FLOP rule for linalg_pinv, logaddexp: counted as 1 FLOP per output element (listed in the graph's "
        "metadata 'fallback_cost_kinds')"]
    assert record[0].filename == __file__  # it points at the capture call
    assert g.metadata["fallback_cost_kinds"] == ["linalg_pinv", "logaddexp"]
    with warnings.catch_warnings():  # in-place forms of elementwise ops are covered too
        warnings.simplefilter("error")
        g = capture(Call(lambda s, x: s.fc(x).clamp_(0, 1).copy_(x[:, :2]), fc=nn.Linear(4, 2)), (A,), name="m")
    assert [op.kind for op in g.ops] == ["input", "linear", "clamp_", "copy_"]


def test_the_fallback_warning_points_at_the_capture_call_through_every_entry_point():
    """Through `suite.capture`'s wrappers it pointed at suite/capture/__init__.py."""
    hardmax = helper.make_node("Hardmax", ["x"], ["y"], name="hardmax")
    x, y = (helper.make_tensor_value_info(n, TensorProto.FLOAT, [3, 4]) for n in ("x", "y"))
    onnx_model = helper.make_model(helper.make_graph([hardmax], "c", [x], [y]))
    model = Call(lambda s, x: torch.logaddexp(x, x))
    calls = [(lambda: suite.capture.capture_module(model, (A,), name="m"), "logaddexp"),
             (lambda: suite.capture.capture_export(model, (A,), name="m"), "logaddexp"),
             (lambda: suite.capture.capture_onnx(onnx_model, name="m"), "hardmax")]
    for call, kind in calls:  # ops still without a rule
        with pytest.warns(UserWarning, match=f"no FLOP rule for {kind}") as record:
            call()
        assert [w.filename for w in record if "FLOP rule" in str(w.message)] == [__file__]


# -- reductions and losses ------------------------------------------------------------------------------------
T = torch.rand(3, 4)  # a target in [0, 1]


@pytest.mark.parametrize(("model", "inputs", "kind", "flops"), [
    (Call(lambda s, x: x.argmax(-1)), (A,), "argmax", 12),
    (Call(lambda s, x: torch.argmin(x)), (A,), "argmin", 12),
    (Call(lambda s, x: x.any()), (A,), "any", 12),
    (Call(lambda s, x: torch.var_mean(x, 1)[0]), (A,), "var_mean", 12),
    (Call(lambda s, x: torch.linalg.vector_norm(x, dim=-1)), (A,), "linalg_vector_norm", 12),
    (Call(lambda s, x, t: F.l1_loss(x, t)), (A, T), "l1_loss", 36),
    (nn.L1Loss(), (A, T), "l1_loss", 36),
    (nn.SmoothL1Loss(), (A, T), "smooth_l1_loss", 36),
    (nn.HuberLoss(), (A, T), "huber_loss", 36),
    (nn.BCELoss(), (T, T), "binary_cross_entropy", 36),
    (nn.BCEWithLogitsLoss(), (A, T), "binary_cross_entropy_with_logits", 36),
    (Call(lambda s, x, t: F.binary_cross_entropy_with_logits(x, t)), (A, T), "binary_cross_entropy_with_logits", 36),
    (nn.KLDivLoss(reduction="sum"), (A, T), "kl_div", 36),
    (nn.MSELoss(), (A, T), "mse_loss", 36),
])
def test_reductions_and_elementwise_losses_count_their_input_elements(model, inputs, kind, flops):
    """A reduction 1 FLOP per input element, an elementwise loss 3 (as MSE); they took the fallback of 1 per
    output element: 1 FLOP for a loss or argmax over 12 elements."""
    op, meta = only_op(model, *inputs)
    assert (op.kind, op.flops) == (kind, flops)
    assert "fallback_cost_kinds" not in meta


Y = torch.tensor([1.0, -1.0, 1.0])  # a target of +-1 per sample (row) of A
C = torch.tensor([0, 2, 3])  # a class per row of A
P = torch.randn(2, 8, 4)  # 2 x 4 patches of 8 = 2 channels x a 2 x 2 kernel, for a 3 x 3 output


def _assert_fx_and_export_count(model, inputs, kind, flops):
    """The fx capture makes one op of `kind` with `flops`, without the fallback's warning, and the torch.export
    capture counts the same forward FLOPs."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        op, meta = only_op(model, *inputs)
        exported = suite.capture.capture_export(model, inputs, name="m")
    assert (op.kind, op.flops) == (kind, flops)
    assert exported.metadata["forward_flops"] == flops


@pytest.mark.parametrize(("model", "inputs", "kind", "flops"), [
    (nn.SoftMarginLoss(), (A, T), "soft_margin_loss", 3 * 12),  # 3 per element, as MSE
    (Call(lambda s, x, t: F.soft_margin_loss(x, t)), (A, T), "soft_margin_loss", 3 * 12),
    (nn.HingeEmbeddingLoss(), (A, T), "hinge_embedding_loss", 3 * 12),
    (Call(lambda s, x, t: F.hinge_embedding_loss(x, t)), (A, T), "hinge_embedding_loss", 3 * 12),
    (nn.MarginRankingLoss(), (A[:, 0], T[:, 0], Y), "margin_ranking_loss", 3 * 3),
    (Call(lambda s, a, b, y: F.margin_ranking_loss(a, b, y)), (A[:, 0], T[:, 0], Y), "margin_ranking_loss", 3 * 3),
    (nn.PoissonNLLLoss(), (A, T), "poisson_nll_loss", 3 * 12),
    (nn.PoissonNLLLoss(log_input=False, full=True), (T, T), "poisson_nll_loss", 6 * 12),  # + 3: Stirling's term
    (Call(lambda s, x, t: F.poisson_nll_loss(x, t, full=True)), (A, T), "poisson_nll_loss", 6 * 12),
    # two distances of 3 per element, 3 per sample; swap: a third distance, and the smaller one per sample
    (nn.TripletMarginLoss(), (A, T, Y[:, None] * A), "triplet_margin_loss", 2 * 3 * 12 + 3 * 3),
    (Call(lambda s, a, p, n: F.triplet_margin_loss(a, p, n, swap=True)), (A, T, Y[:, None] * A),
     "triplet_margin_loss", 3 * 3 * 12 + 4 * 3),
    (nn.CosineEmbeddingLoss(), (A, T, Y), "cosine_embedding_loss", 6 * 12 + 3 * 3),  # cosine_similarity + 3
    (Call(lambda s, a, b, y: F.cosine_embedding_loss(a, b, y)), (A, T, Y), "cosine_embedding_loss", 6 * 12 + 3 * 3),
    (nn.MultiMarginLoss(), (A, C), "multi_margin_loss", 3 * 12 + 2 * 3),  # 3 per score, 2 per sample
    (nn.MultiMarginLoss(p=2, weight=torch.rand(4)), (A, C), "multi_margin_loss", 5 * 12 + 2 * 3),  # square, weight
    (Call(lambda s, x, c: F.multi_margin_loss(x, c, p=2, weight=s.w), w=nn.Buffer(torch.rand(4))), (A, C),
     "multi_margin_loss", 5 * 12 + 2 * 3),
    (nn.KLDivLoss(reduction="batchmean"), (A, T), "kl_div", 3 * 12 + 1),  # and the divide by the batch size
    (Call(lambda s, x, t: F.kl_div(x, t, reduction="batchmean")), (A, T), "kl_div", 3 * 12 + 1),
    (nn.Fold((3, 3), 2), (P,), "fold", 64),  # each of the 64 patch elements added into the output
    (Call(lambda s, x: F.fold(x, (3, 3), 2)), (P,), "fold", 64),
    (nn.Unfold(2), (X,), "unfold", 2 * (4 * 2 * 2) * (2 * 2)),  # export's im2col took the fallback
])
def test_margin_embedding_and_poisson_losses_and_fold_have_rules(model, inputs, kind, flops):
    """Module and function, counted by hand on small shapes (A: 3 samples of 4), as the torch.export capture
    counts them. They took the fallback of 1 per output element (1 FLOP for a loss, 36 for a fold to [2, 2, 3,
    3]) with its warning; KL divergence with "batchmean" counted 36, 1 below torch.export's kl_div and divide."""
    _assert_fx_and_export_count(model, inputs, kind, flops)


VAR = torch.rand(3, 4) + 0.1  # a variance per element of A
ML = torch.tensor([[3, 0, -1, 1], [0, 1, 2, -1], [1, -1, 0, 0]])  # target classes per row of A, ended by -1


@pytest.mark.parametrize(("model", "inputs", "kind", "flops"), [
    # 9 per score (two log-sigmoid terms, their products with y and 1 - y, sum, negation, the class sum), 2 per row
    (nn.MultiLabelSoftMarginLoss(), (A, T), "multilabel_soft_margin_loss", 9 * 12 + 2 * 3),
    (nn.MultiLabelSoftMarginLoss(weight=torch.rand(4)), (A, T), "multilabel_soft_margin_loss", 10 * 12 + 2 * 3),
    (Call(lambda s, x, t: F.multilabel_soft_margin_loss(x, t)), (A, T), "multilabel_soft_margin_loss", 9 * 12 + 2 * 3),
    # as multi-class margin with one target: 3 per score, 2 per row
    (nn.MultiLabelMarginLoss(), (A, ML), "multilabel_margin_loss", 3 * 12 + 2 * 3),
    (Call(lambda s, x, t: F.multilabel_margin_loss(x, t)), (A, ML), "multilabel_margin_loss", 3 * 12 + 2 * 3),
    # two distances of 3 per element; per row: add the margin, subtract, clamp, reduce (swap: a third, the min)
    (nn.TripletMarginWithDistanceLoss(), (A, T, VAR), "triplet_margin_with_distance_loss", 2 * 3 * 12 + 4 * 3),
    (nn.TripletMarginWithDistanceLoss(swap=True), (A, T, VAR), "triplet_margin_with_distance_loss", 3 * 3 * 12 + 5 * 3),
    (Call(lambda s, a, p, n: F.triplet_margin_with_distance_loss(a, p, n, swap=True)), (A, T, VAR),
     "triplet_margin_with_distance_loss", 3 * 3 * 12 + 5 * 3),
])
def test_multilabel_and_distance_losses_have_rules(model, inputs, kind, flops):
    """Module and function, counted by hand on A (3 rows of 4 scores), as the torch.export capture counts them
    (it decomposes the soft margin and the distance loss into ops with rules). They took the fallback: 1 FLOP."""
    _assert_fx_and_export_count(model, inputs, kind, flops)


@pytest.mark.parametrize(("model", "flops"), [
    (nn.GaussianNLLLoss(), 2 * 12 + 6 * 12),  # var: clamp, log; 5 per element, the reduction
    (nn.GaussianNLLLoss(full=True), 2 * 12 + 7 * 12),  # + the constant
    (nn.GaussianNLLLoss(reduction="none"), 2 * 12 + 5 * 12),
    (Call(lambda s, x, t, v: F.gaussian_nll_loss(x, t, v, True)), 2 * 12 + 7 * 12),
    (Call(lambda s, x, t, v: F.gaussian_nll_loss(x, t, v[:, :1])), 2 * 3 + 6 * 12),  # one variance per row
])
def test_gaussian_nll_loss_has_a_rule(model, flops):
    """torch.export cannot capture it (its check of var >= 0 depends on the data): counted by hand only."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        op, _ = only_op(model, A, T, VAR)
    assert (op.kind, op.flops) == ("gaussian_nll_loss", flops)


def test_a_user_distance_of_the_triplet_loss_is_counted_as_pairwise_distance():
    """The fx capture keeps F.triplet_margin_with_distance_loss as one op and does not trace its distance
    function: a user's distance counts as pairwise_distance (3 per element); torch.export traces the function's
    own ops, so it counts the distance as written (here 1 - cosine similarity: 6 per element + 1 per row)."""
    def cosine(a, b):
        return 1 - F.cosine_similarity(a, b)

    model = nn.TripletMarginWithDistanceLoss(distance_function=cosine)
    op, _ = only_op(model, A, T, VAR)
    assert (op.kind, op.flops) == ("triplet_margin_with_distance_loss", 2 * 3 * 12 + 4 * 3)
    exported = suite.capture.capture_export(model, (A, T, VAR), name="m")
    assert exported.metadata["forward_flops"] == 2 * (6 * 12 + 3) + 4 * 3


@pytest.mark.parametrize(("loss", "inputs", "per_element", "per_row"), [
    (nn.MSELoss, (A, T), 2, 0),
    (nn.BCEWithLogitsLoss, (A, T), 2, 0),
    (nn.PoissonNLLLoss, (A, T), 2, 0),
    (nn.KLDivLoss, (A, T), 2, 0),
    (nn.TripletMarginLoss, (A, T, VAR), 6, 2),
    (nn.CosineEmbeddingLoss, (A, T, Y), 6, 2),
    (nn.MultiMarginLoss, (A, C), 3, 1),
    (nn.MultiLabelSoftMarginLoss, (A, T), 9, 1),
    (nn.TripletMarginWithDistanceLoss, (A, T, VAR), 6, 3),
])
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_a_loss_without_reduction_counts_none(loss, inputs, per_element, per_row, reduction):
    """With reduction "none" nothing is added up: A's 12 elements or 3 rows count no reduction; "sum" and
    "mean" 1 per element (the elementwise losses) or per row (the others). Every loss counted it for "none"
    too (MSE: 36, not 24), as the fx and the torch.export capture agree."""
    model = loss(reduction=reduction)
    reduced = reduction != "none"
    flops = per_element * 12 + per_row * 3 + reduced * (3 if per_row else 12)
    op, _ = only_op(model, *inputs)
    exported = suite.capture.capture_export(model, inputs, name="m")
    assert op.flops == exported.metadata["forward_flops"] == flops


@pytest.mark.parametrize(("call", "flops"), [
    (lambda s, x, t: F.mse_loss(x, t, reduction="none"), 24),
    (lambda s, x, t: F.mse_loss(x, t, None, None, "none"), 24),  # by position, after size_average and reduce
    (lambda s, x, t: F.huber_loss(x, t, "none"), 24),
    (lambda s, x, t: F.mse_loss(x, t, reduce=False), 24),  # the deprecated form
    (lambda s, x, t: torch.ops.aten.mse_loss(x, t, 0), 24),  # ATen's Reduction enum: 0 none
    (lambda s, x, t: torch.ops.aten.mse_loss(x, t, 2), 36),
    (lambda s, x, t: F.kl_div(x, t, reduction="batchmean"), 37),
    (lambda s, x, t: F.kl_div(x, t, None, None, "batchmean"), 37),
    (lambda s, x, t: F.multilabel_soft_margin_loss(x, t, reduction="none"), 9 * 12 + 3),
])
def test_loss_functions_read_their_reduction_wherever_it_is_given(call, flops):
    op, _ = only_op(Call(call), A, T)
    assert op.flops == flops


# -- interpolation, local response norm, softmin, data movement -------------------------------------------------
@pytest.mark.parametrize(("model", "flops"), [
    (Call(lambda s, x: F.interpolate(x, scale_factor=2)), 288),  # nearest: 1 per output element
    (Call(lambda s, x: F.interpolate(x, scale_factor=2, mode="bilinear")), 7 * 288),
    (Call(lambda s, x: F.interpolate(x, size=(6, 6), mode="bicubic")), 31 * 288),
    (Call(lambda s, x: F.interpolate(x, size=(1, 1), mode="area")), 72),  # adaptive average pooling
    (nn.Upsample(scale_factor=2, mode="bilinear"), 7 * 288),
    (nn.UpsamplingNearest2d(scale_factor=2), 288),
    (nn.UpsamplingBilinear2d(scale_factor=2), 7 * 288),
])
def test_interpolation_counts_the_neighbours_it_weighs(model, flops):
    """2 n - 1 FLOPs per output element for n neighbours; it took the fallback of 1 (nn.Upsample bilinear,
    x2 of a [2, 4, 3, 3]: 288 FLOPs for 288 weighted sums of 4)."""
    op, meta = only_op(model, X)
    assert (op.kind, op.flops) == ("interpolate", flops)
    assert "fallback_cost_kinds" not in meta


def test_local_response_norm_softmin_and_data_movement_modules_have_rules():
    """LocalResponseNorm(size 3): 3 + 5 per element; Softmin and Softmax2d as softmax, 5; padding and pixel
    shuffles and nn.Unfold 1 per output element as the elementwise ops and F.unfold (they took the fallback, 1
    per output element, with its warning)."""
    assert only_op(nn.LocalResponseNorm(3), X)[0].flops == 8 * 72
    assert only_op(nn.Softmin(1), X)[0].flops == only_op(nn.Softmax2d(), X)[0].flops == 5 * 72
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert only_op(nn.ReflectionPad2d(1), X)[0].flops == 2 * 4 * 5 * 5
        assert only_op(nn.PixelShuffle(2), X)[0].flops == 72
        assert only_op(nn.Unfold(2), X)[0].flops == 2 * (4 * 2 * 2) * (2 * 2)  # [2, 16, 4] patches, as F.unfold
        assert only_op(nn.LogSigmoid(), X)[0].flops == 72
        assert capture(Call(lambda s, x: x.flip(0).roll(1, 1)), (X,), name="m").metadata["forward_flops"] == 2 * 72


@pytest.mark.parametrize(("model", "kind", "flops"), [
    (Call(lambda s, x: F.local_response_norm(x, 3)), "local_response_norm", 8 * 72),  # as the module
    (Call(lambda s, x: F.lp_pool2d(x, 2, 2)), "lp_pool2d", 2 * 4 * 1 * 1 * 4),  # output x kernel, as avg_pool2d
    (Call(lambda s, x: F.lp_pool1d(x.flatten(2), 2, 3)), "lp_pool1d", 2 * 4 * 3 * 3),
    (nn.LPPool2d(2, (3, 1)), "lp_pool2d", 2 * 4 * 1 * 3 * 3),
])
def test_functional_local_response_norm_and_power_average_pooling_have_rules(model, kind, flops):
    """F.local_response_norm counted 1 per element (the module size + 5); F.lp_pool and nn.LPPool (whose
    ONNX LpPool already counted output elements x kernel) took the fallback, 1 per output element."""
    op, meta = only_op(model, X)
    assert (op.kind, op.flops) == (kind, flops)
    assert "fallback_cost_kinds" not in meta


def test_elementwise_math_functions_are_not_reported_as_the_fallback():
    """1 FLOP per output element is their rule, not a fallback: no warning (they were all reported); softmin
    as softmax, 5 per element (it was 1)."""
    def fn(s, x):
        y = F.relu6(x) + F.logsigmoid(x) + F.hardshrink(x) + torch.log1p(x.abs()) + x.floor() + torch.atan2(x, x)
        return F.softmin(torch.fmod(y, 2) + x.tan() + torch.nan_to_num(x).clip(-1, 1), 1)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g = capture(Call(fn), (X,), name="m")
    f = {op.kind: op for op in g.ops}
    assert f["softmin"].flops == 5 * 72 and f["log_sigmoid"].flops == 72
    assert g.metadata["forward_flops"] == 5 * 72 + 72 * (len(g.ops) - 2)  # the other ops (not the input): 1 each


@pytest.mark.parametrize(("fn", "inputs", "kind", "flops"), [
    (lambda s, x: F.normalize(x), (X,), "normalize", 3 * 72),
    (lambda s, a, b: F.cosine_similarity(a, b), (A, A), "cosine_similarity", 6 * 12),
    (lambda s, a, b: F.cosine_similarity(a, b, dim=-1), (A, V), "cosine_similarity", 6 * 12),  # broadcast
    (lambda s, a, b: F.pairwise_distance(a, b), (A, A), "pairwise_distance", 3 * 12),
    (nn.CosineSimilarity(dim=-1), (A, V), "cosine_similarity", 6 * 12),  # the modules as their functions
    (nn.PairwiseDistance(), (A, A), "pairwise_distance", 3 * 12),
    (lambda s, x, g: F.grid_sample(x, g, align_corners=False), (X, torch.zeros(2, 5, 5, 2)), "grid_sample",
     7 * 2 * 4 * 5 * 5),  # bilinear: 4 neighbours per output element
    (lambda s, x, g: F.grid_sample(x, g, mode="nearest", align_corners=False), (X, torch.zeros(2, 5, 5, 2)),
     "grid_sample", 2 * 4 * 5 * 5),
    (lambda s, x, g: F.grid_sample(x, g, align_corners=False), (torch.randn(1, 2, 3, 3, 3), torch.zeros(1, 2, 2, 2, 3)),
     "grid_sample", 15 * 2 * 8),  # bilinear of a volume: trilinear, 8 neighbours
])
def test_normalize_similarities_and_grid_sample_count_their_inputs(fn, inputs, kind, flops):
    """They took the fallback of 1 FLOP per output element (cosine similarity of [3, 4] rows: 3 FLOPs), and
    the modules nn.CosineSimilarity and nn.PairwiseDistance still did (3 instead of 72 and 36)."""
    op, meta = only_op(fn if isinstance(fn, nn.Module) else Call(fn), *inputs)
    assert (op.kind, op.flops) == (kind, flops)
    assert "fallback_cost_kinds" not in meta


# -- scans, sorting, scatter-adds --------------------------------------------------------------------------
R = torch.randn(2, 8)  # rows of n = 8: n log2 n = 24 per row
IDX = torch.tensor([[0, 1, 1], [7, 0, 7]])  # 6 index elements


@pytest.mark.parametrize(("fn", "kind", "flops"), [
    (lambda s, x: x.cumsum(1), "cumsum", 16),
    (lambda s, x: torch.cummax(x, 0)[0], "cummax", 16),  # values and indices: 32 output elements
    (lambda s, x: torch.logcumsumexp(x, 1), "logcumsumexp", 16),
    (lambda s, x: x.sort()[0], "sort", 2 * 8 * 3),
    (lambda s, x: torch.sort(x, dim=0, descending=True)[0], "sort", 8 * 2 * 1),  # 8 rows of 2
    (lambda s, x: x.argsort(dim=1), "argsort", 2 * 8 * 3),
    (lambda s, x: torch.msort(x), "msort", 8 * 2 * 1),  # along dimension 0
    (lambda s, x: x.topk(4).values, "topk", 2 * (8 + 4 * 2)),  # a pass, then the 4 sorted
    (lambda s, x: x.topk(4, sorted=False).values, "topk", 2 * 8),
    (lambda s, x: x.topk(8).values, "topk", 2 * 8 * 3),  # all of them: a sort
    (lambda s, x: torch.topk(x, 1, dim=0).values, "topk", 8 * 2),
    (lambda s, x: x.kthvalue(3, 1)[0], "kthvalue", 2 * 8),
    (lambda s, x: x.scatter_add(1, IDX, x), "scatter_add", 6),  # one add per index element
    (lambda s, x: x.scatter_reduce(1, IDX, x, "amax"), "scatter_reduce", 6),
    (lambda s, x: x.scatter_reduce(1, IDX, x, "mean"), "scatter_reduce", 6 + 16),  # and a divide per output
    (lambda s, x: x.index_add(1, IDX[0], x[:, :3]), "index_add", 6),
    (lambda s, x: x.index_add(1, IDX[0], x[:, :3], alpha=2), "index_add", 2 * 6),  # and the multiply
    (lambda s, x: x.index_put((IDX[0],), x[0, :8], accumulate=True), "index_put", 8),
    (lambda s, x: x.index_put((IDX[0],), x[0, :8]), "index_put", 16),  # data movement
    (lambda s, x: x.index_copy(1, IDX[0, :2] + 2, x[:, :2]), "index_copy", 16),
    (lambda s, x: x.masked_scatter(IDX[0, :1] > 0, x), "masked_scatter", 16),
])
def test_scans_sorts_and_scatters_count_their_compares_and_adds(fn, kind, flops):
    """Scans 1 per element, sorts n log2 n per row, top k n + k log2 k, scatter-adds 1 per source element, the
    data movement ones 1 per output element (all took the fallback of 1 per output element and were reported:
    a sort of 2 rows of 8, 32 with its indices; a scatter_add of 6 elements, 16)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        op, meta = only_op(Call(fn), R.clone())
    assert (op.kind, op.flops) == (kind, flops)
    assert "fallback_cost_kinds" not in meta


def test_in_place_scans_and_scatters_have_the_rule():
    g = capture(Call(lambda s, x: x.clone().cumsum_(1).index_add_(1, IDX[0], x[:, :3]).scatter_add_(1, IDX, x)),
                (R,), name="m")
    f = {op.kind: op.flops for op in g.ops}
    assert (f["cumsum_"], f["index_add_"], f["scatter_add_"]) == (16, 6, 6) and "fallback_cost_kinds" not in g.metadata


def test_sort_indices_pass_no_gradient_and_topk_values_do():
    """In training, topk's values carry a gradient (a backward op scattering it: 1 FLOP per value); argsort's indices
    carry none: no backward op, the linear before it gets only its weight gradient from the other branch."""
    def fn(s, x):
        y = s.fc(x)
        return y.topk(4).values.sum() + y[0, y.argsort(dim=1)[0, 0]]

    g = capture(Call(fn, fc=nn.Linear(8, 8)), (R,), name="m", mode="training")
    names = {op.name for op in g.ops}
    topk, argsort = (next(op.name for op in g.ops if op.kind == k) for k in ("topk", "argsort"))
    assert g.ops[g.index[topk + "/grad"]].flops == 2 * 4
    assert argsort + "/grad" not in names


@pytest.mark.parametrize(("fn", "kind", "flops"), [
    (lambda y: y.sort(dim=1).values, "sort", 2 * 8),  # not 2 * 8 * 3, the forward's compares
    (lambda y: torch.msort(y), "msort", 2 * 8),
    (lambda y: y.topk(3).values, "topk", 2 * 3),  # one per value, not per index too
    (lambda y: y.kthvalue(2).values, "kthvalue", 2),
])
def test_the_backward_of_a_sort_scatters_the_values_gradient(fn, kind, flops):
    """Autograd's backward of sort / topk / kthvalue scatters the values' gradient to the places the indices
    name: 1 FLOP per value (it was charged the forward FLOPs, n log2 n for a sort); both front ends."""
    model = Call(lambda s, x: fn(s.fc(x)).sum(), fc=nn.Linear(8, 8))
    for cap in (capture, suite.capture.capture_export):
        g = cap(model, (R,), name="m", mode="training")
        op = next(op for op in g.ops if op.kind == kind)
        assert g.ops[g.index[op.name + "/grad"]].flops == flops


# -- views and stacking --------------------------------------------------------------------------------------
@pytest.mark.parametrize(("fn", "read"), [
    (lambda x: x.movedim(0, 1), 36),
    (lambda x: torch.moveaxis(x, 0, 1), 36),
    (lambda x: x.swapaxes(0, 1), 36),
    (lambda x: torch.swapdims(x, 1, 2), 36),
    (lambda x: x.adjoint(), 36),
    (lambda x: x.diagonal(dim1=1, dim2=2), 6),  # 2 x 3 of the 36 elements
    (lambda x: x.as_strided((2, 2), (1, 1)), 4),
    (lambda x: x[:, :1].broadcast_to((2, 3, 6)), 12),  # one row read
    (lambda x: x.ravel(), 36),
    (lambda x: torch.atleast_3d(x), 36),
    (lambda x: x.tensor_split(3, dim=2)[0], 12),
    (lambda x: torch.dsplit(x, 2)[1], 18),
    (lambda x: x.split_with_sizes([1, 2], 1)[1], 24),
])
def test_views_and_splits_are_folded(fn, read):
    """Views and splits are shape-only, folded as transpose and chunk are: the op after them reads the part it
    takes. They were ops of 1 FLOP per output element on the fallback (movedim: a copy of 36 elements)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g = capture(Call(lambda s, x: fn(s.fc(x)).relu(), fc=nn.Linear(4, 6)), (torch.randn(2, 3, 4),), name="m")
    assert [op.kind for op in g.ops] == ["input", "linear", "relu"]
    (edge,) = [e for e in g.edges if g.ops[e.dst].kind == "relu"]
    assert g.ops[edge.src].kind == "linear" and edge.bytes == 4 * read


def test_stacking_functions_are_concatenations():
    """dstack, row_stack and column_stack cost 0 FLOPs as cat, stack, hstack and vstack; they took the fallback."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g = capture(Call(lambda s, a: torch.dstack((a, a)) + torch.row_stack((a, a)).sum() + torch.column_stack((a, a))
                         .sum()), (A,), name="m")
    assert [op.flops for op in g.ops if op.kind == "concat"] == [0, 0, 0]
    assert g.metadata["forward_flops"] == 4 * 24  # two sums of 24 elements, two adds of [3, 4, 2]


@pytest.mark.parametrize(("fn", "inputs", "kind", "flops"), [
    (lambda s, a, b: torch.dist(a, b), (A, V), "dist", 3 * 12),  # [3, 4] - [4], broadcast
    (lambda s, a, b: torch.cdist(a, b), (A, torch.randn(5, 4)), "cdist", 3 * 3 * 5 * 4),  # 15 pairs of 4 features
    (lambda s, a, b: torch.cdist(a, b), (torch.randn(2, 3, 4), torch.randn(2, 5, 4)), "cdist", 3 * 2 * 3 * 5 * 4),
    (lambda s, a: a.trace(), (A,), "trace", 3),
    (lambda s, a: torch.linalg.norm(a), (A,), "linalg_norm", 12),
    (lambda s, a: torch.linalg.matrix_norm(a), (A,), "linalg_matrix_norm", 12),
])
def test_distances_trace_and_norms_count_their_inputs(fn, inputs, kind, flops):
    """They took the fallback of 1 FLOP per output element: torch.dist of two [3, 4] 1 FLOP, cdist 3 x 5 pairs
    of 4 features 15, a Frobenius norm 1."""
    op, meta = only_op(Call(fn), *inputs)
    assert (op.kind, op.flops) == (kind, flops)
    assert "fallback_cost_kinds" not in meta


def test_aliases_of_elementwise_functions_and_casts_are_not_reported_as_the_fallback():
    """torch.multiply, subtract, greater, ~mask, x.long() / .bool() (a mask, positions), fliplr, diff, kron are
    1 FLOP per output element by design, as mul, sub, gt, flip; they were reported as the fallback."""
    def fn(s, x):
        m = ~torch.greater(x, 0) ^ x.not_equal(1)
        y = torch.multiply(x, m.long()).subtract(x.bool().int()).fliplr().diff(dim=1)
        return torch.kron(y, torch.negative(y)).sum()

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g = capture(Call(fn), (A,), name="m")
    f = {op.kind: op.flops for op in g.ops}
    assert (f["greater"], f["invert"], f["xor"], f["long"], f["multiply"], f["fliplr"]) == (12, 12, 12, 12, 12, 12)
    assert (f["diff"], f["negative"], f["kron"], f["sum"]) == (9, 9, 81, 81)  # [3, 3] after diff; kron [9, 9]
