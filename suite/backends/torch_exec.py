"""Real execution on PyTorch: run a workload's torch.fx graph with every op on the device its placement
gives, copying tensors at device boundaries.

Mapping a placement (one device per `OpGraph` op) onto the fx graph that capture traced (`ExecGraph`):

* an fx node that is an op of the graph (same naming as capture, `suite.capture.fx._op_names`) runs on
  the op's device; a node capture folded or made a constant (view, getitem, size, ...) runs on the device
  of its first producer, or, with no producer on a device, of its first consumer;
* parameters live on their owner's device: the op that uses them, or, for parameters shared by several
  ops (an LSTM cell called at every time step), the graph's "variable" op that holds them. An op on another
  device gets a copy of the shared weights, once per step per device (as the simulator charges the
  variable's edges) and calls its own replica of the module (same tensors, own attributes), so the
  thread of another device never sees those copies; buffers live with their module (a module called on
  several devices: with its first call), and a call on another device gets copies of them, so what it
  writes there (a shared BatchNorm's running statistics in a training step) does not reach the module; a
  tensor that forward reads itself (a buffer `self.mask`, get_attr) lives with the first op that writes it
  in place, else with its first reader, and a read on another torch device gets a copy;
* a tensor read on another (logical) device than the one that produced it (alone, or in a list, tuple or
  dict) is copied: `.to(device)` between torch devices, `.clone()` between logical devices mapped to one
  torch device. Each value is copied at most once per step to each device; copies are counted
  (`bytes_transferred` per step). In a training step only the forward pass's copies are: autograd copies
  their gradients back across the same boundaries (about as many bytes again) uncounted, where the
  simulator charges both directions;
* an in-place call (`y.mul_(2)`) is read by the nodes after it in y's place, as capture's graph has it:
  on another device than y it overwrites a copy there, which those readers get; on y's device it first
  waits for the earlier readers of y on other devices;
* a recorded in-place write to a buffer (`self.run.copy_(m)`, `self.buf.add_(x)`, `out=self.buf`) keeps
  forward's order, by the rule of capture's graph (`suite.capture.fx.BufferOrder`): the nodes that read the
  buffer after it wait for it, and it waits for those that read the buffer before it; it writes the buffer
  itself, not a copy on its device (`self.buf.mul_(a).add_(b)` with add_ on another device than mul_);
* inputs are staged on their input op's device before the timed steps; an input that forward overwrites
  in place (`x.div_(255)`, through a view too) is cloned there at each step, so that every step of every
  placement reads the staged values (the write overwrote the staged input where it ran on the input's
  device and a copy elsewhere: later steps of some placements read overwritten inputs);
* the modules run in the mode's state that capture traced them in (`suite.capture.fx.mode_flags`: a training
  step keeps a submodule the user put in eval() in eval), their flags restored after each step.

Training step: `zero_grad`, the forward above with autograd recording, `loss.backward()` (autograd runs
each backward function on the device of its forward tensors: backward colocated with forward, as the
training graph's colocation groups say; gradients of copies flow back across the boundary), then SGD with
momentum 0.9 (the zoo's training lowering) on each parameter's device. The nodes that forward computes with
gradients off (`with torch.no_grad():` around a frozen backbone; capture records which) run with them off,
so their weights get no gradient and no update, as in eager training.

Concurrency (`concurrent`). Sequential: the calling thread runs every node in the fx graph's order, as
eager PyTorch does (CUDA work is still asynchronous, so CPU and GPU ops overlap). Concurrent: one worker
thread per device runs its device's nodes in order and waits for the nodes of other devices that it
reads, as TensorFlow's executor (the real execution of the placement papers) runs ready ops of different
devices at once; torch releases the GIL inside ops. The default, "auto", is concurrent when the placement
runs nodes on more than one torch device (CPU + GPU, several GPUs; a device holding only staged inputs runs
none) and sequential when all its devices are logical devices of one torch device: they share the hardware, and thread hand-offs at every boundary only add
wake-up latency (milliseconds on a loaded machine). The backward pass is autograd's: concurrent across
CUDA devices (one engine thread per device); CPU backward functions run in the calling thread.

`TorchBackend` implements the evaluator's `Backend` protocol with the methodology's timing protocol;
allocation failures become status "oom" (memory freed, the run goes on), naming the devices that ran out
(`oom_devices`; of a torch device's cluster devices, those the placement puts anything on: host memory
running out names the CPU devices in use, not the idle ones) with, as their peak memory, what the placement
is known to need there (`suite.backends.timing.oom_need_bytes`: what m_etf's OOM retries compare with the
capacity).
"""

from __future__ import annotations

import copy
import dataclasses
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn as nn
from torch.fx import Node
from torch.fx.node import map_arg

