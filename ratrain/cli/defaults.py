"""What the `ratrain` parsers show (defaults, choices) where the library's home of the value imports NumPy,
as plain constants, so that ``--help`` and an argument error load no NumPy. Each value has its home in the
library; tests/test_cli_startup.py checks every one against it."""
from __future__ import annotations

# ratrain.replay.correctness.CorrectnessConfig's fields the command sets, with their defaults
CORRECTNESS_DEFAULTS = {"steps": 40, "stages": 2, "dp": 2, "microbatches": 4, "layers": 4, "hidden": 64, "heads": 4,
                        "seq": 32, "micro_batch_size": 4, "lr": 3e-3, "seed": 0}
# ratrain.cost.megatron.ACTIVATION_MODES
GPU_ACTIVATION_MODES = ("full", "ckpt", "selective")
# ratrain.repro.gpu_fit.EVALUATIONS
FIT_EVALUATIONS = 160

__all__ = ["CORRECTNESS_DEFAULTS", "FIT_EVALUATIONS", "GPU_ACTIVATION_MODES"]
