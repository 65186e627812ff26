"""Capture an ONNX model into an `OpGraph`: `onnx.load`, `onnx.shape_inference`, then the shared IR.

* Graph inputs that are not initializers become ops of kind "input"; they must be tensors. Every dimension
  must be known after shape inference; pass `input_shapes={"input": [1, 3, 224, 224]}` to fix symbolic
  (dynamic) dimensions, or to give the shape of an input declared without one (a dimension the model fixes
  takes another size only where its recorded shapes agree; the error names the ones changed, and a warning
  where they agree: the ops may still be built for the size the model fixes, as an unrolled loop). Shapes
  computed from them (`x.view(x.size(0), -1)`: Shape -> Gather -> Unsqueeze -> Concat -> Reshape; split
  sizes as the TorchScript exporter's aten::chunk computes them: Shape -> Gather -> Div -> Expand -> Concat
  -> Split; F.pad's pads: ConstantOfShape -> Concat -> Reshape -> Slice -> Transpose -> Reshape -> Cast ->
  Pad) and from a weight's (nn.MultiheadAttention's in_proj_weight.size(0) // 3, exported without constant
  folding), and Resize's scales (F.interpolate's scale_factor so exported: a Concat of Constants) are
  evaluated where ONNX's inference stops (it does at opsets 13-16, and for the Split, the Pad and the
  Resize at every opset); a shape that depends on data (NonZero, Compress, Unique, NonMaxSuppression: x[mask],
  masked_select, torch.unique) is an error saying so.
* ONNX does not mark which initializers are trained (a PyTorch model's buffers are initializers too), so a
  float initializer of more than one element is a parameter (`param_bytes` of the node that reads it, or a
  "variable" op when several nodes share one, see `suite.capture.ir`) where a layer reads it as weights: at a
  weight input (Conv's, ConvTranspose's and DeformConv's weight and bias, Gemm's B and C, an operand of a
  MatMul or Einsum with an activation, an RNN's W, R and B, a norm's scale and bias, Gather's data: an
  embedding table, PRelu's slope), directly or through nodes that read no activation (a transpose, a cast,
  weight normalization); or a vector (one dimension over 1) that an Add, Mul or Concat reads with an
  activation, directly or through shape-only nodes and casts: a bias or scale written out (a Linear's bias
  after its MatMul, LayerNorm before opset 17, an RMSNorm's weight, a layer scale, a class token). Other float
  initializers are buffers, constants as in the torch.fx capture: a causal mask, a position or rotary table
  (or one the exporter folded from them), BatchNormalization's running statistics, Resize's (and Upsample's)
  roi and scales, LSTM / GRU / RNN initial states. Hence a learned tensor of more than one dimension that only
  elementwise ops read is taken for a buffer (ViT's position embedding, added to the patches), and a buffer
  read as weights (a rotary table a Gather indexes by position ids, a fixed matrix multiplied with an
  activation) for a parameter. A quantized model's integer weights (those DequantizeLinear, QLinearConv,
  QLinearMatMul, ConvInteger and MatMulInteger read) are frozen parameters: resident, not trained, as are the
  scales and zero points these ops and QuantizeLinear read. Other integer and scalar initializers are
  constants. Constant nodes holding weights by the same rule (some exporters write them so) are frozen
  parameters; other Constant nodes are constants (a recurrent cell's zero initial state, Gemm's A, an
  attention mask), as are the ones and zeros the PyTorch exporter writes as the scale and bias of a norm that
  has none (nn.InstanceNorm2d by default, nn.GroupNorm's inner InstanceNormalization,
  `elementwise_affine=False`, `affine=False`). An export with constant folding may merge parameters (a
  BatchNorm into the convolution before it, as the exporter does in eval mode) or copy them (a tied embedding
  transposed for the output layer is stored twice), and the import counts what the file holds.
  An initializer is counted once however many nodes read it; nodes computing from weights alone (W[3:7] * 2,
  weight normalization) are per-step ops as in the torch.fx capture, though ONNX Runtime folds them for
  inference (a Slice is folded, a Gather of rows is a lookup of 0 FLOPs).
* Weights stored as external data (every model over 2 GB is) are not read: their sizes are in the model.
  Sparse initializers are refused, naming one.
  Tensors of 4-bit and 2-bit types (int4 weights and activations) take half and a quarter of a byte an element.
  The data of small tensors (a Reshape's shape) is read from the model file's folder; one missing is an error.
* Gather reads from its data input the part it takes (at most its output's bytes: one time step of a
  sequence, not all of it), as the torch.fx capture's folded indexing does. On an activation, as in the
  torch.fx capture: with a constant scalar index (`x[:, -1]`, a select) it is folded, a view; with an index
  tensor (`x.index_select(1, idx)`) it is an op of 1 FLOP per output element (data movement). A lookup in a
  weight table (an embedding) is an op of 0 FLOPs.
* Model-local functions (modules exported as functions: `export_modules_as_functions`) are inlined, their
  nodes in the scope of the module that calls them.
* Control flow (If, Loop, Scan: a node with a subgraph) is refused, naming the node, but for an If whose
  condition is computed from shapes and constants alone (the TorchScript exporter's nn.LocalResponseNorm tests
  the rank so), which is replaced by the branch it takes; so are sequences, except
  a SplitToSequence read only by SequenceAt at known positions (torch.tensor_split), which is a Split; so is
  an op of another domain that shape inference cannot type (onnxruntime's contrib ops).
* An output that nothing reads and whose shape inference leaves unknown (Dropout's mask before opset 10) is
  as omitted, and so are a training BatchNormalization's running (and before opset 14 saved) statistics that
  nothing reads: buffer updates, not activations, as in the torch.fx capture.
* Shape-only nodes (Reshape, Flatten, Squeeze, Unsqueeze, Transpose, Identity, Split, Slice, Expand, and
  Dropout in inference, or in inference mode in a training export: see BatchNormalization below) are folded
  into their producers, their readers reading the part they take (a Slice or a Split's piece: its bytes),
  as the torch.fx capture folds x[:, 1:4], chunk and split: the TorchScript
  exporter writes x.chunk(4, 1) as four Slices from opset 11 on, a Split before. Shape/Size outputs,
  anything computed only from constants and random tensors in the shape of another (RandomNormalLike:
  torch.randn_like, a constant in the fx capture too) are constants.
* FLOPs follow the conventions of `suite.capture.flops`: Conv / ConvTranspose / Gemm / MatMul / Einsum and
  the quantized ConvInteger / QLinearConv / MatMulInteger / QLinearMatMul (2 per multiply-add, +1 per output
  element for a bias), DeformConv (opset 19) as Conv plus the bilinear sampling of its input (N x C x kernel
  elements x output positions samples, 7 FLOPs each as GridSample, 1 more with a mask), Attention (opset 23) as scaled_dot_product_attention (its two products and softmax;
  past keys count), elementwise ops and data movement (Pad, Tile, Trilu, DepthToSpace, OneHot, as the fx
  capture's pad, tile, tril, pixel_shuffle, one_hot) 1 per output element, pooling output elements x kernel,
  global pooling and reductions 1 per input element, Resize / Upsample / GridSample as F.interpolate and
  F.grid_sample (2 n - 1 per output element for n neighbours: linear 2 and cubic 4 per spatial dimension,
  the dimensions after N and C or those `axes` names), LRN size + 5 per element, BatchNormalization 2
  (inference) or 4 (training; but 2 for one in inference mode, training_mode=0, in a model whose other
  BatchNormalizations compute batch statistics: a frozen BatchNorm, as fx keeps one in eval()) per element,
  LayerNormalization, InstanceNormalization and GroupNormalization 5 (statistics of the input), RMSNormalization 3 (as rms_norm), Softmax/LogSoftmax 5, LSTM / GRU / RNN the cell formulas of the fused torch
  layers (per step and direction), SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss as cross-entropy
  and NLL loss (the former saving its log-probabilities in training), TopK as topk (k = n:
  a sort, as torch.sort exports), CumSum 1 per element, ScatterElements / ScatterND with a reduction 1 per update (as
  scatter_add), without one and GatherElements / GatherND 1 per output element (data movement, as scatter
  and gather). Other op types count 1 per output element, are listed in metadata "fallback_cost_kinds" and
  are named in a warning.
  An op the exporter writes out as several nodes is costed node by node, so its FLOPs exceed the torch.fx
  capture's rule for the fused call (MACs are unaffected): GELU before opset 20 (Div, Erf, Add, Mul, Mul) 5 per
  element, its tanh approximation 9, where fx counts 1; SiLU (Sigmoid, Mul) 2 and Mish (Softplus, Tanh, Mul) 3,
  against 1; HardSwish before opset 14 2; LayerNorm before opset 17 (two ReduceMeans, Sub, Pow, Div, Mul, Add)
  7 per element and 2 per row, against 5; GroupNorm (InstanceNormalization of the groups, then Mul and Add) 7,
  against 5; torch.var (ReduceMean, Sub, Mul, ReduceMean, Mul, Div) 4 per input element and 2 per result,
  against 1 per input element; nn.LPPool1d/2d (Pow, AveragePool, then six nodes on the pooled result) about 5
  times fx's; F.normalize (ReduceL2, Clip, Div) 2 per element and 1 per norm, fewer than fx's 3;
  nn.LocalResponseNorm (Mul, Pad, AveragePool, Mul, Add, Pow, Div) about size + 5 per element plus the padded
  channels (9.25 for size 3 on 8 channels), against size + 5 (a native LRN node counts size + 5).
* Kinds are the ONNX op types in lower case ("conv", "gemm", "matmul", "relu"). Op names are the node
  names (made unique); the scope is derived from names of the form "/layer1/layer1.0/conv1/Conv" (as the
  PyTorch exporter writes them): the module path they spell ("layer1.0.conv1"), as the torch.fx capture's.
* `mode="training"` adds backward and update ops for the loss: the graph output named by `loss`, else every
  output (their sum, as a model with an auxiliary head, Inception-V3's, is trained). Forward ops that reach
  no loss output get no backward ops. Metadata "loss_outputs" names the outputs taken as the loss. An
  output need not be a scalar: an exported model rarely includes its loss, so a tensor output stands for
  the sum of its elements (the torch.fx capture, which can wrap the model, asks for the scalar loss).
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from suite.capture import CAPTURE_VERSION
from suite.capture.flops import (
    BATCH_NORM_FLOPS_PER_ELEMENT,
    LAYER_NORM_FLOPS_PER_ELEMENT,
    RMS_NORM_FLOPS_PER_ELEMENT,
    SOFTMAX_FLOPS_PER_ELEMENT,
    Cost,
    TensorInfo,
    attention_cost,
    cross_entropy_cost,
    einsum_cost,
    loss_samples,
    rnn_cell_flops,
    sort_cost,
)
from suite.capture.ir import MODES, ForwardBuilder, Value, _caller_level
from suite.errors import GraphError
from suite.graph import OpGraph

SHAPE_ONLY = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Identity", "Split", "Slice",
                        "Expand"})
CONSTANT_OUTPUT = frozenset({"Shape", "Size", "Constant", "ConstantOfShape", "Range", "EyeLike", "RandomNormal",
                             "RandomUniform", "RandomNormalLike", "RandomUniformLike"})  # read no data (*Like: a shape)
ELEMENTWISE = frozenset(
    """Add Sub Mul Div Pow Sqrt Exp Log Neg Abs Reciprocal Relu Sigmoid Tanh Erf Gelu LeakyRelu Elu Selu Softplus
    Softsign HardSigmoid HardSwish Clip Max Min Where Cast Not And Or Equal Less Greater LessOrEqual GreaterOrEqual
    Sin Cos Floor Ceil Round Sign Mish PRelu Mod Sum Mean QuantizeLinear DequantizeLinear Tan Asin Acos Atan Sinh
    Cosh Asinh Acosh Atanh IsNaN IsInf Xor CastLike Celu ThresholdedRelu Shrink
    Pad Tile Trilu DepthToSpace SpaceToDepth OneHot""".split()
)  # the last: data movement, 1 per output element by design as in the fx capture (pad, tile, tril, pixel_shuffle)
SLICING = frozenset({"Gather"})  # ops whose data input (input 0) they read only in part: their output
# float inputs that are not parameters, by op type: running statistics, Resize's roi and scales, the initial
# states of recurrent layers (zeros the dynamo exporter writes as an initializer)
NOT_PARAMETERS = {"BatchNormalization": (3, 4), "Resize": (1, 2), "Upsample": (1,), "LSTM": (5, 6), "GRU": (5,),
                  "RNN": (5,)}
# inputs that hold a quantized model's integer weights (and QLinearConv's int32 bias), by op type
QUANTIZED_WEIGHTS = {"DequantizeLinear": (0,), "QLinearConv": (3, 8), "QLinearMatMul": (0, 3), "ConvInteger": (1,),
                     "MatMulInteger": (0, 1)}
# their scales and zero points
QUANTIZATION_SCALES = {"QuantizeLinear": (1, 2), "DequantizeLinear": (1, 2), "QLinearConv": (1, 2, 4, 5, 6, 7),
                       "QLinearMatMul": (1, 2, 4, 5, 6, 7), "ConvInteger": (2, 3), "MatMulInteger": (2, 3)}
# inputs that hold weights, by op type: a float initializer or Constant read there is a parameter. Not Gemm's
# A: a recurrent cell's zero initial state is read there (Gemm(h0, W_hh))
WEIGHT_INPUTS = {"Conv": (1, 2), "ConvTranspose": (1, 2), "DeformConv": (1, 3), "Gemm": (1, 2),
                 "LSTM": (1, 2, 3), "GRU": (1, 2, 3), "RNN": (1, 2, 3),
                 "BatchNormalization": (1, 2), "LayerNormalization": (1, 2), "InstanceNormalization": (1, 2),
                 "GroupNormalization": (1, 2), "RMSNormalization": (1,), "Gather": (0,), "PRelu": (1,)}
PRODUCTS = frozenset({"MatMul", "Einsum"})  # any operand a weight, where another is an activation
# ops that read a bias or a scale written out (a Linear's bias after its MatMul, LayerNorm before opset 17, an
# RMSNorm's weight, a layer scale, a class token): a vector read there is a parameter
AFFINE_OPS = frozenset({"Add", "Mul", "Concat"})
NORMS = frozenset({"BatchNormalization", "LayerNormalization", "InstanceNormalization", "GroupNormalization",
                   "RMSNormalization"})  # input 1: the scale, 2: the bias
RNN_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
REDUCE = frozenset({"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2", "ReduceL1",
                    "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp", "ArgMax", "ArgMin"})


def _itemsize(elem_type: int) -> int:
    from onnx import helper

    return int(helper.tensor_dtype_to_np_dtype(elem_type).itemsize)


def _bits(elem_type: int) -> int | None:
    """Bits of an element of the 4-bit and 2-bit types (int4 weights and activations), which pack 2 or 4
    elements a byte where numpy's ml_dtypes types take 1 byte each; None for the others."""
    from onnx import TensorProto

    return {getattr(TensorProto, t, None): b for t, b in (("INT4", 4), ("UINT4", 4), ("FLOAT4E2M1", 4), ("INT2", 2),
                                                          ("UINT2", 2))}.get(elem_type)


