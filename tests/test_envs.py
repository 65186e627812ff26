"""The Gymnasium environments pass the env checker, count evaluations, and reward as documented."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import suite.envs  # noqa: F401  (registers the environments)
from suite import Op, OpGraph, load_cluster
from suite.costmodel import cost_matrix
from suite.envs import ITERATIVE_ID, ONE_SHOT_ID, IterativePlacementEnv, OneShotPlacementEnv
from suite.errors import BudgetExhausted, PlacebenchError
from suite.evaluator import Evaluator, SimulatorBackend
from suite.methodology import Budget

GFLOP = 1e9


def tiny_training_graph() -> OpGraph:
    """data (cpu only) -> l0 -> l1 -> loss (gpu only) with backward ops colocated with their forward op."""
    ops = [Op("data", "input", flops=1e6, output_bytes=10**6, allowed_kinds=("cpu",))]
    for k in range(2):
        ops.append(Op(f"l{k}", "matmul", flops=50 * GFLOP, output_bytes=2 * 10**6, param_bytes=10**7, group=f"l{k}"))
        ops.append(Op(f"l{k}.bwd", "matmul_grad", flops=100 * GFLOP, output_bytes=2 * 10**6, phase="backward",
                      group=f"l{k}"))
    ops.append(Op("loss", "loss", flops=1e7, output_bytes=4, allowed_kinds=("gpu",)))
    edges = [("data", "l0"), ("l0", "l1"), ("l1", "loss"), ("loss", "l1.bwd"), ("l1.bwd", "l0.bwd"),
             ("l0", "l0.bwd"), ("l1", "l1.bwd")]
    return OpGraph.build("tiny_train", ops, edges)


def evaluator(max_evaluations=1000):
    g, c = tiny_training_graph(), load_cluster("haswell_2k80")
    return Evaluator(g, c, Budget(max_evaluations, 300.0), backend=SimulatorBackend(g, c, engine="reference"))


def test_one_shot_passes_env_checker():
    env = OneShotPlacementEnv(evaluator=evaluator())
    check_env(env.unwrapped, skip_render_check=True)


@pytest.mark.parametrize("reward", ["improvement", "final"])
def test_iterative_passes_env_checker(reward):
    env = IterativePlacementEnv(evaluator=evaluator(), reward=reward)
    check_env(env.unwrapped, skip_render_check=True)


def test_registered_ids_make_environments():
    g, c = tiny_training_graph(), load_cluster("haswell_2k80")
    env = gym.make(ONE_SHOT_ID, workload=g, cluster=c, budget=Budget(5, 60.0))
    assert isinstance(env.unwrapped, OneShotPlacementEnv)
    it = gym.make(ITERATIVE_ID, evaluator=evaluator())
    assert isinstance(it.unwrapped, IterativePlacementEnv)


def test_one_shot_step_is_a_whole_placement():
    ev = evaluator()
    env = OneShotPlacementEnv(evaluator=ev)
    obs, info = env.reset(seed=0)
    # groups (colocation, by first op): data, l0 (+bwd), l1 (+bwd), loss; devices cpu:0, gpu:0, gpu:1
    assert env.action_space.nvec.tolist() == [3, 3, 3, 3]
    assert info["action_mask"].tolist() == [[True, False, False], [True, True, True], [True, True, True],
                                            [False, True, True]]
    assert obs.shape == (4, 5 + 2 * 3) and obs.min() >= 0 and obs.max() <= 1
    _, reward, terminated, truncated, info = env.step(np.array([0, 1, 1, 1]))
    assert terminated and not truncated
    expected = ev.measure([0, 1, 1, 1, 1, 1])  # ops: data, l0, l1, loss, l1.bwd, l0.bwd
    assert info["status"] == "ok" and reward == pytest.approx(-math.sqrt(expected.step_time_s))
    _, bad, _, _, info = env.step(np.array([1, 1, 1, 1]))  # data on a GPU: invalid
    assert info["status"] == "invalid" and bad == pytest.approx(-math.sqrt(2 * ev.failure_score_s))
    assert ev.evaluations_used == 2


def test_iterative_improvement_rewards_telescope():
    ev = evaluator()
    env = IterativePlacementEnv(evaluator=ev, reward="improvement", initial=np.array([0, 0, 0, 1]))
    obs, info = env.reset(seed=0)
    first = -math.sqrt(info["score_s"])
    assert obs["cursor"] == 0 and obs["placement"].tolist() == [0, 0, 0, 1]
    total = 0.0
    for a in [0, 1, 2, 1]:
        obs, r, terminated, _, info = env.step(a)
        total += r
    assert terminated
    assert total == pytest.approx(-math.sqrt(info["score_s"]) - first)
    assert ev.evaluations_used == 5  # the initial placement and one per step
    with pytest.raises(PlacebenchError, match="no episode is running"):
        env.step(0)


def test_iterative_final_reward_evaluates_once():
    """Each episode's last reward is -sqrt(score) of its own complete placement, whatever the episode before
    (a reward taken relative to the previous episode's went unnoticed: the first episode's is the same)."""
    ev, ref = evaluator(), evaluator()
    env = IterativePlacementEnv(evaluator=ev, reward="final")
    for episode, (actions, ops) in enumerate([([0, 1, 2, 1], [0, 1, 2, 1, 2, 1]), ([0, 2, 2, 2], [0, 2, 2, 2, 2, 2])]):
        env.reset(seed=3)
        rewards = [env.step(a)[1] for a in actions]
        assert rewards[:3] == [0.0, 0.0, 0.0]  # groups data, l0 (+bwd), l1 (+bwd), loss: ops as `ops`
        assert rewards[3] == -math.sqrt(ref.score(ref.evaluate(ops)))
        assert ev.evaluations_used == episode + 1


def test_random_initial_placement_respects_masks_and_seed():
    env = IterativePlacementEnv(evaluator=evaluator(), reward="final")
    p1 = env.reset(seed=7)[0]["placement"]
    p2 = env.reset(seed=7)[0]["placement"]
    assert p1.tolist() == p2.tolist()
    assert p1[0] == 0 and p1[3] in (1, 2)


@pytest.mark.parametrize("start", [[7, 7, 7, 7], [0, 1], [0, -1, 1, 1], "best", [[0, 1, 1, 1]], [0.0, 1.9, 1.0, 1.0]])
def test_a_start_placement_out_of_the_space_is_refused(start):
    """From the constructor or from reset's options: the observation must stay in its space."""
    with pytest.raises(PlacebenchError, match="(4 device indices in 0..2|'random' or an array of 4)"):
        IterativePlacementEnv(evaluator=evaluator(), reward="improvement", initial=start)
    env = IterativePlacementEnv(evaluator=evaluator(), reward="improvement")
    with pytest.raises(PlacebenchError, match="reset option 'placement'"):
        env.reset(seed=0, options={"placement": start})
    obs, _ = env.reset(seed=0, options={"placement": [0, 1, 2, 1]})
    assert env.observation_space.contains(obs) and obs["placement"].tolist() == [0, 1, 2, 1]


