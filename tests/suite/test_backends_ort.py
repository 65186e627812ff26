"""ONNX Runtime backend: per-device subgraphs equal the eager model for every zoo family (small shapes), the
split is a valid run order, providers are checked (no silent CUDA fallback), training is refused, and the
ort_cpu / ort_gpu baselines."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
import torch.nn as nn

import suite
from suite.backends.devices import DeviceMap, local_cluster
from suite.backends.ort_exec import (
    BackendUnavailable,
    OrtBackend,
    OrtExecutor,
    OrtModel,
    export_onnx,
    make_session,
)
from suite.backends.workload import SMALL_SHAPES, from_module, small_workload
from suite.errors import PlacebenchError
from suite.fidelity import random_placement, random_split_placement
from suite.methodology import Budget, Timing
from suite.placer import NotApplicable, Problem, make_placer

FAST = Timing(warmup_steps=1, measured_steps=3)
FAMILY_WORKLOADS = ["resnet50-b32", "inception_v3-b32", "bert_base-12x768-s128-b8", "rnnlm-2x2048-b64",
                    "nmt-2x1024-b64"]
HAS_CUDA_EP = torch.cuda.is_available() and "CUDAExecutionProvider" in ort.get_available_providers()


@pytest.fixture(scope="module")
def three_cpus():
    return local_cluster(3, gpus=False)  # three logical CPUs, and nothing else on a GPU host


@pytest.fixture(scope="module")
def models():
    """OrtModel of every family's small inference workload (exported once for the module)."""
    return {name: OrtModel(small_workload(name, mode="inference")) for name in FAMILY_WORKLOADS}


@pytest.mark.parametrize("name", FAMILY_WORKLOADS)
def test_split_inference_equals_eager_for_every_family(name, models, three_cpus):
    _, dmap = three_cpus
    om = models[name]
    rw = om.rw
    ref = rw.eager().numpy()
    assert all(a >= 0 for a in om.node_op)  # every ONNX node is attributed to an op
    ex = OrtExecutor(om, dmap)
    rng = np.random.default_rng(4)
    placements = [np.zeros(rw.graph.num_ops, dtype=np.int64), random_split_placement(rw.graph, 3, rng)]
    if rw.graph.num_ops < 100:  # per-op random placements of the image models make ~90 sessions: slow
        placements.append(random_placement(rw.graph, 3, rng))
    for p in placements:
        ex.apply(p)
        ex.copies_bytes = 0
        out = ex.step()
        np.testing.assert_allclose(out[0], ref, rtol=1e-4, atol=1e-5)
        assert (len(ex.segments) == 1) == (len(set(p.tolist())) == 1)
        assert (ex.copies_bytes > 0) == (len(ex.segments) > 1)


@pytest.mark.parametrize("seed", range(4))
def test_segments_form_a_valid_run_order(models, seed):
    om = models["inception_v3-b32"]
    p = random_placement(om.rw.graph, 3, np.random.default_rng(seed))
    segs = om.segments(p)
    available = set(om.graph_inputs)
    dev = om.node_devices(p)
    seen_nodes = []
    for seg in segs:
        assert all(x in available for x in seg.inputs)  # reads only what earlier segments produced
        assert {dev[j] for j in seg.nodes} == {seg.device}
        seen_nodes += seg.nodes
        available.update(seg.outputs)
    assert sorted(seen_nodes) == list(range(len(om.model.graph.node)))
    assert set(om.graph_outputs) <= available
    # no two segments of the same device at the same level
    assert len({(s.level, s.device) for s in segs}) == len(segs)


def test_backend_measures_and_native_cpu_placement(three_cpus):
    cluster, dmap = three_cpus
    rw = small_workload("bert_base-12x768-s128-b8", mode="inference")
    be = OrtBackend(rw, cluster, dmap, timing=FAST)
    m = be.measure(random_split_placement(rw.graph, 3, np.random.default_rng(0)))
    assert m.status == "ok" and len(m.samples_s) == 3 and m.bytes_transferred > 0
    native = be.measure_native("ort_cpu")
    assert native.status == "ok" and native.step_time_s > 0


@pytest.mark.skipif(HAS_CUDA_EP, reason="checks the behaviour without CUDA")
def test_cuda_session_without_the_cuda_provider_is_an_error(three_cpus):
    with pytest.raises(BackendUnavailable, match="CUDAExecutionProvider"):
        make_session(b"", "cuda:0")
    cluster, dmap = three_cpus
    be = OrtBackend(small_workload("rnnlm-2x2048-b64", mode="inference"), cluster, dmap, timing=FAST)
    m = be.measure_native("ort_gpu")
    assert m.status == "error" and "CUDAExecutionProvider" in m.message


@pytest.mark.parametrize("installed, fix", [
    (("onnxruntime",), "install the gpu extra (onnxruntime-gpu)"),
    (("onnxruntime", "onnxruntime-gpu"), "both onnxruntime and onnxruntime-gpu are installed (one module: the CPU "
                                         'one\'s files may hide the GPU one\'s): uninstall both, then pip install -e '
                                         '".[gpu]"'),
])
def test_a_missing_cuda_provider_says_what_to_do(monkeypatch, installed, fix):
    """`pip install -e ".[test,gpu]"` installs both distributions, which share the module `onnxruntime`; the
    error told such a user to install the gpu extra, which they had. It now says both are there."""
    from importlib import metadata

    def version(dist):
        if dist not in installed:
            raise metadata.PackageNotFoundError(dist)
        return "1.20.0"

    monkeypatch.setattr(metadata, "version", version)
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    with pytest.raises(BackendUnavailable) as info:
        make_session(b"", "cuda:0")
    assert str(info.value) == ("cuda:0: onnxruntime has no CUDAExecutionProvider here (available: "
                               "CPUExecutionProvider); " + fix)


