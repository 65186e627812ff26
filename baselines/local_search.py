"""Local search on the evaluator: iterated hill climbing over colocation groups, with the learned placers' budget.

The search sees placements only through `problem.evaluator`, so it spends the same evaluation budget (and
wall clock) as every learned placer. It works on nodes (colocation groups, or single ops), so every
placement it tries respects colocation and device kinds.

1. Start: evaluate a few simple placements — all on the fastest GPU, m-ETF (`baselines.m_etf`), the
   human-expert placement (`baselines.human_expert`) and one uniformly random placement — and start from
   the best (4 evaluations).
2. Hill climbing: a move puts one node on another allowed device. The untried moves of the current
   placement are visited in a random order, `batch_size` at a time (one `evaluate_batch`); the best of a
   batch is taken if it improves the current score. When every move of the current placement has been
   tried without improvement it is a local optimum.
3. Kick (iterated local search): from the best placement so far, move `kick_moves` random nodes to random
   allowed devices and climb again from there.
4. Placements already scored are remembered and never evaluated twice (a repeat costs no budget).
   The search stops when the evaluator's budget (evaluations or seconds) is spent, or when 100 climbs in a
   row met no placement not seen before (a small space fully explored).

Scores are the evaluator's: step time, with the methodology's penalty for OOM and invalid placements.
All randomness comes from `numpy.random.default_rng(seed)`.
"""

from __future__ import annotations

import time
from typing import ClassVar

import numpy as np

from baselines import _common
from baselines.human_expert import expert_node_devices
from baselines.m_etf import m_etf_placement
from suite.errors import BudgetExhausted
from suite.evaluator import Evaluator
from suite.methodology import Budget
from suite.placer import BasePlacer, PlacementResult, Problem

MAX_STALLED_CLIMBS = 100  # climbs in a row that met no new placement: the reachable space is explored


class _Spent(Exception):
    """The evaluator's budget is spent: stop searching."""


class _Scorer:
    """Scores node placements through the evaluator, remembering every placement it has scored."""

    def __init__(self, evaluator: Evaluator, con: _common.Contraction):
        self.ev = evaluator
        self.con = con
        self.seen: dict[bytes, float] = {}

    def scores(self, node_placements: list[np.ndarray]) -> list[float]:
        keys = [p.astype(np.int64).tobytes() for p in node_placements]
        todo: list[int] = []
        first: dict[bytes, int] = {}
        for j, key in enumerate(keys):
            if key not in self.seen and key not in first:
                first[key] = j
                todo.append(j)
        if todo:
            if self.ev.exhausted:
                raise _Spent
            todo = todo[: self.ev.affordable(len(todo))]
            try:
                ms = self.ev.evaluate_batch([self.con.expand(node_placements[j]) for j in todo])
            except BudgetExhausted:
                raise _Spent from None
            for j, m in zip(todo, ms, strict=True):
                self.seen[keys[j]] = self.ev.score(m)
        return [self.seen.get(key, np.inf) for key in keys]


class LocalSearch(BasePlacer):
    """Iterated hill climbing, one colocation group at a time, until the evaluator's budget is spent."""

    name = "local_search"
    defaults: ClassVar[dict] = {"batch_size": 8, "kick_moves": 2}
    bounds: ClassVar[dict] = {"batch_size": (1, 4096), "kick_moves": (0, 1_000_000)}

    def place(self, problem: Problem, budget: Budget, seed: int) -> PlacementResult:
        started = time.perf_counter()
        rng = np.random.default_rng(seed)
        cluster = problem.cluster
        con = _common.contract(problem.workload)
        allowed = _common.allowed_nodes(con, cluster)
        scorer = _Scorer(problem.evaluator, con)
        starts = self._starts(problem, con, allowed, rng)
        best, best_score = starts[0], np.inf
        climbs = kicks = stalled = 0
        stop = "budget"
        try:
            for p, s in zip(starts, scorer.scores(starts), strict=True):
                if s < best_score:
                    best, best_score = p, s
            current, current_score = best.copy(), best_score
            while True:
                seen_before = len(scorer.seen)
                current, current_score = self._climb(current, current_score, allowed, scorer, rng)
                climbs += 1
                if current_score < best_score:
                    best, best_score = current.copy(), current_score
                current = self._kick(best, allowed, rng)
                stalled = stalled + 1 if len(scorer.seen) == seen_before else 0
                if current is None or stalled >= MAX_STALLED_CLIMBS:
                    stop = "exhausted_neighbourhood"
                    break
                kicks += 1
                current_score = scorer.scores([current])[0]
        except _Spent:
            pass
        for key, s in scorer.seen.items():  # the climb may have been cut mid-batch: take the best seen
            if s < best_score:
                best, best_score = np.frombuffer(key, dtype=np.int64).copy(), s
        return PlacementResult.from_search(
            con.expand(best),
            problem,
            started,
            best_score_s=float(best_score) if np.isfinite(best_score) else None,
            climbs=climbs,
            kicks=kicks,
            stop=stop,
            distinct_placements=len(scorer.seen),
        )

    def _starts(self, problem: Problem, con, allowed: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
        cluster = problem.cluster
        order = _common.speed_order(cluster)
        single_dev = cluster.fastest("gpu") if cluster.device_indices("gpu") else int(order[0])
        single, _ = _common.enforce_kinds(np.full(con.num_nodes, single_dev, dtype=np.int64), con, allowed, order)
        etf, _ = m_etf_placement(problem)
        expert, _, _ = expert_node_devices(problem, "expert")
        expert, _ = _common.enforce_kinds(expert, con, allowed, order)
        random = self._random(allowed, rng)
        return [single, con.restrict(etf), expert, random]

    @staticmethod
    def _random(allowed: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Each node on a uniformly random allowed device."""
        counts = allowed.sum(axis=1)
        pick = (rng.random(len(allowed)) * counts).astype(np.int64)
        cum = np.cumsum(allowed, axis=1) - 1
        return np.argmax(cum == pick[:, None], axis=1).astype(np.int64) if len(allowed) else pick

    @staticmethod
    def _moves(current: np.ndarray, allowed: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """All (node, device) moves away from `current`, in random order, as a [M, 2] array."""
        mask = allowed.copy()
        mask[np.arange(len(current)), current] = False
        moves = np.argwhere(mask)
        return moves[rng.permutation(len(moves))]

    def _climb(self, current, current_score, allowed, scorer: _Scorer, rng):
        """Best-of-batch hill climbing until no move of the current placement improves it."""
        batch = int(self.params["batch_size"])
        moves, pos = self._moves(current, allowed, rng), 0
        while pos < len(moves):
            chunk = moves[pos : pos + batch]
            pos += len(chunk)
            cands = []
            for node, dev in chunk.tolist():
                c = current.copy()
                c[node] = dev
                cands.append(c)
            scores = scorer.scores(cands)
            j = int(np.argmin(scores))
            if scores[j] < current_score:
                current, current_score = cands[j], scores[j]
                moves, pos = self._moves(current, allowed, rng), 0
        return current, current_score

    def _kick(self, best: np.ndarray, allowed: np.ndarray, rng: np.random.Generator) -> np.ndarray | None:
        """`kick_moves` random nodes of `best` to random other allowed devices; None if no node can move."""
        movable = np.flatnonzero(allowed.sum(axis=1) > 1)
        if not len(movable):
            return None
        out = best.copy()
        k = min(int(self.params["kick_moves"]), len(movable))
        for node in rng.choice(movable, size=k, replace=False).tolist():
            options = np.flatnonzero(allowed[node])
            options = options[options != out[node]]
            out[node] = int(rng.choice(options))
        return out
