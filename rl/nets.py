"""Neural policy modules for learned placers (PyTorch, CPU).

`Seq2SeqPolicy` is the sequence-to-sequence placer of Mirhoseini et al. (ICML 2017): group embeddings
feed an LSTM encoder; an attentional LSTM decoder emits one device per group, in group order, feeding the
embedding of the device it just chose into its next step. Devices a group may not use are masked out of
the logits (probability 0).

Differences from the paper, for CPU cost (documented in `rl/seq2seq.py` too):
* the attention is multiplicative ("general", Luong et al. 2015) instead of additive: scores are one
  matrix product per step, no [batch, groups, hidden] tensor is kept per step for the backward pass;
* the decoder input at step t also carries the encoder output of group t (the paper's decoder reads group
  t "at the same time step" only through attention); this gives each decision its group directly.

Calling the policy samples (or decodes greedily, or re-scores given actions) a whole batch of placements
and returns their summed log-probabilities and entropies, which is what the trainers take.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from torch import nn

from suite.errors import PlacebenchError


class PolicyOutput(NamedTuple):
    actions: torch.Tensor  # int64 [B, G]
    log_prob: torch.Tensor  # [B], summed over groups, with gradient
    entropy: torch.Tensor  # [B], summed over groups, with gradient


def masked_categorical(
    logits: torch.Tensor,
    mask: torch.Tensor,
    *,
    generator: torch.Generator | None = None,
    greedy: bool = False,
    actions: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Choose from logits [B, D] with a bool mask [B, D] or [D]: (action [B], log_prob [B], entropy [B]).

    `actions` given: score them (PPO, teacher forcing); `greedy`: argmax; else sample with `generator`.
    A logit of an allowed device that is not finite (the policy's weights diverged) is a `PlacebenchError`.
    """
    if not bool(torch.isfinite(logits.masked_fill(~mask, 0.0)).all()):
        raise PlacebenchError("the policy's output is not finite: its weights diverged (lower the learning rate)")
    logits = logits.masked_fill(~mask, float("-inf"))
    logp = torch.log_softmax(logits, dim=-1)
    p = logp.exp()
    if actions is None:
        if greedy:
            actions = logp.argmax(dim=-1)
        else:
            actions = torch.multinomial(p, 1, generator=generator).squeeze(-1)
    chosen = logp.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    # masked entries: p = 0 and logp = -inf; zero logp there first so that no 0 * inf reaches the gradient
    entropy = -(p * logp.masked_fill(~mask, 0.0)).sum(dim=-1)
    return actions, chosen, entropy


class Seq2SeqPolicy(nn.Module):
    """LSTM encoder over group embeddings; attentional LSTM decoder emitting one device per group."""

    def __init__(
        self,
        input_dim: int,
        num_devices: int,
        *,
        hidden_size: int = 128,
        encoder_layers: int = 1,
        bidirectional: bool = True,
        temperature: float = 1.0,
        tanh_constant: float = 0.0,
        forget_bias: float = 1.0,
    ):
        super().__init__()
        if bidirectional and hidden_size % 2:
            raise ValueError(f"a bidirectional encoder needs an even hidden size, got {hidden_size}")
        self.num_devices = num_devices
        self.hidden_size = hidden_size
        self.temperature = temperature
        self.tanh_constant = tanh_constant
        h = hidden_size
        self.embed = nn.Linear(input_dim, h)
        self.encoder = nn.LSTM(
            h, h // 2 if bidirectional else h, num_layers=encoder_layers, batch_first=True, bidirectional=bidirectional
        )
        self.device_embed = nn.Embedding(num_devices + 1, h)  # index num_devices is the <go> symbol
        self.decoder = nn.LSTMCell(2 * h, h)
        self.attn = nn.Linear(h, h, bias=False)
        self.out = nn.Linear(2 * h, num_devices)
        self._init_forget_bias(forget_bias)

    def _init_forget_bias(self, value: float) -> None:
        """Forget-gate bias starts at `value` (1.0 in the authors' controller); gates are ordered i, f, g, o."""
        with torch.no_grad():
            for name, p in [*self.encoder.named_parameters(), *self.decoder.named_parameters()]:
                if name.startswith("bias_ih"):
                    n = p.shape[0] // 4
                    p[n : 2 * n].fill_(value)
                elif name.startswith("bias_hh"):
                    n = p.shape[0] // 4
                    p[n : 2 * n].zero_()

    def encode(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """x [G, F] -> encoder outputs [G, H] and the decoder's initial (h, c), each [1, H]."""
        out, (h, c) = self.encoder(torch.relu(self.embed(x)).unsqueeze(0))
        if self.encoder.bidirectional:
            h = torch.cat([h[-2], h[-1]], dim=-1)
            c = torch.cat([c[-2], c[-1]], dim=-1)
        else:
            h, c = h[-1], c[-1]
        return out.squeeze(0), (h, c)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor,
        batch_size: int = 1,
        *,
        generator: torch.Generator | None = None,
        greedy: bool = False,
        actions: torch.Tensor | None = None,
    ) -> PolicyOutput:
        """Decode `batch_size` placements of the G groups described by x [G, F]; mask [G, D] is bool."""
        G = x.shape[0]
        B = actions.shape[0] if actions is not None else batch_size
        enc, (h, c) = self.encode(x)
        keys = self.attn(enc)  # [G, H]
        h, c = h.expand(B, -1).contiguous(), c.expand(B, -1).contiguous()
        prev = torch.full((B,), self.num_devices, dtype=torch.long)
        chosen, log_prob, entropy = [], torch.zeros(B), torch.zeros(B)
        for t in range(G):
            inp = torch.cat([self.device_embed(prev), enc[t].expand(B, -1)], dim=-1)
            h, c = self.decoder(inp, (h, c))
            weights = torch.softmax(h @ keys.T, dim=-1)  # [B, G]
            context = weights @ enc  # [B, H]
            logits = self.out(torch.cat([h, context], dim=-1)) / self.temperature
            if self.tanh_constant > 0:
                logits = self.tanh_constant * torch.tanh(logits)
            a, lp, ent = masked_categorical(
                logits, mask[t], generator=generator, greedy=greedy, actions=None if actions is None else actions[:, t]
            )
            chosen.append(a)
            log_prob = log_prob + lp
            entropy = entropy + ent
            prev = a
        return PolicyOutput(torch.stack(chosen, dim=1), log_prob, entropy)


def to_tensor(a: np.ndarray, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.as_tensor(np.ascontiguousarray(a), dtype=dtype)
