"""The re-measurement of a final placement with a methodology of several repetitions, on the simulator."""

from __future__ import annotations

import dataclasses
import json

from suite import methodology, runner
from suite.evaluator import Evaluator, SimulatorBackend

REPEATED = """\
version = "test-three-repetitions"
[remeasure]
repetitions = 3
"""


def test_a_simulated_cell_is_measured_once_whatever_the_repetitions(tiny_files, tmp_path):
    """With repetitions = 3 a simulated row said samples 3 with no spread: three equal simulations, read as three
    measurements. Each of its cells on the tiny cluster: all on the CPU, 4 ops of 1 s."""
    (tmp_path / "three.toml").write_text(REPEATED)
    spec = runner.spec_from_dict({"name": "t", "workloads": [str(tiny_files["diamond"])],
                                  "clusters": [str(tiny_files["cluster"])], "placers": ["single_cpu"],
                                  "methodology": "three.toml"}, source="t.toml", base=tmp_path)
    [cell] = runner.make_plan(spec).cells
    assert cell.methodology.repetitions == 3
    record = runner.run_cell(cell)
    assert (record["status"], record["step_time_s"], record["samples"]) == ("ok", 4.0, 1)
    assert runner.check_in_runner(cell, record)[1]
    placement = tmp_path / "p.json"
    placement.write_text(json.dumps([0, 0, 0, 0]))
    measured = runner.measure_placement(str(tiny_files["diamond"]), str(tiny_files["cluster"]), placement,
                                        methodology=str(tmp_path / "three.toml"))
    assert (measured["step_time_s"], measured["samples"]) == (4.0, 1)


def test_a_backend_repeats_unless_its_own_class_says_it_is_deterministic(tiny_graph, tiny_cluster):
    """A subclass of the simulator may add noise: it is repeated unless it declares `deterministic = True`."""
    three = dataclasses.replace(methodology.load(), repetitions=3)

    class Subclass(SimulatorBackend):
        pass

    class Declared(SimulatorBackend):
        deterministic = True

    def samples(backend, **kw):
        return Evaluator(tiny_graph, tiny_cluster, methodology=three, backend=backend).measure([0, 0, 0, 0], **kw).samples_s

    assert samples(SimulatorBackend(tiny_graph, tiny_cluster)) == (4.0,)
    assert samples(Declared(tiny_graph, tiny_cluster)) == (4.0,)
    assert samples(Subclass(tiny_graph, tiny_cluster)) == (4.0, 4.0, 4.0)
    assert samples(SimulatorBackend(tiny_graph, tiny_cluster), repetitions=2) == (4.0, 4.0)  # asked for: given
