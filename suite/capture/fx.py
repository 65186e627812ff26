"""Capture a PyTorch `nn.Module` (plus example inputs) into an `OpGraph` with torch.fx.

How: `torch.fx` symbolic tracing with our tracer, then an interpreter run on the example inputs that
records every node's result shape and dtype (pass meta tensors, and build the model under
`torch.device("meta")`, to capture a large model without allocating or computing anything), then one walk
over the fx graph that fills the IR of `suite.capture.ir`. Tracing and the run leave the module's buffers as
they were (BatchNorm's running statistics in training mode), the example inputs too (`x.add_(1)` in forward)
and torch's random state (dropout's draws); tracing leaves the module's other attributes as they were too
(`self.attn = a` in forward would leave a torch.fx Proxy bound, `self.calls += 1` would count the trace): an
attribute that forward assigns is no state of the graph, which reads its value before the call (`self.h` of
a previous call is not followed).
Tracing runs forward's Python code: a buffer update that torch.fx does not record (`self.n += 1` or
`self.n.add_(1)` on values that are not the inputs', `self.run = ...`) would be done once, while tracing, and
never by the graph, so it is refused (GraphError naming the buffer); one that it records
(`self.run.copy_(x.mean(0))`, `self.buf.add_(x)`, `out=self.buf`) is an op, and the graph keeps forward's order
around it: the ops that read the buffer after it (or a view of it, one taken before the write too) read
it, an edge carrying the bytes they read (a data dependence: on another device they need the new values);
it follows the ops that read the
buffer since the write before (or since the start), by edges of 0 bytes (an order only: it reads nothing of
theirs; no gradient flows along them), and `copy_` follows the write before, which it overwrites unread, the
same way. Until the first write a buffer is a constant: an op that reads it there has no edge for it and
counts none of its bytes read, and the graph, one step, does not show that this read at the next step
needs the value the write leaves (a transfer where they are on different devices). A value that forward
computes from such a buffer alone (`self.buf * 2.0`, `self.buf.sum()`, `self.buf.view(1, 4)`, before or after the write) is traced as a
node reading the buffer where forward reads it (torch.fx would compute it once, while tracing, and keep the
result, stale after the write), so the backends compute it at each step, as eager PyTorch does; a branch on
its values (`if self.buf.sum() > 0:`) is refused by torch.fx. Example
inputs are positional (`example_inputs`) or by name (`example_kwargs`, as `model(input_ids=..., mask=...)`);
values without tensors (None, a flag, a number), and the arguments of `forward` that neither gives, which
keep their defaults, are traced as constants (`mask=None`: `if mask is not None` takes the branch the call
takes). Where the positional inputs reach forward's *args (`forward(self, x, *args, c=None)`), they fill
the arguments before it, then *args, each input of its own ("args_0", "args_1", as torch.export names them;
values without tensors are constants), so that forward may iterate over them; by name, only its
keyword-only arguments and its **kwargs can be given. A forward
that takes **kwargs (`forward(self, x, **kwargs)`, passing them on or reading `kwargs.get("mask")`) gets
the keyword inputs that its named arguments do not take, as eager does: tensors are inputs named by their
keys, other values constants, and none given is an empty dict. The module is
traced and run in the mode's state (`mode_flags`): inference, every module in eval() (an
inference graph has no `if self.training:` branch, whether or not the caller called `eval()`); training, every
module in train(), except the modules that the user put in eval() under a root in train() (a frozen
BatchNorm), as eager training runs them; each module's flag is restored after.

What becomes an op:
* leaf modules: modules with a `capture_cost` method (our LSTM cell, attention step), `nn.LSTM`/`GRU`/`RNN`
  and `nn.MultiheadAttention` (one fused op each), and every other `torch.nn` module without children
  (Linear, Conv2d, BatchNorm2d, ReLU, ...). Other modules (containers, user modules) are traced through.
  A `torch.compile`d module is captured as the module it compiles (a submodule's path is then torch's own,
  "fc._orig_mod").
* every call_function / call_method node that is not shape-only;
* every placeholder that carries a tensor (kind "input").

What is folded into its producers (never losing a dependency, see `ForwardBuilder.fold`): view, reshape,
permute, transpose, getitem (not by a tensor: `x[:, idx]`, `x[mask]` copy what they take, an op of kind
"index" costed as `index_select`, see `flops.GATHERS`; of a parameter, `self.weight[idx]`, an embedding lookup),
flatten, squeeze/unsqueeze, expand, chunk/split, contiguous, size, detach,
`nn.Identity`/`nn.Flatten`, dropout in inference mode (in training mode dropout is an elementwise op, but a
dropout module in eval() and a call with `training=False`, `F.dropout(x, p, self.training)` there, are
folded), and building a dataclass output object (`ModelOutput(loss=..., logits=...)`: its tensors are the
outputs).
In training graphs no gradient flows back through `detach()` or `.data` (a parameter read only so is not
trained, as a frozen one), through a folded value without floating-point
tensors (the indices of `max`), through an op whose outputs are all integer or bool (comparisons, argmax),
or through what forward computes with gradients off (`with torch.no_grad():`, `torch.inference_mode()`: a
frozen backbone's ops get no backward and its weights no update, as in eager training).
Values computed from no model input and no parameter (shapes, `torch.arange`, buffers) are constants, and so
are new tensors made in the shape of another (`torch.zeros_like(x)`, `x.new_zeros(n)`): they read no data,
and no gradient flows through them. torch.fx does not follow parameters read through `module.parameters()`:
what is computed from them is a constant too, which training mode refuses (its gradient would be missing).
An in-place call (`y.add_(1)`, `torch.relu_(y)`, `F.relu(y, inplace=True)`, `nn.ReLU(inplace=True)`)
overwrites its first argument, a call with `out=y` overwrites y: the ops that read that tensor afterwards
read the in-place op. So does an augmented assignment to a tensor (`y += 1` is `y.add_(1)`, op "add_"; `*=`,
`/=` and the others alike), which torch.fx would record as an out-of-place add (`b = a; b += 1; fc2(a)` then
read the old a); on a value that is no tensor (a size, `n += 1`) it is the Python operator. Which of the two
it is shows only on the values: capture tells them apart in its one run on the example inputs, but
`traced_module` (the graph module the backends run) runs the graph once for it where forward has an
augmented assignment (a side effect of a leaf module's forward, a counter, then happens once more).
An in-place call or augmented assignment that writes to memory another live value shares (`y[0].mul_(2)`, `v = y.view(-1); v += 1`, or `y.mul_(2)` while a view of
y is still to be read) is refused: the graph would miss the dependency.
In training mode a frozen parameter (requires_grad=False) is resident but gets no gradient, no update and no
optimizer state (`suite.capture.training`); the graph's metadata "frozen_params" counts them, and the
parameters that forward reads only without a gradient (through `detach()`, under `torch.no_grad()`), which
are not trained either. A parameter that forward never reads (an unused head, an `nn.Parameter` left over) is
not in the graph: not in "params" or "param_bytes", in no device's memory, and not updated (eager SGD skips
it too: its grad stays None).

FLOPs follow `suite.capture.flops`. Ops that no rule covers count 1 FLOP per output element; their kinds are
listed in the graph's metadata under "fallback_cost_kinds" and named in a warning (one per capture). Sizes
come from the recorded dtypes (fp32 for the zoo). An op's scope is its module path: the leaf module's
qualified name, or the innermost module whose forward called the function. Op names: the module path of a
module called once ("layer1.0.conv1"), "{path}/{i}" for the i-th call of a module called several times
("lstm.0/3": layer 0 at step 3), and "{scope}/{fx node name}" for functions ("layer1.0/add"); inputs keep
their argument names. A name that a module's path already has gets a suffix ("fc_2" for an input named "fc" of
a model with a module "fc").
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import math
import operator
import os
import sys
import traceback
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import torch
import torch.nn as nn
from torch.fx import GraphModule, Interpreter, Node, Proxy, Tracer
from torch.fx.node import map_aggregate
from torch.overrides import TorchFunctionMode

from suite.capture import CAPTURE_VERSION
from suite.capture.flops import (
    DROPOUT,
    FACTORIES,
    GATHERS,
    SHAPE_ONLY,
    Cost,
    TensorInfo,
    _arg,
    collect,
    elementwise,
    function_cost,
    module_cost,
    tensors,
)
from suite.capture.ir import MODES, ForwardBuilder, ForwardGraph, Value, is_lookup
from suite.errors import GraphError
from suite.graph import OpGraph

_SHAPE_ONLY_MODULES = (nn.Identity, nn.Flatten, nn.Unflatten)
_DROPOUT_MODULES = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)
_FUSED_LEAVES = (nn.LSTM, nn.GRU, nn.RNN, nn.MultiheadAttention)


class CaptureTracer(Tracer):
    """Keeps the modules that become one op as leaves; traces through everything else. Each node records
    in `meta["grad_enabled"]` whether gradients were on where forward made it (off under `torch.no_grad()`,
    `torch.inference_mode()` or `set_grad_enabled(False)` inside forward; `trace` starts with them on).
    With `var_positional` (the example values that reach forward's *args), *args is the tuple of those: a
    tensor one a placeholder of its own ("args_0", "args_1", as torch.export names them), any other value as
    given; torch.fx would trace *args as one input, a Proxy that cannot be iterated (`for a in args:`).
    With `var_keywords` (name -> example value), forward's **kwargs is the dict of those, as the call passes
    it: a tensor one a placeholder of its name (after the others), any other value as given; torch.fx would
    trace it as one input whose every entry looks given."""

    var_positional: Sequence[Any] | None = None
    var_keywords: Mapping[str, Any] | None = None

    def create_args_for_root(self, root_fn: Any, is_module: bool, concrete_args: Any = None) -> Any:
        fn, args = super().create_args_for_root(root_fn, is_module, concrete_args)
        args = list(args)
        for i, a in enumerate(args):  # torch.fx's "*args" placeholder, then its "**kwargs" one
            target = str(a.node.target) if isinstance(a, Proxy) and a.node.op == "placeholder" else ""
            if self.var_positional is not None and target.startswith("*") and not target.startswith("**"):
                self.graph.erase_node(a.node)
                args[i] = tuple(self.create_proxy("placeholder", f"{target[1:]}_{j}", (None,), {})
                                if collect(v, torch.Tensor) else v for j, v in enumerate(self.var_positional))
            elif self.var_keywords is not None and target.startswith("**"):
                self.graph.erase_node(a.node)
                args[i] = {k: self.create_proxy("placeholder", k, (None,), {}) if collect(v, torch.Tensor) else v
                           for k, v in self.var_keywords.items()}  # a default: they may follow a traced default
        return fn, args

    def call_module(self, m: nn.Module, forward: Any, args: Any, kwargs: Any) -> Any:
        original = _uncompiled(m)
        if original is not m:  # a torch.compile'd submodule: traced as the module it compiles
            return self.call_module(original, original.forward, args, kwargs)
        return super().call_module(m, forward, args, kwargs)

    def create_node(self, *args: Any, **kwargs: Any) -> Node:
        node = super().create_node(*args, **kwargs)
        node.meta["grad_enabled"] = torch.is_grad_enabled()
        return node

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return is_leaf(m)

    def proxy(self, node: Node) -> Proxy:
        return _AugmentedProxy(node, self)


# augmented assignments: the in-place call each is on a tensor (`y += 1` is `y.add_(1)`), and the operator it is
# on an immutable value (`n += 1` on a size is `n + 1`)
_AUGMENTED = {"__iadd__": ("add_", operator.add), "__isub__": ("sub_", operator.sub),
              "__imul__": ("mul_", operator.mul), "__itruediv__": ("div_", operator.truediv),
              "__ifloordiv__": ("floor_divide_", operator.floordiv), "__imod__": ("remainder_", operator.mod),
              "__ipow__": ("pow_", operator.pow), "__iand__": ("bitwise_and_", operator.and_),
              "__ior__": ("bitwise_or_", operator.or_), "__ixor__": ("bitwise_xor_", operator.xor)}


class _AugmentedProxy(Proxy):
    """A Proxy that records an augmented assignment (`y += 1`) as the in-place call it is on a tensor (`y.add_(1)`,
    marked `meta["augmented"]`); torch.fx's Proxy records it as `y + 1`, which leaves y as it was, so another name
    of that tensor (`b = a; b += 1`, a view of it) would read the old values. `_resolve_augmented` makes one on
    a value that is not a tensor (a size: `n += 1`) the Python operator again."""


def _augmented(dunder: str, method: str) -> Any:
    def record(self: Proxy, other: Any) -> Proxy:
        proxy = self.tracer.create_proxy("call_method", method, (self, other), {})
        proxy.node.meta["augmented"] = dunder
        return proxy

    return record


for _dunder, (_method, _) in _AUGMENTED.items():
    setattr(_AugmentedProxy, _dunder, _augmented(_dunder, _method))
_AugmentedProxy.__name__ = "Proxy"  # as torch.fx's errors name it ("'Proxy' object cannot be interpreted as ...")


def is_leaf(m: nn.Module) -> bool:
    """Does the fx capture keep `m` as one op (a leaf: a capture_cost rule, a fused RNN / attention, a torch.nn
    module without children)?"""
    if callable(getattr(m, "capture_cost", None)) or isinstance(m, _FUSED_LEAVES):
        return True
    if isinstance(m, nn.Sequential | nn.ModuleList | nn.ModuleDict):
        return False
    return type(m).__module__.startswith("torch.nn") and not any(True for _ in m.children())


def _uncompiled(m: nn.Module) -> nn.Module:
    """The module that `torch.compile` compiled into `m` (its `_orig_mod`, same parameters), else m."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")  # loaded once anything is compiled
    compiled = getattr(eval_frame, "OptimizedModule", None)
    return m._orig_mod if compiled is not None and isinstance(m, compiled) else m


