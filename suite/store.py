"""The results store: one row per (workload, cluster, placer, params, seed, methodology, evaluator) cell.

A store is a directory::

    manifest.json        what produced the rows: spec, methodology, workload and cluster hashes, and one
                         entry per invocation (git commit, package versions, machine, counts)
    cells/<cell_id>.json one finished cell: the flat row plus its placement, learning curve and placer info
    results.parquet      the flat rows as one table (rebuilt from cells/ at the end of a run, or by `compact`)
    results.csv          the same table as CSV
    .lock                held (flock) by the run that is writing the store, so that two runs never share one

Every file is written atomically (temporary file in the same directory, fsync, rename), so a killed run
loses at most the cells in flight, and a cell is never stored twice: its file name is its key's hash. The
directory is not fsynced: after an operating-system crash or power loss the last renames may be undone, which
loses the cells they stored (a rerun redoes them) or brings back the file they replaced, never a partial file.
The cell files are the source of truth; the tables are derived from them. Cell files and the manifest
record the store's schema_version: one of another schema (written by another placebench) is refused, not read.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import io
import json
import math
import os
import platform
import re
import stat
import subprocess
import tempfile
import warnings
from collections.abc import Iterable, Iterator, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from suite.errors import PlacebenchError
from suite.textfile import as_float, load_json, short_repr

try:
    import fcntl
except ImportError:  # Windows: no flock, so stores are not locked
    fcntl = None

STORE_FORMAT = "placebench.store"
STORE_SCHEMA_VERSION = 1
CELL_FORMAT = "placebench.cell"
STATUSES = ("ok", "oom", "invalid", "timeout", "error", "skipped")

# The flat row: one column per field, in this order, with these types (None is a null).
ROW_SCHEMA = pa.schema(
    [
        ("cell_id", pa.string()),
        ("workload", pa.string()),
        ("workload_hash", pa.string()),
        ("cluster", pa.string()),
        ("cluster_hash", pa.string()),
        ("placer", pa.string()),  # the label shown in tables (name, or name with its parameters)
        ("placer_name", pa.string()),  # the registry name
        ("params", pa.string()),  # canonical JSON of the placer's keyword parameters
        ("params_hash", pa.string()),
        ("placer_code", pa.string()),  # fingerprint of the placer's source (suite.placer_code); not in the key
        ("seed", pa.int64()),
        ("methodology", pa.string()),  # methodology version
        ("budget_evaluations", pa.int64()),
        ("budget_seconds", pa.float64()),
        ("evaluator", pa.string()),
        ("status", pa.string()),  # ok, oom, invalid, timeout, error, skipped
        ("message", pa.string()),
        ("step_time_s", pa.float64()),  # re-measured statistic (median); null unless status is ok
        ("step_time_q25_s", pa.float64()),
        ("step_time_q75_s", pa.float64()),
        ("step_time_min_s", pa.float64()),
        ("step_time_max_s", pa.float64()),
        ("samples", pa.int64()),
        ("peak_memory_bytes", pa.string()),  # JSON object: device name -> bytes
        ("max_peak_memory_bytes", pa.int64()),
        ("oom_devices", pa.string()),  # comma-separated device names
        ("bytes_transferred", pa.int64()),
        ("evaluations", pa.int64()),  # evaluations the search used (counted by the evaluator)
        ("search_wall_time_s", pa.float64()),
        ("cell_wall_time_s", pa.float64()),
        ("placement_hash", pa.string()),
        ("run_id", pa.string()),
        ("finished_at", pa.string()),
        ("placebench_version", pa.string()),
    ]
)
ROW_COLUMNS = tuple(ROW_SCHEMA.names)
KEY_COLUMNS = (
    "workload",
    "workload_hash",
    "cluster",
    "cluster_hash",
    "placer",
    "placer_name",
    "params_hash",
    "seed",
    "methodology",
    "budget_evaluations",
    "budget_seconds",
    "evaluator",
)
JSON_TEXT_COLUMNS = ("peak_memory_bytes", "params")  # string columns that hold a JSON object (or are empty)
_STRING_COLUMNS = tuple(f.name for f in ROW_SCHEMA if pa.types.is_string(f.type))
# the other numbers of a row, each null or >= 0 (`row_problem`)
OPTIONAL_SECONDS = ("step_time_q25_s", "step_time_q75_s", "step_time_min_s", "step_time_max_s", "budget_seconds",
                    "search_wall_time_s", "cell_wall_time_s")
OPTIONAL_COUNTS = ("budget_evaluations", "max_peak_memory_bytes", "bytes_transferred", "evaluations")


class StoreError(PlacebenchError):
    """A store directory or results file that cannot be read."""


# -- atomic files ---------------------------------------------------------------------------------------
def atomic_write_bytes(path: Path, data: bytes) -> Path:
    """Write `data` to `path` so that readers see the old file or the new one, never a partial one."""
    return atomic_write_files({Path(path): data})[0]


def atomic_write_files(files: Mapping[Path, bytes]) -> list[Path]:
    """Write several files so that either all are replaced or none is (as far as the file system allows).

    Every file is first written in full to a temporary file next to its target; only when all of them are
    written, and no target is a directory, are they renamed over their targets. A symbolic link is written
    through (its target is replaced, the link stays). A target that exists and is not a regular file (a
    device such as /dev/stdout, a FIFO) is written directly, since it cannot be replaced. An error names
    the target, not the temporary file.
    """
    staged: list[tuple[str, Path]] = []
    try:
        for path, data in files.items():
            path = Path(path)
            target = Path(os.path.realpath(path))
            try:
                if _is_special(path):
                    with open(path, "wb") as f:
                        f.write(data)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
                staged.append((tmp, target))
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; results are meant to be shared like any file
            except OSError as exc:
                raise OSError(exc.errno, f"cannot write {path}: {exc.strerror}") from None
        for _, target in staged:
            if target.is_dir():
                raise IsADirectoryError(errno.EISDIR, f"cannot write {target}: it is a directory")
        for tmp, target in staged:
            os.replace(tmp, target)
    except BaseException:
        for tmp, _ in staged:
            Path(tmp).unlink(missing_ok=True)
        raise
    return [Path(p) for p in files]


def _is_special(path: Path) -> bool:
    """An existing file that is neither a regular file nor a directory (a device, a FIFO, a socket)."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def check_writable(path: str | Path, *, directory: bool = False) -> None:
    """Raise OSError naming `path` unless `atomic_write_files` could write there (a directory with `directory`).

    Checked before long work (a search, a run) so that its result is not lost to a bad output path: the
    nearest existing directory on the way must take a new file (tried, not guessed from permission bits,
    which root and special file systems do not honour).
    """
    if _is_special(Path(path)):
        if not os.access(path, os.W_OK):
            raise PermissionError(errno.EACCES, f"cannot write {path}: permission denied")
        return
    target = Path(os.path.realpath(path))
    if target.is_dir() and not directory:
        raise IsADirectoryError(errno.EISDIR, f"cannot write {path}: it is a directory")
    where = target if directory else target.parent
    while not where.exists():
        where = where.parent
    if not where.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, f"cannot write {path}: {where} is a file, not a directory")
    try:
        with tempfile.TemporaryFile(dir=where):
            pass
    except OSError as exc:
        tried = f" ({where})" if where != target else ""
        raise OSError(exc.errno, f"cannot write {path}: {exc.strerror}{tried}") from None


