"""Random small programs with in-place calls, views, `out=` and shared layers: on every placement tried, the
torch backend computes what eager PyTorch does, or capture refuses the program (a write that another live
value would see). Fuzzing like this found the in-place bugs fixed on 2026-11-26 (modules and functions with
inplace=True, `out=`, and writes racing with reads through views or aliases on other lanes)."""

from __future__ import annotations

import copy
import random

import numpy as np
import pytest
import torch
import torch.nn as nn

from suite.backends.devices import local_cluster
from suite.backends.torch_exec import TorchExecutor
from suite.backends.workload import from_module
from suite.errors import GraphError

# statements of a program: v{n} is the new value, v{a} and v{b} earlier ones
STATEMENTS = (
    "v{n} = self.fc{k}(v{a})",
    "v{n} = v{a} * 1.5",
    "v{n} = v{a} + v{b}",
    "v{a}.mul_(0.5); v{n} = v{a}",
    "v{a}.add_(v{b}); v{n} = v{a}",
    "v{n} = torch.relu_(v{a})",
    "v{n} = self.act(v{a})",
    "v{n} = torch.nn.functional.relu(v{a}, inplace=True)",
    "v{n} = torch.sub(v{a}, 1.0, out=v{b})",
    "v{n} = v{a}.t().contiguous().t()",
    "p{n}, q{n} = v{a}.chunk(2, 1); p{n}.sigmoid_(); v{n} = torch.cat([p{n}, q{n}], 1)",
    "v{n} = v{a}.clone()",
    "v{n} = torch.tanh(v{a})",
    "v{n} = v{a}.view(2, 4).view(2, 4)",
    "v{a}.clamp_(min=0.1); v{n} = v{a}",
    "v{a}.copy_(v{b}); v{n} = v{a}",
    "v{a}.masked_fill_(v{b} > 0.5, 0.0); v{n} = v{a}",
    "v{n} = self.fc0(self.fc0(v{a}))",
    "v{n} = self.drop(v{a})",
    "v{a}.index_add_(0, torch.tensor([0]), v{b}[1:]); v{n} = v{a}",
)


class _Program(nn.Module):
    def __init__(self, lines: list[str]) -> None:
        super().__init__()
        self.fc0, self.fc1, self.fc2 = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)
        self.act = nn.ReLU(inplace=True)
        self.drop = nn.Dropout(0.3, inplace=True)  # the module is in eval mode: no change, same tensor
        namespace: dict = {"torch": torch}
        exec("def forward(self, x):\n" + "\n".join("    " + line for line in lines), namespace)  # noqa: S102
        self._forward = namespace["forward"]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._forward(self, x)


def _program(rng: random.Random, loss: bool = False) -> list[str]:
    n = rng.randrange(3, 7)
    lines = ["v0 = x * 1.0"]  # a new tensor: writing the model's input would change it for the next run
    for i in range(1, n + 1):
        lines.append(rng.choice(STATEMENTS).format(n=i, a=rng.randrange(i), b=rng.randrange(i), k=rng.randrange(3)))
    out = " + ".join(f"v{j}" for j in range(max(1, n - 2), n + 1))
    return lines + [f"return ({out}).sum()" if loss else f"return {out}"]


def _runs_in_eager(model: nn.Module, x: torch.Tensor, training: bool) -> bool:
    """False where eager PyTorch refuses the program (v.copy_(v); in training, an in-place call on a tensor
    autograd saved)."""
    try:
        if training:
            copy.deepcopy(model)(x).backward()
        else:
            with torch.no_grad():
                model(x)
    except RuntimeError:
        return False
    return True


def _captured(model: nn.Module, x: torch.Tensor, mode: str):
    """The real workload of `model`, or None where capture refuses it (a write another live value sees)."""
    try:
        return from_module(model, (x,), name="program", mode=mode)
    except GraphError as exc:
        assert "writes to memory that" in str(exc) or "cannot trace" in str(exc), exc
        return None


@pytest.mark.parametrize("seed", range(4))
def test_random_programs_compute_as_eager_pytorch_on_every_placement_tried(seed):
    _, dmap = local_cluster(3, gpus=False)
    rng = random.Random(seed)
    checked = 0
    for trial in range(40):
        lines = _program(rng)
        torch.manual_seed(trial)
        x = torch.randn(2, 4)
        model = _Program(lines).eval()
        if not _runs_in_eager(model, x, training=False):
            continue
        rw = _captured(model, x, "inference")
        if rw is None:
            continue
        ref = rw.eager()
        placements = np.random.default_rng(trial).integers(0, 3, size=(6, rw.graph.num_ops))
        for p in placements:
            for concurrent in (False, True):
                ex = TorchExecutor(rw, dmap, concurrent=concurrent)
                ex.apply(p)
                with torch.no_grad():
                    out = ex.forward()
                ex.close()
                torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6, equal_nan=True,
                                           msg=lambda m, lines=lines, p=p, c=concurrent: f"{'; '.join(lines)} "
                                                                                     f"on {p.tolist()} "
                                                                                     f"(concurrent {c}): {m}")
        checked += 1
    assert checked >= 20  # most programs are placed, not refused


@pytest.mark.parametrize("seed", range(2))
def test_random_programs_train_as_eager_pytorch_on_every_placement_tried(seed):
    """Training steps: the loss and every updated parameter as eager PyTorch's step with SGD."""
    _, dmap = local_cluster(3, gpus=False)
    rng = random.Random(100 + seed)
    checked = 0
    for trial in range(80):
        lines = _program(rng, loss=True)
        if any("self.drop" in line for line in lines):  # dropout trains at random: not comparable
            continue
        torch.manual_seed(trial)
        x = torch.randn(2, 4)
        model = _Program(lines)
        if not _runs_in_eager(model, x, training=True):
            continue
        rw = _captured(model, x, "training")
        if rw is None:
            continue
        g = rw.graph
        draw = np.random.default_rng(trial)
        for _ in range(3):
            p = draw.integers(0, 3, size=g.num_ops)
            for members in g.groups.values():  # a forward op with its backward and update ops
                p[members] = p[members[0]]
            for concurrent in (False, True):
                eager = rw.fresh_copy()
                ex = TorchExecutor(rw, dmap, concurrent=concurrent)
                ex.apply(p)
                loss = ex.step()
                ex.close()
                ref = eager.module(*eager.inputs)
                ref.backward()
                torch.optim.SGD(eager.module.parameters(), lr=1e-3, momentum=0.9).step()
                where = f"{'; '.join(lines)} on {p.tolist()} (concurrent {concurrent})"
                torch.testing.assert_close(loss, ref.detach(), rtol=1e-5, atol=1e-6, msg=lambda m, w=where: f"{w}: {m}")
                for name, param in eager.module.named_parameters():
                    if name in ex.eg.params:  # the layers a program uses
                        torch.testing.assert_close(ex.eg.params[name].detach(), param.detach(), rtol=1e-5,
                                                   atol=1e-6, msg=lambda m, w=where: f"{w}: {m}")
        checked += 1
    assert checked >= 5  # most programs with in-place calls on saved tensors fail in eager PyTorch too