class _ShapeRecorder(Interpreter):
    """Runs the graph once and keeps, per node, its result with tensors replaced by `TensorInfo`.

    It also finds in-place calls that write to memory another live value shares (`view_writes`: the call and
    that value's node): `y[0].mul_(2)` writes through a view of y, and `v = y.view(-1); y.mul_(2)` changes v.
    The graph follows an in-place call only through the name it overwrites (its later readers read the call),
    so such a write would be missed by the graph's dependencies and by split placements.
    And it finds the augmented assignments (`_AugmentedProxy`) to a value that is no tensor (`plain`: `n += 1`
    on a size), which it computes with the Python operator; `_make_plain` makes them that operator."""

    def __init__(self, gm: GraphModule) -> None:
        super().__init__(gm)
        self.info: dict[Node, Any] = {}
        self.view_writes: list[tuple[Node, Node]] = []
        self.plain: list[Node] = []
        self._names: dict[Node, list[Node]] = {}  # a tensor's names: its producer and the in-place calls on it
        self.failed: tuple[Node, str] | None = None  # the node that raised and its error, as raised

    def run_node(self, n: Node) -> Any:
        plain = "augmented" in n.meta and not isinstance(self.env.get(n.args[0]), torch.Tensor)
        mutated = None if plain else _mutated_arg(n)
        if mutated is not None and isinstance(self.env.get(mutated), torch.Tensor):
            other = self._sharing(self.env[mutated], self._names.get(mutated, [mutated]))
            if other is not None:
                self.view_writes.append((n, other))
        try:
            if plain:
                self.plain.append(n)
                result = _AUGMENTED[n.meta["augmented"]][1](*self.map_nodes_to_values(n.args, n))
            else:
                result = super().run_node(n)
        except Exception as exc:  # Interpreter.run appends fx's node dump and stack notes to the message
            self.failed = (n, str(exc))
            raise
        self.info[n] = map_aggregate(result, _to_info)
        if mutated is not None:
            _overwritten(self._names, mutated, n)
        return result

    def _sharing(self, t: torch.Tensor, same: list[Node]) -> Node | None:
        """A live value other than the names in `same` whose tensor shares t's memory, else None: t itself, a
        view of it or a tensor t views (by their bases, which meta tensors have too), or one on the same
        storage (`detach()`; meta tensors' storages have no addresses, so that case is not seen on them),
        where the two touch a common element (`a, b = y.chunk(2)`: writing a leaves b as it was)."""
        root = t if t._base is None else t._base
        ptr = t.untyped_storage().data_ptr()

        def shares(x: torch.Tensor) -> bool:
            return ((x if x._base is None else x._base) is root
                    or (ptr != 0 and x.untyped_storage().data_ptr() == ptr)) and _overlap(t, x)

        for node, value in self.env.items():
            if node not in same and any(shares(x) for x in collect(value, torch.Tensor)):
                return node
        return None


