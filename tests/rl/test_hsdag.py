"""HSDAG: chain merging, dominant-edge clustering by hand and against a reference, the parser's levels, the
episode's bookkeeping and its update."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rl.grouping import chain_grouping, make_grouping
from rl.hsdag import HSDAGPlacer, HSDAGSearch, Parser, dominant_clusters, episode_return
from rl.nets import masked_categorical
from suite import Op, OpGraph
from suite.errors import PlacebenchError


def test_chain_grouping_of_branchy(branchy):
    # in -> {a1, b1, c1} (three consumers: no merge); a1 -> a2 and b1 -> b2 are chains; c1 -> join has two
    # other inputs (no merge); join -> out is a chain.
    names = [op.name for op in branchy.ops]
    g = chain_grouping(branchy)
    assert dict(zip(names, g.assignment.tolist(), strict=True)) == {
        "in": 0, "a1": 1, "a2": 1, "b1": 2, "b2": 2, "c1": 3, "join": 4, "out": 4}


def test_chain_grouping_keeps_colocation_and_refuses_kind_conflicts(train2):
    # train2's colocation groups: {data}, {l0.*}, {l1.*}, {loss}. data (cpu only) -> l0.fwd is a chain
    # edge (data has one consumer, l0.fwd one input) and l0 allows cpu: merged. l1.fwd -> loss (gpu only):
    # l1.fwd has two consumers (loss, l1.bwd), so no chain; loss -> l1.bwd: l1.bwd has two inputs.
    g = chain_grouping(train2)
    names = [op.name for op in train2.ops]
    groups = dict(zip(names, g.assignment.tolist(), strict=True))
    assert groups["data"] == groups["l0.fwd"] == groups["l0.bwd"] == groups["l0.upd"]
    assert len({groups["data"], groups["l1.fwd"], groups["loss"]}) == 3
    ops = [Op("a", "x", allowed_kinds=("cpu",)), Op("b", "x", allowed_kinds=("gpu",)), Op("c", "x")]
    chain = OpGraph.build("conflict", ops, [("a", "b"), ("b", "c")])
    assert chain_grouping(chain).assignment.tolist() == [0, 1, 1]
    assert make_grouping(chain, "chain", None).num_groups == 2


def _path_scores(values: dict[tuple[int, int], float], n: int) -> np.ndarray:
    s = np.zeros((n, n))
    for (u, v), x in values.items():
        s[u, v] = s[v, u] = x
    return s


def test_dominant_clusters_by_hand():
    # path 0 - 1 - 2 - 3, scores 0.9, 0.5, 0.8: 0 and 1 keep each other, 2 and 3 keep each other
    adj = np.zeros((4, 4), dtype=bool)
    for u, v in [(0, 1), (1, 2), (2, 3)]:
        adj[u, v] = adj[v, u] = True
    s = _path_scores({(0, 1): 0.9, (1, 2): 0.5, (2, 3): 0.8}, 4)
    assert dominant_clusters(s, adj).tolist() == [0, 0, 1, 1]
    # self-loops: 2 and 3 score themselves highest and stay alone
    s2 = s.copy()
    np.fill_diagonal(s2, [0.1, 0.1, 0.95, 0.99])
    assert dominant_clusters(s2, adj | np.eye(4, dtype=bool)).tolist() == [0, 0, 1, 2]
    # 1's best edge is to 2 (0.9): 0 keeps 1, 1 keeps 2, 2 keeps 1, 3 keeps 2: one cluster
    s3 = _path_scores({(0, 1): 0.5, (1, 2): 0.9, (2, 3): 0.8}, 4)
    assert dominant_clusters(s3, adj).tolist() == [0, 0, 0, 0]
    # an edge that is not a candidate is never kept; a node without candidates stays alone
    cand = adj.copy()
    cand[1, 2] = cand[2, 1] = False
    assert dominant_clusters(s3, cand).tolist() == [0, 0, 1, 1]
    cand[2, 3] = cand[3, 2] = False
    assert dominant_clusters(s3, cand).tolist() == [0, 0, 1, 2]
    # ties go to the lowest index: 1 has 0.5 to both 0 and 2 and keeps 0; 2 keeps 3 (0.7)
    s4 = _path_scores({(0, 1): 0.5, (1, 2): 0.5, (2, 3): 0.7}, 4)
    assert dominant_clusters(s4, adj).tolist() == [0, 0, 1, 1]


def _reference_clusters(scores: np.ndarray, candidate: np.ndarray) -> list[frozenset[int]]:
    """Kept edges by a plain loop, components by graph search."""
    n = len(scores)
    kept = []
    for u in range(n):
        best, arg = -1.0, u
        for v in range(n):
            if candidate[u, v] and scores[u, v] > best:
                best, arg = scores[u, v], v
        kept.append((u, arg))
    nbrs: list[set[int]] = [set() for _ in range(n)]
    for u, v in kept:
        nbrs[u].add(v)
        nbrs[v].add(u)
    seen, out = set(), []
    for u in range(n):
        if u in seen:
            continue
        comp, stack = set(), [u]
        while stack:
            x = stack.pop()
            if x not in comp:
                comp.add(x)
                stack.extend(nbrs[x] - comp)
        seen |= comp
        out.append(frozenset(comp))
    return out


@settings(max_examples=80, deadline=None)
@given(n=st.integers(1, 12), data=st.data())
def test_dominant_clusters_match_reference(n, data):
    pairs = data.draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=3 * n))
    adj = np.zeros((n, n), dtype=bool)
    for u, v in pairs:
        adj[u, v] = adj[v, u] = True
    if data.draw(st.booleans()):
        adj |= np.eye(n, dtype=bool)
    raw = data.draw(st.lists(st.integers(0, 20), min_size=n * n, max_size=n * n))
    s = np.array(raw, dtype=np.float64).reshape(n, n) / 20
    s = np.triu(s) + np.triu(s, 1).T  # symmetric, with ties
    labels = dominant_clusters(s, adj)
    got = [frozenset(np.flatnonzero(labels == c).tolist()) for c in range(labels.max() + 1)]
    assert got == _reference_clusters(s, adj)  # same clusters, numbered by first node


def _parser(adj, mask_ids, num_features=5, **kw):
    torch.manual_seed(0)
    return Parser(num_features, adj, np.asarray(mask_ids), hidden=16, dropout=0.0, **kw)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(2, 14), seed=st.integers(0, 10**6), self_loops=st.booleans(), max_levels=st.integers(0, 3))
def test_parser_clusters_are_connected_and_never_mix_devices(n, seed, self_loops, max_levels):
    rng = np.random.default_rng(seed)
    adj = rng.random((n, n)) < 0.3
    adj = np.triu(adj, 1)
    adj = adj | adj.T
    mask_ids = rng.integers(0, 2, size=n)
    p = _parser(adj, mask_ids, self_loops=self_loops, max_levels=max_levels)
    with torch.no_grad():
        emb, cluster_of, levels = p(torch.as_tensor(rng.random((n, 5)), dtype=torch.float32))
    C = len(emb)
    assert emb.shape == (C, 5) and sorted(set(cluster_of.tolist())) == list(range(C))
    assert max_levels == 0 or levels <= max_levels
    assert (levels == 0) == (C == n)
    for c in range(C):
        members = np.flatnonzero(cluster_of == c)
        assert len(set(mask_ids[members].tolist())) == 1  # one device mask per cluster
        reached, frontier = {int(members[0])}, [int(members[0])]  # connected inside the cluster
        while frontier:
            u = frontier.pop()
            for v in np.flatnonzero(adj[u] & (cluster_of == c)).tolist():
                if v not in reached:
                    reached.add(v)
                    frontier.append(v)
        assert reached == set(members.tolist())


def test_parser_without_self_loops_collapses_a_connected_graph():
    # the authors' configuration: every node keeps an edge to another node, levels repeat until one remains
    n = 10
    adj = np.zeros((n, n), dtype=bool)
    for u in range(n - 1):
        adj[u, u + 1] = adj[u + 1, u] = True
    with torch.no_grad():
        emb, cluster_of, levels = _parser(adj, np.zeros(n), self_loops=False)(torch.rand(n, 5))
    assert len(emb) == 1 and set(cluster_of.tolist()) == {0} and levels >= 1
    with torch.no_grad():
        emb, _, levels = _parser(adj, np.zeros(n), self_loops=False, max_levels=1)(torch.rand(n, 5))
    assert levels == 1 and len(emb) <= n // 2  # one level: every node is paired at least


def test_episode_return():
    assert episode_return(np.array([1.0, 2.0, 3.0]), 0.5) == 3.0 + 2.0 * 0.5 + 1.0 * 0.25
    assert episode_return(np.array([2.0]), 0.95) == 2.0


def _search(problem, **params):
    return HSDAGSearch(problem, {**HSDAGPlacer.defaults, **params}, seed=0)


def test_episode_spends_its_steps_and_places_clusters_whole(train2, k80x2, make_problem):
    problem, _ = make_problem(train2, k80x2, max_evaluations=23)
    s = _search(problem, steps=10, grouping="colocation")
    assert s.episode(reserve=1) and problem.evaluator.evaluations_used == 10
    assert s.episode(reserve=1) and problem.evaluator.evaluations_used == 20
    assert s.episode(reserve=1) and problem.evaluator.evaluations_used == 22  # a short last episode, one kept back
    assert not s.episode(reserve=1) and problem.evaluator.evaluations_used == 22
    assert s.episodes == s.updates == 3 and len(s.clusters) == 22
    mask = s.mask.numpy()
    for gd in [s.greedy(), s.rollouts.best_group_devices]:
        assert mask[np.arange(len(gd)), gd].all()  # cpu-only and gpu-only groups where they may go


def test_episode_states_do_not_depend_on_the_sampled_devices(branchy, k80x2, make_problem):
    # what lets an episode's placements be evaluated in one batch
    runs = []
    for sampling_seed in (1, 2):
        problem, _ = make_problem(branchy, k80x2, max_evaluations=50)
        s = _search(problem, steps=6, grouping="colocation", dropout=0.0, max_levels=1)
        s.generator.manual_seed(sampling_seed)
        s.episode(reserve=0)
        runs.append((s.clusters, s.rollouts.best_group_devices.tolist()))
    assert runs[0][0] == runs[1][0]
    assert runs[0][1] != runs[1][1]  # the devices did differ


def test_update_makes_the_sampled_placement_more_likely(branchy, k80x2, make_problem):
    problem, _ = make_problem(branchy, k80x2, max_evaluations=50)
    s = _search(problem, steps=1, grouping="colocation", dropout=0.0, max_levels=1, lr=1e-4)

    def policy_at_start():
        s.policy.eval()
        with torch.no_grad():
            logits, _, cluster_of = s.policy(s.x0)
        return logits, cluster_of

    before, clusters = policy_at_start()
    s.episode(reserve=0)  # reward 1 / score > 0 and no baseline: the sampled devices gain probability
    after, clusters_after = policy_at_start()
    assert clusters_after.tolist() == clusters.tolist()
    first = np.unique(clusters, return_index=True)[1]
    actions = torch.as_tensor(s.rollouts.best_group_devices[first])
    mask = s._cluster_mask(clusters)
    lp_before = masked_categorical(before, mask, actions=actions)[1].sum()
    lp_after = masked_categorical(after, mask, actions=actions)[1].sum()
    assert lp_after > lp_before


def test_parameter_errors():
    with pytest.raises(PlacebenchError, match="baseline"):
        HSDAGPlacer(baseline="mean")
    with pytest.raises(PlacebenchError, match="grouping"):
        HSDAGPlacer(grouping="nope")
    with pytest.raises(PlacebenchError, match=r"steps=0: must be in \[1, 100000\]"):
        HSDAGPlacer(steps=0)
    with pytest.raises(PlacebenchError, match="max_groups"):
        HSDAGPlacer(max_groups=0)
    with pytest.raises(PlacebenchError, match="max_groups"):
        HSDAGPlacer(max_groups="all")


def test_max_groups_none_leaves_the_chain_merging_uncapped(branchy, k80x2, make_problem):
    """max_groups=None, "no cap" as its comment says, is taken (it was refused as not an integer): the
    search places the chain grouping's 5 groups of branchy; a cap of 2 merges them to 2."""
    assert HSDAGPlacer(max_groups=None).params["max_groups"] is None
    for cap, groups in ((None, 5), (2, 2)):
        problem, budget = make_problem(branchy, k80x2, max_evaluations=3)
        assert HSDAGPlacer(max_groups=cap, steps=2).place(problem, budget, seed=0).info["groups"] == groups


