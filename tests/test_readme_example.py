"""The README's "Adding a placer" example works as written, and the helper it uses gives valid placements."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from suite import graph_io, load_cluster, load_workload, runner
from suite.placement import random_placements, validate
from suite.placer import unregister_placer

README = Path(__file__).resolve().parents[1] / "README.md"


def _placer_example() -> str:
    section = README.read_text().split("## Adding a placer", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readme_placer_runs_as_a_plugin_on_a_training_workload(tmp_path):
    plugin = tmp_path / "random_search.py"
    plugin.write_text(_placer_example())
    try:
        record = runner.evaluate_one("nmt-2x1024-b64", "haswell_2k80", "random_search", plugins=[str(plugin)],
                                     budget={"max_evaluations": 40}, params={"batch": 16})
    finally:
        unregister_placer("random_search")
    assert (record["status"], record["evaluations"]) == ("ok", 40), record.get("message")


@pytest.mark.parametrize("name", ["nmt-2x1024-b64", "inception_v3-b32", "bert_base-12x768-s128-b8"])
def test_random_placements_are_valid_and_cover_the_allowed_devices(name):
    graph, cluster = load_workload(name), load_cluster("haswell_4k80")
    ps = random_placements(graph, cluster, np.random.default_rng(0), 64)
    assert ps.shape == (64, graph.num_ops)
    for p in ps:
        validate(p, graph, cluster)  # raises on a split group or a forbidden device kind
    free = [i for i, op in enumerate(graph.ops) if not op.allowed_kinds]
    assert set(np.unique(ps[:, free])) == set(range(cluster.num_devices))  # every device is drawn somewhere


def test_the_readme_capture_example_runs_as_written(tmp_path, monkeypatch):
    section = README.read_text().split("## Adding a workload", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md (Adding a workload)", "exec"), {})  # its asserts check the MACs by hand
    graph = graph_io.load(tmp_path / "classifier.json")
    assert graph.metadata["forward_macs"] == 8 * 64 * 2
    assert {op.kind for op in graph.ops} >= {"embedding", "linear"}
