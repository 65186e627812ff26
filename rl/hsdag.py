"""HSDAG: the placer of "A Structure-Aware Framework for Learning Device Placements on Computation Graphs"
(arXiv 2405.14185, 2024), on CPU with PyTorch.

Method, from the authors' released code (github.com/Esthesia/HSDAG: main.py, model.py, layer.py, config.py;
the paper's tables were not reachable, so no paper figure is quoted here):

1. Coarsening: chain merging (`rl.grouping.chain_grouping`, the authors' `merge_operations`), here after
   the colocation groups every grouping keeps; optionally capped at `max_groups` by heavy-edge coarsening.
2. Features of each group: op-kind shares and sizes (`rl.features.group_features`, no adjacency rows) and
   the group's time on every device (`rl.features.cost_features`).
3. Learned grouping and embedding, a Graph Parsing Network (Song et al., ICLR 2024; `Parser`): an input MLP,
   then parsing levels (`max_levels`, 1 by default; the authors': until the graph stops shrinking): two GCN
   layers (residual, LayerNorm) give node states; each edge of the undirected graph gets a score
   sigmoid(MLP(h_u * h_v)); every node keeps its highest-scoring edge (its "dominant" edge), and the
   connected components of the kept edges are the clusters of the level; the clusters' features are
   DeepSets pooling (MLP, sum, MLP) of one more GCN layer's output, times the mean score of the edges inside
   the cluster and their count. An output MLP gives the clusters' embeddings. The clustering itself is not
   differentiable; the edge scorer learns through the scaling.
4. Placement: an MLP (Linear-ReLU-Linear) gives each cluster's device distribution; every op of a cluster
   goes to its device. Devices a cluster may not use are masked (clusters never join groups whose allowed
   devices differ).
5. Training: an episode is `steps` placements sampled in turn; after each, every group's features gain
   its cluster's (detached) embedding, so the next placement is parsed from updated states. The reward of
   a placement is 1 / run time; the episode's return is sum_i discount^i r_{T-1-i} (the authors' loop,
   discount 0.95), and one REINFORCE update per episode takes loss = -(sum of every log-probability of
   the episode) x return, Adam lr 1e-3.

Since the states of an episode depend on the policy's embeddings only (not on the sampled devices or their
run times), the episode's placements are evaluated together in one batch; that changes nothing but speed.
Every placement counts against the methodology's budget: at 1000 evaluations a search runs 50 episodes of
20, the authors' 25 x 20 doubled (the last of 19: one evaluation is kept back for the greedy placement).

Final placement: the best placement evaluated during search, or the greedy one (the most likely device of
every cluster, parsed from the initial features, no dropout) if it scores at least as well; one evaluation
is kept back for it. The harness re-measures the final placement either way.

Hyper-parameters. "Authors" = their released config.py and main.py; "ours" = chosen here.

| parameter         | authors                                          | ours (default)                          |
|-------------------|--------------------------------------------------|-----------------------------------------|
| devices           | CPU + one GPU (OpenVINO HETERO)                  | any cluster (D logits per cluster)      |
| coarsening        | chain merging of the OpenVINO graph: their loop  | the rule their comment states (u has    |
|                   | puts every single-input op in its producer's     | one consumer, v one input), on top of   |
|                   | group, also where the producer feeds others      | colocation groups; at most `max_groups` |
|                   |                                                  | (128) groups (1)                        |
| node features     | mean op-type one-hot, group index                | kind shares, sizes, position, output    |
|                   |                                                  | shape, time on every device (2)         |
| widths            | hidden 128; output = feature width               | hidden 64 (CPU time); output the same   |
| layers            | input/output MLP 2, GCN 2 + 1, DeepSets 1 + 1,   | same                                    |
|                   | edge scorer 2                                    |                                         |
| dropout           | 0.2 (never switched off)                         | 0.2 while sampling, 0 for the greedy    |
|                   |                                                  | placement                               |
| self-loops        | ignored (`link_ignore_self_loop`)                | kept (GPN's option) (3)                 |
| parsing levels    | until the graph stops shrinking                  | 1 (`max_levels`; 0 = the authors') (3)  |
| clusters          | dominant edges, with edge dropout                | the connected components of the         |
|                   | (`dropout_parsing`) and GPN's community          | dominant edges; no edge dropout, no     |
|                   | expansion                                        | expansion                               |
| reward            | 1 / run time; all-CPU, all-GPU or failing: 1e-10 | 1 / score (the methodology's penalty    |
|                   |                                                  | for failures, OOM shaping); single-     |
|                   |                                                  | device placements are scored as any (4) |
| episodes          | 25 x 20 placements                               | 20 placements per episode, budget-bound |
| return            | discounted sum, 0.95, no baseline                | same (`baseline` "none"; "moving" is    |
|                   |                                                  | ours: (R - b) / |b|, b a moving average)|
| optimizer         | Adam, lr 1e-3, no clipping                       | same                                    |

(1) For CPU time: the GCNs are dense, and chain merging leaves 285-448 groups on the NMT training graphs
(on inference graphs 37-101). (2) The authors' raw group index is replaced by the position scaled to [0, 1].
(3) Without self-loops every node of a connected graph has a dominant edge to another node, so the levels
repeat until the whole graph is one cluster and every placement puts the whole model on one device (which
the authors' reward rules out); with self-loops a node whose self score is its highest stays alone. Even so,
levels until the graph stops shrinking leave 1.3-1.5 clusters per placement on average (below), so one
level is the default: it leaves 23-126 clusters. (4) A benchmark compares placements by step time, so
single-device placements are legal here.

Tuning: nmt-2x1024-b64, rnnlm-2x2048-b64 and inception_v3-b32 on haswell_4k80 (on the crossbar links the
presets had before d0b28ba) at 1000 evaluations, mean re-measured step time of seeds 0-1 (ms, nmt / rnnlm /
inception; the seed-to-seed spread is 10-90 ms):
at 256 groups, 1 level 317.0 / 417.9 / 499.9 (37-115 clusters per placement), with the moving baseline
307.3 / 424.9 / 495.7; 2 levels 324.5 / 429.8 / 487.2 (moving baseline 320.7 / 388.8 / 465.0); levels
until stable 469.5 (rnnlm) / 528.5 (inception), 1.3-1.5 clusters; hidden 64 344.4 / 387.7 (nmt, rnnlm).
128 groups 352.9 / 406.5 / 467.2 at about half the time per cell (9-11 s); at 128 groups, hidden 64 (the
default) 347.9 / 380.2 / 453.3 in 5-7 s per cell, and without dropout 409.5 / 374.1 / 446.8 in 4-5 s (but
one nmt seed parsed into 5.5 clusters on average, and ended at 453.9 ms). For scale, measured the
same way: single_gpu 625.6 / 768.9 / 553.6, human_expert 474.4 / 300.9 / 553.6, Placeto 380.8 / 453.0 /
477.9, Post 243.4 / 323.1 / 398.2. As with seq2seq and Placeto at this budget, the final placement is
almost always the best one sampled, not the policy's greedy one.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
from torch import nn

from rl.features import cost_features, group_features
from rl.learned import (
    COMMON_BOUNDS,
    COMMON_DEFAULTS,
    check_group_params,
    finish,
    grouped_problem,
    torch_threads,
)
from rl.nets import masked_categorical, to_tensor
from rl.trainers import apply_gradients, loss_weights
from suite.methodology import Budget
from suite.placer import BasePlacer, PlacementResult, Problem, check_choice

BASELINES = ("none", "moving")


# -- the building blocks of the authors' layer.py -------------------------------------------------------


class MLP(nn.Module):
    """Linear layers; after each (the last too if `act_final`): LayerNorm if `norm` is "insert", ReLU,
    dropout. `norm` "post": LayerNorm(x + MLP(x)) (equal widths)."""

    def __init__(self, sizes: list[int], *, norm: str = "none", act_final: bool = True, dropout: float = 0.0):
        super().__init__()
        layers: list[nn.Module] = []
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
            layers.append(nn.Linear(a, b))
            if i < len(sizes) - 2 or act_final:
                if norm == "insert":
                    layers.append(nn.LayerNorm(b))
                layers += [nn.ReLU(), nn.Dropout(dropout)]
        self.body = nn.Sequential(*layers)
        self.post = nn.LayerNorm(sizes[-1]) if norm == "post" else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        return self.post(x + y) if self.post is not None else y


class GCN(nn.Module):
    """`layers` graph convolutions (Kipf and Welling: A_hat X W + b), each followed by ReLU and dropout,
    then LayerNorm(x + result), as the authors' `GNN` block. A_hat is given normalised (`normalized_adjacency`)."""

    def __init__(self, width: int, layers: int, dropout: float):
        super().__init__()
        self.lins = nn.ModuleList([nn.Linear(width, width, bias=False) for _ in range(layers)])
        self.biases = nn.ParameterList([nn.Parameter(torch.zeros(width)) for _ in range(layers)])
        for lin in self.lins:
            nn.init.xavier_uniform_(lin.weight)
        self.drop = nn.Dropout(dropout)
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor, a_hat: torch.Tensor) -> torch.Tensor:
        h = x
        for lin, b in zip(self.lins, self.biases, strict=True):
            h = self.drop(torch.relu(a_hat @ lin(h) + b))
        return self.norm(x + h)


