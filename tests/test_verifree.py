"""The verifier-free family (issue 19): log-probability aggregations, VeriFree's boundary-safe
splicing (reward.splice), reasoning-only policy loss (algorithm.pg_tokens) and reference-SFT term
(algorithm.ref_sft_coef), each against a hand computation on the tiny model."""

import math

import pytest
import torch

from rlpr.config import RewardConfig
from rlpr.reward.probability_reward import ProbabilityReward
from rlpr.reward.scoring import AGGREGATIONS, aggregate
from rlpr.reward.sequence import DEFAULT_ANSWER_CUE, build_score_b_text, tokenize_scored

pytestmark = pytest.mark.unit


def chat(tokenizer, q):
    return tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                         add_generation_prompt=True)


def log_softmax_rows(model, ids, temperature=1.0):
    """[T, V] fp64 log-softmax of the logits predicting ids[1:], one plain forward."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].double() / temperature
    return torch.log_softmax(logits, -1)


def hand_reference_logp(model, ids, mask, temperature=1.0):
    """log p of each masked token given all before it, from a plain forward (no rlpr code)."""
    rows = log_softmax_rows(model, ids, temperature)
    return torch.tensor([rows[t - 1, ids[t]].item() for t in range(1, len(ids)) if mask[t]], dtype=torch.float64)


# -- log-probability aggregations ----------------------------------------------------------------

def test_every_aggregation_by_hand():
    logp = torch.log(torch.tensor([0.5, 0.25]))
    want = {"mean_prob": 0.375, "mean_logprob": (math.log(0.5) + math.log(0.25)) / 2,
            "sum_logprob": math.log(0.125), "seq_likelihood": 0.125, "geo_mean_prob": math.sqrt(0.125)}
    assert set(AGGREGATIONS) == set(want)
    for name, value in want.items():
        assert aggregate(logp, name) == pytest.approx(value, rel=1e-6), name


def test_sum_logprob_reward_on_tiny_model(tiny_model, tokenizer):
    q = chat(tokenizer, "Capital of France?")
    response = "<think> it is Paris </think>\n<answer> Paris </answer>"
    pr = ProbabilityReward(RewardConfig(aggregation="sum_logprob", debias=False, alpha=0.0, shaping="identity"),
                           tokenizer)
    out = pr(tiny_model, [q], [response], ["Paris"])[0]
    enc = tokenize_scored(tokenizer, [build_score_b_text(q, response, "Paris", tokenizer.eos_token)])
    want = hand_reference_logp(tiny_model, enc.input_ids[0], enc.ref_mask[0]).sum().item()
    assert out.score_b == pytest.approx(want, abs=1e-4) and out.reward == pytest.approx(want, abs=1e-4)


# -- reward.splice: text | ids -------------------------------------------------------------------

def scored(tokenizer, item, splice):
    enc = tokenize_scored(tokenizer, [item], splice)
    ids, mask = enc.input_ids[0], enc.ref_mask[0]
    return ids, mask, tokenizer.decode([t for t, m in zip(ids, mask) if m])


def test_splice_ids_equals_text_where_nothing_merges(tokenizer):
    q = chat(tokenizer, "Capital of France?")
    item = build_score_b_text(q, "<think> it is Paris </think>\n<answer> Paris </answer>", "Paris",
                              tokenizer.eos_token)
    assert item.text[item.block_start:].startswith("<answer>")
    text_ids, text_mask, text_ref = scored(tokenizer, item, "text")
    ids, mask, ref = scored(tokenizer, item, "ids")
    assert (ids, mask) == (text_ids, text_mask) and ref == text_ref == " Paris"


def test_splice_ids_keeps_the_block_apart_where_the_boundary_merges(tokenizer):
    """"</think><answer>": SmolLM2 merges '><' across the boundary when o' is tokenized whole."""
    q = chat(tokenizer, "Capital of France?")
    item = build_score_b_text(q, "<think> it is Paris </think><answer> Paris </answer>", "Paris",
                              tokenizer.eos_token)
    text_ids, text_mask, text_ref = scored(tokenizer, item, "text")
    ids, mask, ref = scored(tokenizer, item, "ids")
    head = tokenizer(item.text[:item.block_start], add_special_tokens=False)["input_ids"]
    block = tokenizer(item.text[item.block_start:], add_special_tokens=False)["input_ids"]
    assert ids == head + block and ids != text_ids  # the '><' token is gone: '>' ends z, '<' opens the block
    assert tokenizer.convert_ids_to_tokens(block[:3]) == ["<", "answer", ">"]
    assert ref == text_ref == " Paris"  # the reference tokens themselves do not move here
    assert mask[len(head):] == [t in tokenizer(" Paris", add_special_tokens=False)["input_ids"] for t in block]


