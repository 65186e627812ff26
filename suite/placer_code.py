"""Fingerprints of placer code, so that a run reruns a stored cell whose placer has changed since.

A placer's fingerprint hashes the source of its module, of its parent packages and of every module of the
same top-level package that it imports, transitively, found by reading import statements (nothing is
imported or run): for `rl.seq2seq` that includes the `rl` modules it uses (features, grouping, trainers),
for a plugin file the file alone. Modules loaded by `importlib.import_module` or `__import__` calls are
followed when the call names them with a string literal, not when the name is built at run time. Changes
elsewhere (the simulator, the rest of the suite, installed packages) are not covered: the store's manifest
records the commit and package versions of every run for those, and tables warn when rows come from
different code.
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
    """Hash of `file` (the source of `module`) and of the modules of its top-level package it imports.

    Modules enter the hash by their names below the top-level package, so the same code under another
    top-level name (a plugin file loaded from another folder) has the same fingerprint."""
    digest = hashlib.sha256()
    for name, path in sorted(module_closure(module, file).items()):
        digest.update(name.partition(".")[2].encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def module_closure(module: str, file: Path) -> dict[str, Path]:
    """`module`, its parent packages and the modules of its top-level package it imports (with their
    parent packages), transitively: name -> source file. A module that does not parse is included
    without following its imports."""
    top = module.split(".")[0]
    found: dict[str, Path] = {}
    todo = [(module, file)] + [(name, path) for name, path in _with_parents(module, found) if name != module]
    while todo:
        name, path = todo.pop()
        if name in found:
            continue
        found[name] = path
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        try:
            tree = ast.parse(path.read_bytes(), filename=str(path))
        except (SyntaxError, ValueError):
            continue
        for imported in _imports(tree, package):
            if imported.split(".")[0] == top:
                todo += _with_parents(imported, found)  # importing a.b.c runs a and a.b first
    return found


def _with_parents(name: str, found: dict[str, Path]) -> list[tuple[str, Path]]:
    """(name, file) of a.b.c's packages a, a.b and of a.b.c itself, where found and not yet in `found`."""
    parts = name.split(".")
    out = []
    for k in range(1, len(parts) + 1):
        prefix = ".".join(parts[:k])
        source = None if prefix in found else _module_file(prefix)
        if source is not None:
            out.append((prefix, source))
    return out


def _imports(tree: ast.AST, package: str) -> list[str]:
    """Absolute names of the modules an import statement may name (`from a import b` names a and a.b), and
    of those that `importlib.import_module` or `__import__` calls name as string literals (a relative name
    against this module's package); names built at run time are not seen."""
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            names += _literal_import(node, package)
        elif isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                try:
                    base = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
                except (ImportError, ValueError):  # above the top-level package, or no package
                    continue
            else:
                base = node.module or ""
            names += [base] + [f"{base}.{alias.name}" for alias in node.names]
    return names


def _literal_import(call: ast.Call, package: str) -> list[str]:
    """The module an `import_module("...")` / `importlib.import_module("...")` / `__import__("...")` call
    names with a string literal (nothing for other calls, or a name built at run time)."""
    func = call.func
    called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    if called not in ("import_module", "__import__") or not call.args:
        return []
    first = call.args[0]
    if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
        return []
    name = first.value
    if name.startswith("."):
        try:
            name = importlib.util.resolve_name(name, package)
        except (ImportError, ValueError):
            return []
    return [name]


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
