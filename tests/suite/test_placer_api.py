"""The placer interface as a plugin author sees it: parameter checks, registration, `from_search`."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from suite import Op, OpGraph, load_cluster, placer
from suite.costmodel import Profile
from suite.errors import PlacebenchError, PlacementError
from suite.methodology import Budget
from suite.placement import validate
from suite.placer import (
    BasePlacer,
    ParameterError,
    PlacementResult,
    PlacerFailed,
    PluginError,
    Problem,
    check_choice,
    check_parameter,
    make_placer,
    placer_names,
    register_placer,
    unregister_placer,
)


@pytest.mark.parametrize("value, default, bounds", [
    (1, 16, (1, 4096)), (4096, 16, (1, 4096)),  # bounds are inclusive at both ends
    (0.0, 0.5, (0.0, 1.0)), (1, 0.5, (0.0, 1.0)),  # a float parameter takes an int
    ("x", "y", None), (False, True, None), ([1, 2], None, None), (float("nan"), None, None), (5, None, (0, 1)),  # None: anything
])
def test_a_parameter_in_its_type_and_bounds_is_accepted(value, default, bounds):
    check_parameter("p", "k", value, default, bounds)


@pytest.mark.parametrize("value, default, bounds, message", [
    (0, 16, (1, 4096), r"0: must be in \[1, 4096\]"),
    (4097, 16, (1, 4096), r"must be in \[1, 4096\]"),
    (2.0, 16, None, "expected an integer"),
    (True, 16, None, "expected an integer"),
    (True, 0.5, None, "expected a finite number"),
    (float("nan"), 0.5, None, "expected a finite number"),
    (math.inf, 0.5, None, "expected a finite number"),
    ("1", 0.5, None, "expected a finite number"),
    (1, True, None, "expected a bool"),
    (1, "a", None, "expected a str"),
])
def test_a_parameter_of_another_type_or_out_of_bounds_is_refused(value, default, bounds, message):
    with pytest.raises(PlacebenchError, match=rf"placer 'p': parameter k=.*{message}"):
        check_parameter("p", "k", value, default, bounds)


@pytest.fixture
def toy_placer():
    """`toy`: defaults a=1, b="x", a in [0, 3]; places every op on device `a`."""

    @register_placer("toy_api_placer")
    class Toy(BasePlacer):
        defaults = {"a": 1, "b": "x"}
        bounds = {"a": (0, 3)}

        def place(self, problem, budget, seed):
            started = time.perf_counter()
            problem.evaluator.evaluate(np.zeros(problem.workload.num_ops, dtype=np.int64))
            return PlacementResult.from_search([self.params["a"]] * problem.workload.num_ops, problem, started,
                                               note="hi")

    yield Toy
    unregister_placer("toy_api_placer")


def test_make_placer_merges_parameters_over_the_defaults_and_checks_them(toy_placer):
    assert "toy_api_placer" in placer_names()
    placer = make_placer("toy_api_placer", a=2)
    assert isinstance(placer, toy_placer) and placer.name == "toy_api_placer"
    assert placer.params == {"a": 2, "b": "x"}
    assert make_placer("toy_api_placer").params == {"a": 1, "b": "x"}
    with pytest.raises(PlacebenchError, match=r"placer 'toy_api_placer': bad parameters \{'c': 1\}.*known: \['a', 'b'\]"):
        make_placer("toy_api_placer", c=1)
    with pytest.raises(PlacebenchError, match=r"a=4: must be in \[0, 3\]"):
        make_placer("toy_api_placer", a=4)


def test_a_plugin_cannot_take_an_installed_placers_name():
    with pytest.raises(PlacebenchError, match="placer name 'local_search' is taken by the installed placer"):
        register_placer("local_search")(type("Mine", (BasePlacer,), {}))
    assert make_placer("local_search").__class__.__module__ == "baselines.local_search"


def test_from_search_takes_the_evaluators_statistics(toy_placer):
    g = OpGraph.build("two", [Op("a", "matmul", flops=1e9), Op("b", "matmul", flops=1e9)], [("a", "b")])
    problem = Problem.make(g, load_cluster("haswell_2k80"), Budget(5, 60.0))
    result = make_placer("toy_api_placer", a=2).place(problem, problem.evaluator.budget, 0)
    assert result.placement.dtype == np.int64 and result.placement.tolist() == [2, 2]
    assert result.evaluations == 1 and len(result.curve) == 1 and result.info == {"note": "hi"}
    assert result.wall_time_s >= 0


@pytest.mark.parametrize("given", [[0.0, 1.0], [1.5, 0.0], ["gpu:0", "cpu:0"], np.array([1, 2], dtype=np.uint64),
                                   [0, True], [np.int64(0), np.True_]])
def test_from_search_keeps_a_placement_that_is_not_integers_as_given(given):
    """For the harness to validate (and refuse): a cast would make device 1 of 1.5 or of True (which
    `validate` refuses as a device index), or wrap a uint64."""
    g = OpGraph.build("two", [Op("a", "matmul", flops=1e9), Op("b", "matmul", flops=1e9)], [("a", "b")])
    problem = Problem.make(g, load_cluster("haswell_2k80"), Budget(5, 60.0))
    result = PlacementResult.from_search(given, problem, time.perf_counter())
    assert result.placement is given


def test_a_bool_device_from_search_is_invalid_as_it_is_when_returned_as_given():
    g = OpGraph.build("two", [Op("a", "matmul", flops=1e9), Op("b", "matmul", flops=1e9)], [("a", "b")])
    cluster = load_cluster("haswell_2k80")
    problem = Problem.make(g, cluster, Budget(5, 60.0))
    with pytest.raises(PlacementError, match=r"placement\[1\] \(op 'b'\): True is not a device index"):
        validate(PlacementResult.from_search([0, True], problem, time.perf_counter()).placement, g, cluster)
    assert PlacementResult.from_search([np.int64(1), 0], problem, time.perf_counter()).placement.tolist() == [1, 0]


def test_a_second_class_cannot_take_a_registered_name_but_the_same_one_again_can(toy_placer):
    """A stale copy of a plugin must not silently replace the one under test; reloading the same one is fine."""
    with pytest.raises(PlacebenchError, match=r"^placer name 'toy_api_placer' is taken by .*toy_placer\.<locals>\.Toy "
                                              r"\(registered in this process\); register .*\.Other under another name$"):
        register_placer("toy_api_placer")(type("Other", (BasePlacer,), {}))
    assert register_placer("toy_api_placer")(toy_placer) is toy_placer
    assert type(make_placer("toy_api_placer")) is toy_placer


class _EntryPoint:
    """An installed plugin's entry point, as `importlib.metadata` gives it: `load` imports its module."""

    def __init__(self, name, load):
        self.name, self.value, self.module, self.load = name, "mypkg.placers:Mine", "mypkg.placers", load


