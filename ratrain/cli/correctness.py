"""`ratrain correctness`: the Fig.-7 correctness run on the tiny model (Baseline-1F1B vs RATrain)."""
from __future__ import annotations

import argparse
import sys
import time

from ratrain.cli.defaults import CORRECTNESS_DEFAULTS

# its own folder: a reproduction writes results/correctness, which this must not replace
DEFAULT_OUT = "ratrain-correctness"


def register(subparsers) -> None:
    d = argparse.Namespace(**CORRECTNESS_DEFAULTS)      # CorrectnessConfig's, without loading NumPy
    p = subparsers.add_parser(
        "correctness",
        help="train a tiny model under Baseline-1F1B and RATrain timelines; compare loss curves (Fig. 7)",
        description=__doc__)
    p.add_argument("--steps", type=int, default=d.steps, help=f"training steps (default {d.steps})")
    p.add_argument("--stages", type=int, default=d.stages, help=f"pipeline stages P (default {d.stages})")
    p.add_argument("--dp", type=int, default=d.dp, help=f"data-parallel replicas D (default {d.dp})")
    p.add_argument("--microbatches", type=int, default=d.microbatches,
                   help=f"micro-batches per step A (default {d.microbatches})")
    p.add_argument("--layers", type=int, default=d.layers, help=f"decoder layers (default {d.layers})")
    p.add_argument("--hidden", type=int, default=d.hidden, help=f"hidden size (default {d.hidden})")
    p.add_argument("--heads", type=int, default=d.heads, help=f"attention heads (default {d.heads})")
    p.add_argument("--seq", type=int, default=d.seq, help=f"sequence length (default {d.seq})")
    p.add_argument("--micro-batch-size", type=int, default=d.micro_batch_size,
                   help=f"sequences per micro-batch (default {d.micro_batch_size})")
    p.add_argument("--lr", type=float, default=d.lr, help=f"Adam learning rate (default {d.lr})")
    p.add_argument("--seed", type=int, default=d.seed, help=f"init and data seed (default {d.seed})")
    p.add_argument("--no-reorder-reference", action="store_true",
                   help="skip the yardstick run that sums micro-batch gradients in reverse order")
    p.add_argument("--out", default=DEFAULT_OUT,
                   help=f"output folder (default {DEFAULT_OUT}/: its own, never a reproduction's results/)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(handler=handle)


class _Progress:
    """Progress on stderr, only once a run has taken more than a couple of seconds."""

    def __init__(self, total_runs: int, after_s: float = 2.0):
        self.t0 = time.perf_counter()
        self.after_s = after_s
        self.total_runs = total_runs
        self.run_index = 0
        self.last_label = None
        self.shown = False
        self.open_line = False

    def __call__(self, label: str, step: int, steps: int) -> None:
        if label != self.last_label:
            self.last_label = label
            self.run_index += 1
        elapsed = time.perf_counter() - self.t0
        if elapsed < self.after_s and not (self.shown and step == steps):
            return
        self.shown = True
        end = "\n" if (step == steps and self.run_index == self.total_runs) else ""
        self.open_line = not end
        print(f"\r[{elapsed:6.1f}s] run {self.run_index}/{self.total_runs} {label:<14} step {step}/{steps}",
              end=end, file=sys.stderr, flush=True)

    def close(self) -> None:
        """End a progress line left open (an error message then starts on its own line)."""
        if self.open_line:
            print(file=sys.stderr, flush=True)
            self.open_line = False


def handle(args: argparse.Namespace):
    from ratrain.replay.correctness import TARGET_MAX_REL_DEV, CorrectnessConfig, run_correctness, save_outputs
    cfg = CorrectnessConfig(steps=args.steps, stages=args.stages, dp=args.dp, microbatches=args.microbatches,
                            layers=args.layers, hidden=args.hidden, heads=args.heads, seq=args.seq,
                            micro_batch_size=args.micro_batch_size, lr=args.lr, seed=args.seed)
    reorder = not args.no_reorder_reference
    progress = _Progress(4 if reorder else 3)
    try:
        result = run_correctness(cfg, progress=progress, reorder_reference=reorder)
    finally:
        progress.close()
    save_outputs(result, args.out)
    payload = result.to_json()
    pct = lambda x: f"{100 * x:.4g}%"   # noqa: E731
    lines = [
        f"correctness run: tiny LLaMA-style model L={cfg.layers} H={cfg.hidden} seq={cfg.seq}, "
        f"P={cfg.stages} D={cfg.dp} A={cfg.microbatches} x {cfg.micro_batch_size} seqs, {cfg.steps} steps "
        f"({result.seconds:.1f} s)",
        "  loss         first     final",
        f"  Baseline-1F1B {result.baseline_loss[0]:.4f}   {result.baseline_loss[-1]:.4f}",
        f"  RATrain       {result.ratrain_loss[0]:.4f}   {result.ratrain_loss[-1]:.4f}",
        f"  single-stage  {result.single_stage_loss[0]:.4f}   {result.single_stage_loss[-1]:.4f}",
        f"  per-step relative deviation RATrain vs Baseline: max {pct(result.max_rel_dev)}, "
        f"mean {pct(result.mean_rel_dev)}, final {pct(result.final_rel_dev)} "
        f"(paper max {pct(TARGET_MAX_REL_DEV)}): {'PASS' if result.passed else 'FAIL'}"
        f"{', bit-identical' if payload['bit_identical'] else ''}",
        f"  single-stage vs Baseline: max {pct(payload['single_stage_max_rel_dev'])}"
        f"{', bit-identical' if payload['single_stage_bit_identical'] else ''}",
        *([f"  yardstick, same maths with micro-batch gradients summed in reverse (FP32 rounding only): "
           f"max {pct(payload['reordered_max_rel_dev'])}, mean {pct(payload['reordered_mean_rel_dev'])}, "
           f"final {pct(payload['reordered_final_rel_dev'])}"] if reorder else []),
        f"  RATrain per step: {result.ratrain_stats['recovered_by_r_per_step']} FSR recoveries, "
        f"{result.ratrain_stats['recomputed_at_backward_per_step']} backward-time recomputes; "
        f"Baseline: {result.baseline_stats['recomputed_at_backward_per_step']} backward-time recomputes",
        f"  plot: {result.plot}",
    ]
    return payload, "\n".join(lines)
