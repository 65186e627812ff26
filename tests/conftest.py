"""Shared fixtures: tiny workloads and a tiny cluster, as objects and as files (for specs and the CLI).

The tiny cluster has a CPU with plenty of memory and a GPU with 1 MiB, so that a workload whose parameters
exceed 1 MiB is OOM on the GPU alone. Cost-model numbers are round so that times can be added up by hand:
the CPU does 1e9 FLOP/s, the GPU 1e10 FLOP/s, no per-op overhead, memory time negligible, one link of
1e6 B/s with no latency.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from suite import graph_io
from suite.cluster import Cluster, Device, Link
from suite.graph import Op, OpGraph

MiB = 2**20

TINY_CLUSTER_TOML = """\
schema_version = 1
name = "tiny"
description = "test cluster: a CPU and a small GPU"

[[devices]]
name = "cpu:0"
kind = "cpu"
peak_flops = 1e9
mem_bandwidth = 1e30
memory_bytes = 1073741824
op_overhead_s = 0.0

[[devices]]
name = "gpu:0"
kind = "gpu"
peak_flops = 1e10
mem_bandwidth = 1e30
memory_bytes = 1048576
op_overhead_s = 0.0

[[links]]
between = ["cpu:0", "gpu:0"]
bandwidth = 1e6
latency_s = 0.0
"""


def tiny_cluster() -> Cluster:
    return Cluster(
        name="tiny",
        devices=(
            Device("cpu:0", "cpu", peak_flops=1e9, mem_bandwidth=1e30, memory_bytes=2**30, op_overhead_s=0.0),
            Device("gpu:0", "gpu", peak_flops=1e10, mem_bandwidth=1e30, memory_bytes=MiB, op_overhead_s=0.0),
        ),
        links=(Link(("cpu:0", "gpu:0"), bandwidth=1e6, latency_s=0.0),),
    )


def diamond(name: str = "diamond", *, param_bytes: int = 0) -> OpGraph:
    """a -> (b, c) -> d; 1e9 FLOPs each (1 s on the CPU, 0.1 s on the GPU); 1000-byte outputs."""
    ops = [
        Op("a", "matmul", flops=1e9, output_bytes=1000, param_bytes=param_bytes),
        Op("b", "matmul", flops=1e9, output_bytes=1000),
        Op("c", "matmul", flops=1e9, output_bytes=1000),
        Op("d", "add", flops=1e9, output_bytes=1000),
    ]
    return OpGraph.build(name, ops, [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")], {"model": "test"})


def chain(name: str = "chain", n: int = 6) -> OpGraph:
    ops = [Op(f"op{i}", "matmul", flops=1e8 * (i + 1), output_bytes=100) for i in range(n)]
    return OpGraph.build(name, ops, [(f"op{i}", f"op{i + 1}") for i in range(n - 1)], {"model": "test"})


@pytest.fixture
def tiny_graph() -> OpGraph:
    return diamond()


@pytest.fixture(name="tiny_cluster")
def _tiny_cluster() -> Cluster:
    return tiny_cluster()


@pytest.fixture(scope="session")
def tiny_files(tmp_path_factory) -> dict[str, Path]:
    """Read-only input files: workloads diamond.json, chain.json, big.json (2 MiB of parameters: OOM on
    the GPU) and the cluster tiny.toml."""
    d = tmp_path_factory.mktemp("inputs")
    files = {
        "diamond": graph_io.save(diamond(), d / "diamond.json"),
        "chain": graph_io.save(chain(), d / "chain.json"),
        "big": graph_io.save(diamond("big", param_bytes=2 * MiB), d / "big.json"),
        "cluster": d / "tiny.toml",
    }
    files["cluster"].write_text(TINY_CLUSTER_TOML)
    return files


HARNESS_PLUGIN = Path(__file__).parent / "harness_placers.py"
HARNESS_PLACERS = (
    "harness_raises",
    "harness_hangs",
    "harness_invalid",
    "harness_dies",
    "harness_sleepy",
    "harness_gated",
    "harness_search",
    "harness_not_applicable",
    "harness_over_budget",
    "harness_cheats",
    "harness_misreports",
    "harness_env_device",
    "harness_numerics",
    "harness_from_search",
)


@pytest.fixture(scope="module")
def harness_plugin():
    """Path of the test placers' plugin module (tests/harness_placers.py, also an evaluator
    "harness_double"); unregisters them afterwards so no other test sees them."""
    yield str(HARNESS_PLUGIN)
    from suite import runner
    from suite.placer import unregister_placer

    for name in HARNESS_PLACERS:
        unregister_placer(name)
    runner._EVALUATORS.pop("harness_double", None)
    runner._PLUGINS.pop(str(HARNESS_PLUGIN), None)


def _toml_value(v) -> str:
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    return repr(v)


def _write_spec(directory: Path, name: str = "test", **fields) -> Path:
    """A spec TOML file `directory/name.toml` from keyword fields (tables such as budget as dicts)."""
    lines = [f"name = {_toml_value(name)}"]
    tables = {k: v for k, v in fields.items() if isinstance(v, dict)}
    for k, v in fields.items():
        if k not in tables:
            lines.append(f"{k} = {_toml_value(v)}")
    for k, v in tables.items():
        lines.append(f"[{k}]")
        lines.extend(f"{kk} = {_toml_value(vv)}" for kk, vv in v.items())
    path = Path(directory) / f"{name}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="session")
def spec_writer():
    """spec_writer(directory, name, **fields) -> path of a new spec file (for module-scoped fixtures)."""
    return _write_spec


@pytest.fixture
def write_spec(tmp_path: Path):
    """write_spec(name, **fields) -> path of a spec TOML in tmp_path (tables such as budget as dicts)."""

    def write(name: str = "test", **fields) -> Path:
        return _write_spec(tmp_path, name, **fields)

    return write



@pytest.fixture
def broken_entry_point(tmp_path, monkeypatch):
    """An installed-looking distribution whose placer entry point `broken_placer` cannot be imported.

    It lives on sys.path (which spawned workers inherit), so the runner's workers see it too."""
    dist = tmp_path / "site" / "broken_plugin-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[placebench.placers]\nbroken_placer = no_such_module_xyz:Placer\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    return "broken_placer"
