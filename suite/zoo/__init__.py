"""The model zoo: versioned workloads captured from model definitions in this repository, with a graph cache.

Names carry the shape of the workload: `{model}-{layers}x{hidden}[-s{seq}]-b{batch}` for sequence models,
`{model}-b{batch}` for image models. Mode: a name without suffix is a **training** step (forward, backward,
SGD-with-momentum update; see `suite.capture.training`), as timed by Mirhoseini et al. 2017, Placeto and
Post; a name ending in `-infer` is an **inference** step (forward only), as timed by HSDAG (batch 1, as in
its code). Every graph's metadata states "mode", "model", "batch_size", "num_layers" (sequence models and
BERT), "blocks" (ordered top-level block scopes, for pipeline splits), "source" (the paper the shape comes
from), "workload_params", "params" and "forward_macs" (whole batch).

Workloads (families in `suite/zoo/<family>.py`, shared layers in `suite/zoo/layers.py`):

  rnnlm-2x2048-b64          2-layer LSTM 2048, 40 steps, vocabulary 10k (assumed)     training
  rnnlm-4x6144-b64          large: 4-layer LSTM 6144 (1.33 G parameters)              training
  nmt-2x1024-b64            2+2-layer LSTM 1024, attention, 40+40 steps, vocab 32k    training
  nmt-4x4096-b64            large: 4+4-layer LSTM 4096 (1.50 G parameters)            training
  inception_v3-b32 / -b1-infer     299x299x3, no auxiliary classifier               training / inference
  resnet50-b32 / -b1-infer         224x224x3                                        training / inference
  bert_base-12x768-s128-b8 / -b1-infer   sequence 128, 2-class head                 training / inference

The large variants (`large=True`: wider and deeper RNNLM and NMT, in the spirit of the papers'
large-model experiments; the sizes are ours) need about 18 GiB for a training step on one device, so
single-GPU placement is OOM on a K80 (GK210, 11441 MiB) while the 128 GiB host fits them, and a layer-wise
split over 2 or 4 K80s fits. The base workloads fit one K80 (the papers report single-GPU rows for them).
`Workload.reference` holds published figures (parameters, multiply-adds per example) with their source;
tests compare the captured totals with them.

API: `names()`, `describe(name)`, `build(name)` (trace now, no cache), `load(name)` (cached).

Cache: `results/graphs/<name>.json.gz` (gzipped graph JSON, written byte-reproducibly) and
`results/graphs/index.json` (name -> file, content hash, source hash, op/edge counts). The source hash
covers the model definition files, the builder parameters and metadata, `suite.capture.CAPTURE_VERSION`
and `ZOO_VERSION`; `load` uses the cached graph when the source hash matches and re-traces (then rewrites
file and index atomically) when it does not, or when the entry is missing or not an object. A cached file
whose content does not match the index is an error, not silently replaced. `PLACEBENCH_GRAPH_DIR` overrides
the cache directory (outside a checkout the default is ~/.cache/placebench/graphs). Loading from the cache
does not import torch.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from suite import graph_io
from suite.capture import CAPTURE_VERSION
from suite.errors import GraphError, UnknownNameError
from suite.graph import OpGraph
from suite.textfile import load_json

ZOO_VERSION = 1  # bump when this file changes how graphs or their metadata are made
INDEX_FORMAT = "placebench.graph_index"
INDEX_SCHEMA_VERSION = 1
_HERE = Path(__file__).resolve().parent
_REPO_RESULTS = _HERE.parents[1] / "results"
# in a checkout: the committed results/graphs; in an installed package: the user's cache directory
DEFAULT_CACHE_DIR = (
    _REPO_RESULTS / "graphs"
    if _REPO_RESULTS.is_dir()
    else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "placebench" / "graphs"
)

MIRHOSEINI = "Mirhoseini et al., Device Placement Optimization with Reinforcement Learning, ICML 2017, Sec. 4.1"
HSDAG = "Duan et al., A Structure-Aware Framework for Learning Device Placements on Computation Graphs, NeurIPS 2024"


@dataclass(frozen=True)
class Workload:
    """One registered zoo workload."""

    name: str
    family: str  # module suite.zoo.<family>
    mode: str  # "training" or "inference"
    params: Mapping[str, Any]  # builder parameters (shape of the model)
    description: str
    source: str  # the paper the shape comes from
    reference: Mapping[str, Any] = field(default_factory=dict)  # published figures, labelled with their source
    large: bool = False  # does not fit one K80 GPU

    def blocks(self) -> list[str]:
        return _BLOCKS[self.family](self.params)

    def metadata(self) -> dict[str, Any]:
        p = self.params
        meta: dict[str, Any] = {
            "model": self.family,
            "mode": self.mode,
            "batch_size": p["batch_size"],
            "blocks": self.blocks(),
            "source": self.source,
            "workload_params": dict(p),
        }
        if "num_layers" in p or self.family == "bert_base":
            meta["num_layers"] = p.get("num_layers", 12)
        return meta


def _rnnlm_blocks(p: Mapping[str, Any]) -> list[str]:
    return ["embedding", *[f"lstm.{i}" for i in range(p["num_layers"])], "softmax"]


def _nmt_blocks(p: Mapping[str, Any]) -> list[str]:
    n = p["num_layers"]
    return ["encoder.embedding", *[f"encoder.lstm.{i}" for i in range(n)], "decoder.embedding",
            *[f"decoder.lstm.{i}" for i in range(n)], "attention", "softmax"]


def _resnet50_blocks(p: Mapping[str, Any]) -> list[str]:
    return ["stem", *[f"layer{i + 1}.{b}" for i, n in enumerate((3, 4, 6, 3)) for b in range(n)], "head"]


def _inception_blocks(p: Mapping[str, Any]) -> list[str]:
    mixed = ["mixed_5b", "mixed_5c", "mixed_5d", "mixed_6a", "mixed_6b", "mixed_6c", "mixed_6d", "mixed_6e",
             "mixed_7a", "mixed_7b", "mixed_7c"]
    return ["stem", *mixed, "head"]


def _bert_blocks(p: Mapping[str, Any]) -> list[str]:
    return ["embeddings", *[f"encoder.layer.{k}" for k in range(p.get("num_layers", 12))], "pooler", "head"]


_BLOCKS: dict[str, Callable[[Mapping[str, Any]], list[str]]] = {
    "rnnlm": _rnnlm_blocks,
    "nmt": _nmt_blocks,
    "resnet50": _resnet50_blocks,
    "inception_v3": _inception_blocks,
    "bert_base": _bert_blocks,
}

_RESNET_REF = {"params": 25_557_032, "macs_per_example": 4.09e9,
               "source": "torchvision ResNet50_Weights.IMAGENET1K_V1 model card (25.6 M params, 4.09 GFLOPS = G multiply-adds)"}
_INCEPTION_REF = {"params": 23_834_568, "macs_per_example": 5.71e9,
                  "source": "torchvision Inception_V3_Weights.IMAGENET1K_V1 model card (5.71 G multiply-adds, "
                            "27,161,264 parameters with the auxiliary classifier); parameters without it derived: "
                            "27,161,264 less the auxiliary classifier's 3,326,696 (Keras Applications lists 23.9 M, "
                            "counting batch-norm statistics)"}
_BERT_REF = {"params": 110e6, "source": "Devlin et al., NAACL 2019, Sec. 3: BERT-base, 110 M parameters"}

_SPECS: tuple[Workload, ...] = (
    Workload("rnnlm-2x2048-b64", "rnnlm", "training",
             {"batch_size": 64, "hidden_size": 2048, "num_layers": 2, "num_steps": 40, "vocab_size": 10000},
             "RNNLM: 2-layer LSTM 2048, 40 unrolled steps, batch 64, training step", MIRHOSEINI),
    Workload("rnnlm-4x6144-b64", "rnnlm", "training",
             {"batch_size": 64, "hidden_size": 6144, "num_layers": 4, "num_steps": 40, "vocab_size": 10000},
             "Large RNNLM: 4-layer LSTM 6144 (1.3 G parameters), 40 steps, batch 64, training step; OOM on one K80",
             MIRHOSEINI + " (large-model variant, our sizes)", large=True),
    Workload("nmt-2x1024-b64", "nmt", "training",
             {"batch_size": 64, "hidden_size": 1024, "num_layers": 2, "src_steps": 40, "tgt_steps": 40,
              "vocab_size": 32000},
             "NMT: 2-layer LSTM 1024 encoder-decoder with attention, 40+40 steps, batch 64, training step", MIRHOSEINI),
    Workload("nmt-4x4096-b64", "nmt", "training",
             {"batch_size": 64, "hidden_size": 4096, "num_layers": 4, "src_steps": 40, "tgt_steps": 40,
              "vocab_size": 32000},
             "Large NMT: 4-layer LSTM 4096 encoder-decoder with attention (1.5 G parameters), 40+40 steps, batch 64, "
             "training step; OOM on one K80", MIRHOSEINI + " (large-model variant, our sizes)", large=True),
    Workload("inception_v3-b32", "inception_v3", "training", {"batch_size": 32, "image_size": 299},
             "Inception-V3, 299x299x3, batch 32, training step", MIRHOSEINI, _INCEPTION_REF),
    Workload("inception_v3-b1-infer", "inception_v3", "inference", {"batch_size": 1, "image_size": 299},
             "Inception-V3, 299x299x3, batch 1, inference", HSDAG, _INCEPTION_REF),
    Workload("resnet50-b32", "resnet50", "training", {"batch_size": 32, "image_size": 224},
             "ResNet-50, 224x224x3, batch 32, training step",
             "Gao et al., Post: Device Placement with Cross-Entropy Minimization and Proximal Policy Optimization, "
             "NeurIPS 2018", _RESNET_REF),
    Workload("resnet50-b1-infer", "resnet50", "inference", {"batch_size": 1, "image_size": 224},
             "ResNet-50, 224x224x3, batch 1, inference", HSDAG, _RESNET_REF),
    Workload("bert_base-12x768-s128-b8", "bert_base", "training", {"batch_size": 8, "seq_len": 128},
             "BERT-base (12 layers, hidden 768), sequence 128, batch 8, training step (classification head)",
             HSDAG + " (model shape; training step is ours)", _BERT_REF),
    Workload("bert_base-12x768-s128-b1-infer", "bert_base", "inference", {"batch_size": 1, "seq_len": 128},
             "BERT-base (12 layers, hidden 768), sequence 128, batch 1, inference", HSDAG, _BERT_REF),
)
_REGISTRY: dict[str, Workload] = {w.name: w for w in _SPECS}
_MEMO: dict[tuple[str, str], tuple[str, OpGraph]] = {}


def names() -> list[str]:
    """Registered workload names, sorted."""
    return sorted(_REGISTRY)


def spec(name: str) -> Workload:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownNameError(f"unknown workload {name!r}; zoo workloads: {', '.join(names())}") from None


def describe(name: str) -> dict[str, Any]:
    """What a workload is, without building it: mode, shape, source, published figures, cached sizes."""
    w = spec(name)
    out: dict[str, Any] = {
        "name": w.name,
        "model": w.family,
        "mode": w.mode,
        "description": w.description,
        "params": dict(w.params),
        "source": w.source,
        "reference": dict(w.reference),
        "large": w.large,
        "blocks": w.blocks(),
    }
    entry = _index_entry(cache_dir(), name)
    if entry:
        out["cached"] = {k: entry[k] for k in ("num_ops", "num_edges", "content_hash") if k in entry}
    return out


def cache_dir() -> Path:
    env = os.environ.get("PLACEBENCH_GRAPH_DIR")
    return Path(env) if env else DEFAULT_CACHE_DIR


def source_hash(name: str) -> str:
    """Hash of everything a workload's graph is made from (model code, parameters, capture version)."""
    w = spec(name)
    files = {}
    for fname in (f"{w.family}.py", "layers.py"):
        files[fname] = hashlib.sha256((_HERE / fname).read_bytes()).hexdigest()
    blob = json.dumps(
        {"capture_version": CAPTURE_VERSION, "zoo_version": ZOO_VERSION, "name": w.name, "family": w.family,
         "mode": w.mode, "params": dict(w.params), "metadata": w.metadata(), "files": files},
        sort_keys=True,
    )
    return "sha256:" + hashlib.sha256(blob.encode()).hexdigest()


