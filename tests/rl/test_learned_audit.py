"""Audit additions for rl.learned: the default group cap, the parameters grouped_problem passes on, the
evaluation kept back (or not) for the greedy placement, the final choice, and torch's thread count."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rl.grouping import make_grouping
from rl.hsdag import HSDAGPlacer, HSDAGSearch
from rl.learned import grouped_problem, torch_threads
from rl.placeto import PlacetoPlacer, PlacetoSearch
from rl.post import PostPlacer, PostSearch
from rl.reward import RewardEvaluator
from rl.seq2seq import Seq2SeqPlacer, Seq2SeqSearch
from suite import Op, OpGraph
from suite.cluster import Cluster, Device, Link
from suite.errors import PlacebenchError, PlacementError
from suite.placer import make_placer

GFLOP = 1e9


def chain_graph(n: int = 50) -> OpGraph:
    """n ops in a chain, uneven work and bytes (so that the coarsening methods disagree)."""
    ops = [Op(f"o{i}", "matmul", flops=(1 + i % 7) * GFLOP, output_bytes=1000 * (1 + (i * 37) % 11)) for i in range(n)]
    return OpGraph.build("chain50", ops, [(f"o{i}", f"o{i + 1}") for i in range(n - 1)])


def params(**kw):
    return {**Seq2SeqPlacer.defaults, "grouping": "colocation", **kw}


def test_default_group_cap_is_20_per_device(two_gpus, make_problem):
    """max_groups None: min(256, 20 x devices) = 40 groups for 50 ops on 2 devices."""
    problem, _ = make_problem(chain_graph(), two_gpus)
    grouping, mask, _ = grouped_problem(problem, params(max_groups=None))
    assert grouping.num_groups == 40 and mask.shape == (40, 2)


def test_grouped_problem_coarsens_with_the_coarsen_parameter(two_gpus, make_problem):
    graph = chain_graph()
    problem, _ = make_problem(graph, two_gpus)
    topo = make_grouping(graph, "colocation", 10, coarsen_method="topological")
    heavy = make_grouping(graph, "colocation", 10, coarsen_method="heavy_edge")
    assert topo.assignment.tolist() != heavy.assignment.tolist()  # the test can tell them apart
    for method, expected in (("topological", topo), ("heavy_edge", heavy)):
        grouping, _, _ = grouped_problem(problem, params(max_groups=10, coarsen=method))
        assert grouping.assignment.tolist() == expected.assignment.tolist()


def test_grouped_problem_passes_the_reward_parameters(train2, k80x2, make_problem):
    problem, _ = make_problem(train2, k80x2)
    _, _, rollouts = grouped_problem(problem, params(reward="inv", oom_score_s=7.0, invalid_score_s=9.0,
                                                     oom_shaping=False))
    c = rollouts.config
    assert (c.transform, c.oom_score_s, c.invalid_score_s, c.oom_shaping) == ("inv", 7.0, 9.0, False)


@pytest.mark.parametrize("placer", [Seq2SeqPlacer, PostPlacer])
def test_final_best_spends_every_evaluation_on_samples(placer, train2, k80x2, make_problem):
    """final "best": no evaluation kept back for the greedy placement: 37 = 4 batches of 8 and one of 5."""
    problem, budget = make_problem(train2, k80x2, max_evaluations=37)
    result = placer(batch_size=8, final="best").place(problem, budget, seed=1)
    assert result.evaluations == 37 and result.info["final"] == "best_sampled"
    assert result.info["greedy_score_s"] is None
    assert result.info["best_search_score_s"] == pytest.approx(min(c.best_score_s for c in result.curve))


def test_final_greedy_returns_the_greedy_placement_even_when_a_sample_was_better(branchy, k80x2, make_problem):
    problem, budget = make_problem(branchy, k80x2, max_evaluations=17)
    result = Seq2SeqPlacer(grouping="colocation", batch_size=8, final="greedy").place(problem, budget, seed=0)
    assert result.info["greedy_score_s"] > result.info["best_search_score_s"]  # the premise: a sample was better
    assert result.info["final"] == "greedy"
    assert problem.evaluator.measure(result.placement).step_time_s == pytest.approx(result.info["greedy_score_s"])


def test_torch_threads_restores_the_callers_count(train2, k80x2, make_problem):
    before = torch.get_num_threads()
    outer = 2 if before != 2 else 3
    torch.set_num_threads(outer)
    try:
        with torch_threads(1):
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == outer
        problem, budget = make_problem(train2, k80x2, max_evaluations=3)
        Seq2SeqPlacer(batch_size=2, threads=1).place(problem, budget, seed=0)
        assert torch.get_num_threads() == outer
    finally:
        torch.set_num_threads(before)


def _big_weights() -> OpGraph:
    """A diamond whose first op holds 2 MiB of weights: on the 1 MiB GPU of `tiny_cluster`, OOM."""
    ops = [Op(x, "matmul", flops=1e9, output_bytes=1000, param_bytes=2**21 if x == "a" else 0) for x in "abcd"]
    return OpGraph.build("big", ops, [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")])


@pytest.mark.parametrize("name, extra", [("placeto", {"normalize_advantages": False}),
                                         ("seq2seq", {"reward": "neg", "normalize_advantages": False}),
                                         ("hsdag", {"reward": "neg"})])
def test_penalties_beyond_float32_end_the_search_with_a_clear_error(name, extra, tiny_cluster, make_problem):
    """An OOM score of 1e40 s with unnormalized advantages: the update's weights do not fit float32. Before, the
    loss became inf or NaN and the search ended with "the policy diverged ... lower the learning rate"."""
    problem, budget = make_problem(_big_weights(), tiny_cluster, max_evaluations=30)
    placer = make_placer(name, oom_score_s=1e40, oom_shaping=False, **extra)
    with pytest.raises(PlacebenchError, match=r"weights \(advantages or returns\) reach \S+e\+(39|40), beyond torch.float32"):
        placer.place(problem, budget, seed=0)


@pytest.mark.parametrize("name, extra", [("seq2seq", {"reward": "neg", "normalize_advantages": False}),
                                         ("hsdag", {"reward": "neg"})])
def test_penalties_that_overflow_the_gradient_norm_end_the_search_with_a_clear_error(name, extra, tiny_cluster,
                                                                                     make_problem):
    """An OOM score of 1e25 s: the weights fit float32, the gradient's norm does not. Before, seq2seq's clipped
    updates were scaled by 1 / inf = 0 and the search ran to its end learning nothing, without a word; in HSDAG's
    unclipped Adam the weights whose squared gradients overflowed stopped moving for good (second moment inf),
    the others moved on, also without a word."""
    problem, budget = make_problem(_big_weights(), tiny_cluster, max_evaluations=30)
    placer = make_placer(name, oom_score_s=1e25, oom_shaping=False, **extra)
    with pytest.raises(PlacebenchError, match=r"gradient norm is (inf|nan), whose square .*too large"):
        placer.place(problem, budget, seed=0)


def _sample(search):
    """One batch of each search's own kind (8 placements, or one Placeto episode)."""
    if isinstance(search, HSDAGSearch):
        return search.episode(reserve=0)
    if isinstance(search, PlacetoSearch):
        return search.episode(1, reserve=0)
    return search.step(8)


