# FP16 vector add z = x + y on one DSP: DDR -> AM by DMA, four 192-lane vectors, AM -> DDR.
#
#   mtemu run examples/vector_add.s --input x=x.npy --input y=y.npy --output z
#
# The ISA has no vector add: z = y + x * 1.0 is one FMA per vector (x * 1.0 is exact; the FP32
# sum rounded to FP16 equals FP16 addition, since FP32 carries more than 2 x 11 + 2 bits).
#
# @dsps 1
# @input  x=DDR:0:768:float16
# @input  y=DDR:1536:768:float16
# @output z=DDR:3072:768:float16
#
# Cycles, by hand (default platform: DDR 51 GB/s at 1.7578125 GHz = 51/1.7578125 bytes per cycle,
# DMA latency 600 cycles, no per-row overhead). A 1536-byte row holds the DDR server for
# 1536 * 1.7578125 / 51 = 2700/51 = 52.94 cycles.
#   cycle 0      dma x: starts at 0 + 600, ends 652.94 -> channel 0 done at ceil = 653
#   cycle 1      dma y: starts when the server frees, 652.94, ends 705.88 -> channel 1 done at 706
#   cycle 2      dmawait 0 blocks until 653;  cycle 653: dmawait 1 blocks until 706
#   706..724     19 compute bundles (loads, 9-cycle load latency, 4 FMAs, 6-cycle FMA latency, 4 stores)
#   725..727     3 nops: the last store lands 4 cycles after it issues, before the DMA reads AM
#   cycle 728    dma z: starts at 728 + 600 = 1328 (server idle), ends 1380.94 -> done at 1381
#   cycle 729    dmawait 2 blocks until 1381;  cycle 1381: halt
#   total        1382 cycles (on platforms/mt3000-30gbps.toml, 30 GB/s and 2.1 cycles per row: 1501)
.desc in  src=DDR dst=AM rows=1 row_bytes=1536 src_stride=1536 dst_stride=1536 mode=copy
.desc out src=AM dst=DDR rows=1 row_bytes=1536 src_stride=1536 dst_stride=1536 mode=copy
{ dma 0, in, [s0+0], [s0+0] | smovi s1, 0x3c00 }   # x -> AM[0, 1536); s1 = FP16 bits of 1.0
{ dma 1, in, [s0+1536], [s0+1536] }                 # y -> AM[1536, 3072)
{ dmawait 0 }
{ dmawait 1 }
# four vectors of x and y (192 FP16 lanes = 384 bytes each), two vector loads per bundle
{ vldh v1, [s0+0] | vldh v2, [s0+1536] | svbcast v0, s1 }
{ vldh v3, [s0+384] | vldh v4, [s0+1920] }
{ vldh v5, [s0+768] | vldh v6, [s0+2304] }
{ vldh v7, [s0+1152] | vldh v8, [s0+2688] }
{ nop }                                  # v1, v2 land 9 cycles after their load
{ nop }
{ nop }
{ nop }
{ nop }
{ vfma v2, v1, v0 }                      # v2 = y0 + x0 * 1.0
{ vfma v4, v3, v0 }
{ vfma v6, v5, v0 }
{ vfma v8, v7, v0 }
{ nop }                                  # v2 lands 6 cycles after its FMA
{ nop }
{ vsth [s0+3072], v2 }                   # round to FP16 into AM[3072, 4608)
{ vsth [s0+3456], v4 }
{ vsth [s0+3840], v6 }
{ vsth [s0+4224], v8 }
{ nop }
{ nop }
{ nop }
{ dma 2, out, [s0+3072], [s0+3072] }     # z -> DDR[3072, 4608)
{ dmawait 2 }
{ halt }
