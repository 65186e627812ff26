"""The fast simulator: a numba port of `reference.py` with the same semantics, float for float.

It differs from the reference in implementation only, and relies on three facts of those semantics:

* Within one instant the order in which events are handled does not change any result: readiness counts,
  memory deltas and channel bookkeeping commute, a device has at most one op-done event per instant, and
  dispatch runs after all of the instant's events. So the event queue needs times only, no tie-breaking.
* Every device runs one op at a time, and every channel is first come first served with non-decreasing end
  times. The queue therefore holds at most one event per source (a device's running op, or the transfer at
  the head of a channel); queued transfers wait in a per-channel list. The queue is a short array kept in
  descending time order, so the next event is at its end.
* The ready op with the smallest index wins a device, so each device's ready set is a bitmap over op
  indices; popping scans forward from the lowest word that may be non-empty.

Memory is tracked online with reference counts: `live` changes at once, and at the end of every instant
each device that got an allocation in it has its `live` sampled into its peak. This equals the reference's
sweep with frees before allocations at equal times: a device with no allocation in an instant ends it no
higher than before. A transfer queued behind a busy channel starts, and allocates its receive buffer, when
the transfer ahead of it ends. `simulate_batch` runs many placements in one compiled call, sequentially on
one core, reusing one workspace, which is also kept for the next call with the same sizes.

Every index (op, device, channel, transfer, bitmap word) is unsigned, with `NONE` as "no such": numba
wraps negative indices around, which costs a sign test and keeps every array's length live in the hot loop;
with unsigned indices those disappear and the loop spills fewer registers (blocks / groups / random
placements of tests/suite/test_simulator_bench.py: 0.44 / 0.91 / 1.26 ms before, 0.31 / 0.69 / 1.04 ms
after). `SimInputs.fast_args` hands the graph's index arrays over as uint64 (converted once); index arrays
from other callers are converted on each call.

Cost (one core, 10,000-op benchmark graph): about 27 ns per op with every op on one device (unpredictable
branches: loop lengths, readiness, reference counts), plus about 65 ns per cross-device transfer (the
random placement makes about 12,000). An engine without transfer events
(ready times known when the last input is produced, future memory deltas in per-device heaps) was built,
matched this one exactly, and was slower: side by side on the graph and placements of
tests/suite/test_simulator_bench.py (10,000 ops, 8 devices; best per-placement time over batches of 16),
0.84 / 1.20 / 1.36 ms against this engine's 0.45 / 0.91 / 1.31 ms (before unsigned indices) for blocks /
groups / random placements.
"""

from __future__ import annotations

import threading

import numpy as np
from numba import njit
from numba.cpython.unsafe.numbers import trailing_zeros

U = np.uint64
ONE = U(1)
NONE = U(0xFFFFFFFFFFFFFFFF)  # no op, transfer or device; also "empty" for channel heads and devices


@njit(cache=True, inline="always")
def _queue_push(qt, qs, size, t, s):
    """Insert event source `s` at time `t`; the queue is kept in descending time order."""
    j = size
    while j > U(0) and qt[j - ONE] < t:
        qt[j] = qt[j - ONE]
        qs[j] = qs[j - ONE]
        j -= ONE
    qt[j] = t
    qs[j] = s
    return size + ONE


@njit(cache=True, inline="always")
def _ready_add(bits, low, d, i):
    w = i >> U(6)
    bits[d, w] |= ONE << (i & U(63))
    if w < low[d]:
        low[d] = w


@njit(cache=True, inline="always")
def _ready_pop(bits, low, d):
    """Remove and return the smallest ready op of device d (the caller knows there is one)."""
    w = low[d]
    while bits[d, w] == U(0):
        w += ONE
    x = bits[d, w]
    bits[d, w] = x & (x - ONE)
    low[d] = w
    return w * U(64) + U(trailing_zeros(x))


