"""Audit additions for rl.placeto: message passing leaves nodes without neighbours at their own embedding, the
states an episode keeps for its update, the per-step baseline, discount and entropy bonus of the update, a
batch of two episodes scored row by row, the "best" start, the evaluation kept for the greedy episode, the
default group cap, and the device mask in sampling and in the update."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import rl.placeto
from rl.grouping import colocation_grouping
from rl.nets import masked_categorical
from rl.placeto import PlacetoPlacer, PlacetoPolicy, PlacetoSearch, group_graph
from rl.reward import RewardEvaluator, reward_of
from rl.trainers import discounted_returns
from suite import Op, OpGraph
from suite.costmodel import cost_matrix


def _search(problem, seed=0, **kw):
    return PlacetoSearch(problem, {**PlacetoPlacer.defaults, "grouping": "colocation", **kw}, seed=seed)


def test_message_passing_leaves_a_node_without_parents_or_children_at_its_own_embedding(branchy, k80x2):
    """x <- [has neighbours] * Agg(x) + x0: the source "in" keeps x0 going down, the sink "out" going up, even
    when the aggregators' biases make Agg of an empty set non-zero."""
    gg = group_graph(branchy, colocation_grouping(branchy), np.asarray(cost_matrix(branchy, k80x2)))
    torch.manual_seed(0)
    policy = PlacetoPolicy(9, k80x2.num_devices, gg, rounds=3)
    with torch.no_grad():
        for agg in (policy.down, policy.up):
            agg.g[-1].bias.fill_(0.5)
        x0 = policy.node(torch.rand(1, 8, 9))
        down = policy._propagate(policy.down, x0, policy.src, policy.dst, policy.has_parents)
        up = policy._propagate(policy.up, x0, policy.dst, policy.src, policy.has_children)
    assert torch.equal(down[0, 0], x0[0, 0]) and not torch.equal(down[0, 7], x0[0, 7])
    assert torch.equal(up[0, 7], x0[0, 7]) and not torch.equal(up[0, 0], x0[0, 0])


def test_episode_keeps_each_steps_state_before_its_action(branchy, k80x2, make_problem, monkeypatch):
    evaluated = []
    inner = RewardEvaluator.__call__

    def spy(self, gd):
        evaluated.append(np.array(gd, copy=True))
        return inner(self, gd)

    monkeypatch.setattr(RewardEvaluator, "__call__", spy)
    problem, _ = make_problem(branchy, k80x2, max_evaluations=100)
    search = _search(problem, seed=1)
    seen = {}
    search._update = lambda states, actions, rewards, G: seen.update(states=states, actions=actions)
    assert search.episode(1, reserve=0)
    G = search.graph.num_groups
    before = [evaluated[0][0]] + [e[0] for e in evaluated[1:-1]]  # the placement before step t
    for t, (placement, visits, starts) in enumerate(seen["states"]):
        assert placement[0].tolist() == before[t].tolist()
        assert visits[0].tolist() == [1.0] * t + [0.0] * (G - t)  # groups 0..t-1 visited once
        np.testing.assert_array_equal(starts, search.features.group_starts(placement.numpy()))
        assert evaluated[1 + t][0][t] == int(seen["actions"][0, t])


def _equal_episodes(search, G):
    start = torch.as_tensor(search.initial)
    both = torch.stack([start, start])
    states = [(both, torch.zeros(2, G), search.features.group_starts(both.numpy()))] * G
    return states, torch.zeros(2, G, dtype=torch.long)


