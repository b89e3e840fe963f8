"""Dot product of two FP16 vectors, reduced across DSPs through GSM (run with ``mtemu run``).

    mtemu run examples/dot_gsm.py --input x=x.npy --input y=y.npy --output dot

Every DSP loads its chunk of x and y (VECTORS vectors of ``lanes`` FP16 each) from DDR into AM,
multiplies and accumulates them lane by lane in one FP32 register (each FMA waits for the
previous: a 6-cycle latency chain), stores the 192 lane sums to AM and adds them into one GSM
vector with a ``reduce_add`` DMA. After a barrier DSP 0 folds the GSM vector in halves
(192 -> 96 -> ... -> 3 -> 1 lanes, each a GSM -> GSM ``reduce_add``) and copies the FP32 result
to DDR. Memories start zeroed, so the GSM vector needs no clearing here (on hardware, clear it).

Numerics: the products of FP16 values are exact in FP32; the sums are FP32 in a fixed order
(per lane over the chunk's vectors; over DSPs in the order their reductions issue, which is the
order their y loads finish, below; then the halving tree), so the result is bit-exact with
:func:`reference` (NumPy, same order).

Cycles, by hand, for P DSPs (default platform; tests use P = 4). DDR moves 51/1.7578125 bytes per
cycle, GSM 1024/15; DMA latency 600; no per-row overhead. One 1536-byte chunk holds the DDR server
D = 1536 * 1.7578125 / 51 = 52.94 cycles.

- Cycle 0: every DSP issues its x load. The machine runs the DSP with the smallest clock until
  it reaches a DMA, wait or barrier while another DSP is behind it: DSPs 0..P-2 stop at their
  y load (cycle 1, DSP P-1 is still at 0); DSP P-1 issues x and, no one being behind it, y; then
  DSPs 0..P-2 issue y. The DDR server serves x_0..x_{P-1}, y_{P-1}, y_0..y_{P-2}, back to back
  from cycle 600: y_{P-1} is done at T_{P-1} = ceil(600 + (P + 1) D) and y_d (d < P-1) at
  T_d = ceil(600 + (P + d + 2) D). The last, T_{P-2} (T_0 if P = 1), is ceil(600 + 2 P D).
- From T_d: 37 bundles (loads, 4 FMAs 6 cycles apart, the store and its landing), then the
  reduce DMA at T_d + 37: 768 bytes on the GSM server, 768 * 15 / 1024 = 11.25 cycles, done
  at ceil(T_d + 37 + 600 + 11.25) = T_d + 649 (the DSPs are 53 cycles apart: no queueing). The
  dmawait at T_d + 38 releases at T_d + 649, the barrier bundle issues there: arrival T_d + 650.
- The barrier releases at R = ceil(600 + 2 P D) + 650.
- DSP 0 then issues one bundle (the not-taken branch) and eight dependent GSM -> GSM folds and the
  DDR copy, each ``dma; dmawait`` releasing at ceil(issue + 600 + bytes / rate):
  96 lanes (384 B) +606, 48 +603, 24 +602, then 12, 6, 3, 1, 1 lanes and the 4-byte DDR copy +601
  each, then the halt: R + 1 + 606 + 603 + 602 + 6 * 601 + 1 = R + 5419.
- P = 4: T_2 = ceil(600 + 8 * 52.94) = ceil(1023.53) = 1024, R = 1674, total 7093 cycles
  (:func:`expected_cycles` is this derivation for any P and platform rates; on
  platforms/mt3000-30gbps.toml, 2.1 cycles per row, 7426).
"""
from __future__ import annotations

import numpy as np

from mtemu.assembler import ProgramBuilder, ins
from mtemu.platform import Platform
from mtemu.program_runner import Kernel, Region

DSPS = 4
VECTORS = 4                     # vectors of x (and y) per DSP
R_X, R_Y, R_NOT_LEADER = 1, 2, 3
AM_X, GSM_ACC = 0, 0


def expected_cycles(dsps: int, platform: Platform) -> int:
    """The hand derivation above as a formula of the platform's rates, latency and row overhead."""
    lat, over = platform.dma_latency_cycles, platform.dma_row_overhead_cycles
    ddr, gsm = platform.ddr_bandwidth / platform.clock_hz, platform.gsm_bandwidth / platform.clock_hz
    lane_sums = platform.vector_lanes * 4                          # bytes of the FP32 lane sums
    chunk = VECTORS * platform.vector_lanes * 2 / ddr + over       # one x or y chunk on the DDR server
    t_last = int(np.ceil(lat + 2 * dsps * chunk))
    arrival = 37 + int(np.ceil(lat + lane_sums / gsm + over)) + 1  # from T_d to the barrier
    folds, width = [], platform.vector_lanes                        # lanes each fold moves, as build() folds
    while width % 2 == 0:
        width //= 2
        folds.append(width)
    folds += [1] * (width - 1)
    done = sum(int(np.ceil(lat + 4 * w / gsm + over)) for w in folds) + int(np.ceil(lat + 4 / ddr + over))
    return t_last + arrival + 1 + done + 1


