"""The planner's analytic step estimator (Eq. 11-12): exposed latencies over the 1F1B main path.

From per-layer cost kinds (``ratrain.cost.terms``) it computes T_step = T_1F1B + E_comm + E_upd +
E_pref + E_rec without simulating events: the main path in closed form, recovery hidden in the
windows 1F1B leaves, and the GradSync -> UpdateShard -> PrefetchW chains against their deadlines.
``ratrain.sim.simulator`` is the reference it is tested against.
"""
from __future__ import annotations

from dataclasses import dataclass
from heapq import heapify, heappop, heappush
from itertools import accumulate, groupby

from ratrain.cost.terms import PREFETCH_RESOURCE, LayerKind
from ratrain.errors import ConfigError
from ratrain.sim.pipeline_order import PipelineSchedule
from ratrain.spec.memory import FSR_BUFFER_LAYERS

# ---------------------------------------------------------------- analytic step time (Eq. 11-12)

@dataclass
class StepBreakdown:
    """Eq. 12: T_step = T_1F1B + E_comm + E_upd + E_pref + E_rec (ms).

    t_1f1b_ms: main path without any recovery (F, B, TP all-reduces, ZeRO-3 gather overflow,
    boundary transfers, bubbles and imbalance). e_rec_ms: recovery the windows did not hide
    (all of it under ckpt). e_comm/e_upd/e_pref: how far the GradSync / UpdateShard /
    PrefetchW chains push the step beyond the main path (deadline or barrier). slot_ms: the
    steady-state time per micro-batch; bottleneck_stage: the stage that sets it.
    """
    step_ms: float
    t_1f1b_ms: float
    e_comm_ms: float
    e_upd_ms: float
    e_pref_ms: float
    e_rec_ms: float
    exposed_tail_ms: float
    slot_ms: float
    bottleneck_stage: int

    def to_json(self) -> dict:
        return dict(self.__dict__)


def _stage_sums(kinds: list[LayerKind]) -> tuple[float, float, float]:
    f = b = r = 0.0
    for k in kinds:
        f += k.forward
        b += k.backward
        r += k.recompute
    return f, b, r


def _main_path(path: list[float], slot_loads: list[float], X: float, A: int) -> tuple[float, float, int]:
    """1F1B main path (ms): micro-batch 0's round trip through every stage (``path``: per
    stage F + B + the recovery it exposes, plus 2X per boundary), then one increment per further
    micro-batch. Micro-batch m can only follow m-1 as fast as the busiest of the stages it is
    still alone on allows: the last m stages while the pipeline fills (stage P-1 runs F(m) only
    after B(m-1)), the busiest stage of all once m >= P (``slot_loads``: all compute work per
    micro-batch), and never faster than the last stage's load plus the gradient's round trip
    2X through the half-duplex ports (docs/CHOICES.md, "ratrain simulator").
    Returns (T, steady slot, busiest stage)."""
    P = len(path)
    q = max(range(P), key=slot_loads.__getitem__)
    # the last stage runs F(m) right after B(m-1) with nothing in flight to cover the gradient's
    # round trip; stages before it hold min(P - p, A) micro-batches and absorb it
    floor = slot_loads[-1] + (2 * X if P > 1 else 0.0)
    total = sum(path) + 2 * (P - 1) * X
    best = floor
    for m in range(1, min(A - 1, P - 1) + 1):       # filling: suffix maxima of the loads
        load = slot_loads[P - m]
        if load > best:
            best = load
        total += best
    slot = max(floor, slot_loads[q])
    if A > P:
        total += (A - P) * slot
    return total, slot, q


def _hidden_recovery(window: float, recs: list[float]) -> float:
    """Recovery that fits a window, whole R tasks in backward order (last layer first)."""
    used = 0.0
    for r in reversed(recs):
        if used + r > window + 1e-9:
            break
        used += r
    return used


def _serial_recovery(recs: list[float], bwds: list[float], cap: int | None, overlaps: bool) -> float:
    """Recovery a ``cap``-layer buffer leaves on the backward path of one micro-batch. In backward
    order, recovery k (k >= cap) starts when backward k - cap frees its slot; on a resource of its
    own (``overlaps``) it runs beside backwards k-cap+1..k-1 and only its overflow is exposed."""
    if cap is None:
        return 0.0
    rb, bb = recs[::-1], bwds[::-1]
    return sum(max(0.0, rb[k] - (sum(bb[k - cap + 1:k]) if overlaps else 0.0)) for k in range(cap, len(rb)))