def test_budget_is_enforced():
    env = OneShotPlacementEnv(evaluator=evaluator(max_evaluations=2))
    env.reset(seed=0)
    env.step(np.array([0, 1, 1, 1]))
    env.step(np.array([0, 1, 1, 1]))
    with pytest.raises(BudgetExhausted):
        env.step(np.array([0, 1, 1, 1]))


def test_custom_groups_must_keep_colocation():
    g, c = tiny_training_graph(), load_cluster("haswell_2k80")
    ev = evaluator()
    # ops in topological order: data, l0, l1, loss, l1.bwd, l0.bwd
    names = [op.name for op in g.ops]
    assert names == ["data", "l0", "l1", "loss", "l1.bwd", "l0.bwd"]
    env = OneShotPlacementEnv(evaluator=ev, groups=[0, 1, 1, 2, 1, 1])  # l0 and l1 placed together
    assert env.action_space.nvec.tolist() == [3, 3, 3]
    with pytest.raises(PlacebenchError, match="colocation"):
        OneShotPlacementEnv(g, c, groups=[0, 1, 2, 3, 4, 1])
    with pytest.raises(PlacebenchError, match=r"groups must be 6 integer labels \(one per op of 'tiny_train'\), got shape \(2,\)"):
        OneShotPlacementEnv(g, c, groups=[0, 1])


