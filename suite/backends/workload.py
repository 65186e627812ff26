"""Workloads for real execution: the zoo's model with real (random, seeded) weights on the CPU, its example
inputs, the torch.fx graph module and the `OpGraph` that placements refer to.

`real_workload(name)` builds a zoo workload as registered; keyword overrides change its shape (a smaller
batch, fewer layers, shorter sequences) and `mode` switches a training workload to an inference step or
back. A variant gets its own graph, captured from the very module that runs, named
`{zoo name}+{key}={value}+...` (for example `rnnlm-2x2048-b64+batch_size=2+hidden_size=64+mode=inference`),
so its profiles never mix with the registered workload's. Without overrides the graph is the zoo's cached
graph (same content hash as `suite.zoo.load(name)`; `capture=True` re-captures it and checks that).

Inputs: floating-point inputs are standard normal; integer inputs (token ids, labels) are uniform in
[0, k) with k the smallest of 2 and every embedding table size, so they are valid ids and class labels for
every zoo model (the zoo's own example inputs are all zeros, which would make outputs position-independent
and the equivalence tests weaker). Everything is seeded by `seed`.
"""

from __future__ import annotations

import copy
import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
from torch.fx import GraphModule

from suite.errors import GraphError, PlacebenchError
from suite.graph import OpGraph

# Small shapes of every zoo family, for tests and CI: seconds, not minutes, on two CPU cores.
SMALL_SHAPES: dict[str, dict[str, Any]] = {
    "resnet50": {"batch_size": 2, "image_size": 32},
    "inception_v3": {"batch_size": 2, "image_size": 75},
    "bert_base": {"batch_size": 1, "seq_len": 8, "num_layers": 2, "hidden_size": 64, "heads": 4, "ffn_size": 128,
                  "vocab_size": 100, "max_positions": 16},
    "rnnlm": {"batch_size": 2, "hidden_size": 32, "num_layers": 2, "num_steps": 4, "vocab_size": 50},
    "nmt": {"batch_size": 2, "hidden_size": 32, "num_layers": 2, "src_steps": 3, "tgt_steps": 3, "vocab_size": 50},
}


@dataclass
class RealWorkload:
    """A runnable workload: module (CPU, real weights), example inputs (positional, and by keyword in
    `kwargs`), fx graph module and `OpGraph`."""

    name: str
    mode: str  # "inference" or "training"
    module: nn.Module
    inputs: tuple[Any, ...]
    graph: OpGraph
    params: Mapping[str, Any] = field(default_factory=dict)  # builder parameters (zoo workloads)
    kwargs: Mapping[str, Any] = field(default_factory=dict)  # keyword example inputs
    _gm: GraphModule | None = field(default=None, repr=False)
    _args: tuple[Any, ...] = field(default=(), repr=False)

    @property
    def gm(self) -> GraphModule:
        """The graph module capture traces for the example inputs (`suite.capture.fx.traced_module`: its op
        names are the graph's), sharing parameters with `module`."""
        if self._gm is None:
            from suite.capture.fx import traced_module

            self._gm, self._args = traced_module(self.module, self.inputs, example_kwargs=self.kwargs,
                                                 training=self.training)
        return self._gm

    @property
    def args(self) -> tuple[Any, ...]:
        """The values of `gm`'s placeholders, in order: the example inputs (constants included) and the
        defaults of the arguments they leave out."""
        _ = self.gm  # traced on first use
        return self._args

    @property
    def training(self) -> bool:
        return self.mode == "training"

    def fresh_copy(self) -> RealWorkload:
        """An independent deep copy (weights, buffers, inputs), with the same graph."""
        inputs, kwargs = copy.deepcopy((self.inputs, dict(self.kwargs)))
        return RealWorkload(self.name, self.mode, copy.deepcopy(self.module), inputs, self.graph, dict(self.params),
                            kwargs)

    def eager(self, inputs: Sequence[Any] | None = None) -> Any:
        """The eager model's result on the example inputs (no gradient), in the mode's state
        (`suite.capture.fx.mode_flags`, as capture and the backends run it)."""
        from suite.capture.fx import in_mode

        with torch.no_grad(), in_mode(self.module, self.training):
            return self.module(*(inputs if inputs is not None else self.inputs), **self.kwargs)


def variant_name(name: str, overrides: Mapping[str, Any]) -> str:
    if not overrides:
        return name
    return name + "".join(f"+{k}={overrides[k]}" for k in sorted(overrides))


def _int_bound(module: nn.Module) -> int:
    sizes = [m.num_embeddings for m in module.modules() if isinstance(m, nn.Embedding)]
    return max(1, min([2, *sizes]))


