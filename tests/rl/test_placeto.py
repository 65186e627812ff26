"""The Placeto placer: its group graph and reachability by hand, the label independence of its embedding,
its episodes (one group changed per step, evaluations counted), its update, and its parameters (the
contract it shares with seq2seq and Post is in test_learned.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rl.grouping import Grouping, colocation_grouping
from rl.placeto import (
    GroupGraph,
    PlacetoPlacer,
    PlacetoPolicy,
    PlacetoSearch,
    StateFeatures,
    group_graph,
    group_start_times,
    reachable,
)
from rl.reward import RewardEvaluator
from suite.costmodel import cost_matrix
from suite.errors import PlacebenchError
from suite.methodology import Budget
from suite.placer import Problem, make_placer, placer_names
from suite.simulator import SimInputs, reference


def closure(n: int, edges: list[tuple[int, int]]) -> np.ndarray:
    """Reference: Floyd-Warshall on booleans."""
    r = np.zeros((n, n), dtype=bool)
    for u, v in edges:
        r[u, v] = True
    for k in range(n):
        r |= r[:, k : k + 1] & r[k : k + 1, :]
    return r


def test_reachable_by_hand():
    # 0 -> 1 -> 2, 3 alone, 4 <-> 5 (a cycle: each reaches the other and itself)
    src, dst = np.array([0, 1, 4, 5]), np.array([1, 2, 5, 4])
    r = reachable(6, src, dst)
    expected = np.zeros((6, 6), dtype=bool)
    expected[0, [1, 2]] = expected[1, 2] = True
    expected[4, [4, 5]] = expected[5, [4, 5]] = True
    assert r.tolist() == expected.tolist()


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 12).flatmap(lambda n: st.tuples(
    st.just(n), st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=30))))
def test_reachable_equals_floyd_warshall(case):
    n, edges = case
    src = np.array([u for u, _ in edges], dtype=np.int64)
    dst = np.array([v for _, v in edges], dtype=np.int64)
    assert reachable(n, src, dst).tolist() == closure(n, edges).tolist()


def test_group_graph_of_branchy_by_hand(branchy, k80x2):
    # ops (= groups under the colocation grouping): in a1 a2 b1 b2 c1 join out
    grouping = colocation_grouping(branchy)
    cost = np.asarray(cost_matrix(branchy, k80x2))
    gg = group_graph(branchy, grouping, cost)
    edges = sorted(zip(gg.src.tolist(), gg.dst.tolist(), strict=True))
    assert edges == [(0, 1), (0, 3), (0, 5), (1, 2), (2, 6), (3, 4), (4, 6), (5, 6), (6, 7)]
    a1 = 1
    assert np.flatnonzero(gg.ancestors[a1]).tolist() == [0]
    assert np.flatnonzero(gg.descendants[a1]).tolist() == [2, 6, 7]
    assert np.flatnonzero(gg.parallel[a1]).tolist() == [3, 4, 5]
    assert np.flatnonzero(gg.ancestors[7]).tolist() == [0, 1, 2, 3, 4, 5, 6]
    np.testing.assert_array_equal(gg.cost_s, cost)  # one op per group
    assert gg.output_bytes[1] == 40_000_000


def permuted(gg: GroupGraph, perm: np.ndarray) -> GroupGraph:
    """The same graph with group g renamed perm[g]."""
    inv = np.argsort(perm)
    return GroupGraph(src=perm[gg.src], dst=perm[gg.dst], ancestors=gg.ancestors[inv][:, inv],
                      descendants=gg.descendants[inv][:, inv], cost_s=gg.cost_s[inv],
                      output_bytes=gg.output_bytes[inv], param_bytes=gg.param_bytes[inv])


def test_embedding_does_not_depend_on_group_labels(branchy, k80x2):
    """Placeto's point: the policy reads structure, not indices. Renaming the groups (and moving their
    features with them) leaves every logit unchanged."""
    gg = group_graph(branchy, colocation_grouping(branchy), np.asarray(cost_matrix(branchy, k80x2)))
    G, D = gg.num_groups, k80x2.num_devices
    perm = np.array([3, 7, 0, 5, 1, 6, 2, 4])
    gp = permuted(gg, perm)
    torch.manual_seed(0)
    policy = PlacetoPolicy(9, D, gg)
    other = PlacetoPolicy(9, D, gp)
    weights = {k: v for k, v in policy.state_dict().items() if k not in dict(policy.named_buffers())}
    other.load_state_dict(weights, strict=False)  # same weights; the graph buffers stay the permuted graph's
    x = torch.rand(2, G, 9)
    current = torch.tensor([1, 6])
    inv = torch.as_tensor(np.argsort(perm))
    with torch.no_grad():
        a = policy(x, current)
        b = other(x[:, inv], torch.as_tensor(perm)[current])
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_state_features_by_hand(branchy, k80x2):
    gg = group_graph(branchy, colocation_grouping(branchy), np.asarray(cost_matrix(branchy, k80x2)))
    seen = []

    def starts(gd):  # a stand-in schedule: group g starts at g seconds
        seen.append(gd.tolist())
        return np.tile(np.arange(8.0), (len(gd), 1))

    feats = StateFeatures(gg, k80x2.num_devices, starts)
    placement = torch.tensor([[0, 1, 1, 2, 2, 1, 0, 0]])
    visits = torch.tensor([[1.0, 1, 0, 0, 0, 0, 0, 0]])
    x = feats(placement, visits, torch.tensor([2]))
    D = k80x2.num_devices
    assert x.shape == (1, 8, feats.width) and feats.width == 6 + 2 * D
    assert seen == [[[0, 1, 1, 2, 2, 1, 0, 0]]]  # the schedule of the state's own placement
    given = feats(placement, visits, torch.tensor([2]), np.arange(8.0)[None])  # start times the caller has
    assert torch.equal(given, x) and len(seen) == 1  # used as they are, not simulated again
    own = gg.cost_s[np.arange(8), placement[0].numpy()]
    np.testing.assert_allclose(x[0, :, 0].numpy(), own / own.max(), rtol=1e-6)
    np.testing.assert_allclose(x[0, :, 1].numpy(), np.arange(8) / 7, rtol=1e-6)  # start over the latest start
    np.testing.assert_allclose(x[0, :, 2].numpy(), gg.output_bytes / gg.output_bytes.max(), rtol=1e-6)
    assert x[0, :, 4 + D].tolist() == visits[0].tolist()  # visits, then the current flag, then the one-hot
    assert x[0, :, 5 + D].tolist() == [0, 0, 1, 0, 0, 0, 0, 0]
    assert x[0, :, 6 + D :].argmax(dim=1).tolist() == placement[0].tolist()


def test_group_start_times_are_the_first_start_of_each_group_in_the_schedule(branchy, k80x2, make_problem):
    # groups {in, a1, b1}, {a2, b2}, {c1, join, out} on branchy (in a1 a2 b1 b2 c1 join out)
    grouping = Grouping.from_labels([0, 0, 1, 0, 1, 2, 2, 2])
    problem, _ = make_problem(branchy, k80x2)
    starts = group_start_times(problem, grouping)
    gd = np.array([[0, 1, 2], [2, 2, 2], [1, 0, 1]])
    got = starts(gd)
    inputs = SimInputs.build(branchy, k80x2)
    for row, g in zip(got, gd, strict=True):
        s = reference.simulate(grouping.expand(g), *inputs.args()).start_s
        assert row.tolist() == [s[[0, 1, 3]].min(), s[[2, 4]].min(), s[[5, 6, 7]].min()]
    assert got[1].tolist() == sorted(got[1].tolist()) and got[1][0] == 0.0  # all on one device: in order


def test_an_episode_changes_one_group_per_step_and_counts_every_evaluation(branchy, k80x2, make_problem,
                                                                          evaluated_rows):
    evaluated = evaluated_rows
    problem, _ = make_problem(branchy, k80x2, max_evaluations=100)
    search = PlacetoSearch(problem, {**PlacetoPlacer.defaults, "grouping": "colocation"}, seed=1)
    for _ in range(2):
        assert search.episode(1, reserve=1)
    G = search.graph.num_groups
    assert len(evaluated) == 1 + 2 * G  # the initial placement once (reused), then one per step
    assert problem.evaluator.evaluations_used == 1 + 2 * G
    for e in range(2):
        prev = evaluated[0]
        for t in range(G):
            now = evaluated[1 + e * G + t]
            assert np.flatnonzero(now != prev).tolist() in ([], [t])  # only group t may change at step t
            prev = now
    assert search.episodes == search.updates == 2


def test_episode_rewards_telescope(branchy, k80x2, make_problem, monkeypatch):
    """A step's reward is the change of R = -score; with discount 1 they sum to R(last) - R(initial)."""
    scores = []
    inner = RewardEvaluator.__call__

    def spy(self, gd):
        r = inner(self, gd)
        scores.extend(r.scores_s)
        return r

    monkeypatch.setattr(RewardEvaluator, "__call__", spy)
    problem, _ = make_problem(branchy, k80x2, max_evaluations=100)
    search = PlacetoSearch(problem, {**PlacetoPlacer.defaults, "grouping": "colocation"}, seed=2)
    seen = {}
    search._update = lambda states, actions, rewards, G: seen.update(rewards=rewards)
    assert search.episode(1, reserve=0)
    np.testing.assert_allclose(seen["rewards"][0], -np.diff(scores), rtol=1e-12)
    assert len(set(scores)) > 1  # the episode did move


