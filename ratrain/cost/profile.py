"""Latency profiles: per-layer forward/backward costs of a model, from kernels emulated on mtemu.

A layer's operators come from :func:`ratrain.spec.models.layer_operators`. Their latencies:

- GEMM ``C[m,n] = A[m,k] W[k,n]``: forward is the emulated GEMM (m, k, n); backward is the
  data gradient dX = dY W^T, GEMM (m, n, k), plus the weight gradient dW = X^T dY, GEMM (k, m, n).
- attention: the emulated attention kernels of mtemu (forward producing O and the saved P, and
  the memory-resident Algorithm-1 backward), causal, with grouped-query heads. ALiBi biases and
  sliding windows are not modelled (they change which tiles are skipped, not the kernel).
- elementwise, embedding, loss: DDR-bound, bytes moved / DDR bandwidth (backward moves twice the
  bytes: the incoming gradient and the saved input are read, the outgoing gradient written).
- TP all-reduces are not compute; the cost model adds them on the link.

Everything follows the training platform (``ratrain.spec.platform.TrainingPlatform``): kernels
run on its cluster, the GEMM is its ``gemm_loop_order`` with the variant's default tiles or, with
``tiles = "tuned"``, the best tiles per shape (``mtemu.kernels.registry.choose_tiles``), and the
bytes-bound terms use the DDR rate the emulator measures for their access pattern
(``ratrain.cost.ddr_terms`` names it, ``mtemu.ddr_probe`` measures it), stored in the profile as
``ddr_rates``.

Attention of a micro-batch above 1 or a TP degree above 1 is the micro-batch-1, T=1 kernel scaled by
the (sequence, head) pairs a rank computes: the kernel deals those pairs over the 24 DSPs, and from
24 heads on its cycles per head are constant within 1.2 % (emulated at seq 512: 24 vs 48 heads,
forward 46604 vs 46603 cycles per head, backward 74964 vs 75873), while emulating 128 heads at
seq 2048 would take many minutes (docs/CHOICES.md, "One platform").

Sources: ``emulated`` (every GEMM emulated, attention as above); ``bound``, the planner's fast model: the emulated
micro-batch-1, T=1 profile (shipped or cached) sets a fitted efficiency, total emulated GEMM time
over total closed-form bound time of its GEMMs, and every GEMM of another micro-batch or TP degree
is its bound divided by that efficiency, its attention the reference kernels scaled by the heads it
computes (micro-batch x heads per rank); no emulation beyond the reference profile; and
``roofline`` (a fixed utilization; quick looks only).

GEMM latencies are cached on disk keyed by shape, loop order, tiles, the platform's timing digest
and the emulator version (a hash of the kernels' sources), so a stale or corrupt cache entry is
never trusted. Very large GEMMs are emulated on two reduced problems and extrapolated along the
panel (N) or m-block (M) loop, whose steady-state iterations are identical (docs/CHOICES.md).
"""
from __future__ import annotations

import hashlib
import json
import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import mtemu  # kernels load on first use (mtemu's lazy package), so importing ratrain stays light
from mtemu.kernels.gemm_tiles import PLANLESS_BOUNDS, default_tiles
from mtemu.kernels.names import TILE_CHOICE_VERSION
from ratrain.cost.ddr_terms import term_pattern
from ratrain.cost.sources import PROFILE_SOURCES
from ratrain.errors import ConfigError
from ratrain.spec.models import (
    ModelSpec,
    Operator,
    embedding_and_head_operators,
    layer_operators,
    list_models,
)
from ratrain.spec.platform import TrainingPlatform
from rtcommon import caches
from rtcommon.cache import read_json_cache, write_json_cache
from rtcommon.progress import Progress

PROFILE_FORMAT = caches.cache("profiles").version          # bumped there when a profile's layout changes
GEMM_FORMAT = caches.cache("gemm-latencies").version
# tuned tiles are keyed by the rule that chose them (a new rule re-emulates, never reuses)
TUNED_KEY = f"tuned-v{TILE_CHOICE_VERSION}"
SHIPPED_DIR = Path(__file__).parent.parent / "data" / "profiles"
# GEMMs above this many MACs are extrapolated from two reduced emulations
EXTRAPOLATE_ABOVE_MACS = 70e9
# Training terms whose bytes set the time of an operator kind (their patterns: ratrain.cost.ddr_terms)
DDR_TERMS = ("elementwise", "embedding", "loss", "optimizer_update", "prefetch_write", "parameter_copy")

