"""Compare two sets of results cell by cell: the regression gate for CI (`placebench compare BASE NEW`).

Cells are matched by (cluster, workload, placer, seed): seed by seed, since the simulator is deterministic and
a placer's seed fixes its search. A matched pair is *not comparable* when what it measured differs: the
workload's or the cluster's hash, the placer (a label may name another) or its parameters, the methodology,
the search budget or the evaluator (as asv marks a benchmark whose version changed, instead of comparing
unlike numbers). A placer's own code may differ: that is what a comparison is for. A spec's cell timeout
(`cell_timeout_s`, which overrides the methodology's; the methodology's own is part of its definition, so
compared) is not part of the setup: it is a run's, not a row's (the manifest's run entries record it), and it
changes no number, only whether a slow cell ends as `timeout`. So a `broke` or `changed` to `timeout`, or a
`fixed` from it, may come from runs with different timeouts: gate on stores run from one spec (`placebench
compare` warns when the runs' timeouts differ).

Verdicts of a comparable pair:

* both ok: `slower` when new step time > factor x base, `faster` when base > factor x new; `more memory` /
  `less memory` likewise for the largest per-device peak, with its own factor (by default the same). With
  one timing sample on a side (the simulator, which is deterministic) any change beyond the factor counts;
  with repeated samples (real backends) the interquartile ranges must not overlap either, so noise within
  the spread is never a verdict;
* `broke`: base ok, new failed (oom, invalid, timeout, error, skipped); `fixed`: the reverse;
* `changed`: both failed, with different statuses (oom became error, say);
* `same` otherwise.

`slower`, `more memory`, `broke` and `changed` are regressions. Cells only in the base are `missing`, cells
only in the new results are `new`. Missing and not comparable cells are regressions too, unless `lenient`: a
gate must see every baseline cell measured again the same way (a killed run, or a changed workload that
needs a new baseline, must not pass). Results with no comparable cell at all are an error, not a pass.

Parameters that differ only by an int for a float (`{"k":1}` from a store made before such ints became floats,
`{"k":1.0}` since) are named as such, also where they gave the cells other labels (`p(k=1)`: missing,
`p(k=1.0)`: new).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from suite.report import ReportError, Table, _check_row, format_ratio, format_seconds

MATCH = ("cluster", "workload", "placer", "seed")
SAME_SETUP = ("workload_hash", "cluster_hash", "placer_name", "params_hash", "methodology", "budget_evaluations",
              "budget_seconds", "evaluator")
DEFAULT_FACTOR = 1.05
REGRESSIONS = ("slower", "more memory", "broke", "changed")
VERDICTS = ("slower", "more memory", "broke", "changed", "faster", "less memory", "fixed", "same", "missing", "new",
            "not comparable")


@dataclass(frozen=True)
class Pair:
    """One cell in the base and/or the new results, and what changed."""

    key: tuple  # values of MATCH
    base: Mapping[str, Any] | None
    new: Mapping[str, Any] | None
    verdicts: tuple[str, ...]  # one or two of VERDICTS ("slower", "less memory")
    time_ratio: float | None  # new / base step time, both ok
    memory_ratio: float | None  # new / base largest peak, both known
    why: str = ""  # what differs, for a pair that is not comparable (or a missing and a new cell relabelled)

    def regression(self, lenient: bool = False) -> bool:
        bad = REGRESSIONS + (() if lenient else ("missing", "not comparable"))
        return any(v in bad for v in self.verdicts)


def _where(key: tuple) -> str:
    return f"{' / '.join(map(str, key[:3]))} / seed {key[3]}"


def _index(rows: Iterable[Mapping[str, Any]], side: str) -> dict[tuple, Mapping[str, Any]]:
    """The rows by their MATCH key; ReportError naming `side` and the cell for a malformed or doubled row."""
    out: dict[tuple, Mapping[str, Any]] = {}
    for r in rows:
        try:
            _check_row(r)
        except ReportError as exc:
            raise ReportError(f"{side}: {exc}") from None
        key = tuple(r.get(k) for k in MATCH)
        if key in out:
            raise ReportError(f"{side}: {_where(key)} has several rows (different budgets, methodologies or "
                              f"evaluators in one store?): compare stores of one setup")
        out[key] = r
    return out


def _ratio(new: float, base: float) -> float:
    if base == 0:
        return 1.0 if new == 0 else math.inf
    return new / base


def _beyond(x: float, y: float, factor: float) -> bool:
    """x is more than `factor` times y: compared as a product, so a value that is exactly `factor` times the
    other (as its float) is never beyond it either way (the ratio x / y can round above the factor)."""
    return x > y * factor if y > 0 else x > 0 and not math.isinf(factor)


def _clearly(direction: int, base: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """With repeated samples on both sides, the interquartile ranges do not overlap in this direction
    (+1 slower, -1 faster); with one sample on either side (or no quartiles), always."""
    if min(int(base.get("samples") or 1), int(new.get("samples") or 1)) <= 1:
        return True
    lo_b, hi_b = base.get("step_time_q25_s"), base.get("step_time_q75_s")
    lo_n, hi_n = new.get("step_time_q25_s"), new.get("step_time_q75_s")
    if None in (lo_b, hi_b, lo_n, hi_n):
        return True
    return float(lo_n) > float(hi_b) if direction > 0 else float(hi_n) < float(lo_b)


def compare_pair(base: Mapping[str, Any], new: Mapping[str, Any], factor: float,
                 memory_factor: float | None = None) -> tuple[tuple[str, ...], float | None, float | None]:
    """(verdicts, time ratio, memory ratio) of two rows of the same cell and setup; memory_factor None is
    `factor`, inf never judges memory."""
    mf = factor if memory_factor is None else memory_factor
    memory = None
    if base.get("max_peak_memory_bytes") is not None and new.get("max_peak_memory_bytes") is not None:
        memory = _ratio(float(new["max_peak_memory_bytes"]), float(base["max_peak_memory_bytes"]))
    sb, sn = base["status"], new["status"]
    if sb != "ok" or sn != "ok":
        if sb == sn:
            return ("same",), None, memory
        return ("broke" if sb == "ok" else "fixed" if sn == "ok" else "changed",), None, memory
    tb, tn = float(base["step_time_s"]), float(new["step_time_s"])
    verdicts = []
    if _beyond(tn, tb, factor) and _clearly(+1, base, new):
        verdicts.append("slower")
    elif _beyond(tb, tn, factor) and _clearly(-1, base, new):
        verdicts.append("faster")
    if memory is not None:
        mb, mn = float(base["max_peak_memory_bytes"]), float(new["max_peak_memory_bytes"])
        if _beyond(mn, mb, mf):
            verdicts.append("more memory")
        elif _beyond(mb, mn, mf):
            verdicts.append("less memory")
    return tuple(verdicts) or ("same",), _ratio(tn, tb), memory


def compare(base_rows: Iterable[Mapping[str, Any]], new_rows: Iterable[Mapping[str, Any]],
            factor: float = DEFAULT_FACTOR, memory_factor: float | None = None,
            names: tuple[str, str] = ("base", "new"),
            methodologies: tuple[Mapping[str, Any], Mapping[str, Any]] = ({}, {})) -> list[Pair]:
    """Every cell of either side, matched and judged, in a stable order (cluster, workload, placer, seed).

    `names` label the two sides in errors (the CLI gives their paths). `methodologies` are the two stores'
    methodology definitions by version (their manifests'): rows under one version whose definitions differ
    (an edited methodology file that kept its version) are not comparable, as `run` refuses to mix them."""
    if not (math.isfinite(factor) and factor >= 1):
        raise ReportError(f"the factor must be a finite number >= 1, got {factor!r}")
    if memory_factor is not None and not memory_factor >= 1:
        raise ReportError(f"the memory factor must be a number >= 1 (inf: memory is not judged), got {memory_factor!r}")
    base, new = _index(base_rows, names[0]), _index(new_rows, names[1])
    pairs = []
    for key in sorted(base.keys() | new.keys(), key=lambda k: tuple(str(x) for x in k[:3]) + (k[3],)):
        b, n = base.get(key), new.get(key)
        if n is None:
            pairs.append(Pair(key, b, None, ("missing",), None, None))
            continue
        if b is None:
            pairs.append(Pair(key, None, n, ("new",), None, None))
            continue
        differ = [_setup_change(f, b, n) for f in SAME_SETUP if b.get(f) != n.get(f)]
        if not differ:
            differ = _methodology_differs(b.get("methodology"), *methodologies)
        if differ:
            pairs.append(Pair(key, b, n, ("not comparable",), None, None, "; ".join(differ)))
            continue
        pairs.append(Pair(key, b, n, *compare_pair(b, n, factor, memory_factor)))
    return _explain_relabelled(pairs)


def _params(row: Mapping[str, Any]) -> tuple[str, Any] | None:
    """(the params as written, as values) of a row, None where it has none or they are not JSON."""
    text = row.get("params")
    if not isinstance(text, str) or not text:
        return None
    try:
        return text, json.loads(text)
    except ValueError:
        return None


def _alike(a: Any, b: Any) -> bool:
    """The same values, a whole number and the float it equals counting as the same (booleans do not)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_alike(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_alike(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


WHOLE_FOR_FLOAT = "an int on one side for a float on the other (a store from before such ints became floats: rerun it)"


def _params_change(b: Mapping[str, Any], n: Mapping[str, Any]) -> str | None:
    """'params {..} -> {..}' of two rows whose params are known, saying so when only an int and a float differ."""
    pb, pn = _params(b), _params(n)
    if pb is None or pn is None:
        return None
    return f"params {pb[0]} -> {pn[0]}" + (f": {WHOLE_FOR_FLOAT}" if _alike(pb[1], pn[1]) else "")


def _setup_change(f: str, b: Mapping[str, Any], n: Mapping[str, Any]) -> str:
    """What differs in one SAME_SETUP field, for a message: params themselves rather than their hashes."""
    return (f == "params_hash" and _params_change(b, n)) or f"{f} {_short(b.get(f))} -> {_short(n.get(f))}"


def _explain_relabelled(pairs: list[Pair]) -> list[Pair]:
    """Pairs with a `why` for a missing cell and a new one that differ only in their placer label and an int
    written for a float in its params (`seq2seq(k=1)` in a store made before such numbers became floats,
    `seq2seq(k=1.0)` since): they stay missing and new (other labels, other cells), but say why."""
    news: dict[tuple, list[int]] = {}
    for i, p in enumerate(pairs):
        if p.verdicts == ("new",) and p.new.get("placer_name"):
            news.setdefault((p.key[0], p.key[1], p.key[3], p.new["placer_name"]), []).append(i)
    out = list(pairs)
    for i, p in enumerate(pairs):
        if p.verdicts != ("missing",) or not p.base.get("placer_name"):
            continue
        for j in news.get((p.key[0], p.key[1], p.key[3], p.base["placer_name"]), []):
            change = _params_change(p.base, pairs[j].new)
            if change and change.endswith(WHOLE_FOR_FLOAT) and out[j].why == "":
                why = f"placer {p.key[2]} -> {pairs[j].key[2]}: {WHOLE_FOR_FLOAT}"  # the labels show the params
                out[i], out[j] = replace(p, why=why), replace(pairs[j], why=why)
                break
    return out


def comparable(pairs: Iterable[Pair]) -> int:
    """How many pairs were judged (in both, same setup)."""
    return sum(p.base is not None and p.new is not None and p.verdicts != ("not comparable",) for p in pairs)


def _methodology_differs(version: Any, base: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """What differs between two definitions of one methodology version (none where either is unknown)."""
    b, n = base.get(version), new.get(version)
    if not (isinstance(b, Mapping) and isinstance(n, Mapping)) or b == n:
        return []
    keys = sorted(k for k in {*b, *n} if b.get(k) != n.get(k))
    return [f"methodology {version} defined differently ({', '.join(keys)})"]


def why_not_comparable(pairs: Iterable[Pair], most: int = 3) -> str:
    """The most frequent reasons pairs are not comparable, or base cells are missing (an int written for a float
    parameter, `_explain_relabelled`), with their counts, for a one-line message."""
    reasons = Counter(p.why for p in pairs if p.why and p.verdicts in (("not comparable",), ("missing",)))
    shown = [f"{why} ({n} cell{'s' if n != 1 else ''})" for why, n in reasons.most_common(most)]
    more = len(reasons) - len(shown)
    return "; ".join(shown) + (f"; and {more} other reason(s)" if more > 0 else "")


def _short(value: Any) -> str:
    """A setup value for a message: hashes (bare or "sha256:"-prefixed) cut to 12 digits."""
    text = str(value)
    prefix, _, digest = text.rpartition(":")
    if len(digest) == 64 and all(c in "0123456789abcdef" for c in digest) and prefix in ("", "sha256"):
        return f"{prefix}:{digest[:12]}" if prefix else digest[:12]
    return text


def counts(pairs: Iterable[Pair]) -> dict[str, int]:
    """How many pairs have each verdict (a pair with two verdicts counts for both), in VERDICTS' order."""
    c = Counter(v for p in pairs for v in p.verdicts)
    return {v: c[v] for v in VERDICTS if c[v]}


def _shown(row: Mapping[str, Any] | None) -> str:
    if row is None:
        return "-"
    if row["status"] != "ok":
        return row["status"].upper() if row["status"] == "oom" else row["status"]
    return format_seconds(float(row["step_time_s"]))


def _ratio_text(x: float | None) -> str:
    """`report.format_ratio` with three decimals (1.200x, 0.00025x, 1.235e+08x)."""
    if x is None:
        return ""
    return "inf" if math.isinf(x) else format_ratio(x, 3)


def _verdict_text(p: Pair, b_status: str | None, n_status: str | None) -> str:
    parts = [f"{v}: {b_status} -> {n_status}" if v in ("broke", "fixed", "changed") else v for v in p.verdicts]
    return ", ".join(parts) + (f" ({p.why})" if p.why else "")


def table(pairs: list[Pair], show_all: bool = False, lenient: bool = False, title: str = "Changes") -> Table:
    """The pairs as a table, regressions first: only those that are not `same`, unless show_all."""
    columns = ["cluster", "workload", "placer", "seed", "base", "new", "time", "memory", "verdict", "regression"]
    rows, raw = [], []
    shown = [p for p in pairs if show_all or p.verdicts != ("same",)]
    for p in sorted(shown, key=lambda p: not p.regression(lenient)):  # stable: the order of `compare` within each
        b_status = p.base["status"] if p.base else None
        n_status = p.new["status"] if p.new else None
        bad, verdict = p.regression(lenient), _verdict_text(p, b_status, n_status)
        rows.append([str(p.key[0]), str(p.key[1]), str(p.key[2]), str(p.key[3]), _shown(p.base), _shown(p.new),
                     _ratio_text(p.time_ratio), _ratio_text(p.memory_ratio), verdict, "yes" if bad else ""])
        raw.append([p.key[0], p.key[1], p.key[2], p.key[3],
                    (p.base["step_time_s"] if b_status == "ok" else b_status) if p.base else None,
                    (p.new["step_time_s"] if n_status == "ok" else n_status) if p.new else None,
                    p.time_ratio, p.memory_ratio, verdict, bad])
    return Table(title, columns, rows, raw, ["l", "l", "l", "r", "r", "r", "r", "r", "l", "l"])


def summary(pairs: list[Pair], factor: float, lenient: bool = False, memory_factor: float | None = None) -> str:
    """One line: what was compared, the verdict counts and the number of regressions."""
    c = counts(pairs)
    n_reg = sum(p.regression(lenient) for p in pairs)
    both = sum(p.base is not None and p.new is not None for p in pairs)
    parts = ", ".join(f"{n} {v}" for v, n in c.items()) or "nothing to compare"
    if sum(c.values()) > len(pairs):
        parts += " (a cell with two verdicts counts for both)"
    memory = "" if memory_factor is None else f", memory factor {memory_factor:g}"
    return (f"{both} cells in both, factor {factor:g}{memory}{', lenient' if lenient else ''}: {parts}; "
            f"{n_reg} regression{'s' if n_reg != 1 else ''}")


def as_json(pairs: list[Pair], factor: float, lenient: bool = False, memory_factor: float | None = None,
            show_all: bool = True) -> dict[str, Any]:
    """The comparison as JSON: the counts and regressions of every pair, and the cells of those that are not
    `same` (all of them with show_all). Written out (`store.dumps`), a number that is not finite is null:
    memory_factor inf (memory not judged), and a ratio over a base of 0 s or 0 bytes (its base figure, which
    each cell carries, says so; a time ratio is null too where either side failed, as its statuses say)."""
    return {
        "factor": factor,
        "memory_factor": factor if memory_factor is None else memory_factor,
        "lenient": lenient,
        "counts": counts(pairs),
        "regressions": sum(p.regression(lenient) for p in pairs),
        "summary": summary(pairs, factor, lenient, memory_factor),
        "cells": [
            {**dict(zip(MATCH, p.key, strict=True)), "verdicts": list(p.verdicts), "regression": p.regression(lenient),
             "base_status": p.base["status"] if p.base else None, "new_status": p.new["status"] if p.new else None,
             "base_step_time_s": p.base.get("step_time_s") if p.base else None,
             "new_step_time_s": p.new.get("step_time_s") if p.new else None,
             "base_max_peak_memory_bytes": p.base.get("max_peak_memory_bytes") if p.base else None,
             "new_max_peak_memory_bytes": p.new.get("max_peak_memory_bytes") if p.new else None,
             "time_ratio": p.time_ratio, "memory_ratio": p.memory_ratio, "not_comparable_because": p.why or None}
            for p in pairs if show_all or p.verdicts != ("same",)
        ],
    }
