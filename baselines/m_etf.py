"""m-ETF: a memory-aware critical-path list scheduler (HEFT order, earliest finish time with communication).

The strongest list-scheduling heuristic of the suite. It is not Baechi's m-ETF itself (Jeon et al., SoCC
2020, which repeatedly schedules the ready (op, device) pair that can start earliest, skipping devices
whose memory would overflow) but a memory-aware HEFT (Topcuoglu et al., IEEE TPDS 2002): HEFT's fixed
priority and insertion policy with Baechi's memory rule, plus an OOM check against the evaluator:

1. Priority: upward rank, rank(i) = w_i + max over successors j of (c_ij + rank(j)), with w_i the mean
   time of op i over the devices it may use (cost model) and c_ij the mean transfer time of edge i->j over
   distinct device pairs. Ops are scheduled by decreasing rank (ties by index), a topological order.
2. Device: the one giving the earliest finish time. Start = the first idle slot of the device after the
   data-ready time (insertion into gaps); data ready = latest arrival of an input: at once from the same
   device, else the transfer (latency + bytes / bandwidth of the route) in the first slot after the
   producer finished in which that (source, destination) channel and, on links that share ports, every
   port the transfer holds (`Cluster.ports`, as the simulator) are idle, the inputs' transfers tried one
   after the other in the order they will be booked; one transfer per output and destination
   (the bytes of the first consumer placed there: the simulator sends the sum of all of them, so this
   underestimates slices read by several consumers). Transfers are booked once the device is chosen.
   Counting the ports changed m-ETF's placements on the port-sharing presets (each workload of the default
   zoo, seed 0, measured on the simulator): its estimates came closer to the measured step times (nmt-2x1024
   on haswell_4k80: 419 against 538 ms measured, 284 against 643 ms before), but a better model of each
   greedy step does not always give a better placement: from 2.46x faster (nmt-4x4096 on haswell_4k80; and
   rnnlm-4x6144 there went from OOM to ok, though at 40.7 s, about single_cpu's 42.7 s, until points 4 and 5
   changed as said there) to 1.34x slower (rnnlm-4x6144 on dgx_a100x8); geometric mean
   over the 29 cells ok both ways 0.995.
3. Colocation: the first op of a group to be scheduled chooses the device for the whole group; it adds to
   each device's finish time the extra time the group's other ops would take there compared with their
   best device (a one-step lookahead, so that e.g. a variable is not sent to an idle slow CPU with its
   whole gradient and update chain). The group's other ops follow. Device kinds: only allowed devices.
   The group's memory is checked for its first op only (point 4), so its later ops, forced onto that
   device, can overflow it with their inputs from outside the group and the group's outputs still live,
   and point 5 cannot repair that (a smaller room moves only first ops); point 6 can.
4. Memory: a device is skipped when its estimated memory would exceed its capacity. The estimate is
   resident bytes (param_bytes of the colocation groups placed there) plus live tensors: an op's output
   counts on its device from its placement until its last consumer is placed, and so does each copy of it
   received by another device, of the size the simulator sends (what the consumers there read, at most the
   whole tensor: a variable's weights travel on its edges, its output is 0 bytes); a new group also reserves
   its largest output. If no device fits, the op
   goes where the most memory is left (`info["memory_overflows"]` counts such ops, and ops forced by
   their group onto a device that overflows). The estimate follows the list order, not the simulator's
   execution order (which sends copies as soon as their producer finishes, e.g. weight gradients waiting
   for their accumulation), so it can be far too optimistic: on the large models of the K80 presets it
   found 9.6 GiB where the simulator measured 21.9 GiB (at 380fdb2, before links shared ports).
5. OOM feedback (ours, not Baechi's): the placement is evaluated once; if it is OOM, the room the estimate
   allows on each overflowing device becomes 0.95 x the estimate's peak there x capacity / measured peak
   (so that the estimate's error, measured, is allowed for; if that is no smaller than the room it had, the
   room shrinks by 0.95 x capacity / measured peak instead, by 0.95 where the measured peak is not above
   the capacity or is not known: a real device can run out below the cluster file's figure, and the room
   must not grow) and the schedule is made again, at most
   `oom_retries` times (default 16; 0 gives the single-shot m-ETF with no evaluations; `info["oom_retries"]`
   counts the schedules made again, at most the parameter; an OOM that names no device, as a real backend's
   on an unknown device, ends them: there is no room to shrink). A schedule equal to
   the last one measured is not measured again. The evaluations are counted like any search's; a spent
   budget (evaluations or seconds, also one that runs out during the check) ends the retries with the last schedule.
   Received copies sized as the simulator sends them (point 4; they were sized by the producer's output
   bytes, so a variable's weights read from another device counted as 0) and this rule (it was: the room
   scaled by 0.95 x capacity / measured peak at each retry, which compounds while the schedule does not
   change) made m_etf faster in 3 of its 50 cells of the full suite and changed none other (medians over
   seeds, simulator): rnnlm-4x6144 40.7 -> 5.24 s on haswell_4k80 and 42.4 -> 20.6 s on haswell_2k80,
   nmt-4x4096 18.1 -> 9.73 s on haswell_2k80.
6. Conservative rule (ours): where the last schedule of point 5 is still measured OOM (the retries spent),
   the schedule is made again, with point 5's retries, with each group of several ops holding on its device
   its largest working set of one op (output plus inputs) from its first op's placement to its last's, and
   a new group needing room for it; that schedule is taken if it is measured to fit (`info["reserved_groups"]`).
   `info["reserved_groups_oom_retries"]`, present where this rule ran, counts its own retries. With groups and kind
   limits both present (random DAGs of 30-40 ops, groups of 2, 1/8 CPU-only and 1/8 GPU-only, GPUs of
   200-300 MB; 320 graphs) m_etf was OOM on 14 graphs where one of 12 simple placements (all on the CPU but
   the GPU-only groups) fitted, and on 1 with this rule. Taken always, the rule (reserving the working sets
   from the first schedule on) is too pessimistic on the zoo's large models: with it m_etf was slower in 6
   of its 30 zoo cells on haswell_2k80, haswell_4k80 and dgx_a100x8, up to 7.7x (nmt-4x4096 on haswell_4k80:
   3.64 -> 28.2 s); as a last resort it changes none (no zoo cell ends point 5 OOM).

Deterministic (no randomness; `seed` is unused). `local_search` starts from the single-shot placement.
"""

