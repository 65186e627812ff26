"""The runner: a suite spec (workloads x clusters x placers x seeds + methodology + evaluator) -> stored rows.

A spec is a TOML file (`suite/specs/*.toml` for the built-in ones)::

    name = "quick"
    description = "..."
    workloads = ["@zoo"]              # zoo names, graph files, or "@zoo" (every default zoo workload)
    clusters = ["haswell_2k80"]       # preset names, cluster files, or "@presets"
    placers = ["@all", {name = "x", params = {k = 1}, label = "x-k1"}]  # names, tables, or "@all"
    seeds = [0]                       # default: the methodology's
    methodology = "v1"                # name or file
    evaluator = "simulator"           # or a name from `register_evaluator` / entry points placebench.evaluators
    simulator_engine = "fast"         # optional: "fast" or "reference" (same semantics)
    profiles = ["p/nmt__cuda0.json"]  # optional: measured per-op times (`placebench profile`) for the simulator
    cell_timeout_s = 60               # default: the methodology's
    plugins = []                      # modules or .py files imported (here and in every worker) first
    [budget]                          # overrides of the methodology's search budget
    max_evaluations = 200
    max_seconds = 5.0

Relative file paths in a spec are relative to the spec file. With `profiles`, the simulator takes each op's
time on the devices a profile applies to from the profile of its workload (matched by the graph's content
hash) instead of the roofline estimate; those cells' evaluator is `simulator+profiles:<digest of the
profiles>`, so they are never mixed or compared with the analytic simulator's. A profile may time only some
ops: the store's manifest says, under `profiles` (by that evaluator label, then cluster), how many op times
the profiles give each device, the others being roofline estimates.

Each cell runs in a worker process (start method "spawn": torch and fork do not mix) with a timeout. A
placer that raises gives a row with status `error` and the exception; one that hangs past the cell timeout
is killed and gives `timeout`; a worker that dies gives `error` naming its signal or exit code; an invalid final
placement gives `invalid`; a placer that raises `NotApplicable` gives `skipped`. A workload that no placement
can put on a cluster (an op, or a colocation group, allowing none of the cluster's device kinds) is refused
when the run is planned, before any cell runs: it is the spec's error, not a result of any placer, and rows
would store it once per placer and seed as if each had been tried. The final placement is
always re-measured by a fresh evaluator (outside the search budget), and a simulated one again by the
runner itself (`check_in_runner`); the search's own numbers are never reported as the result. What a
placer prints goes to stderr; killing a worker kills its process group, and on Linux a worker dies with
the runner. Finished cells are stored at once; rerunning a spec skips stored cells, except those whose
placer's source has changed since (`suite.placer_code`) or that were computed with other CPU math kernels
(`suite.numerics`; see `run`).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import json
import math
import multiprocessing
import multiprocessing.connection
import os
import re
import shlex
import signal
import sys
import threading
import time
import traceback
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

import suite
from suite import methodology as _methodology
from suite import registry, simulator
from suite.backends import REAL_BACKENDS, check_available
from suite.cluster import Cluster
from suite.costmodel import Profile, load_profile, profile_coverage
from suite.errors import BudgetExhausted, ClusterError, PlacebenchError, SpecError, UnknownNameError
from suite.evaluator import Evaluator, Measurement, SimulatorBackend, profiled_serial_bound_s
from suite.graph import OpGraph
from suite.methodology import Budget, Methodology
from suite.numerics import run_kernels
from suite.numerics import worker_env as numerics_env
from suite.placement import check_placeable, placement_hash
from suite.placer_code import placer_code
from suite.store import Store, _json_safe, cpu_simd, machine_info, package_versions
from suite.textfile import MAX_SHOWN, as_float, load_toml, short_repr

SPEC_DIR = Path(__file__).parent / "specs"
DEFAULT_SPEC = "quick"
EVALUATOR_GROUP = "placebench.evaluators"  # entry points: name -> factory(workload, cluster, methodology)
FAILED_STATUSES = ("timeout", "error")  # what --retry-failed reruns
MAX_CURVE_POINTS = 256
_SPEC_KEYS = {
    "name",
    "description",
    "workloads",
    "clusters",
    "placers",
    "seeds",
    "methodology",
    "evaluator",
    "simulator_engine",
    "profiles",
    "cell_timeout_s",
    "plugins",
    "budget",
}


# -- specs ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PlacerEntry:
    """One placer column of a spec: registry name, keyword parameters, and the label shown in tables."""

    name: str
    params: Mapping[str, Any] = field(default_factory=dict)
    label: str = ""

    @property
    def params_json(self) -> str:
        return json.dumps(dict(self.params), sort_keys=True, separators=(",", ":"))

    @property
    def params_hash(self) -> str:
        return hashlib.sha256(self.params_json.encode()).hexdigest()[:12]

    @property
    def shown(self) -> str:
        if self.label:
            return self.label
        if not self.params:
            return self.name
        return f"{self.name}({','.join(f'{k}={json.dumps(v)}' for k, v in sorted(self.params.items()))})"


@dataclass(frozen=True)
class Spec:
    name: str
    workloads: tuple[str, ...]
    clusters: tuple[str, ...]
    placers: tuple[PlacerEntry, ...]  # a PlacerEntry named "@all" expands to every available placer
    seeds: tuple[int, ...] | None = None
    methodology: str = _methodology.DEFAULT
    evaluator: str = "simulator"
    simulator_engine: str | None = None
    cell_timeout_s: float | None = None
    plugins: tuple[str, ...] = ()
    budget: Mapping[str, Any] = field(default_factory=dict)
    description: str = ""
    profiles: tuple[str, ...] = ()
    source: str = "<spec>"

    def as_dict(self) -> dict[str, Any]:
        """The spec as the table it was read from (unset optional fields left out): round-trips."""
        d = {
            "name": self.name,
            "description": self.description,
            "workloads": list(self.workloads),
            "clusters": list(self.clusters),
            "placers": [{"name": p.name, "params": dict(p.params), "label": p.label} if p.params or p.label else p.name
                        for p in self.placers],  # "@all" is a name only: a table may not name it
            "seeds": list(self.seeds) if self.seeds is not None else None,
            "methodology": self.methodology,
            "evaluator": self.evaluator,
            "simulator_engine": self.simulator_engine,
            "profiles": list(self.profiles) or None,
            "cell_timeout_s": self.cell_timeout_s,
            "plugins": list(self.plugins),
            "budget": dict(self.budget),
        }
        return {k: v for k, v in d.items() if v is not None}


def spec_names() -> list[str]:
    return sorted(p.stem for p in SPEC_DIR.glob("*.toml"))


def _looks_like_path(s: str) -> bool:
    return "/" in s or s.endswith((".toml", ".json", ".gz", ".py"))


def _not_a_list(where: str, what: str, value: Any) -> None:
    """A bare string or table where the spec documents a list is refused, saying how to write it: reading
    `workloads = "mlp"` as `["mlp"]` would be silent repair (no committed spec or README example relies on it)."""
    if isinstance(value, str):
        shown = short_repr(value)
        hint = f"write [{shown}]" if shown == repr(value) else "put it in a list"
        raise SpecError(f"{where}: expected a list of {what}, got the string {shown}: {hint}")
    if isinstance(value, dict):
        raise SpecError(f"{where}: expected a list of {what}, got a single table {short_repr(value)}: put it in a "
                        f"list, [{{name = ...}}]")


def _str_list(where: str, value: Any) -> tuple[str, ...]:
    _not_a_list(where, "names", value)
    if not isinstance(value, list) or not value:
        raise SpecError(f"{where}: expected a non-empty list of names, got {short_repr(value)}")
    for i, v in enumerate(value):
        if not isinstance(v, str) or not v:
            raise SpecError(f"{where}[{i}]: expected a name, got {short_repr(v)}")
    twice = [v for i, v in enumerate(value) if v in value[:i]]
    if twice:
        raise SpecError(f"{where}: {short_repr(twice[0])} is listed twice")
    return tuple(value)


def _resolve(ref: str, base: Path | None) -> str:
    """A file reference relative to the spec file becomes absolute; names stay names."""
    if base is not None and _looks_like_path(ref) and not ref.startswith("@") and not Path(ref).is_absolute():
        return str((base / ref).resolve())
    return ref


def _placer_entries(where: str, value: Any) -> tuple[PlacerEntry, ...]:
    _not_a_list(where, "placer names or tables", value)
    if not isinstance(value, list) or not value:
        raise SpecError(f"{where}: expected a non-empty list of placer names or tables, got {short_repr(value)}")
    out = []
    for i, item in enumerate(value):
        if isinstance(item, str) and item:
            out.append(PlacerEntry(item))
        elif isinstance(item, dict):
            unknown = set(item) - {"name", "params", "label"}
            if unknown:
                raise SpecError(f"{where}[{i}]: unknown field(s) {short_repr(sorted(unknown))}; known: label, name, "
                                f"params")
            name, params, label = item.get("name"), item.get("params", {}), item.get("label", "")
            if not isinstance(name, str) or not name or name == "@all":
                raise SpecError(f"{where}[{i}].name: expected a placer name, got {short_repr(name)}")
            if not isinstance(params, dict):
                raise SpecError(f"{where}[{i}].params: expected a table, got {short_repr(params)}")
            _json_values(f"{where}[{i}].params", params)
            if not isinstance(label, str):
                raise SpecError(f"{where}[{i}].label: expected a string, got {short_repr(label)}")
            out.append(PlacerEntry(name, params, label))
        else:
            raise SpecError(f"{where}[{i}]: expected a placer name or a table, got {short_repr(item)}")
        if out[-1] in out[:-1]:
            raise SpecError(f"{where}[{i}]: the same placer entry as placers[{out.index(out[-1])}]")
    return tuple(out)


def _at(where: str, key: Any) -> str:
    """`where.key`, or `where['key...']` (escaped, cut) for a key with a newline or other unprintable character
    or a huge one: an error message is one line of bounded length, as the cluster loader shows keys."""
    if isinstance(key, str) and key.isprintable() and len(key) <= MAX_SHOWN:
        return f"{where}.{key}"
    return f"{where}[{short_repr(key)}]"


def _json_values(where: str, value: Any) -> None:
    """Parameters are stored as JSON (a row's params, its cell's identity): a TOML date or time is refused,
    naming its field, not a TypeError when the cell's key is made."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            _json_values(_at(where, k), v)
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            _json_values(f"{where}[{i}]", v)
    elif value is not None and not isinstance(value, str | int | float):
        raise SpecError(f"{where}: {short_repr(value)} is not a parameter value (a string, number, boolean, array "
                        f"or table); write a date or time as a string")


