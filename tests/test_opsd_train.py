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


@pytest.mark.parametrize("top_k,weight", [(0, 1.0), (5, 0.5)])
def test_the_jsd_term_of_the_loss_equals_a_direct_computation(tiny_model, top_k, weight):
    from rlpr.algorithms.losses import Normaliser
    from rlpr.algorithms.opsd import top_k_rows
    from rlpr.train.update import DistillTarget, MicroBatch, Sample, micro_batch_loss

    g = torch.Generator().manual_seed(0)
    samples, direct = [], []
    for length in (5, 3):
        ids = torch.randint(5, 1000, (4 + length,), generator=g).tolist()
        teacher = torch.log_softmax(torch.randn(length, tiny_model.config.vocab_size, generator=g) * 2, -1)
        indices, rows = top_k_rows(teacher, top_k) if top_k else (None, teacher)
        samples.append(Sample(ids, 4, 0.0, distill=DistillTarget(rows, indices, 0.3, weight)))
        student = direct_logprobs(tiny_model, ids, 4, 1.0)
        if top_k:
            student = torch.log_softmax(student.gather(-1, indices), -1)
        direct.append(generalized_jsd(rows, student, 0.3))
    cfg = AlgorithmConfig(entropy_coef=0.0)
    for prefix in (None, samples[0].input_ids[:4]):  # padded, and as one prompt's responses (shared prefix)
        if prefix is not None:
            for s in samples:
                s.input_ids[:4] = prefix
            direct = [generalized_jsd(s.distill.logp,
                                      direct_logprobs(tiny_model, s.input_ids, 4, 1.0) if not top_k else
                                      torch.log_softmax(direct_logprobs(tiny_model, s.input_ids, 4, 1.0)
                                                        .gather(-1, s.distill.indices), -1), 0.3) for s in samples]
        tiny_model.zero_grad()
        loss, stats = micro_batch_loss(tiny_model, MicroBatch(samples, 0, prefix), Normaliser(tokens=8, sequences=2),
                                       cfg, 1.0)
        want = weight * torch.cat(direct).sum() / 8  # token_mean over the 8 response tokens
        assert loss.item() == pytest.approx(want.item(), rel=1e-4)
        assert stats["opsd_tokens"] == 8 and stats["opsd_jsd"] == pytest.approx(torch.cat(direct).sum().item(),
                                                                                   rel=1e-4)
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
