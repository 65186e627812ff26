"""ONNX import: agrees with the torch.fx capture on an exported model; hand-made graphs; errors."""

from __future__ import annotations

import io
import math
import warnings

import numpy as np
import onnx
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
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


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(2, 2, 3, padding=1), nn.Conv2d(2, 2, 3, padding=1)

    def forward(self, x):
        return torch.relu(self.conv2(self.conv1(x)) + x)


class _Nested(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer1, self.layer2 = nn.Sequential(_Block(), _Block()), nn.Sequential(_Block())

    def forward(self, x):
        return self.layer2(self.layer1(x))


def test_scopes_are_the_module_paths_as_in_the_fx_capture():
    """'/layer1/layer1.1/conv1/Conv' is in scope 'layer1.1.conv1'; it was 'conv1', the scope of every block's
    first convolution, so scope grouping put the three blocks' conv1 in one group."""
    x = torch.randn(1, 2, 4, 4)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(_Nested().eval(), (x,), buf, dynamo=False)
    g = import_onnx(onnx.load_from_string(buf.getvalue()))
    assert [(op.kind, op.scope) for op in g.ops if op.kind in ("conv", "add")] == [
        (kind, f"{block}{conv}") for block in ("layer1.0", "layer1.1", "layer2.0")
        for kind, conv in (("conv", ".conv1"), ("conv", ".conv2"), ("add", ""))]
    g_fx = capture(_Nested(), (x,), name="nested")
    assert [op.scope for op in g.ops] == [op.scope for op in g_fx.ops]


def test_onnx_from_file_and_training_mode(exported, tmp_path):
    _, proto = exported
    path = tmp_path / "net.onnx"
    onnx.save(proto, str(path))
    g = import_onnx(path, input_shapes={"x": [2, 3, 8, 8]}, mode="training")
    assert g.name == "main_graph"
    assert g.stats.ops_by_phase["update"] == 3  # conv, two gemms
    assert all(op.group for op in g.ops if op.phase != "forward")


def test_modules_exported_as_functions_are_inlined():
    """A module exported as a model-local function (export_modules_as_functions) was one op of the fallback
    cost ("linear", 1 FLOP per output element), its weights no weight input's: the Gemm inside is costed, in
    the module's scope, as in the plain export and the fx capture."""
    model, x = Net().eval(), torch.randn(2, 3, 8, 8)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), buf, dynamo=False, export_modules_as_functions={nn.Linear})
    proto = onnx.load_from_string(buf.getvalue())
    assert [f.name for f in proto.functions] == ["Linear"]
    g, g_fx = import_onnx(proto), capture(model, (x,), name="net")
    assert [(op.kind, op.scope) for op in g.ops] == [
        ("input", ""), ("conv", "features.0"), ("relu", "features.1"), ("maxpool", "features.2"),
        ("gemm", "classifier.1"), ("relu", "classifier.2"), ("gemm", "classifier.3")]
    assert [op.scope for op in g.ops] == [op.scope for op in g_fx.ops]
    for a, b in zip(g.ops, g_fx.ops, strict=True):
        assert (a.flops, a.param_bytes, a.bytes_read) == (b.flops, b.param_bytes, b.bytes_read)
    assert "fallback_cost_kinds" not in g.metadata


def test_weights_written_as_constant_nodes_are_frozen_parameters(exported):
    """Some exporters write weights as Constant nodes, not initializers: they were constants, so the model had
    no parameters and no weight bytes on any device. They are frozen parameters (a Constant is not trained)."""
    _, proto = exported
    nodes = [helper.make_node("Constant", [], [t.name], value=t) for t in proto.graph.initializer
             if t.name != "classifier.3.bias"]
    nodes.append(helper.make_node("Constant", [], ["classifier.3.bias"], value_floats=[0.5, 0.5, 0.5, 0.5]))
    graph = helper.make_graph([*nodes, *proto.graph.node], "consts", proto.graph.input, proto.graph.output)
    as_constants = helper.make_model(graph, opset_imports=proto.opset_import)
    g = import_onnx(as_constants, input_shapes={"x": [2, 3, 8, 8]})
    ref = import_onnx(proto, input_shapes={"x": [2, 3, 8, 8]})
    conv, fc1, fc2 = (8 * 3 * 3 * 3 + 8) * 4, (128 * 16 + 16) * 4, (16 * 4 + 4) * 4
    assert [op.param_bytes for op in g.ops] == [op.param_bytes for op in ref.ops] == [0, conv, 0, 0, fc1, 0, fc2]
    assert (g.metadata["params"], g.metadata["param_bytes"]) == (2356, 2356 * 4)
    with pytest.raises(GraphError, match="no trainable parameter"):
        import_onnx(as_constants, input_shapes={"x": [2, 3, 8, 8]}, mode="training")
    # through a Transpose (W written as W^T); a mask read by an Add and a recurrent cell's zero initial state,
    # Gemm's A (h0 @ V^T, as a custom LSTM cell exports), are no weights
    nodes = [helper.make_node("Constant", [], ["Wt"], value=_f32((3, 4), "Wt")),
             helper.make_node("Transpose", ["Wt"], ["W"]), helper.make_node("MatMul", ["x", "W"], ["a"], name="mm"),
             helper.make_node("Constant", [], ["mask"], value=_f32((2, 3), "mask")),
             helper.make_node("Add", ["a", "mask"], ["b"], name="add"),
             helper.make_node("Constant", [], ["h0"], value=_f32((2, 5), "h0")),
             helper.make_node("Constant", [], ["V"], value=_f32((3, 5), "V")),
             helper.make_node("Gemm", ["h0", "V"], ["h"], name="gemm", transB=1),
             helper.make_node("Add", ["b", "h"], ["y"], name="add2")]
    g = import_onnx(_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                           [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], []))
    assert [(op.name, op.param_bytes) for op in g.ops] == [("x", 0), ("mm", 12 * 4), ("add", 0), ("gemm", 15 * 4),
                                                           ("add2", 0)]


def test_dynamic_dimension_needs_input_shapes(exported):
    _, proto = exported
    with pytest.raises(GraphError, match="input 'x' has unknown dimension"):
        import_onnx(proto)
    with pytest.raises(GraphError, match="'y', which is not a model input"):
        import_onnx(proto, input_shapes={"y": [1]})
    with pytest.raises(GraphError, match="rank 4"):
        import_onnx(proto, input_shapes={"x": [2, 3]})
    for shape in (["2", 3, 8, 8], [-1, 3, 8, 8], [2.0, 3, 8, 8], [np.int64(0), 3, 8, 8], [True, 3, 8, 8]):
        with pytest.raises(GraphError, match=r"input_shapes\['x'\] = .* must be a list of positive integers"):
            import_onnx(proto, input_shapes={"x": shape})
    # numpy's integers are integers (a shape computed with numpy): they were refused as not integers
    assert import_onnx(proto, input_shapes={"x": np.array([5, 3, 8, 8])}).ops[0].output_shape == (5, 3, 8, 8)
    with pytest.raises(GraphError, match=r"has rank 4, input_shapes gives \[2, 3\]$"):
        import_onnx(proto, input_shapes={"x": np.array([2, 3])})


def test_input_shapes_changing_a_fixed_dimension_says_so_when_inference_fails(exported):
    """A model exported with a static batch (2) given another (4): its recorded output shape [2, 4] conflicts,
    and the error was ONNX's alone ('Inferred shape and existing shape differ'), naming no input."""
    model, _ = exported
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.randn(2, 3, 8, 8),), buf, dynamo=False, input_names=["x"])
    with pytest.raises(GraphError, match=r"differ.*; input_shapes changed dimension 0 of 'x' \(2 in the model, 4 "
                                         r"given\): the model's own shapes may be built on the size it was exported"):
        import_onnx(onnx.load_from_string(buf.getvalue()), input_shapes={"x": [4, 3, 8, 8]})
    assert import_onnx(onnx.load_from_string(buf.getvalue()), input_shapes={"x": [2, 3, 8, 8]}).ops[0].output_bytes == 1536


class _Positions(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("pos", torch.randn(5, 4))

    def forward(self, x):
        return torch.relu(x + self.pos)


def test_input_shapes_a_model_does_not_take_says_so_when_inference_fails():
    """A dynamic length that meets a table of the exported length (5) given 7: the error was ONNX's alone
    ('Incompatible dimensions'), not saying that input_shapes asked for a size the model does not take."""
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(_Positions(), (torch.randn(2, 5, 4),), buf, dynamo=False, input_names=["x"],
                          dynamic_axes={"x": {0: "batch", 1: "length"}})
    proto = onnx.load_from_string(buf.getvalue())
    with pytest.raises(GraphError, match=r"(?s)Incompatible dimensions.*; input_shapes sized 'x': the model may fix "
                                         r"sizes of its own \(a position table"):
        import_onnx(proto, input_shapes={"x": [2, 7, 4]})
    assert import_onnx(proto, input_shapes={"x": [3, 5, 4]}).ops[0].output_bytes == 3 * 5 * 4 * 4


class _Unrolled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.Linear(4, 4)

    def forward(self, x):
        h = x[:, 0]
        for t in range(1, x.shape[1]):  # unrolled by the exporter over the example's 3 steps
            h = torch.tanh(self.cell(h) + x[:, t])
        return h


def test_input_shapes_changing_a_fixed_dimension_warns_when_inference_agrees():
    """An RNN exported with 3 steps, fixed, given 5: shape inference agrees (the steps read x[:, 1] and x[:, 2]),
    and the import gave the MACs of 2 steps for 5 without a word."""
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(_Unrolled().eval(), (torch.randn(2, 3, 4),), buf, dynamo=False, input_names=["x"])
    proto = onnx.load_from_string(buf.getvalue())
    with pytest.warns(UserWarning, match=r"changes dimension 1 of 'x' \(3 in the model, 5 given\).*unrolled"):
        g = import_onnx(proto, input_shapes={"x": [2, 5, 4]})
    assert g.metadata["forward_macs"] == 2 * (2 * 4 * 4)  # the exported 2 steps, as the warning says
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        import_onnx(proto, input_shapes={"x": [2, 3, 4]})


def test_inputs_without_a_shape_or_not_tensors():
    """An input declared without a shape, or a sequence input, is an error naming it (both were a KeyError
    traceback); input_shapes gives a shapeless input its shape (it was refused: 'has rank 0')."""
    mm = helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")
    out = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    shapeless = _model([mm], [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)], out, [_f32((4, 3), "W")])
    with pytest.raises(GraphError, match=r"input 'x' has no shape \(its rank is unknown\); pass input_shapes"):
        import_onnx(shapeless)
    g = import_onnx(shapeless, input_shapes={"x": [2, 4]})
    f = {op.name: op for op in g.ops}
    assert f["x"].output_bytes == 2 * 4 * 4 and f["mm"].flops == 2 * 2 * 4 * 3 and f["mm"].output_bytes == 2 * 3 * 4
    seq = _model([helper.make_node("ConcatFromSequence", ["s"], ["c"], name="cat", axis=0),
                  helper.make_node("MatMul", ["c", "W"], ["y"], name="mm")],
                 [helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, [2, 4])], out, [_f32((4, 3), "W")])
    with pytest.raises(GraphError, match="input 's' is a sequence value, not a tensor"):
        import_onnx(seq)
    untyped = _model([mm], [onnx.ValueInfoProto(name="x")], out, [_f32((4, 3), "W")])
    with pytest.raises(GraphError, match="input 'x' is an untyped value, not a tensor"):
        import_onnx(untyped)


def test_control_flow_is_refused_naming_the_node():
    """If / Loop / Scan were imported as one op costed 1 FLOP per output element: the MatMul in the branch
    (and the edge from 'mm', whose output it reads from the outer scope) and the Loop body's weight W
    (0 parameters) were silently lost."""
    vi = helper.make_tensor_value_info
    then_g = helper.make_graph([helper.make_node("MatMul", ["a", "W"], ["t"])], "then", [], [vi("t", TensorProto.FLOAT, [2, 4])])
    else_g = helper.make_graph([helper.make_node("Relu", ["a"], ["e"])], "else", [], [vi("e", TensorProto.FLOAT, [2, 4])])
    branch = _model([helper.make_node("MatMul", ["x", "W"], ["a"], name="mm"),
                     helper.make_node("ReduceSum", ["x"], ["s"], name="sum", keepdims=0),
                     helper.make_node("Greater", ["s", "zero"], ["c"], name="gt"),
                     helper.make_node("If", ["c"], ["y"], name="if", then_branch=then_g, else_branch=else_g)],
                    [vi("x", TensorProto.FLOAT, [2, 4])], [vi("y", TensorProto.FLOAT, [2, 4])],
                    [_f32((4, 4), "W"), numpy_helper.from_array(np.array(0, np.float32), "zero")])
    with pytest.raises(GraphError, match=r"^ONNX model 'hand': node 'if' \(If\) has a subgraph \(attribute "
                                         r"'(then|else)_branch'\): control flow is not supported"):
        import_onnx(branch)
    body = helper.make_graph([helper.make_node("MatMul", ["h", "W"], ["h2"]), helper.make_node("Identity", ["c"], ["c2"])],
                             "body", [vi("i", TensorProto.INT64, []), vi("c", TensorProto.BOOL, []),
                                      vi("h", TensorProto.FLOAT, [2, 4])],
                             [vi("c2", TensorProto.BOOL, []), vi("h2", TensorProto.FLOAT, [2, 4])])
    loop = _model([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                   helper.make_node("Loop", ["n", "", "r"], ["y"], body=body)],
                  [vi("x", TensorProto.FLOAT, [2, 4])], [vi("y", TensorProto.FLOAT, [2, 4])],
                  [_f32((4, 4), "W"), numpy_helper.from_array(np.array(3, np.int64), "n")])
    with pytest.raises(GraphError, match=r"node 1 \(Loop\) has a subgraph \(attribute 'body'\)"):
        import_onnx(loop, mode="training")


