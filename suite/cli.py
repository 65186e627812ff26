"""The `placebench` command line.

    placebench run [SPEC] [--out DIR] [--jobs N] [--json]     run a suite (default: quick) and print the table
    placebench evaluate WORKLOAD --cluster C --placer P       run one cell
    placebench table STORE [--format F]                       render a results store
    placebench leaderboard [STORE] [--out results]            write leaderboard.md / .csv / .png (STORE: runs/full)
    placebench compare BASE NEW [--factor 1.05]               cell-by-cell changes; exit 1 on regressions (CI)
    placebench list workloads|clusters|placers|specs|papers   what is available
    placebench show WORKLOAD | --cluster C                    one workload's statistics, or a cluster's numbers
    placebench profile WORKLOAD --device cpu                  per-op times on a device of this machine
    placebench fidelity WORKLOAD [--cluster FILE]             simulator vs real execution (table + PNG)
    placebench paper ID [--no-run]                            a paper's table next to placebench's same cells

The README's "Commands" lists every option.

Every command takes --json for machine-readable output. Bad input (a `PlacebenchError`) gives one line
`placebench: error: ...` on stderr and exit code 2, never a traceback; stored results are never lost.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import math
import os
import shlex
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, NoReturn, TextIO

from suite.errors import PlacebenchError
from suite.textfile import human_bytes

EXIT_NOT_OK = 1  # evaluate: the cell's status is not ok (the row is still printed and saved)
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM, as a shell reports it
EXIT_HANGUP = 129  # 128 + SIGHUP


class UsageError(PlacebenchError):
    """A malformed command-line value."""


# -- output helpers -----------------------------------------------------------------------------------------
def _say(text: str) -> None:
    """A line on stderr (progress, warnings, errors); a reader that left does not stop the command."""
    _write(sys.stderr, text + "\n")


def _tty(stream: Any) -> bool:
    return hasattr(stream, "isatty") and stream.isatty()


def _row_objects(record: dict[str, Any]) -> dict[str, Any]:
    """A row with its JSON text columns (stored as text in flat tables) as objects, as --json shows them."""
    from suite.store import JSON_TEXT_COLUMNS

    out = dict(record)
    for k in JSON_TEXT_COLUMNS:
        if isinstance(out.get(k), str):
            out[k] = json.loads(out[k]) if out[k] else None  # empty: the row has none (a failed placer's)
    return out


def _print_json(data: Any) -> None:
    from suite.store import _json_safe

    _write(sys.stdout, json.dumps(_json_safe(data), indent=1, sort_keys=True) + "\n")


def _print_tables(tables: Sequence[Any]) -> None:
    """Rich tables on a terminal wide enough for them, aligned plain text otherwise (never truncated)."""
    from suite import report

    texts = [report.to_text(t) for t in tables]
    if _tty(sys.stdout):
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table as RichTable

        console = Console()
        # rich draws borders and padding: about 3 more characters per column than the plain table
        needed = max(max(len(line) for line in text.splitlines()) + 3 * len(t.columns) for t, text in zip(tables, texts, strict=True))
    if _tty(sys.stdout) and needed <= console.width:
        for t in tables:
            rt = RichTable(title=escape(t.title), title_justify="left")
            for col, align in zip(t.columns, t.align, strict=True):
                rt.add_column(escape(col), justify="left" if align == "l" else "right")
            for row, raw in zip(t.rows, t.raw, strict=True):
                # labels and messages are text, not rich markup: "ls[b=8]" or a path with "[/x]" in it
                styled = [
                    f"[red]{escape(c)}[/red]" if isinstance(v, str) and v in ("oom", "invalid", "timeout", "error")
                    else escape(c)
                    for c, v in zip(row, raw, strict=True)
                ]
                rt.add_row(*styled)
            console.print(rt)
    else:
        print("\n\n".join(texts))


def _parse_params(texts: Sequence[str]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for text in texts:
        key, value = _parse_param(text)
        if key in params:
            raise UsageError(f"--param {key} is given twice")
        params[key] = value
    return params


def _parse_param(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise UsageError(f"--param {text!r}: expected KEY=VALUE")
    return key, option_value(value, f"--param {key}")


def option_value(text: str, where: str) -> Any:
    """The VALUE of a KEY=VALUE option: JSON, or a bare word as a string. JSON that Python cannot hold (an
    integer of thousands of digits, nesting too deep) or with a key given twice is an error, not a string."""
    from suite.textfile import parse_json

    try:
        json.loads(text)
    except json.JSONDecodeError:
        return text  # a bare word is a string
    except (ValueError, RecursionError):
        pass  # parse_json names the problem
    return parse_json(text, where, UsageError)


# -- run ----------------------------------------------------------------------------------------------------
class _Progress:
    """A rich progress bar on a terminal; one line per finished cell otherwise (unless quiet). The notices
    that stored cells run again are warnings: only `quiet_notices` (--quiet, not --json) hides them."""

    def __init__(self, quiet: bool, quiet_notices: bool | None = None):
        self.quiet = quiet
        self.quiet_notices = quiet if quiet_notices is None else quiet_notices
        self.bar = None
        self.total = 0
        self.done = 0

    def plan(self, total: int, reused: int, stale: int, stale_kernels: int = 0) -> None:
        self.total, self.done = total, reused
        if not self.quiet_notices and stale:
            _say(f"placebench: {stale} stored cell(s) were made by other code of their placer; running them again")
        if not self.quiet_notices and stale_kernels:
            _say(f"placebench: {stale_kernels} stored cell(s) were made with other CPU math kernels (another kind "
                 f"of host, or other math settings); running them again")
        if self.quiet:
            return
        if reused:
            _say(f"placebench: {reused} of {total} cells already stored; running {total - reused}")
        if _tty(sys.stderr) and total > reused:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(
                TextColumn("[bold]placebench"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.description}"),
                console=Console(stderr=True),
                transient=False,
            )
            self.bar.start()
            self.task = self.bar.add_task("", total=total, completed=reused)

    def cell(self, record: dict[str, Any]) -> None:
        self.done += 1
        if self.quiet:
            return
        from suite.report import format_seconds

        t = record.get("step_time_s")
        value = format_seconds(t) if record["status"] == "ok" and t is not None else record["status"]
        what = f"{record['workload']} / {record['cluster']} / {record['placer']} / seed {record['seed']}: {value}"
        if self.bar is not None:
            self.bar.update(self.task, advance=1, description=what)
        else:
            wall = record.get("cell_wall_time_s")
            took = f" ({wall:.1f} s)" if isinstance(wall, float) else ""
            _say(f"[{self.done:>{len(str(self.total))}}/{self.total}] {what}{took}")

    def close(self) -> None:
        if self.bar is not None:
            bar, self.bar = self.bar, None
            try:
                bar.stop()
            except OSError as exc:  # its terminal hung up (EIO): the run's own outcome (a SIGHUP's) stands
                if exc.errno != errno.EIO:
                    raise


def cmd_run(args: argparse.Namespace) -> int:
    from suite import report, runner
    from suite.store import is_store_dir, usable_cpus

    spec = runner.load_spec(args.spec)
    if args.out is not None and not args.out.strip():
        raise UsageError("--out is empty: give a store directory, or leave --out out for runs/<spec name>")
    out = Path(args.out) if args.out is not None else Path("runs") / spec.name
    # a store is --out's to run into, whatever its name; a folder inside one would become a store in a store
    if not is_store_dir(out):
        refuse_store_dir(out, "--out", "a new store", is_file=True)
    check_output_dir(out, "--out")
    from suite.backends import REAL_BACKENDS

    jobs = args.jobs if args.jobs is not None else 1 if spec.evaluator in REAL_BACKENDS else usable_cpus()
    if jobs < 1:
        raise UsageError(f"--jobs {jobs}: must be at least 1")
    if args.reference and args.reference not in (labels := runner.placer_labels(spec)):
        raise UsageError(f"--reference {args.reference!r} is not a placer of spec {spec.name!r}: {', '.join(labels)}")
    progress = _Progress(args.quiet or args.json, args.quiet)
    try:
        result = runner.run(
            spec, out, jobs=jobs, force=args.force, retry_failed=args.retry_failed,
            on_plan=progress.plan, on_done=progress.cell,
        )
    finally:
        progress.close()
    res = report.Results.from_rows(result.rows)
    if args.json:
        _print_json(
            {
                "spec": spec.name,
                "store": str(out),
                "cells": len(result.rows),
                "ran": result.ran,
                "reused": result.reused,
                "wall_time_s": result.wall_time_s,
                "rows": [_row_objects(r) for r in result.rows],
                "report": report.as_json(res, args.reference) if res.cells else None,
            }
        )
        return 0
    if res.cells:
        _print_tables([t for _, ts in report.tables(res, args.reference) for t in ts])
    _say(f"\n{len(result.rows)} cells ({result.ran} run now, {result.reused} from the store) in "
         f"{result.wall_time_s:.1f} s; results in {out}/ (placebench table {shlex.quote(str(out))})")
    return 0


def cmd_paper(args: argparse.Namespace) -> int:
    """Run the cells a paper's table needs (unless --no-run), then write and print the comparison."""
    from suite import paper, report, runner
    from suite.store import open_rows, usable_cpus

    table = paper.load_paper(args.paper)
    if args.no_run and args.jobs is not None:
        raise UsageError("--jobs applies to running the cells, not to --no-run")
    store = Path(args.store) if args.store else Path("runs") / "papers" / table.id
    _refuse_inside_store(store, args.out, "--out")
    check_output_dir(args.out, "--out")
    if args.no_run:
        if not store.exists():
            raise UsageError(f"--no-run: no results store at {store}; leave --no-run out to run the cells")
    else:
        jobs = args.jobs if args.jobs is not None else usable_cpus()
        progress = _Progress(args.quiet or args.json, args.quiet)
        try:
            runner.run(paper.spec_for(table), store, jobs=jobs, on_plan=progress.plan, on_done=progress.cell,
                       select=paper.select_for(table))
        finally:
            progress.close()
    rows = open_rows(store)
    runs = _manifest_runs(store)  # also for a store's own results table given as --store: its rows are the store's
    comp = paper.Comparison.from_rows(table, rows)
    if args.no_run and not comp.rows:  # a report of "not run" cells only would replace the last one for nothing
        raise UsageError(f"--no-run: {store} holds no result of {table.id}'s cells; leave --no-run out to run them")
    setup = comp.setup_warning()
    if setup:
        _say(f"placebench: warning: {setup}")
    warnings = [w for w in (_warn_if_incomplete(store, runs, rows), _warn_if_table_lags(str(store), len(rows)),
                            _warn_if_mixed_code(runs, comp.rows), setup) if w]
    provenance = report.provenance(report.runs_that_made(runs, comp.rows))
    written = [str(p) for p in paper.write_paper(comp, args.out, source=str(store), provenance=provenance,
                                                 note="\n\n".join(f"**Warning: {w}.**" for w in warnings),
                                                 profiles=report.manifest_profiles(store))]
    if args.json:
        _print_json({"paper": table.id, "store": str(store), "written": written,
                     "summary": paper.summary_line(comp),
                     "rows": [dict(zip(t.columns, r, strict=True)) for t in [paper.long_table(comp)] for r in t.raw]})
        return 0
    _print_tables(paper.comparison_tables(comp))
    _say(f"\n{paper.summary_line(comp)}\nwritten: {', '.join(written)}")
    return 0