def test_update_makes_the_better_episode_more_likely(branchy, k80x2, make_problem):
    problem, _ = make_problem(branchy, k80x2, max_evaluations=10)
    params = {**PlacetoPlacer.defaults, "grouping": "colocation", "baseline_episodes": 1, "entropy_coef": 0.0}
    search = PlacetoSearch(problem, params, seed=0)
    G = search.graph.num_groups
    start = torch.as_tensor(search.initial)
    both = torch.stack([start, start])
    states = [(both, torch.zeros(2, G), search.features.group_starts(both.numpy()))] * G  # as an episode keeps them
    actions = torch.zeros(2, G, dtype=torch.long)
    actions[1, 0] = 1  # the episodes differ in their first action only
    rewards = np.zeros((2, G))
    rewards[0, 0] = 1.0  # the first one was better

    def probs():
        with torch.no_grad():
            x = search.features(states[0][0][:1], states[0][1][:1], torch.tensor([0]))
            return torch.softmax(search.policy(x, torch.tensor([0])), dim=-1)[0]

    before = probs()
    search._update(states, actions, rewards, G)
    after = probs()
    assert after[0] > before[0] and after[1] < before[1]


def test_greedy_uses_no_evaluations(branchy, k80x2, make_problem):
    problem, _ = make_problem(branchy, k80x2, max_evaluations=10)
    search = PlacetoSearch(problem, {**PlacetoPlacer.defaults, "grouping": "colocation"}, seed=0)
    gd = search.greedy()
    assert problem.evaluator.evaluations_used == 0
    assert gd.shape == (search.graph.num_groups,) and search.mask.numpy()[np.arange(len(gd)), gd].all()


