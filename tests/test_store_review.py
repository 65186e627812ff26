"""Store regressions found in review: a CSV results table's bad value is a StoreError, never a traceback."""

from __future__ import annotations

import pytest

from suite import store as st
from suite.store import Store, StoreError


def _record(cell_id: str, **kw) -> dict:
    """A stored cell of placer p on workload w and cluster c, ok in 0.125 s (seed 0)."""
    return {"cell_id": cell_id, "workload": "w", "workload_hash": "sha256:w", "cluster": "c", "cluster_hash": "sha256:c",
            "placer": "p", "placer_name": "p", "params": "{}", "params_hash": "h", "seed": 0, "methodology": "m1",
            "budget_evaluations": 10, "budget_seconds": 1.5, "evaluator": "simulator", "status": "ok", "message": "",
            "step_time_s": 0.125, "evaluations": 3, "placement": [0, 0, 1], **kw}


def test_a_bad_number_beside_a_long_message_is_a_store_error(tmp_path):
    """A CSV table with a bad number, and a field longer than the csv module's limit (131072 characters: a long
    error message) in the rows that the bad value's line is looked up in, raised csv's `_csv.Error: field larger
    than field limit`, a traceback of `placebench table`. Now the file's StoreError with Arrow's message."""
    s = Store(tmp_path / "store")
    s.write_cell(_record("a1", status="error", step_time_s=None, message="x" * 200_000))
    s.write_cell(_record("a2", seed=1))
    _, path = s.compact()
    text = path.read_text()
    assert text.count("0.125") == 1
    path.write_text(text.replace("0.125", "abc"))
    with pytest.raises(StoreError, match=r"results\.csv: .*'abc'"):
        st.read_table(path)


def test_a_bad_number_holding_a_newline_is_named_with_its_row(tmp_path):
    """A bad number that holds a newline (a quoted CSV field) was reported from the first line of Arrow's message
    only, "not a placebench results table: ... invalid value 'x", without its row. Now as any other bad value:
    the line its row starts on (after a row whose message spans two lines), the row and the value."""
    s = Store(tmp_path / "store")
    s.write_cell(_record("a1", status="error", step_time_s=None, message="boom\nline 2"))
    s.write_cell(_record("a2", seed=1))
    _, path = s.compact()
    text = path.read_text()
    assert text.count("0.125") == 1 and len(text.splitlines()) == 4  # header, a1 on two lines, a2
    path.write_text(text.replace("0.125", '"x\ny"'))
    with pytest.raises(StoreError) as err:
        st.read_table(path)
    assert str(err.value) == f'{path}: line 4 (c / w / p / seed 1): step_time_s must be a number or empty, got "x\\ny"'
