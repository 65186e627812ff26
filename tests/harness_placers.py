"""Misbehaving and simple placers (and one evaluator) for the harness tests, loaded as a spec plugin (by the runner and by
every worker it spawns). Not collected by pytest; the `harness_plugin` fixture unregisters them."""

from __future__ import annotations

import os
import signal
import sys
import time

import numpy as np

from suite.placer import BasePlacer, NotApplicable, PlacementResult, register_placer
from suite.runner import register_evaluator


def _all_on(problem, device: int) -> np.ndarray:
    return np.full(problem.workload.num_ops, device, dtype=np.int64)


@register_placer("harness_raises")
class Raises(BasePlacer):
    """Raises RuntimeError; with `what` = "exit", evaluates one placement and calls sys.exit(3)."""

    defaults = {"what": "error"}

    def place(self, problem, budget, seed):
        if self.params["what"] == "exit":
            problem.evaluator.evaluate(_all_on(problem, 0))
            sys.exit(3)
        raise RuntimeError("boom from a test placer")


@register_placer("harness_hangs")
class Hangs(BasePlacer):
    def place(self, problem, budget, seed):
        time.sleep(3600)


@register_placer("harness_invalid")
class Invalid(BasePlacer):
    """One entry too few."""

    def place(self, problem, budget, seed):
        started = time.perf_counter()
        return PlacementResult.from_search(_all_on(problem, 0)[:-1], problem, started)


@register_placer("harness_dies")
class Dies(BasePlacer):
    defaults = {"how": "sigkill"}

    def place(self, problem, budget, seed):
        if self.params["how"] == "exit":
            os._exit(7)
        os.kill(os.getpid(), signal.SIGKILL)


@register_placer("harness_sleepy")
class Sleepy(BasePlacer):
    """Sleeps, then puts everything on the CPU (device 0)."""

    defaults = {"sleep_s": 0.2}

    def place(self, problem, budget, seed):
        started = time.perf_counter()
        time.sleep(self.params["sleep_s"])
        return PlacementResult.from_search(_all_on(problem, 0), problem, started)


@register_placer("harness_gated")
class Gated(BasePlacer):
    """Waits (up to an hour) until the file `gate` exists, then puts everything on the CPU (device 0); a seed
    below `free_below` does not wait. A test stops a run at a known point with it, however loaded the machine."""

    defaults = {"gate": "", "free_below": 0}

    def place(self, problem, budget, seed):
        started = time.perf_counter()
        deadline = time.monotonic() + 3600
        while (seed >= self.params["free_below"] and not os.path.exists(self.params["gate"])
               and time.monotonic() < deadline):
            time.sleep(0.01)
        return PlacementResult.from_search(_all_on(problem, 0), problem, started)


@register_placer("harness_search")
class Search(BasePlacer):
    """Random search over whole-device placements: uses exactly `evaluations` evaluations."""

    defaults = {"evaluations": 5}

    def place(self, problem, budget, seed):
        started = time.perf_counter()
        rng = np.random.default_rng(seed)
        ev = problem.evaluator
        for _ in range(min(self.params["evaluations"], ev.remaining)):
            ev.evaluate(rng.integers(0, problem.cluster.num_devices, problem.workload.num_ops))
        return PlacementResult.from_search(ev.best_placement, problem, started)


@register_placer("harness_not_applicable")
class NeedsThreeDevices(BasePlacer):
    def place(self, problem, budget, seed):
        if problem.cluster.num_devices < 3:
            raise NotApplicable("needs at least 3 devices")
        raise AssertionError("not reached in the tests")


@register_placer("harness_over_budget")
class OverBudget(BasePlacer):
    def place(self, problem, budget, seed):
        while True:
            problem.evaluator.evaluate(_all_on(problem, 0))


@register_placer("harness_cheats")
class Cheats(BasePlacer):
    """Makes its evaluator's backend report 1 microsecond for everything: patches the backend object itself
    and swaps it too. The harness must report the true step time of the final placement, re-measured by its
    own evaluator on a backend of its own."""

    def place(self, problem, budget, seed):
        from suite.evaluator import Measurement

        class Liar:
            name = "liar"

            def measure(self, placement):
                return Measurement(status="ok", step_time_s=1e-6, samples_s=(1e-6,))

            def measure_batch(self, placements):
                return [self.measure(p) for p in placements]

        started = time.perf_counter()
        liar = Liar()
        original = problem.evaluator.backend
        original.measure, original.measure_batch = liar.measure, liar.measure_batch
        problem.evaluator.backend = liar
        problem.evaluator.evaluate(_all_on(problem, 0))
        return PlacementResult.from_search(_all_on(problem, 0), problem, started)


