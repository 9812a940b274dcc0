"""The model card every checkpoint carries (rlpr/model/card.py): a README.md beside the LoRA
adapter or the full weights, in place of peft's empty template, naming the base model, the data,
the reward, the steps and the held-out before -> after; the same card `rlpr export` writes."""

import pytest

import rlpr

from rlpr.train.checkpoint import list_checkpoints, resume_config
from rlpr.model.card import held_out_line
from rlpr.train.trainer import train

from helpers import tiny_cfg

pytestmark = pytest.mark.integration  # tiny training runs

PEFT_TEMPLATE = "# Model Card for Model ID"  # the first heading of peft's empty template


@pytest.fixture(scope="module")
def runs(tiny_dir, tmp_path_factory):
    """A 3-step LoRA run saving every step (an evaluation at step 2) and a 1-step full fine-tuning run."""
    out = tmp_path_factory.mktemp("card-runs")
    train(tiny_cfg(tiny_dir, out, "lora", "trainer.max_steps=3", "trainer.save_every=1", "trainer.keep_last=3",
                   "trainer.eval_every=2", "trainer.eval_samples=2"))
    train(tiny_cfg(tiny_dir, out, "full", "trainer.max_steps=1", "trainer.eval_samples=0", "model.lora=false"))
    return out


def cards(ckpt, folder):
    top, inner = (ckpt / "README.md").read_text(), (ckpt / folder / "README.md").read_text()
    assert top == inner  # the one in adapter/ (or model/) is what a Hub upload of that folder shows
    return top


def test_every_lora_checkpoint_carries_a_real_card(runs, tiny_dir):
    found = list_checkpoints(runs / "lora")
    assert [c.name for c in found] == ["step_1", "step_2", "step_3"]
    for ckpt in found:
        card = cards(ckpt, "adapter")
        assert PEFT_TEMPLATE not in card and "library_name: peft" in card
        assert f"Trained with rlpr {rlpr.__version__} " in card and "https://arxiv.org/abs/2506.18254" in card
        assert f"| base model | {tiny_dir} |" in card
        assert "| reward | probability (mean_prob; score B - score A (initial)" in card
        assert "train: demo tasks (40 questions); val: demo tasks (4 questions)" in card
        assert f"{ckpt.name} of run lora" in card and f"checkpoints/{ckpt.name}/adapter" in card
    first, second, final = (cards(c, "adapter") for c in found)
    # intermediate checkpoints say their step; held-out as known when each was saved
    assert "| steps | 1 of 3 (an intermediate checkpoint) |" in first
    assert "before training |" in first and "->" not in first.split("held-out before -> after |")[1].split("\n")[0]
    assert "| steps | 2 of 3 (an intermediate checkpoint) |" in second
    assert "| held-out before -> after | greedy " in second and "Avg@2" in second
    # the final one: rewritten after the final evaluation, before -> after
    assert "| steps | 3 |" in final
    row = final.split("| held-out before -> after | ")[1].split(" |")[0]
    assert row.startswith("greedy ") and "% -> " in row and "Avg@2" in row and "step" not in row


def test_a_full_fine_tuning_checkpoint_carries_the_card_too(runs, tiny_dir):
    (ckpt,) = list_checkpoints(runs / "full")
    card = cards(ckpt, "model")
    assert "library_name: transformers" in card and f"| base model | {tiny_dir} |" in card
    assert "| reward | probability (" in card and "| steps | 1 |" in card
    assert 'AutoModelForCausalLM.from_pretrained("checkpoints/step_1/model")' in card
    row = card.split("| held-out before -> after | ")[1].split(" |")[0]
    assert row.startswith("greedy ") and "->" in row and "Avg@" not in row  # greedy only: eval_samples=0


def test_resume_and_pruning_keep_cards(runs):
    """A resumed run's new checkpoints get cards (the before-training evaluation read back from
    metrics.jsonl); pruning removes old checkpoints with their cards."""
    import shutil

    run = runs.parent / "card-resume"
    shutil.copytree(runs / "lora", run)
    train(resume_config(run, ["trainer.max_steps=4"]), resume=str(run))
    assert [c.name for c in list_checkpoints(run)] == ["step_2", "step_3", "step_4"]
    card = cards(run / "checkpoints" / "step_4", "adapter")
    assert "| steps | 4 |" in card and "of run card-resume" in card
    assert "% -> " in card.split("| held-out before -> after | ")[1].split(" |")[0]


def test_held_out_line():
    before = {"eval/greedy_accuracy": 0.38, "eval/accuracy": 0.195, "eval/samples": 4}
    after = {"eval/greedy_accuracy": 0.46, "eval/accuracy": 0.287, "eval/samples": 4}
    assert held_out_line(before, after) == "greedy 38.0% -> 46.0%, Avg@4 19.5% -> 28.7%"
    assert held_out_line(before, after, 5) == "greedy 38.0% -> 46.0%, Avg@4 19.5% -> 28.7% (evaluated at step 5)"
    greedy = {"eval/greedy_accuracy": 0.5, "eval/accuracy": 0.5}  # eval_samples=0: no Avg@k
    assert held_out_line(greedy, greedy) == "greedy 50.0% -> 50.0%"
    assert held_out_line(before, {}) == "greedy 38.0%, Avg@4 19.5% before training"
    assert held_out_line({}, {}) == "-"


def test_cards_are_escaped_for_markdown_html_and_terminals(tmp_path):
    """issue 35, N5: markup and terminal escapes from run names, data paths and metrics went into
    README.md as they were, a newline broke out of the table, and the usage line was an unquoted
    shell command (a run named `a;touch X;b` gave a card whose pasted command ran `touch`)."""
    import re
    import shlex
    from rlpr.model.card import RunInfo, model_card, visible

    name = "a;touch X;b <script>alert(1)</script> *x* \x1b[31mred\x1b[0m $x$ [l](x)\n| injected | row |"
    run = tmp_path / "runs" / name
    info = RunInfo(run, run / "checkpoints" / "step_3", "/models/b|ase <img src=x onerror=y>",
                   "train: data/q|s.jsonl\r\n# heading; val: ```evil```", "probability (mean_prob; x)", 3,
                   "greedy 10.0% -> 20.0%\x07", None)
    for fmt in ("adapter", "model", "hf", "gguf"):
        card = model_card(info, fmt)
        for raw in ("\x1b", "\x07", "\r"):  # anywhere, the code block too
            assert raw not in card, (fmt, raw)
        prose = re.split(r"^`{3,}$", card, flags=re.M)[0]  # a code block shows markup as text
        for raw in ("<script", "<img", "*x*", "[l](x)", "$x$"):
            assert raw not in prose, (fmt, raw)
        assert not any(line.startswith(("| injected", "# heading")) for line in card.splitlines())
        table = [line for line in card.splitlines() if line.startswith("| ")]
        assert len(table) == 7  # the header and six rows: nothing broke out
        for row in table[1:]:
            assert len(re.findall(r"(?<!\\)\|", row)) == 3, row  # the cell's own | are escaped
        assert card.startswith("---\nlibrary_name: ") and card.count("\n---\n") == 1
        fences = re.findall(r"^(`{3,})$", card, flags=re.M)
        assert len(fences) == 2 and fences[0] == fences[1]
        block = card.split(fences[0] + "\n")[1]
        for line in block.splitlines():
            if line.startswith("rlpr export"):
                words = shlex.split(line, comments=True)
                assert words[:2] == ["rlpr", "export"] and words[3] == "--step"
                assert words[2] == visible(str(run))  # one argument, the run's path: `touch` never runs