def _fsr_loads(f: list[float], b: list[float], recs: list[list[float]], last_fwd: list[float], X: float,
               resource: str, buffer_layers: int | None = None,
               bwds: list[list[float]] | None = None) -> tuple[list[float], list[float]]:
    """FSR (Eq. 7): per stage, (steady-state compute load per micro-batch, exposed recovery on
    the fill/drain path).

    On ``compute`` recovery is compute work wherever it runs: hiding it in a window only means
    the stage had idle time, so every stage's slot load is F + B + R (as under ckpt). What FSR
    saves is the pipeline bubbles: stages before the last recover the first micro-batch in
    their warm-up wait and the last ones in their cool-down waits; the last stage runs F(m)
    immediately before B(m), has no window, and exposes its recovery on the path.
    On ``ddr`` recovery overlaps compute. The last stage can recover layer l only after F(m, l)
    (its B(m) follows F(m) at once): R(m, l) runs during F(m, l+1..), and what the chain has
    not finished when F(m) ends is exposed (at least the last layer's recovery). Earlier stages
    recover micro-batch m between B(m-1)'s end and B(m)'s start (their F plus idle time), in
    whole R tasks, last layer first; the rest is exposed and lengthens the slot (fixed point).
    A recovery buffer of ``buffer_layers`` layers (None: unbounded) lets only a micro-batch's last
    that-many layers be recovered ahead; every other recovery waits for a backward to free a slot
    and then sits on the backward path (``_serial_recovery``; per-layer backward times ``bwds``)."""
    P = len(f)
    bwds = bwds or [[0.0] * len(r) for r in recs]
    # stages alike share their lists (main_path passes one per layer shape): each shape's sums once
    each: dict = {}
    rsum, serial = [0.0] * P, [0.0] * P
    for p in range(P):
        key = (id(recs[p]), id(bwds[p]))
        got = each.get(key)
        if got is None:
            got = each[key] = (sum(recs[p]), _serial_recovery(recs[p], bwds[p], buffer_layers, resource != "compute"))
        rsum[p], serial[p] = got
    if resource == "compute":
        return [f[p] + b[p] + rsum[p] for p in range(P)], serial[:-1] + [rsum[-1]]
    ahead = [r if buffer_layers is None else r[len(r) - min(buffer_layers, len(r)):] for r in recs]
    fend = rend = 0.0
    first_ahead = len(recs[-1]) - len(ahead[-1])
    for i, (fw, r) in enumerate(zip(last_fwd, recs[-1], strict=False)):
        fend += fw
        if i >= first_ahead:
            rend = max(fend, rend) + r
    e_last = serial[-1] + (max(0.0, rend - fend) if sum(ahead[-1]) > 0 else 0.0)
    e = serial[:-1] + [e_last]
    for _ in range(8):
        slot = max(f[p] + b[p] + e[p] for p in range(P))
        slot = max(slot, f[-1] + b[-1] + e[-1] + (2 * X if P > 1 else 0.0))
        new = [sum(ahead[p]) - _hidden_recovery(slot - b[p] - e[p], ahead[p]) + serial[p]
               for p in range(P - 1)] + [e_last]
        new = [max(x, y) for x, y in zip(new, e, strict=False)]
        if all(abs(x - y) < 1e-9 for x, y in zip(new, e, strict=False)):
            break
        e = new
    return [f[p] + b[p] + e[p] for p in range(P)], e


def _deadline_chains(kinds: list[LayerKind], ready: list[float], ff: list[float], X: float,
                     has_send: bool, prefetch_link: bool
                     ) -> tuple[tuple[list[float], list[float], list[float]], float, float]:
    """``_deadline_chains_events``' result, from ``_chains_without_prefetch`` where that applies and is exact."""
    if not prefetch_link and not any(k.prefetch for k in kinds):
        got = _chains_without_prefetch(kinds, ready, ff, X, has_send)
        if got is not None:
            return got
    return _deadline_chains_events(kinds, ready, ff, X, has_send, prefetch_link)


# two instants the event loop's tolerance (1e-12, plus rounding) could merge are closer than this
_SEPARATION = 1e-11