@dataclass(frozen=True)
class _PackedInfo(TensorInfo):
    """A tensor of a 4-bit or 2-bit type: its bytes packed (16 int4 elements: 8 bytes, weights or activations)."""

    bits: int = 8

    @property
    def nbytes(self) -> int:
        return -(-self.numel * self.bits // 8)


def _tensor_info(shape: tuple[int, ...], elem_type: int) -> TensorInfo:
    """The TensorInfo of a tensor of ONNX element type `elem_type`, packed where the type is."""
    bits = _bits(elem_type)
    if bits:
        return _PackedInfo(shape, _itemsize(elem_type), _is_float(elem_type), bits)
    return TensorInfo(shape, _itemsize(elem_type), _is_float(elem_type))


def _is_float(elem_type: int) -> bool:
    """A floating-point (or complex) element type, as the fx front end's `is_floating_point() or is_complex()`:
    also bfloat16 and the float8 types, which numpy knows only as ml_dtypes' kind "V" types."""
    from onnx import helper

    dtype = helper.tensor_dtype_to_np_dtype(elem_type)
    return dtype.kind in "fc" or dtype.name.startswith(("bfloat", "float"))


def _load(model: Any) -> Any:
    import onnx

    if isinstance(model, onnx.ModelProto):
        proto, where = model, f"ONNX model {model.graph.name!r}"
    elif isinstance(model, str | Path):
        path = Path(model)
        if not path.exists():
            raise GraphError(f"{path}: no such ONNX file")
        try:  # weights in external data files are not read (their sizes are in the model); see _read_small_data
            proto, where = onnx.load(str(path), load_external_data=False), str(path)
        except OSError as exc:  # a directory, no permission: the reason, not "[Errno 21] ... 'path'"
            raise GraphError(f"{path}: cannot read the ONNX file: {exc.strerror or exc}") from None
        except Exception as exc:  # noqa: BLE001 - protobuf decode errors have many types
            raise GraphError(f"{path}: not a readable ONNX model: {exc}") from None
    else:
        raise GraphError(f"import_onnx needs a path or an onnx.ModelProto, got {type(model).__name__}")
    if not proto.HasField("graph") or not proto.graph.node:
        raise GraphError(f"{where}: not an ONNX model with a graph (no nodes; an empty or truncated file?)")
    if proto.graph.sparse_initializer:  # ONNX's shape inference reads them as rank 0: a misleading error
        sparse = proto.graph.sparse_initializer[0]
        raise GraphError(f"{where}: initializer {(sparse.values.name or '?')!r} is sparse (graph.sparse_initializer): "
                         f"sparse initializers are not supported; store it dense")
    if isinstance(model, str | Path):
        _read_small_data(proto, Path(model).parent, where)
    return proto


def _read_small_data(proto: Any, folder: Path, where: str) -> None:
    """Read the external data of the small initializers (shapes a Reshape takes, scales), from the model's
    folder, as `onnx.load` would; the weights' data is never read, so a model of any size imports."""
    from onnx import TensorProto, external_data_helper

    for init in proto.graph.initializer:
        if init.data_location == TensorProto.EXTERNAL and math.prod(init.dims) <= SHAPE_DATA_LIMIT:
            location = next((e.value for e in init.external_data if e.key == "location"), "?")
            try:
                external_data_helper.load_external_data_for_tensor(init, str(folder))
            except Exception as exc:  # noqa: BLE001 - a missing file, a path outside the folder, a short file
                raise GraphError(f"{where}: cannot read the data of initializer {init.name!r} from {location!r} "
                                 f"(external data, in the model's folder {folder}): {exc}") from None


def _drop_weight_data(graph: Any) -> None:
    """Clear the data of the initializers too large to be shape computations: the import needs only their
    type and shape, and ONNX's shape inference serializes the model, which fails beyond 2 GB of data."""
    from onnx import TensorProto

    for init in graph.initializer:
        if math.prod(init.dims) > SHAPE_DATA_LIMIT:
            for f in ("raw_data", "float_data", "int32_data", "string_data", "int64_data", "double_data",
                      "uint64_data", "external_data"):
                init.ClearField(f)
            init.data_location = TensorProto.DEFAULT


def _fix_inputs(model: Any, input_shapes: Mapping[str, Sequence[int]], where: str) -> list[str]:
    """Set the shapes input_shapes gives and check that every input's is known; returns the dimensions given
    that the model fixes to another size ("dimension 0 of 'x' (6 in the model, 7 given)")."""
    changed = []
    inits = {i.name for i in model.graph.initializer}
    known = [i.name for i in model.graph.input if i.name not in inits]
    for name in input_shapes:
        if name not in known:
            raise GraphError(f"{where}: input_shapes names {name!r}, which is not a model input ({', '.join(known)})")
    for inp in model.graph.input:
        if inp.name in inits:
            continue
        kind = inp.type.WhichOneof("value")
        if kind != "tensor_type" or not inp.type.tensor_type.elem_type:
            what = f"a {kind.removesuffix('_type')}" if kind and kind != "tensor_type" else "an untyped"
            raise GraphError(f"{where}: input {inp.name!r} is {what} value, not a tensor of known element type: "
                             f"only tensor inputs are supported")
        tensor = inp.type.tensor_type
        if inp.name in input_shapes:
            shape = list(input_shapes[inp.name])  # numpy's integers too (a shape computed with numpy)
            if not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) and v > 0 for v in shape):
                raise GraphError(f"{where}: input_shapes[{inp.name!r}] = {shape} must be a list of positive integers")
            shape = [int(v) for v in shape]
            if not tensor.HasField("shape"):  # rank unknown: input_shapes gives it
                tensor.shape.SetInParent()
                for _ in shape:
                    tensor.shape.dim.add()
            if len(shape) != len(tensor.shape.dim):
                raise GraphError(f"{where}: input {inp.name!r} has rank {len(tensor.shape.dim)}, input_shapes gives {shape}")
            for k, (d, v) in enumerate(zip(tensor.shape.dim, shape, strict=True)):
                if d.HasField("dim_value") and d.dim_value > 0 and d.dim_value != v:
                    changed.append(f"dimension {k} of {inp.name!r} ({d.dim_value} in the model, {v} given)")
                d.Clear()
                d.dim_value = int(v)
        elif not tensor.HasField("shape"):
            raise GraphError(f"{where}: input {inp.name!r} has no shape (its rank is unknown); "
                             f"pass input_shapes={{{inp.name!r}: [...]}}")
        dims = tensor.shape.dim
        bad = [d.dim_param or "?" for d in dims if not d.HasField("dim_value") or d.dim_value <= 0]
        if bad:
            raise GraphError(
                f"{where}: input {inp.name!r} has unknown dimension(s) {bad}; pass input_shapes={{{inp.name!r}: [...]}}"
            )
    return changed


