"""The evaluator counts every evaluation against the budget, scores failures, and records the curve."""

import re
import time
from dataclasses import replace

import numpy as np
import pytest

from suite import Op, OpGraph
from suite.costmodel import Profile
from suite.errors import BudgetExhausted, GraphError, ProfileError
from suite.evaluator import Evaluator, Measurement, SimulatorBackend, serial_bound_s
from suite.methodology import Budget
from suite.methodology import load as load_methodology

G = 1e9


@pytest.fixture
def problem(uniform_cluster):
    g = OpGraph.build("fork", [Op("a", "x", flops=G, output_bytes=1000), Op("b", "x", flops=2 * G, param_bytes=600),
                               Op("c", "x", flops=2 * G)], [("a", "b"), ("a", "c")])
    return g, uniform_cluster(2)


def test_budget_is_counted_and_enforced(problem):
    g, c = problem
    # no time limit that counts: the first evaluation compiles the simulator (or loads numba's cache), which
    # on a loaded machine with a cold cache can take long enough that 60 s leave no time for the batch of two
    ev = Evaluator(g, c, Budget(max_evaluations=3, max_seconds=1e9))
    assert ev.evaluate([0, 0, 0]).step_time_s == 5.0
    ms = ev.evaluate_batch([[0, 1, 0], [0, 0, 1]])
    # a [0,1]; copy to d1 [1,2]; b on d1 [2,4]; c on d0 [1,3] -> 4 s, and symmetric
    assert [m.step_time_s for m in ms] == [4.0, 4.0]
    assert ev.evaluations_used == 3 and ev.remaining == 0 and ev.exhausted
    with pytest.raises(BudgetExhausted):
        ev.evaluate([0, 0, 0])
    assert [p.evaluations for p in ev.curve] == [1, 2, 3]
    assert [p.best_score_s for p in ev.curve] == [5.0, 4.0, 4.0]
    assert ev.curve[-1].mean_score_s == pytest.approx(13.0 / 3)
    assert ev.best_placement.tolist() == [0, 1, 0]


def test_batches_are_sized_to_the_time_left(problem):
    """After measurements averaging 2 s, 11 s left fit 5 more evaluations: `affordable` says so, and a batch
    of 6 is refused before it starts instead of overrunning the time budget (no clock is asserted: the
    seconds per evaluation are set, only the few microseconds of this test elapse)."""
    g, c = problem
    ev = Evaluator(g, c, Budget(max_evaluations=100, max_seconds=11))
    assert ev.seconds_per_evaluation is None and ev.affordable(16) == 16  # nothing measured yet: no estimate
    ev.evaluate([0, 0, 0])
    assert ev.seconds_per_evaluation is not None and ev._measured == 1
    ev._measured, ev._measuring_s = 4, 8.0
    assert ev.affordable(16) == 5 and ev.affordable(3) == 3
    with pytest.raises(BudgetExhausted, match="6 evaluations would take about 12 s"):
        ev.evaluate_batch([[0, 0, 0]] * 6)
    assert ev.evaluations_used == 1
    assert len(ev.evaluate_batch([[0, 0, 0]] * 5)) == 5 and ev._measured == 9
    ev._measuring_s = 1e9  # one evaluation longer than the time left: still one at a time while time is left
    assert ev.affordable(16) == 1
    assert len(ev.evaluate_batch([[0, 0, 0]])) == 1  # the one evaluation `affordable` allows is not refused
    with pytest.raises(BudgetExhausted, match="2 evaluations would take"):
        ev.evaluate_batch([[0, 0, 0]] * 2)


def _two_seconds_each_eleven_left(problem) -> Evaluator:
    """An evaluator that has measured 2 s per evaluation so far and has 11 s of its budget left."""
    g, c = problem
    ev = Evaluator(g, c, Budget(max_evaluations=100, max_seconds=11))
    ev.evaluate([0, 0, 0])
    ev._measured, ev._measuring_s = 4, 8.0
    ev.started = time.perf_counter()
    return ev