from suite.backends.devices import (
    DeviceMap,
    cpu_peak_rss_bytes,
    device_indices,
    free_memory,
    memory_in_use_bytes,
    peak_memory_bytes,
    reset_peak_memory,
)
from suite.backends.timing import (
    backend_setup,
    check_cpu_clock,
    clock_function,
    held_by,
    is_oom,
    oom_need_bytes,
    statistic_s,
    time_steps,
)
from suite.backends.workload import RealWorkload
from suite.capture.flops import collect
from suite.cluster import Cluster
from suite.errors import GraphError, PlacebenchError
from suite.evaluator import Measurement
from suite.methodology import Methodology, Timing

SGD_LR = 1e-3
SGD_MOMENTUM = 0.9


def _fetch_attr(root: nn.Module, target: str) -> Any:
    obj: Any = root
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _set_attr_tensor(root: nn.Module, target: str, value: torch.Tensor) -> None:
    *path, last = target.split(".")
    owner = root
    for part in path:
        owner = getattr(owner, part)
    if last in owner._buffers:
        owner._buffers[last] = value
    else:
        setattr(owner, last, value)


def _has_tensor(x: Any) -> bool:
    if isinstance(x, torch.Tensor):
        return True
    if isinstance(x, list | tuple):
        return any(_has_tensor(y) for y in x)
    if isinstance(x, dict):
        return any(_has_tensor(y) for y in x.values())
    return False