def test_splice_ids_gives_the_right_mask_where_text_shifts_it(tokenizer):
    """The fallback with an empty cue puts y* = "-3" right after "The answer:"; tokenized whole,
    ':-' is one token, so the text mask's first scored token starts inside the reasoning (it
    scores ':-' given 'The answer' instead of '-' given 'The answer:'). ids splits at the cue."""
    q = chat(tokenizer, "What is 2 - 5?")
    item = build_score_b_text(q, "The answer:", "-3", tokenizer.eos_token, mode="r1", fallback="free", cue="")
    _, _, text_ref = scored(tokenizer, item, "text")
    ids, mask, ref = scored(tokenizer, item, "ids")
    assert text_ref == ":-3" and ref == "-3"
    head = tokenizer(item.text[:item.block_start], add_special_tokens=False)["input_ids"]
    assert ids[:len(head)] == head and not any(mask[:len(head)])


def test_splice_ids_score_b_is_the_hand_computed_probability(tiny_model, tokenizer):
    q = chat(tokenizer, "What is 2 - 5?")
    cfg = dict(invalid_fallback="free", answer_cue="", debias=False, alpha=0.0, shaping="identity")
    out = ProbabilityReward(RewardConfig(splice="ids", **cfg), tokenizer)(tiny_model, [q], ["The answer:"], ["-3"])[0]
    head = tokenizer(q + "The answer:", add_special_tokens=False)["input_ids"]
    block = tokenizer("-3 </answer>" + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
    n_ref = len(tokenizer("-3", add_special_tokens=False)["input_ids"])
    mask = [False] * len(head) + [True] * n_ref + [False] * (len(block) - n_ref)
    want = hand_reference_logp(tiny_model, head + block, mask).exp().mean().item()
    assert out.score_b == pytest.approx(want, rel=1e-4)
    text = ProbabilityReward(RewardConfig(**cfg), tokenizer)(tiny_model, [q], ["The answer:"], ["-3"])[0]
    assert text.score_b != pytest.approx(want, rel=1e-2)  # text mode scores ':-' instead


# -- RLOO (VeriFree's advantage) -----------------------------------------------------------------

def test_rloo_is_leave_one_out_without_std_division():
    from rlpr.algorithms.advantages import compute_advantages

    r = [0.2, 0.5, 0.1, 0.0]
    want = [r[i] - sum(r[j] for j in range(4) if j != i) / 3 for i in range(4)]  # 0.1, 0.5, -0.0333, -0.1667
    got = compute_advantages(torch.tensor([r]), "rloo")[0].tolist()
    assert got == pytest.approx(want, abs=1e-6)
    # scaling the rewards scales the advantages (no std division)
    assert compute_advantages(torch.tensor([r]) * 10, "rloo")[0].tolist() == pytest.approx([10 * w for w in want],
                                                                                            abs=1e-5)


# -- algorithm.pg_tokens=reasoning ---------------------------------------------------------------

@pytest.mark.parametrize("response,reasoning", [
    ("<think> it is Paris </think>\n<answer> Paris </answer>", "<think> it is Paris </think>\n"),
    # '><' spans the boundary: it ends after the start of <answer>, so it is left out
    ("<think> it is Paris </think><answer> Paris </answer>", "<think> it is Paris </think"),
])
def test_reasoning_tokens_end_before_the_answer_block(tokenizer, response, reasoning):
    from rlpr.train.update import reasoning_tokens

    ids = tokenizer(response, add_special_tokens=False)["input_ids"]
    k = reasoning_tokens(tokenizer, ids, response, 0, "r1")
    assert tokenizer.decode(ids[:k]) == reasoning
    # a prefill ("<think>" in the prompt) shifts the boundary by its length
    generated = response[len("<think>"):]
    gen_ids = tokenizer(generated, add_special_tokens=False)["input_ids"]
    k2 = reasoning_tokens(tokenizer, gen_ids, "<think>" + generated, len("<think>"), "r1")
    assert tokenizer.decode(gen_ids[:k2]) == reasoning[len("<think>"):]


def test_reasoning_tokens_without_an_answer_block_are_all(tokenizer):
    from rlpr.train.update import reasoning_tokens

    ids = tokenizer("Paris, I think.", add_special_tokens=False)["input_ids"]
    assert reasoning_tokens(tokenizer, ids, "Paris, I think.", 0, "r1") is None


def flat_grads(model):
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def test_reasoning_only_loss_and_gradient_by_hand(tokenizer):
    """One update (old = current log-probs, ratio 1): loss = -sum_s A_s k_s / sum_s k_s over the k_s
    reasoning tokens; its gradient that of -sum_s A_s sum_{t < k_s} log p_t / sum_s k_s."""
    from rlpr.config import AlgorithmConfig
    from rlpr.model.loading import tiny_llama
    from rlpr.train.update import Sample, accumulate_gradients

    model = tiny_llama(tokenizer, seed=5).train()
    prompt = tokenizer("Q: capital of France?\n", add_special_tokens=False)["input_ids"]
    responses = ["<think> it is Paris </think>\n<answer> Paris </answer>", "<think> no </think>\n<answer> Rome"]
    advantages, ks = [0.7, -0.4], [3, 2]
    samples = [Sample(prompt + tokenizer(r, add_special_tokens=False)["input_ids"], len(prompt), a, loss_tokens=k)
               for r, a, k in zip(responses, advantages, ks)]
    cfg = AlgorithmConfig(entropy_coef=0.0)
    for micro in (2, 1):
        model.zero_grad(set_to_none=True)
        stats = accumulate_gradients(model, samples, cfg, micro, tokenizer.pad_token_id, 1.0, share_prefix=micro == 1)
        assert stats["tokens"] == sum(ks)
        assert stats["pg_loss"] / stats["tokens"] == pytest.approx(-sum(a * k for a, k in zip(advantages, ks)) / sum(ks))
        got = flat_grads(model)
        model.zero_grad(set_to_none=True)
        hand = 0.0
        for s, a, k in zip(samples, advantages, ks):
            logits = model(torch.tensor([s.input_ids])).logits[0, :-1].float()
            logp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(s.input_ids[1:])[:, None])[:, 0]
            hand = hand - a * logp[s.prompt_len - 1:s.prompt_len - 1 + k].sum()
        (hand / sum(ks)).backward()
        assert torch.allclose(got, flat_grads(model), atol=1e-6, rtol=1e-4)