def test_a_batch_that_affordable_allowed_is_not_refused_for_the_time_spent_making_it(problem):
    """README's loop `while (k := ev.affordable(n)) > 0: ev.evaluate_batch(make(k))`: the time spent making and
    validating the k placements must not turn the grant into a refusal (it ended every time-bound search with
    BudgetExhausted, an error cell). A batch larger than the grant, or one with no grant, is still refused."""
    ev = _two_seconds_each_eleven_left(problem)  # 5 fit
    assert ev.affordable(16) == 5
    ev.started -= 1.5  # the placer took 1.5 s to make them: 9.5 s left
    assert len(ev.evaluate_batch([[0, 0, 0]] * 5)) == 5
    ev._measured, ev._measuring_s = 4, 8.0
    ev.started = time.perf_counter() - 1.5
    with pytest.raises(BudgetExhausted, match="5 evaluations would take about 10 s"):  # no grant for it
        ev.evaluate_batch([[0, 0, 0]] * 5)
    ev.started = time.perf_counter()
    assert ev.affordable(4) == 4 and len(ev.evaluate_batch([[0, 0, 0]])) == 1
    ev._measured, ev._measuring_s = 4, 8.0
    ev.started -= 6.0  # 5 s left: the rest of the grant is taken, and no more
    assert len(ev.evaluate_batch([[0, 0, 0]] * 3)) == 3
    ev._measured, ev._measuring_s = 4, 8.0
    with pytest.raises(BudgetExhausted, match="3 evaluations would take"):
        ev.evaluate_batch([[0, 0, 0]] * 3)


def test_single_evaluations_use_up_the_grant_of_affordable(problem):
    """A grant of `affordable` covers the evaluations it allowed, single ones too: after 3 of a grant of 4 were
    used one at a time, a batch of 3 that the time left does not fit is refused (only 1 is left of the grant)."""
    ev = _two_seconds_each_eleven_left(problem)  # 5 fit
    assert ev.affordable(4) == 4
    for _ in range(3):
        ev.evaluate([0, 0, 0])
    ev._measured, ev._measuring_s = 4, 8.0
    ev.started -= 6.0  # 5 s left: 2 fit, and 1 of the grant is left
    with pytest.raises(BudgetExhausted, match="3 evaluations would take about 6 s"):
        ev.evaluate_batch([[0, 0, 0]] * 3)
    assert ev.evaluations_used == 4


def test_the_rest_of_a_grant_still_covers_a_batch_after_single_evaluations(problem):
    """A grant of 4, one used by `evaluate`: the 3 left cover a batch of 3 that the time left (1 fits) would
    refuse. Without a grant, a batch of one is not refused for time while any is left, as `evaluate` is not."""
    ev = _two_seconds_each_eleven_left(problem)  # 5 fit
    assert ev.affordable(4) == 4
    ev.evaluate([0, 0, 0])
    ev._measured, ev._measuring_s = 4, 8.0
    ev.started -= 8.0  # 3 s left: 1 fits, 3 of the grant are left
    assert len(ev.evaluate_batch([[0, 0, 0]] * 3)) == 3 and ev.evaluations_used == 5
    ev._measured, ev._measuring_s = 4, 8.0  # the grant is spent; 2 s per evaluation
    ev.started = time.perf_counter() - 10.0  # 1 s left
    assert len(ev.evaluate_batch([[0, 0, 0]])) == 1 and ev.evaluations_used == 6


