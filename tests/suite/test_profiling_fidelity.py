"""Profiling (per-op times, calibration, backward/update attribution) and the fidelity study (placement
sets, statistics, reports, the CLI commands)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from suite.backends.devices import local_cluster
from suite.backends.workload import SMALL_SHAPES, from_module, small_workload
from suite.cli import main
from suite.costmodel import load_profile
from suite.errors import PlacebenchError, ProfileError, UnknownNameError
from suite.evaluator import Measurement, SimulatorBackend
from suite.fidelity import (
    SETTINGS,
    FidelityResult,
    Row,
    check_clock,
    check_replace,
    placements_for,
    random_split_placement,
    report_names,
    run_fidelity,
    shown_path,
    spearman,
    write_report,
    write_summary,
)
from suite.methodology import Timing
from suite.placement import validate
from suite.profiling import (
    _distribute,
    find_profiles,
    profile_path,
    profile_workload,
    set_threads,
    uncalibrated,
)
from suite.report import md_escape

FAST = Timing(warmup_steps=1, measured_steps=3)

# CPU behaviour throughout (the CUDA path is tested in test_backends_torch.py): a GPU host would add its GPU
# to every local cluster and to the CLI's default cluster.
pytestmark = pytest.mark.usefixtures("cpu_only")


def test_backward_and_update_times_are_distributed_by_hand(shared_linear):
    g = from_module(shared_linear(), (torch.randn(2, 4),), name="shared", mode="training").graph
    ix = g.index
    fwd = np.zeros(g.num_ops)
    bwd = np.zeros(g.num_ops)
    for name in ("fc/0", "act", "fc/1", "out", "sum_1"):
        fwd[ix[name]] = 1.0
    bwd[ix["out"]] = 4.0  # split between out/grad and out/grad_weight (equal FLOPs)
    bwd[ix["fc/variable"]] = 6.0  # AccumulateGrad of shared weights: shared by the two acc ops
    bwd[ix["act"]] = 2.0
    bwd[ix["fc/0"]] = 5.0  # the first layer has only a weight gradient
    out = dict(zip([op.name for op in g.ops], _distribute(g, fwd, bwd, update_s=10.0), strict=True))
    assert out["out/grad"] == out["out/grad_weight"] == 2.0
    assert out["fc/variable/acc0"] == out["fc/variable/acc1"] == 3.0
    assert out["act/grad"] == 2.0 and out["fc/0/grad_weight"] == 5.0
    assert out["out/update"] == pytest.approx(2.0) and out["fc/variable/update"] == pytest.approx(8.0)  # 20:80 bytes
    assert out["fc/0"] == 1.0 and out["x"] == 0.0
    assert sum(out.values()) == pytest.approx(fwd.sum() + bwd.sum() + 10.0)


def test_inference_profile_is_calibrated_to_the_measured_step(tmp_path):
    rw = small_workload("bert_base-12x768-s128-b8", mode="inference")
    prof = profile_workload(rw, "cpu", timing=FAST, threads=1)
    c = prof.metadata["calibration"]
    assert set(prof.op_times_s) == {op.name for op in rw.graph.ops}
    assert prof.applies_to == "cpu" and prof.workload_hash == rw.graph.content_hash
    assert prof.metadata["backend"] == "torch"  # the runtime whose op times these are
    assert sum(prof.op_times_s.values()) == pytest.approx(c["measured_step_s"], rel=1e-9)
    assert c["method"] in ("additive", "scale") and c["raw_sum_s"] > 0
    compute = [op.name for op in rw.graph.ops if op.kind not in ("input", "variable")]
    assert all(prof.op_times_s[n] > 0 for n in compute)
    # the simulator's single-device step with this profile is the calibrated sum
    cluster, _ = local_cluster(1)
    sim = SimulatorBackend(rw.graph, cluster, [prof], engine="reference")
    assert sim.measure(np.zeros(rw.graph.num_ops, dtype=np.int64)).step_time_s == pytest.approx(c["measured_step_s"])
    path = prof.save(profile_path(tmp_path, rw.graph.name, "cpu"))
    assert path.name.endswith("__cpu.json")
    assert load_profile(path).op_times_s == prof.op_times_s
    assert [p.op_times_s for p in find_profiles(rw.graph, tmp_path)] == [prof.op_times_s]


def test_uncalibrated_training_profile_times_backward_and_update_ops():
    rw = small_workload("rnnlm-2x2048-b64", mode="training")
    prof = profile_workload(rw, "cpu", timing=FAST, threads=1, calibrate=False)
    g = rw.graph
    t = prof.op_times_s
    by_phase = {ph: sum(t[op.name] for op in g.ops if op.phase == ph) for ph in ("forward", "backward", "update")}
    assert all(v > 0 for v in by_phase.values())
    assert all(t[op.name] > 0 for op in g.ops if op.phase == "update")
    assert all(t[op.name] > 0 for op in g.ops if op.kind.endswith("_grad_weight"))
    assert prof.metadata["calibration"]["method"] == "none"
    assert sum(t.values()) == pytest.approx(prof.metadata["calibration"]["raw_sum_s"])
    # nothing of the profiled training steps stays on the shared parameters (memory of what runs next)
    assert all(p.grad is None for p in rw.module.parameters())


def test_spearman_by_hand():
    assert spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    assert spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(1.5 / np.sqrt(3.0))
    # tied middle values share rank 2.5: ranks 1, 2.5, 2.5, 4 against 1, 2, 3, 4 (ranks 1, 2, 2, 4 give 0.923)
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(3 / np.sqrt(10.0))
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 1, 1], [1, 2, 3]) is None


def test_report_numbers_stay_short():
    from suite.fidelity import _ms, _pct

    assert (_pct(-0.0512), _pct(3.0), _pct(999.0), _pct(1e300), _pct(None)) == (
        "-5.1%", "+300.0%", "+99900.0%", "+1.00e+302%", "-")
    assert (_ms(0.5), _ms(1e6), _ms(-2.5e7)) == ("500.00", "1.000e+09", "-2.500e+10")


def test_placement_sets_are_valid_and_respect_groups():
    rw = small_workload("nmt-2x1024-b64", mode="training")
    g = rw.graph
    cluster, _ = local_cluster(3)
    rng = np.random.default_rng(0)
    p = random_split_placement(g, 3, rng, pieces=3)
    validate(p, g, cluster)
    for members in g.groups.values():
        assert len(set(p[members].tolist())) == 1
    chosen, failed = placements_for(g, cluster, n_split=2, n_random=2, seed=1)
    assert [fam for _, fam, _ in chosen] == ["single"] * 3 + ["split"] * 2 + ["random"] * 2 and failed == []
    again, _ = placements_for(g, cluster, n_split=2, n_random=2, seed=1)  # same seed, same set
    assert all(a[0] == b[0] and (a[2] == b[2]).all() for a, b in zip(chosen, again, strict=True))
    for _, _, p in chosen:
        validate(p, g, cluster)


def test_fidelity_study_and_reports(tmp_path):
    rw = small_workload("rnnlm-2x2048-b64", mode="inference")
    cluster, dmap = local_cluster(2)
    prof = profile_workload(rw, "cpu", timing=FAST, threads=1)
    profs = [prof.__class__(**{**prof.__dict__, "applies_to": name}) for name in dmap.cluster_devices]
    result = run_fidelity(rw, cluster, dmap, profs, timing=FAST, n_split=1, n_random=1, rounds=2, seed=0,
                          placers=["single_gpu"])
    assert [r.family for r in result.rows] == ["single", "single", "split", "random", "baseline"]
    assert result.stats()["placements"] == 4  # the placer's row is listed, but it placed nothing
    failed = result.rows.pop()  # a placer that fails is a row saying why, not left out
    assert failed.label == "single_gpu" and failed.status == "skipped" and "has no GPU device" in failed.message
    assert all(r.status == "ok" and r.predicted_s > 0 and r.measured_s > 0 for r in result.rows)
    s = result.stats()
    assert s["measured_ok"] == 4 and s["median_abs_rel_error"] >= 0 and -1 <= s["spearman"] <= 1
    paths = write_report(result, tmp_path)
    assert paths["png"].stat().st_size > 1000
    data = json.loads(paths["json"].read_text())
    assert data["stats"] == json.loads(json.dumps(s)) and len(data["rows"]) == 4
    assert "| single:cpu:0 |" in paths["md"].read_text()
    assert md_escape(rw.graph.name) in paths["summary"].read_text()  # a Markdown cell: batch\_size


def test_within_15_percent_is_the_band_of_the_chart():
    """Exactly 0.85 and 1.15 times the measurement are inside (as floats, (0.85 - 1) / 1 is 0.15000000000000002)."""
    rows = [Row(f"p{k}", "split", pred, 1.0, "ok") for k, pred in enumerate((0.85, 1.15, 0.8499, 1.1501, 1.0))]
    assert [r.within_target for r in rows] == [True, True, False, False, True]
    assert FidelityResult("w", "h", "c", "torch", {}, rows).stats()["within_15pct"] == 3


def test_a_report_names_a_profile_inside_the_working_directory_by_its_relative_path(tmp_path, monkeypatch):
    inside = tmp_path / "results" / "profiles" / "w__cpu.json"
    monkeypatch.chdir(tmp_path)
    assert shown_path(str(inside)) == str(Path("results", "profiles", "w__cpu.json"))
    assert shown_path("results/profiles/w__cpu.json") == str(Path("results", "profiles", "w__cpu.json"))
    outside = str(tmp_path.parent / "elsewhere" / "w__cpu.json")
    assert shown_path(outside) == outside
    assert shown_path("") is None


def test_summary_lists_the_reports_it_cannot_read(tmp_path, capsys):
    """A broken JSON file or a fidelity report without its fields is named in the summary, not skipped."""
    rows = [Row("single:cpu:0", "single", 1.0, 1.25, "ok"), Row("random:0", "random", 2.0, 2.0, "ok")]
    (tmp_path / "good.json").write_text(json.dumps(FidelityResult("w", "h", "c", "torch", {}, rows).to_dict()))
    (tmp_path / "broken.json").write_text('{"format": "placebench.fidelity", ')
    (tmp_path / "partial.json").write_text(json.dumps({"format": "placebench.fidelity", "workload": "w2"}))
    (tmp_path / "other.json").write_text(json.dumps({"format": "something else"}))
    text = write_summary(tmp_path).read_text()
    assert "| w | torch | wall | cpu:0 | 1000.00 | 1250.00 | -20.0% |" in text
    assert "| w | c | torch | wall | 2/2 | 10.0% |" in text
    left = text.split("## Files left out")[1].split("##")[0]
    assert f"- {tmp_path / 'broken.json'}: not valid JSON" in left
    assert f"- {tmp_path / 'partial.json'}: a malformed fidelity report (KeyError: 'rows')" in left
    assert "other.json" not in text and "w2" not in text.split("## Files left out")[0]
    err = capsys.readouterr().err
    assert err.count("warning: the fidelity summary leaves out") == 2


def test_report_and_summary_escape_markdown_in_their_cells(tmp_path):
    """Names and messages are escaped as in every other Markdown table (`suite.report.md_escape`): a '|' in an
    error message split its row into one cell too many, and `my_net_x_` showed as an italic 'net'."""
    from suite.fidelity import markdown

    rows = [Row("single:cpu:0", "single", 1.0, 1.25, "ok"),
            Row("placer:m_etf", "baseline", None, None, "error", message="shape a|b <int>")]
    result = FidelityResult("my_net_x_", "h", "two|cpus", "torch", {}, rows)
    report = markdown(result)
    assert report.startswith("# Simulator fidelity: my\\_net\\_x\\_ on two\\|cpus (torch)\n")
    row = next(line for line in report.splitlines() if line.startswith("| placer"))
    assert row.startswith("| placer:m\\_etf | - | - | - |")
    assert row.endswith("| error: shape a\\|b \\<int\\> |")
    header = next(line for line in report.splitlines() if line.startswith("| placement"))
    assert row.replace("\\|", "").count("|") == header.count("|")
    (tmp_path / "r.json").write_text(json.dumps(result.to_dict()))
    text = write_summary(tmp_path).read_text()
    assert "| my\\_net\\_x\\_ | torch | wall | cpu:0 | 1000.00 | 1250.00 | -20.0% |" in text
    assert "| my\\_net\\_x\\_ | two\\|cpus | torch | wall | 1/1 |" in text


def test_summary_marks_reports_of_an_earlier_graph(tmp_path):
    """A report whose workload hash is not the graph's hash now (a capture change since) is marked and listed;
    one of the current graph, or of a workload this machine cannot load, is not."""
    from suite import load_workload

    rows = [Row("single:cpu:0", "single", 1.0, 1.25, "ok")]
    now = load_workload("resnet50-b1-infer").content_hash
    for name, workload, digest in (("old", "resnet50-b1-infer", "sha256:" + "0" * 64),
                                   ("new", "resnet50-b32+batch_size=2", load_workload("resnet50-b32+batch_size=2").content_hash),
                                   ("mine", "my_module", "sha256:" + "1" * 64)):
        (tmp_path / f"{name}.json").write_text(json.dumps(FidelityResult(workload, digest, "c", "torch", {}, rows).to_dict()))
    text = write_summary(tmp_path).read_text()
    assert "| resnet50-b1-infer † | torch |" in text and "| resnet50-b1-infer † | c |" in text
    assert "| resnet50-b32+batch\\_size=2 | torch |" in text and "| my\\_module | torch |" in text
    stale = text.split("## † Reports of an earlier graph")[1].split("\n## ")[0]
    assert f"- old.json: measured ? on graph sha256:000000000000; resnet50-b1-infer is now graph {now[:19]}" in stale
    assert "new.json" not in stale and "mine.json" not in stale


def test_summary_is_utf8_whatever_the_locale(tmp_path):
    """The summary's dagger mark (a report of an earlier graph) and a non-ASCII workload name are written in
    UTF-8 under an ASCII locale too: the summary was written in the locale's encoding, so there `placebench
    fidelity` failed with UnicodeEncodeError after measuring, with the report written and the summary not."""
    import os
    import subprocess
    import sys

    rows = [Row("single:cpu:0", "single", 1.0, 1.25, "ok")]
    for name, workload in (("old", "resnet50-b1-infer"), ("mine", "modèle")):
        data = FidelityResult(workload, "sha256:" + "0" * 64, "c", "torch", {}, rows).to_dict()
        (tmp_path / f"{name}.json").write_bytes(json.dumps(data).encode())
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
    code = f"from suite.fidelity import write_summary; write_summary({str(tmp_path)!r})"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[2])  # this checkout's suite
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "summary.md").read_bytes().decode("utf-8")
    assert "| resnet50-b1-infer † | torch |" in text and "| modèle | torch |" in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.json", "old.json", "summary.md"]  # no temporary left


def test_statistics_ignore_failed_placements():
    rows = [Row("a", "single", 1.0, 1.0, "ok"), Row("b", "split", 2.0, 1.0, "ok"), Row("c", "random", 3.0, 4.0, "ok"),
            Row("d", "random", 1.0, None, "oom")]
    r = FidelityResult("w", "h", "c", "torch", {}, rows)
    s = r.stats()
    assert s["measured_ok"] == 3 and s["placements"] == 4
    assert s["median_abs_rel_error"] == pytest.approx(0.25)  # errors 0, 1, 0.25
    assert s["spearman"] == pytest.approx(spearman([1, 2, 3], [1, 1, 4]))
    assert s["within_15pct"] == 1


def _shape_args(family: str) -> list[str]:
    return [a for k, v in SMALL_SHAPES[family].items() for a in ("--set", f"{k}={v}")]


def test_fidelity_whose_stdout_reader_left_still_measures_and_writes_its_report(tmp_path):
    """`placebench fidelity ... | head`: its first progress line ("profiling ...") raised BrokenPipeError, and
    the command exited 0 having measured nothing and written no report."""
    r, w = os.pipe()
    os.close(r)
    args = ["rnnlm-2x2048-b64", "--mode", "inference", *_shape_args("rnnlm"), "--clock", "cpu", "--profiles",
            str(tmp_path / "p"), "--out", str(tmp_path / "f"), "--splits", "1", "--random", "0", "--rounds", "1",
            "--no-png", "--placer", "none"]
    try:
        proc = subprocess.run([sys.executable, "-m", "suite.cli", "fidelity", *args], stdout=w, stderr=subprocess.PIPE,
                              text=True, timeout=300)
    finally:
        os.close(w)
    assert (proc.returncode, proc.stderr) == (0, "")
    assert len(list((tmp_path / "p").glob("*.json"))) == 1 and len(list((tmp_path / "f").glob("*__cpu.md"))) == 1


def test_cli_profile_and_fidelity(tmp_path, capsys, monkeypatch):
    args = ["rnnlm-2x2048-b64", "--mode", "inference", *_shape_args("rnnlm"), "--clock", "cpu"]
    assert main(["profile", *args, "--out", str(tmp_path / "p"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["applies_to"] == "cpu" and out["ops"] > 0
    # the variant's name loads as a workload, so its profile gives the simulator measured times
    assert main(["evaluate", out["workload"], "-c", "xeon_h100", "-p", "single_cpu", "--profile", out["path"],
                 "--json"]) == 0
    row, times = json.loads(capsys.readouterr().out), json.loads(Path(out["path"]).read_text())["op_times_s"]
    assert row["evaluator"].startswith("simulator+profiles:") and row["step_time_s"] == pytest.approx(sum(times.values()))
    # a stored profile is not measured over without --force (checked before measuring)
    before = Path(out["path"]).read_text()
    assert main(["profile", *args, "--out", str(tmp_path / "p")]) == 2
    assert "exists (a stored profile); pass --force" in capsys.readouterr().err
    assert Path(out["path"]).read_text() == before
    # the text says what --json does: which cluster devices the profile times
    assert main(["profile", *args, "--out", str(tmp_path / "p2"), "--applies-to", "cpu:0"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.endswith(" ops; applies to every cluster device whose name, kind or model is 'cpu:0'"), first
    assert main(["fidelity", *args, "--profiles", str(tmp_path / "p"), "--out", str(tmp_path / "f"),
                 "--splits", "1", "--random", "1", "--rounds", "1", "--no-png", "--placer", "metis"]) == 0
    text = capsys.readouterr().out
    assert "metis" in text
    assert "Spearman" in text and f"using the stored profile {out['path']}" in text and "profiling" not in text
    reports = sorted(p.name for p in (tmp_path / "f").glob("*.md"))
    assert reports[1] == "summary.md" and reports[0].endswith("__torch__cpu.md")
    report = (tmp_path / "f" / reports[0]).read_text()  # where the profile came from
    assert f"file {out['path']}, machine {platform.node()}, " in report and ", clock cpu, times for " in report
    # a profile directory that takes no new file is fine while nothing is measured into it (read-only data);
    # where a profile would be measured, it is refused before the measurement
    import suite.store

    writable = suite.store.check_writable

    def read_only(path, directory=False):
        if Path(path) == tmp_path / "p":
            raise PermissionError(13, f"cannot write {path}: read-only")
        writable(path, directory=directory)

    monkeypatch.setattr(suite.store, "check_writable", read_only)
    quick = ["fidelity", *args, "--profiles", str(tmp_path / "p"), "--out", str(tmp_path / "f"), "--splits", "0",
             "--random", "0", "--rounds", "1", "--no-png", "--placer", "none"]
    assert main(quick) == 0
    capsys.readouterr()
    assert main([*quick, "--reprofile"]) == 2
    assert capsys.readouterr().err == f"placebench: error: --profiles: cannot write {tmp_path / 'p'}: read-only\n"
    assert Path(out["path"]).read_text() == before
    monkeypatch.undo()
    # a profile measured with other settings is not used, nor measured over, without --reprofile
    fid = ["fidelity", *args[:-1], "wall", "--profiles", str(tmp_path / "p"), "--out", str(tmp_path / "f"),
           "--splits", "0", "--random", "0", "--rounds", "1", "--no-png", "--placer", "none"]
    assert main(fid) == 2
    assert "stored profile has clock 'cpu', this run 'wall': pass --reprofile" in capsys.readouterr().err
    assert Path(out["path"]).read_text() == before
    # nor one without a time for every op (it would fall back to the analytic estimate for those)
    doc = json.loads(before)
    dropped = next(iter(doc["op_times_s"]))
    del doc["op_times_s"][dropped]
    Path(out["path"]).write_text(json.dumps(doc))
    assert main(["cpu" if a == "wall" else a for a in fid]) == 2
    n = len(doc["op_times_s"])
    assert f"covers {n} of {n + 1} ops (missing {dropped})" in capsys.readouterr().err
    assert main([*fid, "--reprofile"]) == 0
    assert "profiling" in capsys.readouterr().out and json.loads(Path(out["path"]).read_text())["metadata"]["clock"] == "wall"
    (stored,) = (tmp_path / "p").glob("*.json")
    stored.write_text(stored.read_text().replace('"op_times_s": {', '"op_times_s": {"bogus op": -1, ', 1))
    damaged = stored.read_text()
    assert main(["fidelity", *args[:-1], "wall", "--profiles", str(tmp_path / "p"), "--out", str(tmp_path / "f"),
                 "--splits", "0", "--random", "0", "--rounds", "1", "--no-png", "--placer", "none"]) == 2
    assert stored.name in capsys.readouterr().err and stored.read_text() == damaged  # reported, not measured over


def test_profiles_written_into_a_folder_named_cells_can_be_written_there_again(tmp_path, capsys, monkeypatch,
                                                                                 tiny_files, write_spec):
    """`profile --out X/cells` made X look like a results store (a folder with cells/), so the same command
    again was refused, exit 2, "--out X/cells is inside the results store X". A store is known by its manifest,
    or by the `.lock` a run leaves or a cell file in its cells/: its cells/ is still refused, also before
    its first manifest."""
    from suite import runner
    from suite.backends import workload
    from suite.store import Store

    args = ["profile", "rnnlm-2x2048-b64", "--mode", "inference", *_shape_args("rnnlm"), "--clock", "cpu",
            "--out", str(tmp_path / "x" / "cells")]
    assert main([*args, "--json"]) == 0
    path = Path(json.loads(capsys.readouterr().out)["path"])
    assert path.parent == tmp_path / "x" / "cells"
    assert main(args) == 2  # the same command: refused by the stored profile, not as a store
    assert "exists (a stored profile); pass --force" in capsys.readouterr().err
    assert main([*args, "--force", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["path"] == str(path)

    spec = write_spec(workloads=[str(tiny_files["diamond"])], clusters=[str(tiny_files["cluster"])],
                      placers=["single_cpu"])
    runner.run(str(spec), tmp_path / "store")
    unrun = Store(tmp_path / "unrun")  # a run stopped before it wrote its manifest
    with unrun.writing():
        pass
    no_manifest = Store(tmp_path / "api")  # cells written through the API alone
    no_manifest.write_cell(Store(tmp_path / "store", create=False).records()[0])
    monkeypatch.setattr(workload, "real_workload", lambda *a, **k: pytest.fail("measured before checking"))
    for store in (tmp_path / "store", unrun.root, no_manifest.root):
        before = sorted(store.rglob("*"))
        out = store / "cells"
        assert main(["profile", "rnnlm-2x2048-b64", "--out", str(out)]) == 2
        assert capsys.readouterr().err == (f"placebench: error: --out {out} is inside the results store "
                                           f"{store.resolve()}: write profiles elsewhere\n")
        assert sorted(store.rglob("*")) == before



def test_output_directories_are_checked_before_any_measurement(tmp_path, capsys, monkeypatch):
    """A file where a directory goes is refused up front, naming the flag: profiling and measuring take
    minutes, and their results would be lost to a late mkdir."""
    from suite.backends import workload

    monkeypatch.setattr(workload, "real_workload", lambda *a, **k: pytest.fail("measured before checking"))
    a_file = tmp_path / "a_file"
    a_file.write_text("kept")
    for argv, flag in ((["profile", "rnnlm-2x2048-b64", "--out", str(a_file)], "--out"),
                       (["fidelity", "rnnlm-2x2048-b64", "--out", str(a_file)], "--out")):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"placebench: error: {flag}: cannot write {a_file}: ") and "is a file, not a directory" in err
    assert main(["fidelity", "rnnlm-2x2048-b64", "--profiles", str(a_file)]) == 2
    assert capsys.readouterr().err == f"placebench: error: --profiles {a_file} is a file, not a directory\n"
    assert a_file.read_text() == "kept"


def test_cli_errors_name_the_problem(capsys):
    assert main(["profile", "no-such-workload"]) == 2
    assert "unknown workload" in capsys.readouterr().err
    assert main(["profile", "rnnlm-2x2048-b64", "--set", "depth=2"]) == 2
    assert "unknown shape parameter" in capsys.readouterr().err
    for command in ("profile", "fidelity"):  # not a traceback from two values of mode
        assert main([command, "rnnlm-2x2048-b64", "--set", "mode=inference"]) == 2
        assert "the step (inference or training) is chosen with --mode, not --set" in capsys.readouterr().err
    for bad in ("batch_size=-1", "batch_size=0", "batch_size=NaN", "batch_size=2.5"):
        assert main(["profile", "rnnlm-2x2048-b64", "--set", bad]) == 2
        assert f"shape parameter {bad.split('=')[0]}=" in capsys.readouterr().err
    for sets in (["batch_size=1", "batch_size=2"], ["batch_size=1", " batch_size =2"]):  # not the last one wins
        assert main(["profile", "rnnlm-2x2048-b64", *(a for v in sets for a in ("--set", v))]) == 2
        assert "--set batch_size is given twice" in capsys.readouterr().err
    for value, message in (("1" * 5000, "not valid JSON: Exceeds the limit"), ("[" * 100000, "not valid JSON: maximum "
                           "recursion depth"), ('{"a": 1, "a": 2}', "key 'a' appears twice")):  # not a traceback
        assert main(["profile", "rnnlm-2x2048-b64", "--set", f"batch_size={value}"]) == 2
        assert capsys.readouterr().err.startswith(f"placebench: error: --set batch_size: {message}")
    assert main(["profile", "rnnlm-2x2048-b64", "--set", " =1"]) == 2
    assert "--set ' =1': expected KEY=VALUE" in capsys.readouterr().err
    assert main(["profile", "rnnlm-2x2048-b64", "--applies-to", " "]) == 2
    assert "--applies-to is empty" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["profile", "rnnlm-2x2048-b64", "--threads", "-2"])
    assert exc.value.code == 2 and "must be in [0, 4097)" in capsys.readouterr().err
    assert main(["profile", "rnnlm-2x2048-b64", "--device", "cuda:9"]) == 2


def test_a_report_that_cannot_be_made_writes_nothing(tmp_path):
    """An infinite number (the relative error of an absurd prediction) is refused before any file is written:
    the earlier report stays whole, md and json alike."""
    good = FidelityResult("w", "h", "c", "torch", {}, [Row("single:cpu:0", "single", 1.0, 1.25, "ok")])
    paths = write_report(good, tmp_path)
    before = {p: p.read_bytes() for p in tmp_path.iterdir()}
    bad = FidelityResult("w", "h", "c", "torch", {}, [Row("single:cpu:0", "single", 1e308, 1e-3, "ok")])
    with pytest.raises(PlacebenchError, match=r"row 'single:cpu:0'\.rel_error = inf .* nothing was written"):
        write_report(bad, tmp_path)
    assert {p: p.read_bytes() for p in tmp_path.iterdir()} == before and paths["png"] in before


def test_a_report_file_name_is_one_name_in_the_report_directory(tmp_path):
    """A cluster file may name its cluster "lab/2cpu" or "../up": the report goes into `out` under a file name
    with those characters replaced (the measurement was lost to 'No such file or directory', or written
    beside `out`), and keeps the cluster's name inside."""
    out = tmp_path / "out"
    for name, stem in (("lab/2cpu", "w__lab_2cpu__torch"), ("../up", "w__.._up__torch")):
        result = FidelityResult("w", "h", name, "torch", {}, [Row("single:cpu:0", "single", 1.0, 1.25, "ok")])
        paths = write_report(result, out, png=False)
        assert paths["json"] == out / f"{stem}.json" and paths["md"] == out / f"{stem}.md"
        assert json.loads(paths["json"].read_text())["cluster"] == name
    assert sorted(p.name for p in tmp_path.rglob("*")) == [
        "out", "summary.md", "w__.._up__torch.json", "w__.._up__torch.md", "w__lab_2cpu__torch.json",
        "w__lab_2cpu__torch.md"]


def _profile_file(tmp_path, times, calibration=None):
    data = {"format": "placebench.profile", "schema_version": 1, "workload": "w", "applies_to": "cpu",
            "op_times_s": times, "metadata": {} if calibration is None else {"calibration": calibration}}
    path = tmp_path / "w__cpu.json"
    path.write_text(json.dumps(data))
    return path


def test_a_profile_whose_times_add_up_to_infinity_is_refused(tmp_path):
    path = _profile_file(tmp_path, {"a": 1e308, "b": 1e308})  # each finite, the step infinite
    with pytest.raises(ProfileError, match=rf"^{path}: op_times_s add up to more than the largest float"):
        load_profile(path)
    path = _profile_file(tmp_path, {"a": 1e-3}, {"method": "scale", "factor": 1e-320})  # raw times overflow
    with pytest.raises(ProfileError, match=rf"^{path}: op_times_s without metadata.calibration"):
        load_profile(path)


@pytest.mark.parametrize("calibration, field", [
    ([1], "metadata.calibration must be an object"),
    ({"factor": 2.0}, "metadata.calibration.method = None"),
    ({"method": "magic"}, "metadata.calibration.method = 'magic'"),
    ({"method": "additive"}, "method 'additive' needs field 'op_overhead_s'"),
    ({"method": "additive", "op_overhead_s": -1e-6}, "metadata.calibration.op_overhead_s = -1e-06"),
    ({"method": "scale"}, "method 'scale' needs field 'factor'"),
    ({"method": "scale", "factor": 0}, "metadata.calibration.factor = 0 "),
    ({"method": "scale", "factor": "x"}, "metadata.calibration.factor = 'x' "),
    ({"method": "scale", "factor": True}, "metadata.calibration.factor = True "),
    ({"method": "none", "raw_sum_s": "1"}, "metadata.calibration.raw_sum_s = '1' "),
    ({"method": "none", "measured_step_s": None}, "metadata.calibration.measured_step_s = None "),
])
def test_profile_calibration_is_checked_when_loaded(tmp_path, calibration, field):
    path = _profile_file(tmp_path, {"a": 1e-3}, calibration)
    with pytest.raises(ProfileError, match=rf"^{path}: ") as exc:
        load_profile(path)
    assert field in str(exc.value)


def test_uncalibrated_undoes_a_checked_calibration(tmp_path):
    times = {"a": 3e-3, "b": 0.0, "c": 0.5e-3}  # c ran in less than the overhead: its raw time is 0, not negative
    prof = load_profile(_profile_file(tmp_path, times, {"method": "additive", "op_overhead_s": 1e-3}))
    assert uncalibrated(prof).op_times_s == pytest.approx({"a": 2e-3, "b": 0.0, "c": 0.0})
    prof = load_profile(_profile_file(tmp_path, {"a": 3e-3, "b": 0.0}, {"method": "scale", "factor": 0.5}))
    assert uncalibrated(prof).op_times_s == pytest.approx({"a": 6e-3, "b": 0.0})
    assert uncalibrated(load_profile(_profile_file(tmp_path, {"a": 3e-3}))).op_times_s == {"a": 3e-3}


def test_unknown_placer_is_refused_before_anything_runs(tmp_path, capsys):
    g = small_workload("rnnlm-2x2048-b64", mode="inference").graph
    cluster, dmap = local_cluster(2)
    with pytest.raises(UnknownNameError, match="unknown placer 'nope'"):
        placements_for(g, cluster, placers=["metis", "nope"])
    with pytest.raises(UnknownNameError, match="unknown placer 'nope'"):
        run_fidelity(None, cluster, dmap, [], placers=["nope"])  # before the workload is even looked at
    args = ["fidelity", "rnnlm-2x2048-b64", *_shape_args("rnnlm"), "--profiles", str(tmp_path / "p"),
            "--out", str(tmp_path / "f"), "--no-png"]
    assert main([*args, "--placer", "nope"]) == 2
    assert "unknown placer 'nope'" in capsys.readouterr().err
    assert main([*args, "--placer", "none", "--placer", "metis"]) == 2
    assert "cannot be combined" in capsys.readouterr().err
    assert not (tmp_path / "p").exists() and not (tmp_path / "f").exists()  # nothing profiled, nothing written


def test_failing_placers_give_rows_not_silence():
    g = small_workload("rnnlm-2x2048-b64", mode="inference").graph
    cluster, _ = local_cluster(2)
    from suite.placer import BasePlacer, register_placer, unregister_placer

    @register_placer("fidelity_test_fails")
    class Fails(BasePlacer):
        def place(self, problem, budget, seed):
            raise RuntimeError("boom")

    try:
        chosen, failed = placements_for(g, cluster, n_split=0, n_random=0,
                                        placers=["single_gpu", "fidelity_test_fails", "ort_gpu", "metis", "single_cpu"])
    finally:
        unregister_placer("fidelity_test_fails")
    assert [label for label, _, _ in chosen] == ["single:cpu:0", "single:cpu:1", "metis"]
    assert [(label, status) for label, status, _ in failed] == [
        ("single_gpu", "skipped"), ("fidelity_test_fails", "error"), ("ort_gpu", "skipped"), ("single_cpu", "skipped")]
    assert "no GPU" in failed[0][2] and failed[1][2] == "RuntimeError: boom" and "no GPU" in failed[2][2]
    assert failed[3][2] == "same placement as single:cpu:0 (measured once, in that row)"  # not dropped unsaid


@pytest.mark.parametrize("argv, message", [
    (["fidelity", "--rounds", "0"], "argument --rounds: '0' must be at least 1"),
    (["fidelity", "--rounds", "-1"], "argument --rounds: '-1' must be at least 1"),
    (["fidelity", "--splits", "-5"], "argument --splits: '-5' must be at least 0"),
    (["fidelity", "--random", "-5"], "argument --random: '-5' must be at least 0"),
    (["fidelity", "--logical-cpus", "0"], "argument --logical-cpus: '0' must be at least 1"),
    (["fidelity", "--threads", "2147483648"], "argument --threads: '2147483648' must be in [0, 4097)"),
    (["profile", "--threads", "2147483648"], "argument --threads: '2147483648' must be in [0, 4097)"),
    (["profile", "--threads", "4097"], "argument --threads: '4097' must be in [0, 4097)"),
])
def test_cli_counts_are_bounded(argv, message, tmp_path, capsys):
    small = [*_shape_args("rnnlm"), "--out", str(tmp_path / "out")]
    if argv[0] == "fidelity":
        small += ["--profiles", str(tmp_path / "p"), "--placer", "none", "--no-png"]
    with pytest.raises(SystemExit) as exc:
        main([argv[0], "rnnlm-2x2048-b64", *small, *argv[1:]])
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_library_counts_are_bounded():
    cluster, dmap = local_cluster(2)
    for bad in ({"rounds": 0}, {"n_split": -1}, {"n_random": -5}):
        with pytest.raises(PlacebenchError, match=f"{next(iter(bad))} = -?[0-9]+ must be a whole number >="):
            run_fidelity(None, cluster, dmap, [], **bad)
    before = torch.get_num_threads()
    for bad in (2**31, -1, 4097):
        with pytest.raises(PlacebenchError, match=rf"threads {bad}: expected a whole number in \[0, 4096\]"):
            set_threads(bad)
    assert torch.get_num_threads() == before


def test_fidelity_on_onnxruntime_without_it_installed_is_a_clear_error(capsys, monkeypatch, tmp_path):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnxruntime" else real(name, *a))
    code = main(["fidelity", "rnnlm-2x2048-b64", "--backend", "onnxruntime", "--out", str(tmp_path / "f")])
    err = capsys.readouterr().err
    assert code == 2 and "--backend onnxruntime needs ONNX Runtime, which is not installed: pip install" in err and "Traceback" not in err
    assert not (tmp_path / "f").exists()


def test_fidelity_refuses_logical_cpus_with_a_cluster(capsys, tmp_path):
    """--logical-cpus shapes this machine's cluster: given with --cluster it would be ignored, so it is refused."""
    code = main(["fidelity", "rnnlm-2x2048-b64", "--cluster", "haswell_2k80", "--logical-cpus", "4",
                 "--out", str(tmp_path / "f")])
    err = capsys.readouterr().err
    assert code == 2 and "--logical-cpus describes this machine's cluster: it cannot be combined with --cluster" in err
    assert not (tmp_path / "f").exists()


@pytest.mark.parametrize("command", ["profile", "fidelity"])
def test_a_graph_file_is_not_a_model_to_run(command, tmp_path, capsys):
    from suite.cli import main

    graph = tmp_path / "g.json"
    graph.write_text("{}")
    assert main([command, str(graph), "--out", str(tmp_path / "out")]) == 2
    assert "needs a zoo workload name (placebench list workloads), not a graph file" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_report_names_the_statistic_of_its_measured_step():
    """The measured step is the timing protocol's statistic of the samples: a mean is not labelled a median."""
    from suite.fidelity import markdown

    rows = [Row("single:cpu:0", "single", 1.0, 1.25, "ok")]
    for statistic in ("mean", "median"):
        info = {"timing": {"warmup_steps": 1, "measured_steps": 3, "statistic": statistic, "synchronize": True}}
        text = markdown(FidelityResult("w", "h", "c", "torch", {}, rows, info=info))
        assert f"| measured ms ({statistic}) |" in text
        assert f"| measured ms ({'median' if statistic == 'mean' else 'mean'}) |" not in text


def test_backward_time_of_unattributed_functions_is_counted_as_unattributed():
    """Each interval between marks goes to the function whose mark ends it; one that ends at a mark of no op
    (owner -1) is unattributed time, like the rest after the last mark (it was dropped)."""
    from suite.profiling import _BackwardTracer

    tracer = _BackwardTracer(None)
    tracer.events = [(0, 1.0), (-1, 3.0), (1, 4.0)]
    out, rest = tracer.times(0.5, 6.0, 2)
    assert out.tolist() == [0.5, 1.0]  # 0.5-1.0 to op 0, 3.0-4.0 to op 1
    assert rest == 4.0  # 1.0-3.0 (no op) + 4.0-6.0 (after the last mark)


class _TenMilliseconds:
    """A real backend that measures nothing: every placement and every native run take 10 ms, one after
    another (as ONNX Runtime's sessions run)."""

    last_concurrent = False

    def __init__(self, *args, **kwargs):
        pass

    def measure(self, placement):
        return Measurement("ok", 0.01, (0.01,))

    def measure_native(self, which):
        return self.measure(None)


def test_a_native_row_whose_prediction_is_out_of_memory_is_not_counted(monkeypatch):
    """The native ort_cpu row is predicted by simulating every op on the CPU. Where that simulation runs out of
    memory, its step time is no prediction: the placement rows then say sim-oom and stay out of the
    statistics, but the native row kept the failed simulation's time and counted as ok."""
    from dataclasses import replace

    import suite.backends.ort_exec as ort_exec
    from suite.cluster import Cluster

    monkeypatch.setattr(ort_exec, "OrtBackend", _TenMilliseconds)
    rw = small_workload("rnnlm-2x2048-b64", mode="inference")
    local, dmap = local_cluster(1)
    tiny = Cluster("tiny", (replace(local.devices[0], memory_bytes=1),), ())  # 1 byte: every placement is oom
    result = run_fidelity(rw, tiny, dmap, [], backend="onnxruntime", timing=FAST, n_split=0, n_random=0, rounds=1)
    assert [(r.label, r.status, r.predicted_s) for r in result.rows] == [
        ("single:cpu:0", "sim-oom", None), ("native:ort_cpu", "sim-oom", None)]
    assert result.stats()["measured_ok"] == 0 and result.stats()["median_abs_rel_error"] is None
    # with room, the native row has the all-on-CPU predictions, uncalibrated too (the uncalibrated median left
    # it out: the two medians were over different rows)
    result = run_fidelity(rw, local, dmap, [], backend="onnxruntime", timing=FAST, n_split=0, n_random=0, rounds=1)
    single, native = result.rows
    assert native.status == "ok" and native.predicted_s == single.predicted_s > 0
    assert native.predicted_raw_s == single.predicted_raw_s > 0


def test_native_runs_are_measured_in_the_interleaved_rounds(monkeypatch):
    """The native rows were measured once, after every round of the placements, so a slow phase of the
    machine could hit them alone; they now take part in every round, and their time is the statistic of
    all their samples, with the interquartile range the placement rows have."""
    import suite.backends.ort_exec as ort_exec
    from suite.evaluator import Measurement

    calls = []
    native_samples = iter([(0.01, 0.05), (0.03,), (0.02, 0.04)])

    class FakeOrt:
        def __init__(self, *args, **kwargs):
            pass

        def measure(self, placement):
            calls.append("placement")
            return Measurement("ok", 0.01, (0.01,))

        def measure_native(self, which):
            calls.append(which)
            samples = next(native_samples)
            return Measurement("ok", float(np.median(samples)), samples)

    monkeypatch.setattr(ort_exec, "OrtBackend", FakeOrt)
    rw = small_workload("rnnlm-2x2048-b64", mode="inference")
    local, dmap = local_cluster(1)
    result = run_fidelity(rw, local, dmap, [], backend="onnxruntime", timing=FAST, n_split=0, n_random=0, rounds=3)
    assert calls == ["placement", "ort_cpu"] * 3
    native = result.rows[-1]
    assert native.label == "native:ort_cpu" and native.status == "ok"
    assert native.measured_s == pytest.approx(0.03)  # the median of 0.01, 0.05, 0.03, 0.02, 0.04
    assert (native.measured_q25_s, native.measured_q75_s) == (pytest.approx(0.02), pytest.approx(0.04))


def test_fidelity_refuses_a_stored_uncalibrated_profile():
    """`placebench profile --no-calibrate` stores its profile where `fidelity` looks for one: reused, the
    report's "profile-calibrated" prediction would be the uncalibrated one (both columns equal)."""
    from suite.backends.commands import _profile_differences
    from suite.graph import Op, OpGraph

    g = OpGraph.build("g", [Op("a", "x", flops=1.0)], [])
    meta = {"device": "cpu", "threads": 1, "clock": "wall", "machine": platform.node()}

    def prof(method):
        from suite.costmodel import Profile

        return Profile("g", "cpu", {"a": 1.0}, g.content_hash, {**meta, "calibration": {"method": method}})

    assert _profile_differences(prof("additive"), g, "cpu", 1, "wall") == []
    assert _profile_differences(prof("scale"), g, "cpu", 1, "wall") == []
    assert _profile_differences(prof("none"), g, "cpu", 1, "wall") == [
        "is not calibrated (placebench profile --no-calibrate), this run calibrates"]


def test_a_report_records_how_each_placement_ran_not_only_the_concurrent_setting(tmp_path):
    """The report said "concurrent execution auto" (or True) whatever ran. With concurrent=True on two
    logical CPUs the single-device placements still run sequentially (one lane): only the split ran on
    threads, which the rows, the report and the summary now say; "auto" runs all of them sequentially."""
    from suite.fidelity import markdown

    rw = small_workload("rnnlm-2x2048-b64", mode="inference")
    cluster, dmap = local_cluster(2)
    forced = run_fidelity(rw, cluster, dmap, [], timing=FAST, n_split=1, n_random=0, rounds=1, concurrent=True)
    assert [(r.label, r.concurrent) for r in forced.rows] == [("single:cpu:0", False), ("single:cpu:1", False),
                                                              ("split:0", True)]
    assert forced.info["concurrent"] is True and forced.info["execution"] == "concurrent for 1 of 3 placements"
    assert "execution concurrent for 1 of 3 placements (concurrent setting True): split:0," in markdown(forced)
    auto = run_fidelity(rw, cluster, dmap, [], timing=FAST, n_split=1, n_random=0, rounds=1)
    assert [r.concurrent for r in auto.rows] == [False] * 3 and auto.info["execution"] == "sequential"
    assert "execution sequential (concurrent setting auto)," in markdown(auto)
    write_report(forced, tmp_path, png=False)
    paths = write_report(auto, tmp_path, png=False)
    summary = paths["summary"].read_text()
    assert "| wall, concurrent for 1 of 3 placements | 3/3 |" in summary and "| wall, sequential | 3/3 |" in summary
    assert json.loads(paths["json"].read_text())["rows"][0]["concurrent"] is False


def test_a_clock_the_study_cannot_use_is_refused_before_profiling(tmp_path, capsys, monkeypatch):
    """--clock cpu --concurrent on over two devices was refused by the backend at the first split, after the
    profiles and the single-device placements had been measured, and nothing was written; CPU time with a
    device mapped to CUDA at the first GPU placement. Both are refused before anything runs."""
    import suite.backends.devices as devices
    from suite.backends.devices import DeviceMap

    small = [f"--set={k}={v}" for k, v in SMALL_SHAPES["rnnlm"].items()]
    code = main(["fidelity", "rnnlm-2x2048-b64", *small, "--mode", "inference", "--logical-cpus", "2",
                 "--clock", "cpu", "--concurrent", "on", "--profiles", str(tmp_path / "p"),
                 "--out", str(tmp_path / "f")])
    err = capsys.readouterr().err
    assert code == 2 and "clock 'cpu' cannot time concurrent execution" in err and "Traceback" not in err
    assert not (tmp_path / "p").exists() and not (tmp_path / "f").exists()
    monkeypatch.setattr(devices, "check_torch_device", lambda *a, **k: None)  # pretend cuda:0 exists
    cluster, _ = local_cluster(2)
    dmap = DeviceMap(tuple(d.name for d in cluster.devices), ("cpu", "cuda:0"))
    with pytest.raises(PlacebenchError, match=r"clock 'cpu' cannot time CUDA work, and cpu:1 is mapped to CUDA"):
        run_fidelity(None, cluster, dmap, [], clock="cpu")  # before the workload is even looked at
    check_clock("wall", cluster, dmap, concurrent=True)  # what can run passes
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        check_clock("cpu", cluster, DeviceMap(dmap.cluster_devices, ("cpu", "cpu")), concurrent="auto")
    finally:
        torch.set_num_threads(before)


def test_cpu_time_with_several_intra_op_threads_is_refused_before_the_placers_search(monkeypatch):
    """CPU time with two intra-op threads was refused by the backend at the first measurement, after the
    placers had searched (up to a minute each) and the backend was made; it is refused before either."""
    import suite.backends.torch_exec as torch_exec

    made = []
    monkeypatch.setattr(torch_exec, "TorchBackend", lambda *a, **k: made.append(a))
    rw = small_workload("rnnlm-2x2048-b64", mode="inference")
    cluster, dmap = local_cluster(2)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with pytest.raises(PlacebenchError, match=r"clock 'cpu' needs one intra-op thread, torch uses 2"):
            run_fidelity(rw, cluster, dmap, [], timing=FAST, clock="cpu", placers=["metis"])
    finally:
        torch.set_num_threads(before)
    assert made == []


@pytest.mark.parametrize("mode, backend, forward_only", [
    ("training", "torch", True), ("inference", "torch", False), ("inference", "onnxruntime", False)])
def test_a_training_report_says_its_copied_bytes_are_the_forward_pass_only(mode, backend, forward_only, monkeypatch):
    """The PyTorch backend counts only the forward pass's copies of a training step (autograd's gradient copies
    back are not), where the simulator charges both directions; the column was labelled "copied MiB/step"
    whatever the step. The study now records the workload's mode, and a training report's column and a note
    under the table say forward only."""
    import suite.backends.ort_exec as ort_exec
    import suite.backends.torch_exec as torch_exec
    from suite.evaluator import Measurement
    from suite.fidelity import markdown

    class Fake:  # measures nothing: 10 ms, 3 MiB copied
        def __init__(self, *args, **kwargs):
            pass

        def measure(self, placement):
            return Measurement("ok", 0.01, (0.01,), bytes_transferred=3 * 2**20)

        def measure_native(self, which):
            return Measurement("ok", 0.01, (0.01,))

    monkeypatch.setattr(torch_exec, "TorchBackend", Fake)
    monkeypatch.setattr(ort_exec, "OrtBackend", Fake)
    rw = small_workload("rnnlm-2x2048-b64", mode=mode)
    local, dmap = local_cluster(1)
    result = run_fidelity(rw, local, dmap, [], backend=backend, timing=FAST, n_split=0, n_random=0, rounds=1)
    assert result.info["mode"] == mode
    text = markdown(result)
    header = "| copied MiB/step (forward only) | status |" if forward_only else "| copied MiB/step | status |"
    assert header in text and "| 3.00 | ok |" in text
    assert ("Copied MiB/step counts the forward pass's copies between devices only" in text) is forward_only


def test_statistics_by_hand_over_every_kind_of_row(tmp_path):
    """Only rows with a prediction and a measurement count (a, b, c, h); a row the simulator or the backend
    could not run is a placement but not compared; a baseline that placed nothing and a native run with no
    prediction (ort_gpu, which counted as a placement: "4/7 placements ok" with every run ok) are neither. By hand: |errors| 0, 1, 0.25, 0.1 (median 0.175, max 1); uncalibrated |errors|
    0.1, 0.8, 0.5 (h has none: median 0.5); ranks of predicted 1, 3, 4, 2 and of measured 2, 2, 4, 2:
    Spearman 3 / sqrt(5 * 3)."""
    from suite.fidelity import markdown

    rows = [Row("a", "single", 1.0, 1.0, "ok", predicted_raw_s=0.9),
            Row("b", "split", 2.0, 1.0, "ok", predicted_raw_s=1.8),
            Row("c", "random", 3.0, 4.0, "ok", predicted_raw_s=2.0),
            Row("d", "random", 1.0, None, "oom"),
            Row("e", "split", None, 2.0, "sim-oom"),
            Row("f", "baseline", None, None, "skipped"),
            Row("native:ort_gpu", "native", None, 1.0, "ok"),
            Row("h", "single", 1.1, 1.0, "ok")]
    result = FidelityResult("w", "h", "c", "torch", {}, rows)
    s = result.stats()
    assert s == {"placements": 6, "measured_ok": 4, "median_abs_rel_error": pytest.approx(0.175),
                 "max_abs_rel_error": 1.0, "spearman": pytest.approx(3 / np.sqrt(15)), "within_15pct": 2,
                 "median_abs_rel_error_uncalibrated": pytest.approx(0.5)}
    assert ("Median absolute relative error: 17.5% (uncalibrated profile: 50.0%); Spearman rank correlation: "
            "0.775; 2 of 4 placements within 15%.") in markdown(result)
    summary = write_report(result, tmp_path, png=False)["summary"].read_text()
    assert "| w | c | torch | wall | 4/6 | 17.5% | 0.775 | 2 |" in summary


def test_a_placement_that_fails_in_a_round_is_not_measured_again_and_has_no_step_time(monkeypatch):
    """Interleaved rounds: a placement that fails is not run in the later rounds, and one that fails after an
    ok round has no step time (its status and message are the failure's), so it stays out of the statistics."""
    import suite.backends.torch_exec as torch_exec
    from suite.evaluator import Measurement

    results = {"single:cpu:0": iter([Measurement("oom", None, message="out of memory on cpu:0")]),
               "single:cpu:1": iter([Measurement("ok", 0.01, (0.01,), bytes_transferred=5),
                                     Measurement("error", None, message="RuntimeError: boom")])}
    calls = []

    class Fake:
        def __init__(self, *args, **kwargs):
            pass

        def measure(self, placement):
            label = f"single:cpu:{int(placement[0])}"
            calls.append(label)
            return next(results[label])

    monkeypatch.setattr(torch_exec, "TorchBackend", Fake)
    rw = small_workload("rnnlm-2x2048-b64", mode="inference")
    cluster, dmap = local_cluster(2)
    result = run_fidelity(rw, cluster, dmap, [], timing=FAST, n_split=0, n_random=0, rounds=3)
    assert calls == ["single:cpu:0", "single:cpu:1", "single:cpu:1"]
    assert [(r.label, r.status, r.measured_s, r.message) for r in result.rows] == [
        ("single:cpu:0", "oom", None, "out of memory on cpu:0"), ("single:cpu:1", "error", None, "RuntimeError: boom")]
    assert result.stats()["measured_ok"] == 0 and result.stats()["placements"] == 2


@pytest.mark.parametrize("statistic, step", [("median", 0.01), ("mean", 0.02)])
def test_a_measured_step_is_the_protocols_statistic_of_every_rounds_samples(statistic, step, monkeypatch):
    """Samples 0.01 and 0.01, then 0.04 (two rounds): median 0.01, mean 0.02 of all three."""
    import suite.backends.torch_exec as torch_exec
    from suite.evaluator import Measurement

    samples = iter([(0.01, 0.01), (0.04,)])

    class Fake:
        def __init__(self, *args, **kwargs):
            pass

        def measure(self, placement):
            s = next(samples)
            return Measurement("ok", float(np.median(s)), s)

    monkeypatch.setattr(torch_exec, "TorchBackend", Fake)
    rw = small_workload("rnnlm-2x2048-b64", mode="inference")
    local, dmap = local_cluster(1)
    timing = Timing(warmup_steps=1, measured_steps=2, statistic=statistic)
    (row,) = run_fidelity(rw, local, dmap, [], timing=timing, n_split=0, n_random=0, rounds=2).rows
    assert row.measured_s == pytest.approx(step)


def _hand_result(rounds: int, concurrent="auto", cluster="c") -> FidelityResult:
    info = {"rounds": rounds, "concurrent": concurrent, "threads": 1, "clock": "cpu",
            "timing": {"warmup_steps": 1, "measured_steps": 3, "statistic": "median", "synchronize": True}}
    return FidelityResult("w", "h", cluster, "torch", {"cpu:0": "cpu"},
                          [Row("single:cpu:0", "single", 0.011, 0.010, "ok")], [], info)


def test_a_report_measured_with_other_settings_is_not_replaced_unseen(tmp_path):
    """Rounds, the concurrent setting "auto" or off, threads and timing are not in a report's file name: a
    study with 3 rounds replaced the report of one with 1 round (the same names) without a word. It is
    refused, naming what differs, unless forced; one measured with the same settings is replaced."""
    write_report(_hand_result(1), tmp_path, png=False)
    path = tmp_path / "w__c__torch__cpu.json"
    before = path.read_text()
    with pytest.raises(PlacebenchError, match=r"w__c__torch__cpu.json was measured with rounds 1 \(this run 3\): "
                                              r"pass --force"):
        write_report(_hand_result(3), tmp_path, png=False)
    with pytest.raises(PlacebenchError, match=r"concurrent 'auto' \(this run False\)"):
        write_report(_hand_result(1, concurrent=False), tmp_path, png=False)
    assert path.read_text() == before
    write_report(_hand_result(1), tmp_path, png=False)  # the same settings: measured again, replaced
    write_report(_hand_result(3), tmp_path, png=False, force=True)
    assert json.loads(path.read_text())["info"]["rounds"] == 3
    path.write_text("{not json")
    with pytest.raises(PlacebenchError, match=r"cannot be read would be replaced"):
        write_report(_hand_result(3), tmp_path, png=False)


def test_a_report_of_another_cluster_of_the_same_file_name_is_not_replaced_unseen(tmp_path):
    """Clusters "lab/2cpu" and "lab_2cpu" both write w__lab_2cpu__torch__cpu.json: with the same settings the
    second replaced the first's report without a word. It is refused, naming both, unless forced."""
    write_report(_hand_result(1, cluster="lab/2cpu"), tmp_path, png=False)
    path = tmp_path / "w__lab_2cpu__torch__cpu.json"
    before = path.read_text()
    with pytest.raises(PlacebenchError, match=r"w__lab_2cpu__torch__cpu.json is the report of cluster 'lab/2cpu' "
                                              r"\(this run 'lab_2cpu'\): pass --force"):
        write_report(_hand_result(1, cluster="lab_2cpu"), tmp_path, png=False)
    assert path.read_text() == before
    write_report(_hand_result(1, cluster="lab_2cpu"), tmp_path, png=False, force=True)
    assert json.loads(path.read_text())["cluster"] == "lab_2cpu"
    names = report_names("w", "lab_2cpu", "onnxruntime", "wall")
    with pytest.raises(PlacebenchError, match=r"report of backend 'torch' \(this run 'onnxruntime'\), "
                                              r"clock 'cpu' \(this run 'wall'\): pass --force"):
        check_replace(path, _hand_result(1).info, names)


@pytest.mark.parametrize("backend, concurrent", [("torch", "on"), ("torch", "off"), ("onnxruntime", "auto")])
def test_the_clis_early_check_and_the_written_report_agree_on_settings_and_names(backend, concurrent, tmp_path,
                                                                                 monkeypatch):
    """The CLI checks a stored report before profiling with the settings and names the report will record:
    built apart, they could drift, and the early check refuse wrongly or miss a conflict."""
    import suite.backends.commands as commands
    import suite.backends.ort_exec as ort_exec
    import suite.backends.torch_exec as torch_exec
    import suite.fidelity as fidelity

    monkeypatch.setattr(torch_exec, "TorchBackend", _TenMilliseconds)
    monkeypatch.setattr(ort_exec, "OrtBackend", _TenMilliseconds)
    monkeypatch.setattr(commands, "profiles_for", lambda *a, **k: [])
    checked = []
    real_check = fidelity.check_replace
    monkeypatch.setattr(fidelity, "check_replace", lambda *a: checked.append(a) or real_check(*a))
    out = tmp_path / "f"
    out.mkdir()
    code = main(["fidelity", "rnnlm-2x2048-b64", "--mode", "inference", *_shape_args("rnnlm"),
                 "--logical-cpus", "2", "--rounds", "2", "--backend", backend, "--concurrent", concurrent,
                 "--splits", "0", "--random", "0", "--placer", "none", "--no-png", "--json",
                 "--profiles", str(tmp_path / "p"), "--out", str(out)])
    assert code == 0
    (early_path, early, early_names), (path, info, names) = checked  # the CLI's, then write_report's
    report = json.loads(path.read_text())
    assert early_path == path and early_names == names
    assert early == {key: report["info"][key] for key in SETTINGS}
    assert names == {"workload": report["workload"], "cluster": "local_2cpu", "backend": backend, "clock": "wall"}
    assert report["info"]["concurrent"] == {"on": True, "off": False, "auto": False}[concurrent]


def test_the_cli_refuses_to_replace_a_report_of_other_settings_before_profiling(tmp_path, capsys):
    from suite.fidelity import report_stem

    name = small_workload("rnnlm-2x2048-b64", mode="inference").graph.name
    out = tmp_path / "f"
    out.mkdir()
    report = out / f"{report_stem(name, 'local_2cpu', 'torch', 'cpu', 'auto')}.json"
    report.write_text(json.dumps({"format": "placebench.fidelity", "info": {"rounds": 1, "concurrent": "auto"}}))
    code = main(["fidelity", "rnnlm-2x2048-b64", "--mode", "inference", *_shape_args("rnnlm"), "--clock", "cpu",
                 "--logical-cpus", "2", "--rounds", "2", "--profiles", str(tmp_path / "p"), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and f"{report} was measured with rounds 1 (this run 2): pass --force" in err
    assert not (tmp_path / "p").exists()  # refused before profiling


@pytest.mark.parametrize("value", ["on", 1, None])
def test_a_concurrent_setting_that_is_not_true_false_or_auto_is_refused(value, monkeypatch):
    """concurrent="on" (the CLI's word) or 1 ran every placement sequentially without a word, while the
    report said "concurrent setting on"; it is refused before the placers search or the backend is made."""
    import suite.backends.torch_exec as torch_exec
    from suite.backends.torch_exec import TorchExecutor

    rw = small_workload("rnnlm-2x2048-b64", mode="inference")
    cluster, dmap = local_cluster(2)
    with pytest.raises(PlacebenchError, match=r"concurrent .*: expected True, False or 'auto'"):
        TorchExecutor(rw, dmap, concurrent=value)
    made = []
    monkeypatch.setattr(torch_exec, "TorchBackend", lambda *a, **k: made.append(a))
    with pytest.raises(PlacebenchError, match=r"expected True, False or 'auto'"):
        run_fidelity(rw, cluster, dmap, [], timing=FAST, concurrent=value, placers=["metis"])
    assert made == []


def test_a_profile_in_which_every_op_took_zero_seconds_is_refused(monkeypatch):
    """A clock too coarse for every op gave an all-zero profile (calibration `none`): with it every single-device
    step was simulated as 0 s, and the evaluator's failure score (a multiple of the summed op times) was 0."""
    import suite.profiling as profiling

    monkeypatch.setattr(profiling, "clock_function", lambda clock: lambda: 1.0)  # a clock that never moves
    rw = small_workload("bert_base-12x768-s128-b8", mode="inference")
    with pytest.raises(ProfileError, match=r"every op took 0 s by the 'wall' clock .* no profile written"):
        profile_workload(rw, "cpu", timing=FAST, threads=1)


def test_a_profile_whose_whole_step_took_zero_seconds_is_refused(monkeypatch):
    """Ops that added up to more than 0 s, and a measured step of 0 s (a clock coarser than the step): the
    calibration scaled every op by 0, wrote factor 0, and the profile it wrote could not be read back."""
    import suite.profiling as profiling

    monkeypatch.setattr(profiling, "time_steps", lambda *a, **k: [0.0, 0.0, 0.0])
    rw = small_workload("bert_base-12x768-s128-b8", mode="inference")
    with pytest.raises(ProfileError, match=r"the whole step took 0 s by the 'wall' clock .* no profile written"):
        profile_workload(rw, "cpu", timing=FAST, threads=1)
    assert profile_workload(rw, "cpu", timing=FAST, threads=1, calibrate=False).metadata["calibration"]["method"] == "none"


def test_find_profiles_takes_glob_characters_of_a_workload_name_literally(tmp_path):
    """A name with `[` was a glob pattern: `m[1]__*.json` matched `m1__...` and never the profile itself."""
    from suite import Op, OpGraph
    from suite.costmodel import Profile

    g = OpGraph.build("m[1]", [Op("a", "x", flops=1e6), Op("b", "x", flops=1e6)], [("a", "b")])
    other = OpGraph.build("m1", [Op("a", "x", flops=1e6)], [])
    prof = Profile(g.name, "cpu", {"a": 1e-3, "b": 2e-3}, workload_hash=g.content_hash)
    prof.save(profile_path(tmp_path, g.name, "cpu"))
    Profile(other.name, "cpu", {"a": 1e-3}, workload_hash=other.content_hash).save(
        profile_path(tmp_path, other.name, "cpu"))
    assert [p.op_times_s for p in find_profiles(g, tmp_path)] == [prof.op_times_s]


def test_an_unknown_clock_is_refused_before_the_profiler_builds_anything(monkeypatch):
    """`profile_workload(clock="bogus")` built the executor (the model moved to the device) and failed only
    when the first step was to be timed; it now fails first, naming the clock."""
    import suite.profiling as profiling

    def built(*a, **k):
        raise AssertionError("the executor was built")

    monkeypatch.setattr(profiling, "TorchExecutor", built)
    rw = small_workload("bert_base-12x768-s128-b8", mode="inference")
    with pytest.raises(PlacebenchError, match=r"clock 'bogus' is not one of"):
        profile_workload(rw, "cpu", timing=FAST, threads=1, clock="bogus")


def test_fidelity_on_another_backend_than_the_profiles_warns_and_says_so_in_its_reports(monkeypatch, tmp_path):
    """`fidelity --backend onnxruntime` predicted from torch-measured profiles (+400..1400 % errors) without
    a word. A profile records its backend; a study of another backend warns before anything runs, and its
    report and the summary say the profiles are torch's. A torch study of torch profiles does not warn."""
    import warnings

    import suite.backends.ort_exec as ort_exec
    from suite.costmodel import Profile
    from suite.fidelity import markdown
    from suite.profiling import measured_backend

    monkeypatch.setattr(ort_exec, "OrtBackend", _TenMilliseconds)
    rw = small_workload("rnnlm-2x2048-b64", mode="inference")
    local, dmap = local_cluster(1)
    meta = {"backend": "torch", "device": "cpu", "calibration": {"method": "none"}}
    prof = Profile(rw.graph.name, "cpu", {op.name: 1e-4 for op in rw.graph.ops}, rw.graph.content_hash, meta)
    with pytest.warns(UserWarning, match=r"the profiles were measured on torch, this study measures onnxruntime: "
                                         r"the predictions are torch's op times"):
        result = run_fidelity(rw, local, dmap, [prof], backend="onnxruntime", timing=FAST, n_split=0, n_random=0,
                              rounds=1)
    assert [p["backend"] for p in result.profiles] == ["torch"]
    assert "**Warning:** the profiles were measured on torch, this study measures onnxruntime" in markdown(result)
    write_report(result, tmp_path, png=False)
    assert "| onnxruntime (torch profiles) |" in write_summary(tmp_path).read_text()
    # older profile_workload profiles (a torch version, no backend) are torch's; a hand-written one: unknown
    old = Profile(rw.graph.name, "cpu", {}, metadata={"torch": "2.0"})
    assert (measured_backend(old), measured_backend(Profile(rw.graph.name, "cpu", {}))) == ("torch", None)
    import suite.backends.torch_exec as torch_exec

    monkeypatch.setattr(torch_exec, "TorchBackend", _TenMilliseconds)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        same = run_fidelity(rw, local, dmap, [prof], backend="torch", timing=FAST, n_split=0, n_random=0, rounds=1)
    assert "Warning" not in markdown(same) and [p["backend"] for p in same.profiles] == ["torch"]


def test_a_workload_name_with_a_slash_is_one_profile_file_in_the_directory(tmp_path):
    """profile_path(d, "../x/y", "cuda:0") was d/../x/y__cuda0.json: `placebench profile` of a graph named so
    wrote outside the profile directory (Profile.save makes the folders). The name is now one file name."""
    from suite import Op, OpGraph
    from suite.costmodel import Profile

    d = tmp_path / "profiles"
    assert profile_path(d, "../x/y", "cuda:0") == d / ".._x_y__cuda0.json"
    assert profile_path(d, "bert+num_layers=2", "cpu") == d / "bert+num_layers=2__cpu.json"  # zoo names as they were
    g = OpGraph.build("../x/y", [Op("a", "x", flops=1e6)], [])
    prof = Profile(g.name, "cpu", {"a": 1e-3}, workload_hash=g.content_hash)
    prof.save(profile_path(d, g.name, "cpu"))
    assert [p.name for p in tmp_path.rglob("*.json")] == [".._x_y__cpu.json"]
    assert [p.op_times_s for p in find_profiles(g, d)] == [prof.op_times_s]


def test_a_placement_predicted_at_0_s_is_reported_not_a_crash_of_the_chart(tmp_path):
    """A profile giving every op of a placement 0 s predicts 0 s; the log-log chart failed on it (numpy:
    'Geometric sequence cannot include zero') after the whole study was measured, and nothing was written.
    The chart leaves that row out and says so; the table and JSON keep it."""
    rows = [Row("single:cpu:0", "single", 0.0, 0.01, "ok"), Row("single:cpu:1", "single", 0.02, 0.01, "ok")]
    result = FidelityResult("w", "h", "c", "torch", {}, rows)
    paths = write_report(result, tmp_path)
    assert paths["png"].read_bytes().startswith(b"\x89PNG")
    assert "| single:cpu:0 | 0.00 | 10.00 |" in paths["md"].read_text()
    assert json.loads(paths["json"].read_text())["rows"][0]["rel_error"] == -1.0