_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def _nul_free(where: str, value: Any) -> None:
    """No string of a spec holds a NUL character (file names cannot; it is never meant)."""
    if isinstance(value, str) and "\x00" in value:
        raise SpecError(f"{where}: {short_repr(value)} contains a NUL character")
    if isinstance(value, Mapping):
        for k, v in value.items():
            _nul_free(_at(where, k), k)
            _nul_free(_at(where, k), v)
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            _nul_free(f"{where}[{i}]", v)


def spec_from_dict(data: Mapping[str, Any], *, source: str = "<spec>", base: Path | None = None) -> Spec:
    """Validate a spec table; every error names the source, the field and the value."""
    unknown = set(data) - _SPEC_KEYS
    if unknown:
        raise SpecError(f"{source}: unknown field(s) {short_repr(sorted(unknown))}; known: "
                        f"{', '.join(sorted(_SPEC_KEYS))}")
    _nul_free(source, dict(data))
    name = data.get("name")
    if name is not None and not isinstance(name, str):  # a number, a TOML date or table
        raise SpecError(f"{source}: field 'name' must be a string, got {short_repr(name)}")
    if not name:
        raise SpecError(f"{source}: field 'name' is missing or empty")
    if not _PLAIN_NAME.fullmatch(name):
        raise SpecError(f"{source}: name {short_repr(name)} must be a plain name (letters, digits, '.', '_', '-'): it names "
                        f"the default store, runs/<name>")
    for key in ("workloads", "clusters", "placers"):
        if key not in data:
            raise SpecError(f"{source}: field {key!r} is missing")
    seeds = data.get("seeds")
    if seeds is not None:
        _methodology.check_seeds(f"{source}: seeds", seeds)
    evaluator = data.get("evaluator", "simulator")
    if not isinstance(evaluator, str) or not evaluator:
        raise SpecError(f"{source}: evaluator must be a name, got {short_repr(evaluator)}")
    engine = data.get("simulator_engine")
    if engine is not None and engine not in ("fast", "reference"):
        raise SpecError(f"{source}: simulator_engine {short_repr(engine)} is not 'fast' or 'reference'")
    timeout = data.get("cell_timeout_s")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0):
        raise SpecError(f"{source}: cell_timeout_s must be a positive number of seconds, got {short_repr(timeout)}")
    if timeout is not None and not math.isfinite(as_float(timeout)):
        raise SpecError(f"{source}: cell_timeout_s must be a finite number of seconds, got {short_repr(timeout)}")
    budget = data.get("budget", {})
    if not isinstance(budget, dict) or set(budget) - {"max_evaluations", "max_seconds"}:
        got = sorted(set(budget) - {"max_evaluations", "max_seconds"}) if isinstance(budget, dict) else None
        raise SpecError(f"{source}: budget must be a table with max_evaluations and/or max_seconds, got "
                        + (f"unknown key(s) {short_repr(got)}" if got else short_repr(budget)))
    if budget:  # validate the numbers the way the methodology does
        _methodology.from_dict({"version": "check", "budget": budget}, source=f"{source}: spec")
    meth = data.get("methodology", _methodology.DEFAULT)
    if not isinstance(meth, str) or not meth:
        raise SpecError(f"{source}: methodology must be a name or a file, got {short_repr(meth)}")
    plugins = data.get("plugins", [])
    if not isinstance(plugins, list) or not all(isinstance(p, str) and p for p in plugins):
        raise SpecError(f"{source}: plugins must be a list of module names or .py files, got {short_repr(plugins)}")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise SpecError(f"{source}: description must be a string, got {short_repr(description)}")
    profiles = data.get("profiles", [])
    if not isinstance(profiles, list) or not all(isinstance(p, str) and p for p in profiles):
        raise SpecError(f"{source}: profiles must be a list of profile files, got {short_repr(profiles)}")
    if profiles and evaluator != "simulator":
        raise SpecError(f"{source}: profiles are per-op times for the simulator; evaluator {short_repr(evaluator)} measures "
                        f"its own")
    return Spec(
        name=name,
        description=description,
        workloads=tuple(_resolve(w, base) for w in _str_list(f"{source}: workloads", data["workloads"])),
        clusters=tuple(_resolve(c, base) for c in _str_list(f"{source}: clusters", data["clusters"])),
        placers=_placer_entries(f"{source}: placers", data["placers"]),
        seeds=tuple(seeds) if seeds is not None else None,
        methodology=_resolve(meth, base) if meth.endswith(".toml") else meth,
        evaluator=evaluator,
        simulator_engine=engine,
        cell_timeout_s=float(timeout) if timeout is not None else None,
        plugins=tuple(_resolve(p, base) for p in plugins),
        budget=dict(budget),
        source=source,
        profiles=tuple(_resolve(p, base) for p in profiles),
    )


def load_spec(name_or_path: str = DEFAULT_SPEC) -> Spec:
    """A built-in spec by name (`placebench list specs`) or a spec file by path."""
    given = Path(name_or_path)
    path = given
    if not _looks_like_path(name_or_path) and not path.is_file():
        path = SPEC_DIR / f"{name_or_path}.toml"  # a built-in name wins over a folder of that name (a store)
    if given.is_dir() and not path.is_file():  # `placebench run STORE`: the store goes to --out
        from suite.store import is_store_dir

        if is_store_dir(given):
            raise SpecError(f"{name_or_path} is a results store, not a spec: to resume or extend it, run a spec "
                            f"into it: {_run_into(given, name_or_path)}")
        raise SpecError(f"{name_or_path} is a directory, not a spec (a built-in name or a spec file)")
    if not path.is_file() and path != given:
        raise UnknownNameError(f"unknown spec {name_or_path!r}; built-in: {', '.join(spec_names())}")
    store = _store_of_file(given) if path == given and given.is_file() else None
    if store is not None:  # `placebench run STORE/results.csv`: one of a store's own files
        raise SpecError(f"{name_or_path} is a file of the results store {store}, not a spec: to resume or extend "
                        f"the store, run a spec into it: {_run_into(store, str(store))}")
    data = load_toml(path, SpecError, "spec")
    return spec_from_dict(data, source=str(path), base=path.resolve().parent)


def _store_of_file(path: Path) -> Path | None:
    """The store whose own file `path` is (its manifest, a results table, a cell file), or None."""
    from suite.store import is_store_dir

    if path.name in ("manifest.json", "results.csv", "results.parquet") and is_store_dir(path.parent):
        return path.parent
    if path.parent.name == "cells" and path.suffix == ".json" and is_store_dir(path.parent.parent):
        return path.parent.parent
    return None