def _chains_without_prefetch(kinds: list[LayerKind], ready: list[float], ff: list[float], X: float,
                             has_send: bool
                             ) -> tuple[tuple[list[float], list[float], list[float]], float, float] | None:
    """``_deadline_chains_events`` when no layer has PrefetchW work and PrefetchW is not on the link (the
    planner's usual stage): the link then holds GradSync alone, first come first served whatever DDR does,
    and DDR runs UpdateShard earliest deadline first as the GradSyncs release it, so each resource is one
    queue walked once. That is the event loop's schedule unless two of its instants are within its
    tolerance of each other (it merges them): then, or for a duration the clock cannot resolve, None."""
    n = len(kinds)
    inf = float("inf")
    gd = [k.gradsync for k in kinds]
    g_end = [0.0] * n
    order = sorted([(ready[j], -j) for j in range(n) if gd[j] != 0])
    m = len(order)
    now = -inf
    i = c = 0
    held: list[tuple[float, int]] = []     # checked before the last Send, too long to end by then: they wait
    link_start = inf
    if has_send:
        # until the Send is done only a GradSync that ends by the stage's last backward may start, the first
        # such in queue order; one that does not fit at some instant never will (time only grows), so each
        # is checked once
        while now < X:
            if c == i:
                if i == m:
                    break
                if order[i][0] > now:
                    now = order[i][0]
                    if now >= X:
                        break
            while i < m and order[i][0] <= now:
                i += 1
            while c < i and now + gd[-order[c][1]] > 1e-9:
                held.append(order[c])
                c += 1
            if c < i:               # it fits: it runs now
                mj = order[c][1]
                c += 1
                end = g_end[-mj] = now + gd[-mj]
                if not end > now:
                    return None
                link_start = min(link_start, now)
                now = end
            else:
                now = order[i][0] if i < m and order[i][0] < X else X
        if held and now < X:
            now = X
    # then first come first served, the held ones first (they came first)
    free = now
    for t, mj in held + order[c:] if held else order[c:]:
        s = t if t > free else free
        end = s + gd[-mj]
        if not end > s:
            return None
        g_end[-mj] = end
        if s < link_start:
            link_start = s
        free = end
    # the link runs them one after another, each ending after it starts: the last to end is the last run
    link_end = free if m else -inf
    # the instants the event loop would visit: every ready time, end and the last Send's end (a start is one
    # of those)
    instants = [r for r, _ in order] + [g_end[-mj] for _, mj in order]
    if has_send:
        instants.append(X)
    for j in range(n):
        if gd[j] == 0:
            g_end[j] = ready[j]
            instants.append(ready[j])
    # DDR: UpdateShard(j) ready when GradSync(j) ends (a zero-length one is done when ready); a zero-length
    # UpdateShard (and every PrefetchW) is done when ready
    ud = [k.update for k in kinds]
    u_end = [g_end[j] if ud[j] == 0 else 0.0 for j in range(n)]
    released = sorted([(g_end[j], j) for j in range(n) if ud[j] != 0])
    heap: list[tuple[float, int]] = []             # the ready ones by deadline (next Forward: lowest layer)
    i, now, m = 0, -inf, len(released)
    while i < m or heap:
        if not heap:
            r, j = released[i]
            if r > now:
                now = r
            if i + 1 == m or released[i + 1][0] > now:     # it alone is ready when DDR is free
                i += 1
                end = now + ud[j]
                if not end > now:
                    return None
                instants.append(end)
                u_end[j] = now = end
                continue
        while i < m and released[i][0] <= now:
            j = released[i][1]
            heappush(heap, (ff[j], j))
            i += 1
        _, j = heappop(heap)
        end = now + ud[j]
        if not end > now:
            return None
        instants.append(end)
        u_end[j] = now = end
    # the check: no two distinct instants closer than the event loop's tolerance
    instants.sort()
    for a, b in zip(instants, instants[1:], strict=False):
        if 0.0 < b - a <= _SEPARATION:       # (b - a is 0 only when b == a: floats underflow gradually)
            return None
    return (g_end, u_end, u_end), link_end, link_start    # PrefetchW's ends are UpdateShard's: one list