def test_update_with_equal_returns_changes_nothing(branchy, k80x2, make_problem):
    """Two episodes with the same returns, baseline over this batch only: every advantage is 0, and with no
    entropy bonus the update leaves every weight where it was. So does a second batch with other returns: the
    baseline includes the batch being updated (a baseline of the earlier batches alone would move them)."""
    problem, _ = make_problem(branchy, k80x2, max_evaluations=10)
    search = _search(problem, baseline_episodes=1, entropy_coef=0.0)
    G = search.graph.num_groups
    states, actions = _equal_episodes(search, G)
    rewards = np.zeros((2, G))
    rewards[:, 0] = 1.0
    before = [p.detach().clone() for p in search.policy.parameters()]
    search._update(states, actions, rewards, G)
    assert all(torch.equal(p, b) for p, b in zip(search.policy.parameters(), before, strict=True))
    search._update(states, actions, 3.0 * rewards, G)
    assert all(torch.equal(p, b) for p, b in zip(search.policy.parameters(), before, strict=True))


def test_entropy_bonus_spreads_the_policy(branchy, k80x2, make_problem):
    problem, _ = make_problem(branchy, k80x2, max_evaluations=10)
    search = _search(problem, baseline_episodes=1, entropy_coef=1.0, lr=1e-4)
    G = search.graph.num_groups
    states, actions = _equal_episodes(search, G)
    current = torch.as_tensor(search.order)

    def entropy():
        with torch.no_grad():
            x = search.features(states[0][0][:1].expand(G, -1), states[0][1][:1].expand(G, -1), current,
                                np.repeat(states[0][2][:1], G, axis=0))
            return masked_categorical(search.policy(x, current), search.mask[current], actions=current * 0)[2].sum()

    before = entropy()
    search._update(states, actions, np.zeros((2, G)), G)  # zero advantages: only the entropy bonus acts
    assert entropy() > before


def test_update_discounts_the_returns(branchy, k80x2, make_problem):
    problem, _ = make_problem(branchy, k80x2, max_evaluations=10)
    search = _search(problem, discount=0.5)
    G = search.graph.num_groups
    states, actions = _equal_episodes(search, G)
    rewards = np.arange(2 * G, dtype=float).reshape(2, G)
    search._update(states, actions, rewards, G)
    np.testing.assert_allclose(search.history[-1], discounted_returns(rewards, 0.5).mean(axis=0), rtol=1e-12)


def test_a_batch_of_two_episodes_is_scored_row_by_row(branchy, k80x2, make_problem, monkeypatch):
    """The update's loss equals -(1/k) sum over episodes b and steps t of A[b, t] log pi(a[b, t] | state[b, t]),
    each state scored on its own (advantages: returns minus the per-step batch mean, not scaled)."""
    problem, _ = make_problem(branchy, k80x2, max_evaluations=100)
    search = _search(problem, seed=3, entropy_coef=0.0, normalize_advantages=False, initial="random_each")
    seen = {}
    search._update = lambda states, actions, rewards, G: seen.update(states=states, actions=actions, rewards=rewards)
    assert search.episode(2, reserve=0)
    assert search.episodes == 2
    G = search.graph.num_groups
    returns = discounted_returns(seen["rewards"], 1.0)
    adv = returns - returns.mean(axis=0)
    expected = 0.0
    with torch.no_grad():
        for b in range(2):
            for t, (placement, visits, starts) in enumerate(seen["states"]):
                v = torch.tensor([int(search.order[t])])
                x = search.features(placement[b : b + 1], visits[b : b + 1], v, starts[b : b + 1])
                lp = masked_categorical(search.policy(x, v), search.mask[v], actions=seen["actions"][b, t : t + 1])[1]
                expected -= adv[b, t] * lp.item() / 2
    losses = []
    real = rl.placeto.apply_gradients
    monkeypatch.setattr(rl.placeto, "apply_gradients", lambda opt, loss, clip: losses.append(loss.item()) or
                        real(opt, loss, clip))
    PlacetoSearch._update(search, seen["states"], seen["actions"], seen["rewards"], G)
    assert abs(expected) > 1e-6
    assert losses == [pytest.approx(expected, rel=1e-4, abs=1e-7)]


