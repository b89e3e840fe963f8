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

GEMM latencies are cached on disk keyed by shape, tiles, platform hash and the emulator version
(a hash of the emulator's sources), so a stale or corrupt cache entry is never trusted. Very
large GEMMs are emulated on two reduced problems and extrapolated along the panel (N) or
m-block (M) loop, whose steady-state iterations are identical (see docs/CHOICES.md).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import mtemu  # kernels load on first use (mtemu's lazy package), so importing ratrain stays light
from mtemu.platform import DEFAULT as MT_DEFAULT
from mtemu.platform import Platform
from mtemu.version import emulator_version as _kernel_version
from ratrain.errors import ConfigError
from ratrain.spec.models import (
    ModelSpec,
    Operator,
    embedding_and_head_operators,
    layer_operators,
)
from rtcommon.fileio import atomic_write_json

PROFILE_FORMAT = 1
SHIPPED_DIR = Path(__file__).parent.parent / "data" / "profiles"
# GEMMs above this many MACs are extrapolated from two reduced emulations
EXTRAPOLATE_ABOVE_MACS = 70e9

def emulator_version(kernel: str = "all") -> str:
    """Version of the emulated timing behind the latencies (see mtemu.version)."""
    return _kernel_version(kernel)


def cache_dir() -> Path:
    return Path(os.environ.get("RATRAIN_CACHE_DIR", Path.home() / ".cache" / "ratrain"))


# ------------------------------------------------------------------------------------------
# GEMM latency cache
# ------------------------------------------------------------------------------------------
class GemmCache:
    """Measured GEMM latencies; entries carry their own key so nothing stale is used."""

    def __init__(self, platform: Platform = MT_DEFAULT, tiles: mtemu.GemmTiles | None = None,
                 path: Path | None = None, progress: bool = False):
        self.platform = platform
        self.tiles = tiles if tiles is not None else mtemu.DEFAULT_TILES
        tiles = self.tiles
        self.version = emulator_version("gemm")
        self.prefix = f"{self.version}|{platform.digest()}|{_tiles_key(tiles)}"
        self.attn_prefix = f"{emulator_version('attention')}|{platform.digest()}|attention"
        self.path = path or cache_dir() / "gemm_cache.json"
        self.progress = progress
        self.entries: dict[str, dict] = {}
        for source in (SHIPPED_DIR / "gemm_cache.json", self.path):
            self.entries.update(self._read(source))
        self.emulated = 0

    def _read(self, path: Path) -> dict:
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, json.JSONDecodeError):
            if self.progress:
                print(f"[profile] ignoring corrupt cache {path}", file=sys.stderr)
            return {}
        if not isinstance(data, dict) or data.get("format") != PROFILE_FORMAT or not isinstance(data.get("entries"),
                                                                                                dict):
            return {}
        out = {}
        for key, val in data["entries"].items():
            if isinstance(val, dict) and isinstance(val.get("seconds"), (int, float)) and val["seconds"] > 0:
                out[key] = val
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
                print(f"[profile] emulating GEMM {m}x{k}x{n} ...", file=sys.stderr, flush=True)
            r = mtemu.gemm_timing(m, k, n, tiles=self.tiles, platform=self.platform)
            entry = {"seconds": r.cycles / self.platform.clock_hz, "cycles": r.cycles,
                     "utilization": r.utilization, "method": "emulated"}
            self.emulated += 1
        self.entries[key] = entry
        return entry

    def attention(self, direction: str, heads: int, kv_heads: int, seq: int, head_dim: int) -> dict:
        """Emulated causal attention forward ('fwd') or Algorithm-1 backward ('bwd') latency."""
        key = f"{self.attn_prefix}|{direction}|{heads}x{kv_heads}x{seq}x{head_dim}|causal"
        hit = self.entries.get(key)
        if hit is not None:
            return hit
        if self.progress:
            print(f"[profile] emulating attention {direction} heads={heads} kv_heads={kv_heads} seq={seq} "
                  f"d={head_dim} ...", file=sys.stderr, flush=True)
        fn = mtemu.attention_forward_timing if direction == "fwd" else mtemu.attention_backward_timing
        r = fn(heads, kv_heads, seq, head_dim, causal=True, platform=self.platform)
        entry = {"seconds": r.cycles / self.platform.clock_hz, "cycles": r.cycles, "utilization": r.utilization,
                 "method": "emulated"}
        self.emulated += 1
        self.entries[key] = entry
        return entry

    def _extrapolate(self, m: int, k: int, n: int) -> dict:
        """Linear in the number of identical loop iterations (panels of n2, m-blocks of mg)."""
        t = self.tiles
        n2 = min(t.n2, n)
        qn, rn = divmod(n, n2)
        if qn >= 4:
            base = rn if rn else n2
            qa = 1 if rn else 0
            na, nb = base + qa * n2, base + (qa + 2) * n2
            ca, cb = self.lookup(m, k, na)["cycles"], self.lookup(m, k, nb)["cycles"]
            reps = (n - na) / n2
            cycles = ca + reps * (cb - ca) / 2
        else:
            mg = min(t.mg, m)
            qm, rm = divmod(m, mg)
            if qm < 4:
                r = mtemu.gemm_timing(m, k, n, tiles=t, platform=self.platform)
                self.emulated += 1
                return {"seconds": r.cycles / self.platform.clock_hz, "cycles": r.cycles,
                        "utilization": r.utilization, "method": "emulated"}
            base = rm if rm else mg
            qa = 1 if rm else 0
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
        atomic_write_json(self.path, {"format": PROFILE_FORMAT, "entries": own})


