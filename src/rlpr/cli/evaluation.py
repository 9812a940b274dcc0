"""`rlpr eval`, `grade`, `serve` and `reward-quality` on the command line.

The model commands read `model.*`, `rollout.*` and `reward.*` from the one Config tree: with no
preset they start from the documented defaults (docs/config.md); `--preset`/`--config` and dotted
overrides work as for `rlpr train`, and their flags are shorthands for config keys (rlpr/cli/
options.py says which setting wins). Handlers import torch/transformers lazily so that
`rlpr --help` stays instant.
"""

from __future__ import annotations

import sys
from pathlib import Path

from rlpr.cli.options import SETTINGS, FilesAndOverrides, add_config_options, command_config, shorthand
from rlpr.cli.outputs import check_not_an_input, check_output_dir, check_output_file
from rlpr.errors import ConfigError, ModelError

# What `rlpr eval`/`grade` and `rlpr reward-quality --input` write into their --output folder
RESULT_FILES = ("results.json", "results.md", "samples.jsonl")
REWARD_QUALITY_FILES = ("reward_quality.json", "reward_quality.md", "scores.jsonl")


def _in(folder, names) -> list[Path]:
    return [Path(folder) / name for name in names]


def _sampling_config(args, held_out: bool = False):
    """The command's config, validated for the sections a command that does not train reads."""
    from rlpr.config import SAMPLING_SECTIONS, validate

    cfg = checkpoint_config(args, held_out)
    validate(cfg, SAMPLING_SECTIONS)
    return cfg


def run_of(checkpoint) -> Path | None:
    """The run directory a --checkpoint names (the run itself, or the run of checkpoints/step_N), if
    it holds its config.yaml."""
    path = Path(checkpoint)
    for run in (path, path.parent.parent):
        if (run / "config.yaml").is_file():
            return run
    return None


def _merged(base: dict, top: dict) -> dict:
    out = dict(base)
    for key, value in top.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def checkpoint_config(args, held_out: bool = False):
    """The command's Config, not yet validated. With `--checkpoint` of a run (or one of its
    checkpoints/step_N), the run's own config.yaml is the start (issue 35, E1): its model.path
    (the base its LoRA adapter belongs to), data.template, rollout lengths, stop strings and dtype;
    with `held_out` (rlpr eval) its answers as long as its held-out evaluation's
    (trainer.eval_max_new_tokens). A --preset/--config goes on top of it, then the flags and dotted
    overrides; the choice is printed on stderr. Without a run: `command_config`."""
    from rlpr.config import build_config, preset_path, read_yaml

    run = run_of(args.checkpoint) if getattr(args, "checkpoint", None) else None
    if run is None:
        return command_config(args)
    base = read_yaml(run / "config.yaml")  # one line when it is not a mapping
    trainer = base.get("trainer") if isinstance(base.get("trainer"), dict) else {}
    if held_out and isinstance(trainer.get("eval_max_new_tokens"), int) and trainer["eval_max_new_tokens"] > 0:
        rollout = base.get("rollout") if isinstance(base.get("rollout"), dict) else {}
        base = {**base, "rollout": {**rollout, "max_new_tokens": trainer["eval_max_new_tokens"]}}
    if args.preset:
        preset = read_yaml(preset_path(args.preset))
        preset.pop("preset", None)
        base = _merged(base, preset)
    settings = getattr(args, SETTINGS, None) or []
    cfg = build_config("", settings, base=base)
    saved_path = (base.get("model") or {}).get("path") if isinstance(base.get("model"), dict) else None
    on_top = " and --preset " + args.preset if args.preset else ""
    print(f"config: the run's {run / 'config.yaml'}{on_top}, flags and overrides on top: model.path "
          f"{cfg.model.path}, data.template {cfg.data.template}, rollout.max_new_tokens "
          f"{cfg.rollout.max_new_tokens}, rollout.temperature {cfg.rollout.temperature}, model.rollout_dtype "
          f"{cfg.model.rollout_dtype}", file=sys.stderr)
    if saved_path is not None and str(cfg.model.path) != str(saved_path):
        print(f"warning: model.path {cfg.model.path} is not the run's base ({saved_path}): a LoRA adapter is "
              f"merged into the model given", file=sys.stderr)
    if _is_adapter(args.checkpoint):  # the base's weights are used: they must be the run's (issue 43)
        from rlpr.model.fingerprint import check_base

        check_base(run, cfg.model.path, f"--checkpoint {args.checkpoint}", getattr(args, "accept_base_change", False))
    return cfg