def normalized_adjacency(adj: np.ndarray) -> torch.Tensor:
    """D^-1/2 (A + I) D^-1/2 of a symmetric 0/1 adjacency without self-loops (the GCN's propagation)."""
    a = adj.astype(np.float64) + np.eye(len(adj))
    d = 1.0 / np.sqrt(a.sum(axis=1))
    return to_tensor(a * d[:, None] * d[None, :])


# -- graph parsing ---------------------------------------------------------------------------------------


def dominant_clusters(scores: np.ndarray, candidate: np.ndarray) -> np.ndarray:
    """Clusters of one parsing level: labels [N], numbered by their first node.

    scores [N, N] symmetric, candidate [N, N] bool (the edges a node may keep, its self-loop included or
    not). Every node keeps its highest-scoring candidate (the lowest index among equals); a node with no
    candidate keeps itself. Clusters are the connected components of the kept edges.
    """
    n = len(scores)
    s = np.where(candidate, scores, -np.inf)
    keep = np.argmax(s, axis=1)
    keep[~candidate.any(axis=1)] = np.flatnonzero(~candidate.any(axis=1))
    parent = np.arange(n)

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for u, v in enumerate(keep.tolist()):
        ru, rv = find(u), find(v)
        if ru != rv:
            parent[max(ru, rv)] = min(ru, rv)
    roots = np.array([find(u) for u in range(n)])
    _, labels = np.unique(roots, return_inverse=True)  # roots are each cluster's smallest node: first-node order
    return labels.astype(np.int64)


