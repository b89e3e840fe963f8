"""Make the published asv dashboard work without internet access.

asv's HTML loads jQuery, flot, bootstrap and a few plugins from public CDNs. This script fetches
the same libraries from the npm registry (`npm pack`), puts them in ``<html_dir>/vendor/`` and
rewrites the CDN references in every published HTML file. Run after ``asv publish``:

    python scripts/localize_dashboard.py [.asv/html]

Nothing third-party is stored in this repository; the tarballs are cached in the ``npm`` cache of
:mod:`rtcommon.caches` (``~/.cache/ratrain/npm`` by default).
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from rtcommon import caches

# CDN URL (as asv 0.6 writes it) -> (npm package spec, file inside the tarball)
ASSETS = {
    "https://code.jquery.com/jquery-3.3.1.min.js": ("jquery@3.3.1", "package/dist/jquery.min.js"),
    "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.min.js": ("flot@0.8.3", "package/jquery.flot.js"),
    "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.time.min.js": ("flot@0.8.3",
                                                                                  "package/jquery.flot.time.js"),
    "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.selection.min.js": ("flot@0.8.3",
                                                                                       "package/jquery.flot.selection.js"),
    "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.categories.min.js": ("flot@0.8.3",
                                                                                        "package/jquery.flot.categories.js"),
    "https://cdn.jsdelivr.net/npm/flot-orderbars@1.0.0/js/jquery.flot.orderBars.js": ("flot-orderbars@1.0.0",
                                                                                      "package/js/jquery.flot.orderBars.js"),
    "https://cdnjs.cloudflare.com/ajax/libs/stupidtable/1.0.1/stupidtable.min.js": ("stupid-table-plugin@1.1.3",
                                                                                    "package/stupidtable.min.js"),
    "https://cdnjs.cloudflare.com/ajax/libs/blueimp-md5/2.19.0/js/md5.min.js": ("blueimp-md5@2.19.0",
                                                                                "package/js/md5.min.js"),
    "https://cdn.jsdelivr.net/npm/bootstrap@3.1.1/dist/js/bootstrap.min.js": ("bootstrap@3.1.1",
                                                                              "package/dist/js/bootstrap.min.js"),
    "https://cdn.jsdelivr.net/npm/bootstrap@3.1.1/dist/css/bootstrap.min.css": ("bootstrap@3.1.1",
                                                                                "package/dist/css/bootstrap.min.css"),
}


def _tarball(spec: str) -> Path:
    folder = caches.path("npm")
    folder.mkdir(parents=True, exist_ok=True)
    name, version = spec.rsplit("@", 1)
    path = folder / f"{name}-{version}.tgz"
    if not path.exists():
        if shutil.which("npm") is None:
            sys.exit("localize_dashboard: npm is needed to fetch the dashboard's JavaScript libraries")
        subprocess.run(["npm", "pack", "--silent", spec], cwd=folder, check=True, stdout=subprocess.DEVNULL)
    return path


def localize(html_dir: Path) -> int:
    vendor = html_dir / "vendor"
    vendor.mkdir(exist_ok=True)
    local = {}
    for url, (spec, member) in ASSETS.items():
        target = vendor / f"{spec.replace('@', '-')}-{Path(member).name}"
        if not target.exists():
            with tarfile.open(_tarball(spec)) as tar:
                data = tar.extractfile(member).read()
            tmp = target.with_suffix(target.suffix + ".tmp")
            tmp.write_bytes(data)
            tmp.replace(target)
        local[url] = f"vendor/{target.name}"
    changed = 0
    for page in html_dir.rglob("*.html"):
        text = page.read_text()
        depth = len(page.relative_to(html_dir).parts) - 1
        prefix = "../" * depth
        new = text
        for url, rel in local.items():
            new = new.replace(url, prefix + rel)
        # integrity/crossorigin attributes would not match the npm build
        new = re.sub(r'\s+integrity="[^"]*"', "", new)
        if new != text:
            page.write_text(new)
            changed += 1
    return changed


if __name__ == "__main__":
    root = Path(sys.argv[1] if len(sys.argv) > 1 else ".asv/html")
    if not (root / "index.html").exists():
        sys.exit(f"localize_dashboard: no published dashboard at {root} (run `asv publish` first)")
    print(f"localized {localize(root)} page(s) in {root}")
