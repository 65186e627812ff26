"""The results store: atomic files, one file per cell, tables that round-trip, clear errors."""

from __future__ import annotations

import json
import os
import re
import stat
import threading

import pytest

from suite import store as st
from suite.store import ROW_COLUMNS, Store, StoreError, row_problem


def _record(cell_id: str, **kw) -> dict:
    base = {
        "cell_id": cell_id,
        "workload": "w",
        "workload_hash": "sha256:w",
        "cluster": "c",
        "cluster_hash": "sha256:c",
        "placer": "p",
        "placer_name": "p",
        "params": "{}",
        "params_hash": "h",
        "seed": 0,
        "methodology": "m1",
        "budget_evaluations": 10,
        "budget_seconds": 1.5,
        "evaluator": "simulator",
        "status": "ok",
        "message": "",
        "step_time_s": 0.125,
        "peak_memory_bytes": json.dumps({"cpu:0": 10}),
        "max_peak_memory_bytes": 10,
        "evaluations": 3,
        "placement": [0, 0, 1],
        "curve": [{"evaluations": 1, "wall_time_s": 0.1, "best_score_s": 0.2, "mean_score_s": 0.2}],
    }
    return {**base, **kw}


def test_atomic_write_replaces_and_leaves_no_temporary(tmp_path):
    p = tmp_path / "f.json"
    st.atomic_write_text(p, "one")
    st.atomic_write_text(p, "two")
    assert p.read_text() == "two"
    assert [x.name for x in tmp_path.iterdir()] == ["f.json"]


def test_written_files_get_the_usual_permissions(tmp_path):
    """Not mkstemp's 0600: a results directory is shared like any other files (here: the umask's default)."""
    path = st.atomic_write_text(tmp_path / "x.json", "{}")
    assert st._UMASK & 0o600 == 0 and path.stat().st_mode & 0o777 == 0o666 & ~st._UMASK != 0o600


def test_failed_atomic_write_keeps_the_old_file(tmp_path, monkeypatch):
    p = tmp_path / "f.json"
    st.atomic_write_text(p, "old")

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        st.atomic_write_text(p, "new")
    assert p.read_text() == "old"
    assert [x.name for x in tmp_path.iterdir()] == ["f.json"]


def test_a_symbolic_link_is_written_through_and_kept(tmp_path):
    (tmp_path / "shared").mkdir()
    target = tmp_path / "shared" / "report.md"
    target.write_text("old")
    link = tmp_path / "latest.md"
    link.symlink_to(target)
    st.atomic_write_text(link, "new")
    assert link.is_symlink() and target.read_text() == "new"
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["latest.md", "report.md", "shared"]


def test_a_device_or_fifo_is_written_directly_not_replaced(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_text()))
    reader.start()
    st.atomic_write_text(fifo, "through the pipe")
    reader.join(5)
    assert received == ["through the pipe"] and stat.S_ISFIFO(os.stat(fifo).st_mode)
    with pytest.raises(OSError, match="cannot write /dev/full: No space left on device"):
        st.atomic_write_text("/dev/full", "x")
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


def test_check_writable_tries_the_nearest_existing_directory(tmp_path):
    st.check_writable(tmp_path / "a" / "b" / "c.json")  # missing directories are made later
    st.check_writable(tmp_path / "a" / "b", directory=True)
    assert list(tmp_path.iterdir()) == []  # the check leaves nothing behind
    (tmp_path / "f").write_text("x")
    with pytest.raises(NotADirectoryError, match="is a file, not a directory"):
        st.check_writable(tmp_path / "f" / "c.json")
    with pytest.raises(NotADirectoryError, match=rf"cannot write {tmp_path / 'f'}: {tmp_path / 'f'} is a file, not a "
                                                 r"directory"):
        st.check_writable(tmp_path / "f", directory=True)
    with pytest.raises(IsADirectoryError, match="it is a directory"):
        st.check_writable(tmp_path)
    with pytest.raises(OSError, match="cannot write /proc/x.json"):
        st.check_writable("/proc/x.json")
    st.check_writable("/dev/null")


def test_a_cell_is_stored_once_under_its_id(tmp_path):
    s = Store(tmp_path / "run")
    s.write_cell(_record("abc", step_time_s=1.0))
    s.write_cell(_record("abc", step_time_s=2.0))  # rerun (--force) overwrites, never duplicates
    s.write_cell(_record("def", seed=1, status="oom", step_time_s=None, oom_devices="gpu:0"))
    assert s.cell_ids() == {"abc", "def"}
    rows = s.rows()
    assert [(r["cell_id"], r["step_time_s"]) for r in rows] == [("abc", 2.0), ("def", None)]
    assert list(rows[0]) == list(ROW_COLUMNS)
    full = s.read_cell("abc")
    assert full["placement"] == [0, 0, 1] and full["curve"][0]["evaluations"] == 1