def test_a_profile_reaches_batches_single_evaluations_re_measurement_and_the_failure_score(problem):
    """b measured at 7 s where the analytic model says 2 s: every way a placement is measured uses it."""
    g, c = problem
    prof = Profile(workload="fork", applies_to="gpu", op_times_s={"b": 7.0})
    ev = Evaluator(g, c, Budget(max_evaluations=10, max_seconds=60), profiles=[prof])
    # all on d0: 1 + 7 + 2 s; split: a on d0 (0-1 s), then b (1-8 s); c on d1 once a's 1000 bytes crossed at
    # 1000 B/s (2-4 s)
    assert [m.step_time_s for m in ev.evaluate_batch([[0, 0, 0], [0, 0, 1]])] == [10.0, 8.0]
    assert ev.evaluate([0, 0, 1]).step_time_s == 8.0
    m = ev.measure([0, 0, 1])
    assert (m.step_time_s, m.busy_s, m.bytes_transferred) == (8.0, {"d0": 8.0, "d1": 2.0}, 1000)
    assert ev.failure_score_s == ev.methodology.failure_multiple * 10.0  # 1 + 7 + 2 s on the slowest device
    plain = Evaluator(g, c, Budget(max_evaluations=10, max_seconds=60))
    assert [m.step_time_s for m in plain.evaluate_batch([[0, 0, 0], [0, 0, 1]])] == [5.0, 4.0]
    assert plain.failure_score_s == plain.methodology.failure_multiple * 5.0
    # a simulator backend handed in (as the runner does) bounds the failure score with its own profiles
    given = Evaluator(g, c, Budget(max_evaluations=10, max_seconds=60), backend=SimulatorBackend(g, c, [prof]))
    assert given.failure_score_s == ev.failure_score_s


def test_profiles_that_make_every_op_0_s_everywhere_are_refused(problem):
    """Every op at 0 s on both GPUs made the serial bound 0 s, so an OOM or invalid placement scored 0 s, as
    well as the best ok placement. 0 s for every op on one device only leaves the other's times: no refusal."""
    g, c = problem
    zeros = {"a": 0.0, "b": 0.0, "c": 0.0}
    with pytest.raises(ProfileError, match=r"^profile\(s\) \(for 'gpu', not from a file\) make every op of workload "
                                           r"'fork' take 0 s on every device of cluster 'uniform2'.*scoring it as well "
                                           r"as the best placement"):
        Evaluator(g, c, Budget(max_evaluations=10, max_seconds=60), profiles=[Profile("fork", "gpu", zeros)])
    ev = Evaluator(g, c, Budget(max_evaluations=10, max_seconds=3600), profiles=[Profile("fork", "d0", zeros)])
    assert ev.failure_score_s == ev.methodology.failure_multiple * 5.0  # d1's roofline times: 1 + 2 + 2 s
    assert ev.evaluate([0, 0, 0]).step_time_s == 0.0 and ev.score(ev.evaluate([0, 0])) == 2 * ev.failure_score_s


def test_a_workload_whose_roofline_times_are_all_0_s_is_refused_without_profiles(uniform_cluster):
    """Every op 0 FLOPs and 0 bytes, devices without an op overhead: the serial bound was 0 s, so the penalty
    of an OOM or invalid placement was 0 s, as good as the best ok placement. Refused as the profiled case
    is, naming the workload and cluster; one op with FLOPs leaves a penalty."""
    c = uniform_cluster(2)
    zero = OpGraph.build("nothing", [Op("a", "x"), Op("b", "x")], [("a", "b")])
    with pytest.raises(GraphError, match=r"^every op of workload 'nothing' takes 0 s on every device of cluster "
                                         r"'uniform2' \(0 FLOPs and 0 bytes.*scoring it as well as the best placement"):
        Evaluator(zero, c, Budget(max_evaluations=10, max_seconds=60))
    some = OpGraph.build("something", [Op("a", "x"), Op("b", "x", flops=G)], [("a", "b")])
    assert Evaluator(some, c, Budget(max_evaluations=10, max_seconds=60)).failure_score_s > 0


