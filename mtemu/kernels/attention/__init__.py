"""Attention on one emulated cluster: the paper's Algorithm 1 backward, a DDR-staged baseline of
it, and the forward kernel that produces O and the saved state Algorithm 1 consumes.

Modules: ``plan`` (default tiles, plan, shape/tile checks, how work items are dealt to DSPs),
``microkernels`` (shared straight-line kernels and their register convention), ``driver``
(per-DSP driver programs and the micro-kernel library), ``backward`` (Algorithm 1) and
``forward``. The paper check (Fig. 10) lives in :mod:`mtemu.validate.attention`.
"""
from .backward import (
                       AttentionResult,
                       attention_backward_timing,
                       build_attention_backward,
                       mk_delta,
                       mk_scores,
                       plan_attention,
                       run_attention_backward,
)
from .driver import AttentionProgram
from .forward import (
                       AttentionForwardResult,
                       attention_forward_timing,
                       build_attention_forward,
                       causal_bias_table,
                       mk_forward_scores,
                       mk_init,
                       mk_lse,
                       plan_attention_forward,
                       run_attention,
)
from .microkernels import mk_gemm, mk_round
from .plan import SCHEDULES, VARIANTS, AttentionPlan, default_tiles

__all__ = ["AttentionForwardResult", "AttentionPlan", "AttentionProgram", "AttentionResult", "SCHEDULES", "VARIANTS",
           "attention_backward_timing", "attention_forward_timing", "build_attention_backward",
           "build_attention_forward", "causal_bias_table", "default_tiles", "mk_delta", "mk_forward_scores",
           "mk_gemm", "mk_init", "mk_lse", "mk_round", "mk_scores", "plan_attention", "plan_attention_forward",
           "run_attention", "run_attention_backward"]
