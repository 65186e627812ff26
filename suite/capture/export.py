"""Capture a PyTorch `nn.Module` (plus example inputs) into an `OpGraph` with torch.export.

Use it where torch.fx cannot trace a model: torch.export runs `forward` on fake tensors of the example
inputs' shapes, so Python code that branches or loops on sizes (`if x.size(0) > 1:`,
`for i in range(x.shape[0]):`) takes the path these inputs take. Control flow on tensor values
(`if x.sum() > 0:`, `TransformerEncoder`'s check of a mask given as an input) is refused by both front ends,
and so are, here, sizes that depend on the data (`x[mask]`, `nonzero`), which the fx capture takes from its run;
`nn.Transformer` is captured by both.

How: `torch.export.export(module, example_inputs, example_kwargs, strict=False)` in the mode's state, as
the fx capture (`suite.capture.fx.mode_flags`, each module's flag restored after; a `torch.compile`d
module is exported as the module it compiles; a dataclass output object that torch's pytree does not know,
`@dataclass class Output`, is returned as the dict of its fields while exporting, as the fx capture reads it,
with no registration left behind; a tensor given for two arguments, `model(x, x)`, is exported as two inputs,
a copy for the second, as the fx capture has them, and a write to one of them in place is refused), then one walk over the exported graph (torch's "training
IR", not decomposed further) that fills the IR of `suite.capture.ir`, so training lowering, serialization
and validation are those of the torch.fx capture. Shapes and dtypes come from the fake tensors the export
records (`node.meta["val"]`): nothing is computed and the module's buffers are left as they were (meta
tensors work too: build the model under `torch.device("meta")` to capture a large one without allocating
it). Parameters and buffers are the exported program's (its graph signature); a parameter's key is its
name in `module.named_parameters()` (tied weights: the first name, as the fx capture).

What an op is: one ATen call of the exported graph. Most torch functions map to one call each (`F.linear`
and `nn.Linear` are `aten.linear`, `nn.Conv2d` is `aten.conv2d`, `nn.LayerNorm` is `aten.layer_norm`,
scaled dot product attention is one call); those that torch writes in Python from other calls
(`F.normalize`, `F.softmin`, `F.local_response_norm`, `nn.Tanhshrink`, `F.kl_div` with batchmean) are
those calls, costed each by its own rule, so their FLOPs can differ from the fx capture's rule for the
function (`F.normalize` of a [3, 8] tensor: 51, the rule 72). A module the fx capture keeps as one op is
traced through:
`nn.MultiheadAttention` is its input projection(s), the attention and the output projection (the same
MACs; its in-projection weights, read by two projections in cross-attention, become a variable op; called
with need_weights=True, its default, it also scales its queries and averages the attention weights over
heads, elementwise ops that the fx capture's rule for the module does not count),
while `nn.LSTM` / `GRU` / `RNN` are one fused call each (one op, as in the fx capture). A module with its
own `capture_cost` rule (the zoo's LSTM cell and attention step) is traced through too: torch.export keeps
no module whole (the zoo's workloads have the fx capture's forward MACs, FLOPs and parameters, in more
ops; their training steps differ by the backward ops of that granularity). Views (view, reshape,
permute, transpose, `.T` / `.mT` / `.mH`, select, slice, getitem, flatten, squeeze / unsqueeze, expand, split,
contiguous, detach) are folded into their producers (indexing by a tensor, `x[:, idx]`, `x[mask]`, is a copy: an op, as
`index_select`, see `flops.GATHERS`; of a parameter, an embedding lookup), and so is dropout in inference mode (in
training mode, one that runs with train=False: a dropout module in eval()), as in the fx capture; values computed from no model input and no parameter (shapes, buffers,
`zeros_like(x)`) are constants. An in-place call (`y.add_(1)`,
`nn.ReLU(inplace=True)`) is an op that its later readers read; one that writes to memory another value
still to be read shares (`y[0].mul_(2)` before y is read) is refused, as in the fx capture. A buffer
update is an op when its value comes from the inputs (`self.run.copy_(x.mean(0))`), ordered as in the fx capture
(its later readers read it; it follows the earlier readers of the old values by 0-byte edges, and `copy_` the
write it overwrites); one from constants only
(`self.n += 1`, `self.n.add_(1)`) is refused naming the buffer, as in the fx capture, unless a module that
the fx capture keeps whole makes it (BatchNorm's running statistics). torch.export records a rebinding
(`self.n = self.n + 1`) as a copy into the buffer: refused so from constants; from the inputs
(`self.n = self.n + x.mean(0)`) an update op whose later readers (`x * self.n`) read the new value, where the
fx capture refuses every rebinding (torch.fx does not record it). A region that
torch.export wraps in a higher-order op, `with torch.no_grad():` or `with torch.autocast(...):`, is inlined
(its ops are named "{scope}/{region}/{node name}"); in training graphs no gradient flows back out of a
no_grad region, nor out of ops run under `torch.inference_mode()` (which export leaves unwrapped: known by
their results, inference tensors). Other higher-order ops (`torch.cond`, loops) are refused.

FLOPs follow `suite.capture.flops` by the ATen op's name (`aten.addmm` is `addmm`, `aten._softmax` is
`softmax`), with the same MACs as the fx capture for matrix products, convolutions and attention. Ops no
rule covers count 1 FLOP per output element, are listed in the graph's metadata "fallback_cost_kinds"
and named in a warning. Op names are "{scope}/{node name}" ("layer1.0.conv1/conv2d"), the scope being
the innermost module whose forward made the call; inputs keep their argument names.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import os
from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn as nn
from torch._ops import HigherOrderOperator
from torch.fx import Node
from torch.fx.node import map_aggregate

from suite.capture import CAPTURE_VERSION
from suite.capture.flops import (
    DROPOUT,
    FACTORIES,
    GATHERS,
    SHAPE_ONLY,
    Cost,
    _rnn_cost,
    collect,
    elementwise,
    embedding_bag_cost,
    function_cost,
    interpolate_cost,
    tensors,
)
from suite.capture.fx import (
    _check_loss,
    _data_inputs,
    _dict_hint,
    _to_info,
    _uncompiled,
    _where,
    buffer_update_hint,
    in_mode,
    is_leaf,
)
from suite.capture.ir import MODES, ForwardBuilder, ForwardGraph, Value, is_lookup
from suite.errors import GraphError
from suite.graph import OpGraph

# ATen names of the views that torch functions become, beside those of `flops.SHAPE_ONLY`
EXPORT_SHAPE_ONLY = SHAPE_ONLY | {"slice", "alias", "unsafe_view", "as_strided", "split_with_sizes", "movedim",
                                  "swapaxes", "swapdims", "lift_fresh", "broadcast_tensors",
                                  "broadcast_to", "numpy_T", "mT", "mH", "adjoint"}  # x.T, x.mT, x.mH, x.adjoint()
EXPORT_DROPOUT = DROPOUT | {"feature_dropout", "native_dropout"}
# ATen ops with outputs that the torch function calling them drops (embedding_bag's offsets and bag sizes,
# adaptive max pooling's indices without return_indices, dropout's mask): outputs of the op where read
DROPPED_OUTPUTS = frozenset({"embedding_bag", "embedding_bag_forward_only", "adaptive_max_pool1d",
                             "adaptive_max_pool2d", "adaptive_max_pool3d", "native_dropout"})
# ATen names that are another name's rule in `flops.function_cost`
ATEN_RULES = {"native_layer_norm": "layer_norm", "native_batch_norm": "batch_norm", "native_group_norm": "group_norm",
              "cross_entropy_loss": "cross_entropy", "nll_loss_forward": "nll_loss", "nll_loss2d": "nll_loss",
              "nll_loss_nd": "nll_loss", "max_pool1d_with_indices": "max_pool1d",
              "max_pool2d_with_indices": "max_pool2d", "max_pool3d_with_indices": "max_pool3d"}
UPSAMPLE_MODES = {"upsample_nearest1d": "nearest", "upsample_nearest2d": "nearest", "upsample_nearest3d": "nearest",
                  "upsample_nearest_exact1d": "nearest-exact", "upsample_nearest_exact2d": "nearest-exact",
                  "upsample_nearest_exact3d": "nearest-exact", "upsample_linear1d": "linear",
                  "upsample_bilinear2d": "bilinear", "upsample_bicubic2d": "bicubic",
                  "upsample_trilinear3d": "trilinear"}
EMBEDDING_BAG_MODES = {0: "sum", 1: "mean", 2: "max"}
GRID_SAMPLE_MODES = {0: "bilinear", 1: "nearest", 2: "bicubic"}  # aten.grid_sampler's interpolation_mode
RNN_MODES = {"lstm": "LSTM", "gru": "GRU", "rnn_tanh": "RNN_TANH", "rnn_relu": "RNN_RELU"}


def export(module: nn.Module, example_inputs: Sequence[Any],
           example_kwargs: Mapping[str, Any] | None = None) -> torch.export.ExportedProgram:
    """`torch.export.export(module, example_inputs, example_kwargs, strict=False)`; GraphError (naming the
    model, the reason and the model's line it stopped at) if torch cannot export it."""
    if not isinstance(module, nn.Module):
        raise GraphError(f"capture needs a torch.nn.Module, got {type(module).__name__}")
    # a dataclass output object that torch's pytree does not know (`@dataclass class Output`) is returned as
    # the dict of its fields while exporting, as the fx capture reads it, with no pytree registration left behind
    handle = module.register_forward_hook(lambda m, args, out: _fields_as_dicts(out))
    (args, kwargs), shared = _distinct((tuple(example_inputs), dict(example_kwargs or {})))
    try:
        ep = torch.export.export(module, args, kwargs, strict=False)
    except Exception as exc:  # noqa: BLE001 - export raises many kinds; report one clear error
        reason = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        if "fake tensor in the exported program constant" in reason:  # torch's words for `.data` in forward
            reason += (" (torch.export cannot follow `.data` of a parameter or buffer in forward: use the tensor "
                       "itself, or `.detach()`, or capture it with capture_module)")
        where = _where(exc, os.path.dirname(torch.__file__))  # the model's line (not torch's)
        raise GraphError(f"torch.export cannot export {type(module).__name__}: {reason}{where}"
                         f"{_dict_hint(example_inputs)}") from exc
    finally:
        handle.remove()
    if shared:
        _check_shared_inputs_unwritten(type(module).__name__, ep, shared)
    return ep


def _distinct(inputs: Any) -> tuple[Any, set[int]]:
    """`inputs` with each tensor given again (`model(x, x)`) replaced by a copy, and the positions among
    their leaves of the tensors given more than once. torch.export traces one tensor given twice as one
    value, read through the last argument naming it (the first argument's input op had no reader); the fx
    capture, and a copy, make each argument an input read by its own readers."""
    leaves, spec = torch.utils._pytree.tree_flatten(inputs)
    first: dict[int, int] = {}
    shared: set[int] = set()
    for i, x in enumerate(leaves):
        if not isinstance(x, torch.Tensor):
            continue
        if id(x) not in first:
            first[id(x)] = i
            continue
        shared |= {first[id(x)], i}
        with torch.no_grad():
            leaves[i] = x.clone().requires_grad_(x.requires_grad)
    return torch.utils._pytree.tree_unflatten(leaves, spec), shared


def _check_shared_inputs_unwritten(what: str, ep: torch.export.ExportedProgram, shared: set[int]) -> None:
    """GraphError where forward writes in place to an input whose tensor was given for another argument too
    (`model(x, x)` and `a.mul_(2)`: eager PyTorch changes b; the copy that `_distinct` made would not), as
    the fx capture refuses that write."""
    specs = [s for s in ep.graph_signature.input_specs if s.kind == torch.export.graph_signature.InputKind.USER_INPUT]
    names = {s.arg.name for i, s in enumerate(specs) if i in shared}
    for node in ep.graph.nodes:
        written = _mutated_arg(node)
        while written is not None and written.op != "placeholder" and (_is_view(written) or _mutated_arg(written)):
            written = written.args[0]
        if written is not None and written.op == "placeholder" and written.name in names:
            raise GraphError(
                f"{what}: the in-place call {node.name!r} ({_aten_name(node)}) writes to input {written.name!r}, "
                f"whose tensor the example inputs give for another argument too: capture would miss that the "
                f"other argument changes with it; give distinct tensors, or write it out of place")


def _fields_as_dicts(x: Any) -> Any:
    """`x` with each dataclass instance that torch's pytree does not know replaced by the dict of its fields
    (in lists, tuples and dicts too)."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type) and type(x) not in torch.utils._pytree.SUPPORTED_NODES:
        return {f.name: _fields_as_dicts(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if isinstance(x, list | tuple) and type(x) in (list, tuple):
        return type(x)(_fields_as_dicts(y) for y in x)
    if isinstance(x, dict) and type(x) is dict:
        return {k: _fields_as_dicts(v) for k, v in x.items()}
    return x


def _aten_name(node: Node) -> str:
    """The op's name without overload and leading underscores ("aten._softmax.default" -> "softmax")."""
    schema = getattr(node.target, "_schema", None)
    name = schema.name.split("::")[-1] if schema is not None else getattr(node.target, "__name__", str(node.target))
    return name.lstrip("_")


def _scope(node: Node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    return str(list(stack.values())[-1][0]) if stack else ""


def _is_view(node: Node) -> bool:
    """Whether the node's result may share its first input's memory (a view, `contiguous`, an item of split)."""
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        return isinstance(node.args[0], Node) and _is_view(node.args[0])
    schema = getattr(node.target, "_schema", None)
    return schema is not None and any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)


def _mutated_arg(node: Node) -> Node | None:
    """The tensor an in-place call (`add_`, `relu_`, an `out=` argument) writes to, by its ATen schema."""
    schema = getattr(node.target, "_schema", None) if node.op == "call_function" else None
    if schema is None:
        return None
    for i, arg in enumerate(schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            value = node.args[i] if i < len(node.args) and not arg.kwarg_only else node.kwargs.get(arg.name)
            return value if isinstance(value, Node) else None
    return None


def _returns_written(node: Node) -> bool:
    """Whether an in-place call returns the tensor it writes (`add_`, `copy_`; not `batch_norm`, which writes
    its running statistics and returns a new tensor)."""
    schema = getattr(node.target, "_schema", None)
    return schema is not None and any(r.alias_info is not None and r.alias_info.is_write for r in schema.returns)


def _view_write(graph: torch.fx.Graph) -> tuple[Node, Node] | None:
    """The first in-place call that writes to memory a value made before it shares, where that value is read
    after the call (its readers would miss the write), and that value; else None. Values that may share
    memory: a tensor, its views, the views of those, and the in-place calls on any of them (a later reader of
    the tensor reads the last in-place call on it, so the calls themselves are not such values)."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    root: dict[Node, Node] = {}

    def find(n: Node) -> Node:
        while root.get(n, n) is not n:
            n = root[n]
        return n

    for n in graph.nodes:
        first = n.args[0] if n.args and isinstance(n.args[0], Node) else None
        base = first if _is_view(n) else _mutated_arg(n)
        if base is not None:
            root[find(n)] = find(base)
    for n in graph.nodes:
        if _mutated_arg(n) is None:
            continue
        group = find(n)
        for other in graph.nodes:
            if order[other] < order[n] and find(other) is group and any(order[u] > order[n] for u in other.users):
                return n, other
    return None


def _check_buffer_updates(what: str, module: nn.Module, ep: torch.export.ExportedProgram) -> None:
    """GraphError naming a buffer that the exported graph updates (`self.n += 1`, `self.n.add_(1)`,
    `self.n = self.n + 1`: an in-place call or a copy_ into it) from values computed from no model input and
    no parameter, outside a module the fx capture keeps whole (BatchNorm's running statistics): such a value
    is a constant in the IR, so the graph would not update the buffer at each step as eager PyTorch does.
    The fx capture refuses the same updates (`suite.capture.fx._check_buffers_untouched`)."""
    sig = ep.graph_signature
    buffers = dict(sig.inputs_to_buffers)
    sources = set(sig.user_inputs) | set(sig.inputs_to_parameters)
    live: set[Node] = set()  # nodes computed from a model input or a parameter
    for node in ep.graph.nodes:
        if node.op == "placeholder":
            if node.name in sources:
                live.add(node)
            continue
        written = _mutated_arg(node)
        if any(n in live for n in collect((node.args, node.kwargs), Node) if n is not written):
            live.add(node)
        if written is None or node in live:
            continue
        while written.op != "placeholder" and (_is_view(written) or _mutated_arg(written) is not None):
            written = written.args[0]
        if written.op != "placeholder" or written.name not in buffers:
            continue
        if _in_leaf(module, _scope(node)):
            continue
        name = buffers[written.name]
        k = name.rsplit(".", 1)[-1]
        raise GraphError(
            f"{what}.forward updates its buffer {name!r} from values that are not the inputs' (self.{k} += 1, "
            f"self.{k}.add_(1), self.{k} = self.{k} + 1; here {node.name!r}, {_aten_name(node)}): such values "
            f"are constants in the graph, so the graph (and the backends that run it) would not update the "
            f"buffer at each step as eager PyTorch does; {buffer_update_hint(k)}")


def _in_leaf(module: nn.Module, scope: str) -> bool:
    """Is the submodule at `scope` ("layer1.0.bn1"), or one above it, a module the fx capture keeps whole? A
    scope that names no submodule counts as one (nothing refused on a path this walk cannot follow)."""
    path = scope.split(".") if scope else []
    try:
        return any(is_leaf(module.get_submodule(".".join(path[:i]))) for i in range(len(path) + 1))
    except AttributeError:
        return True


def forward_graph(module: nn.Module, example_inputs: Sequence[Any], *,
                  example_kwargs: Mapping[str, Any] | None = None, training: bool = False) -> ForwardGraph:
    """Export `module` on `example_inputs` (and `example_kwargs`, by name) and build the forward IR, with the
    module in the mode's state (`fx.mode_flags`, as the fx capture; each module's own flag is
    restored afterwards); a `torch.compile`d module is exported as the module it compiles."""
    if not isinstance(module, nn.Module):
        raise GraphError(f"capture needs a torch.nn.Module, got {type(module).__name__}")
    module = _uncompiled(module)
    what = type(module).__name__
    with in_mode(module, training):
        ep = export(module, example_inputs, example_kwargs)
    sig = ep.graph_signature
    param_targets = dict(sig.inputs_to_parameters)
    user_inputs = set(sig.user_inputs)
    user_outputs = set(sig.user_outputs)
    canon = {id(p): name for name, p in module.named_parameters()}
    _check_buffer_updates(what, module, ep)
    walk = _Walk(what, ep.graph_module, training)
    walk.check_view_writes(ep.graph)
    b = walk.b
    outputs: list[Value] = []
    buffers = dict(sig.inputs_to_buffers)
    for node in ep.graph.nodes:
        outs = tensors(_info(node, what))
        if node.op == "placeholder":
            if node.name in buffers:
                walk.holds[node] = buffers[node.name]
            if node.name in param_targets:
                p = module.get_parameter(param_targets[node.name])
                walk.vals[node] = b.param(canon.get(id(p), param_targets[node.name]), p.numel() * p.element_size(),
                                          p.numel(), trainable=p.requires_grad or not training)
            elif node.name in user_inputs and outs:
                walk.vals[node] = b.input(node.name, sum(t.nbytes for t in outs), outs[0].shape)
            else:  # buffers, lifted constants, non-tensor inputs
                walk.vals[node] = b.constant()
        elif node.op == "output":
            produced = [n for n in collect(node.args, Node) if n.name in user_outputs]
            if training:
                returned = [t for n in produced for t in tensors(_info(n, what))]
                _check_loss(what, returned, _returned(ep, node))
            outputs = [walk.vals[n] for n in produced]
        else:
            walk.node(node, ep.graph_module, "")
    return b.finish(outputs)


def _returned(ep: torch.export.ExportedProgram, output: Node) -> Any:
    """What the module returns, in its structure (a dict of its entries), with `TensorInfo`s for tensors."""
    user = [a for a, spec in zip(output.args[0], ep.graph_signature.output_specs, strict=True)
            if spec.kind == torch.export.graph_signature.OutputKind.USER_OUTPUT]
    leaves = [_info(a) if isinstance(a, Node) else a for a in user]
    return torch.utils._pytree.tree_unflatten(leaves, ep.call_spec.out_spec)


class _Walk:
    """Fills a `ForwardBuilder` from the exported graph's nodes, inlining the regions that torch.export wraps
    in a higher-order op (`with torch.no_grad():`, `with torch.autocast(...):`)."""

    def __init__(self, what: str, root: torch.fx.GraphModule, training: bool) -> None:
        self.what, self.root, self.training = what, root, training
        self.b = ForwardBuilder()
        self.vals: dict[Node, Any] = {}  # a Value per node; a list of them for a region's outputs
        # buffer writes, as the fx capture orders them (see there): the buffer whose memory a node's value is
        # (its placeholder, a view of it, an in-place call on it; a list for a region's outputs), and the ops
        # that read each buffer since its last write. The rule is fx's `BufferOrder`, not shared with it: here
        # a buffer is a placeholder, not a get_attr known by its tensor; a read after a write reads the write's
        # node (exported graphs thread it as a value), where fx reads a get_attr placed after the write; writes
        # and views are known by ATen schemas, and some writes return no buffer (batch_norm); regions pass
        # buffers through their placeholders and outputs
        self.holds: dict[Node, Any] = {}
        self.readers: dict[str, list[str]] = {}
        self.grad_enabled = True  # False inside a no_grad region: its ops pass no gradient back

    def node(self, node: Node, owner: torch.fx.GraphModule, prefix: str) -> None:
        b, vals = self.b, self.vals
        if node.op != "call_function":  # get_attr: a region's graph, a constant
            vals[node] = b.constant()
            return
        if node.target is operator.getitem and isinstance(vals.get(node.args[0]), list):
            vals[node] = vals[node.args[0]][node.args[1]]  # an output of an inlined region
            held = self.holds.get(node.args[0])
            if held and held[node.args[1]] is not None:
                self.holds[node] = held[node.args[1]]
            return
        if isinstance(node.target, HigherOrderOperator):
            vals[node] = self.region(node, owner, prefix)
            return
        info = _info(node, self.what)
        outs = tensors(info)
        args = collect((node.args, node.kwargs), Node)
        ins = [vals[n] for n in args]
        mutated = _mutated_arg(node)
        target = self.holds.get(mutated) if mutated is not None else None
        after: list[str] = []
        if target is not None:  # write after read: it follows the ops that read the buffer's old value
            after = self.readers.pop(target, [])
            if _aten_name(node) == "copy_" and mutated in args:  # overwrites it unread: follows its producers
                after += list(ins[args.index(mutated)].deps)
                ins[args.index(mutated)] = b.constant()
        if not any(v.deps or v.params for v in ins):
            vals[node] = b.constant()  # computed from no input and no parameter: static
        elif "val" not in node.meta:
            raise GraphError(f"{self.what}: torch.export recorded no result for {node.name!r} ({_aten_name(node)})")
        elif not outs:
            vals[node] = b.constant()  # a shape, an assertion, a Python number
        else:
            vals[node] = _call(b, node, prefix, args, ins, outs, self.training, after, self.grad_enabled)
        if _op_name(node, prefix) in vals[node].deps:  # an op: it reads the buffers its arguments hold
            for t in dict.fromkeys(self.holds[a] for a in args if a in self.holds):
                if t != target:
                    self.readers.setdefault(t, []).append(_op_name(node, prefix))
        elif _is_view(node) and node.args and node.args[0] in self.holds:
            self.holds[node] = self.holds[node.args[0]]
        if target is not None and _returns_written(node):  # add_, copy_ (not batch_norm's output)
            self.holds[node] = target

    def region(self, node: Node, owner: torch.fx.GraphModule, prefix: str) -> list[Value]:
        """The ops of a wrapped region, named "{scope}/{region}/{node}"; its outputs pass no gradient back when
        it runs under no_grad. Other higher-order ops (torch.cond, loops) are refused."""
        name = node.target.name()
        if name == "wrap_with_set_grad_enabled":  # (enabled, graph, *operands)
            grad, sub, operands = bool(node.args[0]), node.args[1], node.args[2:]
        elif name == "wrap_with_autocast":  # (device, dtype, enabled, cache_enabled, graph, *operands)
            grad, sub, operands = True, node.args[4], node.args[5:]
        else:
            raise GraphError(f"{self.what}: the exported graph calls {name} ({node.name!r}), which capture does not "
                             f"follow (it follows torch.no_grad and torch.autocast regions)")
        gm = getattr(owner, str(sub.target))
        self.check_view_writes(gm.graph)
        inner = f"{prefix}{sub.target}/"
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        for p, a in zip(placeholders, operands, strict=True):
            self.vals[p] = self.vals[a] if isinstance(a, Node) else self.b.constant()
            if a in self.holds:
                self.holds[p] = self.holds[a]
        results: list[Value] = []
        outer = self.grad_enabled
        if name == "wrap_with_set_grad_enabled":
            self.grad_enabled = grad
        for n in gm.graph.nodes:
            if n.op == "output":
                results = [self.vals[x] if isinstance(x, Node) else self.b.constant() for x in n.args[0]]
                self.holds[node] = [self.holds.get(x) for x in n.args[0]]
            elif n.op != "placeholder":
                self.node(n, gm, inner)
        self.grad_enabled = outer
        return results if grad else [self.b.fold([v], None, grad=False) for v in results]

    def check_view_writes(self, graph: torch.fx.Graph) -> None:
        clash = _view_write(graph)
        if clash is not None:
            call, other = clash
            raise GraphError(
                f"{self.what}: the in-place call {call.name!r} ({_aten_name(call)}) writes to memory that "
                f"{other.name!r} shares (a view of it, or a tensor it views), read after it: the graph would miss "
                f"that dependency and split placements would compute wrongly; write it out of place (e.g. "
                f"torch.where, index_put or torch.cat instead)")


def _info(node: Node, what: str = "capture") -> Any:
    """The node's recorded result with tensors as `TensorInfo`; GraphError where a size is symbolic: one that
    depends on the data (`x[mask]`, `nonzero`, `masked_select`, `unique`), which torch.export does not know."""
    val = node.meta.get("val")
    if any(isinstance(d, torch.SymInt) for t in collect(val, torch.Tensor) for d in t.shape):
        raise GraphError(
            f"{what}: the size of {node.name!r} ({_aten_name(node)}) depends on the values of the data (x[mask], "
            f"nonzero, masked_select, unique), which torch.export does not know; capture it with the torch.fx "
            f"front end, which takes the sizes of the run on the example inputs")
    return map_aggregate(val, _to_info)


def _resolve(x: Any) -> Any:
    """Replace nodes in args by their recorded results (TensorInfo or plain values)."""
    if isinstance(x, Node):
        return _info(x)
    if isinstance(x, list | tuple):
        return type(x)(_resolve(y) for y in x)
    if isinstance(x, dict):
        return {k: _resolve(v) for k, v in x.items()}
    return x


def _train_arg(node: Node) -> bool:
    """A dropout call's `train` flag (aten.dropout(input, p, train)): False returns its input."""
    return (node.args[2] if len(node.args) > 2 else node.kwargs.get("train", True)) is not False


def _op_name(node: Node, prefix: str) -> str:
    """"{scope}/{prefix}{node name}", or "{prefix}{node name}" outside any module."""
    return f"{_scope(node)}/{prefix}{node.name}" if _scope(node) else f"{prefix}{node.name}"


def _call(b: ForwardBuilder, node: Node, prefix: str, arg_nodes: list[Node], ins: list[Value], outs: list[Any],
          training: bool, after: Sequence[str] = (), grad_enabled: bool = True) -> Value:
    name = _aten_name(node)
    base = name.removesuffix("_") if name.endswith("_") and not name.endswith("__") else name  # relu_ -> relu
    if base in DROPPED_OUTPUTS:  # as the fx capture: what the torch function returns
        outs = [t for i, t in enumerate(outs) if i == 0 or _read(node, i)]
    out_bytes = sum(t.nbytes for t in outs)
    # can its result carry a gradient: not one made under torch.inference_mode() (export marks no region for
    # it); where capture is called under inference_mode, every result is an inference tensor: none is told apart
    inference = not torch.is_inference_mode_enabled() and any(
        t.is_inference() for t in collect(node.meta["val"], torch.Tensor))
    grad = grad_enabled and any(t.floating for t in outs) and not inference
    if base in EXPORT_SHAPE_ONLY or (base in EXPORT_DROPOUT and not (training and _train_arg(node))):
        return b.fold(ins, out_bytes, grad=grad and base != "detach")
    lookup = False
    if base in GATHERS and arg_nodes and node.args and arg_nodes[0] is node.args[0]:  # reads the part it takes
        lookup = is_lookup(ins[0])
        ins = [b.fold(ins[:1], out_bytes), *ins[1:]]
    if base in FACTORIES:  # zeros_like(x), x.new_zeros(n): a new tensor of x's shape, not of its data
        ins = _data_inputs(base, node, arg_nodes, ins)
        if not any(v.deps or v.params for v in ins):
            return b.constant()
    overload = getattr(node.target, "_overloadname", "")
    cost = Cost("embedding", 0.0) if lookup else _cost(base, overload, _resolve(node.args), _resolve(dict(node.kwargs)), outs, training)
    if cost is None:
        cost = elementwise(base, outs)
        b.fallback_kinds.append(base)
    return b.cost_op(_op_name(node, prefix), _scope(node), ins, cost, outs, differentiable=grad, after=after)


def _read(node: Node, i: int) -> bool:
    """Whether output i of a node with several is read (by the graph or as an output of the model)."""
    return any(u.target is operator.getitem and u.args[1] == i and u.users for u in node.users)


def _cost(name: str, overload: str, args: tuple, kwargs: dict, outs: list[Any], training: bool) -> Cost | None:
    """The cost of an ATen op by its name (see the module docstring); None: no rule."""
    ins = tensors(args) + tensors(kwargs)
    if name in EXPORT_DROPOUT:
        n = outs[0].numel
        return Cost("dropout", float(n), saved_bytes=n)
    if name in FACTORIES:
        return Cost(name, 0.0)
    if name == "tensordot":  # (self, other, dims_self, dims_other)
        macs = outs[0].numel * math.prod(ins[0].shape[i] for i in args[2])
        return Cost("matmul", 2.0 * macs, float(macs))
    if name in ("embedding_bag", "embedding_bag_forward_only"):  # (weight, indices, offsets, scale_grad_by_freq,
        weight = ins[0]  # mode, sparse, per_sample_weights, ...)
        mode = EMBEDDING_BAG_MODES.get(args[4] if len(args) > 4 else kwargs.get("mode", 0), "sum")
        weighted = (args[6] if len(args) > 6 else kwargs.get("per_sample_weights")) is not None
        return embedding_bag_cost(ins[1], weight.shape[-1], weight.itemsize, mode, weighted, outs[0])
    if name.startswith("scaled_dot_product") and name.endswith("attention"):  # the fused kernels' names too
        name = "scaled_dot_product_attention"
    if name in RNN_MODES:  # lstm.input(input, hx, params, has_biases, num_layers, dropout, train, bidirectional,
        if overload != "input":  # batch_first); lstm.data (a packed sequence): no rule
            return None
        return _rnn_cost(_rnn_layer(name, args), ins, training)
    if name in UPSAMPLE_MODES:
        return interpolate_cost(ins[0], outs[0], UPSAMPLE_MODES[name])
    if name in ("grid_sampler", "grid_sampler_2d", "grid_sampler_3d"):  # (input, grid, interpolation_mode, ...)
        return function_cost("grid_sample", (*args[:2], GRID_SAMPLE_MODES.get(args[2])), {}, outs, training)
    return function_cost(ATEN_RULES.get(name, name), args, kwargs, outs, training)


def _rnn_layer(name: str, args: tuple) -> SimpleNamespace:
    """The attributes of the nn.LSTM / GRU / RNN that makes the call `aten.{name}(input, hx, params, ...)`,
    for `flops._rnn_cost`: sizes from its state and weights (per layer and direction: w_ih, w_hh, then b_ih,
    b_hh with biases, then w_hr with projections)."""
    hx, params, bias, layers, bidirectional, batch_first = tensors(args[1]), args[2], *args[3:5], *args[7:9]
    hidden = hx[-1].shape[-1]  # an LSTM's state is (h, c): c has hidden_size features, h proj_size or those
    proj = hx[0].shape[-1] if hx[0].shape[-1] != hidden else 0
    return SimpleNamespace(mode=RNN_MODES[name], input_size=params[0].shape[1], hidden_size=hidden, proj_size=proj,
                           num_layers=layers, bias=bias, bidirectional=bidirectional, batch_first=batch_first)


def capture(
    module: nn.Module,
    example_inputs: Sequence[Any] = (),
    *,
    example_kwargs: Mapping[str, Any] | None = None,
    name: str,
    mode: str = "inference",
    metadata: Mapping[str, Any] | None = None,
) -> OpGraph:
    """Capture `module(*example_inputs, **example_kwargs)` as the `OpGraph` named `name`, through torch.export
    (tensor inputs given by keyword are inputs named by their argument; other values are constants).

    As `suite.capture.fx.capture`: `mode` is "inference" or "training" (forward, backward and update ops;
    the module's output must then be the loss); metadata gets the mode, parameter count, forward MACs and
    FLOPs, and "capture": "torch.export".
    """
    if mode not in MODES:
        raise GraphError(f"capture mode {mode!r} is not one of {', '.join(MODES)}")
    if not isinstance(example_inputs, list | tuple):
        example_inputs = (example_inputs,)
    fg = forward_graph(module, example_inputs, example_kwargs=example_kwargs, training=mode == "training")
    meta = {"capture": "torch.export", "capture_version": CAPTURE_VERSION, **(metadata or {})}
    return fg.lower(name, mode, meta)
