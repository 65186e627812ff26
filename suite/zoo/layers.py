"""Building blocks shared by the zoo models, written in plain PyTorch.

`LSTMCell` and `AttentionStep` carry a `capture_cost` method, so the capture keeps each call as one leaf
op ("lstm_cell", "attention") with an exact FLOP count: an unrolled recurrent model has one op per layer
per time step, which is the granularity placement papers work at (a fused `nn.LSTM` call would be one op
for the whole sequence, with nothing to place).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from suite.capture.flops import SOFTMAX_FLOPS_PER_ELEMENT, Cost, TensorInfo, lstm_cell_flops


class LSTMCell(nn.Module):
    """One LSTM layer at one time step: (x, (h, c) or None) -> (h', c'). None means a zero initial state.

    Two weight matrices and two biases as in `torch.nn.LSTMCell`; gate order i, f, g, o.
    """

    capture_kind = "lstm_cell"

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__()
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.weight_ih = nn.Parameter(torch.empty(4 * hidden_size, input_size))
        self.weight_hh = nn.Parameter(torch.empty(4 * hidden_size, hidden_size))
        self.bias_ih = nn.Parameter(torch.empty(4 * hidden_size))
        self.bias_hh = nn.Parameter(torch.empty(4 * hidden_size))
        bound = 1.0 / math.sqrt(hidden_size)
        for p in self.parameters():
            nn.init.uniform_(p, -bound, bound)

    def forward(self, x: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor] | None = None):
        if state is None:
            h = x.new_zeros(x.shape[0], self.hidden_size)
            c = h
        else:
            h, c = state
        gates = F.linear(x, self.weight_ih, self.bias_ih) + F.linear(h, self.weight_hh, self.bias_hh)
        i, f, g, o = gates.chunk(4, dim=1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        return h, c

    def capture_cost(self, inputs: list[TensorInfo], outputs: list[TensorInfo], training: bool) -> Cost:
        x = inputs[0]
        batch = math.prod(x.shape[:-1])
        flops, macs = lstm_cell_flops(batch, self.input_size, self.hidden_size)
        # autograd keeps the four activated gates and tanh(c') for the backward pass
        saved = 5 * batch * self.hidden_size * x.itemsize
        return Cost("lstm_cell", flops, macs, saved_bytes=saved)


class AttentionStep(nn.Module):
    """Luong-style attention for one decoder step: (h [B, H], memory [B, S, H]) -> tanh(W_c [context; h] + b).

    FLOPs: scores B S H and context B S H multiply-adds, softmax 5 B S, output projection 2 B (2H) H plus
    bias and tanh 2 B H.
    """

    capture_kind = "attention"

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.out = nn.Linear(2 * hidden_size, hidden_size)

    def forward(self, h: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        scores = torch.bmm(memory, h.unsqueeze(2)).squeeze(2)
        probs = torch.softmax(scores, dim=1)
        context = torch.bmm(probs.unsqueeze(1), memory).squeeze(1)
        return torch.tanh(self.out(torch.cat([context, h], dim=1)))

    def capture_cost(self, inputs: list[TensorInfo], outputs: list[TensorInfo], training: bool) -> Cost:
        h, memory = inputs[0], inputs[1]
        batch, steps, hidden = memory.shape
        macs = 2 * batch * steps * hidden + batch * 2 * hidden * hidden
        flops = 2.0 * macs + SOFTMAX_FLOPS_PER_ELEMENT * batch * steps + 2 * batch * hidden
        saved = (batch * steps + 3 * batch * hidden) * h.itemsize  # probabilities, [context; h], pre-tanh
        return Cost("attention", flops, float(macs), saved_bytes=saved)


class Stack(nn.Module):
    """Stack a list of per-step tensors along `dim` (one "concat" op)."""

    def __init__(self, dim: int = 0) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, xs: list[torch.Tensor]) -> torch.Tensor:
        return torch.stack(xs, dim=self.dim)


class MeanLoss(nn.Module):
    """Average per-step losses: stack (no FLOPs) then mean."""

    def forward(self, losses: list[torch.Tensor]) -> torch.Tensor:
        return torch.stack(losses).mean()


class SoftmaxLayer(nn.Module):
    """Output projection to the vocabulary and, in training graphs, the cross-entropy loss of one step."""

    def __init__(self, hidden_size: int, vocab_size: int, with_loss: bool) -> None:
        super().__init__()
        self.proj = nn.Linear(hidden_size, vocab_size)
        self.with_loss = with_loss
        self.loss = nn.CrossEntropyLoss() if with_loss else None
        self.total = MeanLoss() if with_loss else Stack(dim=1)

    def forward(self, h: torch.Tensor, target: torch.Tensor | None = None) -> torch.Tensor:
        logits = self.proj(h)
        if self.loss is None:
            return logits
        return self.loss(logits, target)


class ClassifierHead(nn.Module):
    """Global average pooling, the final fully connected layer and (training graphs) the loss."""

    def __init__(self, in_features: int, num_classes: int, with_loss: bool) -> None:
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_features, num_classes)
        self.loss = nn.CrossEntropyLoss() if with_loss else None

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        logits = self.fc(torch.flatten(self.pool(x), 1))
        if self.loss is None:
            return logits
        return self.loss(logits, labels)
