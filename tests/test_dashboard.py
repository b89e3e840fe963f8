"""The published asv dashboard loads in headless Chromium without JavaScript errors.

CI records results for HEAD and runs `asv publish` before the tests (.ci/run); elsewhere the test
skips with a message unless a published dashboard and Chromium are both present.
"""
import functools
import http.server
import json
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HTML = Path(os.environ.get("ASV_HTML_DIR", ROOT / ".asv" / "html"))


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.fixture(scope="module")
def served():
    if not (HTML / "index.html").exists():
        pytest.skip(f"no published dashboard at {HTML} (run `asv run ... && asv publish`, as .ci/run does)")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(HTML))
    handler.log_message = lambda *a, **k: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


def test_published_index_lists_tracked_benchmarks():
    if not (HTML / "index.json").exists():
        pytest.skip(f"no published dashboard at {HTML}")
    index = json.loads((HTML / "index.json").read_text())
    names = set(index["benchmarks"])
    assert any("TrackTable5.track_utilization" in n for n in names)
    assert any(n.startswith("benchmarks.Time") for n in names)


def test_dashboard_loads_in_headless_chromium_without_js_errors(served):
    browser = _chromium()
    if browser is None:
        pytest.skip("Chromium is not installed (CI installs Debian's chromium in .ci/run)")
    with tempfile.TemporaryDirectory() as profile:
        cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               "--no-first-run", "--disable-quic", f"--user-data-dir={profile}", "--enable-logging=stderr",
               "--v=0", "--virtual-time-budget=15000", "--dump-dom", served]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    dom, log = proc.stdout, proc.stderr
    assert proc.returncode == 0, log[-2000:]
    console_errors = [line for line in log.splitlines()
                      if "CONSOLE" in line and ("Uncaught" in line or "Error" in line)]
    assert not console_errors, "\n".join(console_errors)
    # the benchmark list is built by the page's JavaScript from index.json
    assert "track_utilization" in dom and "TrackTable5" in dom
