"""The forward-graph IR that every capture front end (torch.fx, ONNX) fills, and its lowering to an `OpGraph`.

A front end walks its source graph in topological order and calls `ForwardBuilder`:

* `input(...)` for a model input (an op of kind "input": the data has to live on some device);
* `param(key, ...)` for a parameter tensor (a `Value` that carries no data dependency, only a parameter use;
  `trainable=False` for a frozen one, which a training step reads but neither differentiates nor updates);
* `constant()` for anything static (shapes, buffers, literals, tensors computed from no input);
* `fold(values, result_bytes)` for a shape-only node (view, reshape, getitem, permute, ...): the result
  depends on the same producer ops, and reading it reads at most `result_bytes` from each of them and of
  each parameter (`x + self.e[3]` reads one row of e, whose owner or variable holds all of it), so no
  dependency is ever lost when a node is folded into its producers; `grad=False` for one that stops the
  gradient (`detach()`, an integer result): a training graph passes no gradient back through it (a
  parameter that every op reads so is not trained, as a frozen one);
* `op(...)` for a real operation: its inputs are the producer ops of the values it reads (edge bytes = the
  bytes actually read, e.g. one time step's slice of an embedding output), and the parameters it uses;
  `differentiable=False` when its outputs are all integer or bool (no gradient flows back through it);
  `after` names ops it must follow though it reads nothing of theirs (an in-place write to a buffer after
  earlier reads of it): edges of 0 bytes, which no gradient follows and no backward op copies.

Parameters. Each parameter has a key (its canonical name). A parameter used by exactly one op is owned by
that op (`param_bytes`). Parameters used by several ops (an LSTM layer's cell called once per time step, a
softmax projection shared by all steps, tied weights) become one op of kind "variable" per set of
parameters with the same users: it holds them (`param_bytes`), has `output_bytes` 0 (the weights are
resident, not a live tensor) and an edge to each user carrying the weights' bytes, so a user on another
device receives a copy, as in TensorFlow, where each device reading a variable gets the tensor once.
Frozen and trainable parameters with the same users form separate variable ops (only the trainable one gets
gradient-accumulation and update ops in training mode), and so do parameters that not the same users read
through `detach()`: a user that reads a variable's weights only so (`no_grad_variables`) passes them no
gradient (no grad-weight or accumulation op of its own; `x * self.w.detach() + self.w` trains w by the add).

`ForwardGraph.lower(name, mode, metadata)` turns the IR into an `OpGraph`: in inference mode the forward
ops as they are; in training mode with backward, gradient-accumulation and update ops (see
`suite.capture.training`). Kinds that no FLOP rule covered are listed in metadata "fallback_cost_kinds" and
named in one warning.
"""

from __future__ import annotations

import math
import os
import sys
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from suite.errors import GraphError
from suite.graph import Op, OpGraph

if TYPE_CHECKING:
    from suite.capture.flops import Cost, TensorInfo

MODES = ("inference", "training")


@dataclass(frozen=True)
class Value:
    """What reading a value costs: bytes read from each producer op, and parameters used (key -> (bytes, count))."""

    deps: Mapping[str, int] = field(default_factory=dict)
    params: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    no_grad: frozenset[str] = frozenset()  # producers in deps read without a gradient path (`x.detach()`)
    no_grad_params: frozenset[str] = frozenset()  # parameters in params read so (`self.w.detach()`)
    param_read: Mapping[str, int] = field(default_factory=dict)  # bytes read of those read in part (`self.e[3]`)


