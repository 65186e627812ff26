"""Reading the project's text inputs (TOML and JSON files) with one kind of error per caller, and their numbers.

A missing file, a directory, bytes that are not UTF-8 or text that does not parse become the caller's error
class with a message that starts with the file's path; never a bare OSError or decoder traceback.
"""

from __future__ import annotations

import json
import math
import numbers
import re
import tomllib
from pathlib import Path
from typing import Any

from suite.errors import PlacebenchError


def read_text(path: str | Path, error: type[PlacebenchError], what: str) -> str:
    """The UTF-8 text of `path`, a `what` file ("cluster", "profile", ...)."""
    path = Path(path)
    try:
        return path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise error(f"{path}: no such {what} file") from None
    except OSError as exc:
        raise error(f"{path}: cannot read the {what} file: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not valid UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})") from None
    except ValueError as exc:  # a NUL character in the path
        raise error(f"{str(path)!r}: not a usable {what} file name: {exc}") from None


def load_toml(path: str | Path, error: type[PlacebenchError], what: str) -> dict[str, Any]:
    text = read_text(path, error, what)
    try:
        return tomllib.loads(text)
    except (ValueError, RecursionError) as exc:  # ValueError: TOMLDecodeError, or an integer too long to convert
        raise error(f"{path}: not valid TOML: {exc}") from None


def load_json(path: str | Path, error: type[PlacebenchError], what: str) -> Any:
    return parse_json(read_text(path, error, what), path, error)


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(f"key {key!r} appears twice in one object")
        out[key] = value
    return out


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")  # "\ud800": half of a UTF-16 pair, in JSON text


def _first_lone_surrogate(x: Any, where: str) -> str | None:
    """`where.key[i]` of the first string (a key or a value) in JSON data `x` that holds a lone surrogate, or
    None: such a string is no text (it cannot be written as UTF-8 or printed)."""
    if isinstance(x, str):
        try:
            x.encode("utf-8")
        except UnicodeEncodeError:
            return f"{where or 'the top level'} = {x!r}"
        return None
    items = x.items() if isinstance(x, dict) else enumerate(x) if isinstance(x, list) else ()
    for k, v in items:
        at = f"{where}[{k}]" if isinstance(k, int) else f"{where}.{k}" if where else k
        bad = _first_lone_surrogate(k, f"a key in {where or 'the top level'}") or _first_lone_surrogate(v, at)
        if bad:
            return bad
    return None


def parse_json(text: str, path: str | Path, error: type[PlacebenchError]) -> Any:
    """JSON text read from `path` (by the caller, e.g. from a gzip file). A key given twice in one object is
    an error (json would keep the last silently), and so is a string with a lone surrogate escape
    ("\\ud800" without its pair)."""
    try:
        data = json.loads(text, object_pairs_hook=_unique_keys)
    except _DuplicateKey as exc:
        raise error(f"{path}: {exc}") from None
    except (ValueError, RecursionError) as exc:  # ValueError: JSONDecodeError, or an integer too long to convert
        raise error(f"{path}: not valid JSON: {exc}") from None
    bad = _first_lone_surrogate(data, "") if _SURROGATE_ESCAPE.search(text) else None
    if bad:
        raise error(f"{path}: {bad}: a lone surrogate escape (half of a UTF-16 pair) is not text")
    return data


def as_float(value: Any) -> float:
    """A number from a data file as a float: NaN if it is not a real number (bools included), +-inf if it is
    too large for one; callers check the range they need."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return math.nan
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def human_bytes(n: float) -> str:
    """Bytes with two decimals in the largest unit (GiB, MiB, KiB) that shows at least 1.00; under 1 KiB,
    exact bytes. The unit follows the rounded value: 2**20 - 1 bytes is 1.00 MiB, not 1024.00 KiB."""
    n = int(n)
    if n < 2**10:
        return f"{n} bytes"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if float(f"{n / scale:.2f}") >= 1.0:
            return f"{n / scale:.2f} {unit}"
    return f"{n / 2**10:.2f} KiB"


MAX_SHOWN = 200  # characters of a value's repr that an error message shows


def short_repr(value: Any) -> str:
    """repr, with a huge integer shown by its size rather than its hundreds of digits, and a long string, list or
    table cut to its start and its size: an error message names a wrong value, it does not repeat 100 KB of it."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30:
        sign = "a negative" if value < 0 else "an"
        return f"{sign} integer of about {int(abs(value).bit_length() * math.log10(2)) + 1} digits"
    text = repr(value)
    if len(text) <= MAX_SHOWN:
        return text
    size = (f"a string of {len(value)} characters" if isinstance(value, str)
            else f"a list of {len(value)} entries" if isinstance(value, list | tuple)
            else f"an object of {len(value)} keys" if isinstance(value, dict)
            else f"{len(text)} characters")
    return f"{text[:MAX_SHOWN - 50]}... ({size})"


def first_non_finite(x: Any, where: str) -> str | None:
    """`where.key[i] = value` of the first NaN or infinite float in JSON data `x`, or None: such a number
    cannot be written as JSON, so a file that holds one is refused by name."""
    if isinstance(x, float) and not math.isfinite(x):
        return f"{where} = {x}"
    items = x.items() if isinstance(x, dict) else enumerate(x) if isinstance(x, list) else ()
    for k, v in items:
        bad = first_non_finite(v, f"{where}.{k}" if isinstance(k, str) else f"{where}[{k}]")
        if bad:
            return bad
    return None
