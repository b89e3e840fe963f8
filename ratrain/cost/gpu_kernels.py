"""Kernel latencies on a GPU from a documented model: the GPU counterpart of the emulated profile.

Nothing here is emulated; every latency is a closed form over the platform's datasheet figures
(``ratrain.spec.gpu.GpuDevice``) and the constants of its kernel model
(``ratrain.spec.gpu.GpuKernelModel``: GEMM efficiency, HBM efficiency, launch cost; the step
overhead and the pipeline's host cost per send or receive are applied by ``ratrain.cost.megatron``),
which `ratrain validate fit-gpu` fits on measured runs (docs/VALIDATION.md says on which).

- GEMM ``C[m, n] = A[m, k] B[k, n]`` (FP16 in, FP32 accumulate), ``batch`` independent problems:
  the output is cut into tiles, one thread block each, and the blocks run in waves of one block
  per SM; a wave lasts one tile's 2 * tile_m * tile_n * k FLOPs at the SM's share of
  ``gemm_efficiency * peak`` (times the tile's share, :func:`gemm_tiles`). The library picks the
  tile with the fewest-wave time among a few around the platform's reference tile. This is the
  tile and wave quantization that makes a GEMM of n = 384 over 108 SMs cost as much as one of
  n = 512. With ``gemm_schedule = "stream-k"`` the library splits the tiles' k loops evenly over
  the SMs (cuBLAS's split-K and stream-K kernels), so only the tile quantization remains, not the
  partial last wave. A memory floor: the operands and the result
  cross HBM once, at ``hbm_efficiency`` of the bandwidth.
- Elementwise, normalisation, dropout, softmax, embedding: bytes moved / (HBM bandwidth x
  ``hbm_efficiency``); backward moves twice the forward's bytes (the incoming gradient and the
  saved input are read, the outgoing gradient written).
- The loss as Megatron computes it by default: the logits cast to FP32 and several passes over
  them each way (:data:`CROSS_ENTROPY_BYTES`, :func:`cross_entropy_profile`), not one FP16 pass.
- The host issues every kernel at ``launch_s`` each (PyTorch's eager dispatch and autograd
  bookkeeping, the CUDA launch): an operator lasts at least its kernels' issue time
  (:func:`operator_kernels` counts them).
- Megatron's fused kernels: the dropout and residual add after the attention projection and after
  the MLP run as one kernel (:data:`FUSED_DROPOUT_ADD`).
- Attention as Megatron runs it unfused: a batched GEMM Q K^T (seq x head_dim x seq per head),
  the fused scale-mask-softmax (reads and writes the seq x seq scores in FP16; PyTorch's five-kernel
  FP32 softmax where Megatron's kernel does not take the shape, :func:`fused_softmax`), and a batched GEMM
  of the probabilities with V; backward: four batched GEMMs (dV, dP, dQ, dK) and the softmax's
  backward (reads output and gradient, writes the input gradient). Attention dropout is its own
  elementwise operator in the model's operator list. Causal masking does not skip work in this
  kernel. With ``attention = "flash"``: one fused kernel doing the causal half of the FLOPs
  (forward 4 * b * heads * seq^2 * d / 2, backward 2.5x) at ``flash_efficiency`` of peak.

The profile this builds is a ``ratrain.cost.profile.LayerProfile`` with source ``gpu-model``, so
the cost terms read it as they read an emulated one.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict

from ratrain.cost.profile import DDR_TERMS, LayerProfile, OpProfile
from ratrain.spec.gpu import GpuPlatform
from ratrain.spec.models import FP16, ModelSpec, Operator, embedding_and_head_operators, layer_operators

GPU_SOURCE = "gpu-model"


def gemm_tiles(platform: GpuPlatform) -> list[tuple[int, int, float]]:
    """The output tiles a GEMM library picks among, with each one's share of the peak rate.

    Around the platform's reference tile (tm, tn): (2 tm, tn), (tm, 2 tn), (tm, tn), (tm, tn / 2),
    (tm / 2, tn), (tm / 2, tn / 2). A tile's rate is the reference's times min(1, its arithmetic
    intensity tm tn / (tm + tn) over the reference's): a smaller tile re-reads more operand bytes
    per FLOP from shared memory and L2, a larger one gains nothing past the peak. No constant is
    added: the reference tile and ``gemm_efficiency`` are the platform's.
    """
    tm, tn = platform.kernels.gemm_tile_m, platform.kernels.gemm_tile_n
    ref = tm * tn / (tm + tn)
    shapes = [(2 * tm, tn), (tm, 2 * tn), (tm, tn), (tm, max(tn // 2, 1)), (max(tm // 2, 1), tn),
              (max(tm // 2, 1), max(tn // 2, 1))]
    out = []
    for a, b in shapes:
        if (a, b) not in [(x, y) for x, y, _ in out]:
            out.append((a, b, min(1.0, a * b / (a + b) / ref)))
    return out


def gemm_seconds(m: int, k: int, n: int, platform: GpuPlatform, batch: int = 1) -> float:
    """One (batched) GEMM on the GPU: the fastest tile's wave-quantized (or stream-K) compute, or the
    HBM floor."""
    dev, km = platform.device, platform.kernels
    per_sm_flops = dev.peak_fp16_flops * km.gemm_efficiency / dev.sm_count
    stream_k = km.gemm_schedule == "stream-k"
    compute = math.inf
    for tm, tn, share in gemm_tiles(platform):
        tiles = math.ceil(m / tm) * math.ceil(n / tn) * batch
        # stream-K spreads the tiles' k loops evenly over the SMs: no partial last wave
        waves = tiles / dev.sm_count if stream_k else math.ceil(tiles / dev.sm_count)
        compute = min(compute, waves * 2.0 * tm * tn * k / (per_sm_flops * share))
    memory = batch * FP16 * (m * k + k * n + m * n) / (dev.hbm_bandwidth * km.hbm_efficiency)
    return max(compute, memory)


def bytes_seconds(nbytes: float, platform: GpuPlatform) -> float:
    """GPU time of bandwidth-bound kernels moving ``nbytes`` through HBM."""
    return nbytes / (platform.device.hbm_bandwidth * platform.kernels.hbm_efficiency)


def host_seconds(kernels: int, platform: GpuPlatform) -> float:
    """The host's time to issue ``kernels`` kernels."""
    return kernels * platform.kernels.launch_s


def operator_kernels(op: Operator, platform: GpuPlatform) -> tuple[int, int]:
    """Kernels the host issues for one operator: forward, backward (a collective counts as one)."""
    if op.kind == "gemm":
        return 1, 3 if op.bias else 2          # dgrad, wgrad (and the bias gradient's reduction)
    if op.kind == "attention":
        if platform.kernels.attention == "flash":
            return 1, 1
        extra = 0 if fused_softmax(op) else TORCH_SOFTMAX_KERNELS - 1
        return 3 + extra, 5 + extra
    if op.kind == "loss":
        return CROSS_ENTROPY_KERNELS
    return 1, 1


# Megatron's fused scale-mask-softmax kernel (FusedScaleMaskSoftmax.is_kernel_available) runs only
# when 16 < seq <= 4096, seq % 4 == 0 and the attention batches (micro-batch x heads per rank) are
# a multiple of 4, the batches one thread block takes for seq > 128 (4 warps, one row each).
# Otherwise it falls back to PyTorch in FP32: cast to float, scale, masked_fill_, softmax, cast
# back, five kernels each way (backward: the casts', the softmax's, the mask's and the scale's
# gradients), moving these bytes per score (forward 6 + 8 + 8 + 8 + 6, backward 6 + 12 + 8 + 8 + 6)
FUSED_SOFTMAX_BATCHES = 4
TORCH_SOFTMAX_KERNELS = 5
TORCH_SOFTMAX_BYTES = (36, 40)


def fused_softmax(op: Operator) -> bool:
    """Whether Megatron runs ``op``'s softmax as its fused kernel (else PyTorch's FP32 fallback)."""
    return 16 < op.seq <= 4096 and op.seq % 4 == 0 and (op.batch * op.heads) % FUSED_SOFTMAX_BATCHES == 0


def hbm_rate(platform: GpuPlatform) -> float:
    """Bytes/s a bandwidth-bound kernel reaches (the GPU's answer to the emulator's DDR rates)."""
    return platform.device.hbm_bandwidth * platform.kernels.hbm_efficiency


def attention_seconds(op: Operator, platform: GpuPlatform) -> tuple[float, float, list]:
    """Forward and backward seconds of one attention operator on one rank, and its kernels."""
    heads = op.batch * op.heads
    s, d = op.seq, op.head_dim
    if platform.kernels.attention == "flash":
        flops = 4.0 * heads * s * s * d * (0.5 if op.causal else 1.0)
        rate = platform.device.peak_fp16_flops * platform.kernels.flash_efficiency
        fwd, bwd = flops / rate, 2.5 * flops / rate
        return fwd, bwd, [["flash-fwd", heads, s, d, fwd], ["flash-bwd", heads, s, d, bwd]]
    scores = heads * s * s * FP16
    qk = gemm_seconds(s, d, s, platform, batch=heads)
    pv = gemm_seconds(s, s, d, platform, batch=heads)
    # fused: read and write the FP16 scores forward; backward reads y and dy, writes dx
    fwd_bytes, bwd_bytes = (2 * scores, 3 * scores) if fused_softmax(op) else \
        (heads * s * s * TORCH_SOFTMAX_BYTES[0], heads * s * s * TORCH_SOFTMAX_BYTES[1])
    softmax = bytes_seconds(fwd_bytes, platform)
    fwd = qk + softmax + pv
    # dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q, and the softmax's backward
    bwd = (gemm_seconds(s, s, d, platform, batch=heads) + gemm_seconds(s, d, s, platform, batch=heads)
           + 2 * gemm_seconds(s, s, d, platform, batch=heads) + bytes_seconds(bwd_bytes, platform))
    return fwd, bwd, [["qk", heads, s, d, s, qk], ["softmax", scores, softmax], ["pv", heads, s, s, d, pv]]


def _gemm_op(op: Operator, platform: GpuPlatform) -> OpProfile:
    """Forward GEMM; backward = data gradient (m, n, k) + weight gradient (k, m, n). A bias is added
    in the GEMM's epilogue forward and reduced over rows in backward (one pass over the output)."""
    parts = [(op.m, op.k, op.n), (op.m, op.n, op.k), (op.k, op.m, op.n)]
    timed = [(*shape, gemm_seconds(*shape, platform), GPU_SOURCE) for shape in parts]
    bias_bwd = bytes_seconds(op.m * op.n * FP16, platform) if op.bias else 0.0
    return OpProfile(op.name, op.kind, timed[0][3], timed[1][3] + timed[2][3] + bias_bwd,
                     gemms=[list(t) for t in timed])


def _gpu_times(op: Operator, platform: GpuPlatform) -> OpProfile:
    if op.kind == "gemm":
        return _gemm_op(op, platform)
    if op.kind == "attention":
        fwd, bwd, kernels = attention_seconds(op, platform)
        return OpProfile(op.name, op.kind, fwd, bwd, gemms=kernels)
    return OpProfile(op.name, op.kind, bytes_seconds(op.bytes_moved, platform),
                     bytes_seconds(2 * op.bytes_moved, platform), op.bytes_moved)


def operator_profile(op: Operator, platform: GpuPlatform) -> OpProfile:
    """Latencies of one forward operator and its backward on the GPU: each direction the longer of
    its GPU time and the host's time to issue its kernels (``operator_kernels`` x ``launch_s``).
    (Letting the host run ahead of the GPU across operators, so that short ones hide behind long
    ones, fits the measured runs worse: docs/VALIDATION.md.) A collective is 0 here: the cost terms
    put it on its link."""
    if op.kind == "allreduce":
        return OpProfile(op.name, op.kind, 0.0, 0.0, op.bytes_moved)
    prof = _gpu_times(op, platform)
    kf, kb = operator_kernels(op, platform)
    prof.forward_s = max(prof.forward_s, host_seconds(kf, platform))
    prof.backward_s = max(prof.backward_s, host_seconds(kb, platform))
    return prof


# dropout then residual add, which Megatron fuses (--bias-dropout-fusion, its default) into one kernel
FUSED_DROPOUT_ADD = {("attn_dropout", "attn_residual"), ("mlp_dropout", "mlp_residual")}


def _fused(ops: list[Operator], platform: GpuPlatform) -> list[OpProfile]:
    """Profiles of a layer's operators with each fused dropout-add pair as one kernel on the first
    of the two (the second takes no time): forward reads x and the residual and writes the sum and
    the 1-byte mask (7 bytes per element), backward reads the gradient and the mask and writes the
    input gradient (5); the residual's gradient passes through."""
    out, i = [], 0
    while i < len(ops):
        op = ops[i]
        if i + 1 < len(ops) and (op.name, ops[i + 1].name) in FUSED_DROPOUT_ADD:
            elements = op.bytes_moved // 5          # the dropout's bytes: read 2, write 2, mask 1
            floor = host_seconds(1, platform)
            out.append(OpProfile(op.name, op.kind, max(bytes_seconds(7 * elements, platform), floor),
                                 max(bytes_seconds(5 * elements, platform), floor), 7 * elements))
            out.append(OpProfile(ops[i + 1].name, ops[i + 1].kind, 0.0, 0.0, 0))
            i += 2
        else:
            out.append(operator_profile(op, platform))
            i += 1
    return out


# Megatron's loss as it runs by default (no --fp16-lm-cross-entropy): the FP16 logits are cast to
# FP32 and _VocabParallelCrossEntropy makes passes over them, bytes per logit: forward cast (read
# 2, write 4), max (4), subtract the max in place (8), exp in place (8), sum (4), divide by the sum
# in place (8), 38 in all; backward: subtract one at the targets (small), scale by the incoming
# gradient in place (8), cast back (read 4, write 2), 14. Kernels each way, the small per-token
# ones (target mask, gather of the target logits, log) included: 9 forward, 4 backward. The
# per-token all-reduces under T > 1 are ``ratrain.cost.megatron``'s, on the tensor group's link.
CROSS_ENTROPY_BYTES = (38, 14)
CROSS_ENTROPY_KERNELS = (9, 4)


def cross_entropy_profile(name: str, logits: int, platform: GpuPlatform) -> OpProfile:
    """Megatron's FP32 vocab-parallel cross-entropy over ``logits`` values on one rank."""
    fwd, bwd = (max(bytes_seconds(nbytes * logits, platform), host_seconds(kernels, platform))
                for nbytes, kernels in zip(CROSS_ENTROPY_BYTES, CROSS_ENTROPY_KERNELS, strict=True))
    return OpProfile(name, "loss", fwd, bwd, CROSS_ENTROPY_BYTES[0] * logits)


def platform_key(platform: GpuPlatform) -> str:
    """What a GPU profile's numbers depend on: the device and the kernel model (not the network)."""
    text = json.dumps({"device": asdict(platform.device), "kernels": asdict(platform.kernels)}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def gpu_layer_profile(spec: ModelSpec, micro_batch: int, seq: int, tp: int, platform: GpuPlatform) -> LayerProfile:
    """Per-layer forward/backward latencies of ``spec`` on one TP rank of the GPU platform."""
    ops = _fused(layer_operators(spec, micro_batch, seq, tp), platform)
    extra = embedding_and_head_operators(spec, micro_batch, seq, tp)
    first = [operator_profile(o, platform) for o in extra["first"]]
    logits = micro_batch * seq * (spec.vocab // tp)
    last = [cross_entropy_profile(o.name, logits, platform) if o.kind == "loss"
            else operator_profile(o, platform) for o in extra["last"]]
    rates = {term: hbm_rate(platform) for term in DDR_TERMS}
    return LayerProfile(spec.name, micro_batch, seq, tp, GPU_SOURCE, ops, first, last, platform_key(platform),
                        GPU_SOURCE, rates)


__all__ = ["CROSS_ENTROPY_BYTES", "CROSS_ENTROPY_KERNELS", "GPU_SOURCE", "attention_seconds", "bytes_seconds",
           "cross_entropy_profile", "gemm_seconds", "gemm_tiles", "gpu_layer_profile",
           "FUSED_DROPOUT_ADD", "TORCH_SOFTMAX_BYTES", "fused_softmax", "hbm_rate", "host_seconds", "operator_kernels",
           "operator_profile", "platform_key"]
