"""NMT: an attentional LSTM encoder-decoder, unrolled over time (Mirhoseini et al., ICML 2017, Sec. 4.1).

Shape of the paper's model: 2-layer LSTMs of 1024 units in the encoder and the decoder, attention, 40 source
and 40 target steps, batch 64 (WMT'14 English-German; Bahdanau et al. 2015, Wu et al. 2016). Assumed where
the paper is silent: source and target vocabularies of 32,000 sub-words, embedding size = hidden size,
unidirectional encoder, Luong-style dot-product attention over the top encoder layer computed after the
top decoder layer (no input feeding), the decoder starts from the encoder's final states, no dropout.

Graph: per sequence one embedding lookup; one `lstm_cell` op per layer per step in the encoder and the
decoder; the encoder outputs stacked once into the attention memory; per decoder step one `attention` op,
an output projection and (training) a cross-entropy loss; the mean of the losses. Scopes:
"encoder.embedding", "encoder.lstm.{l}", "decoder.embedding", "decoder.lstm.{l}", "attention", "softmax".
"""

from __future__ import annotations

import torch
import torch.nn as nn

from suite.zoo.layers import AttentionStep, LSTMCell, SoftmaxLayer, Stack


class Recurrent(nn.Module):
    """An embedding and a stack of LSTM cells (encoder or decoder); the time loop lives in `NMT.forward`."""

    def __init__(self, vocab_size: int, hidden_size: int, num_layers: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, hidden_size)
        self.lstm = nn.ModuleList([LSTMCell(hidden_size, hidden_size) for _ in range(num_layers)])


class Attention(nn.Module):
    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.memory = Stack(dim=1)
        self.step = AttentionStep(hidden_size)


class NMT(nn.Module):
    def __init__(
        self, src_vocab: int, tgt_vocab: int, hidden_size: int, num_layers: int, src_steps: int, tgt_steps: int,
        with_loss: bool,
    ) -> None:
        super().__init__()
        self.src_steps, self.tgt_steps = src_steps, tgt_steps
        self.encoder = Recurrent(src_vocab, hidden_size, num_layers)
        self.decoder = Recurrent(tgt_vocab, hidden_size, num_layers)
        self.attention = Attention(hidden_size)
        self.softmax = SoftmaxLayer(hidden_size, tgt_vocab, with_loss)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        x = self.encoder.embedding(src)
        states: list = [None] * len(self.encoder.lstm)
        top = []
        for t in range(self.src_steps):
            h = x[:, t]
            for layer, cell in enumerate(self.encoder.lstm):
                hc = cell(h, states[layer])
                states[layer] = (hc[0], hc[1])
                h = hc[0]
            top.append(h)
        memory = self.attention.memory(top)
        y = self.decoder.embedding(tgt)
        outs = []
        for t in range(self.tgt_steps):
            h = y[:, t]
            for layer, cell in enumerate(self.decoder.lstm):
                hc = cell(h, states[layer])
                states[layer] = (hc[0], hc[1])
                h = hc[0]
            a = self.attention.step(h, memory)
            outs.append(self.softmax(a, targets[:, t] if self.softmax.with_loss else None))
        return self.softmax.total(outs)


def model_and_inputs(
    *, batch_size: int, hidden_size: int, num_layers: int, src_steps: int, tgt_steps: int, vocab_size: int,
    with_loss: bool,
) -> tuple[nn.Module, tuple]:
    model = NMT(vocab_size, vocab_size, hidden_size, num_layers, src_steps, tgt_steps, with_loss)
    src = torch.zeros(batch_size, src_steps, dtype=torch.long)
    tgt = torch.zeros(batch_size, tgt_steps, dtype=torch.long)
    if not with_loss:
        return model, (src, tgt)
    return model, (src, tgt, torch.zeros(batch_size, tgt_steps, dtype=torch.long))

