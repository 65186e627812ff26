"""Small builders for hand-computed simulator tests: a uniform cluster where times are easy to add up."""

from __future__ import annotations

from suite.cluster import Cluster, Device, Link


def uniform_cluster(
    n: int = 2,
    *,
    flops: float = 1e9,
    mem_bandwidth: float = 1e30,
    memory_bytes: int = 10**12,
    link_bandwidth: float = 1000.0,
    latency_s: float = 0.0,
    kinds: tuple[str, ...] | None = None,
    sharing: str = "pairs",
) -> Cluster:
    """n devices of 1 GFLOP/s (so 1e9 FLOPs take 1 s), no overhead, one shared link of 1000 B/s."""
    kinds = kinds or ("gpu",) * n
    devices = tuple(
        Device(
            name=f"d{i}",
            kind=kinds[i],
            peak_flops=flops,
            mem_bandwidth=mem_bandwidth,
            memory_bytes=memory_bytes,
            op_overhead_s=0.0,
        )
        for i in range(n)
    )
    links = (Link(between=tuple(d.name for d in devices), bandwidth=link_bandwidth, latency_s=latency_s,
                  sharing=sharing),) if n > 1 else ()
    return Cluster(name=f"uniform{n}", devices=devices, links=links)


import pytest  # noqa: E402


@pytest.fixture(name="uniform_cluster")
def _uniform_cluster_fixture():
    return uniform_cluster


@pytest.fixture
def shared_linear():
    """The class of a module that calls one Linear twice: its weights become a variable op shared by two ops
    (a class, so that a test seeds torch before the weights are drawn)."""
    import torch.nn as nn

    class Shared(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.act = nn.ReLU()
            self.out = nn.Linear(4, 1)

        def forward(self, x):
            return self.out(self.fc(self.act(self.fc(x)))).sum()

    return Shared


@pytest.fixture
def cpu_only():
    """This machine with its GPUs hidden, as `CUDA_VISIBLE_DEVICES=` hides them from a new process: for tests of
    the CPU behaviour (local clusters, fidelity defaults), which a GPU host would otherwise change. Its own
    MonkeyPatch: a test's `monkeypatch.undo()` must not bring the GPUs back halfway through."""
    import torch

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.cuda, "is_available", lambda: False)
        mp.setattr(torch.cuda, "device_count", lambda: 0)
        yield

