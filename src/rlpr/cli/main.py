"""The `rlpr` command line: train with RLPR, and the commands around a run (its description lists them all).

Heavy modules are imported inside each command so that `rlpr --help` answers at once. A user
mistake (bad config, data or model path) prints one line `rlpr: error: ...` and exits 2.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import sys

from rlpr.cli.evaluation import register as register_evaluation
from rlpr.cli.options import Shorthand, add_config_options, command_config, shorthand
from rlpr.cli.plan import register as register_plan
from rlpr.cli.export import register as register_export
from rlpr.cli.report import register as register_report
from rlpr.errors import message_line


# A disk that fills up or turns read-only under a command: the user's to fix, not a bug.
_DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG})


def _user_errors():
    """What a user can act on: one line, no traceback (a TrainingError says what to change)."""
    from rlpr.errors import ConfigError, DataError, ModelError, OutputError, TrainingError

    return (ConfigError, DataError, ModelError, OutputError, TrainingError)


def _validated(args):
    from rlpr.config import validate

    cfg = command_config(args)
    validate(cfg)
    return cfg


def cmd_train(args) -> int:
    from rlpr.train.trainer import train

    if args.resume:
        from rlpr.train.checkpoint import resume_config

        cfg = resume_config(args.resume, args.overrides or [])
    else:
        cfg = _validated(args)
    train(cfg, resume=args.resume, accept_base_change=args.accept_base_change)
    return 0


def cmd_score(args) -> int:
    from rlpr.evaluation.score_file import score_file

    cfg = _validated(args)  # the spec's defaults unless a preset is named
    score_file(cfg, args.input, args.output, template=args.template, batch_rows=args.batch_rows)
    return 0


def shorthands(parser: argparse.ArgumentParser) -> dict[str, list[str]]:
    """Config key -> the flags that set it, e.g. "`--max-new-tokens` (eval, reward-quality, serve)"."""
    flags: dict[str, dict[str, list[str]]] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command, sub in action.choices.items():
                for a in sub._actions:
                    if isinstance(a, Shorthand):
                        flags.setdefault(a.key, {}).setdefault(a.option_strings[0], []).append(command)
    return {key: [f"`{flag}` ({', '.join(sorted(commands))})" for flag, commands in by_flag.items()]
            for key, by_flag in flags.items()}


def cmd_config(args) -> int:
    import yaml

    from rlpr.cli.config_reference import config_reference

    if args.reference:
        print(config_reference(shorthands(build_parser())), end="")
    else:
        print(yaml.safe_dump(_validated(args).to_dict(), sort_keys=False, allow_unicode=True), end="")
    return 0


def cmd_data_convert(args) -> int:
    from rlpr.cli.outputs import check_not_an_input, check_output_file
    from rlpr.data.convert import convert_file
    from rlpr.data.loading import ColumnMapping

    check_output_file(args.output)
    check_not_an_input([args.output], {"--input": args.input})
    mapping = ColumnMapping(args.question_column, args.answer_column, args.choices_column)
    skipped: dict[str, int] = {}
    n = convert_file(args.format, args.input, args.output, template=args.template, mapping=mapping,
                     limit=args.limit, source=args.source, skipped=skipped)
    print(f"wrote {n} rows to {args.output}")
    for reason, count in skipped.items():
        print(f"skipped {count} rows ({reason})")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlpr")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train with RLPR")
    add_config_options(p, default_preset="demo")
    p.add_argument("--resume", default=None, help="a run directory (runs/NAME) to continue exactly")
    p.add_argument("--accept-base-change", action="store_true",
                   help="resume although the base model's weights changed since the run started")
    p.set_defaults(fn=cmd_train)

    p = sub.add_parser("score", help="probability rewards for a JSONL of prompt/response/reference")
    add_config_options(p, default_preset=None)
    p.add_argument("--input", required=True)
    p.add_argument("--output", required=True)
    shorthand(p, "--model", "model.path", "'default' (embedded), a HF model dir or a .gguf")
    p.add_argument("--template", default="plain",
                   help="template for string prompts: plain (user turn only), r1, r1_nothink, r1_user")
    shorthand(p, "--temperature", "rollout.temperature", "rollout temperature (logits / T)", type=float)
    p.add_argument("--batch-rows", type=int, default=32)
    p.set_defaults(fn=cmd_score)

    p = sub.add_parser("data", help="data utilities")
    dsub = p.add_subparsers(dest="data_command", required=True)
    c = dsub.add_parser("convert", help="convert a public format into the verl/RLPR parquet layout")
    c.add_argument("--format", required=True,
                   help="gsm8k, math, minerva, aime, mmlu, mmlu_pro, bbh, nq_open, theoremqa, gpqa, "
                        "arc, simpleqa, jsonl (input may be .gz)")
    c.add_argument("--input", required=True)
    c.add_argument("--output", required=True)
    c.add_argument("--template", default="r1")
    c.add_argument("--question-column", default="question")
    c.add_argument("--answer-column", default="answer")
    c.add_argument("--choices-column", default="choices")
    c.add_argument("--limit", type=int, default=None)
    c.add_argument("--source", default=None,
                   help="data_source of every row (picks the grader and its rule, e.g. theoremqa); "
                        "default: the format name")
    c.set_defaults(fn=cmd_data_convert)

    register_evaluation(sub)  # eval, grade, serve, reward-quality
    register_report(sub)
    register_plan(sub)  # memory per GPU before a run
    register_export(sub)

    p = sub.add_parser("config", help="print the effective configuration (YAML), or every key (--reference)")
    add_config_options(p, default_preset="demo")
    p.add_argument("--reference", action="store_true",
                   help="print the key reference in Markdown (docs/config.md: rlpr config --reference > docs/config.md)")
    p.set_defaults(fn=cmd_config)
    # from the commands registered, so that none is left out (export was)
    names = [("data convert" if name == "data" else name) for name in sub.choices]
    parser.description = f"The rlpr command line: {', '.join(names)}."
    return parser


def quiet_console(verbose: bool) -> None:
    """The console shows rlpr's own lines (its loggers at INFO) and progress; the libraries' only
    from WARNING up: matplotlib's font_manager INFO line (the report's first plot), and no
    transformers "Loading weights" / "Writing model shards" bars on every model load (they read
    HF_HUB_DISABLE_PROGRESS_BARS when first imported). `-v`: everything, at DEBUG."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    if not verbose:
        logging.getLogger("rlpr").setLevel(logging.INFO)
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        if "transformers" in sys.modules:  # imported before main ran (rlpr's Python API, a test process)
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()


