"""Human-expert placements: the hand-made placements the placement papers compare against.

Rules key off `workload.metadata["model"]` and each op's `scope` (conventions in the zoo; backward and
update ops carry their forward op's scope). They are applied per colocation group (node), using the scope
of the group's first op, so colocation holds by construction. G = the cluster's GPUs in index order.

`human_expert` (the papers' "Human Experts" rows):
* rnnlm, nmt — the "Human Experts" rows of Mirhoseini et al. 2017 (arXiv 1706.04972). The paper's
  baseline section could not be read from the stored copies this project reaches (title, abstract and
  Sec. 1 only), so the rule is not checked against it. Sec. 1 names the practice: "in a neural translation
  network, each layer, including all LSTM layers, the attention layer, and the softmax layer, is computed
  by a GPU (Sutskever et al., 2014; Wu et al., 2016)". Sutskever et al. 2014, Sec. 3.5 (8 GPUs): "Our
  models have 4 layers of LSTMs, each of which resides on a separate GPU. The remaining 4 GPUs were used
  to parallelize the softmax" (4 GPUs for the 4 encoder and 4 decoder layers: layer k of both on GPU k).
  Wu et al. 2016 (GNMT), Fig. 1: 8 encoder and 8 decoder layers, "one model replica is partitioned 8-ways
  and is placed on 8 different GPUs". Our rule: the LSTM layers, numbered encoder first then decoder, go
  round-robin over G (layer slot k on G[k mod |G|]); the embeddings on the first GPU; attention and
  softmax on the last GPU. Ours, not the sources': numbering the decoder's layers after the encoder's
  (the sources' "layer k of both on GPU k" only where |G| divides the layers per side: not nmt-2x1024 on
  4 or 8 GPUs, nor nmt-4x4096 on 8, where the decoder gets GPUs of its own); attention and softmax on
  G[-1], with the top LSTM layer when no GPU is spare, rather than on the spare GPUs, and the softmax
  not split; round-robin rather than contiguous blocks when layers outnumber GPUs (the sources have GPUs
  enough). rnnlm with 2 layers on 4 GPUs leaves one GPU idle.
* inception_v3, resnet50 — the whole model on a single GPU (here the fastest GPU): the practice this
  project takes for the papers' Inception-V3 "Human Experts" row at their batch sizes (Mirhoseini et al.
  2017, Sec. 4; not re-read, as above).
* bert_base — contiguous blocks of encoder layers per GPU (equal layer counts, `numpy.array_split`), the
  embeddings with the first block, pooler and head with the last (the last non-empty one: with more GPUs
  than layers the GPUs after it stay idle): layer-wise model parallelism as in GPipe (Huang et al. 2019).
* any other workload — a balanced contiguous split of the groups along the topological order over G,
  balanced by compute time on the fastest GPU.

`human_expert_pipeline` (a second, named variant): a layer-pipeline split of `metadata["blocks"]` (the
ordered top-level blocks of the model) into |G| contiguous stages balanced by compute time — the pipeline
split of Inception-V3 / ResNet-50 across GPUs (GPipe, Huang et al. 2019); for workloads without blocks, the
balanced contiguous split along the topological order.

Ops whose scope matches no rule follow the group before them in topological order (the first GPU if
none). Where a model's rule finds none of its layers in the graph (no LSTM layer for rnnlm and nmt, no
encoder layer for bert_base, no block for the pipeline variant: scopes named otherwise), the layer split
it is named for did not happen, and `info["rule"]` says so: `no_layer_matched` (the ops matching the
rule's other parts, such as the embeddings, still go where it puts them). With no GPU, everything goes
to the fastest CPU. Ops that forbid the chosen device kind are moved to the allowed device they exchange
the most bytes with (`_common.enforce_kinds`). Memory is ignored: these are the experts' placements, OOM
or not. Single shot: no evaluations.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence

import numpy as np

from baselines import _common
from suite.cluster import Cluster
from suite.methodology import Budget
from suite.placer import BasePlacer, PlacementResult, Problem

UNASSIGNED = -1


def in_scope(scope: str, prefix: str) -> bool:
    """Is `scope` the module `prefix` or inside it (dotted path)?"""
    return scope == prefix or scope.startswith(prefix + ".")


def balanced_contiguous(costs: Sequence[float], parts: int) -> np.ndarray:
    """Part of each item when a sequence is cut into `parts` contiguous runs of about equal total cost.

    Item j goes to part floor(parts * midpoint_j / total), midpoint_j being the cumulative cost up to the
    middle of item j: monotone, so every part is one contiguous run (a part may be empty).
    """
    c = np.asarray(costs, dtype=np.float64)
    if parts <= 1 or not len(c):
        return np.zeros(len(c), dtype=np.int64)
    total = c.sum()
    if total <= 0:
        return np.minimum(np.arange(len(c)) * parts // len(c), parts - 1).astype(np.int64)
    mid = np.cumsum(c) - c / 2.0
    return np.minimum((parts * mid / total).astype(np.int64), parts - 1)


def _lstm_layer(scope: str, families: Sequence[str]) -> tuple[int, int] | None:
    """(family rank, layer) when `scope` is inside "{family}.lstm.{layer}" ("lstm.{layer}" for family "")."""
    for rank, fam in enumerate(families):
        m = re.match(r"^" + re.escape(fam + "." if fam else "") + r"lstm\.(\d+)(?:\.|$)", scope)
        if m:
            return rank, int(m.group(1))
    return None


def _lstm_rule(scopes: list[str], gpus: list[int], families: Sequence[str]) -> list[int]:
    """LSTM layers, numbered family by family (encoder then decoder), round-robin over the GPUs."""
    layers = sorted({key for s in scopes if (key := _lstm_layer(s, families)) is not None})
    slot = {key: k for k, key in enumerate(layers)}
    out = []
    for s in scopes:
        key = _lstm_layer(s, families)
        if key is not None:
            out.append(gpus[slot[key] % len(gpus)])
        elif any(in_scope(s, e) for e in ("embedding", "encoder.embedding", "decoder.embedding")):
            out.append(gpus[0])
        elif in_scope(s, "attention") or in_scope(s, "softmax"):
            out.append(gpus[-1])
        else:
            out.append(UNASSIGNED)
    return out


_BERT_LAYER = re.compile(r"^encoder\.layer\.(\d+)(?:\.|$)")


def _bert_rule(scopes: list[str], gpus: list[int]) -> list[int]:
    layers = sorted({int(m.group(1)) for s in scopes if (m := _BERT_LAYER.match(s))})
    stage = {}
    for k, chunk in enumerate(np.array_split(np.array(layers, dtype=np.int64), len(gpus))):
        for layer in chunk.tolist():
            stage[layer] = gpus[k]
    # with more GPUs than layers the last blocks are empty: pooler and head go with the last layer's block
    last = stage[layers[-1]] if layers else gpus[-1]
    out = []
    for s in scopes:
        m = _BERT_LAYER.match(s)
        if m:
            out.append(stage[int(m.group(1))])
        elif in_scope(s, "embeddings"):
            out.append(gpus[0])
        elif in_scope(s, "pooler") or in_scope(s, "head"):
            out.append(last)
        else:
            out.append(UNASSIGNED)
    return out


def _block_of(scope: str, blocks: Sequence[str]) -> int:
    """Index of the longest block that contains `scope`, or -1."""
    best, best_len = -1, -1
    for b, name in enumerate(blocks):
        if in_scope(scope, name) and len(name) > best_len:
            best, best_len = b, len(name)
    return best


def _pipeline_rule(scopes: list[str], node_cost: np.ndarray, blocks: Sequence[str], gpus: list[int]) -> list[int]:
    block = np.array([_block_of(s, blocks) for s in scopes], dtype=np.int64)
    block_cost = np.zeros(len(blocks))
    np.add.at(block_cost, block[block >= 0], node_cost[block >= 0])
    stage = balanced_contiguous(block_cost, len(gpus))
    return [gpus[stage[b]] if b >= 0 else UNASSIGNED for b in block.tolist()]


def _fill_unassigned(node_device: list[int], default: int) -> np.ndarray:
    """Unmatched nodes follow the node before them in topological order (`default` if none)."""
    out = np.array(node_device, dtype=np.int64)
    last = default
    for k in range(len(out)):
        if out[k] == UNASSIGNED:
            out[k] = last
        else:
            last = out[k]
    return out


def expert_node_devices(problem: Problem, variant: str) -> tuple[np.ndarray, str, object]:
    """(node placement, rule name, contraction) for a workload under the `variant` rules."""
    graph, cluster = problem.workload, problem.cluster
    con = _common.contract(graph)
    scopes = [graph.ops[i].scope for i in con.first_op.tolist()]
    gpus = cluster.device_indices("gpu")
    single = cluster.fastest("gpu") if gpus else cluster.fastest("cpu")
    if not gpus:
        return np.full(con.num_nodes, single, dtype=np.int64), "no_gpu_single_cpu", con
    ref = _common.reference_device(cluster, gpus)
    node_cost = con.node_sum(problem.costs()[:, ref])
    model = str(graph.metadata.get("model", ""))
    blocks = list(graph.metadata.get("blocks", []) or [])
    layered = True  # the rule found the layers (blocks) it splits
    if variant == "pipeline":
        if blocks:
            devs, rule = _pipeline_rule(scopes, node_cost, blocks, gpus), "block_pipeline"
            layered = any(_block_of(s, blocks) >= 0 for s in scopes)
        else:
            devs, rule = [gpus[k] for k in balanced_contiguous(node_cost, len(gpus))], "balanced_topological"
    elif model in ("rnnlm", "nmt"):
        families = [""] if model == "rnnlm" else ["encoder", "decoder"]
        devs, rule = _lstm_rule(scopes, gpus, families), "lstm_per_gpu"
        layered = any(_lstm_layer(s, families) is not None for s in scopes)
    elif model in ("inception_v3", "resnet50"):
        devs, rule = [single] * con.num_nodes, "single_gpu"
    elif model == "bert_base":
        devs, rule = _bert_rule(scopes, gpus), "layer_blocks"
        layered = any(_BERT_LAYER.match(s) for s in scopes)
    else:
        devs, rule = [gpus[k] for k in balanced_contiguous(node_cost, len(gpus))], "balanced_topological"
    if not layered:  # the rule's layers are not in the graph: do not name a split that did not happen
        rule = "no_layer_matched"
    return _fill_unassigned(devs, gpus[0]), rule, con


class HumanExpert(BasePlacer):
    """The papers' human-expert placement (see the module docstring for each rule and its source)."""

    name = "human_expert"
    variant = "expert"

    def place(self, problem: Problem, budget: Budget, seed: int) -> PlacementResult:
        started = time.perf_counter()
        node_device, rule, con = expert_node_devices(problem, self.variant)
        cluster: Cluster = problem.cluster
        allowed = _common.allowed_nodes(con, cluster)
        node_device, moved = _common.enforce_kinds(node_device, con, allowed, _common.speed_order(cluster))
        return PlacementResult.from_search(con.expand(node_device), problem, started, rule=rule, kind_moves=moved)


class HumanExpertPipeline(HumanExpert):
    """Layer-pipeline split of the model's blocks over the GPUs, balanced by compute time."""

    name = "human_expert_pipeline"
    variant = "pipeline"
