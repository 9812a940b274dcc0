"""The model families users bring: tiny random Llama 3, Qwen2.5, Qwen3, Gemma 2, Gemma 3, Mistral and
Phi-3 models (SmolLM2's vocabulary, 2 layers, hidden 64), each saved as a HF model directory. Per family:
score B equals the log-softmax of the model's own full logits (softcapping, sliding windows shorter than
the texts, GQA, fused projections); one training step (LoRA and full fine-tuning) on the hf engine
changes the weights; the checkpoint reloads through load_policy with the trained policy's logits; on the
soft-capped and sliding-window families, OPSD's teacher rows equal the model's own logits."""

import copy

import pytest
import torch

from rlpr.model.forward import causal_lm
from rlpr.model.loading import find_checkpoint, load_model, load_policy
from rlpr.reward.scoring import reference_logprobs, score_texts
from rlpr.reward.sequence import build_score_a_text, build_score_b_text
from rlpr.train.trainer import Trainer, train

from helpers import direct_logprobs, step_samples, tiny_cfg

pytestmark = pytest.mark.integration

WINDOW = 16  # sliding-window size: every scored text and most prompts below are longer
EOS = "<|im_end|>"


def _config(cls, tokenizer, **kw):
    """A 2-layer, hidden-64 config of `cls` with SmolLM2's vocabulary and GQA (4 query heads, 2 kv)."""
    base = dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                initializer_range=0.1,  # log-probs spread over ~3 nats, not all near -log(V)
                pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                eos_token_id=tokenizer.eos_token_id)
    return cls(**{**base, **kw})


def _build(name, tokenizer):
    import transformers as tf

    gemma = dict(head_dim=16, query_pre_attn_scalar=16, sliding_window=WINDOW, tie_word_embeddings=True)
    if name == "llama3":
        rope = dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                    original_max_position_embeddings=64)
        return tf.LlamaForCausalLM(_config(tf.LlamaConfig, tokenizer, tie_word_embeddings=False, rope_parameters=rope))
    if name == "qwen2.5":  # q/k/v biases, no o_proj bias
        return tf.Qwen2ForCausalLM(_config(tf.Qwen2Config, tokenizer, tie_word_embeddings=True))
    if name == "qwen3":  # q/k RMS norms
        return tf.Qwen3ForCausalLM(_config(tf.Qwen3Config, tokenizer, head_dim=16, tie_word_embeddings=True))
    if name == "gemma2":  # layers alternate sliding / full attention; softcapped attention and output logits
        return tf.Gemma2ForCausalLM(_config(tf.Gemma2Config, tokenizer, final_logit_softcapping=2.0,
                                            attn_logit_softcapping=5.0, **gemma))
    if name == "gemma3":
        return tf.Gemma3ForCausalLM(_config(tf.Gemma3TextConfig, tokenizer, **gemma,
                                            layer_types=["sliding_attention", "full_attention"]))
    if name == "mistral":  # every layer slides
        return tf.MistralForCausalLM(_config(tf.MistralConfig, tokenizer, sliding_window=WINDOW,
                                             tie_word_embeddings=False))
    if name == "phi3":  # fused qkv_proj and gate_up_proj
        return tf.Phi3ForCausalLM(_config(tf.Phi3Config, tokenizer, tie_word_embeddings=False))
    raise KeyError(name)


FAMILIES = ["llama3", "qwen2.5", "qwen3", "gemma2", "gemma3", "mistral", "phi3"]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One torch thread: on a busy 2-core machine, 2 threads of a tiny model spin-wait (20x slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def family_dir(tmp_path_factory, tokenizer):
    """name -> the family's tiny model saved as a HF directory (built once, seed 0)."""
    dirs = {}

    def get(name):
        if name not in dirs:
            torch.manual_seed(0)
            path = tmp_path_factory.mktemp(name)
            _build(name, tokenizer).save_pretrained(path)
            tokenizer.save_pretrained(path)
            dirs[name] = str(path)
        return dirs[name]

    return get


def prompt(tokenizer, q):
    return tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)


def scored_items(tokenizer):
    """Score B texts sharing a prompt longer than the window, a score A text, and one of another prompt."""
    p = prompt(tokenizer, "What is the capital of France? Answer with the name of the city only, please.")
    return [build_score_b_text(p, "<think> short </think> <answer> x", "Paris", EOS),
            build_score_b_text(p, "<think> a longer chain of reasoning about cities, rivers and the history of "
                                  "Europe over several centuries </think>\n<answer>\nBerlin", "Paris, Texas", EOS),
            build_score_b_text(p, "<think> 4 x 2 = 8 </think> <answer>", "8", EOS),
            build_score_a_text(p, "Paris", EOS),
            build_score_b_text(prompt(tokenizer, "Another?"), "<think> unicode </think> <answer>", "Zürich 東京", EOS)]