# -- algorithm.ref_sft_coef ----------------------------------------------------------------------

def sft_samples(tokenizer, weights):
    from rlpr.train.update import Sample

    reward = ProbabilityReward(RewardConfig(splice="ids"), tokenizer)
    q = chat(tokenizer, "Capital of France?")
    out = []
    for i, w in enumerate(weights):
        response = f"<think> step {i} </think>\n<answer> Lyon </answer>"
        o = reward.scored_sequence(q, response, "Paris")
        ids = tokenizer(q, add_special_tokens=False)["input_ids"]
        # advantage 0: the policy-gradient term adds nothing, the gradient is the SFT term's
        out.append(Sample(ids + tokenizer(response, add_special_tokens=False)["input_ids"], len(ids), 0.0,
                          sft=o, sft_weight=w))
    return out


def test_ref_sft_term_value_by_hand(tokenizer):
    from rlpr.config import AlgorithmConfig
    from rlpr.model.loading import tiny_llama
    from rlpr.train.update import accumulate_gradients

    model = tiny_llama(tokenizer, seed=6).train()
    weights, coef = [0.9, 0.3, 0.0], 0.5
    samples = sft_samples(tokenizer, weights)
    ids, mask = samples[0].sft
    assert tokenizer.decode([t for t, m in zip(ids, mask) if m]) == " Paris"
    means = [hand_reference_logp(model, *s.sft).mean().item() for s in samples]
    want = -coef * sum(w * m for w, m in zip(weights, means)) / len(samples)
    cfg = AlgorithmConfig(entropy_coef=0.0, ref_sft_coef=coef, ref_sft_weight="reward")
    stats = accumulate_gradients(model, samples, cfg, 2, tokenizer.pad_token_id, 1.0)
    assert stats["sft_seqs"] == 3 and stats["sft_logp"] == pytest.approx(sum(means), rel=1e-4)
    from rlpr.algorithms.losses import Normaliser, ref_sft_loss
    logp = torch.cat([hand_reference_logp(model, *s.sft) for s in samples]).float()
    seq = torch.repeat_interleave(torch.arange(3), torch.tensor([int(sum(s.sft[1])) for s in samples]))
    loss, _ = ref_sft_loss(logp, seq, 3, torch.tensor(weights), coef, Normaliser(tokens=1, sequences=3))
    assert loss.item() == pytest.approx(want, rel=1e-6)