class ExecGraph:
    """What a placement over a workload's `OpGraph` means for its fx graph (placement-independent part)."""

    def __init__(self, rw: RealWorkload):
        from suite.capture.fx import _op_names

        self.rw = rw
        gm = rw.gm
        graph = rw.graph
        self.gm = gm
        self.nodes: list[Node] = list(gm.graph.nodes)
        self.pos = {n: i for i, n in enumerate(self.nodes)}
        self._in_place_reads()
        self._buffer_order()
        names = _op_names(gm)
        index = graph.index
        # op index of every node that is an op of the graph
        self.op_of: list[int] = [
            index.get(names[n], -1) if n.op in ("placeholder", "call_module", "call_function", "call_method") else -1
            for n in self.nodes
        ]
        covered = {i for i in self.op_of if i >= 0}
        missing = [op.name for i, op in enumerate(graph.ops) if op.phase == "forward" and op.kind != "variable"
                   and i not in covered]
        if missing:
            raise GraphError(
                f"graph {graph.name!r} does not match the module being run: no fx node for op(s) {missing[:5]}"
            )
        # parameters: canonical names, users (ops), owner op or variable op
        self.params: dict[str, nn.Parameter] = dict(gm.named_parameters())
        key_of = {id(p): k for k, p in self.params.items()}
        users: dict[str, list[int]] = {}
        flows: list[set[str]] = [set() for _ in self.nodes]
        for i, n in enumerate(self.nodes):
            ins: set[str] = set()
            for a in self.inputs(i):
                ins |= flows[self.pos[a]]
            if n.op == "get_attr":
                obj = _fetch_attr(gm, str(n.target))
                if isinstance(obj, nn.Parameter):
                    ins = {key_of[id(obj)]}
            if self.op_of[i] >= 0:
                if n.op == "call_module":
                    ins |= {key_of[id(p)] for p in gm.get_submodule(str(n.target)).parameters()}
                for k in ins:
                    users.setdefault(k, []).append(self.op_of[i])
                flows[i] = set()
            else:
                flows[i] = ins
        # a variable op by its users and whether it is trained (has an update op): capture splits shared
        # weights with the same users into a frozen and a trainable variable op
        var_by_users: dict[tuple[frozenset[str], bool], int] = {}
        for v, op in enumerate(graph.ops):
            if op.kind == "variable":
                succ = frozenset(graph.ops[s].name for s in graph.successors(v) if graph.ops[s].phase == "forward")
                var_by_users[(succ, f"{op.name}/update" in graph.index)] = v
        self.param_home_op: dict[str, int] = {}
        for k, us in users.items():
            us = list(dict.fromkeys(us))
            if len(us) == 1:
                self.param_home_op[k] = us[0]
                continue
            shared_by, trained = frozenset(graph.ops[u].name for u in us), self.params[k].requires_grad
            v = var_by_users.get((shared_by, trained), var_by_users.get((shared_by, not trained)))
            if v is None:
                raise GraphError(f"graph {graph.name!r}: no variable op holds parameter {k!r} shared by {len(us)} ops")
            self.param_home_op[k] = v
        self.shared_keys = {k for k, v in self.param_home_op.items() if graph.ops[v].kind == "variable"}
        # attribution of every node to an op: itself, else its first producer's, else its first consumer's
        self.attr: list[int] = list(self.op_of)
        for i, n in enumerate(self.nodes):
            if self.attr[i] >= 0 or n.op == "output":
                continue
            if n.op == "get_attr":
                obj = _fetch_attr(gm, str(n.target))
                if isinstance(obj, nn.Parameter) and key_of[id(obj)] in self.param_home_op:
                    self.attr[i] = self.param_home_op[key_of[id(obj)]]
                continue
            for a in self.inputs(i):
                if self.attr[self.pos[a]] >= 0:
                    self.attr[i] = self.attr[self.pos[a]]
                    break
        for i in range(len(self.nodes) - 1, -1, -1):
            if self.attr[i] >= 0 or self.nodes[i].op == "output":
                continue
            for u in self.nodes[i].users:
                if self.attr[self.pos[u]] >= 0:
                    self.attr[i] = self.attr[self.pos[u]]
                    break
        self.key_of = key_of
        self.input_ops = [(i, self.op_of[i]) for i, n in enumerate(self.nodes) if n.op == "placeholder"]
        self.outputs = [i for i, n in enumerate(self.nodes) if n.op == "output"]

    def _in_place_reads(self) -> None:
        """In-place calls (`y.mul_(2)`), as capture has them: the nodes after one read its result where they
        name the tensor it overwrote (`reads[i]`: input node -> node read in its place). Run on another device
        than y, the call overwrites a copy there, which the later readers then get; and it waits for the
        earlier readers of what it overwrites (`overwrites_after[i]`), which may copy it lazily on their lane:
        of every node that may name y's memory (its family: y's other names after in-place calls, and the
        shape-only calls that may view it or that it may view, `y[1:]`, `v.chunk(2)[0]`; capture refuses a
        write that a later reader of another name would see)."""
        from suite.capture.fx import _mutated_arg, _overwritten

        self.reads: list[dict[Node, Node]] = []
        self.overwrites_after: list[list[int]] = []
        latest: dict[Node, Node] = {}
        readers: dict[Node, list[int]] = {}
        aliases: dict[Node, list[Node]] = {}  # a tensor's names: its producer and the in-place calls on it
        family: dict[Node, list[Node]] = {}  # the nodes that may name one memory, each pointing to one list
        overwritten: list[Node] = []

        def join(a: Node, b: Node) -> None:
            fa, fb = family.setdefault(a, [a]), family.setdefault(b, [b])
            if fa is not fb:
                fa.extend(fb)
                for x in fb:
                    family[x] = fa

        for i, n in enumerate(self.nodes):
            sub = {a: latest[a] for a in n.all_input_nodes if a in latest}
            self.reads.append(sub)
            mutated = _mutated_arg(n)
            earlier = [] if mutated is None else [j for a in family.get(mutated, [mutated]) for j in readers.get(a, [])]
            self.overwrites_after.append(sorted(set(earlier) - {i}))
            for a in n.all_input_nodes:
                readers.setdefault(sub.get(a, a), []).append(i)
            if mutated is not None:  # y.mul_(2).add_(1): the readers of y read add_
                for a in _overwritten(aliases, mutated, n)[:-1]:
                    latest[a] = n
                join(mutated, n)
            if _shape_only(n):
                join(n.args[0], n)
            if mutated is not None:
                overwritten.append(mutated)
        # the inputs that forward overwrites in place, by any of their names: each step gets a copy (_forward)
        self.written_inputs = {self.pos[x] for m in overwritten for x in family.get(m, [m]) if x.op == "placeholder"}

    def _buffer_order(self) -> None:
        """In-place writes to buffers (`self.run.copy_(m)`, `self.buf.add_(x)`, `out=self.buf`) in capture's
        order (`suite.capture.fx.BufferOrder`), node by node: a get_attr of a buffer after a write waits for
        that write (so does a node that reads a view of the buffer taken before the write), and a write for the nodes that read the buffer since the write before (any node but a
        view, which holds the buffer instead: its readers read it): `buffer_after[i]`. The lanes of the
        concurrent mode wait for them as for their inputs. A write gets the tensor it overwrites uncopied
        from any device (`buffer_written[i]`: that argument), so that it writes the buffer itself."""
        from suite.capture.fx import BufferOrder, _is_view, _mutated

        order = BufferOrder(self.gm)
        self.buffer_after: list[list[int]] = []
        self.buffer_written: dict[int, Node] = {}
        for i, n in enumerate(self.nodes):
            target, earlier = order.write(n)
            if target is not None:
                self.buffer_written[i] = _mutated(n)
            after = [self.pos[r] for r in earlier] + [self.pos[w] for _, w in order.stale(n)]
            if n.op == "get_attr":
                write = order.attr(n, _fetch_attr(self.gm, str(n.target)))
                if write is not None:
                    after.append(self.pos[write])
            order.visit(n, target, reads=not _is_view(n))
            self.buffer_after.append(after)

    def inputs(self, i: int) -> list[Node]:
        """The nodes node `i` reads, after in-place calls (see `_in_place_reads`)."""
        sub = self.reads[i]
        return [sub.get(a, a) for a in self.nodes[i].all_input_nodes]