@pytest.mark.parametrize("search_cls, placer_cls, extra", [(Seq2SeqSearch, Seq2SeqPlacer, {}), (PostSearch, PostPlacer, {}),
                                                           (HSDAGSearch, HSDAGPlacer, {"dropout": 0.0, "steps": 8}),
                                                           (PlacetoSearch, PlacetoPlacer, {})])
def test_the_seed_sets_the_sampling_stream_not_only_the_weights(search_cls, placer_cls, extra, branchy, k80x2,
                                                                 make_problem, monkeypatch):
    """Two searches with the same weights (and Placeto's start) but seeds 0 and 1 sample different placements;
    a sampling generator seeded with a constant would draw the same ones for every seed."""
    sampled: dict[int, list] = {}
    inner = RewardEvaluator.__call__

    def spy(self, gd):
        sampled.setdefault(id(self), []).append(np.array(gd).tolist())
        return inner(self, gd)

    monkeypatch.setattr(RewardEvaluator, "__call__", spy)
    params = {**placer_cls.defaults, "grouping": "colocation", "max_groups": 64, **extra}
    a, b = (search_cls(make_problem(branchy, k80x2, max_evaluations=100)[0], params, seed=s) for s in (0, 1))
    if hasattr(a, "policy") and not isinstance(a, PostSearch):
        b.policy.load_state_dict(a.policy.state_dict())
    if isinstance(a, PlacetoSearch):
        b.initial = a.initial.copy()
    assert _sample(a) and _sample(b)
    assert sampled[id(a.rollouts)] != sampled[id(b.rollouts)]