def _install(monkeypatch, ep):
    installed = placer._entry_points()
    monkeypatch.setattr(placer, "_entry_points", lambda: {**installed, ep.name: ep})


def test_an_installed_placer_class_is_named_by_its_entry_point(monkeypatch):
    """A BasePlacer subclass without a `name` of its own: its messages name the entry point, not 'base'."""
    mine = type("Mine", (BasePlacer,), {"defaults": {"k": 1}})
    _install(monkeypatch, _EntryPoint("ep_named", lambda: mine))
    assert placer.placer_class("ep_named").name == "ep_named"
    with pytest.raises(ParameterError, match=r"^placer 'ep_named': bad parameters \{'j': 1\}"):
        make_placer("ep_named", j=1)


@pytest.mark.parametrize("raised, why", [
    (RuntimeError("no GPU driver"), "RuntimeError: no GPU driver"),
    (SystemExit("usage: mine --steps N"), "SystemExit: usage: mine --steps N"),  # an argparse run on import
])
def test_an_installed_plugin_that_fails_to_import_is_a_plugin_error(monkeypatch, raised, why):
    """Listed as broken and its cells `error` rows (README), not the end of `placebench list placers`."""

    def load():
        raise raised

    _install(monkeypatch, _EntryPoint("ep_broken", load))
    with pytest.raises(PluginError, match=rf"^placer 'ep_broken' \(mypkg\.placers:Mine\) failed to load: {why}$"):
        placer.placer_class("ep_broken")


def test_a_constructor_that_exits_is_the_placers_failure(monkeypatch):
    """sys.exit() in a constructor (an argparse there) gives error rows, not the end of the run."""

    class Exits(BasePlacer):
        def __init__(self, **params):
            raise SystemExit(2)

    _install(monkeypatch, _EntryPoint("ep_exits", lambda: Exits))
    with pytest.raises(PlacerFailed, match=r"^placer 'ep_exits' \(.*Exits\) raised in its constructor: SystemExit: 2$"):
        make_placer("ep_exits")


def test_a_choice_parameter_must_name_one_of_its_choices():
    check_choice("p", "grouping", "ops", ("ops", "layers"))
    with pytest.raises(PlacebenchError, match=r"^p: grouping 'op' is not one of ops, layers$"):
        check_choice("p", "grouping", "op", ("ops", "layers"))


def test_what_a_plugin_prints_on_import_and_construction_goes_to_stderr(monkeypatch, capsys):
    """stdout is the command's table or --json document."""

    class Chatty(BasePlacer):
        def __init__(self, **params):
            print("building chatty")
            super().__init__(**params)

    def load():
        print("importing chatty")
        return Chatty

    _install(monkeypatch, _EntryPoint("ep_chatty", load))
    make_placer("ep_chatty")
    out, err = capsys.readouterr()
    assert (out, err) == ("", "importing chatty\nbuilding chatty\n")


def test_a_problem_plans_on_the_evaluators_profiles():
    """Its costs use the measured op times the evaluator scores with, not the cost model's alone."""
    g = OpGraph.build("two", [Op("a", "matmul", flops=1e9), Op("b", "matmul", flops=1e9)], [("a", "b")])
    cluster = load_cluster("haswell_2k80")
    gpu = next(i for i, d in enumerate(cluster.devices) if d.kind == "gpu")
    measured = Profile(workload="two", applies_to="gpu", op_times_s={"a": 0.25}, workload_hash=g.content_hash)
    problem = Problem.make(g, cluster, Budget(5, 60.0), profiles=[measured])
    assert problem.profiles == (measured,)
    assert problem.costs()[0, gpu] == 0.25
    assert Problem.make(g, cluster, Budget(5, 60.0)).costs()[0, gpu] != 0.25
