"""The settings every part runs at: the demo preset with one rollout round per step and the
command line's steps, tokens and threads. Apart from the parts so that rlpr, TRL and the
micro-benchmarks read the same config, and speed.py the same micro-batch for the report."""

from __future__ import annotations


def demo_micro_batch() -> int:
    from rlpr.config import load_config

    return load_config("demo").trainer.micro_batch_sequences


def rlpr_config(args, output_dir: str):
    from rlpr.config import load_config

    overrides = ["algorithm.std_filter=false", "algorithm.max_sampling_tries=1",
                 "trainer.tensorboard=false", "trainer.progress=false", "trainer.sample_every=0",
                 f"trainer.output_dir={output_dir}", f"trainer.max_steps={args.warmup + args.steps}",
                 f"rollout.max_new_tokens={args.max_new_tokens}", f"model.threads={args.threads}"]
    if args.quick:
        overrides.append("data.demo_val_size=8")
    return load_config("demo", overrides), overrides
