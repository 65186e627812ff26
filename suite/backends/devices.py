"""Which real device runs each cluster device, and a cluster that describes this machine.

A `DeviceMap` maps every device of a cluster, by index, to a torch device ("cpu", "cuda:0", ...). Several
cluster devices may map to one torch device: "logical" devices. Execution still treats them as different
devices (every tensor crossing between them is copied, and the copies are counted), which is how the
splitting and copying logic is exercised on a machine without a GPU; but they share the hardware, and one
thread runs them one op at a time.

Default mapping (`DeviceMap.default`): the cluster's CPU devices map to "cpu", its k-th GPU device (in
cluster order) to "cuda:k"; a cluster with more GPU devices than this machine has CUDA devices needs an
explicit mapping (`DeviceMap.parse(cluster, ["gpu:0=cpu"])` maps the rest by default: the GPUs it leaves
out take, in cluster order, the CUDA devices it does not name, so ["gpu:0=cuda:0"] gives gpu:1 cuda:1).

`local_cluster(logical_cpus)` describes this machine: `cpu:0` ... `cpu:{n-1}` (logical CPUs, one physical
CPU) plus `gpu:N` for every visible CUDA device (mapped to `cuda:N`). Numbers: memory sizes from the OS and
torch; peak FLOP/s and bandwidths are either short measurements (`measure=True`: a 1024x1024 matmul, a
64 MiB copy, a small-tensor clone for the per-copy latency) or documented estimates. With profiles (see
`suite.profiling`) the simulator takes op times from measurements, so these numbers matter only for ops
without a profile and for copies.

Peak memory (`reset_peak_memory`, `peak_memory_bytes`): on CUDA torch's allocator peak; on the CPU the peak
resident set of the whole process since the reset, known only where the OS can reset it (Linux), and
counting what was resident at the reset (`cpu_peak_rss_bytes` says what that includes).
"""

from __future__ import annotations

import gc
import os
import platform
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from suite.cluster import Cluster, Device, Link
from suite.errors import ClusterError, PlacebenchError

CPU_FLOPS_PER_CYCLE = 32  # estimate: 2 AVX2 FMA units x 8 fp32 lanes x 2 FLOPs
CPU_GHZ_ESTIMATE = 2.5
CPU_BANDWIDTH_ESTIMATE = 20e9  # bytes/s, estimate: two DDR4 channels, STREAM-like
GPU_FP32_FLOPS_PER_SM_CYCLE = 256  # estimate: 128 fp32 lanes x 2 (Ampere/Hopper)
GPU_GHZ_ESTIMATE = 1.7
GPU_BANDWIDTH_ESTIMATE = 1.5e12
PCIE_BANDWIDTH_ESTIMATE = 12e9  # PCIe 3/4 x16, pageable memory, achievable
PCIE_LATENCY_ESTIMATE_S = 1e-5
OP_OVERHEAD_ESTIMATE_S = 5e-6



def device_indices(placement: object, num_ops: int, num_devices: int) -> np.ndarray:
    """`placement` as int64 device indices for a backend, checked: integers (1.5 is not truncated to 1), one
    per op, each a device of the map. The evaluator validates placements before any backend sees them; this
    guards a backend called on its own."""
    arr = np.asarray(placement)
    if arr.dtype.kind not in "iu":
        raise PlacebenchError(f"placement must hold device indices (integers), got an array of {arr.dtype}")
    if arr.shape != (num_ops,):
        raise PlacebenchError(f"placement has shape {arr.shape}, expected ({num_ops},)")
    if arr.size and (arr.min() < 0 or arr.max() >= num_devices):
        raise PlacebenchError(f"placement uses a device index outside 0..{num_devices - 1}")
    return arr.astype(np.int64)

