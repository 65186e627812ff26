"""Name lookup for workloads and clusters: presets by name, user files by path."""

from __future__ import annotations

from pathlib import Path

from suite import cluster as _cluster
from suite import graph_io
from suite.cluster import Cluster
from suite.errors import ClusterError, UnknownNameError
from suite.graph import OpGraph


def _looks_like_path(s: str) -> bool:
    return "/" in s or s.endswith((".toml", ".json", ".gz"))


def cluster_names() -> list[str]:
    return _cluster.preset_names()


def load_cluster(name_or_path: str) -> Cluster:
    if _looks_like_path(name_or_path):
        return _cluster.load(name_or_path)
    path = _cluster.PRESET_DIR / f"{name_or_path}.toml"
    if not path.exists():
        raise UnknownNameError(f"unknown cluster {name_or_path!r}; presets: {', '.join(cluster_names())}")
    cluster = _cluster.load(path)
    if cluster.name != name_or_path:  # rows name the cluster by `name`: a preset chosen by file name must agree
        raise ClusterError(f"{path}: name = {cluster.name!r}, but a preset's name must be its file name "
                           f"({name_or_path!r})")
    return cluster


def workload_names() -> list[str]:
    from suite import zoo

    return zoo.names()


def load_workload(name_or_path: str) -> OpGraph:
    """A graph file by path, a zoo workload by name, or a shape variant of one by its name
    (`nmt-2x1024-b64+batch_size=1+mode=inference`, as `placebench profile --set` names it)."""
    if _looks_like_path(name_or_path) or Path(name_or_path).is_file():
        return graph_io.load(name_or_path)
    if "+" in name_or_path:
        from suite.backends.workload import variant_graph

        return variant_graph(name_or_path)
    from suite import zoo

    return zoo.load(name_or_path)
