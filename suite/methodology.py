"""The methodology: one versioned set of rules (budget, seeds, re-measurement, timing, scoring, timeouts).

Rules are data (`suite/methodology/*.toml`); this module only loads and validates them.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from suite.errors import SpecError
from suite.textfile import as_float, load_toml, short_repr

METHODOLOGY_DIR = Path(__file__).parent / "methodology"
DEFAULT = "v1"
INT_MAX = 2**63 - 1  # counts are stored as int64 (results tables) and used as numpy integers


def _check_count(where: str, n: Any, least: int) -> None:
    """A count made in code: a whole number in [least, 2**63 - 1], the range the message states."""
    if not isinstance(n, numbers.Integral) or isinstance(n, (bool, np.bool_)) or not least <= n <= INT_MAX:
        raise SpecError(f"{where} must be a whole number in [{least}, 2**63 - 1], got {short_repr(n)}")


@dataclass(frozen=True)
class Budget:
    """Search budget of one placer run: evaluator calls and wall-clock seconds."""

    max_evaluations: int = 1000
    max_seconds: float = 300.0

    def __post_init__(self) -> None:
        # a Budget made in code ("5", NaN, True) would otherwise fail far away, in the middle of a search
        n, t = self.max_evaluations, self.max_seconds
        _check_count("Budget.max_evaluations", n, 0)
        if not isinstance(t, numbers.Real) or isinstance(t, (bool, np.bool_)) or not t >= 0:
            raise SpecError(f"Budget.max_seconds must be a number of seconds >= 0, got {short_repr(t)}")


@dataclass(frozen=True)
class Timing:
    warmup_steps: int = 3
    measured_steps: int = 10
    statistic: str = "median"
    synchronize: bool = True

    def __post_init__(self) -> None:
        # as Budget: Timing(measured_steps=0) made in code failed later, as a NaN step time
        for name, least in (("warmup_steps", 0), ("measured_steps", 1)):
            _check_count(f"Timing.{name}", getattr(self, name), least)
        if self.statistic not in ("median", "mean"):
            raise SpecError(f"Timing.statistic must be 'median' or 'mean', got {short_repr(self.statistic)}")
        if not isinstance(self.synchronize, (bool, np.bool_)):
            raise SpecError(f"Timing.synchronize must be true or false, got {short_repr(self.synchronize)}")


@dataclass(frozen=True)
class Methodology:
    version: str
    budget: Budget = field(default_factory=Budget)
    seeds: tuple[int, ...] = (0,)
    repetitions: int = 1
    timing: Timing = field(default_factory=Timing)
    failure_multiple: float = 10.0
    cell_timeout_s: float = 900.0

    def __post_init__(self) -> None:
        # as Budget and Timing: Methodology(repetitions=0) made in code failed later, inside the re-measurement
        # (an IndexError; 2.5 or NaN a TypeError), and was written as such into a store's manifest
        n, f, t = self.repetitions, self.failure_multiple, self.cell_timeout_s
        if not isinstance(self.version, str) or not self.version:
            raise SpecError(f"Methodology.version must be a non-empty string, got {short_repr(self.version)}")
        if not isinstance(self.budget, Budget) or not isinstance(self.timing, Timing):
            raise SpecError("Methodology.budget and .timing must be a Budget and a Timing, got "
                            f"{type(self.budget).__name__} and {type(self.timing).__name__}")
        seeds = self.seeds
        if not isinstance(seeds, tuple | list) or not all(_real(x) and isinstance(x, numbers.Integral) for x in seeds):
            raise SpecError(f"Methodology.seeds must be a tuple of integer seeds, got {short_repr(seeds)}")
        object.__setattr__(self, "seeds", tuple(check_seeds("Methodology.seeds", [int(x) for x in seeds])))
        _check_count("Methodology.repetitions", n, 1)
        object.__setattr__(self, "repetitions", int(n))
        if not _real(f) or not 1.0 <= f <= MAX_FAILURE_MULTIPLE:
            raise SpecError(f"Methodology.failure_multiple must be a number in [1, {MAX_FAILURE_MULTIPLE:g}], "
                            f"got {short_repr(f)}")
        if not _real(t) or not 0 < t < math.inf:
            raise SpecError(f"Methodology.cell_timeout_s must be a finite number of seconds > 0, got {short_repr(t)}")

    def with_budget(self, **kw: Any) -> Methodology:
        return replace(self, budget=replace(self.budget, **kw))

    def as_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "budget": dict(self.budget.__dict__),
            "seeds": list(self.seeds),
            "repetitions": self.repetitions,
            "timing": dict(self.timing.__dict__),
            "failure_multiple": self.failure_multiple,
            "cell_timeout_s": self.cell_timeout_s,
        }


# the sections of a methodology file and the keys each may hold
SECTIONS = {
    "budget": {"max_evaluations", "max_seconds"},
    "seeds": {"seeds"},
    "remeasure": {"repetitions"},
    "timing": {"warmup_steps", "measured_steps", "statistic", "synchronize"},
    "scoring": {"failure_multiple"},
    "timeout": {"cell_timeout_s"},
}


# a failure's score is this multiple of the serial bound: larger ones overflow to inf (1e308) or break the
# learned placers' reward arithmetic with it
MAX_FAILURE_MULTIPLE = 1e6


def _real(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, (bool, np.bool_))


def _num(where: str, value: Any, *, integer: bool = False, minimum: float = 0.0, maximum: float = math.inf) -> Any:
    """A number of a methodology file in [minimum, maximum] (a whole number: in [minimum, 2**63 - 1]); the
    messages state the accepted range."""
    accepted = (f"a whole number in [{minimum:g}, 2**63 - 1]" if integer
                else f"a number in [{minimum:g}, {maximum:g}]" if maximum < math.inf else f"a number >= {minimum:g}")
    ok = isinstance(value, int) if integer else isinstance(value, int | float)
    if isinstance(value, bool) or not ok or (not integer and not math.isfinite(as_float(value))):
        raise SpecError(f"{where}: expected {accepted if integer else 'a finite number'}, got {short_repr(value)}")
    if value < minimum:
        raise SpecError(f"{where}: {short_repr(value)} is below the minimum {minimum} (accepted: {accepted})")
    if value > maximum:
        raise SpecError(f"{where}: {short_repr(value)} is above the maximum {maximum} (accepted: {accepted})")
    if integer and value > INT_MAX:
        raise SpecError(f"{where}: {short_repr(value)} is above the largest allowed count, 2**63 - 1 "
                        f"(accepted: {accepted})")
    return value


def check_seeds(where: str, seeds: Any) -> list[int]:
    """Seeds of a methodology or a spec: a non-empty list of integers in [0, 2**32) (numpy's seed range)."""
    need = f"{where} must be a non-empty list of integers in [0, 2**32)"
    if not isinstance(seeds, list) or not seeds:
        raise SpecError(f"{need}, got {short_repr(seeds)}")
    for i, s in enumerate(seeds):
        if not isinstance(s, int) or isinstance(s, bool) or not 0 <= s < 2**32:
            raise SpecError(f"{need}; entry {i} is {short_repr(s)}")
    twice = [s for i, s in enumerate(seeds) if s in seeds[:i]]
    if twice:
        raise SpecError(f"{where}: seed {twice[0]} is listed twice")
    return seeds


def _bool(where: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise SpecError(f"{where}: expected true or false, got {short_repr(value)}")
    return value


def _sections(data: Any, source: str) -> dict[str, dict[str, Any]]:
    """Each section of `data` as a table (empty where absent); refuses unknown sections and keys."""
    if not isinstance(data, dict):
        raise SpecError(f"{source}: expected a table, got {data!r}")
    unknown = set(data) - set(SECTIONS) - {"version"}
    if unknown:
        raise SpecError(f"{source}: unknown section(s) or key(s) {sorted(unknown)}; expected version, "
                        f"{', '.join(f'[{s}]' for s in SECTIONS)}")
    out = {}
    for name, keys in SECTIONS.items():
        table = data.get(name, {})
        if not isinstance(table, dict):
            raise SpecError(f"{source}: field {name!r} must be a table ([{name}]), got {short_repr(table)}")
        if set(table) - keys:
            raise SpecError(f"{source}: [{name}] has unknown key(s) {sorted(set(table) - keys)}; expected {sorted(keys)}")
        out[name] = table
    return out


def from_dict(data: dict[str, Any], *, source: str = "<dict>") -> Methodology:
    sec = _sections(data, source)
    if not isinstance(data.get("version"), str) or not data["version"]:
        raise SpecError(f"{source}: field 'version' must be a non-empty string, got {short_repr(data.get('version'))}")
    b, t = sec["budget"], sec["timing"]
    seeds = check_seeds(f"{source}: seeds.seeds", sec["seeds"].get("seeds", [0]))
    statistic = t.get("statistic", "median")
    if statistic not in ("median", "mean"):
        raise SpecError(f"{source}: timing.statistic {short_repr(statistic)} is not 'median' or 'mean'")
    return Methodology(
        version=data["version"],
        budget=Budget(
            max_evaluations=_num(f"{source}: budget.max_evaluations", b.get("max_evaluations", 1000), integer=True, minimum=1),
            max_seconds=float(_num(f"{source}: budget.max_seconds", b.get("max_seconds", 300.0), minimum=0.001)),
        ),
        seeds=tuple(seeds),
        repetitions=_num(f"{source}: remeasure.repetitions", sec["remeasure"].get("repetitions", 1), integer=True, minimum=1),
        timing=Timing(
            warmup_steps=_num(f"{source}: timing.warmup_steps", t.get("warmup_steps", 3), integer=True),
            measured_steps=_num(f"{source}: timing.measured_steps", t.get("measured_steps", 10), integer=True, minimum=1),
            statistic=statistic,
            synchronize=_bool(f"{source}: timing.synchronize", t.get("synchronize", True)),
        ),
        failure_multiple=float(_num(f"{source}: scoring.failure_multiple", sec["scoring"].get("failure_multiple", 10.0), minimum=1.0,
                                      maximum=MAX_FAILURE_MULTIPLE)),
        cell_timeout_s=float(_num(f"{source}: timeout.cell_timeout_s", sec["timeout"].get("cell_timeout_s", 900.0), minimum=0.001)),
    )


def load(name_or_path: str = DEFAULT) -> Methodology:
    """A built-in methodology by name (suite/methodology/NAME.toml) or a methodology file."""
    path = Path(name_or_path)
    if not path.suffix:
        path = METHODOLOGY_DIR / f"{name_or_path}.toml"
        if not path.is_file():
            known = sorted(p.stem for p in METHODOLOGY_DIR.glob("*.toml"))
            raise SpecError(f"unknown methodology {name_or_path!r}; built-in: {', '.join(known)} (or give a .toml file)")
    data = load_toml(path, SpecError, "methodology")
    meth = from_dict(data, source=str(path))
    if path.resolve().parent != METHODOLOGY_DIR.resolve():
        _check_not_built_in(meth, str(path))
    return meth


def _check_not_built_in(meth: Methodology, source: str) -> None:
    """A methodology file may not take a built-in version's name with other rules: its rows would be labelled
    as results of rules they were not run under."""
    for builtin in sorted(METHODOLOGY_DIR.glob("*.toml")):
        known = from_dict(load_toml(builtin, SpecError, "methodology"), source=str(builtin))
        if known.version == meth.version and known != meth:
            ours, theirs = _flat(meth.as_dict()), _flat(known.as_dict())
            diff = [f"{k} {ours.get(k)!r} (built-in {theirs.get(k)!r})" for k in changed_fields(ours, theirs)]
            raise SpecError(f"{source}: version {meth.version!r} is the built-in methodology {builtin.stem!r}, but "
                            f"its rules differ: {', '.join(diff)}; give the file its own version")


def changed_fields(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """The fields in which two methodologies (`Methodology.as_dict`, nested or `_flat`) differ, as dotted
    names (`budget.max_evaluations`), sorted."""
    a, b = _flat(a), _flat(b)
    return sorted(k for k in {*a, *b} if a.get(k) != b.get(k))


def _flat(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out