def emulator_version(kernel: str = "all") -> str:
    """Version of the emulated timing behind the latencies (see mtemu.version)."""
    return mtemu.emulator_version(kernel)


def cache_dir() -> Path:
    """The folder of ratrain's caches (``RATRAIN_CACHE_DIR``, else under ``RTCACHE_DIR``: rtcommon.caches)."""
    return caches.part_dir("ratrain")


# ------------------------------------------------------------------------------------------
# GEMM latency cache
# ------------------------------------------------------------------------------------------
class GemmBound:
    """The closed-form GEMM bound of a platform's loop order and tiles: what the fast model (``bound``)
    asks of the kernels, with no latency file read (a bound profile's attention is its reference's)."""

    def __init__(self, platform: TrainingPlatform | None = None):
        self.training = platform or TrainingPlatform()
        self.platform = self.training.cluster
        # the loop order's name, tiles and (A-resident) bound come from light modules: a profile that is
        # shipped or cached loads no generator; the variant itself (mtemu.kernels.registry) loads on use
        self.loop_order = self.training.gemm_loop_order
        self.tuned = self.training.tiles == "tuned"
        self.tiles = default_tiles(self.loop_order)

    @property
    def variant(self):
        """The registered GEMM variant of the loop order (loads the kernel generators)."""
        return mtemu.gemm_variant(self.loop_order)

    def bound_seconds(self, m: int, k: int, n: int) -> float:
        """The GEMM at its loop order's closed-form utilization bound (no emulation)."""
        tiles = (mtemu.choose_tiles(self.loop_order, m, k, n, self.platform, emulate_top=0) if self.tuned
                 else self.tiles)
        bound = PLANLESS_BOUNDS.get(self.loop_order) or self.variant.bound
        util = bound(m, k, n, tiles, self.platform)
        return m * k * n / (self.platform.peak_mac_per_s * util)


