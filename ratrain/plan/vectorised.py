"""The planner's analytic pass over arrays of candidate configurations: Eq. 10's memory check,
the per-layer cost terms and the 1F1B main path (the lower bound the planner ranks on) in NumPy.

Each function is a closed form of a scalar one, written with the same floating-point operations in
the same order, so that every number is bit-identical to it (tests/test_vectorised_planner.py pins
that): ``peak_bytes`` is ``ratrain.spec.memory.PeakMemory.peak``, ``kind_arrays`` is
``ratrain.cost.terms.cost_terms`` (MT-3000's one link, dense layers, CP = EP = 1; other cases stack
the scalar terms), ``main_path_ms`` is ``ratrain.plan.estimator.main_path``'s ``t_main_ms`` with
recovery on compute. Sequential sums stay sequential: ``np.cumsum`` adds in order, as Python's
``sum`` and ``+=`` loops do (``np.sum`` would add pairwise).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ratrain.cost.terms import ADAM_BYTES_PER_PARAM, CostTerms, LayerKind, _profile_ms
from ratrain.spec.memory import MemoryConstants, PeakMemory
from ratrain.spec.models import FP16, ModelSpec, layer_tp_parameter_count, stage_edge_parameters
from ratrain.spec.parallel import ACTIVATION_POLICIES, PREFETCH_POLICIES
from ratrain.spec.platform import TrainingPlatform

KINDS = ("mid", "first", "last", "only")
FIELDS = ("forward", "backward", "recompute", "gradsync", "update", "prefetch", "params")
SUMMED = FIELDS[:3]         # what the main path sums over a stage's layers
FULL, CKPT, FSR = (ACTIVATION_POLICIES.index(a) for a in ("full", "ckpt", "fsr"))
LAYERWISE = PREFETCH_POLICIES.index("layerwise")
_ACTIVATION = {a: i for i, a in enumerate(ACTIVATION_POLICIES)}
_PREFETCH = {p: i for i, p in enumerate(PREFETCH_POLICIES)}
COLUMNS = ("pp", "dp", "tp", "zero", "micro_batch", "accum", "activation", "prefetch")


@dataclass
class Grid:
    """Candidate configurations as columns (int64; activation and prefetch as indices into
    ``ACTIVATION_POLICIES`` and ``PREFETCH_POLICIES``), all of one sequence length."""
    pp: np.ndarray
    dp: np.ndarray
    tp: np.ndarray
    zero: np.ndarray
    micro_batch: np.ndarray
    accum: np.ndarray
    activation: np.ndarray
    prefetch: np.ndarray
    seq: int
    # set when the rows are every layout (P, D, T, b, A) of ``layouts`` (an L x 5 array) with every ZeRO stage of
    # ``zeros``, activation policy of ``acts`` (indices) and prefetch policy, in that order (``search_grid``'s):
    # (layouts, zeros, acts). ``peak_bytes`` then works per layout
    product: tuple | None = None

    @classmethod
    def of(cls, points: list[tuple], seq: int) -> Grid:
        """From ``search_space``'s (P, D, T, Z, b, A, activation, prefetch) tuples."""
        cols = list(zip(*points, strict=True)) if points else [()] * 8
        ints = [np.array(c, dtype=np.int64) for c in cols[:6]]
        act = np.array([_ACTIVATION[a] for a in cols[6]], dtype=np.int64)
        pref = np.array([_PREFETCH[x] for x in cols[7]], dtype=np.int64)
        p, d, t, z, b, a = ints
        return cls(p, d, t, z, b, a, act, pref, seq)

    def point(self, i: int) -> tuple:
        """Row ``i`` as ``search_space``'s (P, D, T, Z, b, A, activation, prefetch) tuple."""
        p, d, t, z, b, a, act, pref = (int(getattr(self, n)[i]) for n in COLUMNS)
        return p, d, t, z, b, a, ACTIVATION_POLICIES[act], PREFETCH_POLICIES[pref]

    def take(self, index: np.ndarray) -> Grid:
        return Grid(*(getattr(self, n)[index] for n in COLUMNS), self.seq)

    def __len__(self) -> int:
        return len(self.pp)


