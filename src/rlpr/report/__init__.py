"""The run report: one self-contained HTML page (plots embedded as PNGs) for one run or several.

`write_report(run_dirs, output)` is what `rlpr report` and the end of `rlpr train` call;
rlpr/report/data.py reads run directories, rlpr/report/render.py draws and lays out.
"""

from __future__ import annotations

from pathlib import Path

from rlpr.errors import write_atomic
from rlpr.report.data import RunData, load_run
from rlpr.report.render import figures, render_html, write_pngs

__all__ = ["RunData", "load_run", "render_html", "write_report"]


def write_report(run_dirs, output=None, png_dir=None) -> Path:
    """Write the report of `run_dirs` to `output` (default: RUN/report.html for one run,
    ./report.html for several) and, with `png_dir`, each plot as a PNG there. Returns the path."""
    runs = [load_run(p) for p in run_dirs]
    if output is None:
        output = runs[0].path / "report.html" if len(runs) == 1 else Path("report.html")
    figs = figures(runs)
    page = render_html(runs, figs)
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(output, page)
    if png_dir is not None:
        write_pngs(figs, png_dir)
    return output