def test_the_cli_refuses_a_0_s_workload_before_any_cell_runs(tiny_files, write_spec, tmp_path, capsys):
    """The runner's plan check refuses the unprofiled 0 s workload as the Evaluator does: a one-line CLI
    error, exit 2, no cell run."""
    from suite import graph_io
    from suite.cli import main

    path = graph_io.save(OpGraph.build("nothing", [Op("a", "x"), Op("b", "x")], [("a", "b")]), tmp_path / "z.json")
    spec = write_spec("zero", workloads=[str(path)], clusters=[str(tiny_files["cluster"])], placers=["single_cpu"])
    code = main(["run", str(spec), "--out", str(tmp_path / "cli"), "--quiet"])
    out, err = capsys.readouterr()
    assert code == 2 and err.startswith("placebench: error: every op of workload 'nothing' takes 0 s on every device "
                                        "of cluster 'tiny'")
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "cli" / "cells").exists() or not any((tmp_path / "cli" / "cells").iterdir())


def test_batch_larger_than_budget_is_refused_whole(problem):
    g, c = problem
    ev = Evaluator(g, c, Budget(max_evaluations=2, max_seconds=60))
    with pytest.raises(BudgetExhausted):
        ev.evaluate_batch([[0, 0, 0]] * 3)
    assert ev.evaluations_used == 0


def test_one_placement_given_as_a_batch_is_refused_before_any_evaluation(problem):
    """evaluate_batch(placement) instead of evaluate_batch([placement]): its 3 entries would be 3 invalid
    placements, 3 evaluations spent on nothing."""
    g, c = problem
    ev = Evaluator(g, c, Budget(max_evaluations=10, max_seconds=60))
    for one in ([0, 0, 0], np.array([0, 1, 0]), ["cpu:0"] * 3, (np.int64(0),) * 3):
        with pytest.raises(TypeError, match=r"evaluate_batch takes a batch .* this is one placement"):
            ev.evaluate_batch(one)
    assert ev.evaluations_used == 0
    assert len(ev.evaluate_batch([[0, 0, 0]])) == 1 and len(ev.evaluate_batch(np.zeros((2, 3), dtype=int))) == 2
    assert ev.evaluate_batch([]) == [] and ev.evaluations_used == 3


def test_failures_are_statuses_with_penalty_scores(problem, uniform_cluster):
    g, _ = problem
    c = uniform_cluster(2, memory_bytes=1500)
    ev = Evaluator(g, c, Budget(max_evaluations=10, max_seconds=60))
    bound = serial_bound_s(g, c)
    assert bound == 5.0
    bad = ev.evaluate([0, 0])
    assert bad.status == "invalid" and "2 entries" in bad.message and bad.step_time_s is None
    assert ev.score(bad) == 2 * ev.methodology.failure_multiple * bound
    # b's 600 resident bytes + live tensors on d1 exceed 1500? a's copy 1000 + 600 = 1600 -> OOM
    oom = ev.evaluate([0, 1, 0])
    assert oom.status == "oom" and oom.oom_devices == ("d1",) and "d1 needs" in oom.message
    assert ev.score(oom) == ev.methodology.failure_multiple * bound + oom.step_time_s
    assert ev.evaluations_used == 2  # invalid placements cost an evaluation too


def test_the_penalties_are_the_methodologys_failure_multiple_of_the_serial_bound(problem, uniform_cluster):
    # failure_multiple 3, serial bound 5 s: invalid 2 x 3 x 5 = 30 s, OOM 3 x 5 = 15 s + its step time
    g, _ = problem
    three = replace(load_methodology(), failure_multiple=3.0)
    ev = Evaluator(g, uniform_cluster(2, memory_bytes=1500), Budget(max_evaluations=10, max_seconds=60), methodology=three)
    assert ev.failure_score_s == 15.0 and ev.score(ev.evaluate([0, 0])) == 30.0
    oom = ev.evaluate([0, 1, 0])
    assert oom.status == "oom" and ev.score(oom) == 15.0 + oom.step_time_s