def test_leftover_temporary_files_are_not_cells_and_are_cleaned(tmp_path):
    s = Store(tmp_path)
    s.write_cell(_record("abc"))
    (s.cells_dir / ".zzz.json.123.tmp").write_text('{"truncated')
    assert s.cell_ids() == {"abc"}
    with Store(tmp_path).writing():  # the next run cleans up
        assert sorted(p.name for p in s.cells_dir.iterdir()) == ["abc.json"]


def test_a_store_is_written_by_one_run_at_a_time(tmp_path):
    with Store(tmp_path).writing():
        with pytest.raises(StoreError, match="another run is writing to this store"):
            with Store(tmp_path).writing():
                pass
    with Store(tmp_path).writing():  # released
        pass


def test_compacted_tables_round_trip(tmp_path):
    s = Store(tmp_path)
    s.write_cell(_record("a1", step_time_s=0.1 + 0.2))  # a float that needs all its digits
    s.write_cell(_record("a2", seed=1, status="error", step_time_s=None, message='boom, "quoted"\nline 2',
                         peak_memory_bytes=None, max_peak_memory_bytes=None, evaluations=None))
    parquet, csv = s.compact()
    expected = s.rows()
    assert st.read_table(parquet) == expected
    assert st.read_table(csv) == expected
    assert st.open_rows(tmp_path) == expected
    assert expected[0]["step_time_s"] == 0.1 + 0.2
    assert expected[1]["message"] == 'boom, "quoted"\nline 2'


def test_compact_replaces_both_tables_or_neither(tmp_path, monkeypatch):
    """results.parquet was written before results.csv was made: a failure (or a kill) while making the CSV left
    the two tables of different rows."""
    s = Store(tmp_path)
    s.write_cell(_record("a1"))
    s.compact()
    before = {name: (tmp_path / name).read_bytes() for name in ("results.parquet", "results.csv")}
    s.write_cell(_record("a2", seed=1))

    def broken(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(st.pacsv, "write_csv", broken)
    with pytest.raises(KeyboardInterrupt):
        s.compact()
    assert {name: (tmp_path / name).read_bytes() for name in before} == before
    assert len(st.read_table(tmp_path / "results.parquet")) == 1


def test_a_table_under_a_path_that_is_not_utf8_is_read(tmp_path, capsys):
    """Arrow was given the path, and cannot encode one with an undecodable byte (Latin-1 "é" on a UTF-8
    system, which Python holds as "\\udce9"): reading the table was a UnicodeEncodeError traceback."""
    from suite.cli import main

    s = Store(tmp_path / "runs-\udce9")
    s.write_cell(_record("a1", placer="ü😀"))
    for path in s.compact():
        assert st.read_table(path) == s.rows() and st.read_table(path)[0]["placer"] == "ü😀"
        assert main(["table", str(path), "--format", "csv"]) == 0
        assert "ü😀" in capsys.readouterr().out
    (tmp_path / "dir.csv").mkdir()
    with pytest.raises(st.StoreError, match=r"dir.csv: cannot read the results table: Is a directory$"):
        st.read_table(tmp_path / "dir.csv")


def test_non_finite_and_numpy_values_are_stored_as_json(tmp_path):
    import numpy as np

    s = Store(tmp_path)
    s.write_cell(_record("x", info={"best": float("inf"), "arr": np.arange(3), "n": np.int64(4)}))
    assert s.read_cell("x")["info"] == {"best": None, "arr": [0, 1, 2], "n": 4}


def test_a_lone_surrogate_is_stored_as_its_escape_text(tmp_path):
    """A placer's error message that names a file with an undecodable byte (Python's surrogate escape) was
    written as "\\udce9", which the store refuses to read: the run's own table failed on it, as did every rerun."""
    name = b"/tmp/caf\xe9".decode("utf-8", "surrogateescape")
    s = Store(tmp_path)
    s.write_cell(_record("x", status="error", step_time_s=None, message=f"RuntimeError: cannot open {name}",
                         info={name: name}))
    s.write_manifest({"format": st.STORE_FORMAT, "runs": [], "specs": {"t": {"source": name}}})
    record = s.read_cell("x")
    assert record["message"] == "RuntimeError: cannot open /tmp/caf\\udce9"
    assert record["info"] == {"/tmp/caf\\udce9": "/tmp/caf\\udce9"}
    assert s.manifest()["specs"]["t"]["source"] == "/tmp/caf\\udce9"
    s.compact()
    assert st.open_rows(tmp_path / "results.csv")[0]["message"] == "RuntimeError: cannot open /tmp/caf\\udce9"


def test_manifest_round_trip_and_default(tmp_path):
    s = Store(tmp_path)
    assert s.manifest()["runs"] == []
    s.write_manifest({**s.manifest(), "runs": [{"run_id": "r1"}]})
    assert s.manifest()["runs"] == [{"run_id": "r1"}]


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: p / "missing", "no such store directory or results table"),
        (lambda p: (p / "empty").mkdir() or p / "empty", "not a placebench store"),
        (lambda p: (p / "x.csv").write_text("a,b\n1,2\n") and p / "x.csv", "missing column"),
        (lambda p: (p / "x.txt").write_text("hello") and p / "x.txt", "expected a store directory"),
        (lambda p: (p / "x.parquet").write_text("not parquet") and p / "x.parquet", "not a placebench results table"),
    ],
)
def test_unreadable_inputs_are_clear_errors(tmp_path, make, message):
    with pytest.raises(StoreError, match=message):
        st.open_rows(make(tmp_path))