_OVERLAP_CHECK_BYTES = 1 << 24  # two tensors spanning more of one storage are taken to overlap


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors on one storage touch a common byte, by their offsets, strides and sizes (so on
    meta tensors too): exactly where the bytes they span together are at most `_OVERLAP_CHECK_BYTES`, else
    True where their spans meet."""
    if a.numel() == 0 or b.numel() == 0:
        return False
    if a is b or any(s < 0 for x in (a, b) for s in x.stride()):
        return True

    def layout(x: torch.Tensor) -> tuple[int, int, tuple[int, ...], tuple[int, ...]]:
        size = x.element_size()
        start = x.storage_offset() * size
        end = start + sum((n - 1) * s for n, s in zip(x.shape, x.stride(), strict=True)) * size + size
        return start, end, (*x.shape, size), (*(s * size for s in x.stride()), 1)

    (a0, a1, a_shape, a_stride), (b0, b1, b_shape, b_stride) = layout(a), layout(b)
    if a1 <= b0 or b1 <= a0:
        return False
    lo = min(a0, b0)
    if max(a1, b1) - lo > _OVERLAP_CHECK_BYTES:
        return True
    touched = torch.zeros(max(a1, b1) - lo, dtype=torch.bool, device="cpu")  # also under torch.device("meta")
    touched.as_strided(a_shape, a_stride, a0 - lo).fill_(True)
    return bool(touched.as_strided(b_shape, b_stride, b0 - lo).any())


def _to_info(x: Any) -> Any:
    """A tensor's `TensorInfo`; a dataclass instance (a model's output object) as the dict of its fields."""
    if isinstance(x, torch.Tensor):
        return TensorInfo(tuple(int(d) for d in x.shape), int(x.element_size()),
                          x.is_floating_point() or x.is_complex())
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: map_aggregate(getattr(x, f.name), _to_info) for f in dataclasses.fields(x)}
    return x


def _target_name(node: Node) -> str:
    if node.op == "call_method":
        return str(node.target)
    return getattr(node.target, "__name__", str(node.target)).lstrip("_")


def _scope(node: Node) -> str:
    if node.op == "call_module":
        return str(node.target)
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path = list(stack.values())[-1][0]
    return str(path)


def _arg_nodes(node: Node) -> list[Node]:
    return collect((node.args, node.kwargs), Node)


def _resolve(x: Any, info: Mapping[Node, Any]) -> Any:
    """Replace fx nodes in args by their recorded results (TensorInfo or plain values)."""
    if isinstance(x, Node):
        return info.get(x)
    if isinstance(x, list):
        return [_resolve(y, info) for y in x]
    if isinstance(x, tuple):
        return tuple(_resolve(y, info) for y in x)
    if isinstance(x, dict):
        return {k: _resolve(v, info) for k, v in x.items()}
    return x


def trace(module: nn.Module, num_inputs: int | None = None, keywords: Collection[str] = (),
          constants: Mapping[str, Any] | None = None, written: Collection[torch.Tensor] = (),
          var_keywords: Mapping[str, Any] | None = None, var_positional: Sequence[Any] = ()) -> GraphModule:
    """Symbolically trace `module` with the capture tracer (GraphError if torch.fx cannot). With `num_inputs`,
    the arguments of `forward` after the first `num_inputs` that have defaults, except those named in
    `keywords` (tensor inputs given by keyword), are traced with their default values (`mask=None`:
    `if mask is not None` takes the branch the call takes), and those in `constants` with the values given.
    A tensor computed from the buffers in `written` (those forward writes) alone is a node (`_BufferReads`).
    With `num_inputs`, forward's *args is the tuple of `var_positional` and its **kwargs the dict of
    `var_keywords` (`CaptureTracer`; empty by default)."""
    tracer = CaptureTracer()
    if num_inputs is not None:
        tracer.var_positional = tuple(var_positional)
        tracer.var_keywords = dict(var_keywords or {})
    concrete = {**(_defaults_after(module, num_inputs, keywords) or {}), **(constants or {})} or None
    reads = _BufferReads(tracer, written) if written else contextlib.nullcontext()
    try:
        with _transformer_layers_traceable(), torch.enable_grad(), reads:
            graph = tracer.trace(module, concrete_args=concrete)
    except Exception as exc:  # noqa: BLE001 - fx raises many kinds; report one clear error
        raise GraphError(f"torch.fx cannot trace {type(module).__name__}: {exc}{_where(exc)}") from exc
    return GraphModule(tracer.root, graph)


class _BufferReads(TorchFunctionMode):
    """While tracing: a torch call on tensors none of which is traced, one of them a buffer in `written` (or a view
    of one), that returns a tensor (`self.buf * 2.0`, `self.buf.sum()`, `torch.cat([self.buf, c])`,
    `self.buf.view(1, 4)`) is recorded as a node reading the buffer there (a get_attr made at that call),
    instead of computed once by torch.fx into a constant that the graph and the backends would read at every
    step: stale after forward's write, and a view (on the buffer's memory) too once a backend moves the
    buffer to another device. Calls that return no tensor (sizes, dtype), the buffer itself (`.float()` of a
    float one: torch.fx reads it where it is used) or an attribute that is no view of it (`.shape`) are
    left to run; one that is (`self.buf.T`, `.mT`) is a node too, and `.data` is the buffer (its get_attr)."""

    def __init__(self, tracer: Tracer, written: Collection[torch.Tensor]) -> None:
        super().__init__()
        self.tracer = tracer
        self.written = {_memory(t) for t in written}
        self._buffers = {id(t) for t in written}

    def _reads(self, x: Any) -> bool:
        return isinstance(x, torch.Tensor) and _memory(x) in self.written

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        given = collect((args, kwargs), torch.Tensor)
        if collect((args, kwargs), Proxy) or not any(map(self._reads, given)):
            return result
        made = collect(result, torch.Tensor)
        if not made or all(id(t) in self._buffers for t in made):
            return result  # no tensor, the buffer itself (self.buf.float())
        as_node = lambda x: Proxy(self.tracer.create_arg(x), self.tracer) if self._reads(x) else x  # noqa: E731
        if getattr(func, "__name__", "") == "__get__":  # an attribute: a view of the buffer (.T, .mT) is a node
            name = getattr(getattr(func, "__self__", None), "__name__", None)
            if name == "data":  # the buffer's memory without autograd: the buffer, read where it is used
                return as_node(args[0])
            view = len(made) == 1 and made[0]._base is not None and self._reads(made[0])
            return getattr(as_node(args[0]), name) if view and isinstance(name, str) else result
        args, kwargs = map_aggregate((args, kwargs), as_node)
        if func is torch.Tensor.__getitem__:  # as torch.fx records x[i]: operator.getitem
            return args[0][args[1]]
        return Proxy.__torch_function__(func, (Proxy,), args, kwargs)


@contextlib.contextmanager
def _transformer_layers_traceable():
    """While tracing, torch's `nn.TransformerEncoderLayer`, `TransformerDecoderLayer`, `TransformerEncoder` and
    `TransformerDecoder` take their plain path: the attention fast path (a fused inference kernel, the same
    results) is off, as its checks (`src.dim() != 3`) branch on the input; and the encoder's sequence length,
    read only to detect a causal mask, is not taken from a traced input (`src.is_nested`). `nn.Transformer`
    checks its inputs' sizes with `torch._assert` (`_traceable_transformer_forward`), where this torch's
    forward has the signature that function copies; else it is refused (its Python `if`s on sizes)."""
    from torch.nn.modules import transformer

    mha = getattr(torch.backends, "mha", None)
    fastpath = mha.get_fastpath_enabled() if mha is not None else None
    seq_len = getattr(transformer, "_get_seq_len", None)
    is_causal_mask = getattr(transformer, "_detect_is_causal_mask", None)
    forward = transformer.Transformer.forward
    same = _signature(forward) == _signature(_traceable_transformer_forward)

    def traced_seq_len(src: Any, batch_first: bool) -> Any:
        return None if isinstance(src, Proxy) else seq_len(src, batch_first)

    def traced_is_causal(mask: Any, is_causal: Any = None, size: Any = None) -> Any:
        if isinstance(mask, Proxy) and is_causal is None:
            return False  # the mask is applied as given (torch would drop a causal one for the same is_causal)
        return is_causal_mask(mask, is_causal, size)

    if mha is not None:
        mha.set_fastpath_enabled(False)
    if seq_len is not None:
        transformer._get_seq_len = traced_seq_len
    if is_causal_mask is not None:
        transformer._detect_is_causal_mask = traced_is_causal
    if same:
        transformer.Transformer.forward = _traceable_transformer_forward
    try:
        yield
    finally:
        if mha is not None:
            mha.set_fastpath_enabled(fastpath)
        if seq_len is not None:
            transformer._get_seq_len = seq_len
        if is_causal_mask is not None:
            transformer._detect_is_causal_mask = is_causal_mask
        transformer.Transformer.forward = forward


def _signature(f: Any) -> list[tuple[str, Any]]:
    return [(p.name, p.default) for p in inspect.signature(f).parameters.values()]


def _traceable_transformer_forward(self, src, tgt, src_mask=None, tgt_mask=None, memory_mask=None,  # noqa: ANN001
                                   src_key_padding_mask=None, tgt_key_padding_mask=None,
                                   memory_key_padding_mask=None, src_is_causal=None, tgt_is_causal=None,
                                   memory_is_causal=False):
    """`nn.Transformer.forward` with its checks of the inputs' sizes as `torch._assert` calls, which torch.fx
    records and the run on the example inputs evaluates (torch's `if`s on traced sizes cannot be traced)."""
    batch = 0 if self.batch_first else 1
    torch._assert((src.dim() != 3) | (src.size(batch) == tgt.size(batch)),
                  "the batch number of src and tgt must be equal")
    torch._assert((src.size(-1) == self.d_model) & (tgt.size(-1) == self.d_model),
                  "the feature number of src and tgt must be equal to d_model")
    memory = self.encoder(src, mask=src_mask, src_key_padding_mask=src_key_padding_mask, is_causal=src_is_causal)
    return self.decoder(tgt, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                        tgt_key_padding_mask=tgt_key_padding_mask,
                        memory_key_padding_mask=memory_key_padding_mask, tgt_is_causal=tgt_is_causal,
                        memory_is_causal=memory_is_causal)


def _where(exc: BaseException, skip: str = os.path.dirname(torch.fx.__file__)) -> str:
    """" (at FILE:LINE: CODE)" for the innermost frame of the traceback outside the folder `skip` (torch.fx)
    and `suite.capture`: the model's line that tracing could not follow (`if x.sum() > 0:`,
    `range(x.shape[0])`); "" if there is none."""
    skipped = (skip + os.sep, os.path.dirname(__file__) + os.sep)
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if not frame.filename.startswith(skipped):
            code = f": {frame.line.strip()}" if frame.line else ""
            return f" (at {frame.filename}:{frame.lineno}{code})"
    return ""


def _defaults_after(module: nn.Module, num_inputs: int | None, keywords: Collection[str] = ()) -> dict[str, Any] | None:
    """The default values of `module.forward`'s arguments after the first `num_inputs`, by name, except those
    named in `keywords`; where the inputs reach forward's *args, those of its keyword-only arguments."""
    if num_inputs is None:
        return None
    try:
        params = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params[:num_inputs + 1]):
        params = [p for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY]
    else:
        params = params[num_inputs:]
    return {p.name: p.default for p in params if p.default is not inspect.Parameter.empty
            and p.kind is not inspect.Parameter.VAR_KEYWORD and p.name not in keywords} or None