class GemmCache(GemmBound):
    """Measured GEMM latencies; entries carry their own key so nothing stale is used."""

    def __init__(self, platform: TrainingPlatform | None = None, path: Path | None = None, progress: bool = False):
        super().__init__(platform)
        self.version = emulator_version("gemm")
        digest = self.platform.timing_digest()
        tiles_key = TUNED_KEY if self.tuned else _tiles_key(self.tiles)
        self.prefix = f"{self.version}|{digest}|{self.loop_order}|{tiles_key}"
        self.attn_prefix = f"{emulator_version('attention')}|{digest}|attention"
        self.path = path or caches.path("gemm-latencies") / caches.cache("gemm-latencies").entries
        self.progress = progress
        self.entries: dict[str, dict] = {}
        for source in (SHIPPED_DIR / "gemm_cache.json", self.path):
            self.entries.update(self._read(source))
        self.emulated = 0

    def _read(self, path: Path) -> dict:
        # unreadable, corrupt, edited or oversized files are warned about and skipped by rtcommon.cache
        data = read_json_cache(path, checksum=not path.is_relative_to(SHIPPED_DIR))
        if data is None or data.get("format") != GEMM_FORMAT or not isinstance(data.get("entries"), dict):
            return {}
        out, bad = {}, 0
        for key, val in data["entries"].items():
            if _sane_entry(val):
                out[key] = val
            else:
                bad += 1
        if bad:
            caches.warn(f"{path}: dropped {bad} impossible cache entr{'y' if bad == 1 else 'ies'} "
                        "(they are re-emulated when needed)")
        return out

    def key(self, m: int, k: int, n: int) -> str:
        return f"{self.prefix}|{m}x{k}x{n}"

    def seconds(self, m: int, k: int, n: int) -> float:
        return self.lookup(m, k, n)["seconds"]

    def lookup(self, m: int, k: int, n: int) -> dict:
        key = self.key(m, k, n)
        hit = self.entries.get(key)
        if hit is not None:
            return hit
        if m * k * n > EXTRAPOLATE_ABOVE_MACS:
            entry = self._extrapolate(m, k, n)
        else:
            if self.progress:
                print(f"[profile] emulating GEMM {m}x{k}x{n} ({self.loop_order}"
                      f"{', tuned tiles' if self.tuned else ''}) ...", file=sys.stderr, flush=True)
            entry = self._emulated(key, ("gemm", self.loop_order, m, k, n, self.tuned, self.platform))
        self.entries[key] = entry
        return entry

    def tiles_for(self, m: int, k: int, n: int):
        """The variant's default tiles, or with tuned tiles the best for this shape on this platform."""
        if not self.tuned:
            return self.tiles
        return mtemu.choose_tiles(self.loop_order, m, k, n, self.platform)

    def attention(self, direction: str, heads: int, kv_heads: int, seq: int, head_dim: int) -> dict:
        """Emulated causal attention forward ('fwd') or Algorithm-1 backward ('bwd') latency."""
        key = f"{self.attn_prefix}|{direction}|{heads}x{kv_heads}x{seq}x{head_dim}|causal"
        hit = self.entries.get(key)
        if hit is not None:
            return hit
        if self.progress:
            print(f"[profile] emulating attention {direction} heads={heads} kv_heads={kv_heads} seq={seq} "
                  f"d={head_dim} ...", file=sys.stderr, flush=True)
        entry = self._emulated(key, ("attention", direction, heads, kv_heads, seq, head_dim, self.platform))
        self.entries[key] = entry
        return entry

    def _emulated(self, key: str, job: tuple) -> dict:
        """Emulate one kernel now (:class:`_KernelCollector` records the job instead)."""
        self.emulated += 1
        return emulate_kernel(job)

    def _extrapolate(self, m: int, k: int, n: int) -> dict:
        """Linear in the number of identical loop iterations (panels of n2, m-blocks of mg). The
        first iterations still fill the pipeline (the A-resident kernel's first two panels differ),
        so the two reduced problems start after them: 3 and 5 iterations past the remainder."""
        t = self.tiles_for(m, k, n)
        n2 = min(t.n2, n)
        qn, rn = divmod(n, n2)
        if qn >= 8:
            base = rn if rn else n2
            qa = 3 if rn else 2
            na, nb = base + qa * n2, base + (qa + 2) * n2
            ca, cb = self.lookup(m, k, na)["cycles"], self.lookup(m, k, nb)["cycles"]
            reps = (n - na) / n2
            cycles = ca + reps * (cb - ca) / 2
        else:
            mg = min(t.mg, m)
            qm, rm = divmod(m, mg)
            if qm < 8:
                return self._emulated(self.key(m, k, n), ("gemm", self.loop_order, m, k, n, self.tuned,
                                                          self.platform))
            base = rm if rm else mg
            qa = 3 if rm else 2
            ma, mb = base + qa * mg, base + (qa + 2) * mg
            ca, cb = self.lookup(ma, k, n)["cycles"], self.lookup(mb, k, n)["cycles"]
            cycles = ca + (m - ma) / mg * (cb - ca) / 2
        cycles = int(round(cycles))
        util = m * k * n / (self.platform.peak_macs_per_cycle * cycles)
        return {"seconds": cycles / self.platform.clock_hz, "cycles": cycles, "utilization": util,
                "method": "extrapolated"}

    def save(self) -> None:
        if self.emulated == 0:
            return
        own = self._read(self.path)
        own.update({k: v for k, v in self.entries.items()
                    if k.startswith(self.version) or k.startswith(self.attn_prefix)})
        # an unwritable cache costs re-emulation next time (with a warning), nothing else
        write_json_cache(self.path, {"format": GEMM_FORMAT, "entries": own})


def emulate_kernel(job: tuple) -> dict:
    """One cache entry from a kernel job, emulated in this process (a local build or a Dask worker):
    ``("gemm", loop_order, m, k, n, tuned, cluster)`` or
    ``("attention", "fwd" | "bwd", heads, kv_heads, seq, head_dim, cluster)``."""
    kind, *args = job
    if kind == "gemm":
        name, m, k, n, tuned, cluster = args
        variant = mtemu.gemm_variant(name)
        # tuned: the chooser's own run of the winning tiles (the same deterministic emulation)
        choice = variant.choose(m, k, n, cluster) if tuned else None
        tiles = choice.tiles if tuned else variant.default_tiles
        r = choice.result if tuned and choice.result is not None else \
            variant.timing(m, k, n, tiles=tiles, platform=cluster)
    else:
        direction, heads, kv_heads, seq, head_dim, cluster = args
        fn = mtemu.attention_forward_timing if direction == "fwd" else mtemu.attention_backward_timing
        r = fn(heads, kv_heads, seq, head_dim, causal=True, platform=cluster)
    entry = {"seconds": r.cycles / cluster.clock_hz, "cycles": r.cycles, "utilization": r.utilization,
             "method": "emulated"}
    if kind == "gemm" and tuned:
        entry["tiles"] = asdict(tiles)
    return entry