class _ViewNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.fc = nn.Conv2d(3, 4, 3), nn.Linear(4 * 6 * 6, 5)

    def forward(self, x):
        y = self.conv(x)
        return self.fc(y.view(y.size(0), -1))


@pytest.mark.parametrize("opset", [13, 17])
def test_a_dynamic_batch_reshape_from_the_input_size_imports_with_input_shapes(opset):
    """x.view(x.size(0), -1) exported with a dynamic batch computes the Reshape's shape from Shape -> Gather ->
    Unsqueeze -> Concat; at opsets 13-16 ONNX's data propagation does not reach the Reshape, so input_shapes
    did not help: 'shape inference left the shape of /Reshape_output_0 unknown'."""
    x = torch.randn(2, 3, 8, 8)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(_ViewNet().eval(), (x,), buf, dynamo=False, opset_version=opset, input_names=["x"],
                          dynamic_axes={"x": {0: "batch"}})
    g = import_onnx(onnx.load_from_string(buf.getvalue()), input_shapes={"x": [2, 3, 8, 8]})
    assert [op.kind for op in g.ops] == ["input", "conv", "gemm"]
    f = {op.kind: op for op in g.ops}
    assert f["conv"].flops == 2 * (2 * 4 * 6 * 6) * 27 + 2 * 4 * 6 * 6 and f["conv"].output_bytes == 288 * 4
    assert f["gemm"].flops == 2 * 2 * 5 * 144 + 2 * 5 and edge_bytes(g, "/conv/Conv", "/fc/Gemm") == 288 * 4
    g_fx = capture(_ViewNet(), (x,), name="view")
    assert g.metadata["forward_flops"] == g_fx.metadata["forward_flops"] and g.metadata["params"] == g_fx.metadata["params"]


def test_sizes_computed_from_the_shape_of_a_weight_are_evaluated():
    """nn.MultiheadAttention slices its in_proj_weight at in_proj_weight.size(0) // 3 (Shape -> Gather -> Div ->
    Mul -> Slice); exported without constant folding (as for training) the Slice's output was 'left unknown':
    the shape of an initializer was not among those the import evaluates."""
    model, x = nn.MultiheadAttention(8, 2, batch_first=True).eval(), torch.randn(2, 3, 8)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x, x, x), buf, dynamo=False, opset_version=17, do_constant_folding=False)
    proto = onnx.load_from_string(buf.getvalue())
    assert any(n.op_type == "Shape" and n.input[0] == "in_proj_weight" for n in proto.graph.node)
    g = import_onnx(proto)
    g_fx = capture(model, (x, x, x), name="mha")
    assert g.metadata["params"] == g_fx.metadata["params"] == 3 * (64 + 8) + 64 + 8
    assert g.metadata["forward_macs"] == g_fx.metadata["forward_macs"] == 4 * 6 * 64 + 2 * 2 * 3 * 3 * 8


def test_split_sizes_computed_from_the_shape_are_evaluated():
    """The TorchScript exporter's aten::chunk computes a Split's sizes from the input's shape: Shape -> Gather ->
    Add -> Div -> Expand -> Concat (x.chunk(3, 1) of a [4, 7] tensor: [3, 3, 1]). ONNX's inference does not
    propagate through Expand, and the evaluation of shape data did not run it: 'shape inference left the shape
    of 'a' unknown', even with every input dimension known."""
    def const(name, value):
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(value, np.int64)))

    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"), helper.make_node("Shape", ["r"], ["shape"]),
             const("dim", [1]), const("chunks_1", [2]), const("chunks", [3]),
             helper.make_node("Gather", ["shape", "dim"], ["size"], axis=0),
             helper.make_node("Add", ["size", "chunks_1"], ["t"]), helper.make_node("Div", ["t", "chunks"], ["chunk"]),
             helper.make_node("Expand", ["chunk", "chunks_1"], ["first"]),
             helper.make_node("Mul", ["chunk", "chunks_1"], ["m"]), helper.make_node("Sub", ["size", "m"], ["last"]),
             helper.make_node("Concat", ["first", "last"], ["sizes"], axis=0),
             helper.make_node("Split", ["r", "sizes"], ["a", "b", "c"], axis=1),
             helper.make_node("Neg", ["a"], ["na"], name="neg_a"), helper.make_node("Neg", ["c"], ["nc"], name="neg_c")]
    proto = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 7])],
                   [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in ("na", "nc")], [])
    g = import_onnx(proto, input_shapes={"x": [4, 7]})
    f = {op.name: op for op in g.ops}
    assert [op.kind for op in g.ops] == ["input", "relu", "neg", "neg"]
    assert (f["neg_a"].flops, f["neg_a"].output_bytes, edge_bytes(g, "relu", "neg_a")) == (12, 48, 48)  # 4 x 3
    assert (f["neg_c"].flops, f["neg_c"].output_bytes, edge_bytes(g, "relu", "neg_c")) == (4, 16, 16)  # 4 x 1


def test_bad_files(tmp_path):
    with pytest.raises(GraphError, match="no such ONNX file"):
        import_onnx(tmp_path / "missing.onnx")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00garbage")
    with pytest.raises(GraphError, match="bad.onnx"):
        import_onnx(bad)
    (tmp_path / "dir.onnx").mkdir()  # the reason, as other files give it: no "[Errno 21] ... 'path'"
    with pytest.raises(GraphError, match=rf"^{tmp_path / 'dir.onnx'}: cannot read the ONNX file: Is a directory$"):
        import_onnx(tmp_path / "dir.onnx")
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")  # parses as an empty ModelProto
    with pytest.raises(GraphError, match="empty.onnx: not an ONNX model with a graph"):
        import_onnx(empty)
    for not_a_model in (None, 3, b"\x08\x07"):
        with pytest.raises(GraphError, match="import_onnx needs a path or an onnx.ModelProto"):
            import_onnx(not_a_model)


def test_a_sparse_initializer_is_refused_naming_it():
    """A weight stored as a sparse initializer failed in shape inference with "Input tensors of wrong rank (0)"
    of the MatMul reading it."""
    values = numpy_helper.from_array(np.array([1.0, 2.0], np.float32), "W")
    sparse = helper.make_sparse_tensor(values, numpy_helper.from_array(np.array([0, 5], np.int64), "W_idx"), [4, 4])
    proto = _model([helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], [])
    proto.graph.sparse_initializer.append(sparse)
    with pytest.raises(GraphError, match=r"^ONNX model 'hand': initializer 'W' is sparse \(graph.sparse_initializer\): "
                                         r"sparse initializers are not supported; store it dense$"):
        import_onnx(proto)


def test_external_data_weights_are_not_read(tmp_path, monkeypatch):
    """A model saved with external data (every model over 2 GB is) had all its weights read into memory, then
    shape inference serialized the model: beyond 2 GB that fails ('Failed to serialize proto'). Weights' sizes
    are in the model, so their data is not read; a small tensor a shape is computed from is, from the model's
    folder, and a missing one is an error that names it."""
    nodes = [helper.make_node("MatMul", ["x", "W"], ["y"], name="mm"),
             helper.make_node("Reshape", ["y", "shape"], ["z"], name="reshape"),
             helper.make_node("Relu", ["z"], ["r"], name="relu")]
    proto = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 40])],
                   [helper.make_tensor_value_info("r", TensorProto.FLOAT, None)],
                   [_f32((40, 30), "W"), numpy_helper.from_array(np.array([6, 10], np.int64), "shape")])
    folder = tmp_path / "model"
    folder.mkdir()
    onnx.save_model(proto, str(folder / "m.onnx"), save_as_external_data=True, all_tensors_to_one_file=False,
                    size_threshold=0)
    assert sorted(p.name for p in folder.iterdir()) == ["W", "m.onnx", "shape"]
    (folder / "W").unlink()  # the weights' data is not needed
    monkeypatch.chdir(tmp_path)  # the data is looked for next to the model, not in the working directory
    g = import_onnx(folder / "m.onnx")
    assert (g.metadata["params"], g.ops[g.index["mm"]].param_bytes) == (1200, 1200 * 4)
    assert g.ops[g.index["relu"]].output_shape == (6, 10)
    (folder / "shape").unlink()
    with pytest.raises(GraphError, match=r"m.onnx: cannot read the data of initializer 'shape' from 'shape'"):
        import_onnx(folder / "m.onnx")


def test_an_output_nothing_produces_is_an_error():
    """A graph output no node writes was a KeyError traceback."""
    proto = _model([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                   [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 4])], [])
    with pytest.raises(GraphError, match="^ONNX model 'hand': output 'z' of the model is not produced by any node"):
        import_onnx(proto)


def _training_export(model: nn.Module, x: torch.Tensor, opset: int) -> onnx.ModelProto:
    """`model(x)` exported as torch exports a training step's model (TrainingMode.TRAINING)."""
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), buf, dynamo=False, training=torch.onnx.TrainingMode.TRAINING,
                          opset_version=opset)
    return onnx.load_from_string(buf.getvalue())


def _model(nodes, inputs, outputs, inits) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "hand", inputs, outputs, initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_contrib_ops_and_sequences_are_refused_with_the_reason():
    """An onnxruntime contrib op (an optimized model's FusedMatMul) and a sequence failed with 'shape inference
    left the shape of ... unknown', no reason."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("FusedMatMul", ["r", "W"], ["y"], name="fmm", domain="com.microsoft")]
    graph = helper.make_graph(nodes, "ort", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [_f32((4, 4), "W")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    with pytest.raises(GraphError, match="node 'fmm' is FusedMatMul of domain 'com.microsoft', whose shapes ONNX's"):
        import_onnx(proto)
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),  # a sequence of the rows, concatenated back
             helper.make_node("SplitToSequence", ["r"], ["seq"], name="rows", keepdims=0),
             helper.make_node("ConcatFromSequence", ["seq"], ["y"], name="cat", axis=0)]
    proto = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [])
    with pytest.raises(GraphError, match=r"node 'rows' \(SplitToSequence\) makes 'seq', a sequence value, not a tensor"):
        import_onnx(proto)


class _TensorSplit(nn.Module):
    def forward(self, x):
        return [t.relu() for t in x.tensor_split(3, dim=1)]


@pytest.mark.parametrize("opset", [13, 17])
def test_a_split_to_sequence_read_at_known_positions_is_a_split(opset):
    """x.tensor_split(3, dim=1) exports as SplitToSequence (sizes computed from x's shape) -> SequenceAt: a
    sequence, which the import refused. Read only at known positions, it is a Split: 7 columns as 3, 2, 2."""
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(_TensorSplit().eval(), (torch.randn(2, 7),), buf, dynamo=False, opset_version=opset,
                          input_names=["x"], dynamic_axes={"x": {0: "batch"}})
    proto = onnx.load_from_string(buf.getvalue())
    assert {"SplitToSequence", "SequenceAt"} <= {n.op_type for n in proto.graph.node}
    g = import_onnx(proto, input_shapes={"x": [4, 7]})
    assert [(op.kind, op.output_bytes) for op in g.ops] == [("input", 4 * 7 * 4), ("relu", 4 * 3 * 4),
                                                            ("relu", 4 * 2 * 4), ("relu", 4 * 2 * 4)]
    assert [e.bytes for e in g.edges] == [4 * 3 * 4, 4 * 2 * 4, 4 * 2 * 4]


def test_a_split_to_sequence_of_one_size_at_opset_11():
    """One size (3) splits 7 columns as 3, 3, 1; at opset 11 a Split takes its sizes as an attribute; position -1
    is the last piece."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("SplitToSequence", ["r", "three"], ["seq"], name="split", axis=1),
             helper.make_node("SequenceAt", ["seq", "last"], ["p"]), helper.make_node("Neg", ["p"], ["y"], name="neg")]
    graph = helper.make_graph(nodes, "seq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 7])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.array(3, np.int64), "three"),
                               numpy_helper.from_array(np.array(-1, np.int64), "last")])
    g = import_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)]))
    assert g.ops[g.index["neg"]].output_bytes == edge_bytes(g, "relu", "neg") == 2 * 1 * 4


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


