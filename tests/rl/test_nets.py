"""The seq2seq policy: masks are obeyed, re-scoring reproduces sampled log-probabilities, seeds repeat."""

from __future__ import annotations

import math

import pytest
import torch

from rl.nets import Seq2SeqPolicy, masked_categorical
from suite.errors import PlacebenchError


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


def fixed_logits_policy(bias, **kw):
    """A 1-group, 3-device policy whose output layer ignores its input: pre-temperature logits = `bias`."""
    torch.manual_seed(0)
    pol = Seq2SeqPolicy(4, 3, hidden_size=8, **kw)
    with torch.no_grad():
        pol.out.weight.zero_()
        pol.out.bias.copy_(torch.tensor(bias))
    return pol, torch.rand(1, 4), torch.ones(1, 3, dtype=torch.bool)


def test_temperature_divides_the_logits():
    pol, x, mask = fixed_logits_policy([1.0, 0.0, 0.0], temperature=2.0)
    lp = pol(x, mask, actions=torch.tensor([[0]])).log_prob
    e = math.exp(0.5)  # logits [1, 0, 0] / 2
    assert lp.item() == pytest.approx(math.log(e / (e + 2)), abs=1e-6)


def test_tanh_constant_squashes_the_logits():
    pol, x, mask = fixed_logits_policy([4.0, 0.0, 0.0], temperature=2.0, tanh_constant=1.5)
    lp = pol(x, mask, actions=torch.tensor([[0]])).log_prob
    e = math.exp(1.5 * math.tanh(2.0))  # 1.5 * tanh([4, 0, 0] / 2)
    assert lp.item() == pytest.approx(math.log(e / (e + 2)), abs=1e-6)


def test_attention_context_drives_the_logits():
    """With the decoder state's columns of the output layer zeroed and the attention scores all 0 (uniform
    weights), every step's logits are W_context @ mean(encoder outputs) + b."""
    pol, x, mask = policy_and_inputs()
    H = pol.hidden_size
    with torch.no_grad():
        pol.out.weight[:, :H].zero_()
        pol.out.weight[:, H:] *= 20.0  # a context that moves the logits by far more than the tolerance
        pol.attn.weight.zero_()
    actions = torch.tensor([[0, 2, 1, 1, 0]])  # mask: group 0 on device 0 only, group 3 not on device 0
    out = pol(x, mask, actions=actions)
    with torch.no_grad():
        logits = pol.out.weight[:, H:] @ pol.encode(x)[0].mean(0) + pol.out.bias
    assert logits.std() > 0.1  # not uniform: the test would not see a context of zeros otherwise
    expected = 0.0
    for t, a in enumerate(actions[0].tolist()):
        expected += torch.log_softmax(logits.masked_fill(~mask[t], float("-inf")), -1)[a].item()
    assert out.log_prob.item() == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_logit_of_an_allowed_device_is_a_clear_error(bad):
    mask = torch.tensor([[True, True, False]])
    with pytest.raises(PlacebenchError, match="not finite"):
        masked_categorical(torch.tensor([[0.0, bad, 0.0]]), mask)
    # a masked device's logit is never read: NaN there is fine and the allowed devices are sampled as before
    a, lp, _ = masked_categorical(torch.tensor([[0.0, 0.0, bad]]), mask, greedy=True)
    assert a.tolist() == [0] and lp.item() == pytest.approx(math.log(0.5))
