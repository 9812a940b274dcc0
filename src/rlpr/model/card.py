"""The model card (a README.md in Hugging Face's layout) of a trained model: what every checkpoint a
run saves carries (beside its LoRA adapter or full weights, in place of peft's empty template) and
what `rlpr export` writes beside the exported model. One card for both: base model, data, reward,
steps, held-out before -> after.

Everything is read as data from the run directory (config.yaml, metrics.jsonl, summary.yaml) or
passed in; building a card never fails a save (`checkpoint_card` falls back to what it has)."""

from __future__ import annotations

import json
import logging
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from rlpr.errors import write_atomic, yaml_load

log = logging.getLogger("rlpr.train")

CARD_FILE = "README.md"
# what the card sits beside: a checkpoint's adapter/ or model/ folder, or an export
FORMATS = ("adapter", "model", "hf", "gguf")


@dataclass
class RunInfo:
    """What the model card says: where the model came from and what training did."""

    run: Path
    checkpoint: Path
    base: str
    data: str
    reward: str
    steps: int
    held_out: str
    max_steps: int | None = None


# C0 and C1 control characters (newlines, ESC and the terminal escapes they start, NUL, DEL) and
# the Unicode line and paragraph separators: never written as they are
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
# Markdown's inline markup (emphasis, code, links, tables, math, strikethrough) and backslash
_MARKUP = re.compile(r"([\\`*\[\]|$~])")
_WORD_EDGE_UNDERSCORE = re.compile(r"(?<![0-9A-Za-z])_|_(?![0-9A-Za-z])")  # emphasis; a_b inside a word is not


