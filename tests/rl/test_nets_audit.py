"""Audit additions for rl.nets: the decoder step by step against a plain re-statement of the documented
architecture (previous device fed back, group t's encoder output, attention over groups), and the
forget-gate bias."""

from __future__ import annotations

import pytest
import torch

from rl.nets import Seq2SeqPolicy


def reference_log_prob(pol: Seq2SeqPolicy, x: torch.Tensor, mask: torch.Tensor, actions: list[int]) -> float:
    """One placement decoded by hand: decoder input [embedding of the previous device (<go> first), encoder
    output of group t]; attention weights softmax over the groups of h . attn(enc); logits out([h, context])."""
    with torch.no_grad():
        enc, (h, c) = pol.encode(x)
        keys = pol.attn(enc)
        prev, total = pol.num_devices, 0.0
        for t, a in enumerate(actions):
            inp = torch.cat([pol.device_embed.weight[prev], enc[t]])[None]
            h, c = pol.decoder(inp, (h, c))
            weights = torch.softmax((h @ keys.T)[0], dim=0)  # one weight per group, summing to 1
            context = weights @ enc
            logits = pol.out(torch.cat([h[0], context])) / pol.temperature
            total += torch.log_softmax(logits.masked_fill(~mask[t], float("-inf")), dim=0)[a].item()
            prev = a
    return total


def test_decoder_matches_the_documented_architecture():
    torch.manual_seed(0)
    pol = Seq2SeqPolicy(7, 3, hidden_size=16)
    x = torch.rand(5, 7)
    mask = torch.ones(5, 3, dtype=torch.bool)
    mask[0] = torch.tensor([True, False, False])
    for actions in ([0, 2, 1, 1, 0], [0, 0, 2, 1, 2], [0, 1, 1, 2, 2]):
        got = pol(x, mask, actions=torch.tensor([actions])).log_prob.item()
        assert got == pytest.approx(reference_log_prob(pol, x, mask, actions), abs=1e-5)


def test_the_device_chosen_at_step_t_conditions_step_t_plus_1():
    """Re-scoring [a0, 0] and [a0, 1]: the conditional log-odds of group 1 depend on a0 (fed back)."""
    torch.manual_seed(0)
    pol = Seq2SeqPolicy(4, 2, hidden_size=8)
    x, mask = torch.rand(2, 4), torch.ones(2, 2, dtype=torch.bool)
    lp = pol(x, mask, actions=torch.tensor([[0, 0], [0, 1], [1, 0], [1, 1]])).log_prob.detach()
    odds_after_0, odds_after_1 = (lp[0] - lp[1]).item(), (lp[2] - lp[3]).item()
    assert abs(odds_after_0 - odds_after_1) > 1e-4


def test_forget_gate_bias_starts_at_one():
    """Gates are ordered i, f, g, o: bias_ih's second quarter is 1, bias_hh's is 0 (encoder both ways, decoder)."""
    torch.manual_seed(0)
    pol = Seq2SeqPolicy(4, 2, hidden_size=8, forget_bias=1.0)
    params = [*pol.encoder.named_parameters(), *pol.decoder.named_parameters()]
    biases = [(name, p) for name, p in params if name.startswith("bias")]
    assert len(biases) == 6  # ih and hh of the encoder's two directions and of the decoder
    for name, p in biases:
        n = p.shape[0] // 4
        expected = 1.0 if name.startswith("bias_ih") else 0.0
        assert p[n : 2 * n].tolist() == [expected] * n, name
        assert p[:n].abs().max().item() < 1.0  # the input gate keeps its random initial bias
