"""Real execution on ONNX Runtime: the workload exported to ONNX, split by placement into per-device
subgraphs, each run in its own session with the CPU or CUDA execution provider, tensors handed between them.

Export and op mapping. The fx graph that the capture traced is rebuilt with every op node wrapped in a
submodule named `pb_op_{k}` (k = the op's index in the `OpGraph`), then exported with the TorchScript
exporter (`torch.onnx.export(..., dynamo=False)`; the dynamo exporter needs onnxscript). Inputs without
tensors (`forward(x, n_layers: int, flag: bool)`'s 3 and True, a None) are baked in as the constants capture
traced them as, so the ONNX model's inputs are the tensor inputs; a list or tuple of tensors is one input per
tensor (`xs.0`, `xs.1`: `tensor_inputs`), and each tensor of forward's *args is one
(`args_0`, `args_1`: capture makes each a placeholder of its own). ONNX node names
carry the module scope ("/pb_op_17/m/MatMul"), so every ONNX node that comes from op k is known; a node
outside any op scope (the reshapes, transposes and constants of folded fx nodes, exporter-made
identities) follows the device of the producer of its first computed input, or, with none, of its first
consumer, the same rule as the PyTorch backend's folded nodes. So a placement over the workload's ops
(the same `OpGraph` for both backends) decides the device of every ONNX node.

Splitting. Each ONNX node gets a level: the largest over its producers of the producer's level, plus one
where the producer is on another device. The nodes of one (level, device) pair form a subgraph; the
subgraphs in (level, device) order form a valid topological order (a subgraph only reads from lower levels
or from itself), and the number of subgraphs is the number of device switches along the longest chain,
not the number of boundary edges. Each subgraph becomes an ONNX model with the initializers it reads
(weights read on several devices are stored once per device, when the sessions are created, not copied
per step; the simulator charges a shared variable's weights per step) and one `InferenceSession` on its
device's provider. A step runs the sessions in order with I/O binding: outputs stay on their device (the graph's
outputs too: a timed step copies nothing to the host that the placement does not);
a tensor read on another device is copied once per step per device (OrtValue to/from CUDA; a real copy
between logical devices mapped to one torch device), and the copies are counted. Every session stops its
intra-op threads spinning at the end of each run (`session.force_spinning_stop`): by default they spin on
after a run, and with many sessions run one after another the spinning threads of those that finished take
the cores from the one running (81 sessions of a per-op random split of a small ResNet-50, 2 threads each,
on a shared machine: 0.9 s a step instead of 30 ms).

Providers are checked, never assumed: a session for a CUDA device must report CUDAExecutionProvider
(`get_providers()`), must not have run-time fallback (`disable_fallback()`), and, where ONNX Runtime
records graph assignment, must not have placed floating-point compute nodes on the CPU; otherwise the
measurement is status "error" with the reason. A silent fallback is an error, not a result.

Peak memory per cluster device, read after the timed steps: on a CPU the placement uses, the peak resident set
of this process (as the PyTorch backend's; left out where the OS cannot reset it between placements: macOS,
Windows); on a CUDA device the run uses, the memory in use on the whole device
(`torch.cuda.mem_get_info`'s total - free), which holds ONNX Runtime's arena at its peak (an arena does not
shrink) but also the CUDA contexts of ONNX Runtime and of torch (made by that query where torch had none
there: some hundreds of MiB), torch's cached blocks and other processes' memory: an upper bound, not the
allocator peak that the PyTorch backend reports; on a device the run leaves unused, 0 (a CPU: not
the process's resident set; the native runs count every CPU as used).

Out of memory: status "oom" naming the cluster devices on the CUDA device the error names ("GPU=1"), else on
the torch device of the session or copy that failed (`oom_devices`), of them those the placement puts anything
on (host memory: not the CPU devices it leaves idle), with, as their peak memory, what the
placement is known to need there (`suite.backends.timing.oom_need_bytes`; on CUDA the memory in use on the
device, ONNX Runtime's arena included, plus the failed request); a message that names no device, from a
failure where none was running, names none ("out of memory on an unknown device").

Framework placements (`measure_native`): the whole model in one session, with the CPU provider only
("ort_cpu") or the CUDA provider with CPU fallback ("ort_gpu"), its inputs staged on the device before the
timed steps and its outputs bound there, as a placement's steps are: the framework's own device choice (see
baselines/ort_native.py); `native_assignment` reports where ONNX Runtime put each op. Its
`bytes_transferred` is 0: the copies ONNX Runtime makes inside its one session (ort_gpu: between its CUDA
nodes and the nodes it falls back to the CPU with) are not seen, so they are not counted.

Inference only: onnxruntime has no training sessions (that is the separate onnxruntime-training
package), so a training workload is refused with a clear error.
"""

