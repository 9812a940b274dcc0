"""OPSD in the trainer (issue 41) on the tiny model: the teacher pass and each token's signal against a
direct forward, the JSD term of the loss against a direct computation, every kind and control from the
command line, and a bit-exact resume with the EMA teacher."""

from __future__ import annotations

import math

import pytest
import torch

from helpers import adapter_tensors, direct_logprobs, step_samples
from rlpr.algorithms.opsd import generalized_jsd
from rlpr.cli.main import main
from rlpr.config import AlgorithmConfig, load_config
from rlpr.train.tracking import read_metrics

pytestmark = pytest.mark.integration

SMALL = ["rollout.max_new_tokens=6", "rollout.responses_per_prompt=2", "trainer.prompts_per_step=2",
         "trainer.mini_batch_prompts=1", "trainer.micro_batch_sequences=2", "data.demo_train_size=20",
         "data.val=", "trainer.progress=false", "trainer.tensorboard=false", "trainer.sample_every=0",
         "trainer.report=false", "algorithm.filter_warmup_steps=1", "algorithm.filter_init_steps=1",
         "trainer.lr=1e-2", "model.rollout_dtype=float32", "trainer.mixed_precision=none"]


def small_cfg(tiny_dir, out, name, *extra):
    return load_config("demo", [f"model.path={tiny_dir}", f"trainer.output_dir={out}", f"trainer.name={name}",
                                *SMALL, *extra])


@pytest.mark.parametrize("loss,top_k", [("sampled_token", 0), ("jsd", 0), ("jsd", 7)])
def test_teacher_pass_and_signal_match_a_direct_forward(tiny_dir, tmp_path, loss, top_k):
    from rlpr.train.trainer import Trainer

    cfg = small_cfg(tiny_dir, tmp_path, "direct", "reward.kind=opsd", f"opsd.loss={loss}", f"opsd.top_k={top_k}",
                    "opsd.clip=0.02", "rollout.temperature=0.7")
    trainer = Trainer(cfg, tmp_path / "direct")
    samples, metrics = step_samples(trainer)
    assert samples and metrics["opsd/skipped_frac"] == 0.0 and metrics["opsd/identity_n"] == len(samples)
    policy = trainer.policy
    for s in samples:
        prompt = trainer.train_prompts[s.prompt_index]
        teacher_ids = trainer.distiller.teacher_prompt_ids(s.prompt_index)
        text = trainer.tokenizer.decode(teacher_ids)
        assert prompt.example.reference in text  # the reference, then the question
        assert text.index(prompt.example.reference) < text.index(prompt.example.prompt[-1]["content"])
        response = s.input_ids[s.prompt_len:]
        with policy.disable_adapter():  # opsd.teacher=initial: LoRA's adapter-off base
            u_rows = direct_logprobs(policy, teacher_ids + response, len(teacher_ids), 0.7)
        s_rows = direct_logprobs(policy, s.input_ids, s.prompt_len, 0.7)
        u = u_rows.gather(-1, torch.tensor(response)[:, None]).squeeze(-1)
        student = s_rows.gather(-1, torch.tensor(response)[:, None]).squeeze(-1)
        assert torch.allclose(s.old_logp, student, atol=1e-4)
        if loss == "sampled_token":
            assert torch.allclose(s.token_advantages, (u - student).clamp(-0.02, 0.02), atol=1e-4)
            assert s.distill is None
        elif top_k:
            values, indices = torch.topk(u_rows, top_k, dim=-1)
            assert torch.equal(s.distill.indices, indices)
            assert torch.allclose(s.distill.logp, torch.log_softmax(values, -1), atol=1e-4)
        else:
            assert s.distill.indices is None and torch.allclose(s.distill.logp, u_rows, atol=1e-4)