class Parser(nn.Module):
    """The Graph Parsing Network of the authors' model.py: learned, hierarchical clustering and embedding.

    Called with group features x [G, F] it returns (cluster embeddings [C, F], cluster of each group [G],
    levels run). Adjacency and device masks of the base graph are fixed at construction.
    """

    def __init__(self, num_features: int, adjacency: np.ndarray, mask_ids: np.ndarray, *, hidden: int = 128,
                 dropout: float = 0.2, self_loops: bool = True, max_levels: int = 0):
        super().__init__()
        h = hidden
        self.input = MLP([num_features, h, h], norm="insert", dropout=dropout)
        self.gnn1 = GCN(h, 2, dropout)
        self.gnn2 = GCN(h, 1, dropout)
        self.edge = MLP([h, h, 1], norm="insert", act_final=False, dropout=dropout)
        self.pre = MLP([h, h], norm="post", dropout=dropout)
        self.post = MLP([h, h], norm="post", dropout=dropout)
        self.output = MLP([h, h, num_features], dropout=dropout)
        self.adjacency = adjacency.astype(bool)
        self.mask_ids = np.asarray(mask_ids, dtype=np.int64)
        self.self_loops = self_loops
        self.max_levels = max_levels
        self._base = self._level(self.adjacency, self.mask_ids)  # the first level's graph never changes

    def _level(self, adj: np.ndarray, mask_ids: np.ndarray) -> tuple[torch.Tensor, np.ndarray, np.ndarray, np.ndarray]:
        """What a level needs of its graph: A_hat, the edges a node may keep ([N, N], self-loops per
        `self_loops`), and the ends of the scored edges (pairs u < v, then self-loops)."""
        n = len(adj)
        candidate = adj & (mask_ids[:, None] == mask_ids[None, :])  # never join groups of other devices
        u, v = np.nonzero(np.triu(candidate, k=1))
        loops = np.arange(n) if self.self_loops else np.zeros(0, dtype=np.int64)
        if self.self_loops:
            candidate = candidate | np.eye(n, dtype=bool)
        return normalized_adjacency(adj), candidate, np.concatenate([u, loops]), np.concatenate([v, loops])

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, np.ndarray, int]:
        h = self.input(x)
        adj, mask_ids = self.adjacency, self.mask_ids
        cluster_of = np.arange(len(x))
        levels = 0
        while len(adj) > 1 and (self.max_levels == 0 or levels < self.max_levels):
            n = len(adj)
            a_hat, candidate, ends_u, ends_v = self._base if levels == 0 else self._level(adj, mask_ids)
            z = self.gnn1(h, a_hat)
            score = torch.sigmoid(self.edge(z[ends_u] * z[ends_v]).squeeze(-1))  # pairs, then self-loops
            dense = np.zeros((n, n))
            s = score.detach().numpy()
            dense[ends_u, ends_v] = s
            dense[ends_v, ends_u] = s
            labels = dominant_clusters(dense, candidate)
            C = int(labels.max()) + 1
            if C == n:
                break
            levels += 1
            # edges inside a cluster, each direction of a pair counted once (the authors' directed edges)
            inside = labels[ends_u] == labels[ends_v]
            weight = torch.as_tensor(np.where(ends_u == ends_v, 1.0, 2.0)[inside], dtype=score.dtype)
            at = torch.as_tensor(labels[ends_u][inside])
            count = torch.zeros(C).index_add(0, at, weight)
            total = torch.zeros(C).index_add(0, at, weight * score[torch.as_tensor(inside)])
            has = count > 0
            mean_score = torch.where(has, total / count.clamp_min(1.0), torch.ones(()))
            count = torch.where(has, count, torch.ones(()))
            pooled = torch.zeros(C, h.shape[1]).index_add(0, torch.as_tensor(labels), self.pre(self.gnn2(h, a_hat)))
            h = self.post(pooled) * mean_score[:, None] * count[:, None]
            member = np.zeros((n, C))
            member[np.arange(n), labels] = 1.0
            adj = member.T @ adj.astype(np.float64) @ member > 0
            np.fill_diagonal(adj, False)
            mask_ids = mask_ids[np.unique(labels, return_index=True)[1]]
            cluster_of = labels[cluster_of]
        return self.output(h), cluster_of, levels