from __future__ import annotations

import io
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn as nn
from torch.fx import GraphModule
from torch.fx.node import map_arg

from suite.backends.devices import (
    DeviceMap,
    cpu_peak_rss_bytes,
    device_indices,
    free_memory,
    memory_in_use_bytes,
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
from suite.backends.torch_exec import ExecGraph
from suite.backends.workload import RealWorkload
from suite.cluster import Cluster
from suite.errors import PlacebenchError
from suite.evaluator import Measurement
from suite.methodology import Methodology, Timing

OPSET = 17
IR_VERSION = 8  # what onnxruntime >= 1.17 reads
_SCOPE = re.compile(r"(?:^|/)pb_op_(\d+)(?:/|$)")
CPU_EP = "CPUExecutionProvider"
CUDA_EP = "CUDAExecutionProvider"


class BackendUnavailable(PlacebenchError):
    """The backend cannot run this workload or device here (training on ONNX Runtime, CUDA missing, ...)."""


class _NodeCall(nn.Module):
    """One fx op node as a module, so that the exporter records its scope."""

    def __init__(self, kind: str, target: Any, module: nn.Module | None = None):
        super().__init__()
        self.kind, self.target = kind, target
        if module is not None:
            self.m = module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.kind == "call_module":
            return self.m(*args, **kwargs)
        if self.kind == "call_function":
            return self.target(*args, **kwargs)
        obj, *rest = args
        return getattr(obj, self.target)(*rest, **kwargs)


def constant_inputs(eg: ExecGraph) -> dict[Any, Any]:
    """The placeholders whose values hold no tensor (`forward(x, n_layers: int, flag: bool)`'s 3 and True, a
    None) with their values: the capture traced them as constants, the exporter would make them tensors."""
    from suite.capture.flops import collect

    holders = [n for n in eg.nodes if n.op == "placeholder"]  # one per value, *args' too (see tensor_inputs)
    return {n: x for n, x in zip(holders, eg.rw.args, strict=False) if not collect(x, torch.Tensor)}


def scoped_module(eg: ExecGraph) -> GraphModule:
    """The fx graph module with every op node wrapped in a submodule `pb_op_{op index}`, and the placeholders
    of constants (`constant_inputs`) replaced by their values."""
    gm = eg.gm
    constants = constant_inputs(eg)
    root = nn.Module()
    for name, child in gm.named_children():
        setattr(root, name, child)
    for name, p in gm.named_parameters(recurse=False):
        root.register_parameter(name, p)
    for name, b in gm.named_buffers(recurse=False):
        root.register_buffer(name, b)
    g = torch.fx.Graph()
    env: dict[Any, Any] = {}
    for i, n in enumerate(eg.nodes):
        k = eg.op_of[i]
        if n in constants:
            env[n] = constants[n]
        elif k >= 0 and n.op in ("call_module", "call_function", "call_method"):
            sub = f"pb_op_{k}"
            module = gm.get_submodule(str(n.target)) if n.op == "call_module" else None
            setattr(root, sub, _NodeCall(n.op, n.target, module))
            env[n] = g.call_module(sub, map_arg(n.args, lambda a: env[a]), map_arg(n.kwargs, lambda a: env[a]))
        else:
            env[n] = g.node_copy(n, lambda a: env[a])
    wgm = GraphModule(root, g)
    wgm.training = eg.rw.training  # the exporter restores this mode on every shared submodule afterwards
    return wgm


def check_inference(rw: RealWorkload) -> None:
    """Refuse a training workload: the ONNX Runtime backend runs inference only."""
    if rw.training:
        raise BackendUnavailable(
            f"workload {rw.name!r} is a training step: the ONNX Runtime backend runs inference only "
            "(onnxruntime has no training sessions)"
        )


def tensor_inputs(eg: ExecGraph) -> list[tuple[str, int, Any]]:
    """The exported model's inputs in order, as the exporter flattens the placeholders' values (constants
    left out): (ONNX input name, op index of the placeholder, tensor). A list or tuple of tensors gives one
    input per tensor, `{placeholder}.{i}`; another value (a dict) is refused by name. Each tensor in forward's
    *args is a placeholder of its own (`args_0`, `args_1`, ...: capture traces the graph module from the live
    module each time, `RealWorkload.gm`, never from a stored graph), a number there a constant."""
    holders = [(n, eg.op_of[i]) for i, n in enumerate(eg.nodes) if n.op == "placeholder"]
    constants = constant_inputs(eg)
    out: list[tuple[str, int, Any]] = []

    def walk(name: str, holder: str, op: int, x: Any) -> None:
        if isinstance(x, torch.Tensor):
            out.append((name, op, x))
        elif isinstance(x, list | tuple):
            for k, y in enumerate(x):
                walk(f"{name}.{k}", holder, op, y)
        else:
            raise PlacebenchError(
                f"ONNX export of {eg.rw.name!r}: input {holder!r} holds a {type(x).__name__}; the ONNX Runtime "
                "backend takes tensors, lists and tuples of tensors, and values without tensors (constants)")

    for (n, op), x in zip(holders, eg.rw.args, strict=False):  # fewer values: the rest at their defaults
        if n not in constants:
            walk(n.name, n.name, op, x)
    return out


def export_onnx(rw: RealWorkload, eg: ExecGraph | None = None) -> Any:
    """The workload's inference model as an ONNX ModelProto with op scopes and inferred shapes."""
    import onnx

    check_inference(rw)
    eg = eg or ExecGraph(rw)
    wgm = scoped_module(eg)
    constants = constant_inputs(eg)  # baked into the graph, not inputs
    holders = [n for n in eg.nodes if n.op == "placeholder"]
    args = tuple(x for n, x in zip(holders, rw.args, strict=False) if n not in constants) if constants else rw.args
    names = [name for name, _, _ in tensor_inputs(eg)]
    buf = io.BytesIO()
    modes = {m: m.training for m in rw.module.modules()}
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            torch.onnx.export(wgm, args, buf, dynamo=False, input_names=names, opset_version=OPSET)
    finally:
        for m, mode in modes.items():
            m.training = mode
    model = onnx.load_from_string(buf.getvalue())
    model.ir_version = min(model.ir_version, IR_VERSION)
    return onnx.shape_inference.infer_shapes(model)


@dataclass
class Segment:
    """One per-device subgraph: its nodes, external inputs and outputs, and (once built) its session."""

    device: int
    level: int
    nodes: list[int]
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    session: Any = None


class OrtModel:
    """An exported workload and the op of every ONNX node (see the module docstring)."""

    def __init__(self, rw: RealWorkload, eg: ExecGraph | None = None):
        self.rw = rw
        self.eg = eg or ExecGraph(rw)
        self.model = export_onnx(rw, self.eg)
        g = self.model.graph
        self.initializers = {t.name: t for t in g.initializer}
        self.graph_inputs = [i.name for i in g.input if i.name not in self.initializers]
        self.graph_outputs = [o.name for o in g.output]
        self.types: dict[str, Any] = {}
        for vi in [*g.input, *g.output, *g.value_info]:
            self.types[vi.name] = vi
        self.producer: dict[str, int] = {}
        for j, nd in enumerate(g.node):
            for o in nd.output:
                if o:
                    self.producer[o] = j
        self.consumers: dict[str, list[int]] = {}
        for j, nd in enumerate(g.node):
            for x in nd.input:
                if x:
                    self.consumers.setdefault(x, []).append(j)
        # the exporter leaves out inputs that nothing reads: the tensors of the placeholders (`rw.args`: the
        # positional and keyword example inputs and defaults; lists flattened) are matched by name
        inputs = tensor_inputs(self.eg)
        self._placeholder_op = {name: op for name, op, _ in inputs}
        self.node_op = self._attribute()
        self.op_index = rw.graph.index
        self.input_op = {name: self._placeholder_op.get(name, -1) for name in self.graph_inputs}
        by_name = {name: x for name, _, x in inputs}
        self.input_values = {name: by_name[name] for name in self.graph_inputs}

    def _attribute(self) -> list[int]:
        """Op index of every ONNX node: its pb_op scope, else its producer's, else its first consumer's."""
        nodes = self.model.graph.node
        out = [-1] * len(nodes)
        for j, nd in enumerate(nodes):
            m = _SCOPE.search(nd.name)
            if m:
                out[j] = int(m.group(1))
        input_op = self._placeholder_op
        for j, nd in enumerate(nodes):
            if out[j] >= 0:
                continue
            for x in nd.input:
                if x in self.producer and out[self.producer[x]] >= 0:
                    out[j] = out[self.producer[x]]
                    break
                if x in input_op and input_op[x] >= 0:
                    out[j] = input_op[x]
                    break
        for j in range(len(nodes) - 1, -1, -1):
            if out[j] >= 0:
                continue
            for o in nodes[j].output:
                for c in self.consumers.get(o, []):
                    if out[c] >= 0:
                        out[j] = out[c]
                        break
                if out[j] >= 0:
                    break
        return out

    def node_devices(self, placement: np.ndarray) -> list[int]:
        return [int(placement[a]) if a >= 0 else 0 for a in self.node_op]

    def segments(self, placement: np.ndarray) -> list[Segment]:
        """Per-device subgraphs in a valid run order (see the module docstring)."""
        dev = self.node_devices(placement)
        nodes = self.model.graph.node
        level = [0] * len(nodes)
        for j, nd in enumerate(nodes):
            lv = 0
            for x in nd.input:
                p = self.producer.get(x)
                if p is not None:
                    lv = max(lv, level[p] + (dev[p] != dev[j]))
            level[j] = lv
        groups: dict[tuple[int, int], list[int]] = {}
        for j in range(len(nodes)):
            groups.setdefault((level[j], dev[j]), []).append(j)
        segs = [Segment(device=d, level=lv, nodes=js) for (lv, d), js in sorted(groups.items())]
        seg_of = {}
        for s, seg in enumerate(segs):
            for j in seg.nodes:
                seg_of[j] = s
        wanted_out = set(self.graph_outputs)
        for s, seg in enumerate(segs):
            produced: set[str] = set()
            ins: list[str] = []
            for j in seg.nodes:
                for x in nodes[j].input:
                    if x and x not in produced and x not in self.initializers and x not in ins:
                        p = self.producer.get(x)
                        if p is None or seg_of[p] != s:
                            ins.append(x)
                produced.update(o for o in nodes[j].output if o)
            outs = []
            for j in seg.nodes:
                for o in nodes[j].output:
                    if not o:
                        continue
                    if o in wanted_out or any(seg_of[c] != s for c in self.consumers.get(o, [])):
                        outs.append(o)
            seg.inputs, seg.outputs = ins, outs
        return segs

    def submodel(self, seg: Segment) -> Any:
        """The ONNX model of one segment."""
        from onnx import helper

        g = self.model.graph
        nodes = [g.node[j] for j in seg.nodes]
        used = {x for nd in nodes for x in nd.input if x in self.initializers}
        graph = helper.make_graph(
            nodes,
            f"{g.name}_seg{seg.level}_{seg.device}",
            [self._value_info(x) for x in seg.inputs],
            [self._value_info(x) for x in seg.outputs],
            [self.initializers[x] for x in sorted(used)],
        )
        return helper.make_model(graph, opset_imports=list(self.model.opset_import), ir_version=self.model.ir_version)

    def _value_info(self, name: str) -> Any:
        from onnx import helper

        vi = self.types.get(name)
        if vi is None or not vi.type.HasField("tensor_type"):
            # a placement that cuts the graph there cannot be run (a status "error"), the others can
            raise BackendUnavailable(f"ONNX export of {self.rw.name!r}: ONNX shape inference gave no type for "
                                     f"tensor {name!r}, which this placement passes between devices")
        t = vi.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim] if t.HasField("shape") else None
        return helper.make_tensor_value_info(name, t.elem_type, shape)

    def float_tensor(self, name: str) -> bool:
        from onnx import TensorProto

        vi = self.types.get(name)
        return vi is not None and vi.type.tensor_type.elem_type in (
            TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16)


