"""Placeto: the placer of Addanki, Bojja Venkatakrishnan, Gupta, Mao and Alizadeh, "Placeto: Learning
Generalizable Device Placement Algorithms for Distributed Machine Learning" (NeurIPS 2019), on CPU with
PyTorch.

Method. Placement is improved one group at a time. An episode starts from an initial placement and visits
the groups in topological order (their first ops' order), one step each; at each step the policy reads a
graph embedding of the current placement and picks a device for the current group, and the new placement
is evaluated. The reward of a step is the improvement it made, r_t = R(p_{t+1}) - R(p_t) with R = -score
(the run time, or the methodology's penalty for a failing placement), so an episode's returns telescope to
the improvement from each step's state to the end. The policy is trained with REINFORCE, one update per
batch of episodes, against a per-step baseline: the mean return at that step over the last
`baseline_episodes` batches (the current one included), as the authors' `--turn-based-baseline`.

Policy (the authors' `mp_nn` with `--radial-mp` and `--tri-agg`, `rl.placeto.PlacetoPolicy`): per-group
features go through a node MLP; `rounds` synchronous rounds of message passing run from parents to
children and, separately, from children to parents, x <- [has neighbours] * Agg(x) + x0 with
Agg = relu(g(sum over neighbours of relu(f(x)))), one aggregator per direction; the two results are
concatenated. The groups are then split, relative to the current group, into ancestors, descendants and
the rest (parallel groups), each set is summed through its own aggregator, and [current group, ancestors,
descendants, parallel] feeds an MLP that gives the logits of the devices; devices the group may not use are
masked out. Coarsening can leave cycles in the group graph: the visiting order is then the first ops' order,
and the groups on a cycle with the current one count as both its ancestors and its descendants.

Every evaluated placement counts against the methodology's budget, so an episode of G groups costs G
evaluations (plus one for the initial placement): at 1000 evaluations and the default grouping a search
runs about 1000 / G episodes. That is Placeto's per-step reward measured the way every placer here is.
With `batch_size` k > 1 a step evaluates k placements; where the budget's last evaluations cannot pay for a
whole step, they go to its first placements (no update follows), so the budget is spent exactly.
Placeto's other claim, a policy trained on one family of graphs placing unseen graphs without retraining,
is not what a benchmark cell measures: like the other learned placers, Placeto here trains from scratch
on each (workload, cluster, seed).

Final placement: the best placement evaluated during search, or the greedy episode (argmax at every step
from the initial placement, which needs no evaluation until its end) if it scores at least as well; one
evaluation is kept back for it. The harness re-measures the final placement either way.

Hyper-parameters. "Authors" = the authors' released code (github.com/aravic/generalizable-device-placement:
model/progressive_placer_test.py defaults, model/rl_params.py, model/hyperparameters.txt); "ours" = chosen
here.

| parameter         | authors                                             | ours (default)                       |
|-------------------|-----------------------------------------------------|--------------------------------------|
| initial placement | one random placement, reused every episode          | same ("random"; also "random_each", |
|                   | (options: new each episode, the best so far)        | new each episode, and "best")        |
| visiting order    | topological, one pass                               | groups by first op, `passes` 1       |
| reward            | run-time improvement, discount 1, no scaling        | same (reward "neg": R = -score)      |
| failing placement | memory penalty 2 per GB over 8-11 GB, capped at 10 s| the methodology's penalty, OOM      |
|                   |                                                     | shaping (as seq2seq, `rl.reward`)    |
| node features     | cost, output size, visits, current flag, start time,| the group's time on its device,     |
|                   | device one-hot; columns / their maximum             | start time (1), output and parameter |
|                   |                                                     | bytes, visits, current flag, device  |
|                   |                                                     | one-hot, time on every device (2)    |
| embedding width   | the feature width                                   | same (`hidden` 0)                    |
| message passing   | 8 rounds each way (hyperparameters.txt), sum        | same                                 |
| pooling           | ancestors / descendants / parallel, sum             | same                                 |
| policy head       | MLP [2x, 1x] of its input width, softmax            | same                                 |
| initialisation    | Glorot uniform, zero biases                         | same                                 |
| baseline          | mean return per step over the last 10 episodes      | same (`baseline_episodes` 10)        |
| optimizer         | Adam, lr 1e-3, grad-norm clip 1.25                  | same                                 |
| entropy bonus     | coefficient 1.0 (rl_params default)                 | 0.01 (3)                             |
| episodes / update | 1 (4-8 workers in hyperparameters.txt)              | 1 (`batch_size`)                     |
| advantages        | raw                                                 | divided by their std (run times      |
|                   |                                                     | differ by 10^4 across workloads)     |
| grouping          | a pre-grouped graph (grouper not released)          | seq2seq's: co-location rules, then   |
|                   |                                                     | heavy-edge coarsening to 4 x devices |
|                   |                                                     | (4)                                  |

(1) As the authors', from the simulator's schedule of the state's placement: the start of the group's first op
(`suite.simulator.start_times`), over the latest group start. It is the cost model's prediction even when the
evaluator runs placements for real, and is not counted against the budget. (Before, a static topological
position stood in for it.) (2) Ours, for heterogeneous clusters (the authors placed on identical GPUs). (3),
(4) and the other defaults: nmt-2x1024-b64, rnnlm-2x2048-b64 and inception_v3-b32 on haswell_4k80 (on the
crossbar links the presets had before d0b28ba) at 1000 evaluations, mean re-measured step time of seeds 0-1
(ms, nmt / rnnlm / inception): default (4 x devices = 17-20 groups, about 50 episodes) 384.5 / 496.5 / 467.3
(seeds apart: 385.5, 383.5 / 467.2, 525.8 / 465.3,
469.2); with the topological position in place of the start time, on the same graphs, 379.6 / 457.9 / 477.9:
within the spread of two seeds. With the position, on the graphs before CAPTURE_VERSION 2: 2 x devices 404.4 /
593.0 / 495.1; 8 x devices 411.4 / 504.2 / 457.0; 20 x devices (seq2seq's cap, 9 episodes) 401.2 / 513.6 /
511.3; entropy 0 392.0 / 470.1 / 478.2; initial "best" 384.1 / 477.3 / 462.9, "random_each" 383.1 / 486.7 /
464.7; lr 3e-3 403.7 / 528.2 / 509.4, 1e-2 419.0 / 528.2 / 509.5 (the policy settles early on one placement).
For scale: single_gpu 625.6 / 768.9 / 553.6, human_expert 474.4 / 300.9 / 553.6, Post 243.4 / 323.1 / 398.2.
At this budget Placeto's policy learns little (its greedy episode rarely beats the best placement its episodes
visited), and with many episodes its greedy episode mostly settles on one GPU: on the 8-op `branchy` test graph on
haswell_2k80 (colocation grouping, lr 1e-2, 249 episodes, seeds 0-7) it is all on one GPU (270.9 ms, against the
brute-force optimum of 133.6 ms) for 6 of 8 seeds and 194.1 ms for the other 2; with the topological position in
place of the start time, one GPU for 6 seeds, 137.4 ms (seed 0) and 145.7 ms (seed 7). The best placements its
episodes visited, which the final placement falls back on, are 133.9 to 251.7 ms (with the start time).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from rl.features import group_edges, scaled_log
from rl.grouping import Grouping
from rl.learned import (
    COMMON_BOUNDS,
    COMMON_DEFAULTS,
    check_group_params,
    finish,
    grouped_problem,
    torch_threads,
)
from rl.nets import masked_categorical
from rl.reward import reward_of
from rl.trainers import apply_gradients, build_optimizer, discounted_returns, loss_weights, scale_advantages
from suite.errors import PlacebenchError
from suite.graph import OpGraph
from suite.methodology import Budget
from suite.placer import BasePlacer, PlacementResult, Problem, check_choice
from suite.simulator import start_times

INITIAL = ("random", "random_each", "best")


# -- the grouped graph ----------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class GroupGraph:
    """The static part of Placeto's state: the group-level graph, its reachability, and group costs."""

    src: np.ndarray  # int64 [E]: group-level edges src -> dst (no self-loops, no duplicates)
    dst: np.ndarray  # int64 [E]
    ancestors: np.ndarray  # bool [G, G]: ancestors[v, u] = a path u -> v exists (u != v)
    descendants: np.ndarray  # bool [G, G]: descendants[v, u] = a path v -> u exists (u != v)
    cost_s: np.ndarray  # float64 [G, D]: the group's summed op times on each device (cost model)
    output_bytes: np.ndarray  # float64 [G]
    param_bytes: np.ndarray  # float64 [G]

    @property
    def num_groups(self) -> int:
        return len(self.output_bytes)

    @property
    def parallel(self) -> np.ndarray:
        """bool [G, G]: neither ancestor nor descendant of the row's group, nor the group itself."""
        return ~(self.ancestors | self.descendants | np.eye(self.num_groups, dtype=bool))