def test_iterative_step_before_reset_is_refused():
    """Before the first reset there is no start placement and no R(p_0) to take the improvement from: the
    step used to place group 0 on a zero placement and reward -sqrt(score) - 0 (and spend an evaluation)."""
    ev = evaluator()
    env = IterativePlacementEnv(evaluator=ev, reward="improvement")
    with pytest.raises(PlacebenchError, match="reset"):
        env.step(1)
    assert ev.evaluations_used == 0


@pytest.mark.parametrize("action", [3, -1, 1.5, "1", True, np.bool_(False)])
def test_iterative_action_outside_the_action_space_is_refused(action):
    """Discrete(3): device 3 used to go into obs["placement"], outside MultiDiscrete([3, 3, 3, 3])."""
    ev = evaluator()
    env = IterativePlacementEnv(evaluator=ev, reward="improvement", initial=np.array([0, 1, 1, 1]))
    obs, _ = env.reset(seed=0)
    with pytest.raises(PlacebenchError, match="action"):
        env.step(action)
    assert ev.evaluations_used == 1  # the start placement only
    obs, _, _, _, _ = env.step(np.int64(2))  # the episode goes on from where it was
    assert obs["cursor"] == 1 and obs["placement"].tolist() == [2, 1, 1, 1]
    assert env.observation_space.contains(obs)


@pytest.mark.parametrize("action", [[0, 1, 1, 1, 2], [0, 1, 1], [0, 3, 1, 1], [0, -1, 1, 1], [0.0, 1.7, 1.0, 1.0],
                                    [[0, 1, 1, 1]]])
def test_one_shot_action_outside_the_action_space_is_refused(action):
    """MultiDiscrete([3, 3, 3, 3]): a fifth device used to be dropped silently and 1.7 truncated to 1, each
    evaluated as if the agent had asked for [0, 1, 1, 1]."""
    ev = evaluator()
    env = OneShotPlacementEnv(evaluator=ev)
    env.reset(seed=0)
    with pytest.raises(PlacebenchError, match="action"):
        env.step(np.array(action))
    assert ev.evaluations_used == 0
    env.step([0, 1, 1, 1])  # a list of ints is in the space
    assert ev.evaluations_used == 1


def test_iterative_step_past_the_budget_leaves_the_episode_as_it_was():
    """BudgetExhausted from a step's evaluation: the placement and the cursor are not advanced."""
    ev = evaluator(max_evaluations=2)
    env = IterativePlacementEnv(evaluator=ev, reward="improvement", initial=np.array([0, 1, 1, 1]))
    env.reset(seed=0)
    env.step(2)
    with pytest.raises(BudgetExhausted):
        env.step(0)
    assert env._obs()["placement"].tolist() == [2, 1, 1, 1] and env._obs()["cursor"] == 1


def test_iterative_reset_past_the_budget_starts_no_episode():
    """An improvement-mode reset evaluates the start placement; past the budget it raises BudgetExhausted and
    the env keeps its previous episode. It used to install the new start placement and cursor 0 first, so
    the observation showed an episode whose R(p_0) was never evaluated (the reward baseline the old one's)."""
    ev = evaluator(max_evaluations=2)
    env = IterativePlacementEnv(evaluator=ev, reward="improvement", initial=np.array([0, 1, 1, 1]))
    env.reset(seed=0)
    env.step(2)
    with pytest.raises(BudgetExhausted):
        env.reset(seed=0, options={"placement": [0, 2, 2, 1]})
    assert env._obs()["placement"].tolist() == [2, 1, 1, 1] and env._obs()["cursor"] == 1
    assert ev.evaluations_used == 2

    ev = evaluator(max_evaluations=5)  # one whole episode of 4 groups: the start placement and 4 steps
    env = IterativePlacementEnv(evaluator=ev, reward="improvement", initial=np.array([0, 1, 1, 1]))
    env.reset(seed=0)
    for d in (0, 2, 1, 1):
        env.step(d)
    with pytest.raises(BudgetExhausted):
        env.reset(seed=0)
    with pytest.raises(PlacebenchError, match="no episode is running"):  # the ended episode is still the state
        env.step(1)
    assert ev.evaluations_used == 5


