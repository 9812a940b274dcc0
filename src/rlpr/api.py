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
from rlpr.errors import ArgumentTypeError

# -- the arguments' types, checked before any work (issue 35, N11): a string where a list belongs
# was read character by character, a wrong type gave a raw AttributeError from deep inside


def _kind(value) -> str:
    return f"{type(value).__name__} {value!r}"[:120]


def _path(name: str, value, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, (str, os.PathLike)) or isinstance(value, bool):
        raise ArgumentTypeError(f"{name}: expected a path (str or os.PathLike), got {_kind(value)}")


def _texts(name: str, value) -> list[str]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ArgumentTypeError(f"{name}: expected a list of strings, got {_kind(value)}"
                                + (f" (for one, pass [{value!r}])" if isinstance(value, str) else ""))
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise ArgumentTypeError(f"{name}[{i}]: expected a string, got {_kind(item)}")
    return list(value)


def _overrides(value):
    override_list(value)  # the one check of an overrides argument's type (rlpr/config/call.py)
    return value


def _int(name: str, value, low: int, optional: bool = False) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentTypeError(f"{name}: expected a whole number, got {_kind(value)}")
    if value < low:
        raise ArgumentTypeError(f"{name}: must be at least {low}, got {value}")


def _cfg(value) -> None:
    if not isinstance(value, (Config, str, os.PathLike)) or isinstance(value, bool):
        raise ArgumentTypeError(f"cfg: expected a Config (rlpr.config(...)) or a preset name or YAML path, got "
                                f"{_kind(value)}")


def config(preset: str = "demo", overrides: Sequence[str] | dict | None = None) -> Config:
    """A validated Config: the preset (a name in rlpr/configs or a YAML file) with dotted overrides,
    given as ["trainer.max_steps=5", ...] or {"trainer.max_steps": 5}; what every command reads."""
    _path("preset", preset)
    return from_preset(str(preset), _overrides(overrides))


def train(cfg: Config | str = "demo", overrides: Sequence[str] | dict | None = None,
          resume: str | os.PathLike | None = None, accept_base_change: bool = False) -> dict:
    """Train (or resume a run directory) as `rlpr train` does; returns the run's summary (held-out
    results before/after, the last step's metrics) with `run_dir` added. A preset name builds the
    Config first; a Config is used as given (overrides then apply on top of it).
    `accept_base_change`: resume although the base model's weights changed since the run started."""
    from rlpr.train.checkpoint import resume_config
    from rlpr.train.trainer import train as run

    from rlpr.train.run_dir import default_run_dir

    _cfg(cfg)
    _overrides(overrides)
    _path("resume", resume, optional=True)
    if resume is not None:
        cfg, run_dir = resume_config(str(resume), override_list(overrides)), Path(resume)
    else:
        if isinstance(cfg, (str, os.PathLike)):
            cfg = config(str(cfg), overrides)
        elif overrides:
            cfg = _with_overrides(cfg, overrides)
        run_dir = default_run_dir(cfg)  # named now, so that the caller learns where the run went
        cfg = _with_overrides(cfg, [f"trainer.name={run_dir.name}"])
    summary = run(cfg, resume=str(resume) if resume is not None else None, accept_base_change=accept_base_change)
    return {**summary, "run_dir": str(run_dir)}