# -- evaluate -----------------------------------------------------------------------------------------------
def cmd_evaluate(args: argparse.Namespace) -> int:
    from suite import runner

    for flag, value in (("--placement", args.placement), ("--save-placement", args.save_placement),
                        ("--trace", args.trace)):
        if value is not None and not value.strip():
            raise UsageError(f"{flag} is empty: give a file")
    if args.trace is not None:
        if args.save_placement is not None and Path(args.save_placement).resolve() == Path(args.trace).resolve():
            raise UsageError("--trace and --save-placement name the same file")
        _check_output_file(args.trace, "--trace", [args.workload, args.cluster, args.methodology, args.placement or "",
                                                    *args.plugin, *args.profile])
    if args.placement is not None:
        given = [flag for flag, value in (
            ("--save-placement", args.save_placement), ("--param", args.param or None), ("--seed", args.seed),
            ("--max-evaluations", args.max_evaluations), ("--max-seconds", args.max_seconds),
            ("--timeout", args.timeout), ("--plugin", args.plugin or None)) if value is not None]
        if given:
            raise UsageError(f"{given[0]} applies to a placer's search, not to --placement")
        record = runner.measure_placement(args.workload, args.cluster, args.placement, methodology=args.methodology,
                                          simulator_engine=args.engine, profiles=args.profile)
        code = _print_evaluation(record, args.json)
        if args.trace is not None:
            _write_trace(record, args.workload, args.cluster, args.trace, args.profile)
        return code
    if args.save_placement is not None:
        _check_output_file(args.save_placement, "--save-placement",
                           [args.workload, args.cluster, args.methodology, *args.plugin, *args.profile])
    budget = {}
    if args.max_evaluations is not None:
        budget["max_evaluations"] = args.max_evaluations
    if args.max_seconds is not None:
        budget["max_seconds"] = args.max_seconds
    record = runner.evaluate_one(
        args.workload,
        args.cluster,
        args.placer,
        params=_parse_params(args.param),
        seed=args.seed if args.seed is not None else 0,
        methodology=args.methodology,
        budget=budget,
        cell_timeout_s=args.timeout,
        plugins=args.plugin,
        simulator_engine=args.engine,
        profiles=args.profile,
    )
    code = _print_evaluation(record, args.json)  # shown before saving: a failed save does not hide the result
    if args.save_placement is not None:
        _save_placement(record, args.workload, args.cluster, args.save_placement)
    if args.trace is not None:
        _write_trace(record, args.workload, args.cluster, args.trace, args.profile)
    return code


def _write_trace(record: dict[str, Any], workload: str, cluster: str, path: str, profiles: Sequence[str] = ()) -> None:
    """The timeline of the cell's final placement (Trace Event Format) for Perfetto or chrome://tracing."""
    from suite import load_cluster, load_workload
    from suite.costmodel import load_profile
    from suite.simulator.trace import write_chrome_trace

    if record.get("placement") is None:
        _say(f"placebench: warning: no placement to trace in {path}: the cell's status is {record['status']}")
        return
    row = _row_objects(record)  # params as an object, as --json shows them
    meta = {k: row[k] for k in ("placer", "seed", "params", "placement_hash") if row.get(k) is not None}
    profs = [load_profile(p) for p in profiles]  # the evaluation checked that each is this workload's
    evaluator = str(record.get("evaluator") or "")
    if evaluator.startswith("simulator"):
        meta["evaluator"] = evaluator
    else:  # measured by a real backend: the timeline (and its step time) is the simulator's, not the run's
        meta.update(evaluator="simulator", cell_evaluator=evaluator, cell_step_time_s=record.get("step_time_s"))
        _say(f"placebench: note: the trace is the simulator's timeline of the placement, not the {evaluator} run "
             f"that measured the cell (its step time is in the trace as cell_step_time_s)")
    write_chrome_trace(path, load_workload(workload), load_cluster(cluster), record["placement"], profiles=profs,
                       metadata=meta)
    _say(f"trace: {path} (open it in https://ui.perfetto.dev or chrome://tracing)")