from __future__ import annotations

import bisect
import time

import numpy as np

from baselines import _common
from suite.errors import BudgetExhausted
from suite.methodology import Budget
from suite.placer import BasePlacer, PlacementResult, Problem
from suite.simulator import send_caps

MAX_GAP_SCAN = 64  # idle gaps tried per booking query


def upward_rank(cost: np.ndarray, allowed_op: np.ndarray, graph, latency_s: np.ndarray, bandwidth: np.ndarray) -> np.ndarray:
    """HEFT upward rank of every op (seconds)."""
    n, ndev = cost.shape
    a = graph.arrays
    masked = np.where(allowed_op, cost, 0.0)
    w = masked.sum(axis=1) / np.maximum(allowed_op.sum(axis=1), 1)
    if ndev > 1:
        off = ~np.eye(ndev, dtype=bool)
        mean_lat = float(latency_s[off].mean())
        mean_inv_bw = float((1.0 / bandwidth[off]).mean())
    else:
        mean_lat = mean_inv_bw = 0.0
    rank = np.zeros(n)
    for i in range(n - 1, -1, -1):
        lo, hi = a.succ_ptr[i], a.succ_ptr[i + 1]
        if hi > lo:
            succ = a.succ_idx[lo:hi]
            comm = mean_lat + a.succ_bytes[lo:hi] * mean_inv_bw
            rank[i] = w[i] + float((comm + rank[succ]).max())
        else:
            rank[i] = w[i]
    return rank


class Timeline:
    """Busy time of one resource (a device, or a link channel): insertion-based booking as in HEFT.

    Keeps the idle gaps before `free_s` (sorted, disjoint); a booking takes the first gap that fits after
    the ready time, else starts at max(ready, free_s). At most `MAX_GAP_SCAN` gaps are tried per query,
    which bounds the cost on long schedules.
    """

    def __init__(self) -> None:
        self.gap_start: list[float] = []
        self.gap_end: list[float] = []
        self.free_s = 0.0

    def earliest_start(self, ready_s: float, duration_s: float) -> float:
        j = bisect.bisect_right(self.gap_end, ready_s)
        for k in range(j, min(j + MAX_GAP_SCAN, len(self.gap_end))):
            t = max(self.gap_start[k], ready_s)
            if t + duration_s <= self.gap_end[k]:
                return t
        return max(ready_s, self.free_s)

    def book(self, start_s: float, duration_s: float) -> None:
        end_s = start_s + duration_s
        if start_s >= self.free_s:
            if start_s > self.free_s:
                self.gap_start.append(self.free_s)
                self.gap_end.append(start_s)
            self.free_s = max(self.free_s, end_s)
            return
        k = bisect.bisect_right(self.gap_start, start_s) - 1  # the gap that holds [start_s, end_s]
        gs, ge = self.gap_start[k], self.gap_end[k]
        pieces = [(a, b) for a, b in ((gs, start_s), (end_s, ge)) if b > a]
        self.gap_start[k : k + 1] = [a for a, _ in pieces]
        self.gap_end[k : k + 1] = [b for _, b in pieces]


