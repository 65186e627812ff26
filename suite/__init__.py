"""placebench core: workloads, clusters, the simulator, the placer interface and the harness.

The classes and functions below are imported when first used, so that `import suite` (which runs before any
`suite.*` module) does not load numpy: `placebench` is in `suite.cli.main`, where Ctrl-C is handled, before
the slow imports start."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from suite.errors import PlacebenchError

if TYPE_CHECKING:
    from suite.cluster import Cluster, Device, Link
    from suite.graph import Edge, Op, OpGraph
    from suite.simulator import SimResult, simulate, simulate_batch

__version__ = "0.1.0"

_LAZY = {
    "Cluster": "suite.cluster",
    "Device": "suite.cluster",
    "Link": "suite.cluster",
    "Edge": "suite.graph",
    "Op": "suite.graph",
    "OpGraph": "suite.graph",
    "SimResult": "suite.simulator",
    "simulate": "suite.simulator",
    "simulate_batch": "suite.simulator",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'suite' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The module's names with the lazy ones, so that `dir(suite)` and `help(suite)` show them."""
    return sorted({*globals(), *_LAZY})


def load_cluster(name_or_path: str) -> Cluster:
    """A preset by name (`placebench list clusters`) or a TOML file by path. An unknown name raises
    `suite.errors.UnknownNameError`, which lists the presets."""
    from suite.registry import load_cluster as _load

    return _load(name_or_path)


def load_workload(name_or_path: str) -> OpGraph:
    """A zoo workload by versioned name (`placebench list workloads`), a shape variant of one by its name
    (`nmt-2x1024-b64+batch_size=1+mode=inference`), or a graph JSON file by path. An unknown name raises
    `suite.errors.UnknownNameError`, which lists the zoo's names."""
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
