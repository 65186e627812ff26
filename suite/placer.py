"""The placer interface and registry.

A placer is a class with a `name`, keyword parameters, and `place(problem, budget, seed)`. In-tree and
third-party placers are found through the entry-point group `placebench.placers` (loaded lazily, so a
broken plugin is reported and does not stop the others); tests and notebooks can also register a class
with the `register_placer` decorator. `suite/` never imports a placer module by name.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from suite.cluster import Cluster
from suite.costmodel import Profile, cost_matrix
from suite.errors import PlacebenchError, UnknownNameError
from suite.evaluator import CurvePoint, Evaluator
from suite.graph import OpGraph
from suite.methodology import Budget
from suite.textfile import as_float, load_toml, short_repr

ENTRY_POINT_GROUP = "placebench.placers"
FAMILIES_FILE = Path(__file__).with_name("placers.toml")


@dataclass
class Problem:
    """What a placer sees: the workload, the cluster, and the budgeted evaluator."""

    workload: OpGraph
    cluster: Cluster
    evaluator: Evaluator

    @classmethod
    def make(cls, workload: OpGraph, cluster: Cluster, budget: Budget | None = None, **kw: Any) -> Problem:
        return cls(workload, cluster, Evaluator(workload, cluster, budget, **kw))

    @property
    def profiles(self) -> tuple[Profile, ...]:
        """The measured op times the evaluator's simulator uses (none with other backends): a placer's own
        estimates (costs, simulated start times) must use them too, or it plans on other times than it is
        scored on."""
        return tuple(getattr(self.evaluator.backend, "profiles", ()))

    def costs(self) -> np.ndarray:
        """Time of every op on every device [n_ops, D] from the cost model, with the evaluator's profiles."""
        return cost_matrix(self.workload, self.cluster, self.profiles)


@dataclass
class PlacementResult:
    """A placer's answer: the placement and what the search cost."""

    placement: Any  # device indices (an int64 array), device names or {op: device}: the harness validates it
    evaluations: int = 0
    wall_time_s: float = 0.0
    curve: list[CurvePoint] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_search(cls, placement: Any, problem: Problem, started: float, **info: Any) -> PlacementResult:
        """Fill the statistics from the evaluator the placer was handed. An integer placement becomes an int64
        array; any other is kept as given, for the harness to validate (a cast would make device 1 of 1.5)."""
        ev = problem.evaluator
        return cls(
            placement=_integers_or_as_given(placement),
            evaluations=ev.evaluations_used,
            wall_time_s=time.perf_counter() - started,
            curve=list(ev.curve),
            info=info,
        )


def _integers_or_as_given(placement: Any) -> Any:
    """`placement` as an int64 array if its entries are integers, else unchanged (floats, NaN, names, None, and
    bools, which numpy would make devices 0 and 1 of in a list of ints but the harness refuses)."""
    try:
        arr = np.asarray(placement)
    except (TypeError, ValueError):  # a ragged list
        return placement
    if arr.dtype.kind not in "iu" or arr.dtype == np.uint64:
        return placement
    if arr.ndim == 1 and not isinstance(placement, np.ndarray) and any(isinstance(v, bool | np.bool_) for v in placement):
        return placement
    return arr.astype(np.int64)


@runtime_checkable
class Placer(Protocol):
    name: ClassVar[str]
    params: dict[str, Any]

    def place(self, problem: Problem, budget: Budget, seed: int) -> PlacementResult: ...


_REGISTERED: dict[str, Callable[..., Placer]] = {}


def register_placer(name: str) -> Callable[[type], type]:
    """Class decorator: make a placer available under `name` in this process."""

    def deco(cls: type) -> type:
        ep = _entry_points().get(name)
        if ep is not None:  # a plugin must not pass its results off as an installed placer's
            raise PlacebenchError(f"placer name {name!r} is taken by the installed placer {ep.value}; "
                                  f"register {cls.__name__} under another name")
        check_name_free("placer", name, _REGISTERED.get(name), cls)
        cls.name = name
        _REGISTERED[name] = cls
        return cls

    return deco