def test_the_initial_teacher_is_the_adapter_off_base_after_the_adapter_moved(tiny_dir, tmp_path):
    """opsd.teacher=initial after a step that moved the adapter (at step 1 LoRA's B is 0, so the
    adapter-on policy and the base are the same model and a test there proves nothing)."""
    from rlpr.train.trainer import Trainer

    cfg = small_cfg(tiny_dir, tmp_path, "moved", "reward.kind=opsd", "opsd.loss=sampled_token", "opsd.clip=1e9",
                    "algorithm.std_filter=false", "trainer.lr=5e-2")
    trainer = Trainer(cfg, tmp_path / "moved")
    trainer.train_step(1)
    assert any(p.abs().max() > 0 for n, p in trainer.policy.named_parameters() if "lora_B" in n)
    samples, _ = step_samples(trainer, 2)
    s = samples[0]
    teacher_ids = trainer.distiller.teacher_prompt_ids(s.prompt_index)
    ids, response = teacher_ids + s.input_ids[s.prompt_len:], torch.tensor(s.input_ids[s.prompt_len:])[:, None]
    with trainer.policy.disable_adapter():
        base = direct_logprobs(trainer.policy, ids, len(teacher_ids), 1.0).gather(-1, response).squeeze(-1)
    moved = direct_logprobs(trainer.policy, ids, len(teacher_ids), 1.0).gather(-1, response).squeeze(-1)
    teacher = s.token_advantages + s.old_logp  # a_t = u_t - s_t, unclipped
    assert torch.allclose(teacher, base, atol=1e-4)
    assert (moved - base).abs().max() > 1e-3  # the adapter-on policy is another model by now


@pytest.mark.parametrize("top_k,weight,clip", [(0, 1.0, 0.0), (5, 0.5, 0.0), (0, 1.0, 1.0)])
def test_the_jsd_term_of_the_loss_equals_a_direct_computation(tiny_model, top_k, weight, clip):
    from rlpr.algorithms.losses import Normaliser
    from rlpr.algorithms.opsd import top_k_rows
    from rlpr.train.update import DistillTarget, MicroBatch, Sample, micro_batch_loss

    g = torch.Generator().manual_seed(0)
    samples, direct = [], []
    for length in (5, 3):
        ids = torch.randint(5, 1000, (4 + length,), generator=g).tolist()
        teacher = torch.log_softmax(torch.randn(length, tiny_model.config.vocab_size, generator=g) * 2, -1)
        indices, rows = top_k_rows(teacher, top_k) if top_k else (None, teacher)
        samples.append(Sample(ids, 4, 0.0, distill=DistillTarget(rows, indices, 0.3, weight, clip)))

    def direct_jsd(s):  # the student's rows from one plain forward, then the divergence
        student = direct_logprobs(tiny_model, s.input_ids, 4, 1.0)
        if top_k:
            student = torch.log_softmax(student.gather(-1, s.distill.indices), -1)
        return generalized_jsd(s.distill.logp, student, 0.3)

    cfg = AlgorithmConfig(entropy_coef=0.0)
    # padded rows; one prompt's responses after a shared prefix; and packed after it (the CPU runs' path)
    for prefix, packed in ((None, False), (samples[0].input_ids[:4], False), (samples[0].input_ids[:4], True)):
        if prefix is not None:
            for s in samples:
                s.input_ids[:4] = prefix
        direct = torch.cat([direct_jsd(s) for s in samples])
        past = 0
        if clip:  # clip between the 4th and 5th smallest: it bites on 4 of the 8 tokens
            values = direct.sort().values
            clip = (values[3] + values[4]).item() / 2
            for s in samples:
                s.distill.token_clip = clip
            past, direct = int((direct > clip).sum()), direct.clamp(max=clip)
            assert past == 4
        tiny_model.zero_grad()
        loss, stats = micro_batch_loss(tiny_model, MicroBatch(samples, 0, prefix, packed=packed),
                                       Normaliser(tokens=8, sequences=2), cfg, 1.0)
        want = weight * direct.sum() / 8  # token_mean over the 8 response tokens
        assert loss.item() == pytest.approx(want.item(), rel=1e-4)
        assert stats["opsd_tokens"] == 8 and stats["opsd_jsd"] == pytest.approx(direct.sum().item(), rel=1e-4)
        assert stats["opsd_clipped"] == past
        loss.backward()
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in tiny_model.parameters())


