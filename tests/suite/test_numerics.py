"""The math-library pins of the runner's workers (`suite.numerics`)."""

import os
import subprocess
import sys

import pytest

from suite import numerics as nm

OLD_NUMPY = ["SSSE3", "SSE41", "POPCNT", "SSE42", "AVX", "F16C", "FMA3", "AVX2", "AVX512F", "AVX512CD",
             "AVX512_KNL", "AVX512_SKX", "AVX512_CLX", "AVX512_CNL", "AVX512_ICL", "AVX512_SPR"]
NEW_NUMPY = ["X86_V3", "X86_V4", "AVX512_ICL", "AVX512_SPR"]
BASE = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "AVX2",
        "OPENBLAS_CORETYPE": "Haswell"}


def test_numpy_targets_above_avx2_in_either_naming():
    assert nm.numpy_above_avx2(NEW_NUMPY) == ["X86_V4", "AVX512_ICL", "AVX512_SPR"]
    assert nm.numpy_above_avx2(OLD_NUMPY) == OLD_NUMPY[8:]
    assert nm.numpy_above_avx2(["X86_V3"]) == []


@pytest.mark.parametrize("simd", ["AVX2", "AVX-512"])
def test_hosts_with_avx2_get_the_same_pins(simd):
    assert nm.pins(simd, NEW_NUMPY) == {**BASE, "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR"}
    assert nm.pins(simd, ["X86_V3"]) == BASE  # a numpy without targets above AVX2: nothing to disable


def test_this_numpy_imports_with_its_targets_above_avx2_disabled():
    """The list is read from the installed numpy and names dispatch targets only: disabling a baseline
    feature would stop numpy from importing."""
    from numpy._core._multiarray_umath import __cpu_baseline__, __cpu_dispatch__

    value = nm.pins("AVX2").get(nm.NUMPY_VAR, "")
    assert value.split() == nm.numpy_above_avx2(__cpu_dispatch__)
    assert not set(value.split()) & set(__cpu_baseline__)
    env = {**os.environ, nm.NUMPY_VAR: value}
    done = subprocess.run([sys.executable, "-W", "error", "-c", "import numpy; numpy.ones(64).sum()"], env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("baseline", [["X86_V4"], ["SSE42", "AVX2", "AVX512F", "AVX512_SKX"]])
def test_a_numpy_built_for_avx512_is_not_pinned(baseline):
    """Its AVX-512 loops are its baseline, which cannot be disabled: the run could not match other hosts."""
    assert nm.pins("AVX-512", NEW_NUMPY, baseline) == {}
    assert nm.pins("AVX-512", NEW_NUMPY, ["X86_V2"]) != {}
    assert nm.pins("AVX-512", baseline=baseline) == {}  # given alone, with the installed numpy's dispatch list


@pytest.mark.parametrize("simd", ["NEON", "SVE", ""])
def test_other_hosts_are_not_pinned(simd):
    assert nm.pins(simd, NEW_NUMPY) == {}


def test_worker_env_pins_simulated_runs_and_keeps_the_callers_settings():
    pins = nm.pins("AVX2")
    assert nm.worker_env(True, "AVX2", {}) == pins
    assert nm.worker_env(False, "AVX2", {}) == {}
    assert nm.worker_env(True, "NEON", {}) == {}
    env = {"MKL_CBWR": "AUTO", "PATH": "/bin"}  # only the math variables are taken from the caller
    assert nm.worker_env(True, "AVX2", env) == {**pins, "MKL_CBWR": "AUTO"}
    assert nm.worker_env(False, "AVX2", env) == {"MKL_CBWR": "AUTO"}
    own_numpy = {nm.NUMPY_VAR: "AVX512_SKX"}  # numpy's variable is the caller's too
    assert nm.worker_env(True, "AVX2", own_numpy) == {**pins, nm.NUMPY_VAR: "AVX512_SKX"}
    assert nm.worker_env(False, "AVX2", own_numpy) == own_numpy


def test_labels_tell_pinned_runs_apart_from_the_hosts_own_kernels():
    pinned = {**BASE, "NPY_DISABLE_CPU_FEATURES": "X86_V4"}
    assert nm.is_pinned(pinned) and nm.is_pinned(BASE)
    assert not nm.is_pinned({"MKL_CBWR": "COMPATIBLE"}) and not nm.is_pinned({})
    assert not nm.is_pinned({**BASE, "ATEN_CPU_CAPABILITY": "default"})  # the caller's own value: not pinned
    assert nm.kernels_label("AVX2", pinned) == nm.kernels_label("AVX2", BASE) == "AVX2 CPUs, math pinned"
    assert nm.kernels_label("AVX-512", pinned) == "AVX-512 CPUs, math pinned"  # agreement not measured yet
    assert nm.kernels_label("AVX2", {}) == "AVX2 CPUs"
    assert nm.kernels_label("AVX2", {"MKL_CBWR": "COMPATIBLE"}) == "AVX2 CPUs (MKL_CBWR=COMPATIBLE)"
    assert nm.kernels_label("AVX2", {**BASE, "ATEN_CPU_CAPABILITY": "default"}) == (
        "AVX2 CPUs (ATEN_CPU_CAPABILITY=default, MKL_CBWR=COMPATIBLE, ONEDNN_MAX_CPU_ISA=AVX2, "
        "OPENBLAS_CORETYPE=Haswell)")
    # sorted by name whatever order the run recorded them in, so that equal settings read alike
    assert nm.kernels_label("AVX2", {"OPENBLAS_CORETYPE": "Haswell", "MKL_CBWR": "AUTO"}) == (
        "AVX2 CPUs (MKL_CBWR=AUTO, OPENBLAS_CORETYPE=Haswell)")


def test_a_runs_kernels_are_read_from_its_manifest_entry():
    run = {"machine": {"simd": "AVX2"}, "numerics": BASE}
    assert nm.run_kernels(run) == "AVX2 CPUs, math pinned"
    assert nm.run_kernels({"machine": {"simd": "AVX-512"}}) == "AVX-512 CPUs"
    assert nm.run_kernels({"machine": {}, "numerics": BASE}) == nm.run_kernels({}) == ""  # host unknown