def common_start(timelines: list, ready_s: float, duration_s: float) -> float:
    """The earliest start at or after `ready_s` at which every timeline can take `duration_s` (a channel and
    the ports a transfer holds). Each round moves to the latest of their earliest starts, until all agree: it
    ends, since the start only rises, and only to a gap's start or a timeline's free time, of which there
    are finitely many. (A timeline's `MAX_GAP_SCAN` limit can make the slot found later than the earliest.)"""
    s = ready_s
    while timelines:
        latest = max(tl.earliest_start(s, duration_s) for tl in timelines)
        if latest <= s:
            break
        s = latest
    return s


class Trial:
    """A timeline with tentative bookings on top, the timeline itself untouched: a device's data-ready query
    books its input transfers one after the other, as the booking will, so that two inputs needing one
    channel or port are not both priced in the same slot."""

    def __init__(self, base: Timeline) -> None:
        self.base = base
        self.booked: list[tuple[float, float]] = []

    def earliest_start(self, ready_s: float, duration_s: float) -> float:
        s = ready_s
        while True:
            s = self.base.earliest_start(s, duration_s)
            clash = [end for start, end in self.booked if start < s + duration_s and s < end]
            if not clash:
                return s
            s = max(clash)

    def book(self, start_s: float, duration_s: float) -> None:
        self.booked.append((start_s, start_s + duration_s))