def build(name: str) -> OpGraph:
    """Trace the workload now (no cache); imports torch."""
    import importlib

    import torch

    from suite.capture.fx import capture

    w = spec(name)
    family = importlib.import_module(f"suite.zoo.{w.family}")
    with torch.device("meta"):
        model, inputs = family.model_and_inputs(**w.params, with_loss=w.mode == "training")
    return capture(model, inputs, name=w.name, mode=w.mode, metadata=w.metadata())


def load(name: str, *, cache: str | Path | None = None) -> OpGraph:
    """The workload's graph: from the cache when its source hash matches, else traced and cached."""
    w = spec(name)
    directory = Path(cache) if cache is not None else cache_dir()
    src = source_hash(w.name)
    memo = _MEMO.get((str(directory), name))
    if memo is not None and memo[0] == src:
        return memo[1]
    entry = _index_entry(directory, name)
    path = directory / f"{name}.json.gz"
    graph = None
    if entry and entry.get("source_hash") == src and path.exists():
        graph = graph_io.load(path)
        if graph.content_hash != entry.get("content_hash"):
            raise GraphError(
                f"{path}: content hash {graph.content_hash} does not match {directory / 'index.json'} "
                f"({entry.get('content_hash')}); delete the file to rebuild it"
            )
    if graph is None:
        graph = build(name)
        with contextlib.suppress(OSError):  # a read-only cache still gives a graph
            _store(directory, graph, src)
    _MEMO[(str(directory), name)] = (src, graph)
    return graph