def test_measure_is_outside_the_budget(problem):
    g, c = problem
    ev = Evaluator(g, c, Budget(max_evaluations=1, max_seconds=60))
    m = ev.measure([0, 0, 0])
    assert m.status == "ok" and m.step_time_s == 5.0 and ev.evaluations_used == 0


def test_time_budget_is_enforced(problem):
    g, c = problem
    ev = Evaluator(g, c, Budget(max_evaluations=10, max_seconds=60))
    ev.started -= 61  # as if the search had started 61 s ago: evaluations are left, time is not
    assert ev.remaining == 10 and ev.exhausted
    with pytest.raises(BudgetExhausted, match="time budget"):
        ev.evaluate([0, 0, 0])
    assert ev.evaluations_used == 0 and ev.curve == []


def test_serial_bound_takes_each_ops_slowest_device(tiny_graph, tiny_cluster):
    # diamond: 4 ops of 1e9 FLOPs, 1 s each on the CPU (the slowest), 0.1 s on the GPU -> 4 x 1 s
    assert serial_bound_s(tiny_graph, tiny_cluster) == 4.0


class Scripted:
    """A backend that answers with the given measurements in turn."""

    name = "scripted"

    def __init__(self, *answers):
        self.answers = list(answers)

    def measure(self, placement):
        return self.answers.pop(0)

    def measure_batch(self, placements):
        return [self.measure(p) for p in placements]


def _ok(t):
    return Measurement(status="ok", step_time_s=t, samples_s=(t,))


def test_measure_repeats_and_takes_the_median(tiny_graph, tiny_cluster):
    backend = Scripted(_ok(1.0), _ok(3.0), _ok(8.0))
    ev = Evaluator(tiny_graph, tiny_cluster, backend=backend)
    m = ev.measure([0, 0, 0, 0], repetitions=3)
    assert (m.status, m.step_time_s, m.samples_s) == ("ok", 3.0, (1.0, 3.0, 8.0))  # the mean would be 4.0
    assert backend.answers == [] and ev.evaluations_used == 0


def test_measure_repetitions_take_the_methodologys_statistic(tiny_graph, tiny_cluster):
    meth = load_methodology()
    mean = replace(meth, timing=replace(meth.timing, statistic="mean"))
    ev = Evaluator(tiny_graph, tiny_cluster, methodology=mean, backend=Scripted(_ok(1.0), _ok(3.0), _ok(8.0)))
    assert ev.measure([0, 0, 0, 0], repetitions=3).step_time_s == 4.0  # not the median, 3.0


def test_measure_repetitions_of_a_backend_that_gives_no_samples_take_its_step_times(tiny_graph, tiny_cluster):
    """samples_s is optional: a backend that gives only step times 1, 3 and 8 s is measured as three samples
    (median 3 s); it was an 'ok' measurement without a step time, a ValueError."""
    answers = [Measurement(status="ok", step_time_s=t) for t in (1.0, 3.0, 8.0)]
    m = Evaluator(tiny_graph, tiny_cluster, backend=Scripted(*answers)).measure([0, 0, 0, 0], repetitions=3)
    assert (m.status, m.step_time_s, m.samples_s) == ("ok", 3.0, (1.0, 3.0, 8.0))


def test_measure_repetitions_default_to_the_methodologys(tiny_graph, tiny_cluster):
    three = replace(load_methodology(), repetitions=3)
    backend = Scripted(_ok(1.0), _ok(3.0), _ok(8.0))
    ev = Evaluator(tiny_graph, tiny_cluster, methodology=three, backend=backend)
    assert ev.measure([0, 0, 0, 0]).samples_s == (1.0, 3.0, 8.0)


