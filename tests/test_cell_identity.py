"""A cell's identity (its id, from its key) and when a stored cell is reused, rerun or retried."""

from __future__ import annotations

from suite import runner


def test_a_leaderboard_cells_id_is_unchanged():
    """The id of a cell of the full suite's store (resnet50-b1-infer on haswell_2k80, single_gpu, seed 2, the
    methodology v1, the simulator): a change of how keys are made or written (a field, their order) would
    make every stored cell look new, and a rerun would run all of them again."""
    spec = runner.spec_from_dict({"name": "full", "workloads": ["resnet50-b1-infer"], "clusters": ["haswell_2k80"],
                                  "placers": ["single_gpu"], "seeds": [2]}, source="t.toml")
    [cell] = runner.make_plan(spec).cells
    assert cell.key["params_hash"] == "44136fa355b3"  # of {}
    assert cell.cell_id == "000ec9a49083de1e8db3"


def test_parameters_in_another_order_are_one_cell():
    """TOML keeps a table's order: {a = 1, b = 2.5} and {b = 2.5, a = 1} are one setup, one cell."""
    entries = [runner.PlacerEntry("p", {"a": 1, "b": 2.5}), runner.PlacerEntry("p", {"b": 2.5, "a": 1})]
    assert [e.params_json for e in entries] == ['{"a":1,"b":2.5}'] * 2
    assert entries[0].params_hash == entries[1].params_hash and entries[0].shown == entries[1].shown == "p(a=1,b=2.5)"


def test_a_placer_whose_source_cannot_be_read_now_keeps_its_stored_cells(tiny_files, write_spec, tmp_path,
                                                                          monkeypatch):
    """An unknown fingerprint (None) on either side is no evidence of changed code: the cell is reused."""
    spec = runner.load_spec(str(write_spec(workloads=[str(tiny_files["diamond"])],
                                           clusters=[str(tiny_files["cluster"])], placers=["single_cpu"])))
    store = tmp_path / "store"
    assert runner.run(spec, store).ran == 1
    monkeypatch.setattr(runner, "placer_code", lambda name: None)
    told = []
    assert runner.run(spec, store, on_plan=lambda *a: told.append(a)).ran == 0
    assert told == [(1, 1, 0, 0)]


def test_retry_failed_reruns_errors_and_timeouts_only(tiny_files, write_spec, harness_plugin, tmp_path):
    """invalid, skipped and oom are results of the placer, as ok is: --retry-failed leaves them."""
    spec = runner.load_spec(str(write_spec(workloads=[str(tiny_files["big"])], clusters=[str(tiny_files["cluster"])],
                                           placers=["single_gpu", "harness_invalid", "harness_not_applicable",
                                                    "harness_raises"], plugins=[harness_plugin])))
    store = tmp_path / "store"
    first = runner.run(spec, store)
    assert sorted(r["status"] for r in first.rows) == ["error", "invalid", "oom", "skipped"]
    again = runner.run(spec, store, retry_failed=True)
    assert [r["placer"] for r in again.rows if r["run_id"] == again.run_id] == ["harness_raises"]