def test_training_workloads_are_refused():
    with pytest.raises(BackendUnavailable, match="inference only"):
        export_onnx(small_workload("rnnlm-2x2048-b64", mode="training"))


def test_ort_baselines():
    rw = small_workload("resnet50-b32", mode="inference")
    g = rw.graph
    h100 = suite.load_cluster("xeon_h100")
    budget = Budget(max_evaluations=1)
    cpu = make_placer("ort_cpu").place(Problem.make(g, h100, budget), budget, 0)
    assert (cpu.placement == 0).all() and cpu.evaluations == 0
    gpu = make_placer("ort_gpu", assignment="static").place(Problem.make(g, h100, budget), budget, 0)
    inputs = [i for i, op in enumerate(g.ops) if op.kind == "input"]
    assert (gpu.placement[inputs] == 0).all()
    assert (np.delete(gpu.placement, inputs) == 1).all()
    assert gpu.info["assignment"] == "static"
    two_cpus, _ = local_cluster(2, gpus=False)
    with pytest.raises(NotApplicable):
        make_placer("ort_gpu").place(Problem.make(g, two_cpus, budget), budget, 0)


def test_ort_gpu_keeps_colocation_groups_in_training_graphs():
    g = small_workload("rnnlm-2x2048-b64", mode="training").graph
    h100 = suite.load_cluster("xeon_h100")
    budget = Budget(max_evaluations=1)
    res = make_placer("ort_gpu").place(Problem.make(g, h100, budget), budget, 0)
    for members in g.groups.values():
        assert len(set(res.placement[members].tolist())) == 1


def test_a_gpu_cluster_runs_with_its_gpu_mapped_to_the_cpu(models):
    cluster = suite.load_cluster("xeon_h100")
    dmap = DeviceMap.parse(cluster, ["gpu:0=cpu"])
    om = models["nmt-2x1024-b64"]
    ex = OrtExecutor(om, dmap)
    ex.apply(random_split_placement(om.rw.graph, 2, np.random.default_rng(1)))
    np.testing.assert_allclose(ex.step()[0], om.rw.eager().numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(not HAS_CUDA_EP, reason="needs CUDA and onnxruntime-gpu")
def test_cpu_gpu_split_on_cuda(models):
    cluster, dmap = local_cluster(1)
    om = models["resnet50-b32"]
    p = random_split_placement(om.rw.graph, cluster.num_devices, np.random.default_rng(0))
    ex = OrtExecutor(om, dmap)
    ex.apply(p)
    np.testing.assert_allclose(ex.step()[0], om.rw.eager().numpy(), rtol=1e-3, atol=1e-3)
    be = OrtBackend(om.rw, cluster, dmap, timing=FAST)
    assert be.measure_native("ort_gpu").status == "ok"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet50-b1-infer", "inception_v3-b1-infer", "bert_base-12x768-s128-b1-infer",
                                  "rnnlm-2x2048-b64", "nmt-2x1024-b64"])
def test_full_size_workloads_batch_one_inference(name, three_cpus):
    """Every zoo model at full size (not the large variants), batch 1, inference, split over logical CPUs."""
    from suite import zoo
    from suite.backends.workload import real_workload

    rw = real_workload(name) if zoo.spec(name).mode == "inference" else real_workload(name, mode="inference",
                                                                                        batch_size=1)
    _, dmap = three_cpus
    ex = OrtExecutor(OrtModel(rw), dmap)
    ex.apply(random_split_placement(rw.graph, 3, np.random.default_rng(0)))
    np.testing.assert_allclose(ex.step()[0], rw.eager().numpy(), rtol=1e-3, atol=1e-4)