class _KernelCollector(GemmCache):
    """Walks a profile's kernels as a build would, recording every kernel missing from the cache as a
    job instead of emulating it. Its own entries (placeholders, extrapolations of placeholders) are
    thrown away with it."""

    def __init__(self, cache: GemmCache):
        self.__dict__.update(cache.__dict__)
        self.entries = dict(cache.entries)
        self.progress = False
        self.jobs: dict[str, tuple] = {}

    def _emulated(self, key: str, job: tuple) -> dict:
        self.jobs[key] = job
        return {"seconds": 1.0, "cycles": 1, "utilization": 1.0, "method": "pending"}


def _sane_entry(val: object) -> bool:
    """A cached kernel latency that could be true: positive finite seconds, utilization in (0, 1]."""
    if not isinstance(val, dict):
        return False
    sec, util = val.get("seconds"), val.get("utilization")
    return (isinstance(sec, (int, float)) and not isinstance(sec, bool) and math.isfinite(sec) and 0 < sec < 1e6
            and isinstance(util, (int, float)) and math.isfinite(util) and 0 < util <= 1)


def _tiles_key(t) -> str:
    return ",".join(f"{k}={v}" for k, v in asdict(t).items())


# ------------------------------------------------------------------------------------------
# layer profiles
# ------------------------------------------------------------------------------------------
@dataclass
class OpProfile:
    name: str
    kind: str
    forward_s: float
    backward_s: float
    bytes_moved: int = 0
    gemms: list = field(default_factory=list)    # (m, k, n, seconds, method) that make it up

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class LayerProfile:
    model: str
    micro_batch: int
    seq: int
    tp: int
    source: str                     # "emulated", "bound" or "roofline"
    ops: list[OpProfile]
    first_ops: list[OpProfile]
    last_ops: list[OpProfile]
    platform_key: str               # platform_key(platform): cluster timing digest, loop order, tiles
    emulator_version: str
    ddr_rates: dict[str, float] = field(default_factory=dict)   # bytes/s per training term (DDR_TERMS)

    @property
    def forward_s(self) -> float:
        return sum(o.forward_s for o in self.ops)

    @property
    def backward_s(self) -> float:
        return sum(o.backward_s for o in self.ops)

    @property
    def first_forward_s(self) -> float:
        return sum(o.forward_s for o in self.first_ops)

    @property
    def first_backward_s(self) -> float:
        return sum(o.backward_s for o in self.first_ops)

    @property
    def last_forward_s(self) -> float:
        return sum(o.forward_s for o in self.last_ops)

    @property
    def last_backward_s(self) -> float:
        return sum(o.backward_s for o in self.last_ops)

    def ddr_rate(self, term: str) -> float:
        """Bytes/s of a bandwidth-bound training term on the profile's platform."""
        rate = self.ddr_rates.get(term)
        if rate is None:
            raise ConfigError(f"profile of {self.model} has no DDR rate for {term!r} "
                              f"(has: {', '.join(self.ddr_rates)})")
        return rate

    def to_json(self) -> dict:
        return {"format": PROFILE_FORMAT, "model": self.model, "micro_batch": self.micro_batch, "seq": self.seq,
                "tp": self.tp, "source": self.source, "platform_key": self.platform_key,
                "emulator_version": self.emulator_version, "ddr_rates": self.ddr_rates,
                "forward_s": self.forward_s, "backward_s": self.backward_s,
                "first_forward_s": self.first_forward_s, "first_backward_s": self.first_backward_s,
                "last_forward_s": self.last_forward_s, "last_backward_s": self.last_backward_s,
                "ops": [o.to_json() for o in self.ops], "first_ops": [o.to_json() for o in self.first_ops],
                "last_ops": [o.to_json() for o in self.last_ops]}

    @classmethod
    def from_json(cls, d: dict) -> LayerProfile:
        def ops(key):
            return [OpProfile(**o) for o in d[key]]
        rates = {str(k): float(v) for k, v in d["ddr_rates"].items()}
        return cls(d["model"], d["micro_batch"], d["seq"], d["tp"], d["source"], ops("ops"), ops("first_ops"),
                   ops("last_ops"), d["platform_key"], d["emulator_version"], rates)


def platform_key(platform: TrainingPlatform) -> str:
    """What a profile's numbers depend on besides the model: the cluster's timing digest, the GEMM
    loop order and the tiles (the memory budget and the link are not in it)."""
    c = platform.cluster
    tiles = TUNED_KEY if platform.tiles == "tuned" else _tiles_key(default_tiles(platform.gemm_loop_order))
    return hashlib.sha256(f"{c.timing_digest()}|{platform.gemm_loop_order}|{tiles}".encode()).hexdigest()[:16]


