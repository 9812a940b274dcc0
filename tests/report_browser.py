"""The run report in a real browser (docs/testing.md): report.html loaded in headless Chromium ($RLPR_CHROMIUM,
else chromium / chromium-browser / google-chrome on PATH); every <img> decoded and laid out, the held-out
table present, nothing wider than the window. Exit status 0 when the checks pass, 1 when one fails, 2
when Chromium is absent or fails.

    python tests/report_browser.py runs/NAME [--screenshot shot.png --height 6000] [--json check.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
WIDTH = 1280

# appended to a copy of the page: the counts as attributes of <html>, read back from --dump-dom
PROBE = """<script>
window.addEventListener("load", () => {
  const root = document.documentElement, imgs = Array.from(document.images);
  const heading = Array.from(document.querySelectorAll("h2"))
    .find(h => h.textContent.startsWith("Held-out evaluation") && h.textContent.includes("before"));
  const table = heading && heading.nextElementSibling;
  const heads = table && table.tagName === "TABLE" ? Array.from(table.rows[0].cells, c => c.textContent) : [];
  root.setAttribute("data-images", imgs.length);
  root.setAttribute("data-broken", imgs.filter(i => !i.complete || i.naturalWidth === 0).length);
  root.setAttribute("data-unlaid", imgs.filter(i => i.getBoundingClientRect().width === 0).length);
  root.setAttribute("data-held-out-rows", heads.includes("before") && heads.includes("after")
    ? table.rows.length - 1 : -1);
  root.setAttribute("data-overflow", Math.max(0, root.scrollWidth - window.innerWidth));
  root.setAttribute("data-probed", "1");
});
</script>"""
ATTRS = ("images", "broken", "unlaid", "held-out-rows", "overflow")


def find_chromium() -> str | None:
    """$RLPR_CHROMIUM, else the first Chromium on PATH; None when there is none."""
    if os.environ.get("RLPR_CHROMIUM"):
        return shutil.which(os.environ["RLPR_CHROMIUM"])
    return next((found for name in CHROMIUM_NAMES if (found := shutil.which(name))), None)


def _chromium(chromium: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    # --no-sandbox: as root in a container; the page is ours and loads nothing from outside
    cmd = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
           f"--window-size={WIDTH},{args[0]}", *args[1:]]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def check_page(page: Path, chromium: str, height: int = 4000) -> dict:
    """The counts the probe writes, for `page` loaded in headless Chromium at WIDTH x `height`."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "page.html"
        text = page.read_text(encoding="utf-8")
        copy.write_text(text.replace("</body>", PROBE + "</body>") if "</body>" in text else text + PROBE,
                        encoding="utf-8")
        proc = _chromium(chromium, str(height), "--virtual-time-budget=10000", "--dump-dom", copy.as_uri())
    root = re.search(r"<html\b[^>]*>", proc.stdout)
    attrs = dict(re.findall(r'data-([\w-]+)="([^"]*)"', root.group(0))) if root else {}
    if attrs.get("probed") != "1":
        raise RuntimeError(f"Chromium did not run the page's load event (exit {proc.returncode}): "
                           f"{proc.stderr.strip().splitlines()[-1:] or proc.stdout[:200]}")
    return {name.replace("-", "_"): int(attrs[name]) for name in ATTRS}


def problems(counts: dict) -> list[str]:
    """What a reader would see wrong, one line each (none: the page is whole)."""
    out = []
    if counts["images"] == 0:
        out.append("no images")
    if counts["broken"]:
        out.append(f"{counts['broken']} of {counts['images']} images did not load")
    if counts["unlaid"]:
        out.append(f"{counts['unlaid']} images have no width on the page")
    if counts["held_out_rows"] <= 0:
        out.append("no held-out before -> after table (or an empty one)")
    if counts["overflow"] > 0:
        out.append(f"the page is {counts['overflow']} px wider than a {WIDTH} px window")
    return out


def screenshot(page: Path, chromium: str, output: Path, height: int) -> None:
    proc = _chromium(chromium, str(height), f"--screenshot={output.resolve()}", page.resolve().as_uri())
    if not output.is_file():
        raise RuntimeError(f"Chromium wrote no screenshot (exit {proc.returncode})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", help="a run directory (its report is written first) or a report .html")
    parser.add_argument("--screenshot", type=Path, help="also save a PNG of the page here")
    parser.add_argument("--height", type=int, default=4000, help="window height in pixels (default 4000)")
    parser.add_argument("--json", type=Path, help="write the counts and problems here")
    args = parser.parse_args(argv)
    chromium = find_chromium()
    if chromium is None:
        print("report_browser: no Chromium found (apt-get install -y chromium, or set RLPR_CHROMIUM)",
              file=sys.stderr)
        return 2
    target = Path(args.target)
    if target.is_dir():
        from rlpr.report import write_report

        page = write_report([target])
    else:
        page = target
    try:
        counts = check_page(page, chromium, args.height)
        if args.screenshot:
            screenshot(page, chromium, args.screenshot, args.height)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        print(f"report_browser: {e}", file=sys.stderr)
        return 2
    found = problems(counts)
    if args.json:
        args.json.write_text(json.dumps({"page": str(page), **counts, "problems": found}, indent=1) + "\n")
    print(f"{page}: {counts['images']} images, {counts['broken']} not loaded, held-out table "
          f"{counts['held_out_rows']} rows, {counts['overflow']} px too wide"
          + (f"; PROBLEMS: {'; '.join(found)}" if found else "; ok"))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
