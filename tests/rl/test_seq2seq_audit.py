"""Audit additions for rl.seq2seq: the seed reaches the initial weights, the parameters reach the policy and
the trainer, the encoder input is the group embedding with its adjacency rows, and the update takes the rewards
of the reward parameter."""

from __future__ import annotations

import numpy as np
import torch

from rl.features import group_features
from rl.seq2seq import Seq2SeqPlacer, Seq2SeqSearch


def _weights(search: Seq2SeqSearch) -> list[torch.Tensor]:
    return [p.detach().clone() for p in search.policy.parameters()]


def test_the_seed_sets_the_initial_weights(branchy, k80x2, make_problem):
    problem, _ = make_problem(branchy, k80x2)
    params = {**Seq2SeqPlacer.defaults, "grouping": "colocation", "hidden_size": 8}
    a, b, c = (_weights(Seq2SeqSearch(problem, params, seed)) for seed in (0, 0, 1))
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(torch.equal(x, y) for x, y in zip(a, c, strict=True))


def test_parameters_reach_the_policy_and_the_trainer(branchy, k80x2, make_problem):
    problem, _ = make_problem(branchy, k80x2)
    params = {**Seq2SeqPlacer.defaults, "grouping": "colocation", "hidden_size": 12, "lr": 0.02,
              "baseline_decay": 0.5, "entropy_coef": 0.3, "grad_clip": 2.5, "normalize_advantages": False,
              "temperature": 1.7, "tanh_constant": 2.5, "bidirectional": False}
    s = Seq2SeqSearch(problem, params, seed=0)
    tr, pol = s.trainer, s.policy
    assert tr.optimizer.param_groups[0]["lr"] == 0.02 and tr.baseline.decay == 0.5
    assert (tr.entropy_coef, tr.grad_clip, tr.normalize) == (0.3, 2.5, False)
    assert (pol.hidden_size, pol.temperature, pol.tanh_constant, pol.encoder.bidirectional) == (12, 1.7, 2.5, False)


def test_encoder_input_is_the_group_embedding_with_adjacency(branchy, k80x2, make_problem):
    problem, _ = make_problem(branchy, k80x2)
    s = Seq2SeqSearch(problem, {**Seq2SeqPlacer.defaults, "grouping": "colocation"}, seed=0)
    G = s.grouping.num_groups
    expected = group_features(branchy, s.grouping).matrix()
    K = len({op.kind for op in branchy.ops})
    assert s.x.shape == (G, K + 6 + 4 + 2 * G)
    np.testing.assert_array_equal(s.x.numpy(), expected)


def test_greedy_is_the_most_likely_placement_and_draws_nothing(train2, k80x2, make_problem):
    """train2 in 2 groups: the CPU-only group has one choice, so the greedy decode (argmax at every step) is the
    most likely of the allowed placements; it neither samples nor advances the search's generator."""
    problem, _ = make_problem(train2, k80x2)
    s = Seq2SeqSearch(problem, {**Seq2SeqPlacer.defaults, "hidden_size": 8}, seed=0)
    mask = s.mask.numpy()
    assert mask.sum(axis=1).tolist() == [1, 2]
    allowed = torch.tensor([[0, d] for d in np.flatnonzero(mask[1])])
    with torch.no_grad():
        lp = s.policy(s.x, s.mask, actions=allowed).log_prob
    state = s.generator.get_state()
    for _ in range(3):
        assert s.greedy().tolist() == allowed[int(lp.argmax())].tolist()
    assert torch.equal(s.generator.get_state(), state)


def test_the_update_learns_from_the_rewards_of_the_reward_parameter(branchy, k80x2, make_problem):
    """REINFORCE gets -sqrt(score) of each sampled placement by default (Mirhoseini et al.), 1 / score with
    reward "inv": the rewards of the rollout, in the order of the sampled log-probabilities."""
    for reward, of in (("neg_sqrt", lambda s: -np.sqrt(s)), ("inv", lambda s: 1.0 / s)):
        problem, _ = make_problem(branchy, k80x2)
        s = Seq2SeqSearch(problem, {**Seq2SeqPlacer.defaults, "grouping": "colocation", "hidden_size": 8,
                                    "reward": reward}, seed=0)
        got: dict = {}
        s.trainer.step = lambda log_prob, entropy, rewards, got=got: got.update(log_prob=log_prob, rewards=rewards)
        r = s.step(4)
        np.testing.assert_allclose(got["rewards"], of(r.scores_s), rtol=1e-12)
        assert len(set(r.scores_s.tolist())) > 1  # the premise: the samples score differently
        with torch.no_grad():
            again = s.policy(s.x, s.mask, actions=torch.as_tensor(r.group_devices)).log_prob
        torch.testing.assert_close(got["log_prob"].detach(), again)