def test_a_failed_iterative_reset_leaves_the_random_generator_as_it_was():
    """Gymnasium's reset(seed) seeds, then resets; if the reset raises, the env is as before the call, its RNG
    included. It used to keep the new seed (and the draws of the random start placement) after a
    BudgetExhausted, so a caller that caught it went on from another random stream."""
    ev = evaluator(max_evaluations=2)
    env = IterativePlacementEnv(evaluator=ev, reward="improvement")  # random start placements
    env.reset(seed=0)
    env.step(1)
    generator, state = env.np_random, env.np_random.bit_generator.state
    with pytest.raises(BudgetExhausted):
        env.reset(seed=5)
    with pytest.raises(BudgetExhausted):
        env.reset()  # draws a start placement from the env's own generator before evaluating it
    with pytest.raises(PlacebenchError, match="reset option 'placement'"):
        env.reset(seed=6, options={"placement": [0, 1, 2, 7]})
    assert env.np_random is generator and env.np_random_seed == 0
    assert env.np_random.bit_generator.state == state
    fresh = IterativePlacementEnv(evaluator=evaluator(), reward="improvement")
    fresh.reset(seed=0)
    fresh.step(1)
    assert env.np_random.integers(1 << 30, size=4).tolist() == fresh.np_random.integers(1 << 30, size=4).tolist()

    ev = evaluator(max_evaluations=1)
    ev.evaluate(np.zeros(6, dtype=np.int64))  # the shared budget is spent before the env's first reset
    env = IterativePlacementEnv(evaluator=ev, reward="improvement")
    with pytest.raises(BudgetExhausted):
        env.reset(seed=3)
    assert env._np_random is None and env._np_random_seed is None


def test_an_evaluator_with_another_workload_cluster_or_budget_is_refused():
    """The evaluator's workload, cluster and budget are the ones used: a different workload, cluster or a
    budget given beside it used to be dropped without a word."""
    ev = evaluator()
    other = OpGraph.build("other", [Op("x", "matmul", flops=1e9)], [])
    with pytest.raises(PlacebenchError, match="workload"):
        OneShotPlacementEnv(other, evaluator=ev)
    with pytest.raises(PlacebenchError, match="cluster"):
        IterativePlacementEnv(cluster="haswell_4k80", evaluator=ev)
    with pytest.raises(PlacebenchError, match="budget"):
        OneShotPlacementEnv(evaluator=ev, budget=Budget(5, 60.0))
    # the evaluator's own workload and cluster (objects, equal copies or names) are fine
    env = OneShotPlacementEnv(tiny_training_graph(), "haswell_2k80", evaluator=ev)
    assert env.evaluator is ev and env.problem.workload is ev.workload


def test_the_evaluators_cluster_given_as_its_file_is_the_evaluators():
    """A cluster file path names the evaluator's cluster as well as its name does."""
    from pathlib import Path

    import suite

    ev = evaluator()
    path = str(Path(suite.__file__).parent / "clusters" / "haswell_2k80.toml")
    assert OneShotPlacementEnv(cluster=path, evaluator=ev).evaluator is ev
    with pytest.raises(PlacebenchError, match="is not the evaluator's"):
        OneShotPlacementEnv(cluster=path.replace("2k80", "4k80"), evaluator=ev)


def test_observed_device_times_are_the_evaluators_profiled_times():
    """An evaluator with profiles scores on their measured op times; the observation's time on each device
    used to come from the cost model alone (here: l0 looked fastest on a GPU, where it takes 10 s)."""
    from suite.costmodel import Profile

    g, c = tiny_training_graph(), load_cluster("haswell_2k80")
    slow_gpu = Profile(g.name, "gpu", {"l0": 10.0, "l0.bwd": 10.0}, workload_hash=g.content_hash)
    ev = Evaluator(g, c, Budget(10, 60.0), profiles=[slow_gpu])
    one_shot, iterative = OneShotPlacementEnv(evaluator=ev), IterativePlacementEnv(evaluator=ev, reward="final")
    obs, it_obs = one_shot.reset(seed=0)[0], iterative.reset(seed=0)[0]
    assert one_shot.observation_space.contains(obs) and iterative.observation_space.contains(it_obs)
    for feats in (obs, it_obs["features"]):
        times = feats[:, 5:8]  # group l0 (with its backward op) on cpu:0, gpu:0, gpu:1
        assert times[1, 1] == times[1, 2] == 1.0 > times[1, 0]
    plain = OneShotPlacementEnv(g, c).problem.features
    assert plain[1, 5] > plain[1, 6]  # the cost model alone: the GPU is faster