def origin(obj: Any) -> str:
    """Where a class or function is defined: module and qualified name, and the file of a plugin file."""
    module = sys.modules.get(obj.__module__)
    file = getattr(module, "__file__", None) if obj.__module__.startswith("placebench_plugin_") else None
    return f"{obj.__module__}.{obj.__qualname__}" + (f" ({file})" if file else "")


def check_name_free(kind: str, name: str, was: Any, new: Any) -> None:
    """Refuse a registration under a name that another class or function already holds in this process (the
    same one loaded again is fine): a stale copy of a plugin must not silently replace the one under test."""
    if was is not None and origin(was) != origin(new):
        raise PlacebenchError(f"{kind} name {name!r} is taken by {origin(was)} (registered in this process); "
                              f"register {origin(new)} under another name")


def unregister_placer(name: str) -> None:
    _REGISTERED.pop(name, None)


def _entry_points() -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def placer_names() -> list[str]:
    """Every available placer name (entry points and decorator registrations), sorted."""
    return sorted(set(_entry_points()) | set(_REGISTERED))


@functools.cache
def placer_families() -> dict[str, str]:
    """Built-in placer name -> its family, in table order (`suite/placers.toml`)."""
    data = load_toml(FAMILIES_FILE, PlacebenchError, "placer families")
    families = data.get("family", [])
    out: dict[str, str] = {}
    if not isinstance(families, list):
        raise PlacebenchError(f"{FAMILIES_FILE}: 'family' must be an array of tables ([[family]])")
    for fam in families:
        if not (isinstance(fam, dict) and isinstance(fam.get("name"), str) and isinstance(fam.get("placers"), list)
                and all(isinstance(name, str) for name in fam["placers"])):
            raise PlacebenchError(f"{FAMILIES_FILE}: each [[family]] needs a name and a list of placer names")
        for name in fam["placers"]:
            if name in out:
                raise PlacebenchError(f"{FAMILIES_FILE}: placer {name!r} is listed twice")
            out[name] = fam["name"]
    return out


def placer_order(names: Iterable[str]) -> list[str]:
    """The distinct `names` in table order: the built-in placers by family, then any other by name."""
    rank = {name: i for i, name in enumerate(placer_families())}
    return sorted(set(names), key=lambda name: (rank.get(name, len(rank)), name))


class PluginError(PlacebenchError):
    """A placer plugin that could not be loaded."""


class NotApplicable(PlacebenchError):
    """Raised by `place` when the placer cannot handle this problem (e.g. the cluster lacks a device kind
    it needs). The runner stores the cell with status `skipped` and this message; it is not a failure."""


@contextlib.contextmanager
def prints_to_stderr() -> Iterator[None]:
    """Run a plugin's code (its import, its constructor) with what it prints sent to stderr: stdout is the
    command's table or --json document, as in the runner's workers."""
    with contextlib.redirect_stdout(sys.stderr):
        yield


def placer_class(name: str) -> Callable[..., Placer]:
    if name in _REGISTERED:
        return _REGISTERED[name]
    eps = _entry_points()
    if name not in eps:
        raise UnknownNameError(f"unknown placer {name!r}; available: {', '.join(placer_names())}")
    try:
        with prints_to_stderr():
            cls = eps[name].load()
    except (Exception, SystemExit) as exc:  # a broken plugin is reported, not fatal (sys.exit() on import too)
        raise PluginError(f"placer {name!r} ({eps[name].value}) failed to load: {type(exc).__name__}: {exc}") from exc
    if not hasattr(cls, "name") or cls.name != name:
        cls.name = name
    return cls


def placer_defaults(cls: Any) -> dict[str, Any]:
    """A placer class's parameter defaults: its `defaults` (BasePlacer), else its constructor's keyword defaults."""
    defaults = getattr(cls, "defaults", None)
    if isinstance(defaults, dict):
        return dict(defaults)
    try:
        sig = inspect.signature(cls)
    except (TypeError, ValueError):
        return {}
    return {k: p.default for k, p in sig.parameters.items() if p.default is not inspect.Parameter.empty}


