"""The fast simulator: a numba port of `reference.py` with the same semantics, float for float.

Differences are of implementation only:
* heaps are arrays (events keyed by (time, seq), per-device ready heaps keyed by op index);
* memory is tracked online with reference counts instead of a sort, and the peak is read at the end of
  each instant, which equals the reference's sweep with frees before allocations at equal times;
* a transfer queued behind a busy channel starts when the channel's previous transfer is done, so its
  receive buffer is allocated while handling that transfer's completion (no extra event).
`simulate_batch` runs many placements in one compiled call (sequentially; one core).
"""

from __future__ import annotations

import numpy as np
from numba import njit

OP_DONE = 0
XFER_DONE = 1


@njit(cache=True, inline="always")
def _ev_less(t, i, j):
    # events are stored in creation order, so the arena index is the tie-breaking sequence number
    return t[i] < t[j] or (t[i] == t[j] and i < j)


@njit(cache=True, inline="always")
def _ev_push(h, t, size, e):
    i = size
    h[i] = e
    while i > 0:
        p = (i - 1) >> 1
        if _ev_less(t, h[i], h[p]):
            h[i], h[p] = h[p], h[i]
            i = p
        else:
            break
    return size + 1


@njit(cache=True, inline="always")
def _ev_pop(h, t, size):
    """Remove the root (caller has read it); returns the new size."""
    size -= 1
    h[0] = h[size]
    i = 0
    while True:
        left = 2 * i + 1
        if left >= size:
            break
        m = left
        r = left + 1
        if r < size and _ev_less(t, h[r], h[left]):
            m = r
        if _ev_less(t, h[m], h[i]):
            h[i], h[m] = h[m], h[i]
            i = m
        else:
            break
    return size


@njit(cache=True, inline="always")
def _rd_push(h, d, size, v):
    i = size
    h[d, i] = v
    while i > 0:
        p = (i - 1) >> 1
        if h[d, i] < h[d, p]:
            h[d, i], h[d, p] = h[d, p], h[d, i]
            i = p
        else:
            break
    return size + 1


@njit(cache=True, inline="always")
def _rd_pop(h, d, size):
    top = h[d, 0]
    size -= 1
    h[d, 0] = h[d, size]
    i = 0
    while True:
        left = 2 * i + 1
        if left >= size:
            break
        m = left
        r = left + 1
        if r < size and h[d, r] < h[d, left]:
            m = r
        if h[d, m] < h[d, i]:
            h[d, i], h[d, m] = h[d, m], h[d, i]
            i = m
        else:
            break
    return top, size


@njit(cache=True, inline="always")
def _sort_small(a, k):
    """Insertion sort of a[:k] (k is at most the number of devices)."""
    for i in range(1, k):
        v = a[i]
        j = i - 1
        while j >= 0 and a[j] > v:
            a[j + 1] = a[j]
            j -= 1
        a[j + 1] = v


@njit(cache=True)
def _workspace(n, ndev, n_edges):
    # events: one OP_DONE per op, at most one XFER_DONE per (producer, other device)
    cap = n + min(n_edges, n * max(ndev - 1, 0)) + 1
    return (
        np.empty(cap, np.float64),  # event arena: time; the arena index is the creation order
        np.empty(cap, np.int64),  # kind
        np.empty(cap, np.int64),  # operand a
        np.empty(cap, np.int64),  # operand b
        np.empty(cap, np.int64),  # heap of arena indices
        np.empty(cap, np.int64),  # per XFER_DONE event: bytes of the next transfer on its channel, or -1
        np.empty((ndev, max(n, 1)), np.int64),  # ready heaps per device
        np.zeros(ndev, np.int64),  # ready heap sizes
        np.zeros(ndev, np.bool_),  # device busy
        np.zeros((ndev, ndev), np.float64),  # channel free time
        np.empty((ndev, ndev), np.int64),  # per channel: arena index of its last transfer
        np.empty(n, np.int64),  # pending inputs per op
        np.zeros(n, np.float64),  # finish times
        np.empty(ndev, np.int64),  # bytes to send per destination (scratch, -1 = none)
        np.empty(ndev, np.int64),  # destinations of the op that just finished (scratch)
        np.ones(n, np.int64),  # producer-copy reference counts
        np.zeros((n, ndev), np.int64),  # received-copy reference counts
        np.zeros((n, ndev), np.int64),  # received-copy bytes
        np.zeros(ndev, np.int64),  # live bytes
    )


@njit(cache=True, error_model="numpy")
def _simulate(
    placement,
    cost,
    succ_ptr,
    succ_idx,
    succ_bytes,
    pred_ptr,
    pred_idx,
    output_bytes,
    param_bytes,
    latency_s,
    bandwidth,
    busy_s,
    peak,
    link_bytes,
    ws,
):
    """One placement; fills busy_s [D], peak [D], link_bytes [D, D] (zeroed here); returns the step time.

    `ws` is the workspace of `_workspace`, reused across the placements of a batch.

    Memory: every allocation and free is applied to `live` at once, and `peak` takes `live` whenever
    simulated time moves on. Within one instant the reference applies all frees before all allocations, so
    its maximum over the instant is the value at the instant's end, whatever the order of the updates.
    """
    n = placement.shape[0]
    ndev = cost.shape[1]
    busy_s[:] = 0.0
    peak[:] = 0
    link_bytes[:, :] = 0
    if n == 0:
        return 0.0

    et, ek, ea, eb, heap, chain_bytes, ready, rsize, busy, chan_free, chan_last, pending, finish, nbytes, \
        dsts, own_refs, recv_refs, recv_bytes, live = ws
    esize = 0
    seq = 0
    rsize[:] = 0
    busy[:] = False
    chan_free[:, :] = 0.0
    finish[:] = 0.0
    nbytes[:] = -1
    own_refs[:] = 1
    recv_refs[:, :] = 0
    live[:] = 0
    mem_changed = False

    for i in range(n):
        pending[i] = pred_ptr[i + 1] - pred_ptr[i]
        for j in range(succ_ptr[i], succ_ptr[i + 1]):
            c = succ_idx[j]
            if placement[c] == placement[i]:
                own_refs[i] += 1
            else:
                recv_refs[i, placement[c]] += 1
        for dd in range(ndev):
            if recv_refs[i, dd] > 0:
                own_refs[i] += 1  # one outgoing transfer to device dd
    for i in range(n):
        if pending[i] == 0:
            d = placement[i]
            rsize[d] = _rd_push(ready, d, rsize[d], i)

    t = 0.0
    first = True
    while True:
        if not first:
            if esize == 0:
                break
            if mem_changed and et[heap[0]] != t:  # an instant is over: its end state is a peak candidate
                for dd in range(ndev):
                    peak[dd] = max(peak[dd], live[dd])
                mem_changed = False
            t = et[heap[0]]
            while esize > 0 and et[heap[0]] == t:
                e = heap[0]
                kind = ek[e]
                a = ea[e]
                b = eb[e]
                esize = _ev_pop(heap, et, esize)
                if kind == OP_DONE:
                    p = a
                    src = b
                    busy[src] = False
                    n_dst = 0
                    for j in range(succ_ptr[p], succ_ptr[p + 1]):
                        c = succ_idx[j]
                        dc = placement[c]
                        if dc == src:
                            pending[c] -= 1
                            if pending[c] == 0:
                                rsize[dc] = _rd_push(ready, dc, rsize[dc], c)
                        else:
                            if nbytes[dc] < 0:
                                dsts[n_dst] = dc
                                n_dst += 1
                            if succ_bytes[j] > nbytes[dc]:
                                nbytes[dc] = succ_bytes[j]
                    _sort_small(dsts, n_dst)
                    for k in range(n_dst):
                        dst = dsts[k]
                        nb = nbytes[dst]
                        nbytes[dst] = -1
                        st = max(t, chan_free[src, dst])
                        en = st + latency_s[src, dst] + nb / bandwidth[src, dst]
                        chan_free[src, dst] = en
                        link_bytes[src, dst] += nb
                        recv_bytes[p, dst] = nb
                        if st == t:
                            live[dst] += nb
                            mem_changed = True
                        else:
                            # the channel is busy: this copy is allocated when the transfer ahead of it
                            # (the channel's last one) is done, which is at time st
                            chain_bytes[chan_last[src, dst]] = nb
                        et[seq] = en
                        ek[seq] = XFER_DONE
                        ea[seq] = p
                        eb[seq] = dst
                        chain_bytes[seq] = -1
                        chan_last[src, dst] = seq
                        esize = _ev_push(heap, et, esize, seq)
                        seq += 1
                    # memory: this op's own run is over; its inputs lose a consumer
                    own_refs[p] -= 1
                    if own_refs[p] == 0:
                        live[src] -= output_bytes[p]
                        mem_changed = True
                    for j in range(pred_ptr[p], pred_ptr[p + 1]):
                        q = pred_idx[j]
                        if placement[q] == src:
                            own_refs[q] -= 1
                            if own_refs[q] == 0:
                                live[src] -= output_bytes[q]
                                mem_changed = True
                        else:
                            recv_refs[q, src] -= 1
                            if recv_refs[q, src] == 0:
                                live[src] -= recv_bytes[q, src]
                                mem_changed = True
                else:  # XFER_DONE
                    p = a
                    dst = b
                    for j in range(succ_ptr[p], succ_ptr[p + 1]):
                        c = succ_idx[j]
                        if placement[c] == dst:
                            pending[c] -= 1
                            if pending[c] == 0:
                                rsize[dst] = _rd_push(ready, dst, rsize[dst], c)
                    src = placement[p]
                    own_refs[p] -= 1
                    if own_refs[p] == 0:
                        live[src] -= output_bytes[p]
                        mem_changed = True
                    if chain_bytes[e] >= 0:  # the next transfer on this channel starts now
                        live[dst] += chain_bytes[e]
                        mem_changed = True
        first = False
        # dispatch: every idle device starts its ready op with the smallest index, in device order
        for d in range(ndev):
            if rsize[d] > 0 and not busy[d]:
                i, rsize[d] = _rd_pop(ready, d, rsize[d])
                busy[d] = True
                dur = cost[i, d]
                finish[i] = t + dur
                busy_s[d] += dur
                live[d] += output_bytes[i]
                mem_changed = True
                et[seq] = finish[i]
                ek[seq] = OP_DONE
                ea[seq] = i
                eb[seq] = d
                esize = _ev_push(heap, et, esize, seq)
                seq += 1
    for dd in range(ndev):
        peak[dd] = max(peak[dd], live[dd])
    for i in range(n):
        peak[placement[i]] += param_bytes[i]
    step = 0.0
    for i in range(n):
        if finish[i] > step:
            step = finish[i]
    return step


@njit(cache=True)
def _simulate_batch(placements, cost, succ_ptr, succ_idx, succ_bytes, pred_ptr, pred_idx,
                    output_bytes, param_bytes, latency_s, bandwidth, steps, busy, peak, link):
    ws = _workspace(placements.shape[1], cost.shape[1], succ_idx.shape[0])
    for b in range(placements.shape[0]):
        steps[b] = _simulate(placements[b], cost, succ_ptr, succ_idx, succ_bytes, pred_ptr, pred_idx,
                             output_bytes, param_bytes, latency_s, bandwidth, busy[b], peak[b], link[b], ws)


def simulate_one(placement, cost, succ_ptr, succ_idx, succ_bytes, pred_ptr, pred_idx,
                 output_bytes, param_bytes, latency_s, bandwidth):
    """Returns (step_time_s, busy_s [D], peak_memory_bytes [D], link_bytes [D, D])."""
    ndev = cost.shape[1]
    busy = np.zeros(ndev, np.float64)
    peak = np.zeros(ndev, np.int64)
    link = np.zeros((ndev, ndev), np.int64)
    ws = _workspace(len(placement), ndev, len(succ_idx))
    step = _simulate(np.ascontiguousarray(placement, dtype=np.int64), cost, succ_ptr, succ_idx, succ_bytes,
                     pred_ptr, pred_idx, output_bytes, param_bytes, latency_s, bandwidth, busy, peak, link, ws)
    return step, busy, peak, link


def simulate_batch(placements, cost, succ_ptr, succ_idx, succ_bytes, pred_ptr, pred_idx,
                   output_bytes, param_bytes, latency_s, bandwidth):
    """Placements [B, n] -> (steps [B], busy [B, D], peak [B, D], link_bytes [B, D, D])."""
    bsz = placements.shape[0]
    ndev = cost.shape[1]
    steps = np.zeros(bsz, np.float64)
    busy = np.zeros((bsz, ndev), np.float64)
    peak = np.zeros((bsz, ndev), np.int64)
    link = np.zeros((bsz, ndev, ndev), np.int64)
    _simulate_batch(np.ascontiguousarray(placements, dtype=np.int64), cost, succ_ptr, succ_idx, succ_bytes,
                    pred_ptr, pred_idx, output_bytes, param_bytes, latency_s, bandwidth, steps, busy, peak, link)
    return steps, busy, peak, link