def _read_index(directory: Path) -> dict[str, dict[str, Any]]:
    path = directory / "index.json"
    if not path.exists():
        return {}
    data = load_json(path, GraphError, "graph index")
    if not isinstance(data, dict) or data.get("format") != INDEX_FORMAT or not isinstance(data.get("workloads"), dict):
        raise GraphError(f"{path}: not a placebench graph index (field 'format' must be {INDEX_FORMAT!r})")
    if data.get("schema_version") != INDEX_SCHEMA_VERSION:
        raise GraphError(f"{path}: schema_version {data.get('schema_version')!r} is not supported")
    return data["workloads"]


def _index_entry(directory: Path, name: str) -> dict[str, Any] | None:
    """A workload's index entry; one that is not an object counts as missing (re-traced, like a stale one)."""
    entry = _read_index(directory).get(name)
    return entry if isinstance(entry, dict) else None


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """Exclusive lock on the cache directory itself (no lock file left behind); none where flock is missing."""
    directory.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:
        yield
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def graph_bytes(graph: OpGraph) -> bytes:
    """The gzipped JSON of a graph, byte-reproducible (no timestamp in the gzip header)."""
    text = json.dumps(graph_io.to_dict(graph), separators=(",", ":"), allow_nan=False)
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, compresslevel=9, mtime=0) as gz:
        gz.write(text.encode("utf-8"))
    return buf.getvalue()


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def _store(directory: Path, graph: OpGraph, src: str) -> None:
    with _locked(directory):
        _write_atomic(directory / f"{graph.name}.json.gz", graph_bytes(graph))
        index = _read_index(directory)
        index[graph.name] = {
            "file": f"{graph.name}.json.gz",
            "content_hash": graph.content_hash,
            "source_hash": src,
            "mode": graph.metadata.get("mode"),
            "num_ops": graph.num_ops,
            "num_edges": graph.num_edges,
        }
        body = {"format": INDEX_FORMAT, "schema_version": INDEX_SCHEMA_VERSION,
                "workloads": {k: index[k] for k in sorted(index)}}
        _write_atomic(directory / "index.json", (json.dumps(body, indent=1, sort_keys=True) + "\n").encode())