def test_best_start_is_the_best_placement_so_far(branchy, k80x2, make_problem):
    problem, _ = make_problem(branchy, k80x2, max_evaluations=100)
    search = _search(problem, initial="best")
    assert search.episode(1, reserve=0)
    used = problem.evaluator.evaluations_used
    placements, rewards = search._start(2, reserve=0)
    best = search.rollouts.best_group_devices
    assert placements.tolist() == [best.tolist()] * 2
    assert rewards.tolist() == [reward_of(search.rollouts.best_score_s, "neg")] * 2
    assert problem.evaluator.evaluations_used == used  # known already: not evaluated again


def test_an_episode_cut_short_leaves_the_evaluation_for_the_greedy_episode(train2, k80x2, make_problem):
    # 4 groups: the start, 7 episodes of 4 steps = 29; the 8th episode stops before its first step, and the
    # 30th evaluation is the greedy episode's
    problem, budget = make_problem(train2, k80x2, max_evaluations=30)
    result = PlacetoPlacer(grouping="colocation").place(problem, budget, seed=0)
    assert result.info["groups"] == 4 and result.info["episodes"] == 7
    assert result.evaluations == 30 and result.info["greedy_score_s"] is not None


def test_default_group_cap_is_four_per_device(k80x2, make_problem):
    ops = [Op(f"o{i}", "matmul", flops=1e9 * (1 + i % 3), output_bytes=1000) for i in range(20)]
    chain = OpGraph.build("chain20", ops, [(f"o{i}", f"o{i + 1}") for i in range(19)])
    problem, budget = make_problem(chain, k80x2, max_evaluations=3)
    result = PlacetoPlacer(grouping="colocation").place(problem, budget, seed=0)
    assert result.info["groups"] == 4 * k80x2.num_devices


def test_episodes_sample_and_score_only_the_devices_a_group_may_use(train2, k80x2, make_problem, evaluated_rows):
    """train2's data group may only use cpu:0 and its loss group only the GPUs: every placement an episode
    evaluates obeys that, and the update's log-probabilities are over the allowed devices (the data group's
    forced choice has log-probability 0, so an advantage at its step alone gives every weight a zero gradient)."""
    evaluated = evaluated_rows
    problem, _ = make_problem(train2, k80x2, max_evaluations=100)
    search = _search(problem, seed=2, entropy_coef=0.0, discount=0.0)
    assert search.mask.numpy().tolist() == [[True, False, False], [True, True, True], [True, True, True],
                                            [False, True, True]]
    for _ in range(3):
        assert search.episode(1, reserve=1)
    assert len(evaluated) == 1 + 3 * 4
    assert all(g[0] == 0 and g[3] in (1, 2) for g in evaluated)

    placement = torch.tensor([[0, 1, 2, 1]])
    visits = torch.zeros(1, 4)
    states = []
    for t in range(4):
        states.append((placement.clone(), visits.clone(), search.features.group_starts(placement.numpy())))
        visits[0, t] += 1
    search.history.clear()
    search.history.append(np.zeros(4))
    rewards = np.array([[1.0, 0.0, 0.0, 0.0]])  # discount 0: the advantage is 0.5 at the data group's step only
    search._update(states, placement, rewards, 4)
    assert all(p.grad is None or not p.grad.any() for p in search.policy.parameters())


@pytest.mark.parametrize("initial", ["best", "random"])
def test_greedy_episode_starts_where_the_episodes_start(initial, branchy, k80x2, make_problem):
    """initial "best": the greedy episode starts from the best placement so far; else from the initial one."""
    problem, _ = make_problem(branchy, k80x2, max_evaluations=100)
    search = _search(problem, initial=initial)
    for _ in range(3):
        assert search.episode(1, reserve=0)
    best = search.rollouts.best_group_devices
    assert best.tolist() != search.initial.tolist()  # the premise: the two starts differ
    seen = []
    features = search.features

    def spy(placement, *args):
        seen.append(placement[0].tolist())
        return features(placement, *args)

    search.features = spy
    search.greedy()
    assert seen[0] == (best if initial == "best" else search.initial).tolist()
