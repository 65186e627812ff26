"""Random small programs with in-place calls, views, `out=` and shared layers: on every placement tried, the
torch backend computes what eager PyTorch does, or capture refuses the program (a write that another live
value would see). Fuzzing like this found the in-place bugs fixed on 2026-11-26 (modules and functions with
inplace=True, `out=`, and writes racing with reads through views or aliases on other lanes)."""

from __future__ import annotations

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


def _program(rng: random.Random) -> list[str]:
    n = rng.randrange(3, 7)
    lines = ["v0 = x * 1.0"]  # a new tensor: writing the model's input would change it for the next run
    for i in range(1, n + 1):
        lines.append(rng.choice(STATEMENTS).format(n=i, a=rng.randrange(i), b=rng.randrange(i), k=rng.randrange(3)))
    return lines + ["return " + " + ".join(f"v{j}" for j in range(max(1, n - 2), n + 1))]


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
        try:
            with torch.no_grad():
                model(x)
        except RuntimeError:  # eager PyTorch refuses it too (v.copy_(v), an in-place call on overlapping memory)
            continue
        try:
            rw = from_module(model, (x,), name="program", mode="inference")
        except GraphError as exc:
            assert "writes to memory that" in str(exc) or "cannot trace" in str(exc), (lines, exc)
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