def canonical_params(cls: Any, params: Mapping[str, Any]) -> dict[str, Any]:
    """`params` with a whole number given for a parameter whose default is a float made that float (`k = 1` is
    `k = 1.0`): the placer gets the type of its default, and a cell's identity (its params) is the same however
    the number was written. Other values are kept as given."""
    defaults = placer_defaults(cls)
    out = dict(params)
    for key, value in params.items():
        if isinstance(defaults.get(key), float) and isinstance(value, int) and not isinstance(value, bool):
            try:
                number = float(value)
            except OverflowError:
                continue
            if number == value:  # exactly: a larger integer than a float holds is left for the placer to refuse
                out[key] = number
    return out


class ParameterError(PlacebenchError, TypeError):
    """A parameter a placer does not know, or one it needs left out: the spec's error (a TypeError too, as
    Python's own for a wrong keyword argument)."""


class PlacerFailed(PlacebenchError):
    """A placer's constructor raised for another reason than its parameters' names (a bug in the placer): the
    placer's error, not the spec's. The runner makes its cells `error` rows; the cause is `__cause__`."""


def make_placer(name: str, **params: Any) -> Placer:
    """Instantiate a placer by name with keyword parameters. Unknown or missing parameters, and a placer's own
    PlacebenchError (a value it refuses), are the caller's error; anything else its constructor raises is
    `PlacerFailed`, naming the placer's class and module."""
    cls = placer_class(name)
    try:
        signature = inspect.signature(cls)
    except (TypeError, ValueError):  # no signature to read: the constructor's own errors will tell
        signature = None
    if signature is not None:
        try:
            signature.bind(**params)
        except TypeError as exc:
            raise ParameterError(f"placer {name!r}: bad parameters {params}: {exc}") from None
    try:
        with prints_to_stderr():
            return cls(**params)
    except PlacebenchError:
        raise
    except (Exception, SystemExit) as exc:  # sys.exit() too (an argparse in the constructor): not the end of a run
        raise PlacerFailed(f"placer {name!r} ({origin(cls)}) raised in its constructor: {type(exc).__name__}: "
                           f"{exc}") from exc


def check_parameter(placer: str, key: str, value: Any, default: Any, bounds: tuple[float, float] | None) -> None:
    """A parameter must have its default's type (a float one takes an int too), be finite, and lie in
    `bounds` (inclusive) when given; a None default accepts anything (the placer checks it)."""
    where = f"placer {placer!r}: parameter {key}={short_repr(value)}"
    if default is None:
        return
    if isinstance(default, bool) or isinstance(default, str):
        if type(value) is not type(default):
            raise PlacebenchError(f"{where}: expected a {type(default).__name__}")
        return
    if isinstance(default, int):
        if not isinstance(value, int) or isinstance(value, bool):
            raise PlacebenchError(f"{where}: expected an integer")
    elif isinstance(default, float):
        if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(as_float(value)):
            raise PlacebenchError(f"{where}: expected a finite number")
    if bounds is not None and not bounds[0] <= value <= bounds[1]:
        raise PlacebenchError(f"{where}: must be in [{bounds[0]}, {bounds[1]}]")


def check_choice(placer: str, key: str, value: Any, choices: tuple[str, ...]) -> None:
    """A parameter that names one of `choices` (a grouping, a reward transform, ...) must be one of them."""
    if value not in choices:
        raise PlacebenchError(f"{placer}: {key} {value!r} is not one of {', '.join(choices)}")


class BasePlacer:
    """Convenience base: stores keyword parameters (merged over `defaults`) in `self.params`, checked against
    the defaults' types and the optional `bounds` (inclusive ranges of numeric parameters)."""

    name: ClassVar[str] = "base"
    defaults: ClassVar[dict[str, Any]] = {}
    bounds: ClassVar[dict[str, tuple[float, float]]] = {}

    def __init__(self, **params: Any):
        unknown = set(params) - set(self.defaults)
        if unknown:
            raise ParameterError(f"placer {self.name!r}: bad parameters {params}: unknown parameter(s) "
                                 f"{sorted(unknown)}; known: {sorted(self.defaults)}")
        for key, value in params.items():
            check_parameter(self.name, key, value, self.defaults[key], self.bounds.get(key))
        self.params = {**self.defaults, **params}

    def place(self, problem: Problem, budget: Budget, seed: int) -> PlacementResult:  # pragma: no cover
        raise NotImplementedError