def interrupt_on_signals() -> None:
    """SIGTERM and SIGHUP (a scheduler's stop, a closed terminal) raise `errors.Interrupted` where
    the command is, as Ctrl-C raises KeyboardInterrupt: every command cleans up what it was writing
    (an export's temporary folder) and ends with one line. Training replaces them with its own
    while it steps (rlpr/train/signals.py: finish the step, checkpoint). Off the main thread: none."""
    import signal

    from rlpr.errors import Interrupted, stop_signals

    def handler(signum, frame):
        raise Interrupted(signal.Signals(signum).name)

    for s in stop_signals():
        if s != signal.SIGINT:  # Python's own handler raises KeyboardInterrupt
            try:
                signal.signal(s, handler)
            except (ValueError, OSError):
                pass


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    quiet_console(args.verbose)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from rlpr.model.memory import cap_kernel_caches

    cap_kernel_caches()  # before any model work (scoring, evaluation, serving, training)
    interrupt_on_signals()
    try:
        return args.fn(args) or 0
    except KeyboardInterrupt as e:  # Ctrl-C, SIGTERM, SIGHUP: what was being written is cleaned up
        if args.verbose:
            raise
        print(f"rlpr: {args.command} interrupted ({str(e) or 'SIGINT'})", file=sys.stderr)
        return 130
    except _user_errors() as e:
        print(f"rlpr: error: {message_line(e)}", file=sys.stderr)
        return 2
    except OSError as e:
        if args.verbose or e.errno not in _DISK_ERRNOS:
            raise
        # a full or read-only disk met while streaming an output (samples.jsonl, scores.jsonl)
        where = f"{e.filename}: " if e.filename else ""
        print(f"rlpr: error: {where}{e.strerror} (run with -v for a traceback)", file=sys.stderr)
        return 2
    except ValueError as e:  # converters and validators raise plain ValueError for user input too
        if args.verbose:
            raise
        print(f"rlpr: error: {message_line(e)} (run with -v for a traceback)", file=sys.stderr)
        return 2
    except Exception as e:  # a library's own error type for a full disk (safetensors' SafetensorError)
        from rlpr.errors import write_failure, write_failure_reason

        if args.verbose or not write_failure(e):
            raise
        print(f"rlpr: error: a write failed: {write_failure_reason(e)} (run with -v for a traceback)",
              file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