@dataclass
class FwdOp:
    """One forward op of the IR (or a variable op holding shared parameters)."""

    name: str
    kind: str
    scope: str
    flops: float
    macs: float  # multiply-adds of matrix products and convolutions (for reporting against published figures)
    inputs: dict[str, int]  # producer op name -> bytes read
    output_bytes: int
    output_shape: tuple[int, ...] = ()
    output_numel: int = 0
    saved_bytes: int = 0  # activations kept for the backward pass beyond the output (training mode only)
    weight_bytes_read: int | None = None  # bytes of its weights it reads, where fewer than all (a lookup's rows)
    param_uses: dict[str, tuple[int, int]] = field(default_factory=dict)  # key -> (bytes, count)
    own_param_bytes: int = 0  # every parameter it holds, frozen ones included (all are resident)
    own_param_count: int = 0
    trainable_param_bytes: int = 0  # the part of own_param_* that training updates (requires_grad)
    trainable_param_count: int = 0
    variables: list[str] = field(default_factory=list)  # names of variable ops whose weights this op reads
    differentiable: bool = True  # its output can carry a gradient (False: only integer / bool outputs)
    no_grad_inputs: frozenset[str] = frozenset()  # inputs read only without a gradient path (`x.detach()`)
    no_grad_params: frozenset[str] = frozenset()  # parameter keys it reads only so (`self.w.detach()`)
    no_grad_variables: frozenset[str] = frozenset()  # variable ops whose weights it reads only so
    after: tuple[str, ...] = ()  # ops that must run before it, though it reads nothing of theirs (0-byte edges)


@dataclass
class ForwardGraph:
    """Forward ops in topological order (variable ops included), variable sizes and the model outputs."""

    ops: list[FwdOp]
    outputs: list[str]  # producer ops of the model's outputs (the loss in training mode)
    fallback_kinds: list[str] = field(default_factory=list)  # kinds costed by the generic rule

    @property
    def by_name(self) -> dict[str, FwdOp]:
        return {op.name: op for op in self.ops}

    @property
    def param_count(self) -> int:
        return sum(op.own_param_count for op in self.ops)

    @property
    def param_bytes(self) -> int:
        return sum(op.own_param_bytes for op in self.ops)

    @property
    def frozen_param_count(self) -> int:
        return sum(op.own_param_count - op.trainable_param_count for op in self.ops)

    @property
    def macs(self) -> float:
        return sum(op.macs for op in self.ops)

    @property
    def flops(self) -> float:
        return sum(op.flops for op in self.ops)

    def lower(self, name: str, mode: str, metadata: Mapping[str, Any] | None = None) -> OpGraph:
        """Build the validated `OpGraph` of this forward graph in `mode` ("inference" or "training")."""
        if mode not in MODES:
            raise GraphError(f"capture mode {mode!r} is not one of {', '.join(MODES)}")
        if mode == "training":
            from suite.capture.training import training_ops

            ops, edges = training_ops(self)
            if not any(op.phase == "update" for op in ops):
                raise GraphError(f"{name}: training mode, but no trainable parameter reaches the model's output (the loss), "
                                 f"so nothing would be trained; capture it in inference mode")
        else:
            ops, edges = inference_ops(self)
        meta = {
            "mode": mode,
            "params": self.param_count,
            "param_bytes": self.param_bytes,
            "forward_macs": self.macs,
            "forward_flops": self.flops,
        }
        if mode == "training" and self.frozen_param_count:  # only then: other graphs (and hashes) are as before
            meta["frozen_params"] = self.frozen_param_count
        if self.fallback_kinds:
            kinds = sorted(set(self.fallback_kinds))
            meta["fallback_cost_kinds"] = kinds
            warnings.warn(f"{name}: no FLOP rule for {', '.join(kinds)}: counted as 1 FLOP per output element "
                          f"(listed in the graph's metadata 'fallback_cost_kinds')",
                          stacklevel=_caller_level())
        meta.update(metadata or {})
        meta["mode"] = mode
        return OpGraph.build(name, ops, edges, meta)


LOOKUP_KINDS = ("embedding", "gather")  # ops that read only the rows they gather from their weights


def is_lookup(data: Value) -> bool:
    """Whether a gather's data input (`self.weight[idx]`, `self.weight.index_select(0, idx)`) is a weight table:
    parameters and no op's output. Such a gather is an embedding lookup (kind "embedding", no FLOPs, as
    `F.embedding`), as ONNX's Gather of a weight."""
    return bool(data.params) and not data.deps