def _distinct(*cols: np.ndarray) -> tuple[list[tuple[int, ...]], np.ndarray]:
    """The distinct value tuples over the rows of ``cols`` and, per row, the index of its tuple."""
    code = np.zeros(len(cols[0]), dtype=np.int64)
    for c in cols:
        code = code * (int(c.max()) + 1 if len(c) else 1) + c
    _, first, inverse = np.unique(code, return_index=True, return_inverse=True)
    return [tuple(int(c[i]) for c in cols) for i in first], inverse.reshape(-1)


def _table(values: list, inverse: np.ndarray, dtype=np.int64) -> np.ndarray:
    return np.array(values, dtype=dtype)[inverse]


# ---------------------------------------------------------------- Eq. 10: memory

def _shard(count: np.ndarray, d: np.ndarray) -> np.ndarray:
    return np.ceil(count / d).astype(np.int64)      # math.ceil(count / d): the same float quotient


def _stage_bytes(model: ModelSpec, s: dict, first: np.ndarray, last: np.ndarray, n_layers: np.ndarray,
                 n_act: np.ndarray, g: Grid, constants: MemoryConstants) -> np.ndarray:
    """``ratrain.spec.memory._stage_bytes`` summed, for dense layers at CP = EP = 1 without offload: one
    stage per row (``s``: the ``_LayerBytes`` fields as arrays over the rows, ``g`` the rows' configurations)."""
    d, z, tp, act, c = g.dp, g.zero, g.tp, g.activation, constants
    m = g.micro_batch * g.seq
    layer, emb, head = s["layer_params"], s["embedding_params"], s["head_params"]
    rec = s["full"] - s["ckpt"]
    params = n_layers * layer + np.where(first, emb, 0) + np.where(last, head, 0)
    biggest = np.maximum(np.maximum(layer, np.where(first, emb, 0)), np.where(last, head, 0))
    state = (c.weight_bytes * np.where(z < 3, params, _shard(params, d))
             + c.grad_bytes * np.where(z < 2, params, _shard(params, d))
             + c.optimizer_bytes * np.where(z < 1, params, _shard(params, d)))
    tokens = n_act * m * 4 * (first.astype(np.int64) + last) + np.where(first, n_act * s["embedding_mask"], 0)
    saved = n_act * n_layers * np.where(act == FULL, s["full"], s["ckpt"]) + tokens
    recovery = np.where(act == FSR, np.minimum(c.fsr_buffer_layers, n_layers) * rec, 0)
    grad_object = np.maximum(np.maximum(layer, np.where(first, np.minimum(m, model.vocab // tp) * model.hidden, 0)),
                             np.where(last, head, 0))
    staging = c.grad_bytes * grad_object * (d > 1) if c.gradsync_staging else 0
    boundary = (2 - first.astype(np.int64) - last) * s["replicated_tokens"] * (model.hidden * FP16)
    tp_staging = (tp > 1) * (m * model.hidden * FP16)
    gathered = (z == 3) & (d > 1)
    buffers = np.where(gathered, c.weight_bytes * (biggest + np.where(g.prefetch == LAYERWISE, biggest, params)), 0)
    recompute = np.where(act == CKPT, rec, 0)
    ws = np.where(last, np.maximum(np.where(act == FULL, s["workspace_full"], s["workspace_fsr"]),
                                   s["head_workspace"]), np.where(act == FULL, s["workspace_full"], s["workspace_fsr"]))
    return state + saved + recovery + staging + boundary + tp_staging + buffers + recompute + ws \
        + c.runtime_reserve_bytes


SIZE_FIELDS = ("ckpt", "full", "workspace_fsr", "workspace_full", "head_workspace", "layer_params",
               "embedding_params", "head_params", "replicated_tokens", "embedding_mask")
EDGE_FIELDS = ("embedding_params", "head_params")     # stage_edge_parameters' (embedding, head)


def peak_bytes(memory: PeakMemory, g: Grid) -> np.ndarray:
    """``memory.peak`` of every row of ``g`` (dense model, CP = EP = 1): the largest of Eq. 9 over the
    stages that can hold the peak (``PeakMemory.representatives``), one array row per such stage (a grid of
    every layout with every ZeRO stage and policy: ``_product_peak_bytes``)."""
    if not len(g):
        return np.zeros(0, dtype=np.int64)
    if g.product is not None:
        return _product_peak_bytes(memory, g.seq, *g.product)
    depths, at = _distinct(g.pp)
    reps = [memory.representatives(pp) for (pp,) in depths]
    width = max(len(r) for r in reps)
    count = np.array([len(r) for r in reps])[at]
    rows = np.repeat(np.arange(len(g)), count)
    starts = np.concatenate(([0], np.cumsum(count)[:-1]))
    k = np.arange(len(rows)) - starts[rows]
    stage = np.array([[p for p, _ in r] + [0] * (width - len(r)) for r in reps])[at[rows], k]
    layers = np.array([[n for _, n in r] + [0] * (width - len(r)) for r in reps])[at[rows], k]
    sub = g.take(rows)
    # of the layer sizes only the stage edges depend on P (``stage_edge_parameters``, as ``_layer_bytes`` reads
    # them): the rest once per (b, T), the edges once per (T, P)
    keys, which = _distinct(sub.micro_batch, sub.tp)
    sizes = [memory.sizes(b, g.seq, t, 1) for b, t in keys]
    s = {name: _table([getattr(x, name) for x in sizes], which) for name in SIZE_FIELDS if name not in EDGE_FIELDS}
    keys, which = _distinct(sub.tp, sub.pp)
    edges = [stage_edge_parameters(memory.model, pp, t) for t, pp in keys]
    for i, name in enumerate(EDGE_FIELDS):
        s[name] = _table([e[i] for e in edges], which)
    n_act = np.minimum(sub.pp - stage, sub.accum)
    value = _stage_bytes(memory.model, s, stage == 0, stage == sub.pp - 1, layers, n_act, sub, memory.constants)
    return np.maximum.reduceat(value, starts)


def _product_peak_bytes(memory: PeakMemory, seq: int, layouts: np.ndarray, zeros: tuple[int, ...],
                        acts: tuple[int, ...]) -> np.ndarray:
    """``peak_bytes`` of every layout (P, D, T, b, A) of ``layouts`` with every ZeRO stage of ``zeros``,
    activation policy of ``acts`` and prefetch policy, in that order: ``_stage_bytes``' terms split by what
    they depend on, the stage's alone once per stage that can hold the peak, those of Z, the policies and
    the prefetch policy as small tables added by broadcasting (integers, so in any order)."""
    model, c = memory.model, memory.constants
    # the stages that can hold the peak, one row each: the layout, its stage and that stage's layer count
    lay, stage, layers, starts = [], [], [], []
    for i, pp in enumerate(layouts[:, 0].tolist()):
        starts.append(len(lay))
        for st, n in memory.representatives(pp):
            lay.append(i)
            stage.append(st)
            layers.append(n)
    # the layer sizes once per (b, T), the stage edges once per (T, P), as ``peak_bytes`` reads them
    P, D, T, B, A = layouts.T
    sizes, edges = {}, {}
    per_layout = {name: [] for name in SIZE_FIELDS}
    for pp, t, b in zip(P.tolist(), T.tolist(), B.tolist(), strict=True):
        got = sizes.get((b, t)) or sizes.setdefault((b, t), memory.sizes(b, seq, t, 1))
        edge = edges.get((t, pp)) or edges.setdefault((t, pp), stage_edge_parameters(model, pp, t))
        for name in SIZE_FIELDS:
            per_layout[name].append(getattr(got, name))
        per_layout["embedding_params"][-1], per_layout["head_params"][-1] = edge
    lay = np.array(lay, dtype=np.int64)
    s = {name: np.array(v, dtype=np.int64)[lay] for name, v in per_layout.items()}
    stage, layers = np.array(stage, dtype=np.int64), np.array(layers, dtype=np.int64)
    pp, d, tp, m = P[lay], D[lay], T[lay], B[lay] * seq
    first, last = stage == 0, stage == pp - 1
    n_act = np.minimum(pp - stage, A[lay])
    layer, emb, head = s["layer_params"], s["embedding_params"], s["head_params"]
    rec = s["full"] - s["ckpt"]
    params = layers * layer + np.where(first, emb, 0) + np.where(last, head, 0)
    biggest = np.maximum(np.maximum(layer, np.where(first, emb, 0)), np.where(last, head, 0))
    # (stage, Z): the training state
    z = np.array(zeros, dtype=np.int64)[None, :]
    whole, shard = params[:, None], _shard(params, d)[:, None]
    state = (c.weight_bytes * np.where(z < 3, whole, shard) + c.grad_bytes * np.where(z < 2, whole, shard)
             + c.optimizer_bytes * np.where(z < 1, whole, shard))
    # (stage, Z, prefetch policy): Z=3's gathered working weights and prefetch buffer
    gathered = (z == 3) & (d > 1)[:, None]
    prefetched = np.stack([biggest if i == LAYERWISE else params for i in range(len(PREFETCH_POLICIES))], axis=1)
    buffers = np.where(gathered[:, :, None], (c.weight_bytes * (biggest[:, None] + prefetched))[:, None, :], 0)
    # (stage, activation policy): activations, recovery and recompute buffers, workspace
    act = np.array(acts, dtype=np.int64)[None, :]
    tokens = n_act * m * 4 * (first.astype(np.int64) + last) + np.where(first, n_act * s["embedding_mask"], 0)
    saved = (n_act * layers)[:, None] * np.where(act == FULL, s["full"][:, None], s["ckpt"][:, None]) \
        + tokens[:, None]
    recovery = np.where(act == FSR, (np.minimum(c.fsr_buffer_layers, layers) * rec)[:, None], 0)
    recompute = np.where(act == CKPT, rec[:, None], 0)
    ws = np.where(act == FULL, s["workspace_full"][:, None], s["workspace_fsr"][:, None])
    ws = np.where(last[:, None], np.maximum(ws, s["head_workspace"][:, None]), ws)
    # (stage): the rest
    grad_object = np.maximum(np.maximum(layer, np.where(first, np.minimum(m, model.vocab // tp) * model.hidden, 0)),
                             np.where(last, head, 0))
    staging = c.grad_bytes * grad_object * (d > 1) if c.gradsync_staging else 0
    boundary = (2 - first.astype(np.int64) - last) * s["replicated_tokens"] * (model.hidden * FP16)
    tp_staging = (tp > 1) * (m * model.hidden * FP16)
    alone = staging + boundary + tp_staging + c.runtime_reserve_bytes
    value = (state[:, :, None, None] + buffers[:, :, None, :] + (saved + recovery + recompute + ws)[:, None, :, None]
             + alone[:, None, None, None])
    return np.maximum.reduceat(value, np.array(starts), axis=0).reshape(-1)


# ---------------------------------------------------------------- cost terms

def _ring_allreduce_ms(nbytes, ranks: np.ndarray, bandwidth: float, latency_s: float) -> np.ndarray:
    value = 1e3 * (2 * (ranks - 1) / ranks * nbytes / bandwidth + 2 * (ranks - 1) * latency_s)
    return np.where(ranks <= 1, 0.0, value)


def _ring_reduce_scatter_ms(nbytes, ranks: np.ndarray, bandwidth: float, latency_s: float) -> np.ndarray:
    value = 1e3 * ((ranks - 1) / ranks * nbytes / bandwidth + (ranks - 1) * latency_s)
    return np.where(ranks <= 1, 0.0, value)


@dataclass
class KindArrays:
    """Per row of a grid, the four layer kinds of ``cost_terms`` (``kinds[kind][field]``) and the
    stage transfer (ms)."""
    kinds: dict[str, dict[str, np.ndarray]]
    transfer: np.ndarray

    def take(self, index: np.ndarray) -> KindArrays:
        return KindArrays({k: {f: v[index] for f, v in fields.items()} for k, fields in self.kinds.items()},
                          self.transfer[index])

    def terms(self, i: int) -> CostTerms:
        """Row ``i`` as ``CostTerms`` (its kinds only: what ``main_path`` and ``lifecycle_tail`` read)."""
        made = [LayerKind(*[fields[f].item(i) for f in FIELDS[:-1]], fields["params"].item(i))
                for fields in (self.kinds[k] for k in KINDS)]
        return CostTerms(*made, self.transfer.item(i), {})


PROFILE_FIELDS = ("forward_s", "backward_s", "first_forward_s", "first_backward_s", "last_forward_s",
                  "last_backward_s")


def _profile_columns(g: Grid, profile_of) -> dict[str, np.ndarray]:
    keys, at = _distinct(g.micro_batch, g.tp)
    profiles = [profile_of(b, t) for b, t in keys]
    cols = {n: _table([_profile_ms(p, n) for p in profiles], at, float) for n in PROFILE_FIELDS}
    for n in ("optimizer_update", "prefetch_write"):
        cols[n] = _table([p.ddr_rate(n) for p in profiles], at, float)
    return cols


def vectorisable_terms(model: ModelSpec, platform) -> bool:
    """Whether ``kind_arrays`` has the closed form (else it stacks the scalar ``cost_terms``)."""
    return isinstance(platform, TrainingPlatform) and model.moe is None


def kind_arrays(model: ModelSpec, platform: TrainingPlatform, g: Grid, profile_of) -> KindArrays:
    """``cost_terms`` of every row of ``g`` on MT-3000 (one link for every collective), dense layers,
    CP = EP = 1; ``profile_of(b, T)`` gives the latency profile. Same operations as ``cost_terms``, the
    four kinds (mid, first, last, only) stacked as the rows of 4 x n arrays."""
    bw, lat = platform.link_bandwidth, platform.link_latency_s
    T, D, Z = g.tp, g.dp, g.zero
    m = g.micro_batch * g.seq
    act = m * model.hidden * FP16
    ar = _ring_allreduce_ms(act, T, bw, lat)
    prof = _profile_columns(g, profile_of)
    f_core, b_core = prof["forward_s"], prof["backward_s"]
    keys, at = _distinct(T, g.pp)
    layer = _table([layer_tp_parameter_count(model, t) for t, _ in keys], at)
    edges = [stage_edge_parameters(model, pp, t) for t, pp in keys]
    emb, head = _table([e for e, _ in edges], at), _table([h for _, h in edges], at)
    zero = np.zeros(len(g))
    first_f_comm, last_f_comm, last_b_comm = ar, 2 * _ring_allreduce_ms(m * 4, T, bw, lat), ar
    fx_first, bx_first = prof["first_forward_s"], prof["first_backward_s"]
    fx_last, bx_last = prof["last_forward_s"], prof["last_backward_s"]
    # per kind: (f_extra, b_extra, f_comm, b_comm, params) as in cost_terms' kind() calls
    f_extra = np.stack([zero, fx_first, fx_last, fx_first + fx_last])
    b_extra = np.stack([zero, bx_first, bx_last, bx_first + bx_last])
    f_comm = np.stack([zero, first_f_comm, last_f_comm, first_f_comm + last_f_comm])
    b_comm = np.stack([zero, zero, last_b_comm, last_b_comm])
    params = np.stack([layer, layer + emb, layer + head, layer + emb + head])
    per_use_gather = (Z == 3) & (D > 1) & (g.prefetch == LAYERWISE)
    prefetch_gather = (D > 1) & (((Z == 1) | (Z == 2)) | ((Z == 3) & (g.prefetch != LAYERWISE)))
    policy = g.activation

    fwd = f_core + 2 * ar + f_extra + f_comm
    bwd = b_core + 2 * ar + b_extra + b_comm
    rec = np.broadcast_to(f_core + 2 * ar, fwd.shape)
    gather = _ring_reduce_scatter_ms(params * FP16, D, bw, lat)
    fwd = np.where(per_use_gather, np.maximum(fwd, gather), fwd)
    bwd_g = np.where(policy == CKPT, np.maximum(bwd + rec, gather) - rec, np.maximum(bwd, gather))
    rec = np.where(per_use_gather & (policy == FSR), np.maximum(rec, gather), rec)
    bwd = np.where(per_use_gather, bwd_g, bwd)
    rec = np.where(policy == FULL, 0.0, rec)
    grad_bytes = params * FP16
    sync = np.where(D > 1, np.where(Z >= 2, _ring_reduce_scatter_ms(grad_bytes, D, bw, lat),
                                    _ring_allreduce_ms(grad_bytes, D, bw, lat)), 0.0)
    # one link: GradSync also holds it for the layer's TP all-reduces and ZeRO-3 gather
    sync = np.where(sync > 0, sync + (2 * ar + np.where(per_use_gather, gather, 0.0)), sync)
    shard = np.where(Z >= 1, np.ceil(params / D).astype(np.int64), params)
    upd = 1e3 * shard * ADAM_BYTES_PER_PARAM / prof["optimizer_update"]
    pre = np.where(prefetch_gather, np.maximum(gather, 1e3 * params * FP16 / prof["prefetch_write"]), 0.0)
    values = {"forward": fwd, "backward": bwd, "recompute": rec, "gradsync": sync, "update": upd,
              "prefetch": pre, "params": params}
    kinds = {k: {f: values[f][i] for f in FIELDS} for i, k in enumerate(KINDS)}
    return KindArrays(kinds, 1e3 * (act / bw + lat))


def stacked_kind_arrays(terms: list[CostTerms]) -> KindArrays:
    """``KindArrays`` of scalar ``cost_terms``, one per row (GPU platforms, MoE layers)."""
    kinds = {k: {f: np.array([getattr(getattr(t, k), f) for t in terms],
                             dtype=np.int64 if f == "params" else float) for f in FIELDS} for k in KINDS}
    return KindArrays(kinds, np.array([t.transfer for t in terms], dtype=float))


# ---------------------------------------------------------------- the 1F1B main path

def _pick(table: np.ndarray, columns: np.ndarray) -> np.ndarray:
    """``table[i, columns[i, j]]`` (columns below 0 read column 0; the callers mask them)."""
    return np.take_along_axis(table, np.maximum(columns, 0), axis=1)


def main_path_ms(ka: KindArrays, g: Grid, counts_of, *, fsr: bool = True, fsr_buffer_layers: int = 1
                 ) -> np.ndarray:
    """``main_path(stage_kinds(terms, partition), transfer, A, activation, fsr, 'compute',
    fsr_buffer_layers).t_main_ms`` of every row (``counts_of(P)``: the layers of each stage).

    Rows that differ only in what the main path does not read (ZeRO stage and prefetch policy, mostly)
    have the same inputs bit for bit: each distinct row is computed once."""
    if len(g) == 0:
        return np.zeros(0)
    inputs = np.stack([g.pp.astype(float), g.accum.astype(float), g.activation.astype(float), ka.transfer]
                      + [ka.kinds[k][f] for k in KINDS for f in ("forward", "backward", "recompute")], axis=1)
    first, inverse = _distinct_rows(np.ascontiguousarray(inputs).view(np.int64))
    if len(first) == len(g):
        return _main_path_ms(ka, g, counts_of, fsr, fsr_buffer_layers)
    return _main_path_ms(ka.take(first), g.take(first), counts_of, fsr, fsr_buffer_layers)[inverse]


# odd multipliers that mix a row's 64-bit columns into one key (wrapping; any collision is caught)
_MIX = np.array([(0x9E3779B97F4A7C15 * (2 * i + 1)) % 2 ** 63 | 1 for i in range(64)], dtype=np.int64)


def _distinct_rows(bits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For the rows of an int64 table: the index of one row of each distinct value, and per row which of
    those it equals (``np.unique(bits, axis=0)``'s index and inverse, in another order). Rows are told apart
    by a mixed key, then checked against their representative in full: a collision takes the exact way."""
    key = (bits * _MIX[:bits.shape[1]]).sum(axis=1)
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    if not (bits[first][inverse] == bits).all():
        _, first, inverse = np.unique(bits, axis=0, return_index=True, return_inverse=True)
        inverse = inverse.reshape(-1)
    return first, inverse


def _main_path_ms(ka: KindArrays, g: Grid, counts_of, fsr: bool, fsr_buffer_layers: int) -> np.ndarray:
    """``main_path_ms`` of every row, each computed."""
    P, A = g.pp, g.accum
    depths, at = _distinct(P)
    width_p = int(P.max())
    counts = np.array([list(counts_of(pp)) + [0] * (width_p - pp) for (pp,) in depths], dtype=np.int64)[at]
    width = max(int(counts.max()), 1)
    X = np.where(P > 1, ka.transfer, 0.0)
    policy = np.where((g.activation == FSR) & (not fsr), CKPT, g.activation)
    stage = np.arange(counts.shape[1])[None, :]
    is_first, is_last = stage == 0, stage == (P - 1)[:, None]
    alone = is_first & is_last
    # per field (forward, backward, recompute) and kind, a (3, rows) table
    mid, first, last, only = (np.stack([ka.kinds[k][f] for f in SUMMED]) for k in KINDS)
    # ``_stage_sums``' sums over a stage's layers in forward order, every field at once: [start, start + mid,
    # start + mid + mid, ...] added in order for start = the first kind (stage 0) and start = mid (the others)
    steps = np.empty((len(SUMMED), 2, len(P), width))
    steps[...] = mid[:, None, :, None]
    steps[:, 0, :, 0] = first
    sums = np.cumsum(steps, axis=-1)
    rows, after_first = np.arange(len(P))[:, None], (~is_first).astype(np.int64)
    head = sums[:, after_first, rows, np.maximum(counts - 1, 0)]
    before = sums[:, after_first, rows, np.maximum(counts - 2, 0)]
    # the last stage its layers but the last then the last kind, one layer alone ``only``
    with_last = np.where(counts >= 2, before + last[:, :, None], last[:, :, None])
    value = np.where(is_last, with_last, head)
    value = np.where(alone & (counts == 1), only[:, :, None], value)
    f, b0, recompute = np.where(counts > 0, value, 0.0)
    rsum = np.where((policy == FULL)[:, None], 0.0, recompute)
    base = f + b0
    # FSR on compute: stages before the last expose the recovery their buffer cannot hold ahead
    # (``_serial_recovery``: the reversed recomputes from index ``fsr_buffer_layers`` on), the last all;
    # reversed, stage 0 holds its mids then the first layer's
    cap = fsr_buffer_layers
    mids = sums[SUMMED.index("recompute"), 1]
    k = counts - cap - is_first
    tail = np.where(k >= 1, _pick(mids, k - 1), 0.0)
    first_rec = first[SUMMED.index("recompute")][:, None]
    serial = np.where(is_first, np.where(counts > cap, np.where(k >= 1, tail + first_rec, first_rec), 0.0), tail)
    e = np.where(is_last, rsum, serial)
    path = np.where((policy == FULL)[:, None], base, np.where((policy == CKPT)[:, None], base + rsum, base + e))
    slot_loads = np.where((policy == FULL)[:, None], base, base + rsum)
    return _main_path(path, slot_loads, X, A, P, counts.shape[1])


def _main_path(path: np.ndarray, slot_loads: np.ndarray, X: np.ndarray, A: np.ndarray, P: np.ndarray,
               width: int) -> np.ndarray:
    """``ratrain.plan.estimator._main_path``'s T over rows (stages beyond a row's P are zero): the filling
    increments are the running maxima of the floor and the loads from the last stage back, added in order."""
    rows = np.arange(len(P))
    floor = slot_loads[rows, P - 1] + np.where(P > 1, 2 * X, 0.0)
    back = np.arange(1, width)[None, :]                     # m = 1 .. width - 1
    loads = np.take_along_axis(slot_loads, np.maximum(P[:, None] - back, 0), axis=1)
    best = np.maximum.accumulate(np.maximum(loads, floor[:, None]), axis=1)
    fill = np.where(back <= np.minimum(A - 1, P - 1)[:, None], best, 0.0)
    start = np.cumsum(path, axis=1)[:, -1] + 2 * (P - 1) * X
    total = np.cumsum(np.concatenate([start[:, None], fill], axis=1), axis=1)[:, -1]
    masked = np.where(np.arange(width)[None, :] < P[:, None], slot_loads, -np.inf)
    slot = np.maximum(floor, masked.max(axis=1))
    return np.where(A > P, total + (A - P) * slot, total)
