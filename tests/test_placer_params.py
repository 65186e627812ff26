"""Placer parameters in a spec: the identity of a cell, and whose error a parameter problem is."""

from __future__ import annotations

from suite import runner
from suite.placer import canonical_params


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
