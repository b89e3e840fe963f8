"""`mtemu validate`: the emulated kernels against the paper (Table 5, the Table 5 calibration
study, Fig. 10)."""
from __future__ import annotations

import argparse
import sys

from ..errors import MtemuError
from ..platform import Platform
from .args import (
    add_loop_order_args,
    add_platform_args,
    add_tile_args,
    any_tiles_from_args,
    parse_floats,
    platform_from_args,
)


def _validate(args: argparse.Namespace) -> tuple[dict, str]:
    from ..validate import format_attention, validate_attention
    if args.what == "dsp-family":
        return _dsp_family(args)
    plat = platform_from_args(args)
    if args.what == "table5":
        return _table5(args, plat)
    if args.what == "table5-study":
        return _table5_study(args, plat)
    if args.what == "attention":
        rows = validate_attention(plat, progress=not args.json)
        return {"rows": rows, "platform_hash": plat.digest()}, format_attention(rows)
    raise MtemuError(f"unknown validation {args.what!r}")


def _dsp_family(args: argparse.Namespace) -> tuple[dict, str]:
    """The FP64 kernels on platforms/ft-m7032.toml (or --platform), against the paper's measurements."""
    from ..validate.dsp_family import PLATFORM_FILE as DSP_FAMILY_PLATFORM
    from ..validate.dsp_family import TOLERANCE_PP as DSP_FAMILY_TOLERANCE_PP
    from ..validate.dsp_family import format_dsp_family, format_scaling, validate_dsp_family
    from ..validate.dsp_family import scaling as dsp_family_scaling
    if args.platform is None:
        args.platform = str(DSP_FAMILY_PLATFORM)
    plat = platform_from_args(args)
    rows = validate_dsp_family(plat, progress=not args.json)
    scale = dsp_family_scaling(plat, progress=not args.json)
    return ({"rows": [r.to_json() for r in rows], "scaling": [r.to_json() for r in scale], "platform": plat.name,
             "platform_hash": plat.digest(), "tolerance_pp": DSP_FAMILY_TOLERANCE_PP},
            format_dsp_family(rows, plat) + "\n\n" + format_scaling(scale))


def _table5(args: argparse.Namespace, plat: Platform) -> tuple[dict, str]:
    from .. import validate as v
    from ..kernels.gemm import GemmTiles
    tiles = any_tiles_from_args(args)
    rows = v.table5(plat, tiles, progress=not args.json)
    variants = v.table5_variants(plat, tiles) if isinstance(tiles, GemmTiles) else []
    text = (v.format_table5_tiles(plat, tiles) + "\n" + v.format_table5(rows) + "\n" + v.format_table5_summary(rows)
            + (f"\n\n{v.format_variants(variants)}" if variants else ""))
    return {"rows": [r.to_json() for r in rows], "variants": variants, "platform_hash": plat.digest()}, text


def _table5_study(args: argparse.Namespace, plat: Platform) -> tuple[dict, str]:
    from ..calibrate import bandwidth_study, emulate_a_resident, emulate_fit, format_study, plot_study
    rows = bandwidth_study([1e9 * x for x in parse_floats(args.bandwidths, "--bandwidths")], plat)
    note = None if args.json else (lambda m: print(m, file=sys.stderr, flush=True))
    emulated = [emulate_fit(getattr(r, strategy), plat, progress=note)
                for strategy in args.emulate or () if strategy != "a-resident" for r in rows]
    if "a-resident" in (args.emulate or ()):
        emulated.append(emulate_a_resident(base=plat, progress=note))
    if args.plot:
        plot_study(rows, args.plot, emulated)
    text = format_study(rows, emulated) + (f"\nplot: {args.plot}" if args.plot else "")
    return {"rows": [r.to_json() for r in rows], "emulated": [e.to_json() for e in emulated],
            "platform_hash": plat.digest()}, text


def register(sub) -> None:
    p = sub.add_parser("validate", help="compare emulated kernels with the paper")
    p.add_argument("what", choices=("table5", "table5-study", "attention", "dsp-family"),
                   help="table5: FP16 GEMM utilization; table5-study: which DDR rate and calibration could "
                        "meet Table 5 (closed-form, optionally emulated); attention: resident vs DDR-staged "
                        "backward (Fig. 10); dsp-family: the FP64 GEMM kernels on FT-M7032 "
                        "(platforms/ft-m7032.toml unless --platform) against the family's published measurements")
    add_loop_order_args(p)
    study = p.add_argument_group("table5-study")
    study.add_argument("--bandwidths", default="30,35,40,45,51", metavar="GBS",
                       help="comma-separated DDR server rates in GB/s (default: 30,35,40,45,51)")
    study.add_argument("--emulate", action="append", choices=("fixed", "protocol", "oracle", "a-resident"),
                       help="also emulate this strategy's fit at every rate (repeatable; ~35 s per rate); "
                            "a-resident: the emulated Fig. 4 loop order at the raw 51 GB/s, no fitted constant")
    study.add_argument("--plot", metavar="FILE", help="write the study figure (PNG)")
    add_tile_args(p)
    add_platform_args(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=_validate)