@register_placer("harness_misreports")
class Misreports(BasePlacer):
    """Evaluates everything on the CPU once (4 s on the tiny diamond: its evaluator's best), then returns
    everything on the GPU and claims no evaluations, without `PlacementResult.from_search`. The row must hold
    the returned placement, re-measured, and the evaluations its evaluator counted."""

    def place(self, problem, budget, seed):
        problem.evaluator.evaluate(_all_on(problem, 0))
        return PlacementResult(_all_on(problem, 1), evaluations=0)


@register_evaluator("harness_double")
def double_time_backend(workload, cluster, methodology):
    """An evaluator plugin: the simulator with every step time doubled (to see which backend measured)."""
    from dataclasses import replace

    from suite.evaluator import SimulatorBackend

    class Double(SimulatorBackend):
        name = "harness_double"

        def _to_measurement(self, r):
            m = super()._to_measurement(r)
            return replace(m, step_time_s=2 * m.step_time_s, samples_s=tuple(2 * s for s in m.samples_s))

    return Double(workload, cluster)


@register_placer("harness_env_device")
class EnvDevice(BasePlacer):
    """Every op on the device named by $HARNESS_DEVICE (default: device 0): one placer whose behaviour a test
    changes between two runs, as an edit of its code would."""

    def place(self, problem, budget, seed):
        started = time.perf_counter()
        device = problem.cluster.index[os.environ.get("HARNESS_DEVICE", problem.cluster.devices[0].name)]
        return PlacementResult.from_search(_all_on(problem, device), problem, started)


@register_placer("harness_numerics")
class Numerics(BasePlacer):
    """Every op on device 0; its info holds the worker's math-library variables and torch's CPU capability,
    to see what a worker computes with."""

    def place(self, problem, budget, seed):
        import torch

        from suite.numerics import VARIABLES

        started = time.perf_counter()
        return PlacementResult.from_search(_all_on(problem, 0), problem, started,
                                           env={v: os.environ[v] for v in VARIABLES if v in os.environ},
                                           torch_kernels=torch.backends.cpu.get_cpu_capability())


@register_placer("harness_patches_class")
class PatchesClass(BasePlacer):
    """Patches the simulator backend's class, not its own evaluator: the worker's re-measurement (a fresh
    backend of that class, in this process) then says 1 microsecond, and so would every later cell of the
    worker. The runner's own check must catch it, and no other cell may see the patch."""

    def place(self, problem, budget, seed):
        from dataclasses import replace

        from suite.evaluator import SimulatorBackend

        original = SimulatorBackend._to_measurement

        def fake(self, result):
            m = original(self, result)
            return replace(m, step_time_s=1e-6, samples_s=(1e-6,)) if m.status == "ok" else m

        SimulatorBackend._to_measurement = fake
        return PlacementResult.from_search(_all_on(problem, 0), problem, time.perf_counter())


@register_placer("harness_names")
class Names(BasePlacer):
    """A placement of device names, as `validate` accepts: every op on the CPU."""

    def place(self, problem, budget, seed):
        names = [problem.cluster.devices[0].name] * problem.workload.num_ops
        return PlacementResult(placement=names, evaluations=0, wall_time_s=0.0)


@register_placer("harness_from_search")
class FromSearch(BasePlacer):
    """Returns through `PlacementResult.from_search` a placement that is not of integers: `what` = "half" (the
    last op on device 1.5), "nan" (every op on NaN) or "names" (every op on the CPU, by name)."""

    defaults = {"what": "half"}

    def place(self, problem, budget, seed):
        n = problem.workload.num_ops
        placement = {"half": [0.0] * (n - 1) + [1.5], "nan": [float("nan")] * n,
                     "names": [problem.cluster.devices[0].name] * n}[self.params["what"]]
        return PlacementResult.from_search(placement, problem, time.perf_counter())


@register_placer("harness_prints")
class Prints(BasePlacer):
    """Prints to stdout, as a chatty placer does: the run's --json document must not take it."""

    def place(self, problem, budget, seed):
        print("hello from a placer")
        return PlacementResult.from_search(_all_on(problem, 0), problem, time.perf_counter())


@register_placer("harness_child_hangs")
class ChildHangs(BasePlacer):
    """Starts a child process that ignores SIGINT and SIGTERM (as the worker does), writes its pid to the
    file named by `pid_file`, and hangs: the cell times out, and the child must die with the worker."""

    defaults = {"pid_file": ""}

    def place(self, problem, budget, seed):
        import subprocess

        child = subprocess.Popen(["sleep", "3600"])
        with open(self.params["pid_file"], "w") as f:
            f.write(str(child.pid))
        time.sleep(3600)
