"""The settings both sides run at: the demo preset with one rollout round per step and the command
line's steps, tokens and threads, and the prompts in the order rlpr takes them."""

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


def demo_prompts(args, output_dir: str, n: int) -> list:
    """The first `n` training prompts in the order rlpr's trainer takes them (its PromptStream at
    the config's seed), for TRL to train on the same ones."""
    from rlpr.data.prompts import PromptStream, prepare_prompts
    from rlpr.model.loading import load_tokenizer
    from rlpr.train.setup import load_examples_for

    cfg, _ = rlpr_config(args, output_dir)
    tok = load_tokenizer(cfg.model.path)
    train, _ = prepare_prompts(load_examples_for(cfg, "train"), tok, cfg.data.max_prompt_tokens, cfg.data.prefill)
    stream = PromptStream(len(train), cfg.trainer.seed, cfg.data.shuffle)
    return [train[i] for i in stream.take(n)]
