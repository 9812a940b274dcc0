"""`rlpr report RUN [RUN ...]`: the run report (rlpr/report/) on the command line."""

from __future__ import annotations


def cmd_report(args) -> int:
    from pathlib import Path

    from rlpr.cli.outputs import check_output_dir, check_output_file
    from rlpr.report import write_report

    # write_report's default output, checked before any plot is drawn
    check_output_file(args.output or (Path(args.runs[0]) / "report.html" if len(args.runs) == 1 else "report.html"))
    if args.png_dir:
        check_output_dir(args.png_dir)
    path = write_report(args.runs, args.output, args.png_dir)
    print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB)")
    if args.png_dir:
        print(f"plots in {args.png_dir}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("report", help="an HTML report (plots, held-out before -> after, config, samples) "
                                      "of one run or comparing runs")
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directories (runs/NAME)")
    p.add_argument("--output", "-o", default=None,
                   help="the HTML file (default: RUN/report.html for one run, ./report.html for several)")
    p.add_argument("--png-dir", default=None, help="also write each plot as a PNG in this folder")
    p.set_defaults(fn=cmd_report)