@dataclass(frozen=True)
class DeviceMap:
    """torch device of each cluster device (by cluster index)."""

    cluster_devices: tuple[str, ...]
    torch_devices: tuple[str, ...]

    def __post_init__(self) -> None:
        if len(self.cluster_devices) != len(self.torch_devices):
            raise ClusterError("device map: one torch device per cluster device is needed")
        for name, td in zip(self.cluster_devices, self.torch_devices, strict=True):
            check_torch_device(td, where=f"device map: {name}")

    def __len__(self) -> int:
        return len(self.torch_devices)

    def torch_device(self, d: int) -> torch.device:
        return torch.device(self.torch_devices[d])

    @property
    def cuda_devices(self) -> list[torch.device]:
        """The distinct CUDA devices in use."""
        return [torch.device(t) for t in dict.fromkeys(self.torch_devices) if t.startswith("cuda")]

    def as_dict(self) -> dict[str, str]:
        return dict(zip(self.cluster_devices, self.torch_devices, strict=True))

    @classmethod
    def default(cls, cluster: Cluster) -> DeviceMap:
        return cls.parse(cluster, ())

    @classmethod
    def parse(cls, cluster: Cluster, items: Sequence[str] | dict[str, str]) -> DeviceMap:
        """From "cluster_device=torch_device" items (or a dict); unmapped devices get the default."""
        given: dict[str, str] = {}
        pairs = items.items() if isinstance(items, dict) else [_split_item(s) for s in items]
        for name, td in pairs:
            if name not in cluster.index:
                raise ClusterError(
                    f"device map: {name!r} is not a device of cluster {cluster.name!r} "
                    f"({', '.join(d.name for d in cluster.devices)})"
                )
            if name in given:
                raise ClusterError(f"device map: {name!r} is mapped twice ({given[name]!r} and {td!r})")
            given[name] = td
        out = []
        gpu_k = 0
        for dev in cluster.devices:
            if dev.name in given:
                out.append(given[dev.name])
            elif dev.kind == "cpu":
                out.append("cpu")
            else:  # the next CUDA device the map does not name: two GPUs share one only when asked to
                while f"cuda:{gpu_k}" in given.values():
                    gpu_k += 1
                out.append(f"cuda:{gpu_k}")
                gpu_k += 1
        return cls(tuple(d.name for d in cluster.devices), tuple(out))


def _split_item(text: str) -> tuple[str, str]:
    if "=" not in text:
        raise ClusterError(f"device map: {text!r} is not of the form CLUSTER_DEVICE=TORCH_DEVICE (gpu:0=cuda:1)")
    a, b = text.split("=", 1)
    return a.strip(), b.strip()


def check_torch_device(text: str, *, where: str = "device") -> None:
    """A torch device that exists on this machine ("cpu" or "cuda:N" with N visible)."""
    if text == "cpu":
        return
    m = re.fullmatch(r"cuda:(\d+)", text)
    if not m:
        raise ClusterError(f"{where}: {text!r} is not a torch device of the form 'cpu' or 'cuda:N'")
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if int(m.group(1)) >= n:
        raise ClusterError(f"{where}: {text!r} is not available on this machine ({n} CUDA device(s) visible)")


# -- synchronisation and memory ----------------------------------------------------------------------------
def synchronize(devices: Sequence[torch.device]) -> None:
    """Wait for every CUDA device in `devices` (no-op for the CPU, whose ops are synchronous)."""
    for d in devices:
        if d.type == "cuda":
            torch.cuda.synchronize(d)


_cpu_peak_reset = False  # whether the last reset_peak_memory reset this process's peak resident set


def reset_peak_memory(devices: Sequence[torch.device]) -> None:
    """Peaks from here: the CUDA allocator's of `devices`, and this process's peak resident set where the OS
    can reset it (Linux); `cpu_peak_rss_bytes` says None where it could not."""
    global _cpu_peak_reset
    for d in devices:
        if d.type == "cuda":
            torch.cuda.reset_peak_memory_stats(d)
    _cpu_peak_reset = _reset_cpu_peak()