def _run_into(path: Path, given: str) -> str:
    """The command that runs into the store at `path` (`given` as the user wrote it), with the spec its last
    run recorded (SPEC where it records none)."""
    from suite.store import StoreError
    from suite.textfile import load_json

    spec = "SPEC"
    try:
        manifest = load_json(path / "manifest.json", StoreError, "store manifest")
        name = manifest["runs"][-1]["spec"]
        source = manifest["specs"][name].get("source", "")
        builtin = SPEC_DIR / f"{name}.toml"
        if source and not (builtin.is_file() and Path(source).resolve() == builtin.resolve()):
            spec = shlex.quote(source)
        elif isinstance(name, str) and name:
            spec = shlex.quote(name)
    except (StoreError, LookupError, TypeError, AttributeError, OSError):
        pass  # a manifest without a run (or a damaged one) names no spec
    return f"placebench run {spec} --out {shlex.quote(given)}"


# -- plugins --------------------------------------------------------------------------------------------
_PLUGINS: dict[str, ModuleType] = {}


def load_plugins(refs: Sequence[str]) -> None:
    """Import plugin modules (by module name or .py file) once per process, so their placers register."""
    from suite.placer import prints_to_stderr

    for ref in refs:
        if ref in _PLUGINS:
            continue
        try:
            with prints_to_stderr():  # stdout is the command's output, not the plugin's
                if ref.endswith(".py") or "/" in ref:
                    path = Path(ref)
                    if not path.is_file():
                        raise SpecError(f"plugin {ref}: no such file")
                    name = f"placebench_plugin_{path.stem}_{hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:8]}"
                    mspec = importlib.util.spec_from_file_location(name, path)
                    assert mspec is not None and mspec.loader is not None
                    module = importlib.util.module_from_spec(mspec)
                    sys.modules[name] = module  # as an import would: its classes' source can be found (placer_code)
                    try:
                        mspec.loader.exec_module(module)
                    except BaseException:
                        del sys.modules[name]
                        raise
                else:
                    module = importlib.import_module(ref)
        except PlacebenchError:
            raise
        except SystemExit as exc:  # sys.exit() at import must not end placebench as if it had succeeded
            raise SpecError(f"plugin {ref!r} called sys.exit({short_repr(exc.code)}) while being imported") from None
        except Exception as exc:
            raise SpecError(f"plugin {ref!r} failed to import: {type(exc).__name__}: {exc}") from None
        _PLUGINS[ref] = module


# -- evaluators -----------------------------------------------------------------------------------------
_EVALUATORS: dict[str, Callable[..., Any]] = {}


