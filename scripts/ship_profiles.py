"""Regenerate the latency profiles that ship with the package (ratrain/data/profiles/).

Run after any change to the emulator, the GEMM kernel or the platform defaults:
    python scripts/ship_profiles.py [--scheduler ADDRESS] [model ...]
    python scripts/ship_profiles.py --platform platforms/bandwidth-rich.toml llama2-13b qwen2.5-32b
Profiles are built into a scratch cache and copied, so a crash leaves the shipped set intact.
With ``--platform`` (a what-if platform of a study, e.g. `ratrain reproduce platforms`) only the
profile files are shipped, not its GEMM cache entries: the study needs the profiles alone, and
the shipped GEMM cache stays the default platform's (small). With ``--scheduler`` the kernels of
every profile are emulated on that Dask cluster first (``ratrain.cost.profile.build_profiles``),
then the profiles are assembled here. Sequence length 2048 first (every table), then Fig. 9's
other lengths (T=1, b=1; default platform only). The GEMM latency cache ships the 2048 shapes only:
the Fig. 9 profiles are complete without it, and the cache stays small.
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

SCRATCH = Path(tempfile.mkdtemp(prefix="ratrain-ship-"))
os.environ["RATRAIN_CACHE_DIR"] = str(SCRATCH)

from mtemu.version import write_shipped_versions  # noqa: E402
from ratrain.cost.profile import SHIPPED_DIR, build_profiles, layer_profile  # noqa: E402
from ratrain.repro.targets import FIG9_MODELS, FIG9_SEQS  # noqa: E402
from ratrain.spec.models import get_model  # noqa: E402
from ratrain.spec.platform import TrainingPlatform  # noqa: E402
from rtcommon.progress import Progress  # noqa: E402

MODELS = ["llama2-7b", "llama2-13b", "baichuan2-13b", "qwen2.5-32b", "llama2-70b"]
TPS = (1, 2)
# what the reproduction needs first (Tables 2-6: T=1 everywhere, T=2 for Table 2's TP-heavy rows)
ORDER = [(m, 1) for m in MODELS] + [("llama2-13b", 2), ("qwen2.5-32b", 2)]
SEQ = 2048
# (model, b, T) of the finalists `ratrain plan` confirms on emulated kernels in the README's plan examples
# and Table 3's cases (default search space, --confirm 3): shipped, so those plans emulate nothing on a
# fresh install (tests/test_planner.py checks the list covers them)
PLAN_FINALISTS = [("llama2-7b", 2, 1), ("llama2-7b", 4, 1), ("llama2-7b", 1, 2), ("llama2-7b", 1, 4),
                  ("llama2-70b", 1, 4), ("qwen2.5-32b", 2, 2)]


def main(models: list[str], platform_file: str | None = None, scheduler: str | None = None) -> None:
    SHIPPED_DIR.mkdir(parents=True, exist_ok=True)
    platform = TrainingPlatform.from_file(platform_file) if platform_file else TrainingPlatform()
    if platform_file is None:
        print(f"versions recorded in {write_shipped_versions()}", flush=True)
    jobs = [(m, 1, t, SEQ) for m, t in ORDER if m in models]       # (model, b, T, seq)
    jobs += [(m, 1, t, SEQ) for m in models for t in TPS if (m, t) not in ORDER]
    if platform_file is None:
        jobs += [(m, 1, 1, n) for n in FIG9_SEQS if n != SEQ for m in FIG9_MODELS if m in models]
        jobs += [(m, b, t, SEQ) for m, b, t in PLAN_FINALISTS if m in models]
    if scheduler:
        build_profiles([(get_model(name), b, seq, tp) for name, b, tp, seq in jobs], platform=platform,
                       scheduler=scheduler, progress=Progress(True))
    for name, b, tp, seq in jobs:
        t = time.time()
        prof = layer_profile(get_model(name), b, seq, tp, platform=platform, progress=True)
        print(f"{platform.name} {name} b={b} seq={seq} tp={tp}: fwd {prof.forward_s * 1e3:.2f} ms "
              f"bwd {prof.backward_s * 1e3:.2f} ms ({time.time() - t:.0f} s)", flush=True)
        for f in (SCRATCH / "profiles").glob("*.json"):
            shutil.copyfile(f, SHIPPED_DIR / f.name)
        # missing: nothing new emulated; other platforms' and later lengths' shapes are not shipped
        if platform_file is None and seq == SEQ and (SCRATCH / "gemm_cache.json").exists():
            shutil.copyfile(SCRATCH / "gemm_cache.json", SHIPPED_DIR / "gemm_cache.json")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", metavar="model", help="default: " + ", ".join(MODELS))
    parser.add_argument("--platform", help="platform file (default: the built-in MT-3000 cluster)")
    parser.add_argument("--scheduler", metavar="ADDRESS", help="emulate the kernels on this Dask cluster")
    args = parser.parse_args()
    main(args.models or MODELS, args.platform, args.scheduler)
