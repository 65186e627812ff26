"""The README's examples (a placer, a captured workload) work as written, and the helper the placer uses gives
valid placements; the figures it quotes are those of the stored benchmark and fidelity runs; what it says
`evaluate` and a spec's real evaluators run is what they run."""

from __future__ import annotations

import json
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


def test_the_readme_quotes_the_stored_simulator_benchmark():
    """The figures of "Speed" (the main machine): minimums (medians) of `results/benchmarks/simulator.json`, in ms,
    one placement to two decimals, a batch of 64 to the millisecond."""
    runs = json.loads((README.parent / "results" / "benchmarks" / "simulator.json").read_text())["benchmarks"]
    stats = {b["name"]: b["stats"] for b in runs}

    def ms(test: str, stat: str, digits: int) -> list[str]:
        return [f"{stats[f'{test}[{kind}]'][stat] * 1e3:.{digits}f}" for kind in ("blocks", "groups", "random")]

    text = " ".join(README.read_text().split("\nSpeed (", 1)[1].split("That machine had", 1)[0].split())
    one, batch = "test_fast_one_placement_10k_ops_8_devices", "test_fast_batch_of_64_placements_10k_ops_8_devices"
    a, b = ms(one, "min", 2), ms(one, "median", 2)
    assert (f"One placement takes {a[0]} ms (minimum; median {b[0]} ms) in contiguous blocks, {a[1]} ms ({b[1]} ms) "
            f"in random groups of 50 ops, {a[2]} ms ({b[2]} ms) when every op") in text
    a, b = ms(batch, "min", 0), ms(batch, "median", 0)
    assert f"does 64 in {' / '.join(a)} ms (medians {' / '.join(b)} ms)" in text
    a, b = ms("test_public_simulate_10k_ops_8_devices", "min", 2), ms("test_public_simulate_batch_of_64_10k_ops_8_devices",
                                                                     "min", 0)
    assert f"`suite.simulate` takes {' / '.join(a)} ms and `suite.simulate_batch` {' / '.join(b)} ms for 64" in text