def _read_umask() -> int:
    mask = os.umask(0o022)  # the only way to read it is to set it: done once, at import
    os.umask(mask)
    return mask


_UMASK = _read_umask()


def atomic_write_text(path: Path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def _json_safe(value: Any) -> Any:
    """JSON-compatible copy: numpy scalars and arrays to Python, non-finite floats to None, others to str,
    and in every string a lone surrogate (a file name's undecodable byte) as its escape text (`_text`)."""
    if isinstance(value, Mapping):
        return {_text(str(k)): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if hasattr(value, "tolist") and not isinstance(value, str):
        return _json_safe(value.tolist())
    if isinstance(value, bool) or value is None or isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    return _text(str(value))


def _text(s: str) -> str:
    """`s`, with each lone surrogate (half of a UTF-16 pair: no text, and refused when a file is read back)
    written as its escape, "\\udce9"."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return s.encode("utf-8", "backslashreplace").decode("utf-8")
    return s


def dumps(value: Any) -> str:
    return json.dumps(_json_safe(value), sort_keys=True, indent=1)


# -- rows -----------------------------------------------------------------------------------------------
def flat_row(record: Mapping[str, Any]) -> dict[str, Any]:
    """The table columns of a cell record: missing numbers are null, missing strings are empty."""
    row = {c: record.get(c) for c in ROW_COLUMNS}
    for c in _STRING_COLUMNS:
        if row[c] is None:
            row[c] = ""
    return row


def sort_key(row: Mapping[str, Any]) -> tuple:
    return (row["cluster"], row["workload"], row["placer"], row["seed"], row["cell_id"])


def rows_to_table(rows: Iterable[Mapping[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist([flat_row(r) for r in rows], schema=ROW_SCHEMA)


def table_bytes(rows: Iterable[Mapping[str, Any]], path: Path) -> bytes:
    """The bytes of a results table of `rows` for `path`: Parquet (`.parquet`) or CSV (`.csv`)."""
    path = Path(path)
    table = rows_to_table(sorted(rows, key=sort_key))
    sink = pa.BufferOutputStream()
    if path.suffix == ".parquet":
        pq.write_table(table, sink)
    elif path.suffix == ".csv":
        pacsv.write_csv(table, sink)
    else:
        raise StoreError(f"{path}: results tables are .parquet or .csv")
    return sink.getvalue().to_pybytes()


def write_table(rows: Iterable[Mapping[str, Any]], path: Path) -> Path:
    """Write rows as Parquet (`.parquet`) or CSV (`.csv`), atomically."""
    return atomic_write_bytes(Path(path), table_bytes(rows, path))


def read_table(path: Path) -> list[dict[str, Any]]:
    """Rows of a results table written by `write_table` (Parquet or CSV); StoreError naming the file and the
    cell for a row that `row_problem` refuses."""
    path = Path(path)
    if path.suffix not in (".parquet", ".csv"):
        raise StoreError(f"{path}: expected a store directory, a .parquet or a .csv results table")
    try:  # read by Python, not by Arrow: Arrow takes a path for a URI and cannot open one that is not UTF-8
        data = pa.BufferReader(path.read_bytes())
    except FileNotFoundError:
        raise StoreError(f"{path}: no such results table") from None
    except OSError as exc:
        raise StoreError(f"{path}: cannot read the results table: {exc.strerror or exc}") from None
    try:
        if path.suffix == ".parquet":
            table = pq.read_table(data)
        else:
            opts = pacsv.ConvertOptions(
                column_types={f.name: f.type for f in ROW_SCHEMA},
                strings_can_be_null=False,
                quoted_strings_can_be_null=True,  # a quoted empty field ("") is null where an unquoted one is
                null_values=[""],  # as write_table writes null; "nan", "NA", "null" are not silently null
            )
            table = pacsv.read_csv(data, convert_options=opts)
        columns = table.column_names  # decodes the names: a non-UTF-8 name fails here
    except UnicodeDecodeError as exc:
        raise StoreError(f"{path}: not a placebench results table: a column name is not valid UTF-8 "
                         f"(byte 0x{exc.object[exc.start]:02x})") from None
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError) as exc:
        first_line = str(exc).partition("\n")[0]  # Arrow may add a dump of the schema
        where = _csv_bad_value(data, str(exc)) if path.suffix == ".csv" else None
        raise StoreError(f"{path}: {where or f'not a placebench results table: {first_line}'}") from None
    missing = [c for c in ("cell_id", "workload", "cluster", "placer", "seed", "status", "step_time_s") if c not in columns]
    if missing:
        raise StoreError(f"{path}: not a placebench results table: missing column(s) {', '.join(missing)}")
    unknown = [c for c in columns if c not in ROW_COLUMNS]
    if unknown:  # a misspelt column would otherwise be dropped, and the one meant read as empty
        raise StoreError(f"{path}: not a placebench results table: unknown column(s) {', '.join(unknown)}")
    twice = [c for i, c in enumerate(columns) if c in columns[:i]]
    if twice:  # one of the two would be dropped
        raise StoreError(f"{path}: not a placebench results table: column {twice[0]} appears twice")
    rows = [flat_row(r) for r in table.to_pylist()]
    for r in rows:  # before sorting: an empty seed would not sort
        problem = row_problem(r)
        if problem:
            raise StoreError(f"{path}: {row_where(r)}: {problem}")
    return sorted(rows, key=sort_key)


_CSV_CONVERSION = re.compile(r"In CSV column #(\d+): CSV conversion error to (\w+): invalid value '(.*)'$", re.S)
_CSV_KINDS = {"int64": "a 64-bit whole number", "double": "a number"}


def _csv_bad_value(data: pa.BufferReader, arrow_message: str) -> str | None:
    """'line N (cluster / workload / placer / seed S): COLUMN must be ..., got VALUE' for Arrow's message on a CSV
    value it could not convert, which names the column by its index and not the row; None for another error.
    `arrow_message` is the whole message: a value holding a newline (a quoted field) runs over its first line.
    N is the line the row starts on, as an editor numbers it."""
    match = _CSV_CONVERSION.match(arrow_message)
    if not match:
        return None
    index, kind, value = int(match[1]), match[2], match[3]
    data.seek(0)
    reader = csv.reader(io.StringIO(data.read().decode("utf-8", "replace"), newline=""))
    try:
        header = next(reader, [])
        start = reader.line_num + 1
        for fields in reader:
            if index < len(header) and index < len(fields) and fields[index] == value:
                row = dict(zip(header, fields, strict=False))
                empty = "" if header[index] == "seed" else " or empty"  # the one number of a row's key
                return (f"line {start} ({row_where(row)}): {header[index]} must be "
                        f"{_CSV_KINDS.get(kind, kind)}{empty}, got {_shown(value)}")
            start = reader.line_num + 1
    except csv.Error:  # a field Arrow read but csv will not (over its 131072-character limit): Arrow's message
        return None
    return None


# -- checks of what a store's files hold --------------------------------------------------------------------
def _shown(value: Any) -> str:
    """A JSON value for an error message: scalars as written in JSON, containers by their kind."""
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, int) and not isinstance(value, bool):
        return short_repr(value)  # a huge one by its size, not its first digits
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):  # not JSON: bytes or a date from a Parquet column, an integer too long
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def row_where(row: Mapping[str, Any]) -> str:
    """'cluster / workload / placer / seed N': where a row's problem is, in error messages."""
    return " / ".join(str(row.get(k)) for k in ("cluster", "workload", "placer")) + f" / seed {row.get('seed')}"


def row_problem(row: Mapping[str, Any]) -> str | None:
    """What is wrong with a result row or cell record, or None. A row names its cell (workload, cluster,
    placer: non-empty strings; seed: a 64-bit integer), has a known status, a step time that is null or a
    finite number >= 0, and not null when the status is ok, and a count of timed samples that is null or a
    whole number (at least 1 for an ok row: its step time is the statistic of them); its other times and
    counts (`OPTIONAL_SECONDS`, `OPTIONAL_COUNTS`) are null or finite numbers >= 0 (counts whole and below
    2**63, as the table's int64 columns hold them), its other texts are null or strings, and
    `JSON_TEXT_COLUMNS` empty or the JSON text of an object (commands parse them). Cell files,
    results tables (a Parquet file keeps its own column types) and the rows of reports are checked by this
    one rule."""
    for field in ("workload", "cluster", "placer"):
        if not isinstance(row.get(field), str) or not row[field]:
            return f"{field} must be a non-empty string, got {_shown(row.get(field))}"
    seed = row.get("seed")
    if isinstance(seed, bool) or not isinstance(seed, int) or not -(2**63) <= seed < 2**63:
        return f"seed must be a 64-bit integer, got {_shown(seed)}"
    if row.get("status") not in STATUSES:
        return f"status must be one of {', '.join(STATUSES)}, got {_shown(row.get('status'))}"
    t = row.get("step_time_s")
    if t is not None and not _seconds(t):
        return f"step_time_s must be null or a finite number >= 0, got {_shown(t)}"
    if t is None and row["status"] == "ok":
        return "status ok needs a step_time_s"
    n = row.get("samples")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or not (1 if row["status"] == "ok" else 0)
                          <= n < 2**63):
        need = "at least 1 for status ok" if row["status"] == "ok" else ">= 0"
        return f"samples must be null or a whole number {need} (64-bit), got {_shown(n)}"
    for field in OPTIONAL_SECONDS:
        v = row.get(field)
        if v is not None and not _seconds(v):
            return f"{field} must be null or a finite number >= 0, got {_shown(v)}"
    for field in OPTIONAL_COUNTS:
        v = row.get(field)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2**63):
            return f"{field} must be null or a whole number >= 0 (64-bit), got {_shown(v)}"
    for field in _STRING_COLUMNS:
        if row.get(field) is not None and not isinstance(row[field], str):
            return f"{field} must be null or a string, got {_shown(row[field])}"
    for field in JSON_TEXT_COLUMNS:
        if row.get(field) and not _json_object_text(row[field]):
            return f"{field} must be empty or the JSON text of an object, got {_shown(row[field])}"
    return None


