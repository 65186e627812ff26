"""Pinned CPU math for placer searches: the same kernels, so the same floats, on x86-64 hosts with AVX2.

A learned placer's search follows its floats, and the libraries behind them pick their code by the CPU: ATen's
vector kernels (AVX-512 or AVX2), oneDNN (torch's LSTMs: its GEMMs are jitted for the widest extension), MKL
(torch's BLAS; outside its conditional numerical reproducibility mode it may also vary with run-time
conditions), OpenBLAS (numpy's BLAS) and numpy's own SIMD loops. On unchanged code and seeds, 20 of HSDAG's
50 leaderboard cells changed between an AVX-512 and an AVX2 host. Each library reads an environment variable
at start-up that fixes its choice; the runner's workers start with them set (`worker_env`), so a run records
what it ran under (`numerics` in the manifest). MKL's pin is its COMPATIBLE branch (SSE2-level code without
approximate reciprocals, the one branch MKL documents for non-Intel CPUs), the others their AVX2 code. Thread
counts, which sums also depend on, are fixed by the learned placers themselves (their `threads` parameter, 1
by default, is part of a cell's key).

Hosts are told apart by `store.cpu_simd` (/proc/cpuinfo, else numpy's CPU detection). Only
simulated runs are pinned: a run that times real execution keeps the CPU's own kernels, since pinning would
slow down what it measures. The caller's own setting of any of these variables wins and is recorded. Pinned
runs on AVX-512 and AVX2 hosts should compute alike; until that is measured, `kernels_label` still names the
host's extension, so `compare` warns about such a pair.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

# the variables, in the order each library's documentation names them; values: the AVX2 level on x86-64
PINS = {
    "ATEN_CPU_CAPABILITY": "avx2",  # torch: its vector kernels (the default picks AVX-512 where the CPU has it)
    "ONEDNN_MAX_CPU_ISA": "AVX2",  # oneDNN (torch's LSTMs): the widest code its JIT may emit
    "MKL_CBWR": "COMPATIBLE",  # MKL: the one reproducibility branch documented for non-Intel CPUs too
    "OPENBLAS_CORETYPE": "Haswell",  # numpy's OpenBLAS: its AVX2 kernels
}
NUMPY_VAR = "NPY_DISABLE_CPU_FEATURES"  # numpy: its dispatch targets above AVX2, named as this numpy names them
VARIABLES = (*PINS, NUMPY_VAR)
PINNED_SIMD = ("AVX2", "AVX-512")  # `store.cpu_simd` values of the hosts that can run the pinned code


def numpy_above_avx2(dispatch: Iterable[str]) -> list[str]:
    """numpy's dispatch targets above AVX2 (names differ by numpy version: "AVX512_SKX" before 2.4, "X86_V4"
    since), from the list that numpy was built with; disabling one the CPU lacks is a no-op."""
    return [f for f in dispatch if f == "X86_V4" or f.startswith("AVX512")]


def pins(simd: str, dispatch: Iterable[str] | None = None, baseline: Iterable[str] | None = None) -> dict[str, str]:
    """The variables that pin the math libraries on a host with this `simd`; none elsewhere (other
    architectures, or x86-64 without AVX2, have no common level to pin to here), and none with a numpy built
    to require more than AVX2 (`baseline`, e.g. compiled with -march=native): its loops cannot be turned off,
    so the run could not compute as others do. `dispatch` and `baseline` default to the installed numpy's."""
    if simd not in PINNED_SIMD:
        return {}
    if dispatch is None or baseline is None:
        from numpy._core import _multiarray_umath as umath

        dispatch = umath.__cpu_dispatch__ if dispatch is None else dispatch
        baseline = umath.__cpu_baseline__ if baseline is None else baseline
    if numpy_above_avx2(baseline):
        return {}
    above = numpy_above_avx2(dispatch)
    return {**PINS, **({NUMPY_VAR: " ".join(above)} if above else {})}


def worker_env(simulated: bool, simd: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """What workers get of these variables: the pins for a simulated run on a host that has AVX2, with the
    caller's own values of any of them (set in `environ`) winning, and those values in any case."""
    environ = os.environ if environ is None else environ
    env = pins(simd) if simulated else {}
    env.update({v: environ[v] for v in VARIABLES if v in environ})
    return env


def is_pinned(env: Mapping[str, str]) -> bool:
    """Whether a run's recorded `numerics` holds every pin at its value (a caller's own value of one of them,
    such as ATEN_CPU_CAPABILITY=default, makes the run unpinned)."""
    return all(env.get(v) == value for v, value in PINS.items())


def kernels_label(simd: str, env: Mapping[str, str]) -> str:
    """What picked a run's CPU kernels, to tell runs apart whose learned placers may search differently: the
    host's vector extension, and either "math pinned" or the variables set, if any (numpy's list in a pinned
    run names the targets that the installed numpy has, not a choice: it is left out)."""
    if is_pinned(env):
        return f"{simd} CPUs, math pinned"
    settings = ", ".join(f"{k}={v}" for k, v in sorted(env.items()))
    return f"{simd} CPUs" + (f" ({settings})" if settings else "")


def run_kernels(run: Mapping[str, Any]) -> str:
    """`kernels_label` of a run entry of a store's manifest (its `machine`'s `simd` and its `numerics`); ""
    where the run did not record its host's vector extension (an older store, or an unknown CPU)."""
    simd = (run.get("machine") or {}).get("simd") or ""
    return kernels_label(simd, run.get("numerics") or {}) if simd else ""