def ddr_rates(platform: TrainingPlatform, source: str) -> dict[str, float]:
    """Effective DDR rates of the bandwidth-bound terms: emulated (``mtemu.ddr_probe``), or the
    nominal rate for the roofline stand-in (which emulates nothing)."""
    if source == "roofline":
        return {term: platform.cluster.ddr_bandwidth for term in DDR_TERMS}
    return {term: mtemu.pattern_bandwidth(platform.cluster, term_pattern(term)) for term in DDR_TERMS}


class _Timer:
    """Operator latencies: emulated kernels, the closed-form bound, or a roofline stand-in."""

    ROOFLINE_UTILIZATION = 0.66

    def __init__(self, source: str, platform: TrainingPlatform, cache: GemmCache | None, rates: dict[str, float],
                 reference: LayerProfile | None = None):
        self.source = source
        self.platform = platform.cluster
        self.cache = cache
        self.rates = rates
        # the bound model: the b=1 emulated profile's attention per sequence, and the fitted efficiency
        self.attention_b1 = {}
        self.gemm_scale = 1.0
        if reference is not None:     # attention scaled from it (emulated and bound); GEMMs only for bound
            for o in reference.ops + reference.first_ops + reference.last_ops:
                if o.kind == "attention":       # gemms: [name, heads, kv_heads, seq, d, seconds] per kernel
                    self.attention_b1[o.name] = (o.forward_s, o.backward_s, o.gemms[0][1])
        if reference is not None and source == "bound":
            shapes = [g for o in reference.ops + reference.first_ops + reference.last_ops if o.kind == "gemm"
                      for g in o.gemms]
            emulated = sum(g[3] for g in shapes)
            bound = sum(cache.bound_seconds(*g[:3]) for g in shapes)
            self.gemm_scale = emulated / bound if bound > 0 else 1.0

    def gemm(self, m: int, k: int, n: int) -> tuple[float, str]:
        if self.source == "roofline":
            return m * k * n / (self.platform.peak_mac_per_s * self.ROOFLINE_UTILIZATION), "roofline"
        if self.source == "bound":
            return self.cache.bound_seconds(m, k, n) * self.gemm_scale, "bound"
        e = self.cache.lookup(m, k, n)
        return e["seconds"], e["method"]

    def bytes(self, nbytes: float, term: str = "elementwise") -> float:
        return nbytes / self.rates[term]

    def _attention(self, direction: str, op: Operator) -> float:
        if self.attention_b1:
            # attention work is per (sequence, head): the T=1, b=1 kernel's time scaled by the heads
            # this rank computes (micro-batch x heads per TP rank) over the reference's heads
            fwd, bwd, ref_heads = self.attention_b1[op.name]
            return (fwd if direction == "fwd" else bwd) * op.batch * op.heads / ref_heads
        return self.cache.attention(direction, op.batch * op.heads, op.batch * op.kv_heads, op.seq,
                                    op.head_dim)["seconds"]

    def op(self, op: Operator) -> OpProfile:
        if op.kind == "gemm":
            timed = [(*s, *self.gemm(*s)) for s in _gemm_parts(op)]
            bias = self.bytes(op.m * op.n * 2 * 2) if op.bias else 0.0
            return OpProfile(op.name, op.kind, timed[0][3] + bias, timed[1][3] + timed[2][3] + bias,
                             gemms=[list(t) for t in timed])
        if op.kind == "attention":
            heads, kv_heads = op.batch * op.heads, op.batch * op.kv_heads
            if self.source == "roofline":
                macs = op.macs if not op.causal else op.macs / 2
                t = macs / (self.platform.peak_mac_per_s * self.ROOFLINE_UTILIZATION)
                return OpProfile(op.name, op.kind, t, 2.5 * t)
            fwd, bwd = self._attention("fwd", op), self._attention("bwd", op)
            return OpProfile(op.name, op.kind, fwd, bwd,
                             gemms=[["attention-fwd", heads, kv_heads, op.seq, op.head_dim, fwd],
                                    ["attention-bwd", heads, kv_heads, op.seq, op.head_dim, bwd]])
        if op.kind == "allreduce":
            return OpProfile(op.name, op.kind, 0.0, 0.0, op.bytes_moved)
        term = op.kind if op.kind in ("embedding", "loss") else "elementwise"
        return OpProfile(op.name, op.kind, self.bytes(op.bytes_moved, term), self.bytes(2 * op.bytes_moved, term),
                         op.bytes_moved)


