"""The evaluator counts every evaluation against the budget, scores failures, and records the curve."""

import pytest

from suite import Op, OpGraph
from suite.errors import BudgetExhausted
from suite.evaluator import Evaluator, serial_bound_s
from suite.methodology import Budget

G = 1e9


@pytest.fixture
def problem(uniform_cluster):
    g = OpGraph.build("fork", [Op("a", "x", flops=G, output_bytes=1000), Op("b", "x", flops=2 * G, param_bytes=600),
                               Op("c", "x", flops=2 * G)], [("a", "b"), ("a", "c")])
    return g, uniform_cluster(2)


def test_budget_is_counted_and_enforced(problem):
    g, c = problem
    ev = Evaluator(g, c, Budget(max_evaluations=3, max_seconds=60))
    assert ev.evaluate([0, 0, 0]).step_time_s == 5.0
    ms = ev.evaluate_batch([[0, 1, 0], [0, 0, 1]])
    # a [0,1]; copy to d1 [1,2]; b on d1 [2,4]; c on d0 [1,3] -> 4 s, and symmetric
    assert [m.step_time_s for m in ms] == [4.0, 4.0]
    assert ev.evaluations_used == 3 and ev.remaining == 0 and ev.exhausted
    with pytest.raises(BudgetExhausted):
        ev.evaluate([0, 0, 0])
    assert [p.evaluations for p in ev.curve] == [1, 2, 3]
    assert [p.best_score_s for p in ev.curve] == [5.0, 4.0, 4.0]
    assert ev.curve[-1].mean_score_s == pytest.approx(13.0 / 3)
    assert ev.best_placement.tolist() == [0, 1, 0]


def test_batch_larger_than_budget_is_refused_whole(problem):
    g, c = problem
    ev = Evaluator(g, c, Budget(max_evaluations=2, max_seconds=60))
    with pytest.raises(BudgetExhausted):
        ev.evaluate_batch([[0, 0, 0]] * 3)
    assert ev.evaluations_used == 0


def test_failures_are_statuses_with_penalty_scores(problem, uniform_cluster):
    g, _ = problem
    c = uniform_cluster(2, memory_bytes=1500)
    ev = Evaluator(g, c, Budget(max_evaluations=10, max_seconds=60))
    bound = serial_bound_s(g, c)
    assert bound == 5.0
    bad = ev.evaluate([0, 0])
    assert bad.status == "invalid" and "2 entries" in bad.message and bad.step_time_s is None
    assert ev.score(bad) == 2 * ev.methodology.failure_multiple * bound
    # b's 600 resident bytes + live tensors on d1 exceed 1500? a's copy 1000 + 600 = 1600 -> OOM
    oom = ev.evaluate([0, 1, 0])
    assert oom.status == "oom" and oom.oom_devices == ("d1",) and "d1 needs" in oom.message
    assert ev.score(oom) == ev.methodology.failure_multiple * bound + oom.step_time_s
    assert ev.evaluations_used == 2  # invalid placements cost an evaluation too


def test_measure_is_outside_the_budget(problem):
    g, c = problem
    ev = Evaluator(g, c, Budget(max_evaluations=1, max_seconds=60))
    m = ev.measure([0, 0, 0])
    assert m.status == "ok" and m.step_time_s == 5.0 and ev.evaluations_used == 0