def edge_bytes(g, src: str, dst: str) -> int:
    s, d = g.index[src], g.index[dst]
    (e,) = [e for e in g.edges if e.src == s and e.dst == d]
    return e.bytes


def _f32(shape, name: str):
    return numpy_helper.from_array(np.zeros(shape, dtype=np.float32), name)


def _two_heads() -> onnx.ModelProto:
    """Two independent branches: gemm -> y and deconv -> z, each with weights."""
    nodes = [helper.make_node("Gemm", ["a", "B", "C"], ["y"], name="gemm", transA=1),
             helper.make_node("ConvTranspose", ["x", "Wt"], ["z"], name="deconv")]
    return _model(
        nodes,
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [6, 2]),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 4, 5, 5])],
        [_f32((6, 5), "B"), _f32((5,), "C"), _f32((2, 4, 3, 3), "Wt")],
    )


def test_gemm_trans_a_and_conv_transpose_rules_by_hand():
    proto = _two_heads()
    f = {op.name: op for op in import_onnx(proto).ops}
    # A^T [2, 6] x B [6, 5]: the inner dimension is A's first (6), not its second (2): 2*5*6 = 60 MACs, + bias 10
    assert f["gemm"].flops == 2 * 60 + 10
    # each input element scatters into C_out/group x kernel outputs: 18 inputs * (4*3*3) = 648 MACs (no bias)
    assert f["deconv"].flops == 2 * 648
    assert f["deconv"].output_bytes == 1 * 4 * 5 * 5 * 4 and f["deconv"].param_bytes == 2 * 4 * 9 * 4


@pytest.mark.parametrize(("inputs", "flops"), [(["x", "W", "off", "B"], 2466), (["x", "W", "off", "", "mask"], 2592)],
                         ids=["bias", "mask"])
def test_deform_conv_costs_its_convolution_and_its_sampling(inputs, flops):
    """DeformConv (opset 19) had no rule: 1 FLOP per output element (36), though its weights are parameters.
    X [1, 2, 5, 5], W [4, 2, 3, 3]: output [1, 4, 3, 3], 36 x 2 x 9 = 648 MACs; 1 x 2 x 9 x 9 = 162 input
    values sampled, 7 FLOPs each (bilinear, as GridSample), 8 with a mask. 2 x 648 + 36 (bias) + 7 x 162 = 2466;
    2 x 648 + 8 x 162 = 2592."""
    f32 = TensorProto.FLOAT
    node = helper.make_node("DeformConv", inputs, ["y"], name="dcn", kernel_shape=[3, 3])
    shapes = {"x": [1, 2, 5, 5], "off": [1, 18, 3, 3], "mask": [1, 9, 3, 3]}
    graph = helper.make_graph([node], "dcn", [helper.make_tensor_value_info(n, f32, shapes[n]) for n in inputs
                                             if n in shapes], [helper.make_tensor_value_info("y", f32, None)],
                              [_f32((4, 2, 3, 3), "W"), _f32((4,), "B")][:1 + ("B" in inputs)])
    g = import_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)]))
    dcn = g.ops[g.index["dcn"]]
    assert (dcn.kind, dcn.flops, g.metadata["forward_macs"]) == ("deformconv", flops, 648)
    assert "fallback_cost_kinds" not in g.metadata


@pytest.mark.parametrize("layout", ["4d", "3d", "past"])
def test_attention_op_costs_as_scaled_dot_product_attention(layout):
    """ONNX's Attention (opset 23) had no rule: 1 FLOP per output element (240), not its products and softmax.
    4 query heads of 5 rows, 2 key-value heads (grouped) of 7 keys, 8 query-key and 6 value features:
    MACs 2 x 4 x 5 x 7 x (8 + 6) = 3920; FLOPs 2 x 3920 + 5 per score (2 x 4 x 5 x 7 = 280) = 9240."""
    f32 = TensorProto.FLOAT
    if layout == "3d":
        shapes, attrs = {"q": [2, 5, 32], "k": [2, 7, 16], "v": [2, 7, 12]}, {"q_num_heads": 4, "kv_num_heads": 2}
    else:
        shapes, attrs = {"q": [2, 4, 5, 8], "k": [2, 2, 7, 8], "v": [2, 2, 7, 6]}, {}
    inputs = ["q", "k", "v"]
    if layout == "past":  # 3 cached keys and 4 new ones: 7 keys
        shapes.update(k=[2, 2, 4, 8], v=[2, 2, 4, 6], pk=[2, 2, 3, 8], pv=[2, 2, 3, 6])
        inputs += ["", "pk", "pv"]
    nodes = [helper.make_node("Relu", [n], [f"{n}r"], name=f"relu_{n}") for n in shapes]
    nodes.append(helper.make_node("Attention", [f"{n}r" if n else "" for n in inputs], ["y"], name="attn", **attrs))
    graph = helper.make_graph(nodes, "attn", [helper.make_tensor_value_info(n, f32, s) for n, s in shapes.items()],
                              [helper.make_tensor_value_info("y", f32, None)])
    g = import_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)]))
    attn = g.ops[g.index["attn"]]
    assert (attn.kind, attn.flops, g.metadata["forward_macs"]) == ("attention", 9240, 3920)
    assert attn.output_bytes == 2 * 5 * 4 * 6 * 4 and "fallback_cost_kinds" not in g.metadata


def test_training_loss_is_the_named_output_or_every_output():
    """`loss` names the output a training step differentiates: the branch to the other output gets no
    backward or update ops. Without it, every output is part of the loss (as before)."""
    both = import_onnx(_two_heads(), mode="training")
    assert sorted(op.name for op in both.ops if op.phase == "update") == ["deconv/update", "gemm/update"]
    assert both.metadata["loss_outputs"] == ["y", "z"]
    only_y = import_onnx(_two_heads(), mode="training", loss="y")
    assert [op.name for op in only_y.ops if op.phase != "forward"] == ["gemm/grad_weight", "gemm/update"]
    assert only_y.metadata["loss_outputs"] == ["y"]
    assert [op.name for op in only_y.ops if op.phase == "forward"] == [op.name for op in both.ops
                                                                      if op.phase == "forward"]
    assert "loss_outputs" not in import_onnx(_two_heads()).metadata
    with pytest.raises(GraphError, match="loss='logits' is not an output of the model; its outputs: y, z"):
        import_onnx(_two_heads(), mode="training", loss="logits")
    with pytest.raises(GraphError, match="loss='y' names the output a training step differentiates; mode is "
                                         "'inference'"):
        import_onnx(_two_heads(), loss="y")


def _norm_model() -> onnx.ModelProto:
    """x [2,4] -> MatMul W[4,3] -> Dropout -> LayerNormalization -> Mul by a float scalar -> Reshape [2,3,1,1]
    -> BatchNormalization -> ReduceSum (the loss)."""
    nodes = [helper.make_node("MatMul", ["x", "W"], ["a"], name="mm"),
             helper.make_node("Dropout", ["a"], ["d"], name="drop"),
             helper.make_node("LayerNormalization", ["d", "g", "b"], ["l"], name="ln", axis=-1),
             helper.make_node("Mul", ["l", "s"], ["m"], name="mul"),
             helper.make_node("Reshape", ["m", "shape"], ["m4"], name="rs"),
             helper.make_node("BatchNormalization", ["m4", "bs", "bb", "bm", "bv"], ["n"], name="bn"),
             helper.make_node("ReduceSum", ["n"], ["y"], name="sum", keepdims=0)]
    inits = [_f32((4, 3), "W"), _f32((3,), "g"), _f32((3,), "b"),
             numpy_helper.from_array(np.array(2.0, dtype=np.float32), "s"),
             numpy_helper.from_array(np.array([2, 3, 1, 1], dtype=np.int64), "shape"),
             _f32((3,), "bs"), _f32((3,), "bb"), _f32((3,), "bm"), _f32((3,), "bv")]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])], inits)


def test_norms_reductions_dropout_and_scalar_initializers_by_hand():
    infer = import_onnx(_norm_model())
    train = import_onnx(_norm_model(), mode="training")
    fi, ft = {op.name: op for op in infer.ops}, {op.name: op for op in train.ops}
    # 6 elements everywhere after the MatMul
    assert fi["ln"].flops == ft["ln"].flops == 5 * 6
    assert fi["bn"].flops == 2 * 6 and ft["bn"].flops == 4 * 6  # inference vs training batch norm
    assert fi["sum"].flops == 6 and not infer.metadata.get("fallback_cost_kinds")  # 1 per input element
    # the float scalar is a constant: the Mul owns no parameter
    assert fi["mul"].param_bytes == 0 and fi["ln"].param_bytes == 2 * 3 * 4
    # dropout: folded in inference; in training an op that keeps its mask (1 B per element) for backward
    assert "drop" not in fi and fi["ln"].bytes_read == 24 + 24
    assert ft["drop"].flops == 6 and ft["drop"].output_bytes == 6 * 4 + 6
    assert edge_bytes(train, "drop", "drop/grad") == 30


def test_rms_normalization_costs_as_rms_norm_and_its_scale_is_a_parameter():
    """Opset 23's RMSNormalization was the fallback (1 FLOP per element, warned); its scale is a weight input."""
    nodes = [helper.make_node("RMSNormalization", ["x", "w"], ["y"], name="rms")]
    graph = helper.make_graph(nodes, "rms", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4])], [_f32((4,), "w")])
    g = import_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)]))
    assert (g.ops[g.index["rms"]].flops, g.metadata["params"]) == (3 * 24, 4)
    assert "fallback_cost_kinds" not in g.metadata


@pytest.mark.parametrize("opset", [9, 17])
def test_dropout_with_its_mask_as_an_output_costs_as_in_the_fx_capture(opset):
    """torch exports a training-mode Dropout with its mask as a second output: it was costed 1 FLOP per element
    of both outputs (2 per element) and kept the mask twice (output and saved bytes): 7 B per element, not 5.
    Before opset 10 ONNX infers no shape for the mask, which nothing reads: it failed ('left unknown'); such an
    output is as omitted, the mask kept as saved bytes."""
    model = nn.Sequential(nn.Linear(4, 6), nn.Dropout(0.5), nn.Linear(6, 2)).train()
    x = torch.randn(3, 4)
    proto = _training_export(model, x, opset)
    (node,) = [n for n in proto.graph.node if n.op_type == "Dropout"]
    assert len(node.output) == 2  # the mask
    (drop,) = [op for op in import_onnx(proto, mode="training").ops if op.kind == "dropout"]
    assert (drop.flops, drop.output_bytes) == (18, 18 * 4 + 18)  # [3, 6] float32 values and bool mask
    wrapped = nn.Sequential(model, _Sum()).train()  # fx's training mode needs the scalar loss
    (fx_drop,) = [op for op in capture(wrapped, (x,), name="m", mode="training").ops if op.kind == "dropout"]
    assert (drop.flops, drop.output_bytes) == (fx_drop.flops, fx_drop.output_bytes)


class _Sum(nn.Module):
    def forward(self, x):
        return x.sum()


def test_split_and_multi_output_nodes_edges_carry_the_bytes_read_and_dtype_sizes():
    nodes = [helper.make_node("MatMul", ["x", "W"], ["a"], name="mm"),
             helper.make_node("Split", ["a"], ["s1", "s2"], name="split", axis=1),
             helper.make_node("Relu", ["s1"], ["r"], name="relu"),
             helper.make_node("TopK", ["s2", "k"], ["v", "i"], name="topk"),
             helper.make_node("Tanh", ["v"], ["t"], name="tanh")]
    proto = _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [2, 4])],
        [helper.make_tensor_value_info("r", TensorProto.DOUBLE, [2, 2]),
         helper.make_tensor_value_info("t", TensorProto.DOUBLE, [2, 1])],
        [numpy_helper.from_array(np.zeros((4, 4)), "W"), numpy_helper.from_array(np.array([1], dtype=np.int64), "k")],
    )
    g = import_onnx(proto)
    f = {op.name: op for op in g.ops}
    assert f["x"].output_bytes == 2 * 4 * 8 and f["mm"].param_bytes == 16 * 8  # float64: 8 B per element
    assert "split" not in f  # shape-only: folded
    assert edge_bytes(g, "mm", "relu") == edge_bytes(g, "mm", "topk") == 2 * 2 * 8  # each half, not all 64 B
    # TopK writes values (2x1 float64) and indices (2x1 int64); Tanh reads only the values
    assert f["topk"].output_bytes == 16 + 16 and edge_bytes(g, "topk", "tanh") == 16


def test_an_omitted_optional_output_is_not_read_by_an_omitted_optional_input():
    """LayerNormalization's omitted Mean and InvStdDev outputs ("") made "" its output: the Clip of another
    branch, whose omitted min is "" too, got an edge from it (32 bytes that nothing sends)."""
    vi = helper.make_tensor_value_info
    nodes = [helper.make_node("MatMul", ["x", "W"], ["a"], name="mm"),
             helper.make_node("LayerNormalization", ["a", "g"], ["ln", "", ""], name="ln", axis=-1),
             helper.make_node("Relu", ["x2"], ["r"], name="relu"),
             helper.make_node("Clip", ["r", "", "max"], ["c"], name="clip")]
    proto = _model(nodes, [vi("x", TensorProto.FLOAT, [2, 4]), vi("x2", TensorProto.FLOAT, [2, 4])],
                   [vi("ln", TensorProto.FLOAT, [2, 4]), vi("c", TensorProto.FLOAT, [2, 4])],
                   [_f32((4, 4), "W"), _f32((4,), "g"), numpy_helper.from_array(np.array(6, np.float32), "max")])
    g = import_onnx(proto)
    assert sorted((g.ops[e.src].name, g.ops[e.dst].name, e.bytes) for e in g.edges) == [
        ("mm", "ln", 32), ("relu", "clip", 32), ("x", "mm", 32), ("x2", "relu", 32)]
    assert g.ops[g.index["clip"]].bytes_read == 32


@pytest.mark.parametrize("dtype", [TensorProto.BFLOAT16, TensorProto.FLOAT16, TensorProto.FLOAT])
def test_bfloat16_initializers_are_parameters(dtype):
    """A bfloat16 weight is a parameter and its MatMul's output carries a gradient, as float16 and float32:
    numpy knows bfloat16 only as an ml_dtypes type of kind "V", so it was taken for a non-float, its weight
    for a constant (0 parameters, 0 param bytes, its bytes not read) and training found nothing to train."""
    w = helper.make_tensor("W", dtype, [4, 3], np.zeros(12, dtype=np.uint16).tolist() if dtype == TensorProto.BFLOAT16
                           else np.zeros(12).tolist())
    proto = _model([helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")],
                   [helper.make_tensor_value_info("x", dtype, [2, 4])],
                   [helper.make_tensor_value_info("y", dtype, [2, 3])], [w])
    size = 4 if dtype == TensorProto.FLOAT else 2
    g = import_onnx(proto)
    f = {op.name: op for op in g.ops}
    assert g.metadata["params"] == 12 and f["mm"].param_bytes == 12 * size
    assert f["mm"].bytes_read == (8 + 12) * size and f["mm"].output_bytes == 6 * size
    assert import_onnx(proto, mode="training").stats.ops_by_phase["update"] == 1


def test_gather_and_slice_read_the_part_they_take():
    """Taking one time step of a [2, 5, 8] activation (Gather on axis 1 with a scalar index, or Slice) reads that
    step's 64 bytes, as the torch.fx capture's folded x[:, -1]; the whole 320-byte tensor was read (and sent,
    when placed apart). Both are folded (a select is a view, a Slice as a Split): the reader reads the part.
    The Gather was an op of 0 FLOPs."""
    nodes = [helper.make_node("MatMul", ["x", "W"], ["a"], name="mm"),
             helper.make_node("Gather", ["a", "t"], ["g"], name="gather", axis=1),
             helper.make_node("Slice", ["a", "starts", "ends", "axes"], ["s"], name="slice"),
             helper.make_node("Relu", ["g"], ["r"], name="relu"),
             helper.make_node("Relu", ["s"], ["q"], name="relu2")]
    inits = [numpy_helper.from_array(np.zeros((8, 8), dtype=np.float32), "W"),
             numpy_helper.from_array(np.array(4, dtype=np.int64), "t")]
    inits += [numpy_helper.from_array(np.array([v], dtype=np.int64), n) for n, v in (("starts", 0), ("ends", 1), ("axes", 1))]
    proto = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, 8])],
                   [helper.make_tensor_value_info("r", TensorProto.FLOAT, [2, 8]),
                    helper.make_tensor_value_info("q", TensorProto.FLOAT, [2, 1, 8])], inits)
    g = import_onnx(proto)
    f = {op.name: op for op in g.ops}
    assert edge_bytes(g, "mm", "relu") == edge_bytes(g, "mm", "relu2") == 2 * 8 * 4
    assert f["relu"].bytes_read == f["relu2"].bytes_read == 64 and f["mm"].output_bytes == 320
    assert "slice" not in f and "gather" not in f


def test_gather_with_an_index_tensor_is_index_select_and_an_embedding_lookup_is_free():
    """Gather of an activation with an index tensor is x.index_select(1, idx): 1 FLOP per output element (data
    movement), as in the fx capture (it was 0), reading the part it takes; a lookup in a weight table (an
    embedding) stays 0 FLOPs and reads the rows it takes."""
    nodes = [helper.make_node("MatMul", ["x", "W"], ["a"], name="mm"),
             helper.make_node("Gather", ["a", "idx"], ["g"], name="select", axis=1),
             helper.make_node("Gather", ["E", "ids"], ["e"], name="embed", axis=0)]
    inits = [numpy_helper.from_array(np.zeros((8, 8), dtype=np.float32), "W"),
             numpy_helper.from_array(np.array([0, 3], dtype=np.int64), "idx"),
             numpy_helper.from_array(np.zeros((10, 4), dtype=np.float32), "E")]
    proto = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, 8]),
                           helper.make_tensor_value_info("ids", TensorProto.INT64, [3])],
                   [helper.make_tensor_value_info("g", TensorProto.FLOAT, [2, 2, 8]),
                    helper.make_tensor_value_info("e", TensorProto.FLOAT, [3, 4])], inits)
    f = {op.name: op for op in import_onnx(proto).ops}
    assert (f["select"].kind, f["select"].flops, f["select"].bytes_read) == ("gather", 2 * 2 * 8, 2 * 2 * 8 * 4)
    assert (f["embed"].kind, f["embed"].flops, f["embed"].param_bytes) == ("gather", 0, 10 * 4 * 4)
    assert f["embed"].bytes_read == 3 * 8 + 3 * 4 * 4  # the ids and the 3 rows


def test_a_slice_of_a_weight_reads_only_its_part():
    """A MatMul of x [2, 4] with a Slice of a [10, 4] weight (rows 3:7) reads x (32 bytes) and those 4 rows
    (64), not the whole weight (160, resident), as a Gather of it reads its rows and the torch.fx capture's
    `x @ self.e[3:7]`. Before, it read 192 bytes."""
    nodes = [helper.make_node("Slice", ["E", "starts", "ends"], ["s"], name="slice"),
             helper.make_node("MatMul", ["x", "s"], ["y"], name="mm")]
    inits = [numpy_helper.from_array(np.ones((10, 4), dtype=np.float32), "E"),
             numpy_helper.from_array(np.array([3], dtype=np.int64), "starts"),
             numpy_helper.from_array(np.array([7], dtype=np.int64), "ends")]
    proto = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], inits)
    [mm] = [op for op in import_onnx(proto).ops if op.kind == "matmul"]
    assert (mm.bytes_read, mm.param_bytes) == (2 * 4 * 4 + 4 * 4 * 4, 10 * 4 * 4)


def test_a_weight_sliced_gathered_and_scaled_counts_its_parameters_once_and_the_scaling_per_step():
    """E [10, 4] read by a Gather of rows 1:5, and by a Slice of rows 3:7 scaled by 2 (a constant subexpression
    of weights): its 40 parameters are counted once, on a variable op both read; the Slice is folded, the Gather
    a lookup of 0 FLOPs, and the Mul 16 FLOPs a step, as the torch.fx capture counts `x @ (self.E[3:7] * 2)`."""
    nodes = [helper.make_node("Gather", ["E", "idx"], ["g"], name="gather"),
             helper.make_node("Slice", ["E", "starts", "ends"], ["s"], name="slice"),
             helper.make_node("Mul", ["s", "two"], ["s2"], name="scale"),
             helper.make_node("MatMul", ["x", "g"], ["h"], name="mm1"),
             helper.make_node("MatMul", ["h", "s2"], ["y"], name="mm2")]
    inits = [numpy_helper.from_array(np.ones((10, 4), dtype=np.float32), "E"),
             numpy_helper.from_array(np.arange(1, 5, dtype=np.int64), "idx"),
             numpy_helper.from_array(np.array(2.0, dtype=np.float32), "two"),
             numpy_helper.from_array(np.array([3], dtype=np.int64), "starts"),
             numpy_helper.from_array(np.array([7], dtype=np.int64), "ends")]
    proto = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], inits)
    g = import_onnx(proto)
    assert [(op.name, op.kind, op.flops, op.param_bytes) for op in g.ops] == [
        ("x", "input", 0, 0), ("E/variable", "variable", 0, 160), ("gather", "gather", 0, 0),
        ("scale", "mul", 16, 0), ("mm1", "matmul", 64, 0), ("mm2", "matmul", 64, 0)]
    assert (g.metadata["params"], g.metadata["param_bytes"]) == (40, 160)