@pytest.mark.parametrize("initial", ["random", "random_each", "best"])
def test_initial_modes_spend_the_budget_exactly(initial, train2, k80x2, make_problem):
    problem, budget = make_problem(train2, k80x2, max_evaluations=30)
    result = PlacetoPlacer(initial=initial, grouping="colocation").place(problem, budget, seed=0)
    assert result.evaluations == 30 == len(result.curve)
    G = result.info["groups"]
    starts = {"random": 1, "random_each": result.info["episodes"], "best": 1}[initial]
    # the episodes that ran, their starts, the greedy evaluation, and the steps of an episode cut short
    assert result.info["episodes"] * G + starts + 1 <= 30
    assert result.info["episodes"] == result.info["updates"] >= 1


@pytest.mark.parametrize("initial", ["random", "random_each", "best"])
def test_episodes_side_by_side_spend_the_budget_exactly(initial, branchy, k80x2, make_problem, evaluated_rows):
    """batch_size 4: the last evaluations, fewer than a step's 4, go to that step's first placements. They used
    to be left unspent (30 or 29 of 31 evaluations used)."""
    problem, budget = make_problem(branchy, k80x2, max_evaluations=31)
    result = PlacetoPlacer(initial=initial, grouping="colocation", batch_size=4, rounds=1).place(problem, budget,
                                                                                                   seed=0)
    assert result.evaluations == 31 == len(result.curve) == len(evaluated_rows)