def _tiles_key(t: mtemu.GemmTiles) -> str:
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
    source: str                     # "emulated" or "roofline"
    ops: list[OpProfile]
    first_ops: list[OpProfile]
    last_ops: list[OpProfile]
    platform_hash: str
    emulator_version: str

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

    def to_json(self) -> dict:
        return {"format": PROFILE_FORMAT, "model": self.model, "micro_batch": self.micro_batch, "seq": self.seq,
                "tp": self.tp, "source": self.source, "platform_hash": self.platform_hash,
                "emulator_version": self.emulator_version,
                "forward_s": self.forward_s, "backward_s": self.backward_s,
                "first_forward_s": self.first_forward_s, "first_backward_s": self.first_backward_s,
                "last_forward_s": self.last_forward_s, "last_backward_s": self.last_backward_s,
                "ops": [o.to_json() for o in self.ops], "first_ops": [o.to_json() for o in self.first_ops],
                "last_ops": [o.to_json() for o in self.last_ops]}

    @classmethod
    def from_json(cls, d: dict) -> "LayerProfile":
        def ops(key):
            return [OpProfile(**o) for o in d[key]]
        return cls(d["model"], d["micro_batch"], d["seq"], d["tp"], d["source"], ops("ops"), ops("first_ops"),
                   ops("last_ops"), d["platform_hash"], d["emulator_version"])


class _Timer:
    """Operator latencies from emulated GEMMs (``emulated``) or an analytic stand-in (``roofline``)."""

    ROOFLINE_UTILIZATION = 0.66

    def __init__(self, source: str, platform: Platform, cache: GemmCache | None):
        self.source = source
        self.platform = platform
        self.cache = cache

    def gemm(self, m: int, k: int, n: int) -> tuple[float, str]:
        if self.source == "roofline":
            return m * k * n / (self.platform.peak_mac_per_s * self.ROOFLINE_UTILIZATION), "roofline"
        e = self.cache.lookup(m, k, n)
        return e["seconds"], e["method"]

    def bytes(self, nbytes: float) -> float:
        return nbytes / self.platform.ddr_bandwidth

    def op(self, op: Operator) -> OpProfile:
        if op.kind == "gemm":
            parts = [(op.m, op.k, op.n), (op.m, op.n, op.k), (op.k, op.m, op.n)]
            timed = [(*s, *self.gemm(*s)) for s in parts]
            bias = self.bytes(op.m * op.n * 2 * 2) if op.bias else 0.0
            return OpProfile(op.name, op.kind, timed[0][3] + bias, timed[1][3] + timed[2][3] + bias,
                             gemms=[list(t) for t in timed])
        if op.kind == "attention":
            heads, kv_heads = op.batch * op.heads, op.batch * op.kv_heads
            if self.source == "roofline":
                macs = op.macs if not op.causal else op.macs / 2
                t = macs / (self.platform.peak_mac_per_s * self.ROOFLINE_UTILIZATION)
                return OpProfile(op.name, op.kind, t, 2.5 * t)
            fwd = self.cache.attention("fwd", heads, kv_heads, op.seq, op.head_dim)
            bwd = self.cache.attention("bwd", heads, kv_heads, op.seq, op.head_dim)
            return OpProfile(op.name, op.kind, fwd["seconds"], bwd["seconds"],
                             gemms=[["attention-fwd", heads, kv_heads, op.seq, op.head_dim, fwd["seconds"]],
                                    ["attention-bwd", heads, kv_heads, op.seq, op.head_dim, bwd["seconds"]]])
        if op.kind == "allreduce":
            return OpProfile(op.name, op.kind, 0.0, 0.0, op.bytes_moved)
        return OpProfile(op.name, op.kind, self.bytes(op.bytes_moved), self.bytes(2 * op.bytes_moved), op.bytes_moved)