def check_output_dir(path: str | Path, flag: str) -> None:
    """An output directory may be missing (it is made) but not a file, and it must take files."""
    from suite.store import check_writable

    try:
        check_writable(path, directory=True)
    except OSError as exc:
        raise UsageError(f"{flag}: {exc.strerror}") from None


def refuse_store_dir(path: str | Path, flag: str, what: str, *, is_file: bool = False) -> None:
    """A results store (or its cells/ folder) holds only the store's own files: a profile, placement or report
    written there would be read as a damaged cell, which stops the store's tables, replace its manifest, or
    be mixed with its data. Refused like the other commands' outputs (`_refuse_inside_store`), before any
    work. `path` is a directory, or with `is_file` a file to write."""
    from suite.store import is_store_dir

    target = Path(path).resolve()
    folder = target.parent if is_file else target
    for root in (folder, folder.parent):
        if is_store_dir(root):
            where = "" if root == target else "inside "
            raise UsageError(f"{flag} {path} is {where}the results store {root}: write {what} elsewhere")


def _check_output_file(path: str, flag: str, inputs: Sequence[str]) -> None:
    """An output file must be writable and not one of the command's own input files (checked before any work,
    so that a long search is not lost to a bad path)."""
    from suite.store import check_writable

    target = Path(path).resolve()
    for name in inputs:
        if Path(name).is_file() and Path(name).resolve() == target:
            raise UsageError(f"{flag} {path} is an input of this command")
    refuse_store_dir(path, flag, "it", is_file=True)
    try:
        check_writable(path)
    except OSError as exc:
        raise UsageError(f"{flag}: {exc.strerror}") from None


def _save_placement(record: dict[str, Any], workload: str, cluster: str, path: str) -> None:
    from suite import load_cluster, load_workload
    from suite.placement import save_placement

    if record.get("placement") is None:
        _say(f"placebench: warning: no placement to save in {path}: the cell's status is {record['status']}")
        return
    save_placement(record["placement"], load_workload(workload), load_cluster(cluster), path)


def _print_evaluation(record: dict[str, Any], as_json: bool) -> int:
    """Print the cell's row; the exit code: 0 when its status is ok, EXIT_NOT_OK for any other (a CI step
    that evaluates a placer fails on an OOM, invalid, timed-out, failed or skipped cell). A reader of stdout
    that left (`| head`) changes neither the code nor the files that evaluate writes after printing."""
    from suite.report import format_seconds

    code = 0 if record["status"] == "ok" else EXIT_NOT_OK
    if as_json:
        _print_json(_row_objects(record))
        return code
    status = record["status"]
    lines = [("workload", record["workload"]), ("cluster", record["cluster"])]
    if "placement_file" in record:
        lines.append(("placement", f"from {record['placement_file']}"))
    else:
        lines.append(("placer", f"{record['placer']} (seed {record['seed']})"))
    lines.append(("status", status))
    if status == "ok":
        lines.append(("step time", f"{format_seconds(record['step_time_s'])} (re-measured, {record['samples']} sample(s))"))
    if record.get("message"):
        lines.append(("message", record["message"]))
    if record.get("peak_memory_bytes"):
        peak = json.loads(record["peak_memory_bytes"])
        lines.append(("peak memory", ", ".join(f"{d} {human_bytes(b)}" for d, b in peak.items())))
    if record.get("evaluations") is not None:
        lines.append(("search", f"{record['evaluations']} of {record['budget_evaluations']} evaluations, "
                                f"{record.get('search_wall_time_s') or 0.0:.3f} s"))
    if record.get("placement_hash"):
        lines.append(("placement hash", record["placement_hash"]))
    lines.append(("methodology", f"{record['methodology']}, evaluator {record['evaluator']}"))
    width = max(len(k) for k, _ in lines)
    _write(sys.stdout, "\n".join(f"{k.ljust(width)}  {v}" for k, v in lines) + "\n")
    return code


# -- table and leaderboard ----------------------------------------------------------------------------------
def _text(text: Any) -> str:
    """`str(text)` with each lone surrogate (a path's byte that is not UTF-8, as Python holds it) as its escape
    text, "\\udce9": a report, a chart and a file written as UTF-8 cannot hold it."""
    from suite.store import _text as escaped

    return escaped(str(text))


def _utf8(text: str) -> bytes:
    """A report's text as UTF-8, a path in it that is not UTF-8 with its escapes (`_text`)."""
    return _text(text).encode("utf-8")


def _write(stream: TextIO, text: str) -> None:
    """Write and flush; when the stream's reader has left (`| head`, `2>&1 | head`) or its terminal hung up
    (EIO: a closed window or ssh session), point it at /dev/null instead of failing, so that an exit code that
    gives a verdict (compare's, a stopped run's) still does."""
    try:
        stream.write(text)
        stream.flush()
    except OSError as exc:
        if not isinstance(exc, BrokenPipeError) and exc.errno != errno.EIO:
            raise
        os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())


def _store_runs(store: str | Path) -> list[dict[str, Any]]:
    """The runs recorded in a store's manifest (none for a results table file)."""
    from suite.store import Store

    return (Store(store, create=False).manifest().get("runs") or []) if Path(store).is_dir() else []


def _manifest_runs(store: str | Path) -> list[dict[str, Any]]:
    """The runs in the manifest of the store behind STORE: the store, or the store holding a results table
    file given instead (none for a table file outside a store)."""
    from suite.store import is_store_dir

    root = _store_root(store)
    return _store_runs(root) if root is not None and is_store_dir(root) else []


def _store_methodologies(store: str | Path) -> dict[str, Any]:
    """The methodology definitions (by version) in the manifest of the store behind STORE (none for a results
    table file outside a store)."""
    from suite.store import Store, is_store_dir

    root = _store_root(store)
    if root is None or not is_store_dir(root):
        return {}
    meths = Store(root, create=False).manifest().get("methodologies")
    return dict(meths) if isinstance(meths, dict) else {}


def _warn_if_incomplete(store: str | Path, runs: list[dict[str, Any]], rows: list[dict[str, Any]],
                        side: str = "") -> str:
    """A store where the last run of some spec stopped early makes tables that look final: say so on stderr
    (and return it). Every spec counts, not only the last run's: a later complete run of another spec does
    not fill the gaps. A run killed outright never recorded how many cells it ran: its rows among `rows`
    (the store's) say how many it stored. `side` ("BASE runs/a") starts the text where a command reads two
    stores."""
    from suite.store import in_use

    root = _store_root(store)
    if root is not None and in_use(root):
        text = f"a run is writing {root} now: these rows are what it has stored so far"
        _write(sys.stderr, f"placebench: warning: {text}\n")
        return text
    latest: dict[str, dict[str, Any]] = {}
    for run in runs:
        latest[str(run.get("spec", "?"))] = run
    stopped = [run for run in latest.values() if not run.get("complete", True)]
    if not stopped:
        return ""
    what = "; ".join(f"spec {run.get('spec', '?')}: {_cells_run(run, rows)}" for run in stopped)
    head = f"{side}: " if side else ""
    text = (f"{head}incomplete store: the last run of {len(stopped)} spec(s) stopped before it finished ({what}); "
            f"rerun the same `placebench run` command to complete it")
    _write(sys.stderr, f"placebench: warning: {text}\n")
    return text


