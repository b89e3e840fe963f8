"""The pipeline schedule as one more dimension of the planner's search.

A choice is a ``ratrain.sim.pipeline_order.PipelineSchedule`` by name and chunks per stage
(``interleaved`` only; ``ScheduleChoice`` is the same type). For each, this module gives what the
planner needs before timing anything:

* whether the layout can run it (interleaved: P * v <= layers, and Megatron's micro-batch rule);
* the stages' layers (interleaved: the layout's partition rule applied to P * v chunks, chunk g on
  stage g mod P, as ``ratrain.repro.schedules`` and the simulator place them);
* the worst stage's peak memory (Eq. 10): Eq. 9's state and buffers for the layers the stage holds
  (``stage_bytes_without_activations``) plus the activation sets the schedule's order keeps alive,
  walked op by op with the simulator's lifetime rules (``activation_residency``): an F allocates its
  chunk's sets (checkpoints, or full activations under full-save, plus the int32 ids/labels on the
  first/last chunk), its B frees them, and under ZB-H1 the B keeps what W reads
  (``weight_gradient_bytes``) until that W. Under 1F1B the walk gives N_act = min(P - p, A) sets and
  the peak equals ``PeakMemory`` (tested); for the other schedules it is the order's exact count at
  op granularity, an upper bound of the per-layer timeline.

The step time per schedule is ``ratrain.plan.estimator.schedule_step_breakdown``.
"""
from __future__ import annotations

from ratrain.cost.terms import CostTerms, LayerKind
from ratrain.errors import ConfigError
from ratrain.plan.choices import DEFAULT_VIRTUAL_STAGES
from ratrain.sim.pipeline_order import SCHEDULES, PipelineSchedule, build
from ratrain.sim.weight_split import DEFAULT_WEIGHT_FRACTION, layer_weight_gradient_bytes, weight_gradient_ms
from ratrain.spec.memory import (
    DEFAULT_CONSTANTS,
    MemoryConstants,
    layer_checkpoint_bytes,
    layer_full_bytes,
    stage_bytes_without_activations,
)
from ratrain.spec.models import ModelSpec
from ratrain.spec.parallel import partition_model

TOKEN_BYTES = 4                 # int32 ids (first chunk) and labels (last chunk) per token, as Eq. 9


# The planner's schedule choices are pipeline_order's one schedule type (name and v; the weight
# share and chunk sizes are derived per layout when a finalist is simulated).
ScheduleChoice = PipelineSchedule
ONE_F_ONE_B = PipelineSchedule()


def _search_choice(name: str, virtual_stages: int, where: str) -> PipelineSchedule:
    """A schedule the search may try: interleaved with v = 1 would only repeat 1f1b."""
    choice = PipelineSchedule(name, virtual_stages=virtual_stages)
    if name == "interleaved" and virtual_stages < 2:
        raise ConfigError(f"{where}: schedule interleaved needs virtual stages >= 2 (v = 1 is 1f1b)")
    return choice