def test_bad_cell_and_manifest_files_are_errors(tmp_path):
    s = Store(tmp_path)
    (s.cells_dir / "bad.json").write_text("{not json")
    with pytest.raises(StoreError, match=r"bad\.json: not valid JSON"):
        s.rows()
    (s.cells_dir / "bad.json").write_text('{"n": 1' + "0" * 5000 + "}")  # json's ValueError, not a JSONDecodeError
    with pytest.raises(StoreError, match=r"bad\.json: not valid JSON: Exceeds the limit"):
        s.rows()
    s.manifest_path.write_bytes(b'{"format": "\xff"}')
    with pytest.raises(StoreError, match=r"manifest\.json: not valid UTF-8 text"):
        s.manifest()
    s.manifest_path.write_text('{"format": "something else"}')
    with pytest.raises(StoreError, match="not a placebench store manifest"):
        s.manifest()


def test_cell_file_with_another_format_is_refused(tmp_path):
    s = Store(tmp_path)
    path = s.write_cell(_record("abc"))
    data = json.loads(path.read_text())
    assert data["format"] == "placebench.cell"
    path.write_text(json.dumps({**data, "format": "placebench.profile"}))
    with pytest.raises(StoreError, match=r"abc\.json: not a placebench cell file"):
        s.read_cell("abc")
    with pytest.raises(StoreError, match=r"abc\.json: not a placebench cell file"):
        s.rows()
    path.write_text(json.dumps([data]))  # valid JSON, but not an object
    with pytest.raises(StoreError, match=r"abc\.json: not a placebench cell file"):
        s.read_cell("abc")


def test_machine_description(tmp_path):
    info = st.machine_info()
    assert set(info) == {"hostname", "platform", "python", "cpu", "simd", "cpus"} and info["cpus"] >= 1
    assert st.package_versions()["numpy"]
    assert st.git_state(tmp_path) == {"commit": None, "dirty": None}  # not a git checkout


@pytest.mark.parametrize(("cpuinfo", "simd"), [
    ("processor\t: 0\nflags\t\t: fpu sse2 avx avx2 avx512f avx512bw\n", "AVX-512"),
    ("processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\nprocessor\t: 1\nflags\t\t: fpu sse2 avx avx2 fma\n", "AVX2"),
    ("processor\t: 0\nflags\t\t: fpu sse2 avx\n", ""),
    ("processor\t: 0\nFeatures\t: fp asimd evtstrm aes\n", "NEON"),
    ("processor\t: 0\nFeatures\t: fp asimd sve sve2\n", "SVE"),
    ("", ""),
])
def test_the_widest_vector_extension_is_read_from_cpuinfo(cpuinfo, simd):
    """avx512_vnni alone is not avx512f, and a flag must be a whole word of the flags line."""
    assert st.cpu_simd(cpuinfo) == simd
    assert st.cpu_simd("flags : avx512_vnni avx2x\n") == ""


def test_without_cpuinfo_the_extension_comes_from_numpys_detection(monkeypatch):
    """Hosts without /proc/cpuinfo (macOS, Windows): numpy's `__cpu_features__` names the same extensions."""
    def no_cpuinfo(self, *args, **kwargs):
        raise FileNotFoundError(self)

    monkeypatch.setattr(st.Path, "read_text", no_cpuinfo)
    assert st.cpu_simd(features={"AVX2": True, "AVX512F": True, "SSE2": True}) == "AVX-512"
    assert st.cpu_simd(features={"AVX2": True, "AVX512F": False}) == "AVX2"
    assert st.cpu_simd(features={"ASIMD": True, "SVE": False}) == "NEON"
    assert st.cpu_simd(features={"AVX": True}) == ""
    from numpy._core._multiarray_umath import __cpu_features__

    assert st.cpu_simd() == st.cpu_simd(features=__cpu_features__)  # this numpy's detection by default
    if st.Path("/proc/cpuinfo").exists():
        monkeypatch.undo()
        assert st.cpu_simd() == st.cpu_simd(features=__cpu_features__)  # both sources agree on this host


def test_git_state_counts_new_files_in_the_code_folders_as_changes(tmp_path):
    import subprocess

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    git("init", "-q")
    (tmp_path / "suite").mkdir()
    (tmp_path / "suite" / "a.py").write_text("x = 1\n")
    git("add", ".")
    git("commit", "-q", "-m", "one")
    state = st.git_state(tmp_path)
    assert len(state["commit"]) == 40 and state["dirty"] is False
    (tmp_path / "notes.txt").write_text("not code\n")  # untracked, outside the code folders
    assert st.git_state(tmp_path)["dirty"] is False
    (tmp_path / "baselines").mkdir()
    (tmp_path / "baselines" / "new_placer.py").write_text("y = 2\n")  # a new placer, not yet added
    assert st.git_state(tmp_path)["dirty"] is True
    (tmp_path / "baselines" / "new_placer.py").unlink()
    (tmp_path / "suite" / "a.py").write_text("x = 2\n")  # a changed tracked file
    assert st.git_state(tmp_path)["dirty"] is True


