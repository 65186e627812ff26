"""RNNLM: a multi-layer LSTM language model, unrolled over time (Mirhoseini et al., ICML 2017, Sec. 4.1).

Shape of the paper's model: 2 LSTM layers of 2048 units, 40 unrolled steps, batch 64 (Zaremba et al. 2014;
Jozefowicz et al. 2016). The vocabulary size is not given in the paper; we assume 10,000 words (the Penn
Treebank vocabulary of Zaremba et al.). Embedding size = hidden size. No dropout (it changes neither the
structure nor the placement problem).

Graph: one embedding lookup for the whole sequence; one `lstm_cell` op per layer per step; per step an
output projection and (training) a cross-entropy loss; the mean of the per-step losses. Scopes:
"embedding", "lstm.{layer}", "softmax".
"""

from __future__ import annotations

import torch
import torch.nn as nn

from suite.zoo.layers import LSTMCell, SoftmaxLayer


class RNNLM(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int, num_layers: int, num_steps: int, with_loss: bool) -> None:
        super().__init__()
        self.num_steps = num_steps
        self.embedding = nn.Embedding(vocab_size, hidden_size)
        self.lstm = nn.ModuleList([LSTMCell(hidden_size, hidden_size) for _ in range(num_layers)])
        self.softmax = SoftmaxLayer(hidden_size, vocab_size, with_loss)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        x = self.embedding(tokens)
        states: list = [None] * len(self.lstm)
        outs = []
        for t in range(self.num_steps):
            h = x[:, t]
            for layer, cell in enumerate(self.lstm):
                hc = cell(h, states[layer])
                states[layer] = (hc[0], hc[1])
                h = hc[0]
            outs.append(self.softmax(h, targets[:, t] if self.softmax.with_loss else None))
        return self.softmax.total(outs)


def model_and_inputs(
    *, batch_size: int, hidden_size: int, num_layers: int, num_steps: int, vocab_size: int, with_loss: bool
) -> tuple[nn.Module, tuple]:
    model = RNNLM(vocab_size, hidden_size, num_layers, num_steps, with_loss)
    tokens = torch.zeros(batch_size, num_steps, dtype=torch.long)
    if not with_loss:
        return model, (tokens,)
    return model, (tokens, torch.zeros(batch_size, num_steps, dtype=torch.long))