def _caller_level() -> int:
    """The `stacklevel` of the first caller outside `suite.capture`, for a warning given by its caller: the
    user's capture call, whichever entry point (`suite.capture.capture_module`, `fx.capture`, ...) it used."""
    here = os.path.dirname(os.path.abspath(__file__)) + os.sep
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(here):
        frame, level = frame.f_back, level + 1
    return level


def op_bytes_read(op: FwdOp, var_bytes: Mapping[str, int]) -> int:
    """Input tensors read plus the weights used, which are read each step.

    A variable op reads nothing: it holds resident weights, and each of its users reads them (as a
    TensorFlow variable hands out a reference). A lookup (embedding, gather) reads the rows it gathers,
    at most its output's bytes, not its whole table; an op with `weight_bytes_read` (an embedding bag, whose
    rows are more than its output) reads at most that many bytes of its weights.
    """
    if op.kind == "variable":
        return 0
    weights = op.own_param_bytes + sum(var_bytes[v] for v in op.variables)
    if op.kind in LOOKUP_KINDS:
        weights = min(weights, op.output_bytes)
    if op.weight_bytes_read is not None:
        weights = min(weights, op.weight_bytes_read)
    return sum(op.inputs.values()) + weights


def inference_ops(fg: ForwardGraph) -> tuple[list[Op], list[tuple[str, str, int]]]:
    var_bytes = {op.name: op.own_param_bytes for op in fg.ops if op.kind == "variable"}
    ops: list[Op] = []
    edges: list[tuple[str, str, int]] = []
    for f in fg.ops:
        ops.append(
            Op(
                name=f.name,
                kind=f.kind,
                flops=float(f.flops),
                bytes_read=op_bytes_read(f, var_bytes),
                bytes_written=f.output_bytes,
                output_bytes=f.output_bytes,
                param_bytes=f.own_param_bytes,
                phase="forward",
                output_shape=f.output_shape,
                scope=f.scope,
            )
        )
        edges.extend((p, f.name, b) for p, b in f.inputs.items())
        edges.extend((v, f.name, var_bytes[v]) for v in f.variables)
        edges.extend(order_edges(f))
    return ops, edges


def order_edges(f: FwdOp) -> list[tuple[str, str, int]]:
    """The 0-byte edges that order `f` after the ops in `f.after` that it does not read."""
    return [(p, f.name, 0) for p in f.after if p not in f.inputs]