def m_etf_placement(problem: Problem, capacity_scale: np.ndarray | None = None,
                    reserve_groups: bool = False) -> tuple[np.ndarray, dict]:
    """The m-ETF op placement and schedule statistics; `capacity_scale` [D] shrinks the memory the estimate
    allows on each device (1: its capacity). `reserve_groups`: a group of several ops holds, on its device,
    its ops' largest working set (output plus inputs) from its first op's placement to its last's, and a
    new group needs room for it (the conservative rule of point 6)."""
    graph, cluster = problem.workload, problem.cluster
    n, ndev = graph.num_ops, cluster.num_devices
    a = graph.arrays
    cost = problem.costs()
    con = _common.contract(graph)
    allowed_node = _common.allowed_nodes(con, cluster)
    allowed_op = allowed_node[con.node_of_op]
    if ndev > 1:
        lat, bw = cluster.routes
    else:
        lat, bw = np.zeros((1, 1)), np.full((1, 1), np.inf)
    rank = upward_rank(cost, allowed_op, graph, lat, bw)
    order = np.lexsort((np.arange(n), -rank))

    capacity = np.array([d.memory_bytes for d in cluster.devices], dtype=np.float64)
    if capacity_scale is not None:
        capacity = capacity * capacity_scale
    node_params = con.node_sum(a.param_bytes)
    node_max_out = np.zeros(con.num_nodes)
    np.maximum.at(node_max_out, con.node_of_op, a.output_bytes.astype(np.float64))
    node_cost = con.node_sum(np.where(allowed_op, cost, np.inf))
    out_bytes = a.output_bytes.astype(np.float64)
    send_cap = send_caps(a.output_bytes, a.succ_ptr, a.succ_bytes).astype(np.float64)
    consumers_left = np.diff(a.succ_ptr).copy()
    group_size = np.bincount(con.node_of_op, minlength=con.num_nodes)
    placed_in_node = np.zeros(con.num_nodes, dtype=np.int64)
    reserved = np.zeros(ndev)  # working sets held by groups still being placed (reserve_groups)
    node_work = np.zeros(con.num_nodes)  # each group's largest working set of one op: output + inputs
    if reserve_groups:
        src = np.repeat(np.arange(n), np.diff(a.succ_ptr))
        reads = np.zeros(n)
        np.add.at(reads, a.succ_idx, np.minimum(a.succ_bytes, send_cap[src]))
        np.maximum.at(node_work, con.node_of_op, out_bytes + reads)
        node_work[group_size < 2] = 0.0
    resident = np.zeros(ndev)
    live = np.zeros(ndev)
    devices = [Timeline() for _ in range(ndev)]
    channels: dict[tuple[int, int], Timeline] = {}
    ports = cluster.ports if ndev > 1 else None
    port_lines = [Timeline() for _ in range(ports[2])] if ports is not None else []
    arrived: dict[tuple[int, int], float] = {}  # (op, device) -> when a copy of the op's output is there
    finish = np.zeros(n)
    dev_of_op = np.full(n, -1, dtype=np.int64)
    node_dev = np.full(con.num_nodes, -1, dtype=np.int64)
    copies: list[list[int]] = [[] for _ in range(n)]  # devices holding a received copy of each op's output
    copy_bytes: dict[tuple[int, int], float] = {}  # (op, device) -> bytes of that copy so far
    peak = np.zeros(ndev)  # the estimate's largest resident + live bytes on each device
    overflows = 0

    def transfer_s(p: int, src: int, dst: int, nbytes: float) -> float:
        return float(lat[src, dst] + nbytes / bw[src, dst])

    def held(src: int, dst: int) -> list[Timeline]:
        """The timelines a transfer from src to dst holds: its channel and the ports of its route."""
        out = [channels.setdefault((src, dst), Timeline())]
        if ports is not None:
            ch = src * ndev + dst
            out += [port_lines[x] for x in ports[1][ports[0][ch]:ports[0][ch + 1]].tolist()]
        return out

    def data_ready(preds, pbytes, d: int) -> float:
        """When every input can be on device d: the transfers it needs are tried in the order the booking
        below takes them (producers by finish time), each in the first slot where its channel and ports are
        idle, on trial copies of those timelines."""
        t = 0.0
        trials: dict[int, Trial] = {}
        for p, nb in sorted(zip(preds, pbytes, strict=True), key=lambda x: finish[x[0]]):
            src = int(dev_of_op[p])
            if src == d:
                t = max(t, finish[p])
            elif (p, d) in arrived:
                t = max(t, arrived[(p, d)])
            else:
                dur = transfer_s(p, src, d, nb)
                lines = [trials.setdefault(id(tl), Trial(tl)) for tl in held(src, d)]
                start = common_start(lines, finish[p], dur)
                for line in lines:
                    line.book(start, dur)
                t = max(t, start + dur)
        return t

    for i in order.tolist():
        lo, hi = a.pred_ptr[i], a.pred_ptr[i + 1]
        preds = a.pred_idx[lo:hi].tolist()
        pbytes = a.pred_bytes[lo:hi].tolist()
        k = con.node_of_op[i]
        if node_dev[k] >= 0:
            cands = np.array([node_dev[k]])
        else:
            cands = np.flatnonzero(allowed_node[k])
        eft = np.full(ndev, np.inf)
        for d in cands.tolist():
            eft[d] = devices[d].earliest_start(data_ready(preds, pbytes, d), cost[i, d]) + cost[i, d]
        # bytes each device would receive for op i, as the simulator sends them: per input, what op i reads
        # (its edge: a variable's edges carry its weights), added to a copy already there, at most send_cap
        extra = []
        for p, nb in zip(preds, pbytes, strict=True):
            add = np.full(ndev, min(float(nb), send_cap[p]))
            add[dev_of_op[p]] = 0.0
            for dd in copies[p]:
                have = copy_bytes[(p, dd)]
                add[dd] = min(have + nb, send_cap[p]) - have
            extra.append(add)
        incoming = np.sum(extra, axis=0) if extra else np.zeros(ndev)
        if node_dev[k] >= 0:
            d = int(node_dev[k])
            if resident[d] + live[d] + incoming[d] + out_bytes[i] > capacity[d]:
                overflows += 1
        else:
            need = resident[cands] + node_params[k] + live[cands] + incoming[cands] + node_max_out[k]
            if reserve_groups:
                need = need - incoming[cands] - node_max_out[k] + reserved[cands] + np.maximum(
                    incoming[cands] + out_bytes[i], node_work[k])
            fits = need <= capacity[cands]
            if fits.any():
                ok = cands[fits]
                rest = node_cost[k, ok] - cost[i, ok]  # the group's other ops, on each device
                d = int(ok[np.argmin(eft[ok] + rest - rest.min())])
            else:
                overflows += 1
                d = int(cands[np.argmax(capacity[cands] - need)])
            node_dev[k] = d
            resident[d] += node_params[k]
            reserved[d] += node_work[k]
        placed_in_node[k] += 1
        if placed_in_node[k] == group_size[k]:
            reserved[d] -= node_work[k]
        for p, add in zip(preds, extra, strict=True):
            if dev_of_op[p] != d:
                copy_bytes[(p, d)] = copy_bytes.get((p, d), 0.0) + add[d]
        ready = 0.0
        for p, nb in sorted(zip(preds, pbytes, strict=True), key=lambda x: finish[x[0]]):  # book the transfers
            src = int(dev_of_op[p])
            if src == d:
                ready = max(ready, finish[p])
                continue
            if (p, d) not in arrived:
                dur = transfer_s(p, src, d, nb)
                lines = held(src, d)
                start = common_start(lines, finish[p], dur)
                for line in lines:
                    line.book(start, dur)
                arrived[(p, d)] = start + dur
                copies[p].append(d)
            ready = max(ready, arrived[(p, d)])
        start = devices[d].earliest_start(ready, cost[i, d])
        devices[d].book(start, cost[i, d])
        dev_of_op[i] = d
        finish[i] = start + cost[i, d]
        live[d] += out_bytes[i] + incoming[d]
        peak[d] = max(peak[d], resident[d] + live[d])
        if hi > lo:
            pa = np.array(preds)
            consumers_left[pa] -= 1
            for p in pa[consumers_left[pa] == 0].tolist():  # all consumers placed: free p everywhere
                live[dev_of_op[p]] -= out_bytes[p]
                for dd in copies[p]:
                    live[dd] -= copy_bytes[(p, dd)]
        if a.succ_ptr[i + 1] == a.succ_ptr[i]:
            live[d] -= out_bytes[i]
    info = {"estimated_step_time_s": float(finish.max()) if n else 0.0, "memory_overflows": overflows,
            "estimated_peak_bytes": peak.tolist()}
    return dev_of_op, info