OPSD_KEYS = {"opsd/teacher_logp_mean", "opsd/log_ratio_mean", "opsd/identity_pearson", "opsd/identity_spearman",
             "opsd/identity_mean_gap", "perf/teacher_s"}


@pytest.mark.parametrize("name,extra,keys", [
    ("opsd", ["reward.kind=opsd"], OPSD_KEYS | {"opsd/jsd"}),
    # the tiny model's RLPR rewards are often equal within a group: no std filter, so that both steps train
    ("opsd_hybrid", ["reward.kind=opsd_hybrid", "opsd.loss=sampled_token", "algorithm.std_filter=false"],
     OPSD_KEYS | {"opsd/adv_mean"}),
    ("op2sd", ["reward.kind=opsd", "reward.shuffle_references=true", "opsd.top_k=8"], OPSD_KEYS | {"opsd/jsd"}),
    ("opsd_context_only", ["reward.kind=opsd", "opsd.context=none", "opsd.loss=sampled_token"],
     OPSD_KEYS | {"opsd/clip_frac"}),
    ("opsd_no_teacher", ["reward.kind=opsd_no_teacher"], {"opsd/no_teacher_frac", "opsd/adv_mean"}),
])
def test_each_kind_and_control_trains_from_the_command_line(tiny_dir, tmp_path, name, extra, keys):
    args = [f"model.path={tiny_dir}", f"trainer.output_dir={tmp_path}", f"trainer.name={name}", *SMALL, *extra,
            "trainer.max_steps=2", f"trainer.report={str(name == 'opsd').lower()}"]
    assert main(["train", *args]) == 0
    steps = [m for m in read_metrics(tmp_path / name) if "reward/mean" in m]
    assert [m["step"] for m in steps] == [1, 2]
    for m in steps:
        assert keys <= set(m), keys - set(m)
        assert all(math.isfinite(m[k]) for k in keys if not k.startswith("opsd/identity"))
        assert m["filter/kept_frac"] == 1.0 and m["policy/updates"] == 2 and m["filter/threshold"] == 0.0
        if name != "opsd_hybrid":  # no sequence reward: every response 0, every group trained
            assert m["reward/mean"] == 0.0
    assert any(v.abs().max() > 0 for k, v in adapter_tensors(tmp_path / name).items() if "lora_B" in k)
    if name == "opsd":  # the run report plots the identity
        assert "OPSD identity: OPSD sum vs RLPR" in (tmp_path / name / "report.html").read_text()


def test_ema_teacher_and_identity_resume_bit_exactly(tiny_dir, tmp_path):
    from rlpr.train.checkpoint import latest_checkpoint, load_state, resume_config
    from rlpr.train.trainer import train

    extra = ["reward.kind=opsd", "opsd.teacher=ema", "opsd.ema_decay=0.5", "opsd.top_k=16"]
    train(small_cfg(tiny_dir, tmp_path, "straight", *extra, "trainer.max_steps=2"))
    train(small_cfg(tiny_dir, tmp_path, "resumed", *extra, "trainer.max_steps=1"))
    train(resume_config(tmp_path / "resumed", ["trainer.max_steps=2"]), resume=str(tmp_path / "resumed"))
    a, b = adapter_tensors(tmp_path / "straight"), adapter_tensors(tmp_path / "resumed")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ema_a = load_state(latest_checkpoint(tmp_path / "straight"))["opsd"]["ema"]
    ema_b = load_state(latest_checkpoint(tmp_path / "resumed"))["opsd"]["ema"]
    assert ema_a["steps"] == ema_b["steps"] == 4  # one per optimizer step: 2 per step
    assert all(torch.equal(ema_a["weights"][k], ema_b["weights"][k]) for k in ema_a["weights"])
    # the teacher moved off the initial adapter (lora_B starts at 0)
    assert any(v.abs().max() > 0 for k, v in ema_a["weights"].items() if "lora_B" in k)
    # a checkpoint whose teacher state has the wrong shape is refused as the other malformed states are
    from rlpr.train.checkpoint import state_shape_problem

    state = load_state(latest_checkpoint(tmp_path / "straight"))
    assert state_shape_problem(state, latest_checkpoint(tmp_path / "straight")) is None
    state["opsd"] = {"ema": {"steps": -1, "weights": {}}}
    assert state_shape_problem(state, latest_checkpoint(tmp_path / "straight")) == "malformed OPSD teacher state"
    ma = [{k: v for k, v in m.items() if not k.startswith("perf/")} for m in read_metrics(tmp_path / "straight")]
    mb = [{k: v for k, v in m.items() if not k.startswith("perf/")} for m in read_metrics(tmp_path / "resumed")]
    assert ma == mb and all("opsd/identity_pearson" in m for m in ma if "reward/mean" in m)