def peak_memory_bytes(device: torch.device) -> int | None:
    """Allocator peak since the last reset on CUDA; on the CPU, peak resident set of this process since the
    last reset, None where that is unknown (`cpu_peak_rss_bytes`)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return cpu_peak_rss_bytes()


def _reset_cpu_peak() -> bool:
    """Reset the peak resident set (Linux: 5 written to /proc/self/clear_refs sets VmHWM to VmRSS); False
    where the OS has no such reset (macOS, Windows) or refuses it. Heap memory that the C allocator keeps
    after it was freed (what earlier placements, captures and exports left) goes back to the OS first
    (glibc's malloc_trim): the resident set, and so the peak from here, held it, and the next placement
    reported an earlier one's memory (see `cpu_peak_rss_bytes`)."""
    _malloc_trim()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def _proc_status_bytes(key: str) -> int | None:
    """A size in /proc/self/status ("VmHWM", "VmRSS") in bytes; None where there is none (not Linux)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(f"{key}:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def memory_in_use_bytes(device: torch.device) -> int | None:
    """Bytes in use now: allocated by torch's allocator on CUDA; resident set of this process on the CPU, None
    where the OS gives no current size (not Linux)."""
    if device.type == "cuda":
        return int(torch.cuda.memory_allocated(device))
    return _proc_status_bytes("VmRSS")


def cpu_peak_rss_bytes() -> int | None:
    """Peak resident set of this process since the last `reset_peak_memory`; None where that could not reset
    it: the OS's own peak (getrusage's ru_maxrss on macOS and elsewhere) is the maximum over the process's
    life, which after a larger placement is that placement's peak, not this one's.

    It is the whole process's: Python, torch and the workload's weights included (a tiny model reports
    some 230 MiB), and what the reset left resident. The reset returns the heap memory that glibc keeps
    free to the OS, so a placement measured after a larger one reports its own peak (a tiny model after
    one that fragmented 100 MiB of heap: 236 MiB, not 337 MiB); freed memory that stays resident still
    counts (what Python's own allocator keeps, the heap of a C library other than glibc), so there the peak
    can still depend on what ran before."""
    return _proc_status_bytes("VmHWM") if _cpu_peak_reset else None


def free_memory(devices: Sequence[torch.device] = ()) -> None:
    """After an out-of-memory error: collect garbage and return cached CUDA blocks."""
    gc.collect()
    if any(d.type == "cuda" for d in devices) or torch.cuda.is_available():
        torch.cuda.empty_cache()


# -- this machine ---------------------------------------------------------------------------------------------
def cpu_model_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def host_memory_bytes() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 16 * 2**30


def _median_time_s(fn, repeats: int = 5, sync: Sequence[torch.device] = ()) -> float:
    fn()
    synchronize(sync)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        synchronize(sync)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def measure_device(device: torch.device) -> dict[str, float]:
    """Short measurements: matmul FLOP/s, copy bandwidth (bytes read + written per second: what an op's
    bytes accessed are divided by), small-clone latency."""
    n = 1024
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    flops = 2 * n**3 / _median_time_s(lambda: a @ b, sync=[device])
    x = torch.empty(16 * 2**20, device=device)  # 64 MiB
    y = torch.empty_like(x)
    bandwidth = 2 * x.numel() * x.element_size() / _median_time_s(lambda: y.copy_(x), sync=[device])
    small = torch.empty(16, device=device)
    latency = _median_time_s(lambda: small.clone(), repeats=51, sync=[device])
    return {"peak_flops": flops, "mem_bandwidth": bandwidth, "copy_latency_s": latency,
            "clone_bandwidth": clone_bandwidth(device)}


def clone_bandwidth(device: torch.device, rounds: int = 3) -> float:
    """Bytes/s of cloning activations as a step does: 64 clones of 1 MiB kept alive, so every clone gets
    fresh memory (on the CPU: page faults included, which dominate; a clone into reused memory is ~10x
    faster but is not what a step's boundary copies get). Median over `rounds`."""
    act = torch.randn(2**18, device=device)
    rates = []
    for _ in range(rounds):
        keep = []
        if device.type == "cpu":
            _malloc_trim()  # memory freed earlier goes back to the OS, as between the steps of a run
        synchronize([device])
        t0 = time.perf_counter()
        for _ in range(64):
            keep.append(act.clone())
        synchronize([device])
        rates.append(64 * act.numel() * act.element_size() / (time.perf_counter() - t0))
        del keep
    return sorted(rates)[len(rates) // 2]


def _malloc_trim() -> None:
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _cpu_device(name: str, measured: dict[str, float] | None) -> Device:
    cores = os.cpu_count() or 1
    model = f"{cpu_model_name()} ({cores} cores, this machine)"
    if measured:
        return Device(name, "cpu", peak_flops=measured["peak_flops"], mem_bandwidth=measured["mem_bandwidth"],
                      memory_bytes=host_memory_bytes(), op_overhead_s=OP_OVERHEAD_ESTIMATE_S, model=model,
                      source={"peak_flops": "measured: 1024x1024 fp32 matmul", "mem_bandwidth": "measured: 64 MiB copy, bytes read + written",
                              "memory_bytes": "os.sysconf physical memory", "op_overhead_s": "estimate"})
    return Device(name, "cpu", peak_flops=cores * CPU_GHZ_ESTIMATE * 1e9 * CPU_FLOPS_PER_CYCLE,
                  mem_bandwidth=CPU_BANDWIDTH_ESTIMATE, memory_bytes=host_memory_bytes(),
                  op_overhead_s=OP_OVERHEAD_ESTIMATE_S, compute_efficiency=0.5, memory_efficiency=0.7, model=model,
                  source={"peak_flops": f"estimate: cores x {CPU_GHZ_ESTIMATE} GHz x {CPU_FLOPS_PER_CYCLE} FLOP/cycle",
                          "mem_bandwidth": "estimate", "memory_bytes": "os.sysconf physical memory",
                          "op_overhead_s": "estimate"})


def _gpu_device(name: str, index: int, measured: dict[str, float] | None) -> Device:
    props = torch.cuda.get_device_properties(index)
    model = f"{props.name} (this machine)"
    if measured:
        return Device(name, "gpu", peak_flops=measured["peak_flops"], mem_bandwidth=measured["mem_bandwidth"],
                      memory_bytes=int(props.total_memory), op_overhead_s=OP_OVERHEAD_ESTIMATE_S, model=model,
                      source={"peak_flops": "measured: 1024x1024 fp32 matmul", "mem_bandwidth": "measured: 64 MiB copy, bytes read + written",
                              "memory_bytes": "torch.cuda.get_device_properties", "op_overhead_s": "estimate"})
    peak = props.multi_processor_count * GPU_FP32_FLOPS_PER_SM_CYCLE * GPU_GHZ_ESTIMATE * 1e9
    return Device(name, "gpu", peak_flops=peak, mem_bandwidth=GPU_BANDWIDTH_ESTIMATE, memory_bytes=int(props.total_memory),
                  op_overhead_s=OP_OVERHEAD_ESTIMATE_S, compute_efficiency=0.6, memory_efficiency=0.8, model=model,
                  source={"peak_flops": f"estimate: SMs x {GPU_FP32_FLOPS_PER_SM_CYCLE} FLOP/cycle x {GPU_GHZ_ESTIMATE} GHz",
                          "mem_bandwidth": "estimate", "memory_bytes": "torch.cuda.get_device_properties",
                          "op_overhead_s": "estimate"})


def _h2d(index: int) -> tuple[float, float]:
    """(bandwidth bytes/s, latency s) of a pageable host-to-device copy."""
    dev = torch.device(f"cuda:{index}")
    host = torch.empty(16 * 2**20)
    bw = host.numel() * host.element_size() / _median_time_s(lambda: host.to(dev), sync=[dev])
    small = torch.empty(16)
    lat = _median_time_s(lambda: small.to(dev), repeats=51, sync=[dev])
    return bw, lat


def local_cluster(logical_cpus: int = 1, *, measure: bool = False, gpus: bool = True,
                  name: str | None = None) -> tuple[Cluster, DeviceMap]:
    """This machine as a cluster (see the module docstring) and its device map."""
    if logical_cpus < 1:
        raise ClusterError(f"local cluster: logical_cpus must be at least 1, got {logical_cpus}")
    cpu_meas = measure_device(torch.device("cpu")) if measure else None
    devices = [_cpu_device(f"cpu:{i}", cpu_meas) for i in range(logical_cpus)]
    torch_devices = ["cpu"] * logical_cpus
    n_gpu = torch.cuda.device_count() if gpus and torch.cuda.is_available() else 0
    for k in range(n_gpu):
        meas = measure_device(torch.device(f"cuda:{k}")) if measure else None
        devices.append(_gpu_device(f"gpu:{k}", k, meas))
        torch_devices.append(f"cuda:{k}")
    links = []
    if logical_cpus > 1:
        bw = cpu_meas["clone_bandwidth"] if cpu_meas else CPU_BANDWIDTH_ESTIMATE / 4
        lat = cpu_meas["copy_latency_s"] if cpu_meas else OP_OVERHEAD_ESTIMATE_S
        links.append(Link(tuple(f"cpu:{i}" for i in range(logical_cpus)), bandwidth=bw, latency_s=lat,
                          name="host memory copy",
                          source={"bandwidth": "measured: 64 clones of 1 MiB kept alive (fresh memory)" if cpu_meas else "estimate",
                                  "latency_s": "measured: small-tensor clone" if cpu_meas else "estimate"}))
    for k in range(n_gpu):
        bw, lat = _h2d(k) if measure else (PCIE_BANDWIDTH_ESTIMATE, PCIE_LATENCY_ESTIMATE_S)
        links.append(Link(("cpu:0", f"gpu:{k}"), bandwidth=bw, latency_s=lat, name=f"pcie cuda:{k}",
                          source={"bandwidth": "measured: 64 MiB host-to-device" if measure else "estimate",
                                  "latency_s": "measured" if measure else "estimate"}))
    cname = name or f"local_{logical_cpus}cpu" + (f"_{n_gpu}gpu" if n_gpu else "")
    cluster = Cluster(name=cname, devices=tuple(devices), links=tuple(links),
                      description="this machine" + (f" ({logical_cpus} logical CPU devices)" if logical_cpus > 1 else ""))
    return cluster, DeviceMap(tuple(d.name for d in devices), tuple(torch_devices))


def cluster_to_toml(cluster: Cluster) -> str:
    """The cluster as a cluster file (for `--cluster FILE`), sources included."""
    import json

    def val(v) -> str:
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list | tuple):
            return "[" + ", ".join(val(x) for x in v) + "]"
        return repr(v)

    lines = ["schema_version = 1", f"name = {val(cluster.name)}", f"description = {val(cluster.description)}"]
    lines += [f"source.{k} = {val(v)}" for k, v in cluster.source.items()] + [""]
    for d in cluster.devices:
        lines.append("[[devices]]")
        for k in ("name", "kind", "model", "peak_flops", "mem_bandwidth", "memory_bytes", "op_overhead_s",
                  "compute_efficiency", "memory_efficiency"):
            lines.append(f"{k} = {val(getattr(d, k))}")
        lines.extend(f"source.{k} = {val(v)}" for k, v in d.source.items())
        lines.append("")
    for lk in cluster.links:
        lines.append("[[links]]")
        lines += [f"name = {val(lk.name)}", f"between = {val(list(lk.between))}", f"bandwidth = {val(lk.bandwidth)}",
                  f"latency_s = {val(lk.latency_s)}", f"sharing = {val(lk.sharing)}"]
        lines.extend(f"source.{k} = {val(v)}" for k, v in lk.source.items())
        lines.append("")
    return "\n".join(lines)
