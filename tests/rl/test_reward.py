"""Rewards and budgeted rollouts: -sqrt(step time), penalties, and the budget is never overrun."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rl.grouping import colocation_grouping
from rl.learned import finish
from rl.reward import RewardConfig, RewardEvaluator, reward_of, score_s
from suite.evaluator import Measurement


def test_reward_transforms():
    assert reward_of(4.0) == -2.0
    assert reward_of(4.0, "neg") == -4.0
    assert reward_of(math.e, "neg_log") == pytest.approx(-1.0)
    assert reward_of(4.0, "inv") == 0.25
    # sub-millisecond step times keep their value: the floors only keep a zero score finite
    assert reward_of(1e-4, "inv") == pytest.approx(1e4) and reward_of(1e-4, "neg_log") == pytest.approx(math.log(1e4))
    assert reward_of(0.0, "inv") == 1e12
    with pytest.raises(ValueError, match="unknown reward transform 'square'"):
        RewardConfig("square")
    with pytest.raises(ValueError, match="oom_score_s must be a positive number of seconds, got -1.0"):
        RewardConfig(oom_score_s=-1.0)
    with pytest.raises(ValueError, match="invalid_score_s must be a positive number of seconds, got 0.0"):
        RewardConfig(invalid_score_s=0.0)  # a zero penalty would rank a failing placement as the fastest


def test_penalties(branchy, k80x2, make_problem):
    problem, _ = make_problem(branchy, k80x2)
    ev = problem.evaluator
    oom = Measurement("oom", 2.0)
    bad = Measurement("invalid", None)
    assert score_s(Measurement("ok", 0.25), ev) == 0.25
    assert score_s(oom, ev) == ev.failure_score_s + 2.0  # the methodology's (no per-device peaks given)
    assert score_s(bad, ev) == 2 * ev.failure_score_s
    fixed = RewardConfig(oom_score_s=100.0, invalid_score_s=200.0)  # Mirhoseini-style fixed running time
    assert score_s(oom, ev, fixed) == 100.0
    assert score_s(bad, ev, fixed) == 200.0
    failed = Measurement("error", None)  # a real backend that could not run the placement: scored as invalid
    assert score_s(failed, ev) == 2 * ev.failure_score_s
    assert score_s(failed, ev, fixed) == 200.0


def test_rollouts_respect_budget_and_track_best(train2, k80x2, make_problem):
    problem, _ = make_problem(train2, k80x2, max_evaluations=10)
    g = colocation_grouping(train2)
    rollouts = RewardEvaluator(problem.evaluator, g)
    # groups: data (cpu only), l0, l1, loss (gpu only)
    batch = np.array([[0, 1, 1, 1], [0, 1, 2, 1], [1, 1, 1, 1]])  # the last puts data on a GPU: invalid
    assert rollouts.allowance(8) == 8
    r = rollouts(batch)
    assert r.statuses == ["ok", "ok", "invalid"]
    assert np.allclose(r.rewards, -np.sqrt(r.scores_s))
    assert rollouts.best_score_s == r.scores_s[:2].min()
    assert problem.evaluator.evaluations_used == 3
    assert rollouts.allowance(8, reserve=1) == 6
    ev = problem.evaluator
    saved = ev._measured, ev._measuring_s
    ev._measured, ev._measuring_s = 1, ev.time_left_s / 2.5  # two more evaluations fit the time left
    assert rollouts.allowance(8) == 2
    ev._measured, ev._measuring_s = saved
    rollouts(np.tile(batch[:1], (7, 1)))
    assert rollouts.allowance(8) == 0
    assert rollouts(batch[:1]) is None  # over budget: None, not an exception
    assert problem.evaluator.evaluations_used == 10
    assert len(problem.evaluator.curve) == 10


def test_ties_keep_the_first_best_and_a_greedy_placement_as_good_wins(branchy, k80x2, make_problem):
    """All on gpu:0 and all on gpu:1 take the same time: the best stays the first seen, within a batch and
    across batches; a greedy placement that scores as well as the best sampled one is the final one."""
    problem, _ = make_problem(branchy, k80x2, max_evaluations=10)
    rollouts = RewardEvaluator(problem.evaluator, colocation_grouping(branchy))
    gpu0, gpu1 = np.full(8, 1), np.full(8, 2)
    r = rollouts(np.stack([gpu1, gpu0]))
    assert r.scores_s[0] == r.scores_s[1] and rollouts.best_group_devices.tolist() == gpu1.tolist()
    rollouts(gpu0[None])
    assert rollouts.best_group_devices.tolist() == gpu1.tolist()
    final, source, score = rollouts.final(gpu0, "best_or_greedy")
    assert (final.tolist(), source, score) == (gpu0.tolist(), "greedy", rollouts.best_score_s)
    used = problem.evaluator.evaluations_used
    final, source, score = rollouts.final(gpu0, "best")
    assert (final.tolist(), source, score) == (gpu1.tolist(), "best_sampled", None)
    assert problem.evaluator.evaluations_used == used  # "best" spends no evaluation on the greedy placement


def test_oom_shaping_ranks_nearly_fitting_placements_better(branchy, k80x2, make_problem):
    problem, _ = make_problem(branchy, k80x2)
    ev = problem.evaluator
    cap = k80x2.devices[1].memory_bytes  # gpu:0
    half_over = Measurement("oom", 1.0, peak_memory_bytes={"cpu:0": 0, "gpu:0": cap + cap // 2, "gpu:1": 0})
    twice = Measurement("oom", 1.0, peak_memory_bytes={"cpu:0": 0, "gpu:0": 2 * cap, "gpu:1": cap})
    assert score_s(half_over, ev) == pytest.approx(ev.failure_score_s * 1.5 + 1.0)
    assert score_s(twice, ev) == pytest.approx(ev.failure_score_s * 2.0 + 1.0)  # gpu:0 over by 100%; gpu:1 just full
    assert score_s(half_over, ev, RewardConfig(oom_shaping=False)) == ev.failure_score_s + 1.0


def test_the_evaluation_kept_back_is_kept_of_the_time_left_too(train2, k80x2, make_problem):
    """A search bound by its time budget stops while the evaluation kept for the greedy placement still fits
    (before, it ran until no time was left, and the greedy placement was never scored)."""
    problem, _ = make_problem(train2, k80x2, max_evaluations=100)
    ev = problem.evaluator
    rollouts = RewardEvaluator(ev, colocation_grouping(train2))
    ev._measured, ev._measuring_s = 1, ev.time_left_s / 3.5  # three more evaluations fit the time left
    assert rollouts.allowance(8) == 3
    assert rollouts.allowance(8, reserve=1) == 2
    ev._measuring_s = ev.time_left_s / 1.5  # one fits: the search stops and leaves it to the greedy placement
    assert rollouts.allowance(8, reserve=1) == 0
    assert rollouts.allowance(1) == 1
    _, source, greedy_score = rollouts.final(np.array([0, 1, 1, 1]), "best_or_greedy")
    assert source == "greedy" and greedy_score is not None and ev.evaluations_used == 1


def test_best_or_greedy_keeps_the_better_of_the_two(branchy, k80x2, make_problem):
    """The greedy placement is kept only if it scores at least as well as the best sampled one: a worse
    greedy placement (all on the CPU) leaves the best sampled one (all on gpu:0), a better one replaces it."""
    problem, _ = make_problem(branchy, k80x2, max_evaluations=10)
    rollouts = RewardEvaluator(problem.evaluator, colocation_grouping(branchy))
    cpu, gpu0, split = np.full(8, 0), np.full(8, 1), np.array([1, 1, 1, 2, 2, 1, 1, 1])  # split: b1, b2 on gpu:1
    sampled = rollouts(gpu0[None]).scores_s[0]
    final, source, score = rollouts.final(cpu, "best_or_greedy")
    assert score > sampled  # the premise: the CPU is slower
    assert (final.tolist(), source) == (gpu0.tolist(), "best_sampled")
    final, source, score = rollouts.final(split, "best_or_greedy")
    assert score < sampled  # the premise: two GPUs are faster than one
    assert (final.tolist(), source) == (split.tolist(), "greedy")


def test_a_better_greedy_placement_is_not_counted_as_the_best_sample(branchy, k80x2, make_problem):
    """The greedy placement is evaluated for the final choice, not sampled: `best_search_score_s` stays the best
    sample's score and the greedy one's is `greedy_score_s` (before, both held the greedy score)."""
    problem, _ = make_problem(branchy, k80x2, max_evaluations=10)
    rollouts = RewardEvaluator(problem.evaluator, colocation_grouping(branchy))
    cpu, gpu0 = np.full(8, 0), np.full(8, 1)
    sampled = float(rollouts(cpu[None]).scores_s[0])
    greedy = score_s(problem.evaluator.measure(np.full(8, 1)), problem.evaluator)
    assert greedy < sampled  # the premise: all on a K80 beats all on the CPU

    class Search:
        grouping = rollouts.grouping

        def __init__(self):
            self.rollouts = rollouts

        def greedy(self):
            return gpu0

        def info(self):
            return {}

    result = finish(Search(), problem, 0.0, {"final": "best_or_greedy"})
    assert result.placement.tolist() == gpu0.tolist()  # branchy: one group per op
    assert (result.info["final"], result.info["greedy_score_s"]) == ("greedy", greedy)
    assert result.info["best_search_score_s"] == sampled
    assert (rollouts.best_score_s, rollouts.best_group_devices.tolist()) == (sampled, cpu.tolist())


def test_best_search_score_is_none_when_nothing_was_sampled(branchy, k80x2, make_problem):
    problem, _ = make_problem(branchy, k80x2, max_evaluations=1)
    rollouts = RewardEvaluator(problem.evaluator, colocation_grouping(branchy))

    class Search:
        grouping = rollouts.grouping

        def __init__(self):
            self.rollouts = rollouts

        def greedy(self):
            return np.full(8, 1)

        def info(self):
            return {}

    result = finish(Search(), problem, 0.0, {"final": "best_or_greedy"})
    assert result.info["final"] == "greedy" and result.info["greedy_score_s"] is not None
    assert result.info["best_search_score_s"] is None


# -- mutation round: behaviours no test pinned ------------------------------------------------------------


def test_neg_log_reward_of_a_zero_score_is_floored_not_a_math_error():
    # the floor 1e-12 s: -log(1e-12) = 12 log 10 (without it, math.log(0) raises "math domain error")
    assert reward_of(0.0, "neg_log") == pytest.approx(12 * math.log(10), rel=1e-12)


def test_best_placement_is_a_copy_of_the_callers_array(branchy, k80x2, make_problem):
    """The caller may reuse its sample buffer: writing into it after the call leaves the best placement as it
    was evaluated (an int64 [B, G] array is not copied on the way in)."""
    problem, _ = make_problem(branchy, k80x2, max_evaluations=10)
    rollouts = RewardEvaluator(problem.evaluator, colocation_grouping(branchy))
    samples = np.full((1, 8), 1, dtype=np.int64)
    rollouts(samples)
    samples[:] = 0
    assert rollouts.best_group_devices.tolist() == [1] * 8


def test_batches_count_evaluated_batches_only_and_one_placement_is_a_batch_of_one(branchy, k80x2, make_problem):
    """`batches` counts the calls that evaluated something (a refused one does not); a single placement [G]
    is evaluated as a batch of one (one evaluation, a rollout of one row)."""
    problem, _ = make_problem(branchy, k80x2, max_evaluations=3)
    rollouts = RewardEvaluator(problem.evaluator, colocation_grouping(branchy))
    r = rollouts(np.full(8, 1))
    assert r.group_devices.shape == (1, 8) and len(r.scores_s) == 1 and problem.evaluator.evaluations_used == 1
    rollouts(np.full((2, 8), 2))
    assert rollouts(np.full((1, 8), 0)) is None  # over budget
    assert rollouts.batches == 2


def test_allowance_is_never_negative_when_less_than_the_reserve_is_left(branchy, k80x2, make_problem):
    # nothing left, one evaluation kept back: 0 placements (not 0 - 1 = -1)
    problem, _ = make_problem(branchy, k80x2, max_evaluations=1)
    rollouts = RewardEvaluator(problem.evaluator, colocation_grouping(branchy))
    rollouts(np.full((1, 8), 1))
    assert rollouts.allowance(8, reserve=1) == 0 and rollouts.allowance(8) == 0


def test_final_with_nothing_sampled_is_the_greedy_placement_in_every_mode(branchy, k80x2, make_problem):
    """"best" with nothing sampled, and "best_or_greedy" with no evaluation left for the greedy placement,
    return the greedy placement unscored (there is no best sample to return)."""
    problem, _ = make_problem(branchy, k80x2, max_evaluations=0)
    rollouts = RewardEvaluator(problem.evaluator, colocation_grouping(branchy))
    greedy = np.full(8, 2)
    for mode in ("best", "best_or_greedy", "greedy"):
        final, source, score = rollouts.final(greedy, mode)
        assert (final.tolist(), source, score) == (greedy.tolist(), "greedy", None)