def test_an_installed_copy_inside_another_git_repository_is_outside_git(tmp_path):
    """A wheel installed into a virtual environment kept inside a user's own repository: the folder above
    its `suite` package is site-packages, and git there answers with the user's repository, whose commit and
    changes are not placebench's code."""
    import subprocess

    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "app.py").write_text("x = 1\n")
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "one"],
                   cwd=tmp_path, check=True)
    site = tmp_path / ".venv" / "lib" / "python3.11" / "site-packages"
    (site / "suite").mkdir(parents=True)
    assert st.git_state(site) == {"commit": None, "dirty": None}
    assert len(st.git_state(tmp_path)["commit"]) == 40  # the repository's own top is a checkout


# -- bad stores: clear errors naming the file and field, nothing written ---------------------------------------
def test_a_non_empty_directory_that_is_not_a_store_is_refused_before_anything_is_written(tmp_path):
    user = tmp_path / "user"
    user.mkdir()
    (user / "results.csv").write_text("my own results\n")
    with pytest.raises(StoreError, match=r"user: not empty and not a placebench store .*new or empty directory"):
        Store(user)
    assert [p.name for p in user.iterdir()] == ["results.csv"]
    assert (user / "results.csv").read_text() == "my own results\n"
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "manifest.json").write_text('{"format": "something else"}')
    with pytest.raises(StoreError, match="not a placebench store"):
        Store(foreign)
    assert [p.name for p in foreign.iterdir()] == ["manifest.json"]
    (tmp_path / "empty").mkdir()
    for fine in (tmp_path / "empty", tmp_path / "missing" / "run"):
        assert Store(fine).cells_dir.is_dir()
    store = Store(tmp_path / "store")  # a store with cells/, or with only its manifest, is reopened
    store.write_cell(_record("abc"))
    store.compact()
    assert Store(tmp_path / "store").cell_ids() == {"abc"}
    only_manifest = tmp_path / "only_manifest"
    only_manifest.mkdir()
    (only_manifest / "manifest.json").write_text(json.dumps({"format": "placebench.store", "runs": []}))
    assert Store(only_manifest).cells_dir.is_dir()


