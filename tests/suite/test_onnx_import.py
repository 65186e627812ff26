"""ONNX import: agrees with the torch.fx capture on an exported model; hand-made graphs; errors."""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import pytest
import torch
import torch.nn as nn
from onnx import TensorProto, helper, numpy_helper

from suite.capture.fx import capture
from suite.capture.onnx_import import import_onnx
from suite.errors import GraphError


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(8 * 4 * 4, 16), nn.ReLU(), nn.Linear(16, 4))

    def forward(self, x):
        return self.classifier(self.features(x))


@pytest.fixture(scope="module")
def exported() -> tuple[nn.Module, onnx.ModelProto]:
    model = Net().eval()
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.randn(2, 3, 8, 8),), buf, dynamo=False, input_names=["x"],
                          dynamic_axes={"x": {0: "batch"}})
    return model, onnx.load_from_string(buf.getvalue())


def test_onnx_matches_fx_capture(exported):
    model, proto = exported
    g_onnx = import_onnx(proto, name="net", input_shapes={"x": [2, 3, 8, 8]})
    g_fx = capture(model, (torch.randn(2, 3, 8, 8),), name="net")
    assert [op.kind for op in g_onnx.ops] == ["input", "conv", "relu", "maxpool", "gemm", "relu", "gemm"]
    assert g_onnx.num_edges == g_fx.num_edges == 6
    for a, b in zip(g_onnx.ops, g_fx.ops, strict=True):
        assert (a.flops, a.output_bytes, a.param_bytes, a.bytes_read) == (b.flops, b.output_bytes, b.param_bytes, b.bytes_read)
    assert g_onnx.metadata["params"] == g_fx.metadata["params"] == sum(p.numel() for p in model.parameters())
    assert g_onnx.metadata["forward_macs"] == g_fx.metadata["forward_macs"]
    assert g_onnx.ops[1].scope == "features.0"


def test_onnx_from_file_and_training_mode(exported, tmp_path):
    _, proto = exported
    path = tmp_path / "net.onnx"
    onnx.save(proto, str(path))
    g = import_onnx(path, input_shapes={"x": [2, 3, 8, 8]}, mode="training")
    assert g.name == "main_graph"
    assert g.stats.ops_by_phase["update"] == 3  # conv, two gemms
    assert all(op.group for op in g.ops if op.phase != "forward")


def test_dynamic_dimension_needs_input_shapes(exported):
    _, proto = exported
    with pytest.raises(GraphError, match="input 'x' has unknown dimension"):
        import_onnx(proto)
    with pytest.raises(GraphError, match="'y', which is not a model input"):
        import_onnx(proto, input_shapes={"y": [1]})
    with pytest.raises(GraphError, match="rank 4"):
        import_onnx(proto, input_shapes={"x": [2, 3]})


def test_bad_files(tmp_path):
    with pytest.raises(GraphError, match="no such ONNX file"):
        import_onnx(tmp_path / "missing.onnx")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00garbage")
    with pytest.raises(GraphError, match="bad.onnx"):
        import_onnx(bad)


def _model(nodes, inputs, outputs, inits) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "hand", inputs, outputs, initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_hand_made_graph_flops_and_shared_initializer():
    w = numpy_helper.from_array(np.ones((4, 4), dtype=np.float32), "W")
    shape = numpy_helper.from_array(np.array([2, 8], dtype=np.int64), "shape")
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["a"], name="mm1"),
        helper.make_node("Relu", ["a"], ["b"], name="relu"),
        helper.make_node("MatMul", ["b", "W"], ["c"], name="mm2"),
        helper.make_node("Reshape", ["c", "shape"], ["d"], name="reshape"),
        helper.make_node("Softmax", ["d"], ["y"], name="softmax", axis=1),
    ]
    proto = _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
        [w, shape],
    )
    g = import_onnx(proto, name="hand")
    f = {op.name: op for op in g.ops}
    assert set(f) == {"x", "W/variable", "mm1", "relu", "mm2", "softmax"}  # Reshape folded
    assert f["mm1"].flops == 2 * 4 * 4 * 4 and f["relu"].flops == 16 and f["softmax"].flops == 5 * 16
    assert f["W/variable"].param_bytes == 64 and f["mm1"].param_bytes == 0
    assert g.metadata["params"] == 16  # the int64 shape initializer is a constant, not a parameter
    assert g.index["softmax"] in g.successors(g.index["mm2"])


def test_conv_and_gemm_rules_by_hand():
    wc = numpy_helper.from_array(np.zeros((6, 2, 3, 3), dtype=np.float32), "Wc")
    bc = numpy_helper.from_array(np.zeros(6, dtype=np.float32), "Bc")
    wg = numpy_helper.from_array(np.zeros((5, 6 * 4 * 4), dtype=np.float32), "Wg")
    nodes = [
        helper.make_node("Conv", ["x", "Wc", "Bc"], ["c"], name="conv", pads=[1, 1, 1, 1], group=2),
        helper.make_node("GlobalAveragePool", ["c"], ["p"], name="gap"),
        helper.make_node("Flatten", ["c"], ["f"], name="flat"),
        helper.make_node("Gemm", ["f", "Wg"], ["y"], name="fc", transB=1),
    ]
    proto = _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5]),
         helper.make_tensor_value_info("p", TensorProto.FLOAT, [1, 6, 1, 1])],
        [wc, bc, wg],
    )
    g = import_onnx(proto)
    f = {op.name: op for op in g.ops}
    out = 1 * 6 * 4 * 4
    assert f["conv"].flops == 2 * out * 2 * 9 + out
    assert f["gap"].flops == out
    assert f["fc"].flops == 2 * 5 * 96
    assert f["conv"].param_bytes == (6 * 2 * 9 + 6) * 4