@pytest.mark.parametrize("weight,direction", [(1.0, 1), (-1.0, -1)])
def test_ref_sft_gradient_moves_the_reference_probability(tokenizer, weight, direction):
    """A step against the gradient raises log p(y* | Q, z) for a positive weight (reward, a positive
    advantage) and lowers it for a negative one (a negative advantage)."""
    from rlpr.config import AlgorithmConfig
    from rlpr.model.loading import tiny_llama
    from rlpr.train.update import accumulate_gradients

    model = tiny_llama(tokenizer, seed=7).train()
    samples = sft_samples(tokenizer, [weight, weight])
    before = sum(hand_reference_logp(model, *s.sft).mean().item() for s in samples)
    cfg = AlgorithmConfig(entropy_coef=0.0, ref_sft_coef=1.0)
    model.zero_grad(set_to_none=True)
    accumulate_gradients(model, samples, cfg, 2, tokenizer.pad_token_id, 1.0)
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p.add_(-1e-2 * p.grad)
    after = sum(hand_reference_logp(model, *s.sft).mean().item() for s in samples)
    assert (after - before) * direction > 0


def test_sft_weights_registry():
    from rlpr.algorithms.losses import SFT_WEIGHTS

    assert {k: f(0.25, -0.5) for k, f in SFT_WEIGHTS.items()} == {"reward": 0.25, "advantage": -0.5, "one": 1.0}


def test_log_domain_aggregation_needs_the_fallback():
    """An unscored response scores 0, above every log-probability: the config refuses that combination."""
    from rlpr.config import Config, validate
    from rlpr.errors import ConfigError

    for name in ("mean_logprob", "sum_logprob"):
        cfg = Config()
        cfg.reward.aggregation = name
        with pytest.raises(ConfigError, match=f"reward.aggregation={name} needs reward.invalid_fallback=free"):
            validate(cfg, sections=("reward",))
        cfg.reward.invalid_fallback = "free"
        validate(cfg, sections=("reward",))


# -- VeriFree fidelity: the scored block, the summed SFT term --------------------------------------

@pytest.mark.parametrize("mode,response,block", [
    ("r1_nothink", "Let me think. <answer> Lyon </answer>", "<answer> Paris </answer>"),
    ("r1", "<think> hmm </think>\n<answer>Lyon</answer>", "<answer> Paris </answer>"),
    ("boxed", "So it is \\boxed{Lyon}.", "\\boxed{Paris}"),
])
def test_score_span_block_scores_the_whole_answer_block(tokenizer, mode, response, block):
    q = chat(tokenizer, "Capital of France?")
    item = build_score_b_text(q, response, "Paris", tokenizer.eos_token, mode=mode, span="block")
    assert item.text[item.ref_start:item.ref_end] == block
    _, mask, scored_text = scored(tokenizer, item, "ids")
    assert scored_text == block and not mask[-1]  # EOS is not scored
    reference = build_score_b_text(q, response, "Paris", tokenizer.eos_token, mode=mode)
    assert scored(tokenizer, reference, "ids")[2].strip() == "Paris"  # span=reference: y* only


def test_score_span_block_on_the_fallback_scores_cue_reference_and_tag(tokenizer):
    q = chat(tokenizer, "Capital of France?")
    item = build_score_b_text(q, "It is Paris.", "Paris", tokenizer.eos_token, fallback="free", span="block")
    assert item.text[item.ref_start:item.ref_end] == DEFAULT_ANSWER_CUE + "Paris </answer>"


def verifree_reward(tokenizer):
    return ProbabilityReward(RewardConfig(format_mode="r1_nothink", aggregation="seq_likelihood", score_span="block",
                                          debias=False, shaping="identity", alpha=0.0, repetition_penalty=False,
                                          splice="ids"), tokenizer)