def _shape_only(node: Node) -> bool:
    """A call that may return a view of its first argument (`y[0]`, `y.chunk(2)`, `y.t()`, `y.detach()`)."""
    from suite.capture.flops import SHAPE_ONLY
    from suite.capture.fx import _target_name

    return (node.op in ("call_function", "call_method") and bool(node.args) and isinstance(node.args[0], Node)
            and _target_name(node) in SHAPE_ONLY)


def _replica(module: nn.Module) -> nn.Module:
    """A copy of `module` that shares its parameter and buffer tensors (gradients reach the originals) but
    none of its attribute dicts. `functional_call` swaps a module's attributes for the length of a call: on
    the replica of one lane it cannot show a weight copy to another lane's thread calling the original."""
    memo: dict[int, Any] = {id(t): t for t in (*module.parameters(), *module.buffers())}
    return copy.deepcopy(module, memo)


@dataclasses.dataclass
class Copies:
    """Tensors copied across device boundaries in one step."""

    count: int = 0
    bytes: int = 0


def check_concurrent(concurrent: Any) -> None:
    """`concurrent` is True, False or "auto" (see the module docstring): any other value ("on", 1) ran
    sequentially without a word, while a fidelity report named it as the setting."""
    if not (isinstance(concurrent, bool) or (isinstance(concurrent, str) and concurrent == "auto")):
        raise PlacebenchError(f"concurrent {concurrent!r}: expected True, False or 'auto'")


