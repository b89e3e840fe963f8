"""The main job's experiments by name, in run order, with one line on what each shows and its typical
cost: what ``ratrain reproduce --help`` lists and its argument accepts, importable without the
experiments (and so without the emulator). ``ratrain.repro.report.catalog`` pairs each with its runner.
``cost``: the CPU time one run measured with the shipped profiles once the emulator is compiled (on
idle cores about its wall time; the ranking study simulates on two processes); a run records each
experiment's cost as ``timing`` (wall_s, cpu_s) in ``results/<key>.json``: update it from there."""
from __future__ import annotations

import os

# key: (summary, cost)
EXPERIMENTS: dict[str, tuple[str, str]] = {
    "table5": ("Table 5: emulated FP16 GEMM utilization on the five shapes, and why", "<1 min"),
    "table5_study": ("Table 5: which DDR rate and calibration could meet the target", "<1 min"),
    "tune": ("tile tuner on the Table 5 shapes (the tiles --tiles tuned uses)", "<1 min"),
    "attention": ("Fig. 10: memory-resident vs DDR-staged attention backward", "<1 min"),
    "table2": ("Table 2: RATrain vs GPU-style strategies at 256 clusters", "<1 min"),
    "table3": ("Table 3: fewest clusters that fit 20 GB, and the layout", "<1 min"),
    "table4": ("Table 4: planner prediction vs event simulation", "<1 min"),
    "table6": ("Table 6: LLaMA-2-7B scale-out from 256 to 1024 clusters", "<1 min"),
    "ablation": ("ablation: FSR, update-prefetch and layer-wise sync switched off", "<1 min"),
    "schedules": ("RATrain's layouts under 1F1B, GPipe, interleaved and ZB-H1", "<1 min"),
    "budget": ("the planner's choice and RATrain's advantage at 12-30 GB budgets", "<1 min"),
    "sensitivity": ("what the platform would have to be for the missed rows", "~1 min"),
    "stragglers": ("does a cluster-time spread explain Table 6's efficiency loss", "<1 min"),
    "platforms": ("a second platform: do the principles transfer beyond MT-3000", "<1 min"),
    "ranking": ("does the planner rank configurations as the simulator does", "~1 min"),
    "fig9": ("Fig. 9: utilization and training time over sequence length", "<1 min"),
    "correctness": ("lifecycle scheduling changes timing, not learning (a small model trained)", "<1 min"),
    "measured": ("the simulator against 1,440 measured runs on an A100 node", "<1 min"),
    "cross_platform": ("the paper's premise on MT-3000 and on GPU clusters", "<1 min"),
}
EXPERIMENT_NAMES = tuple(EXPERIMENTS)


def experiments_help() -> str:
    """One line per experiment, with its typical cost (``ratrain reproduce --help``)."""
    width = max(map(len, EXPERIMENTS))
    return ("experiments (rough CPU time with the shipped profiles once the emulator is compiled; the "
            "first run adds about 3 min of compiling and emulating):\n") + "\n".join(
        f"  {key:{width}s}  {cost:>7s}  {summary}" for key, (summary, cost) in EXPERIMENTS.items())


__all__ = ["EXPERIMENTS", "EXPERIMENT_NAMES", "experiments_help"]


def default_jobs() -> int:
    """Processes the main job runs on by default: two where this process may use two cores or more, else
    one. With two, the emulator's experiments run in a worker, and the other process waits for it
    before it would load or compile any jitted code (``ratrain.repro.report._run_split``), so only
    one process at a time uses Numba's cache."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:              # no affinity call (macOS): every core
        cores = os.cpu_count() or 1
    return 2 if cores >= 2 else 1