def _subgraph_nodes(graph: Any) -> list[tuple[int, Any, Any]]:
    """(index, node, attribute) of each node with a graph attribute (If, Loop, Scan: control flow)."""
    from onnx import AttributeProto

    return [(i, node, a) for i, node in enumerate(graph.node) for a in node.attribute
            if a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS)]


def _refuse_subgraphs(graph: Any, where: str) -> None:
    """Control flow (If, Loop, Scan: nodes with a graph attribute) is refused: its body's ops, the parameters
    it uses and the outer values it reads are not inputs of the node, so they would be lost."""
    for i, node, a in _subgraph_nodes(graph)[:1]:
        raise GraphError(
            f"{where}: node {node.name or i!r} ({node.op_type}) has a subgraph (attribute {a.name!r}): control "
            f"flow is not supported; export the model with it unrolled or resolved (tracing with fixed inputs)"
        )


def _inline_functions(proto: Any, where: str) -> Any:
    """The model with its local functions inlined (modules exported as functions: torch.onnx.export's
    export_modules_as_functions), each call's nodes named in the call's module path, "/classifier/classifier.1/
    Linear" -> "/classifier/classifier.1/Gemm", so that their scope is the module's."""
    import onnx.inliner
    from onnx import FunctionProto

    if not proto.functions:
        return proto
    functions = {(f.domain, f.name, f.overload): f for f in proto.functions}
    for k, node in enumerate(proto.graph.node):
        function = functions.get((node.domain, node.op_type, node.overload))
        if function is None:
            continue
        call = FunctionProto()  # one copy a call, its nodes named after it
        call.CopyFrom(function)
        call.name = f"{function.name}__call{k}"
        path = node.name.rsplit("/", 1)[0] if "/" in node.name else ""
        for n in call.node:
            n.name = f"{path}/{n.name.rsplit('/', 1)[-1] or n.op_type}"
        node.op_type = call.name
        proto.functions.append(call)
    try:
        return onnx.inliner.inline_local_functions(proto)
    except Exception as exc:  # noqa: BLE001
        raise GraphError(f"{where}: cannot inline the model's local functions: {str(exc).strip()}") from None