def _deadline_chains_events(kinds: list[LayerKind], ready: list[float], ff: list[float], X: float,
                            has_send: bool, prefetch_link: bool
                            ) -> tuple[tuple[list[float], list[float], list[float]], float, float]:
    """Deadline mode as the simulator runs it: GradSync(l) on the link, UpdateShard(l) on DDR,
    PrefetchW(l) on the link (``prefetch_link``) or DDR. Each resource is non-preemptive and work
    conserving; UpdateShard/PrefetchW start earliest deadline first (next Forward(l), i.e. the
    lowest layer); GradSync too when PrefetchW shares the link, else in ready order. Zero-length
    tasks occupy nothing. A link task that would overrun the stage's last boundary Send ([0, X]
    on stages p > 0) must fit before it or wait. Returns per layer the (GradSync, UpdateShard,
    PrefetchW) ends, and the end and start of the stage's link work.

    The planner runs this for every stage of every finalist, so the event loop is written for speed: one
    branch per resource, each queued task carrying its duration, and a task that an end makes ready queued
    at once (only the initial ready times wait, in a sorted list). The order of events, and so every
    number, is that of a plain loop moving every task through one pending heap."""
    n = len(kinds)
    inf = float("inf")
    g_end, u_end, w_end = [0.0] * n, [0.0] * n, [0.0] * n
    ends = (g_end, u_end, w_end)
    gd, ud, wd = [k.gradsync for k in kinds], [k.update for k in kinds], [k.prefetch for k in kinds]
    dur = (gd, ud, wd)
    w_on_link = prefetch_link
    # tasks not yet ready as (ready time, G/U/W index, layer); ready ones per resource as (EDF key, index,
    # layer, duration), the key (deadline, layer), or for GradSync alone on the link FIFO (ready time, upper
    # layer first); the entries are distinct, so a queue's order is that of its entries alone
    pending = [(ready[j], 0, j) for j in range(n) if gd[j] != 0]
    link_q: list = []
    ddr_q: list = []
    on_link = len(pending)                   # tasks waiting for the link, ready or not
    free_link = free_ddr = -inf
    link_end, link_start = -inf, inf
    events: list = []
    for j in range(n):                       # zero-length GradSyncs are done when ready
        if gd[j] == 0:
            t = g_end[j] = ready[j]
            if ud[j] != 0:
                pending.append((t, 1, j))
            else:
                u_end[j] = t
                if wd[j] != 0:
                    pending.append((t, 2, j))
                    on_link += w_on_link
                else:
                    w_end[j] = t
    pending.sort(reverse=True)               # only these wait for a ready time: a list, next last
    now = -inf
    while pending or link_q or ddr_q or events:
        tol = now + 1e-12
        while pending and pending[-1][0] <= tol:
            t, c, j = pending.pop()
            if c == 0:
                heappush(link_q, (ff[j], j, 0, j, gd[j]) if prefetch_link else (t, -j, 0, j, gd[j]))
            elif c == 1:
                heappush(ddr_q, (ff[j], j, 1, j, ud[j]))
            else:
                heappush(link_q if w_on_link else ddr_q, (ff[j], j, 2, j, wd[j]))
        again = False       # a task started that ends within the tolerance: its resource may start another now
        if free_link <= tol and link_q:
            if has_send and now < X:
                # transfers keep priority: only a task that ends before the last Send may start, the first
                # such in queue order (the queue's least entry if it qualifies)
                if now + link_q[0][4] <= 1e-9:
                    task = heappop(link_q)
                else:
                    task = min((x for x in link_q if now + x[4] <= 1e-9), default=None)
                    if task is not None:
                        link_q.remove(task)
                        heapify(link_q)
            else:
                task = heappop(link_q)
            if task is not None:
                _, _, c, j, d = task
                end = free_link = now + d
                on_link -= 1
                if now < link_start:
                    link_start = now
                if end > link_end:
                    link_end = end
                heappush(events, (end, c, j))
                again = end <= tol
        if free_ddr <= tol and ddr_q:
            _, _, c, j, d = heappop(ddr_q)
            end = free_ddr = now + d
            heappush(events, (end, c, j))
            again = again or end <= tol
        if again:
            continue
        # (else another pass at this instant would start nothing: no task became ready, and each resource
        # is busy or has no task it may start)
        # the next instant anything can change: an end, a ready time, a resource freed, the last Send done
        nxt = events[0][0] if events else inf
        if pending and pending[-1][0] < nxt:
            nxt = pending[-1][0]
        if tol < free_link < nxt:
            nxt = free_link
        if tol < free_ddr < nxt:
            nxt = free_ddr
        if has_send and now < X and on_link and X < nxt:
            nxt = X
        now = nxt
        tol = now + 1e-12
        while events and events[0][0] <= tol:
            t, c, j = heappop(events)
            ends[c][j] = t
            while c < 2:                     # the chain's next nonzero task becomes ready now
                c += 1
                d = dur[c][j]
                if d != 0:
                    # ready now (t is within the tolerance): straight to its resource's queue
                    if c == 1:
                        heappush(ddr_q, (ff[j], j, 1, j, d))
                    elif w_on_link:
                        heappush(link_q, (ff[j], j, 2, j, d))
                        on_link += 1
                    else:
                        heappush(ddr_q, (ff[j], j, 2, j, d))
                    break
                ends[c][j] = t               # zero-length: done when ready
    return ends, link_end, link_start


