"""placebench core: workloads, clusters, the simulator, the placer interface and the harness."""

from suite.cluster import Cluster, Device, Link
from suite.errors import PlacebenchError
from suite.graph import Edge, Op, OpGraph
from suite.simulator import SimResult, simulate, simulate_batch

__version__ = "0.1.0"


def load_cluster(name_or_path: str) -> Cluster:
    """A preset by name (`placebench list clusters`) or a TOML file by path."""
    from suite.registry import load_cluster as _load

    return _load(name_or_path)


def load_workload(name_or_path: str) -> OpGraph:
    """A zoo workload by versioned name (`placebench list workloads`) or a graph JSON file by path."""
    from suite.registry import load_workload as _load

    return _load(name_or_path)


__all__ = [
    "Cluster",
    "Device",
    "Edge",
    "Link",
    "Op",
    "OpGraph",
    "PlacebenchError",
    "SimResult",
    "load_cluster",
    "load_workload",
    "simulate",
    "simulate_batch",
]