class _TwoOutputs(nn.Module):
    """An unread first input (the exporter drops it), two read inputs, and three outputs: one made early, one
    read later by another op, one last."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(4, 5), nn.Linear(5, 3), nn.Linear(3, 2)

    def forward(self, unused, x, y):
        h = torch.relu(self.a(x))
        early = h * 2.0
        z = self.b(h) + y
        return self.c(z), early, z


@pytest.fixture(scope="module")
def two_outputs():
    torch.manual_seed(0)
    inputs = (torch.randn(2, 7), torch.randn(2, 4), torch.randn(2, 3))
    return OrtModel(from_module(_TwoOutputs().eval(), inputs, name="two_outputs"))


def test_split_outputs_equal_eager_and_one_session_with_an_unread_input(two_outputs, three_cpus):
    om = two_outputs
    rw = om.rw
    assert len(om.graph_inputs) == 2  # the unread input is not in the ONNX graph: inputs are matched by name
    ref = [t.numpy() for t in rw.eager()]
    sess = make_session(om.model.SerializeToString(), "cpu")
    whole = sess.run(None, {n: x.numpy() for n, x in zip(["x", "y"], rw.inputs[1:], strict=True)})
    for w, r in zip(whole, ref, strict=True):
        np.testing.assert_allclose(w, r, rtol=1e-5, atol=1e-6)
    cluster, dmap = three_cpus
    ex = OrtExecutor(om, dmap)
    n = rw.graph.num_ops
    rng = np.random.default_rng(0)
    for p in [np.zeros(n, dtype=np.int64), np.arange(n) % 3, *(rng.integers(0, 3, n) for _ in range(6))]:
        ex.apply(p)
        out = ex.step()
        assert len(out) == len(ref)
        for o, w in zip(out, whole, strict=True):
            np.testing.assert_allclose(o, w, rtol=1e-5, atol=1e-6)
    m = OrtBackend(rw, cluster, dmap, timing=FAST).measure_native("ort_cpu")
    assert m.status == "ok", m.message


def test_bad_placements_are_refused(two_outputs, three_cpus):
    cluster, dmap = three_cpus
    be = OrtBackend(two_outputs.rw, cluster, dmap, timing=FAST)
    n = two_outputs.rw.graph.num_ops
    for p, what in [(np.zeros(n - 1), "shape"), (np.zeros(n + 2), "shape"), (np.full(n, 3), "outside 0..2"),
                    (np.full(n, -1), "outside 0..2")]:
        with pytest.raises(PlacebenchError, match=what):
            be.measure(p.astype(np.int64))
    with pytest.raises(PlacebenchError, match="device indices \\(integers\\), got an array of float64"):
        be.measure(np.full(n, 1.5))  # was run as device 1


def test_cpu_clock_counts_onnx_runtime_threads_not_torch_threads(two_outputs, three_cpus, monkeypatch):
    cluster, dmap = three_cpus
    rw = two_outputs.rw
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    one = OrtBackend(rw, cluster, dmap, timing=FAST, threads=1, clock="cpu")
    assert one.measure(np.zeros(rw.graph.num_ops, dtype=np.int64)).status == "ok"
    assert one.measure_native("ort_cpu").status == "ok"
    two = OrtBackend(rw, cluster, dmap, timing=FAST, threads=2, clock="cpu")
    with pytest.raises(PlacebenchError, match="one intra-op thread, ONNX Runtime uses 2"):
        two.measure(np.zeros(rw.graph.num_ops, dtype=np.int64))


def test_an_unknown_clock_fails_when_the_backend_is_made_before_the_model_is_exported(two_outputs, three_cpus,
                                                                                      monkeypatch):
    """Not at the first measurement, after the export and the sessions."""
    import suite.backends.ort_exec as ox

    cluster, dmap = three_cpus

    def exported(*a, **k):
        raise AssertionError("the model was exported before the clock was checked")

    monkeypatch.setattr(ox, "OrtModel", exported)
    with pytest.raises(PlacebenchError, match="clock 'sundial' is not one of wall, cpu"):
        OrtBackend(two_outputs.rw, cluster, dmap, timing=FAST, clock="sundial")


def test_a_gpu_the_run_leaves_unused_reports_no_peak_memory(two_outputs, three_cpus, monkeypatch):
    """As in the PyTorch backend: an unused GPU reports 0, not the memory other sessions hold there."""
    import suite.backends.devices as devices
    import suite.backends.ort_exec as ox
    import suite.backends.timing as timing

    cluster, _ = three_cpus
    be = OrtBackend(two_outputs.rw, cluster, None, timing=FAST)
    monkeypatch.setattr(devices, "check_torch_device", lambda *a, **k: None)  # pretend cuda:0 and cuda:1 exist
    be.device_map = DeviceMap(("cpu:0", "cpu:1", "cpu:2"), ("cpu", "cuda:0", "cuda:1"))
    monkeypatch.setattr(ox, "reset_peak_memory", lambda devs: None)
    monkeypatch.setattr(timing, "synchronize", lambda devs: None)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d: (2**30, 5 * 2**30))
    names = ["cpu:0", "cpu:1", "cpu:2"]
    m = be._measured(lambda: None, [torch.device("cpu"), torch.device("cuda:1")], names, 0)
    assert (m.peak_memory_bytes["cpu:1"], m.peak_memory_bytes["cpu:2"]) == (0, 4 * 2**30)
    m = be._measured(lambda: None, [torch.device("cpu")], names, 0)
    assert (m.peak_memory_bytes["cpu:1"], m.peak_memory_bytes["cpu:2"]) == (0, 0)


def test_a_cpu_the_placement_puts_nothing_on_reports_no_peak_memory(two_outputs, three_cpus):
    """Every op on cpu:0 of three logical CPUs: cpu:1 and cpu:2 hold nothing and report 0; they reported the
    process's peak resident set, as cpu:0 does."""
    cluster, dmap = three_cpus
    m = OrtBackend(two_outputs.rw, cluster, dmap, timing=FAST).measure(
        np.zeros(two_outputs.rw.graph.num_ops, dtype=np.int64))
    assert m.status == "ok" and m.peak_memory_bytes["cpu:0"] > 0
    assert (m.peak_memory_bytes["cpu:1"], m.peak_memory_bytes["cpu:2"]) == (0, 0)


def test_fidelity_refuses_a_training_workload_before_profiling(tmp_path, capsys):
    """The refusal came only when the backend was built, after the workload had been profiled (minutes at full
    size) and its profile stored."""
    from suite.cli import main

    small = [f"--set={k}={v}" for k, v in SMALL_SHAPES["rnnlm"].items()]
    code = main(["fidelity", "rnnlm-2x2048-b64", *small, "--mode", "training", "--backend", "onnxruntime",
                 "--logical-cpus", "1", "--profiles", str(tmp_path / "p"), "--out", str(tmp_path / "f")])
    err = capsys.readouterr().err
    assert code == 2 and "placebench: error:" in err and "runs inference only" in err and "Traceback" not in err
    assert not (tmp_path / "p").exists() and not (tmp_path / "f").exists()


