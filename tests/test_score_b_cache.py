"""Score B from the rollout's kept KV cache (issue 42): the decode loops keep each row's real
positions, and score B continuing them equals score B recomputed over the whole o' (fp32, tiny model;
the embedded model's checks are in test_score_b_cache_real.py)."""

import pytest
import torch
from helpers import score_b_both_ways

from rlpr.config import load_config
from rlpr.model.forward import output_cache
from rlpr.reward.from_cache import uses_cache
from rlpr.reward.probability_reward import ProbabilityReward
from rlpr.rollout.decode import sample
from rlpr.rollout.graph_decode import static_sample
from rlpr.rollout.hf import HFRollout
from rlpr.rollout.kept_cache import KeptCaches
from rlpr.rollout.sampling import PerRowSampler, row_seed

pytestmark = pytest.mark.unit

QUESTIONS = ["Capital of France?", "A much longer question about rivers and mountains?", "Why?"]


def chat(tokenizer, questions=QUESTIONS):
    return [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
            for q in questions]


@pytest.fixture(scope="module")
def policy(tiny_model):
    """The tiny model under a LoRA adapter whose B is not zero: the rollout copy holds merged weights."""
    import copy

    from rlpr.train.setup import build_policy

    torch.manual_seed(3)
    wrapped = build_policy(load_config("demo"), copy.deepcopy(tiny_model))
    for name, p in wrapped.named_parameters():
        if "lora_B" in name:
            p.data.normal_(0, 0.05)
    return wrapped


def fresh_cache(model, ids):
    with torch.no_grad():
        return output_cache(model(input_ids=torch.tensor([ids]), use_cache=True))


def assert_holds(model, cache, ids):
    """`cache` (a RowCache) holds `ids` and the keys/values a fresh forward over them computes."""
    assert cache.ids == ids and cache.length == len(ids)
    for layer, kv in zip(fresh_cache(model, ids).layers, cache.kv):
        torch.testing.assert_close(kv[0], layer.keys[0], atol=1e-5, rtol=0)
        torch.testing.assert_close(kv[1], layer.values[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("loop", ["rlpr", "graph"])
def test_the_engine_keeps_each_rows_real_positions(policy, tokenizer, loop):
    """Rows end at different steps (stop tokens: every token holding an "e"), leave the batch at
    compaction, and share prompts of different lengths (left padding): each kept cache holds the
    prompt and the response but its last token, as a fresh forward over those ids computes them."""
    prompts = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in chat(tokenizer)]
    engine = HFRollout(policy, tokenizer, torch.float32, batch_sequences=5, loop=loop, stop=["e"])
    plain = engine.generate(prompts, 4, max_new_tokens=12, seeds=[1, 2, 3])
    assert all(r.cache is None for r in plain)  # nothing kept outside `keeping`
    with engine.keeping():
        kept = engine.generate(prompts, 4, max_new_tokens=12, seeds=[1, 2, 3])
    assert [r.token_ids for r in kept] == [r.token_ids for r in plain]
    assert len({len(r.token_ids) for r in kept}) > 2  # rows ended at several steps
    for r in kept:
        assert_holds(engine.model, r.cache, prompts[r.prompt_index] + r.token_ids[:-1])
    assert not engine.keep_caches


def test_the_static_loop_keeps_rows_before_compaction(policy, tokenizer):
    """The static loop moves live rows into smaller buckets (here every 2 steps): the finished rows'
    caches are copied out before that overwrites them."""
    prompts = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in chat(tokenizer)] * 3
    engine = HFRollout(policy, tokenizer, torch.float32, loop="graph", stop=["e"])
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), tokenizer.pad_token_id)
    attn = torch.zeros_like(ids)
    for r, p in enumerate(prompts):
        ids[r, width - len(p):], attn[r, width - len(p):] = torch.tensor(p), 1
    sampler = PerRowSampler([row_seed(5, r) for r in range(len(prompts))], 1.0, 1.0)
    keep = KeptCaches([len(p) for p in prompts], width, (tokenizer.eos_token_id, *engine.ends), None)
    new = static_sample(engine.model, ids, attn, sampler, max_new_tokens=20, eos=tokenizer.eos_token_id,
                        pad=tokenizer.pad_token_id, ends=engine.ends, check_every=2, keep=keep)
    ends = {tokenizer.eos_token_id, *engine.ends}
    for r, p in enumerate(prompts):
        tokens = new[r].tolist()
        end = next((k for k, t in enumerate(tokens) if t in ends), None)
        tokens = tokens[:end + 1] if end is not None else tokens
        assert_holds(engine.model, keep.row(r, p, tokens), p + tokens[:-1])