def _stage_life(kinds: list[LayerKind], bprime: list[float], X: float, mode: str,
                has_send: bool, prefetch_link: bool = False
                ) -> tuple[tuple[float, float, float], float, float | None, float, tuple[float, float | None]]:
    """One stage's GradSync -> UpdateShard -> PrefetchW chains, times relative to the end of the
    stage's last backward (``end``); forward starts relative to the stage's first F.

    Returns (worst[v], all_g, first_g, link_end, ddr_ends): for the variants v = GradSync only,
    + UpdateShard, + PrefetchW, the largest ``chain end - (end - first F)`` that the deadline
    (mode 'deadline': next Forward(l) waits for PrefetchW(l)) or the stage barrier (modes
    'barrier': layer-wise GradSync then a bulk update/prefetch phase, and 'bulk': everything
    after the stage's last backward) imposes, as an offset to add to ``end - start``; the end of
    the last GradSync and the start of the first (relative to ``end``); the end of all of the
    stage's link work (the last GradSync, or the last PrefetchW if ``prefetch_link``); the end of
    the last UpdateShard and of the last DDR-resident PrefetchW (None on the link).

    GradSync(l) is ready when layer l's last backward ends (bulk: all at ``end``); alone on the
    link they run in that order. Transfers have priority: a link task that would overrun the
    stage's last boundary Send (ready at ``end`` on stages p > 0) waits until that Send is done.
    Deadline mode replays the simulator's queues (``_deadline_chains``: earliest deadline first
    for UpdateShard/PrefetchW, and for GradSync too when PrefetchW shares the link); the barrier
    modes run all updates after the last GradSync, then all PrefetchWs back to back."""
    n = len(kinds)
    if mode != "bulk":
        # layer j's last B ends before layers j-1..0 run theirs (the sums in layer order, as a running total)
        ready = [-a for a in accumulate(bprime[:-1], initial=0.0)]
    else:
        ready = [0.0] * n
    if mode == "deadline":
        ff = list(accumulate([k.forward for k in kinds[:-1]], initial=0.0))
        # the chains as the resources run them (with PrefetchW on the link, GradSync ends include
        # its interference; E_comm/E_upd/E_pref split the joint schedule)
        ends, link_end, first = _deadline_chains(kinds, ready, ff, X, has_send, prefetch_link)
        g_ends, u_ends, w_ends = ends
        # without PrefetchW work its ends are UpdateShard's, handed over as the same list: reduced once
        same = w_ends is u_ends
        u = max([e_j - ff_j for e_j, ff_j in zip(u_ends, ff, strict=True)])
        worst = (max([e_j - ff_j for e_j, ff_j in zip(g_ends, ff, strict=True)]), u,
                 u if same else max([e_j - ff_j for e_j, ff_j in zip(w_ends, ff, strict=True)]))
        u_all = max(u_ends)
        return worst, max(g_ends), (first if first < float("inf") else None), link_end, \
            (u_all, None if prefetch_link else u_all if same else max(w_ends))
    link = -float("inf")
    first_g = None
    for j in range(n - 1, -1, -1):
        g = kinds[j].gradsync
        st = ready[j] if ready[j] > link else link
        if has_send and g > 0 and st < X and st + g > 1e-9:
            st = X
        if first_g is None and g > 0:
            first_g = st
        link = st + g
    all_g = link
    u = sum(k.update for k in kinds)
    w = sum(k.prefetch for k in kinds)
    link_end = all_g + u + w if (prefetch_link and w > 0) else all_g
    if prefetch_link and w > 0 and first_g is None:
        first_g = all_g + u         # the first link task is a PrefetchW
    return (all_g, all_g + u, all_g + u + w), all_g, first_g, link_end, \
        (all_g + u, None if prefetch_link else all_g + u + w)


@dataclass
class MainPath:
    """The first half of ``step_breakdown``: the 1F1B main path with recovery (``t_main_ms``), a lower
    bound of the step (the lifecycle chains only add to it), and what the chains' half needs."""
    stages: list[list[LayerKind]]
    X: float
    policy: str
    shapes: dict
    sig: list
    f: list[float]
    b0: list[float]
    rsum: list[float]
    share: list[float]
    t_1f1b_ms: float
    t_main_ms: float
    slot_ms: float
    bottleneck_stage: int


