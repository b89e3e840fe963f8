"""The paper's published figures (arXiv 2606.10415), used only as targets beside our results.

Copied from docs/reference/paper-targets.md. Nothing in the library computes with these
numbers except to compare and to report.
"""
from __future__ import annotations

# Fig. 10: memory-resident attention backward over a DDR-staged baseline (head dim 128).
FIG10_SPEEDUP = (1.24, 1.54)

# Table 2: 256 clusters, global batch 4096 sequences of 2048 tokens.
TABLE2 = [
    # model, method, P, D, T, Z, activation, peak_gb, step_s, slowdown
    ("llama2-13b", "ratrain", 2, 128, 1, 2, "fsr", 15.84, 688.09, 1.00),
    ("llama2-13b", "tp-heavy", 2, 64, 2, 2, "fsr", 16.51, 826.53, 1.20),
    ("llama2-13b", "zero3-heavy", 2, 128, 1, 3, "fsr", 14.73, 717.93, 1.04),
    ("llama2-13b", "backward-ckpt", 2, 128, 1, 2, "ckpt", 15.73, 937.04, 1.36),
    ("llama2-13b", "full-save", None, None, None, None, "full", None, None, None),
    ("llama2-13b", "tuned", 2, 128, 1, 2, "ckpt", 15.73, 945.84, 1.37),
    ("qwen2.5-32b", "ratrain", 8, 32, 1, 2, "fsr", 14.71, 1592.51, 1.00),
    ("qwen2.5-32b", "tp-heavy", 8, 16, 2, 2, "fsr", 19.45, 1922.66, 1.21),
    ("qwen2.5-32b", "zero3-heavy", 8, 32, 1, 3, "fsr", 16.54, 1798.78, 1.13),
    ("qwen2.5-32b", "backward-ckpt", 8, 32, 1, 2, "ckpt", 14.50, 2162.54, 1.36),
    ("qwen2.5-32b", "full-save", None, None, None, None, "full", None, None, None),
    ("qwen2.5-32b", "tuned", 8, 32, 1, 2, "ckpt", 14.50, 2167.81, 1.36),
]
TABLE2_CLUSTERS = 256
TABLE2_GLOBAL_BATCH = 4096

# Table 3: minimum feasible clusters under 20 GB (T=1, ZeRO-2). Global batch derived.
TABLE3 = [
    # model, min_clusters, P, D, A, peak_gb, step_s, global_batch
    ("llama2-7b", 8, 2, 4, 128, 19.57, 1304.13, 512),
    ("baichuan2-13b", 16, 8, 2, 128, 19.06, 743.15, 256),
    ("qwen2.5-32b", 64, 16, 4, 128, 18.14, 873.85, 512),
    ("llama2-70b", 96, 48, 2, 16, 19.46, 281.32, 32),
]

# Table 4: planner prediction vs measurement.
TABLE4 = [
    # model, clusters, predicted_s, measured_s, error
    ("llama2-7b", 256, 140.92, 144.28, 0.0233),
    ("baichuan2-13b", 256, 268.74, 276.61, 0.0285),
    ("qwen2.5-32b", 256, 441.83, 455.21, 0.0294),
    ("qwen2.5-32b", 512, 225.47, 231.36, 0.0255),
]

# Table 6: LLaMA-2-7B throughput-oriented scale-out.
TABLE6 = [
    # clusters, global_batch, step_s, tokens_per_s, speedup, efficiency
    (256, 2048, 144.28, 29069.73, 1.00, 1.000),
    (512, 4096, 145.75, 57558.07, 1.98, 0.990),
    (768, 6144, 147.23, 85465.01, 2.94, 0.980),
    (1024, 8192, 148.75, 112790.55, 3.88, 0.970),
]

# Ablation: Qwen2.5-32B, 256 clusters, P=8, D=32, T=1, Z=2, b=1, A=128.
ABLATION = [
    # variant, normalized_step, tail_amplification
    ("full", 1.00, 1.00),
    ("no-fsr", 1.33, None),
    ("no-update-prefetch", 1.01, 2.31),
    ("no-layerwise", 1.03, 4.59),
]
ABLATION_FULL_STEP_S = 1790.13
ABLATION_FULL_TAIL_S = 14.69

# Correctness run (Fig. 7).
CORRECTNESS_MAX_REL_DEV = 0.00081

# Targets of the reproduction.
TOL_TABLE2_SLOWDOWN = 0.07
TOL_TABLE2_PEAK_GB = 1.5
TOL_TABLE2_STEP_REL = 0.25
TOL_TABLE3_PEAK_GB = 1.0
TOL_TABLE4_ERROR = 0.03
TOL_TABLE6_EFFICIENCY = 0.015
TOL_ABLATION_FSR = 0.07

# Fig. 9: sequence length. 256 clusters, global batch 4096 sequences. The caption gives
# only the shape: MAC-only utilization rises from 512 to 2048 and dips slightly at 3072 and 4096;
# training time of Baichuan2-13B and Qwen2.5-32B falls from 512 to 2048 and rises after; LLaMA-2-7B
# "performs well around 1024 and 2048".
FIG9_MODELS = ("llama2-7b", "baichuan2-13b", "qwen2.5-32b")
FIG9_SEQS = (512, 1024, 2048, 3072, 4096)
FIG9_CLUSTERS = 256
FIG9_GLOBAL_BATCH = 4096
FIG9_VALLEY_MODELS = ("baichuan2-13b", "qwen2.5-32b")   # training time lowest at 2048
FIG9_SWEET_SEQS = (1024, 2048)                          # LLaMA-2-7B's best training time
# "slightly decreases": utilization at 3072 and 4096 at most this far (relative) below 2048's (our choice)
TOL_FIG9_DIP = 0.05