@njit(cache=True)
def _workspace(n, ndev, n_edges):
    """Scratch arrays for one graph size, reused across the placements of a batch.

    The arrays built with zeros, -1 or NONE are returned to that state by every run.
    """
    n_sources = ndev + ndev * ndev  # one per device, one per channel (diagonal unused)
    n_xfer = min(n_edges, n * max(ndev - 1, 0)) + 1  # at most one transfer per (producer, other device)
    return (
        np.empty(n_sources, np.float64),  # event queue: times
        np.empty(n_sources, np.uint64),  # event queue: source (device d, or ndev + channel)
        np.empty(n_xfer, np.uint64),  # transfer: producer
        np.empty(n_xfer, np.int64),  # transfer: bytes
        np.empty(n_xfer, np.float64),  # transfer: end time
        np.empty(n_xfer, np.uint64),  # transfer: next transfer on its channel, or NONE
        np.full(ndev * ndev, NONE, np.uint64),  # channel: first transfer not yet done, or NONE
        np.empty(ndev * ndev, np.uint64),  # channel: last transfer
        np.zeros(ndev * ndev, np.float64),  # channel: time it becomes free
        np.zeros((ndev, (n + 63) // 64), np.uint64),  # ready bitmaps per device
        np.empty(ndev, np.uint64),  # lowest word of each bitmap that may be non-empty
        np.empty(ndev, np.int64),  # ready ops per device
        np.empty(ndev, np.uint64),  # running op per device, or NONE
        np.empty(n, np.int64),  # inputs not yet on the op's device
        np.empty(n, np.int64),  # references to each op's own output copy
        np.zeros((n, ndev), np.int64),  # references to each received copy
        np.empty((n, ndev), np.int64),  # bytes of each received copy
        np.empty(ndev, np.int64),  # live bytes per device
        np.full(ndev, -1, np.int64),  # scratch: bytes to send to each device, -1 = none
        np.zeros(ndev, np.int64),  # scratch: consumers on each other device
        np.empty(ndev, np.uint64),  # scratch: destinations of the op that just finished
        np.empty(ndev, np.uint64),  # devices to consider at the next dispatch
        np.zeros(ndev, np.bool_),  # device is in that list
        np.empty(n, np.uint64),  # the placement, unsigned
        np.empty(n, np.float64),  # duration of each op on its device, gathered in one pass
    )


@njit(cache=True, error_model="numpy")
def _simulate(placement, cost, succ_ptr, succ_idx, succ_bytes, pred_ptr, pred_idx, output_bytes, param_bytes,
              latency_s, bandwidth, busy_s, peak, link_bytes, ws):
    """One placement; fills busy_s [D], peak [D] and link_bytes [D, D]; returns the step time."""
    n = U(placement.shape[0])
    ndev = U(cost.shape[1])
    busy_s[:] = 0.0
    peak[:] = 0
    link_bytes[:, :] = 0
    if n == U(0):
        return 0.0
    (qt, qs, x_op, x_bytes, x_end, x_next, ch_head, ch_tail, ch_free, ready, low, n_ready, running, pending,
     own_refs, recv_refs, recv_bytes, live, send_bytes, n_remote, dsts, cand, is_cand, dev_of, dur_of) = ws
    ch_free[:] = 0.0
    live[:] = 0
    n_words = U(ready.shape[1])
    for d in range(ndev):
        low[d] = n_words
        n_ready[d] = 0
        running[d] = NONE
        cand[d] = d
        is_cand[d] = True
    n_cand = ndev
    for i in range(n):
        d = U(placement[i])
        dev_of[i] = d
        dur_of[i] = cost[i, d]
        pending[i] = pred_ptr[i + ONE] - pred_ptr[i]
        own_refs[i] = ONE + succ_ptr[i + ONE] - succ_ptr[i]  # its own run + every consumer (see OP_DONE)
    for i in range(n):
        if pending[i] == 0:
            d = dev_of[i]
            _ready_add(ready, low, d, i)
            n_ready[d] += 1
    q = U(0)  # queue size
    nx = U(0)  # transfers created
    grown = U(0)  # bitmask of the devices whose live bytes grew in this instant (device d is bit d % 64)
    step = 0.0
    t = 0.0
    while True:
        # dispatch: every idle device starts its ready op with the smallest index (only devices that
        # became idle or got a ready op since the last dispatch can start one)
        for k in range(n_cand):
            d = cand[k]
            is_cand[d] = False
            if running[d] == NONE and n_ready[d] > 0:
                i = _ready_pop(ready, low, d)
                n_ready[d] -= 1
                running[d] = i
                dur = dur_of[i]
                end = t + dur
                step = max(step, end)
                busy_s[d] += dur
                live[d] += output_bytes[i]
                grown |= ONE << (d & U(63))
                q = _queue_push(qt, qs, q, end, d)
        n_cand = U(0)
        if q == U(0) or qt[q - ONE] != t:  # the instant is over: its end state is a peak candidate
            if ndev > U(64):  # the bitmask cannot name every device
                for d in range(ndev):
                    peak[d] = max(peak[d], live[d])
                grown = U(0)
            while grown != U(0):
                d = U(trailing_zeros(grown))
                grown &= grown - ONE
                peak[d] = max(peak[d], live[d])
            if q == U(0):
                break
            t = qt[q - ONE]
        while q > U(0) and qt[q - ONE] == t:
            q -= ONE
            s = qs[q]
            if s < ndev:  # OP_DONE: the op running on device s finished
                src = s
                p = running[src]
                running[src] = NONE
                if not is_cand[src]:
                    is_cand[src] = True
                    cand[n_cand] = src
                    n_cand += ONE
                n_dst = U(0)
                for j in range(succ_ptr[p], succ_ptr[p + ONE]):
                    c = succ_idx[j]
                    dc = dev_of[c]
                    if dc == src:
                        pending[c] -= 1
                        if pending[c] == 0:
                            _ready_add(ready, low, dc, c)
                            n_ready[dc] += 1
                    else:
                        if send_bytes[dc] < 0:
                            dsts[n_dst] = dc
                            n_dst += ONE
                        send_bytes[dc] = max(send_bytes[dc], succ_bytes[j])
                        n_remote[dc] += 1
                # the own copy was referenced once per consumer: remote consumers now hold it through
                # one transfer per destination instead
                own_refs[p] -= 1
                for m in range(n_dst):
                    dst = dsts[m]
                    nb = send_bytes[dst]
                    send_bytes[dst] = -1
                    own_refs[p] -= n_remote[dst] - 1
                    recv_refs[p, dst] = n_remote[dst]
                    n_remote[dst] = 0
                    recv_bytes[p, dst] = nb
                    ch = src * ndev + dst
                    begin = max(t, ch_free[ch])
                    end = begin + latency_s[src, dst] + nb / bandwidth[src, dst]
                    ch_free[ch] = end
                    link_bytes[src, dst] += nb
                    x_op[nx] = p
                    x_bytes[nx] = nb
                    x_end[nx] = end
                    x_next[nx] = NONE
                    if ch_head[ch] == NONE:  # the channel is free: the transfer starts now
                        ch_head[ch] = nx
                        q = _queue_push(qt, qs, q, end, ndev + ch)
                        live[dst] += nb
                        grown |= ONE << (dst & U(63))
                    else:
                        x_next[ch_tail[ch]] = nx
                    ch_tail[ch] = nx
                    nx += ONE
                if own_refs[p] == 0:
                    live[src] -= output_bytes[p]
                for j in range(pred_ptr[p], pred_ptr[p + ONE]):  # the inputs lose a consumer
                    r = pred_idx[j]
                    if dev_of[r] == src:
                        own_refs[r] -= 1
                        if own_refs[r] == 0:
                            live[src] -= output_bytes[r]
                    else:
                        recv_refs[r, src] -= 1
                        if recv_refs[r, src] == 0:
                            live[src] -= recv_bytes[r, src]
            else:  # XFER_DONE: the transfer at the head of channel s - ndev arrived
                ch = s - ndev
                x = ch_head[ch]
                p = x_op[x]
                src = ch // ndev
                dst = ch - src * ndev
                nxt = x_next[x]
                ch_head[ch] = nxt
                if nxt != NONE:  # the next transfer on this channel starts now
                    q = _queue_push(qt, qs, q, x_end[nxt], s)
                    live[dst] += x_bytes[nxt]
                    grown |= ONE << (dst & U(63))
                for j in range(succ_ptr[p], succ_ptr[p + ONE]):
                    c = succ_idx[j]
                    if dev_of[c] == dst:
                        pending[c] -= 1
                        if pending[c] == 0:
                            _ready_add(ready, low, dst, c)
                            n_ready[dst] += 1
                            if not is_cand[dst]:
                                is_cand[dst] = True
                                cand[n_cand] = dst
                                n_cand += ONE
                own_refs[p] -= 1
                if own_refs[p] == 0:
                    live[src] -= output_bytes[p]
    for i in range(n):
        peak[dev_of[i]] += param_bytes[i]
    return step


@njit(cache=True)
def _simulate_batch(placements, cost, succ_ptr, succ_idx, succ_bytes, pred_ptr, pred_idx,
                    output_bytes, param_bytes, latency_s, bandwidth, steps, busy, peak, link, ws):
    for b in range(placements.shape[0]):
        steps[b] = _simulate(placements[b], cost, succ_ptr, succ_idx, succ_bytes, pred_ptr, pred_idx,
                             output_bytes, param_bytes, latency_s, bandwidth, busy[b], peak[b], link[b], ws)


_kept = threading.local()  # per thread: the last workspace and its sizes


def _workspace_for(n: int, ndev: int, n_edges: int) -> tuple:
    """The workspace of the last call with these sizes, or a new one (which replaces it).

    Keeping it saves allocating and first touching about 2.5 MB per call for a 10,000-op graph on 8 devices:
    in a fresh process that cost more than the simulation of a blocks placement (0.80 against 0.31 ms per
    `simulate_one`). Every run leaves the workspace as it found it, so reuse is exact; numba holds the GIL,
    so one thread never runs two simulations at once.
    """
    sizes = (n, ndev, n_edges)
    if getattr(_kept, "sizes", None) != sizes:
        _kept.sizes, _kept.ws = None, None  # free the old one before allocating the new
        _kept.ws = _workspace(n, ndev, n_edges)
        _kept.sizes = sizes
    return _kept.ws


def simulate_batch(placements, cost, succ_ptr, succ_idx, succ_bytes, pred_ptr, pred_idx,
                   output_bytes, param_bytes, latency_s, bandwidth):
    """Placements [B, n] -> (steps [B], busy [B, D], peak [B, D], link_bytes [B, D, D]).

    The index arrays (succ_ptr, succ_idx, pred_ptr, pred_idx) are used as uint64; `SimInputs.fast_args`
    gives them so, other callers pay a conversion per call. Device indices are not checked here: the
    callers in `suite.simulator` validate placements first.
    """
    bsz = placements.shape[0]
    ndev = cost.shape[1]
    steps = np.zeros(bsz, np.float64)
    busy = np.zeros((bsz, ndev), np.float64)
    peak = np.zeros((bsz, ndev), np.int64)
    link = np.zeros((bsz, ndev, ndev), np.int64)
    ws = _workspace_for(placements.shape[1], ndev, succ_idx.shape[0])
    _simulate_batch(np.ascontiguousarray(placements, dtype=np.int64), cost, unsigned(succ_ptr), unsigned(succ_idx),
                    succ_bytes, unsigned(pred_ptr), unsigned(pred_idx), output_bytes, param_bytes, latency_s,
                    bandwidth, steps, busy, peak, link, ws)
    return steps, busy, peak, link


def unsigned(index: np.ndarray) -> np.ndarray:
    """An index array as the uint64 the engine reads (no copy if it already is one)."""
    return np.ascontiguousarray(index, dtype=np.uint64)


def simulate_one(placement, cost, succ_ptr, succ_idx, succ_bytes, pred_ptr, pred_idx,
                 output_bytes, param_bytes, latency_s, bandwidth):
    """Returns (step_time_s, busy_s [D], peak_memory_bytes [D], link_bytes [D, D])."""
    steps, busy, peak, link = simulate_batch(np.asarray(placement).reshape(1, -1), cost, succ_ptr, succ_idx,
                                             succ_bytes, pred_ptr, pred_idx, output_bytes, param_bytes,
                                             latency_s, bandwidth)
    return float(steps[0]), busy[0], peak[0], link[0]
