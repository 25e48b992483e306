"""A real browser for the analysis HTML: Debian's headless Chromium (`.ci/run` installs it).

`screenshot` writes a PNG of the page (`png_stats`: its size and pixel variance); `layout` loads a copy of the page with a small
script that writes the document's widths into its title, and reads them back from the
DOM Chromium dumps. Tests skip with the reason only when Chromium is not installed here.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

WIDTH, HEIGHT = 1280, 4000
_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--mute-audio",
          "--no-first-run", "--disable-dev-shm-usage", f"--window-size={WIDTH},{HEIGHT}")
_PROBE = """<script>
window.addEventListener("load", function () {
  var d = document.documentElement, b = document.body, wide = [];
  document.querySelectorAll("body *").forEach(function (e) {
    var r = e.getBoundingClientRect();
    if (r.right > d.clientWidth + 1 && wide.length < 5) { wide.push(e.tagName + "." + e.className); }
  });
  document.title = "LAYOUT " + JSON.stringify({client: d.clientWidth, scroll: d.scrollWidth,
                                               body: b.scrollWidth, wide: wide});
});
</script>"""


def chromium() -> str:
    """The chromium executable, or skip the test saying why."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.skip("chromium is not installed here (Debian: apt-get install chromium; .ci/run installs it)")
    return found


def _run(args: list[str], tmp: Path) -> subprocess.CompletedProcess[str]:
    profile = tmp / "chromium-profile"
    profile.mkdir(exist_ok=True)
    return subprocess.run([chromium(), *_FLAGS, f"--user-data-dir={profile}", *args], capture_output=True,
                          text=True, timeout=120, cwd=tmp)


def screenshot(html: Path, png: Path) -> Path:
    """A headless screenshot of `html` (WIDTH x HEIGHT) written to `png`."""
    done = _run(["--run-all-compositor-stages-before-draw", "--virtual-time-budget=5000",
                 f"--screenshot={png}", html.resolve().as_uri()], png.parent)
    assert png.is_file(), done.stderr[-2000:]
    return png


def layout(html: Path, tmp: Path) -> dict[str, Any]:
    """The page's client and scroll widths (and up to 5 elements reaching past the right edge)."""
    probe = tmp / "probe.html"
    probe.write_text(html.read_text(encoding="utf-8").replace("</body>", _PROBE + "</body>"), encoding="utf-8")
    done = _run(["--run-all-compositor-stages-before-draw", "--virtual-time-budget=5000", "--dump-dom",
                 probe.as_uri()], tmp)
    start = done.stdout.find("<title>LAYOUT ")
    assert start >= 0, done.stderr[-2000:]
    text = done.stdout[start + len("<title>LAYOUT "):done.stdout.index("</title>", start)]
    found: dict[str, Any] = json.loads(text.replace("&quot;", '"').replace("&amp;", "&"))
    return found


def png_stats(path: Path) -> tuple[int, int, float]:
    """(width, height, variance of the grey values) of a PNG, checked to be one by its signature."""
    from PIL import Image, ImageStat

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"not a PNG: {path}"
    with Image.open(path) as image:
        grey = image.convert("L")
        return image.width, image.height, float(ImageStat.Stat(grey).var[0])
