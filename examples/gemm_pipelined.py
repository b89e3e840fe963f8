"""A software-pipelined GEMM micro-kernel on one DSP: C[4, 384] = A[4, K] B[K, 384], FP16 in and out.

    mtemu run examples/gemm_pipelined.py --input a=a.npy --input b=b.npy --output c

The paper's Table 1 pipeline at the scale of one micro-kernel. A (4 x K) goes DDR -> SM, B
(K x 384) DDR -> AM. For every k: four scalar loads of A[r, k] (SLDST), four broadcasts into
vectors (SMAC1), two vector loads of the B row (VLDST1), then eight FMAs (VMAC) into the 4 x 2
vector accumulators C[r, c] (two 192-lane vectors per row). VMAC is the bottleneck (8 issues per
k), so the schedule is a modulo schedule of period 8: with T0 = 11,

    vfma   C[r][c] += a[r] * b[k % 2][c]   at T0 + 8k + 2r + c
    svbcast a[r] <- A[r, k]                at 8k + 2r + 7       (broadcast latency 4)
    sldh   s[r]  <- A[r, k]                at 8k + 2r           (scalar load latency 7)
    vldh   b[k % 2][c] <- B[k, c]          at 8k + c + 2        (vector load latency 9)

so the loads for k + 1 issue under the FMAs of k. Operand registers rotate where a value is
still being read when the next one would arrive: B rows use two register sets (b[k % 2]); A's
scalars and broadcast vectors need only one. The accumulators start at zero (broadcasts of s0 on
SMAC2 in cycles 0..7). Every FMA reads what it needs exactly when it lands, which the assembler
checks (change a cycle above and it refuses the program, naming bundle, unit and register).
``pipelined=False`` builds the same k step without overlap (19 cycles per k instead of 8).

Numerics: FP16 products are exact in FP32 and each accumulator sums over k in order, rounded to
FP16 once (``vsth``): bit-exact with :func:`reference`.

Cycles, by hand, K = 16 (default platform: DDR 51/1.7578125 bytes per cycle, DMA latency 600, no
per-row overhead):

- cycle 0: dma A (128 B): DDR server from 600, 128 * 1.7578125 / 51 = 4.41 cycles -> done 605;
  cycle 1: dma B (12288 B): starts when the server frees (604.41), 423.53 cycles -> ends
  1027.94, done 1028; cycle 2: dmawait A until 605; cycle 605: dmawait B until 1028.
- compute from S = 1028: the last FMA issues at T0 + 8(K - 1) + 7 = 8K + 10 = 138 and lands at
  144; accumulator i = 2r + c is stored as it lands, at 8K + 9 + i, the last at 8K + 16 = 144;
  three nops let that store land; the C DMA issues at S + 8K + 20 = 1176.
- dma C (3072 B): 600 + 105.88 -> done at 1176 + 706 = 1882; the dmawait at 1177 waits until
  then; the halt issues at 1882: total 1883 cycles (pipelined).
- Not pipelined, each k takes 19 cycles (loads 0..3, broadcasts 7..10, FMAs 11..18): accumulator
  i lands at 19(K - 1) + 17 + i and is stored then, 19K - 2 .. 19K + 5; three nops; the C DMA at
  S + 19K + 9 = 1341 is done at 2047: total 2048 cycles. The pipeline saves 11 cycles per k
  (165 here); with the DMAs around it the kernel is still latency-bound (``mtemu explain``).
"""
from __future__ import annotations

import numpy as np

from mtemu.assembler import Instr, ProgramBuilder, ins
from mtemu.platform import Platform
from mtemu.program_runner import Kernel, Region

DSPS = 1
ROWS, VECS, K = 4, 2, 16
T0 = 11                              # first FMA: scalar load (7) + broadcast (4)
SM_A, AM_B = 0, 0


