"""Fingerprints of placer code, so that a run reruns a stored cell whose placer has changed since.

A placer's fingerprint hashes the source of its module and of every module of the same top-level package
that it imports, transitively, found by reading import statements (nothing is imported or run): for
`rl.seq2seq` that includes the `rl` modules it uses (features, grouping, trainers), for a plugin file the
file alone. Changes elsewhere (the simulator, the rest of the suite, installed packages) are not covered:
the store's manifest records the commit and package versions of every run for those, and tables warn when
rows come from different code.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import inspect
from pathlib import Path


def placer_code(name: str) -> str | None:
    """The fingerprint of a registered placer (12 hex digits), or None where its source cannot be read."""
    from suite.placer import _REGISTERED, _entry_points

    try:
        if name in _REGISTERED:
            cls = _REGISTERED[name]
            module, file = cls.__module__, Path(inspect.getsourcefile(cls) or "")
        else:
            module = _entry_points()[name].module
            file = _module_file(module)
        if file is None or not file.is_file():
            return None
        return fingerprint(module, file)
    except (KeyError, TypeError, OSError, SyntaxError, ValueError, ImportError):
        return None


def fingerprint(module: str, file: Path) -> str:
    """Hash of `file` (the source of `module`) and of the modules of its top-level package it imports."""
    digest = hashlib.sha256()
    for name, path in sorted(module_closure(module, file).items()):
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def module_closure(module: str, file: Path) -> dict[str, Path]:
    """`module` and the modules of its top-level package it imports (with their parent packages),
    transitively: name -> source file."""
    top = module.split(".")[0]
    found: dict[str, Path] = {}
    todo = [(module, file)]
    while todo:
        name, path = todo.pop()
        if name in found:
            continue
        found[name] = path
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for imported in _imports(ast.parse(path.read_bytes(), filename=str(path)), package):
            parts = imported.split(".")
            if parts[0] != top:
                continue
            for k in range(1, len(parts) + 1):  # importing a.b.c runs a and a.b first
                prefix = ".".join(parts[:k])
                source = None if prefix in found else _module_file(prefix)
                if source is not None:
                    todo.append((prefix, source))
    return found


def _imports(tree: ast.AST, package: str) -> list[str]:
    """Absolute names of the modules an import statement may name: `from a import b` names a and a.b."""
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                if not package:
                    continue
                base = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
            else:
                base = node.module or ""
            names += [base] + [f"{base}.{alias.name}" for alias in node.names]
    return names


def _module_file(name: str) -> Path | None:
    """The source file of a module, found from its top-level package's folder without importing it."""
    top, *rest = name.split(".")
    spec = importlib.util.find_spec(top)  # a top-level name: nothing is imported
    if spec is None:
        return None
    if not rest:
        return Path(spec.origin) if spec.origin and spec.origin.endswith(".py") else None
    for folder in spec.submodule_search_locations or ():
        base = Path(folder).joinpath(*rest)
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None