class _Gates(nn.Module):
    """An LSTM-style cell: one Linear, its output chunked into four gates."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 32)

    def forward(self, x):
        i, f, g, o = self.fc(x).chunk(4, 1)
        return torch.sigmoid(o) * torch.tanh(torch.sigmoid(f) * torch.tanh(g)) + i


@pytest.mark.parametrize("opset", [9, 17])
def test_chunk_exported_as_slices_or_a_split_imports_as_the_fx_capture(opset):
    """The TorchScript exporter writes x.chunk(4, 1) as four Slices from opset 11 on (a Split before). The
    Split was folded, the Slices were four ops of 24 FLOPs each on the fallback: the same model had four ops
    more one way. Both are folded now, as the fx capture folds chunk; each gate reads its [3, 8] quarter."""
    model, x = _Gates().eval(), torch.randn(3, 8)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), buf, dynamo=False, opset_version=opset)
    proto = onnx.load_from_string(buf.getvalue())
    assert ("Slice" if opset >= 11 else "Split") in {n.op_type for n in proto.graph.node}
    g, g_fx = import_onnx(proto), capture(model, (x,), name="m")
    kinds = sorted(op.kind for op in g.ops)
    assert kinds == ["add", "gemm", "input", "mul", "mul", "sigmoid", "sigmoid", "tanh", "tanh"]
    assert len(g.ops) == len(g_fx.ops) and g.metadata["forward_flops"] == g_fx.metadata["forward_flops"]
    assert "fallback_cost_kinds" not in g.metadata
    gemm = g.ops[g.index[next(op.name for op in g.ops if op.kind == "gemm")]]
    assert sorted(e.bytes for e in g.edges if e.src == g.index[gemm.name]) == [3 * 8 * 4] * 4


def test_an_exported_last_time_step_reads_as_in_the_fx_capture():
    class Last(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn, self.out = nn.LSTM(8, 6, batch_first=True), nn.Linear(6, 3)

        def forward(self, x):
            y, _ = self.rnn(x)
            return self.out(y[:, -1])

    model, x = Last().eval(), torch.randn(2, 5, 8)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), buf, dynamo=False, input_names=["x"])
    g_onnx, g_fx = import_onnx(onnx.load_from_string(buf.getvalue())), capture(model, (x,), name="last")
    assert "gather" not in {op.kind for op in g_onnx.ops}  # y[:, -1] is folded, a view, as in the fx capture
    (gemm,), (fc,) = [op for op in g_onnx.ops if op.kind == "gemm"], [op for op in g_fx.ops if op.kind == "linear"]
    assert (gemm.flops, gemm.bytes_read) == (fc.flops, fc.bytes_read)
    assert edge_bytes(g_onnx, next(op.name for op in g_onnx.ops if op.kind == "lstm"), gemm.name) == 2 * 6 * 4
    assert sum(op.bytes_read for op in g_onnx.ops if op.kind in ("lstm", "gemm")) == sum(
        op.bytes_read for op in g_fx.ops if op.kind in ("lstm", "linear"))


def test_quantized_weights_are_frozen_parameters_and_quantized_products_count_their_macs():
    """A quantized model's int8 weights were constants: 0 parameters and 0 bytes resident, the DequantizeLinear
    folded away, and MatMulInteger / QLinearConv costed 1 FLOP per output element with 0 MACs."""
    def i8(shape, name):
        return numpy_helper.from_array(np.ones(shape, dtype=np.int8), name)

    def scalar(v, dtype, name):
        return numpy_helper.from_array(np.array(v, dtype=dtype), name)

    nodes = [helper.make_node("DequantizeLinear", ["Wq", "s", "z"], ["W"], name="dq"),
             helper.make_node("MatMul", ["x", "W"], ["a"], name="mm"),  # [2, 4] x [4, 6]
             helper.make_node("QuantizeLinear", ["a", "s", "z"], ["aq"], name="q"),
             helper.make_node("MatMulInteger", ["aq", "W2q"], ["b"], name="mmi"),  # [2, 6] x [6, 3]
             helper.make_node("Reshape", ["b", "shape"], ["b4"], name="rs"),
             helper.make_node("Cast", ["b4"], ["b4f"], name="cast", to=TensorProto.FLOAT),
             helper.make_node("QuantizeLinear", ["b4f", "s", "z"], ["cq"], name="q2"),  # [1, 2, 3, 1]
             helper.make_node("QLinearConv", ["cq", "s", "z", "Wc", "s", "z", "s", "z", "Bc"], ["y"], name="qconv",
                              kernel_shape=[3, 1], pads=[1, 0, 1, 0])]  # 5 filters of 2 x 3 x 1, int32 bias
    inits = [i8((4, 6), "Wq"), i8((6, 3), "W2q"), i8((5, 2, 3, 1), "Wc"),
             numpy_helper.from_array(np.zeros(5, dtype=np.int32), "Bc"), scalar(0.5, np.float32, "s"),
             scalar(0, np.int8, "z"), numpy_helper.from_array(np.array([1, 2, 3, 1], dtype=np.int64), "shape")]
    proto = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                   [helper.make_tensor_value_info("y", TensorProto.INT8, [1, 5, 3, 1])], inits)
    g = import_onnx(proto)
    f = {op.name: op for op in g.ops}
    assert g.metadata["params"] == 24 + 18 + 30 + 5 and g.metadata["param_bytes"] == 24 + 18 + 30 + 20
    assert (f["dq"].param_bytes, f["dq"].flops, f["dq"].output_bytes) == (24, 24, 24 * 4)
    assert edge_bytes(g, "dq", "mm") == 24 * 4
    assert (f["mmi"].param_bytes, f["mmi"].flops) == (18, 2 * 2 * 3 * 6)
    assert (f["qconv"].param_bytes, f["qconv"].flops) == (30 + 20, 2 * 15 * 6 + 15)  # out [1, 5, 3, 1]: 15 x 2*3*1
    assert g.metadata["forward_macs"] == 2 * 6 * 4 + 2 * 3 * 6 + 15 * 6
    assert "fallback_cost_kinds" not in g.metadata
    with pytest.raises(GraphError, match="no trainable parameter"):  # the weights are frozen
        import_onnx(proto, mode="training")


def test_per_channel_quantization_scales_are_frozen():
    """A per-channel scale ([3] floats) of a quantized weight is resident but not trained: it got a gradient
    and a momentum update, so training a model whose only float weights are scales found something to train."""
    nodes = [helper.make_node("DequantizeLinear", ["Wq", "s"], ["W"], name="dq", axis=1),
             helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")]
    proto = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
                   [numpy_helper.from_array(np.ones((4, 3), np.int8), "Wq"), _f32((3,), "s")])
    g = import_onnx(proto)
    assert (g.metadata["params"], g.ops[g.index["dq"]].param_bytes) == (12 + 3, 12 + 3 * 4)
    with pytest.raises(GraphError, match="no trainable parameter"):
        import_onnx(proto, mode="training")
    # the float tensor a QuantizeLinear reads is its data, not a scale: only 's' is frozen (3, not 3 + 12); Wf is
    # trained by the MatMul that reads it too (QuantizeLinear's integer output passes it no gradient)
    q = _model([helper.make_node("QuantizeLinear", ["Wf", "s"], ["Wq"], name="q", axis=1), *nodes,
                helper.make_node("MatMul", ["x", "Wf"], ["y2"], name="mm2"),
                helper.make_node("Add", ["y", "y2"], ["z"], name="add")],
               proto.graph.input, [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 3])],
               [_f32((4, 3), "Wf"), _f32((3,), "s")])
    assert import_onnx(q, mode="training").metadata["frozen_params"] == 3


def test_int4_weights_take_half_a_byte_each():
    """int4 weights pack two to a byte (15 of them: 8 bytes); numpy's int4 type takes a byte each (15)."""
    w = helper.make_tensor("Wq", TensorProto.INT4, [5, 3], np.ones(15, dtype=np.int8).tolist())
    nodes = [helper.make_node("DequantizeLinear", ["Wq", "s"], ["W"], name="dq"),
             helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")]
    graph = helper.make_graph(nodes, "int4", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
                              initializer=[w, numpy_helper.from_array(np.array(0.5, np.float32), "s")])
    g = import_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))
    assert (g.metadata["params"], g.metadata["param_bytes"]) == (15, 8)
    assert g.ops[g.index["dq"]].param_bytes == 8 and g.ops[g.index["dq"]].output_bytes == 15 * 4


def test_int4_activations_take_half_a_byte_each():
    """QuantizeLinear to int4 (opset 21) of x [2, 8]: 16 elements packed two to a byte, 8 bytes written and read
    by the DequantizeLinear; before, 16 (numpy's int4 type takes a byte each)."""
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="q"),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], name="dq")]
    inits = [numpy_helper.from_array(np.array(0.1, np.float32), "s"), helper.make_tensor("z", TensorProto.INT4, [], [0])]
    graph = helper.make_graph(nodes, "int4", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])], initializer=inits)
    g = import_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))
    q, dq = g.ops[g.index["q"]], g.ops[g.index["dq"]]
    assert (q.output_bytes, q.bytes_read, dq.bytes_read, dq.output_bytes) == (8, 2 * 8 * 4, 8, 2 * 8 * 4)
    assert [e.bytes for e in g.edges] == [64, 8]


def test_batch_norm_running_statistics_are_not_parameters():
    nodes = [helper.make_node("BatchNormalization", ["x", "bs", "bb", "bm", "bv"], ["y"], name="bn")]
    inits = [numpy_helper.from_array(np.full(3, v, dtype=np.float32), n)
             for v, n in ((1.0, "bs"), (0.5, "bb"), (0.25, "bm"), (2.0, "bv"))]
    proto = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 2, 2])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 2, 2])], inits)
    g = import_onnx(proto)
    assert g.metadata["params"] == 2 * 3  # scale and bias only, as nn.BatchNorm2d(3).parameters()


class _Buffers(nn.Module):
    """A language model's buffers (a float causal mask, a position table, rotary frequencies) and BatchNorm's
    running statistics, beside parameters that no weight input reads: a Linear's bias added after its MatMul
    (3-D input), LayerNorm written out before opset 17, an RMSNorm weight, a class token."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.qkv, self.norm = nn.Embedding(10, 16), nn.Linear(16, 48), nn.LayerNorm(16)
        self.bn, self.head = nn.BatchNorm1d(16), nn.Linear(16, 3)
        self.cls, self.scale = nn.Parameter(torch.randn(1, 1, 16)), nn.Parameter(torch.randn(16))
        self.register_buffer("mask", torch.triu(torch.full((7, 7), float("-inf")), 1))
        self.register_buffer("pos", torch.randn(7, 16))
        self.register_buffer("inv_freq", torch.rand(8))
        with torch.no_grad():
            for p in self.parameters():  # no two equal (zero) biases for the exporter to merge
                p.copy_(torch.randn_like(p))

    def forward(self, ids):
        x = torch.cat([self.cls.expand(ids.shape[0], -1, -1), self.embed(ids)], 1) + self.pos
        angles = torch.arange(7.0)[:, None] * self.inv_freq
        x = x * torch.cat([angles, angles], -1).cos()
        q, k, v = self.qkv(self.norm(x)).chunk(3, -1)
        x = torch.softmax(q @ k.transpose(1, 2) + self.mask, -1) @ v
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True)) * self.scale
        return self.head(self.bn(x.transpose(1, 2)).mean(2))


@pytest.mark.parametrize(("opset", "folding"), [(14, True), (17, True), (17, False)])
def test_buffers_are_not_parameters(opset, folding):
    """Every float initializer of more than one element was a parameter: the causal mask, the position table
    and the rotary frequencies (or the cos table folded from them) counted, and in training each got a
    gradient, optimizer state and an update. The parameters are now the PyTorch model's, as in the fx capture."""
    model, ids = _Buffers().eval(), torch.randint(0, 10, (2, 6))
    count = sum(p.numel() for p in model.parameters())
    assert count == 160 + 816 + 32 + 32 + 51 + 16 + 16
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (ids,), buf, dynamo=False, opset_version=opset, do_constant_folding=folding)
    proto = onnx.load_from_string(buf.getvalue())
    names = {i.name for i in proto.graph.initializer}
    assert {"mask", "pos"} <= names and ("inv_freq" in names) == (not folding)  # else a cos table: a buffer too
    assert ("LayerNormalization" in {n.op_type for n in proto.graph.node}) == (opset >= 17)
    g = import_onnx(proto)
    g_fx = capture(model, (ids,), name="buffers")
    assert (g.metadata["params"], g.metadata["param_bytes"]) == (count, count * 4)
    assert (g_fx.metadata["params"], g_fx.metadata["param_bytes"]) == (count, count * 4)
    train = import_onnx(proto, mode="training")
    assert (train.metadata["params"], train.metadata.get("frozen_params", 0)) == (count, 0)


class _LeftWeight(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w, self.v = nn.Parameter(torch.randn(3, 4)), nn.Parameter(torch.randn(5, 3))

    def forward(self, x):  # x: [B, 4, 2]
        return torch.einsum("ij,bjk->bik", self.v, torch.matmul(self.w, x))


def test_a_weight_multiplied_from_the_left_is_a_parameter():
    """torch.matmul(self.w, x) and einsum('ij,bjk->bik', self.v, ...): the left operand is no weight input of a
    product, so the rule that takes buffers for constants lost them (and their update in training)."""
    model, x = _LeftWeight(), torch.randn(2, 4, 2)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), buf, dynamo=False, opset_version=17)
    proto = onnx.load_from_string(buf.getvalue())
    assert [n.op_type for n in proto.graph.node] == ["MatMul", "Einsum"]
    g = import_onnx(proto)
    assert [(op.kind, op.param_bytes) for op in g.ops] == [("input", 0), ("matmul", 12 * 4), ("einsum", 15 * 4)]
    assert g.metadata["params"] == capture(model, (x,), name="left").metadata["params"] == 27
    assert import_onnx(proto, mode="training").stats.ops_by_phase["update"] == 2


@pytest.mark.parametrize("norm", [nn.InstanceNorm2d(4), nn.InstanceNorm2d(4, affine=True), nn.GroupNorm(2, 4),
                                  nn.BatchNorm2d(4, affine=False), nn.LayerNorm([4, 3, 3], elementwise_affine=False)],
                         ids=["instance", "instance-affine", "group", "batch-no-affine", "layer-no-affine"])
def test_the_exporters_ones_and_zeros_for_a_norm_without_affine_weights_are_not_parameters(norm):
    """The PyTorch exporter writes a norm without a scale and bias (and GroupNorm's inner InstanceNormalization)
    with Constant nodes of ones and zeros: they were frozen parameters, 72 for LayerNorm([4, 3, 3]) here."""
    model, x = nn.Sequential(nn.Conv2d(4, 4, 1), norm).eval(), torch.randn(2, 4, 3, 3)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), buf, dynamo=False, opset_version=17, do_constant_folding=False)  # BN unfused
    g = import_onnx(onnx.load_from_string(buf.getvalue()))
    count = sum(p.numel() for p in model.parameters())
    assert g.metadata["params"] == capture(model, (x,), name="norm").metadata["params"] == count
    assert count == 20 + (8 if isinstance(norm, nn.GroupNorm) or norm.weight is not None else 0)


@pytest.mark.parametrize("opset", [9, 17])
def test_resize_scales_are_not_parameters(opset):
    """A float scales initializer ([1, 1, 2, 2]) was a parameter: 4 more parameters, and in training a
    gradient and a momentum update of the upsampling factors."""
    op = "Upsample" if opset == 9 else "Resize"
    inputs = ["c", "scales"] if opset == 9 else ["c", "", "scales"]
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], name="conv"),
             helper.make_node(op, inputs, ["y"], name="up", mode="nearest")]
    proto = helper.make_model(helper.make_graph(
        nodes, "up", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 8, 8])],
        initializer=[_f32((3, 2, 1, 1), "W"), numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")]),
        opset_imports=[helper.make_opsetid("", opset)])
    g = import_onnx(proto)
    f = {op.name: op for op in g.ops}
    assert g.metadata["params"] == 6 and f["up"].param_bytes == 0 and f["up"].output_bytes == 3 * 64 * 4
    train = import_onnx(proto, mode="training")
    assert sorted(op.name for op in train.ops if op.phase == "update") == ["conv/update"]


