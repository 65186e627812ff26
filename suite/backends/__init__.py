"""Real execution backends: PyTorch (`torch_exec`) and ONNX Runtime (`ort_exec`), the device mapping of a
cluster onto this machine (`devices`), runnable workloads (`workload`) and the shared timing protocol
(`timing`). Importing this package does not import torch; its modules do."""

from __future__ import annotations

from typing import Any

REAL_BACKENDS = ("torch", "onnxruntime")
ORT_INSTALL = 'pip install -e ".[cpu]" (or ".[gpu]" with CUDA; never both in one environment)'


def ort_distributions() -> list[str]:
    """The ONNX Runtime distributions installed here, of "onnxruntime" and "onnxruntime-gpu". Both install
    the one module `onnxruntime`, so with both the files of the one installed last hide the other's."""
    from importlib import metadata

    out = []
    for dist in ("onnxruntime", "onnxruntime-gpu"):
        try:
            metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
        out.append(dist)
    return out


def check_available(name: str, what: str) -> None:
    """Raise a clear error, naming the extra to install, when backend `name` needs a package not installed
    here (ONNX Runtime is an optional dependency). `what` names the option or setting that asked for it."""
    import importlib.util

    from suite.errors import PlacebenchError

    if name == "onnxruntime" and importlib.util.find_spec("onnxruntime") is None:
        raise PlacebenchError(f"{what} needs ONNX Runtime, which is not installed: {ORT_INSTALL}")


def make_real_backend(name: str, graph: Any, cluster: Any, *, methodology: Any = None,
                      device_map: Any = None) -> Any:
    """`TorchBackend` ("torch") or `OrtBackend` ("onnxruntime") for a zoo workload's graph on `cluster`, with
    the cluster's default device map unless one is given."""
    from suite.backends.workload import for_graph
    from suite.errors import PlacebenchError

    if name not in REAL_BACKENDS:
        raise PlacebenchError(f"real backend {name!r} is not one of {', '.join(REAL_BACKENDS)}")
    check_available(name, f"the {name} backend")
    rw = for_graph(graph)
    if name == "torch":
        from suite.backends.torch_exec import TorchBackend

        return TorchBackend(rw, cluster, device_map, methodology=methodology)
    from suite.backends.ort_exec import OrtBackend

    return OrtBackend(rw, cluster, device_map, methodology=methodology)


def torch_evaluator(workload: Any, cluster: Any, methodology: Any = None) -> Any:
    """Runner factory (entry point `placebench.evaluators: torch`): real execution on PyTorch."""
    return make_real_backend("torch", workload, cluster, methodology=methodology)


def ort_evaluator(workload: Any, cluster: Any, methodology: Any = None) -> Any:
    """Runner factory (entry point `placebench.evaluators: onnxruntime`): real execution on ONNX Runtime."""
    return make_real_backend("onnxruntime", workload, cluster, methodology=methodology)