def test_a_diverged_policy_ends_the_search_with_a_clear_error(train2, k80x2, make_problem):
    """At lr 10 (the top of its range) one Adam step makes the message-passing embeddings overflow: the
    next episode's logits are not finite. The search stops there with a message naming the cause, not
    torch's 'probability tensor contains either inf, nan or element < 0'."""
    problem, budget = make_problem(train2, k80x2, max_evaluations=100)
    with pytest.raises(PlacebenchError, match=r"placeto: the policy diverged after update 1: its output is not "
                                              r"finite \(lr 10.0 is too high"):
        PlacetoPlacer(lr=10.0, grouping="colocation").place(problem, budget, seed=0)


def test_registered_and_checked():
    assert "placeto" in placer_names()
    assert make_placer("placeto", rounds=2).params["rounds"] == 2
    with pytest.raises(PlacebenchError, match="initial"):
        PlacetoPlacer(initial="zeros")
    with pytest.raises(PlacebenchError, match="grouping"):
        PlacetoPlacer(grouping="nope")
    with pytest.raises(PlacebenchError, match="discount"):
        PlacetoPlacer(discount=1.5)
    with pytest.raises(PlacebenchError, match="every advantage is zero"):  # the baseline is the episode itself
        PlacetoPlacer(batch_size=1, baseline_episodes=1)
    assert PlacetoPlacer(batch_size=2, baseline_episodes=1).params["baseline_episodes"] == 1  # the batch's mean


def test_episode_matches_the_iterative_gym_environment(branchy, k80x2, make_problem):
    """Placeto's MDP is `placebench/Iterative-v0` with reward "improvement": replaying an episode's actions
    in the environment, from the same start, gives the same step rewards (reward -sqrt(score), no shaping)."""
    from suite.envs import IterativePlacementEnv

    problem, _ = make_problem(branchy, k80x2, max_evaluations=100)
    params = {**PlacetoPlacer.defaults, "grouping": "colocation", "reward": "neg_sqrt", "oom_shaping": False}
    search = PlacetoSearch(problem, params, seed=4)
    seen = {}
    search._update = lambda states, actions, rewards, G: seen.update(actions=actions, rewards=rewards)
    assert search.episode(1, reserve=0)
    env_problem, _ = make_problem(branchy, k80x2, max_evaluations=100)
    env = IterativePlacementEnv(evaluator=env_problem.evaluator, reward="improvement")
    env.reset(seed=0, options={"placement": search.initial})
    replayed = [env.step(int(a))[1] for a in seen["actions"][0]]
    np.testing.assert_allclose(replayed, seen["rewards"][0], rtol=1e-12, atol=1e-15)
    assert np.count_nonzero(seen["rewards"][0]) >= 2


def test_the_search_plans_on_the_evaluators_profiles(branchy, k80x2):
    """With measured times (an evaluator with profiles), Placeto's group costs and simulated start times are
    those times, not the analytic estimate it is not scored on: on every K80, a1 takes 3 s, so a2 starts
    3 s after a1 on the same device."""
    from suite.costmodel import Profile
    from suite.evaluator import Evaluator

    prof = Profile("branchy", "gpu", {"a1": 3.0})
    budget = Budget(50, 60)
    problem = Problem(branchy, k80x2, Evaluator(branchy, k80x2, budget, profiles=[prof]))
    search = PlacetoSearch(problem, {**PlacetoPlacer.defaults, "grouping": "colocation"}, seed=1)
    inputs = SimInputs.build(branchy, k80x2, [prof])
    np.testing.assert_array_equal(search.graph.cost_s, inputs.cost)  # one op per group
    gd = np.array([[1, 1, 1, 1, 1, 1, 1, 1]])
    s = reference.simulate(gd[0], *inputs.args()).start_s
    assert search.features.group_starts(gd)[0].tolist() == s.tolist() and s[2] == s[1] + 3.0