def step_breakdown(stages: list[list[LayerKind]], transfer_ms: float, accum: int, *, activation: str = "fsr",
                   layerwise: bool = True, update_prefetch: bool = True, fsr: bool = True,
                   recovery_resource: str = "compute", fsr_buffer_layers: int | None = FSR_BUFFER_LAYERS,
                   prefetch_resource: str = PREFETCH_RESOURCE) -> StepBreakdown:
    """Analytic T_step (Eq. 11-12) of one replica from its per-stage layer kinds; no simulation.

    ``activation``/``fsr`` follow ``ratrain.sim.simulator.Mechanisms`` (fsr off = backward-time
    recovery); ``layerwise``/``update_prefetch`` select the lifecycle mode; ``recovery_resource``
    is where FSR recovery runs ('compute' or 'ddr', as in PipelineCosts); ``fsr_buffer_layers`` the
    recovery buffer's capacity in layers (Mechanisms.fsr_buffer_layers); ``prefetch_resource``
    where PrefetchW runs ('link', as ``pipeline_costs`` builds it, or 'ddr')."""
    main = main_path(stages, transfer_ms, accum, activation=activation, fsr=fsr,
                     recovery_resource=recovery_resource, fsr_buffer_layers=fsr_buffer_layers)
    return lifecycle_tail(main, layerwise=layerwise, update_prefetch=update_prefetch,
                          recovery_resource=recovery_resource, prefetch_resource=prefetch_resource)


def main_path(stages: list[list[LayerKind]], transfer_ms: float, accum: int, *, activation: str = "fsr",
              fsr: bool = True, recovery_resource: str = "compute",
              fsr_buffer_layers: int | None = FSR_BUFFER_LAYERS) -> MainPath:
    """``step_breakdown``'s main path (arguments as there): cheap next to the lifecycle chains, and
    ``t_main_ms`` <= the step, so the planner ranks on it before it runs the chains."""
    P = len(stages)
    X = transfer_ms if P > 1 else 0.0
    policy = "ckpt" if (activation == "fsr" and not fsr) else activation
    # stages built by stage_kinds share LayerKind objects: sum each distinct shape once
    shapes: dict = {}
    sig = []
    for kinds in stages:
        key = (len(kinds), id(kinds[0]), id(kinds[-1]))
        if key not in shapes:
            fs, bs, rs = _stage_sums(kinds)
            shapes[key] = (fs, bs, rs if policy != "full" else 0.0,
                           [k.recompute if policy != "full" else 0.0 for k in kinds], [k.backward for k in kinds])
        sig.append(key)
    f = [shapes[k][0] for k in sig]
    b0 = [shapes[k][1] for k in sig]
    rsum = [shapes[k][2] for k in sig]
    base = [f[p] + b0[p] for p in range(P)]
    t_1f1b, _, _ = _main_path(base, base, X, accum)
    if policy == "ckpt":
        path = slot_loads = [base[p] + rsum[p] for p in range(P)]
        share = [1.0] * P
    elif policy == "fsr":
        recs = [shapes[k][3] for k in sig]
        slot_loads, e = _fsr_loads(f, b0, recs, [k.forward for k in stages[-1]], X, recovery_resource,
                                   fsr_buffer_layers, [shapes[k][4] for k in sig])
        path = [base[p] + e[p] for p in range(P)]
        share = [e[p] / rsum[p] if rsum[p] > 0 else 0.0 for p in range(P)]
    else:
        path = slot_loads = base
        share = [0.0] * P
    t_main, slot, q = _main_path(path, slot_loads, X, accum)
    return MainPath(stages, X, policy, shapes, sig, f, b0, rsum, share, t_1f1b, t_main, slot, q)


def _runs(kinds: list[LayerKind], recs: list[float]) -> tuple:
    """A stage's layers as runs of one LayerKind: (forward, backward, recovery, GradSync, UpdateShard,
    PrefetchW, layers) each, what ``_stage_life`` reads of them (a layer's recovery follows from its kind)."""
    out, start = [], 0
    for _, run in groupby(kinds, key=id):         # the same object: one kind
        n = sum(1 for _ in run)
        k = kinds[start]
        out.append((k.forward, k.backward, recs[start], k.gradsync, k.update, k.prefetch, n))
        start += n
    return tuple(out)


