"""The training loop on tiny in-process models: micro-batch invariance, exact resume, dynamic
sampling, interruption, and the run directory a user gets."""

import logging
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml
from safetensors.torch import load_file

from rlpr.algorithms.losses import Normaliser
from rlpr.train.checkpoint import latest_checkpoint, load_state
from rlpr.train.metrics import Group
from rlpr.config import AlgorithmConfig
from rlpr.errors import ConfigError, TrainingError
from rlpr.reward.probability_reward import RewardOutput
from rlpr.rollout.hf import Rollout
from rlpr.train.tracking import read_metrics
from rlpr.train.trainer import Trainer, train
from rlpr.train.update import Sample, accumulate_gradients, fill_logprobs

from helpers import ScriptedEngine, adapter_tensors, at_a_terminal, tiny_cfg

pytestmark = pytest.mark.integration


# -- (a) micro-batch invariance -------------------------------------------------------------------

def random_samples(vocab, n=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        p, r = 3 + i % 4, 2 + (5 * i) % 9
        ids = torch.randint(3, vocab, (p + r,), generator=g).tolist()
        out.append(Sample(ids, p, advantage=float(torch.randn(1, generator=g))))
    return out


def grouped_samples(vocab, groups=3, n=4, seed=0):
    """Responses that share their group's prompt, as in RL."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for k in range(groups):
        prompt = torch.randint(3, vocab, (5 + 3 * k,), generator=g).tolist()
        for i in range(n):
            response = torch.randint(3, vocab, (2 + (5 * i + k) % 7,), generator=g).tolist()
            out.append(Sample(prompt + response, len(prompt), advantage=float(torch.randn(1, generator=g))))
    return out


@pytest.mark.parametrize("loss_agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"])
@pytest.mark.parametrize("kl_coef", [0.0, 0.05])
def test_loss_and_gradients_do_not_depend_on_micro_batching(tokenizer, loss_agg, kl_coef):
    from rlpr.model.loading import tiny_llama

    cfg = AlgorithmConfig(loss_agg=loss_agg, kl_coef=kl_coef)
    model = tiny_llama(tokenizer, seed=3).train()
    ref = tiny_llama(tokenizer, seed=4)
    samples = grouped_samples(len(tokenizer))
    fill_logprobs(ref, samples, "ref_logp", 4, tokenizer.pad_token_id, 1.0)
    with torch.no_grad():  # move off the old policy so that ratios and clipping matter
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    fill_logprobs(tiny_llama(tokenizer, seed=3), samples, "old_logp", 4, tokenizer.pad_token_id, 1.0, False)
    shared = [Sample(s.input_ids, s.prompt_len, s.advantage) for s in samples]
    fill_logprobs(tiny_llama(tokenizer, seed=3), shared, "old_logp", 4, tokenizer.pad_token_id, 1.0, True)
    packed = [Sample(s.input_ids, s.prompt_len, s.advantage) for s in samples]
    fill_logprobs(tiny_llama(tokenizer, seed=3), packed, "old_logp", 4, tokenizer.pad_token_id, 1.0, True, pack=True)
    for a, b, c in zip(samples, shared, packed):  # the shared-prompt paths give the same old log-probs
        assert torch.allclose(a.old_logp, b.old_logp, atol=1e-5)
        assert torch.allclose(a.old_logp, c.old_logp, atol=1e-5)
    results = []
    # whole, one sequence at a time, uneven chunks; each with and without the shared-prompt path;
    # then token budgets (trainer.micro_batch_tokens: 1 puts every sequence alone, 40 packs 2-4);
    # then the shared prompt's responses packed into rows (trainer.pack_responses)
    for micro, share, budget, pack in ((len(samples), False, 0, False), (1, False, 0, False), (3, False, 0, False),
                                       (len(samples), True, 0, False), (1, True, 0, False), (3, True, 0, False),
                                       (1, False, 40, False), (1, True, 40, False), (1, False, 1, False),
                                       (1, True, 1, False), (len(samples), True, 0, True), (3, True, 0, True),
                                       (1, True, 40, True)):
        model.zero_grad(set_to_none=True)
        stats = accumulate_gradients(model, samples, cfg, micro, tokenizer.pad_token_id, 0.8, share,
                                     max_tokens=budget, pack=pack)
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        results.append((stats, grads))
    (s0, g0), *rest = results
    assert g0.abs().sum() > 0 and s0["clipped"] > 0
    for stats, grads in rest:
        # fp32 summation order differs with the CPU and thread count: seq_mean_token_sum's gradients
        # (largest 0.87) differed by up to 1.8e-6 on an AVX2 AMD EPYC, so the tolerance scales with them
        assert torch.allclose(grads, g0, atol=max(1e-6, 1e-5 * g0.abs().max().item()), rtol=1e-5)
        for key in ("pg_loss", "entropy", "kl", "tokens", "clipped"):
            assert stats[key] == pytest.approx(s0[key], rel=1e-6, abs=1e-6)


def test_prompt_runs_once_per_group_whatever_the_micro_batch(tokenizer, monkeypatch):
    """The gradient test above covers the values; this checks that the prompt's forward really
    is shared across a group's micro-batches (3 groups of 4 responses, 1 response per micro-batch)."""
    import rlpr.train.update as update
    from rlpr.model.loading import tiny_llama

    built = []

    class Counting(update.PrefixState):
        def __init__(self, model, prefix):
            built.append(len(prefix))
            super().__init__(model, prefix)

    monkeypatch.setattr(update, "PrefixState", Counting)
    samples = grouped_samples(len(tokenizer))
    model = tiny_llama(tokenizer, seed=3).train()
    accumulate_gradients(model, samples, AlgorithmConfig(), 1, tokenizer.pad_token_id, 1.0, True)
    assert built == [5, 8, 11]
    built.clear()
    accumulate_gradients(model, samples, AlgorithmConfig(), 1, tokenizer.pad_token_id, 1.0, True, lockstep=True)
    assert built == [5] * 4 + [8] * 4 + [11] * 4  # FSDP's lock-step path: one prompt forward per micro-batch


def test_normaliser_counts_whole_mini_batch(tokenizer):
    from rlpr.train.update import normaliser

    samples = random_samples(len(tokenizer), n=5)
    assert normaliser(samples) == Normaliser(tokens=sum(s.response_len for s in samples), sequences=5)


# -- (b) exact resume -----------------------------------------------------------------------------

def comparable(metrics):
    return [{k: v for k, v in m.items() if not k.startswith("perf/")} for m in metrics]


def test_straight_run_equals_interrupted_and_resumed_run(tiny_dir, tmp_path):
    # both runs on tiny_cfg's 2 threads, whatever the load when each starts (the test below: the resume keeps them)
    straight = tiny_cfg(tiny_dir, tmp_path, "straight", "trainer.max_steps=4", "data.val=")
    train(straight)
    first = tiny_cfg(tiny_dir, tmp_path, "resumed", "trainer.max_steps=2", "data.val=")
    train(first)
    from rlpr.train.checkpoint import resume_config

    train(resume_config(tmp_path / "resumed", ["trainer.max_steps=4"]), resume=str(tmp_path / "resumed"))

    a, b = adapter_tensors(tmp_path / "straight"), adapter_tensors(tmp_path / "resumed")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    sa = load_state(latest_checkpoint(tmp_path / "straight"))
    sb = load_state(latest_checkpoint(tmp_path / "resumed"))
    assert sa["step"] == sb["step"] == 4
    assert sa["filter"] == sb["filter"] and sa["filter"]["ema"] is not None  # the EMA really started
    assert sa["ranks"][0]["stream"] == sb["ranks"][0]["stream"]
    for group_a, group_b in zip(sa["optimizer"]["state"].values(), sb["optimizer"]["state"].values()):
        for key in group_a:
            assert torch.equal(group_a[key], group_b[key])
    ma, mb = read_metrics(tmp_path / "straight"), read_metrics(tmp_path / "resumed")
    assert comparable(ma) == comparable(mb)
    assert [m["step"] for m in ma] == [1, 2, 3, 4]
    # the length monitor's baseline (the first 3 steps) crosses the resume point and is restored
    assert sa["length"] == sb["length"] and len(sa["length"]["first"]) == 3
    assert ma[0]["rollout/response_len_ratio"] == 1.0 and all("rollout/response_len_ratio" in m for m in ma)


def test_a_resume_keeps_the_threads_the_run_was_saved_with(tiny_dir, tmp_path, monkeypatch, caplog):
    """model.threads=0 chooses threads from how busy the machine is at the start; a CPU matmul's sums
    depend on the thread count (full fine-tuning of the tiny model, 2 threads then 1: 7e-9 apart after
    one step). A resume on a busier machine takes the saved count and stays bit for bit."""
    import rlpr.parallel.threads as threads
    from rlpr.train.checkpoint import resume_config

    full = ["model.lora=false", "trainer.lr=1e-4", "data.val=", "trainer.save_every=2", "model.threads=0"]
    monkeypatch.setattr(threads, "choose_threads", lambda *a: (2, None))  # an idle machine: 2 threads
    train(tiny_cfg(tiny_dir, tmp_path, "straight", "trainer.max_steps=3", *full))
    train(tiny_cfg(tiny_dir, tmp_path, "resumed", "trainer.max_steps=2", *full))
    assert load_state(latest_checkpoint(tmp_path / "resumed"))["ranks"][0]["threads"] == 2
    monkeypatch.setattr(threads, "choose_threads", lambda *a: (1, None))  # a busy one at the resume
    with caplog.at_level(logging.INFO, logger="rlpr"):
        train(resume_config(tmp_path / "resumed", ["trainer.max_steps=3"]), resume=str(tmp_path / "resumed"))
    assert "resuming on 2 torch threads per process, as the run was saved" in caplog.text
    model = "model/model.safetensors"
    a = load_file(str(latest_checkpoint(tmp_path / "straight") / model))
    b = load_file(str(latest_checkpoint(tmp_path / "resumed") / model))
    assert all(torch.equal(a[k], b[k]) for k in a)
    # an explicit model.threads is taken as given
    caplog.clear()
    before = torch.get_num_threads()
    try:
        with caplog.at_level(logging.INFO, logger="rlpr"):
            train(resume_config(tmp_path / "resumed", ["trainer.max_steps=4", "model.threads=1"]),
                  resume=str(tmp_path / "resumed"))
        assert "resuming on" not in caplog.text and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_lora_weights_change_and_checkpoint_loads(tiny_dir, tmp_path):
    cfg = tiny_cfg(tiny_dir, tmp_path, "run", "trainer.max_steps=2", "trainer.keep_last=1",
                   "trainer.save_every=1", "trainer.sample_every=1")
    summary = train(cfg)
    run = tmp_path / "run"
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step_2"]  # keep_last=1, no temp dirs
    tensors = adapter_tensors(run)
    assert any("lora_B" in k and v.abs().sum() > 0 for k, v in tensors.items())  # B starts at zero
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["trainer"]["max_steps"] == 2 and saved["model"]["lora"] is True
    metrics = read_metrics(run)
    steps = [m for m in metrics if "reward/mean" in m]
    for key in ("reward/score_b_mean", "reward/score_a_mean", "reward/mean", "filter/kept_frac", "filter/ema_std",
                "policy/clip_frac", "policy/entropy", "policy/kl", "policy/grad_norm",
                "rollout/response_len_mean", "perf/step_s", "perf/rollout_tok_s", "reward/fallback_frac"):
        assert key in steps[0], key
    evals = [m for m in metrics if "eval/accuracy" in m]
    assert [m["step"] for m in evals] == [0, 2] and "before" in summary and "after" in summary
    assert len(list((run / "samples").glob("*.jsonl"))) == 2
    from rlpr.model.loading import load_policy

    model, _ = load_policy(tiny_dir, run)
    assert not hasattr(model, "peft_config")  # adapter merged for inference


def test_full_fine_tuning_with_kl_saves_hf_model(tiny_dir, tmp_path):
    cfg = tiny_cfg(tiny_dir, tmp_path, "full", "trainer.max_steps=1", "model.lora=false",
                   "algorithm.kl_coef=0.1", "algorithm.kl_estimator=k2", "data.val=")
    train(cfg)
    ckpt = latest_checkpoint(tmp_path / "full")
    assert (ckpt / "model" / "model.safetensors").exists() and (ckpt / "model" / "tokenizer.json").exists()
    assert read_metrics(tmp_path / "full")[-1]["policy/kl"] >= 0.0


def test_existing_run_is_not_overwritten(tiny_dir, tmp_path):
    cfg = tiny_cfg(tiny_dir, tmp_path, "once", "trainer.max_steps=1", "data.val=")
    train(cfg)
    with pytest.raises(ConfigError, match="resume it with rlpr train --resume"):
        train(cfg)


# -- (d) dynamic sampling -------------------------------------------------------------------------

def fake_groups(trainer, indices, stds_by_index):
    groups = []
    for i in indices:
        spread = stds_by_index(i)
        rewards = [0.5 - spread, 0.5 + spread, 0.5 - spread, 0.5 + spread]
        groups.append(Group(trainer.train_prompts[i], [Rollout(0, [1, 2], "x", True)] * 4,
                            [RewardOutput(True, 1.0, False, r, 0.0, r, 0.0, r) for r in rewards]))
    return groups


def test_dynamic_sampling_refills_and_returns_surplus(tiny_dir, tmp_path):
    cfg = tiny_cfg(tiny_dir, tmp_path, "dyn", "algorithm.filter_warmup_steps=0", "algorithm.filter_init_steps=0",
                   "algorithm.max_sampling_tries=5", "data.val=")
    trainer = Trainer(cfg, tmp_path / "dyn")
    trainer.filter.ema = 0.2  # threshold 0.1: only odd prompt indices pass
    rolled = []

    def rollout_groups(indices, seed):
        rolled.append(list(indices))
        return fake_groups(trainer, indices, lambda i: 0.3 if i % 2 else 0.0)

    trainer.rollout_groups = rollout_groups
    kept, stats = trainer.collect(step=1)
    assert len(kept) == 4 and all(g.prompt.index % 2 for g in kept)
    assert stats["filter/tries"] == len(rolled) >= 2
    generated = [i for batch in rolled for i in batch]
    surplus = [i for i in generated if i % 2][4:]
    assert trainer.stream.cache == surplus  # surplus kept groups go back to the prompt cache
    assert stats["filter/kept_frac"] == pytest.approx(4 / len(generated))
    # the cache is served first on the next step
    assert trainer.stream.take(len(surplus)) == surplus


def test_too_few_kept_groups(tiny_dir, tmp_path):
    cfg = tiny_cfg(tiny_dir, tmp_path, "few", "algorithm.filter_warmup_steps=0", "algorithm.filter_init_steps=0",
                   "algorithm.max_sampling_tries=2", "data.val=", "algorithm.on_insufficient=error")
    trainer = Trainer(cfg, tmp_path / "few")
    trainer.filter.ema = 1.0
    trainer.rollout_groups = lambda indices, seed: fake_groups(trainer, indices, lambda i: 0.0)
    with pytest.raises(TrainingError, match="kept 0 of 4 groups after 2 rollout rounds"):
        trainer.collect(step=1)
    trainer.cfg.algorithm.on_insufficient = "train"
    kept, stats = trainer.collect(step=2)
    assert kept == [] and stats["filter/kept_frac"] == 0.0
    assert trainer.update(kept)["policy/tokens"] == 0.0  # nothing to train on, no crash


# -- interruption and user errors -----------------------------------------------------------------

def test_sigint_checkpoints_and_resume_finishes(tiny_dir, tmp_path):
    run = tmp_path / "sig"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "rlpr", "train", f"model.path={tiny_dir}", f"trainer.output_dir={tmp_path}",
           "trainer.name=sig", "trainer.max_steps=200", "rollout.max_new_tokens=8", "rollout.responses_per_prompt=2",
           "trainer.prompts_per_step=2", "trainer.mini_batch_prompts=2", "data.val=", "model.threads=1",
           "trainer.tensorboard=false", "trainer.report=false"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=at_a_terminal)  # Ctrl-C reaches it as a terminal's foreground job
    deadline = time.time() + 120
    while time.time() < deadline and not ((run / "metrics.jsonl").exists() and (run / "metrics.jsonl").read_text()):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    assert f"rlpr train --resume {run}" in err
    step = load_state(latest_checkpoint(run))["step"]
    assert 1 <= step < 200
    result = subprocess.run([sys.executable, "-m", "rlpr", "train", "--resume", str(run), "trainer.max_steps=" +
                             str(step + 1)], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert [m["step"] for m in read_metrics(run)] == list(range(1, step + 2))


@pytest.mark.parametrize("override,message", [
    ("trainer.prompts_per_step=5", "must be a multiple of trainer.mini_batch_prompts"),
    ("trainer.max_stepz=3", "did you mean 'trainer.max_steps'"),
    ("rollout.temperature=0", "rollout.temperature: must be in (0, inf), got 0"),
    ("reward.aggregation=median", "reward.aggregation: 'median' is not one of"),
    ("data.train=/nonexistent.parquet", "data.train: file not found"),
    ("trainer.lr=fast", "trainer.lr: expected a number"),
    ("rollout.responses_per_prompt=1", "rollout.responses_per_prompt: must be in [2, inf), got 1"),
    # issue 16, item 5: nonsense values that used to pass
    ("trainer.warmup_steps=-5", "trainer.warmup_steps: must be in [0, inf), got -5"),
    ("trainer.lr=nan", "trainer.lr: must be in (0, inf), got nan"),
    ("trainer.lr=inf", "trainer.lr: must be in (0, inf), got inf"),
    ("rollout.temperature=nan", "rollout.temperature: must be in (0, inf)"),
    ("model.lora_dropout=2", "model.lora_dropout: must be in [0, 1), got 2.0"),
    ("algorithm.filter_beta=-1", "algorithm.filter_beta: must be in [0, inf)"),
    ("trainer.save_every=-1", "trainer.save_every: must be in [0, inf)"),
    ("trainer.eval_every=-2", "trainer.eval_every: must be in [0, inf)"),
    ("trainer.sample_every=-3", "trainer.sample_every: must be in [0, inf)"),
    ("reward.kind=judge", "reward.kind: 'judge' is not one of probability, verifier, hybrid"),
    ("data.demo_families=[capital,moon]", "unknown demo task family moon"),
])
def test_config_errors_are_one_line(override, message, capsys):
    from rlpr.cli.main import main

    assert main(["train", override]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


# -- reward kinds, accuracy and collapse metrics, sampled evaluation (issue 14) ---------------------

@pytest.mark.parametrize("kind", ["verifier", "hybrid"])
def test_verifier_and_hybrid_kinds_train_and_log_accuracy(tiny_dir, tmp_path, kind):
    cfg = tiny_cfg(tiny_dir, tmp_path, kind, "trainer.max_steps=2", f"reward.kind={kind}",
                   "trainer.eval_samples=2", "trainer.sample_every=1")
    summary = train(cfg)
    metrics = read_metrics(tmp_path / kind)
    steps = [m for m in metrics if "reward/mean" in m]
    for m in steps:
        assert 0.0 <= m["reward/accuracy"] <= 1.0 and 0.0 < m["rollout/distinct_frac"] <= 1.0
    rows = [json_line for f in sorted((tmp_path / kind / "samples").glob("*.jsonl"))
            for json_line in map(yaml.safe_load, f.read_text().splitlines())]
    alpha = cfg.reward.alpha
    for r in rows:
        assert r["correct"] in (0.0, 1.0)
        verifier = (1 - alpha) * r["correct"] + alpha * r["format"]
        if kind == "verifier":
            assert r["score_b"] == 0.0 and r["reward"] == pytest.approx(verifier + r["penalty"])
        else:
            probability = (1 - alpha) * r["delta"] + alpha * r["format"]
            assert r["reward"] == pytest.approx(1.0 * verifier + 0.5 * probability + r["penalty"])
    after = summary["after"]
    for key in ("eval/accuracy", "eval/accuracy_se", "eval/greedy_accuracy", "eval/greedy_accuracy_se",
                "eval/pass@2"):
        assert key in after, key
    assert after["eval/samples"] == 2 and after["eval/pass@2"] >= after["eval/accuracy"] - 1e-9


def test_held_out_report_prints_before_and_after_with_errors():
    from rlpr.train.held_out import held_out_report

    ev = {"eval/accuracy": 0.25, "eval/accuracy_se": 0.03, "eval/greedy_accuracy": 0.5,
          "eval/greedy_accuracy_se": 0.035, "eval/pass@8": 0.7, "eval/reward_mean": 0.1, "eval/score_b_mean": 0.2,
          "eval/questions": 200, "eval/samples": 8}
    text = held_out_report({"before": ev, "after": {**ev, "eval/accuracy": 0.4}})
    assert "200 questions" in text and "25.0% ± 3.0 -> 40.0% ± 3.0" in text and "pass@8" in text


def test_held_out_graded_only_matches_the_scored_evaluation(tiny_dir, tmp_path):
    """evaluate(score=False) (the learning benchmark's transfer sets and curve points) grades the same
    responses the same way as the scored evaluation, without the probability reward's keys."""
    from rlpr.train.held_out import evaluate

    trainer = Trainer(tiny_cfg(tiny_dir, tmp_path, "graded", "trainer.eval_samples=2", "data.demo_val_size=6"),
                      tmp_path / "graded")
    refs = [p.example.reference for p in trainer.val_prompts]
    greedy = [ref if j % 2 == 0 else "no idea" for j, ref in enumerate(refs)]  # every second one right
    samples = [text for j, ref in enumerate(refs) for text in (ref, "no idea" if j < 3 else ref)]
    trainer.engine = ScriptedEngine(trainer.tokenizer, greedy + samples)
    results = {}
    for score in (True, False):
        trainer.engine.i, kept = 0, []
        results[score] = (evaluate(trainer, kept, score=score), kept)
    (scored, kept_scored), (graded, kept_graded) = results[True], results[False]
    n = len(refs)
    assert graded["eval/greedy_accuracy"] == pytest.approx(((n + 1) // 2) / n)
    assert graded["eval/accuracy"] == pytest.approx((2 * n - (3 if n > 3 else n)) / (2 * n))
    assert graded["eval/pass@2"] == 1.0 and kept_graded == kept_scored
    assert {k: v for k, v in scored.items() if k in graded} == graded
    assert set(scored) - set(graded) == {"eval/reward_mean", "eval/score_b_mean", "eval/format_rate"}


def test_collapse_is_flagged(tiny_dir, tmp_path, caplog):
    import logging

    trainer = Trainer(tiny_cfg(tiny_dir, tmp_path, "flag", "data.val="), tmp_path / "flag")
    with caplog.at_level(logging.WARNING, logger="rlpr.train"):
        trainer._flag_collapse(3, {"rollout/distinct_frac": 0.25})  # 1 of 4 responses distinct
        trainer._flag_collapse(4, {"rollout/distinct_frac": 1.0})
    # the trainer's warnings only (building it may warn that the machine is busy: rlpr.parallel.threads)
    assert [r.getMessage()[:27] for r in caplog.records
            if r.name.startswith("rlpr.train") and r.levelno >= logging.WARNING] == ["step 3: collapse? on averag"]


def test_length_monitor_ratio_and_one_warning(caplog):
    import logging

    from rlpr.train.metrics import LengthMonitor

    mon, seen = LengthMonitor(0.5), []
    with caplog.at_level(logging.WARNING, logger="rlpr.train"):
        for step, length in enumerate([20.0, 24.0, 16.0, 12.0, 9.0, 8.0, float("nan")], 1):
            m = {"rollout/response_len_mean": length}
            mon(step, m)
            seen.append(m.get("rollout/response_len_ratio"))
    # baseline: the running mean of the first 3 steps (20, 22, then 20), fixed after that
    assert seen[:6] == pytest.approx([1.0, 24 / 22, 0.8, 0.6, 0.45, 0.4]) and seen[6] is None
    messages = [r.getMessage() for r in caplog.records]  # once, at the first crossing
    assert len(messages) == 1 and messages[0].startswith("step 5: responses shortened to 45% of the first 3 steps' mean")
    again = LengthMonitor(0.5)
    again.load_state_dict(mon.state_dict())
    assert (again.first, again.warned) == ([20.0, 24.0, 16.0], True)
    quiet = LengthMonitor(0.0)
    for step, length in enumerate([20.0, 20.0, 20.0, 1.0], 1):
        quiet(step, {"rollout/response_len_mean": length})
    assert not quiet.warned


def test_a_step_with_every_group_filtered_logs_no_policy_values(tiny_dir, tmp_path):
    """With no group kept there is no update: the per-token policy metrics are missing (null in
    metrics.jsonl, a gap in the report's plots), not 0.0 (an entropy of 0 reads as a collapse)."""
    cfg = tiny_cfg(tiny_dir, tmp_path, "none", "trainer.max_steps=3", "algorithm.filter_beta=1e9",
                   "algorithm.max_sampling_tries=1", "data.val=")
    train(cfg)
    last = [m for m in read_metrics(tmp_path / "none") if "reward/mean" in m][-1]
    assert last["filter/kept_groups"] == 0 and last["policy/updates"] == 0 and last["policy/tokens"] == 0
    for key in ("policy/pg_loss", "policy/entropy", "policy/kl", "policy/clip_frac", "policy/grad_norm"):
        assert last[key] is None, key


def test_a_training_error_is_one_line_on_the_command_line(tiny_dir, tmp_path, monkeypatch, capsys):
    """A TrainingError (e.g. algorithm.on_insufficient=error and too few kept groups) says what to
    change: `rlpr train` prints it as one line and exits 2, no traceback."""
    import rlpr.train.trainer as trainer_module
    from rlpr.cli.main import main

    def refuse(cfg, resume=None, **_):
        raise TrainingError("step 3: the std filter kept 0 of 4 groups after 2 rollout rounds; raise ...")

    monkeypatch.setattr(trainer_module, "train", refuse)
    assert main(["train", f"model.path={tiny_dir}", f"trainer.output_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "rlpr: error: step 3: the std filter kept 0 of 4 groups after 2 rollout rounds; raise ..."