def _infer_shapes(proto: Any, where: str, changed: Sequence[str] = (), given: Sequence[str] = ()) -> Any:
    """ONNX's shape inference; `changed`: the fixed dimensions input_shapes changes, `given`: the inputs it
    sizes, named in the error."""
    import onnx

    try:
        return onnx.shape_inference.infer_shapes(proto, strict_mode=True, data_prop=True)
    except Exception as exc:  # noqa: BLE001
        if changed:
            hint = (f"; input_shapes changed {', '.join(changed)}: the model's own shapes may be built on the size "
                    f"it was exported with; export it with that dimension dynamic")
        elif given:
            hint = (f"; input_shapes sized {', '.join(map(repr, given))}: the model may fix sizes of its own (a "
                    f"position table as long as the example it was exported with), which these must match")
        else:
            hint = ""
        raise GraphError(f"{where}: ONNX shape inference failed: {str(exc).strip()}{hint}") from None


def _known_tensors(graph: Any) -> dict[str, TensorInfo]:
    """The graph's inputs, values and outputs whose type and every dimension shape inference knows."""
    infos = {}
    for vi in [*graph.input, *graph.value_info, *graph.output]:
        t = vi.type.tensor_type
        if t.elem_type and t.HasField("shape") and all(d.HasField("dim_value") for d in t.shape.dim):
            infos[vi.name] = _tensor_info(tuple(int(d.dim_value) for d in t.shape.dim), t.elem_type)
    return infos


def _unknown_shapes(proto: Any) -> bool:
    known = _known_tensors(proto.graph)
    return any(o and o not in known for n in proto.graph.node for o in n.output)


SHAPE_DATA_LIMIT = 1024  # elements: shape computations are small; weights are not evaluated
SHAPE_DATA_OPS = frozenset(
    """Constant ConstantOfShape Identity Cast Gather Unsqueeze Squeeze Concat Slice Reshape Add Sub Mul Div Mod Neg
    Abs Floor Ceil Max Min Equal Less Greater Not Where ReduceProd ReduceSum Expand Tile Transpose""".split()
)


def _opset(proto: Any) -> int:
    """The model's version of the standard ONNX domain."""
    return next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 1)


def _small_initializers(graph: Any) -> dict[str, Any]:
    """The values (numpy arrays) of the initializers small enough to be shape data and stored in the model."""
    from onnx import TensorProto, numpy_helper

    return {i.name: numpy_helper.to_array(i) for i in graph.initializer
            if math.prod(i.dims) <= SHAPE_DATA_LIMIT and i.data_location != TensorProto.EXTERNAL}


def _result_numel(node: Any, values: Mapping[str, Any]) -> int:
    """Elements of the result of the shape-data ops that can make a large tensor from small inputs (0 for others)."""
    import numpy as np

    if node.op_type == "ConstantOfShape":
        return math.prod(values[node.input[0]].tolist())
    if node.op_type == "Expand":
        return math.prod(np.broadcast_shapes(values[node.input[0]].shape, tuple(values[node.input[1]].tolist())))
    if node.op_type == "Tile":
        return values[node.input[0]].size * math.prod(values[node.input[1]].tolist())
    return 0