def test_recurrent_initial_states_are_not_parameters():
    """The dynamo exporter writes nn.LSTM's zero initial state as an initializer read by LSTM's initial_h and
    initial_c: it was a trainable parameter (20 more here, with a gradient and an update in training)."""
    nodes = [helper.make_node("LSTM", ["x", "W", "R", "B", "", "h0", "c0"], ["y"], name="lstm", hidden_size=5)]
    inits = [_f32((1, 20, 3), "W"), _f32((1, 20, 5), "R"), _f32((1, 40), "B"), _f32((1, 2, 5), "h0"),
             _f32((1, 2, 5), "c0")]
    proto = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 2, 3])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 1, 2, 5])], inits)
    g = import_onnx(proto)
    assert (g.metadata["params"], g.ops[g.index["lstm"]].param_bytes) == (60 + 100 + 40, 200 * 4)
    gru = _model([helper.make_node("GRU", ["x", "W", "R", "", "", "h0"], ["y"], name="gru", hidden_size=5)],
                 proto.graph.input, proto.graph.output, [_f32((1, 15, 3), "W"), _f32((1, 15, 5), "R"), inits[3]])
    assert import_onnx(gru).metadata["params"] == 45 + 75


@pytest.mark.parametrize(
    "rnn",
    [nn.LSTM(3, 5, num_layers=2, bidirectional=True), nn.LSTM(3, 5, batch_first=True), nn.GRU(3, 5), nn.RNN(3, 5),
     nn.LSTM(3, 5, bias=False), nn.GRU(3, 5, bias=False), nn.RNN(3, 5, bias=False)],
    ids=["lstm-2-bidirectional", "lstm-batch-first", "gru", "rnn", "lstm-no-bias", "gru-no-bias", "rnn-no-bias"],
)
def test_recurrent_layers_cost_as_in_the_fx_capture(rnn):
    """An exported LSTM / GRU / RNN gets the fused layer's cell formula, not 1 FLOP per output element."""
    x = torch.randn(2, 4, 3) if rnn.batch_first else torch.randn(4, 2, 3)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(rnn.eval(), (x,), buf, dynamo=False)
    g_onnx = import_onnx(onnx.load_from_string(buf.getvalue()), name="rnn")
    g_fx = capture(rnn, (x,), name="rnn")
    assert "fallback_cost_kinds" not in g_onnx.metadata
    assert g_onnx.metadata["forward_flops"] == g_fx.metadata["forward_flops"]
    assert g_onnx.metadata["forward_macs"] == g_fx.metadata["forward_macs"]
    assert g_onnx.metadata["params"] == g_fx.metadata["params"]


class _Losses(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 5)

    def forward(self, x, t):
        logits = self.fc(x.transpose(1, -1)).transpose(1, -1)  # [N, C=5, H, W]
        return F.cross_entropy(logits, t) + F.nll_loss(logits, t)


@pytest.mark.parametrize("mode", ["inference", "training"])
def test_exported_losses_cost_as_in_the_fx_capture(mode):
    """SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss (what torch exports for its losses) get the
    cross-entropy and NLL rules (they had none: 1 FLOP, and no saved log-probabilities); classes are
    dimension 1, so logits [2, 5, 3, 4] are 24 samples of 5 classes."""
    x, t = torch.randn(2, 3, 3, 4), torch.zeros(2, 3, 4, dtype=torch.long)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(_Losses(), (x, t), buf, dynamo=False)
    g = import_onnx(onnx.load_from_string(buf.getvalue()), name="losses", mode=mode)
    assert "fallback_cost_kinds" not in g.metadata
    f = {op.kind: op for op in g.ops}
    ce, nll = f["softmaxcrossentropyloss"], f["negativeloglikelihoodloss"]
    assert ce.flops == 5 * 120 + 24 and nll.flops == 24
    # training keeps the log-probabilities beside the scalar loss
    assert ce.output_bytes == 4 + (120 * 4 if mode == "training" else 0)
    g_fx = capture(_Losses(), (x, t), name="losses", mode=mode)
    fx_ce, fx_nll = (next(op for op in g_fx.ops if op.kind == k) for k in ("cross_entropy", "nll_loss"))
    assert (ce.flops, ce.output_bytes) == (fx_ce.flops, fx_ce.output_bytes)
    assert (nll.flops, nll.output_bytes) == (fx_nll.flops, fx_nll.output_bytes)
    assert g.metadata["forward_flops"] == g_fx.metadata["forward_flops"] == 720 + 120 + 624 + 24 + 1


class _Masked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc, self.fc2 = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        a = self.fc(x)
        return (self.fc2(a) * (a > 0).float()).sum()


def test_no_gradient_flows_through_a_comparison():
    """Greater outputs bool: no backward op for it or the Cast after it (each had one, 8 FLOPs)."""
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(_Masked(), (torch.randn(2, 4),), buf, dynamo=False)
    g = import_onnx(onnx.load_from_string(buf.getvalue()), name="masked", mode="training")
    assert sorted(op.kind for op in g.ops if op.phase == "backward") == [
        "gemm_grad", "gemm_grad_weight", "gemm_grad_weight", "mul_grad", "reducesum_grad"]
    (mul_grad,) = [op for op in g.ops if op.kind == "mul_grad"]
    assert mul_grad.output_bytes == 32  # the gradient of fc2's output, not of the mask


class _Einsum(nn.Module):
    def forward(self, a, b):
        return torch.einsum("bij,bjk->bik", a, b) + torch.einsum("bik->bk", torch.einsum("bij,bjk->bik", a * 2, b))[:, None]


def test_einsum_costs_as_in_the_fx_capture():
    """An exported Einsum gets the fx rule (two operands: a multiply-add per index combination; one: 1 per
    input element), not 1 FLOP per output element."""
    args = (torch.randn(2, 3, 4), torch.randn(2, 4, 5))
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(_Einsum(), args, buf, dynamo=False)
    g_onnx = import_onnx(onnx.load_from_string(buf.getvalue()), name="einsum")
    g_fx = capture(_Einsum(), args, name="einsum")
    assert "fallback_cost_kinds" not in g_onnx.metadata
    assert g_onnx.metadata["forward_macs"] == g_fx.metadata["forward_macs"] == 2 * 120
    assert g_onnx.metadata["forward_flops"] == g_fx.metadata["forward_flops"]


def _one_node(node, inputs, out_shapes, inits=()):
    """The op of a model of `node` alone (float inputs and outputs of the shapes given; an output named "idx"
    int64), and the graph's metadata."""
    vi = helper.make_tensor_value_info
    outs = [vi(o, TensorProto.INT64 if o == "idx" else TensorProto.FLOAT, s) for o, s in zip(node.output, out_shapes, strict=True)]
    g = import_onnx(_model([node], [vi(x, TensorProto.FLOAT, s) for x, s in inputs], outs, list(inits)))
    (op,) = [op for op in g.ops if op.kind != "input"]
    return op, g.metadata


def _i64(values, name: str):
    return numpy_helper.from_array(np.array(values, dtype=np.int64), name)


@pytest.mark.parametrize(("node", "inputs", "out_shapes", "inits", "flops"), [
    (helper.make_node("TopK", ["x", "k"], ["v", "idx"], axis=1), [("x", [2, 8])], [[2, 4], [2, 4]],
     [_i64([4], "k")], 2 * (8 + 4 * 2)),  # a pass over each row of 8, then the 4 sorted
    (helper.make_node("TopK", ["x", "k"], ["v", "idx"], axis=1, sorted=0), [("x", [2, 8])], [[2, 4], [2, 4]],
     [_i64([4], "k")], 2 * 8),
    (helper.make_node("TopK", ["x", "k"], ["v", "idx"], axis=0), [("x", [8, 2])], [[8, 2], [8, 2]],
     [_i64([8], "k")], 2 * 8 * 3),  # all of them: torch.sort, n log2 n per row
    (helper.make_node("CumSum", ["x", "axis"], ["y"]), [("x", [2, 8])], [[2, 8]], [_i64(1, "axis")], 16),
    (helper.make_node("ScatterElements", ["x", "i", "u"], ["y"], axis=1, reduction="add"), [("x", [2, 8]), ("u", [2, 3])],
     [[2, 8]], [_i64([[0, 1, 1], [7, 0, 7]], "i")], 6),  # one add per update, as scatter_add
    (helper.make_node("ScatterElements", ["x", "i", "u"], ["y"], axis=1), [("x", [2, 8]), ("u", [2, 3])],
     [[2, 8]], [_i64([[0, 1, 1], [7, 0, 7]], "i")], 16),  # no reduction: data movement, as scatter
    (helper.make_node("ScatterND", ["x", "i", "u"], ["y"], reduction="add"), [("x", [2, 8]), ("u", [1, 8])],
     [[2, 8]], [_i64([[1]], "i")], 8),
    (helper.make_node("GatherElements", ["x", "i"], ["y"], axis=1), [("x", [2, 8])], [[2, 3]],
     [_i64([[0, 1, 1], [7, 0, 7]], "i")], 6),
    (helper.make_node("GatherND", ["x", "i"], ["y"]), [("x", [2, 8])], [[1, 8]], [_i64([[1]], "i")], 8),
])
def test_topk_cumsum_scatter_and_gather_elements_have_rules(node, inputs, out_shapes, inits, flops):
    """They took the fallback of 1 FLOP per output element and were reported (TopK of 4 of 8: 16 with its
    indices; a scatter-add of 6 updates: 16). Now as the fx capture's topk / sort, cumsum, scatter_add,
    scatter and gather."""
    op, meta = _one_node(node, inputs, out_shapes, inits)
    assert (op.kind, op.flops) == (node.op_type.lower(), flops)
    assert "fallback_cost_kinds" not in meta


class _Ranked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        y = self.fc(x)
        idx = torch.tensor([[0, 1, 1], [7, 0, 7]])
        return y.sort(dim=1)[0] + y.topk(4).values.sum() + y.cumsum(1) + y.scatter_add(1, idx, y[:, :3])


def test_exported_sort_topk_cumsum_and_scatter_add_cost_as_in_the_fx_capture():
    model, x = _Ranked().eval(), torch.randn(2, 8)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), buf, dynamo=False, opset_version=17)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g, g_fx = import_onnx(onnx.load_from_string(buf.getvalue())), capture(model, (x,), name="m")
    flops = sorted(op.flops for op in g.ops if op.kind in ("topk", "cumsum", "scatterelements"))
    assert flops == sorted(op.flops for op in g_fx.ops if op.kind in ("sort", "topk", "cumsum", "scatter_add"))
    assert flops == [6, 16, 2 * (8 + 4 * 2), 2 * 8 * 3]


class _Padded(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 1)

    def forward(self, x):
        return F.pad(self.conv(x), (1, 1, 2, 0)).relu()


@pytest.mark.parametrize("opset", [11, 17])
def test_f_pad_exported_by_torchscript_imports(opset):
    """The TorchScript exporter computes F.pad's pads from constants through a Transpose (ConstantOfShape ->
    Concat -> Reshape -> Slice -> Transpose -> Reshape -> Cast -> Pad), which ONNX's inference does not
    evaluate and the import's folding did not either: every model with F.pad failed ("shape inference left
    the shape of '27' (node '/Pad') unknown")."""
    model, x = _Padded().eval(), torch.randn(1, 4, 6, 6)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), buf, dynamo=False, opset_version=opset)
    g = import_onnx(onnx.load_from_string(buf.getvalue()))
    (pad,) = [op for op in g.ops if op.kind == "pad"]
    assert pad.output_shape == (1, 4, 8, 8) and pad.flops == 4 * 8 * 8
    g_fx = capture(model, (x,), name="m")
    assert g.metadata["forward_flops"] == g_fx.metadata["forward_flops"]


def test_exported_data_movement_and_math_functions_are_not_reported_as_the_fallback():
    """F.pad, repeat, triu, pixel_shuffle, tan, asin, celu, nan_to_num (IsNaN, IsInf) export as Pad, Tile, Trilu,
    DepthToSpace, Tan, Asin, Celu, IsNaN and IsInf: 1 FLOP per output element, as the fx capture counts them
    by design; they were reported as the fallback (a warning on most exported CNNs, for their Pad)."""
    class Ops(nn.Module):
        def forward(self, x):
            y = F.pad(x, (1, 1, 1, 1)).repeat(1, 2, 1, 1).triu()
            return F.pixel_shuffle(y, 2).tan() + 1, F.celu(x.asin()), torch.nan_to_num(x)

    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Ops(), (torch.randn(1, 4, 2, 2),), buf, dynamo=False, opset_version=17)
    proto = onnx.load_from_string(buf.getvalue())
    assert {"Pad", "Tile", "Trilu", "DepthToSpace", "Tan", "Asin", "Celu", "IsNaN", "IsInf"} <= {
        n.op_type for n in proto.graph.node}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g = import_onnx(proto)
    f = {op.kind: op.flops for op in g.ops}
    assert (f["pad"], f["tile"], f["trilu"], f["depthtospace"], f["tan"]) == (64, 128, 128, 128, 128)
    assert (f["asin"], f["celu"], f["isnan"], f["isinf"]) == (16, 16, 16, 16)