def test_ort_gpu_runs_on_the_cuda_device_the_clusters_gpu_is_mapped_to(two_outputs, monkeypatch):
    """measure_native("ort_gpu") ran on cuda:0 whatever the device map said: on cuda:0 for a GPU mapped to
    cuda:1, and on cuda:0 (where there is one) for a GPU mapped to the CPU, which is now an error status."""
    import suite.backends.devices as devices
    import suite.backends.ort_exec as ox

    cluster = suite.load_cluster("xeon_h100")
    gpu = cluster.devices[cluster.fastest("gpu")].name
    be = OrtBackend(two_outputs.rw, cluster, DeviceMap.parse(cluster, [f"{gpu}=cpu"]), timing=FAST)
    m = be.measure_native("ort_gpu")
    assert m.status == "error" and "mapped to 'cpu', not a CUDA device" in m.message
    asked = []

    def fake_session(data, torch_device, **kw):
        asked.append(torch_device)
        raise BackendUnavailable("no session here")

    monkeypatch.setattr(devices, "check_torch_device", lambda *a, **k: None)  # pretend cuda:1 exists
    monkeypatch.setattr(ox, "make_session", fake_session)
    be = OrtBackend(two_outputs.rw, cluster, DeviceMap.parse(cluster, [f"{gpu}=cuda:1"]), timing=FAST)
    assert be.measure_native("ort_gpu").status == "error" and asked == ["cuda:1"]


def test_sessions_stop_their_threads_spinning_after_each_run(two_outputs):
    """By default ONNX Runtime's intra-op threads spin on after a run: with many segment sessions run one after
    another, the idle sessions' spinning threads took the cores (81 sessions of a per-op random split of a small
    ResNet-50, 2 threads each: 0.9 s a step instead of 30 ms)."""
    sess = make_session(two_outputs.model.SerializeToString(), "cpu", threads=2)
    assert sess.get_session_options().get_session_config_entry("session.force_spinning_stop") == "1"


def test_native_assignment_on_an_onnxruntime_without_assignment_records_is_a_clear_error(monkeypatch, models):
    """ort_gpu reads where ONNX Runtime put each node; a version that cannot say is named, not an
    AttributeError."""
    import suite.backends.ort_exec as ort_exec

    monkeypatch.setattr(ort_exec, "make_session", lambda *a, **k: object())
    with pytest.raises(BackendUnavailable, match=r"does not report where it assigns nodes .*upgrade onnxruntime-gpu"):
        ort_exec.native_assignment(models["resnet50-b32"])


class _Keyword(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x, shift=None, scale=2.0):
        y = self.fc(x) * scale
        return y if shift is None else y + shift