def full_logit_logprobs(model, tokenizer, item):
    """Independently: log_softmax of the model's own full logits (HF applies the family's softcapping),
    at the positions of the tokens that overlap the reference characters."""
    enc = tokenizer(item.text, add_special_tokens=False, return_offsets_mapping=True)
    ids = torch.tensor([enc["input_ids"]])
    with torch.no_grad():
        logp = model(input_ids=ids).logits[0].double().log_softmax(-1)
    rows = [t for t, (s, e) in enumerate(enc["offset_mapping"]) if s < item.ref_end and e > item.ref_start and e > s]
    return torch.stack([logp[t - 1, ids[0, t]] for t in rows]), ids.shape[1]


def test_the_matrix_covers_tied_untied_gqa_windows_softcapping_and_fused_projections(family_dir):
    """As rlpr loads the saved directories (each through AutoModelForCausalLM)."""
    models = {name: load_model(family_dir(name))[0] for name in FAMILIES}
    assert {n: type(m).__name__ for n, m in models.items()} == {
        "llama3": "LlamaForCausalLM", "qwen2.5": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
        "gemma2": "Gemma2ForCausalLM", "gemma3": "Gemma3ForCausalLM", "mistral": "MistralForCausalLM",
        "phi3": "Phi3ForCausalLM"}
    tied = {n for n, m in models.items() if m.get_output_embeddings().weight is m.get_input_embeddings().weight}
    assert tied == {"qwen2.5", "qwen3", "gemma2", "gemma3"}  # the others untied
    assert all(m.config.num_key_value_heads < m.config.num_attention_heads for m in models.values())
    assert {n for n, m in models.items() if getattr(m.config, "sliding_window", None) == WINDOW} == {
        "gemma2", "gemma3", "mistral"}
    assert models["gemma2"].config.final_logit_softcapping == 2.0
    assert models["llama3"].config.rope_parameters["rope_type"] == "llama3"
    names = {n.rsplit(".", 1)[-1] for n, _ in models["phi3"].named_modules()}
    assert {"qkv_proj", "gate_up_proj"} <= names and not {"q_proj", "gate_proj"} & names
    assert models["qwen2.5"].model.layers[0].self_attn.q_proj.bias is not None
    assert hasattr(models["qwen3"].model.layers[0].self_attn, "q_norm")


@pytest.mark.parametrize("family", FAMILIES)
def test_score_b_equals_the_log_softmax_of_the_models_own_logits(family, family_dir, tokenizer):
    model, _ = load_model(family_dir(family))
    items = scored_items(tokenizer)
    expected = [full_logit_logprobs(model, tokenizer, item) for item in items]
    assert min(n for _, n in expected) > 2 * WINDOW
    shared = tokenizer(items[0].text[:items[0].prefix_chars], add_special_tokens=False)["input_ids"]
    assert len(shared) > WINDOW  # the prompt's cache alone outgrows the sliding window
    for share_prefix, side in ((True, "right"), (False, "right"), (False, "left")):
        got = reference_logprobs(model, tokenizer, items, share_prefix=share_prefix, padding_side=side)
        for (want, _), logp in zip(expected, got):
            assert logp.shape == want.shape
            assert torch.allclose(logp.double(), want, atol=1e-4, rtol=0), (share_prefix, side, (logp - want).abs().max())
    scores = score_texts(model, tokenizer, items)
    assert scores == pytest.approx([w.exp().mean().item() for w, _ in expected], abs=1e-5)
    assert max(w.max() - w.min() for w, _ in expected) > 0.5  # the model's log-probs vary: the check can fail


@pytest.mark.parametrize("family", ["gemma2", "gemma3", "mistral"])
def test_the_sliding_window_and_softcapping_matter_here(family, family_dir, tokenizer):
    """The checks above would catch a path that ignores the window or the softcapping: these change
    the reference log-probs far beyond their tolerance."""
    from transformers import AutoModelForCausalLM

    path = family_dir(family)
    model, _ = load_model(path)
    items = scored_items(tokenizer)
    base = [full_logit_logprobs(model, tokenizer, it)[0] for it in items]
    wide = AutoModelForCausalLM.from_pretrained(path, sliding_window=100_000).eval()
    assert max((a - full_logit_logprobs(wide, tokenizer, it)[0]).abs().max() for a, it in zip(base, items)) > 1e-2
    if family == "gemma2":
        model.config.final_logit_softcapping = None
        uncapped = [full_logit_logprobs(model, tokenizer, it)[0] for it in items]
        assert max((a - b).abs().max() for a, b in zip(base, uncapped)) > 1e-2


