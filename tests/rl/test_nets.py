"""The seq2seq policy: masks are obeyed, re-scoring reproduces sampled log-probabilities, seeds repeat."""

from __future__ import annotations

import torch

from rl.nets import Seq2SeqPolicy, masked_categorical


def policy_and_inputs(seed=0):
    torch.manual_seed(seed)
    pol = Seq2SeqPolicy(7, 3, hidden_size=16)
    x = torch.rand(5, 7)
    mask = torch.ones(5, 3, dtype=torch.bool)
    mask[0] = torch.tensor([True, False, False])
    mask[3] = torch.tensor([False, True, True])
    return pol, x, mask


def test_mask_is_obeyed():
    pol, x, mask = policy_and_inputs()
    out = pol(x, mask, 64, generator=torch.Generator().manual_seed(0))
    assert out.actions.shape == (64, 5)
    assert (out.actions[:, 0] == 0).all()
    assert (out.actions[:, 3] != 0).all()
    assert torch.isfinite(out.log_prob).all() and torch.isfinite(out.entropy).all()


def test_rescoring_matches_sampling():
    pol, x, mask = policy_and_inputs()
    out = pol(x, mask, 8, generator=torch.Generator().manual_seed(1))
    again = pol(x, mask, actions=out.actions)
    assert torch.equal(again.actions, out.actions)
    assert torch.allclose(again.log_prob, out.log_prob, atol=1e-6)
    assert torch.allclose(again.entropy, out.entropy, atol=1e-6)


def test_same_seed_same_samples_and_greedy_is_deterministic():
    pol, x, mask = policy_and_inputs()
    a = pol(x, mask, 4, generator=torch.Generator().manual_seed(3)).actions
    b = pol(x, mask, 4, generator=torch.Generator().manual_seed(3)).actions
    assert torch.equal(a, b)
    g1 = pol(x, mask, 1, greedy=True).actions
    assert torch.equal(g1, pol(x, mask, 1, greedy=True).actions)


def test_masked_categorical_entropy_and_greedy():
    logits = torch.tensor([[0.0, 0.0, 5.0]])
    a, lp, ent = masked_categorical(logits, torch.tensor([True, True, False]), greedy=True)
    assert a.item() in (0, 1)
    assert torch.allclose(lp, torch.log(torch.tensor([0.5])))
    assert torch.allclose(ent, torch.log(torch.tensor([2.0])))


def test_gradients_are_finite_with_masked_devices():
    pol, x, mask = policy_and_inputs()
    out = pol(x, mask, 4, generator=torch.Generator().manual_seed(0))
    (out.log_prob.sum() + out.entropy.sum()).backward()
    assert all(torch.isfinite(p.grad).all() for p in pol.parameters() if p.grad is not None)