def _is_adapter(checkpoint) -> bool:
    """Whether the checkpoint a --checkpoint names is a LoRA adapter (merged into the base model)."""
    from rlpr.model.checkpoint_files import ADAPTER_DIR
    from rlpr.model.loading import find_checkpoint

    try:
        return (find_checkpoint(checkpoint) / ADAPTER_DIR).is_dir()
    except ModelError:  # no checkpoint: loading it says so
        return False


def run_samples(args) -> int | None:
    """Without --samples, `rlpr eval --checkpoint RUN` takes the run's own held-out sample count
    (trainer.eval_samples, when > 0; an _AvgK file name still wins), said on stderr."""
    from rlpr.config import read_yaml

    run = run_of(args.checkpoint) if args.checkpoint and args.samples is None else None
    if run is None:
        return None
    trainer = read_yaml(run / "config.yaml").get("trainer")
    k = trainer.get("eval_samples") if isinstance(trainer, dict) else None
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        return None
    print(f"samples: {k} per question, the run's trainer.eval_samples (--samples to change)", file=sys.stderr)
    return k


def _load(cfg, args):
    from rlpr.model.loading import load_policy
    from rlpr.parallel.distributed import resolve_device
    from rlpr.parallel.threads import use_threads

    use_threads(cfg.model.threads, device=cfg.model.device)
    return load_policy(cfg.model.path, args.checkpoint, device=resolve_device(cfg.model.device),
                       accept_base_change=getattr(args, "accept_base_change", False))


def _engine(cfg, args):
    from rlpr.model.precision import resolve_rollout_dtype
    from rlpr.rollout.engines import build_engine

    model, tokenizer = _load(cfg, args)
    dtype = resolve_rollout_dtype(cfg.model.rollout_dtype, next(model.parameters()).device)
    return build_engine(model, tokenizer, cfg.rollout, dtype), tokenizer


def cmd_eval(args) -> int:
    from rlpr.config import SAMPLING_SECTIONS, validate
    from rlpr.evaluation.benchmark import check_fits, check_rollout, evaluate, load_benchmarks

    from rlpr.cli.quiet import quiet_libraries

    quiet_libraries(args.verbose)
    cfg = checkpoint_config(args, held_out=True)  # a run's own config.yaml first (issue 35, E1)
    check_rollout(cfg.rollout)  # the flags' own messages first
    validate(cfg, SAMPLING_SECTIONS)
    check_output_dir(args.output)  # not after the model has loaded and sampled
    check_not_an_input(_in(args.output, RESULT_FILES), {"--data": args.data})
    judge = None
    if args.judge_url:
        from rlpr.evaluation.judge import JudgeClient, JudgeConfig

        judge = JudgeClient(JudgeConfig(args.judge_url, args.judge_model or "", args.judge_key_env,
                                        args.judge_concurrency, args.judge_timeout, args.judge_retries,
                                        backoff=args.judge_backoff))
    from rlpr.data.templates import TEMPLATES

    if cfg.data.template not in TEMPLATES:
        raise ConfigError(f"data.template: {cfg.data.template!r} is not one of {', '.join(TEMPLATES)}")
    # bad files fail before the model loads; flat rows get the prompt `rlpr train` gives them
    benchmarks = load_benchmarks(args.data, args.samples, args.limit or 0, cfg.data.template,
                                 default_samples=run_samples(args))
    check_fits(benchmarks, cfg.rollout.max_new_tokens)  # --samples too many for memory: one line, not an OOM
    engine, tokenizer = _engine(cfg, args)
    results = evaluate(engine, tokenizer, benchmarks, args.output, cfg.rollout, judge, seed=args.seed)
    for name, r in results.items():
        if name not in ("general", "all"):
            failed = f", judge failed {r['judge_failed']}/{r['judge_calls']}" if judge else ""
            print(f"{name}: Avg@{r['samples_per_question']} {100 * r['accuracy']:.1f}% "
                  f"({r['n_questions']} questions{failed})")
    for label in ("general", "all"):
        if label in results:
            print(f"{label}: {100 * results[label]['accuracy']:.1f}%")
    print(f"wrote {args.output}/results.json, results.md, samples.jsonl")
    return 0


def cmd_grade(args) -> int:
    from rlpr.evaluation.benchmark import grade_responses

    check_output_dir(args.output)
    check_not_an_input(_in(args.output, RESULT_FILES), {"--data": args.data, "--responses": args.responses})
    results = grade_responses(args.data, args.responses, args.output)
    for name, r in results.items():
        if name not in ("general", "all"):
            print(f"{name}: Avg@{r['samples_per_question']} {100 * r['accuracy']:.1f}% "
                  f"({r['n_questions']} questions, {r['questions_without_responses']} without responses)")
    print(f"wrote {args.output}/results.json, results.md, samples.jsonl")
    return 0


