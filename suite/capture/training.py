"""Training-step graphs: the forward ops plus backward, gradient-accumulation and parameter-update ops.

Which ops get gradients follows autograd: an op *needs a gradient* when it owns trainable parameters,
reads a trainable variable (not only through `detach()`), or reads an op that needs one, unless its outputs cannot carry one
(`differentiable` False: comparisons, argmax, integer casts) or it reads that op only through `detach()`
(its `no_grad_inputs`); it is *active* when it also has a path to a model output (the loss) along reads a
gradient flows back through.
For every active op:

* when some input needs a gradient: a grad-input op `{name}/grad` (kind `{kind}_grad`, FLOPs = forward
  FLOPs; sort, msort, topk and kthvalue, whose backward only scatters the values' gradient to the
  positions the indices name: 1 FLOP per element of that gradient). It reads the gradient of the op's
  output from the backward ops of its consumers (edge bytes = the bytes the consumer read), the saved
  output (an edge from the forward op), and the weights of the variables it reads (an op with weights) or
  the forward op's inputs (an op without). Its output is the gradient of the inputs that need one.
* when the op has weights: a grad-weight op `{name}/grad_weight` (kind `{kind}_grad_weight`, FLOPs =
  forward FLOPs; an embedding lookup, which has none, scatters its gradient: 1 FLOP per output element).
  It reads the output gradient, the saved output and the forward op's inputs (the saved activations).
  Its output is the weight gradient, a live tensor until the update (or accumulation) op consumes it.
  So an op with weights inside the network costs 2x its forward FLOPs backward, the first layer 1x.
  Frozen parameters (`requires_grad=False`, or read only through `detach()`) get no weight gradient, nor do
  the weights an op reads through `detach()` (`x * self.w.detach() + self.w`: only the add gets one): an op whose weights are all frozen
  has no grad-weight op (its grad-input op still reads them), and one whose weights are partly frozen
  (a frozen weight, a trainable bias) has one with its forward FLOPs scaled by the trainable share of its
  weight bytes (an approximation) and an output of the trainable weights' size.
* an op without FLOPs and weights (concatenation, stacking) read by several active consumers gets only
  the grad-input op, which sums their gradients ((consumers - 1) FLOPs per output element); read by one,
  no op: the gradient passes through to the backward ops that consume it (never losing a dependency).

Two backward ops per layer (as TensorFlow's gradient graphs have: one MatMul for the input gradient, one
for the weight gradient) keep memory right: the weight gradient is freed after the update, while the input
gradient of, e.g., the first LSTM layer lives until the embedding's backward op.

Parameters are updated by SGD with momentum (TensorFlow's ApplyMomentum): an op `{name}/update` (phase
"update", kind "apply_momentum") per op that owns trainable parameters, reading the weight gradient; its
`param_bytes` is the optimizer state, one momentum buffer = 1x the trainable parameters; FLOPs = 4 per
trainable parameter (v = mu v + g; w = w - lr v). Frozen parameters stay resident with no gradient and no
optimizer state. A trainable variable op (shared weights) gets a chain of `{variable}/acc{i}` ops
(kind "accumulate_grad", one per use, in backward order, 1 FLOP per parameter) that sums the per-use
weight gradients, then one update op.

Colocation as in TensorFlow: a forward op, its backward ops and its update op form one group named after
the forward op; a variable op, its accumulation ops and its update op form one group named after the
variable. Backward and update ops carry the scope of their forward op.

In training mode a forward op's `output_bytes` also counts `saved_bytes`: activations internal to a fused
op (the gates of an LSTM cell, the log-probabilities of a cross-entropy) that autograd keeps until the
backward op has run; the edge to the backward op keeps them alive in the simulator's memory model.
Backward, accumulation and update ops have no `output_shape` (only forward ops record one).
"""

from __future__ import annotations

import math
from collections import defaultdict

from suite.capture.ir import ForwardGraph, FwdOp, op_bytes_read, order_edges
from suite.graph import Op

MOMENTUM_FLOPS_PER_PARAM = 4  # v <- mu v + g (2), w <- w - lr v (2)
SCATTER_BACKWARD_KINDS = frozenset({"sort", "msort", "topk", "kthvalue"})  # backward: 1 FLOP per output element


