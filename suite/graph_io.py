"""Versioned JSON serialization of `OpGraph` (optionally gzipped), with a content hash. Never pickle.

File layout (schema version 1)::

    {"format": "placebench.opgraph", "schema_version": 1, "name": ..., "metadata": {...},
     "hash": "sha256:<hex>",
     "ops": [{"name", "kind", "flops", "bytes_read", "bytes_written", "output_bytes", "param_bytes",
              "phase", "group", "allowed_kinds", "output_shape", "scope"}, ...],
     "edges": [[src_name, dst_name, bytes], ...]}

The hash covers name, metadata, ops and edges in canonical form, so an unchanged model hashes the same
on every machine; loading checks it, so a hand-edited or truncated file is reported, not used. A file
without a "hash" key (one written by hand or by another tool) loads: its hash is computed on loading, and
results and profiles name that hash.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import zlib
from pathlib import Path
from typing import Any

from suite.errors import GraphError
from suite.graph import Op, OpGraph
from suite.textfile import MAX_SHOWN, parse_json, short_repr

FORMAT = "placebench.opgraph"
SCHEMA_VERSION = 1
_OP_FIELDS = (
    "name",
    "kind",
    "flops",
    "bytes_read",
    "bytes_written",
    "output_bytes",
    "param_bytes",
    "phase",
    "group",
    "allowed_kinds",
    "output_shape",
    "scope",
)
_REQUIRED_OP_FIELDS = ("name", "kind")


def _op_to_dict(op: Op) -> dict[str, Any]:
    return {
        "name": op.name,
        "kind": op.kind,
        "flops": op.flops,
        "bytes_read": op.bytes_read,
        "bytes_written": op.bytes_written,
        "output_bytes": op.output_bytes,
        "param_bytes": op.param_bytes,
        "phase": op.phase,
        "group": op.group,
        "allowed_kinds": list(op.allowed_kinds),
        "output_shape": list(op.output_shape),
        "scope": op.scope,
    }


def _body(graph: OpGraph) -> dict[str, Any]:
    return {
        "name": graph.name,
        "metadata": dict(graph.metadata),
        "ops": [_op_to_dict(op) for op in graph.ops],
        "edges": [[graph.ops[e.src].name, graph.ops[e.dst].name, e.bytes] for e in graph.edges],
    }


def content_hash(graph: OpGraph) -> str:
    canon = json.dumps(_body(graph), sort_keys=True, separators=(",", ":"), allow_nan=False)
    return "sha256:" + hashlib.sha256(canon.encode()).hexdigest()


def to_dict(graph: OpGraph) -> dict[str, Any]:
    body = _body(graph)
    return {"format": FORMAT, "schema_version": SCHEMA_VERSION, "hash": graph.content_hash, **body}


TOP_KEYS = frozenset({"format", "schema_version", "hash", "name", "metadata", "ops", "edges"})


def from_dict(data: Any, *, source: str = "<dict>", check_hash: bool = True) -> OpGraph:
    """Build a graph from its JSON form; every problem is a `GraphError` naming `source` and the field."""
    if not isinstance(data, dict):
        raise GraphError(f"{source}: expected a JSON object, got {type(data).__name__}")
    if data.get("format") != FORMAT:
        raise GraphError(f"{source}: field 'format' is {short_repr(data.get('format'))}, expected {FORMAT!r}")
    version = data.get("schema_version")
    if type(version) is not int or version != SCHEMA_VERSION:  # not True, not 1.0
        raise GraphError(f"{source}: schema_version {short_repr(version)} is not supported (this placebench reads {SCHEMA_VERSION})")
    unknown = sorted(set(data) - TOP_KEYS)
    if unknown:
        raise GraphError(f"{source}: unknown field(s) {short_repr(unknown)}; known: {', '.join(sorted(TOP_KEYS))}")
    for key, typ in (("name", str), ("ops", list), ("edges", list)):
        if not isinstance(data.get(key), typ):
            raise GraphError(f"{source}: field {key!r} is missing or not a {typ.__name__}")
    metadata = data.get("metadata", {})
    if not isinstance(metadata, dict):
        raise GraphError(f"{source}: field 'metadata' is not an object")
    ops = []
    for i, raw in enumerate(data["ops"]):
        if not isinstance(raw, dict):
            raise GraphError(f"{source}: ops[{i}] is not an object")
        for key in _REQUIRED_OP_FIELDS:
            if key not in raw:
                raise GraphError(f"{source}: ops[{i}] has no field {key!r}")
        unknown = set(raw) - set(_OP_FIELDS)
        if unknown:
            raise GraphError(f"{source}: ops[{i}] has unknown field(s) {short_repr(sorted(unknown))}")
        kw = dict(raw)
        for key in ("allowed_kinds", "output_shape"):
            if key in kw:
                if not isinstance(kw[key], list):
                    raise GraphError(f"{source}: ops[{i}].{key} is not a list")
                kw[key] = tuple(kw[key])
        ops.append(Op(**kw))
    edges = []
    for j, e in enumerate(data["edges"]):
        if not isinstance(e, list) or len(e) != 3:
            raise GraphError(f"{source}: edges[{j}] is not [src, dst, bytes]: {short_repr(e)}")
        edges.append(tuple(e))
    try:
        graph = OpGraph.build(data["name"], ops, edges, metadata)
    except GraphError as exc:
        raise GraphError(f"{source}: {exc}") from None
    if check_hash and "hash" in data and data["hash"] != graph.content_hash:
        said = data["hash"] if isinstance(data["hash"], str) and len(data["hash"]) <= MAX_SHOWN else short_repr(data["hash"])
        raise GraphError(
            f"{source}: content hash mismatch (file says {said}, contents hash to {graph.content_hash}); "
            "the file was edited or is corrupt"
        )
    return graph


def save(graph: OpGraph, path: str | Path) -> Path:
    """Write atomically (`suite.store.atomic_write_bytes`: a temporary file of its own, removed if the write
    fails); a name ending in `.gz` is gzipped (with no time stamp or file name in the gzip header, so the
    same graph always gives the same bytes)."""
    from suite.store import atomic_write_bytes

    path = Path(path)
    data = json.dumps(to_dict(graph), separators=(",", ":"), allow_nan=False).encode("utf-8")
    if path.suffix == ".gz":
        buf = io.BytesIO()
        with gzip.GzipFile(filename="", mode="wb", fileobj=buf, compresslevel=6, mtime=0) as f:
            f.write(data)
        data = buf.getvalue()
    return atomic_write_bytes(path, data)


def load(path: str | Path, *, check_hash: bool = True) -> OpGraph:
    path = Path(path)
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rt", encoding="utf-8") as f:
                text = f.read()
        else:
            text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise GraphError(f"{path}: no such graph file") from None
    except OSError as exc:  # a directory, no permission, not gzip data: the reason without "[Errno N] ... 'path'"
        raise GraphError(f"{path}: cannot read graph file: {exc.strerror or exc}") from None
    except (EOFError, UnicodeDecodeError, zlib.error) as exc:  # zlib.error: damaged compressed data
        raise GraphError(f"{path}: cannot read graph file: {exc}") from None
    except ValueError as exc:  # a NUL character in the path
        raise GraphError(f"{str(path)!r}: not a usable graph file name: {exc}") from None
    return from_dict(parse_json(text, path, GraphError), source=str(path), check_hash=check_hash)