@pytest.mark.parametrize(("attrs", "x_shape", "per_element"), [
    ({}, [2, 4, 3, 3], 1),  # nearest
    ({"mode": "linear"}, [2, 4, 3, 3], 7),  # bilinear: 4 neighbours
    ({"mode": "cubic"}, [2, 4, 3, 3], 31),  # bicubic: 16
    ({"mode": "linear"}, [2, 4, 3], 3),  # linear of a sequence: 2
    ({"mode": "linear"}, [1, 2, 2, 3, 3], 15),  # trilinear: 8
    ({"mode": "linear", "axes": [2]}, [2, 4, 3, 3], 3),  # one axis resized
])
def test_resize_counts_the_neighbours_it_weighs_as_interpolate(attrs, x_shape, per_element):
    """Resize took the fallback, 1 FLOP per output element: an exported F.interpolate(mode="bilinear")
    counted 1 per weighted sum of 4, the fx capture 7."""
    vi = helper.make_tensor_value_info
    rank = len(x_shape)
    axes = attrs.get("axes", range(2, rank))
    out_shape = [d * 2 if k in axes else d for k, d in enumerate(x_shape)]
    scales = numpy_helper.from_array(np.array([2.0 if k in axes else 1.0 for k in range(rank)] if "axes" not in attrs
                                              else [2.0], np.float32), "scales")
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], name="resize", **attrs)
    model = helper.make_model(helper.make_graph([node], "r", [vi("x", TensorProto.FLOAT, x_shape)],
                                                [vi("y", TensorProto.FLOAT, out_shape)], [scales]),
                              opset_imports=[helper.make_opsetid("", 18)])
    g = import_onnx(model)
    assert g.ops[g.index["resize"]].flops == per_element * math.prod(out_shape)
    assert "fallback_cost_kinds" not in g.metadata


class _Sampled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 1)

    def forward(self, x, grid):
        y = self.conv(x)
        up = F.interpolate(y, scale_factor=2, mode="bilinear") + F.interpolate(y, scale_factor=2, mode="bicubic")
        return up, F.grid_sample(y, grid, align_corners=False), F.interpolate(y, scale_factor=2)


def test_exported_interpolation_and_grid_sample_cost_as_in_the_fx_capture():
    model, inputs = _Sampled().eval(), (torch.randn(1, 4, 3, 3), torch.zeros(1, 5, 5, 2))
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, inputs, buf, dynamo=False, opset_version=17)
    g, g_fx = import_onnx(onnx.load_from_string(buf.getvalue())), capture(model, inputs, name="m")
    flops = sorted(op.flops for op in g.ops if op.kind in ("resize", "gridsample"))
    assert flops == sorted(op.flops for op in g_fx.ops if op.kind in ("interpolate", "grid_sample"))
    assert flops == [144, 7 * 100, 7 * 144, 31 * 144]  # nearest, bilinear grid sample, bilinear, bicubic
    assert "fallback_cost_kinds" not in g.metadata


class _PadUp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 2, 1)

    def forward(self, x):
        return F.interpolate(F.pad(self.conv(x), (1, 1, 1, 1)), scale_factor=2)


def test_interpolate_exported_without_constant_folding_imports():
    """Unfolded (as a training export is), scale_factor is a Concat of two float Constants, which ONNX's
    inference does not read, and F.pad's output is known only once its pads are evaluated, so the model's
    recorded output shape does not stand in: 'shape inference left the shape of ... (node /Resize) unknown'."""
    model, x = _PadUp().eval(), torch.randn(1, 2, 4, 4)
    flops = []
    for folding in (True, False):
        buf = io.BytesIO()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(model, (x,), buf, dynamo=False, opset_version=13, do_constant_folding=folding)
        proto = onnx.load_from_string(buf.getvalue())
        made_by = {o: n.op_type for n in proto.graph.node for o in n.output}
        scales = next(n.input[2] for n in proto.graph.node if n.op_type == "Resize")
        assert made_by[scales] == ("Constant" if folding else "Concat")
        g = import_onnx(proto)
        flops.append({op.kind: op.flops for op in g.ops if op.kind in ("pad", "resize")})
    g_fx = capture(model, (x,), name="m")
    assert flops[0] == flops[1] == {"pad": 2 * 36, "resize": 2 * 144}
    assert flops[1]["resize"] == next(op.flops for op in g_fx.ops if op.kind == "interpolate")


def test_lrn_counts_size_plus_5_per_element_as_local_response_norm():
    op, meta = _one_node(helper.make_node("LRN", ["x"], ["y"], size=3), [("x", [2, 4, 3, 3])], [[2, 4, 3, 3]])
    assert (op.kind, op.flops) == ("lrn", 8 * 72) and "fallback_cost_kinds" not in meta


def test_control_flow_that_shape_inference_fails_on_is_refused_as_control_flow():
    """An If on the data whose branch not taken is ill-typed (MatMul of [2, 4] by [3, 3]) fails ONNX's shape
    inference, which now runs before control flow is refused: the error is still the control flow's, naming
    the node, not the inference's."""
    vi = helper.make_tensor_value_info
    then_g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["t"])], "then", [], [vi("t", TensorProto.FLOAT, None)])
    else_g = helper.make_graph([helper.make_node("Relu", ["x"], ["e"])], "else", [], [vi("e", TensorProto.FLOAT, None)])
    m = _model([helper.make_node("ReduceSum", ["x"], ["s"], name="sum", keepdims=0),
                helper.make_node("Greater", ["s", "zero"], ["c"], name="gt"),
                helper.make_node("If", ["c"], ["y"], name="if", then_branch=then_g, else_branch=else_g)],
               [vi("x", TensorProto.FLOAT, [2, 4])], [vi("y", TensorProto.FLOAT, [2, 4])],
               [_f32((3, 3), "W"), numpy_helper.from_array(np.array(0, np.float32), "zero")])
    with pytest.raises(GraphError, match=r"^ONNX model 'hand': node 'if' \(If\) has a subgraph \(attribute "
                                         r"'(then|else)_branch'\): control flow is not supported"):
        import_onnx(m)


@pytest.mark.parametrize("opset", [11, 17])
@pytest.mark.parametrize("folding", [True, False])
def test_local_response_norm_exported_with_an_if_on_its_rank_imports_the_branch_taken(opset, folding):
    """The TorchScript exporter writes nn.LocalResponseNorm with an If on the rank of its pooled input
    (Shape -> Gather -> Equal): it was refused as control flow. The condition is known from the shapes, so the
    branch taken (here the else branch: an Identity) replaces it. By hand, 2 x 8 x 6 x 6 = 576 elements: Mul
    (x^2) 576, Pad of the channels by 1 and 1: 2 x 10 x 6 x 6 = 720, AveragePool (3, 1, 1): 576 x 3 = 1728,
    then Mul, Add, Pow and Div 576 each."""
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.LocalResponseNorm(3)).eval()
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.randn(2, 3, 8, 8),), buf, dynamo=False, opset_version=opset,
                          do_constant_folding=folding)
    proto = onnx.load_from_string(buf.getvalue())
    assert "If" in [n.op_type for n in proto.graph.node]
    g = import_onnx(proto)
    assert [(op.kind, op.flops) for op in g.ops[2:]] == [
        ("mul", 576), ("pad", 720), ("averagepool", 1728), ("mul", 576), ("add", 576), ("pow", 576), ("div", 576)]
    assert g.metadata["params"] == 8 * 3 * 3 * 3 + 8
    assert g.ops[-1].output_bytes == 576 * 4 and g.num_edges == 9  # a chain, and the conv read by the Div too


def test_an_if_on_shapes_takes_its_branch_with_the_weights_it_reads():
    """A branch's nodes, the weights they read from the outer scope and their edges are imported (an unnamed
    node named in the If's module); the branch not taken (a MatMul with W2) is not. By hand: x [2, 4] @ W [4, 3]: 2 x 2 x 4 x 3 = 48 FLOPs."""
    vi = helper.make_tensor_value_info
    then_g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["t"])], "then", [],
                               [vi("t", TensorProto.FLOAT, [2, 3])])
    else_g = helper.make_graph([helper.make_node("MatMul", ["x", "W2"], ["e"], name="else_mm")], "else", [],
                               [vi("e", TensorProto.FLOAT, [2, 3])])
    m = _model([helper.make_node("Shape", ["x"], ["s"], name="shape"),
                helper.make_node("Gather", ["s", "zero"], ["b"], name="gather", axis=0),
                helper.make_node("Equal", ["b", "two"], ["c"], name="eq"),
                helper.make_node("If", ["c"], ["y"], name="/block/If", then_branch=then_g, else_branch=else_g),
                helper.make_node("Relu", ["y"], ["z"], name="relu")],
               [vi("x", TensorProto.FLOAT, [2, 4])], [vi("z", TensorProto.FLOAT, [2, 3])],
               [_f32((4, 3), "W"), _f32((4, 3), "W2"), numpy_helper.from_array(np.array(0, np.int64), "zero"),
                numpy_helper.from_array(np.array(2, np.int64), "two")])
    g = import_onnx(m)
    assert [(op.name, op.kind, op.flops, op.param_bytes) for op in g.ops] == [
        ("x", "input", 0, 0), ("/block/MatMul", "matmul", 48, 48), ("relu", "relu", 6, 0)]
    assert g.num_edges == 2 and g.metadata["params"] == 12 and g.ops[1].scope == "block"  # the If's module


def test_a_size_that_depends_on_the_data_is_refused_saying_so():
    """y[y > 0] exports as NonZero -> GatherND, torch.unique as Unique: the error said only that shape
    inference left the size unknown."""
    class Masked(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            y = self.fc(x)
            return y[y > 0].sum()

    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Masked(), (torch.randn(2, 4),), buf, dynamo=False, opset_version=17)
    with pytest.raises(GraphError, match=r"node '/NonZero' \(NonZero\) makes '/NonZero_output_0', whose size "
                                         r"depends on the data \(x\[mask\], .*torch.fx front end"):
        import_onnx(onnx.load_from_string(buf.getvalue()))
    vi = helper.make_tensor_value_info
    proto = _model([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                    helper.make_node("Unique", ["r"], ["u"], name="unique")],
                   [vi("x", TensorProto.FLOAT, [6])], [vi("u", TensorProto.FLOAT, None)], [])
    with pytest.raises(GraphError, match=r"node 'unique' \(Unique\) makes 'u', whose size depends on the data"):
        import_onnx(proto)


class _Reparametrized(nn.Module):
    """A VAE's sampling step: z = mu + eps * std, eps = randn_like(std)."""

    def __init__(self) -> None:
        super().__init__()
        self.enc, self.dec = nn.Linear(8, 8), nn.Linear(4, 8)

    def forward(self, x):
        mu, logvar = self.enc(x).chunk(2, 1)
        std = (0.5 * logvar).exp()
        return self.dec(mu + torch.randn_like(std) * std + torch.rand_like(mu)).sum()


def test_random_like_tensors_are_constants_as_in_the_fx_capture():
    """torch.randn_like / rand_like export as RandomNormalLike / RandomUniformLike, which read only their input's
    shape. They were ops reading it (on the fallback), and in training the gradient flowed through them: a
    backward op randomnormallike_grad that autograd never runs (24 FLOPs and 4 ops more than the fx capture)."""
    model, x = _Reparametrized(), torch.randn(3, 8)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), buf, dynamo=False, opset_version=17)
    proto = onnx.load_from_string(buf.getvalue())
    assert {"RandomNormalLike", "RandomUniformLike"} <= {n.op_type for n in proto.graph.node}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g = import_onnx(proto, mode="training")
    g_fx = capture(model, (x,), name="m", mode="training")
    assert not [op for op in g.ops if op.kind.startswith("random")]
    assert len(g.ops) == len(g_fx.ops) == 20
    assert g.stats.total_flops == g_fx.stats.total_flops


class _Var(nn.Module):
    def forward(self, x):
        return x.var(dim=1)


class _Normalize(nn.Module):
    def forward(self, x):
        return F.normalize(x, dim=-1)