def _schedule(platform: Platform, pipelined: bool) -> dict[int, list[Instr]]:
    """cycle -> instructions of the compute phase (A in SM at SM_A, B in AM at AM_B, C FP16 after B)."""
    lanes = platform.vector_lanes
    n = VECS * lanes
    am_c = AM_B + K * n * 2
    acc = [[r * VECS + c for c in range(VECS)] for r in range(ROWS)]     # v0..v7
    va = [8 + r for r in range(ROWS)]                                    # v8..v11
    vb = [[12 + j * VECS + c for c in range(VECS)] for j in range(2)]    # v12..v15
    s = [1 + r for r in range(ROWS)]                                     # s1..s4
    at: dict[int, list[Instr]] = {}

    def put(cycle: int, instr: Instr) -> None:
        at.setdefault(cycle, []).append(instr)

    period = 8 if pipelined else 19                  # VMAC-bound, or one k after the other
    for i in range(ROWS * VECS):
        put(i, ins("svbcast", i, 0, unit="SMAC2"))   # C = 0
    for k in range(K):
        base = period * k
        for r in range(ROWS):
            put(base + 2 * r if pipelined else base + r, ins("sldh", s[r], (0, SM_A + (r * K + k) * 2)))
            put(base + 2 * r + 7 if pipelined else base + r + 7, ins("svbcast", va[r], s[r], unit="SMAC1"))
        for c in range(VECS):
            put(base + c + 2 if pipelined else base, ins("vldh", vb[k % 2][c], (0, AM_B + (k * n + c * lanes) * 2)))
        for r in range(ROWS):
            for c in range(VECS):
                put(base + T0 + 2 * r + c, ins("vfma", acc[r][c], va[r], vb[k % 2][c]))
    last = period * (K - 1) + T0 + platform.latencies.vmac - 1          # cycle before acc 0 lands
    for r in range(ROWS):
        for c in range(VECS):
            i = 2 * r + c
            put(last + 1 + i, ins("vsth", (0, am_c + (r * n + c * lanes) * 2), acc[r][c]))
    return at


def build(platform: Platform, pipelined: bool = True) -> Kernel:
    lanes = platform.vector_lanes
    n = VECS * lanes
    a_bytes, b_bytes, c_bytes = ROWS * K * 2, K * n * 2, ROWS * n * 2
    am_c = AM_B + b_bytes
    ddr_a, ddr_b, ddr_c = 0, a_bytes, a_bytes + b_bytes
    b = ProgramBuilder(platform)
    da = b.descriptor("DDR", "SM", 1, a_bytes, a_bytes, a_bytes, name="a")
    db = b.descriptor("DDR", "AM", 1, b_bytes, b_bytes, b_bytes, name="b")
    dc = b.descriptor("AM", "DDR", 1, c_bytes, c_bytes, c_bytes, name="c")
    b.bundle(ins("dma", 0, da, (0, ddr_a), (0, SM_A)))
    b.bundle(ins("dma", 1, db, (0, ddr_b), (0, AM_B)))
    b.bundle(ins("dmawait", 0))
    b.bundle(ins("dmawait", 1))
    at = _schedule(platform, pipelined)
    for cycle in range(max(at) + 1):
        b.bundle(*at.get(cycle, [ins("nop")]))
    b.nops(platform.latencies.vector_store - 1)      # the last store lands before the DMA reads C
    b.bundle(ins("dma", 2, dc, (0, am_c), (0, ddr_c)))
    b.bundle(ins("dmawait", 2))
    b.bundle(ins("halt"))
    return Kernel([b.assemble()],
                  inputs={"a": Region("DDR", ddr_a, (ROWS, K), "float16"),
                          "b": Region("DDR", ddr_b, (K, n), "float16")},
                  outputs={"c": Region("DDR", ddr_c, (ROWS, n), "float16")},
                  useful_macs=ROWS * K * n)


def reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """FP32 accumulation over k in order, one rounding to FP16 (the kernel's arithmetic)."""
    acc = np.zeros((a.shape[0], b.shape[1]), np.float32)
    for k in range(a.shape[1]):
        acc = acc + a[:, k:k + 1].astype(np.float32) * b[k:k + 1, :].astype(np.float32)
    return acc.astype(np.float16)