@pytest.mark.parametrize("kw, what", [({"budget": 100}, "budget"), ({"evaluator": "simulator"}, "evaluator"),
                                      ({"workload": 3}, "workload"), ({"cluster": ("haswell_2k80",)}, "cluster")])
def test_an_argument_of_the_wrong_type_is_refused_when_the_env_is_made(kw, what):
    """`budget=100` used to be taken and fail at the first step with "'int' object has no attribute
    'max_evaluations'" (a bare AttributeError); a workload or cluster that is neither an object nor a name, or an
    evaluator given by name, failed the same way inside the constructor."""
    args = {"workload": tiny_training_graph(), "cluster": "haswell_2k80", **kw}
    for make in (OneShotPlacementEnv, IterativePlacementEnv):
        with pytest.raises(PlacebenchError, match=f"^{what} must be "):
            make(**args)


def test_a_ragged_action_or_grouping_is_refused_by_name():
    """numpy cannot make an array of a ragged list: the one-shot step and the `groups` argument used to let its
    bare ValueError ("inhomogeneous shape") through instead of saying which argument is wrong."""
    ev = evaluator()
    env = OneShotPlacementEnv(evaluator=ev)
    env.reset(seed=0)
    with pytest.raises(PlacebenchError, match="^action must be 4 integer device indices"):
        env.step([[0, 1], [1, 1]])
    assert ev.evaluations_used == 0
    with pytest.raises(PlacebenchError, match="^groups must be 6 integer labels .* got a ragged list"):
        OneShotPlacementEnv(evaluator=ev, groups=[[0, 1], [2]])


def test_unknown_reset_options_are_refused():
    """reset(options={"placment": p}) used to start from a random placement without a word, and options that
    are not a dict failed with a bare AttributeError ('list' object has no attribute 'get')."""
    it = IterativePlacementEnv(evaluator=evaluator(), reward="final")
    with pytest.raises(PlacebenchError, match="unknown reset option 'placment'.* only 'placement'"):
        it.reset(seed=0, options={"placment": [0, 1, 2, 1]})
    with pytest.raises(PlacebenchError, match="reset options must be a dict, got list"):
        it.reset(seed=0, options=[0, 1, 2, 1])
    assert it.reset(seed=0, options={"placement": [0, 1, 2, 1]})[0]["placement"].tolist() == [0, 1, 2, 1]
    one = OneShotPlacementEnv(evaluator=evaluator())
    with pytest.raises(PlacebenchError, match="unknown reset option 'placement'.* takes none"):
        one.reset(seed=0, options={"placement": [0, 1, 2, 1]})
    one.reset(seed=0, options={})


def test_groups_from_rl_grouping_are_its_assignment():
    """The docstring said a `groups` array comes "e.g. from rl.grouping", whose functions return a `Grouping`:
    passing one was refused as "got shape ()". The labels are its `assignment`; the object itself is named."""
    from rl.grouping import colocation_grouping

    grouping = colocation_grouping(tiny_training_graph())
    with pytest.raises(PlacebenchError, match="got a Grouping$"):
        OneShotPlacementEnv(evaluator=evaluator(), groups=grouping)
    env = OneShotPlacementEnv(evaluator=evaluator(), groups=grouping.assignment)
    assert env.action_space.nvec.tolist() == [3, 3, 3, 3]
    assert "`assignment` of an `rl.grouping.Grouping`" in suite.envs.__doc__