@pytest.mark.parametrize("family", FAMILIES)
def test_update_gradients_through_the_shared_prompt_and_packed_rows_equal_the_padded_path(family, family_dir):
    """The update's shared-prompt path (the prompt's keys/values computed once, continuations on top)
    and its responses packed into rows after the prompt (trainer.pack_responses) give the padded
    path's old log-probs and gradients, with prompts and responses longer than the window: rotary
    variants, biases, q/k norms, fused projections, every layer or every second one sliding. Gemma 2's
    soft-capped attention runs eager, which `auto` does not pack."""
    from rlpr.config import AlgorithmConfig
    from rlpr.model.packing import resolve_packing, unpackable
    from rlpr.train.update import Sample, accumulate_gradients, fill_logprobs

    model, tokenizer = load_model(family_dir(family))
    model.train()
    packable = unpackable(model) is None
    assert packable == (family != "gemma2") and resolve_packing("auto", model, torch.device("cpu"), True) == packable
    g = torch.Generator().manual_seed(0)
    samples = []
    for k in range(2):
        prompt_ids = torch.randint(3, len(tokenizer), (WINDOW + 5 + 3 * k,), generator=g).tolist()
        for i in range(3):
            response = torch.randint(3, len(tokenizer), (4 + 9 * i,), generator=g).tolist()
            samples.append(Sample(prompt_ids + response, len(prompt_ids), advantage=float(torch.randn(1, generator=g))))
    fill_logprobs(model, samples, "old_logp", 6, tokenizer.pad_token_id, 1.0, False)
    if packable:
        packed = [Sample(s.input_ids, s.prompt_len, s.advantage) for s in samples]
        fill_logprobs(model, packed, "old_logp", 6, tokenizer.pad_token_id, 1.0, True, pack=True)
        for a, b in zip(samples, packed):
            assert torch.allclose(a.old_logp, b.old_logp, atol=1e-5)
    grads = []
    layouts = ((6, False, False), (6, True, False), (1, True, False)) + (((6, True, True), (2, True, True))
                                                                        if packable else ())
    for micro, share, pack in layouts:
        model.zero_grad(set_to_none=True)
        accumulate_gradients(model, samples, AlgorithmConfig(), micro, tokenizer.pad_token_id, 1.0, share, pack=pack)
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    assert grads[0].abs().max() > 0
    for other in grads[1:]:
        assert torch.allclose(other, grads[0], atol=1e-5 * grads[0].abs().max().item(), rtol=1e-4)


@pytest.mark.parametrize("family", ["gemma2", "gemma3", "mistral"])
def test_hf_engine_greedy_rollouts_equal_greedy_decoding_of_full_forwards(family, family_dir):
    """rlpr's decode loop (a shared prefill, preallocated full-attention layers, transformers'
    sliding-window layers as they are) past the window, with left padding: the tokens of a plain
    argmax over the full logits of the whole sequence at every step."""
    from rlpr.rollout.hf import HFRollout

    model, tokenizer = load_model(family_dir(family))
    prompts = [tokenizer(prompt(tokenizer, q))["input_ids"] for q in ("Capital of France?", "Name a colour of the rainbow.")]
    assert len(set(map(len, prompts))) == 2 and min(map(len, prompts)) > WINDOW
    rollouts = HFRollout(model, tokenizer, dtype=torch.float32).generate(prompts, 2, max_new_tokens=16, temperature=0.0)
    for r in rollouts:
        ids = list(prompts[r.prompt_index])
        with torch.no_grad():
            for token in r.token_ids:
                assert token == int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
                ids.append(token)
    assert max(len(prompts[r.prompt_index]) + len(r.token_ids) for r in rollouts) > 3 * WINDOW