class HSDAGPolicy(nn.Module):
    """Parser plus the placement head: device logits for every cluster."""

    def __init__(self, num_features: int, num_devices: int, adjacency: np.ndarray, mask_ids: np.ndarray, *,
                 hidden: int = 128, dropout: float = 0.2, self_loops: bool = True, max_levels: int = 0):
        super().__init__()
        self.parser = Parser(num_features, adjacency, mask_ids, hidden=hidden, dropout=dropout,
                             self_loops=self_loops, max_levels=max_levels)
        self.head = nn.Sequential(nn.Linear(num_features, hidden), nn.ReLU(), nn.Linear(hidden, num_devices))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
        """x [G, F] -> (logits [C, D], cluster embeddings [C, F], cluster of each group [G])."""
        emb, cluster_of, _ = self.parser(x)
        return self.head(emb), emb, cluster_of


# -- the search -----------------------------------------------------------------------------------------


def episode_return(rewards: np.ndarray, discount: float) -> float:
    """The authors' return of an episode: sum_i discount^i r_{T-1-i} (the last reward undiscounted)."""
    r = np.asarray(rewards, dtype=np.float64)[::-1]
    return float(np.sum(r * discount ** np.arange(len(r))))


class HSDAGSearch:
    """One HSDAG search on one problem: episodes of `steps` placements, one REINFORCE update each."""

    def __init__(self, problem: Problem, params: dict[str, Any], seed: int):
        p = self.params = params
        graph, cluster = problem.workload, problem.cluster
        # max_groups None is no cap here (grouped_problem reads None as the batched placers' 20 x devices)
        cap = p["max_groups"] if p["max_groups"] is not None else max(1, graph.num_ops)
        self.grouping, mask, self.rollouts = grouped_problem(problem, {**p, "max_groups": cap})
        self.mask = torch.as_tensor(mask)
        feats = group_features(graph, self.grouping)
        self.x0 = to_tensor(np.concatenate([feats.matrix(adjacency=False),
                                            cost_features(graph, cluster, self.grouping, problem.profiles)], axis=1))
        G = self.grouping.num_groups
        adj = np.zeros((G, G), dtype=bool)
        adj[feats.edge_index[0], feats.edge_index[1]] = True
        adj = adj | adj.T
        _, mask_ids = np.unique(mask, axis=0, return_inverse=True)
        self.generator = torch.Generator().manual_seed(seed)
        with torch.random.fork_rng(devices=[]):  # seeded weights and dropout; the caller's global RNG is untouched
            torch.manual_seed(seed)
            self.policy = HSDAGPolicy(self.x0.shape[1], cluster.num_devices, adj, mask_ids.reshape(-1),
                                      hidden=int(p["hidden"]), dropout=float(p["dropout"]),
                                      self_loops=bool(p["self_loops"]), max_levels=int(p["max_levels"]))
            self.rng_state = torch.get_rng_state()
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=float(p["lr"]))
        self.baseline: float | None = None
        self.episodes = self.updates = 0
        self.clusters: list[int] = []  # clusters of every evaluated placement (not of a batch refused for time)

    def _cluster_mask(self, cluster_of: np.ndarray) -> torch.Tensor:
        first = np.unique(cluster_of, return_index=True)[1]  # clusters hold groups of one mask: any member's
        return self.mask[torch.as_tensor(first)]

    def episode(self, reserve: int) -> bool:
        """Sample one episode (at most `steps` placements, as the budget allows) and learn from it."""
        p = self.params
        k = self.rollouts.allowance(int(p["steps"]), reserve=reserve)
        if k < 1:
            return False
        x = self.x0
        log_probs, placements, clusters = [], [], []
        with torch.random.fork_rng(devices=[]):  # dropout draws from the search's own stream
            torch.set_rng_state(self.rng_state)
            self.policy.train()
            for _ in range(k):
                logits, emb, cluster_of = self.policy(x)
                a, logp, _ = masked_categorical(logits, self._cluster_mask(cluster_of), generator=self.generator)
                log_probs.append(logp.sum())
                placements.append(a.numpy()[cluster_of])
                clusters.append(len(emb))
                x = x + emb.detach()[torch.as_tensor(cluster_of)]
            self.rng_state = torch.get_rng_state()
        r = self.rollouts(np.stack(placements))
        if r is None:  # refused (out of time): nothing evaluated, nothing counted
            return False
        self.clusters += clusters
        ret = episode_return(r.rewards, float(p["discount"]))
        weight = ret
        if p["baseline"] == "moving":
            if self.baseline is None:
                self.baseline = ret
            weight = (ret - self.baseline) / max(abs(self.baseline), 1e-12)
            self.baseline = 0.9 * self.baseline + 0.1 * ret
        loss_weights(weight)  # raises if the weight is beyond float32's range
        loss = -torch.stack(log_probs).sum() * weight
        apply_gradients(self.optimizer, loss, float(p["grad_clip"]))  # raises if the gradient's norm overflows
        self.episodes += 1
        self.updates += 1
        return True

    def greedy(self) -> np.ndarray:
        """The most likely device of every cluster, parsed from the initial features without dropout."""
        self.policy.eval()
        with torch.no_grad():
            logits, _, cluster_of = self.policy(self.x0)
            a, _, _ = masked_categorical(logits, self._cluster_mask(cluster_of), greedy=True)
        self.policy.train()
        return a.numpy()[cluster_of]

    def info(self) -> dict[str, Any]:
        """Counters; the clusters per evaluated placement (mean, last) are None when none was evaluated."""
        c = self.clusters
        return {"episodes": self.episodes, "updates": self.updates,
                "clusters_mean": float(np.mean(c)) if c else None, "clusters_last": c[-1] if c else None}