def _fold_shape_data(proto: Any) -> bool:
    """Evaluate the integer tensors computed from shapes and constants alone, and Resize's scales, into
    initializers (the nodes removed: the import takes their outputs as constants anyway), so that a new shape
    inference reads them.
    ONNX's own data propagation stops early in older opsets: `x.view(x.size(0), -1)` exported with a dynamic
    batch at opset 13 (Shape -> Gather -> Unsqueeze -> Concat -> Reshape) leaves the Reshape's output unknown
    even once the batch is fixed. Returns whether it folded anything."""
    import numpy as np
    from onnx import helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    graph = proto.graph
    shapes = {i.name: tuple(i.dims) for i in graph.initializer}  # a weight's too (in_proj_weight.size(0))
    shapes.update((name, info.shape) for name, info in _known_tensors(graph).items())
    opset = _opset(proto)
    outputs = {o.name for o in graph.output}
    # float sizes: Resize's and Upsample's roi and scales (F.interpolate's scale_factor, a Concat of Constants
    # when exported without constant folding), which ONNX's inference reads only from a constant
    scales = {n.input[k] for n in graph.node if n.op_type in ("Resize", "Upsample")
              for k in NOT_PARAMETERS[n.op_type] if len(n.input) > k}
    values: dict[str, Any] = {"": None}  # "" = an omitted optional input
    values.update(_small_initializers(graph))
    folded = []  # indices of the nodes evaluated
    branches = {}  # If node's index -> the branch its condition, computed from shapes and constants alone, takes
    for k, node in enumerate(graph.node):
        if (node.op_type == "If" and node.domain in ("", "ai.onnx") and node.input[0] in values
                and np.asarray(values[node.input[0]]).size == 1):
            branches[k] = _attr(node, "then_branch" if bool(values[node.input[0]]) else "else_branch")
            continue
        try:
            if node.op_type in ("Shape", "Size") and node.input[0] in shapes:
                shape = shapes[node.input[0]]
                if node.op_type == "Size":
                    results = [np.array(math.prod(shape), dtype=np.int64)]
                else:
                    results = [np.array(shape[_attr(node, "start", 0):_attr(node, "end", None)], dtype=np.int64)]
            elif node.domain in ("", "ai.onnx") and node.op_type in SHAPE_DATA_OPS and all(x in values for x in node.input):
                if _result_numel(node, values) > SHAPE_DATA_LIMIT:
                    continue
                feeds = {x: values[x] for x in node.input if x}
                inputs = [helper.make_tensor_value_info(x, helper.np_dtype_to_tensor_dtype(v.dtype), None)
                          for x, v in feeds.items()]
                out_infos = [helper.make_empty_tensor_value_info(o) for o in node.output if o]
                model = helper.make_model(helper.make_graph([node], "fold", inputs, out_infos),
                                          opset_imports=[helper.make_opsetid("", opset)])
                results = ReferenceEvaluator(model).run(None, feeds)
            else:
                continue
        except Exception:  # noqa: BLE001 - what the reference evaluator cannot run is left to shape inference
            continue
        names = [o for o in node.output if o]
        for o, r in zip(names, results, strict=False):
            if np.asarray(r).size <= SHAPE_DATA_LIMIT:
                values[o] = np.asarray(r)
        if all(o in values and (values[o].dtype.kind in "iu" or o in scales) and o not in outputs for o in names):
            folded.append(k)
    for k in folded:
        graph.initializer.extend(numpy_helper.from_array(values[o], o) for o in graph.node[k].output if o)
    if folded or branches:  # the folded nodes removed; each If replaced by its branch's nodes, in its place,
        # and Identities to its outputs
        nodes = []
        for k, node in enumerate(graph.node):
            if k not in branches:
                if k not in folded:
                    nodes.append(node)
                continue
            branch = branches[k]
            graph.initializer.extend(branch.initializer)
            for n in branch.node:
                nodes.append(n)
                n.name = n.name or f"{node.name.rpartition('/')[0]}/{n.op_type}"  # in the If's module
            nodes.extend(helper.make_node("Identity", [b.name], [o], name=f"{node.name}/Identity_{j}")
                         for j, (b, o) in enumerate(zip(branch.output, node.output, strict=True)) if o)
        new = [type(n)() for n in nodes]  # copies: the old list is cleared below
        for c, n in zip(new, nodes, strict=True):
            c.CopyFrom(n)
        del graph.node[:]
        graph.node.extend(new)
    return bool(folded or branches)