def test_kept_caches_stay_within_their_budget(policy, tokenizer):
    prompts = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in chat(tokenizer)]
    engine = HFRollout(policy, tokenizer, torch.float32)
    width = max(map(len, prompts))
    ids = torch.full((3, width), tokenizer.pad_token_id)
    attn = torch.zeros_like(ids)
    for r, p in enumerate(prompts):
        ids[r, width - len(p):], attn[r, width - len(p):] = torch.tensor(p), 1
    one = 2 * 2 * 2 * (len(prompts[0]) + 5) * 16 * 4  # layers x (k, v) x kv heads x positions x head dim x 4 B
    keep = KeptCaches([len(p) for p in prompts], width, (tokenizer.eos_token_id,), budget=one)
    sample(engine.model, ids, attn, lambda logits, rows: logits.argmax(-1), max_new_tokens=6,
           eos=tokenizer.eos_token_id, pad=tokenizer.pad_token_id, keep=keep)
    assert keep.used <= one and len(keep.rows) == 1


@pytest.mark.parametrize("on_copy", ["auto", "never"])
@pytest.mark.parametrize("case", ["r1", "free"])
def test_score_b_from_the_cache_equals_recomputed(policy, tokenizer, case, on_copy):
    """fp32: the rewards equal recomputed ones to 1e-6 and the reference log-probs to 1e-5, with answer
    tags (r1, format-valid: o' departs from the response after `<answer>`) and without them (the
    fallback's answer turn after the whole response); the longest response is cut before EOS. The
    caches continue on the rollout copy (its merged LoRA weights; reward.score_b_on_copy=auto, an
    fp32 copy) or on the policy with its adapter (never)."""
    out = score_b_both_ways(policy, tokenizer, case, on_copy)
    for a, b in zip(out["fresh"], out["cached"]):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=0)
    for a, b in zip(out["recomputed"], out["with_cache"]):
        assert abs(a.reward - b.reward) <= 1e-6 and abs(a.score_b - b.score_b) <= 1e-6


def test_which_caches_score_b_uses():
    f32, bf16 = torch.float32, torch.bfloat16
    assert uses_cache("auto", True, "current", f32, f32)
    assert not uses_cache("auto", True, "current", bf16, f32)  # a bf16 rollout copy is not exact
    assert uses_cache("always", True, "current", bf16, f32)
    assert not uses_cache("never", True, "current", f32, f32)
    assert not uses_cache("auto", True, "initial", f32, f32)  # other weights scored B
    assert not uses_cache("always", False, "current", f32, f32)  # the kind scores no reference
    with pytest.raises(ValueError, match="score_b_from_cache"):
        uses_cache("yes", True, "current", f32, f32)


def test_the_trainer_scores_from_the_caches_and_frees_them(tiny_dir, tmp_path):
    """One rollout round of the tiny demo in fp32: the engine keeps the caches, score B continues
    them, the rewards equal those recomputed (reward.score_b_from_cache=never) and the rollouts hold
    no cache once scored."""
    from helpers import tiny_cfg

    from rlpr.train.trainer import Trainer

    rewards = {}
    for mode in ("auto", "never"):
        cfg = tiny_cfg(tiny_dir, tmp_path, mode, "model.rollout_dtype=float32", f"reward.score_b_from_cache={mode}")
        trainer = Trainer(cfg, tmp_path / mode)
        assert trainer.keep_caches == (mode == "auto")
        seen = []
        score_b = trainer.reward.score_b

        def spy(model, items, groups, too_long=None, caches=None):
            seen.append(caches is not None and all(c is not None for c in caches))
            return score_b(model, items, groups, too_long, caches)

        trainer.reward.score_b = spy
        groups = trainer.rollout_groups(list(range(4)), seed=1)
        assert seen == [mode == "auto"]
        assert all(r.cache is None for g in groups for r in g.rollouts)
        rewards[mode] = [o for g in groups for o in g.rewards]
    for a, b in zip(rewards["auto"], rewards["never"]):
        assert abs(a.reward - b.reward) <= 1e-6 and abs(a.score_b - b.score_b) <= 1e-6


def test_which_model_continues_a_kept_cache():
    """reward.score_b_on_copy: the rollout copy that kept a cache continues it where it has the
    scorer's dtype (auto), in any dtype (always), or never; a cache without a copy goes to the scorer."""
    from rlpr.reward.scoring import continuing_model
    from rlpr.rollout.kept_cache import RowCache

    scorer, copy32, copy16 = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2), torch.nn.Linear(2, 2).bfloat16()
    kv = torch.zeros(1, 2, 1, 1, 1)
    of32, of16, bare = RowCache(kv, [1], copy32), RowCache(kv, [1], copy16), RowCache(kv, [1])
    assert continuing_model(scorer, of32, "auto") is copy32
    assert continuing_model(scorer, of16, "auto") is scorer  # bf16 keys/values, fp32 scorer
    assert continuing_model(scorer, of16, "always") is copy16
    assert continuing_model(scorer, of32, "never") is scorer
    assert continuing_model(scorer, bare, "always") is scorer