@pytest.mark.filterwarnings("ignore:.*render_mode='human' that is not in the possible render_modes")
@pytest.mark.parametrize("env_id", [ONE_SHOT_ID, ITERATIVE_ID])
def test_render_mode_none_is_accepted(env_id):
    """`gym.make(id, render_mode=None)`, the usual way to ask for no rendering, failed with a TypeError
    (unexpected keyword argument 'render_mode'); a mode these envs cannot render is refused by name."""
    env = gym.make(env_id, evaluator=evaluator(), render_mode=None)
    assert env.render_mode is None
    with pytest.raises(PlacebenchError, match="render_mode 'human'"):
        gym.make(env_id, evaluator=evaluator(), render_mode="human")


def test_observation_features_by_hand():
    """Groups data, l0 (+bwd), l1 (+bwd), loss: each column scaled log of the group's sum over its largest,
    the topological position of its first op over the last op's, its time on each device, its mask."""
    env = OneShotPlacementEnv(evaluator=evaluator())
    obs, _ = env.reset(seed=0)

    def scaled(xs):
        return [math.log1p(x) / math.log1p(max(xs)) for x in xs]

    expected = np.column_stack([
        scaled([1e6, 150 * GFLOP, 150 * GFLOP, 1e7]),  # flops
        scaled([10**6, 4 * 10**6, 4 * 10**6, 4]),  # output bytes
        [0.0, 1.0, 1.0, 0.0],  # parameter bytes: 1e7 in each layer group
        [math.log(2) / math.log(3), 1.0, 1.0, math.log(2) / math.log(3)],  # op count 1, 2, 2, 1
        [0 / 5, 1 / 5, 2 / 5, 3 / 5],  # first ops data, l0, l1, loss of ops 0..5
    ])
    assert obs[:, :5] == pytest.approx(expected, abs=1e-6)
    c = np.asarray(cost_matrix(env.problem.workload, env.problem.cluster, ())) * 1e6  # microseconds
    group_us = np.stack([c[0], c[1] + c[5], c[2] + c[4], c[3]])  # ops: data, l0, l1, loss, l1.bwd, l0.bwd
    assert obs[:, 5:8] == pytest.approx(np.log1p(group_us) / np.log1p(group_us.max()), abs=1e-6)
    assert obs[:, 8:].tolist() == [[1, 0, 0], [1, 1, 1], [1, 1, 1], [0, 1, 1]]


def test_iterative_info_masks_the_next_group_to_place():
    """After each step the cursor and `info["action_mask"]` are those of the group the next step places;
    after the last step, group 0's (the episode is over)."""
    env = IterativePlacementEnv(evaluator=evaluator(), reward="final", initial=np.array([0, 1, 1, 1]))
    obs, info = env.reset(seed=0)
    seen = [(obs["cursor"], info["action_mask"].tolist())]
    for a in [0, 1, 2, 1]:
        obs, _, terminated, _, info = env.step(a)
        seen.append((obs["cursor"], info["action_mask"].tolist()))
    assert terminated
    assert seen == [(0, [True, False, False]), (1, [True, True, True]), (2, [True, True, True]),
                    (3, [False, True, True]), (0, [True, False, False])]


def test_caller_groups_are_numbered_by_their_first_op_whatever_their_labels():
    """The iterative env places groups in topological order (of their first ops), not in the order of the
    labels a caller gave: labels 3, 2, 1, 0 for data, l0, l1, loss are groups 0, 1, 2, 3."""
    env = IterativePlacementEnv(evaluator=evaluator(), reward="final", groups=[3, 2, 1, 0, 1, 2],
                                initial=np.array([0, 1, 1, 1]))
    assert env.problem.assignment.tolist() == [0, 1, 2, 3, 2, 1]  # ops: data, l0, l1, loss, l1.bwd, l0.bwd
    _, info = env.reset(seed=0)
    assert info["action_mask"].tolist() == [True, False, False]  # data first: CPU only
    for a in [0, 1, 2]:
        env.step(a)
    _, _, terminated, _, info = env.step(2)
    assert terminated and info["status"] == "ok"
    assert info["step_time_s"] == pytest.approx(env.evaluator.measure([0, 1, 2, 2, 2, 1]).step_time_s)