def cmd_serve(args) -> int:
    from rlpr.cli.quiet import quiet_libraries
    from rlpr.evaluation.serve import serve

    quiet_libraries(args.verbose)
    serve(_sampling_config(args), args.checkpoint, host=args.host, port=args.port, fault_mode=args.fault_mode,
          fault_delay=args.fault_delay, name=args.served_name, max_prompt_tokens=args.max_prompt_tokens,
          api_key_env=args.api_key_env, read_timeout=args.read_timeout, max_connections=args.max_connections,
          accept_base_change=args.accept_base_change)
    return 0


def cmd_reward_quality(args) -> int:
    if bool(args.input) == bool(args.build_from):
        raise ValueError("give exactly one of --input LABELED.jsonl or --build-from DATA_FILE")
    cfg = _sampling_config(args)
    if args.build_from:
        from rlpr.evaluation.reward_quality import build_examples, build_labeled

        if args.samples is None:
            raise ValueError("--build-from needs --samples N (responses per question)")
        check_output_file(args.output)
        check_not_an_input([args.output], {"--build-from": args.build_from})
        # bad rows and duplicate ids fail before the model loads
        examples = build_examples(args.build_from, limit=args.limit or 0)
        engine, tokenizer = _engine(cfg, args)
        n = build_labeled(engine, tokenizer, examples, args.output, samples=args.samples,
                          rollout=cfg.rollout, seed=args.seed)
        print(f"wrote {n} labeled rows to {args.output}")
        return 0
    from rlpr.evaluation.reward_quality import read_labeled, reward_quality

    if not 0 <= args.bootstrap <= 100_000:
        raise ValueError(f"--bootstrap must be in 0..100000 (resamples), got {args.bootstrap}")
    check_output_dir(args.output)
    check_not_an_input(_in(args.output, REWARD_QUALITY_FILES), {"--input": args.input})
    rows = read_labeled(args.input, args.template)  # a bad row fails before the model loads
    model, tokenizer = _load(cfg, args)
    report = reward_quality(model, tokenizer, rows, args.output, reward_cfg=cfg.reward,
                            n_boot=args.bootstrap, seed=args.seed, source=args.input)
    print(f"{report['n_mixed_groups']} mixed-correctness groups ({report['n_mixed_rows']} rows)",
          file=sys.stderr)
    for name, s in report["scores"].items():
        auc, within = ("n/a" if v is None else f"{v:.3f}" for v in (s["auc"], s["mean_group_auc"]))
        print(f"{name}: AUC {auc}, within-group {within}  ({report['labels'][name]})")
    print(f"wrote {args.output}/reward_quality.json, reward_quality.md, scores.jsonl")
    return 0


# --------------------------------------------------------------------------- the parsers

def _add_model(p) -> None:
    shorthand(p, "--model", "model.path", "'default' (embedded), a HF model dir or a .gguf")
    p.add_argument("--checkpoint", default=None,
                   help="a run directory (its latest checkpoint) or a checkpoints/step_N directory")
    shorthand(p, "--device", "model.device", "where the model runs (auto: the GPU when CUDA is available, "
              "else the CPU)", choices=("auto", "cpu", "cuda"))
    p.add_argument("--accept-base-change", action="store_true",
                   help="use a --checkpoint's LoRA adapter although its base model's weights changed since the "
                        "run started")


def _add_sampling(p) -> None:
    shorthand(p, "--engine", "rollout.engine", "rollout engine: hf (rlpr's loop) or vllm (needs vLLM installed: "
              "docs/vllm.md)", choices=("hf", "vllm"))
    shorthand(p, "--max-new-tokens", "rollout.max_new_tokens", "longest response in tokens", type=int)
    shorthand(p, "--temperature", "rollout.temperature", "sampling temperature (0: greedy)", type=float)
    shorthand(p, "--batch-sequences", "rollout.batch_sequences", "sequences per generate call", type=int)
    shorthand(p, "--dtype", "model.rollout_dtype", "dtype of the sampling copy of the model (auto: bfloat16 "
              "where the hardware has fast bf16)", choices=("auto", "bfloat16", "float32"))
    p.add_argument("--seed", type=int, default=0)


# A command's own defaults, under the preset (eval's answers are longer than training's).
EVAL_DEFAULTS = {"rollout.max_new_tokens": 1024}


