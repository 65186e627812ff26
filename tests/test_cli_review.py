"""CLI regressions found in review: refusals of an --out that fire on valid input."""

from __future__ import annotations

from suite.cli import main


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_run_resumes_a_store_whose_folder_is_named_cells(capsys, tiny_files, write_spec, tmp_path):
    """A store named `cells` (`--out runs/cells`) has a cells/ folder of its own, so its parent looked like a store
    (`is_store_dir`: a folder with cells/) and the second `run` into it, a resume, was refused as "inside the
    results store runs" (exit 2). A store is --out's to run into, whatever its name."""
    spec = write_spec(workloads=[str(tiny_files["diamond"])], clusters=[str(tiny_files["cluster"])],
                      placers=["single_cpu"])
    out = tmp_path / "runs" / "cells"
    assert _run(capsys, "run", str(spec), "--out", str(out), "--quiet")[0] == 0
    manifest = (out / "manifest.json").read_text()
    code, _, err = _run(capsys, "run", str(spec), "--out", str(out), "--quiet")
    assert code == 0, err
    assert (out / "manifest.json").read_text() != manifest  # the resume recorded its run


def test_an_output_path_too_long_is_named_by_its_flag(capsys, tiny_files, write_spec, tmp_path):
    """The store-folder check of an output path stat'ed `<path>/cells` first: a name too long was reported as
    "placebench: error: <path>/cells: File name too long", a path the user never gave and no flag. As before
    that check: "--out: File name too long", exit 2, nothing written."""
    spec = write_spec(workloads=[str(tiny_files["diamond"])], clusters=[str(tiny_files["cluster"])],
                      placers=["single_cpu"])
    long = tmp_path / ("x" * 300)
    code, _, err = _run(capsys, "run", str(spec), "--out", str(long / "store"), "--quiet")
    assert (code, err) == (2, "placebench: error: --out: File name too long\n")
    assert _run(capsys, "run", str(spec), "--out", str(tmp_path / "store"), "--quiet")[0] == 0
    code, _, err = _run(capsys, "table", str(tmp_path / "store"), "--output", str(long / "t.md"))
    assert (code, err) == (2, "placebench: error: --output: File name too long\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store", "test.toml"]