def random_inputs(module: nn.Module, examples: Sequence[torch.Tensor], seed: int) -> tuple[torch.Tensor, ...]:
    """Inputs shaped like `examples`: normal floats, integer ids in [0, k) (see the module docstring)."""
    gen = torch.Generator().manual_seed(seed + 1)
    k = _int_bound(module)
    out = []
    for x in examples:
        if x.dtype.is_floating_point:
            out.append(torch.randn(x.shape, generator=gen, dtype=x.dtype))
        else:
            out.append(torch.randint(0, k, x.shape, generator=gen, dtype=x.dtype))
    return tuple(out)


def parse_variant_name(name: str) -> tuple[str, dict[str, Any]]:
    """The zoo name and overrides (shape parameters as integers, and `mode`) of a name `variant_name` made,
    e.g. `nmt-2x1024-b64+batch_size=1+mode=inference`; a name without `+` is a zoo name with no overrides."""
    base, *parts = name.split("+")
    overrides: dict[str, Any] = {}
    for part in parts:
        key, sep, value = part.partition("=")
        if not sep or not key or not value:
            raise PlacebenchError(f"workload {name!r}: {part!r} is not KEY=VALUE (a variant name is "
                                  "ZOO_NAME+KEY=VALUE+..., for example rnnlm-2x2048-b64+batch_size=1)")
        if key in overrides:
            raise PlacebenchError(f"workload {name!r}: {key} is given twice")
        if key == "mode":
            overrides[key] = value
        else:
            try:
                overrides[key] = int(value)
            except ValueError:
                raise PlacebenchError(f"workload {name!r}: shape parameter {key}={value!r} must be a positive "
                                      "integer") from None
    return base, overrides


@dataclass(frozen=True)
class _Variant:
    workload: Any  # the zoo's Workload
    family: Any  # its module in suite.zoo
    mode: str
    params: dict[str, Any]
    name: str  # the graph's name (`variant_name`)


def _variant(name: str, mode: str | None, overrides: dict[str, Any]) -> _Variant:
    """Check a zoo name (or variant name) and shape overrides; the variant they make."""
    from suite import zoo

    asked = name  # errors name what was asked for
    if "+" in name:
        base, parsed = parse_variant_name(name)
        given_mode = parsed.pop("mode", None)
        clash = [k for k in parsed if k in overrides and overrides[k] != parsed[k]]
        if clash or (mode is not None and given_mode is not None and mode != given_mode):
            raise PlacebenchError(f"workload {asked!r}: the name and the overrides disagree on "
                                  f"{', '.join(clash) or 'mode'}")
        name, overrides, mode = base, {**parsed, **overrides}, mode or given_mode
    w = zoo.spec(name)
    mode = mode or w.mode
    if mode not in ("inference", "training"):
        raise PlacebenchError(f"workload {asked!r}: mode {mode!r} is not 'inference' or 'training'")
    unknown = set(overrides) - set(w.params)
    family = importlib.import_module(f"suite.zoo.{w.family}")
    if unknown:
        import inspect

        allowed = set(inspect.signature(family.model_and_inputs).parameters) - {"with_loss"}
        if unknown - allowed:
            raise PlacebenchError(
                f"workload {asked!r}: unknown shape parameter(s) {sorted(unknown - allowed)}; "
                f"known: {sorted(allowed)}"
            )
    for key, value in overrides.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise PlacebenchError(f"workload {asked!r}: shape parameter {key}={value!r} must be a positive integer")
    changes = dict(overrides)
    if mode != w.mode:
        changes["mode"] = mode
    gname = variant_name(name, {k: v for k, v in changes.items() if w.params.get(k) != v or k == "mode"})
    return _Variant(w, family, mode, {**w.params, **overrides}, gname)


def _model_and_inputs(v: _Variant) -> tuple[nn.Module, Any]:
    """The variant's module and example inputs. Shape parameters torch cannot build (a dimension beyond int64,
    a tensor whose size overflows) are a `PlacebenchError` naming the workload, not torch's traceback. The zoo
    workload's own parameters are not caught: an exception there is a bug in the model code."""
    try:
        return v.family.model_and_inputs(**v.params, with_loss=v.mode == "training")
    except (RuntimeError, TypeError, OverflowError) as exc:
        if v.params == v.workload.params:
            raise
        why = (str(exc).strip().splitlines() or [""])[0]
        raise PlacebenchError(f"workload {v.name!r}: torch cannot build the model with these shape parameters "
                              f"({type(exc).__name__}: {why})") from None


def _capture(v: _Variant, module: nn.Module, inputs: Sequence[torch.Tensor]) -> OpGraph:
    from suite import zoo
    from suite.capture.fx import capture as capture_graph

    meta = dict(v.workload.metadata())
    meta.update(mode=v.mode, batch_size=v.params["batch_size"], workload_params=v.params)
    if "num_layers" in v.params:
        meta["num_layers"] = v.params["num_layers"]
    w = v.workload
    meta["blocks"] = zoo.Workload(v.name, w.family, v.mode, v.params, w.description, w.source).blocks()
    if v.name != w.name:
        meta["variant_of"] = w.name
    return capture_graph(module, inputs, name=v.name, mode=v.mode, metadata=meta)