def score(cfg: Config | str, questions: Sequence[str], responses: Sequence[str], references: Sequence[str], *,
          checkpoint: str | os.PathLike | None = None, model=None, tokenizer=None,
          accept_base_change: bool = False) -> list[dict]:
    """Probability rewards of responses to questions (chat-templated with cfg.data.template, as
    training prompts are), as `rlpr score` writes them: one dict per response with valid, format,
    score_b, score_a, delta, reward. The model is cfg.model.path with `checkpoint` applied (a run
    directory or checkpoints/step_N), or `model`/`tokenizer` as given (e.g. one already loaded). A
    LoRA checkpoint's base must be the one its run started from, as for `rlpr eval --checkpoint`,
    unless `accept_base_change`."""
    from rlpr.data.prompts import chat_text
    from rlpr.data.templates import build_messages
    from rlpr.reward.probability_reward import ProbabilityReward

    _cfg(cfg)
    questions, responses = _texts("questions", questions), _texts("responses", responses)
    references = _texts("references", references)
    _path("checkpoint", checkpoint, optional=True)
    if (model is None) != (tokenizer is None):
        raise ArgumentTypeError("model and tokenizer: give both (a model already loaded and its tokenizer) or neither")
    cfg = _sampling_config(cfg)
    if not len(questions) == len(responses) == len(references):
        raise ValueError(f"questions, responses and references differ in length "
                         f"({len(questions)}, {len(responses)}, {len(references)})")
    if model is None:
        model, tokenizer = _load(cfg, checkpoint, accept_base_change)
    max_length = getattr(model.config, "max_position_embeddings", None)
    reward = ProbabilityReward(cfg.reward, tokenizer, cfg.rollout.temperature, max_length)
    prompts = [chat_text(tokenizer, build_messages(q, cfg.data.template)) for q in questions]
    return [o.to_dict() for o in reward(model, prompts, list(responses), [r.strip() for r in references])]


def evaluate(cfg: Config | str, data: Sequence[str | os.PathLike], *, checkpoint: str | os.PathLike | None = None,
             samples: int | None = None, limit: int = 0, output_dir: str | os.PathLike = "eval",
             seed: int = 0, accept_base_change: bool = False) -> dict:
    """Avg@k accuracy on benchmark or question files, as `rlpr eval` computes it (the graders by data
    source, cfg.rollout's sampling); writes results.json/.md and samples.jsonl to `output_dir` and
    returns the results by benchmark. A LoRA checkpoint's base is checked as `rlpr eval` checks it
    (`accept_base_change`: go on, with a warning, although it changed)."""
    from rlpr.evaluation.benchmark import check_rollout, evaluate as run, load_benchmarks
    from rlpr.model.precision import resolve_rollout_dtype
    from rlpr.rollout.engines import build_engine

    _cfg(cfg)
    if isinstance(data, (str, os.PathLike)):
        data = [data]  # one file
    if not isinstance(data, Sequence) or not data:
        raise ArgumentTypeError(f"data: expected a list of data files, got {_kind(data)}")
    for i, d in enumerate(data):
        _path(f"data[{i}]", d)
    _path("checkpoint", checkpoint, optional=True)
    _path("output_dir", output_dir)
    _int("samples", samples, 1, optional=True)
    _int("limit", limit, 0)
    _int("seed", seed, 0)
    cfg = _sampling_config(cfg)
    check_rollout(cfg.rollout)
    benchmarks = load_benchmarks([str(d) for d in data], samples, limit, cfg.data.template)
    model, tokenizer = _load(cfg, checkpoint, accept_base_change)
    dtype = resolve_rollout_dtype(cfg.model.rollout_dtype, next(model.parameters()).device)
    engine = build_engine(model, tokenizer, cfg.rollout, dtype)
    return run(engine, tokenizer, benchmarks, str(output_dir), cfg.rollout, None, seed=seed)


def _load(cfg: Config, checkpoint, accept_base_change: bool = False):
    from rlpr.model.loading import load_policy
    from rlpr.parallel.distributed import resolve_device

    return load_policy(cfg.model.path, checkpoint, device=resolve_device(cfg.model.device),
                       accept_base_change=bool(accept_base_change))


def _sampling_config(cfg: Config | str) -> Config:
    """A preset name becomes its Config; only the sections scoring and sampling read are checked."""
    from rlpr.config import load_config

    return load_config(str(cfg), sections=SAMPLING_SECTIONS) if isinstance(cfg, (str, os.PathLike)) else cfg


def _with_overrides(cfg: Config, overrides) -> Config:
    from rlpr.config import load_config

    return load_config(cfg.preset, override_list(overrides), base=cfg.to_dict())