def visible(text) -> str:
    """`text` with every control character shown as an escape (`\x1b`, `\n`): a value read from a
    run directory never moves the cursor, recolours a terminal or breaks a line."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), str(text))


def md(text) -> str:
    """`text` as literal text in a Markdown table cell or heading (issue 35, N5): control characters
    shown as escapes, HTML's `<` and `&` as entities, Markdown's markup characters backslash-escaped,
    so markup planted in a run name, data path or metric renders as the characters typed."""
    text = visible(text).replace("&", "&amp;").replace("<", "&lt;")
    text = _WORD_EDGE_UNDERSCORE.sub(r"\\_", _MARKUP.sub(r"\\\1", text))
    return "\\" + text if text[:1] in ("#", "+", "-", "=", ">") else text


def _section(cfg: dict, name: str) -> dict:
    value = cfg.get(name) if isinstance(cfg, dict) else None
    return value if isinstance(value, dict) else {}


def describe_reward(reward: dict) -> str:
    """'probability (mean_prob; score B - score A (initial), shaping threshold_0, format weight 0.1)':
    the kind first (a tag is made of it), then its main settings."""
    kind = str(reward.get("kind", "probability"))
    agg, alpha = reward.get("aggregation", "mean_prob"), reward.get("alpha", 0.1)
    debias = f"score B - score A ({reward.get('score_a', 'initial')})" if reward.get("debias", True) else "score B"
    if kind == "probability":
        settings = f"{agg}; {debias}, shaping {reward.get('shaping', 'threshold_0')}, format weight {alpha}"
    elif kind == "hybrid":
        settings = f"{reward.get('vr_weight', 1.0)} x verifier + {reward.get('pr_weight', 0.5)} x probability ({agg})"
    elif kind == "nover":
        settings = f"scorer {reward.get('scorer', 'current')}, gate {reward.get('nover_gate', 'format')}"
    else:
        settings = f"format weight {alpha}"
    return f"{kind} ({settings})"


def describe_data(data: dict) -> str:
    """'train: demo (232 questions); val: demo (100 questions)' (a file or folder by its path)."""
    def one(split: str) -> str:
        source = str(data.get(split, "demo"))
        if not source:
            return "none"
        size = data.get(f"demo_{split}_size")
        return f"demo tasks ({size} questions)" if source == "demo" and size else source
    return f"train: {one('train')}; val: {one('val')}"


def held_out_line(before: dict, after: dict, at_step: int | None = None) -> str:
    """'greedy 38.0% -> 46.0%, Avg@4 19.5% -> 28.7%' from two held-out evaluations ('at step N'
    added for one during the run), 'greedy 38.0% before training' with no later one, or a dash."""
    before, after = before or {}, after or {}
    k = after.get("eval/samples") or before.get("eval/samples")
    keys = [("eval/greedy_accuracy", "greedy")] + ([("eval/accuracy", f"Avg@{k}")] if k else [])
    pct = {side: {label: f"{100 * d[key]:.1f}%" for key, label in keys if isinstance(d.get(key), (int, float))}
           for side, d in (("before", before), ("after", after))}
    parts = [f"{label} {pct['before'][label]} -> {value}" for label, value in pct["after"].items()
             if label in pct["before"]]
    if parts:
        return ", ".join(parts) + (f" (evaluated at step {at_step})" if at_step is not None else "")
    if pct["after"]:
        return ", ".join(f"{label} {v}" for label, v in pct["after"].items()) + (
            f" at step {at_step}" if at_step is not None else "")
    if pct["before"]:
        return ", ".join(f"{label} {v}" for label, v in pct["before"].items()) + " before training"
    return "-"


def held_out_until(run: Path, step: int) -> tuple[dict, dict, int | None]:
    """(before, the latest evaluation at or before `step`, its step) from the run's metrics.jsonl
    (the evaluation before training is logged at step 0); summary.yaml's before/after when the log
    has none. Lines that do not parse are passed over: a card never fails on them."""
    before: dict = {}
    latest: tuple[dict, int | None] = ({}, None)
    try:
        lines = (run / "metrics.jsonl").read_bytes().split(b"\n")
    except OSError:
        lines = []
    for line in lines:
        if b'"eval/' not in line:  # most records hold no evaluation: not parsed
            continue
        try:
            record = json.loads(line)
            at = int(record["step"])
        except (ValueError, KeyError, TypeError, RecursionError):
            continue
        evals = {k: v for k, v in record.items() if isinstance(k, str) and k.startswith("eval/")}
        if at == 0:
            before = {**before, **evals}
        elif at <= step:
            latest = ({**latest[0], **evals} if latest[1] == at else evals, at)
    if not before or latest[1] is None:
        summary = _read_yaml(run / "summary.yaml")
        if summary.get("step") == step:
            before = before or _mapping(summary.get("before"))
            if latest[1] is None and _mapping(summary.get("after")):
                latest = (_mapping(summary.get("after")), step)
    return before, latest[0], latest[1]


def _mapping(value) -> dict:
    return value if isinstance(value, dict) else {}


def _read_yaml(path: Path) -> dict:
    import yaml

    try:
        return _mapping(yaml_load(path.read_text(encoding="utf-8", errors="replace")))
    except (OSError, yaml.YAMLError, ValueError, RecursionError):
        return {}


def checkpoint_step(checkpoint: Path) -> int:
    """N of a checkpoints/step_N folder (0 for any other name)."""
    tail = Path(checkpoint).name.removeprefix("step_")
    return int(tail) if tail.isdigit() else 0


def run_info(run: Path, checkpoint: Path, cfg: dict | None = None) -> RunInfo:
    """What the card of `checkpoint` says, from `cfg` (the run's configuration as a dict; default:
    its config.yaml) and the held-out evaluations logged up to the checkpoint's step."""
    run, checkpoint = Path(run), Path(checkpoint)
    cfg = cfg if cfg is not None else _read_yaml(run / "config.yaml")
    step = checkpoint_step(checkpoint)
    max_steps = _section(cfg, "trainer").get("max_steps")
    before, after, at = held_out_until(run, step)
    held_out = held_out_line(before, after, at if at is not None and at < step else None)
    return RunInfo(run, checkpoint, str(_section(cfg, "model").get("path", "default")),
                   describe_data(_section(cfg, "data")), describe_reward(_section(cfg, "reward")), step,
                   held_out, max_steps if isinstance(max_steps, int) else None)


