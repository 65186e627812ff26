"""Placer parameters in a spec: the identity of a cell, and whose error a parameter problem is."""

from __future__ import annotations

import re

import pytest

from suite import runner
from suite.errors import PlacebenchError
from suite.placer import ParameterError, PlacerFailed, canonical_params, make_placer, unregister_placer
from suite.store import Store


def _spec(tiny_files, harness_plugin, *placers):
    return runner.spec_from_dict({"name": "t", "workloads": [str(tiny_files["diamond"])],
                                  "clusters": [str(tiny_files["cluster"])], "placers": list(placers),
                                  "plugins": [harness_plugin]}, source="t.toml")


class Plain:  # a placer class without BasePlacer's `defaults`: its constructor's keyword defaults count
    def __init__(self, lr=0.5, steps=3, mode=None):
        pass


def test_a_whole_number_for_a_float_parameter_is_that_float():
    given = {"lr": 1, "steps": 4, "mode": 2}
    assert canonical_params(Plain, given) == {"lr": 1.0, "steps": 4, "mode": 2}
    assert [type(v) for v in canonical_params(Plain, given).values()] == [float, int, int]
    assert type(canonical_params(Plain, {"lr": True})["lr"]) is bool  # not 1.0: the type check refuses it
    # an integer a float cannot hold exactly (or at all) is left for the placer's own check
    assert type(canonical_params(Plain, {"lr": 2**53 + 1})["lr"]) is int
    assert type(canonical_params(Plain, {"lr": 10**400})["lr"]) is int
    assert given == {"lr": 1, "steps": 4, "mode": 2}  # not changed in place


def test_k_1_and_k_1_0_are_one_cell(tiny_files, harness_plugin):
    """sleep_s defaults to 0.2: `sleep_s = 0` and `sleep_s = 0.0` made two cells (ids, labels) of one setup."""
    cells = [runner.make_plan(_spec(tiny_files, harness_plugin, {"name": "harness_sleepy", "params": {"sleep_s": v}})).cells[0]
             for v in (0, 0.0)]
    assert cells[0].cell_id == cells[1].cell_id
    assert cells[0].key["placer"] == "harness_sleepy(sleep_s=0.0)"
    assert cells[0].placer.params_json == '{"sleep_s":0.0}'
    # an integer parameter stays an integer
    [cell] = runner.make_plan(_spec(tiny_files, harness_plugin, {"name": "harness_search", "params": {"evaluations": 2}})).cells
    assert (cell.key["placer"], cell.placer.params_json) == ("harness_search(evaluations=2)", '{"evaluations":2}')


def test_a_rerun_with_the_number_written_otherwise_reuses_the_stored_cell(tiny_files, harness_plugin, tmp_path):
    store = tmp_path / "store"
    first = runner.run(_spec(tiny_files, harness_plugin, {"name": "harness_sleepy", "params": {"sleep_s": 0}}), store)
    assert (first.ran, first.rows[0]["params"]) == (1, '{"sleep_s":0.0}')
    again = runner.run(_spec(tiny_files, harness_plugin, {"name": "harness_sleepy", "params": {"sleep_s": 0.0}}), store)
    assert (again.ran, again.reused) == (0, 1)
    assert [r["placer"] for r in again.store.rows()] == ["harness_sleepy(sleep_s=0.0)"]


BUGGY_PLUGIN = '''
from suite.placer import BasePlacer, register_placer


@register_placer("test_buggy_init")
class BuggyInit(BasePlacer):
    """Its constructor has a bug: a TypeError of its own, whatever the parameters."""

    defaults = {"width": 2}

    def __init__(self, **params):
        super().__init__(**params)
        self.half = "x" + self.params["width"]

    def place(self, problem, budget, seed):
        raise AssertionError("never made")


@register_placer("test_plain_init")
class PlainInit:
    def __init__(self, *, needed, lr=0.1):
        self.params = {"needed": needed, "lr": lr}

    def place(self, problem, budget, seed):
        raise AssertionError("not run")
'''


@pytest.fixture
def buggy_plugin(tmp_path):
    path = tmp_path / "buggy.py"
    path.write_text(BUGGY_PLUGIN)
    yield str(path)
    for name in ("test_buggy_init", "test_plain_init"):
        unregister_placer(name)
    runner._PLUGINS.pop(str(path), None)


def test_a_type_error_in_a_placers_constructor_is_the_placers_not_the_specs(buggy_plugin):
    runner.load_plugins([buggy_plugin])
    with pytest.raises(PlacerFailed) as exc:
        make_placer("test_buggy_init", width=3)
    assert re.fullmatch(r"placer 'test_buggy_init' \(placebench_plugin_buggy_\w+\.BuggyInit \(.*buggy\.py\)\) raised "
                        r"in its constructor: TypeError: can only concatenate str \(not \"int\"\) to str", str(exc.value))
    assert isinstance(exc.value.__cause__, TypeError)
    # unknown and missing parameters are the spec's: of a BasePlacer and of a plain constructor
    with pytest.raises(ParameterError, match=r"^placer 'test_buggy_init': bad parameters \{'depth': 1\}: unknown "
                                             r"parameter\(s\) \['depth'\]; known: \['width'\]$"):
        make_placer("test_buggy_init", depth=1)
    with pytest.raises(ParameterError, match=r"^placer 'test_plain_init': bad parameters \{'lr': 0.5\}: missing a "
                                             r"required argument: 'needed'$"):
        make_placer("test_plain_init", lr=0.5)
    with pytest.raises(ParameterError, match=r"^placer 'test_plain_init': bad parameters \{'needed': 1, 'k': 2\}: "
                                             r"got an unexpected keyword argument 'k'$"):
        make_placer("test_plain_init", needed=1, k=2)
    assert make_placer("test_plain_init", needed=1).params == {"needed": 1, "lr": 0.1}
    # a value the placer's checks refuse stays the spec's error
    with pytest.raises(PlacebenchError, match=r"parameter width='2': expected an integer") as exc:
        make_placer("test_buggy_init", width="2")
    assert not isinstance(exc.value, PlacerFailed)


def test_a_placer_whose_constructor_fails_gives_error_rows(tiny_files, buggy_plugin, tmp_path):
    """It was a spec error ("bad parameters"), the run refused as if the spec were wrong."""
    spec = runner.spec_from_dict({"name": "t", "workloads": [str(tiny_files["diamond"])],
                                  "clusters": [str(tiny_files["cluster"])], "plugins": [buggy_plugin],
                                  "placers": ["single_cpu", {"name": "test_buggy_init", "params": {"width": 3}}]},
                                  source="t.toml")
    rows = {r["placer"]: r for r in runner.run(spec, tmp_path / "store").rows}
    assert rows["single_cpu"]["status"] == "ok"
    row = rows["test_buggy_init(width=3)"]
    assert row["status"] == "error"
    assert row["message"].startswith("placer 'test_buggy_init' (placebench_plugin_buggy_")
    assert row["message"].endswith("raised in its constructor: TypeError: can only concatenate str (not \"int\") to str")
    record = Store(tmp_path / "store").read_cell(row["cell_id"])
    assert 'self.half = "x" + self.params["width"]' in record["traceback"]
