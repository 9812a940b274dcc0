"""`rlpr export RUN --format hf|gguf --output PATH`: a trained model for use outside rlpr (rlpr/model/export.py)."""

from __future__ import annotations

import sys


def cmd_export(args) -> int:
    from rlpr.cli.quiet import quiet_libraries
    from rlpr.model.export import export_run

    quiet_libraries(args.verbose)
    try:
        path = export_run(args.run, args.output, args.format, args.step, args.gguf_type, args.dtype,
                          overwrite=args.overwrite, accept_base_change=args.accept_base_change)
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM/SIGHUP (rlpr's main raises Interrupted for them)
        print(f"rlpr: export interrupted ({str(e) or 'SIGINT'}); nothing was written to {args.output}", file=sys.stderr)
        return 130
    size = sum(f.stat().st_size for f in ([path] if path.is_file() else path.rglob("*")) if f.is_file())
    print(f"wrote {path} ({size / 2**20:.0f} MiB)")
    return 0


def register(sub) -> None:
    from rlpr.model.export import FORMATS, GGUF_TYPES

    p = sub.add_parser("export", help="write a run's trained model (LoRA merged) as a Hugging Face folder or a "
                                      "GGUF file, with a model card")
    p.add_argument("run", metavar="RUN", help="a run directory (runs/NAME)")
    p.add_argument("--format", choices=FORMATS, default="hf",
                   help="hf: safetensors + tokenizer + generation config (vLLM, TGI, the Hub); gguf: llama.cpp, "
                        "Ollama, LM Studio")
    p.add_argument("--output", "-o", required=True,
                   help="a new or empty folder to write (gguf: a new .gguf file, its card beside it as "
                        "NAME.README.md, or a folder that gets model.gguf and README.md)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing output whole (never merged into; the run, its base model and the "
                        "current folder are never replaced)")
    p.add_argument("--accept-base-change", action="store_true",
                   help="merge a LoRA adapter although its base model's weights changed since the run started")
    p.add_argument("--step", type=int, default=None, help="checkpoints/step_N (default: the latest complete one)")
    p.add_argument("--gguf-type", choices=GGUF_TYPES, default="f16",
                   help="GGUF weight type: f16 (default), q8_0 (8-bit, about half the size) or f32")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32",
                   help="hf: the weights' dtype (default float32, what rlpr trains in)")
    p.set_defaults(fn=cmd_export)