def test_run_into_a_users_directory_is_one_line_and_keeps_the_files(capsys, tiny_files, write_spec, tmp_path):
    from suite.cli import main

    spec = write_spec(workloads=[str(tiny_files["diamond"])], clusters=[str(tiny_files["cluster"])],
                      placers=["single_cpu"])
    user = tmp_path / "user"
    user.mkdir()
    (user / "results.csv").write_text("my own results\n")
    code = main(["run", str(spec), "--out", str(user), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("placebench: error: ") and err.count("\n") == 1, err
    assert "not a placebench store" in err
    assert [p.name for p in user.iterdir()] == ["results.csv"]
    assert (user / "results.csv").read_text() == "my own results\n"


@pytest.mark.parametrize(
    "change, message",
    [
        ({"seed": "zero"}, r'seed must be a 64-bit integer, got "zero"'),
        ({"seed": 0.5}, "seed must be a 64-bit integer, got 0.5"),
        ({"seed": True}, "seed must be a 64-bit integer, got true"),
        ({"seed": 2**64}, "seed must be a 64-bit integer"),
        ({"seed": 2**63}, "seed must be a 64-bit integer"),  # one past int64's largest
        ({"seed": -(2**63) - 1}, "seed must be a 64-bit integer"),
        ({"cluster": None}, "cluster must be a non-empty string, got null"),
        ({"placer": 3}, "placer must be a non-empty string, got 3"),
        ({"workload": ""}, 'workload must be a non-empty string, got ""'),
        ({"workload": ["w"]}, "workload must be a non-empty string, got a list"),
        ({"status": "fine"}, r'status must be one of ok, oom, invalid, timeout, error, skipped, got "fine"'),
        ({"step_time_s": "1.0"}, r'step_time_s must be null or a finite number >= 0, got "1.0"'),
        ({"step_time_s": -1.0}, "step_time_s must be null or a finite number >= 0, got -1.0"),
        ({"step_time_s": float("nan")}, "step_time_s must be null or a finite number >= 0, got NaN"),
        ({"step_time_s": False}, "step_time_s must be null or a finite number >= 0, got false"),
        ({"status": None, "seed": 1}, "status must be one of"),
        ({"status": "ok", "step_time_s": None}, "status ok needs a step_time_s"),
        ({"cell_id": 7}, "cell_id must be a non-empty string, got 7"),
        # the other times and counts: a NaN, a negative or a text is refused too (they were read unchecked, and
        # a NaN budget made every cell of a comparison "not comparable")
        ({"budget_seconds": float("nan")}, "budget_seconds must be null or a finite number >= 0, got NaN"),
        ({"step_time_max_s": -0.5}, "step_time_max_s must be null or a finite number >= 0, got -0.5"),
        ({"search_wall_time_s": float("inf")}, "search_wall_time_s must be null or a finite number >= 0, got Infinity"),
        ({"budget_seconds": 10**400}, "budget_seconds must be null or a finite number >= 0, got an integer of "
                                        "about 401 digits"),  # too large for a float
        ({"evaluations": 2.5}, r"evaluations must be null or a whole number >= 0 \(64-bit\), got 2.5"),
        ({"bytes_transferred": -1}, r"bytes_transferred must be null or a whole number >= 0 \(64-bit\), got -1"),
        ({"budget_evaluations": True}, r"budget_evaluations must be null or a whole number >= 0 \(64-bit\), got true"),
        # above int64: the results table could not hold it, and rebuilding it failed with a bare OverflowError
        ({"bytes_transferred": 2**64}, r"bytes_transferred must be null or a whole number >= 0 \(64-bit\)"),
        ({"samples": 2**63}, r"samples must be null or a whole number at least 1 for status ok \(64-bit\)"),
        # JSON text that commands parse (run --json, paper): a bad one was a JSONDecodeError traceback there
        ({"peak_memory_bytes": "{bad"}, r'peak_memory_bytes must be empty or the JSON text of an object, got "\{bad"'),
        ({"peak_memory_bytes": "[1]"}, r'peak_memory_bytes must be empty or the JSON text of an object, got "\[1\]"'),
        ({"params": "null"}, r'params must be empty or the JSON text of an object, got "null"'),
    ],
)
def test_a_malformed_cell_is_an_error_naming_the_file_and_field(tmp_path, change, message):
    s = Store(tmp_path)
    s.write_cell(_record("good"))
    path = s.cell_path("bad")
    path.write_text(json.dumps({"format": "placebench.cell", **_record("bad"), **change}))
    with pytest.raises(StoreError, match=r"bad\.json: " + message):
        s.read_cell("bad")
    with pytest.raises(StoreError, match=r"bad\.json: " + message):
        s.rows()


def test_json_text_columns_may_be_empty_and_a_bad_one_in_a_csv_table_is_named(tmp_path):
    s = Store(tmp_path / "s")
    s.write_cell(_record("a1", peak_memory_bytes="", params=""))  # a failed placer's row has neither
    s.write_cell(_record("a2", seed=1, peak_memory_bytes=None))
    assert [(r["peak_memory_bytes"], r["params"]) for r in s.rows()] == [("", ""), ("", "{}")]
    st.write_table([_record("a1", params="{'a': 1}")], tmp_path / "x.csv")
    with pytest.raises(StoreError, match=r"""x\.csv: c / w / p / seed 0: params must be empty or the JSON text of an """
                                         r"""object, got "\{'a': 1\}"$"""):
        st.open_rows(tmp_path / "x.csv")


def test_the_extreme_64_bit_seeds_are_accepted():
    assert row_problem({**_record("x"), "seed": 2**63 - 1}) is None
    assert row_problem({**_record("x"), "seed": -(2**63)}) is None


@pytest.mark.parametrize("field", ["cell_id", "workload", "cluster", "placer", "seed", "status"])
def test_a_cell_without_a_required_field_is_an_error(tmp_path, field):
    s = Store(tmp_path)
    record = {"format": "placebench.cell", **_record("bad")}
    del record[field]
    s.cell_path("bad").write_text(json.dumps(record))
    with pytest.raises(StoreError, match=rf"bad\.json: cell file is missing field\(s\) {field} \(a damaged cell: move "
                                         rf"it out of {s.cells_dir} and run the spec again to redo that cell\)$"):
        s.rows()


def test_a_failed_cell_needs_no_step_time(tmp_path):
    s = Store(tmp_path)
    record = _record("x", status="timeout")
    del record["step_time_s"]
    s.write_cell(record)
    assert s.rows()[0]["step_time_s"] is None


def test_a_cell_stored_under_another_name_is_an_error(tmp_path):
    s = Store(tmp_path)
    s.write_cell(_record("abc")).rename(s.cells_dir / "other.json")
    with pytest.raises(StoreError, match=r"other\.json: holds cell_id \"abc\", not the one of its file name"):
        s.rows()
    with pytest.raises(StoreError, match=r"other\.json: holds cell_id"):
        s.read_cell("other")


def test_table_of_a_store_with_a_malformed_cell_is_one_line(capsys, tmp_path):
    from suite.cli import main

    s = Store(tmp_path / "store")
    s.write_cell(_record("abc", seed="zero"))
    for command in (["table", str(s.root)], ["leaderboard", str(s.root), "--out", str(tmp_path / "lb")]):
        code = main(command)
        err = capsys.readouterr().err
        assert code == 2 and err.startswith("placebench: error: ") and err.count("\n") == 1, err
        assert "abc.json: seed must be a 64-bit integer" in err


@pytest.mark.parametrize(
    "change, message",
    [
        ({"runs": {}}, "runs must be a list of objects, got an object"),
        ({"runs": None}, "runs must be a list of objects, got null"),
        ({"runs": ["r1"]}, r'runs\[0\] must be an object, got "r1"'),
        ({"runs": [{"run_id": "r1"}, {"git": "abc"}]}, r'runs\[1\]\.git must be an object, got "abc"'),
        ({"runs": [{"packages": ["numpy"]}]}, r"runs\[0\]\.packages must be an object, got a list"),
        ({"runs": [{"machine": 3}]}, r"runs\[0\]\.machine must be an object, got 3"),
        ({"runs": [{"numerics": ["x"]}]}, r"runs\[0\]\.numerics must be an object, got a list"),
        ({"runs": [{"run_id": ["r1"]}]}, r"runs\[0\]\.run_id must be a string, got a list"),
        ({"runs": [{"machine": {"simd": ["AVX2"]}}]}, r"runs\[0\]\.machine\.simd must be a string, got a list"),
        ({"runs": [{"complete": "no"}]}, r'runs\[0\]\.complete must be true or false, got "no"'),
        ({"methodologies": []}, "methodologies must be an object, got a list"),
        ({"workloads": []}, "workloads must be an object, got a list"),
        ({"clusters": "tiny"}, r'clusters must be an object, got "tiny"'),
        ({"specs": []}, "specs must be an object, got a list"),
        ({"placers": []}, "placers must be an object, got a list"),
        ({"methodologies": {"placebench-methodology-v1": 3}}, r'methodologies\["placebench-methodology-v1"\] must be '
                                                              "an object, got 3"),
        ({"specs": {"quick": ["x"]}}, r'specs\["quick"\] must be an object, got a list'),
        ({"workloads": {"diamond": "sha256:0"}}, r'workloads\["diamond"\] must be an object, got "sha256:0"'),
        ({"clusters": {"tiny": None}}, r'clusters\["tiny"\] must be an object, got null'),
        ({"placers": {"p": "random"}}, r'placers\["p"\] must be an object with name and params_hash, got "random"'),
        ({"placers": {"p": {"name": "random"}}}, r'placers\["p"\] must be an object with name and params_hash'),
    ],
)
def test_a_malformed_manifest_is_an_error_naming_the_field(tmp_path, change, message):
    s = Store(tmp_path)
    s.manifest_path.write_text(json.dumps({"format": "placebench.store", "schema_version": 1, "runs": [], **change}))
    with pytest.raises(StoreError, match=r"manifest\.json: " + message):
        s.manifest()


def test_a_manifest_as_a_run_writes_it_is_accepted(tmp_path):
    s = Store(tmp_path)
    run = {"run_id": "r1", "git": {"commit": None, "dirty": None}, "packages": {"numpy": "2"}, "machine": {}}
    manifest = {"format": "placebench.store", "schema_version": 1, "runs": [run], "specs": {}, "methodologies": {},
                "workloads": {}, "clusters": {}, "placers": {"p": {"name": None, "params": None, "params_hash": None}}}
    s.write_manifest(manifest)
    assert s.manifest() == manifest


def test_a_text_field_of_another_type_is_an_error(tmp_path):
    import datetime

    import pyarrow as pa
    import pyarrow.parquet as pq

    s = Store(tmp_path / "s")
    s.write_cell(_record("a1"))
    table = st.rows_to_table(s.rows())  # a Parquet file keeps its own column types
    for column, values, shown in (("evaluator", pa.array([3]), "3"), ("message", pa.array([[1, 2]]), "a list"),
                                  ("message", pa.array([b"x"]), "b'x'"),
                                  ("step_time_s", pa.array([datetime.date(2020, 1, 1)]), "datetime.date(2020, 1, 1)")):
        i = table.schema.get_field_index(column)
        pq.write_table(table.set_column(i, column, values), tmp_path / "x.parquet")
        with pytest.raises(StoreError, match=rf"x\.parquet: c / w / p / seed 0: {column} must be null or a .*, "
                                             rf"got {re.escape(shown)}$"):
            st.open_rows(tmp_path / "x.parquet")
    i = table.schema.get_field_index("workload")  # categories (pandas): strings
    pq.write_table(table.set_column(i, "workload", table.column("workload").dictionary_encode()), tmp_path / "x.parquet")
    assert st.open_rows(tmp_path / "x.parquet") == s.rows()
    for field, value in (("run_id", [1]), ("params", {"a": 1}), ("workload_hash", 3)):  # cell files: JSON of any type
        s.write_cell(_record("a1", **{field: value}))
        with pytest.raises(StoreError, match=rf"a1\.json: {field} must be null or a string, got "):
            s.rows()


def test_an_unknown_or_repeated_column_is_an_error_not_dropped(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    s = Store(tmp_path / "s")
    s.write_cell(_record("a1", oom_devices="gpu:0"))
    _, csv = s.compact()
    header, rest = csv.read_text().split("\n", 1)
    path = tmp_path / "x.csv"
    path.write_text(header.replace('"oom_devices"', '"oom_device"') + "\n" + rest)  # misspelt: not read as ""
    with pytest.raises(StoreError, match=r"x\.csv: not a placebench results table: unknown column\(s\) oom_device$"):
        st.open_rows(path)
    path.write_text(header.replace('"message"', '"oom_devices"') + "\n" + rest)
    with pytest.raises(StoreError, match=r"x\.csv: not a placebench results table: column oom_devices appears twice"):
        st.open_rows(path)
    table = st.rows_to_table(s.rows())  # Arrow refuses it, with the schema on more lines: one line is kept
    pq.write_table(pa.Table.from_arrays([*table.columns, table.column("seed")], names=[*table.column_names, "seed"]),
                   tmp_path / "x.parquet")
    with pytest.raises(StoreError, match=r"x\.parquet: not a placebench results table: .*seed") as exc:
        st.open_rows(tmp_path / "x.parquet")
    assert "\n" not in str(exc.value)


def test_a_csv_table_with_a_non_utf8_header_is_an_error(tmp_path):
    path = tmp_path / "x.csv"
    path.write_bytes(b"cell_id,w\xffrkload\n1,2\n")
    with pytest.raises(StoreError, match=r"x\.csv: not a placebench results table: a column name is not valid UTF-8"):
        st.open_rows(path)
    path.write_bytes("cell_id,workload,cluster,placer,seed,status,step_time_s\n1,w\xff,c,p,0,ok,1\n".encode("latin-1"))
    with pytest.raises(StoreError, match=r"x\.csv: not a placebench results table"):
        st.open_rows(path)


def test_a_store_emptied_by_a_shell_glob_is_reusable(tmp_path):
    """`rm -rf store/*` leaves the dot files (.lock, temporary files): the directory counts as empty."""
    with Store(tmp_path).writing():
        pass
    (tmp_path / "cells").rmdir()
    (tmp_path / ".results.csv.abc.tmp").write_text("partial")
    with Store(tmp_path).writing():
        assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", "cells"]  # the temporary file is gone


def test_in_use_says_whether_a_run_holds_the_store(tmp_path):
    assert not st.in_use(tmp_path)  # never held: no lock file
    with Store(tmp_path).writing():
        assert st.in_use(tmp_path)
    assert not st.in_use(tmp_path)


def test_a_run_on_a_store_whose_methodology_entry_is_malformed_is_refused(capsys, tiny_files, write_spec, tmp_path):
    """The manifest's methodology is what tells a stored cell was measured under the same rules: a run may not
    reuse cells when that entry cannot be read (it would skip the check), nor drop what is stored."""
    from suite.cli import main

    spec = write_spec(workloads=[str(tiny_files["diamond"])], clusters=[str(tiny_files["cluster"])],
                      placers=["single_cpu"])
    store = tmp_path / "store"
    assert main(["run", str(spec), "--out", str(store), "--quiet"]) == 0
    manifest = json.loads((store / "manifest.json").read_text())
    manifest["methodologies"]["placebench-methodology-v1"] = 3
    (store / "manifest.json").write_text(json.dumps(manifest))
    before = sorted(p.name for p in (store / "cells").iterdir())
    capsys.readouterr()
    assert main(["run", str(spec), "--out", str(store), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err == (f"placebench: error: {store / 'manifest.json'}: methodologies[\"placebench-methodology-v1\"] must "
                   "be an object, got 3\n")
    assert sorted(p.name for p in (store / "cells").iterdir()) == before
    assert json.loads((store / "manifest.json").read_text()) == manifest


@pytest.mark.parametrize("version", [2, 0, "1", True, None])
def test_a_cell_or_manifest_of_another_store_schema_is_refused_not_read(tmp_path, version):
    s = Store(tmp_path)
    path = s.write_cell(_record("abc"))
    data = json.loads(path.read_text())
    assert data["schema_version"] == 1
    path.write_text(json.dumps({**data, "schema_version": version}))
    shown = json.dumps(version)
    with pytest.raises(StoreError, match=rf"abc\.json: a cell of store schema_version {shown}; this placebench "
                                         r"reads 1: read or extend the store with the placebench that wrote it$"):
        s.rows()
    path.write_text(json.dumps({k: v for k, v in data.items() if k != "schema_version"}))
    assert s.rows()[0]["cell_id"] == "abc"  # a file that does not say is of this schema
    s.manifest_path.write_text(json.dumps({"format": "placebench.store", "schema_version": version, "runs": []}))
    with pytest.raises(StoreError, match=rf"manifest\.json: a store manifest of store schema_version {shown}"):
        s.manifest()


def test_a_csv_table_with_every_field_quoted_reads_as_written(tmp_path):
    """A spreadsheet or csv.QUOTE_ALL writes the empty numbers of a failed row as "" instead of nothing: they
    are null as unquoted empty fields are; a quoted "" text stays "" (never null)."""
    import csv

    failed = _record("b2", seed=1, status="oom", step_time_s=None, max_peak_memory_bytes=None, evaluations=None,
                     message="", peak_memory_bytes="")
    st.write_table([_record("a1"), failed], tmp_path / "x.csv")
    fields = list(csv.reader((tmp_path / "x.csv").open(newline="")))
    with (tmp_path / "quoted.csv").open("w", newline="") as f:
        csv.writer(f, quoting=csv.QUOTE_ALL).writerows(fields)
    assert '"oom","","",' in (tmp_path / "quoted.csv").read_text()
    rows = st.open_rows(tmp_path / "quoted.csv")
    assert rows == st.open_rows(tmp_path / "x.csv")
    assert rows[1]["step_time_s"] is None and rows[1]["evaluations"] is None and rows[1]["message"] == ""


def test_a_csv_value_that_is_no_number_is_named_by_line_and_column(tmp_path):
    st.write_table([_record("a1"), _record("b2", seed=1, status="error", step_time_s=None)], tmp_path / "x.csv")
    text = (tmp_path / "x.csv").read_text()
    (tmp_path / "bad.csv").write_text(text.replace('"error","",,', '"error","","n/a",'))
    with pytest.raises(StoreError, match=r'bad\.csv: line 3 \(c / w / p / seed 1\): step_time_s must be a number or '
                                         r'empty, got "n/a"$'):
        st.open_rows(tmp_path / "bad.csv")
    (tmp_path / "bad.csv").write_text(text.replace(',1,"m1"', ',1.5,"m1"'))
    with pytest.raises(StoreError, match=r'bad\.csv: line 3 \(c / w / p / seed 1\.5\): seed must be a 64-bit whole '
                                         r'number, got "1\.5"$'):
        st.open_rows(tmp_path / "bad.csv")


def test_a_bad_number_beside_a_long_message_is_a_store_error(tmp_path):
    """A CSV table with a bad number, and a field longer than the csv module's limit (131072 characters: a long
    error message) in the rows that the bad value's line is looked up in, raised csv's `_csv.Error: field larger
    than field limit`, a traceback of `placebench table`. Now the file's StoreError with Arrow's message."""
    s = Store(tmp_path / "store")
    s.write_cell(_record("a1", status="error", step_time_s=None, message="x" * 200_000))
    s.write_cell(_record("a2", seed=1))
    _, path = s.compact()
    text = path.read_text()
    assert text.count("0.125") == 1
    path.write_text(text.replace("0.125", "abc"))
    with pytest.raises(StoreError, match=r"results\.csv: .*'abc'"):
        st.read_table(path)


def test_a_bad_number_holding_a_newline_is_named_with_its_row(tmp_path):
    """A bad number that holds a newline (a quoted CSV field) was reported from the first line of Arrow's message
    only, "not a placebench results table: ... invalid value 'x", without its row. Now as any other bad value:
    the line its row starts on (after a row whose message spans two lines), the row and the value."""
    s = Store(tmp_path / "store")
    s.write_cell(_record("a1", status="error", step_time_s=None, message="boom\nline 2"))
    s.write_cell(_record("a2", seed=1))
    _, path = s.compact()
    text = path.read_text()
    assert text.count("0.125") == 1 and len(text.splitlines()) == 4  # header, a1 on two lines, a2
    path.write_text(text.replace("0.125", '"x\ny"'))
    with pytest.raises(StoreError) as err:
        st.read_table(path)
    assert str(err.value) == f'{path}: line 4 (c / w / p / seed 1): step_time_s must be a number or empty, got "x\\ny"'


def test_a_folder_of_plain_files_under_cells_is_not_a_store(tmp_path):
    """A cells/ folder alone made any folder a store: `profile --out X/cells` left X looking like one, so a run
    into X was let in, failed on the first profile as "a damaged cell" and left X/.lock behind. One rule
    (`is_store_dir`) for every command: the store's manifest, or a cells/ folder that is empty (a store just
    made), holds a cell file, or has a run's .lock beside it."""
    x = tmp_path / "x"
    (x / "cells").mkdir(parents=True)
    assert st.is_store_dir(x)  # empty cells/: a store just made
    (x / "cells" / "rnnlm__cpu.json").write_text(json.dumps({"format": "placebench.profile"}))
    assert not st.is_store_dir(x)
    with pytest.raises(StoreError, match="not empty and not a placebench store"):
        Store(x)
    assert not (x / ".lock").exists()
    (x / ".lock").touch()  # a run held it
    assert st.is_store_dir(x)
    s = Store(tmp_path / "s")
    s.write_cell(_record("a1"))
    assert st.is_store_dir(s.root) and not st.is_store_dir(s.root / "cells")
    assert not st.is_store_dir(tmp_path / ("y" * 300))  # a name too long: not a store, no OSError