def test_lora_targets_follow_the_model(family_dir, tokenizer, caplog):
    """The default names on a model that fuses projections (Phi-3) become every linear layer; on
    Llama-style models they are all the linear layers already; names that match nothing are one ConfigError."""
    from rlpr.errors import ConfigError
    from rlpr.model.lora import lora_targets

    from rlpr.config import ModelConfig

    default = list(ModelConfig().lora_target_modules)  # Llama's seven projections
    phi3, llama = _build("phi3", tokenizer), _build("llama3", tokenizer)
    assert lora_targets(phi3, default) == "all-linear"
    assert lora_targets(llama, default) == default
    assert lora_targets(llama, ["all-linear"]) == "all-linear"
    assert lora_targets(phi3, ["qkv_proj"]) == ["qkv_proj"]
    with caplog.at_level("WARNING", logger="rlpr.model.lora"):
        assert lora_targets(phi3, ["qkv_proj", "q_proj"]) == ["qkv_proj", "q_proj"]
    assert "has no q_proj" in caplog.text
    with pytest.raises(ConfigError, match=r"none of q_proj, gate_proj is a module of Phi3ForCausalLM "
                                          r"\(its linear layers: down_proj, gate_up_proj, lm_head, o_proj, qkv_proj"):
        lora_targets(phi3, ["q_proj", "gate_proj"])


@pytest.mark.parametrize("family", FAMILIES)
def test_lora_adapts_every_linear_layer_and_syncs_the_merged_weights(family, family_dir, tokenizer):
    """build_policy's adapter covers every linear layer of the decoder (Phi-3's fused ones included),
    and `merged_weights` (what the rollout copy and vLLM receive) equals peft's own merge, biases of
    adapted layers (Qwen2's q/k/v) included."""
    from peft.tuners.lora import LoraLayer

    from rlpr.config import load_config
    from rlpr.model.weights import merged_weights
    from rlpr.train.setup import build_policy

    model, _ = load_model(family_dir(family))
    linear = {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and ".layers." in n}
    policy = build_policy(load_config("demo", [f"model.path={family_dir(family)}"]), model)
    adapted = {n.removeprefix("base_model.model.") for n, m in policy.named_modules() if isinstance(m, LoraLayer)}
    assert adapted == linear
    with torch.no_grad():
        for n, p in policy.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    merged = copy.deepcopy(policy).merge_and_unload().state_dict()
    ours = merged_weights(policy)
    assert ours.keys() == merged.keys()
    for k in merged:
        assert torch.allclose(ours[k], merged[k], atol=1e-6, rtol=0), k


@pytest.mark.parametrize("family", FAMILIES)
def test_the_rollout_copy_built_without_random_init_equals_a_from_config_build(family, family_dir):
    """plain_copy skips from_config's random draws (the sync overwrites them): after the same sync, its
    parameters and buffers (rotary frequencies, embedding scales) equal a normally built copy's, tied
    weights are tied alike, and the logits agree."""
    from transformers import AutoModelForCausalLM

    from rlpr.rollout.hf import plain_copy

    model, _ = load_model(family_dir(family))
    ours = plain_copy(model, torch.bfloat16)
    theirs = AutoModelForCausalLM.from_config(copy.deepcopy(model.config), dtype=torch.bfloat16).eval()
    for built in (ours, theirs):
        target = built.state_dict()
        with torch.no_grad():
            for name, value in model.state_dict().items():
                target[name].copy_(value.to(target[name].dtype))
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    for (name, a), (_, b) in zip([*ours.named_parameters(), *ours.named_buffers()],
                                 [*theirs.named_parameters(), *theirs.named_buffers()]):
        assert a.dtype == b.dtype and torch.equal(a, b), name
    tied = [m.get_input_embeddings().weight.data_ptr() == m.get_output_embeddings().weight.data_ptr()
            for m in (ours, theirs)]
    assert tied[0] == tied[1] == bool(model.config.tie_word_embeddings)
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]])
    with torch.no_grad():
        assert torch.equal(ours(input_ids=ids).logits, theirs(input_ids=ids).logits)


def test_rlpr_plan_counts_the_adapter_training_builds(family_dir):
    """`rlpr plan` resolves the LoRA targets as training does: Phi-3's fused layers are counted."""
    from rlpr.config import ModelConfig, load_config
    from rlpr.model.architecture import architecture
    from rlpr.train.setup import build_policy

    path = family_dir("phi3")
    model, _ = load_model(path)
    policy = build_policy(load_config("demo", [f"model.path={path}"]), model)
    trainable = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    assert architecture(ModelConfig(path=path, lora=True)).lora_params == trainable