# -- sessions --------------------------------------------------------------------------------------------
def _device_spec(torch_device: str) -> tuple[str, int]:
    if torch_device == "cpu":
        return "cpu", 0
    return "cuda", int(torch_device.split(":")[1])


def make_session(model_bytes: bytes, torch_device: str, *, threads: int = 0, fallback: bool = False,
                 record: bool = True) -> Any:
    """An InferenceSession on `torch_device`'s provider, with the providers it really uses checked."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = int(threads)
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    so.add_session_config_entry("session.force_spinning_stop", "1")  # idle sessions' threads must not spin
    if record:
        so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    kind, index = _device_spec(torch_device)
    if kind == "cpu":
        providers: list[Any] = [CPU_EP]
    else:
        if CUDA_EP not in ort.get_available_providers():
            from suite.backends import ort_distributions

            fix = ("both onnxruntime and onnxruntime-gpu are installed (one module: the CPU one's files may hide the "
                   'GPU one\'s): uninstall both, then pip install -e ".[gpu]"' if len(ort_distributions()) == 2
                   else "install the gpu extra (onnxruntime-gpu)")
            raise BackendUnavailable(
                f"{torch_device}: onnxruntime has no {CUDA_EP} here (available: {', '.join(ort.get_available_providers())}); "
                + fix
            )
        providers = [(CUDA_EP, {"device_id": index}), CPU_EP]
    sess = ort.InferenceSession(model_bytes, so, providers=providers)
    used = sess.get_providers()
    if kind == "cuda":
        if CUDA_EP not in used:
            raise BackendUnavailable(f"{torch_device}: asked for {CUDA_EP}, the session uses only {used}")
        sess.disable_fallback()
    return sess


_NOT_COMPUTE = ("Shape", "Size", "Constant", "ConstantOfShape", "MemcpyToHost", "MemcpyFromHost")


def computes_floats(om: OrtModel, j: int) -> bool:
    """ONNX node j computes a floating-point tensor: not a shape computation (Shape, Gather or Mul of sizes,
    Constant), which ONNX Runtime keeps on the CPU next to CUDA compute as its normal practice."""
    nd = om.model.graph.node[j]
    return nd.op_type not in _NOT_COMPUTE and any(om.float_tensor(o) for o in nd.output)


def cpu_assigned_compute_nodes(sess: Any, om: OrtModel | None = None) -> list[str]:
    """Names of nodes ONNX Runtime assigned to the CPU provider that compute floating-point tensors
    (shape computations on the CPU are ONNX Runtime's normal practice, not a fallback)."""
    try:
        info = sess.get_provider_graph_assignment_info()
    except Exception:  # noqa: BLE001 - older onnxruntime: no assignment record, providers already checked
        return []
    out = []
    for sub in info:
        if sub.ep_name != CPU_EP:
            continue
        for nd in sub.get_nodes():
            if nd.op_type in _NOT_COMPUTE:
                continue
            if om is not None:
                j = _node_by_name(om).get(nd.name)
                if j is not None and not computes_floats(om, j):
                    continue
            out.append(nd.name)
    return out


def _node_by_name(om: OrtModel) -> dict[str, int]:
    cache = getattr(om, "_by_name", None)
    if cache is None:
        cache = {nd.name: j for j, nd in enumerate(om.model.graph.node)}
        om._by_name = cache
    return cache


def _copy_ortvalue(v: Any, torch_device: str) -> Any:
    """`v` copied to `torch_device`: one copy, as a step's boundary copy makes. A CPU value's `numpy()` is a
    view of its memory (copied here: a real copy between logical devices), a CUDA value's is already a new
    host copy (copied again, a GPU-to-CPU copy was timed as two)."""
    import onnxruntime as ort

    kind, index = _device_spec(torch_device)
    arr = v.numpy()
    if kind == "cpu":
        return ort.OrtValue.ortvalue_from_numpy(arr.copy() if v.device_name().lower() == "cpu" else arr)
    return ort.OrtValue.ortvalue_from_numpy(arr, "cuda", index)


class OrtExecutor:
    """Runs inference steps of a workload split over devices by one placement (see the module docstring)."""

    def __init__(self, om: OrtModel, device_map: DeviceMap, *, threads: int | None = None):
        self.om = om
        self.device_map = device_map
        self.threads = torch.get_num_threads() if threads is None else threads
        self.segments: list[Segment] = []
        self.copies_bytes = 0
        self._staged: dict[str, tuple[Any, int]] = {}
        self._used: list[int] = []
        self.at: str | None = None  # the torch device of the session being made or run, or of the copy made

    def apply(self, placement: np.ndarray) -> None:
        import onnxruntime as ort

        placement = device_indices(placement, self.om.rw.graph.num_ops, len(self.device_map))
        self.release()  # the last placement's sessions and their memory pools go before this one's are made
        segs = self.om.segments(placement)
        inputs = {name: int(placement[op]) if op >= 0 else 0
                  for name, op in ((n, self.om.input_op.get(n, -1)) for n in self.om.input_values)}
        # known before anything is allocated: an out-of-memory failure below names only these devices
        self._used = sorted({s.device for s in segs} | set(inputs.values()))
        for seg in segs:
            td = self.device_map.torch_devices[seg.device]
            data = self.om.submodel(seg).SerializeToString()
            self.at = td
            seg.session = make_session(data, td, threads=self.threads)
            if td != "cpu":
                bad = cpu_assigned_compute_nodes(seg.session, self.om)
                if bad:
                    raise BackendUnavailable(
                        f"{td}: onnxruntime placed {len(bad)} compute node(s) of a CUDA subgraph on the CPU "
                        f"(silent fallback), e.g. {bad[:3]}"
                    )
        self.segments = segs
        self._staged = {}
        for name, x in self.om.input_values.items():
            d = inputs[name]
            self.at = self.device_map.torch_devices[d]
            kind, index = _device_spec(self.at)
            arr = x.detach().cpu().numpy()
            self._staged[name] = (ort.OrtValue.ortvalue_from_numpy(arr, kind, index), d)

    @property
    def used_devices(self) -> list[int]:
        """The cluster devices (indices) the applied placement puts anything on: a segment or a staged input
        (an input op alone on a GPU holds its input there, and the steps copy it from there); set by `apply`
        before it makes the sessions, emptied by `release`."""
        return list(self._used)

    @property
    def devices(self) -> list[torch.device]:
        """The torch devices of `used_devices`: those a step synchronises and reports peak memory of."""
        return [torch.device(t) for t in dict.fromkeys(self.device_map.torch_devices[d] for d in self.used_devices)]

    def step(self) -> list[np.ndarray]:
        """One inference step; returns the graph outputs as numpy arrays."""
        vals = self.run()
        return [vals[name][0].numpy() for name in self.om.graph_outputs]

    def run(self) -> dict[str, tuple[Any, int]]:
        """One inference step, as timed: every tensor (OrtValue) with its device, the outputs left on theirs."""
        if not self.segments:
            raise PlacebenchError("no placement applied (or it was released)")
        vals: dict[str, tuple[Any, int]] = dict(self._staged)
        cache: dict[tuple[str, int], Any] = {}
        for seg in self.segments:
            td = self.device_map.torch_devices[seg.device]
            kind, index = _device_spec(td)
            self.at = td
            binding = seg.session.io_binding()
            for name in seg.inputs:
                v, d = vals[name]
                if d != seg.device:
                    c = cache.get((name, seg.device))
                    if c is None:
                        c = cache[(name, seg.device)] = _copy_ortvalue(v, td)
                        self.copies_bytes += int(np.prod(v.shape())) * _itemsize(v)
                    v = c
                binding.bind_ortvalue_input(name, v)
            for name in seg.outputs:
                binding.bind_output(name, kind, index)
            seg.session.run_with_iobinding(binding)
            for name, v in zip(seg.outputs, binding.get_outputs(), strict=True):
                vals[name] = (v, seg.device)
        return vals

    def release(self) -> None:
        for seg in self.segments:
            seg.session = None
        self.segments = []
        self._staged = {}
        self._used = []


_ITEMSIZE = {"float": 4, "double": 8, "int64": 8, "int32": 4, "float16": 2, "bfloat16": 2, "bool": 1, "uint8": 1,
             "int8": 1, "int16": 2, "uint16": 2, "uint32": 4, "uint64": 8, "complex64": 8, "complex128": 16}


def _itemsize(v: Any) -> int:
    """Bytes per element of an OrtValue (its data type, e.g. "tensor(bfloat16)"); for a type not listed the
    placement's status is "error", rather than a guess in the copied bytes."""
    t = v.data_type()
    size = _ITEMSIZE.get(t.removeprefix("tensor(").removesuffix(")"))
    if size is None:
        raise BackendUnavailable(f"a copy between devices of an ONNX Runtime value of type {t}: bytes per "
                                 "element unknown")
    return size


class OrtBackend:
    """ONNX Runtime as an evaluator backend (inference workloads; what its peak memory counts: see the module
    docstring)."""

    name = "onnxruntime"
    last_concurrent = False  # the sessions of a step run one after another in the calling thread

    def __init__(self, rw: RealWorkload, cluster: Cluster, device_map: DeviceMap | None = None, *,
                 methodology: Methodology | None = None, timing: Timing | None = None, threads: int | None = None,
                 clock: str = "wall"):
        clock_function(clock)  # an unknown clock fails here, before the model is exported and its sessions made
        self.rw = rw
        self.workload = rw.graph
        self.cluster = cluster
        self.device_map, self.timing = backend_setup(cluster, device_map, methodology, timing)
        self.model = OrtModel(rw)
        self.executor = OrtExecutor(self.model, self.device_map, threads=threads)
        self.clock = clock

    def _measured(self, run, devices: Sequence[torch.device], names: Sequence[str], copied: int,
                  used_devices: Sequence[int] | None = None) -> Measurement:
        """`used_devices`: the cluster devices the placement puts anything on (None: every CPU device, and the
        GPUs mapped to `devices`)."""
        check_cpu_clock(self.clock, devices, False, threads=self.executor.threads, runtime="ONNX Runtime")
        reset_peak_memory(devices)
        samples = time_steps(run, self.timing, devices, self.clock)
        peaks = {}
        used = {str(t) for t in devices}
        cpu_peak = cpu_peak_rss_bytes()
        for d, name in enumerate(names):
            td = self.device_map.torch_device(d)
            if td.type != "cuda" and cpu_peak is None:
                continue  # unknown (no resettable peak): left out, for the CPUs left idle too (not a max of 0)
            if used_devices is not None and d not in used_devices:
                peaks[name] = 0  # a device the placement puts nothing on: not the process's resident set
            elif td.type != "cuda":
                peaks[name] = cpu_peak
            elif str(td) in used:
                free, total = torch.cuda.mem_get_info(td)
                peaks[name] = int(total - free)  # the arena keeps its peak; CUDA contexts and others' memory too
            else:  # a GPU the run leaves unused: 0, not what other sessions or processes hold there
                peaks[name] = 0
        return Measurement(status="ok", step_time_s=statistic_s(samples, self.timing), samples_s=tuple(samples),
                           peak_memory_bytes=peaks, bytes_transferred=int(copied))

    def _failed(self, exc: BaseException, at: str | None = None, used: Sequence[int] | None = None) -> Measurement:
        """The status of a failure; `at`: the torch device of the session or copy that failed, if known;
        `used`: the cluster devices the placement puts anything on, the only ones an OOM names (None: all)."""
        first = str(exc).splitlines()[0] if str(exc) else ""
        oom, need = (), {}
        if is_oom(exc):  # before the sessions are released: ONNX Runtime's arenas still hold what they took
            oom = oom_devices(exc, at, self.device_map)
            if used is not None:
                oom = held_by(oom, used, self.device_map.cluster_devices)
            for name in oom:
                td = self.device_map.torch_device(self.device_map.cluster_devices.index(name))
                if td.type == "cuda":
                    free, total = torch.cuda.mem_get_info(td)
                    need[name] = oom_need_bytes(total - free, total - free, exc)
                else:
                    need[name] = oom_need_bytes(cpu_peak_rss_bytes() or 0, memory_in_use_bytes(td) or 0, exc)
        self.executor.release()
        free_memory(self.device_map.cuda_devices)
        if is_oom(exc):
            return Measurement(status="oom", step_time_s=None, oom_devices=oom, peak_memory_bytes=need,
                               message=f"out of memory on {', '.join(oom) or 'an unknown device'}: {first}")
        return Measurement(status="error", step_time_s=None, message=f"{type(exc).__name__}: {first}")

    def measure(self, placement: np.ndarray) -> Measurement:
        ex = self.executor
        names = [d.name for d in self.cluster.devices]
        ex.at = None
        reset_peak_memory(())  # the CPU's peak from here (a failure in `apply` or the first step: this one's)
        try:
            ex.apply(placement)
            ex.copies_bytes = 0
            ex.run()
            copied = ex.copies_bytes
            return self._measured(ex.run, ex.devices, names, copied, ex.used_devices)
        except PlacebenchError as exc:
            if isinstance(exc, BackendUnavailable):
                return self._failed(exc, ex.at, ex.used_devices)
            raise
        except Exception as exc:  # noqa: BLE001 - failures are statuses
            return self._failed(exc, ex.at, ex.used_devices)

    def measure_batch(self, placements: np.ndarray) -> list[Measurement]:
        return [self.measure(p) for p in placements]

    def measure_native(self, which: str, *, gpu: str | None = None) -> Measurement:
        """The framework's own placement: "ort_cpu" (CPU provider) or "ort_gpu" (CUDA with CPU fallback) on
        `gpu`, by default the torch device the cluster's fastest GPU is mapped to. Copies inside the session
        are not seen: `bytes_transferred` is 0 (see the module docstring)."""
        if which not in ("ort_cpu", "ort_gpu"):
            raise PlacebenchError(f"native placement {which!r} is not 'ort_cpu' or 'ort_gpu'")
        if which == "ort_gpu" and gpu is None:
            has_gpu = self.cluster.device_indices("gpu")
            gpu = self.device_map.torch_devices[self.cluster.fastest("gpu")] if has_gpu else "cuda:0"
        import onnxruntime as ort

        if which == "ort_gpu" and not gpu.startswith("cuda"):  # never the CPU provider under the GPU's name
            return Measurement(status="error", step_time_s=None,
                               message=f"ort_gpu: the cluster's GPU is mapped to {gpu!r}, not a CUDA device")
        data = self.model.model.SerializeToString()
        self.executor.release()  # a placement's sessions would hold their memory pools during this run
        at = "cpu" if which == "ort_cpu" else gpu
        reset_peak_memory(())  # the CPU's peak from here
        try:
            # a new session each call: one kept between the rounds would hold its GPU memory pool while the
            # placements are measured, and their peak memory on the GPU is read from what is free
            sess = make_session(data, at, threads=self.executor.threads)
            kind, index = _device_spec(at)
            # as a placement's steps: inputs staged on the device before, outputs left there
            staged = {n: ort.OrtValue.ortvalue_from_numpy(x.detach().cpu().numpy(), kind, index)
                      for n, x in self.model.input_values.items()}

            def run() -> None:
                binding = sess.io_binding()
                for n, v in staged.items():
                    binding.bind_ortvalue_input(n, v)
                for n in self.model.graph_outputs:
                    binding.bind_output(n, kind, index)
                sess.run_with_iobinding(binding)

            run()
            devices = [torch.device("cpu")] if which == "ort_cpu" else [torch.device(gpu)]
            m = self._measured(run, devices, [d.name for d in self.cluster.devices], 0)
        except PlacebenchError as exc:
            if isinstance(exc, BackendUnavailable):
                return self._failed(exc, at)
            raise
        except Exception as exc:  # noqa: BLE001
            return self._failed(exc, at)
        return m


def oom_devices(exc: BaseException, at: str | None, device_map: DeviceMap) -> tuple[str, ...]:
    """The cluster devices an ONNX Runtime allocation failure happened on: those mapped to the CUDA device its
    message names (CUDA_CALL's "CUDA failure 2: out of memory ; GPU=1 ; ..."), else to `at`, the torch
    device of the session or copy that failed; none where neither is known (ONNX Runtime's arena message,
    "Failed to allocate memory for requested buffer of size ...", names no device)."""
    m = re.search(r"\bGPU=(\d+)", str(exc))
    target = f"cuda:{m.group(1)}" if m else at
    if target is None:
        return ()
    return tuple(n for n, t in zip(device_map.cluster_devices, device_map.torch_devices, strict=True)
                 if str(torch.device(t)) == str(torch.device(target)))


def native_assignment(om: OrtModel, gpu: str = "cuda:0") -> dict[int, str]:
    """Where ONNX Runtime with the CUDA provider and CPU fallback puts each op: op index -> "gpu" or "cpu"
    (an op is on the GPU when at least half of its ONNX nodes that compute floating-point tensors are, a tie
    going to the GPU, the provider asked for first; the shape computations that ONNX Runtime keeps on the CPU
    next to CUDA compute do not count, as `computes_floats` says: the 16 of an LSTM cell's chunk sizes made
    its 16 compute nodes a tie. An op with no such node goes by all of its nodes)."""
    sess = make_session(om.model.SerializeToString(), gpu, record=True)
    if not hasattr(sess, "get_provider_graph_assignment_info"):
        import onnxruntime as ort

        raise BackendUnavailable(f"onnxruntime {ort.__version__} does not report where it assigns nodes "
                                 "(InferenceSession.get_provider_graph_assignment_info): upgrade onnxruntime-gpu")
    info = sess.get_provider_graph_assignment_info()
    by_name = _node_by_name(om)
    votes: dict[int, list[int]] = {}  # the nodes computing floating-point tensors
    others: dict[int, list[int]] = {}  # shape computations: an op's votes only where it has no compute node
    for sub in info:
        on_gpu = int(sub.ep_name == CUDA_EP)
        for nd in sub.get_nodes():
            j = by_name.get(nd.name)
            if j is not None and om.node_op[j] >= 0:
                (votes if computes_floats(om, j) else others).setdefault(om.node_op[j], []).append(on_gpu)
    return {op: ("gpu" if 2 * sum(v) >= len(v) else "cpu")
            for op, v in ((op, votes.get(op) or others[op]) for op in sorted({*votes, *others}))}