def _json_object_text(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except (ValueError, RecursionError):
        return False


def _seconds(v: Any) -> bool:
    """A finite real number >= 0 (not a bool, a text or an integer too large for a float)."""
    t = as_float(v)
    return math.isfinite(t) and t >= 0


def _schema_problem(data: Mapping[str, Any], path: Path, what: str) -> StoreError | None:
    """The error for a cell or manifest of another store schema (a placebench that writes another layout
    made it), or None; a file that does not say is of this schema (the version is always written)."""
    version = data.get("schema_version", STORE_SCHEMA_VERSION)
    if isinstance(version, int) and not isinstance(version, bool) and version == STORE_SCHEMA_VERSION:
        return None
    return StoreError(f"{path}: {what} of store schema_version {_shown(version)}; this placebench reads "
                      f"{STORE_SCHEMA_VERSION}: read or extend the store with the placebench that wrote it")


def check_cell(data: Mapping[str, Any], path: Path) -> None:
    """Raise StoreError naming `path` and the field unless the cell has every field of its key, a non-empty
    cell_id and passes `row_problem`."""
    missing = [f for f in ("cell_id", "workload", "cluster", "placer", "seed", "status") if f not in data]
    if missing:
        raise StoreError(f"{path}: cell file is missing field(s) {', '.join(missing)}")
    if not isinstance(data["cell_id"], str) or not data["cell_id"]:
        raise StoreError(f"{path}: cell_id must be a non-empty string, got {_shown(data['cell_id'])}")
    problem = row_problem(data)
    if problem:
        raise StoreError(f"{path}: {problem}")


MANIFEST_TABLES = ("methodologies", "workloads", "clusters", "specs", "placers")
RUN_OBJECTS = ("git", "packages", "machine", "numerics")


def check_manifest(data: Mapping[str, Any], path: Path) -> None:
    """Raise StoreError naming `path` and the field unless the manifest's runs are a list of objects (their
    git, packages, machine and numerics objects where present, run_id and machine.simd strings, complete
    true or false), its tables are objects, each of their entries is an object (a methodology that is not one
    could not be checked against a run's), and each placer label one with name and params_hash."""
    runs = data.get("runs", [])
    if not isinstance(runs, list):
        raise StoreError(f"{path}: runs must be a list of objects, got {_shown(runs)}")
    for i, run in enumerate(runs):
        if not isinstance(run, dict):
            raise StoreError(f"{path}: runs[{i}] must be an object, got {_shown(run)}")
        for key in RUN_OBJECTS:
            if key in run and not isinstance(run[key], dict):
                raise StoreError(f"{path}: runs[{i}].{key} must be an object, got {_shown(run[key])}")
        for key, value, kind, what in (("run_id", run.get("run_id"), str, "a string"),
                                       ("machine.simd", run.get("machine", {}).get("simd"), str, "a string"),
                                       ("complete", run.get("complete"), bool, "true or false")):
            if value is not None and not isinstance(value, kind):
                raise StoreError(f"{path}: runs[{i}].{key} must be {what}, got {_shown(value)}")
    for key in MANIFEST_TABLES:
        if key in data and not isinstance(data[key], dict):
            raise StoreError(f"{path}: {key} must be an object, got {_shown(data[key])}")
    for key in ("methodologies", "workloads", "clusters", "specs"):
        for name, entry in data.get(key, {}).items():
            if not isinstance(entry, dict):
                raise StoreError(f"{path}: {key}[{json.dumps(name)}] must be an object, got {_shown(entry)}")
    for label, entry in data.get("placers", {}).items():
        if not isinstance(entry, dict) or not {"name", "params_hash"} <= entry.keys():
            raise StoreError(f"{path}: placers[{json.dumps(label)}] must be an object with name and params_hash, "
                             f"got {_shown(entry)}")


# -- the store ------------------------------------------------------------------------------------------
def in_use(root: str | Path) -> bool:
    """Whether a run holds the store at `root` now (`Store.writing`); False where locks are not available."""
    if fcntl is None:
        return False
    try:
        with open(Path(root) / ".lock", "rb") as f:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            except OSError:
                return False
            return False
    except OSError:  # no lock file: no run has held it
        return False


def is_store_dir(root: str | Path) -> bool:
    """Whether a directory is a store: it has the store's manifest.json, or a cells/ folder that is empty (a
    store just made), holds a cell file, or has a `.lock` beside it (a run held it, maybe stopping before its
    manifest). A cells/ folder of other files is not one: `profile --out X/cells` makes X a folder of plain
    profiles, and a store named cells does not make its parent one. False where the path cannot be looked at
    (a name too long, a folder not readable): the caller's own check of the path then says so."""
    root = Path(root)
    try:
        if not root.is_dir():
            return False
        if _json_format(root / "manifest.json") == STORE_FORMAT:
            return True
        cells = root / "cells"
        if not cells.is_dir():
            return False
        return ((root / ".lock").exists() or not any(cells.iterdir())
                or any(_json_format(f) == CELL_FORMAT for f in cells.glob("*.json")))
    except OSError:
        return False


def _json_format(path: Path) -> Any:
    """The "format" field of a JSON object file; None for any other file, or one that cannot be read."""
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None
    return data.get("format") if isinstance(data, dict) else None


class Store:
    """A results directory (see the module docstring). Creating one makes the directory, which must be new,
    empty or a store already: results.csv and results.parquet are rewritten in it."""

    def __init__(self, root: str | Path, *, create: bool = True):
        self.root = Path(root)
        if self.root.exists() and not self.root.is_dir():
            raise StoreError(f"{self.root}: exists and is not a directory")
        if not create and not self.cells_dir.is_dir():
            raise StoreError(f"{self.root}: not a placebench store (no cells/ directory)")
        if create and self.root.is_dir() and not is_store_dir(self.root) and any(
                p.name != ".lock" and not (p.name.startswith(".") and p.name.endswith(".tmp")) for p in self.root.iterdir()):
            raise StoreError(f"{self.root}: not empty and not a placebench store (no cells/ directory or store "
                             f"manifest.json); to keep its files, write the results to a new or empty directory")
        if create:
            self.cells_dir.mkdir(parents=True, exist_ok=True)

    @contextlib.contextmanager
    def writing(self) -> Iterator[Store]:
        """Hold the store for one run: while it is held, a second run on the same store is refused instead of
        redoing the same cells beside it. The lock is the operating system's (`flock` on `.lock`), so it ends
        with the process however the process ends. Where there is no `flock` (Windows) or the file system
        refuses locks, nothing is held (with a warning in the second case). Temporary files left by a killed
        writer (cells, manifest, tables) are removed once the lock is held."""
        with open(self.root / ".lock", "a+b") as f:
            if fcntl is not None:
                try:
                    fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    raise StoreError(f"{self.root}: another run is writing to this store; wait for it to finish "
                                     f"or give another --out") from None
                except OSError as exc:
                    warnings.warn(f"{self.root}: cannot lock the store ({exc.strerror}); two runs on it at once "
                                  f"would both run every missing cell", stacklevel=3)
            for tmp in [*self.cells_dir.glob(".*.tmp"), *self.root.glob(".*.tmp")]:  # never a finished file
                tmp.unlink(missing_ok=True)
            yield self

    def check_writable(self) -> None:
        """Raise StoreError naming the directory unless the store's directory and cells/ take new files: checked
        before a run's work, which would otherwise be lost at its first cell."""
        for directory in (self.root, self.cells_dir):
            try:
                check_writable(directory, directory=True)
            except OSError as exc:
                raise StoreError(f"{exc.strerror}; a run stores its results there: make it writable, or give "
                                 f"another --out") from None

    @property
    def cells_dir(self) -> Path:
        return self.root / "cells"

    @property
    def manifest_path(self) -> Path:
        return self.root / "manifest.json"

    def cell_path(self, cell_id: str) -> Path:
        return self.cells_dir / f"{cell_id}.json"

    # cells
    def cell_ids(self) -> set[str]:
        return {p.stem for p in self.cells_dir.glob("*.json")}

    def write_cell(self, record: Mapping[str, Any]) -> Path:
        body = {"format": CELL_FORMAT, "schema_version": STORE_SCHEMA_VERSION, **record}
        return atomic_write_text(self.cell_path(record["cell_id"]), dumps(body))

    def read_cell(self, cell_id: str) -> dict[str, Any]:
        """The record of a cell file, checked (`check_cell`) and stored under its own cell_id."""
        path = self.cell_path(cell_id)
        try:
            data = load_json(path, StoreError, "cell")
            if not isinstance(data, dict) or data.get("format") != CELL_FORMAT:
                raise StoreError(f"{path}: not a placebench cell file")
            other_schema = _schema_problem(data, path, "a cell")
            if other_schema is None:
                check_cell(data, path)
                if data["cell_id"] != cell_id:
                    raise StoreError(f"{path}: holds cell_id {_shown(data['cell_id'])}, not the one of its file "
                                     f"name; a cell file is named <cell_id>.json")
        except StoreError as exc:  # never repaired silently: the user decides, and is told how
            raise StoreError(f"{exc} (a damaged cell: move it out of {self.cells_dir} and run the spec again "
                             "to redo that cell)") from None
        if other_schema is not None:  # not damaged: its fields may mean other things, so none is read
            raise other_schema
        return data

    def records(self) -> list[dict[str, Any]]:
        """Every stored cell (full records), in table order."""
        return sorted((self.read_cell(p.stem) for p in self.cells_dir.glob("*.json")), key=sort_key)

    def rows(self) -> list[dict[str, Any]]:
        return [flat_row(r) for r in self.records()]

    # manifest
    def manifest(self) -> dict[str, Any]:
        if not self.manifest_path.exists():
            return {"format": STORE_FORMAT, "schema_version": STORE_SCHEMA_VERSION, "runs": []}
        data = load_json(self.manifest_path, StoreError, "store manifest")
        if not isinstance(data, dict) or data.get("format") != STORE_FORMAT:
            raise StoreError(f"{self.manifest_path}: not a placebench store manifest")
        other_schema = _schema_problem(data, self.manifest_path, "a store manifest")
        if other_schema is not None:
            raise other_schema
        check_manifest(data, self.manifest_path)
        return data

    def write_manifest(self, manifest: Mapping[str, Any]) -> Path:
        return atomic_write_text(self.manifest_path, dumps(manifest))

    # derived tables
    def compact(self) -> tuple[Path, Path]:
        """Rebuild results.parquet and results.csv from the cell files: both are made before either is replaced."""
        rows = self.rows()
        paths = (self.root / "results.parquet", self.root / "results.csv")
        parquet, csv = atomic_write_files({p: table_bytes(rows, p) for p in paths})
        return parquet, csv


def open_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows from a store directory (its cell files), or from a .parquet / .csv results table."""
    path = Path(path)
    if path.is_dir():
        return Store(path, create=False).rows()
    if not path.exists():
        raise StoreError(f"{path}: no such store directory or results table")
    return read_table(path)


# -- the manifest's description of the machine ----------------------------------------------------------
MANIFEST_PACKAGES = (
    "placebench",
    "numpy",
    "numba",
    "torch",
    "onnx",
    "onnxruntime",
    "onnxruntime-gpu",
    "pymetis",
    "pyscotch",
    "gymnasium",
    "pyarrow",
    "rich",
    "matplotlib",
)


def package_versions(names: Iterable[str] = MANIFEST_PACKAGES) -> dict[str, str]:
    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


CODE_FOLDERS = ("suite", "baselines", "rl")  # an untracked file there (a new placer) is a code change


def git_state(where: Path | None = None) -> dict[str, Any]:
    """The commit of the checkout that holds the code (None outside git) and whether it has local changes:
    changed tracked files anywhere, or untracked files in the code folders. `where` (by default the folder
    above the `suite` package) must be the checkout's top: an installed copy in a virtual environment that
    lies inside some other git repository is outside git, not at that repository's commit."""
    where = Path(where).resolve() if where else Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=where, capture_output=True, text=True, timeout=10,
                              check=True).stdout.strip()

    try:
        if Path(git("rev-parse", "--show-toplevel")).resolve() != where:
            return {"commit": None, "dirty": None}
        commit = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no") or git(
            "ls-files", "--others", "--exclude-standard", "--", *CODE_FOLDERS)
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    return {"commit": commit or None, "dirty": bool(dirty)}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