def _cells_run(run: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """How many of its cells a stopped run ran, as its manifest entry records it, else (a run killed before
    it could record it) how many of `rows` it made."""
    to_run, planned = run.get("cells_to_run", "?"), run.get("cells_planned", "?")
    if "cells_run" in run:
        return f"{run['cells_run']} of its {to_run} cells to run were run ({planned} planned)"
    known = not rows or any(r.get("run_id") for r in rows)  # no row at all: it stored none
    made = sum(r.get("run_id") == run.get("run_id") for r in rows) if known else "?"
    return (f"{made} of its {to_run} cells to run are in the store ({planned} planned; the run ended without "
            f"recording how many it ran)")


def _code_version(run: dict[str, Any]) -> tuple[str | None, bool]:
    """The code a run was made with: its commit, else outside git the placebench version (None when the
    manifest says neither); and whether the checkout had uncommitted changes."""
    git = run.get("git") or {}
    if git.get("commit"):
        dirty = bool(git.get("dirty"))
        return str(git["commit"])[:12] + (" with uncommitted changes" if dirty else ""), dirty
    version = (run.get("packages") or {}).get("placebench")
    return (f"placebench {version} (no commit recorded)" if version else None), False


def _warn_if_mixed_code(runs: list[dict[str, Any]], rows: list[dict[str, Any]], side: str = "") -> str:
    """Rows of runs made by different code side by side (a run reruns stored cells when their placer's own
    source changes, not when other code does): say so on stderr (and return it). Two runs of a checkout
    with changes count as different code: the changes may differ. `side` ("NEW runs/b") starts the text
    where a command reads two stores."""
    used = {r.get("run_id") for r in rows}
    versions = [_code_version(run) for run in runs if run.get("run_id") in used]
    dirty_runs = sum(dirty for _, dirty in versions)
    labels = list(dict.fromkeys(label for label, _ in versions))
    if len(labels) < 2 and dirty_runs < 2:
        return ""
    code = ", ".join(label or "unknown code" for label in labels)
    head = f"{side}: " if side else ""
    text = (f"{head}mixed code: these rows come from {len(versions)} runs of {code}; a run reruns a stored cell when "
            f"its placer's source changed, not when other code did: rerun the spec(s) that made them with --force "
            f"to use one version")
    _write(sys.stderr, f"placebench: warning: {text}\n")
    return text


def _warn_if_other_kernels(base_runs: list[Any], new_runs: list[Any]) -> str:
    """The runs that made BASE's and NEW's rows picked their CPU math kernels differently: by the CPU's vector
    extension (`store.cpu_simd`, where recorded) or the math libraries' settings
    (`suite.numerics.kernels_label`; pinned runs on different extensions too, while their agreement is not
    measured). Say on stderr (and return) that the learned placers may then differ on the same code and seed."""
    from suite.numerics import run_kernels

    sides = [sorted({run_kernels(run) for run in runs} - {""}) for runs in (base_runs, new_runs)]
    if not (sides[0] and sides[1]) or sides[0] == sides[1]:
        return ""
    pinned = all(label.endswith("math pinned") for label in sides[0] + sides[1])
    text = (f"BASE ran with {' / '.join(sides[0])} and NEW with {' / '.join(sides[1])}: the learned placers' "
            f"floats depend on the CPU kernels, so they may search differently on the same code and seed"
            f"{' (the pins should make them agree; that is not yet measured)' if pinned else ''}; "
            f"compare stores made alike to gate code changes")
    _write(sys.stderr, f"placebench: warning: {text}\n")
    return text


def _warn_if_other_timeouts(base_runs: list[Any], new_runs: list[Any]) -> str:
    """The runs that made BASE's and NEW's rows had different cell timeouts (a spec's `cell_timeout_s`, else
    the methodology's; the manifest records each run's). The timeout is not part of a pair's setup
    (`suite.compare`): it changes no number, only whether a slow cell ends as `timeout`. Say on stderr (and
    return) that a verdict to or from `timeout` may then come from the timeouts alone."""
    sides = [sorted({float(run["cell_timeout_s"]) for run in runs if isinstance(run.get("cell_timeout_s"), int | float)})
             for runs in (base_runs, new_runs)]
    if not (sides[0] and sides[1]) or sides[0] == sides[1]:
        return ""
    text = (f"BASE ran with cell timeouts of {' / '.join(f'{t:g} s' for t in sides[0])} and NEW with "
            f"{' / '.join(f'{t:g} s' for t in sides[1])}: a cell that ends as timeout on one side may have "
            f"finished on the other for that alone; compare stores run with one timeout to gate code changes")
    _write(sys.stderr, f"placebench: warning: {text}\n")
    return text


def _store_root(store: str | Path) -> Path | None:
    """The store directory behind STORE: itself, or the store holding a results table file given instead."""
    from suite.store import is_store_dir

    path = Path(store).resolve()
    if path.is_dir():
        return path
    return path.parent if is_store_dir(path.parent) else None


def _refuse_inside_store(store: str | Path, path: str | Path | None, flag: str) -> None:
    """A report written into the store it is made from would overwrite the store's own files (manifest, cells,
    tables) or mix reports with its data: refuse it."""
    if not path:
        return
    target, root = Path(path).resolve(), _store_root(store)
    if root is not None and (target == root or root in target.parents):
        raise UsageError(f"{flag} {path} is inside the results store {root}: write reports elsewhere")
    if target == Path(store).resolve():
        raise UsageError(f"{flag} {path} is the results file the report is made from: write reports elsewhere")


def _names(text: str | None, flag: str) -> list[str]:
    """A comma-separated filter; an option given with no names is an error, not "no filter". A comma inside
    brackets or a JSON string is part of its name: a placer's default label names its parameters,
    `local_search(batch_size=32,steps=10)`."""
    if text is None:
        return []
    parts, depth, quoted, escaped, start = [], 0, False, False, 0
    for i, ch in enumerate(text):
        if quoted:
            quoted, escaped = escaped or ch != '"', not escaped and ch == "\\"
        elif ch == '"':
            quoted = True
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth = max(0, depth - 1)
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    names = [x.strip() for x in [*parts, text[start:]] if x.strip()]
    if not names:
        raise UsageError(f"{flag} {text!r} names nothing: give one or more names, comma-separated")
    return names


TABLE_FORMATS = ("text", "md", "csv", "latex", "html", "json")
COMPARE_FORMATS = ("text", "md", "csv", "json")
SUFFIX_FORMATS = {".txt": "text", ".md": "md", ".csv": "csv", ".tex": "latex", ".html": "html", ".htm": "html",
                  ".json": "json"}


def _output_format(args: argparse.Namespace, choices: Sequence[str]) -> str:
    """The output format from --format, --json and --output's suffix, which must agree (default text)."""
    asked = []
    if args.format is not None:
        asked.append((f"--format {args.format}", args.format))
    if args.json:
        asked.append(("--json", "json"))
    if args.output:
        fmt = SUFFIX_FORMATS.get(Path(args.output).suffix.lower())
        if fmt is not None and fmt not in choices:
            raise UsageError(f"--output {args.output}: this command writes {', '.join(choices)}, not {fmt}")
        if fmt is not None:
            asked.append((f"--output {args.output}", fmt))
    for flag, fmt in asked[1:]:
        if fmt != asked[0][1]:
            raise UsageError(f"{asked[0][0]} and {flag} ask for different formats ({asked[0][1]}, {fmt})")
    return asked[0][1] if asked else "text"


def cmd_table(args: argparse.Namespace) -> int:
    from suite import report
    from suite.store import atomic_write_files, open_rows

    for flag, path in (("--output", args.output), ("--chart", args.chart)):
        _refuse_inside_store(args.store, path, flag)
        if path:
            _check_output_file(path, flag, [])
    fmt = _output_format(args, TABLE_FORMATS)
    if args.chart and Path(args.chart).suffix.lower() != ".png":
        raise UsageError(f"--chart {args.chart}: the chart is a PNG; name the file *.png")
    if args.output and args.chart and Path(args.output).resolve() == Path(args.chart).resolve():
        raise UsageError(f"--output and --chart are the same file {args.output}")
    rows = open_rows(args.store)
    runs = _manifest_runs(args.store)
    _warn_if_incomplete(args.store, runs, rows)
    _warn_if_table_lags(args.store, len(rows))
    reference = args.reference or report.DEFAULT_REFERENCE
    applied = []  # the filters before this one: a name may have rows in the store but none they keep
    for flag, field, wanted in (("--cluster", "cluster", [args.cluster] if args.cluster else []),
                                ("--workloads", "workload", _names(args.workloads, "--workloads")), ("--placers", "placer", None)):
        if wanted is None:  # placers last: the reference joins them only if it has rows left after the others
            wanted = _names(args.placers, "--placers")
            if wanted and reference not in wanted and any(r["placer"] == reference for r in rows):
                wanted.append(reference)  # speedups need the reference's column
        if wanted:
            known = sorted({r[field] for r in rows})
            unknown = [w for w in wanted if w not in known]
            if unknown:
                where = f" with {' '.join(applied)}" if applied else ""
                raise UsageError(f"{flag} {unknown[0]!r} has no rows in {args.store}{where}; {field}s: {', '.join(known)}")
            rows = [r for r in rows if r[field] in wanted]
            applied.append(f"{flag} {','.join(wanted)}")
    _warn_if_mixed_code(runs, rows)
    # everything is made before anything is written: a failure leaves no half-written output
    png = report.chart_png(rows, args.reference, note=f"made by placebench table from {_text(args.store)}") if args.chart else None
    res = report.Results.from_rows(rows)
    if not res.cells:
        raise report.ReportError(f"{args.store}: no result rows")
    terminal = fmt == "text" and not args.output
    profiles = report.manifest_profiles(args.store)
    text = None if terminal else report.render(rows, fmt, args.reference, profiles)
    shown = [t for _, ts in report.tables(res, args.reference) for t in ts] if terminal else None
    files = {Path(args.chart): png} if png is not None else {}
    if args.output:
        files[Path(args.output)] = _utf8(text)
    atomic_write_files(files)
    if shown is not None:
        _print_tables(shown)
        for line in report.profile_coverage_lines(res.evaluators, profiles):  # as `render` ends a text report
            print(f"\n{line}")
    elif not args.output:
        sys.stdout.write(text)
    return 0


def cmd_leaderboard(args: argparse.Namespace) -> int:
    from suite import report
    from suite.store import open_rows

    _refuse_inside_store(args.store, args.out, "--out")
    check_output_dir(args.out, "--out")
    rows = open_rows(args.store)
    runs = _manifest_runs(args.store)
    warnings = [w for w in (_warn_if_incomplete(args.store, runs, rows), _warn_if_table_lags(args.store, len(rows)),
                            _warn_if_mixed_code(runs, rows)) if w]
    old_chart = Path(args.out) / "leaderboard.png"
    if args.no_chart and old_chart.exists():  # left as it is (never deleted), but it is not of these rows
        _say(f"placebench: warning: {old_chart} is from an earlier leaderboard, not of these rows (--no-chart): "
             f"remove it, or drop --no-chart to replace it")
    written = [str(p) for p in report.write_leaderboard(
        rows, args.out, args.reference, source=_text(args.store), runs=runs,
        note="\n\n".join(f"**Warning: {_text(w)}.**" for w in warnings), chart=not args.no_chart,
        profiles=report.manifest_profiles(args.store))]
    if args.json:
        _print_json({"written": written})
    else:
        print("\n".join(written))
    return 0


def _warn_if_table_lags(path: str, n_rows: int) -> str:
    """A store's own results table is rewritten when a run ends: a run killed before that leaves it behind
    the cell files. Say so on stderr (and return it) when the counts differ."""
    from suite.store import Store

    source = _results_source(path)
    if source == Path(path).resolve():  # a store directory, or a table outside a store
        return ""
    cells = len(Store(source, create=False).cell_ids())
    if cells == n_rows:
        return ""
    text = (f"{path} holds {n_rows} rows but {source} has {cells} cell files (a run ended before rewriting it): "
            f"read the store directory {source} instead")
    _write(sys.stderr, f"placebench: warning: {text}\n")
    return text


def _results_source(path: str) -> Path:
    """The store a results path reads: a store's own results table (results.csv or .parquet, rebuilt from its
    cells) counts as its store; any other file is itself."""
    p = Path(path).resolve()
    root = _store_root(p) if p.is_file() and p.name in ("results.csv", "results.parquet") else None
    return root or p


def cmd_compare(args: argparse.Namespace) -> int:
    """Exit 1 when NEW has regressions against BASE (the CI gate), 0 otherwise; 2 on bad input or when no cell
    could be compared. The exit code holds even when the reader of stdout or stderr has gone (`| head`)."""
    from suite import compare, report
    from suite.store import atomic_write_files, dumps, open_rows

    if _results_source(args.base) == _results_source(args.new):
        raise UsageError(f"BASE {args.base} and NEW {args.new} are the same results")
    for store in (args.base, args.new):
        _refuse_inside_store(store, args.output, "--output")
    if args.output:
        _check_output_file(args.output, "--output", [])
    fmt = _output_format(args, COMPARE_FORMATS)
    sides, side_runs = [], []
    for side, store in (("BASE", args.base), ("NEW", args.new)):
        rows = open_rows(store)
        runs = _manifest_runs(store)  # also for a table file inside a store: its rows are the store's
        _warn_if_incomplete(store, runs, rows, side=f"{side} {store}")  # which of the two stores it is about
        _warn_if_table_lags(store, len(rows))
        _warn_if_mixed_code(runs, rows, side=f"{side} {store}")
        sides.append(rows)
        side_runs.append(report.runs_that_made(runs, rows))
    _warn_if_other_kernels(*side_runs)
    _warn_if_other_timeouts(*side_runs)
    pairs = compare.compare(sides[0], sides[1], args.factor, args.memory_factor, names=(args.base, args.new),
                            methodologies=(_store_methodologies(args.base), _store_methodologies(args.new)))
    line = compare.summary(pairs, args.factor, args.lenient, args.memory_factor)
    if not compare.comparable(pairs):
        found = ", ".join(f"{n} {v}" for v, n in compare.counts(pairs).items()) or "no cells on either side"
        why = compare.why_not_comparable(pairs)
        raise report.ReportError(f"nothing to compare: no cell of {args.base} was measured the same way in {args.new} "
                                 f"({found})" + (f": {why}" if why else ""))
    if fmt == "json":
        text = dumps(compare.as_json(pairs, args.factor, args.lenient, args.memory_factor, args.all)) + "\n"
    else:
        t = compare.table(pairs, args.all, args.lenient, title=f"Changes: {args.new} against {args.base}")
        body = {"text": report.to_text, "md": report.to_markdown, "csv": report.to_csv}[fmt](t)
        text = body if fmt == "csv" else (body + "\n\n" if t.rows else "") + line + "\n"
    if args.output:
        atomic_write_files({Path(args.output): _utf8(text)})
    else:
        _write(sys.stdout, text)  # a reader that left does not change the exit code
    if args.output or fmt in ("json", "csv"):  # the summary is not on stdout: say it on stderr
        _write(sys.stderr, f"placebench: compare: {line}\n")
    return 1 if any(p.regression(args.lenient) for p in pairs) else 0


# -- list and show ------------------------------------------------------------------------------------------
def _list_workloads() -> list[dict[str, Any]]:
    from suite import registry

    try:
        names = registry.workload_names()
    except (ImportError, AttributeError) as exc:
        raise PlacebenchError(f"the model zoo is not available: {exc}") from None
    from suite import zoo

    out = []
    for n in names:
        d = zoo.describe(n) if hasattr(zoo, "describe") else {}
        item = {"name": n, "mode": d.get("mode", ""), "description": d.get("description", "")}
        if "cached" in d:
            item["num_ops"] = d["cached"].get("num_ops")
        out.append(item)
    return out


def _list_loaded(names: Iterable[str], load: Callable[[str], Any], describe: Callable[[Any], dict[str, Any]],
                 broken: dict[str, Any]) -> list[dict[str, Any]]:
    """One entry per name, described from what `load` gives; one that fails to load is listed as broken (with
    the `broken` fields and its error), the others are still listed."""
    out = []
    for name in names:
        try:
            item = describe(load(name))
        except PlacebenchError as exc:
            out.append({"name": name, "status": "broken", **broken, "description": str(exc)})
            continue
        out.append({"name": name, "status": "ok", **item})
    return out


def _list_clusters() -> list[dict[str, Any]]:
    from suite import registry

    return _list_loaded(registry.cluster_names(), registry.load_cluster,
                        lambda c: {"devices": [d.name for d in c.devices], "description": c.description},
                        {"devices": []})


def _list_placers() -> list[dict[str, Any]]:
    from suite.placer import (
        _entry_points,
        placer_class,
        placer_defaults,
        placer_families,
        placer_names,
        placer_order,
    )

    eps = _entry_points()
    families = placer_families()
    out = []
    for name in placer_order(placer_names()):
        entry = {"name": name, "family": families.get(name, "plugin"),
                 "source": eps[name].value if name in eps else "registered in this process"}
        try:
            cls = placer_class(name)
            entry["status"] = "ok"
            entry["description"] = ((cls.__doc__ or "").strip().splitlines() or [""])[0]
            entry["parameters"] = placer_defaults(cls)
        except PlacebenchError as exc:  # a broken plugin is reported, not fatal
            entry["status"] = "broken"
            entry["description"] = str(exc)
        out.append(entry)
    return out


def _list_specs() -> list[dict[str, Any]]:
    from suite import runner

    return _list_loaded(runner.spec_names(), runner.load_spec,
                        lambda s: {"description": s.description, "path": str(s.source)}, {})


def _list_papers() -> list[dict[str, Any]]:
    from suite import paper

    return _list_loaded(paper.paper_names(), paper.load_paper,
                        lambda t: {"description": f"{t.citation}, {t.table}: {t.quantity}", "path": t.source}, {})


_LISTS = {"workloads": _list_workloads, "clusters": _list_clusters, "placers": _list_placers, "specs": _list_specs,
          "papers": _list_papers}


def cmd_list(args: argparse.Namespace) -> int:
    if args.plugin:
        if args.what != "placers":
            raise UsageError("--plugin applies to 'list placers' only")
        from suite import runner

        runner.load_plugins(args.plugin)
    items = _LISTS[args.what]()
    if args.json:
        _print_json(items)
        return 0
    for item in items:
        extra = []
        if item.get("devices"):
            extra.append(f"{len(item['devices'])} devices ({', '.join(item['devices'])})")
        if item.get("status") == "broken":
            extra.append("BROKEN")
        if item.get("description"):
            extra.append(item["description"])
        if item.get("parameters"):
            extra.append("parameters: " + ", ".join(f"{k}={json.dumps(v, default=str)}"
                                                    for k, v in item["parameters"].items()))
        family = f"  [{item['family']}]" if item.get("family") else ""
        print(item["name"] + family + ("  " + " - ".join(extra) if extra else ""))
    return 0


def workload_info(name: str) -> dict[str, Any]:
    import suite

    g = suite.load_workload(name)
    stats = g.stats.as_dict()
    kinds: dict[str, int] = {}
    for op in g.ops:
        kinds[op.kind] = kinds.get(op.kind, 0) + 1
    from suite import zoo

    published = dict(zoo.describe(name)["reference"]) if name in zoo.names() else {}
    return {
        "name": g.name,
        "hash": g.content_hash,
        "metadata": dict(g.metadata),
        "stats": stats,
        "colocation_groups": len(g.groups),
        "op_kinds": dict(sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0]))),
        "published": published,  # published figures with their source (zoo workloads; {} for a graph file)
    }