def reachable(num_nodes: int, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """bool [N, N]: out[u, v] = some path of one edge or more leads from u to v (cycles allowed)."""
    children: list[list[int]] = [[] for _ in range(num_nodes)]
    for u, v in zip(src.tolist(), dst.tolist(), strict=True):
        children[u].append(v)
    reach = [0] * num_nodes  # bitsets as Python ints
    changed = True
    while changed:  # one pass in reverse index order settles a DAG numbered topologically; cycles take more
        changed = False
        for u in range(num_nodes - 1, -1, -1):
            r = reach[u]
            for v in children[u]:
                r |= reach[v] | (1 << v)
            if r != reach[u]:
                reach[u], changed = r, True
    nbytes = (num_nodes + 7) // 8
    bits = [np.unpackbits(np.frombuffer(r.to_bytes(nbytes, "little"), np.uint8), bitorder="little")[:num_nodes]
            for r in reach]
    return np.array(bits, dtype=bool).reshape(num_nodes, num_nodes)


def group_graph(graph: OpGraph, grouping: Grouping, cost_s: np.ndarray) -> GroupGraph:
    """The group-level graph of `grouping`; cost_s [n_ops, D] is the cost model's op times."""
    a, asg, G = graph.arrays, grouping.assignment, grouping.num_groups
    (src, dst), _, _ = group_edges(graph, grouping)
    reach = reachable(G, src, dst)
    np.fill_diagonal(reach, False)
    cost = np.zeros((G, cost_s.shape[1]))
    np.add.at(cost, asg, cost_s)
    return GroupGraph(
        src=src,
        dst=dst,
        ancestors=reach.T.copy(),
        descendants=reach,
        cost_s=cost,
        output_bytes=np.bincount(asg, weights=np.asarray(a.output_bytes, np.float64), minlength=G),
        param_bytes=np.bincount(asg, weights=np.asarray(a.param_bytes, np.float64), minlength=G),
    )


# -- the policy -----------------------------------------------------------------------------------------


def mlp(sizes: list[int]) -> nn.Sequential:
    """Linear layers with ReLU between them (none after the last); Glorot-uniform weights, zero biases."""
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        lin = nn.Linear(a, b)
        nn.init.xavier_uniform_(lin.weight)
        nn.init.zeros_(lin.bias)
        layers += [lin] if i == len(sizes) - 2 else [lin, nn.ReLU()]
    return nn.Sequential(*layers)


class Aggregator(nn.Module):
    """relu(g(sum over a set of relu(f(x)))): the authors' `Aggregator`, f and g one hidden layer each."""

    def __init__(self, width: int):
        super().__init__()
        self.f = mlp([width, width, width])
        self.g = mlp([width, width, width])

    def over_edges(self, x: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
        """x [N, G, W] -> [N, G, W]: each node aggregates over the sources of its incoming edges."""
        h = torch.relu(self.f(x))
        return torch.relu(self.g(torch.zeros_like(h).index_add(1, dst, h[:, src])))

    def over_set(self, x: torch.Tensor, members: torch.Tensor) -> torch.Tensor:
        """x [N, G, W], members [N, G] (0/1) -> [N, W]: one aggregate per row over its members."""
        h = torch.relu(self.f(x))
        return torch.relu(self.g(torch.bmm(members.unsqueeze(1), h).squeeze(1)))


class PlacetoPolicy(nn.Module):
    """Graph embedding by message passing both ways, pooled around the current group; logits over devices."""

    def __init__(self, num_features: int, num_devices: int, graph: GroupGraph, *, hidden: int = 0, rounds: int = 8):
        super().__init__()
        d = hidden or num_features
        self.rounds = rounds
        self.node = mlp([num_features, d, d, d])
        self.down = Aggregator(d)  # parents -> children
        self.up = Aggregator(d)  # children -> parents
        self.pools = nn.ModuleList([Aggregator(2 * d) for _ in range(3)])  # ancestors, descendants, parallel
        self.head = mlp([8 * d, 16 * d, 8 * d, num_devices])
        self.register_buffer("src", torch.as_tensor(graph.src))
        self.register_buffer("dst", torch.as_tensor(graph.dst))
        G = graph.num_groups
        self.register_buffer("has_parents", torch.as_tensor(np.bincount(graph.dst, minlength=G) > 0).float()[:, None])
        self.register_buffer("has_children", torch.as_tensor(np.bincount(graph.src, minlength=G) > 0).float()[:, None])
        sets = np.stack([graph.ancestors, graph.descendants, graph.parallel], axis=1)  # [G, 3, G]
        self.register_buffer("sets", torch.as_tensor(sets, dtype=torch.float32))

    def _propagate(self, agg: Aggregator, x0: torch.Tensor, src: torch.Tensor, dst: torch.Tensor,
                   has_in: torch.Tensor) -> torch.Tensor:
        x = x0
        for _ in range(self.rounds):
            x = has_in * agg.over_edges(x, src, dst) + x0
        return x

    def forward(self, features: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
        """features [N, G, F], current [N] (the group to place in each row) -> logits [N, D]."""
        x0 = self.node(features)
        emb = torch.cat([self._propagate(self.down, x0, self.src, self.dst, self.has_parents),
                         self._propagate(self.up, x0, self.dst, self.src, self.has_children)], dim=-1)
        sets = self.sets[current]  # [N, 3, G]
        pooled = [pool.over_set(emb, sets[:, k]) for k, pool in enumerate(self.pools)]
        own = emb[torch.arange(len(current)), current]
        return self.head(torch.cat([own, *pooled], dim=-1))


# -- states ---------------------------------------------------------------------------------------------


class StateFeatures:
    """Per-group features of a state (placement, visit counts, current group) as the policy reads them.

    `group_starts` maps group placements [N, G] to each group's start time in the simulator's schedule of
    that placement [N, G] (the start of its first op); like the cost columns it is the cost model's
    prediction, read as an observation, not an evaluation of the budget.
    """

    def __init__(self, graph: GroupGraph, num_devices: int, group_starts: Callable[[np.ndarray], np.ndarray]):
        self.num_devices = num_devices
        self.group_starts = group_starts
        self.cost = torch.as_tensor(graph.cost_s, dtype=torch.float32)  # [G, D]

        def scaled(x: np.ndarray) -> np.ndarray:
            top = x.max() if x.size else 0.0
            return x / top if top > 0 else x

        static = np.column_stack([scaled(graph.output_bytes), scaled(graph.param_bytes),
                                  scaled_log(graph.cost_s * 1e6)])
        self.static = torch.as_tensor(static, dtype=torch.float32)  # [G, 2 + D]
        self.width = 2 + self.static.shape[1] + 2 + num_devices

    def __call__(self, placement: torch.Tensor, visits: torch.Tensor, current: torch.Tensor,
                 starts: np.ndarray | None = None) -> torch.Tensor:
        """placement [N, G] long, visits [N, G] float, current [N] long -> features [N, G, F]. `starts` [N, G]:
        `group_starts(placement)` if the caller has it already (else simulated here)."""
        N, G = placement.shape
        own = self.cost.expand(N, G, -1).gather(2, placement.unsqueeze(2)).squeeze(2)  # time on its device
        own = own / own.amax(dim=1, keepdim=True).clamp_min(1e-30)
        if starts is None:
            starts = self.group_starts(placement.numpy())
        start = torch.as_tensor(starts, dtype=torch.float32)
        start = start / start.amax(dim=1, keepdim=True).clamp_min(1e-30)
        flag = F.one_hot(current, G).float()
        onehot = F.one_hot(placement, self.num_devices).float()
        return torch.cat([own.unsqueeze(2), start.unsqueeze(2), self.static.expand(N, -1, -1), visits.unsqueeze(2),
                          flag.unsqueeze(2), onehot], dim=2)


def group_start_times(problem: Problem, grouping: Grouping) -> Callable[[np.ndarray], np.ndarray]:
    """The function giving, for group placements [N, G], each group's simulated start time [N, G]."""
    order = np.argsort(grouping.assignment, kind="stable")  # ops by group; every group has an op
    first = np.searchsorted(grouping.assignment[order], np.arange(grouping.num_groups))

    def starts(group_devices: np.ndarray) -> np.ndarray:
        ops = start_times(problem.workload, problem.cluster, grouping.expand(group_devices), validate_each=False,
                          profiles=problem.profiles)
        return np.minimum.reduceat(ops[:, order], first, axis=1)

    return starts


# -- the search -----------------------------------------------------------------------------------------


class PlacetoSearch:
    """One Placeto search on one problem: episodes of one step per group, REINFORCE after each batch."""

    def __init__(self, problem: Problem, params: dict[str, Any], seed: int):
        p = self.params = params
        self.grouping, mask, self.rollouts = grouped_problem(problem, p)
        self.mask = torch.as_tensor(mask)
        self.graph = group_graph(problem.workload, self.grouping, problem.costs())
        self.features = StateFeatures(self.graph, problem.cluster.num_devices,
                                      group_start_times(problem, self.grouping))
        self.generator = torch.Generator().manual_seed(seed)
        self.rng = np.random.default_rng(seed)
        with torch.random.fork_rng(devices=[]):  # seeded initial weights; the caller's global RNG is untouched
            torch.manual_seed(seed)
            self.policy = PlacetoPolicy(self.features.width, problem.cluster.num_devices, self.graph,
                                        hidden=int(p["hidden"]), rounds=int(p["rounds"]))
        self.optimizer = build_optimizer(self.policy.parameters(), float(p["lr"]))
        self.order = np.tile(np.arange(self.graph.num_groups), int(p["passes"]))  # the group placed at each step
        self.history: deque[np.ndarray] = deque(maxlen=int(p["baseline_episodes"]))  # batch-mean returns
        self.initial = self._random_placement()
        self.initial_reward: float | None = None  # R of `initial`, once evaluated
        self.episodes = self.updates = 0

    def _random_placement(self) -> np.ndarray:
        return np.array([self.rng.choice(np.flatnonzero(row)) for row in self.mask.numpy()], dtype=np.int64)

    def _start(self, k: int, reserve: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The batch's start placements [k, G] and their rewards [k], or None if the budget ran out."""
        mode, rollouts = self.params["initial"], self.rollouts
        if mode == "best" and rollouts.best_group_devices is not None:
            reward = reward_of(rollouts.best_score_s, rollouts.config.transform)
            return np.repeat(rollouts.best_group_devices[None], k, axis=0), np.full(k, reward)
        if mode != "random_each" and self.initial_reward is not None:
            return np.repeat(self.initial[None], k, axis=0), np.full(k, self.initial_reward)
        starts = np.stack([self._random_placement() for _ in range(k)]) if mode == "random_each" else self.initial[None]
        if not self._affordable(starts, reserve):
            return None
        r = rollouts(starts)
        if r is None:
            return None
        if mode == "random_each":
            return starts, r.rewards
        self.initial_reward = float(r.rewards[0])
        return np.repeat(starts, k, axis=0), np.full(k, self.initial_reward)

    def episode(self, k: int, reserve: int) -> bool:
        """Run k episodes side by side and learn from them; False if the budget ran out first (no update)."""
        start = self._start(k, reserve)
        if start is None:
            return False
        placement, prev = torch.as_tensor(start[0]), start[1]
        visits = torch.zeros(placement.shape, dtype=torch.float32)
        T, G = len(self.order), self.graph.num_groups
        states, actions = [], []
        rewards = np.zeros((k, T))
        for t, v in enumerate(self.order):
            current = torch.full((k,), int(v), dtype=torch.long)
            starts = self.features.group_starts(placement.numpy())  # kept for the update: simulated once
            with torch.no_grad():
                x = self.features(placement, visits, current, starts)
                a, _, _ = masked_categorical(self._logits(x, current), self.mask[v], generator=self.generator)
            states.append((placement.clone(), visits.clone(), starts))
            actions.append(a)
            placement[:, v] = a
            visits[:, v] += 1
            if not self._affordable(placement.numpy(), reserve):
                return False
            r = self.rollouts(placement.numpy())
            if r is None:
                return False
            rewards[:, t] = r.rewards - prev
            prev = r.rewards
        self.episodes += k
        self._update(states, torch.stack(actions, dim=1), rewards, G)
        return True

    def _affordable(self, placements: np.ndarray, reserve: int) -> bool:
        """Whether the budget pays for evaluating all of `placements` [k, G]; if not, the first ones it pays for
        are evaluated (kept as candidates for the final placement), so that the budget is spent exactly."""
        n = self.rollouts.allowance(len(placements), reserve=reserve)
        if n < len(placements):
            if n > 0:
                self.rollouts(placements[:n])
            return False
        return True

    def _logits(self, x: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
        """The policy's logits; a `PlacebenchError` if any is not finite (the weights diverged: lr too high)."""
        logits = self.policy(x, current)
        if not bool(torch.isfinite(logits).all()):
            when = f"after update {self.updates}" if self.updates else "before any update"
            raise PlacebenchError(
                f"placeto: the policy diverged {when}: its output is not finite "
                f"(lr {self.params['lr']!r} is too high for this problem; lower it)")
        return logits

    def _update(self, states: list, actions: torch.Tensor, rewards: np.ndarray, G: int) -> None:
        """REINFORCE on the batch, with the per-step baseline over the last batches."""
        p = self.params
        k, T = rewards.shape
        returns = discounted_returns(rewards, float(p["discount"]))
        self.history.append(returns.mean(axis=0))
        adv = returns - np.mean(np.stack(self.history), axis=0)
        adv = scale_advantages(adv.reshape(-1), bool(p["normalize_advantages"])).reshape(k, T)
        placement = torch.stack([s[0] for s in states], dim=1).reshape(k * T, G)  # row b * T + t
        visits = torch.stack([s[1] for s in states], dim=1).reshape(k * T, G)
        starts = np.stack([s[2] for s in states], axis=1).reshape(k * T, G)
        current = torch.as_tensor(self.order).repeat(k)
        logits = self._logits(self.features(placement, visits, current, starts), current)
        _, logp, ent = masked_categorical(logits, self.mask[current], actions=actions.reshape(-1))
        weight = loss_weights(adv.reshape(-1), logp.dtype)
        loss = -(weight * logp).sum() / k - float(p["entropy_coef"]) * ent.sum() / k
        apply_gradients(self.optimizer, loss, p["grad_clip"])
        self.updates += 1

    def info(self) -> dict[str, Any]:
        return {"episodes": self.episodes, "updates": self.updates}

    def greedy(self) -> np.ndarray:
        """One episode taking the most likely device at every step, from the initial (or best) placement."""
        best = self.rollouts.best_group_devices
        start = best if self.params["initial"] == "best" and best is not None else self.initial
        placement = torch.as_tensor(start).clone()[None]
        visits = torch.zeros(placement.shape, dtype=torch.float32)
        with torch.no_grad():
            for v in self.order:
                current = torch.tensor([int(v)])
                logits = self._logits(self.features(placement, visits, current), current)
                a, _, _ = masked_categorical(logits, self.mask[v], greedy=True)
                placement[0, v] = a[0]
                visits[0, v] += 1
        return placement[0].numpy()


class PlacetoPlacer(BasePlacer):
    """Addanki et al. 2019: iterative placement, one group per step, by a graph-embedding policy."""

    name = "placeto"
    defaults = {
        "grouping": "mirhoseini",  # one of rl.grouping.GROUPINGS
        "max_groups": None,  # None: 4 x devices
        "coarsen": "heavy_edge",  # heavy_edge | topological
        "initial": "random",  # random (one, reused) | random_each | best (the best placement so far)
        "passes": 1,  # visits of every group per episode
        "hidden": 0,  # embedding width; 0: the feature width, as the authors
        "rounds": 8,  # message-passing rounds in each direction
        "batch_size": 1,  # episodes per update
        "discount": 1.0,
        "baseline_episodes": 10,  # batches whose per-step mean returns form the baseline (>= 2 at batch_size 1)
        "lr": 0.001,
        "entropy_coef": 0.01,
        "grad_clip": 1.25,
        "normalize_advantages": True,
        "reward": "neg",  # R = -score; a step's reward is the improvement of R
        **COMMON_DEFAULTS,
    }
    bounds = {
        "passes": (1, 1000), "hidden": (0, 8192), "rounds": (0, 1000), "batch_size": (1, 4096),
        "discount": (0.0, 1.0), "baseline_episodes": (1, 1_000_000), "lr": (1e-12, 10.0),
        "entropy_coef": (0.0, 1e6), "grad_clip": (0.0, 1e12),
        **COMMON_BOUNDS,
    }

    def __init__(self, **params: Any):
        super().__init__(**params)
        check_group_params(self.name, self.params)
        check_choice(self.name, "initial", self.params["initial"], INITIAL)
        if self.params["batch_size"] == 1 and self.params["baseline_episodes"] == 1:
            raise PlacebenchError(f"{self.name}: batch_size 1 with baseline_episodes 1 makes the baseline each "
                                  "episode's own returns, so every advantage is zero and the policy never learns; "
                                  "raise either")

    def place(self, problem: Problem, budget: Budget, seed: int) -> PlacementResult:
        started = time.perf_counter()
        p = dict(self.params)
        if p["max_groups"] is None:
            p["max_groups"] = 4 * problem.cluster.num_devices
        with torch_threads(int(p["threads"])):
            search = PlacetoSearch(problem, p, seed)
            reserve = 0 if p["final"] == "best" else 1
            while search.episode(int(p["batch_size"]), reserve):  # False once the budget cannot pay for a step
                pass
            return finish(search, problem, started, self.params)