def test_block_reward_is_the_answer_block_probability_by_hand(tiny_model, tokenizer):
    """VeriFree's R = p(answer block | x, z): the product of the probabilities of every token of the
    rendered block (tags included), each given x, z and the block's tokens before it."""
    q = chat(tokenizer, "Capital of France?")
    out = verifree_reward(tokenizer)(tiny_model, [q], ["Let me think. <answer> Lyon </answer>"], ["Paris"])[0]
    head = tokenizer(q + "Let me think. ", add_special_tokens=False)["input_ids"]
    block = tokenizer("<answer> Paris </answer>", add_special_tokens=False)["input_ids"]
    eos = tokenizer(tokenizer.eos_token, add_special_tokens=False)["input_ids"]
    ids = head + block + eos
    mask = [False] * len(head) + [True] * len(block) + [False] * len(eos)
    want = hand_reference_logp(tiny_model, ids, mask).sum().exp().item()
    assert len(block) > 3 and out.score_b == pytest.approx(want, rel=1e-4) and out.reward == pytest.approx(want, rel=1e-4)
    only_y = ProbabilityReward(RewardConfig(format_mode="r1_nothink", aggregation="seq_likelihood", debias=False,
                                            shaping="identity", alpha=0.0, splice="ids"), tokenizer)
    assert only_y(tiny_model, [q], ["Let me think. <answer> Lyon </answer>"], ["Paris"])[0].score_b > out.score_b


def test_score_span_block_needs_no_score_a():
    from rlpr.config import Config, validate
    from rlpr.errors import ConfigError

    cfg = Config()
    cfg.reward.score_span = "block"
    with pytest.raises(ConfigError, match="reward.score_span=block .* set reward.debias=false"):
        validate(cfg, sections=("reward",))
    cfg.reward.debias = False
    validate(cfg, sections=("reward",))


def test_ref_sft_sum_by_hand_value_and_gradient(tokenizer):
    """ref_sft_norm=sum (VeriFree's sft_loss): -coef * sum_s w_s * sum_{t in block(s)} log p_t / S, over
    the tokens of the whole answer block with score_span=block; its gradient that of the hand loss."""
    from rlpr.algorithms.losses import Normaliser, ref_sft_loss
    from rlpr.config import AlgorithmConfig
    from rlpr.model.loading import tiny_llama
    from rlpr.train.update import Sample, accumulate_gradients

    model = tiny_llama(tokenizer, seed=8).train()
    reward = verifree_reward(tokenizer)
    q = chat(tokenizer, "Capital of France?")
    weights, coef = [0.8, 0.2, -0.5], 0.7
    samples = []
    for i, w in enumerate(weights):
        response = f"Step {i}. <answer> Lyon </answer>"
        prompt = tokenizer(q, add_special_tokens=False)["input_ids"]
        samples.append(Sample(prompt + tokenizer(response, add_special_tokens=False)["input_ids"], len(prompt), 0.0,
                              sft=reward.scored_sequence(q, response, "Paris"), sft_weight=w))
    ids, mask = samples[0].sft
    assert tokenizer.decode([t for t, m in zip(ids, mask) if m]) == "<answer> Paris </answer>"
    sums = [hand_reference_logp(model, *s.sft).sum().item() for s in samples]
    want = -coef * sum(w * s for w, s in zip(weights, sums)) / len(samples)
    logp = torch.cat([hand_reference_logp(model, *s.sft) for s in samples]).float()
    seq = torch.repeat_interleave(torch.arange(3), torch.tensor([int(sum(s.sft[1])) for s in samples]))
    norm = Normaliser(tokens=1, sequences=3)
    loss, means = ref_sft_loss(logp, seq, 3, torch.tensor(weights), coef, norm, "sum")
    assert loss.item() == pytest.approx(want, rel=1e-6)
    mean_loss, _ = ref_sft_loss(logp, seq, 3, torch.tensor(weights), coef, norm, "mean")
    n = [int(sum(s.sft[1])) for s in samples]
    assert mean_loss.item() == pytest.approx(-coef * sum(w * s / k for w, s, k in zip(weights, sums, n)) / 3, rel=1e-6)

    cfg = AlgorithmConfig(entropy_coef=0.0, ref_sft_coef=coef, ref_sft_weight="reward", ref_sft_norm="sum")
    model.zero_grad(set_to_none=True)
    accumulate_gradients(model, samples, cfg, 2, tokenizer.pad_token_id, 1.0)
    got = flat_grads(model)
    model.zero_grad(set_to_none=True)
    hand = 0.0
    for s, w in zip(samples, weights):
        ids, mask = s.sft
        logits = model(torch.tensor([ids])).logits[0, :-1].float()
        lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
        hand = hand - coef * w * lp[torch.tensor(mask[1:])].sum()
    (hand / len(samples)).backward()
    assert torch.allclose(got, flat_grads(model), atol=1e-6, rtol=1e-4)
