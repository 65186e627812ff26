"""Local search: finds the brute-force optimum of small problems within the methodology's budget, stays in
budget, is seeded, and never ends worse than its m-ETF start."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from baselines import _common
from baselines.human_expert import HumanExpert
from baselines.local_search import LocalSearch
from baselines.m_etf import m_etf_placement
from suite import methodology, registry
from suite.errors import PlacebenchError
from suite.methodology import Budget
from suite.placement import validate
from suite.simulator import simulate_batch

BRUTE_FORCE_CASES = 24


def brute_force_optimum_s(graph, cluster) -> float:
    """Smallest simulated step time over every placement that respects colocation and device kinds."""
    con = _common.contract(graph)
    allowed = _common.allowed_nodes(con, cluster)
    choices = [np.flatnonzero(row).tolist() for row in allowed]
    nodes = np.array(list(itertools.product(*choices)), dtype=np.int64)
    best = np.inf
    for start in range(0, len(nodes), 20000):
        for r in simulate_batch(graph, cluster, nodes[start : start + 20000][:, con.node_of_op], validate_each=False):
            if r.status == "ok":
                best = min(best, r.step_time_s)
    return best


def test_finds_the_brute_force_optimum_in_90_percent_of_small_problems(random_graph, make_problem):
    """Random DAGs of 6..10 ops on 2 or 3 devices (some with colocation pairs and kind constraints), local
    search with the methodology's evaluation budget; its final placement must match the optimum (relative
    1e-12) in at least 90% of the cases."""
    budget = methodology.load().budget
    clusters = [registry.load_cluster("xeon_h100"), registry.load_cluster("haswell_2k80")]
    rng = np.random.default_rng(2024)
    hits, misses = 0, []
    for case in range(BRUTE_FORCE_CASES):
        n = int(rng.integers(6, 11))
        cluster = clusters[min(case % 3, 1)]  # two cases in three on 3 devices
        graph = random_graph(n, 1000 + case, max_preds=2, groups=case % 4 == 3, kinds=case % 3 == 2)
        optimum = brute_force_optimum_s(graph, cluster)
        problem = make_problem(graph, cluster, max_evaluations=budget.max_evaluations)
        result = LocalSearch().place(problem, budget, seed=case)
        assert result.evaluations <= budget.max_evaluations
        m = problem.evaluator.measure(result.placement)
        if m.status == "ok" and abs(m.step_time_s - optimum) <= 1e-12 * optimum:
            hits += 1
        else:
            misses.append((case, n, cluster.num_devices, m.step_time_s / optimum))
    assert hits >= 0.9 * BRUTE_FORCE_CASES, misses


def test_without_evaluations_it_returns_its_first_start_and_no_score(random_graph, make_problem, haswell_2k80):
    """A budget of 0 evaluations: the first start (every op on the fastest GPU, gpu:0 = device 1 of haswell_2k80) is the
    answer, and the best score seen is None (nothing was scored), not inf, which JSON cannot hold."""
    g = random_graph(6, 1)
    r = LocalSearch().place(make_problem(g, haswell_2k80, max_evaluations=0), Budget(max_evaluations=0), 0)
    assert r.placement.tolist() == [1] * 6 and r.evaluations == 0
    assert r.info == {"best_score_s": None, "climbs": 0, "kicks": 0, "stop": "budget", "distinct_placements": 0}


def test_stays_within_the_evaluation_budget(random_graph, make_problem, haswell_2k80):
    g = random_graph(60, 3, groups=True, kinds=True)
    p = make_problem(g, haswell_2k80, max_evaluations=7)
    r = LocalSearch().place(p, Budget(max_evaluations=7), 0)
    assert r.evaluations == p.evaluator.evaluations_used == 7
    validate(r.placement, g, haswell_2k80)
    assert len(r.curve) == 7


def test_a_spent_time_budget_still_returns_a_valid_placement(random_graph, make_problem, haswell_2k80):
    g = random_graph(30, 4, kinds=True)
    p = make_problem(g, haswell_2k80, max_seconds=0.001)
    import time

    time.sleep(0.01)
    r = LocalSearch().place(p, Budget(max_seconds=0.001), 0)
    validate(r.placement, g, haswell_2k80)
    assert r.evaluations == 0


def test_same_seed_same_search(random_graph, make_problem, haswell_4k80):
    g = random_graph(40, 5, groups=True)
    a, b = (LocalSearch().place(make_problem(g, haswell_4k80, max_evaluations=150), Budget(), 9) for _ in range(2))
    assert np.array_equal(a.placement, b.placement)
    assert [c.best_score_s for c in a.curve] == [c.best_score_s for c in b.curve]


def test_never_worse_than_its_m_etf_start(random_graph, make_problem, haswell_4k80):
    for seed in range(3):
        g = random_graph(50, 10 + seed, groups=True, kinds=True)
        p = make_problem(g, haswell_4k80, max_evaluations=60)
        r = LocalSearch().place(p, Budget(), seed)
        start, _ = m_etf_placement(p)
        assert p.evaluator.score(p.evaluator.measure(r.placement)) <= p.evaluator.score(p.evaluator.measure(start))


def test_every_tried_placement_is_valid(random_graph, make_problem, haswell_2k80, monkeypatch):
    """Moves respect kinds and colocation: the evaluator measures no placement as invalid, and the search
    spends its whole budget in batches."""
    g = random_graph(20, 6, groups=True, kinds=True)
    p = make_problem(g, haswell_2k80, max_evaluations=100)
    statuses = []
    evaluate_batch = p.evaluator.evaluate_batch

    def spy(placements):
        ms = evaluate_batch(placements)
        statuses.extend(m.status for m in ms)
        return ms

    monkeypatch.setattr(p.evaluator, "evaluate_batch", spy)
    LocalSearch().place(p, Budget(), 0)
    assert len(statuses) == p.evaluator.evaluations_used == 100
    assert "invalid" not in statuses


@pytest.mark.parametrize("max_evaluations", [7, 13, 21])
def test_returns_the_best_placement_it_evaluated(random_graph, make_problem, haswell_2k80, max_evaluations):
    """The budget runs out in the middle of a climb: the result is still the best placement evaluated."""
    for seed in range(4):
        g = random_graph(30, seed, groups=True, kinds=True)
        p = make_problem(g, haswell_2k80, max_evaluations=max_evaluations)
        r = LocalSearch().place(p, Budget(max_evaluations=max_evaluations), seed)
        assert r.evaluations == max_evaluations
        assert p.evaluator.score(p.evaluator.measure(r.placement)) == p.evaluator.best_score_s
        assert r.info["best_score_s"] == p.evaluator.best_score_s


@pytest.mark.parametrize(("n", "max_evaluations"), [(10, 150), (24, 200)])
def test_kicks_start_from_the_best_placement_so_far(random_graph, make_problem, haswell_2k80, n, max_evaluations):
    """Iterated local search: each kick perturbs the best placement evaluated so far, not the local optimum
    the last climb ended in, nor the best start (on these graphs the climbs improve on the starts)."""
    g = random_graph(n, 23, groups=True, kinds=True)
    con = _common.contract(g)
    p = make_problem(g, haswell_2k80, max_evaluations=max_evaluations)
    kicked_from = []

    class Spy(LocalSearch):
        def _kick(self, best, allowed, rng):
            kicked_from.append((best.copy(), p.evaluator.best_score_s))
            return super()._kick(best, allowed, rng)

    Spy().place(p, Budget(), 3)
    assert len(kicked_from) >= 5
    assert p.evaluator.best_score_s < p.evaluator.curve[3].best_score_s  # the climbs beat the 4 starts
    for best, best_score in kicked_from:
        assert p.evaluator.score(p.evaluator.measure(con.expand(best))) == best_score


def test_the_first_four_evaluations_are_the_documented_starts(random_graph, make_problem, make_cluster, monkeypatch):
    """One batch of 4 starts, in order: all on the fastest GPU (gpu:0, device 1: the GPUs tie, the first
    wins), m-ETF, the human expert (here a balanced split over the GPUs) and a uniformly random placement,
    each on these 12 ops a placement of its own; the curve's first 4 points are their scores. The random
    start changes with the seed, the others do not."""
    g = random_graph(12, 4)
    cluster = make_cluster(2)
    expert = HumanExpert().place(make_problem(g, cluster), Budget(), 0).placement.tolist()
    randoms = []
    for seed in range(6):
        p = make_problem(g, cluster, max_evaluations=4)
        batches = []
        evaluate_batch = p.evaluator.evaluate_batch

        def spy(placements, evaluate_batch=evaluate_batch, batches=batches):
            batches.append([np.asarray(x).tolist() for x in placements])
            return evaluate_batch(placements)

        monkeypatch.setattr(p.evaluator, "evaluate_batch", spy)
        LocalSearch().place(p, Budget(max_evaluations=4), seed)
        assert len(batches) == 1 and len(batches[0]) == 4
        single, etf, human, rand = batches[0]
        assert single == [1] * 12
        assert etf == m_etf_placement(p)[0].tolist()
        assert human == expert
        assert len({tuple(x) for x in batches[0]}) == 4  # the random start is none of the other three
        validate(rand, g, cluster)
        scores = [p.evaluator.score(p.evaluator.measure(x)) for x in batches[0]]
        assert [c.best_score_s for c in p.evaluator.curve] == pytest.approx(np.minimum.accumulate(scores).tolist())
        assert [c.mean_score_s for c in p.evaluator.curve] == pytest.approx(
            [sum(scores[: k + 1]) / (k + 1) for k in range(4)])
        randoms.append(rand)
    assert len({tuple(x) for x in randoms}) == len(randoms)
    draws = np.array(randoms).ravel()
    assert sorted(set(draws.tolist())) == [0, 1, 2]  # every device is drawn
    assert np.bincount(draws).min() >= 0.2 * len(draws)  # about a third each (72 draws)


@pytest.mark.parametrize("kick_moves", [1, 3, 50])
def test_a_kick_moves_kick_moves_nodes(random_graph, make_problem, haswell_2k80, kick_moves):
    """A kick moves min(kick_moves, movable nodes) distinct nodes of the best placement, each to another
    device: it differs from the best in exactly that many nodes (8 nodes, each allowed on all 3 devices)."""
    g = random_graph(8, 7)
    p = make_problem(g, haswell_2k80, max_evaluations=300)
    kicks = []

    class Spy(LocalSearch):
        def _kick(self, best, allowed, rng):
            out = super()._kick(best, allowed, rng)
            kicks.append((best.copy(), out))
            return out

    Spy(kick_moves=kick_moves).place(p, Budget(), 0)
    assert len(kicks) >= 3
    for best, out in kicks:
        assert len(best) == 8
        assert int((best != out).sum()) == min(kick_moves, 8)


def test_parameters_are_checked_at_construction():
    assert LocalSearch(batch_size=1, kick_moves=0).params == {"batch_size": 1, "kick_moves": 0}
    for bad in ({"batch_size": 0}, {"batch_size": -3}, {"batch_size": float("nan")}, {"batch_size": True},
                {"kick_moves": -1}, {"batch_size": "8"}):
        with pytest.raises(PlacebenchError, match=f"parameter {next(iter(bad))}="):
            LocalSearch(**bad)


def test_a_small_space_explored_in_full_ends_the_search_before_the_budget(random_graph, make_problem, haswell_2k80):
    """3 ops on 3 devices: 27 placements, each evaluated once (repeats cost nothing); then 100 climbs in a row
    meet nothing new and the search stops, with 973 evaluations of its budget left."""
    g = random_graph(3, 7)
    p = make_problem(g, haswell_2k80, max_evaluations=1000)
    r = LocalSearch().place(p, Budget(), 0)
    assert r.info["stop"] == "exhausted_neighbourhood" and r.info["climbs"] >= 100
    assert r.evaluations == r.info["distinct_placements"] == 27


def test_climbs_that_meet_new_placements_go_on_past_100(random_graph, make_problem, haswell_2k80):
    """10 ops on 3 devices (59049 placements): more than 100 climbs, each meeting placements not seen before,
    run until the budget is spent; only 100 climbs in a row with nothing new stop the search early."""
    g = random_graph(10, 7)
    p = make_problem(g, haswell_2k80, max_evaluations=1500)
    r = LocalSearch().place(p, Budget(), 0)
    assert r.info["stop"] == "budget" and r.info["climbs"] > 100
    assert r.evaluations == r.info["distinct_placements"] == 1500


def test_a_climb_ends_at_a_local_optimum(random_graph, make_problem, haswell_2k80):
    """Where a climb finishes (the budget not cut it short), no move of one node to another device scores
    better: after each improvement the moves of the new placement are tried, not the rest of the old list."""
    g = random_graph(8, 7)
    p = make_problem(g, haswell_2k80, max_evaluations=300)
    ends = []

    class Spy(LocalSearch):
        def _climb(self, current, current_score, allowed, scorer, rng):
            out = super()._climb(current, current_score, allowed, scorer, rng)
            ends.append(out)
            return out

    Spy().place(p, Budget(), 0)
    judge = make_problem(g, haswell_2k80).evaluator
    con = _common.contract(g)
    assert len(ends) >= 3 and con.num_nodes == 8
    for current, score in ends:
        for node in range(8):
            for dev in range(3):
                c = current.copy()
                c[node] = dev
                assert judge.score(judge.measure(con.expand(c))) >= score


def test_of_equal_starts_the_first_is_kept(make_problem, make_cluster):
    """One op on two equal GPUs: every placement takes the same time. The search keeps the first of the
    equal starts (all on gpu:0), whatever device the human expert (gpu:1 here) or the random start chose."""
    from suite.graph import Op, OpGraph

    g = OpGraph.build("one", [Op("x", "matmul", flops=1e9, output_bytes=8)], [])
    cluster = make_cluster(2, cpu=False)
    for seed in range(4):
        r = LocalSearch().place(make_problem(g, cluster, max_evaluations=50), Budget(), seed)
        assert r.placement.tolist() == [0] and r.info["distinct_placements"] == 2


def test_no_node_can_move_the_search_ends_with_the_only_placement(make_problem, make_cluster):
    """Every op CPU-only on a cluster with one CPU: one placement exists; the search scores it once and stops
    (no kick is possible), without spending its budget."""
    from suite.graph import Op, OpGraph

    g = OpGraph.build("cpu_only", [Op(f"o{i}", "x", flops=1e9, output_bytes=8, allowed_kinds=("cpu",))
                                   for i in range(3)], [("o0", "o1"), ("o1", "o2")])
    r = LocalSearch().place(make_problem(g, make_cluster(2), max_evaluations=50), Budget(), 0)
    assert r.placement.tolist() == [0, 0, 0] and r.evaluations == 1
    assert r.info["stop"] == "exhausted_neighbourhood" and r.info["kicks"] == 0


def test_the_first_start_is_the_fastest_gpu_even_where_the_cpu_is_faster(random_graph, make_problem, make_cluster):
    """A CPU of 1e11 FLOP/s and GPUs of 1e10: the first start is still every op on the fastest GPU (gpu:0,
    device 1), as documented, not on the fastest device."""
    g = random_graph(6, 1)
    cluster = make_cluster(2, cpu_flops=1e11, gpu_flops=1e10)
    r = LocalSearch().place(make_problem(g, cluster, max_evaluations=0), Budget(max_evaluations=0), 0)
    assert r.placement.tolist() == [1] * 6 and r.evaluations == 0