def parse_schedules(text: str, virtual_stages: tuple[int, ...] = (DEFAULT_VIRTUAL_STAGES,)
                    ) -> tuple[PipelineSchedule, ...]:
    """``1f1b,interleaved,zb-h1`` (or ``all``) -> choices; interleaved once per v in ``virtual_stages``."""
    names = list(SCHEDULES) if text.strip() == "all" else [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise ConfigError(f"--schedules: expected comma-separated names of {', '.join(SCHEDULES)} or 'all', "
                          f"got {text!r}")
    out: list[PipelineSchedule] = []
    for name in names:
        if name not in SCHEDULES:
            raise ConfigError(f"--schedules: unknown schedule {name!r} (choose from {', '.join(SCHEDULES)} or 'all')")
        for v in (virtual_stages if name == "interleaved" else (1,)):
            choice = _search_choice(name, v, "--virtual-stages")
            if choice not in out:
                out.append(choice)
    return tuple(out)


def check_schedules(schedules) -> tuple[PipelineSchedule, ...]:
    """The search's choices from names and/or PipelineSchedules (a name alone: interleaved gets v = 2);
    only name and v are kept (the planner derives the rest per layout)."""
    if isinstance(schedules, (str, PipelineSchedule)) or not schedules:
        raise ConfigError(f"plan: schedules must be a non-empty sequence of schedule names or PipelineSchedule, "
                          f"got {schedules!r}")
    out = []
    for s in schedules:
        if isinstance(s, PipelineSchedule):
            out.append(_search_choice(s.name, s.virtual_stages, "plan"))
        elif isinstance(s, str):
            out.append(_search_choice(s, DEFAULT_VIRTUAL_STAGES if s == "interleaved" else 1, "plan"))
        else:
            raise ConfigError(f"plan: a schedule must be a name or a PipelineSchedule, got {s!r}")
    return tuple(dict.fromkeys(out))


def runnable(choice: PipelineSchedule, layers: int, pp: int, accum: int) -> bool:
    """Whether the schedule can run this layout (interleaved: more than one stage, P*v chunks with a
    layer each, and the order's micro-batch rule, ``PipelineSchedule.runs``)."""
    if choice.name != "interleaved":
        return True
    if pp == 1 or pp * choice.virtual_stages > layers:
        return False
    return choice.runs(pp, accum)


def stage_chunks(model: ModelSpec, pp: int, partition: str, choice: PipelineSchedule) -> list[list[range]]:
    """Per stage, its chunks' layers in local chunk order (one chunk per stage except interleaved)."""
    if choice.name != "interleaved":
        return [[r] for r in partition_model(model, pp, partition)]
    chunks = partition_model(model, pp * choice.virtual_stages, partition)
    return [[chunks[c * pp + p] for c in range(choice.virtual_stages)] for p in range(pp)]


def chunk_kinds(terms: CostTerms, chunks: list[list[range]], layers: int) -> list[list[LayerKind]]:
    """Per stage, its layers' kinds in local chunk order: the model's first layer carries the embedding,
    its last the LM head (as ``stage_kinds`` does for one chunk per stage)."""
    out = []
    for stage in chunks:
        ks: list[LayerKind] = []
        for r in stage:
            for i in r:
                if layers == 1:
                    ks.append(terms.only)
                elif i == 0:
                    ks.append(terms.first)
                elif i == layers - 1:
                    ks.append(terms.last)
                else:
                    ks.append(terms.mid)
        out.append(ks)
    return out


def weight_shares(profile, kinds: list[list[LayerKind]], layers_of: list[list[int]]) -> list[float]:
    """Per stage, the weight gradient W's milliseconds per micro-batch (ZB-H1's deferred part): the
    profile's dW GEMMs per layer (``weight_gradient_ms``; embedding and LM head on the first/last layer),
    each capped at the layer's backward. A profile without timed GEMMs uses DEFAULT_WEIGHT_FRACTION."""
    try:
        w = weight_gradient_ms(profile)
    except (AttributeError, TypeError):
        w = None
    last = max(i for stage in layers_of for i in stage)
    out = []
    for ks, idx in zip(kinds, layers_of, strict=True):
        total = 0.0
        for k, i in zip(ks, idx, strict=True):
            if w is None:
                total += DEFAULT_WEIGHT_FRACTION * k.backward
            else:
                ms = w["layer"] + (w["first"] if i == 0 else 0.0) + (w["last"] if i == last else 0.0)
                total += min(k.backward, ms)
        out.append(total)
    return out


def _backward_rise(steps: list[int]) -> int:
    """The largest running sum of per-layer byte changes (0 if the bytes only fall)."""
    run = best = 0
    for d in steps:
        run += d
        best = max(best, run)
    return best


class ScheduleMemory:
    """The worst stage's peak bytes of a layout under a schedule (see the module docstring); caches the
    op orders and per-layer sizes for many configurations of one model."""

    def __init__(self, model: ModelSpec, partition: str, constants: MemoryConstants = DEFAULT_CONSTANTS):
        self.model, self.partition, self.constants = model, partition, constants
        self._orders: dict[tuple, list] = {}
        self._wbytes: dict[tuple, list[int]] = {}
        self._chunks: dict[tuple, list[list[range]]] = {}
        self._per_layer: dict[tuple, int] = {}
        self._base: dict[tuple, int] = {}
        self._live: dict[tuple, list[int]] = {}

    def chunks(self, pp: int, choice: PipelineSchedule) -> list[list[range]]:
        """``stage_chunks`` of the model, cached per (P, schedule name, v)."""
        key = (pp, choice.name, choice.virtual_stages)
        got = self._chunks.get(key)
        if got is None:
            got = self._chunks[key] = stage_chunks(self.model, pp, self.partition, choice)
        return got

    def _order(self, choice: PipelineSchedule, pp: int, accum: int) -> list:
        key = (choice.name, choice.virtual_stages, pp, accum)
        got = self._orders.get(key)
        if got is None:
            got = self._orders[key] = build(choice, pp, accum)
        return got

    def stage_peaks(self, choice: PipelineSchedule, pp: int, dp: int, tp: int, zero: int, b: int, accum: int, seq: int,
                    activation: str, prefetch: str) -> list[int]:
        """Per stage: Eq. 9 without activations + the peak of the order's live activation sets."""
        model = self.model
        chunks = self.chunks(pp, choice)
        live = self.live_peaks(choice, pp, tp, b, accum, seq, activation == "full")
        out = []
        for p, (stage, peak) in enumerate(zip(chunks, live, strict=True)):
            n_layers = sum(len(r) for r in stage)
            key = (pp, dp, tp, zero, b, seq, activation, prefetch, p == 0, p == pp - 1, n_layers)
            base = self._base.get(key)
            if base is None:       # the same for every schedule of the layout
                base = self._base[key] = stage_bytes_without_activations(
                    model, pp=pp, dp=dp, tp=tp, zero=zero, micro_batch=b, seq=seq, activation=activation,
                    prefetch=prefetch, first=p == 0, last=p == pp - 1, n_layers=n_layers, constants=self.constants)
            out.append(base + peak)
        return out

    def live_peaks(self, choice: PipelineSchedule, pp: int, tp: int, b: int, accum: int, seq: int, full: bool
                   ) -> list[int]:
        """Per stage, the peak bytes of the activation sets the order keeps alive: they depend on the layout's
        P, T, b, A and on whether activations are kept whole, not on D, ZeRO or prefetch (so a layout's ZeRO
        stages and policies walk the order once)."""
        key = (choice.name, choice.virtual_stages, pp, tp, b, accum, seq, full)
        got = self._live.get(key)
        if got is None:
            got = self._live[key] = self._walk_live(choice, pp, tp, b, accum, seq, full)
        return got

    def _walk_live(self, choice: PipelineSchedule, pp: int, tp: int, b: int, accum: int, seq: int, full: bool
                   ) -> list[int]:
        model, L = self.model, self.model.layers
        chunks = self.chunks(pp, choice)
        per_layer = self._per_layer.get((full, b, seq, tp))
        if per_layer is None:
            per_layer = self._per_layer[(full, b, seq, tp)] = (layer_full_bytes(model, b, seq, tp) if full
                                                               else layer_checkpoint_bytes(model, b, seq))
        tokens = b * seq * TOKEN_BYTES
        split = choice.name == "zb-h1"
        if split:
            key = (b, seq, tp)
            wb = self._wbytes.get(key)
            if wb is None:
                wb = self._wbytes[key] = layer_weight_gradient_bytes(model, L, b, seq, tp)
        orders = self._order(choice, pp, accum)
        out = []
        for stage, ops in zip(chunks, orders, strict=True):
            held = [len(r) * per_layer + (tokens if r.start == 0 else 0) + (tokens if r.stop == L else 0)
                    for r in stage]
            kept = [sum(wb[i] for i in r) for r in stage] if split else [0] * len(stage)
            # under zb-h1 a layer's B swaps its set for what W reads, last layer first: the stage's bytes can
            # rise inside the B (e.g. the LM head's logits gradient), so the B's own peak is a prefix maximum
            rise = [_backward_rise([wb[i] - per_layer for i in reversed(r)]) if split else 0 for r in stage]
            cur = peak = 0
            for kind, _, c in ops:
                if kind == "F":
                    cur += held[c]
                    peak = max(peak, cur)
                elif kind == "B":
                    peak = max(peak, cur + rise[c])
                    cur += kept[c] - held[c]
                    peak = max(peak, cur)
                else:
                    cur -= kept[c]
            out.append(peak)
        return out

    def peak(self, choice: PipelineSchedule, pp: int, dp: int, tp: int, zero: int, b: int, accum: int, seq: int,
             activation: str, prefetch: str) -> int:
        return max(self.stage_peaks(choice, pp, dp, tp, zero, b, accum, seq, activation, prefetch))


__all__ = ["DEFAULT_VIRTUAL_STAGES", "ONE_F_ONE_B", "ScheduleChoice", "ScheduleMemory", "check_schedules",
           "chunk_kinds", "parse_schedules", "runnable", "stage_chunks", "weight_shares"]