def _gemm_parts(op: Operator) -> list[tuple[int, int, int]]:
    """The GEMMs of a GEMM operator: forward, data gradient, weight gradient (module docstring)."""
    return [(op.m, op.k, op.n), (op.m, op.n, op.k), (op.k, op.m, op.n)]


def build_profile(spec: ModelSpec, micro_batch: int, seq: int, tp: int = 1, *, source: str = "emulated",
                  platform: TrainingPlatform | None = None, cache: GemmCache | None = None,
                  progress: bool = False) -> LayerProfile:
    if source not in PROFILE_SOURCES:
        raise ConfigError(f"profile source must be one of {', '.join(PROFILE_SOURCES)}, got {source!r}")
    platform = platform or TrainingPlatform()
    if source == "emulated" and cache is None:
        cache = GemmCache(platform, progress=progress)
    reference = None
    if source != "roofline" and (micro_batch, tp) != (1, 1):
        # attention of more sequences or fewer heads per rank: the reference kernels, scaled
        reference = layer_profile(spec, 1, seq, 1, source="emulated", platform=platform, progress=progress,
                                  cache=cache)
    if source == "bound" and reference is None:
        return layer_profile(spec, 1, seq, 1, source="emulated", platform=platform, progress=progress, cache=cache)
    # the bound model's DDR rates are its emulated reference's (the probe's numbers, stored with that
    # profile), so a shipped or cached reference spares emulating the probe
    rates = dict(reference.ddr_rates) if source == "bound" else ddr_rates(platform, source)
    # the bound model's GEMMs are closed-form and its attention the reference's: no latency file is
    # read for it (reading the GEMM cache twice per fast profile was most of a warm plan's profile time)
    timer = _Timer(source, platform, cache if cache is not None or source != "bound" else GemmBound(platform),
                   rates, reference)
    ops = [timer.op(o) for o in layer_operators(spec, micro_batch, seq, tp)]
    extra = embedding_and_head_operators(spec, micro_batch, seq, tp)
    first = [timer.op(o) for o in extra["first"]]
    last = [timer.op(o) for o in extra["last"]]
    if cache is not None:
        cache.save()
    version = emulator_version("all") if source != "roofline" else "roofline"
    return LayerProfile(spec.name, micro_batch, seq, tp, source, ops, first, last, platform_key(platform), version,
                        timer.rates)


def _profile_name(spec: ModelSpec, micro_batch: int, seq: int, tp: int, key: str) -> str:
    shape = hashlib.sha256(json.dumps(spec.to_json(), sort_keys=True).encode()).hexdigest()[:8]
    # the hashes decide the file; only a built-in model's name labels it (an HF config's name is
    # text from an input file and never reaches a path)
    label = spec.name if spec.name in list_models() else "hf-config"
    return f"{label}-b{micro_batch}-s{seq}-tp{tp}-{shape}-{key[:8]}.json"


_MEMO: dict[tuple, LayerProfile] = {}


def layer_profile(spec: ModelSpec, micro_batch: int, seq: int, tp: int = 1, *, source: str = "emulated",
                  platform: TrainingPlatform | None = None, progress: bool | None = None,
                  cache: GemmCache | None = None) -> LayerProfile:
    """The profile for (model, b, seq, tp) on ``platform``: memory, then the shipped or cached file
    if current, else built (the ``bound`` and ``roofline`` sources are built every time: they are
    fast; ``bound`` still emulates the b=1 attention kernels once, through the cache).

    Building an emulated profile takes minutes; ``progress`` (default: when stderr is a terminal)
    reports it on stderr, so ``--json`` output on stdout stays clean."""
    if progress is None:
        progress = sys.stderr.isatty()
    if source not in PROFILE_SOURCES:
        raise ConfigError(f"profile source must be one of {', '.join(PROFILE_SOURCES)}, got {source!r}")
    platform = platform or TrainingPlatform()
    key = platform_key(platform)
    memo_key = _memo_key(spec, micro_batch, seq, tp, source, key)
    if memo_key in _MEMO:
        return _MEMO[memo_key]
    if source != "emulated":
        prof = build_profile(spec, micro_batch, seq, tp, source=source, platform=platform, progress=progress,
                             cache=cache)
        _MEMO[memo_key] = prof
        return prof
    name = _profile_name(spec, micro_batch, seq, tp, key)
    prof = _stored_profile(name, key)
    if prof is not None:
        _MEMO[memo_key] = prof
        return prof
    if progress:
        print(f"[profile] building the emulated latency profile of {spec.name} (b={micro_batch}, seq={seq}, "
              f"tp={tp}, {platform.gemm_loop_order} GEMM); this emulates its kernels once and caches them in "
              f"{cache_dir()}", file=sys.stderr, flush=True)
    prof = build_profile(spec, micro_batch, seq, tp, source="emulated", platform=platform, progress=progress,
                         cache=cache)
    write_json_cache(caches.path("profiles") / name, prof.to_json())   # unwritable: warned, rebuilt next time
    _MEMO[memo_key] = prof
    return prof


