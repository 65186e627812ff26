"""FLOP rules of the capture for ops the zoo does not use: norms, matrix-vector and tensor products."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from onnx import TensorProto, helper

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
