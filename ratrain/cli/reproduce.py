"""`ratrain reproduce [experiment]`: the main job (every validation, ours beside the paper)."""
from __future__ import annotations

import argparse

from ratrain.cli.args import add_platform_args, platform_from_args
from ratrain.errors import ConfigError
from ratrain.repro.experiment_list import EXPERIMENT_NAMES, default_jobs, experiments_help
from ratrain.spec.memory import FSR_BUFFER_LAYERS


def _reproduce(args):
    from ratrain.repro.experiment import Settings, format_checks
    from ratrain.repro.report import RunClock, reproduce
    which = [args.experiment] if args.experiment else None
    if args.jobs < 1:
        raise ConfigError(f"--jobs must be an integer >= 1, got {args.jobs}")
    platform = platform_from_args(args)
    settings = Settings(profile_source=args.profile, recovery_resource=args.recovery_resource, platform=platform,
                        fsr_buffer_layers=args.fsr_buffer_layers)
    clock = RunClock.now()
    exps = reproduce(which, args.out, progress=not args.json, settings=settings, jobs=args.jobs)
    timing = clock.elapsed()        # not a result: payload comparisons ignore "timing" and "seconds"
    if args.experiment:
        e = exps[0]
        payload = {"rows": e.rows, "checks": [c.to_json() for c in e.checks], "figures": e.figures,
                   "timing": e.timing}
    else:
        payload = {"experiments": {e.key: e.to_json() for e in exps}, "report": f"{args.out}/report.md",
                   "timing": timing}
    blocks = []
    for e in exps:
        blocks.append(f"== {e.title} ==\n" + (e.text + "\n\n" if e.text else "") + format_checks(e))
    total = sum(len(e.checks) for e in exps)
    passed = sum(e.passed for e in exps)
    blocks.append(f"{passed}/{total} checks pass; results in {args.out}/" + ("" if args.experiment else " (report.md)"))
    return payload, "\n\n".join(blocks)


def register(sub) -> None:
    p = sub.add_parser("reproduce", help="run the paper reproduction (all experiments, or one)",
                       epilog=experiments_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("experiment", nargs="?", choices=EXPERIMENT_NAMES, metavar="EXPERIMENT",
                   help="one experiment (listed below); default: all of them and results/report.md")
    p.add_argument("--profile", choices=("emulated", "roofline"), default="emulated",
                   help="latency source (default: kernels emulated on mtemu)")
    p.add_argument("--recovery-resource", choices=("compute", "ddr"), default="compute",
                   help="where FSR recovery runs (default: compute, the honest model; 'ddr' shows the platform "
                        "the paper's FSR gain needs)")
    p.add_argument("--fsr-buffer-layers", type=int, default=FSR_BUFFER_LAYERS, metavar="N",
                   help=f"layers FSR's recovery buffer holds, in memory and in the simulator (default "
                        f"{FSR_BUFFER_LAYERS}, Eq. 6's single M_rec)")
    add_platform_args(p)
    p.add_argument("--out", default="results", help="output folder (default: results/)")
    p.add_argument("--jobs", type=int, default=default_jobs(), metavar="N",
                   help=f"processes (default: 2 with two cores or more, else 1; here {default_jobs()}): with 2 the "
                        "emulator's experiments run in a worker beside the others; same results, files and order")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=_reproduce)
