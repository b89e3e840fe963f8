"""Validation against the paper's kernel figures, from emulated cycles only: Table 5 (FP16 GEMM
utilization, :mod:`.table5`) and Fig. 10 (resident over DDR-staged attention backward,
:mod:`.attention`)."""
from .attention import PAPER_SPEEDUP, VALIDATE_SEQS, format_attention, validate_attention, validate_heads
from .table5 import (
                     FIT_ROWS,
                     NAIVE_TILES,
                     TABLE5,
                     TABLE5_M,
                     TABLE5_TOLERANCE_PP,
                     VARIANT_SHAPE,
                     Table5Row,
                     default_variant,
                     format_table5,
                     format_table5_summary,
                     format_table5_tiles,
                     format_variants,
                     table5,
                     table5_variants,
)

__all__ = ["FIT_ROWS", "NAIVE_TILES", "PAPER_SPEEDUP", "TABLE5", "TABLE5_M", "TABLE5_TOLERANCE_PP", "VALIDATE_SEQS",
           "VARIANT_SHAPE", "Table5Row", "default_variant", "format_attention", "format_table5",
           "format_table5_summary", "format_table5_tiles", "format_variants", "table5", "table5_variants",
           "validate_attention", "validate_heads"]