class TorchExecutor:
    """Runs steps of a `RealWorkload` under one placement at a time (see the module docstring)."""

    def __init__(self, rw: RealWorkload, device_map: DeviceMap, *, exec_graph: ExecGraph | None = None,
                 concurrent: bool | str = "auto"):
        check_concurrent(concurrent)
        if len(device_map) == 0:
            raise PlacebenchError("device map is empty")
        self.rw = rw
        self.eg = exec_graph or ExecGraph(rw)
        self.device_map = device_map
        self.tdevs = [device_map.torch_device(d) for d in range(len(device_map))]
        self.placement: np.ndarray | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.copies = Copies()
        self.concurrent = concurrent
        self._staged: list[Any] = []
        self._pool: Any = None
        self._lock = threading.Lock()
        self._step_grad = False  # the grad mode of the step running (its caller's)
        self._flags: list[tuple[nn.Module, bool]] = []  # each module's train / eval flag in a step
        self._used: list[int] = []  # the cluster devices the placement puts anything on (`used_devices`)
        self._devices_used: list[torch.device] = []

    # -- placement ----------------------------------------------------------------------------------------
    def apply(self, placement: np.ndarray) -> None:
        """Move parameters, buffers and inputs where `placement` puts them and compile the step."""
        eg = self.eg
        placement = device_indices(placement, self.rw.graph.num_ops, len(self.tdevs))
        self.optimizer = None
        node_dev = [int(placement[a]) if a >= 0 else -1 for a in eg.attr]
        self.node_dev = node_dev
        self.param_dev = {k: int(placement[v]) for k, v in eg.param_home_op.items()}
        # a device holding only inputs or shared weights (a variable op) is used too: it allocates, and in a
        # training step the weights' update runs there. Known before anything moves: an out-of-memory
        # failure in the moves below names only these devices
        self._used = sorted({d for d in node_dev if d >= 0} | set(self.param_dev.values()))
        self._devices_used = sorted({self.tdevs[d] for d in self._used}, key=str)
        with torch.no_grad():
            for k, p in eg.params.items():
                p.grad = None  # a gradient (of an earlier placement) must not outlive a move
                d = self.param_dev.get(k)
                if d is not None and p.device != self.tdevs[d]:
                    p.data = p.data.to(self.tdevs[d])
            # buffers with their module (first call), get_attr tensors with their first consumer
            self.module_dev: dict[str, int] = {}
            for i, n in enumerate(eg.nodes):
                if n.op == "call_module" and node_dev[i] >= 0:
                    self.module_dev.setdefault(str(n.target), node_dev[i])
            for target, d in self.module_dev.items():
                m = eg.gm.get_submodule(target)
                for mod in m.modules():
                    for bname, b in list(mod._buffers.items()):
                        if b is not None and b.device != self.tdevs[d]:
                            mod._buffers[bname] = b.to(self.tdevs[d])
            # a get_attr tensor (self.mask, self.run) once, with its first write, else its first reader; each
            # get_attr on another torch device reads a copy (see _node_call)
            written = [j for j in map(eg.pos.get, eg.buffer_written.values()) if eg.nodes[j].op == "get_attr"]
            home: dict[str, int] = {}
            for i in [*written, *range(len(eg.nodes))]:
                if eg.nodes[i].op == "get_attr" and node_dev[i] >= 0:
                    home.setdefault(str(eg.nodes[i].target), node_dev[i])
            for target, d in home.items():
                obj = _fetch_attr(eg.gm, target)
                if isinstance(obj, torch.Tensor) and not isinstance(obj, nn.Parameter) and obj.device != self.tdevs[d]:
                    _set_attr_tensor(eg.gm, target, obj.to(self.tdevs[d]))
        # inputs staged on their op's device, one value per placeholder: capture makes each tensor of forward's
        # *args a placeholder of its own (args_0, args_1, ...; `suite.capture.fx.CaptureTracer`), and the graph
        # module is traced from the live module each time (`RealWorkload.gm`), never read from a stored graph
        self._staged = []
        for (i, _), x in zip(eg.input_ops, self.rw.args, strict=False):  # fewer values: the rest at defaults
            d = node_dev[i]
            self._staged.append(_map_tensors(x, lambda t, d=d: t.to(self.tdevs[d])) if d >= 0 else x)
        from suite.capture.fx import in_mode, mode_flags

        self._flags = mode_flags(self.rw.module, self.rw.training)  # the state capture traced it in
        with in_mode(self.rw.module, self.rw.training, self._flags):  # the replicas take it too
            self._compile()
        if self.rw.training:
            params = [p for p in eg.params.values() if p.requires_grad]
            self.optimizer = torch.optim.SGD(params, lr=SGD_LR, momentum=SGD_MOMENTUM)
        self.placement = placement

    def _module_overrides(self, target: str, d: int) -> list[tuple[str, str | None, torch.Tensor]]:
        """Parameters / buffers of module `target` that live on another device than `d`: (name, key, tensor)."""
        m = self.eg.gm.get_submodule(target)
        out: list[tuple[str, str | None, torch.Tensor]] = []
        for pname, p in m.named_parameters():
            k = self.eg.key_of[id(p)]
            if self.param_dev.get(k, d) != d:
                out.append((pname, k, p))
        if self.module_dev.get(target, d) != d:
            out.extend((bname, None, b) for bname, b in m.named_buffers())
        return out

    def _compile(self) -> None:
        """One closure per node: fetch arguments on the node's device (copying), run, store; and the lanes
        of the concurrent mode: per device its nodes in order, with the nodes of other lanes each waits for."""
        eg = self.eg
        self._program: list[tuple[int, Callable[[list[Any], dict], Any]]] = []
        # lanes: the devices that run a node; one holding only inputs (placeholders) runs nothing in a step
        used = sorted({d for d, n in zip(self.node_dev, eg.nodes, strict=True)
                       if d >= 0 and n.op not in ("placeholder", "output")}) or [0]
        lane_of = [d if d >= 0 else used[0] for d in self.node_dev]
        self._lanes: dict[int, list[tuple[int, Callable[[list[Any], dict], Any], list[int]]]] = {d: [] for d in used}
        self._output: tuple[int, Callable[[list[Any], dict], Any]] | None = None
        self._replicas: dict[tuple[str, int], nn.Module] = {}
        for i, n in enumerate(eg.nodes):
            if n.op == "placeholder":
                continue
            fn = self._node_fn(i, n)
            self._program.append((i, fn))
            if n.op == "output":
                self._output = (i, fn)
                continue
            before = [eg.pos[a] for a in eg.inputs(i)] + eg.overwrites_after[i] + eg.buffer_after[i]
            waits = [j for j in dict.fromkeys(before) if eg.nodes[j].op != "placeholder" and lane_of[j] != lane_of[i]]
            self._lanes[lane_of[i]].append((i, fn, waits))
        distinct = {self.tdevs[d] for d in self._lanes}
        self._concurrent_now = len(self._lanes) > 1 and (
            self.concurrent is True or (self.concurrent == "auto" and len(distinct) > 1))
        if self._concurrent_now and self._pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(max_workers=len(self.tdevs), thread_name_prefix="placebench-device")

    def _node_fn(self, i: int, n: Node) -> Callable[[list[Any], dict], Any]:
        """Node `i`'s closure; one that forward computed with gradients off (`torch.no_grad()` inside forward:
        a frozen backbone) runs with them off (grad mode is per thread: set in the thread that runs it), but
        copies what it reads as the step does (with gradients in training): later nodes reuse the copies."""
        if n.meta.get("grad_enabled", True):
            return self._node_call(i, n, self._move)

        def move(v: Any, tdev: torch.device) -> Any:
            with torch.set_grad_enabled(self._step_grad):
                return self._move(v, tdev)

        fn = self._node_call(i, n, move)

        def run_without_grad(env: list[Any], cache: dict) -> Any:
            with torch.no_grad():
                return fn(env, cache)

        return run_without_grad

    def _node_call(self, i: int, n: Node, move: Callable[[Any, torch.device], Any]
                   ) -> Callable[[list[Any], dict], Any]:
        eg = self.eg
        d = self.node_dev[i]
        tdev = self.tdevs[d] if d >= 0 else None
        pos = eg.pos
        node_dev = self.node_dev

        sub = eg.reads[i]
        written = eg.buffer_written.get(i)  # the argument that holds the buffer this node overwrites

        def fetch_from(env: list[Any], cache: dict) -> Callable[[Node], Any]:
            def fetch(a: Node) -> Any:
                j = pos[sub.get(a, a)]
                v = env[j]
                src = node_dev[j]
                if tdev is None or (src == d and src >= 0) or not _has_tensor(v) or a is written:
                    return v
                if src < 0 and _on(v, tdev):  # a device-less constant already where it is needed
                    return v
                key = (j, d)
                c = cache.get(key)
                if c is None:
                    c = cache[key] = move(v, tdev)
                return c

            return fetch

        if n.op == "get_attr":
            target = str(n.target)
            if tdev is None or n in eg.buffer_written.values():  # an in-place write gets the tensor itself
                return lambda env, cache: _fetch_attr(eg.gm, target)

            def get_attr(env: list[Any], cache: dict) -> Any:
                t = _fetch_attr(eg.gm, target)
                if isinstance(t, torch.Tensor) and not isinstance(t, nn.Parameter) and t.device != tdev:
                    return move(t, tdev)  # a buffer read on several torch devices lives on one of them
                return t

            return get_attr
        if n.op == "output":
            return lambda env, cache: map_arg(n.args[0], lambda a: env[pos[sub.get(a, a)]])
        if n.op == "call_module":
            target = str(n.target)
            module = eg.gm.get_submodule(target)
            overrides = self._module_overrides(target, d) if d >= 0 else []
            if not overrides:
                def run_module(env: list[Any], cache: dict) -> Any:
                    f = fetch_from(env, cache)
                    return module(*map_arg(n.args, f), **map_arg(n.kwargs, f))

                return run_module

            replica = self._replicas.get((target, d))
            if replica is None:
                replica = self._replicas[(target, d)] = _replica(module)

            def run_shared(env: list[Any], cache: dict) -> Any:
                f = fetch_from(env, cache)
                tensors = {}
                for name, key, t in overrides:
                    ck = ("param", key or f"{target}.{name}", d)
                    c = cache.get(ck)
                    if c is None:
                        c = cache[ck] = move(t, tdev)
                    tensors[name] = c
                return torch.func.functional_call(replica, tensors, tuple(map_arg(n.args, f)), dict(map_arg(n.kwargs, f)))

            return run_shared
        if n.op == "call_function":
            fn = n.target

            def run_function(env: list[Any], cache: dict) -> Any:
                f = fetch_from(env, cache)
                return fn(*map_arg(n.args, f), **map_arg(n.kwargs, f))

            return run_function
        if n.op == "call_method":
            method = str(n.target)

            def run_method(env: list[Any], cache: dict) -> Any:
                f = fetch_from(env, cache)
                obj, *rest = map_arg(n.args, f)
                return getattr(obj, method)(*rest, **map_arg(n.kwargs, f))

            return run_method
        raise GraphError(f"fx node {n.name!r}: unsupported op {n.op!r}")  # pragma: no cover

    def _move(self, v: Any, tdev: torch.device) -> Any:
        """`v`'s tensors copied to `tdev` (a clone where one is already there), each copy counted."""
        return _map_tensors(v, lambda t: self._copy(t, tdev))

    def _copy(self, t: torch.Tensor, tdev: torch.device) -> torch.Tensor:
        with self._lock:
            self.copies.count += 1
            self.copies.bytes += t.numel() * t.element_size()
        return t.clone() if t.device == tdev else t.to(tdev)

    # -- steps ----------------------------------------------------------------------------------------------
    @property
    def used_devices(self) -> list[int]:
        """The cluster devices (indices) the applied placement puts anything on: a node, a staged input, a
        parameter (shared weights on their variable op's device)."""
        return list(self._used)

    @property
    def devices(self) -> list[torch.device]:
        """The torch devices of `used_devices`: those a step synchronises and reports peak memory of."""
        return list(self._devices_used)

    @property
    def concurrent_now(self) -> bool:
        """Whether the applied placement runs on worker threads (see the module docstring)."""
        return self._concurrent_now

    def forward(self, node_hook: Callable[[int, Any], None] | None = None,
                timer: Callable[[int, Callable[[], Any]], Any] | None = None) -> Any:
        """One forward pass; returns the graph's output. `timer(i, thunk)` wraps each node's execution. The
        modules run in the mode's state (`suite.capture.fx.mode_flags`); their flags are restored after."""
        from suite.capture.fx import in_mode

        with in_mode(self.rw.module, self.rw.training, self._flags):
            return self._forward(node_hook, timer)

    def _forward(self, node_hook: Callable[[int, Any], None] | None,
                 timer: Callable[[int, Callable[[], Any]], Any] | None) -> Any:
        env: list[Any] = [None] * len(self.eg.nodes)
        self._step_grad = torch.is_grad_enabled()
        for i, _ in self.eg.input_ops[len(self._staged):]:  # arguments left at their defaults
            env[i] = self.eg.nodes[i].args[0] if self.eg.nodes[i].args else None
        for (i, _), x in zip(self.eg.input_ops, self._staged, strict=False):
            env[i] = _map_tensors(x, torch.Tensor.clone) if i in self.eg.written_inputs else x  # the staged inputs stay as staged
        cache: dict = {}
        if self._concurrent_now and node_hook is None and timer is None:
            return self._forward_lanes(env, cache)
        out = None
        for i, fn in self._program:
            if timer is None:
                v = fn(env, cache)
            else:
                v = timer(i, lambda fn=fn: fn(env, cache))
            env[i] = v
            if node_hook is not None:
                node_hook(i, v)
            if self.eg.nodes[i].op == "output":
                out = v
        return out

    def _forward_lanes(self, env: list[Any], cache: dict) -> Any:
        """Concurrent forward: one worker thread per device runs its nodes in order, waiting for the nodes of
        other devices it reads (as TensorFlow's executor runs ready ops of different devices at once)."""
        done = [threading.Event() for _ in env]
        failed: list[BaseException] = []
        grad = torch.is_grad_enabled()  # grad mode is thread-local: the workers take the caller's

        def run_lane(lane: list[tuple[int, Callable[[list[Any], dict], Any], list[int]]]) -> None:
            try:
                with torch.set_grad_enabled(grad):
                    for i, fn, waits in lane:
                        for j in waits:
                            done[j].wait()
                        if failed:
                            return
                        env[i] = fn(env, cache)
                        done[i].set()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller below
                failed.append(exc)
                for e in done:
                    e.set()

        futures = [self._pool.submit(run_lane, lane) for lane in self._lanes.values()]
        for f in futures:
            f.result()
        if failed:
            raise failed[0]
        i, fn = self._output
        return fn(env, cache)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def step(self) -> Any:
        """One inference step (no gradients; returns the output) or training step (forward, backward, SGD
        momentum update; returns the loss)."""
        if self.placement is None:
            raise PlacebenchError("no placement applied")
        if not self.rw.training:
            with torch.no_grad():
                return self.forward()
        self.optimizer.zero_grad(set_to_none=True)
        loss = _loss(self.forward())
        loss.backward()
        self.optimizer.step()
        return loss.detach()

    def release(self) -> None:
        """Drop the optimizer state and staged inputs (after an OOM, before the next placement)."""
        self.optimizer = None
        self._staged = []
        self.placement = None
        self._used, self._devices_used = [], []
        for p in self.eg.params.values():
            p.grad = None