def test_the_node_features_hold_the_evaluators_profiled_times(branchy, k80x2):
    """The cost columns of HSDAG's node features are the times the evaluator scores with (its profiles),
    not the analytic estimate: a1 measured at 3 s on every K80 shows in them."""
    from rl.features import cost_features
    from suite.costmodel import Profile
    from suite.evaluator import Evaluator
    from suite.methodology import Budget
    from suite.placer import Problem

    prof = Profile("branchy", "gpu", {"a1": 3.0})
    problem = Problem(branchy, k80x2, Evaluator(branchy, k80x2, Budget(50, 60), profiles=[prof]))
    search = _search(problem, grouping="colocation")
    D = k80x2.num_devices
    measured = cost_features(branchy, k80x2, search.grouping, [prof])
    assert not np.array_equal(measured, cost_features(branchy, k80x2, search.grouping))
    np.testing.assert_array_equal(search.x0[:, -D:].numpy(), measured)


def test_max_groups_none_is_no_cap_on_a_graph_with_more_chain_groups_than_the_learned_default(two_gpus,
                                                                                               make_problem):
    """max_groups=None is documented as "no cap": a fan of 60 branches (62 chain groups) on 2 devices keeps
    its 62 groups; it was capped at the batched placers' min(256, 20 x devices) = 40 (30 groups)."""
    n = 60
    ops = [Op("in", "input", flops=1e6, output_bytes=1000), Op("join", "add", flops=1e6, output_bytes=4)]
    ops += [Op(f"b{i}", "matmul", flops=1e9, output_bytes=1000) for i in range(n)]
    edges = [("in", f"b{i}") for i in range(n)] + [(f"b{i}", "join") for i in range(n)]
    fan = OpGraph.build("fan", ops, edges)
    assert make_grouping(fan, "chain", None).num_groups == n + 2
    problem, budget = make_problem(fan, two_gpus, max_evaluations=3)
    assert HSDAGPlacer(max_groups=None, steps=2).place(problem, budget, seed=0).info["groups"] == n + 2