def _as_root(module: nn.Module, num_inputs: int, keywords: Sequence[str] = (),
             constants: Mapping[str, Any] | None = None) -> nn.Module:
    """A module that is itself a leaf (nn.Linear, an LSTM cell) is wrapped, as submodule "module", so that it
    stays one op instead of being traced through; the wrapper takes `num_inputs` positional arguments, then
    those named in `keywords`, and passes those on by keyword, with the values in `constants`."""
    if not is_leaf(module):
        return module
    try:
        arg_names = list(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        arg_names = []
    graph = torch.fx.Graph()
    args = tuple(graph.placeholder(arg_names[i] if i < len(arg_names) else f"input_{i}") for i in range(num_inputs))
    kwargs = {**(constants or {}), **{k: graph.placeholder(k) for k in keywords}}
    graph.output(graph.call_module("module", args, kwargs))
    root = nn.Module()
    root.module = module
    return GraphModule(root, graph)


def _example_args(what: str, module: nn.Module, example_inputs: Sequence[Any],
                  example_kwargs: Mapping[str, Any]) -> tuple[tuple[Any, ...], list[str], list[str]]:
    """The values of `forward`'s arguments in the order of the graph's placeholders (the positional example
    inputs, then for each later argument its keyword example input or its default, then the keyword inputs
    with tensors that only its **kwargs takes, `CaptureTracer.var_keywords`; where the inputs reach
    forward's *args, torch.fx's order: the arguments before *args, the keyword-only ones, the inputs in *args
    that hold tensors (`CaptureTracer.var_positional`), then those in **kwargs), the
    names of the positional ones (none where forward takes *args) and the names given by keyword, in
    forward's order; GraphError naming an argument that is missing, unknown or given twice, or too many
    positional inputs."""
    n = len(example_inputs)
    np = sys.modules.get("numpy")
    for where, x in [*((f"example input {i}", x) for i, x in enumerate(example_inputs)),
                     *((f"keyword example input {k!r}", x) for k, x in example_kwargs.items())]:
        if np is not None and collect(x, np.ndarray):
            raise GraphError(f"{what}: {where} is or holds a numpy array; pass torch tensors (torch.from_numpy)")
    try:
        params = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        params = None
    if params is None:
        if example_kwargs:
            raise GraphError(f"{what}: keyword example inputs need forward's arguments by name, and its forward "
                             f"has no signature; give them positionally")
        return tuple(example_inputs), [], []
    var = [i for i, p in enumerate(params[:n + 1]) if p.kind is inspect.Parameter.VAR_POSITIONAL]
    var_keyword = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    if var:  # torch.fx puts the keyword-only arguments before *args: forward(x, *args, c=None) is (x, c, *args)
        kwonly = [p for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY]
        for k in example_kwargs:
            if k in [p.name for p in params[:var[0]]]:
                raise GraphError(f"{what}: argument {k!r} is given twice, as example input "
                                 f"{[p.name for p in params].index(k)} and by keyword")
            if k not in [p.name for p in kwonly] and not var_keyword:
                raise GraphError(f"{what}: keyword example input {k!r} is not a keyword-only argument of forward, "
                                 f"which takes *args; give the others positionally")
        values = []
        for p in kwonly:
            if p.name not in example_kwargs and p.default is inspect.Parameter.empty:
                raise GraphError(f"{what}.forward needs keyword-only argument {p.name!r}, which the example "
                                 f"inputs do not give (give it in example_kwargs)")
            values.append(example_kwargs.get(p.name, p.default))
        given = [p.name for p in kwonly if p.name in example_kwargs]
        extra = [x for x in example_inputs[var[0]:] if collect(x, torch.Tensor)]  # the others: constants
        in_kwargs = [x for k, x in example_kwargs.items() if k not in given and collect(x, torch.Tensor)]
        return (*example_inputs[:var[0]], *values, *extra, *in_kwargs), [], given
    named = [p for p in params if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
    names = [p.name for p in named]
    positional = [p.name for p in named if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    if n > len(positional):
        raise GraphError(f"{what}.forward takes {len(positional)} positional argument(s) "
                         f"({', '.join(positional) or 'none'}); {n} example inputs were given")
    for k in example_kwargs:
        if k not in names and not var_keyword:
            raise GraphError(f"{what}.forward has no argument {k!r} (keyword example inputs name its arguments: "
                             f"{', '.join(names) or 'none'})")
        if k in names[:n]:
            raise GraphError(f"{what}: argument {k!r} is given twice, as example input {names.index(k)} and by "
                             f"keyword")
    args = list(example_inputs)
    for p in named[n:]:
        if p.name in example_kwargs:
            args.append(example_kwargs[p.name])
        elif p.default is not inspect.Parameter.empty:
            args.append(p.default)
        else:
            hint = _dict_hint(example_inputs)
            raise GraphError(f"{what}.forward needs argument {p.name!r}, which the example inputs do not give "
                             f"({n} positional, keywords: {', '.join(example_kwargs) or 'none'}){hint}")
    args += [x for k, x in example_kwargs.items() if k not in names and collect(x, torch.Tensor)]  # in **kwargs
    return tuple(args), names[:n], [k for k in names if k in example_kwargs]


def _star_args_at(module: nn.Module, n: int) -> int:
    """How many of `n` positional inputs come before forward's *args: those after reach it (n where forward
    takes no *args, or the inputs end before it)."""
    try:
        params = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        return n
    return next((i for i, p in enumerate(params[:n + 1]) if p.kind is inspect.Parameter.VAR_POSITIONAL), n)


def _dict_hint(example_inputs: Sequence[Any]) -> str:
    """What an error adds where a dict was given as a positional example input (meant as keyword inputs)."""
    if any(isinstance(x, Mapping) for x in example_inputs):
        return "; a dict among the example inputs is one argument: give keyword inputs as example_kwargs"
    return ""


def forward_graph(module: nn.Module, example_inputs: Sequence[Any], *, example_kwargs: Mapping[str, Any] | None = None,
                  training: bool = False) -> ForwardGraph:
    """Trace, record shapes on `example_inputs` (and `example_kwargs`, by name), and build the forward IR, with
    the module in the mode's state (`mode_flags`; each module's own flag is restored afterwards)."""
    if not isinstance(module, nn.Module):
        raise GraphError(f"capture needs a torch.nn.Module, got {type(module).__name__}")
    module = _uncompiled(module)
    with in_mode(module, training):
        return _forward_graph(module, example_inputs, example_kwargs, training)


def traced_module(module: nn.Module, example_inputs: Sequence[Any] = (), *,
                  example_kwargs: Mapping[str, Any] | None = None,
                  training: bool = False) -> tuple[GraphModule, tuple[Any, ...]]:
    """The torch.fx graph module that capture traces for `module(*example_inputs, **example_kwargs)` (the
    module `torch.compile` compiled, in the mode's state, values without tensors as constants), and the
    values of its placeholders in order, with which capture runs it: what a backend runs for the graph."""
    module = _uncompiled(module)
    with in_mode(module, training):
        _, gm, args = _traced(type(module).__name__, module, tuple(example_inputs), example_kwargs or {})
    return gm, args


def mode_flags(module: nn.Module, training: bool) -> list[tuple[nn.Module, bool]]:
    """Each module of `module` with its train / eval flag in the mode's state: inference, every module in
    eval(); training, every module in train(), except that a module the user put in eval() under a root in
    train() stays in eval() (a frozen BatchNorm reads its running statistics, as in the user's eager training).
    Capture and the backends run a module in this state."""
    if training and _uncompiled(module).training:
        return [(m, m.training) for m in module.modules()]
    return [(m, training) for m in module.modules()]


@contextlib.contextmanager
def in_mode(module: nn.Module, training: bool, flags: Sequence[tuple[nn.Module, bool]] | None = None):
    """The modules in the mode's state (`flags`, else `mode_flags`) for the length of the block; each flag that
    was changed is restored after."""
    changed = []
    for m, flag in mode_flags(module, training) if flags is None else flags:
        if m.training != flag:
            changed.append((m, m.training))
            m.training = flag
    try:
        yield
    finally:
        for m, flag in changed:
            m.training = flag


def _traced(what: str, module: nn.Module, example_inputs: Sequence[Any], example_kwargs: Mapping[str, Any],
            resolve: bool = True) -> tuple[nn.Module, GraphModule, tuple[Any, ...]]:
    """The module traced (`module`, or the wrapper of a leaf module, `_as_root`), its graph module and the
    values of its placeholders in order; with `resolve`, its augmented assignments to values that are no
    tensors made their operator (`_resolve_augmented`: a run, where forward has one), else left to the caller."""
    args, positional, given = _example_args(what, module, example_inputs, example_kwargs)
    keywords = [k for k in given if collect(example_kwargs[k], torch.Tensor)]  # inputs; the rest are constants
    var_keywords = {k: x for k, x in example_kwargs.items() if k not in given}  # forward's **kwargs
    var_positional = example_inputs[_star_args_at(module, len(example_inputs)):]  # forward's *args
    constants = {k: example_kwargs[k] for k in given if k not in keywords}
    root = _as_root(module, len(example_inputs), keywords, constants)
    if root is not module:  # the wrapper takes the positional inputs, then the keyword ones
        args = (*example_inputs, *(example_kwargs[k] for k in keywords))
    elif positional:  # positional values without tensors (None, a flag) are constants too (not with *args)
        constants.update((k, x) for k, x in zip(positional, example_inputs, strict=True)
                         if not collect(x, torch.Tensor))
    kept, attrs = _buffers(module), _attributes(module)
    try:  # tracing runs forward's Python code: what it does to a buffer is done for real, and not recorded
        gm = trace(root, len(example_inputs), keywords, constants, var_keywords=var_keywords,
                   var_positional=var_positional)
        _check_buffers_untouched(what, kept)
        written = BufferOrder.written(gm)
        if written:  # again, with what forward computes from those buffers alone as nodes (`_BufferReads`)
            buffers = dict(gm.named_buffers())
            gm = trace(root, len(example_inputs), keywords, constants, [buffers[k] for k in written], var_keywords,
                       var_positional)
            _check_buffers_untouched(what, kept)
        if resolve:
            _resolve_augmented(gm, args)
    finally:
        _restore(kept)
        _restore_attributes(attrs)
    return root, gm, args


def _resolve_augmented(gm: GraphModule, args: Sequence[Any]) -> None:
    """Make each augmented assignment of `gm` (`_AugmentedProxy`) whose target is no tensor (`n += 1` on a size,
    `shape += (1,)`) the out-of-place operator (`operator.add`: the same on an immutable value), by a run on
    `args` (inputs restored after); one on a tensor stays its in-place call. Where the run fails, the graph is
    left as it is (capture's run reports the error). Capture tells them apart in its shape-recording run
    instead (`_ShapeRecorder.plain`), so that it runs forward's leaf modules once."""
    if not any("augmented" in n.meta for n in gm.graph.nodes):
        return
    rec, inputs = _ShapeRecorder(gm), _written_inputs(gm, args)
    cuda = sorted({t.device.index or 0 for t in collect(args, torch.Tensor) if t.device.type == "cuda"})
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=cuda):
            rec.run(*args)
    except Exception:  # noqa: BLE001 - capture's own run raises it with the op it failed at
        return
    finally:
        _restore_inputs(inputs)
    _make_plain(gm, rec.plain)


def _make_plain(gm: GraphModule, plain: Sequence[Node]) -> None:
    """Make the augmented assignments `plain` (to values that are no tensors) of `gm` their Python operator."""
    for n in plain:
        n.op, n.target = "call_function", _AUGMENTED[n.meta.pop("augmented")][1]
    if plain:
        gm.recompile()


Kept = tuple[str, nn.Module, str, torch.Tensor, torch.Tensor, int]


def _buffers(module: nn.Module) -> list[Kept]:
    """Every buffer of `module`: (qualified name, owner, key, tensor, a copy of its values, its version)."""
    return [(f"{prefix}.{k}" if prefix else k, m, k, t, t.clone(), t._version) for prefix, m in module.named_modules()
            for k, t in m._buffers.items() if t is not None]


def _attributes(module: nn.Module) -> list[tuple[nn.Module, dict[str, Any]]]:
    """Each module of `module` with a shallow copy of its attributes (`__dict__`)."""
    return [(m, dict(m.__dict__)) for m in module.modules()]


def _restore_attributes(attrs: Sequence[tuple[nn.Module, dict[str, Any]]]) -> None:
    """Each module in `attrs` with the attributes it had then: those bound since (`self.cache = y` in forward,
    which tracing binds to a torch.fx Proxy; torch.fx's own `_tensor_constant0`) removed, those rebound
    (`self.calls += 1`) bound again to their old values."""
    for m, before in attrs:
        for k in [k for k in m.__dict__ if k not in before]:
            del m.__dict__[k]
        for k, v in before.items():
            if m.__dict__.get(k, _MISSING) is not v:
                m.__dict__[k] = v


_MISSING = object()


def _written_inputs(gm: GraphModule, args: Sequence[Any]) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
    """Where `gm` writes a tensor in place (`x.add_(1)`, `F.relu(x, inplace=True)`): each tensor in `args` with a
    copy of its values and its version, to restore the example inputs after a run; else none."""
    if not any(_mutated_arg(n) is not None for n in gm.graph.nodes):
        return []
    return [(t, t.detach().clone(), t._version) for t in collect(args, torch.Tensor)]


def _restore_inputs(kept: Sequence[tuple[torch.Tensor, torch.Tensor, int]]) -> None:
    """Each tensor in `kept` (`_written_inputs`) that was written since valued as it was then."""
    with torch.no_grad():
        for t, before, version in kept:
            if t._version != version:
                t.copy_(before)


def _restore(kept: Sequence[Kept]) -> None:
    """Each buffer in `kept` bound and valued as when `_buffers` took it."""
    with torch.no_grad():
        for _, m, k, t, before, _ in kept:
            t.copy_(before)
            m._buffers[k] = t


def _check_buffers_untouched(what: str, kept: Sequence[Kept]) -> None:
    """GraphError naming a buffer that tracing rebound (`self.n = self.n + 1`) or changed in place
    (`self.n += 1`, `self.n.add_(1)` on values that are not the inputs'): torch.fx ran that update once, for
    real, and did not record it, so the graph cannot update the buffer at each step as eager PyTorch does.
    An in-place call is seen by the tensor's version counter even where it leaves the values as they were
    (`self.ema.mul_(0.9)` on zeros) and on meta tensors; a write through `.data`, which that counter does not
    see, by the values (not on meta tensors)."""
    for name, m, k, t, before, version in kept:
        if m._buffers.get(k) is t and t._version == version and (t.device.type == "meta" or _same_bits(t, before)):
            continue
        how = (f"assigns its buffer {name!r} a new tensor (self.{k} = ...)" if m._buffers.get(k) is not t else
               f"updates its buffer {name!r} in place from values that are not the inputs' (self.{k} += 1, "
               f"self.{k}.add_(1))")
        raise GraphError(
            f"{what}.forward {how}: "
            f"torch.fx runs that update once while it traces, and does not record it, so the graph (and the "
            f"backends that run it) would not update the buffer at each step as eager PyTorch does; "
            f"{buffer_update_hint(k)}")


def buffer_update_hint(attr: str) -> str:
    """How to write a buffer update that both captures record, for the error refusing one on buffer `attr`."""
    return (f"keep the update in a leaf module (one with a capture_cost method, as BatchNorm keeps its running "
            f"statistics), or use a local variable where the value need not outlive the call; an update that "
            f"mixes in the inputs (a running average: self.{attr}.mul_(0.9).add_(0.1 * m)) is recorded written "
            f"as one write from them (self.{attr}.copy_(0.9 * self.{attr} + 0.1 * m))")


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Do `a` and `b` hold the same bytes (NaN equal to itself)? Other layouts than strided (sparse): the
    same values."""
    if a.layout != torch.strided or b.layout != torch.strided:
        return a.layout == b.layout and a.shape == b.shape and torch.equal(a.detach().to_dense(), b.detach().to_dense())
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(
        a.detach().reshape(-1).contiguous().view(torch.uint8), b.detach().reshape(-1).contiguous().view(torch.uint8))


def _forward_graph(module: nn.Module, example_inputs: Sequence[Any], example_kwargs: Mapping[str, Any] | None,
                   training: bool) -> ForwardGraph:
    what = type(module).__name__
    module, gm, args = _traced(what, module, example_inputs, example_kwargs or {}, resolve=False)
    for node in gm.graph.nodes:
        if isinstance(node.kwargs.get("out"), tuple | list):
            raise GraphError(f"{what}: the call {node.name!r} ({_target_name(node)}) writes several tensors through "
                             f"out=, which capture does not follow (it follows out= with one tensor): return them "
                             f"instead (v, i = torch.max(a, 1))")
    rec = _ShapeRecorder(gm)
    kept, inputs = _buffers(module), _written_inputs(gm, args)
    cuda = sorted({t.device.index or 0 for t in [*collect(args, torch.Tensor), *module.parameters()]
                   if t.device.type == "cuda"})
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=cuda):  # dropout's draws leave the caller's RNG alone
            rec.run(*args)
    except Exception as exc:  # noqa: BLE001
        at, why = "", str(exc)
        if rec.failed is not None:
            node, why = rec.failed
            kind = type(gm.get_submodule(str(node.target))).__name__ if node.op == "call_module" else _target_name(node)
            at = f" at {str(node.target) if node.op == 'call_module' else node.name!r} ({kind})"
        hint = _dict_hint(example_inputs)
        raise GraphError(f"running {what} on the example inputs failed{at}: {why}{hint}") from exc
    finally:  # the run leaves the module's buffers as they were (BatchNorm's running statistics), and the inputs
        _restore(kept)
        _restore_inputs(inputs)
    _make_plain(gm, rec.plain)  # `n += 1` on a size: the operator (no second run to tell, `_resolve_augmented`)
    if rec.view_writes:
        call, other = rec.view_writes[0]
        raise GraphError(
            f"{what}: the in-place call {call.name!r} ({_target_name(call)}) writes to memory that {other.name!r} "
            f"shares (a view of it, or a tensor it views): capture follows an in-place call only through the "
            f"tensor it names, so the graph would miss that dependency and split placements would compute "
            f"wrongly; write it out of place (e.g. torch.where, index_put or torch.cat instead)")
    canon = {id(p): name for name, p in module.named_parameters()}
    names = _op_names(gm)
    b = ForwardBuilder()
    vals: dict[Node, Value] = {}
    outputs: list[Value] = []
    aliases: dict[Node, list[Node]] = {}  # a tensor's names: its producer and the in-place calls on it
    order = BufferOrder(gm)  # forward's order around the in-place writes to buffers
    for node in gm.graph.nodes:
        info = rec.info.get(node)
        outs = tensors(info)
        out_bytes = sum(t.nbytes for t in outs)
        out_shape = outs[0].shape if outs else ()
        ins = [vals[n] for n in _arg_nodes(node)]
        for a, write in order.stale(node):  # a view taken before a write reads it (read after write)
            ins[_arg_nodes(node).index(a)] = b.fold([vals[write]], sum(t.nbytes for t in tensors(rec.info.get(a))))
        target, earlier = order.write(node)
        after = [names[r] for r in earlier]
        if target is not None:  # write after read: it follows the ops that read the buffer's old value
            if _target_name(node) == "copy_" and node.args and node.args[0] in _arg_nodes(node):
                i = _arg_nodes(node).index(node.args[0])  # copy_ overwrites its first argument unread: it
                after += list(ins[i].deps)  # follows that value's producers (an earlier write), reads none
                ins[i] = b.constant()
        if node.op == "placeholder":
            vals[node] = b.input(names[node], out_bytes, out_shape) if outs else b.constant()
        elif node.op == "get_attr":
            obj = _fetch_attr(gm, str(node.target))
            if isinstance(obj, nn.Parameter):
                vals[node] = b.param(canon.get(id(obj), str(node.target)), obj.numel() * obj.element_size(),
                                     obj.numel(), trainable=obj.requires_grad or not training)
            else:
                if training and isinstance(obj, torch.Tensor) and obj.grad_fn is not None:
                    raise GraphError(
                        f"{what}: {node.target!r} is a tensor that tracing computed from parameters it did not "
                        f"follow (those of module.parameters() or named_parameters(): a weight penalty, say); "
                        f"it is a constant in the graph, so a training step would miss its gradient: read the "
                        f"parameters as attributes (self.fc.weight) instead")
                write = order.attr(node, obj)  # a buffer's last write (self.run, a view tracing took of it)
                vals[node] = b.constant() if write is None else b.fold([vals.get(write, Value())], out_bytes)
        elif node.op == "output":
            if training:
                _check_loss(what, outs, info)
            outputs = ins
        elif not any(v.deps or v.params for v in ins) and node.op != "call_module":
            vals[node] = b.constant()  # computed from no input and no parameter: static
        elif not outs:
            vals[node] = b.constant()  # a shape, a dtype, a Python number
        else:
            vals[node] = _call(b, gm, node, names[node], rec.info, ins, outs, out_bytes, canon, training, after)
        order.visit(node, target, reads=names.get(node) in vals.get(node, Value()).deps)  # an op reads
        mutated = _mutated_arg(node)
        if mutated is not None:  # later readers of the mutated tensor, by any of its names, read the result
            for a in _overwritten(aliases, mutated, node):
                vals[a] = vals[node]
    return b.finish(outputs)


def _mutated_arg(node: Node) -> Node | None:
    """The tensor an in-place call (`y.add_(1)`, `torch.relu_(y)`, a function called or a module built with
    `inplace=True`: `F.relu(y, inplace=True)`, `nn.ReLU(inplace=True)`) overwrites: its first argument; for
    a call with `out=y`, y. A call on a module attribute (`self.buf.add_(x)`) gives None (see
    `_written_buffer`)."""
    mutated = _mutated(node)
    if mutated is not None and mutated.op == "get_attr" and not isinstance(node.kwargs.get("out"), Node):
        return None
    return mutated


def _mutated(node: Node) -> Node | None:
    """`_mutated_arg`, a module attribute included (`self.buf` for `self.buf.add_(x)`)."""
    if node.op not in ("call_function", "call_method", "call_module"):
        return None
    out = node.kwargs.get("out")
    if isinstance(out, Node):  # torch.add(x, 1, out=y) overwrites y
        return out
    if not node.args:
        return None
    first = node.args[0]
    if not isinstance(first, Node):
        return None
    if node.op == "call_module":
        owner = node.graph.owning_module
        module = owner.get_submodule(str(node.target)) if owner is not None else None
        return first if getattr(module, "inplace", False) is True else None
    name = _target_name(node)
    if name.endswith("_") and not name.endswith("__"):
        return first
    if node.op != "call_function":
        return None
    if node.kwargs.get("inplace") is True or (len(node.args) > 1 and _inplace_by_position(node)):
        return first
    return None


class BufferOrder:
    """Forward's order around the recorded in-place writes to buffers (`self.run.copy_(m)`, `self.buf.add_(x)`,
    `out=self.buf`), the one rule of capture's graph and of the torch backend's lanes: a read of a buffer
    after a write reads that write (read after write), and a write follows the nodes that read the buffer
    since the write before (write after read; `copy_` follows that write too, through its get_attr); a node
    that reads a view taken before a write (`v = self.run.view(1, 4)`, then the write, then `x * v`) reads
    that write (`stale`). Walk the fx graph's nodes in order: for each, `write(node)`, `stale(node)`, then
    `attr(node, tensor)` for a get_attr node, then `visit(node, target, reads)`."""

    def __init__(self, gm: GraphModule) -> None:
        self._buffer_of = {_memory(t): name for name, t in gm.named_buffers()}
        self.holds: dict[Node, str] = {}  # node -> the buffer whose memory its value is (get_attr, a view, a write)
        self._seen: dict[Node, Node | None] = {}  # node in holds -> the last write to its buffer when it was made
        self._written: dict[str, Node] = {}  # buffer -> the last write to it
        self._readers: dict[str, list[Node]] = {}  # buffer -> the nodes that read it since that write

    @staticmethod
    def written(gm: GraphModule) -> list[str]:
        """The buffers that `gm` writes in place (recorded writes), in order of their first write."""
        order, out = BufferOrder(gm), []
        for node in gm.graph.nodes:
            target, _ = order.write(node)
            if node.op == "get_attr":
                order.attr(node, _fetch_attr(gm, str(node.target)))
            order.visit(node, target, reads=not _is_view(node))
            if target is not None and target not in out:
                out.append(target)
        return out

    def write(self, node: Node) -> tuple[str | None, list[Node]]:
        """The buffer that `node` overwrites (None for a node that writes none) and the nodes that read it
        since the write before, in order: `node` must follow them."""
        target = _written_buffer(node, self.holds)
        return target, (self._readers.pop(target, []) if target is not None else [])

    def attr(self, node: Node, obj: Any) -> Node | None:
        """For get_attr `node`, whose value is `obj`: where it is a buffer (or a view of one that tracing
        took, `self.run[0]`, `.view(1, 4)`), the last write to it, which `node` reads; else None (also
        before the buffer's first write)."""
        buffer = self._buffer_of.get(_memory(obj)) if isinstance(obj, torch.Tensor) else None
        if buffer is None:
            return None
        self.holds[node] = buffer
        self._seen[node] = self._written.get(buffer)
        return self._seen[node]

    def stale(self, node: Node) -> list[tuple[Node, Node]]:
        """The arguments of `node` that hold a buffer written since they were made (a view taken before the
        write: eager PyTorch reads the new values through it), each with that buffer's last write, which
        `node` reads."""
        out = []
        for a in dict.fromkeys(_arg_nodes(node)):
            write = self._written.get(self.holds[a]) if a in self.holds else None
            if write is not None and write is not self._seen.get(a):
                out.append((a, write))
        return out

    def visit(self, node: Node, target: str | None, reads: bool) -> None:
        """Record `node`, which overwrites buffer `target` (`write`'s); `reads`: whether it reads the data of
        the buffers its arguments hold (an op; a view of one holds that buffer instead)."""
        if reads:
            for t in dict.fromkeys(self.holds[a] for a in _arg_nodes(node) if a in self.holds):
                if t != target:
                    self._readers.setdefault(t, []).append(node)
        elif _is_view(node) and node.args and node.args[0] in self.holds:
            self.holds[node] = self.holds[node.args[0]]
            self._seen[node] = self._written.get(self.holds[node])  # it reads the stale writes of its argument
        if target is not None:
            self._written[target] = node
            self.holds[node] = target
            self._seen[node] = node


def _written_buffer(node: Node, holds: Mapping[Node, str]) -> str | None:
    """The buffer that in-place call `node` overwrites (`self.run.copy_(m)`, `self.buf.mul_(a).add_(b)`,
    `torch.add(x, 1, out=self.buf)`), by its attribute path; None for any other node. `holds`: the nodes
    whose value is a buffer's memory (its get_attr nodes, the in-place calls on it)."""
    mutated = _mutated(node)
    return holds.get(mutated) if mutated is not None else None


def _root(t: torch.Tensor) -> torch.Tensor:
    """The tensor whose memory `t` views (its `_base`), else t."""
    return t if t._base is None else t._base


def _memory(t: torch.Tensor) -> int:
    """Which memory `t` is: its storage, so that `.data` of a buffer (no view: no `_base`) is the buffer; for a
    tensor without any (empty, meta), the tensor it views."""
    try:
        ptr = t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        ptr = 0
    return ptr if ptr else id(_root(t))


def _is_view(node: Node) -> bool:
    """A node that capture folds as a view of its first argument (`y.view(-1)`, `y.t()`, `nn.Flatten`)."""
    if node.op == "call_module":
        owner = node.graph.owning_module
        return owner is not None and isinstance(owner.get_submodule(str(node.target)), _SHAPE_ONLY_MODULES)
    return node.op in ("call_function", "call_method") and _target_name(node) in SHAPE_ONLY


def _overwritten(names: dict[Node, list[Node]], mutated: Node, call: Node) -> list[Node]:
    """Record that in-place `call` overwrote `mutated`: the tensor's names (its producer, then the in-place
    calls on it, `call` last), one list shared by all of them in `names`."""
    same = names.setdefault(mutated, [mutated])
    same.append(call)
    names[call] = same
    return same


def _inplace_by_position(node: Node) -> bool:
    """A torch.nn.functional call given inplace=True by position (`F.relu(x, True)`)."""
    if getattr(node.target, "__module__", None) != "torch.nn.functional":
        return False
    try:
        return inspect.signature(node.target).bind(*node.args, **node.kwargs).arguments.get("inplace") is True
    except (TypeError, ValueError):
        return False


def _check_loss(what: str, outs: Sequence[Any], result: Any = None) -> None:
    """A training step differentiates one scalar: the loss the module returns (`result`: what it returns, as
    recorded, to name the shapes of a dict's or output object's entries)."""
    if len(outs) != 1 or math.prod(outs[0].shape) != 1:
        got = ", ".join(str(tuple(t.shape)) for t in outs) or "no tensor"
        fix = "wrap the model in a module that computes the loss"
        if isinstance(result, Mapping) and outs:  # a dict or an output object: name its entries
            got = "{" + ", ".join(f"{k!r}: " + (", ".join(str(t.shape) for t in tensors(v)) or "no tensor")
                                  for k, v in result.items()) + "}"
            if "loss" in result:
                fix = "wrap the model in a module that returns its 'loss' entry alone"
        raise GraphError(f"training mode needs {what} to return its loss, one scalar tensor; it returns {got} "
                         f"({fix}, or capture it in inference mode)")


def _op_names(gm: GraphModule) -> dict[Node, str]:
    """Readable unique op names: the module path for a module called once, "{path}/{i}" for its i-th call
    (one per time step of a recurrent layer), "{scope}/{fx node name}" for functions."""
    calls: dict[str, int] = {}
    for node in gm.graph.nodes:
        if node.op == "call_module":
            calls[str(node.target)] = calls.get(str(node.target), 0) + 1
    seen: dict[str, int] = {}
    names: dict[Node, str] = {}
    for node in gm.graph.nodes:
        if node.op == "call_module":
            target = str(node.target)
            i = seen.get(target, 0)
            seen[target] = i + 1
            names[node] = target if calls[target] == 1 else f"{target}/{i}"
    taken = set(names.values())
    for node in gm.graph.nodes:
        if node.op == "call_module":
            continue
        if node.op in ("call_function", "call_method"):
            scope = _scope(node)
            name = f"{scope}/{node.name}" if scope else node.name
        else:
            name = node.name
        unique, k = name, 1
        while unique in taken:  # an input named like a module ("fc" for self.fc): the module keeps its path
            k += 1
            unique = f"{name}_{k}"
        taken.add(unique)
        names[node] = unique
    return names


def _call(b, gm, node, op_name, all_info, ins, outs, out_bytes, canon, training, after=()) -> Value:
    args = _resolve(node.args, all_info)
    kwargs = _resolve(dict(node.kwargs), all_info)
    params: dict[str, tuple[int, int]] = {}
    frozen: set[str] = set()  # keys of its parameters that do not require grad
    grad = node.meta.get("grad_enabled", True) and any(t.floating for t in outs)  # can its result carry one
    if node.op == "call_module":
        m = gm.get_submodule(str(node.target))
        if isinstance(m, _SHAPE_ONLY_MODULES) or (isinstance(m, _DROPOUT_MODULES) and not (training and m.training)):
            return b.fold(ins, out_bytes, grad=grad)
        if isinstance(m, _DROPOUT_MODULES):
            cost: Cost | None = Cost("dropout", float(sum(t.numel for t in outs)), saved_bytes=sum(t.numel for t in outs))
        else:
            cost = module_cost(m, args, kwargs, outs, training)
        kind = getattr(m, "capture_kind", None) or type(m).__name__.lower()
        if cost is None:
            cost = elementwise(kind, outs)
            b.fallback_kinds.append(kind)
        for p in m.parameters():
            key = canon.get(id(p), f"{node.target}.{id(p)}")
            params[key] = (p.numel() * p.element_size(), p.numel())
            if training and not p.requires_grad:  # inference graphs do not depend on it
                frozen.add(key)
    else:
        name = _target_name(node)
        if name == "getitem" and isinstance(args[0], TensorInfo) and collect(args[1:], TensorInfo):
            name = "index"  # x[:, idx], x[mask]: advanced indexing copies what it takes (a gather), as index_select
        lookup = False
        if name in GATHERS and isinstance(node.args[0], Node):  # reads the part it takes (at most its output)
            lookup = is_lookup(ins[0])
            ins = [b.fold(ins[:1], out_bytes), *ins[1:]]
        if dataclasses.is_dataclass(node.target):  # Output(loss=..., logits=...): an object holding its tensors
            return b.fold(ins, None, grad=grad)
        if name in SHAPE_ONLY or (name in DROPOUT and not (training and _arg(args, kwargs, 2, "training",
                                                                           kwargs.get("train", True)))):
            # detach() and .data, or the integer part of a result (the indices of max), pass no gradient back
            detached = name == "detach" or (name == "getattr" and args[1:2] == ("data",))
            return b.fold(ins, out_bytes, grad=grad and not detached)
        if name in FACTORIES:  # zeros_like(x), x.new_zeros(n): a new tensor of x's shape, not of its data
            ins = _data_inputs(name, node, _arg_nodes(node), ins)
            if not any(v.deps or v.params for v in ins):
                return b.constant()
        if name in DROPOUT:
            n = sum(t.numel for t in outs)
            cost = Cost("dropout", float(n), saved_bytes=n)
        elif name in FACTORIES:
            cost = Cost(name, 0.0)
        elif lookup:
            cost = Cost("embedding", 0.0)
        else:
            cost = function_cost(name, args, kwargs, outs, training)
            if cost is None:
                cost = elementwise(name, outs)
                b.fallback_kinds.append(name)
    return b.cost_op(op_name, _scope(node), ins, cost, outs, params=params, frozen=frozen, differentiable=grad,
                     after=after)


def _data_inputs(name: str, node: Node, arg_nodes: Sequence[Node], ins: Sequence[Value]) -> list[Value]:
    """The values factory `name` reads data from: all but the tensor whose shape a `*_like` / `new_*` one
    copies (`zeros_like(x)` reads none of x's data)."""
    template = node.args[0] if name.endswith("_like") or name.startswith("new_") else None
    return [v for n, v in zip(arg_nodes, ins, strict=True) if n is not template]


def _fetch_attr(gm: GraphModule, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def capture(
    module: nn.Module,
    example_inputs: Sequence[Any] = (),
    *,
    example_kwargs: Mapping[str, Any] | None = None,
    name: str,
    mode: str = "inference",
    metadata: Mapping[str, Any] | None = None,
) -> OpGraph:
    """Capture `module(*example_inputs, **example_kwargs)` as the `OpGraph` named `name`. A single example
    input that is not a list or tuple is the one positional input (a dict too: use `example_kwargs` for
    `model(input_ids=..., attention_mask=...)`); arguments that neither gives keep their defaults.

    `mode` is "inference" (forward ops only) or "training" (forward, backward and update ops; the module's
    output must then be the loss). Metadata gets the mode, parameter count (of the parameters forward reads),
    forward MACs and FLOPs.
    """
    if mode not in MODES:
        raise GraphError(f"capture mode {mode!r} is not one of {', '.join(MODES)}")
    if not isinstance(example_inputs, list | tuple):
        example_inputs = (example_inputs,)
    fg = forward_graph(module, example_inputs, example_kwargs=example_kwargs, training=mode == "training")
    meta = {"capture": "torch.fx", "capture_version": CAPTURE_VERSION, **(metadata or {})}
    return fg.lower(name, mode, meta)