@pytest.mark.parametrize(
    ("module", "opset", "onnx_flops", "fx_flops"),
    [(nn.GELU(), 17, 5 * 320, 320), (nn.GELU(), 20, 320, 320), (nn.GELU("tanh"), 17, 9 * 320, 320),
     (nn.SiLU(), 17, 2 * 320, 320), (nn.Mish(), 17, 3 * 320, 320), (nn.Hardswish(), 13, 2 * 320, 320),
     (nn.Hardswish(), 14, 320, 320), (nn.LayerNorm(16), 16, 7 * 320 + 2 * 20, 5 * 320),
     (nn.LayerNorm(16), 17, 5 * 320, 5 * 320), (nn.GroupNorm(2, 16), 17, 7 * 320, 5 * 320),
     (_Var(), 17, 4 * 320 + 2 * 32, 320), (nn.LPPool1d(2, 2), 17, 2 * 320 + 6 * 160, 320),
     (_Normalize(), 17, 2 * 320 + 20, 3 * 320)],
    ids=["gelu-17", "gelu-20", "gelu-tanh-17", "silu", "mish", "hardswish-13", "hardswish-14", "layernorm-16",
         "layernorm-17", "groupnorm", "var", "lppool", "normalize"],
)
def test_ops_exported_as_several_nodes_cost_node_by_node_as_documented(module, opset, onnx_flops, fx_flops):
    """The module docstring's figures for an op the exporter writes out: x [2, 10, 16] is 320 elements in 20
    rows of the last dimension (GroupNorm: [2, 16, 10], 2 groups; var over dimension 1: 32 results; the pool:
    160 outputs)."""
    x = torch.randn(2, 16, 10) if isinstance(module, nn.GroupNorm) else torch.randn(2, 10, 16)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), (x,), buf, dynamo=False, opset_version=opset)
    assert import_onnx(onnx.load_from_string(buf.getvalue())).metadata["forward_flops"] == onnx_flops
    assert capture(module, (x,), name="m").metadata["forward_flops"] == fx_flops


@pytest.mark.parametrize("mode", ["inference", "training"])
@pytest.mark.parametrize(
    "make",
    [lambda: nn.ConvTranspose2d(2, 3, 3, stride=2), lambda: nn.Sequential(nn.Conv2d(2, 4, 1), nn.PReLU(4)),
     lambda: _LstmOutput()],
    ids=["conv-transpose-bias", "prelu-per-channel", "lstm"],
)
def test_bias_slope_and_saved_states_as_in_the_fx_capture(make, mode):
    """ConvTranspose's bias (+1 per output element), PReLU's per-channel slope (a parameter: [4, 1, 1] as
    exported) and, in training, an LSTM's saved gate activations (in its output bytes) agree with fx."""
    model = make().train(mode == "training")
    x = torch.randn(4, 2, 3) if isinstance(model, _LstmOutput) else torch.randn(1, 2, 4, 4)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), buf, dynamo=False, training=torch.onnx.TrainingMode.PRESERVE)
    g = import_onnx(onnx.load_from_string(buf.getvalue()), mode=mode)
    fx = capture(nn.Sequential(model, _Sum()) if mode == "training" else model, (x,), name="m", mode=mode)
    assert (g.metadata["params"], g.metadata["forward_macs"]) == (fx.metadata["params"], fx.metadata["forward_macs"])
    fwd = [(op.flops, op.output_bytes) for op in g.ops if op.phase == "forward" and op.kind != "input"]
    fx_fwd = [(op.flops, op.output_bytes) for op in fx.ops if op.phase == "forward" and op.kind != "input"]
    assert fwd == fx_fwd[:len(fwd)] and len(fx_fwd) == len(fwd) + (mode == "training")  # fx: and the sum (the loss)


class _LstmOutput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(3, 5)

    def forward(self, x):
        return self.lstm(x)[0]


def test_conv_integer_zero_points_are_no_bias():
    """ConvInteger (x, w, x_zero_point, w_zero_point) has no bias: 2 FLOPs per multiply-add only."""
    nodes = [helper.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["y"], name="conv")]
    inits = [numpy_helper.from_array(np.zeros((3, 2, 3, 3), np.uint8), "w"),
             numpy_helper.from_array(np.array(1, np.uint8), "xz"), numpy_helper.from_array(np.array(2, np.uint8), "wz")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 2, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, None)], inits)
    g = import_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))
    assert g.ops[g.index["conv"]].flops == 2 * (3 * 2 * 2) * (2 * 3 * 3)  # 12 outputs x 18 MACs


@pytest.mark.parametrize("mode", ["inference", "training"])
@pytest.mark.parametrize("opset", [12, 14])
def test_training_batch_norm_running_statistics_are_no_activations(opset, mode):
    """A training export's BatchNormalization also outputs the updated running mean and variance (and before
    opset 14 the saved batch statistics), which nothing reads: its output bytes counted them at opset 14
    (where their shapes are inferred; not at 12), 2 x 8 floats more than fx's batch_norm, and so did the
    backward ops that read the output. Where a graph output is one, it stays."""
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)).train()
    x = torch.randn(2, 3, 4, 4)
    proto = _training_export(model, x, opset)
    (node,) = [n for n in proto.graph.node if n.op_type == "BatchNormalization"]
    assert len(node.output) == (5 if opset < 14 else 3)
    g = import_onnx(proto, mode=mode)
    fx = capture(nn.Sequential(model, _Sum()) if mode == "training" else model, (x,), name="m", mode=mode)
    bn, fx_bn = g.ops[g.index[node.name]], [op for op in fx.ops if op.kind == "batch_norm"][0]
    assert bn.output_bytes == fx_bn.output_bytes == 2 * 8 * 4 * 4 * 4
    assert bn.flops == fx_bn.flops == (4 if mode == "training" else 2) * 2 * 8 * 4 * 4
    if opset >= 14:  # the running mean as a graph output: written, counted
        proto.graph.output.append(helper.make_tensor_value_info(node.output[1], TensorProto.FLOAT, [8]))
        assert import_onnx(proto).ops[g.index[node.name]].output_bytes == 2 * 8 * 4 * 4 * 4 + 8 * 4


def test_gather_at_a_scalar_index_computed_from_the_data_is_an_op_that_reads_it():
    """x[x.argmax()]: a scalar index, but not a constant: an index op reading the element it takes from x and
    the index from argmax (folding it as a view, as x[:, -1] is, would lose the dependency on argmax)."""
    nodes = [helper.make_node("ArgMax", ["x"], ["i"], name="argmax", keepdims=0, axis=0),
             helper.make_node("Gather", ["x", "i"], ["g"], name="pick", axis=0)]
    g = import_onnx(_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6])],
                           [helper.make_tensor_value_info("g", TensorProto.FLOAT, None)], []))
    pick = g.index["pick"]
    assert g.ops[pick].flops == 1 and g.ops[pick].bytes_read == 4 + 8  # one float32 and one int64
    assert sorted((g.ops[e.src].name, e.bytes) for e in g.edges if e.dst == pick) == [("argmax", 8), ("x", 4)]


def test_a_product_of_constants_is_no_weight_and_an_integer_result_passes_no_gradient():
    """Rotary angles, positions [8, 1] @ frequencies [1, 4], are a constant: no op and no parameters (only a
    product with an activation makes its operands weights). In training, argmax's integer result passes no
    gradient back: argmax and its cast get no backward op, and the MatMul only its weight gradient."""
    nodes = [helper.make_node("MatMul", ["pos", "freq"], ["ang"], name="outer"),
             helper.make_node("Cos", ["ang"], ["c"], name="cos"),
             helper.make_node("Mul", ["x", "c"], ["y"], name="rot"),
             helper.make_node("MatMul", ["y", "W"], ["z"], name="proj")]
    inits = [_f32((8, 1), "pos"), _f32((1, 4), "freq"), _f32((4, 3), "W")]
    g = import_onnx(_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 4])],
                           [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)], inits))
    assert [op.name for op in g.ops] == ["x", "rot", "proj"] and g.metadata["params"] == 4 * 3
    nodes = [helper.make_node("MatMul", ["x", "W"], ["a"], name="mm"),
             helper.make_node("ArgMax", ["a"], ["i"], name="argmax", axis=1, keepdims=1),
             helper.make_node("Cast", ["i"], ["f"], name="cast", to=TensorProto.FLOAT),
             helper.make_node("Mul", ["a", "f"], ["y"], name="mul")]
    g = import_onnx(_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                           [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [_f32((4, 3), "W")]),
                    mode="training")
    assert [op.name for op in g.ops if op.phase != "forward"] == ["mul/grad", "mm/grad_weight", "mm/update"]


def _two_batch_norms(modes: tuple[int, int]) -> onnx.ModelProto:
    """x [2, 3, 2, 2] -> BatchNormalization (training_mode modes[0]) -> BatchNormalization (modes[1])."""
    nodes = [helper.make_node("BatchNormalization", ["x", "s1", "b1", "m1", "v1"],
                              ["y1", *(["rm1", "rv1"] if modes[0] else [])], name="bn1", training_mode=modes[0]),
             helper.make_node("BatchNormalization", ["y1", "s2", "b2", "m2", "v2"],
                              ["y2", *(["rm2", "rv2"] if modes[1] else [])], name="bn2", training_mode=modes[1])]
    inits = [_f32((3,), f"{k}{j}") for j in (1, 2) for k in "sbmv"]
    graph = helper.make_graph(nodes, "bn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 2, 2])],
                              [helper.make_tensor_value_info("y2", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])


class _TwoBatchNorms(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bn1, self.bn2 = nn.BatchNorm2d(3), nn.BatchNorm2d(3)

    def forward(self, x):
        return self.bn2(self.bn1(x)).sum()


def test_a_frozen_batch_norm_in_a_training_export_costs_as_in_inference():
    """A training export whose BatchNorms compute batch statistics (training_mode=1) and one reads its running
    statistics (training_mode=0: the user's frozen BatchNorm, in eval() under a model in train()): the frozen
    one costs 2 FLOPs per element in a training step, as in the fx capture (it cost 4, the attribute ignored).
    An export whose BatchNorms are all in inference mode is trained as a whole (4 each), as fx trains a model
    in eval(); an inference graph costs 2 each."""
    def flops(modes, mode):
        g = import_onnx(_two_batch_norms(modes), mode=mode)
        return [g.ops[g.index[n]].flops for n in ("bn1", "bn2")]

    assert flops((1, 0), "training") == [4 * 24, 2 * 24]
    assert flops((0, 1), "training") == [2 * 24, 4 * 24]
    assert flops((0, 0), "training") == flops((1, 1), "training") == [4 * 24, 4 * 24]
    assert flops((1, 0), "inference") == flops((0, 0), "inference") == [2 * 24, 2 * 24]
    model = _TwoBatchNorms().train()
    model.bn2.eval()
    fx = capture(model, (torch.randn(2, 3, 2, 2),), name="m", mode="training")
    assert [op.flops for op in fx.ops if op.kind == "batch_norm" and op.phase == "forward"] == [4 * 24, 2 * 24]


def _two_dropouts(modes: tuple[bool | None, bool | None], opset: int = 17) -> onnx.ModelProto:
    """x [2, 3] -> Dropout -> Dropout, each with training_mode a Constant of modes[k] (None: not given)."""
    nodes, inits = [], [numpy_helper.from_array(np.array(0.5, np.float32), "ratio")]
    for k, m in enumerate(modes):
        ins = [["x", "d0"][k], "ratio"]
        if m is not None:
            nodes.append(helper.make_node("Constant", [], [f"t{k}"], value=numpy_helper.from_array(np.array(m))))
            ins.append(f"t{k}")
        nodes.append(helper.make_node("Dropout", ins, [f"d{k}"], name=f"drop{k}"))
    nodes.append(helper.make_node("MatMul", ["d1", "W"], ["y"], name="mm"))
    graph = helper.make_graph(nodes, "drop", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [*inits, _f32((3, 4), "W")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


class _Dropouts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 4, bias=False)

    def forward(self, x):
        return self.fc(F.dropout(F.dropout(x, 0.5, training=True), 0.5, training=False)).sum()


def test_a_dropout_in_inference_mode_in_a_training_export_is_folded():
    """In a training step a Dropout whose training_mode is false (or not given) in a model whose other Dropouts
    drop (a training export) is an identity, folded as fx folds F.dropout(x, p, training=False) in training;
    it was an op of 1 FLOP per element keeping its mask. An export whose Dropouts are all in inference mode is
    trained as a whole, as fx trains a model in eval()."""
    def drops(modes):
        return [op.name for op in import_onnx(_two_dropouts(modes), mode="training").ops if op.kind == "dropout"]

    assert drops((True, False)) == drops((True, None)) == ["drop0"]
    assert drops((False, True)) == ["drop1"]
    assert drops((False, None)) == drops((None, None)) == drops((True, True)) == ["drop0", "drop1"]
    assert not [op for op in import_onnx(_two_dropouts((True, False))).ops if op.kind == "dropout"]
    fx = capture(_Dropouts().train(), (torch.randn(2, 3),), name="m", mode="training")
    assert len([op for op in fx.ops if op.kind == "dropout"]) == 1