def _memo_key(spec: ModelSpec, micro_batch: int, seq: int, tp: int, source: str, key: str) -> tuple:
    """A profile's key in this process's memo (``_MEMO``): the model's full description, the shape, the
    source and the platform's key."""
    return (json.dumps(spec.to_json(), sort_keys=True), micro_batch, seq, tp, source, key)


def _stored_profile(name: str, key: str) -> LayerProfile | None:
    """The shipped, else the cached, profile file ``name`` if it is current."""
    version = emulator_version("all")
    for path in (SHIPPED_DIR / name, caches.path("profiles") / name):
        prof = _load_if_current(path, version, key)
        if prof is not None:
            return prof
    return None


# ------------------------------------------------------------------------------------------
# many profiles at once: their kernels emulated in parallel (a Dask cluster or local processes)
# ------------------------------------------------------------------------------------------
ProfileRequest = tuple[ModelSpec, int, int, int]          # (model, micro-batch, seq, tp)


def kernel_jobs(requests: list[ProfileRequest], platform: TrainingPlatform, cache: GemmCache
                ) -> dict[str, tuple]:
    """Cache key -> job (:func:`emulate_kernel`) of every kernel the emulated profiles of ``requests``
    need that ``cache`` lacks: their GEMMs (the reduced problems of extrapolated ones) and the
    attention kernels of their micro-batch-1, T=1 references. Current stored profiles need nothing."""
    collector = _KernelCollector(cache)
    timer = _Timer("emulated", platform, collector, {})
    key = platform_key(platform)
    todo = []
    for spec, b, seq, tp in requests:         # a (b, T) profile's attention is scaled from its reference
        todo += [(spec, 1, seq, 1), (spec, b, seq, tp)] if (b, tp) != (1, 1) else [(spec, b, seq, tp)]
    for spec, b, seq, tp in todo:
        if _stored_profile(_profile_name(spec, b, seq, tp, key), key) is not None:
            continue
        extra = embedding_and_head_operators(spec, b, seq, tp)
        for op in layer_operators(spec, b, seq, tp) + extra["first"] + extra["last"]:
            if op.kind == "gemm":
                for shape in _gemm_parts(op):
                    timer.gemm(*shape)
            elif op.kind == "attention" and (b, tp) == (1, 1):
                timer._attention("fwd", op)
                timer._attention("bwd", op)
    return collector.jobs


def unbuilt_profiles(requests: list[ProfileRequest], platform: TrainingPlatform) -> list[ProfileRequest]:
    """The requests whose emulated profile is neither in this process's memory nor stored (shipped or cached)
    and current: the ones :func:`layer_profile` would build. Stored ones found here are kept in memory, as
    ``layer_profile`` keeps them (so nothing is read twice)."""
    key = platform_key(platform)
    out = []
    for spec, b, seq, tp in requests:
        memo_key = _memo_key(spec, b, seq, tp, "emulated", key)
        if memo_key in _MEMO:
            continue
        prof = _stored_profile(_profile_name(spec, b, seq, tp, key), key)
        if prof is None:
            out.append((spec, b, seq, tp))
        else:
            _MEMO[memo_key] = prof
    return out


def _job_cost(job: tuple) -> tuple:
    """A kernel job's rough emulation cost, to order them: attention above any GEMM (its kernels take
    several times a large GEMM's), the backward above the forward, GEMMs by their MACs."""
    if job[0] == "attention":
        direction, heads, _kv, seq, head_dim = job[1:6]
        return 1, direction == "bwd", heads * seq * seq * head_dim
    return 0, False, job[2] * job[3] * job[4]