@pytest.fixture
def trained(monkeypatch):
    """train(cfg) -> (summary, the Trainer that ran, with its in-memory policy)."""
    trainers = []
    run = Trainer.run

    def keep(self):
        trainers.append(self)
        return run(self)

    monkeypatch.setattr(Trainer, "run", keep)

    def go(cfg):
        summary = train(cfg)
        return summary, trainers[-1]

    return go


def probe_ids(tokenizer):
    texts = [scored_items(tokenizer)[1].text, "The quick brown fox jumps over the lazy dog " * 4]
    return [torch.tensor([tokenizer(t, add_special_tokens=False)["input_ids"]]) for t in texts]


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
@pytest.mark.parametrize("family", FAMILIES)
def test_one_step_trains_saves_and_reloads(family, lora, family_dir, tokenizer, tmp_path, trained):
    path = family_dir(family)
    cfg = tiny_cfg(path, tmp_path, "run", "trainer.max_steps=1", f"model.lora={str(lora).lower()}", "model.threads=1",
                   "data.val=", "trainer.eval_before=false", "trainer.sample_every=0", "trainer.report=false",
                   "data.demo_train_size=4", "trainer.prompts_per_step=2", "rollout.responses_per_prompt=2",
                   "rollout.max_new_tokens=6")
    summary, trainer = trained(cfg)
    assert summary["step"] == 1 and summary["last"]["policy/tokens"] > 0
    ckpt = find_checkpoint(tmp_path / "run")
    assert (ckpt / ("adapter" if lora else "model")).is_dir()
    initial, _ = load_model(path)
    reloaded, _ = load_policy(path, tmp_path / "run")
    assert not hasattr(reloaded, "peft_config")
    before, after = initial.state_dict(), reloaded.state_dict()
    assert before.keys() == after.keys()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert changed and all(after[k].isfinite().all() for k in changed)
    if lora:  # the merged adapter moved the adapted weights, e.g. Phi-3's fused qkv_proj
        assert any("qkv_proj" in k or "q_proj" in k for k in changed)
    policy = causal_lm(trainer.policy).eval()
    with torch.no_grad():
        for ids in probe_ids(tokenizer):
            assert ids.shape[1] > WINDOW
            want = policy(input_ids=ids).logits
            got = reloaded(input_ids=ids).logits
            assert torch.allclose(got, want, atol=1e-4, rtol=0), (got - want).abs().max()
            assert (initial(input_ids=ids).logits - want).abs().max() > 1e-4  # training moved the outputs


@pytest.mark.parametrize("family", ["gemma2", "gemma3", "mistral"])
def test_opsd_teacher_rows_equal_the_models_own_logits(family, family_dir, tokenizer, tmp_path):
    """OPSD's teacher (issue 41; Gemma is one of its learning rows) on the families whose logits are
    soft-capped or whose attention slides: each response token's full-vocabulary teacher row equals the
    log-softmax of HF's own logits over the teacher prompt (reference, then question; longer than the
    window) followed by the response, and the student's log-probs the same over the plain prompt."""
    from rlpr.train.trainer import Trainer

    cfg = tiny_cfg(family_dir(family), tmp_path, "opsd", "reward.kind=opsd", "opsd.loss=jsd", "opsd.top_k=0",
                   "model.threads=1", "data.val=", "trainer.sample_every=0", "model.rollout_dtype=float32",
                   "trainer.mixed_precision=none", "rollout.temperature=0.7", "trainer.prompts_per_step=2",
                   "rollout.responses_per_prompt=2", "rollout.max_new_tokens=6")
    trainer = Trainer(cfg, tmp_path / "opsd")
    samples, metrics = step_samples(trainer)
    assert samples and metrics["opsd/skipped_frac"] == 0.0
    for s in samples:
        teacher_ids = trainer.distiller.teacher_prompt_ids(s.prompt_index)
        response = s.input_ids[s.prompt_len:]
        assert len(teacher_ids) > WINDOW and response
        with trainer.policy.disable_adapter():  # opsd.teacher=initial: LoRA's adapter-off base
            teacher = direct_logprobs(trainer.policy, teacher_ids + response, len(teacher_ids), 0.7)
        student = direct_logprobs(trainer.policy, s.input_ids, s.prompt_len, 0.7)
        assert torch.allclose(s.distill.logp, teacher, atol=1e-4), (s.distill.logp - teacher).abs().max()
        picked = student.gather(-1, torch.tensor(response)[:, None]).squeeze(-1)
        assert torch.allclose(s.old_logp, picked, atol=1e-4)
