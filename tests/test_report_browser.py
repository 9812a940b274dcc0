"""The run report in a real browser (tests/report_browser.py, the check these tests run): a tiny run's
report.html loaded in headless Chromium has every image decoded and laid out, the held-out before ->
after table, and nothing wider than the window; a page with a broken image is caught. Skips (one line)
without Chromium; docs/testing.md says how to run it."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlpr.train.trainer import train

import report_browser
from helpers import tiny_cfg

pytestmark = pytest.mark.slow  # a real browser (and a tiny training run)

SCRIPT = Path(report_browser.__file__)


@pytest.fixture(scope="module")
def browser():
    module = report_browser
    chromium = module.find_chromium()
    if chromium is None:
        pytest.skip("needs Chromium for the real-browser check of the report (apt-get install -y chromium)")
    return module, chromium


@pytest.fixture(scope="module")
def run(browser, tiny_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("browser-run")
    train(tiny_cfg(tiny_dir, out, "shown", "trainer.max_steps=3", "trainer.eval_every=2", "trainer.eval_samples=2",
                   "trainer.report=true"))
    return out / "shown"


def test_the_report_loads_whole_in_chromium(run, tmp_path):
    shot, counts = tmp_path / "shot.png", tmp_path / "check.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), str(run), "--screenshot", str(shot), "--json", str(counts)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    result = json.loads(counts.read_text())
    assert result["images"] >= 6 and result["broken"] == 0 and result["unlaid"] == 0, result
    assert result["held_out_rows"] >= 5 and result["overflow"] == 0 and result["problems"] == [], result
    assert shot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    from PIL import Image

    assert Image.open(shot).size == (1280, 4000)


def test_a_broken_image_and_a_missing_table_are_caught(browser, run, tmp_path):
    """The check is not vacuous: an image that does not decode, a page without the held-out table
    and an element wider than the window are each counted."""
    module, chromium = browser
    page = (run / "report.html").read_text()
    bad = tmp_path / "bad.html"
    bad.write_text(page.replace("Held-out evaluation, before", "Held-out, before").replace(
        "</body>", '<img alt="x" src="data:image/png;base64,AAAA"><div style="width:3000px">x</div></body>'))
    counts = module.check_page(bad, chromium)
    assert counts["broken"] == 1 and counts["held_out_rows"] == -1 and counts["overflow"] > 0, counts
    assert len(module.problems(counts)) == 3