class HSDAGPlacer(BasePlacer):
    """HSDAG: a graph parsing network learns the grouping, an MLP places each cluster; REINFORCE."""

    name = "hsdag"
    defaults = {
        "grouping": "chain",  # one of rl.grouping.GROUPINGS
        "max_groups": 128,  # None: no cap
        "coarsen": "heavy_edge",  # heavy_edge | topological, when max_groups caps the chain merging
        "hidden": 64,
        "dropout": 0.2,
        "self_loops": True,
        "max_levels": 1,  # parsing levels; 0: until the graph stops shrinking (the authors')
        "steps": 20,  # placements per episode (the authors' update_timestep)
        "discount": 0.95,
        "baseline": "none",  # none (the authors) | moving (ours: relative to a moving average of returns)
        "lr": 0.001,
        "grad_clip": 0.0,  # 0: none, as the authors
        "reward": "inv",  # 1 / score
        **COMMON_DEFAULTS,
    }
    bounds = {
        "hidden": (1, 8192), "dropout": (0.0, 0.99), "max_levels": (0, 1000), "steps": (1, 100_000),
        "discount": (0.0, 1.0), "lr": (1e-12, 10.0), "grad_clip": (0.0, 1e12),
        **COMMON_BOUNDS,
    }

    def __init__(self, **params: Any):
        # max_groups=None (no cap, the authors' chain merging as it is) passes over the integer check of its
        # default; check_group_params checks max_groups either way
        uncapped = "max_groups" in params and params["max_groups"] is None
        super().__init__(**{k: v for k, v in params.items() if not (uncapped and k == "max_groups")})
        if uncapped:
            self.params["max_groups"] = None
        check_group_params(self.name, self.params)
        check_choice(self.name, "baseline", self.params["baseline"], BASELINES)

    def place(self, problem: Problem, budget: Budget, seed: int) -> PlacementResult:
        started = time.perf_counter()
        p = self.params
        with torch_threads(int(p["threads"])):
            search = HSDAGSearch(problem, p, seed)
            reserve = 0 if p["final"] == "best" else 1
            while search.episode(reserve):
                pass
            return finish(search, problem, started, p)