class METF(BasePlacer):
    """Memory-aware earliest-finish-time list scheduling in upward-rank order."""

    name = "m_etf"
    defaults = {"oom_retries": 16}
    bounds = {"oom_retries": (0, 100)}

    def place(self, problem: Problem, budget: Budget, seed: int) -> PlacementResult:
        started = time.perf_counter()
        if self.params["oom_retries"] == 0:  # the single-shot m-ETF, with no evaluations
            placement, info = m_etf_placement(problem)
            return PlacementResult.from_search(placement, problem, started, oom_retries=0, **info)
        placement, info, retries, status = self._retry(problem, reserve_groups=False)
        info = {**info, "oom_retries": retries}
        if status == "oom":  # point 6: the conservative rule, only where the usual one found no fit
            p2, info2, retries2, status2 = self._retry(problem, reserve_groups=True)
            if status2 not in ("oom", None):
                placement, info = p2, {**info2, "oom_retries": retries, "reserved_groups": True}
            info["reserved_groups_oom_retries"] = retries2
        return PlacementResult.from_search(placement, problem, started, **info)

    def _retry(self, problem: Problem, reserve_groups: bool) -> tuple[np.ndarray, dict, int, str | None]:
        """Point 5: the schedule, made again with less room on the devices it overflowed, up to `oom_retries`
        times; returns it with its statistics, the retries and its measured status (None: not measured).
        The status is measured for the last schedule too once the retries have all been OOM, if the budget
        allows, so that `place` knows whether to try the conservative rule."""
        ev, cluster = problem.evaluator, problem.cluster
        scale = np.ones(cluster.num_devices)
        placement, info = m_etf_placement(problem, reserve_groups=reserve_groups)
        retries = 0
        last = m = None
        while not ev.exhausted:
            if last is None or not np.array_equal(placement, last):  # the same placement is not measured again
                try:
                    m = ev.evaluate(placement)
                except BudgetExhausted:  # the time ran out since the check: keep the schedule, as when exhausted
                    break
                last = placement
            if m.status != "oom" or retries >= self.params["oom_retries"] or not m.oom_devices:
                break  # (an OOM that names no device leaves no room to shrink: the schedule would be the same)
            for name in m.oom_devices:
                d = cluster.index[name]
                measured = float(m.peak_memory_bytes.get(name, 0))
                # the room that makes the estimate's peak there as far below capacity as the measured peak was
                # above it (the estimate's error, with a 5% margin); where the estimate already used less,
                # shrink by the overshoot, and by 5% where none was measured (a real device that ran out below
                # the cluster's capacity, or with no peak known): the room never grows
                room = 0.95 * info["estimated_peak_bytes"][d] / measured if measured > 0 else scale[d]
                overshoot = min(1.0, cluster.devices[d].memory_bytes / measured) if measured > 0 else 1.0
                scale[d] = room if room < scale[d] else scale[d] * 0.95 * overshoot
            placement, info = m_etf_placement(problem, scale, reserve_groups)
            retries += 1
        measured = m is not None and last is not None and np.array_equal(placement, last)
        return placement, info, retries, m.status if measured else None