@pytest.mark.parametrize("name", ["seq2seq", "post", "placeto", "hsdag"])
def test_a_cluster_without_a_kind_an_op_needs_is_an_error_naming_that_op(name, train2, make_problem):
    """train2's loss runs only on a GPU: on CPUs alone every learned placer raises `PlacementError` before any
    evaluation (the runner's status `error`, as for the classical placers), naming the loss, not the first op
    of its group (l1.fwd, which allows any kind)."""
    cpus = Cluster("two_cpus", tuple(Device(f"cpu:{i}", "cpu", 1e11, 1e11, 10**10, 1e-5) for i in range(2)),
                   (Link(("cpu:0", "cpu:1"), 1e10, 1e-5),))
    problem, budget = make_problem(train2, cpus, max_evaluations=10)
    with pytest.raises(PlacementError, match=r"op 'loss' allows only gpu device kinds, and cluster 'two_cpus' has none"):
        make_placer(name).place(problem, budget, seed=0)
    assert problem.evaluator.evaluations_used == 0


# -- mutation round: budget and bookkeeping no test pinned ----------------------------------------------


def test_default_group_cap_is_at_most_256(make_problem):
    """max_groups None on 13 devices: min(256, 20 x 13 = 260) = 256 groups for a chain of 300 ops."""
    devs = tuple(Device(f"gpu:{i}", "gpu", 1e12, 1e11, 10**10, 1e-5) for i in range(13))
    links = tuple(Link((a.name, b.name), 1e10, 1e-5) for i, a in enumerate(devs) for b in devs[i + 1 :])
    problem, _ = make_problem(chain_graph(300), Cluster("thirteen", devs, links))
    grouping, _, _ = grouped_problem(problem, params(max_groups=None))
    assert grouping.num_groups == 256


def test_group_parameters_are_checked_at_construction():
    with pytest.raises(PlacebenchError, match="post: max_groups must be None or an integer >= 1, got True"):
        PostPlacer(max_groups=True)  # a bool is no group count (True would be 1 group)
    with pytest.raises(PlacebenchError, match="coarsen"):
        PostPlacer(coarsen="nope")


def test_result_hyperparameters_are_a_copy_of_the_placers(train2, k80x2, make_problem):
    placer = PostPlacer(batch_size=2, ce_interval=2)
    problem, budget = make_problem(train2, k80x2, max_evaluations=3)
    result = placer.place(problem, budget, seed=0)
    result.info["hyperparameters"]["batch_size"] = 99
    assert placer.params["batch_size"] == 2


def test_a_batch_the_budget_refuses_ends_the_search(train2, k80x2, make_problem, monkeypatch):
    """step(k) None (the evaluator refused the batch for time): no further batch is tried, although the
    allowance is still above 0 (it was asked again and again, evaluating nothing)."""
    calls = []

    def refused(self, k):
        calls.append(k)
        if len(calls) > 3:
            raise AssertionError("step asked again after a refused batch")
        return None

    monkeypatch.setattr(PostSearch, "step", refused)
    problem, budget = make_problem(train2, k80x2, max_evaluations=20)
    result = PostPlacer(batch_size=8).place(problem, budget, seed=0)
    assert calls == [8] and result.info["final"] == "greedy" and result.evaluations == 1


def test_the_last_evaluation_before_the_reserve_is_sampled_and_threads_apply_inside(train2, k80x2, make_problem,
                                                                                    monkeypatch):
    """10 evaluations, batches of 8, one kept back: batches of 8 and 1, then the greedy placement. The search
    runs at the placer's `threads` (3), the caller's count before and after."""
    seen = []
    inner = PostSearch.step

    def spy(self, k):
        seen.append((k, torch.get_num_threads()))
        return inner(self, k)

    monkeypatch.setattr(PostSearch, "step", spy)
    before = torch.get_num_threads()
    problem, budget = make_problem(train2, k80x2, max_evaluations=10)
    result = PostPlacer(batch_size=8, ce_interval=16, threads=3).place(problem, budget, seed=0)
    assert seen == [(8, 3), (1, 3)] and result.evaluations == 10 and torch.get_num_threads() == before