def test_measure_is_oom_if_any_repetition_is(tiny_graph, tiny_cluster):
    oom = Measurement(status="oom", step_time_s=8.0, samples_s=(8.0,), oom_devices=("gpu:0",),
                      message="gpu:0 over capacity", peak_memory_bytes={"gpu:0": 9})
    ev = Evaluator(tiny_graph, tiny_cluster, backend=Scripted(_ok(1.0), _ok(3.0), oom))
    m = ev.measure([0, 0, 0, 0], repetitions=3)
    # the OOM repetition decides the status and says which device overflowed and why
    assert (m.status, m.oom_devices, m.message, m.peak_memory_bytes) == ("oom", ("gpu:0",), "gpu:0 over capacity",
                                                                         {"gpu:0": 9})


def test_measure_repetitions_keep_each_devices_largest_peak(tiny_graph, tiny_cluster):
    def ok(t, peak):
        return Measurement(status="ok", step_time_s=t, samples_s=(t,), peak_memory_bytes=peak, bytes_transferred=64,
                           busy_s={"cpu:0": t})

    backend = Scripted(ok(1.0, {"cpu:0": 5, "gpu:0": 1}), ok(3.0, {"cpu:0": 2, "gpu:0": 4}), ok(8.0, {"cpu:0": 3}))
    m = Evaluator(tiny_graph, tiny_cluster, backend=backend).measure([0, 0, 0, 0], repetitions=3)
    assert (m.peak_memory_bytes, m.bytes_transferred, m.step_time_s) == ({"cpu:0": 5, "gpu:0": 4}, 64, 3.0)


def test_an_invalid_placement_in_a_batch_costs_an_evaluation_and_is_on_the_curve(problem):
    g, c = problem
    ev = Evaluator(g, c, Budget(max_evaluations=10, max_seconds=60))
    ms = ev.evaluate_batch([[0, 0, 0], [0, 0], [0, 1, 0]])
    assert [m.status for m in ms] == ["ok", "invalid", "ok"]
    assert ev.evaluations_used == 3 and [p.evaluations for p in ev.curve] == [1, 2, 3]
    # scores 5, 2 x failure score, 4 (as in test_budget_is_counted_and_enforced)
    bad = 2 * ev.failure_score_s
    assert [p.best_score_s for p in ev.curve] == [5.0, 5.0, 4.0]
    assert ev.curve[-1].mean_score_s == pytest.approx((5.0 + bad + 4.0) / 3)


def test_bytes_transferred_add_up_every_link(problem, uniform_cluster):
    # a on d0 sends its 1000 bytes to b on d1 and to c on d2: two transfers, 2000 bytes.
    g, _ = problem
    ev = Evaluator(g, uniform_cluster(3), Budget(max_evaluations=10, max_seconds=60))
    assert ev.evaluate([0, 1, 2]).bytes_transferred == 2000
    assert [m.bytes_transferred for m in ev.evaluate_batch([[0, 1, 2], [0, 1, 1]])] == [2000, 1000]
    assert ev.measure([0, 1, 2]).bytes_transferred == 2000


def test_the_oom_message_names_only_the_devices_over_capacity(uniform_cluster):
    # a holds 1000 parameter bytes on d0 (exactly the capacity: fits), b 1001 on d1 (one byte over).
    g = OpGraph.build("params", [Op("a", "x", flops=G, param_bytes=1000), Op("b", "x", flops=G, param_bytes=1001)], [])
    m = Evaluator(g, uniform_cluster(2, memory_bytes=1000)).measure([0, 1])
    assert (m.status, m.oom_devices) == ("oom", ("d1",))
    assert m.message == "out of memory: d1 needs 1001 bytes of 1000 bytes"
    assert m.peak_memory_bytes == {"d0": 1000, "d1": 1001}


