"""BERT-base (Devlin et al., NAACL 2019) in plain PyTorch, the layout of the reference implementation:
12 layers, hidden 768, 12 heads, feed-forward 3072, vocabulary 30,522, 512 positions, 2 token types, GELU,
a pooler, and a 2-class sequence-classification head (plus its loss in training graphs). Workload of HSDAG
(Duan et al., NeurIPS 2024), which places BERT-base inference at sequence length 128.

No attention mask (every token valid) and no dropout. Published figure: about 110 M parameters (Devlin et
al.; 109.5 M with the pooler). Forward multiply-adds per sequence of length S (derived, not published):
12 x (4 S H^2 + 2 S^2 H + 2 S H F) + pooler, about 11.2 G at S = 128.
Scopes: "embeddings", "encoder.layer.{k}", "pooler", "head".
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Embeddings(nn.Module):
    def __init__(self, vocab: int, hidden: int, max_positions: int, seq_len: int) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, hidden)
        self.position_embeddings = nn.Embedding(max_positions, hidden)
        self.token_type_embeddings = nn.Embedding(2, hidden)
        self.layer_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.register_buffer("position_ids", torch.arange(seq_len).unsqueeze(0), persistent=False)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        x = self.word_embeddings(input_ids) + self.position_embeddings(self.position_ids)
        return self.layer_norm(x + self.token_type_embeddings(token_type_ids))


class SelfAttention(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(x.size(0), x.size(1), self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self._split(self.query(x)), self._split(self.key(x)), self._split(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        context = torch.matmul(torch.softmax(scores, dim=-1), v)
        return context.transpose(1, 2).reshape(x.size(0), x.size(1), self.heads * self.head_dim)


class AddNorm(nn.Module):
    """Dense projection, residual add and layer norm (BertSelfOutput / BertOutput)."""

    def __init__(self, in_features: int, hidden: int) -> None:
        super().__init__()
        self.dense = nn.Linear(in_features, hidden)
        self.layer_norm = nn.LayerNorm(hidden, eps=1e-12)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.layer_norm(self.dense(x) + residual)


class Layer(nn.Module):
    def __init__(self, hidden: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.attention = SelfAttention(hidden, heads)
        self.attention_output = AddNorm(hidden, hidden)
        self.intermediate = nn.Linear(hidden, ffn)
        self.output = AddNorm(ffn, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.attention_output(self.attention(x), x)
        return self.output(F.gelu(self.intermediate(x)), x)


class Encoder(nn.Module):
    def __init__(self, layers: int, hidden: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.layer = nn.ModuleList([Layer(hidden, heads, ffn) for _ in range(layers)])


class Pooler(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(x[:, 0]))


class Head(nn.Module):
    def __init__(self, hidden: int, num_labels: int, with_loss: bool) -> None:
        super().__init__()
        self.classifier = nn.Linear(hidden, num_labels)
        self.loss = nn.CrossEntropyLoss() if with_loss else None

    def forward(self, pooled: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        logits = self.classifier(pooled)
        return logits if self.loss is None else self.loss(logits, labels)


class BertBase(nn.Module):
    def __init__(
        self, *, num_layers: int, hidden_size: int, heads: int, ffn_size: int, vocab_size: int, max_positions: int,
        seq_len: int, num_labels: int, with_loss: bool,
    ) -> None:
        super().__init__()
        self.embeddings = Embeddings(vocab_size, hidden_size, max_positions, seq_len)
        self.encoder = Encoder(num_layers, hidden_size, heads, ffn_size)
        self.pooler = Pooler(hidden_size)
        self.head = Head(hidden_size, num_labels, with_loss)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, labels: torch.Tensor | None = None):
        x = self.embeddings(input_ids, token_type_ids)
        for layer in self.encoder.layer:
            x = layer(x)
        return self.head(self.pooler(x), labels)


def model_and_inputs(
    *, batch_size: int, seq_len: int, num_layers: int = 12, hidden_size: int = 768, heads: int = 12,
    ffn_size: int = 3072, vocab_size: int = 30522, max_positions: int = 512, num_labels: int = 2, with_loss: bool,
) -> tuple[nn.Module, tuple]:
    model = BertBase(
        num_layers=num_layers, hidden_size=hidden_size, heads=heads, ffn_size=ffn_size, vocab_size=vocab_size,
        max_positions=max_positions, seq_len=seq_len, num_labels=num_labels, with_loss=with_loss,
    )
    ids = torch.zeros(batch_size, seq_len, dtype=torch.long)
    types = torch.zeros(batch_size, seq_len, dtype=torch.long)
    if not with_loss:
        return model, (ids, types)
    return model, (ids, types, torch.zeros(batch_size, dtype=torch.long))