def lifecycle_tail(main: MainPath, *, layerwise: bool = True, update_prefetch: bool = True,
                   recovery_resource: str = "compute", prefetch_resource: str = PREFETCH_RESOURCE,
                   chains: dict | None = None) -> StepBreakdown:
    """``step_breakdown``'s second half: the GradSync -> UpdateShard -> PrefetchW chains of every stage
    against the main path ``main``, and the step (arguments as in ``step_breakdown``). ``chains``: a memo
    of stage chains by everything they read, shared by the estimates that pass the same dict (the
    planner's finalists: layouts that differ elsewhere often run the same stage chains)."""
    if prefetch_resource not in ("ddr", "link"):
        raise ConfigError(f"step_breakdown: prefetch_resource must be 'ddr' or 'link', got {prefetch_resource!r}")
    link_w = prefetch_resource == "link"
    stages, X, policy, shapes, sig = main.stages, main.X, main.policy, main.shapes, main.sig
    f, b0, rsum, share = main.f, main.b0, main.rsum, main.share
    t_1f1b, t_main, slot, q = main.t_1f1b_ms, main.t_main_ms, main.slot_ms, main.bottleneck_stage
    P = len(stages)
    starts, ends = [0.0] * P, [0.0] * P
    acc = 0.0
    for p in range(P):
        starts[p] = acc
        acc += f[p] + X
    ends[0] = t_main
    for p in range(1, P):
        ends[p] = ends[p - 1] - X - b0[p - 1] - share[p - 1] * rsum[p - 1]
    mode = "deadline" if (layerwise and update_prefetch) else ("barrier" if layerwise else "bulk")
    bounds = [t_main, t_main, t_main]
    memo: dict = {}
    for p, kinds in enumerate(stages):
        key = (sig[p], share[p], p > 0)
        got = memo.get(key)
        if got is None:
            s = share[p]
            recs = shapes[sig[p]][3]
            # zero-length PrefetchWs occupy nothing: the link then holds GradSync alone (FIFO)
            args = (X, mode, P > 1 and p > 0, link_w and any([k.prefetch > 0 for k in kinds]))
            if chains is None:
                got = _stage_life(kinds, [k.backward + s * r for k, r in zip(kinds, recs, strict=True)], *args)
            else:
                # everything a chain reads, the stage's layers as runs of one kind (a few runs, not a tuple a layer)
                inputs = (_runs(kinds, recs), s, args)
                got = chains.get(inputs)
                if got is None:
                    got = chains[inputs] = _stage_life(
                        kinds, [k.backward + s * r for k, r in zip(kinds, recs, strict=True)], *args)
            memo[key] = got
        worst, all_g, first_g, link_end, ddr_ends = got
        span = ends[p] - starts[p]
        for v in range(3):
            if worst[v] + span > bounds[v]:
                bounds[v] = worst[v] + span
        if first_g is not None:        # the step's link work must clear the next step's
            # (GradSync's share bounds E_comm; link-resident PrefetchW's the whole step)
            if P > 1:
                first_port = starts[p] - X if p > 0 else f[0]
                bounds[0] = max(bounds[0], all_g + ends[p] - first_port)
                bounds[2] = max(bounds[2], link_end + ends[p] - first_port)
            else:
                bounds[0] = max(bounds[0], all_g - first_g)
                bounds[2] = max(bounds[2], link_end - first_g)
        if policy == "fsr" and recovery_resource == "ddr":
            # DDR-resident state tasks that spill past T must clear the next step's first recovery
            # there, R(0, first layer) right after F(0, first layer)
            first_r = starts[p] + kinds[0].forward
            if any(k.update > 0 for k in kinds):
                bounds[1] = max(bounds[1], ddr_ends[0] + ends[p] - first_r)
            if ddr_ends[1] is not None and any(k.prefetch > 0 for k in kinds):
                bounds[2] = max(bounds[2], ddr_ends[1] + ends[p] - first_r)
    t_g = bounds[0]
    t_gu = max(t_g, bounds[1])
    t_all = max(t_gu, bounds[2])
    return StepBreakdown(step_ms=t_all, t_1f1b_ms=t_1f1b, e_comm_ms=t_g - t_main, e_upd_ms=t_gu - t_g,
                         e_pref_ms=t_all - t_gu, e_rec_ms=t_main - t_1f1b, exposed_tail_ms=t_all - t_main,
                         slot_ms=slot, bottleneck_stage=q)


# ---------------------------------------------------------------- other pipeline schedules

def interleaved_port_transfers(stages: int, virtual_stages: int) -> int:
    """Boundary transfers the busiest stage's port carries per micro-batch under interleaving (forward
    and backward): every chunk boundary g -> g+1 of the P*v chunks occupies the ports of the stages of
    both chunks (the simulator's transfers are joint jobs on both ports)."""
    touch = [0] * stages
    for g in range(stages * virtual_stages - 1):
        touch[g % stages] += 1
        touch[(g + 1) % stages] += 1
    return 2 * max(touch)