def test_the_oom_message_shows_the_overflow_when_need_and_capacity_round_equal(uniform_cluster):
    # capacity 11.17 GiB (11993692405 bytes, rounded); d1 holds 4096 bytes more: both show as 11.17 GiB.
    cap = 11993692405
    g = OpGraph.build("params", [Op("a", "x", flops=G, param_bytes=cap - 1), Op("b", "x", flops=G, param_bytes=cap + 4096)], [])
    m = Evaluator(g, uniform_cluster(2, memory_bytes=cap)).measure([0, 1])
    assert m.message == "out of memory: d1 needs 11.17 GiB of 11.17 GiB (4.00 KiB over)"
    # 2 GiB of 1 GiB: plainly over, no overflow added
    g = OpGraph.build("params", [Op("a", "x", flops=G, param_bytes=2**31)], [])
    m = Evaluator(g, uniform_cluster(1, memory_bytes=2**30)).measure([0])
    assert m.message == "out of memory: d0 needs 2.00 GiB of 1.00 GiB"


def test_measure_is_oom_whichever_repetition_is(tiny_graph, tiny_cluster):
    oom = Measurement(status="oom", step_time_s=8.0, samples_s=(8.0,), oom_devices=("gpu:0",), message="over")
    m = Evaluator(tiny_graph, tiny_cluster, backend=Scripted(_ok(1.0), oom, _ok(3.0))).measure([0, 0, 0, 0], repetitions=3)
    assert (m.status, m.oom_devices, m.step_time_s, m.samples_s) == ("oom", ("gpu:0",), 3.0, (1.0, 8.0, 3.0))


def test_placements_by_device_name_or_mapping_are_recorded_as_device_indices(problem):
    """The curve and the best placement come from the validated placement, so a valid placement given by
    device names (or as an {op: device} mapping) is recorded as its indices, and an invalid one in a form
    that is no index array (the first evaluation, so also the best so far) is counted, not a crash."""
    g, c = problem
    ev = Evaluator(g, c, Budget(max_evaluations=10, max_seconds=60))
    assert ev.evaluate(["zz", "d0", "d0"]).status == "invalid"
    assert (ev.evaluations_used, len(ev.curve), ev.best_placement) == (1, 1, None)
    assert ev.evaluate({"a": 0}).status == "invalid"
    ms = ev.evaluate_batch([["d0", "d1", "d0"], {"a": "d0", "b": "d0", "c": "d0"}])
    assert [m.step_time_s for m in ms] == [4.0, 5.0]
    assert (ev.evaluations_used, len(ev.curve)) == (4, 4)
    assert ev.best_placement.tolist() == [0, 1, 0]


def test_after_only_invalid_evaluations_the_best_is_an_invalid_index_array(problem):
    """A placer returning `best_placement` then returns that invalid placement: its cell is 'invalid', not an
    error from a None placement."""
    g, c = problem
    ev = Evaluator(g, c, Budget(max_evaluations=10, max_seconds=60))
    assert ev.evaluate([0, 0]).status == "invalid" and ev.best_placement.tolist() == [0, 0]
    assert ev.evaluate_batch([[0, 7, 0]])[0].status == "invalid" and ev.best_placement.tolist() == [0, 0]


@pytest.mark.parametrize("reps", [0, -1, 1.5, True, np.int64(0), np.float64(2.0), np.bool_(True)])
def test_re_measurement_needs_a_positive_whole_number_of_repetitions(problem, reps):
    """0 is not "the methodology's default" and -1 is no IndexError: both are named as wrong."""
    g, c = problem
    ev = Evaluator(g, c, Budget(max_evaluations=10, max_seconds=60))
    with pytest.raises(ValueError, match=re.escape(f"repetitions must be a positive integer, got {reps!r}")):
        ev.measure([0, 0, 0], repetitions=reps)
    with pytest.raises(ValueError, match=re.escape(f"repetitions must be a positive integer, got {reps!r}")):
        ev.measure([0, 0], repetitions=reps)  # an invalid placement returned 'invalid', the bad count unnamed
    assert ev.measure([0, 0, 0], repetitions=2).samples_s == (5.0, 5.0)
    assert ev.measure([0, 0, 0], repetitions=np.int64(3)).samples_s == (5.0, 5.0, 5.0)  # a numpy count is a count