def model_card(info: RunInfo, fmt: str) -> str:
    """The README.md: YAML front matter (library, tags), what training did, how to load it. `fmt`:
    adapter / model (a checkpoint's folder), hf / gguf (an export)."""
    from rlpr.version import __version__

    base = "SmolLM2-135M-Instruct (embedded in rlpr)" if info.base == "default" else info.base
    step_dir = f"checkpoints/{info.checkpoint.name}"
    run = shlex.quote(visible(info.run))  # a pasted command runs exactly one rlpr command
    usage = {
        "gguf": 'llama-cli -m model.gguf -p "..."  # llama.cpp; or Ollama / LM Studio',
        "hf": "AutoModelForCausalLM.from_pretrained(PATH)  # transformers, vLLM, TGI",
        "model": f"AutoModelForCausalLM.from_pretrained({json.dumps(visible(step_dir + '/model'))})  "
                 f"# transformers, vLLM\n"
                 f"rlpr export {run} --step {int(info.steps)} --format gguf -o model.gguf  # llama.cpp",
        "adapter": f"rlpr export {run} --step {int(info.steps)} --format hf -o merged  # LoRA merged into the "
                   f"base\nPeftModel.from_pretrained(base_model, {json.dumps(visible(step_dir + '/adapter'))})  "
                   f"# peft, on the base model",
    }[fmt]
    fence = "`" * max(3, 1 + max((len(m) for m in re.findall(r"`+", usage)), default=0))
    library = {"gguf": "gguf", "adapter": "peft"}.get(fmt, "transformers")
    steps = str(info.steps)
    if info.max_steps and info.steps < info.max_steps:
        steps = f"{info.steps} of {info.max_steps} (an intermediate checkpoint)"
    kind = re.sub(r"[^0-9A-Za-z_-]", "", info.reward.split()[0] if info.reward else "") or "probability"
    return f"""---
library_name: {library}
tags: [rlpr, reinforcement-learning, rlpr-{kind}]
---
# {md(info.run.name)}

Trained with rlpr {__version__} (Reinforcement Learning with Reference Probability Reward,
[arXiv 2506.18254](https://arxiv.org/abs/2506.18254)).

| | |
|---|---|
| base model | {md(base)} |
| training data | {md(info.data or '-')} |
| reward | {md(info.reward)} |
| steps | {md(steps)} |
| held-out before -> after | {md(info.held_out)} |
| checkpoint | {md(info.checkpoint.name)} of run {md(info.run.name)} |

{fence}
{usage}
{fence}
"""


def checkpoint_card(run: Path, checkpoint: Path, fmt: str, cfg: dict | None = None) -> str | None:
    """The card of a checkpoint being saved; None (and a warning) if it cannot be built: a save
    never fails for its card. No configuration (`cfg` None and no config.yaml in `run`): None."""
    try:
        cfg = cfg if cfg is not None else _read_yaml(Path(run) / "config.yaml")
        return model_card(run_info(run, checkpoint, cfg), fmt) if cfg else None
    except Exception as e:  # noqa: BLE001 - a convenience beside the weights
        log.warning("could not write the model card of %s: %s", checkpoint, e)
        return None


def write_card(folder: Path, text: str) -> None:
    """README.md in `folder`, written atomically (a temporary file renamed)."""
    write_atomic(Path(folder) / CARD_FILE, text)


def refresh_card(checkpoint: Path) -> None:
    """Rewrite a saved checkpoint's cards from its run directory as it stands now: after the final
    held-out evaluation (which runs once the final checkpoint is saved), its before -> after. A
    failure is a warning."""
    checkpoint = Path(checkpoint)
    folder = "adapter" if (checkpoint / "adapter").is_dir() else "model"
    card = checkpoint_card(checkpoint.parent.parent, checkpoint, folder)
    if card:
        try:
            write_card(checkpoint, card)
            write_card(checkpoint / folder, card)
        except OSError as e:
            log.warning("could not update the model card of %s: %s", checkpoint, e)