def cluster_info(name: str) -> dict[str, Any]:
    """A cluster's devices and links with every number's source, and the numbers that have none."""
    from suite import registry
    from suite.cluster import DEVICE_NUMBERS, LINK_NUMBERS, unsourced

    c = registry.load_cluster(name)
    return {
        "name": c.name,
        "hash": c.content_hash,
        "description": c.description,
        "source": dict(c.source),
        "devices": [{"name": d.name, "kind": d.kind, "model": d.model,
                     **{k: getattr(d, k) for k in DEVICE_NUMBERS}, "source": dict(d.source)} for d in c.devices],
        "links": [{"name": lk.name, "between": list(lk.between), **{k: getattr(lk, k) for k in LINK_NUMBERS},
                   "sharing": lk.sharing, "source": dict(lk.source)} for lk in c.links],
        "unsourced": unsourced(c),
    }


SHARING_TEXT = {"pairs": "one channel per ordered pair (a crossbar)",
                "ports": "one transfer at a time per device port and direction"}


def _exact(x: float) -> str:
    """x in the fewest significant digits that read back as x (1.3248e+12, not 1.325e+12)."""
    x = float(x)
    return next(s for p in range(1, 18) if float(s := f"{x:.{p}g}") == x)


def _show_cluster(name: str, as_json: bool) -> int:
    info = cluster_info(name)
    if as_json:
        _print_json(info)
        return 0
    lines = [f"cluster {info['name']}" + (f": {info['description']}" if info["description"] else ""),
             f"hash {info['hash']}"]
    lines += [f"source.{k}: {v}" for k, v in info["source"].items()]
    for d in info["devices"]:
        lines.append(f"device {d['name']} ({d['kind']}{', ' + d['model'] if d['model'] else ''}): "
                     f"{_exact(d['peak_flops'])} FLOP/s x {_exact(d['compute_efficiency'])}, "
                     f"{_exact(d['mem_bandwidth'])} B/s x {_exact(d['memory_efficiency'])}, "
                     f"{d['memory_bytes']} bytes ({human_bytes(d['memory_bytes'])}), {_exact(d['op_overhead_s'])} s per op")
        lines += [f"  source.{k}: {v}" for k, v in d["source"].items()]
    for j, lk in enumerate(info["links"]):
        lines.append(f"links[{j}]{' ' + lk['name'] if lk['name'] else ''} ({', '.join(lk['between'])}): "
                     f"{_exact(lk['bandwidth'])} B/s per direction, {_exact(lk['latency_s'])} s latency, "
                     f"{SHARING_TEXT[lk['sharing']]}")
        lines += [f"  source.{k}: {v}" for k, v in lk["source"].items()]
    missing = info["unsourced"]
    lines.append(f"numbers without a source ({len(missing)}): {', '.join(missing)}" if missing else
                 "every number has a source")
    print("\n".join(lines))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    if (args.workload is None) == (args.cluster is None):
        raise UsageError("show takes a workload or --cluster C (a preset name or a cluster file), one of them")
    if args.cluster is not None:
        return _show_cluster(args.cluster, args.json)
    info = workload_info(args.workload)
    if args.json:
        _print_json(info)
        return 0
    s = info["stats"]
    lines = [
        ("workload", info["name"]),
        ("hash", info["hash"]),
        ("ops", f"{s['num_ops']} ({', '.join(f'{k} {v}' for k, v in s['ops_by_phase'].items())})"),
        ("edges", f"{s['num_edges']} (average degree {s['average_degree']:.2f})"),
        ("FLOPs", f"{s['total_flops']:.4g}"),
        ("resident bytes", f"{human_bytes(s['param_bytes'])} (parameters, and optimizer state in training)"),
        ("longest path", f"{s['critical_path_ops']} ops; most FLOPs on a path: {s['critical_path_flops']:.4g}"),
        ("colocation groups", str(info["colocation_groups"])),
        ("op kinds", ", ".join(f"{k} {v}" for k, v in list(info["op_kinds"].items())[:12])
         + (f" (12 most frequent of {len(info['op_kinds'])} kinds; --json lists all)" if len(info["op_kinds"]) > 12 else "")),
    ]
    lines += [(f"metadata.{k}", json.dumps(v) if not isinstance(v, str) else v) for k, v in info["metadata"].items()]
    lines += [(f"published.{k}", f"{v:,.0f}" if isinstance(v, int | float) else str(v))
              for k, v in info["published"].items()]
    width = max(len(k) for k, _ in lines)
    print("\n".join(f"{k.ljust(width)}  {v}" for k, v in lines))
    return 0