def schedule_step_breakdown(stages: list[list[LayerKind]], transfer_ms: float, accum: int, *,
                            schedule: str | PipelineSchedule = "1f1b", weight_ms: list[float] | None = None,
                            **kwargs) -> StepBreakdown:
    """Analytic T_step under a pipeline schedule: ``step_breakdown``'s 1F1B estimate of the same
    stages (``stages``: each stage's layers, all its chunks under interleaving), with the main path's
    bubble rescaled; the exposed lifecycle tail (E_comm + E_upd + E_pref) is kept as 1F1B's.

    With T the 1F1B main path, s its steady slot, X a boundary transfer and P stages, the bubble beyond
    the transfers on the fill path is b = max(0, T - A s - 2(P-1)X). Then
      1f1b, gpipe:  T (GPipe's fill and drain cost the same (P-1) slots);
      interleaved:  A s' + b / v + 2(Pv-1)X, s' = max(s, n X) with n the busiest port's transfers per
                    micro-batch (``interleaved_port_transfers``): v chunks shrink the bubble v-fold but
                    put v times the boundary transfers on the path and the ports;
      zb-h1:        A s + b (1 - 2W/s) + 2(P-1)X, W the bottleneck stage's weight-gradient ms per
                    micro-batch (``weight_ms``): the zero-bubble paper's H1 bubble (P-1)(F + B - 2W)
                    against 1F1B's (P-1)(F + B), B the whole backward.
    docs/CHOICES.md ("Schedules in the planner") states the error against the simulator."""
    main_kw = {k: kwargs[k] for k in ("activation", "fsr", "recovery_resource", "fsr_buffer_layers") if k in kwargs}
    tail_kw = {k: v for k, v in kwargs.items() if k not in main_kw}
    one = main_path(stages, transfer_ms, accum, **main_kw)
    main, slot = schedule_main_path(one, accum, schedule, weight_ms)
    return schedule_tail(one, main, slot, schedule, **tail_kw)


def schedule_main_path(one: MainPath, accum: int, schedule: str | PipelineSchedule = "1f1b",
                       weight_ms: list[float] | None = None) -> tuple[float, float]:
    """``schedule_step_breakdown``'s main path under ``schedule`` from the 1F1B one ``one``: (ms, the
    steady slot). The lifecycle tail only adds to it, so it bounds the step from below."""
    sched = PipelineSchedule.of(schedule)
    if sched.name in ("1f1b", "gpipe"):
        return one.t_main_ms, one.slot_ms
    P = len(one.stages)
    X = one.X
    t_main = one.t_1f1b_ms + (one.t_main_ms - one.t_1f1b_ms)     # as StepBreakdown's t_1f1b + e_rec
    slot = one.slot_ms
    fill = 2 * (P - 1) * X
    bubble = max(0.0, t_main - accum * slot - fill)
    if sched.name == "interleaved":
        v = sched.virtual_stages
        slot = max(slot, interleaved_port_transfers(P, v) * X) if P > 1 else slot
        return accum * slot + bubble / v + 2 * (P * v - 1) * X, slot
    if weight_ms is None or len(weight_ms) != P:
        raise ConfigError("schedule_step_breakdown: zb-h1 needs weight_ms, one weight-gradient time per stage")
    w = weight_ms[one.bottleneck_stage]
    return accum * slot + bubble * max(0.0, 1.0 - 2.0 * w / slot if slot > 0 else 1.0) + fill, slot


def schedule_tail(one: MainPath, main: float, slot: float, schedule: str | PipelineSchedule = "1f1b",
                  **kwargs) -> StepBreakdown:
    """``schedule_step_breakdown``'s second half: 1F1B's lifecycle tail (``lifecycle_tail`` of ``one``,
    arguments as there) on the schedule's main path ``main`` and slot ``slot``."""
    bd = lifecycle_tail(one, **kwargs)
    if PipelineSchedule.of(schedule).name in ("1f1b", "gpipe"):
        return bd
    t_main = bd.t_1f1b_ms + bd.e_rec_ms
    tail = bd.step_ms - t_main
    return StepBreakdown(step_ms=main + tail, t_1f1b_ms=main - bd.e_rec_ms, e_comm_ms=bd.e_comm_ms,
                         e_upd_ms=bd.e_upd_ms, e_pref_ms=bd.e_pref_ms, e_rec_ms=bd.e_rec_ms, exposed_tail_ms=tail,
                         slot_ms=slot, bottleneck_stage=bd.bottleneck_stage)
