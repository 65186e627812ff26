"""Speed of the fast simulator (pytest-benchmark; run with `pytest -m benchmark`).

Targets of issue 2: one placement of a 10,000-op graph on 8 devices in at most 1 ms, a batch of 64 in at
most 32 ms, on one core.
"""

import numpy as np
import pytest

from suite import Op, OpGraph
from suite.cluster import Cluster, Device, Link
from suite.simulator import fast, inputs_for


def random_graph(n: int, seed: int = 0) -> OpGraph:
    """A layered random DAG of n ops, about 1.5 inputs per op (like captured model graphs)."""
    rng = np.random.default_rng(seed)
    ops = [Op(f"o{i}", "x", flops=float(rng.integers(1e6, 1e10)), bytes_read=int(rng.integers(0, 1e7)),
              output_bytes=int(rng.integers(1e3, 1e7)), param_bytes=int(rng.integers(0, 1e6))) for i in range(n)]
    edges = set()
    for j in range(1, n):
        k = 1 + int(rng.random() < 0.5)
        for i in rng.integers(max(0, j - 50), j, size=k):
            edges.add((int(i), j))
    return OpGraph.build(f"random{n}", ops, [(f"o{i}", f"o{j}") for i, j in sorted(edges)])


def eight_gpus() -> Cluster:
    devs = tuple(Device(f"gpu:{i}", "gpu", 1.95e13, 1.5e12, 40 * 2**30, 5e-6) for i in range(8))
    return Cluster("bench8", devs, (Link(tuple(d.name for d in devs), 1e11, 3e-6),))


@pytest.fixture(scope="module")
def setup():
    g = random_graph(10_000)
    c = eight_gpus()
    args = inputs_for(g, c).fast_args()
    rng = np.random.default_rng(1)
    placements = rng.integers(0, 8, size=(64, g.num_ops)).astype(np.int64)
    fast.simulate_one(placements[0], *args)  # compile outside the timing
    return args, placements


@pytest.mark.benchmark(group="simulator")
def test_fast_one_placement_10k_ops_8_devices(benchmark, setup):
    args, placements = setup
    step, *_ = benchmark(fast.simulate_one, placements[0], *args)
    assert step > 0


@pytest.mark.benchmark(group="simulator")
def test_fast_batch_of_64_placements_10k_ops_8_devices(benchmark, setup):
    args, placements = setup
    steps, *_ = benchmark(fast.simulate_batch, placements, *args)
    assert (steps > 0).all()