def build_profile(spec: ModelSpec, micro_batch: int, seq: int, tp: int = 1, *, source: str = "emulated",
                  platform: Platform = MT_DEFAULT, tiles: mtemu.GemmTiles | None = None,
                  cache: GemmCache | None = None, progress: bool = False) -> LayerProfile:
    if source not in ("emulated", "roofline"):
        raise ConfigError(f"profile source must be 'emulated' or 'roofline', got {source!r}")
    if source == "emulated" and cache is None:
        cache = GemmCache(platform, tiles, progress=progress)
    timer = _Timer(source, platform, cache)
    ops = [timer.op(o) for o in layer_operators(spec, micro_batch, seq, tp)]
    extra = embedding_and_head_operators(spec, micro_batch, seq, tp)
    first = [timer.op(o) for o in extra["first"]]
    last = [timer.op(o) for o in extra["last"]]
    if cache is not None:
        cache.save()
    return LayerProfile(spec.name, micro_batch, seq, tp, source, ops, first, last, platform.digest(),
                        emulator_version("all") if source == "emulated" else "roofline")


def _profile_name(spec: ModelSpec, micro_batch: int, seq: int, tp: int) -> str:
    shape = hashlib.sha256(json.dumps(spec.to_json(), sort_keys=True).encode()).hexdigest()[:8]
    return f"{spec.name}-b{micro_batch}-s{seq}-tp{tp}-{shape}.json"


_MEMO: dict[tuple, LayerProfile] = {}

def layer_profile(spec: ModelSpec, micro_batch: int, seq: int, tp: int = 1, *, source: str = "emulated",
                  platform: Platform = MT_DEFAULT, tiles: mtemu.GemmTiles | None = None,
                  progress: bool | None = None) -> LayerProfile:
    """The profile for (model, b, seq, tp): memory, then shipped/cached file if current, else built.

    Building one emulates many kernels and takes minutes; ``progress`` (default: when stderr is a
    terminal) reports it on stderr, so ``--json`` output on stdout stays clean."""
    if progress is None:
        progress = sys.stderr.isatty()
    tiles = tiles if tiles is not None else mtemu.DEFAULT_TILES
    memo_key = (json.dumps(spec.to_json(), sort_keys=True), micro_batch, seq, tp, source, platform.digest(),
                _tiles_key(tiles))
    if memo_key in _MEMO:
        return _MEMO[memo_key]
    if source == "roofline":
        prof = build_profile(spec, micro_batch, seq, tp, source="roofline", platform=platform, tiles=tiles)
        _MEMO[memo_key] = prof
        return prof
    name = _profile_name(spec, micro_batch, seq, tp)
    version = emulator_version("all")
    for path in (SHIPPED_DIR / name, cache_dir() / "profiles" / name):
        prof = _load_if_current(path, version, platform, tiles, progress)
        if prof is not None:
            _MEMO[memo_key] = prof
            return prof
    if progress:
        print(f"[profile] building the emulated latency profile of {spec.name} (b={micro_batch}, seq={seq}, "
              f"tp={tp}); this emulates its GEMMs once and caches them in {cache_dir()}", file=sys.stderr, flush=True)
    prof = build_profile(spec, micro_batch, seq, tp, source="emulated", platform=platform, tiles=tiles,
                         progress=progress)
    payload = prof.to_json()
    payload["tiles"] = _tiles_key(tiles)
    atomic_write_json(cache_dir() / "profiles" / name, payload)
    _MEMO[memo_key] = prof
    return prof


def _load_if_current(path: Path, version: str, platform: Platform, tiles: mtemu.GemmTiles,
                     progress: bool) -> LayerProfile | None:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError):
        if progress:
            print(f"[profile] {path} is corrupt: rebuilding", file=sys.stderr)
        return None
    try:
        if (data.get("format") != PROFILE_FORMAT or data.get("emulator_version") != version
                or data.get("platform_hash") != platform.digest() or data.get("tiles") != _tiles_key(tiles)):
            if progress:
                print(f"[profile] {path.name} is stale (emulator or platform changed): rebuilding", file=sys.stderr)
            return None
        prof = LayerProfile.from_json(data)
    except (KeyError, TypeError, ValueError):
        if progress:
            print(f"[profile] {path} is malformed: rebuilding", file=sys.stderr)
        return None
    if not all(math.isfinite(o.forward_s) and o.forward_s >= 0 for o in prof.ops):
        return None
    return prof