SIMD_FLAGS = (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("sve", "SVE"), ("asimd", "NEON"))  # widest first


def cpu_simd(cpuinfo: str | None = None, features: Mapping[str, bool] | None = None) -> str:
    """The widest vector extension the CPU has ("AVX-512", "AVX2", "SVE", "NEON"), "" if unknown. torch,
    oneDNN, MKL, OpenBLAS and numpy pick their CPU kernels by it unless the run pinned them
    (`suite.numerics`), so the learned placers' floats (and then their searches) can differ between hosts
    that differ in it. Read from /proc/cpuinfo; where there is none (not Linux), from the CPU features that
    numpy detected at import (`features`: its `__cpu_features__`)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return _simd_from_numpy(features)
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    return next((name for flag, name in SIMD_FLAGS if flag in flags), "")


def _simd_from_numpy(features: Mapping[str, bool] | None) -> str:
    """`cpu_simd` from numpy's run-time CPU detection (names: its `__cpu_features__` keys)."""
    if features is None:
        try:
            from numpy._core._multiarray_umath import __cpu_features__ as features
        except ImportError:
            return ""
    return next((name for flag, name in SIMD_FLAGS if features.get(flag.upper())), "")


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def machine_info() -> dict[str, Any]:
    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": cpu_model(),
        "simd": cpu_simd(),
        "cpus": usable_cpus(),
    }
