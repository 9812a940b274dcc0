"""rlpr from Python (a notebook, a script): the same configuration and code paths as the command
line, without argparse. `import rlpr` stays quick: these import their engines when called.

    import rlpr
    cfg = rlpr.config("demo", ["trainer.max_steps=5"])
    summary = rlpr.train(cfg)                                    # == rlpr train trainer.max_steps=5
    rewards = rlpr.score(cfg, ["What is the capital of France?"], ["It is Paris."], ["Paris"])
    results = rlpr.evaluate(cfg, ["examples/my_questions_val.jsonl"], checkpoint=summary["run_dir"])
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from rlpr.config import SAMPLING_SECTIONS, Config, from_preset, override_list


def config(preset: str = "demo", overrides: Sequence[str] | dict | None = None) -> Config:
    """A validated Config: the preset (a name in rlpr/configs or a YAML file) with dotted overrides,
    given as ["trainer.max_steps=5", ...] or {"trainer.max_steps": 5}; what every command reads."""
    return from_preset(preset, overrides)


def train(cfg: Config | str = "demo", overrides: Sequence[str] | dict | None = None,
          resume: str | os.PathLike | None = None) -> dict:
    """Train (or resume a run directory) as `rlpr train` does; returns the run's summary (held-out
    results before/after, the last step's metrics) with `run_dir` added. A preset name builds the
    Config first; a Config is used as given (overrides then apply on top of it)."""
    from rlpr.train.checkpoint import resume_config
    from rlpr.train.trainer import train as run

    from rlpr.train.run_dir import default_run_dir

    if resume is not None:
        cfg, run_dir = resume_config(str(resume), override_list(overrides)), Path(resume)
    else:
        if isinstance(cfg, str):
            cfg = config(cfg, overrides)
        elif overrides:
            cfg = _with_overrides(cfg, overrides)
        run_dir = default_run_dir(cfg)  # named now, so that the caller learns where the run went
        cfg = _with_overrides(cfg, [f"trainer.name={run_dir.name}"])
    summary = run(cfg, resume=str(resume) if resume is not None else None)
    return {**summary, "run_dir": str(run_dir)}


def score(cfg: Config | str, questions: Sequence[str], responses: Sequence[str], references: Sequence[str], *,
          checkpoint: str | os.PathLike | None = None, model=None, tokenizer=None) -> list[dict]:
    """Probability rewards of responses to questions (chat-templated with cfg.data.template, as
    training prompts are), as `rlpr score` writes them: one dict per response with valid, format,
    score_b, score_a, delta, reward. The model is cfg.model.path with `checkpoint` applied (a run
    directory or checkpoints/step_N), or `model`/`tokenizer` as given (e.g. one already loaded)."""
    from rlpr.data.prompts import chat_text
    from rlpr.data.templates import build_messages
    from rlpr.reward.probability_reward import ProbabilityReward

    cfg = _sampling_config(cfg)
    if not len(questions) == len(responses) == len(references):
        raise ValueError(f"questions, responses and references differ in length "
                         f"({len(questions)}, {len(responses)}, {len(references)})")
    if model is None:
        model, tokenizer = _load(cfg, checkpoint)
    max_length = getattr(model.config, "max_position_embeddings", None)
    reward = ProbabilityReward(cfg.reward, tokenizer, cfg.rollout.temperature, max_length)
    prompts = [chat_text(tokenizer, build_messages(q, cfg.data.template)) for q in questions]
    return [o.to_dict() for o in reward(model, prompts, list(responses), [r.strip() for r in references])]


def evaluate(cfg: Config | str, data: Sequence[str | os.PathLike], *, checkpoint: str | os.PathLike | None = None,
             samples: int | None = None, limit: int = 0, output_dir: str | os.PathLike = "eval",
             seed: int = 0) -> dict:
    """Avg@k accuracy on benchmark or question files, as `rlpr eval` computes it (the graders by data
    source, cfg.rollout's sampling); writes results.json/.md and samples.jsonl to `output_dir` and
    returns the results by benchmark."""
    from rlpr.evaluation.benchmark import check_rollout, evaluate as run, load_benchmarks
    from rlpr.model.precision import resolve_rollout_dtype
    from rlpr.rollout.engines import build_engine

    cfg = _sampling_config(cfg)
    check_rollout(cfg.rollout)
    benchmarks = load_benchmarks([str(d) for d in data], samples, limit, cfg.data.template)
    model, tokenizer = _load(cfg, checkpoint)
    dtype = resolve_rollout_dtype(cfg.model.rollout_dtype, next(model.parameters()).device)
    engine = build_engine(model, tokenizer, cfg.rollout, dtype)
    return run(engine, tokenizer, benchmarks, str(output_dir), cfg.rollout, None, seed=seed)


def _load(cfg: Config, checkpoint):
    from rlpr.model.loading import load_policy
    from rlpr.parallel.distributed import resolve_device

    return load_policy(cfg.model.path, checkpoint, device=resolve_device(cfg.model.device))


def _sampling_config(cfg: Config | str) -> Config:
    """A preset name becomes its Config; only the sections scoring and sampling read are checked."""
    from rlpr.config import load_config

    return load_config(cfg, sections=SAMPLING_SECTIONS) if isinstance(cfg, str) else cfg


def _with_overrides(cfg: Config, overrides) -> Config:
    from rlpr.config import load_config

    return load_config(cfg.preset, override_list(overrides), base=cfg.to_dict())
