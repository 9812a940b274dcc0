"""Command-line registration of the evaluation commands (eval, grade, serve, reward-quality).

Handlers import torch/transformers lazily so that `rlpr --help` stays instant.
"""

from __future__ import annotations

import sys


def _add_model(p) -> None:
    p.add_argument("--model", default="default", help="'default' (embedded), a HF model dir or a .gguf")
    p.add_argument("--checkpoint", default=None,
                   help="a run directory (its latest checkpoint) or a checkpoints/step_N directory")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="where the model runs (auto: the GPU when CUDA is available, else the CPU)")


def _load(args):
    from rlpr.parallel.distributed import resolve_device
    from rlpr.model.loading import load_policy

    return load_policy(args.model, args.checkpoint, device=resolve_device(args.device))


def _add_sampling(p, max_new_tokens: int) -> None:
    p.add_argument("--max-new-tokens", type=int, default=max_new_tokens)
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (0: greedy)")
    p.add_argument("--batch-sequences", type=int, default=32, help="sequences per generate call")
    p.add_argument("--dtype", choices=("auto", "bfloat16", "float32"), default="auto",
                   help="dtype of the sampling copy of the model (auto: bfloat16 where the hardware has fast bf16)")
    p.add_argument("--seed", type=int, default=0)


def _engine(args):

    from rlpr.model.precision import resolve_rollout_dtype
    from rlpr.rollout.hf import HFRollout

    model, tokenizer = _load(args)
    dtype = resolve_rollout_dtype(args.dtype, next(model.parameters()).device)
    return HFRollout(model, tokenizer, dtype=dtype, batch_sequences=args.batch_sequences), tokenizer


def cmd_eval(args) -> int:
    from rlpr.evaluation.benchmark import EvalSettings, evaluate, load_benchmarks

    settings = EvalSettings(samples=args.samples, max_new_tokens=args.max_new_tokens,
                            temperature=args.temperature, top_p=args.top_p, limit=args.limit or 0,
                            batch_sequences=args.batch_sequences, seed=args.seed)
    judge = None
    if args.judge_url:
        from rlpr.evaluation.judge import JudgeClient, JudgeConfig

        judge = JudgeClient(JudgeConfig(args.judge_url, args.judge_model or "", args.judge_key_env,
                                        args.judge_concurrency, args.judge_timeout, args.judge_retries,
                                        backoff=args.judge_backoff))
    benchmarks = load_benchmarks(args.data, settings)  # bad files and flags fail before the model loads
    engine, tokenizer = _engine(args)
    results = evaluate(engine, tokenizer, benchmarks, args.output, settings, judge)
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

    results = grade_responses(args.data, args.responses, args.output)
    for name, r in results.items():
        if name not in ("general", "all"):
            print(f"{name}: Avg@{r['samples_per_question']} {100 * r['accuracy']:.1f}% "
                  f"({r['n_questions']} questions, {r['questions_without_responses']} without responses)")
    print(f"wrote {args.output}/results.json, results.md, samples.jsonl")
    return 0


def cmd_serve(args) -> int:
    from rlpr.evaluation.serve import serve

    serve(args.model, args.checkpoint, host=args.host, port=args.port, max_new_tokens=args.max_new_tokens,
          fault_mode=args.fault_mode, fault_delay=args.fault_delay, threads=args.threads,
          name=args.served_name, device=args.device, max_prompt_tokens=args.max_prompt_tokens,
          api_key_env=args.api_key_env, read_timeout=args.read_timeout)
    return 0


def cmd_reward_quality(args) -> int:
    if bool(args.input) == bool(args.build_from):
        raise ValueError("give exactly one of --input LABELED.jsonl or --build-from DATA_FILE")
    if args.build_from:
        from rlpr.evaluation.reward_quality import build_labeled

        if args.samples is None:
            raise ValueError("--build-from needs --samples N (responses per question)")
        engine, tokenizer = _engine(args)
        n = build_labeled(engine, tokenizer, args.build_from, args.output, samples=args.samples,
                          limit=args.limit or 0, max_new_tokens=args.max_new_tokens,
                          temperature=args.temperature, seed=args.seed, batch_sequences=args.batch_sequences)
        print(f"wrote {n} labeled rows to {args.output}")
        return 0
    from rlpr.evaluation.reward_quality import SCORE_LABELS, read_labeled, reward_quality

    if args.bootstrap < 0:
        raise ValueError("--bootstrap must be >= 0")
    rows = read_labeled(args.input, args.template)  # a bad row fails before the model loads
    model, tokenizer = _load(args)
    report = reward_quality(model, tokenizer, rows, args.output, fallback=args.fallback,
                            n_boot=args.bootstrap, seed=args.seed, source=args.input)
    print(f"{report['n_mixed_groups']} mixed-correctness groups ({report['n_mixed_rows']} rows)",
          file=sys.stderr)
    for name, s in report["scores"].items():
        auc = "n/a" if s["auc"] is None else f"{s['auc']:.3f}"
        print(f"{SCORE_LABELS[name]}: AUC {auc}")
    print(f"wrote {args.output}/reward_quality.json, reward_quality.md, scores.jsonl")
    return 0


def register(sub) -> None:
    """Add the evaluation subcommands to the `rlpr` argparse subparsers."""
    p = sub.add_parser("eval", help="Avg@k accuracy on benchmark files (optionally with an LLM judge)")
    _add_model(p)
    p.add_argument("--data", nargs="+", required=True, help="benchmark files (parquet/jsonl/json/csv)")
    p.add_argument("--samples", type=int, default=None,
                   help="samples per question (default: K of an _AvgK file-name suffix, else 1)")
    _add_sampling(p, max_new_tokens=1024)
    p.add_argument("--top-p", type=float, default=1.0)
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
    _add_model(p)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True, help="0 picks a free port (printed when ready)")
    p.add_argument("--max-new-tokens", type=int, default=256, help="cap on a request's max_tokens")
    p.add_argument("--fault-mode", choices=("none", "slow", "error", "flaky"), default="none",
                   help="inject failures for testing clients")
    p.add_argument("--fault-delay", type=float, default=2.0, help="seconds to sleep in slow mode")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--served-name", default=None, help="model id reported by the API (default: --model)")
    p.add_argument("--max-prompt-tokens", type=int, default=0,
                   help="longest prompt accepted (0: the model's context minus --max-new-tokens)")
    p.add_argument("--api-key-env", default=None,
                   help="require 'Authorization: Bearer KEY', KEY read from this environment variable")
    p.add_argument("--read-timeout", type=float, default=30.0, help="seconds a connection may stay silent")
    p.set_defaults(fn=cmd_serve)

    p = sub.add_parser("reward-quality", help="ROC-AUC of the rewards against correctness labels")
    _add_model(p)
    p.add_argument("--input", default=None,
                   help="labeled JSONL: prompt, response, reference, correct, [group]")
    p.add_argument("--output", required=True,
                   help="output directory (with --build-from: the labeled JSONL to write)")
    p.add_argument("--fallback", choices=("none", "free"), default="none",
                   help="score tagless responses as reasoning (spec 1b) instead of 0")
    p.add_argument("--template", default="plain", help="template for string prompts (as in `rlpr score`)")
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples of groups (0: no CI)")
    p.add_argument("--build-from", default=None, help="a data file: sample and rule-label a labeled JSONL")
    p.add_argument("--samples", type=int, default=None, help="responses per question (--build-from)")
    p.add_argument("--limit", type=int, default=None, help="at most this many questions (--build-from)")
    _add_sampling(p, max_new_tokens=256)
    p.set_defaults(fn=cmd_reward_quality)
