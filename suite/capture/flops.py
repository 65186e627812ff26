"""FLOP counting rules shared by the capture front ends.

Conventions (FLOPs, a multiply-add = 2 FLOPs; MACs = multiply-adds of matrix products and convolutions
only, the figure papers publish):

* linear / matmul / bmm / mv / dot / inner / tensordot / linalg.vecdot: 2 x MACs (MACs = output elements x
  the size of the contracted dimensions), plus 1 per output element for a bias (the added input of addmm,
  addmv, addr, baddbmm, addbmm); outer: a product of contracted size 1 (n x m MACs, as the einsum "i,j->ij");
  linalg.multi_dot / chain_matmul: their matrix products in the cheapest order, which torch chooses;
  nn.Bilinear: one multiply-add per sample, output feature and pair of input features (+ its bias);
  einsum as torch computes it: 1 per input element for one operand; for more, operand
  by operand from the left, each step a product with MACs = the product of its indices' sizes, after summing
  out (1 per element) an index no later operand or the output needs;
* multi-head attention (nn.MultiheadAttention, scaled_dot_product_attention): its matrix products, softmax
  (5 per score) and, for the module, its projection biases;
* convolution: MACs = output elements x (input channels / groups) x kernel elements; FLOPs = 2 x MACs,
  plus 1 per output element for a bias; a transposed convolution: MACs = input elements x (output channels /
  groups) x kernel elements;
* elementwise ops (add, mul, relu, sigmoid, tanh, gelu, ...) and anything without a rule: 1 per output
  element; reductions (sum, mean, max, argmax, any, var_mean, vector norms, ...): 1 per input element;
* softmax, log-softmax, softmin and Gumbel softmax: 5 per element (max, subtract, exp, sum, divide);
* batch norm: 2 per element in inference (scale and shift with running statistics), 4 in training (batch
  statistics, then normalise; 2 for a module in eval() or a call with training=False in a training step, a
  frozen BatchNorm); layer norm: 5 per element; group norm and instance norm compute their statistics from
  the input in inference too: 5 per element, as layer norm (instance norm with running statistics,
  `track_running_stats` in eval() / `use_input_stats=False`: 2, as batch norm); RMS norm: 3 per element (layer norm's less the mean and its
  subtraction). (torch's FlopCounterMode counts no norm.)
* pooling (max, average, power-average): output elements x kernel elements; adaptive average pooling: 1 per
  input element;
* interpolation (F.interpolate, nn.Upsample): a weighted sum of n neighbours per output element, 2 n - 1
  (nearest 1, linear 3, bilinear 7, trilinear 15, bicubic 31); mode "area" as adaptive average pooling;
  F.grid_sample likewise (bilinear: 4 neighbours in 2-D, 8 in 3-D);
* local response norm (module or function): size + 5 per element (square, window sum, scale, shift, power,
  divide); F.normalize: 3 per element (power, sum, divide); F.pairwise_distance (and nn.PairwiseDistance): 3
  per element of the broadcast inputs (subtract, power, sum), as torch.dist, and torch.cdist for each pair
  of rows; F.cosine_similarity (and nn.CosineSimilarity): 6 (the sums of x1 x2, x1 x1 and x2 x2); trace: 1 per diagonal element; linalg.norm
  and linalg.matrix_norm (vector 2-norm, Frobenius) as the reductions;
* data movement (padding, pixel and channel shuffles, flip, roll, repeat, gather, scatter, index_copy,
  masked_scatter, index_put without accumulate, unfold / im2col, ...): 1 per output element, as elementwise ops;
  fold (nn.Fold, F.fold, ATen's col2im) adds its patches up: 1 per input element, as a scatter-add; those in
  `GATHERS` (index_select, indexing by a tensor) read only the part of their data input that they take (of
  a parameter, `self.weight[idx]`, they are embedding lookups, below), as any op reads only the part of a
  parameter that a constant index or slice takes (`x + self.e[3]`: one row);
* scans (cumsum, cumprod, cummax, cummin, logcumsumexp): 1 per input element (one add, multiply or compare
  each, as the reductions; logcumsumexp as logsumexp);
* scatter-adds (scatter_add, scatter_reduce, index_add, index_put with accumulate): 1 per source element
  added in (scatter_reduce "mean" also divides: + 1 per output element; index_add with an alpha other than 1
  multiplies: + 1 per source element; index_put counts its values as given, not broadcast);
* sorting (sort, argsort, msort): n log2 n compares per sorted row of n elements; the top k of n (topk, k < n):
  one pass over the row (n) and, when they come sorted, k log2 k more (top n of n: a sort); kthvalue: a
  selection, n per row;
* recurrent layers (nn.LSTM / GRU / RNN) and cells (nn.LSTMCell / GRUCell / RNNCell): the cell formula of
  `rnn_cell_flops` per step, layer and direction;
* cross-entropy: log-softmax (5 per logit) + 1 per sample (pick and average; classes are dimension 1, so
  logits [N, C, H, W] have N x H x W samples); it saves the log-probabilities for its backward pass;
  negative log-likelihood: 1 per sample; mean squared error and the other elementwise losses (L1, smooth L1,
  Huber, binary cross-entropy with or without logits, KL divergence, soft margin, hinge embedding, Poisson
  negative log-likelihood, margin ranking): 3 per element of the (broadcast) inputs (the difference or log
  term, its penalty, the reduction); KL divergence with reduction "batchmean" + 1 (its divide by the batch
  size, an op of its own in torch.export); Poisson NLL with `full` + 3 per element (the Stirling term);
  `loss_cost` has the rest: Gaussian NLL, triplet margin (with distance), cosine embedding, multi-class and
  multi-label margin, multi-label soft margin; with reduction "none" a loss counts no reduction (of the
  elementwise ones 2 per element);
* embedding lookups, concatenation, stacking: no FLOPs (only bytes); an embedding bag (nn.EmbeddingBag,
  F.embedding_bag): 1 per looked-up element (indices x embedding dim: the adds of sum and mean, the compares
  of max), 1 more per looked-up element with per_sample_weights (the multiply), and for mode "mean" 1 per
  output element (the divide). A lookup reads the rows it gathers, not its whole table (its parameter bytes
  stay the whole table); `self.weight[idx]` and `self.weight.index_select(0, idx)` are lookups too (kind
  "embedding", as ONNX's Gather of a weight).

A module can bring its own rule: give it a method `capture_cost(inputs, outputs, training) -> Cost`
(`inputs`/`outputs`: lists of `TensorInfo`) and, optionally, a class attribute `capture_kind`; the fx
front end then keeps it as one leaf op (see `suite/zoo/layers.py` for the LSTM cell and attention step).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

FP32_BYTES = 4
SOFTMAX_FLOPS_PER_ELEMENT = 5
LAYER_NORM_FLOPS_PER_ELEMENT = 5  # also group norm and instance norm with input statistics
RMS_NORM_FLOPS_PER_ELEMENT = 3
BATCH_NORM_FLOPS_PER_ELEMENT = {False: 2, True: 4}  # keyed by training


@dataclass(frozen=True)
class TensorInfo:
    shape: tuple[int, ...]
    itemsize: int
    floating: bool = True  # a floating-point (or complex) tensor, which can carry a gradient

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize


@dataclass(frozen=True)
class Cost:
    kind: str
    flops: float
    macs: float = 0.0
    saved_bytes: int = 0  # activations internal to the op kept for its backward pass (training)
    weight_bytes_read: int | None = None  # bytes of its weights it reads, where fewer than all (a lookup's rows)


def collect(obj: Any, cls: type) -> list[Any]:
    """Every instance of `cls` in a nested structure of lists, tuples, dicts, slices and dataclass instances
    (a model's output object), in order."""
    out: list[Any] = []

    def walk(x: Any) -> None:
        if isinstance(x, cls):
            out.append(x)
        elif isinstance(x, list | tuple):
            for y in x:
                walk(y)
        elif isinstance(x, dict):
            for y in x.values():
                walk(y)
        elif isinstance(x, slice):
            walk((x.start, x.stop, x.step))
        elif dataclasses.is_dataclass(x) and not isinstance(x, type):
            for f in dataclasses.fields(x):
                walk(getattr(x, f.name))

    walk(obj)
    return out


def tensors(obj: Any) -> list[TensorInfo]:
    """Every TensorInfo in a nested structure of args, in order."""
    return collect(obj, TensorInfo)


def _numel(xs: Iterable[TensorInfo]) -> int:
    return sum(x.numel for x in xs)


def _arg(args: tuple, kwargs: dict, i: int, key: str, default: Any = None) -> Any:
    """A call's argument given at position `i` or by name `key`."""
    return args[i] if len(args) > i else kwargs.get(key, default)


def _broadcast(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """The broadcast shape of two shapes."""
    n = max(len(a), len(b))
    a, b = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
    return tuple(max(x, y) if min(x, y) != 0 else 0 for x, y in zip(a, b, strict=True))


def _pair(v: Any, n: int) -> tuple[int, ...]:
    if isinstance(v, int):
        return (v,) * n
    return tuple(int(x) for x in v)


# -- building blocks (pure functions of shapes) --------------------------------------------------------
def linear_cost(in_shape: tuple[int, ...], out_features: int, bias: bool) -> Cost:
    rows = math.prod(in_shape[:-1])
    macs = rows * in_shape[-1] * out_features
    return Cost("linear", 2.0 * macs + (rows * out_features if bias else 0), macs)


def conv_cost(out_shape: tuple[int, ...], in_channels_per_group: int, kernel: tuple[int, ...], bias: bool, kind: str) -> Cost:
    out_numel = math.prod(out_shape)
    macs = out_numel * in_channels_per_group * math.prod(kernel)
    return Cost(kind, 2.0 * macs + (out_numel if bias else 0), macs)


def conv_transpose_cost(x: TensorInfo, weight: tuple[int, ...], out: TensorInfo, bias: bool, kind: str) -> Cost:
    """A transposed convolution: every input element meets (out channels / groups) x kernel weights
    (weight shape: in channels, out channels / groups, kernel...)."""
    macs = x.numel * math.prod(weight[1:])
    return Cost(kind, 2.0 * macs + (out.numel if bias else 0), float(macs))


def bilinear_cost(x1: TensorInfo, weight: tuple[int, ...], out: TensorInfo, bias: bool) -> Cost:
    """nn.Bilinear / F.bilinear, y = x1^T W x2 + b (weight: out features, in1 features, in2 features): one
    multiply-add per output element and pair of input features, plus 1 per output element for a bias."""
    macs = out.numel * weight[1] * weight[2]
    return Cost("bilinear", 2.0 * macs + (out.numel if bias else 0), float(macs))


def matmul_cost(a: tuple[int, ...], out: tuple[int, ...]) -> Cost:
    k = a[-1] if a else 1
    macs = math.prod(out) * k
    return Cost("matmul", 2.0 * macs, macs)


def tensordot_cost(a: TensorInfo, dims: Any, out: TensorInfo) -> Cost | None:
    """torch.tensordot: MACs = output elements x the contracted sizes of `a` (`dims`: an int, the last dims
    of a, or the pair of dimension lists); None for dims given as a tensor."""
    if isinstance(dims, int):
        contracted = a.shape[len(a.shape) - dims:] if dims else ()
    elif isinstance(dims, list | tuple) and len(dims) == 2 and not tensors(dims):
        contracted = tuple(a.shape[i] for i in dims[0])
    else:
        return None
    macs = out.numel * math.prod(contracted)
    return Cost("matmul", 2.0 * macs, float(macs))


def attention_cost(rows: int, keys: int, d_qk: int, d_v: int, kind: str = "attention") -> Cost:
    """Scaled dot-product attention of `rows` queries (all heads) over `keys` keys: the products q k^T (`d_qk`)
    and probabilities v (`d_v`), and the softmax of the scores."""
    macs = rows * keys * (d_qk + d_v)
    return Cost(kind, 2.0 * macs + SOFTMAX_FLOPS_PER_ELEMENT * rows * keys, float(macs))


def multi_dot_cost(ins: list[TensorInfo]) -> Cost:
    """linalg.multi_dot / chain_matmul: the matrix products in the order of fewest multiply-adds (torch's
    choice); a 1-D first (last) operand is a row (column) vector."""
    dims = [ins[0].shape[0] if len(ins[0].shape) == 2 else 1]
    dims += [t.shape[-1] if len(t.shape) == 2 or i < len(ins) - 1 else 1 for i, t in enumerate(ins)]
    n = len(ins)
    best = [[0] * n for _ in range(n)]  # best[i][j]: MACs of the product of operands i..j
    for length in range(1, n):
        for i in range(n - length):
            j = i + length
            best[i][j] = min(best[i][k] + best[k + 1][j] + dims[i] * dims[k + 1] * dims[j + 1] for k in range(i, j))
    macs = best[0][n - 1]
    return Cost("matmul", 2.0 * macs, float(macs))


def einsum_cost(equation: Any, ins: list[TensorInfo]) -> Cost | None:
    """torch.einsum, as ATen computes it without opt_einsum (with opt_einsum installed torch may choose a
    cheaper order: the count is then an upper bound). Of one operand (a sum, trace or transpose): 1 FLOP
    per input element. Of more: the operands are multiplied in from the left. Before each product, an index
    that is not in the output and that no other operand still holds (with a size other than 1) is summed out
    of the side that holds it (1 FLOP per element of that side); the product then costs one multiply-add
    for every combination of the indices of its two sides (`...` broadcast, a size-1 index broadcasting
    against the other side), and sums out the indices that no later operand needs. An equation that does
    not match its operands: None (the fallback)."""
    if not isinstance(equation, str) or not ins:
        return None
    lhs, arrow, rhs = equation.replace(" ", "").partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ins):
        return None
    if len(ins) == 1:
        return Cost("einsum", float(ins[0].numel))
    operands: list[dict[Any, int]] = []  # index -> size, per operand
    for term, t in zip(terms, ins, strict=True):
        head, dots, tail = term.partition("...")
        middle = len(t.shape) - len(head) - len(tail) if dots else 0
        if middle < 0 or len(head) + middle + len(tail) != len(t.shape):
            return None
        # the dims under `...` are aligned from the right across operands: ("...", 1) is the last of them
        letters = [*head, *(("...", middle - k) for k in range(middle)), *tail]
        operands.append(dict(zip(letters, t.shape, strict=True)))  # a repeated index is a diagonal: one size
    dotted = {x for op in operands for x in op if isinstance(x, tuple)}
    if arrow:
        out = set(rhs.replace("...", "")) | (dotted if "..." in rhs else set())
    else:  # implicit output: the letters that occur once, and the `...` dims
        every = [x for term in terms for x in term.replace("...", "")]
        out = {x for x in every if every.count(x) == 1} | dotted
    holders = {x: sum(op.get(x, 1) != 1 for op in operands) for op in operands for x in op if x not in out}
    macs = summed = 0
    a = dict(operands[0])
    for b in map(dict, operands[1:]):
        both = [*a, *(x for x in b if x not in a)]
        contracted: set[Any] = set()
        drop_a: list[Any] = []  # indices summed out of one side before the product
        drop_b: list[Any] = []
        for x in both:
            if x in out:
                continue
            if a.get(x, 1) != 1 and b.get(x, 1) != 1:
                holders[x] -= 1
                if holders[x] == 1:  # no later operand holds it: summed by this product
                    contracted.add(x)
                    holders[x] = 0
            elif holders[x] == 1 and (a.get(x, 1) != 1 or b.get(x, 1) != 1):  # one side only
                (drop_a if a.get(x, 1) != 1 else drop_b).append(x)
                holders[x] = 0
        for side, dropped in ((a, drop_a), (b, drop_b)):  # one sum per side over all its indices to drop
            if dropped:
                summed += math.prod(side.values())
                side.update(dict.fromkeys(dropped, 1))
        macs += math.prod(max(a.get(x, 1), b.get(x, 1)) for x in both)
        a = {x: max(a.get(x, 1), b.get(x, 1)) for x in both if x not in contracted}
    return Cost("einsum", 2.0 * macs + summed, float(macs))


def lstm_cell_flops(batch: int, input_size: int, hidden: int) -> tuple[float, float]:
    """(FLOPs, MACs) of one LSTM cell step, written as TensorFlow's BasicLSTMCell computes it.

    gates = x W_ih^T + b_ih + h W_hh^T + b_hh          2 B 4H (I + H) + 3 B 4H (two biases, one add)
    i, f, o = sigmoid(.), g = tanh(.)                  B 4H
    c' = f c + i g                                     3 B H
    h' = o tanh(c')                                    2 B H
    total = 8 B H (I + H) + 21 B H
    """
    macs = 4 * batch * hidden * (input_size + hidden)
    return 2.0 * macs + 21.0 * batch * hidden, float(macs)


def rnn_cell_flops(gates: int, batch: int, input_size: int, hidden: int, proj: int = 0,
                   bias: bool = True) -> tuple[float, float]:
    """(FLOPs, MACs) of one step of a recurrent cell with `gates` gates (LSTM 4, GRU 3, RNN 1): the LSTM
    formula of `lstm_cell_flops` (with a projection of h to `proj` features: + B H P MACs), else
    2 x MACs + 6 per gate element. Of those, 2 per gate element are the adds of the two biases b_ih and
    b_hh: a cell without biases (`bias=False`) has 2 x B x gates x H fewer."""
    no_bias = 0.0 if bias else 2.0 * gates * batch * hidden
    if gates == 4 and proj:
        m = 4 * batch * hidden * (input_size + proj) + batch * hidden * proj  # gates, then h = W_hr h
        return 2.0 * m + 21.0 * batch * hidden - no_bias, float(m)
    if gates == 4:
        f, m = lstm_cell_flops(batch, input_size, hidden)
        return f - no_bias, m
    m = gates * batch * hidden * (input_size + hidden)
    return 2.0 * m + 6.0 * gates * batch * hidden - no_bias, float(m)


def loss_samples(logits: TensorInfo) -> int:
    """Samples of a classification loss: classes are dimension 1 of [N, C, d1, ...] (N x d1 x ... samples),
    the only dimension of an unbatched [C] (one sample)."""
    return logits.numel // logits.shape[1] if len(logits.shape) >= 2 and logits.shape[1] else 1


def cross_entropy_cost(logits: TensorInfo, kind: str = "cross_entropy") -> Cost:
    flops = SOFTMAX_FLOPS_PER_ELEMENT * logits.numel + loss_samples(logits)
    return Cost(kind, float(flops), 0.0, saved_bytes=logits.nbytes)


def loss_cost(kind: str, ins: list[TensorInfo], *, reduction: str = "mean", full: bool = False, swap: bool = False,
              p: Any = 1, weighted: bool = False) -> Cost:
    """A loss other than cross-entropy and NLL, module or function, by its function's name (`kind`). Its
    `reduction` ("mean", "sum", "batchmean") costs 1 per element it adds up; "none" adds nothing up and counts
    no reduction (the terms marked `reduction` below):
    * the elementwise losses (`ELEMENTWISE_LOSSES`): 3 per element of the broadcast inputs (the difference or
      log term, its penalty, the reduction); KL divergence with "batchmean" + 1 (the divide by the batch
      size); Poisson NLL with `full` + 3 per element (the Stirling term: its log terms, their sum, the mask);
    * Gaussian NLL (input, target, var): 2 per element of var (its clamp at eps, its log), 5 per element of the
      broadcast inputs (subtract, square, divide by var, add the log, halve), + 1 with `full` (the constant),
      + 1 (the reduction);
    * triplet margin: each distance d(a, p), d(a, n) (and with `swap` d(p, n)) 3 per element of the
      broadcast inputs, as pairwise_distance; per sample 3 (d(a, p) - d(a, n) + margin, the clamp at 0, the
      reduction), + 1 with `swap` (the smaller of d(a, n) and d(p, n));
    * triplet margin with distance: as triplet margin, the distances counted as pairwise_distance (the fx
      capture keeps the loss as one op and does not trace its `distance_function`: a user's function is
      counted as that; torch.export traces it, so the two agree for the default distance), and per sample
      1 more (the margin is added and the distances subtracted as two ops, as torch.export records them);
    * cosine embedding: 6 per element of the broadcast inputs, as cosine_similarity; per sample 3 (the
      penalty, 1 - cos or max(0, cos - margin), the choice by the target, the reduction);
    * multi-class margin (input [N, C] or [C]): per score 3 (margin - x[y] + x[i], the clamp at 0, the sum
      over classes), + 1 for `p` = 2 (the square), + 1 with a class `weight` (the multiply); per sample 2 (the
      divide by C, the reduction);
    * multi-label margin (input [N, C] or [C]): as multi-class margin with one target class per sample (each
      further target of a sample takes another 3 per score of it, which the shapes do not tell);
    * multi-label soft margin (classes: the last dimension): per score 9 (the two log-sigmoid terms, their
      products with y and 1 - y, sum, negation, the sum over classes; + 1 with a class `weight`), per sample
      2 (the divide by C, the reduction), as torch.export decomposes it."""
    reduce = int(reduction != "none")
    shape = functools.reduce(_broadcast, (t.shape for t in ins if t.floating), ())
    n = math.prod(shape)
    if kind in ("triplet_margin_loss", "triplet_margin_with_distance_loss"):
        samples = n // shape[-1] if shape and shape[-1] else 1
        per_sample = 2 + reduce + swap + (kind == "triplet_margin_with_distance_loss")
        return Cost(kind, float((3 if swap else 2) * 3 * n + per_sample * samples))
    if kind == "cosine_embedding_loss":
        rows = shape[:-1] if len(shape) > 1 else ()  # the pair's features: its last dimension
        return Cost(kind, float(6 * n + (2 + reduce) * math.prod(rows)))
    if kind in ("multi_margin_loss", "multilabel_margin_loss"):
        x = ins[0]
        per_score = 3 + (p == 2) + weighted
        return Cost(kind, float(per_score * x.numel + (1 + reduce) * loss_samples(x)))
    if kind == "multilabel_soft_margin_loss":
        x = ins[0]
        samples = x.numel // x.shape[-1] if x.shape and x.shape[-1] else 1
        return Cost(kind, float((9 + weighted) * x.numel + (1 + reduce) * samples))
    if kind == "gaussian_nll_loss":
        return Cost(kind, float(2 * ins[2].numel + (5 + full + reduce) * n))
    return Cost(kind, float((2 + reduce) * n + (reduction == "batchmean") + (3 * n if full else 0)))


# ATen's Reduction enum, and the place of `reduction` in the signature of each ATen loss op (torch.export's)
_ATEN_REDUCTION = {0: "none", 1: "mean", 2: "sum"}
_ATEN_REDUCTION_AT = {"mse_loss": 2, "l1_loss": 2, "smooth_l1_loss": 2, "huber_loss": 2, "kl_div": 2,
                      "soft_margin_loss": 2, "multilabel_margin_loss": 2, "binary_cross_entropy": 3,
                      "hinge_embedding_loss": 3, "binary_cross_entropy_with_logits": 4, "margin_ranking_loss": 4,
                      "cosine_embedding_loss": 4, "poisson_nll_loss": 5, "multi_margin_loss": 5,
                      "triplet_margin_loss": 7}


def loss_reduction(name: str, args: tuple, kwargs: dict) -> str:
    """The reduction of a loss call: given by name, as a string among the positional arguments (a torch
    function's), or as the int of ATen's Reduction enum at its place in the ATen op; the deprecated
    `reduce=False` (by name) is "none"; else "mean", the default of every loss."""
    if kwargs.get("reduce") is False:  # before `reduction`, which the fx capture fills in with its default
        return "none"
    if isinstance(kwargs.get("reduction"), str):
        return kwargs["reduction"]
    given = [a for a in args if isinstance(a, str)]
    if given:
        return given[0]
    at = _ATEN_REDUCTION_AT.get(name)
    value = _arg(args, kwargs, at, "reduction") if at is not None else None
    if isinstance(value, int) and not isinstance(value, bool):
        return _ATEN_REDUCTION.get(value, "mean")
    return "mean"


def embedding_bag_cost(indices: TensorInfo, dim: int, itemsize: int, mode: str, weighted: bool,
                       out: TensorInfo) -> Cost:
    """An embedding bag looking up `indices` rows of `dim` elements (`itemsize` bytes each) and reducing
    them per bag (see the module docstring); it reads those rows of its table, not all of it."""
    looked_up = indices.numel * dim
    flops = looked_up * (2 if weighted else 1) + (out.numel if mode == "mean" else 0)
    return Cost("embedding_bag", float(flops), weight_bytes_read=looked_up * itemsize)


INTERPOLATION_NEIGHBOURS = {"nearest": 1, "nearest-exact": 1, "linear": 2, "bilinear": 4, "bicubic": 16,
                            "trilinear": 8}


def interpolate_cost(x: TensorInfo, out: TensorInfo, mode: str, kind: str = "interpolate") -> Cost | None:
    """F.interpolate / nn.Upsample / F.grid_sample: 2 n - 1 FLOPs per output element for n neighbours weighed;
    "area" is an adaptive average pooling (1 per input element); None for a mode without a rule."""
    if mode == "area":
        return Cost(kind, float(x.numel))
    n = INTERPOLATION_NEIGHBOURS.get(mode)
    return None if n is None else elementwise(kind, [out], 2 * n - 1)


def sort_cost(kind: str, x: TensorInfo, dim: int, k: int | None = None, sort_k: bool = True) -> Cost:
    """Sorting the rows of `x` along `dim` (n elements each): n log2 n per row; with `k` < n, the top k of
    each row: n, plus k log2 k when they come sorted (`sort_k`)."""
    n = x.shape[dim] if x.shape else 1
    rows = x.numel // n if n else 0
    if k is None or (k >= n and sort_k):
        per_row = n * math.log2(n) if n > 1 else 0.0
    else:
        per_row = n + (k * math.log2(k) if sort_k and k > 1 else 0.0)
    return Cost(kind, float(rows * per_row))


def pool_cost(out: TensorInfo, kernel: tuple[int, ...], kind: str) -> Cost:
    return Cost(kind, float(out.numel * math.prod(kernel)))


def elementwise(kind: str, out: list[TensorInfo], per_element: float = 1.0) -> Cost:
    return Cost(kind, float(per_element * _numel(out)))


# -- functions and methods ------------------------------------------------------------------------------
SHAPE_ONLY = frozenset(
    {
        "getitem", "getattr", "view", "view_as", "reshape", "reshape_as", "permute", "transpose", "t",
        "contiguous", "size", "dim", "flatten", "unflatten", "squeeze", "unsqueeze", "expand", "expand_as",
        "chunk", "split", "unbind", "narrow", "select", "detach", "numel", "movedim", "moveaxis", "swapaxes",
        "swapdims", "adjoint", "diagonal", "as_strided", "broadcast_to", "ravel", "atleast_1d", "atleast_2d",
        "atleast_3d", "tensor_split", "split_with_sizes", "hsplit", "vsplit", "dsplit", "view_as_real",
        "view_as_complex",
    }
)
DROPOUT = frozenset({"dropout", "alpha_dropout", "feature_alpha_dropout", "dropout1d", "dropout2d", "dropout3d"})
CONCAT = frozenset({"cat", "concat", "concatenate", "stack", "hstack", "vstack", "dstack", "row_stack", "column_stack"})
MATMUL = frozenset({"matmul", "bmm", "mm", "baddbmm", "addmm", "addbmm", "mv", "dot", "vdot", "inner"})
REDUCTIONS = frozenset({"sum", "mean", "amax", "amin", "max", "min", "prod", "norm", "var", "std", "logsumexp",
                        "argmax", "argmin", "aminmax", "all", "any", "count_nonzero", "nansum", "nanmean", "median",
                        "var_mean", "std_mean", "linalg_vector_norm"})
# the elementwise losses: their torch.nn module's name -> the function's name (the kind)
_LOSS_KINDS = {"MSELoss": "mse_loss", "L1Loss": "l1_loss", "SmoothL1Loss": "smooth_l1_loss", "HuberLoss": "huber_loss",
               "BCELoss": "binary_cross_entropy", "BCEWithLogitsLoss": "binary_cross_entropy_with_logits",
               "KLDivLoss": "kl_div", "SoftMarginLoss": "soft_margin_loss", "HingeEmbeddingLoss": "hinge_embedding_loss",
               "PoissonNLLLoss": "poisson_nll_loss", "MarginRankingLoss": "margin_ranking_loss"}
ELEMENTWISE_LOSSES = frozenset(_LOSS_KINDS.values())
# the losses with a structure of their own (see `loss_cost`): module name -> function name, the ATen name too
_STRUCTURED_LOSS_KINDS = {"TripletMarginLoss": "triplet_margin_loss", "CosineEmbeddingLoss": "cosine_embedding_loss",
                          "MultiMarginLoss": "multi_margin_loss", "MultiLabelMarginLoss": "multilabel_margin_loss",
                          "MultiLabelSoftMarginLoss": "multilabel_soft_margin_loss",
                          "GaussianNLLLoss": "gaussian_nll_loss",
                          "TripletMarginWithDistanceLoss": "triplet_margin_with_distance_loss"}
SOFTMAX = frozenset({"softmax", "log_softmax", "softmin", "gumbel_softmax"})
POOL = {
    "max_pool1d": 1, "max_pool2d": 2, "max_pool3d": 3, "avg_pool1d": 1, "avg_pool2d": 2, "avg_pool3d": 3,
}
# functions, methods and ATen ops whose cost is 1 FLOP per output element by design (elementwise maths, casts
# and data movement, by their usual names, torch's other names and the ATen names the export front end sees),
# and their in-place forms (`clamp_`): `function_cost` gives them that cost; any other name without a rule is a
# fallback, named as such by the front ends
ELEMENTWISE = frozenset(
    """add sub mul div truediv floordiv neg pos relu relu_ gelu tanh sigmoid silu exp log sqrt rsqrt pow abs clamp
    clamp_min clamp_max maximum minimum where masked_fill masked_fill_ iadd isub imul itruediv erf hardtanh
    leaky_relu elu selu softplus sin cos reciprocal square sign add_ mul_ sub_ div_ tanh_ sigmoid_ mish
    hardswish hardsigmoid lt gt le ge eq ne logical_not and_ or_ float half double to type_as clone pad
    softsign rsub matmul_ addcmul addcdiv lerp copy fill zero flip roll repeat tile repeat_interleave tril triu
    gather index_select index scatter pixel_shuffle pixel_unshuffle channel_shuffle unfold one_hot relu6 celu glu
    log_sigmoid hardshrink softshrink tanhshrink rrelu threshold prelu erfc erfinv log1p expm1 log2 log10 exp2
    tan asin acos atan sinh cosh asinh acosh atanh atan2 logit floor ceil round trunc frac fmod remainder
    nan_to_num clip sgn hypot xlogy fmax fmin logical_and logical_or logical_xor isnan isinf isfinite bucketize
    multiply subtract negative positive absolute divide true_divide greater greater_equal less less_equal
    not_equal invert xor bitwise_not bitwise_and bitwise_or bitwise_xor long int bool short byte char bfloat16
    signbit copysign float_power heaviside sinc deg2rad rad2deg lgamma digamma i0 fix arccos arcsin arctan
    arctan2 fliplr flipud rot90 diff kron to_copy lift_fresh_copy floor_divide select_scatter slice_scatter
    constant_pad_nd im2col reflection_pad1d reflection_pad2d reflection_pad3d replication_pad1d replication_pad2d
    replication_pad3d index_copy index_fill masked_scatter masked_select take take_along_dim""".split()
)
SCANS = frozenset({"cumsum", "cumprod", "cummax", "cummin", "logcumsumexp"})
# ops that take parts of their data input (argument 0) by an index tensor, as ONNX Gather: `x.index_select(1, idx)`,
# and `x[:, idx]` / `x[mask]` (fx's getitem with a tensor index, ATen's index), a copy, not a view: 1 FLOP per
# output element, and they read at most their output's bytes of that input (plus the index)
GATHERS = frozenset({"index_select", "index"})
ADAPTIVE_POOL = frozenset(
    {"adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d", "adaptive_max_pool1d",
     "adaptive_max_pool2d", "adaptive_max_pool3d"}
)
CONV = {"conv1d": 1, "conv2d": 2, "conv3d": 3}
CONV_TRANSPOSE = frozenset({"conv_transpose1d", "conv_transpose2d", "conv_transpose3d"})
FACTORIES = frozenset({"zeros", "ones", "empty", "full", "arange", "rand", "randn", "zeros_like", "ones_like",
                       "empty_like", "full_like", "rand_like", "randn_like", "randint_like", "new_zeros", "new_ones",
                       "new_empty", "new_full", "tensor"})


def function_cost(name: str, args: tuple, kwargs: dict, out: list[TensorInfo], training: bool) -> Cost | None:
    """Cost of a torch function / tensor method by its name; None: no specific rule (use the default)."""
    ins = tensors(args) + tensors(kwargs)
    if name in ("outer", "ger", "addr"):  # (input +) a b^T, a product of contracted size 1
        macs = ins[-2].numel * ins[-1].numel
        return Cost("matmul", 2.0 * macs + (out[0].numel if name == "addr" else 0), float(macs))
    if name == "tensordot":
        return tensordot_cost(ins[0], _arg(args, kwargs, 2, "dims", 2), out[0])
    if name in ("linalg_multi_dot", "multi_dot", "chain_matmul") and len(ins) > 1:
        return multi_dot_cost(ins)
    if name == "linalg_vecdot":  # sum(x * y, dim): one multiply-add per element of the broadcast operands
        macs = math.prod(_broadcast(ins[0].shape, ins[1].shape))
        return Cost("matmul", 2.0 * macs, float(macs))
    if name == "bilinear":  # (input1, input2, weight, bias): weight [out, in1, in2]
        return bilinear_cost(ins[0], ins[2].shape, out[0], len(ins) > 3)
    if name in ("addmm", "addmv", "baddbmm", "addbmm") and len(ins) > 2:  # input + a @ b: the add counts as a bias
        a = ins[1]
        batches = a.shape[0] if name == "addbmm" else 1  # addbmm also sums the batch of products
        macs = batches * math.prod(out[0].shape) * a.shape[-1]
        return Cost("matmul", 2.0 * macs + out[0].numel, float(macs))
    if name in MATMUL:
        return matmul_cost(ins[0].shape, out[0].shape)
    if name == "linear":
        weight = ins[1]
        bias = len(ins) > 2 or kwargs.get("bias") is not None
        return linear_cost(ins[0].shape, weight.shape[0], bias)
    if name in CONV:
        weight = ins[1]
        bias = len(ins) > 2
        return conv_cost(out[0].shape, weight.shape[1], tuple(weight.shape[2:]), bias, name)
    if name in CONV_TRANSPOSE:
        return conv_transpose_cost(ins[0], ins[1].shape, out[0], len(ins) > 2, name)
    if name in ("convolution", "convolution_overrideable"):  # torch.convolution / torch._convolution / ATen's:
        weight = ins[1]  # (input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
        bias = _arg(args, kwargs, 2, "bias") is not None
        if _arg(args, kwargs, 6, "transposed", False):
            return conv_transpose_cost(ins[0], weight.shape, out[0], bias, "conv_transpose")
        return conv_cost(out[0].shape, weight.shape[1], tuple(weight.shape[2:]), bias, "convolution")
    if name in CONCAT:
        return Cost("concat", 0.0)
    if name == "embedding":
        return Cost("embedding", 0.0)
    if name == "embedding_bag":  # (input, weight, offsets, max_norm, norm_type, scale_grad_by_freq, mode, sparse,
        weight = _arg(args, kwargs, 1, "weight")  # per_sample_weights, ...)
        return embedding_bag_cost(_arg(args, kwargs, 0, "input"), weight.shape[-1], weight.itemsize,
                                  _arg(args, kwargs, 6, "mode", "mean"),
                                  _arg(args, kwargs, 8, "per_sample_weights") is not None, out[0])
    if name in SOFTMAX:
        return elementwise(name, out, SOFTMAX_FLOPS_PER_ELEMENT)
    if name in ("cross_entropy",):
        return cross_entropy_cost(ins[0])
    if name == "nll_loss":
        return Cost("nll_loss", float(loss_samples(ins[0])))
    if name in ELEMENTWISE_LOSSES or name in _STRUCTURED_LOSS_KINDS.values():
        # the options sit at the same positions in the torch function and the ATen op; the reduction does not
        # (`loss_reduction`; ATen's kl_div never sees "batchmean", which torch.export records as a sum and a divide)
        opts = {"poisson_nll_loss": {"full": bool(_arg(args, kwargs, 3, "full", False))},
                "gaussian_nll_loss": {"full": bool(_arg(args, kwargs, 3, "full", False))},
                "triplet_margin_loss": {"swap": bool(_arg(args, kwargs, 6, "swap", False))},
                "triplet_margin_with_distance_loss": {"swap": bool(kwargs.get("swap", False))},  # keyword-only
                "multi_margin_loss": {"p": _arg(args, kwargs, 2, "p", 1),
                                      "weighted": _arg(args, kwargs, 4, "weight") is not None},
                "multilabel_soft_margin_loss": {"weighted": _arg(args, kwargs, 2, "weight") is not None},
                }.get(name, {})
        return loss_cost(name, ins, reduction=loss_reduction(name, args, kwargs), **opts)
    if name in ("fold", "col2im"):  # the patches added up into the output: 1 per input element
        return Cost(name, float(ins[0].numel))
    if name in ("max", "min") and len(ins) > 1:  # torch.max(a, b): elementwise, as torch.maximum(a, b)
        return elementwise(name, out)
    if name in REDUCTIONS:
        return Cost(name, float(ins[0].numel if ins else _numel(out)))
    base = name.removesuffix("_")  # in-place forms (x.cumsum_, x.scatter_add_) as the others
    if base in SCANS:
        return Cost(name, float(ins[0].numel))
    if base in ("sort", "argsort", "msort"):  # sort(input, dim=-1, ...); msort sorts along dimension 0
        return sort_cost(name, ins[0], 0 if base == "msort" else _arg(args, kwargs, 1, "dim", -1))
    if base == "topk":  # (input, k, dim=-1, largest=True, sorted=True)
        return sort_cost(name, ins[0], _arg(args, kwargs, 2, "dim", -1), _arg(args, kwargs, 1, "k"),
                         bool(_arg(args, kwargs, 4, "sorted", True)))
    if base == "kthvalue":  # (input, k, dim=-1): a selection
        return sort_cost(name, ins[0], _arg(args, kwargs, 2, "dim", -1), 1, False)
    if base in ("scatter_add", "scatter_reduce"):  # (input, dim, index, src, reduce): one per index element
        n = _arg(args, kwargs, 2, "index").numel
        mean = base == "scatter_reduce" and _arg(args, kwargs, 4, "reduce") == "mean"
        return Cost(name, float(n + (out[0].numel if mean else 0)))
    if base == "index_add":  # (input, dim, index, source, *, alpha=1)
        n = _arg(args, kwargs, 3, "source").numel
        return Cost(name, float(n * (1 if kwargs.get("alpha", 1) == 1 else 2)))
    if base == "index_put":  # (input, indices, values, accumulate=False)
        if _arg(args, kwargs, 3, "accumulate", False):
            return Cost(name, float(_arg(args, kwargs, 2, "values").numel))
        return elementwise(name, out)
    if name == "dist":  # the p-norm of a - b: 3 per element of the broadcast inputs, as pairwise_distance
        return Cost(name, float(3 * math.prod(_broadcast(ins[0].shape, ins[1].shape))))
    if name == "cdist":  # x1 [..., P, M], x2 [..., R, M]: a distance of M features per pair of rows
        a, b = ins[0], ins[1]
        batch = math.prod(_broadcast(a.shape[:-2], b.shape[:-2]))
        return Cost(name, float(3 * batch * a.shape[-2] * b.shape[-2] * a.shape[-1]))
    if name == "trace":  # the sum of the diagonal
        return Cost(name, float(min(ins[0].shape)))
    if name in ("linalg_norm", "linalg_matrix_norm") and _arg(args, kwargs, 1, "ord") in (None, "fro"):
        return Cost(name, float(ins[0].numel))  # a vector 2-norm or the Frobenius norm: a reduction
    if name == "layer_norm":
        return elementwise("layer_norm", out, LAYER_NORM_FLOPS_PER_ELEMENT)
    if name == "batch_norm":  # (input, running_mean, running_var, weight, bias, training, ...); ATen's too (weight,
        # bias first): batch statistics only in a training step and where the call computes them (not a frozen one)
        batch_stats = training and bool(_arg(args, kwargs, 5, "training", False))
        return elementwise(name, out, BATCH_NORM_FLOPS_PER_ELEMENT[batch_stats])
    if name == "group_norm":
        return elementwise(name, out, LAYER_NORM_FLOPS_PER_ELEMENT)
    if name == "instance_norm":  # (input, running_mean, running_var, weight, bias, use_input_stats, ...), ATen's too
        stats = _arg(args, kwargs, 5, "use_input_stats", True)
        return elementwise(name, out, LAYER_NORM_FLOPS_PER_ELEMENT if stats else BATCH_NORM_FLOPS_PER_ELEMENT[False])
    if name == "rms_norm":
        return elementwise(name, out, RMS_NORM_FLOPS_PER_ELEMENT)
    if name in POOL:
        kernel = args[1] if len(args) > 1 else kwargs.get("kernel_size")
        return pool_cost(out[0], _pair(kernel, POOL[name]), name)
    if name in ("lp_pool1d", "lp_pool2d", "lp_pool3d"):  # (input, norm_type, kernel_size, ...)
        return pool_cost(out[0], _pair(_arg(args, kwargs, 2, "kernel_size"), int(name[-2])), name)
    if name == "local_response_norm":  # (input, size, ...)
        return elementwise(name, out, _arg(args, kwargs, 1, "size") + 5)
    if name in ADAPTIVE_POOL:
        return Cost(name, float(ins[0].numel))
    if name == "interpolate":  # (input, size, scale_factor, mode, ...)
        return interpolate_cost(ins[0], out[0], _arg(args, kwargs, 3, "mode", "nearest"))
    if name == "grid_sample":  # (input, grid, mode, ...): "bilinear" of a 5-D input is trilinear
        mode = _arg(args, kwargs, 2, "mode", "bilinear")
        trilinear = mode == "bilinear" and len(ins[0].shape) == 5
        return interpolate_cost(ins[0], out[0], "trilinear" if trilinear else mode, "grid_sample")
    if name == "normalize":
        return elementwise(name, out, 3)
    if name in ("pairwise_distance", "cosine_similarity"):
        per_element = 3 if name == "pairwise_distance" else 6
        return Cost(name, float(per_element * math.prod(_broadcast(ins[0].shape, ins[1].shape))))
    if name == "einsum":
        return einsum_cost(args[0] if args else kwargs.get("equation"), ins)
    if name == "scaled_dot_product_attention":
        q, k, v = ins[0], ins[1], ins[2]
        return attention_cost(math.prod(q.shape[:-1]), k.shape[-2], q.shape[-1], v.shape[-1])
    if name in ELEMENTWISE or base in ELEMENTWISE:
        return elementwise(name, out)
    return None


# -- modules ---------------------------------------------------------------------------------------------
def module_cost(module: Any, args: tuple, kwargs: dict, out: list[TensorInfo], training: bool) -> Cost | None:
    """Cost of a leaf module call; None: no rule (the caller falls back to 1 FLOP per output element)."""
    import torch.nn as nn

    if callable(getattr(module, "capture_cost", None)):
        return module.capture_cost(tensors(args) + tensors(kwargs), out, training)
    ins = tensors(args) + tensors(kwargs)
    if isinstance(module, nn.Linear):
        return linear_cost(ins[0].shape, module.out_features, module.bias is not None)
    if isinstance(module, nn.Conv1d | nn.Conv2d | nn.Conv3d):
        kind = type(module).__name__.lower()
        return conv_cost(
            out[0].shape, module.in_channels // module.groups, tuple(module.kernel_size), module.bias is not None, kind
        )
    if isinstance(module, nn.ConvTranspose1d | nn.ConvTranspose2d | nn.ConvTranspose3d):
        kind = type(module).__name__.lower()
        return conv_transpose_cost(ins[0], tuple(module.weight.shape), out[0], module.bias is not None, kind)
    if isinstance(module, nn.Bilinear):
        return bilinear_cost(ins[0], tuple(module.weight.shape), out[0], module.bias is not None)
    if isinstance(module, nn.BatchNorm1d | nn.BatchNorm2d | nn.BatchNorm3d):
        return elementwise("batch_norm", out, BATCH_NORM_FLOPS_PER_ELEMENT[training and module.training])
    if isinstance(module, nn.LayerNorm):
        return elementwise("layer_norm", out, LAYER_NORM_FLOPS_PER_ELEMENT)
    if isinstance(module, nn.GroupNorm):
        return elementwise("group_norm", out, LAYER_NORM_FLOPS_PER_ELEMENT)
    if isinstance(module, nn.InstanceNorm1d | nn.InstanceNorm2d | nn.InstanceNorm3d):
        stats = (training and module.training) or not module.track_running_stats
        return elementwise("instance_norm", out, LAYER_NORM_FLOPS_PER_ELEMENT if stats else BATCH_NORM_FLOPS_PER_ELEMENT[False])
    if isinstance(module, nn.RMSNorm):
        return elementwise("rms_norm", out, RMS_NORM_FLOPS_PER_ELEMENT)
    if isinstance(module, nn.Embedding):
        return Cost("embedding", 0.0)
    if isinstance(module, nn.EmbeddingBag):  # forward(input, offsets=None, per_sample_weights=None)
        weighted = (len(args) > 2 and args[2] is not None) or kwargs.get("per_sample_weights") is not None
        return embedding_bag_cost(ins[0], module.embedding_dim, module.weight.element_size(), module.mode, weighted,
                                  out[0])
    if isinstance(module, nn.Softmax | nn.Softmin | nn.Softmax2d | nn.LogSoftmax):
        kind = "log_softmax" if isinstance(module, nn.LogSoftmax) else type(module).__name__.lower()
        return elementwise(kind, out, SOFTMAX_FLOPS_PER_ELEMENT)
    if isinstance(module, nn.Upsample):  # nn.UpsamplingNearest2d / UpsamplingBilinear2d too
        return interpolate_cost(ins[0], out[0], module.mode)
    if isinstance(module, nn.LocalResponseNorm):
        return elementwise("local_response_norm", out, module.size + 5)
    if isinstance(module, nn.PairwiseDistance | nn.CosineSimilarity):  # as their functions: per broadcast element
        distance = isinstance(module, nn.PairwiseDistance)
        name, per_element = ("pairwise_distance", 3) if distance else ("cosine_similarity", 6)
        return Cost(name, float(per_element * math.prod(_broadcast(ins[0].shape, ins[1].shape))))
    if isinstance(module, nn.CrossEntropyLoss):
        return cross_entropy_cost(ins[0])
    if isinstance(module, nn.NLLLoss):
        return Cost("nll_loss", float(loss_samples(ins[0])))
    kinds = {**_LOSS_KINDS, **_STRUCTURED_LOSS_KINDS}
    loss = next((kind for cls, kind in kinds.items() if isinstance(module, getattr(nn, cls))), None)
    if loss is not None:
        weight = getattr(module, "weight", None)
        return loss_cost(loss, ins, reduction=getattr(module, "reduction", "mean"),
                         full=bool(getattr(module, "full", False)), swap=bool(getattr(module, "swap", False)),
                         p=getattr(module, "p", 1), weighted=weight is not None)
    if isinstance(module, nn.Fold):  # as F.fold
        return Cost("fold", float(ins[0].numel))
    if isinstance(module, nn.MaxPool1d | nn.MaxPool2d | nn.MaxPool3d | nn.AvgPool1d | nn.AvgPool2d | nn.AvgPool3d):
        # spatial dimensions by the class, not by the rank: an unbatched input has one dimension less
        n = (1 if isinstance(module, nn.MaxPool1d | nn.AvgPool1d)
             else 2 if isinstance(module, nn.MaxPool2d | nn.AvgPool2d) else 3)
        name = ("max_pool" if isinstance(module, nn.MaxPool1d | nn.MaxPool2d | nn.MaxPool3d) else "avg_pool") + f"{n}d"
        return pool_cost(out[0], _pair(module.kernel_size, n), name)
    if isinstance(module, nn.LPPool1d | nn.LPPool2d | nn.LPPool3d):
        n = 1 if isinstance(module, nn.LPPool1d) else 2 if isinstance(module, nn.LPPool2d) else 3
        return pool_cost(out[0], _pair(module.kernel_size, n), f"lp_pool{n}d")
    if isinstance(module, nn.AdaptiveAvgPool1d | nn.AdaptiveAvgPool2d | nn.AdaptiveAvgPool3d
                  | nn.AdaptiveMaxPool1d | nn.AdaptiveMaxPool2d | nn.AdaptiveMaxPool3d):
        name = type(module).__name__
        return Cost(f"adaptive_{'avg' if 'Avg' in name else 'max'}_pool{name[-2:]}", float(ins[0].numel))
    if isinstance(module, nn.LSTM | nn.GRU | nn.RNN):
        return _rnn_cost(module, ins, training)
    if isinstance(module, nn.LSTMCell | nn.GRUCell | nn.RNNCell):
        return _rnn_cell_cost(module, ins, training)
    if isinstance(module, nn.MultiheadAttention):
        return _mha_cost(module, ins, training)
    if isinstance(module, _elementwise_modules()):
        return elementwise(type(module).__name__.lower(), out)
    return None


def _rnn_cost(module: Any, ins: list[TensorInfo], training: bool) -> Cost:
    """A fused nn.LSTM / GRU / RNN call: one op, the per-cell formula summed over layers, steps, directions."""
    x = ins[0]
    if len(x.shape) == 2:  # unbatched
        steps, batch = x.shape[0], 1
    elif module.batch_first:
        batch, steps = x.shape[0], x.shape[1]
    else:
        steps, batch = x.shape[0], x.shape[1]
    hidden = module.hidden_size
    proj = getattr(module, "proj_size", 0)  # an LSTM with projections: h has proj_size features
    out_size = proj or hidden
    dirs = 2 if module.bidirectional else 1
    gates = {"LSTM": 4, "GRU": 3}.get(module.mode, 1)
    flops = macs = 0.0
    for layer in range(module.num_layers):
        in_size = module.input_size if layer == 0 else out_size * dirs
        f, m = rnn_cell_flops(gates, batch, in_size, hidden, proj, bias=bool(module.bias))
        flops += f * steps * dirs
        macs += m * steps * dirs
    kind = {4: "lstm", 3: "gru"}.get(gates, "rnn")
    saved = (5 * batch * hidden * steps * dirs * module.num_layers * x.itemsize) if training else 0
    return Cost(kind, flops, macs, saved_bytes=saved)


def _rnn_cell_cost(module: Any, ins: list[TensorInfo], training: bool) -> Cost:
    """One step of an nn.LSTMCell / GRUCell / RNNCell: the formula of `rnn_cell_flops`, as one step of the
    fused layer (`_rnn_cost`), and in training the same saved activations."""
    import torch.nn as nn

    x = ins[0]
    batch = x.shape[0] if len(x.shape) == 2 else 1  # [B, I], or [I] unbatched
    gates = 4 if isinstance(module, nn.LSTMCell) else 3 if isinstance(module, nn.GRUCell) else 1
    hidden = module.hidden_size
    flops, macs = rnn_cell_flops(gates, batch, module.input_size, hidden, bias=bool(module.bias))
    saved = 5 * batch * hidden * x.itemsize if training else 0
    return Cost({4: "lstm_cell", 3: "gru_cell"}.get(gates, "rnn_cell"), flops, macs, saved_bytes=saved)


def _mha_cost(module: Any, ins: list[TensorInfo], training: bool) -> Cost:
    """nn.MultiheadAttention: the q, k, v and out projections (+1 per output element for each bias, as
    Linear), the scores and weighted sums of all heads, softmax; in training it saves the attention weights."""
    q, k = ins[0], ins[1]
    e = module.embed_dim
    if len(q.shape) == 2:  # unbatched: [L, E]
        batch, lq, lk = 1, q.shape[0], k.shape[0]
    elif module.batch_first:
        batch, lq, lk = q.shape[0], q.shape[1], k.shape[1]
    else:
        lq, batch, lk = q.shape[0], q.shape[1], k.shape[0]
    proj = batch * lq * e * e + batch * lk * (module.kdim + module.vdim) * e + batch * lq * e * e  # q, k, v, out
    # add_bias_kv appends a learned key and value, add_zero_attn a zero one, after the projections
    keys = lk + (module.bias_k is not None) + bool(module.add_zero_attn)
    attn = 2 * batch * lq * keys * e  # scores and weighted sum over all heads
    macs = proj + attn
    scores = batch * module.num_heads * lq * keys
    bias = (batch * (lq + 2 * lk) * e if module.in_proj_bias is not None else 0) + (
        batch * lq * e if module.out_proj.bias is not None else 0)
    saved = scores * q.itemsize if training else 0
    return Cost("multihead_attention", 2.0 * macs + bias + SOFTMAX_FLOPS_PER_ELEMENT * scores, float(macs),
                saved_bytes=saved)


@functools.cache
def _elementwise_modules() -> tuple[type, ...]:
    import torch.nn as nn

    names = ["ReLU", "ReLU6", "GELU", "SiLU", "Tanh", "Sigmoid", "LeakyReLU", "ELU", "SELU", "Hardtanh",
             "Hardswish", "Hardsigmoid", "Mish", "Softplus", "PReLU", "Softsign", "Tanhshrink", "CELU", "LogSigmoid",
             "Threshold", "Hardshrink", "Softshrink", "RReLU", "GLU", "PixelShuffle", "PixelUnshuffle", "Unfold",
             "ChannelShuffle", *(f"{pad}Pad{n}d" for pad in ("Zero", "Constant", "Reflection", "Replication", "Circular")
                                 for n in (1, 2, 3))]
    return tuple(getattr(nn, n) for n in names if hasattr(nn, n))