def _split_sequences(proto: Any) -> bool:
    """A SplitToSequence read only by SequenceAt at known positions (torch.tensor_split; torch.split with sizes
    computed from a shape) is a Split whose outputs the SequenceAt take: rewritten so (SequenceAt as Identity)
    once its split sizes are known, a list or one size (`_fold_shape_data` evaluates them). Returns whether it
    rewrote one."""
    import numpy as np
    from onnx import helper, numpy_helper

    graph = proto.graph
    opset = _opset(proto)
    shapes = {name: info.shape for name, info in _known_tensors(graph).items()}
    known = _small_initializers(graph)
    readers: dict[str, list[Any]] = {}
    for n in graph.node:
        for x in n.input:
            readers.setdefault(x, []).append(n)
    outputs = {o.name for o in graph.output}
    changed = False
    for k, node in enumerate(graph.node):
        seq = node.output[0] if node.op_type == "SplitToSequence" and node.domain in ("", "ai.onnx") else None
        reads = readers.get(seq, [])
        if seq is None or seq in outputs or not reads or len(node.input) < 2 or node.input[1] not in known or any(
                r.op_type != "SequenceAt" or r.input[0] != seq or r.input[1] not in known for r in reads):
            continue
        split, axis = known[node.input[1]], _attr(node, "axis", 0)
        if split.ndim == 0:  # one size: pieces of it, the last one shorter
            if node.input[0] not in shapes or int(split) <= 0:
                continue
            dim = shapes[node.input[0]][axis]
            split = np.array([int(split)] * (dim // int(split)) + ([dim % int(split)] if dim % int(split) else []))
        pieces = [f"{seq}_{j}" for j in range(len(split))]
        sizes = [int(v) for v in split]
        if any(not -len(pieces) <= int(known[r.input[1]]) < len(pieces) for r in reads):
            continue  # a position past the end: an invalid model, left to fail as a sequence
        if opset >= 13:
            graph.initializer.append(numpy_helper.from_array(np.array(sizes, np.int64), f"{seq}_sizes"))
            new = helper.make_node("Split", [node.input[0], f"{seq}_sizes"], pieces, name=node.name, axis=axis)
        else:
            new = helper.make_node("Split", [node.input[0]], pieces, name=node.name, axis=axis, split=sizes)
        graph.node[k].CopyFrom(new)
        for r in reads:
            r.CopyFrom(helper.make_node("Identity", [pieces[int(known[r.input[1]]) % len(pieces)]], list(r.output),
                                        name=r.name))
        changed = True
    return changed


def _weight_values(graph: Any) -> tuple[set[str], set[str]]:
    """The values read as weights (at WEIGHT_INPUTS, or by a product with an activation), with what they are
    computed from by nodes that read no activation (W -> Transpose, a cast, weight normalization, a fake
    quantization); and the values that an op of AFFINE_OPS reads with an activation, with what they are made
    from by shape-only nodes and casts (a class token's Expand). Activations: the graph inputs and what is
    computed from them, but for their shapes."""
    inits = {i.name for i in graph.initializer}
    activations = {i.name for i in graph.input if i.name not in inits}
    for n in graph.node:
        if n.op_type not in CONSTANT_OUTPUT and activations.intersection(n.input):
            activations.update(n.output)
    weights = {n.input[k] for n in graph.node for k in WEIGHT_INPUTS.get(n.op_type, ()) if len(n.input) > k}
    # the operands of a product with an activation (x @ W, torch.matmul(self.weight, x)), not of one of
    # constants alone (rotary frequencies' outer product)
    weights.update(x for n in graph.node if n.op_type in PRODUCTS and activations.intersection(n.input)
                   for x in n.input)
    affine = {x for n in graph.node if n.op_type in AFFINE_OPS and activations.intersection(n.input) for x in n.input}
    for n in reversed(graph.node):
        if weights.intersection(n.output) and not activations.intersection(n.input):
            weights.update(n.input)
        if (n.op_type in SHAPE_ONLY or n.op_type == "Cast") and n.input and affine.intersection(n.output):
            affine.add(n.input[0])
    return weights, affine


def _constant_tensor(node: Any) -> Any:
    """The tensor a Constant node holds (`value`, or `value_floats` as float32), else None (a scalar, integer
    list, string or sparse tensor: a constant as it is)."""
    import numpy as np
    from onnx import AttributeProto, numpy_helper

    if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or len(node.attribute) != 1:
        return None
    a = node.attribute[0]
    if a.name == "value" and a.type == AttributeProto.TENSOR:
        return a.t
    if a.name == "value_floats" and a.type == AttributeProto.FLOATS:
        return numpy_helper.from_array(np.array(a.floats, dtype=np.float32))
    return None


def _scope(node_name: str) -> str:
    """The dotted module path of a node the PyTorch exporter named, "/layer1/layer1.0/conv1/Conv" ->
    "layer1.0.conv1". Each component is a module's name from its last non-numeric part on ("conv1" for
    layer1.0.conv1, "layer1.0" for layer1.0, "layers.1" for encoder.layers.1): a component that extends the
    path's own such tail by numeric parts ("layer1" -> "layer1.0") replaces it, any other is appended."""
    path = ""
    for part in [p for p in node_name.split("/") if p][:-1]:
        atoms = path.split(".")
        k = max((i for i, a in enumerate(atoms) if not a.isdigit()), default=0)
        tail = ".".join(atoms[k:])
        rest = part[len(tail) + 1:].split(".") if path and part.startswith(tail + ".") else []
        if rest and all(a.isdigit() for a in rest):
            path = ".".join([*atoms[:k], part])
        else:
            path = f"{path}.{part}" if path else part
    return path


DATA_DEPENDENT_SHAPES = frozenset({"NonZero", "Compress", "Unique", "NonMaxSuppression"})  # their output sizes


def _unknown_shape(where: str, graph: Any, node: Any, i: int, name: str) -> GraphError:
    """The error for a value whose shape inference left unknown, with the reason where it is one we know."""
    label = f"node {node.name or i!r}"
    if node.domain not in ("", "ai.onnx") and not node.domain.startswith("ai.onnx."):
        return GraphError(
            f"{where}: {label} is {node.op_type} of domain {node.domain!r}, whose shapes ONNX's shape inference does "
            f"not know (a custom op, or a contrib op of onnxruntime's graph optimizations: Attention, FusedMatMul, "
            f"SkipLayerNormalization): only standard ONNX ops are supported; import the model as exported"
        )
    if node.op_type in DATA_DEPENDENT_SHAPES:
        return GraphError(
            f"{where}: {label} ({node.op_type}) makes {name!r}, whose size depends on the data (x[mask], "
            f"torch.nonzero, masked_select, masked_scatter and torch.unique export so): the import needs every shape "
            f"known; capture the PyTorch module with the torch.fx front end (sizes of the example inputs' run), or "
            f"export it without (a mask multiply, torch.where of three arguments)"
        )
    kinds = {vi.name: vi.type.WhichOneof("value") for vi in graph.value_info}
    kind = kinds.get(name)
    if kind and kind != "tensor_type":
        return GraphError(
            f"{where}: {label} ({node.op_type}) makes {name!r}, a {kind.removesuffix('_type')} value, not a tensor: "
            f"ONNX sequences (SplitToSequence, SequenceAt: torch.tensor_split, a scripted list of tensors), maps "
            f"and optionals are not supported"
        )
    return GraphError(f"{where}: shape inference left the shape of {name!r} ({label}) unknown")


def _attr(node: Any, name: str, default: Any = None) -> Any:
    """A node's attribute (a string one as str), else `default`."""
    from onnx import helper

    for a in node.attribute:
        if a.name == name:
            value = helper.get_attribute_value(a)
            return value.decode() if isinstance(value, bytes) else value
    return default


def _batch_stats(node: Any) -> bool:
    """Whether a BatchNormalization computes batch statistics: training_mode=1 (opset 14 on), or before it
    the training form, which also outputs the statistics."""
    return bool(_attr(node, "training_mode", 0)) or sum(1 for o in node.output if o) > 1


def _drops(node: Any, graph: Any, opset: int) -> bool:
    """Whether a Dropout drops: from opset 12 its training_mode input is given and not a constant false;
    before it, the training form, which outputs its mask (and no is_test=1)."""
    from onnx import numpy_helper

    if opset < 12:
        return sum(1 for o in node.output if o) > 1 and not _attr(node, "is_test", 0)
    if len(node.input) < 3 or not node.input[2]:
        return False
    mode = node.input[2]
    tensor = next((i for i in graph.initializer if i.name == mode), None) or next(
        (_constant_tensor(n) for n in graph.node if n.op_type == "Constant" and mode in n.output), None)
    return tensor is None or bool(numpy_helper.to_array(tensor).all())


def onnx_cost(node: Any, ins: list[TensorInfo | None], outs: list[TensorInfo], training: bool) -> Cost | None:
    """Cost of one ONNX node; None when no rule applies."""
    op = node.op_type
    kind = op.lower()
    out_numel = sum(t.numel for t in outs)
    if op in ("Conv", "ConvInteger", "QLinearConv"):  # quantized: weight and bias at other inputs
        w_at, bias_at = {"Conv": (1, 2), "ConvInteger": (1, None), "QLinearConv": (3, 8)}[op]
        macs = outs[0].numel * math.prod(ins[w_at].shape[1:])
        bias = bias_at is not None and len(ins) > bias_at and ins[bias_at] is not None
        return Cost(kind, 2.0 * macs + (outs[0].numel if bias else 0), float(macs))
    if op == "DeformConv":  # (X, W, offset, B, mask): a convolution of the input sampled at learned offsets
        x, w, out = ins[0], ins[1], outs[0]
        macs = out.numel * math.prod(w.shape[1:])
        # every input channel is sampled at each kernel position of each output position, bilinearly (4
        # neighbours: 7 FLOPs, as GridSample), and multiplied by the mask where one is given
        samples = x.shape[0] * x.shape[1] * math.prod(w.shape[2:]) * math.prod(out.shape[2:])
        bias = len(ins) > 3 and ins[3] is not None
        mask = len(ins) > 4 and ins[4] is not None
        return Cost(kind, 2.0 * macs + (out.numel if bias else 0) + (7 + mask) * samples, float(macs))
    if op == "ConvTranspose":
        x, w = ins[0], ins[1]
        macs = x.numel * math.prod(w.shape[1:])
        return Cost(kind, 2.0 * macs + (outs[0].numel if len(ins) > 2 and ins[2] is not None else 0), float(macs))
    if op == "Einsum" and all(t is not None for t in ins):
        cost = einsum_cost(_attr(node, "equation"), ins)
        return Cost(kind, cost.flops, cost.macs) if cost is not None else None
    if op == "Gemm":
        a = ins[0]
        k = a.shape[0] if _attr(node, "transA", 0) else a.shape[1]
        macs = outs[0].numel * k
        bias = outs[0].numel if len(ins) > 2 and ins[2] is not None else 0
        return Cost(kind, 2.0 * macs + bias, float(macs))
    if op in ("MatMul", "MatMulInteger", "QLinearMatMul"):
        macs = outs[0].numel * ins[0].shape[-1]
        return Cost(kind, 2.0 * macs, float(macs))
    if op == "Attention" and node.domain in ("", "ai.onnx"):  # opset 23 (com.microsoft's has other inputs)
        q, k, v = ins[0], ins[1], ins[2]  # Q [B, heads, Sq, D] or [B, Sq, heads x D]; past keys (input 4) add to K's
        heads, kv_heads = _attr(node, "q_num_heads"), _attr(node, "kv_num_heads")
        if len(q.shape) == 4:
            rows, d_qk, d_v, keys = math.prod(q.shape[:-1]), q.shape[-1], v.shape[-1], k.shape[-2]
        elif heads and kv_heads:
            rows, d_qk, d_v, keys = q.shape[0] * q.shape[1] * heads, q.shape[-1] // heads, v.shape[-1] // kv_heads, k.shape[1]
        else:
            return None
        keys += ins[4].shape[-2] if len(ins) > 4 and ins[4] is not None else 0
        return attention_cost(rows, keys, d_qk, d_v, kind)  # as scaled_dot_product_attention
    if op in ("MaxPool", "AveragePool", "LpPool"):
        return Cost(kind, float(outs[0].numel * math.prod(_attr(node, "kernel_shape", [1]))))
    if op in ("Resize", "Upsample", "GridSample"):  # as F.interpolate / F.grid_sample: a weighted sum of n neighbours
        mode = _attr(node, "mode", "bilinear" if op == "GridSample" else "nearest")
        per_dim = {"nearest": 1, "linear": 2, "bilinear": 2, "cubic": 4, "bicubic": 4}.get(mode)
        rank = len(ins[0].shape)
        dims = len(_attr(node, "axes", None) or ()) or (rank - 2 if rank > 2 else rank)  # the spatial ones
        return Cost(kind, float((2 * per_dim ** dims - 1) * outs[0].numel)) if per_dim else None
    if op == "LRN":
        return Cost(kind, float((_attr(node, "size") + 5) * outs[0].numel))
    if op in ("GlobalAveragePool", "GlobalMaxPool") or op in REDUCE:
        return Cost(kind, float(ins[0].numel))
    if op == "BatchNormalization":
        return Cost(kind, float(BATCH_NORM_FLOPS_PER_ELEMENT[training] * outs[0].numel))
    if op in ("LayerNormalization", "InstanceNormalization", "GroupNormalization"):  # statistics of the input
        return Cost(kind, float(LAYER_NORM_FLOPS_PER_ELEMENT * outs[0].numel))
    if op == "RMSNormalization":  # opset 23
        return Cost(kind, float(RMS_NORM_FLOPS_PER_ELEMENT * outs[0].numel))
    if op in ("Softmax", "LogSoftmax"):
        return Cost(kind, float(SOFTMAX_FLOPS_PER_ELEMENT * out_numel))
    if op in RNN_GATES:  # one layer, all steps and directions; W: [directions, gates x hidden, input]
        x, w = ins[0], ins[1]
        steps, batch = (x.shape[1], x.shape[0]) if _attr(node, "layout", 0) else (x.shape[0], x.shape[1])
        dirs, in_size = w.shape[0], w.shape[2]
        hidden = _attr(node, "hidden_size") or w.shape[1] // RNN_GATES[op]
        has_bias = len(ins) > 3 and ins[3] is not None  # inputs X, W, R, then the optional B
        f, m = rnn_cell_flops(RNN_GATES[op], batch, in_size, hidden, bias=has_bias)
        saved = 5 * batch * hidden * steps * dirs * x.itemsize if training else 0  # as the fx front end
        return Cost(kind, f * steps * dirs, m * steps * dirs, saved_bytes=saved)
    if op == "SoftmaxCrossEntropyLoss":
        return cross_entropy_cost(ins[0], kind)
    if op == "NegativeLogLikelihoodLoss":
        return Cost(kind, float(loss_samples(ins[0])))
    if op == "TopK":  # the top k along `axis` (k: the output's size there); torch.sort exports as TopK of all n
        axis = _attr(node, "axis", -1)
        return sort_cost(kind, ins[0], axis, outs[0].shape[axis], bool(_attr(node, "sorted", 1)))
    if op == "CumSum":
        return Cost(kind, float(ins[0].numel))
    if op in ("ScatterElements", "ScatterND", "Scatter"):  # (data, indices, updates): a reduction adds each update in
        reduction = _attr(node, "reduction", "none")
        return Cost(kind, float(ins[2].numel if reduction != "none" else out_numel))
    if op in ("GatherElements", "GatherND"):  # data movement, as torch.gather
        return Cost(kind, float(out_numel))
    if op == "Concat":
        return Cost("concat", 0.0)
    if op == "Gather":
        return Cost("gather", 0.0)
    if op in ELEMENTWISE:
        return Cost(kind, float(out_numel))
    if op == "Dropout":  # keeps its mask (1 B per element) for backward: an output already when it has a second
        n = outs[0].numel
        return Cost(kind, float(n), saved_bytes=0 if len(outs) > 1 else n)
    return None


def import_onnx(
    model: Any,
    *,
    name: str | None = None,
    mode: str = "inference",
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    metadata: Mapping[str, Any] | None = None,
    loss: str | None = None,
) -> OpGraph:
    """Import an ONNX model (a path or an `onnx.ModelProto`) as an `OpGraph`; see the module docstring."""
    import numpy as np
    import onnx
    from onnx import TensorProto, numpy_helper

    if mode not in MODES:
        raise GraphError(f"capture mode {mode!r} is not one of {', '.join(MODES)}")
    if loss is not None and mode != "training":
        raise GraphError(f"loss={loss!r} names the output a training step differentiates; mode is {mode!r}")
    where = str(model) if not isinstance(model, onnx.ModelProto) else f"ONNX model {model.graph.name!r}"
    proto = onnx.ModelProto()
    proto.CopyFrom(_load(model))
    _drop_weight_data(proto.graph)
    proto = _inline_functions(proto, where)
    changed = _fix_inputs(proto, input_shapes or {}, where)
    given = list(input_shapes or {})
    try:
        proto = _infer_shapes(proto, where, changed, given)
    except GraphError:
        _refuse_subgraphs(proto.graph, where)  # the clearer reason, where there is control flow
        raise
    # an If whose condition is computed from shapes and constants alone (nn.LocalResponseNorm's rank test) is
    # replaced by the branch it takes; other control flow is refused
    while ((_unknown_shapes(proto) or _subgraph_nodes(proto.graph))
           and (_fold_shape_data(proto) or _split_sequences(proto))):
        proto = _infer_shapes(proto, where, changed, given)
    _refuse_subgraphs(proto.graph, where)
    training = mode == "training"
    graph = proto.graph
    infos = _known_tensors(graph)
    b = ForwardBuilder()
    vals: dict[str, Value] = {"": b.constant()}  # "" = an omitted optional input
    # BatchNormalization's running mean and variance are buffers, not trained parameters: constants, as the
    # torch.fx capture treats them; so are Resize's and Upsample's float roi and scales (sizes, not weights)
    # and the initial states of recurrent layers (nn.LSTM's zeros when no state is passed)
    buffers = {n.input[k] for n in graph.node for k in NOT_PARAMETERS.get(n.op_type, ()) if len(n.input) > k}
    quantized = {n.input[k] for n in graph.node for k in QUANTIZED_WEIGHTS.get(n.op_type, ()) if len(n.input) > k}
    scales = {n.input[k] for n in graph.node for k in QUANTIZATION_SCALES.get(n.op_type, ()) if len(n.input) > k}
    weights, affine = _weight_values(graph)
    # a training export (a BatchNormalization computes batch statistics) keeps a BatchNormalization in inference
    # mode frozen, as eager training and the fx capture keep one the user put in eval(); an inference export is
    # trained as a whole, as the fx capture trains a model in eval()
    batch_stats = {i: _batch_stats(n) for i, n in enumerate(graph.node) if n.op_type == "BatchNormalization"}
    frozen_norms = {i for i, s in batch_stats.items() if not s} if any(batch_stats.values()) else set()
    # so is a Dropout in inference mode folded in a training export, as fx folds F.dropout(x, p, training=False)
    drops = {i: _drops(n, graph, _opset(proto)) for i, n in enumerate(graph.node) if n.op_type == "Dropout"}
    identities = {i for i, d in drops.items() if not d} if any(drops.values()) else set()
    # a norm's scale and bias as the exporter writes them for a norm without (nn.InstanceNorm2d's default,
    # GroupNorm's inner InstanceNormalization, elementwise_affine=False): Constant nodes of ones and zeros
    identity = {n.input[k]: v for n in graph.node if n.op_type in NORMS for k, v in ((1, 1.0), (2, 0.0))
                if len(n.input) > k}

    def stored(name: str, tensor: Any, constant_node: bool = False) -> Value:  # an initializer or a Constant's tensor
        info = _tensor_info(tuple(int(d) for d in tensor.dims), tensor.data_type)
        infos[name] = info
        nbytes = info.nbytes  # int4 weights: packed
        if info.numel <= 1:
            return b.constant()
        if (constant_node and name in identity and tensor.data_location != TensorProto.EXTERNAL
                and bool(np.all(numpy_helper.to_array(tensor) == identity[name]))):
            return b.constant()
        vector = sum(d > 1 for d in info.shape) == 1  # [C], [1, C], [C, 1, 1]: a bias or scale
        weight = name in weights or name in scales or (vector and name in affine)
        if info.floating and weight and name not in buffers:  # a Constant node is not trained, nor is a scale
            return b.param(name, nbytes, info.numel, trainable=not constant_node and name not in scales)
        if not info.floating and name in quantized:
            return b.param(name, nbytes, info.numel, trainable=False)
        return b.constant()

    for init in graph.initializer:
        vals[init.name] = stored(init.name, init)
    for inp in graph.input:
        if inp.name not in vals:
            info = infos[inp.name]
            vals[inp.name] = b.input(inp.name, info.nbytes, info.shape)
    taken: set[str] = set(vals)
    read = {x for n in graph.node for x in n.input} | {o.name for o in graph.output}
    for i, node in enumerate(graph.node):
        try:
            ins = [vals[x] for x in node.input]
        except KeyError as exc:
            raise GraphError(f"{where}: node {node.name or i!r} reads {exc.args[0]!r}, which nothing produces") from None
        outputs = [o for o in node.output if o]  # "" is an omitted optional output: it stays the constant ""
        # an output that nothing reads and shape inference leaves unknown is as omitted (Dropout's mask before
        # opset 10, which has no shape inference)
        outputs = [o for o in outputs if o in infos or o in read] or outputs
        if node.op_type == "BatchNormalization":  # a training one's running (and saved) statistics: buffer
            outputs = [o for o in outputs if o == node.output[0] or o in read]  # updates, as in fx, unless read
        tensor = _constant_tensor(node)
        if tensor is not None and outputs:  # weights some exporters write as Constant nodes
            vals[outputs[0]] = stored(outputs[0], tensor, constant_node=True)
            continue
        missing = [o for o in outputs if o not in infos]
        if missing and node.op_type not in CONSTANT_OUTPUT:
            if not any(v.deps or v.params for v in ins):
                for o in outputs:
                    vals[o] = b.constant()
                continue
            raise _unknown_shape(where, graph, node, i, missing[0])
        outs = [infos[o] for o in outputs if o in infos]
        if node.op_type in CONSTANT_OUTPUT or not any(v.deps or v.params for v in ins):
            for o in outputs:
                vals[o] = b.constant()
            continue
        if node.op_type in SHAPE_ONLY or (node.op_type == "Dropout" and (not training or i in identities)):
            for o in outputs:  # an integer or bool result passes no gradient back
                vals[o] = b.fold(ins, infos[o].nbytes if o in infos else None,
                                 grad=o not in infos or infos[o].floating)
            continue
        on_activation = node.op_type == "Gather" and not ins[0].params  # not a lookup in a weight table
        index = infos.get(node.input[1]) if node.op_type == "Gather" and len(node.input) > 1 else None
        if on_activation and outs and index is not None and index.shape == () and not ins[1].deps:
            vals[outputs[0]] = b.fold([ins[0]], outs[0].nbytes)  # x[:, -1]: a view, folded as fx's select
            continue
        if node.op_type in SLICING and outs:  # x[:, -1]: reads the slice it takes, not all of x (as fx's getitem)
            ins[0] = b.fold([ins[0]], outs[0].nbytes)
        in_infos = [infos.get(x) if x else None for x in node.input]
        cost = onnx_cost(node, in_infos, outs, training and i not in frozen_norms)
        if on_activation and cost is not None:  # x.index_select(1, idx): data movement, as in the fx capture
            cost = Cost(cost.kind, float(sum(t.numel for t in outs)))
        if cost is None:
            cost = Cost(node.op_type.lower(), float(sum(t.numel for t in outs)))
            b.fallback_kinds.append(cost.kind)
        op_name = node.name or f"{node.op_type}_{i}"
        while op_name in taken:
            op_name = f"{op_name}_{i}"
        taken.add(op_name)
        total = sum(t.nbytes for t in outs)
        b.op(
            op_name, cost.kind, _scope(node.name), ins, flops=cost.flops, macs=cost.macs, output_bytes=total,
            output_shape=outs[0].shape if outs else (), output_numel=sum(t.numel for t in outs),
            saved_bytes=cost.saved_bytes, differentiable=any(t.floating for t in outs),
        )
        for o in outputs:  # an integer output (TopK's indices) passes no gradient back
            vals[o] = Value(deps={op_name: infos[o].nbytes if o in infos else total},
                            no_grad=frozenset({op_name}) if o in infos and not infos[o].floating else frozenset())
    names = [o.name for o in graph.output]
    if loss is not None and loss not in names:
        raise GraphError(f"{where}: loss={loss!r} is not an output of the model; its outputs: {', '.join(names)}")
    for o in names:
        if o not in vals:
            raise GraphError(f"{where}: output {o!r} of the model is not produced by any node, input or initializer")
    fg = b.finish([vals[o] for o in names if loss is None or o == loss])
    gname = name or graph.name or "onnx_model"
    meta = {"capture": "onnx", "capture_version": CAPTURE_VERSION, **(metadata or {})}
    if training:
        meta["loss_outputs"] = [loss] if loss is not None else names
    if changed:
        warnings.warn(f"{where}: input_shapes changes {', '.join(changed)}: the ops are imported at the sizes "
                      f"shape inference gives them, but the model may be built for the size it fixes (a loop "
                      f"unrolled over the exported steps stays so); export the dimension dynamic to be sure",
                      stacklevel=_caller_level())
    return fg.lower(gname, mode, meta)