class ForwardBuilder:
    """Accumulates forward ops in topological order; see the module docstring."""

    def __init__(self) -> None:
        self._ops: dict[str, FwdOp] = {}
        self._frozen: set[str] = set()  # keys of parameters a training step does not update
        self._with_grad: set[str] = set()  # keys of parameters some op reads with a gradient path
        self.fallback_kinds: list[str] = []

    # -- values ---------------------------------------------------------------------------------------
    @staticmethod
    def constant() -> Value:
        return Value()

    def param(self, key: str, nbytes: int, count: int, *, trainable: bool = True) -> Value:
        if not trainable:
            self._frozen.add(key)
        return Value(params={key: (int(nbytes), int(count))})

    def fold(self, values: Iterable[Value], result_bytes: int | None, *, grad: bool = True) -> Value:
        """A shape-only node: same producers and parameters, at most `result_bytes` read from each;
        `grad=False`: a node that stops the gradient (`x.detach()`), so the ops reading the result pass none
        back to them."""
        deps, params, no_grad, no_grad_params, read = self._merge(values)
        if result_bytes is not None:  # of a parameter too: `self.e[3]` reads one row of e
            deps = {p: min(b, int(result_bytes)) for p, b in deps.items()}
            read = {k: min(read.get(k, nb), int(result_bytes)) for k, (nb, _) in params.items()}
        if not grad:
            no_grad, no_grad_params = frozenset(deps), frozenset(params)
        return Value(deps=deps, params=params, no_grad=no_grad, no_grad_params=no_grad_params,
                     param_read={k: b for k, b in read.items() if b < params[k][0]})

    def _merge(self, values: Iterable[Value]) -> tuple[dict[str, int], dict[str, tuple[int, int]], frozenset[str],
                                                       frozenset[str], dict[str, int]]:
        """The producers and parameters `values` read, those of each read only without a gradient path, and
        the bytes read of the parameters read in part."""
        deps: dict[str, int] = {}
        params: dict[str, tuple[int, int]] = {}
        read: dict[str, int] = {}
        with_grad: set[str] = set()
        for v in values:
            for p, b in v.deps.items():
                deps[p] = deps.get(p, 0) + int(b)
                if p not in v.no_grad:
                    with_grad.add(p)
            params.update(v.params)
            for k, (nb, _) in v.params.items():
                read[k] = read.get(k, 0) + v.param_read.get(k, nb)
            with_grad.update(k for k in v.params if k not in v.no_grad_params)
        for p in deps:  # reading a value twice (x * x) reads the producer's output once
            deps[p] = min(deps[p], self._ops[p].output_bytes)
        read = {k: b for k, b in read.items() if b < params[k][0]}  # so do its parameters (self.e[3] + self.e)
        return deps, params, frozenset(deps) - with_grad, frozenset(params) - with_grad, read

    # -- ops ------------------------------------------------------------------------------------------
    def input(self, name: str, nbytes: int, shape: tuple[int, ...] = ()) -> Value:
        return self.op(name, "input", "", [], flops=0.0, macs=0.0, output_bytes=nbytes, output_shape=shape)

    def op(
        self,
        name: str,
        kind: str,
        scope: str,
        values: Iterable[Value],
        *,
        flops: float,
        macs: float = 0.0,
        output_bytes: int,
        output_shape: tuple[int, ...] = (),
        output_numel: int | None = None,
        saved_bytes: int = 0,
        weight_bytes_read: int | None = None,
        params: Mapping[str, tuple[int, int]] | None = None,
        frozen: Iterable[str] = (),
        differentiable: bool = True,
        after: Iterable[str] = (),
    ) -> Value:
        """A real operation; `params` are parameters it uses besides those in `values` (a module's own), of
        which `frozen` names the keys that training does not update; `weight_bytes_read` for one that reads
        fewer bytes of its weights than all of them (a lookup); `differentiable=False` for one whose
        outputs carry no gradient (comparisons, argmax, integer casts, an op run under torch.no_grad():
        autograd passes nothing back through them, nor to its parameters); `after` names ops that must run
        before it though it reads nothing of theirs (an in-place write after earlier reads of what it
        overwrites): 0-byte edges, no gradient."""
        if name in self._ops:
            raise GraphError(f"capture: duplicate op name {name!r}")
        if not (math.isfinite(flops) and flops >= 0):
            raise GraphError(f"capture: op {name!r} has invalid FLOPs {flops!r}")
        deps, uses, no_grad, no_grad_params, read = self._merge(values)
        uses.update(params or {})
        if read:  # it reads a part of a parameter (`x + self.e[3]`): that part, as a lookup its rows
            part = sum(nb if k in (params or {}) else read.get(k, nb) for k, (nb, _) in uses.items())
            weight_bytes_read = part if weight_bytes_read is None else min(int(weight_bytes_read), part)
        self._frozen.update(frozen)
        # the parameters it reads without a gradient path: through detach(), or all where it passes none back
        no_grad_params = frozenset(uses) if not differentiable else no_grad_params - set(params or {})
        self._with_grad.update(k for k in uses if k not in no_grad_params)
        if output_numel is None:
            output_numel = math.prod(output_shape) if output_shape else 0
        self._ops[name] = FwdOp(
            name=name,
            kind=kind,
            scope=scope,
            flops=float(flops),
            macs=float(macs),
            inputs=deps,
            output_bytes=int(output_bytes),
            output_shape=tuple(int(d) for d in output_shape),
            output_numel=int(output_numel),
            saved_bytes=int(saved_bytes),
            weight_bytes_read=None if weight_bytes_read is None else int(weight_bytes_read),
            param_uses=dict(uses),
            differentiable=bool(differentiable),
            no_grad_inputs=no_grad,
            no_grad_params=no_grad_params,
            after=tuple(dict.fromkeys(p for p in after if p != name)),
        )
        return Value(deps={name: int(output_bytes)})

    def cost_op(self, name: str, scope: str, values: Iterable[Value], cost: Cost, outs: Sequence[TensorInfo],
                **kwargs: Any) -> Value:
        """`op` with the kind, FLOPs, MACs, saved and weight bytes of `cost`, and the bytes, elements and
        (the first one's) shape of its outputs `outs`; `kwargs`: `op`'s other arguments."""
        return self.op(
            name,
            cost.kind,
            scope,
            values,
            flops=cost.flops,
            macs=cost.macs,
            output_bytes=sum(t.nbytes for t in outs),
            output_shape=outs[0].shape,
            output_numel=sum(t.numel for t in outs),
            saved_bytes=cost.saved_bytes,
            weight_bytes_read=cost.weight_bytes_read,
            **kwargs,
        )

    # -- finish ---------------------------------------------------------------------------------------
    def finish(self, outputs: Iterable[Value]) -> ForwardGraph:
        """Assign parameters to owners or variable ops and return the `ForwardGraph`."""
        out_names: list[str] = []
        for v in outputs:
            for p in v.deps:
                if p not in out_names:
                    out_names.append(p)
        users: dict[str, list[str]] = {}
        for op in self._ops.values():
            for key in op.param_uses:
                users.setdefault(key, []).append(op.name)
        # parameters with the same set of (several) users, the same trainability and the same users reading
        # them with a gradient path form one variable op; one that every op reads without a gradient path
        # (`self.w.detach()`) gets none, as a frozen one
        shared: dict[tuple[tuple[str, ...], bool, tuple[str, ...]], list[str]] = {}
        for key, us in users.items():
            trainable = key not in self._frozen and key in self._with_grad
            if len(us) == 1:
                op = self._ops[us[0]]
                nbytes, count = op.param_uses[key]
                op.own_param_bytes += nbytes
                op.own_param_count += count
                op.trainable_param_bytes += nbytes if trainable else 0
                op.trainable_param_count += count if trainable else 0
            else:
                with_grad = tuple(u for u in us if key not in self._ops[u].no_grad_params)
                shared.setdefault((tuple(us), trainable, with_grad), []).append(key)
        variables: dict[str, FwdOp] = {}
        taken = set(self._ops)
        for (us, trainable, with_grad), keys in shared.items():
            prefix = _common_prefix(keys)
            name = f"{prefix}/variable"
            k = 1
            while name in taken:
                k += 1
                name = f"{prefix}/variable{k}"
            taken.add(name)
            nbytes = sum(self._ops[us[0]].param_uses[key][0] for key in keys)
            count = sum(self._ops[us[0]].param_uses[key][1] for key in keys)
            var = FwdOp(
                name=name,
                kind="variable",
                scope=prefix,
                flops=0.0,
                macs=0.0,
                inputs={},
                output_bytes=0,
                own_param_bytes=nbytes,
                own_param_count=count,
                trainable_param_bytes=nbytes if trainable else 0,
                trainable_param_count=count if trainable else 0,
            )
            variables[name] = var
            for u in us:
                self._ops[u].variables.append(name)
                if u not in with_grad:  # it reads them through detach(): no weight gradient of its own
                    self._ops[u].no_grad_variables |= {name}
        ordered: list[FwdOp] = []
        placed: set[str] = set()
        for op in self._ops.values():
            for v in op.variables:
                if v not in placed:
                    ordered.append(variables[v])
                    placed.add(v)
            ordered.append(op)
        return ForwardGraph(ops=ordered, outputs=out_names, fallback_kinds=list(self.fallback_kinds))


def _common_prefix(keys: list[str]) -> str:
    """Longest common dotted prefix of parameter keys ("lstm.0.weight_ih", "lstm.0.bias_ih" -> "lstm.0")."""
    parts = [k.split(".") for k in keys]
    prefix: list[str] = []
    for group in zip(*parts, strict=False):
        if all(p == group[0] for p in group):
            prefix.append(group[0])
        else:
            break
    if len(keys) == 1 and len(prefix) > 1:
        prefix = prefix[:-1]  # a single parameter: name the variable after its module
    return ".".join(prefix) or keys[0]