def real_workload(name: str, *, seed: int = 0, mode: str | None = None, capture: bool = False,
                  **overrides: Any) -> RealWorkload:
    """A zoo workload (or a shape variant of it, see the module docstring) ready to run on the CPU. `name`
    may be a variant's name; overrides add to its own."""
    from suite import zoo

    v = _variant(name, mode, overrides)
    torch.manual_seed(seed)
    module, examples = _model_and_inputs(v)
    module.train(v.mode == "training")
    inputs = random_inputs(module, examples, seed)
    base = v.workload.name
    if v.name == base and not capture:
        graph = zoo.load(base)
    else:
        graph = _capture(v, module, inputs)
        if v.name == base and graph.content_hash != zoo.load(base).content_hash:
            raise GraphError(f"workload {base!r}: the graph captured from the real module differs from the zoo's")
    return RealWorkload(v.name, v.mode, module, inputs, graph, v.params)


_VARIANT_GRAPHS: dict[str, OpGraph] = {}


def variant_graph(name: str) -> OpGraph:
    """The graph of a shape variant by its name, as `real_workload` captures it but without weights (built on
    the meta device, as the zoo's graphs are); kept for the process, not cached on disk. The name must be
    the one `variant_name` makes (sorted keys, only values that differ from the zoo workload's), so one
    variant has one name in results."""
    graph = _VARIANT_GRAPHS.get(name)
    if graph is not None:
        return graph
    v = _variant(name, None, {})
    if v.name != name:
        raise PlacebenchError(f"workload {name!r}: write this variant as {v.name!r} (keys sorted, only values "
                              "that differ from the zoo workload's)")
    with torch.device("meta"):
        module, examples = _model_and_inputs(v)
    module.train(v.mode == "training")
    graph = _VARIANT_GRAPHS[name] = _capture(v, module, examples)
    return graph


def from_module(module: nn.Module, inputs: Any = (), *, example_kwargs: Mapping[str, Any] | None = None,
                name: str, mode: str = "inference") -> RealWorkload:
    """Any module the capture can trace, run as `module(*inputs, **example_kwargs)`, the example inputs as
    `capture` takes them (a single input that is not a list or tuple is the one positional input; values
    without tensors are constants). In training mode its output must be the loss. Capture and the backends
    run it in the mode's state, as `suite.capture.fx.mode_flags` says (training: a submodule the user put in
    eval() under a root in train() stays in eval()), and leave its train / eval flags as they were."""
    from suite.capture.fx import capture as capture_graph

    inputs = tuple(inputs) if isinstance(inputs, list | tuple) else (inputs,)
    kwargs = dict(example_kwargs or {})
    graph = capture_graph(module, inputs, example_kwargs=kwargs, name=name, mode=mode,
                          metadata={"model": type(module).__name__})
    return RealWorkload(name, mode, module, inputs, graph, kwargs=kwargs)


def has_model(graph: OpGraph) -> bool:
    """Is there a model to run for `graph`: a zoo workload, or a variant of one (`real_workload`)?"""
    from suite import zoo

    names = zoo.names()
    variant_of = graph.metadata.get("variant_of")
    return graph.name in names or (isinstance(variant_of, str) and variant_of in names)


def for_graph(graph: OpGraph, *, seed: int = 0) -> RealWorkload:
    """The runnable workload whose graph is `graph`: a zoo workload or a variant made by `real_workload`."""
    from suite import zoo

    meta = graph.metadata
    if not has_model(graph):
        raise PlacebenchError(
            f"workload {graph.name!r} has no model in the zoo to run for real (real backends run zoo workloads "
            "and their variants)"
        )
    if graph.name in zoo.names():
        rw = real_workload(graph.name, seed=seed)
    else:
        base = zoo.spec(meta["variant_of"])
        params = dict(meta.get("workload_params", {}))
        overrides = {k: v for k, v in params.items() if base.params.get(k) != v}
        rw = real_workload(base.name, seed=seed, mode=meta.get("mode"), **overrides)
    if rw.graph.content_hash != graph.content_hash:
        raise GraphError(f"workload {graph.name!r}: the graph given ({graph.content_hash}) is not the graph of the "
                         f"model ({rw.graph.content_hash})")
    return rw


def small_workload(name: str, *, mode: str | None = None, seed: int = 0) -> RealWorkload:
    """`real_workload` of a zoo workload in the small shape of its family (`SMALL_SHAPES`)."""
    from suite import zoo

    return real_workload(name, seed=seed, mode=mode, **SMALL_SHAPES[zoo.spec(name).family])
