"""The reference simulator: short, readable, and the definition of the semantics.

Semantics (the fast simulator reproduces them exactly, float for float):

* Each device has one compute stream and runs one op at a time, for `cost[i, device]` seconds.
* An op is ready when the output of every predecessor is on its device: at once when the predecessor ran on
  the same device, else when the transfer of that output to its device has arrived.
* Time advances from event to event. All events at the current time are handled first, the ends of ops
  in the order of their devices' indices, then the ends of transfers; then every idle device, in index
  order, starts its ready op with the smallest index (ops are in canonical topological order, so this is a
  fixed priority). Only links that share ports make the order of op ends within a time matter: the
  transfers they start claim ports in that order. An op of zero duration (an op overhead of 0 s) started at
  t ends at t in a further round of the same time, after that round's starts: an op it makes ready at t
  waits for its device if another op started there at t, whatever their indices.
* When op p finishes on device a, its output is sent once to each other device D that has consumers of p
  (in increasing order of D), however many consumers D has. The transfer carries what those consumers
  read: the sum of their edges' bytes (an edge carries the bytes its consumer reads, e.g. one time step's
  slice), but never more than p's whole tensor, send_cap[p]: the larger of p's output bytes and its
  largest edge (a variable's output is 0 bytes; its edges carry its weights; `suite.simulator.send_caps`).
  It goes over the channel (a, D): it starts when the channel is free (one transfer at a time per
  direction, first come first served) and takes latency[a, D] + bytes / bandwidth[a, D]. With `ports`
  (`Cluster.ports`: links with `sharing = "ports"`, and the hops of "pairs" links that routes of several
  links take) it also waits until each port that the pair's route holds is free, and holds them all until
  it ends.
* Memory per device = resident bytes (param_bytes of its ops) + live tensors. An op's output is allocated
  on its device when the op starts and freed when the op, its local consumers and its outgoing transfers
  have all finished. A received copy is allocated on the destination when its transfer starts and freed
  when its last consumer there finishes. At equal times frees come before allocations.
* Peak memory above a device's capacity is OOM; the step time is still computed and reported.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

OP_DONE = 0
XFER_DONE = 1


@dataclass(frozen=True)
class Schedule:
    """Everything the reference simulator computes, for tests and explanation."""

    step_time_s: float
    start_s: np.ndarray  # [n]
    finish_s: np.ndarray  # [n]
    busy_s: np.ndarray  # [D]
    peak_memory_bytes: np.ndarray  # [D], resident bytes included
    link_bytes: np.ndarray  # [D, D]
    transfers: list[tuple[int, int, int, float, float, int]]  # (op, src dev, dst dev, start, end, bytes)
    resident_bytes: np.ndarray  # [D] parameter bytes of the ops on each device
    memory_events: list[tuple[int, float, int]]  # `memory_events`: (device, time, +/- bytes of a live tensor)


def simulate(
    placement: np.ndarray,
    cost: np.ndarray,
    succ_ptr: np.ndarray,
    succ_idx: np.ndarray,
    succ_bytes: np.ndarray,
    num_preds: np.ndarray,
    output_bytes: np.ndarray,
    send_cap: np.ndarray,
    param_bytes: np.ndarray,
    latency_s: np.ndarray,
    bandwidth: np.ndarray,
    ports: tuple[np.ndarray, np.ndarray, int] | None = None,
) -> Schedule:
    n = len(placement)
    ndev = cost.shape[1]
    dev = [int(d) for d in placement]
    dur = [float(cost[i, dev[i]]) for i in range(n)]
    succ = [[int(c) for c in succ_idx[succ_ptr[i] : succ_ptr[i + 1]]] for i in range(n)]
    ebytes = [[int(b) for b in succ_bytes[succ_ptr[i] : succ_ptr[i + 1]]] for i in range(n)]

    pending = [int(k) for k in num_preds]
    ready: list[list[int]] = [[] for _ in range(ndev)]
    busy = [False] * ndev
    chan_free = [[0.0] * ndev for _ in range(ndev)]
    port_ptr, port_ids, n_ports = ports if ports is not None else (np.zeros(ndev * ndev + 1, np.int64), [], 0)
    port_free = [0.0] * n_ports
    start = [0.0] * n
    finish = [0.0] * n
    busy_s = [0.0] * ndev
    link_bytes = np.zeros((ndev, ndev), dtype=np.int64)
    transfers: list[tuple[int, int, int, float, float, int]] = []
    events: list[tuple[float, int, int, int]] = []  # (time, kind, device, op)

    def push(t: float, kind: int, a: int, b: int) -> None:
        heapq.heappush(events, (t, kind, b, a))

    def arrive(c: int) -> None:
        pending[c] -= 1
        if pending[c] == 0:
            heapq.heappush(ready[dev[c]], c)

    def dispatch(t: float) -> None:
        for d in range(ndev):
            if not busy[d] and ready[d]:
                i = heapq.heappop(ready[d])
                busy[d] = True
                start[i] = t
                finish[i] = t + dur[i]
                busy_s[d] += dur[i]
                push(finish[i], OP_DONE, i, d)

    for i in range(n):
        if pending[i] == 0:
            heapq.heappush(ready[dev[i]], i)
    dispatch(0.0)
    while events:
        t = events[0][0]
        while events and events[0][0] == t:
            _, kind, b, a = heapq.heappop(events)
            if kind == OP_DONE:
                p, src = a, b
                busy[src] = False
                nbytes = [-1] * ndev  # bytes to send to each other device, -1: none
                for c, eb in zip(succ[p], ebytes[p], strict=True):
                    if dev[c] == src:
                        arrive(c)
                    else:
                        nbytes[dev[c]] = max(nbytes[dev[c]], 0) + eb
                for dst in range(ndev):
                    if nbytes[dst] >= 0:
                        nbytes[dst] = min(nbytes[dst], int(send_cap[p]))
                        held = port_ids[port_ptr[src * ndev + dst] : port_ptr[src * ndev + dst + 1]]
                        s = max([t, chan_free[src][dst]] + [port_free[k] for k in held])
                        e = s + latency_s[src, dst] + nbytes[dst] / bandwidth[src, dst]
                        chan_free[src][dst] = e
                        for k in held:
                            port_free[k] = e
                        link_bytes[src, dst] += nbytes[dst]
                        transfers.append((p, src, dst, s, e, nbytes[dst]))
                        push(e, XFER_DONE, p, dst)
            else:
                p, dst = a, b
                for c in succ[p]:
                    if dev[c] == dst:
                        arrive(c)
        dispatch(t)

    finish_arr = np.array(finish, dtype=np.float64)
    resident = np.zeros(ndev, dtype=np.int64)
    for p in range(n):
        resident[dev[p]] += int(param_bytes[p])
    mem = memory_events(dev, start, finish, succ, transfers, output_bytes)
    return Schedule(
        step_time_s=float(finish_arr.max()) if n else 0.0,
        start_s=np.array(start, dtype=np.float64),
        finish_s=finish_arr,
        busy_s=np.array(busy_s, dtype=np.float64),
        peak_memory_bytes=resident + _peak_live(mem, ndev),
        link_bytes=link_bytes,
        transfers=transfers,
        resident_bytes=resident,
        memory_events=mem,
    )


def _peak_live(events: list[tuple[int, float, int]], ndev: int) -> np.ndarray:
    """The most live bytes on each device over the sweep of `memory_events` (frees before allocations at
    equal times)."""
    live = [0] * ndev
    peak = [0] * ndev
    for d, _t, delta in events:
        live[d] += delta
        peak[d] = max(peak[d], live[d])
    return np.array(peak, dtype=np.int64)


def memory_events(dev, start, finish, succ, transfers, output_bytes) -> list[tuple[int, float, int]]:
    """Every allocation and free of a live tensor as (device, time, +bytes or -bytes), in the order of the
    sweep: by device, then time, frees before allocations at equal times."""
    n = len(dev)
    release = list(finish)  # when the producer's own copy can be freed
    for p in range(n):
        for c in succ[p]:
            if dev[c] == dev[p]:
                release[p] = max(release[p], finish[c])
    events: list[tuple[int, float, int, int]] = []  # (device, time, 0 free / 1 alloc, bytes)
    for p, _src, dst, s, e, nb in transfers:
        release[p] = max(release[p], e)
        freed = e
        for c in succ[p]:
            if dev[c] == dst:
                freed = max(freed, finish[c])
        events.append((dst, s, 1, nb))
        events.append((dst, freed, 0, -nb))
    for p in range(n):
        nb = int(output_bytes[p])
        events.append((dev[p], start[p], 1, nb))
        events.append((dev[p], release[p], 0, -nb))
    return [(d, t, delta) for d, t, _kind, delta in sorted(events, key=lambda x: (x[0], x[1], x[2]))]