def _active_ops(fg: ForwardGraph, consumers: dict[str, list[tuple[str, int]]]) -> set[str]:
    needs: dict[str, bool] = {}
    for op in fg.ops:  # a variable op precedes its users
        needs[op.name] = op.differentiable and (
            op.trainable_param_bytes > 0
            or any(needs[v] for v in op.variables if v not in op.no_grad_variables)
            or any(needs[p] for p in op.inputs if p not in op.no_grad_inputs)
        )
    reach: set[str] = set(fg.outputs)
    users_of_var: dict[str, list[str]] = defaultdict(list)
    for op in fg.ops:
        for v in op.variables:
            users_of_var[v].append(op.name)
    for op in reversed(fg.ops):
        if op.kind == "variable":
            continue
        if any(c in reach for c, _ in consumers[op.name]):
            reach.add(op.name)
    for v, us in users_of_var.items():
        if any(u in reach for u in us):
            reach.add(v)
    return {name for name in reach if needs[name]}


def training_ops(fg: ForwardGraph) -> tuple[list[Op], list[tuple[str, str, int]]]:
    """Lower a forward graph to the ops and edges of one training step (see the module docstring)."""
    by_name = fg.by_name
    var_bytes = {op.name: op.own_param_bytes for op in fg.ops if op.kind == "variable"}
    trainable_vars = {op.name for op in fg.ops if op.kind == "variable" and op.trainable_param_bytes > 0}
    consumers: dict[str, list[tuple[str, int]]] = defaultdict(list)  # the reads a gradient flows back through
    for op in fg.ops:
        for p, b in op.inputs.items():
            if p not in op.no_grad_inputs:
                consumers[p].append((op.name, b))
    active = _active_ops(fg, consumers)

    active_consumers = {name: sum(1 for c, _ in cs if c in active) for name, cs in consumers.items()}

    def has_backward(op: FwdOp) -> bool:
        return (
            op.name in active
            and op.kind not in ("variable", "input")
            and (
                op.flops > 0
                or op.own_param_bytes > 0
                or bool(op.variables)
                or active_consumers.get(op.name, 0) > 1
            )
        )

    backward = {op.name for op in fg.ops if has_backward(op)}

    # gradient sources of every active op's output: backward ops of its consumers, through pass-throughs
    grad_src: dict[str, dict[str, int]] = {}
    for op in reversed(fg.ops):
        if op.name not in active or op.kind == "variable":
            continue
        src: dict[str, int] = defaultdict(int)
        for c, e in consumers[op.name]:
            if c not in active:
                continue
            if c in backward:
                src[f"{c}/grad"] += e
            else:
                for s, b in grad_src[c].items():
                    src[s] += min(b, e)
        grad_src[op.name] = {s: min(b, op.output_bytes) for s, b in src.items()}

    ops: list[Op] = []
    edges: list[tuple[str, str, int]] = []
    uses_left: dict[str, list[str]] = defaultdict(list)  # variable -> users with a backward op, forward order
    for f in fg.ops:
        for v in f.variables:
            if f.name in backward and v in trainable_vars and v not in f.no_grad_variables:
                uses_left[v].append(f.name)
    has_acc = {v for v, us in uses_left.items() if us}

    # forward ops
    for f in fg.ops:
        saved = f.saved_bytes if f.name in backward else 0
        if f.kind == "variable":
            group = f.name if f.name in has_acc else None
        else:
            group = f.name if f.name in backward else None
        ops.append(
            Op(
                name=f.name,
                kind=f.kind,
                flops=float(f.flops),
                bytes_read=op_bytes_read(f, var_bytes),
                bytes_written=f.output_bytes + saved,
                output_bytes=f.output_bytes + saved,
                param_bytes=f.own_param_bytes,
                phase="forward",
                group=group,
                output_shape=f.output_shape,
                scope=f.scope,
            )
        )
        edges.extend((p, f.name, b) for p, b in f.inputs.items())
        edges.extend((v, f.name, var_bytes[v]) for v in f.variables)
        edges.extend(order_edges(f))

    # backward ops in reverse forward order; update / accumulation ops right after the gradient they consume
    acc_prev: dict[str, str] = {}  # variable -> last accumulation op emitted
    for f in reversed(fg.ops):
        if f.name not in backward:
            continue
        grad_in = sum(b for p, b in f.inputs.items() if p in active and p not in f.no_grad_inputs)
        has_weights = f.own_param_bytes > 0 or bool(f.variables)  # frozen ones too: grad input reads them
        trained = [v for v in f.variables if v in trainable_vars and v not in f.no_grad_variables]
        weights = f.own_param_bytes + sum(var_bytes[v] for v in f.variables)
        trained_bytes = f.trainable_param_bytes + sum(var_bytes[v] for v in trained)
        grad_edges = list(grad_src[f.name].items())
        saved = (f.name, f.output_bytes + f.saved_bytes)
        if grad_in > 0:  # gradient of the inputs
            gname = f"{f.name}/grad"
            if f.kind in SCATTER_BACKWARD_KINDS:  # autograd scatters the values' gradient by the indices
                flops = float(math.prod(f.output_shape))  # the values (first output), not the indices
            elif f.flops > 0:
                flops = f.flops
            else:  # no FLOPs, several consumers: sum their gradients
                flops = float(max(active_consumers.get(f.name, 0) - 1, 0) * f.output_numel)
            ins = [*grad_edges, saved]
            if has_weights:  # grad input = grad output x weights
                ins.extend((v, var_bytes[v]) for v in f.variables)
            else:  # elementwise / activation-activation ops read their inputs
                ins.extend(f.inputs.items())
            ops.append(_backward_op(gname, f"{f.kind}_grad", flops, ins, grad_in, f.own_param_bytes, f))
            edges.extend((src, gname, b) for src, b in ins)
        if trained_bytes > 0:  # gradient of the (trainable) weights = grad output x saved inputs
            wname = f"{f.name}/grad_weight"
            flops = f.flops if f.flops > 0 else float(f.output_numel)  # embedding: scatter-add
            if trained_bytes < weights:
                flops = flops * trained_bytes / weights
            ins = [*grad_edges, saved, *f.inputs.items()]
            ops.append(_backward_op(wname, f"{f.kind}_grad_weight", flops, ins, trained_bytes, 0, f))
            edges.extend((src, wname, b) for src, b in ins)
            if f.trainable_param_bytes > 0:
                ops.append(_update_op(f"{f.name}/update", f, f.name))
                edges.append((wname, f"{f.name}/update", f.trainable_param_bytes))
            for v in trained:
                var = by_name[v]
                w = var.own_param_bytes
                aname = f"{v}/acc{uses_left[v].index(f.name)}"
                ops.append(
                    Op(
                        name=aname,
                        kind="accumulate_grad",
                        flops=float(var.own_param_count),
                        bytes_read=2 * w if v in acc_prev else w,
                        bytes_written=w,
                        output_bytes=w,
                        phase="backward",
                        group=v,
                        scope=var.scope,
                    )
                )
                edges.append((wname, aname, w))
                if v in acc_prev:
                    edges.append((acc_prev[v], aname, w))
                acc_prev[v] = aname
                if f.name == uses_left[v][0]:  # the first use in forward order is the last gradient
                    ops.append(_update_op(f"{v}/update", var, v))
                    edges.append((aname, f"{v}/update", w))
    return ops, edges


def _backward_op(name: str, kind: str, flops: float, ins: list[tuple[str, int]], out_bytes: int,
                 extra_read: int, f: FwdOp) -> Op:
    return Op(
        name=name,
        kind=kind,
        flops=float(flops),
        bytes_read=sum(b for _, b in ins) + extra_read,
        bytes_written=out_bytes,
        output_bytes=out_bytes,
        phase="backward",
        group=f.name,
        scope=f.scope,
    )


def _update_op(name: str, owner: FwdOp, group: str) -> Op:
    w = owner.trainable_param_bytes
    return Op(
        name=name,
        kind="apply_momentum",
        flops=float(MOMENTUM_FLOPS_PER_PARAM * owner.trainable_param_count),
        bytes_read=3 * w,  # weights, gradient, momentum
        bytes_written=2 * w,  # weights, momentum
        output_bytes=0,
        param_bytes=w,  # the momentum buffer (optimizer state)
        phase="update",
        group=group,
        scope=owner.scope,
    )