# -- parser -------------------------------------------------------------------------------------------------
def _positive_float(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (x > 0 and math.isfinite(x)):
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive number")
    return x


def factor(allow_inf: bool = False) -> Any:
    """An argparse type: a ratio >= 1 (finite unless allow_inf)."""
    def parse(text: str) -> float:
        try:
            x = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not (x >= 1 and (allow_inf or math.isfinite(x))):
            raise argparse.ArgumentTypeError(f"{text!r} must be a {'' if allow_inf else 'finite '}number >= 1")
        return x

    return parse


def whole_number(low: int, high: int | None = None) -> Any:
    """An argparse type: an integer >= low (and < high when given)."""
    shown = f"2**{high.bit_length() - 1}" if high and high & (high - 1) == 0 else str(high)

    def parse(text: str) -> int:
        try:
            x = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if x < low or (high is not None and x >= high):
            raise argparse.ArgumentTypeError(f"{text!r} must be " + (f"in [{low}, {shown})" if high else f"at least {low}"))
        return x

    return parse


SEED = whole_number(0, 2**32)


class _Parser(argparse.ArgumentParser):
    """argparse with the CLI's error format: one line on stderr (no usage block), exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"placebench: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from suite import __version__
    from suite.compare import DEFAULT_FACTOR

    p = _Parser(prog="placebench", description="Benchmark suite for device placement.")
    p.add_argument("--version", action="version", version=f"placebench {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    r = sub.add_parser("run", help="run a suite spec (default: quick) and print the comparison table",
                       description="Run a spec's cells not yet in the store and print the comparison table. A spec "
                                   "that no cell could run (an unknown name, a workload no placement fits on a "
                                   "cluster, a real evaluator's cluster GPU not visible here or workload without a "
                                   "zoo model) is refused before any cell runs, exit 2.")
    r.add_argument("spec", nargs="?", default="quick", help="built-in spec name (placebench list specs) or spec file")
    r.add_argument("--out", help="results store directory (default: runs/<spec name>)")
    r.add_argument("--jobs", "-j", type=whole_number(1),
                   help="parallel worker processes (default: usable CPUs; 1, the only choice, for a real-execution evaluator)")
    r.add_argument("--force", action="store_true", help="rerun cells already in the store")
    r.add_argument("--retry-failed", action="store_true", help="rerun stored cells whose status is error or timeout")
    r.add_argument("--reference", help="placer that speedups are relative to (default: single_gpu)")
    r.add_argument("--quiet", "-q", action="store_true",
                   help="no progress output, nor the notices that stored cells run again (--json keeps those)")
    r.add_argument("--json", action="store_true", help="print the rows and report as JSON")
    r.set_defaults(func=cmd_run)

    e = sub.add_parser("evaluate", help="run one cell (workload, cluster, placer, seed); nothing is stored",
                       description="Run one cell and print its row. Exit status: 0 when the cell is ok, 1 when it "
                                   "is oom, invalid, timeout, error or skipped, 2 on bad input.")
    e.add_argument("workload", help="zoo workload name, shape variant name (ZOO+key=value...) or graph file")
    e.add_argument("--cluster", "-c", required=True, help="cluster preset name or file")
    what = e.add_mutually_exclusive_group(required=True)
    what.add_argument("--placer", "-p", help="placer name (placebench list placers)")
    what.add_argument("--placement", metavar="FILE",
                      help="measure the placement in FILE instead of running a placer (as --save-placement writes it)")
    e.add_argument("--save-placement", metavar="FILE", help="write the placer's final placement to FILE (JSON)")
    e.add_argument("--trace", metavar="FILE",
                   help="write the final placement's timeline (ops, transfers, memory per device) to FILE as a "
                        "Chrome/Perfetto trace (JSON)")
    e.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help="placer parameter (JSON value)")
    e.add_argument("--seed", type=SEED, help="the placer's seed (default 0)")
    e.add_argument("--methodology", default="v1", help="methodology name or file (default: v1)")
    e.add_argument("--max-evaluations", type=whole_number(1), help="override the search budget's evaluations")
    e.add_argument("--max-seconds", type=_positive_float, help="override the search budget's seconds")
    e.add_argument("--timeout", type=_positive_float, help="cell timeout in seconds (default: the methodology's)")
    e.add_argument("--plugin", action="append", default=[], help="module or .py file to import first (repeatable)")
    e.add_argument("--engine", choices=("fast", "reference"), help="simulator engine (same results)")
    e.add_argument("--profile", action="append", default=[], metavar="FILE",
                   help="measured per-op times for the simulator (`placebench profile`; repeatable)")
    e.add_argument("--json", action="store_true")
    e.set_defaults(func=cmd_evaluate)

    t = sub.add_parser("table", help="render a results store (directory, .parquet or .csv)")
    t.add_argument("store")
    t.add_argument("--format", "-f", choices=TABLE_FORMATS,
                   help="output format (default: from --output's suffix, else text)")
    t.add_argument("--reference", help="placer that speedups are relative to (default: single_gpu)")
    t.add_argument("--cluster", help="only this cluster")
    t.add_argument("--placers", help="only these placers, comma-separated (the reference is kept for speedups)")
    t.add_argument("--workloads", help="only these workloads, comma-separated")
    t.add_argument("--output", "-o", help="write to this file instead of stdout")
    t.add_argument("--chart", metavar="FILE.png", help="also write a bar chart PNG to this file")
    t.add_argument("--json", action="store_true", help="same as --format json")
    t.set_defaults(func=cmd_table)

    lb = sub.add_parser("leaderboard", help="write leaderboard.md, .csv and .png from a results store")
    lb.add_argument("store", nargs="?", default="runs/full", help="results store (default: runs/full, the leaderboard suite)")
    lb.add_argument("--out", default="results", help="output directory (default: results)")
    lb.add_argument("--reference", help="placer that speedups are relative to (default: single_gpu)")
    lb.add_argument("--no-chart", action="store_true", help="skip leaderboard.png")
    lb.add_argument("--json", action="store_true")
    lb.set_defaults(func=cmd_leaderboard)

    cp = sub.add_parser("compare", help="compare two results stores cell by cell; exit 1 on regressions (CI gate)",
                        description="Compare NEW with BASE cell by cell (cluster, workload, placer, seed). Exit codes: "
                                    "0 no regression, 1 regressions, 2 bad input or nothing comparable.")
    cp.add_argument("base", help="the baseline: results store directory, .parquet or .csv")
    cp.add_argument("new", help="the results to check against it")
    cp.add_argument("--factor", type=factor(), default=DEFAULT_FACTOR,
                    help="a step time changes beyond this ratio (default %(default)s)")
    cp.add_argument("--memory-factor", type=factor(allow_inf=True), metavar="FACTOR",
                    help="peak memory changes beyond this ratio (default: --factor; inf: memory is not judged)")
    cp.add_argument("--lenient", action="store_true",
                    help="cells missing from NEW or measured another way (not comparable) are listed, not regressions")
    cp.add_argument("--all", action="store_true", help="list every cell, not only the changed ones")
    cp.add_argument("--format", "-f", choices=COMPARE_FORMATS,
                    help="output format (default: from --output's suffix, else text)")
    cp.add_argument("--output", "-o", help="write to this file instead of stdout")
    cp.add_argument("--json", action="store_true", help="same as --format json")
    cp.set_defaults(func=cmd_compare)

    pa = sub.add_parser("paper", help="a paper's published table next to placebench's results for the same cells",
                        description="Run the cells a paper's table needs (those not in the store yet), then print and "
                                    "write the comparison (placebench list papers).")
    pa.add_argument("paper", help="paper table id (placebench list papers) or a paper-table file")
    pa.add_argument("--store", help="results store to run into and read (default: runs/papers/<id>; runs/full reuses "
                                    "the leaderboard's cells)")
    pa.add_argument("--out", default="results/papers", help="output directory for <id>.md and <id>.csv "
                                                            "(default: results/papers)")
    pa.add_argument("--no-run", action="store_true", help="only report what the store holds")
    pa.add_argument("--jobs", "-j", type=whole_number(1), help="parallel worker processes (default: usable CPUs)")
    pa.add_argument("--quiet", "-q", action="store_true",
                    help="no progress output, nor the notices that stored cells run again (--json keeps those)")
    pa.add_argument("--json", action="store_true", help="print the comparison as JSON")
    pa.set_defaults(func=cmd_paper)

    ls = sub.add_parser("list", help="list workloads, clusters, placers, specs or paper tables")
    ls.add_argument("what", choices=sorted(_LISTS))
    ls.add_argument("--plugin", action="append", default=[],
                    help="with placers: module or .py file to import first, so its placers are listed (repeatable)")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_list)

    sh = sub.add_parser("show", help="statistics and metadata of one workload, or one cluster with its sources")
    sh.add_argument("workload", nargs="?", help="zoo workload name, shape variant name (ZOO+key=value...) or graph file")
    sh.add_argument("--cluster", "-c", help="show this cluster (preset name or file) instead")
    sh.add_argument("--json", action="store_true")
    sh.set_defaults(func=cmd_show)

    from suite.backends.commands import add_commands

    add_commands(sub)  # profile, fidelity: real execution (torch is imported only when they run)
    return p


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler, `timeout`) or SIGHUP (a closed terminal or ssh session): stop like Ctrl-C,
    storing what is finished; the exit code is 128 + the signal's number, as a shell reports it."""

    def __init__(self, signum: int = signal.SIGTERM):
        super().__init__(signum)
        self.exit_code = 128 + int(signum)


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated(signum)


def _stop_signals() -> list[int]:
    """SIGTERM, and SIGHUP where there is one and it is not ignored (`nohup`: the run is meant to outlive
    its terminal)."""
    out = [signal.SIGTERM]
    if hasattr(signal, "SIGHUP") and signal.getsignal(signal.SIGHUP) != signal.SIG_IGN:
        out.append(signal.SIGHUP)
    return out


def _os_error_text(exc: OSError) -> str:
    """The message without Python's "[Errno N]" prefix; the file it names, if any, first."""
    if not exc.strerror:
        return str(exc)
    return f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror


def _lenient_streams() -> list[Any]:
    """Make stdout and stderr write a lone surrogate (a path's byte that is not UTF-8, as Python holds it) as
    its escape text, "\\udce9", where they would fail on it (errors "strict": stdout under a UTF-8 locale other
    than C); return those streams, to be made strict again."""
    changed = []
    for stream in (sys.stdout, sys.stderr):
        if getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
            changed.append(stream)
    return changed


def main(argv: Sequence[str] | None = None) -> int:
    args: argparse.Namespace | None = None
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        previous = {signum: signal.signal(signum, _raise_terminated) for signum in _stop_signals()}
    lenient = _lenient_streams()
    try:
        for arg in sys.argv[1:] if argv is None else argv:  # only a caller of main() can pass one: argv cannot
            if "\x00" in arg:
                raise UsageError(f"argument {arg!r} contains a NUL character: no name or file name holds one")
        args = build_parser().parse_args(argv)
        code = int(args.func(args) or 0)
        for stream in (sys.stdout, sys.stderr):  # flushed here: a reader that left fails neither the exit code
            _write(stream, "")                    # nor Python's exit
        return code
    except PlacebenchError as exc:
        _say(f"placebench: error: {exc}")
        return EXIT_USAGE
    except BrokenPipeError:  # `placebench ... | head`: the reader left; not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:  # an unwritable --out, a missing directory: the user's input, not a bug
        _say(f"placebench: error: {_os_error_text(exc)}")
        return EXIT_USAGE
    except KeyboardInterrupt as exc:
        if getattr(args, "func", None) not in (cmd_run, cmd_paper):  # only these store cells as they finish
            _say("placebench: interrupted")
        elif getattr(args, "force", False) or getattr(args, "retry_failed", False):
            _say("placebench: interrupted; the cells redone so far are stored and the others keep their earlier "
                 "rows: rerun the same command to redo them all")
        else:
            _say("placebench: interrupted; finished cells are stored, rerun the same command to resume")
        return exc.exit_code if isinstance(exc, Terminated) else EXIT_INTERRUPTED
    finally:
        for signum, handler in previous.items():
            if handler is not None:  # None: set outside Python, cannot be put back
                signal.signal(signum, handler)
        for stream in lenient:
            with contextlib.suppress(ValueError, OSError):  # closed, or its reader left
                stream.reconfigure(errors="strict")


if __name__ == "__main__":
    sys.exit(main())
