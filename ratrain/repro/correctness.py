"""The correctness experiment: RATrain vs Baseline-1F1B on a real tiny model (paper Fig. 7)."""
from __future__ import annotations

from pathlib import Path

from ratrain.replay.correctness import CorrectnessConfig, run_correctness, save_outputs
from ratrain.repro import targets as paper
from ratrain.repro.experiment import Check, Experiment
from rtcommon.progress import Progress


def run_correctness_experiment(out: Path, progress: Progress, settings=None) -> Experiment:
    progress("Correctness: training Baseline-1F1B, RATrain and single-stage on the tiny model")
    result = run_correctness(CorrectnessConfig(steps=20))
    save_outputs(result, out / "correctness")
    d = result.to_json()
    rows = [{"step": i + 1, "baseline_loss": b, "ratrain_loss": r, "rel_dev": dv}
            for i, (b, r, dv) in enumerate(zip(result.baseline_loss, result.ratrain_loss, result.rel_dev,
                                               strict=False))]
    checks = [Check("max per-step relative loss deviation", d["max_rel_dev"], paper.CORRECTNESS_MAX_REL_DEV,
                    f"<= {paper.CORRECTNESS_MAX_REL_DEV}", d["max_rel_dev"] <= paper.CORRECTNESS_MAX_REL_DEV,
                    "bit-identical" if d["bit_identical"] else "differs"),
              Check("single-stage loop agrees", d["single_stage_max_rel_dev"], 0.0, "== 0",
                    d["single_stage_max_rel_dev"] == 0.0)]
    text = (f"RATrain vs Baseline-1F1B over {d['steps']} steps: max {d['max_rel_dev']:.3g}, mean "
            f"{d['mean_rel_dev']:.3g}, "
            f"final {d['final_rel_dev']:.3g} relative deviation (paper max {paper.CORRECTNESS_MAX_REL_DEV:.3%}); "
            f"bit-identical: {d['bit_identical']}")
    return Experiment("correctness", "Correctness: lifecycle scheduling changes timing, not learning", rows, checks,
                      [d["plot"]], text)