def test_gsm8k_worked_solutions_convert_and_train_with_the_teacher_shown_them(tiny_dir, tmp_path):
    """Issue 58: real GSM8K train rows ("#### N" answers) through `rlpr data convert`, then `rlpr train`
    with the teacher shown each row's worked solution (opsd.context=solution)."""
    from helpers import shared_data
    from rlpr.data.loading import load_examples
    from rlpr.train.trainer import Trainer

    source = shared_data("gsm8k/train.jsonl")  # skips with one line when ../shared/data is absent
    data = tmp_path / "gsm8k_train.parquet"
    assert main(["data", "convert", "--format", "gsm8k", "--input", str(source), "--output", str(data),
                 "--template", "steps", "--limit", "12"]) == 0
    rows = load_examples(data, "steps")
    first = rows[0].extra_info["solution"]
    assert first.endswith(f"\nAnswer: {rows[0].reference}") and "<<" not in first and "####" not in first
    extra = [f"data.train={data}", "reward.kind=opsd", "opsd.context=solution", "data.max_prompt_tokens=256",
             "opsd.recipe=authors_current", "rollout.max_new_tokens=6"]
    cfg = small_cfg(tiny_dir, tmp_path, "gsm8k", *extra)
    trainer = Trainer(cfg, tmp_path / "gsm8k")
    text = trainer.tokenizer.decode(trainer.distiller.teacher_prompt_ids(0))
    example = trainer.train_prompts[0].example
    assert example.extra_info["solution"] in text and "Here is a reference solution to the problem below:" in text
    args = [f"model.path={tiny_dir}", f"trainer.output_dir={tmp_path}", "trainer.name=gsm8k_cli", *SMALL, *extra,
            "trainer.max_steps=2"]
    assert main(["train", *args]) == 0
    steps = [m for m in read_metrics(tmp_path / "gsm8k_cli") if "reward/mean" in m]
    assert [m["step"] for m in steps] == [1, 2] and all(m["opsd/skipped_frac"] == 0.0 for m in steps)
    assert all(math.isfinite(m["opsd/jsd"]) and 0.0 <= m["opsd/jsd_clip_frac"] <= 1.0 for m in steps)


def test_demo_families_without_solutions_are_refused_for_the_solution_teacher(tiny_dir, tmp_path):
    from rlpr.errors import ConfigError
    from rlpr.train.trainer import Trainer

    with pytest.raises(ConfigError, match="data.demo_families: .* mix short-answer and reasoning families"):
        small_cfg(tiny_dir, tmp_path, "bare", "data.demo_families=[capital,add_two_digit]")
    with pytest.raises(ConfigError, match="the demo family capital has no worked solutions"):
        Trainer(small_cfg(tiny_dir, tmp_path, "bare2", "reward.kind=opsd", "opsd.context=solution",
                          "data.demo_families=[capital]", "data.demo_val_size=5"), tmp_path / "bare2")
    cfg = small_cfg(tiny_dir, tmp_path, "solved", "reward.kind=opsd", "opsd.context=solution", "data.template=steps",
                    "data.demo_families=[add_two_digit,weekday_steps]", "data.max_prompt_tokens=256",
                    "data.demo_val_size=5")
    trainer = Trainer(cfg, tmp_path / "solved")
    text = trainer.tokenizer.decode(trainer.distiller.teacher_prompt_ids(0))
    assert trainer.train_prompts[0].example.extra_info["solution"] in text and "After understanding" in text