@pytest.mark.parametrize("kwargs", [{"shift": True}, {"shift": True, "scale": 3.0}])
def test_keyword_example_inputs_are_exported_and_fed(three_cpus, kwargs):
    """from_module(model, (x,), example_kwargs={'shift': s, 'scale': 3.0}): the exported model takes shift as
    an input and scale as its example value, split over two devices equal to eager. It was exported with
    the positional inputs alone (shift None: 'unsupported operand type(s) for +'; scale 2.0: fx's
    'scale has been specialized to have value 3.0')."""
    _, dmap = three_cpus
    torch.manual_seed(0)
    x, s = torch.randn(2, 4), torch.randn(2, 4)
    kwargs = {**kwargs, "shift": s}
    rw = from_module(_Keyword(), (x,), example_kwargs=kwargs, name="keyword")
    om = OrtModel(rw)
    assert om.graph_inputs == ["x", "shift"]
    ex = OrtExecutor(om, dmap)
    ex.apply(np.arange(rw.graph.num_ops, dtype=np.int64) % 2)
    out = ex.step()[0]
    expected = rw.module.fc(x) * kwargs.get("scale", 2.0) + s
    np.testing.assert_allclose(out, expected.detach().numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(out, rw.eager().numpy(), rtol=1e-6, atol=1e-6)


class _Constants(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x, n_layers: int, flag: bool, mask=None):
        for _ in range(n_layers):
            x = self.fc(x)
        if mask is not None:
            x = x + mask
        return torch.relu(x) if flag else x


@pytest.mark.parametrize("constants", [(3, True), (2, False, None)])
def test_positional_constants_are_baked_into_the_export(three_cpus, constants):
    """forward(x, n_layers: int, flag: bool): capture and the PyTorch backend take 3 and True as traced
    constants; the export failed inside torch.onnx.export (the tracer made them tensors: 'We don't have an op
    for aten::eq ... Argument types: Tensor, bool'). Now the model's only input is x, split equals eager."""
    cluster, dmap = three_cpus
    torch.manual_seed(0)
    x = torch.randn(2, 4)
    rw = from_module(_Constants().eval(), (x, *constants), name="constants")
    om = OrtModel(rw)
    assert om.graph_inputs == ["x"]
    ex = OrtExecutor(om, dmap)
    ex.apply(np.arange(rw.graph.num_ops, dtype=np.int64) % 2)
    expected = x
    for _ in range(constants[0]):
        expected = rw.module.fc(expected)
    expected = torch.relu(expected) if constants[1] else expected
    np.testing.assert_allclose(ex.step()[0], expected.detach().numpy(), rtol=1e-6, atol=1e-6)
    m = OrtBackend(rw, cluster, dmap, timing=FAST).measure(np.zeros(rw.graph.num_ops, dtype=np.int64))
    assert m.status == "ok", m.message


def test_allocation_failures_name_their_device_and_the_bytes_asked_for(monkeypatch):
    """An ONNX Runtime OOM named no device (m_etf's OOM retries then shrank no device's room): now the CUDA
    device its message names, else the device of the session or copy that failed, else none, said so."""
    import suite.backends.devices as devices
    from suite.backends.ort_exec import oom_devices
    from suite.backends.timing import oom_need_bytes, requested_bytes

    monkeypatch.setattr(devices, "check_torch_device", lambda *a, **k: None)  # pretend cuda:0 and cuda:1 exist
    dmap = DeviceMap(("cpu:0", "cpu:1", "gpu:0", "gpu:1"), ("cpu", "cpu", "cuda:0", "cuda:1"))
    cuda = RuntimeError("CUDA failure 2: out of memory ; GPU=1 ; hostname=h ; file=f.cc ; line=7 ; expr=cudaMalloc")
    arena = RuntimeError("[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Non-zero status code returned while running "
                         "MatMul node. Failed to allocate memory for requested buffer of size 1048576")
    assert oom_devices(cuda, None, dmap) == ("gpu:1",)
    assert oom_devices(cuda, "cuda:0", dmap) == ("gpu:1",)  # the message's device first
    assert oom_devices(arena, "cuda:0", dmap) == ("gpu:0",)
    assert oom_devices(arena, "cpu", dmap) == ("cpu:0", "cpu:1")
    assert oom_devices(arena, None, dmap) == ()
    assert requested_bytes(arena) == 2**20
    assert requested_bytes(RuntimeError("CUDA out of memory. Tried to allocate 2.50 GiB. GPU 0 has ...")) == 5 * 2**29
    assert requested_bytes(RuntimeError("DefaultCPUAllocator: you tried to allocate 123 bytes.")) == 123
    assert requested_bytes(cuda) == 0
    assert oom_need_bytes(100, 60, RuntimeError("requested buffer of size 50")) == 110
    assert oom_need_bytes(100, 30, RuntimeError("requested buffer of size 50")) == 100


def test_an_out_of_memory_step_names_the_device_it_ran_on(two_outputs, monkeypatch):
    """The step fails on the session of cluster device 1 (mapped to the CPU, as all three are here): the
    measurement names the devices on that torch device that the placement uses (it named cpu:1 too, which
    this placement leaves idle) and reports at least the bytes asked for there."""
    cluster, dmap = local_cluster(3, gpus=False)
    be = OrtBackend(two_outputs.rw, cluster, dmap, timing=FAST)

    def run(self):
        self.at = self.device_map.torch_devices[1]
        raise RuntimeError("Failed to allocate memory for requested buffer of size 1099511627776")

    monkeypatch.setattr(OrtExecutor, "run", run)
    p = np.zeros(two_outputs.rw.graph.num_ops, dtype=np.int64)
    p[-1] = 2
    m = be.measure(p)
    assert m.status == "oom" and m.oom_devices == ("cpu:0", "cpu:2")
    assert m.message.startswith("out of memory on cpu:0, cpu:2: Failed to allocate")
    assert all(2**40 < v < 2**41 for v in m.peak_memory_bytes.values()) and len(m.peak_memory_bytes) == 2
    assert be.measure(np.zeros_like(p)).oom_devices == ("cpu:0",)


def test_a_placements_sessions_are_released_before_the_next_ones_are_made(two_outputs, three_cpus, monkeypatch):
    """apply() made the new placement's sessions while the last one's were held (and measure_native ran with
    them held): on a GPU both memory pools at once, a spurious OOM near capacity and an inflated peak."""
    import weakref

    import suite.backends.ort_exec as ox

    cluster, dmap = three_cpus
    made, alive_at_make = [], []
    real_make = ox.make_session

    def make(*args, **kwargs):
        alive_at_make.append(sum(r() is not None for r in made))
        sess = real_make(*args, **kwargs)
        made.append(weakref.ref(sess))
        return sess

    monkeypatch.setattr(ox, "make_session", make)
    be = OrtBackend(two_outputs.rw, cluster, dmap, timing=FAST)
    n = two_outputs.rw.graph.num_ops
    be.executor.apply(np.arange(n, dtype=np.int64) % 3)
    first = len(made)
    assert first == len(be.executor.segments) > 1 and alive_at_make == list(range(first))
    be.executor.apply(np.zeros(n, dtype=np.int64))
    assert alive_at_make[first] == 0  # the first placement's sessions were gone
    assert be.measure_native("ort_cpu").status == "ok" and alive_at_make[-1] == 0


def test_timed_steps_copy_no_inputs_or_outputs_to_or_from_the_host(two_outputs, three_cpus, monkeypatch):
    """A placement's step converted every graph output to numpy (on a GPU a copy to the host and a wait, in
    each timed step), and ort_cpu / ort_gpu fed numpy inputs to `run` (on a GPU a copy to the device in each
    step): neither is the placement's work, and the PyTorch backend does neither. Now both stage the inputs
    on the device before and leave the outputs there (the step's results stay equal to eager)."""
    cluster, dmap = three_cpus
    calls = []
    monkeypatch.setattr(ort.OrtValue, "numpy", lambda self: calls.append("numpy"))
    monkeypatch.setattr(ort.InferenceSession, "run", lambda self, *a, **k: calls.append("run"))
    be = OrtBackend(two_outputs.rw, cluster, dmap, timing=FAST)
    assert be.measure(np.zeros(two_outputs.rw.graph.num_ops, dtype=np.int64)).status == "ok"  # no copies
    assert be.measure_native("ort_cpu").status == "ok"
    assert calls == []
    monkeypatch.undo()
    with pytest.raises(PlacebenchError, match="no placement applied"):  # measure_native released it
        be.executor.step()
    be.executor.apply(np.arange(two_outputs.rw.graph.num_ops, dtype=np.int64) % 3)
    out = be.executor.step()
    for o, r in zip(out, two_outputs.rw.eager(), strict=True):
        np.testing.assert_allclose(o, r.numpy(), rtol=1e-5, atol=1e-6)


def test_a_boundary_tensor_without_a_type_is_an_error_status_not_a_crash(three_cpus):
    """A tensor that ONNX shape inference left untyped cannot be a subgraph's input or output: a placement that
    cuts there raised a PlacebenchError out of measure (ending a whole run or fidelity study); it is now that
    placement's status "error", and a placement that does not cut there still runs."""
    cluster, dmap = three_cpus
    torch.manual_seed(0)
    rw = from_module(_TwoOutputs().eval(), (torch.randn(2, 7), torch.randn(2, 4), torch.randn(2, 3)), name="untyped")
    be = OrtBackend(rw, cluster, dmap, timing=FAST)
    n = rw.graph.num_ops
    split = np.arange(n, dtype=np.int64) % 2
    crossing = {x for seg in be.model.segments(split) for x in seg.inputs} - set(be.model.graph_inputs)
    name = sorted(crossing)[0]
    del be.model.types[name]
    m = be.measure(split)
    assert m.status == "error" and f"no type for tensor {name!r}" in m.message
    assert be.measure(np.zeros(n, dtype=np.int64)).status == "ok"


class _Nested(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, xs, y):
        return self.fc(xs[0]) + xs[1][0] * xs[1][1] + y


class _Dict(_Nested):
    def forward(self, xs, y):
        return self.fc(xs["a"]) + y


def test_list_inputs_are_fed_one_tensor_each_and_a_dict_is_refused_by_name(three_cpus):
    """forward(xs: list, y): the exporter flattens xs into one input per tensor, which were not matched to the
    placeholders (a KeyError 'onnx::Add_1' when the backend was made). They are named xs.0, xs.1.0, ... and
    fed; a dict (which the exporter would take as keyword arguments) is refused, naming the input."""
    _, dmap = three_cpus
    torch.manual_seed(0)
    xs = [torch.randn(2, 4), (torch.randn(2, 4), torch.randn(2, 4))]
    rw = from_module(_Nested().eval(), (xs, torch.randn(2, 4)), name="nested")
    om = OrtModel(rw)
    assert om.graph_inputs == ["xs.0", "xs.1.0", "xs.1.1", "y"]
    ex = OrtExecutor(om, dmap)
    ex.apply(np.arange(rw.graph.num_ops, dtype=np.int64) % 2)
    np.testing.assert_allclose(ex.step()[0], rw.eager().numpy(), rtol=1e-6, atol=1e-6)
    rw = from_module(_Dict().eval(), ({"a": torch.randn(2, 4)}, torch.randn(2, 4)), name="dict")
    with pytest.raises(PlacebenchError, match="input 'xs' holds a dict"):
        OrtModel(rw)


def test_copied_bytes_count_each_types_element_size():
    """bfloat16, int16, uint16 (2 bytes) and uint64 (8) were counted as 4 bytes per element, and any type not
    listed as 4; an unknown type is now the placement's error, not a guess."""
    from suite.backends.ort_exec import _itemsize

    class Value:
        def __init__(self, t):
            self.t = t

        def data_type(self):
            return self.t

    for t, size in [("bfloat16", 2), ("int16", 2), ("uint16", 2), ("uint64", 8), ("float", 4), ("bool", 1)]:
        assert _itemsize(Value(f"tensor({t})")) == size, t
    assert _itemsize(ort.OrtValue.ortvalue_from_numpy(np.zeros(3, np.uint16))) == 2
    with pytest.raises(BackendUnavailable, match=r"tensor\(string\): bytes per element unknown"):
        _itemsize(Value("tensor(string)"))


class _Star(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x, *args):
        return self.fc(x) - 2 * args[0] + args[2][1] * args[3]


def test_star_args_inputs_are_each_fed_under_their_own_name(three_cpus):
    """forward(x, *args) with four tensors in *args: the *args placeholder was paired with the first of them
    alone (a zip of placeholders and values), so the exported model's other inputs had no value (a KeyError
    such as 'onnx::Mul_4' when the backend was made). They are args_0, args_2.1, args_3 (capture makes each
    value in *args an input of its own; args_1 and args_2.0 are unread, so not inputs), and the split equals
    the model computed by hand; a number in *args is a constant, as capture traces it."""
    _, dmap = three_cpus
    torch.manual_seed(0)
    x, a, b, c, d, e = (torch.randn(2, 4) for _ in range(6))
    module = _Star().eval()
    rw = from_module(module, (x, a, b, [c, d], e), name="star")
    om = OrtModel(rw)
    assert om.graph_inputs == ["x", "args_0", "args_2.1", "args_3"]
    assert [om.input_values[n] is v for n, v in zip(om.graph_inputs, [x, a, d, e], strict=True)] == [True] * 4
    ex = OrtExecutor(om, dmap)
    expected = (module.fc(x) - 2 * a + d * e).detach().numpy()
    for p in [np.zeros(rw.graph.num_ops, dtype=np.int64), np.arange(rw.graph.num_ops, dtype=np.int64) % 3]:
        ex.apply(p)
        np.testing.assert_allclose(ex.step()[0], expected, rtol=1e-6, atol=1e-6)
    om = OrtModel(from_module(module, (x, a, 3, [c, d], e), name="star_int"))
    assert om.graph_inputs == ["x", "args_0", "args_2.1", "args_3"]
    ex = OrtExecutor(om, dmap)
    ex.apply(np.zeros(om.rw.graph.num_ops, dtype=np.int64))
    np.testing.assert_allclose(ex.step()[0], expected, rtol=1e-6, atol=1e-6)


class _Fan(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        b = torch.relu(h) * 2
        return b + h + torch.sigmoid(h)


def test_copied_bytes_count_each_tensor_once_per_step_per_device_it_is_read_on(three_cpus):
    """Ops x, fc, relu, mul, add, sigmoid, add_1 on devices 2, 0, 1, 0, 1, 2, 1, in float64 (64 bytes a
    tensor): x is staged on device 2 and copied to fc's device 0; fc's output h is read on devices 1 (relu,
    then add, two segments apart: one copy) and 2; relu's output goes to 0, mul's and sigmoid's to 1. Six
    copies, 384 bytes a step, in both backends (no tests counted the bytes exactly)."""
    cluster, dmap = three_cpus
    torch.manual_seed(0)
    module = _Fan().double().eval()
    rw = from_module(module, (torch.randn(2, 4, dtype=torch.float64),), name="fan")
    assert [op.name for op in rw.graph.ops] == ["x", "fc", "relu", "mul", "add", "sigmoid", "add_1"]
    placement = np.array([2, 0, 1, 0, 1, 2, 1])
    be = OrtBackend(rw, cluster, dmap, timing=FAST)
    assert [(s.level, s.device) for s in be.model.segments(placement)] == [(0, 0), (1, 1), (1, 2), (2, 0), (3, 1)]
    m = be.measure(placement)
    assert m.status == "ok" and m.bytes_transferred == 6 * 64
    from suite.backends.torch_exec import TorchBackend

    assert TorchBackend(rw, cluster, dmap, timing=FAST).measure(placement).bytes_transferred == 6 * 64
    np.testing.assert_allclose(be.executor.step()[0], rw.eager().numpy(), rtol=1e-12)


class _View(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x.view(2, 4))


def test_a_folded_node_that_reads_an_input_runs_with_the_input_op():
    """x.view(2, 4) is folded into no op: its ONNX Reshape (and the Constant of its shape, which reads nothing)
    follow the producer of the Reshape's first computed input, the graph input x (op 0), as in the PyTorch
    backend, not their consumer fc (op 1)."""
    om = OrtModel(from_module(_View().eval(), (torch.randn(8),), name="view"))
    assert [nd.op_type for nd in om.model.graph.node] == ["Constant", "Reshape", "Gemm"]
    assert om.node_op == [0, 0, 1]


def test_a_device_holding_only_an_input_is_a_device_the_step_uses(two_outputs, three_cpus):
    """An input op placed alone on a device stages its input there and each step copies it from there: that
    device is used (synchronised, its peak memory reported), though it runs no segment. It was left out: a
    GPU holding the staged input reported 0 peak memory."""
    _, dmap = three_cpus
    g = two_outputs.rw.graph
    ex = OrtExecutor(two_outputs, dmap)
    p = np.zeros(g.num_ops, dtype=np.int64)
    p[g.index["x"]] = 2
    ex.apply(p)
    assert {s.device for s in ex.segments} == {0}
    assert ex.used_devices == [0, 2]
    assert ex.devices == [torch.device("cpu")]
    ex.copies_bytes = 0
    ex.run()
    assert ex.copies_bytes == 2 * 4 * 4  # x, 2x4 floats, from cpu:2 to cpu:0


def test_native_assignment_puts_an_op_on_the_gpu_when_at_least_half_of_its_nodes_are(two_outputs, monkeypatch):
    """ort_gpu's measured rule, read from a (fake) session's assignment record: the op `mul` (a Constant on the
    CPU, its Mul on CUDA) goes to the GPU, its Constant not voting; `relu`, all on the CPU, falls back."""
    import types

    import suite.backends.ort_exec as ort_exec

    on = {"/pb_op_5/Constant": "CPUExecutionProvider", "/pb_op_4/Relu": "CPUExecutionProvider"}
    nodes = [nd.name for nd in two_outputs.model.graph.node]
    subs = [types.SimpleNamespace(ep_name=ep, get_nodes=lambda ep=ep: [
        types.SimpleNamespace(name=n) for n in nodes if on.get(n, "CUDAExecutionProvider") == ep])
        for ep in ("CUDAExecutionProvider", "CPUExecutionProvider")]
    session = types.SimpleNamespace(get_provider_graph_assignment_info=lambda: subs)
    monkeypatch.setattr(ort_exec, "make_session", lambda *a, **k: session)
    g = two_outputs.rw.graph
    got = {g.ops[op].name: where for op, where in ort_exec.native_assignment(two_outputs).items()}
    assert got == {"a": "gpu", "relu": "cpu", "mul": "gpu", "b": "gpu", "add": "gpu", "c": "gpu"}


def test_native_assignment_leaves_the_shape_computations_on_the_cpu_out_of_the_vote(monkeypatch):
    """An op whose Reshape runs on CUDA and whose Shape and Gather (of sizes, int64) ONNX Runtime keeps on the
    CPU ran on the GPU, but was counted on the CPU, 2 nodes to 1 (an LSTM cell's 16 chunk-size nodes tied its
    16 compute nodes); so was a Relu with two float Constants on the CPU. Only nodes computing floating-point
    tensors, not Constants, vote; an op with none (an int64 ArgMax on
    the CPU, a tie of a Gather of sizes on each provider) goes by all its nodes. Fake model and record."""
    import types

    import suite.backends.ort_exec as ort_exec

    N = types.SimpleNamespace
    nodes = [N(name="/pb_op_1/Shape", op_type="Shape", output=["s"]),
             N(name="/pb_op_1/Gather", op_type="Gather", output=["g"]),
             N(name="/pb_op_1/Reshape", op_type="Reshape", output=["r"]),
             N(name="/pb_op_2/Relu", op_type="Relu", output=["y"]),
             N(name="/pb_op_2/Constant", op_type="Constant", output=["c1"]),  # float constants on the CPU
             N(name="/pb_op_2/Constant_1", op_type="Constant", output=["c2"]),
             N(name="/pb_op_3/ArgMax", op_type="ArgMax", output=["i"]),
             N(name="/pb_op_4/Gather", op_type="Gather", output=["g4"]),
             N(name="/pb_op_4/Gather_1", op_type="Gather", output=["g5"])]
    om = N(model=N(graph=N(node=nodes), SerializeToString=lambda: b""), node_op=[1, 1, 1, 2, 2, 2, 3, 4, 4],
           float_tensor=lambda o: o in ("r", "y", "c1", "c2"))
    cpu = {"/pb_op_1/Shape", "/pb_op_1/Gather", "/pb_op_2/Constant", "/pb_op_2/Constant_1", "/pb_op_3/ArgMax",
           "/pb_op_4/Gather"}
    subs = [N(ep_name=ep, get_nodes=lambda ep=ep: [nd for nd in nodes if (nd.name in cpu) == (ep == "CPUExecutionProvider")])
            for ep in ("CUDAExecutionProvider", "CPUExecutionProvider")]
    monkeypatch.setattr(ort_exec, "make_session", lambda *a, **k: N(get_provider_graph_assignment_info=lambda: subs))
    assert ort_exec.native_assignment(om) == {1: "gpu", 2: "gpu", 3: "cpu", 4: "gpu"}


class _ArgMax(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        h = torch.relu(self.fc(x))
        return h * torch.argmax(h, dim=1, keepdim=True).float()


def test_only_floating_point_nodes_on_the_cpu_are_a_silent_fallback(monkeypatch):
    """Of the nodes a CUDA session's record puts on the CPU, those computing floating-point tensors are a
    fallback (the measurement's error); a Shape, or a node whose outputs are integers (ArgMax), is ONNX
    Runtime's normal practice. Fake record: every node on the CPU."""
    import types

    from suite.backends.ort_exec import cpu_assigned_compute_nodes

    torch.manual_seed(0)
    om = OrtModel(from_module(_ArgMax().eval(), (torch.randn(2, 4),), name="argmax"))
    nodes = {nd.name: nd.op_type for nd in om.model.graph.node}
    assert "ArgMax" in nodes.values()
    record = [types.SimpleNamespace(ep_name="CPUExecutionProvider", get_nodes=lambda: [
        types.SimpleNamespace(name=n, op_type=t) for n, t in nodes.items()])]
    session = types.SimpleNamespace(get_provider_graph_assignment_info=lambda: record)
    got = {nodes[n] for n in cpu_assigned_compute_nodes(session, om)}
    assert got == set(nodes.values()) - {"ArgMax", "Constant"}
    assert "Relu" in got and "Cast" in got  # Cast to float computes a float tensor


def test_a_boundary_copy_to_the_cpu_copies_once():
    """A CUDA value's numpy() is already a new host copy, which the copy to a CPU device copied again: a
    GPU-to-CPU boundary copy was timed as two. Between CPU devices numpy() is a view: that one is copied."""
    from suite.backends.ort_exec import _copy_ortvalue

    class FromCuda:  # what a CUDA OrtValue gives: its data in a new host array
        def __init__(self) -> None:
            self.host = np.arange(6, dtype=np.float32)

        def device_name(self) -> str:
            return "Cuda"

        def numpy(self) -> np.ndarray:
            return self.host

    gpu = FromCuda()
    out = _copy_ortvalue(gpu, "cpu")
    assert np.shares_memory(out.numpy(), gpu.host)
    src = ort.OrtValue.ortvalue_from_numpy(np.arange(6, dtype=np.float32))
    out = _copy_ortvalue(src, "cpu")
    assert not np.shares_memory(out.numpy(), src.numpy())
    np.testing.assert_array_equal(out.numpy(), np.arange(6, dtype=np.float32))


def test_without_a_resettable_peak_the_cpu_peak_is_unknown(two_outputs, three_cpus, monkeypatch):
    """As in the PyTorch backend: without /proc (macOS, Windows) the process's lifetime peak resident set was
    reported as the placement's; the CPU's peak is now left out (unknown)."""
    import builtins

    import suite.backends.devices as devices

    def no_proc(path, *args, **kwargs):
        if str(path).startswith("/proc/"):
            raise FileNotFoundError(path)
        return builtins.open(path, *args, **kwargs)

    monkeypatch.setattr(devices, "open", no_proc, raising=False)
    cluster, dmap = three_cpus
    m = OrtBackend(two_outputs.rw, cluster, dmap, timing=FAST).measure(
        np.zeros(two_outputs.rw.graph.num_ops, dtype=np.int64))
    assert m.status == "ok" and m.peak_memory_bytes == {}  # unknown: not cpu:0's, nor 0 for the idle CPUs