def register(sub) -> None:
    """Add the evaluation subcommands to the `rlpr` argparse subparsers."""
    p = sub.add_parser("eval", help="Avg@k accuracy on benchmark files (optionally with an LLM judge)")
    add_config_options(p, default_preset=None, defaults=EVAL_DEFAULTS)
    _add_model(p)
    p.add_argument("--data", nargs="+", required=True, action=FilesAndOverrides,
                   help="benchmark files (parquet/jsonl/json/csv/tsv/arrow, also .gz) or datasets folders (FOLDER:SPLIT)")
    p.add_argument("--samples", type=int, default=None,
                   help="samples per question (default: K of an _AvgK file-name suffix, else 1)")
    _add_sampling(p)
    shorthand(p, "--top-p", "rollout.top_p", "nucleus sampling", type=float)
    p.add_argument("--limit", type=int, default=None, help="at most this many questions per file")
    p.add_argument("--output", required=True, help="directory for results.json/.md and samples.jsonl")
    p.add_argument("--judge-url", default=None,
                   help="OpenAI-compatible base URL (e.g. http://127.0.0.1:8000/v1); "
                        "asked only where the rule grader says wrong")
    p.add_argument("--judge-model", default=None)
    p.add_argument("--judge-key-env", default="OPENAI_API_KEY", help="environment variable holding the API key")
    p.add_argument("--judge-concurrency", type=int, default=8)
    p.add_argument("--judge-timeout", type=float, default=30.0, help="seconds per request")
    p.add_argument("--judge-retries", type=int, default=3, help="retries on timeouts, 5xx and connection errors")
    p.add_argument("--judge-backoff", type=float, default=0.5,
                   help="seconds before the first retry (doubles each retry, with jitter)")
    p.set_defaults(fn=cmd_eval)

    p = sub.add_parser("grade", help="grade responses produced elsewhere (no model): Avg@k and samples")
    p.add_argument("--data", required=True, help="the data file the responses answer (e.g. converted parquet)")
    p.add_argument("--responses", required=True,
                   help="JSONL rows {index: 0-based row of --data, response: text}; several per index")
    p.add_argument("--output", required=True, help="directory for results.json/.md and samples.jsonl")
    p.set_defaults(fn=cmd_grade)

    p = sub.add_parser("serve", help="an OpenAI-compatible chat-completions server for a model")
    add_config_options(p, default_preset=None)
    _add_model(p)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True, help="0 picks a free port (printed when ready)")
    shorthand(p, "--max-new-tokens", "rollout.max_new_tokens", "cap on a request's max_tokens", type=int)
    shorthand(p, "--engine", "rollout.engine", "who generates: hf (the model's generate) or vllm (needs vLLM "
              "installed: docs/vllm.md)", choices=("hf", "vllm"))
    p.add_argument("--fault-mode", choices=("none", "slow", "error", "flaky"), default="none",
                   help="inject failures for testing clients")
    p.add_argument("--fault-delay", type=float, default=2.0, help="seconds to sleep in slow mode")
    shorthand(p, "--threads", "model.threads", "torch threads (0: chosen from the free CPUs)", type=int)
    p.add_argument("--served-name", default=None, help="model id reported by the API (default: --model)")
    p.add_argument("--max-prompt-tokens", type=int, default=0,
                   help="longest prompt accepted (0: the model's context minus --max-new-tokens)")
    p.add_argument("--api-key-env", default=None,
                   help="require 'Authorization: Bearer KEY', KEY read from this environment variable")
    p.add_argument("--read-timeout", type=float, default=30.0,
                   help="seconds a whole request (request line, headers and body) may take to arrive; 408 after")
    p.add_argument("--max-connections", type=int, default=64,
                   help="connections served at once (a thread each); as many more wait, the rest get 503 at once")
    p.set_defaults(fn=cmd_serve)

    p = sub.add_parser("reward-quality", help="ROC-AUC of every reward variant against correctness labels")
    add_config_options(p, default_preset=None)
    _add_model(p)
    p.add_argument("--input", default=None,
                   help="labeled JSONL: prompt, response, reference, correct, [group]")
    p.add_argument("--output", required=True,
                   help="output directory (with --build-from: the labeled JSONL to write)")
    shorthand(p, "--fallback", "reward.invalid_fallback", "score tagless responses as reasoning (spec 1b) "
              "instead of 0", choices=("none", "free"))
    p.add_argument("--template", default="plain", help="template for string prompts (as in `rlpr score`)")
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples of groups (0: no CI)")
    p.add_argument("--build-from", default=None, help="a data file: sample and rule-label a labeled JSONL")
    p.add_argument("--samples", type=int, default=None, help="responses per question (--build-from)")
    p.add_argument("--limit", type=int, default=None, help="at most this many questions (--build-from)")
    _add_sampling(p)
    p.set_defaults(fn=cmd_reward_quality)