def test_the_readme_quotes_the_fidelity_summary_of_the_cpu_machine():
    """The opening's single-device figures: PyTorch rows of `results/fidelity/summary.md`, less those of the
    CPU + GPU report (another machine); 25 timed by CPU clock, 2 more by wall clock."""
    summary = (README.parent / "results" / "fidelity" / "summary.md").read_text().split("## All placements")[0]
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in summary.splitlines() if line.endswith("% |")]
    gpu_reports = {r[0] for r in rows if r[3].startswith("gpu")}
    rows = [r for r in rows if r[1] == "torch" and r[0] not in gpu_reports]

    def figures(rs):
        errors = sorted(abs(float(r[6].rstrip("%"))) for r in rs)
        n = len(errors)
        median = (errors[(n - 1) // 2] + errors[n // 2]) / 2
        return n, f"{median:.1f}%", sum(e <= 3 for e in errors), sum(e <= 10 for e in errors)

    cpu = [r for r in rows if r[2] == "cpu"]
    n, median, within3, within10 = figures(cpu)
    n_all, median_all, within3_all, within10_all = figures(rows)
    text = " ".join(README.read_text().split("## Commands", 1)[0].split())
    assert (f"off by {median} in the median over the {n} rows timed by CPU clock on this project's CPU machine "
            f"({within3} within 3%, {within10} within 10%; with its {n_all - n} wall-clock rows, {median_all}, "
            f"{within3_all} and {within10_all} of {n_all};") in text
    worst = max((r for r in rows), key=lambda r: abs(float(r[6].rstrip("%"))))
    assert f"the worst {worst[6]}:" in text


def test_the_readme_quotes_the_cpu_gpu_fidelity_report():
    """"The simulator" quotes the one CPU + GPU report's row of `results/fidelity/summary.md` and its single-GPU row."""
    summary = (README.parent / "results" / "fidelity" / "summary.md").read_text()
    # cells are Markdown-escaped (bert\_base); no cell here holds an escaped |, so splitting on | is safe
    lines = [[c.strip().replace("\\", "") for c in line.split("|")[1:-1]]
             for line in summary.splitlines() if line.startswith("| ")]
    workload = "resnet50-b32+batch_size=8+mode=inference"
    (placements,) = [r for r in lines if r[0] == workload and r[1] == "local_1cpu_1gpu"]
    (gpu,) = [r for r in lines if r[0] == workload and r[3] == "gpu:0"]
    text = " ".join(README.read_text().split("## The simulator", 1)[1].split())
    assert (f"{placements[4].split('/')[0]} placements, median error {placements[5]}, Spearman {placements[6]}; "
            f"the single-GPU step predicted {gpu[4]} ms, measured {gpu[5]} ms)") in text


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_the_readme_says_evaluate_measures_with_the_simulator(tmp_path):
    """`evaluate` has no option that picks an evaluator: a placer's cell and a placement file are measured by the
    simulator, with `--profile` by the profiled one; so the README must not promise a real backend there."""
    import argparse

    from suite.cli import build_parser

    commands = _flat(README.read_text().split("## Commands", 1)[1].split("## Concepts", 1)[0])
    assert ("`evaluate` measures with the simulator (with `--profile`, the profiled one); real execution runs "
            "through a spec's `evaluator`.") in commands
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert not {a.dest for a in sub.choices["evaluate"]._actions} & {"evaluator", "backend"}

    graph = load_workload("rnnlm-2x2048-b64")
    placement = tmp_path / "p.json"
    placement.write_text(json.dumps([0] * graph.num_ops))
    profile = README.parent / "results" / "profiles" / "rnnlm-2x2048-b64__cpu.json"
    plain = runner.measure_placement(graph.name, "haswell_2k80", placement)
    profiled = runner.measure_placement(graph.name, "haswell_2k80", placement, profiles=[str(profile)])
    assert plain["evaluator"] == "simulator" and profiled["evaluator"].startswith("simulator+profiles:")
    searched = runner.evaluate_one(graph.name, "haswell_2k80", "single_cpu")
    assert (searched["status"], searched["evaluator"]) == ("ok", "simulator")


def test_the_readme_spec_says_what_a_real_evaluator_runs_and_where(monkeypatch):
    """The spec example's comment: real backends run zoo workloads and their variants (a graph of one's own has
    no model to run), the cluster's CPUs on this CPU and its k-th GPU on cuda:k, a device this machine must have."""
    from suite import PlacebenchError
    from suite.backends import devices
    from suite.backends.devices import DeviceMap
    from suite.backends.workload import for_graph, has_model
    from suite.graph import Op, OpGraph

    spec = README.read_text().split("## Writing a suite spec", 1)[1].split("```", 2)[1]
    comment = _flat(" ".join(line.split("#", 1)[1] for line in spec.splitlines() if "#" in line))
    assert ("real execution of zoo workloads and their shape variants, not graphs of your own: the cluster's CPUs "
            "run on this CPU, its k-th GPU on cuda:k, which must exist here;") in comment
    own = OpGraph.build("mine", [Op("a", "input", output_bytes=8), Op("b", "relu", output_bytes=8)], [("a", "b")])
    assert has_model(load_workload("rnnlm-2x2048-b64")) and not has_model(own)
    with pytest.raises(PlacebenchError, match="has no model in the zoo to run for real"):
        for_graph(own)
    with pytest.raises(PlacebenchError, match="'cuda:64' is not available on this machine"):
        DeviceMap.parse(load_cluster("xeon_h100"), ["gpu:0=cuda:64"])  # no test machine has 65 GPUs
    cluster = load_cluster("haswell_4k80")
    monkeypatch.setattr(devices, "check_torch_device", lambda text, where="": None)  # as if it had 4
    assert DeviceMap.default(cluster).as_dict() == {
        "cpu:0": "cpu", "gpu:0": "cuda:0", "gpu:1": "cuda:1", "gpu:2": "cuda:2", "gpu:3": "cuda:3"}


def test_the_readme_says_which_extra_installs_tox():
    """"Development" starts with tox, which neither the base install nor the `test` extra brings."""
    import tomllib

    extras = tomllib.loads((README.parent / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert not any(d.startswith("tox") for d in extras["test"])
    assert "placebench[test]" in extras["dev"] and any(d.startswith("tox") for d in extras["dev"])
    development = _flat(README.read_text().split("## Development", 1)[1])
    assert development.startswith('`tox` (`pip install -e ".[dev]"` installs it;')


def test_the_readme_quotes_the_onnx_runtime_row_of_the_fidelity_summary():
    """The opening's ONNX Runtime figure: measured / predicted step time of ResNet-50 inference at batch 1 on
    cpu:0 (`results/fidelity/summary.md`; cpu:1's row gives 44%), predicted from PyTorch's profiles."""
    summary = (README.parent / "results" / "fidelity" / "summary.md").read_text().split("## All placements")[0]
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in summary.splitlines() if line.startswith("| ")]
    (row,) = [r for r in rows if r[:2] == ["resnet50-b1-infer", "onnxruntime"] and r[3] == "cpu:0"]
    share = round(100 * float(row[5]) / float(row[4]))
    text = _flat(README.read_text().split("## Commands", 1)[0])
    assert f"runs ResNet-50 inference at batch 1 in {share}% of the time predicted from PyTorch's profiles." in text


def test_the_readme_quotes_the_profile_coverage_footer(tiny_files):
    """"Reading the table" quotes the footer's coverage text as `profile_coverage` writes it for the test's
    diamond (4 ops) on the tiny cluster (cpu:0, gpu:0) with one op's CPU time profiled."""
    from suite.costmodel import Profile, profile_coverage

    graph, cluster = graph_io.load(tiny_files["diamond"]), load_cluster(str(tiny_files["cluster"]))
    summary = profile_coverage(graph, cluster, [Profile("diamond", "cpu", {"b": 0.5})])["summary"]
    prefix = "op times from profiles: "
    assert summary.startswith(prefix)
    table = _flat(README.read_text().split("## Reading the table", 1)[1].split("\n## ", 1)[0])
    assert f"(`{summary.removeprefix(prefix)}`)" in table