def build_profiles(requests: list[ProfileRequest], *, platform: TrainingPlatform | None = None,
                   scheduler=None, workers: int = 1, progress: Progress | None = None,
                   pool: mtemu.LocalPool | None = None) -> list[LayerProfile]:
    """The emulated profiles of ``requests`` (as :func:`layer_profile` gives them, bit for bit), their
    missing kernels emulated in parallel on a Dask cluster (``scheduler``: an address or a Client)
    or on ``workers`` local processes (``pool``'s, kept between calls, where given).

    The numba cache is filled in this process before any job is sent (numba's on-disk cache is not
    safe for concurrent writers); workers only emulate and return numbers. This process alone merges
    them into the GEMM cache, in key order, and writes it once, atomically."""
    progress = progress or Progress(False)
    platform = platform or TrainingPlatform()
    cache = GemmCache(platform)
    jobs = kernel_jobs(requests, platform, cache)
    if jobs:
        keys = sorted(jobs)
        client = mtemu.connect_scheduler(scheduler)          # reached before anything is compiled or emulated
        where = "the Dask cluster" if client is not None else f"{workers} local process(es)"
        progress(f"profiles: {len(keys)} kernels to emulate on {where}; compiling the machine here first")
        mtemu.warm_numba_cache(platform.cluster)
        results: dict[str, dict] = {}
        done = iter(range(1, len(keys) + 1))

        def step(_note: str) -> None:
            i = next(done)
            if i == len(keys) or i % max(1, len(keys) // 20) == 0:
                progress(f"profiles: {i}/{len(keys)} kernels emulated")
        # the longest first (attention, then the GEMMs by MACs), so that no worker starts a long one last
        order = sorted(keys, key=lambda k: _job_cost(jobs[k]), reverse=True)
        for i, entry in mtemu.map_jobs([jobs[k] for k in order], workers, client, step, emulate_kernel, pool):
            results[order[i]] = entry
        for k in keys:                                  # merged in key order, whatever order they finished in
            cache.entries[k] = results[k]
        cache.emulated = len(keys)
        cache.save()
        cache.emulated = 0                              # the builds below only read (and extrapolate)
    return [layer_profile(spec, b, seq, tp, platform=platform, progress=False, cache=cache)
            for spec, b, seq, tp in requests]


def _warn(path: Path, why: str) -> None:
    caches.warn(f"{path} {why}: ignored (it will be rebuilt)", stacklevel=3)


def _positive_ints(values: list) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values)


def _seconds(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and 0 <= value < 1e6


def _kernels_problem(prof: LayerProfile) -> str | None:
    """What is wrong with an operator's kernel list, which later reads index (None if sound): an
    emulated or bound profile's GEMM has its three GEMMs (m, k, n, seconds, ...), its attention
    the forward and backward kernels (name, heads, kv_heads, seq, head_dim, seconds)."""
    for o in prof.ops + prof.first_ops + prof.last_ops:
        if not isinstance(o.gemms, list) or not all(isinstance(g, list) for g in o.gemms):
            return f"operator {o.name!r}: its kernel list is not a list of lists"
        if prof.source == "roofline":
            continue
        if o.kind == "gemm" and (len(o.gemms) != 3 or not all(len(g) >= 4 and _positive_ints(g[:3])
                                                                and _seconds(g[3]) for g in o.gemms)):
            return f"operator {o.name!r}: a GEMM needs three (m, k, n, seconds, ...) entries"
        if o.kind == "attention" and (len(o.gemms) != 2 or not all(
                len(g) == 6 and isinstance(g[0], str) and _positive_ints(g[1:5]) and _seconds(g[5])
                for g in o.gemms)):
            return f"operator {o.name!r}: attention needs its forward and backward kernels"
    return None


def _load_if_current(path: Path, version: str, key: str) -> LayerProfile | None:
    """A shipped or cached profile, if it is current and sane; anything else is rebuilt with a
    one-line warning (a stale file silently: a new emulator version or platform is expected)."""
    # None: missing, or corrupt or edited (warned by rtcommon.cache); shipped files carry no checksum
    data = read_json_cache(path, checksum=not path.is_relative_to(SHIPPED_DIR))
    if data is None:
        return None
    if (data.get("format") != PROFILE_FORMAT or data.get("emulator_version") != version
            or data.get("platform_key") != key):
        return None
    try:
        prof = LayerProfile.from_json(data)
    except (KeyError, TypeError, ValueError, AttributeError):
        _warn(path, "is malformed")
        return None
    times = [t for o in prof.ops + prof.first_ops + prof.last_ops for t in (o.forward_s, o.backward_s)]
    rates = list(prof.ddr_rates.values())
    if (not all(isinstance(t, (int, float)) and math.isfinite(t) and 0 <= t < 1e6 for t in times)
            or set(prof.ddr_rates) != set(DDR_TERMS) or not all(math.isfinite(r) and r > 0 for r in rates)):
        _warn(path, "holds impossible values")
        return None
    problem = _kernels_problem(prof)
    if problem is not None:
        _warn(path, f"is malformed ({problem})")
        return None
    return prof
