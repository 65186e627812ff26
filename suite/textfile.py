"""Reading the project's text inputs (TOML and JSON files) with one kind of error per caller, and their numbers.

A missing file, a directory, bytes that are not UTF-8 or text that does not parse become the caller's error
class with a message that starts with the file's path; never a bare OSError or decoder traceback.
"""

from __future__ import annotations

import json
import math
import numbers
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


def load_toml(path: str | Path, error: type[PlacebenchError], what: str) -> dict[str, Any]:
    text = read_text(path, error, what)
    try:
        return tomllib.loads(text)
    except (ValueError, RecursionError) as exc:  # ValueError: TOMLDecodeError, or an integer too long to convert
        raise error(f"{path}: not valid TOML: {exc}") from None


def load_json(path: str | Path, error: type[PlacebenchError], what: str) -> Any:
    return parse_json(read_text(path, error, what), path, error)


def parse_json(text: str, path: str | Path, error: type[PlacebenchError]) -> Any:
    """JSON text read from `path` (by the caller, e.g. from a gzip file)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:  # ValueError: JSONDecodeError, or an integer too long to convert
        raise error(f"{path}: not valid JSON: {exc}") from None


def as_float(value: Any) -> float:
    """A number from a data file as a float: NaN if it is not a real number (bools included), +-inf if it is
    too large for one; callers check the range they need."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return math.nan
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf
