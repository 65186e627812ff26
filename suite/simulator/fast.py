"""The fast simulator: a numba engine with the semantics of `reference.py`, float for float.

It differs from the reference in how it gets there, relying on these facts of those semantics:

* A transfer's end is known when it is created: a channel is first come first served, so a transfer starts
  when the channel is free (`ch_free`, the end of the one ahead of it) and takes latency + bytes / bandwidth.
  So arrivals are not events. When op p ends, each consumer gets the arrival time of its input at once (p's
  end for a consumer on p's device, the transfer's end for one elsewhere); its ready time `ready_at` is the
  latest of them, and once its last producer has ended it is *released* to its device.
* An idle device starts the released op with the smallest index whose ready time has come (a bitmap over
  op indices per device). Each device has one event slot: the end of its running op, or when idle the
  earliest ready time among its released ops (INF if none). The next instant is the smallest slot or the
  start of a queued transfer (below); there are no other events. Within an instant the order of op ends
  does not matter, and every device whose slot it is dispatches after all of them, as in the reference.
* Memory changes as in the reference: an op's output is allocated when it starts; a received copy when its
  transfer starts: at once on a free channel, else when the transfer ahead ends (queued transfers wait in a
  list per channel, and the event queue holds the next start of each channel); frees when consumers end.
  The transfers of op p hold its own copy until the last of them ends (at p's end or later): that release
  waits in a list per device. Releases only lower a device's live bytes, so the list is applied only
  when the live bytes (still counting those copies) exceed the device's peak so far, when the time moves on;
  otherwise the exact value could not set a new peak. This equals the reference's sweep of memory events
  with frees before allocations at equal times: the peak is the largest live bytes at the end of a time.
* The dispatch scan passes over released ops not ready yet, and the release walk over releases not yet due.
  Both are short in practice (at most 6 entries per op over the zoo workloads and cluster presets with
  random, grouped and block placements; 0.1 on the benchmark graph) but grow with the number of ops waiting
  at once: a fan of thousands of transfers queued on one slow link makes them quadratic. So the engine counts
  them and gives up past 32 n + 4096 (n ops), and `_simulate_guarded` reruns the placement with the robust
  engine, compiled from the same code (`robust` True): a released op found not ready moves to its device's
  min-heap by ready time until its time comes, and each release waits on the channel of its last transfer, in
  time order (a channel's transfer ends only grow), so that only due releases are visited. It is linear in
  every case, but about 1.5 times slower on usual graphs (the extra code in the event loop), hence not the
  default. On 16,000 producers sending to 16,000 consumers over one slow link (`test_simulator_bench.py`),
  one placement takes 4.4 ms (2.8 in the robust engine) against 261 ms (consumers in producer order) and
  335 ms (in reverse) for the fast engine left to run.

Devices in masks (`busy`, `act`, `armed`, `over`): bit k stands for the devices d with d % 64 == k; up to
64 devices that is device k alone. Larger clusters loop over the devices of each set bit and check each one
(correct, not tuned); they read `act`, `done` and `over` only (`busy` and `armed`, which a class of devices
cannot keep exactly, are not read) and test each device's `running` and `slot`; that code is compiled only
for them: `_simulate`'s argument `wide` is None up to 64 devices and numba prunes the branches on `wide is
None` at compile time (as it does those on `robust is None`). Indices are unsigned, with `NONE` as "no
such": numba wraps negative indices around, which costs a sign test in the hot loop.
`simulate_batch` runs many placements in one compiled call, sequentially on one core, reusing one workspace,
which is also kept for the next call with the same sizes.

Measured on tests/suite/test_simulator_bench.py's graph (10,000 ops, 8 devices, one core; minimum ms of a
batch of 64 blocks / groups / random placements), side by side in one sitting: 18.0 / 39.6 / 47.8, against
20.0 / 42.8 / 58.0 for the engine before this one (until 7261ced), which made every transfer's arrival an
event in a queue of channel heads: 10,200 / 14,400 / 17,400 instants per placement (random: 10,000 op ends and
11,900 arrivals) against 10,000 / 11,100 / 12,100 here. With at most two devices armed and no queued start,
the next instant is found without the 8-wide scan (-3% blocks, -4% groups). Removing a part (results then
wrong) shows what the time goes to: the frees of a finished op's inputs cost 7 / 6 / 0 ms of a batch; the rest
is the event loop, bound by chains of dependent loads and by branch mispredictions more than by instruction
count (cachegrind: 5.7 M instructions per random placement, about 2.2 per cycle).

Tried and dropped (batch of 64, blocks / groups / random, against 18.3 / 40.6 / 48.1 ms for a prototype of
this design in the same sitting): arrivals delivered lazily at the destination's next dispatch, with transfer
records in per-channel lists (28.0 / 54.5 / 74.6); the successors of an ended op in two branch-free passes
(23.2 / 46.3 / 52.3) or in one (18.5 / 43.7 / 49.0); frees without branches through one reference count per
(op, device) (19.9 / 44.5 / 56.4); frees moved after the dispatch (21.7 / 46.8 / 56.8); every device's peak
compared 8 wide at the end of each instant (20.4 / 41.7 / 49.1); the own-copy releases in per-channel lists
(25.9 / 49.7 / 62.0, before the peak bound); no float division (a product instead: no change); the
robust engine's heaps and per-channel release lists as the only engine (32.3 / 55.2 / 66.9 against
19.3 / 40.5 / 48.1), or only its heap check in the dispatch (23.7 / 44.6 / 54.1): code in the event loop
costs even when it never runs, and a cold call to out-of-line code costs as much (34.6 / 56.2 / 66.9;
llvm.expect hints no help). Tried on the engine before (against its 20 / 43 / 58 ms): future memory deltas in per-device heaps instead of arrival
events (0.84 / 1.20 / 1.36 ms per placement against 0.45 / 0.91 / 1.31 then); a binary heap, a branch-free
insertion, per-source slots or source-tagged keys for the channel queue; two placements interleaved instant by
instant (+25%: twice the live registers); int32 counters; one array of 4 words per op; device masks as arrays
of words (+40% for blocks); an 8-wide vector min of the slots (no change: a vector load of slots just written
by scalar stores is not forwarded). Vectorising across the placements of a batch was ruled out by measurement:
an 8-wide gather or scatter of int64 takes 5-6.5 ns on this machine's CPU (AMD EPYC, AVX-512), about what the
scalar engine spends per event.

Measured at 28d3f26 against its 19.6 / 40.3 / 48.5 ms: with no memory bookkeeping at all (results wrong)
11.5 / 26.2 / 35.9, so random placements would miss 32 ms even without a memory model. A single pass over
the ops in index order, with no event loop, does not apply: 176 / 4,250 / 4,060 of the 10,000 ops start out of
index order on their device (an op whose inputs have arrived overtakes a lower one still waiting for its
own). The device count as a compile-time constant (19.5 / 40.1 / 48.3) and frees by masks instead of
branches (19.9 / 40.6 / 49.1): no gain. The cost per op is flat from 2,500 to 20,000 ops (random placements:
76 to 85 ns), so cache misses are not what bounds it. On 2026-11-25, on a 2.45 GHz Zen 3 host with AVX2
only (against this engine's 26.6 / 51.4 / 61.0 ms there): a prepass per placement that groups each op's
consumers by device (its own first, then the others in order) and sizes its transfers, so that the event
loop reads them in order instead of grouping them, took 41.3 / 70.5 / 76.1: it costs more than it saves.
"""

from __future__ import annotations

import threading

import numpy as np
from numba import njit
from numba.core import types
from numba.cpython.unsafe.numbers import trailing_zeros
from numba.extending import intrinsic

U = np.uint64
ONE = U(1)
NONE = U(0xFFFFFFFFFFFFFFFF)  # no op, device, edge or channel
INF = np.int64(0x7FF0000000000000)  # the bits of +inf: no event in a slot, no released op


@intrinsic
def _bits(typingctx, x):
    """The bit pattern of a float64 as an int64: ordered like the float for non-negative times."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.int64))
    return types.int64(types.float64), codegen


@intrinsic
def _time(typingctx, x):
    """The float64 with the bit pattern x (inverse of `_bits`)."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.float64))
    return types.float64(types.int64), codegen


@njit(cache=True, inline="always")
def _min8(a, o):
    """The smallest of a[o:o + 8], as a tree of selects (no branches)."""
    return min(min(min(a[o], a[o + ONE]), min(a[o + U(2)], a[o + U(3)])),
               min(min(a[o + U(4)], a[o + U(5)]), min(a[o + U(6)], a[o + U(7)])))


@njit(cache=True, inline="always")
def _equal8(a, o, m):
    """Bit k set where a[o + k] == m, for k < 8."""
    return (U(a[o] == m) | U(a[o + ONE] == m) << ONE | U(a[o + U(2)] == m) << U(2) | U(a[o + U(3)] == m) << U(3)
            | U(a[o + U(4)] == m) << U(4) | U(a[o + U(5)] == m) << U(5) | U(a[o + U(6)] == m) << U(6)
            | U(a[o + U(7)] == m) << U(7))


@njit(cache=True, inline="always")
def _queue_push(qt, qs, size, t, ch):
    """Insert channel `ch` at time `t` (bits); the queue is kept in descending time order."""
    j = size
    while j > U(0) and qt[j - ONE] < t:
        qt[j] = qt[j - ONE]
        qs[j] = qs[j - ONE]
        j -= ONE
    qt[j] = t
    qs[j] = ch
    return size + ONE


@njit(cache=True, inline="always")
def _heap_push(heap_t, heap_op, base, size, t, c):
    """Add op c with ready time t (bits) to the min-heap heap_t/heap_op[base:base + size]; returns the new size."""
    i = size
    while i > U(0):
        parent = (i - ONE) >> ONE
        if heap_t[base + parent] <= t:
            break
        heap_t[base + i] = heap_t[base + parent]
        heap_op[base + i] = heap_op[base + parent]
        i = parent
    heap_t[base + i] = t
    heap_op[base + i] = c
    return size + ONE


@njit(cache=True, inline="always")
def _heap_pop(heap_t, heap_op, base, size):
    """Remove the root of the min-heap heap_t/heap_op[base:base + size] (size > 0); returns the new size."""
    size -= ONE
    t = heap_t[base + size]
    c = heap_op[base + size]
    i = U(0)
    while True:
        child = (i << ONE) + ONE
        if child >= size:
            break
        if child + ONE < size and heap_t[base + child + ONE] < heap_t[base + child]:
            child += ONE
        if t <= heap_t[base + child]:
            break
        heap_t[base + i] = heap_t[base + child]
        heap_op[base + i] = heap_op[base + child]
        i = child
    heap_t[base + i] = t
    heap_op[base + i] = c
    return size


@njit(cache=True, inline="always")
def _pick(d, tb, released, low, n_released, ready_at):
    """The released op of device d with the smallest index whose ready time is at most `tb`, removed from the
    set; else NONE and the earliest ready time of the set (INF if empty). Also returns how many released ops
    it passed over (not ready yet): the work that `_simulate` bounds."""
    total = n_released[d]
    left = total
    earliest = INF
    w = low[d]
    while left > 0:
        x = released[d, w]
        if x == U(0) and earliest == INF:
            low[d] = w + ONE  # no released op below this word
        while x != U(0):
            c = w * U(64) + U(trailing_zeros(x))
            r = ready_at[c]
            if r <= tb:
                released[d, w] ^= x & (~x + ONE)
                n_released[d] = n_released[d] - 1
                return c, earliest, total - left
            earliest = min(earliest, r)
            x &= x - ONE
            left -= 1
        w += ONE
    return NONE, earliest, total


@njit(cache=True, inline="always")
def _pick_waiting(d, tb, released, low, n_released, ready_at, heap_t, heap_op, heap_base, heap_size):
    """`_pick` for the robust engine: a released op found not ready yet leaves the bitmap for the device's heap
    of waiting ops (by ready time), and comes back when its time has come, so each op is passed over at most
    once however long it waits. The earliest ready time returned when none is ready includes the heap's."""
    base = heap_base[d]
    while heap_size[d] > U(0) and heap_t[base] <= tb:
        c = heap_op[base]
        heap_size[d] = _heap_pop(heap_t, heap_op, base, heap_size[d])
        w = c >> U(6)
        released[d, w] |= ONE << (c & U(63))
        low[d] = min(low[d], w)
        n_released[d] += 1
    w = low[d]
    while n_released[d] > 0:
        x = released[d, w]
        while x != U(0):
            c = w * U(64) + U(trailing_zeros(x))
            bit = x & (~x + ONE)
            released[d, w] ^= bit
            n_released[d] -= 1
            r = ready_at[c]
            if r <= tb:
                low[d] = w
                return c, INF
            heap_size[d] = _heap_push(heap_t, heap_op, base, heap_size[d], r, c)
            x ^= bit
        w += ONE
    low[d] = U(released.shape[1])
    return NONE, heap_t[base] if heap_size[d] > U(0) else INF


@njit(cache=True)
def _workspace(n, ndev, n_edges):
    """Scratch arrays for one graph size, reused across the placements of a batch.

    The arrays built with zeros, -1, NONE or INF are returned to that state by every run.
    """
    w = (ndev + 7) // 8 * 8  # slots, live bytes and peaks padded to whole groups of 8
    n_xfer = min(n_edges, n * max(ndev - 1, 0)) + 1  # at most one transfer per (producer, other device)
    return (
        np.empty(ndev * ndev, np.int64),  # event queue of queued transfer starts: time (bits), descending
        np.empty(ndev * ndev, np.uint64),  # event queue: channel (src * ndev + dst), one entry per channel
        np.full(ndev * ndev, NONE, np.uint64),  # channel: first queued transfer not yet started
        np.empty(ndev * ndev, np.uint64),  # channel: last queued transfer
        np.empty(n_xfer, np.int64),  # queued transfer: start (bits)
        np.empty(n_xfer, np.int64),  # queued transfer: bytes
        np.empty(n_xfer, np.uint64),  # queued transfer: next on its channel
        np.empty(ndev * ndev, np.float64),  # channel (src * ndev + dst): time it becomes free
        np.zeros((ndev, (n + 63) // 64), np.uint64),  # released ops per device (bitmaps)
        np.empty(ndev, np.uint64),  # lowest word of each bitmap that may be non-empty
        np.empty(ndev, np.int64),  # released ops per device
        np.empty(ndev, np.uint64),  # running op per device, NONE if idle
        np.full(w, INF, np.int64),  # slot: end of the running op, or earliest ready time when idle (bits)
        np.empty(n, np.int64),  # inputs not yet produced
        np.empty(n, np.int64),  # ready time (bits): the latest arrival of an input so far
        np.empty(n, np.int64),  # references to each op's own output copy
        np.zeros((n, ndev), np.int64),  # references to each received copy
        np.empty((n, ndev), np.int64),  # bytes of each received copy
        np.empty(w, np.int64),  # live bytes per device
        np.empty(w, np.int64),  # peak live bytes per device so far
        np.full(ndev, -1, np.int64),  # scratch: bytes to send to each device, -1 = none
        np.zeros(ndev, np.int64),  # scratch: consumers on each other device
        np.empty(ndev, np.uint64),  # scratch: destinations of the op that just ended
        np.empty(ndev, np.uint64),  # scratch: last edge to each destination
        np.empty(max(n_edges, 1), np.uint64),  # edge: next edge to a consumer on the same destination
        np.empty(n, np.uint64),  # the placement, unsigned
        np.empty(n, np.float64),  # duration of each op on its device
        np.full(ndev * ndev, NONE, np.uint64),  # own-copy releases waiting: first op of each list (see `robust`)
        np.empty(n, np.uint64),  # waiting release: next op of the list
        np.empty(n, np.int64),  # waiting release: when the op's last transfer ends (bits)
        np.empty(ndev * ndev, np.uint64),  # robust engine: last op of each channel's list of waiting releases
        np.empty(n, np.int64),  # robust engine: heaps of waiting ops (released, not ready), a segment per device
        np.empty(n, np.uint64),  # robust engine: heaps of waiting ops: op
        np.empty(ndev, np.uint64),  # robust engine: heap segment of each device: start
        np.zeros(ndev, np.uint64),  # robust engine: heap of each device: size
    )


@njit(cache=True, error_model="numpy")
def _simulate(placement, cost, succ_ptr, succ_idx, succ_bytes, pred_ptr, pred_idx, output_bytes, send_cap, param_bytes,
              latency_s, bandwidth, busy_s, peak, link_bytes, ws, wide, robust, starts, ports):
    """One placement; fills busy_s [D], peak [D], link_bytes [D, D] and starts [n] (each op's start time);
    returns the step time.

    With `robust` None, the fast engine: it gives up and returns -1.0 (the workspace restored) once its scans
    have passed over more than 32 n + 4096 entries; the robust engine (`robust` True) never does. `ports` is
    None, or (ptr, port, free) for links that share ports (`Cluster.ports`, with `free` the time each port
    becomes free): a transfer waits for its channel and for the ports of its pair, and holds them all."""
    n = U(placement.shape[0])
    ndev = U(cost.shape[1])
    busy_s[:] = 0.0
    peak[:] = 0
    link_bytes[:, :] = 0
    if n == U(0):
        return 0.0
    (qt, qs, ch_qhead, ch_qtail, xq_start, xq_bytes, xq_next, ch_free, released, low, n_released, running, slot,
     pending, ready_at, own_refs, recv_refs, recv_bytes, live, top, send_bytes, n_remote, dsts, dst_edge, edge_next,
     dev_of, dur_of, rel_head, rel_next, rel_time, rel_tail, heap_t, heap_op, heap_base, heap_size) = ws
    ch_free[:] = 0.0
    if ports is not None:
        port_ptr, port, port_free = ports
        port_free[:] = 0.0
    live[:] = 0
    top[:] = 0
    n_words = U(released.shape[1])
    for d in range(ndev):
        low[d] = n_words
        n_released[d] = 0
        running[d] = NONE
        slot[d] = 0  # every device dispatches at 0
        if robust is not None:
            heap_base[d] = 0
    for i in range(n):
        d = U(placement[i])
        if robust is not None:
            heap_base[d] += ONE
        dev_of[i] = d
        dur_of[i] = cost[i, d]
        pending[i] = pred_ptr[i + ONE] - pred_ptr[i]
        own_refs[i] = ONE + succ_ptr[i + ONE] - succ_ptr[i]  # its own run + every consumer (see below)
        ready_at[i] = 0
    if robust is not None:
        start = U(0)
        for d in range(ndev):  # device d's heap holds at most its ops
            count = heap_base[d]
            heap_base[d] = start
            start += count
    for i in range(n):
        if pending[i] == 0:
            d = dev_of[i]
            w = U(i) >> U(6)
            released[d, w] |= ONE << (U(i) & U(63))
            low[d] = min(low[d], w)
            n_released[d] += 1
    busy = U(0)  # device classes with a running op (up to 64 devices: the devices)
    armed = U(0)  # device classes with a finite slot
    act = NONE >> (U(64) - min(ndev, U(64)))  # device classes to dispatch at this instant: at 0, all
    done = U(0)  # device classes whose running op ends at this instant
    q = U(0)  # channels in the event queue
    nq = U(0)  # queued transfers so far
    t = 0.0
    tb = np.int64(0)  # _bits(t)
    over = U(0)  # device classes whose live bytes may exceed their peak in this instant
    work = np.int64(0)  # fast engine: released ops and waiting releases passed over so far
    limit = np.int64(32) * np.int64(n) + 4096
    while True:
        while done != U(0):
            k = U(trailing_zeros(done))
            done &= done - ONE
            first, stride = k, U(64)
            if wide is not None and ports is not None:  # ports are claimed in device order: all devices at once
                first, stride, done = U(0), ONE, U(0)
            for src in range(first, ndev if wide is not None else k + ONE, stride):
                if wide is not None and (running[src] == NONE or slot[src] != tb):
                    continue
                # the op running on src ends: each consumer gets its input, at once or by a transfer
                p = running[src]
                running[src] = NONE
                busy &= ~(ONE << k)
                n_dst = U(0)
                for j in range(succ_ptr[p], succ_ptr[p + ONE]):
                    c = succ_idx[j]
                    dc = dev_of[c]
                    if dc == src:
                        v = pending[c] - 1
                        pending[c] = v
                        ready_at[c] = max(ready_at[c], tb)
                        z = U(v == 0)
                        w = c >> U(6)
                        released[src, w] |= z << (c & U(63))
                        low[src] = min(low[src], w | (z - ONE))  # w | NONE (no change) unless c was released
                        n_released[src] += z
                    else:
                        if send_bytes[dc] < 0:
                            dsts[n_dst] = dc
                            n_dst += ONE
                            dst_edge[dc] = NONE
                            send_bytes[dc] = 0
                        edge_next[j] = dst_edge[dc]
                        dst_edge[dc] = j
                        send_bytes[dc] += succ_bytes[j]
                        n_remote[dc] += 1
                # the own copy was referenced by its run and each consumer; remote consumers now hold it
                # through their transfers, and all of p's transfers through one release when the last ends
                own_refs[p] -= 1
                last = tb
                last_ch = NONE
                if ports is not None:  # ports are claimed in destination order
                    for e in range(1, n_dst):
                        x = dsts[e]
                        f = e
                        while f > 0 and dsts[f - 1] > x:
                            dsts[f] = dsts[f - 1]
                            f -= 1
                        dsts[f] = x
                for e in range(n_dst):
                    dst = dsts[e]
                    nb = min(send_bytes[dst], send_cap[p])
                    send_bytes[dst] = -1
                    own_refs[p] -= n_remote[dst]
                    recv_refs[p, dst] = n_remote[dst]
                    n_remote[dst] = 0
                    recv_bytes[p, dst] = nb
                    ch = src * ndev + dst
                    s = max(t, ch_free[ch])
                    if ports is not None:
                        for h in range(port_ptr[ch], port_ptr[ch + ONE]):
                            s = max(s, port_free[port[h]])
                    end = s + latency_s[src, dst] + nb / bandwidth[src, dst]
                    ch_free[ch] = end
                    if ports is not None:
                        for h in range(port_ptr[ch], port_ptr[ch + ONE]):
                            port_free[port[h]] = end
                    link_bytes[src, dst] += nb
                    eb = _bits(end)
                    if robust is None:
                        last = max(last, eb)
                    elif eb >= last:
                        last = eb
                        last_ch = ch
                    if s == t:  # the channel is free: the received copy is allocated now
                        lv = live[dst] + nb
                        live[dst] = lv
                        over |= U(lv > top[dst]) << (dst & U(63))
                    else:  # queued behind the channel's transfers: it starts when the one ahead ends
                        xq_start[nq] = _bits(s)
                        xq_bytes[nq] = nb
                        xq_next[nq] = NONE
                        if ch_qhead[ch] == NONE:
                            ch_qhead[ch] = nq
                            q = _queue_push(qt, qs, q, _bits(s), ch)
                        else:
                            xq_next[ch_qtail[ch]] = nq
                        ch_qtail[ch] = nq
                        nq += ONE
                    idle = ((busy >> (dst & U(63))) & ONE) == U(0) if wide is None else running[dst] == NONE
                    j = dst_edge[dst]
                    while j != NONE:  # the consumers on dst get their input when the transfer ends
                        c = succ_idx[j]
                        j = edge_next[j]
                        v = pending[c] - 1
                        pending[c] = v
                        r = max(ready_at[c], eb)
                        ready_at[c] = r
                        z = U(v == 0)
                        w = c >> U(6)
                        released[dst, w] |= z << (c & U(63))
                        low[dst] = min(low[dst], w | (z - ONE))
                        n_released[dst] += z
                        if z and idle:  # an idle device wakes when its released op is ready
                            slot[dst] = min(slot[dst], r)
                            act |= U(r == tb) << (dst & U(63))
                            armed |= ONE << (dst & U(63))
                if n_dst > U(0):
                    own_refs[p] += 1
                    rel_time[p] = last
                    if robust is None:  # a list per device, newest first
                        rel_next[p] = rel_head[src]
                        rel_head[src] = p
                    else:  # a list per channel, in time order: a channel's transfer ends only grow
                        rel_next[p] = NONE
                        if rel_head[last_ch] == NONE:
                            rel_head[last_ch] = p
                        else:
                            rel_next[rel_tail[last_ch]] = p
                        rel_tail[last_ch] = p
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
        while q > U(0) and qt[q - ONE] == tb:  # queued transfers that start now
            q -= ONE
            ch = qs[q]
            x = ch_qhead[ch]
            d = ch % ndev
            lv = live[d] + xq_bytes[x]
            live[d] = lv
            over |= U(lv > top[d]) << (d & U(63))
            x = xq_next[x]
            ch_qhead[ch] = x
            if x != NONE:
                q = _queue_push(qt, qs, q, xq_start[x], ch)
        while act != U(0):  # dispatch: each idle device of the instant starts its ready op, if any
            k = U(trailing_zeros(act))
            act &= act - ONE
            for d in range(k, ndev if wide is not None else k + ONE, 64):
                if wide is not None and (running[d] != NONE or slot[d] != tb):
                    continue
                if robust is None:
                    i, earliest, passed = _pick(d, tb, released, low, n_released, ready_at)
                    work += passed
                else:
                    i, earliest = _pick_waiting(d, tb, released, low, n_released, ready_at, heap_t, heap_op,
                                                heap_base, heap_size)
                if i != NONE:
                    running[d] = i
                    dur = dur_of[i]
                    busy_s[d] += dur
                    slot[d] = _bits(t + dur)
                    busy |= ONE << k
                    armed |= ONE << k
                    lv = live[d] + output_bytes[i]
                    live[d] = lv
                    over |= U(lv > top[d]) << k
                    starts[i] = t
                else:
                    slot[d] = earliest
                    if wide is None:
                        armed = (armed & ~(ONE << k)) | (U(earliest != INF) << k)
        # the next instant: the earliest slot, or a queued transfer start
        two = armed & (armed - ONE)  # armed without its lowest bit
        if wide is None and q == U(0) and two == U(0):  # one event source at most
            act = armed
            m = slot[trailing_zeros(armed)] if armed != U(0) else INF
        elif wide is None and q == U(0) and (two & (two - ONE)) == U(0):  # two
            ka = U(trailing_zeros(armed))
            kb = U(trailing_zeros(two))
            m = min(slot[ka], slot[kb])
            act = (U(slot[ka] == m) << ka) | (U(slot[kb] == m) << kb)
        else:
            m = INF
            act = U(0)
            for g in range(0, slot.shape[0], 8):
                gm = _min8(slot, U(g))
                gmask = _equal8(slot, U(g), gm)
                act = (act & (U(gm < m) - ONE)) | (gmask & (U(gm <= m) * NONE)) << (U(g) & U(63))
                m = min(m, gm)
            if q > U(0):
                mc = qt[q - ONE]
                act &= U(mc < m) - ONE
                m = min(m, mc)
        if m != tb:  # the time moves on: the instant's end state is a peak candidate
            while over != U(0):  # new peaks, after the releases that are due
                k = U(trailing_zeros(over))
                over &= over - ONE
                for d in range(k, ndev if wide is not None else k + ONE, 64):
                    if live[d] <= top[d]:
                        continue
                    if robust is None:  # walk the device's list
                        prev = NONE
                        p = rel_head[d]
                        while p != NONE:
                            nxt = rel_next[p]
                            if rel_time[p] <= tb:  # p's last transfer has ended
                                if prev == NONE:
                                    rel_head[d] = nxt
                                else:
                                    rel_next[prev] = nxt
                                own_refs[p] -= 1
                                if own_refs[p] == 0:
                                    live[d] -= output_bytes[p]
                            else:
                                prev = p
                                work += 1
                            p = nxt
                    else:  # the due releases lead each of the device's channels' lists
                        for ch in range(d * ndev, d * ndev + ndev):
                            p = rel_head[ch]
                            while p != NONE and rel_time[p] <= tb:
                                own_refs[p] -= 1
                                if own_refs[p] == 0:
                                    live[d] -= output_bytes[p]
                                p = rel_next[p]
                            rel_head[ch] = p
                    top[d] = max(top[d], live[d])
            if m == INF or (robust is None and work > limit):
                break
        tb = m
        t = _time(m)
        done = act & busy if wide is None else act
    if robust is None and work > limit:  # given up: the workspace as found, for the robust engine
        ch_qhead[:] = NONE
        released[:, :] = 0
        recv_refs[:, :] = 0
        slot[:] = INF
        rel_head[:] = NONE
        return -1.0
    for d in range(ndev):
        peak[d] = top[d]
        slot[d] = INF
        heap_size[d] = 0
    rel_head[:] = NONE
    for i in range(n):
        peak[dev_of[i]] += param_bytes[i]
    return t


@njit(cache=True)
def _simulate_guarded(placement, cost, succ_ptr, succ_idx, succ_bytes, pred_ptr, pred_idx, output_bytes, send_cap,
                      param_bytes, latency_s, bandwidth, busy_s, peak, link_bytes, ws, wide, starts, mode, ports):
    """Mode 0: the fast engine, and the robust one where the fast one gives up; 1: the fast engine only (-1.0
    where it gives up); 2: the robust engine only."""
    step = -1.0
    if mode != 2:
        step = _simulate(placement, cost, succ_ptr, succ_idx, succ_bytes, pred_ptr, pred_idx, output_bytes, send_cap,
                         param_bytes, latency_s, bandwidth, busy_s, peak, link_bytes, ws, wide, None, starts, ports)
    if step < 0.0 and mode != 1:
        step = _simulate(placement, cost, succ_ptr, succ_idx, succ_bytes, pred_ptr, pred_idx, output_bytes, send_cap,
                         param_bytes, latency_s, bandwidth, busy_s, peak, link_bytes, ws, wide, True, starts, ports)
    return step


@njit(cache=True)
def _simulate_batch(placements, cost, succ_ptr, succ_idx, succ_bytes, pred_ptr, pred_idx,
                    output_bytes, send_cap, param_bytes, latency_s, bandwidth, steps, busy, peak, link, ws, wide, starts,
                    mode, ports):
    """Placement b's start times go to starts[b], or all to one scratch row when `starts` has one."""
    last = starts.shape[0] - 1
    for b in range(placements.shape[0]):
        steps[b] = _simulate_guarded(placements[b], cost, succ_ptr, succ_idx, succ_bytes, pred_ptr, pred_idx,
                                     output_bytes, send_cap, param_bytes, latency_s, bandwidth, busy[b], peak[b],
                                     link[b], ws, wide, starts[min(b, last)], mode, ports)


ENGINE_MODES = {"auto": 0, "fast": 1, "robust": 2}  # `engine` of simulate_batch -> `mode` of _simulate_guarded
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
                   output_bytes, send_cap, param_bytes, latency_s, bandwidth, ports=None, *, start_times=False,
                   engine="auto"):
    """Placements [B, n] -> (steps [B], busy [B, D], peak [B, D], link_bytes [B, D, D]), and with
    `start_times` a fifth array [B, n] of each op's start time (the engine records them in any case: one
    store per op, within the noise of the benchmark, and half the code to compile as a second engine).

    `engine`: "auto" (the fast engine, and the robust one for the placements on which it gives up), "fast"
    (its step time is -1.0 where it gives up; for tests) or "robust". `ports`: `Cluster.ports` (None: no
    link shares ports, and an engine compiled without that code).

    The index arrays (succ_ptr, succ_idx, pred_ptr, pred_idx) are used as uint64; `SimInputs.fast_args`
    gives them so, other callers pay a conversion per call. Device indices are not checked here: the
    callers in `suite.simulator` validate placements first.
    """
    if engine not in ENGINE_MODES:
        raise ValueError(f"engine must be one of {', '.join(ENGINE_MODES)}, got {engine!r}")
    bsz = placements.shape[0]
    ndev = cost.shape[1]
    steps = np.zeros(bsz, np.float64)
    busy = np.zeros((bsz, ndev), np.float64)
    peak = np.zeros((bsz, ndev), np.int64)
    link = np.zeros((bsz, ndev, ndev), np.int64)
    starts = np.zeros(placements.shape if start_times else (1, placements.shape[1]), np.float64)
    ws = _workspace_for(placements.shape[1], ndev, succ_idx.shape[0])
    # writable, as a read-only array is another type to numba: a second compiled engine for nothing
    _simulate_batch(np.require(placements, np.int64, ["C", "W"]), cost, unsigned(succ_ptr), unsigned(succ_idx),
                    succ_bytes, unsigned(pred_ptr), unsigned(pred_idx), output_bytes, send_cap, param_bytes, latency_s,
                    bandwidth, steps, busy, peak, link, ws, None if ndev <= 64 else ndev, starts, ENGINE_MODES[engine],
                    None if ports is None else (_read_only(ports[0]), _read_only(ports[1]), np.zeros(int(ports[2]))))
    return (steps, busy, peak, link, starts) if start_times else (steps, busy, peak, link)


def unsigned(index: np.ndarray) -> np.ndarray:
    """An index array as the uint64 the engine reads (no copy if it already is one)."""
    return np.ascontiguousarray(index, dtype=np.uint64)


def _read_only(index: np.ndarray) -> np.ndarray:
    """`unsigned(index)` as a read-only view: one array type for numba, whichever way the caller holds it."""
    view = unsigned(index).view()
    view.setflags(write=False)
    return view


def simulate_one(placement, cost, succ_ptr, succ_idx, succ_bytes, pred_ptr, pred_idx,
                 output_bytes, send_cap, param_bytes, latency_s, bandwidth, ports=None):
    """Returns (step_time_s, busy_s [D], peak_memory_bytes [D], link_bytes [D, D])."""
    steps, busy, peak, link = simulate_batch(np.asarray(placement).reshape(1, -1), cost, succ_ptr, succ_idx,
                                             succ_bytes, pred_ptr, pred_idx, output_bytes, send_cap, param_bytes,
                                             latency_s, bandwidth, ports)
    return float(steps[0]), busy[0], peak[0], link[0]