def _loss(out: Any) -> torch.Tensor:
    """The loss in a training step's output: its one tensor, alone or in a tuple, list, dict or output object
    (`{'loss': loss}`, `Output(loss=loss, logits=None)`), as capture accepts a training graph's output."""
    found = collect(out, torch.Tensor)
    if len(found) != 1:
        raise GraphError(f"a training step's output must hold one tensor, its loss; it holds {len(found)}")
    return found[0]


def _map_tensors(v: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """`v` with `fn` applied to its tensors (alone, or in lists, tuples and dicts)."""
    if isinstance(v, torch.Tensor):
        return fn(v)
    if isinstance(v, list | tuple):
        return type(v)(_map_tensors(x, fn) for x in v)
    if isinstance(v, dict):
        return {k: _map_tensors(x, fn) for k, x in v.items()}
    return v


def _on(v: Any, tdev: torch.device) -> bool:
    if isinstance(v, torch.Tensor):
        return v.device == tdev
    if isinstance(v, list | tuple):
        return all(_on(x, tdev) for x in v)
    if isinstance(v, dict):
        return all(_on(x, tdev) for x in v.values())
    return True


class TorchBackend:
    """Real execution on PyTorch as an evaluator backend (see the module docstring).

    `measure(placement)` applies the placement, runs one step that counts the copies, then the methodology's
    warm-up and measured steps, and returns the step time (the methodology's statistic, median or mean) with
    every sample, the peak memory of each cluster device (CUDA:
    allocator peak of its torch device; CPU: peak resident set of this whole process, from what was resident
    when it was reset, left out where the OS cannot reset it between placements (macOS, Windows: see
    `suite.backends.devices.cpu_peak_rss_bytes`); logical
    devices sharing a torch device report the same number; a device the placement puts nothing on, 0) and the bytes the forward pass copies across device boundaries per
    step (training: the gradients copied back are not counted, see the module docstring).

    `last_concurrent`: whether the last `measure` ran its steps on concurrent threads (what `concurrent`
    "auto" chose for its placement; None when it failed before).

    `threads`: torch's intra-op threads for the steps of every measurement (default: torch's count when the
    backend is made), set for each `measure` and restored after it, as the ONNX Runtime backend fixes its
    sessions' threads when it is made: a placer that changes torch's threads while it searches (the learned
    placers' `threads`) does not change what its evaluations measure.
    """

    name = "torch"

    def __init__(self, rw: RealWorkload, cluster: Cluster, device_map: DeviceMap | None = None, *,
                 methodology: Methodology | None = None, timing: Timing | None = None,
                 concurrent: bool | str = "auto", clock: str = "wall", threads: int | None = None):
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise PlacebenchError(f"threads {threads!r}: expected a whole number >= 1 (or None: torch's count now)")
        clock_function(clock)  # an unknown clock fails here, before the executor is built and the model moved
        self.rw = rw
        self.workload = rw.graph
        self.cluster = cluster
        self.device_map, self.timing = backend_setup(cluster, device_map, methodology, timing)
        self.executor = TorchExecutor(rw, self.device_map, concurrent=concurrent)
        self.clock = clock
        self.threads = torch.get_num_threads() if threads is None else threads
        self.last_concurrent: bool | None = None  # whether the last measurement ran concurrent threads

    def measure(self, placement: np.ndarray) -> Measurement:
        before = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            return self._measure(placement)
        finally:
            torch.set_num_threads(before)

    def _measure(self, placement: np.ndarray) -> Measurement:
        ex = self.executor
        names = [d.name for d in self.cluster.devices]
        # peaks from here: an out-of-memory failure in `apply` or the first step reports this placement's
        reset_peak_memory(self.device_map.cuda_devices)
        self.last_concurrent = None
        try:
            ex.apply(placement)
            self.last_concurrent = ex.concurrent_now
            devices = ex.devices
            check_cpu_clock(self.clock, devices, ex.concurrent_now)
            ex.copies = Copies()
            ex.step()  # one step to count the copies of a step
            copied = ex.copies.bytes
            reset_peak_memory(list(dict.fromkeys([*devices, *self.device_map.cuda_devices])))  # all: peaks are per process
            samples = time_steps(ex.step, self.timing, devices, self.clock)
        except PlacebenchError:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure becomes a status, never a crash of the run
            if not is_oom(exc):
                ex.release()
                free_memory(self.device_map.cuda_devices)
                return Measurement(status="error", step_time_s=None,
                                   message=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            oom = held_by(_oom_devices(exc, self.device_map), ex.used_devices, names)
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            need = {n: oom_need_bytes(peak_memory_bytes(self.device_map.torch_device(d)) or 0,
                                      memory_in_use_bytes(self.device_map.torch_device(d)) or 0, exc)
                    for d, n in enumerate(names) if n in oom}  # in use now: what it held when it failed
        else:
            oom = None
        if oom is not None:  # outside the except block: the traceback's tensors are released before freeing
            ex.release()
            free_memory(self.device_map.cuda_devices)
            return Measurement(status="oom", step_time_s=None, oom_devices=oom, peak_memory_bytes=need,
                               message=f"out of memory on {', '.join(oom) or 'an unknown device'}: {first}")
        used = set(ex.used_devices)
        cpu_known = cpu_peak_rss_bytes() is not None
        peaks = {}
        for d, name in enumerate(names):
            td = self.device_map.torch_device(d)
            if td.type == "cpu" and not cpu_known:
                continue  # unknown (no resettable peak): left out, for the CPUs left idle too (not a max of 0)
            # a device this placement puts nothing on reports 0: not the process's resident set (a CPU) nor
            # what earlier placements left allocated (a GPU)
            peaks[name] = peak_memory_bytes(td) if d in used else 0
        return Measurement(
            status="ok",
            step_time_s=statistic_s(samples, self.timing),
            samples_s=tuple(samples),
            peak_memory_bytes=peaks,
            message="",
            bytes_transferred=int(copied),
        )

    def measure_batch(self, placements: np.ndarray) -> list[Measurement]:
        return [self.measure(p) for p in placements]


def _oom_devices(exc: BaseException, device_map: DeviceMap) -> tuple[str, ...]:
    """Cluster devices an OOM error names: the CUDA device in its message; else, for a CUDA failure (torch's
    OutOfMemoryError, or a CUDA call's "CUDA error: out of memory"), the one CUDA device of the map (none
    where there are several); else every CPU-mapped device."""
    import re

    text = str(exc)
    m = re.search(r"GPU (\d+)", text) or re.search(r"cuda:(\d+)", text)
    on_cuda = isinstance(exc, torch.OutOfMemoryError) or "cuda" in text.lower()
    target = f"cuda:{m.group(1)}" if m else (None if on_cuda else "cpu")
    if target is None and len(device_map.cuda_devices) == 1:
        target = str(device_map.cuda_devices[0])
    if target is None:
        return ()
    return tuple(n for n, t in zip(device_map.cluster_devices, device_map.torch_devices, strict=True) if t == target)