def register_evaluator(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: `factory(workload, cluster, methodology) -> Backend` available as `evaluator = name`.

    Packages can instead declare the factory under the entry-point group `placebench.evaluators`. The
    built-in "simulator" needs neither."""

    def deco(factory: Callable[..., Any]) -> Callable[..., Any]:
        from importlib.metadata import entry_points

        from suite.placer import check_name_free, origin

        installed = {ep.name: ep.value for ep in entry_points(group=EVALUATOR_GROUP)}
        if name == "simulator" or name in installed:  # a plugin must not pass its rows off as another's
            taken = "the built-in simulator" if name == "simulator" else f"the installed evaluator {installed[name]}"
            raise PlacebenchError(f"evaluator name {name!r} is taken by {taken}; register {origin(factory)} under "
                                  "another name")
        check_name_free("evaluator", name, _EVALUATORS.get(name), factory)
        _EVALUATORS[name] = factory
        return factory

    return deco


def evaluator_names() -> list[str]:
    from importlib.metadata import entry_points

    return sorted({"simulator", *_EVALUATORS, *(ep.name for ep in entry_points(group=EVALUATOR_GROUP))})


def _evaluator_factory(name: str) -> Callable[..., Any]:
    if name in _EVALUATORS:
        return _EVALUATORS[name]
    from importlib.metadata import entry_points

    from suite.placer import prints_to_stderr

    for ep in entry_points(group=EVALUATOR_GROUP):
        if ep.name == name:
            try:
                with prints_to_stderr():
                    return ep.load()
            except Exception as exc:
                raise PlacebenchError(f"evaluator {name!r} ({ep.value}) failed to load: {type(exc).__name__}: {exc}") from None
    raise UnknownNameError(f"unknown evaluator {name!r}; available: {', '.join(evaluator_names())}")


# -- planning -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Cell:
    """One unit of work, sent to a worker: everything needed to run it and to key its row."""

    cell_id: str
    key: Mapping[str, Any]
    workload_ref: str
    cluster_ref: str
    placer: PlacerEntry
    seed: int
    methodology: Methodology
    evaluator: str
    simulator_engine: str | None
    timeout_s: float
    plugins: tuple[str, ...]
    placer_code: str | None = None  # fingerprint of the placer's source (suite.placer_code); not in the key
    profiles: tuple[Profile, ...] = ()  # the profiles of the cell's workload, read when planned (digest: key's evaluator)

    @property
    def budget(self) -> Budget:
        return self.methodology.budget

    def describe(self) -> str:
        return f"{self.key['workload']} / {self.key['cluster']} / {self.key['placer']} / seed {self.seed}"


@dataclass
class Plan:
    spec: Spec
    methodology: Methodology
    cells: list[Cell]
    workloads: dict[str, OpGraph]  # by reference (zoo name or absolute path)
    clusters: dict[str, Cluster]
    seeds: tuple[int, ...]  # what the cells run: the spec's, else the methodology's
    cell_timeout_s: float  # likewise


def cell_id(key: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(dict(key), sort_keys=True).encode()).hexdigest()[:20]


def _expand_workloads(refs: Sequence[str]) -> list[str]:
    out: list[str] = []
    for ref in refs:
        if ref == "@zoo":
            out.extend(registry.workload_names())
        elif ref.startswith("@"):
            raise SpecError(f"workloads: unknown set {ref!r}; use '@zoo' or names")
        else:
            out.append(ref)
    return list(dict.fromkeys(out))


def _expand_clusters(refs: Sequence[str]) -> list[str]:
    out: list[str] = []
    for ref in refs:
        if ref == "@presets":
            out.extend(registry.cluster_names())
        elif ref.startswith("@"):
            raise SpecError(f"clusters: unknown set {ref!r}; use '@presets' or names")
        else:
            out.append(ref)
    return list(dict.fromkeys(out))


def _expand_placers(entries: Sequence[PlacerEntry]) -> list[PlacerEntry]:
    from suite.placer import (
        PlacerFailed,
        PluginError,
        canonical_params,
        make_placer,
        placer_class,
        placer_names,
    )

    available = placer_names()
    out: list[PlacerEntry] = []
    for e in entries:
        if e.name == "@all":
            out.extend(PlacerEntry(n) for n in available)
        elif e.name.startswith("@"):
            raise SpecError(f"placers: unknown set {e.name!r}; use '@all' or names")
        elif e.name not in available:
            raise UnknownNameError(f"unknown placer {e.name!r}; available: {', '.join(available)}")
        else:
            out.append(e)
    for i, e in enumerate(out):  # parameters are input: check them now (placers without parameters load lazily)
        if e.params:
            try:
                cls = placer_class(e.name)
            except PluginError:
                continue  # a broken plugin becomes error rows, not a failed run
            with contextlib.suppress(PlacerFailed):  # a placer whose constructor fails: error rows, not a spec error
                make_placer(e.name, **dict(e.params))
            out[i] = PlacerEntry(e.name, canonical_params(cls, e.params), e.label)  # `k = 1` is `k = 1.0`: one cell
    labels: dict[str, PlacerEntry] = {}
    for e in out:
        if e.shown in labels and labels[e.shown] != e:
            raise SpecError(f"placers: two different entries are labelled {e.shown!r}; give them distinct labels")
        labels[e.shown] = e
    return list({(e.name, e.params_json, e.shown): e for e in out}.values())


def _one_definition_per_name(kind: str, loaded: Mapping[str, OpGraph | Cluster]) -> None:
    """Tables group rows by name: two different graphs (or clusters) under one name would be merged."""
    by_name: dict[str, tuple[str, str]] = {}
    for ref, x in loaded.items():
        if x.name in by_name and by_name[x.name][1] != x.content_hash:
            raise SpecError(f"{kind}s {by_name[x.name][0]!r} and {ref!r} are both named {x.name!r} but differ; "
                            f"rename one of them")
        by_name.setdefault(x.name, (ref, x.content_hash))


def _check_store_matches(store: Store, m: Mapping[str, Any], records: Sequence[Mapping[str, Any]], plan: Plan,
                         labels: Mapping[str, Any]) -> None:
    """A store (its manifest `m` and stored `records`) holds one setup (methodology, search budget, evaluator;
    with profiles, one evaluator label per workload, of the same base evaluator) and one definition per
    workload and cluster name: refuse to mix in another, which tables would merge as if it were more seeds.
    What binds it is what its stored rows were made with: a methodology version, a placer label (`labels`:
    those its rows carry) or a workload or cluster name whose rows were all removed binds nothing."""
    if plan.cells and records:
        planned = {c.key["workload"]: _setup(c.key) for c in plan.cells}
        for row in records:
            ours, theirs, where = planned.get(row.get("workload")), _setup(row), f" of {row.get('workload')}"
            if ours is None:  # another workload's rows: the store-wide part must agree
                ours, theirs, where = _store_wide(next(iter(planned.values()))), _store_wide(theirs), ""
            if theirs != ours:
                raise SpecError(f"{store.root}: its rows{where} were made with {_setup_text(theirs)}; this run has "
                                f"{_setup_text(ours)}; tables would mix them: use another --out")
    # the manifest keeps what every past run used; only what the stored rows were made with binds the store
    old_meth = m.get("methodologies", {}).get(plan.methodology.version)
    if not any(r.get("methodology") == plan.methodology.version for r in records):
        old_meth = None
    # its budget is the last run's (a spec may set it) and every row carries its own, checked above
    changed = [f for f in _methodology.changed_fields(old_meth, plan.methodology.as_dict())
               if not f.startswith("budget.")] if isinstance(old_meth, Mapping) else []
    if changed:
        raise SpecError(f"{store.root}: its rows were made under another methodology named "
                        f"{plan.methodology.version!r} (differs in {', '.join(changed)}); tables would mix them: "
                        f"give the changed methodology its own version, or use another --out")
    for p in {c.placer.shown: c.placer for c in plan.cells}.values():
        was = labels.get(p.shown)
        if was is not None and (was["name"], was["params_hash"]) != (p.name, p.params_hash):
            raise SpecError(f"{store.root}: placer label {p.shown!r} is stored for {was['name']} with params "
                            f"{was.get('params', '?')}; this run gives it to {p.name} with params {p.params_json}; "
                            f"tables would show both in one column: give it another label, or use another --out")
    for kind, new in (("workload", plan.workloads), ("cluster", plan.clusters)):
        old = m.get(f"{kind}s", {})
        with_rows = {r.get(kind) for r in records}
        for x in new.values():
            entry = old.get(x.name)
            if x.name in with_rows and isinstance(entry, Mapping) and entry.get("hash") not in (None, x.content_hash):
                raise SpecError(
                    f"{store.root}: its rows for {kind} {x.name!r} were made from a different definition (hash "
                    f"{str(entry['hash'])[:12]}, now {x.content_hash[:12]}); tables would mix them: use another --out"
                )


_SETUP = ("methodology", "budget_evaluations", "budget_seconds", "evaluator")


def _setup(key: Mapping[str, Any]) -> dict[str, Any]:
    """What a row was measured under: methodology, budget, evaluator (with its profiles' digest)."""
    return {k: key.get(k) for k in _SETUP}


def _store_wide(setup: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a setup every row of a store shares: profiles are per workload, the base evaluator is not."""
    return {**setup, "evaluator": str(setup.get("evaluator")).split("+profiles:")[0]}


def _setup_text(setup: Mapping[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in setup.items())


def _stored_placer_labels(manifest: Mapping[str, Any], records: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Placer label -> {name, params, params_hash} of the labels a store's cells carry: from its manifest, or
    for stores written before the manifest kept them, from the cells. A label none of its cells carries (they
    were all removed) binds nothing."""
    kept = manifest.get("placers") if isinstance(manifest.get("placers"), Mapping) else {}
    labels: dict[str, dict[str, Any]] = {}
    for r in records:
        if r["placer"] not in labels:
            labels[r["placer"]] = kept.get(r["placer"]) or {"name": r.get("placer_name"), "params": r.get("params"),
                                                            "params_hash": r.get("params_hash")}
    return labels


def placer_labels(spec: Spec) -> list[str]:
    """The column labels the spec's placers get in tables (plugins loaded, '@all' expanded)."""
    load_plugins(spec.plugins)
    return [e.shown for e in _expand_placers(spec.placers)]


def make_plan(spec: Spec) -> Plan:
    """Resolve names, load every workload and cluster (checking them), and list the cells in spec order."""
    load_plugins(spec.plugins)
    if spec.evaluator not in evaluator_names():
        raise UnknownNameError(f"unknown evaluator {spec.evaluator!r}; available: {', '.join(evaluator_names())}")
    check_available(spec.evaluator, f"{spec.source}: evaluator {spec.evaluator!r}")  # not an error row per cell
    meth = _methodology.load(spec.methodology)
    if spec.budget:
        meth = meth.with_budget(**spec.budget)
    timeout_s = spec.cell_timeout_s if spec.cell_timeout_s is not None else meth.cell_timeout_s
    seeds = spec.seeds if spec.seeds is not None else meth.seeds
    workloads = {ref: suite.load_workload(ref) for ref in _expand_workloads(spec.workloads)}
    clusters = {ref: suite.load_cluster(ref) for ref in _expand_clusters(spec.clusters)}
    _one_definition_per_name("workload", workloads)
    _one_definition_per_name("cluster", clusters)
    for graph in workloads.values():  # a combination no placement can satisfy: a clear error now, not odd rows
        for cluster in clusters.values():
            check_placeable(graph, cluster)
    profiles = _profiles_by_workload(spec.profiles, workloads, spec.source)
    if spec.evaluator == "simulator":  # op and transfer times must be finite: a clear error now, not error rows
        for wref, graph in workloads.items():
            for cref, cluster in clusters.items():
                _check_costs(graph, cluster, cref, profiles[wref])
    placers = _expand_placers(spec.placers)
    codes = {p.name: placer_code(p.name) for p in placers}
    cells = []
    seen: set[str] = set()
    for cref, cluster in clusters.items():
        for wref, graph in workloads.items():
            for p in placers:
                for seed in seeds:
                    key = {
                        "workload": graph.name,
                        "workload_hash": graph.content_hash,
                        "cluster": cluster.name,
                        "cluster_hash": cluster.content_hash,
                        "placer": p.shown,
                        "placer_name": p.name,
                        "params_hash": p.params_hash,
                        "seed": int(seed),
                        "methodology": meth.version,
                        "budget_evaluations": int(meth.budget.max_evaluations),
                        "budget_seconds": float(meth.budget.max_seconds),
                        "evaluator": _evaluator_label(spec.evaluator, profiles[wref]),
                    }
                    cid = cell_id(key)
                    if cid in seen:
                        continue
                    seen.add(cid)
                    cells.append(
                        Cell(cid, key, wref, cref, p, int(seed), meth, spec.evaluator, spec.simulator_engine, timeout_s,
                             spec.plugins, codes[p.name], tuple(profiles[wref]))
                    )
    return Plan(spec, meth, cells, workloads, clusters, tuple(int(x) for x in seeds), timeout_s)


def _check_runnable(plan: Plan, cells: Sequence[Cell]) -> None:
    """A real evaluator runs each cluster device on the torch device of its default map (a GPU on the next
    visible CUDA device) and each workload's zoo model: a cluster naming more GPUs than this machine has, or a
    workload without a zoo model, fails every cell the same way, so it is refused before any cell runs. Only the
    `cells` that would run are checked: a store measured on a GPU machine still resumes (or prints) on a CPU one
    when it has nothing left to run."""
    from suite.backends.devices import DeviceMap
    from suite.backends.workload import has_model

    spec = plan.spec
    if spec.evaluator not in REAL_BACKENDS:
        return
    clusters = {c.cluster_ref: plan.clusters[c.cluster_ref] for c in cells}
    workloads = {c.workload_ref: plan.workloads[c.workload_ref] for c in cells}
    for cref, cluster in clusters.items():
        try:
            DeviceMap.default(cluster)
        except ClusterError as exc:
            raise ClusterError(f"{spec.source}: evaluator {spec.evaluator!r} cannot run cluster {cref}: {exc}") from None
    for wref, graph in workloads.items():
        if not has_model(graph):
            raise SpecError(f"{spec.source}: evaluator {spec.evaluator!r} runs zoo workloads and their variants; "
                            f"workload {wref} ({graph.name!r}) has no model in the zoo")


def _profiles_by_workload(paths: Sequence[str], workloads: Mapping[str, OpGraph], source: str
                          ) -> dict[str, list[Profile]]:
    """Profile files read and each given to the workload it was measured on (same content hash; a
    hand-written profile without a hash: same name). A profile of none of the workloads is an error; one
    given twice (the same file, or a copy) counts once, so its evaluator label is that of one."""
    out: dict[str, list[Profile]] = {ref: [] for ref in workloads}
    for path in paths:
        prof = load_profile(path)
        refs = [ref for ref, g in workloads.items()
                if prof.workload_hash == g.content_hash or (not prof.workload_hash and prof.workload == g.name)]
        if not refs:
            same = [g for g in workloads.values() if g.name == prof.workload]
            if same:  # captured anew since, or edited: the name alone would hide it
                which = (f"another graph than the workload {same[0].name!r} ({same[0].content_hash}) has now: "
                         "profile it again")
            elif len(workloads) == 1:
                [g] = workloads.values()
                which = f"not the workload {g.name!r} ({g.content_hash})"
            else:
                which = "none of the spec's workloads"
            raise SpecError(f"{source}: profile {path} was measured on workload {prof.workload!r} "
                            f"({prof.workload_hash or 'no hash'}), which is {which}")
        for ref in refs:
            if prof not in out[ref]:
                out[ref].append(prof)
    return out


def _evaluator_label(evaluator: str, profiles: Sequence[Profile]) -> str:
    """The evaluator a row names: the simulator with measured per-op times is another evaluator."""
    if not profiles:
        return evaluator
    digest = hashlib.sha256("\n".join(sorted(json.dumps(p.to_dict(), sort_keys=True) for p in profiles)).encode())
    return f"{evaluator}+profiles:{digest.hexdigest()[:12]}"


def _check_costs(graph: OpGraph, cluster: Cluster, cluster_ref: str, profiles: Sequence[Profile] = ()) -> None:
    """The simulator's op and transfer times are finite (ClusterError naming the cluster file otherwise), and
    some op takes more than 0 s on some device (`profiled_serial_bound_s`): a ProfileError when profiles make
    every op 0 s, a GraphError when the roofline does without profiles (0 FLOPs and 0 bytes everywhere, no
    device op_overhead_s)."""
    try:
        simulator.inputs_for(graph, cluster, profiles)
    except ClusterError as exc:
        raise ClusterError(f"{cluster_ref}: {exc}" if cluster_ref != cluster.name else str(exc)) from None
    profiled_serial_bound_s(graph, cluster, profiles)


# -- one cell (runs inside a worker) --------------------------------------------------------------------
_WORKLOADS: dict[str, OpGraph] = {}
_CLUSTERS: dict[str, Cluster] = {}


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def base_record(cell: Cell) -> dict[str, Any]:
    return {
        "cell_id": cell.cell_id,
        **cell.key,
        "params": cell.placer.params_json,
        "placer_code": cell.placer_code,
        "message": "",
        "placebench_version": suite.__version__,
    }


def failure_record(cell: Cell, status: str, message: str, cell_wall_time_s: float | None = None) -> dict[str, Any]:
    return {**base_record(cell), "status": status, "message": message, "cell_wall_time_s": cell_wall_time_s, "finished_at": _now()}


def make_backend(cell: Cell, graph: OpGraph, cluster: Cluster) -> Any:
    if cell.evaluator == "simulator":
        return SimulatorBackend(graph, cluster, cell.profiles, engine=cell.simulator_engine)
    return _evaluator_factory(cell.evaluator)(graph, cluster, cell.methodology)


def _measurement_fields(m: Measurement, used: Sequence[str] = ()) -> dict[str, Any]:
    """The row's measurement columns. `max_peak_memory_bytes` is the largest per-device peak, None when
    unknown: no peaks, or (an ok step) a device in `used` (the placement's devices) with no peak, as a real
    backend leaves out a CPU whose peak this OS cannot measure; a maximum over the other devices would pass
    for the step's largest peak (and `compare` would judge memory on it)."""
    peak = {k: int(v) for k, v in m.peak_memory_bytes.items()}
    unknown = m.status == "ok" and any(d not in peak for d in used)
    out: dict[str, Any] = {
        "status": m.status,
        "message": m.message,
        "peak_memory_bytes": json.dumps(peak, sort_keys=True) if peak else None,
        "max_peak_memory_bytes": max(peak.values()) if peak and not unknown else None,
        "oom_devices": ",".join(m.oom_devices),
        "bytes_transferred": int(m.bytes_transferred) if m.status != "invalid" else None,
    }
    if m.status == "ok" and m.step_time_s is not None:  # failures are a status, never a number
        samples = np.asarray(m.samples_s or (m.step_time_s,), dtype=np.float64)
        q25, q75 = np.percentile(samples, [25, 75])
        out.update(
            step_time_s=float(m.step_time_s),
            step_time_q25_s=float(q25),
            step_time_q75_s=float(q75),
            step_time_min_s=float(samples.min()),
            step_time_max_s=float(samples.max()),
            samples=int(samples.size),
        )
    return out


def _thin_curve(curve: Sequence[Any]) -> list[dict[str, Any]]:
    points = [c.as_dict() if hasattr(c, "as_dict") else dict(c) for c in curve]
    if len(points) <= MAX_CURVE_POINTS:
        return points
    idx = np.unique(np.linspace(0, len(points) - 1, MAX_CURVE_POINTS).round().astype(int))
    return [points[i] for i in idx]


def _load_cached(cell: Cell) -> tuple[OpGraph, Cluster]:
    graph = _WORKLOADS.get(cell.workload_ref)
    if graph is None:
        graph = suite.load_workload(cell.workload_ref)
        if len(_WORKLOADS) >= 8:
            _WORKLOADS.pop(next(iter(_WORKLOADS)))
        _WORKLOADS[cell.workload_ref] = graph
    if graph.content_hash != cell.key["workload_hash"]:
        raise SpecError(f"workload {cell.workload_ref!r} changed since the run was planned")
    cluster = _CLUSTERS.get(cell.cluster_ref)
    if cluster is None:
        cluster = _CLUSTERS[cell.cluster_ref] = suite.load_cluster(cell.cluster_ref)
    if cluster.content_hash != cell.key["cluster_hash"]:
        raise SpecError(f"cluster {cell.cluster_ref!r} changed since the run was planned")
    return graph, cluster


def run_cell(cell: Cell, on_search_start: Callable[[], None] | None = None) -> dict[str, Any]:
    """Run one cell in this process and return its record; never raises for a placer's failure.

    `on_search_start` is called when the setup (plugins, workload, placer) is done and the placer starts:
    the cell timeout counts from there (search + re-measurement), as the methodology says."""
    from suite.placement import validate
    from suite.placer import NotApplicable, PlacementResult, PlacerFailed, Problem, make_placer

    started = time.perf_counter()

    def done(status: str, message: str, **extra: Any) -> dict[str, Any]:
        return {
            **failure_record(cell, status, message, time.perf_counter() - started),
            **extra,
        }

    try:
        load_plugins(cell.plugins)
        graph, cluster = _load_cached(cell)
        placer = make_placer(cell.placer.name, **dict(cell.placer.params))
        backend = make_backend(cell, graph, cluster)
        _warm_up(graph, cluster, backend, (cell.workload_ref, cell.cluster_ref))
        evaluator = Evaluator(graph, cluster, cell.budget, methodology=cell.methodology, backend=backend)
        problem = Problem(graph, cluster, evaluator)
    except PlacerFailed as exc:  # the placer's bug: its traceback, as for one raised in place()
        return done("error", str(exc), traceback="".join(traceback.format_exception(exc.__cause__, limit=-8)))
    except PlacebenchError as exc:
        return done("error", str(exc))
    except Exception as exc:
        return done("error", f"setup failed: {type(exc).__name__}: {exc}", traceback=traceback.format_exc(limit=-8))
    if on_search_start is not None:
        on_search_start()
    search_started = time.perf_counter()
    try:
        result = placer.place(problem, cell.budget, cell.seed)
    except NotApplicable as exc:
        return done("skipped", str(exc), evaluations=evaluator.evaluations_used)
    except BudgetExhausted as exc:
        return done(
            "error",
            f"placer went past its search budget: {exc}",
            evaluations=evaluator.evaluations_used,
            search_wall_time_s=time.perf_counter() - search_started,
        )
    except (Exception, SystemExit, KeyboardInterrupt) as exc:  # sys.exit() in a placer (argparse) too
        return done(
            "error",
            f"{type(exc).__name__}: {exc}",
            evaluations=evaluator.evaluations_used,
            search_wall_time_s=time.perf_counter() - search_started,
            traceback=traceback.format_exc(limit=-8),
        )
    stats = {
        "evaluations": evaluator.evaluations_used,  # counted by the evaluator, not reported by the placer
        "search_wall_time_s": time.perf_counter() - search_started,
        "curve": _thin_curve(evaluator.curve),
    }
    if not isinstance(result, PlacementResult):
        return done("error", f"place() returned {type(result).__name__}, not a PlacementResult", **stats)
    stats["info"] = result.info
    # Re-measure the final placement with a fresh backend and evaluator, outside the search budget.
    try:
        placement = validate(result.placement, graph, cluster)  # indices, device names or {op: device}
        judge = Evaluator(graph, cluster, cell.budget, methodology=cell.methodology, backend=make_backend(cell, graph, cluster))
        m = judge.measure(placement)
    except PlacebenchError as exc:
        return done("invalid", str(exc), **stats)
    except Exception as exc:
        return done("error", f"re-measurement failed: {type(exc).__name__}: {exc}", **stats)
    used = [cluster.devices[d].name for d in sorted(set(placement.tolist()))]
    record = {**done(m.status, m.message, **stats), **_measurement_fields(m, used)}
    if m.status != "invalid":
        record["placement_hash"] = placement_hash(placement)
        record["placement"] = placement.tolist()
    return record


def check_in_runner(cell: Cell, record: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """(the record, True), or (an error row, False) where the runner's own simulation of its placement
    disagrees with it: the worker's evaluator was changed, and the worker must run no other cell.

    The worker re-measured the placement in the process the placer ran in, which the placer could have
    changed (a patched class of the evaluator or the simulator); the runner's process ran no placer. The
    simulator is deterministic, so they agree but for the last bits of float sums, where the workers' pinned
    math may differ from the runner's. Real-execution cells are not checked (they would be timed again)."""
    if cell.evaluator != "simulator" or record.get("placement") is None:
        return record, True
    graph, cluster = _load_cached(cell)
    judge = Evaluator(graph, cluster, cell.budget, methodology=cell.methodology, backend=make_backend(cell, graph, cluster))
    m = judge.measure(np.asarray(record["placement"], dtype=np.int64))
    ours = _measurement_fields(m, [cluster.devices[d].name for d in sorted(set(record["placement"]))])
    same = m.status == record["status"] and all(
        math.isclose(float(ours.get(k) or 0.0), float(record.get(k) or 0.0), rel_tol=1e-9)
        for k in ("step_time_s", "max_peak_memory_bytes"))
    if same:
        return record, True
    return {**failure_record(cell, "error", (
        f"the worker measured {record['status']} {record.get('step_time_s')!r} s, peak "
        f"{record.get('max_peak_memory_bytes')!r} B for its final placement, the runner {m.status} "
        f"{ours.get('step_time_s')!r} s, peak {ours.get('max_peak_memory_bytes')!r} B: the placer (or one run before "
        "it in that worker) changed the evaluator; the result is not kept"), record.get("cell_wall_time_s")),
        **{k: record[k] for k in ("evaluations", "search_wall_time_s") if k in record}}, False


# -- workers --------------------------------------------------------------------------------------------
def _watch_parent(parent_pid: int) -> None:
    """Exit when the runner that started this worker is gone (killed runs leave no orphans)."""
    while True:
        time.sleep(1.0)
        if os.getppid() != parent_pid:
            os._exit(3)


_WARM: set[tuple[str, str]] = set()


def _warm_up(graph: OpGraph, cluster: Cluster, backend: Any, key: tuple[str, str]) -> None:
    """Compile (or load from numba's cache) the simulator for this workload and cluster before the timed
    part of the cell, so that neither the cell timeout nor the placer's time budget pays for it.

    Only the simulator (`SimulatorBackend` and its subclasses) is warmed up. For a real-execution backend
    the warm-up was two real measurements of the whole model on one device, outside the cell timeout and
    unreported (a slow or stuck one ended as "setup took over 180 s"); each real measurement runs its own
    untimed warm-up steps (the methodology's timing), so it needs none."""
    if key in _WARM or not isinstance(backend, SimulatorBackend):
        return
    _WARM.add(key)
    from suite.placement import validate

    for d in range(cluster.num_devices):
        placement = np.full(graph.num_ops, d, dtype=np.int64)
        try:
            validate(placement, graph, cluster)
        except PlacebenchError:
            continue
        with contextlib.suppress(Exception):  # a broken engine shows up in the cell itself
            backend.measure(placement)
            backend.measure_batch(placement[None, :])
        return


def _worker_main(conn: multiprocessing.connection.Connection, parent_pid: int) -> None:
    # Ctrl-C (and a SIGTERM sent to the process group) reaches the workers too: the runner handles it (and
    # stops the workers); a worker that took it as a placer's exception, or died of it, would report a bogus
    # error row. The worker started with them held (`_stop_signals_held`): they are let in once ignored.
    for signum in _STOP_SIGNALS:  # SIGHUP too: a closed terminal's, which the runner handles as a SIGTERM
        signal.signal(signum, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
    if hasattr(os, "setpgrp"):  # a group of its own: killing the worker kills what its placer started too
        os.setpgrp()
    if sys.platform.startswith("linux"):  # the kernel ends this worker when the runner dies, even while a
        with contextlib.suppress(Exception):  # placer holds the GIL in C code (the watcher thread cannot run)
            import ctypes

            ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
    # what a placer prints goes to stderr: stdout is the run's table or its --json document
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdout = sys.stderr
    while True:
        try:
            cell = conn.recv()
        except (EOFError, OSError):
            return
        if cell is None:
            return
        try:
            record = run_cell(cell, lambda cell=cell: conn.send(("start", cell.cell_id)))
        except BaseException as exc:  # even a SystemExit or KeyboardInterrupt in a placer is a row
            record = failure_record(cell, "error", f"{type(exc).__name__}: {exc}")
        try:  # as the store writes it: a placer's info holding a function or a socket cannot stop the send
            conn.send(("done", _json_safe(record)))
        except (OSError, ValueError):
            return


_THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS")


@contextlib.contextmanager
def _worker_env(threads: int, numerics: Mapping[str, str]) -> Iterator[None]:
    """The environment a worker starts in: the math libraries' threads capped so parallel workers do not
    oversubscribe, and their kernels pinned as `numerics` says (`suite.numerics.worker_env`)."""
    wanted = {**{v: str(threads) for v in _THREAD_VARS}, **numerics}
    saved = {v: os.environ.get(v) for v in wanted}
    for v, value in wanted.items():
        os.environ.setdefault(v, value)
    try:
        yield
    finally:
        for v, old in saved.items():
            if old is None:
                os.environ.pop(v, None)
            else:
                os.environ[v] = old


@contextlib.contextmanager
def _bare_main() -> Iterator[None]:
    """Start workers without re-running the caller's __main__ in them (spawn would import it: a script
    without an `if __name__ == "__main__"` guard, or a program read from stdin, would break). Workers only
    need this module; placers reach them through the registry and the spec's plugins."""
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = ModuleType("__main__")
    try:
        yield
    finally:
        if main is not None:
            sys.modules["__main__"] = main


_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM, *([signal.SIGHUP] if hasattr(signal, "SIGHUP") else [])}


@contextlib.contextmanager
def _stop_signals_held() -> Iterator[None]:
    """Hold Ctrl-C, SIGTERM and SIGHUP (pending, not lost) while a worker starts; they arrive when it has started. The
    worker inherits the held signals, so a Ctrl-C while it imports Python, numpy and the suite does not kill it
    with a traceback on the run's stderr; it lets them in once it ignores them (`_worker_main`)."""
    if hasattr(signal, "pthread_sigmask"):
        from multiprocessing import resource_tracker

        resource_tracker.ensure_running()  # a start of its process unblocks them: done before they are held
    with _stop_signals_deferred():
        yield


@contextlib.contextmanager
def _stop_signals_deferred() -> Iterator[None]:
    """Hold Ctrl-C, SIGTERM and SIGHUP (pending, not lost: they arrive at the end) while a stopped run records
    what it did. A second one (Ctrl-C pressed twice; a closed terminal sends SIGHUP from the kernel and again
    from the shell) would otherwise stop the record half-way, leaving the manifest without the run's count."""
    if not hasattr(signal, "pthread_sigmask"):  # Windows: no signal masks
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _signal_text(signum: int) -> str:
    """'9 (SIGKILL; the host's out-of-memory killer sends this)', '11 (SIGSEGV)', or the number alone."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        return str(signum)
    return f"{signum} ({name}; the host's out-of-memory killer sends this)" if name == "SIGKILL" else f"{signum} ({name})"


BOOT_TIMEOUT_S = 180.0


class _Worker:
    def __init__(self, ctx: Any, threads: int, numerics: Mapping[str, str]):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, os.getpid()), name="placebench-worker")
        try:
            with _stop_signals_held(), _worker_env(threads, numerics), _bare_main():
                self.proc.start()
        except BaseException:  # a Ctrl-C held during the start arrives here: the caller never sees this worker
            if self.proc.pid is not None:
                self.kill()
            raise
        finally:
            child.close()
        self.cell: Cell | None = None
        self.submitted = 0.0
        self.started: float | None = None

    def submit(self, cell: Cell) -> bool:
        """Hand a cell to the worker; False if the worker is gone (the caller starts another)."""
        self.cell, self.submitted, self.started = cell, time.perf_counter(), None
        try:
            self.conn.send(cell)
        except (OSError, ValueError):
            self.kill()
            return False
        except BaseException:  # a cell that does not pickle, an interrupt: no worker may outlive the run
            self.kill()
            raise
        return True

    @property
    def deadline(self) -> float:
        if self.started is None:
            return self.submitted + BOOT_TIMEOUT_S + (self.cell.timeout_s if self.cell else 0.0)
        return self.started + (self.cell.timeout_s if self.cell else 0.0)

    def death_message(self, hint: str = "") -> str:
        """The error message of the cell of a worker that is gone: how it ended, then `hint` (how to rerun it)."""
        self.proc.join(timeout=5)
        code = self.proc.exitcode
        if code is None:
            self.kill()
            how = "worker stopped answering"
        elif code < 0:
            how = f"worker killed by signal {_signal_text(-code)}"
        else:
            how = f"worker died (exit code {code})"
        return f"{how}; {hint}" if hint else how

    def kill(self) -> None:
        """End the worker and every process its placers started (its process group), even when the worker
        itself is already gone: a placer's child must not outlive its cell, nor hold the run's output."""
        if self.proc.pid is not None and hasattr(os, "killpg"):
            with contextlib.suppress(OSError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(timeout=10)
        self.conn.close()

    def stop(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.conn.send(None)
        self.proc.join(timeout=2)
        self.kill()


def worker_numerics(cells: Sequence[Cell], simd: str | None = None) -> dict[str, str]:
    """The math libraries' settings for the workers of these cells (`suite.numerics`): pinned when every cell
    is simulated, so that the learned placers search alike on x86-64 hosts with AVX2 or AVX-512. `simd`: the
    host's vector extension (default: `store.cpu_simd`)."""
    simulated = all(c.evaluator == "simulator" for c in cells)
    return numerics_env(simulated, cpu_simd() if simd is None else simd)


def execute(
    cells: Sequence[Cell],
    *,
    jobs: int = 1,
    on_done: Callable[[dict[str, Any]], None],
    on_start: Callable[[Cell], None] | None = None,
    numerics: Mapping[str, str] | None = None,
    rerun_hint: str = "--retry-failed reruns the cell",
) -> None:
    """Run cells in `jobs` isolated worker processes; call `on_done(record)` for each, in finishing order.
    The workers' math libraries run as `numerics` says (default: `worker_numerics(cells)`). `rerun_hint`
    ends the message of a cell whose worker died (none: "")."""
    if not cells:
        return
    jobs = max(1, min(jobs, len(cells)))
    from suite.store import usable_cpus

    numerics = worker_numerics(cells) if numerics is None else numerics

    threads = max(1, usable_cpus() // jobs)
    ctx = multiprocessing.get_context("spawn")
    queue = deque(cells)
    idle: list[_Worker | None] = [None] * jobs
    busy: list[_Worker] = []
    try:
        while queue or busy:
            while queue and idle:
                w = idle.pop()
                cell = queue.popleft()
                if w is not None and (not w.proc.is_alive() or not w.submit(cell)):
                    w.kill()
                    w = None
                if w is None:
                    w = _Worker(ctx, threads, numerics)
                    w.submit(cell)  # a fresh worker's pipe takes it; if it dies at once, that shows below
                busy.append(w)
            wait_s = max(0.0, min(w.deadline for w in busy) - time.perf_counter())
            # a worker whose first send failed has a closed pipe (wait() would raise): its sentinel shows it
            handles = [w.conn for w in busy if not w.conn.closed] + [w.proc.sentinel for w in busy]
            multiprocessing.connection.wait(handles, timeout=min(wait_s, 5.0))
            for w in list(busy):
                cell = w.cell
                assert cell is not None
                record: dict[str, Any] | None = None
                replace = False
                try:
                    while record is None and w.conn.poll():
                        kind, payload = w.conn.recv()
                        if kind == "start":
                            w.started = time.perf_counter()
                            if on_start:
                                on_start(cell)
                        else:
                            record = payload
                except (EOFError, OSError):
                    record = failure_record(cell, "error", w.death_message(rerun_hint), time.perf_counter() - w.submitted)
                    replace = True
                if record is None and not w.proc.is_alive():
                    record = failure_record(cell, "error", w.death_message(rerun_hint), time.perf_counter() - w.submitted)
                    replace = True
                if record is None and time.perf_counter() >= w.deadline:
                    w.kill()
                    what = f"did not finish within the cell timeout of {cell.timeout_s:g} s"
                    if w.started is None:
                        what = (f"setup (worker start, plugins, workload, placer, evaluator) took over "
                                f"{BOOT_TIMEOUT_S + cell.timeout_s:g} s")  # the deadline `Worker.deadline` gives it
                    record = failure_record(cell, "timeout", what, time.perf_counter() - w.submitted)
                    replace = True
                if record is None:
                    continue
                busy.remove(w)
                if not replace:
                    try:
                        record, trusted = check_in_runner(cell, record)
                        replace = not trusted
                    except Exception as exc:  # a failure of the check itself is a row too, not a lost run
                        record = failure_record(cell, "error", f"the runner's check of the final placement "
                                                f"failed: {type(exc).__name__}: {exc}", record.get("cell_wall_time_s"))
                if replace:
                    w.kill()  # a worker whose evaluator was changed runs no other cell
                idle.append(None if replace else w)
                on_done(record)
    finally:
        for w in busy:  # still running a cell: only on an interrupt or an error in on_done
            w.kill()
        for w in idle:
            if w is not None:
                w.stop()


# -- a run ----------------------------------------------------------------------------------------------
@dataclass
class RunResult:
    store: Store
    plan: Plan
    ran: int  # cells run by this invocation
    reused: int  # cells found in the store and skipped
    rows: list[dict[str, Any]]  # the flat rows of every planned cell, in table order
    wall_time_s: float
    run_id: str


def _manifest_update(store: Store, plan: Plan, run_entry: dict[str, Any], labels: Mapping[str, Any]) -> None:
    m = store.manifest()
    m.setdefault("specs", {})[plan.spec.name] = {**plan.spec.as_dict(), "source": plan.spec.source}
    m.setdefault("methodologies", {})[plan.methodology.version] = plan.methodology.as_dict()
    m["placers"] = {**labels, **m.get("placers", {})}
    for p in {c.placer.shown: c.placer for c in plan.cells}.values():
        m["placers"][p.shown] = {"name": p.name, "params": p.params_json, "params_hash": p.params_hash}
    ws = m.setdefault("workloads", {})
    for ref, g in plan.workloads.items():
        ws[g.name] = {"hash": g.content_hash, "ref": ref, "num_ops": g.num_ops, "metadata": dict(g.metadata)}
    cs = m.setdefault("clusters", {})
    for ref, c in plan.clusters.items():
        cs[c.name] = {"hash": c.content_hash, "ref": ref, "devices": [d.name for d in c.devices]}
    entries = _profile_entries(plan)  # rows name the profiles' digest only: say what they cover
    if entries:
        table = m["profiles"] = dict(m["profiles"]) if isinstance(m.get("profiles"), Mapping) else {}
        for label, entry in entries.items():
            kept = table.get(label)
            clusters = kept.get("clusters") if isinstance(kept, Mapping) else None
            table[label] = {**entry, "clusters": {**(clusters if isinstance(clusters, Mapping) else {}),
                                                  **entry["clusters"]}}
    runs = [r for r in m.setdefault("runs", []) if r.get("run_id") != run_entry["run_id"]]
    m["runs"] = [*runs, run_entry]
    store.write_manifest(m)


def _profile_entries(plan: Plan) -> dict[str, dict[str, Any]]:
    """Per profiled evaluator label of the plan's cells: its workload, profile files, and per cluster how many
    op times the profiles give each device (`suite.costmodel.profile_coverage`)."""
    out: dict[str, dict[str, Any]] = {}
    done: set[tuple[str, str]] = set()
    for c in plan.cells:
        label = c.key["evaluator"]
        if not c.profiles or (label, c.cluster_ref) in done:
            continue
        done.add((label, c.cluster_ref))
        graph, cluster = plan.workloads[c.workload_ref], plan.clusters[c.cluster_ref]
        entry = out.setdefault(label, {"workload": graph.name, "files": [p.source for p in c.profiles],
                                       "clusters": {}})
        entry["clusters"][cluster.name] = profile_coverage(graph, cluster, c.profiles)
    return out


def _made_by_other_code(record: Mapping[str, Any] | None, cell: Cell) -> bool:
    """A stored cell whose placer's fingerprint differs from the current one (unknown on either side: no)."""
    stored = record.get("placer_code") if record else None
    return bool(stored and cell.placer_code and stored != cell.placer_code)


def _made_with_other_kernels(record: Mapping[str, Any] | None, made: Mapping[str, str], now: str) -> bool:
    """A stored cell whose run computed with other CPU kernels than this run will (`made`: run_id -> its
    `suite.numerics.run_kernels`; unknown on either side: no): a learned placer's search follows its floats,
    so it may have found another placement."""
    stored = made.get(record.get("run_id") or "") if record else None
    return bool(stored and now and stored != now)


def check_jobs(spec: Spec, jobs: int) -> None:
    """Refuse parallel workers for a built-in real-execution evaluator: each cell's steps would be timed while
    the other workers run theirs on the same CPUs and GPUs (and with the CPUs' threads split between them)."""
    if jobs > 1 and spec.evaluator in REAL_BACKENDS:
        raise PlacebenchError(f"--jobs {jobs}: spec {spec.name!r} times real execution (evaluator "
                              f"{spec.evaluator!r}); cells run in parallel would time each other: use --jobs 1")


def run(
    spec: Spec | str,
    out: str | Path,
    *,
    jobs: int = 1,
    force: bool = False,
    retry_failed: bool = False,
    on_plan: Callable[[int, int, int, int], None] | None = None,
    on_done: Callable[[dict[str, Any]], None] | None = None,
    on_start: Callable[[Cell], None] | None = None,
    select: Callable[[Cell], bool] | None = None,
) -> RunResult:
    """Run every cell of `spec` not yet in the store at `out`, and the stored ones whose placer's code has
    changed since (its fingerprint, `suite.placer_code`) or whose run computed with other CPU kernels (another
    vector extension or other math settings, `suite.numerics`: a host's own run is reused, another kind of
    host's is redone); all of them with `force`, and the failed ones too with `retry_failed`. `select` keeps
    only the cells of the spec's product it accepts (a paper's table names (workload, cluster) pairs).
    `on_plan(total, reused, stale_code, stale_kernels)` is told before any cell runs. A spec whose evaluator
    times real execution ("torch", "onnxruntime") runs with `jobs` 1: parallel workers would time each other."""
    t0 = time.perf_counter()
    spec = load_spec(spec) if isinstance(spec, str) else spec
    check_jobs(spec, jobs)
    plan = make_plan(spec)
    if select is not None:
        plan.cells = [c for c in plan.cells if select(c)]
    new = not Path(out).exists()
    if new:  # it runs every cell: refused before the store is made
        _check_runnable(plan, plan.cells)
    store = Store(out)
    store.check_writable()  # before any placer runs, and before the store is changed
    with store.writing():  # one run at a time per store
        records = store.records()  # every stored cell is readable: a malformed one is an error now, before any work
        manifest = store.manifest()
        labels = _stored_placer_labels(manifest, records)
        _check_store_matches(store, manifest, records, plan, labels)
        by_id = {r["cell_id"]: r for r in records}
        machine = machine_info()
        numerics = worker_numerics(plan.cells, machine["simd"])  # fixed by the spec, not by the cells left to run
        kernels_now = run_kernels({"machine": machine, "numerics": numerics})
        made = {r["run_id"]: run_kernels(r) for r in manifest.get("runs", []) if r.get("run_id")}
        stale_code = set() if force else {c.cell_id for c in plan.cells
                                          if _made_by_other_code(by_id.get(c.cell_id), c)}
        stale_kernels = set() if force else {c.cell_id for c in plan.cells if c.cell_id not in stale_code
                                             and _made_with_other_kernels(by_id.get(c.cell_id), made, kernels_now)}
        stale = stale_code | stale_kernels
        if force:
            todo = list(plan.cells)
        else:
            todo = [c for c in plan.cells if c.cell_id not in by_id or c.cell_id in stale
                    or (retry_failed and by_id[c.cell_id]["status"] in FAILED_STATUSES)]
        if not new:
            _check_runnable(plan, todo)  # only the cells left to run; before the run is recorded in the manifest
        run_id = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ-") + uuid.uuid4().hex[:6]
        entry = {
            "run_id": run_id,
            "spec": spec.name,
            "started_at": _now(),
            "finished_at": None,
            "complete": False,
            "cells_planned": len(plan.cells),
            "cells_to_run": len(todo),
            "cells_stale": len(stale),  # made by other code of their placer, or with other CPU kernels
            "cells_stale_kernels": len(stale_kernels),
            "seeds": list(plan.seeds),  # the methodology's entry keeps its own defaults; these are the run's
            "cell_timeout_s": plan.cell_timeout_s,
            "jobs": jobs,
            "git": _git(),
            "packages": package_versions(),
            "machine": machine,
            "numerics": numerics,
        }
        _manifest_update(store, plan, entry, labels)
        if on_plan:
            on_plan(len(plan.cells), len(plan.cells) - len(todo), len(stale_code), len(stale_kernels))
        ran = 0

        def finished(record: dict[str, Any]) -> None:
            nonlocal ran
            record["run_id"] = run_id
            store.write_cell(record)
            ran += 1
            if on_done:
                on_done(record)

        try:
            execute(todo, jobs=jobs, on_done=finished, on_start=on_start, numerics=entry["numerics"])
        finally:
            with _stop_signals_deferred():
                entry["finished_at"] = _now()
                entry["cells_run"] = ran
                entry["complete"] = ran == len(todo)  # an interrupt after the last cell was stored stops nothing
                _manifest_update(store, plan, entry, labels)
                store.compact()
        wanted = {c.cell_id for c in plan.cells}
        rows = [r for r in store.rows() if r["cell_id"] in wanted]
        return RunResult(store, plan, ran, len(plan.cells) - len(todo), rows, time.perf_counter() - t0, run_id)


def _git() -> dict[str, Any]:
    from suite.store import git_state

    return git_state()


def measure_placement(
    workload: str,
    cluster: str,
    path: str | Path,
    *,
    methodology: str = _methodology.DEFAULT,
    simulator_engine: str | None = None,
    profiles: Sequence[str] = (),
) -> dict[str, Any]:
    """Measure the placement in a file (`suite.placement.save_placement`'s format, or a list of device
    indices) as a cell's final placement is measured: same evaluator and methodology. Nothing is stored.

    A file that does not fit the workload and cluster (wrong length, unknown device, another workload's
    hash...) raises `PlacementError`; an OOM placement is a result (status oom)."""
    from suite.placement import load_placement

    meth = _methodology.load(methodology)
    graph, target = suite.load_workload(workload), suite.load_cluster(cluster)
    placement = load_placement(path, graph, target)
    profs = _profiles_by_workload(profiles, {workload: graph}, "--profile")[workload]
    _check_costs(graph, target, cluster, profs)
    backend = SimulatorBackend(graph, target, profs, engine=simulator_engine)
    m = Evaluator(graph, target, meth.budget, methodology=meth, backend=backend).measure(placement)
    return {
        "workload": graph.name,
        "workload_hash": graph.content_hash,
        "cluster": target.name,
        "cluster_hash": target.content_hash,
        "placement_file": str(path),
        "methodology": meth.version,
        "evaluator": _evaluator_label("simulator", profs),
        **_measurement_fields(m),
        "placement_hash": placement_hash(placement),
        "placement": placement.tolist(),
    }


def evaluate_one(
    workload: str,
    cluster: str,
    placer: str,
    *,
    params: Mapping[str, Any] | None = None,
    seed: int = 0,
    methodology: str = _methodology.DEFAULT,
    budget: Mapping[str, Any] | None = None,
    cell_timeout_s: float | None = None,
    plugins: Sequence[str] = (),
    simulator_engine: str | None = None,
    profiles: Sequence[str] = (),
) -> dict[str, Any]:
    """Run one cell in an isolated worker (same rules as a suite run) and return its record; nothing is stored."""
    spec = spec_from_dict(
        {
            "name": "evaluate",
            "workloads": [workload],
            "clusters": [cluster],
            "placers": [{"name": placer, "params": dict(params or {})}],
            "seeds": [seed],
            "methodology": methodology,
            "budget": dict(budget or {}),
            "plugins": list(plugins),
            **({"cell_timeout_s": cell_timeout_s} if cell_timeout_s is not None else {}),
            **({"simulator_engine": simulator_engine} if simulator_engine else {}),
            **({"profiles": [str(Path(p).resolve()) for p in profiles]} if profiles else {}),
        },
        source="evaluate",
        base=Path.cwd(),
    )
    plan = make_plan(spec)
    records: list[dict[str, Any]] = []
    execute(plan.cells, jobs=1, on_done=records.append, rerun_hint="")  # no store, no --retry-failed
    return records[0]