def build(platform: Platform) -> Kernel:
    lanes = platform.vector_lanes
    vec = lanes * 2                               # bytes of one FP16 vector
    chunk = VECTORS * vec                         # bytes of x per DSP
    n = platform.dsps * VECTORS * lanes           # elements of x
    am_y, am_acc = chunk, 2 * chunk               # AM: x chunk, y chunk, FP32 lane sums
    ddr_y, ddr_out = n * 2, 4 * n                 # DDR: x, y, result
    b = ProgramBuilder(platform)
    load = b.descriptor("DDR", "AM", 1, chunk, chunk, chunk, name="load")
    reduce = b.descriptor("AM", "GSM", 1, lanes * 4, 0, 0, "reduce_add", name="reduce")
    b.bundle(ins("dma", 0, load, (R_X, 0), (0, AM_X)))
    b.bundle(ins("dma", 1, load, (R_Y, 0), (0, am_y)))
    b.bundle(ins("dmawait", 0))
    b.bundle(ins("dmawait", 1))
    # acc v0 = 0; load VECTORS pairs (x in odd, y in even registers), two loads per bundle
    for i in range(VECTORS):
        extra = [ins("svbcast", 0, 0)] if i == 0 else []      # s0 reads 0: FP16 zero
        b.bundle(ins("vldh", 2 * i + 1, (0, AM_X + i * vec)), ins("vldh", 2 * i + 2, (0, am_y + i * vec)), *extra)
    b.nops(9 - VECTORS)                          # the first pair lands 9 cycles after its load
    for i in range(VECTORS):
        b.bundle(ins("vfma", 0, 2 * i + 1, 2 * i + 2))        # v0 += x_i * y_i, lane by lane
        b.nops(platform.latencies.vmac - 1)                   # wait for v0 before the next FMA
    b.bundle(ins("vstw", (0, am_acc), 0))                     # 192 FP32 lane sums to AM
    b.nops(platform.latencies.vector_store - 1)
    b.bundle(ins("dma", 2, reduce, (0, am_acc), (0, GSM_ACC)))  # GSM[lane] += lane sum
    b.bundle(ins("dmawait", 2))
    b.bundle(ins("barrier"))
    b.bundle(ins("bnz", R_NOT_LEADER, "done"))
    # DSP 0: fold the GSM vector in halves while it is even, then add the last lanes one by one
    width = lanes
    folds = []
    while width % 2 == 0:
        width //= 2
        folds.append((width, width))              # GSM[0:w] += GSM[w:2w]
    folds += [(1, k) for k in range(1, width)]    # GSM[0] += GSM[k]
    for w, src in folds:
        d = b.descriptor("GSM", "GSM", 1, w * 4, 0, 0, "reduce_add", name=f"fold{w}_{src}")
        b.bundle(ins("dma", 3, d, (0, GSM_ACC + src * 4), (0, GSM_ACC)))
        b.bundle(ins("dmawait", 3))
    out = b.descriptor("GSM", "DDR", 1, 4, 0, 0, name="result")
    b.bundle(ins("dma", 3, out, (0, GSM_ACC), (0, ddr_out)))
    b.bundle(ins("dmawait", 3))
    b.label("done")
    b.bundle(ins("halt"))
    init = {d: {R_X: d * chunk, R_Y: ddr_y + d * chunk, R_NOT_LEADER: int(d != 0)} for d in range(platform.dsps)}
    return Kernel([b.assemble()], init_sregs=init,
                  inputs={"x": Region("DDR", 0, (n,), "float16"), "y": Region("DDR", ddr_y, (n,), "float16")},
                  outputs={"dot": Region("DDR", ddr_out, (1,), "float32")}, useful_macs=n)


def reference(x: np.ndarray, y: np.ndarray, dsps: int, lanes: int) -> np.float32:
    """The kernel's summation order in NumPy FP32."""
    prod = x.astype(np.float32) * y.astype(np.float32)          # exact
    chunks = prod.reshape(dsps, VECTORS, lanes)
    gsm = np.zeros(lanes, np.float32)
    for d in [dsps - 1] + list(range(dsps - 1)):                # the order the reductions issue
        acc = np.zeros(lanes, np.float32)
        for i in range(VECTORS):
            acc = acc + chunks[d, i]
        gsm = gsm + acc
    width = lanes
    while width % 2 == 0:
        width //= 2
        gsm[:width] = gsm[:width] + gsm[width:2 * width]
    for k in range(1, width):
        gsm[0] = gsm[0] + gsm[k]
    return gsm[0]
