"""The HF rollout engine: per-prompt reproducible sampling, greedy decoding, top-p, weight sync."""

import pytest
import torch

from rlpr.rollout.hf import HFRollout, PerRowSampler, inverse_cdf, merged_weights

pytestmark = pytest.mark.unit


def prompts(tokenizer, questions):
    return [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                          tokenize=True, return_dict=False) for q in questions]


@pytest.fixture(scope="module")
def engine(tiny_model, tokenizer):
    return HFRollout(tiny_model, tokenizer, torch.float32, batch_sequences=5)


def test_sampling_does_not_depend_on_batch_companions(engine, tokenizer):
    ps = prompts(tokenizer, ["Capital of France?", "A much longer question about rivers and mountains?"])
    both = engine.generate(ps, 3, max_new_tokens=10, seeds=[11, 22])
    alone = engine.generate(ps[1:], 3, max_new_tokens=10, seeds=[22])
    assert [r.token_ids for r in both[3:]] == [r.token_ids for r in alone]
    assert [r.prompt_index for r in both] == [0, 0, 0, 1, 1, 1]
    again = engine.generate(ps, 3, max_new_tokens=10, seeds=[11, 22])
    assert [r.token_ids for r in again] == [r.token_ids for r in both]
    other = engine.generate(ps, 3, max_new_tokens=10, seeds=[12, 22])
    assert [r.token_ids for r in other[:3]] != [r.token_ids for r in both[:3]]
    assert len({tuple(r.token_ids) for r in both[:3]}) > 1  # the samples of a group differ


def test_shared_prefill_equals_plain_prefill(tiny_model, tokenizer):
    """Each prompt's prefill runs once and its KV cache is repeated for its rows: in fp32 the
    first-token logits are equal (to 1e-6; bit for bit on some CPUs) and every sampled response is the same as with a plain
    prefill of all rows, across chunk boundaries that split a group (batch 5, groups of 3)."""
    from rlpr.model.forward import position_ids_from_mask

    ps = prompts(tokenizer, ["Capital of France?", "A much longer question about rivers and mountains?",
                             "Why is the sky blue?"])
    shared = HFRollout(tiny_model, tokenizer, torch.float32, batch_sequences=5)
    plain = HFRollout(tiny_model, tokenizer, torch.float32, batch_sequences=5, share_prefill=False)
    a = shared.generate(ps, 3, max_new_tokens=12, seeds=[1, 2, 3])
    b = plain.generate(ps, 3, max_new_tokens=12, seeds=[1, 2, 3])
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
    assert [r.prompt_index for r in a] == [0, 0, 0, 1, 1, 1, 2, 2, 2]

    width, rows = max(map(len, ps)), [0, 0, 1, 1, 1, 2]
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    attn = torch.zeros_like(ids)
    for r, i in enumerate(rows):
        ids[r, width - len(ps[i]):], attn[r, width - len(ps[i]):] = torch.tensor(ps[i]), 1
    m = shared.model
    with torch.no_grad():
        full = m(input_ids=ids, attention_mask=attn, position_ids=position_ids_from_mask(attn)).logits[:, -1]
        cache = shared._shared_prefill(ids, attn, rows)
        assert cache.get_seq_length() == width - 1
        last = m(input_ids=ids[:, -1:], attention_mask=attn, position_ids=position_ids_from_mask(attn)[:, -1:],
                 past_key_values=cache).logits[:, -1]
    # bit-identical on the Sapphire Rapids CPU this was written on; on an AVX2-only AMD EPYC the
    # one-token query takes another matmul kernel than the full forward: differences up to 2.4e-7
    # (the sampled tokens above are still identical)
    torch.testing.assert_close(last, full, rtol=0, atol=1e-6)
    assert shared._shared_prefill(ids[[0, 2]], attn[[0, 2]], [0, 1]) is None  # nothing repeats: plain path


def prompt_tokens_run(model):
    """A forward pre-hook counting the query tokens of every forward with more than one (a prefill)."""
    seen = []

    def hook(module, args, kwargs):
        ids = kwargs.get("input_ids")
        if ids is not None and ids.shape[1] > 1:
            seen.append(ids.numel())

    return seen, model.register_forward_pre_hook(hook, with_kwargs=True)


@pytest.mark.parametrize("budget", [None, 0])
def test_a_prompt_prefilled_once_serves_the_later_passes(tiny_model, tokenizer, budget):
    """reusing_prompts (the held-out evaluation: greedy, then k samples): the sampled pass starts from
    the greedy pass's prompt prefills, no prompt forward of its own, and draws what it draws
    without them (fp32), across chunks of other widths (batch 5: greedy 4 rows, then 3 chunks);
    with a budget of 0 bytes nothing is kept and both passes prefill."""
    ps = prompts(tokenizer, ["Capital of France?", "A much longer question about rivers and mountains?",
                             "Why is the sky blue?", "2 + 2?"])
    engine = HFRollout(tiny_model, tokenizer, torch.float32, batch_sequences=5)
    greedy = engine.generate(ps, 1, max_new_tokens=8, temperature=0.0)
    sampled = engine.generate(ps, 3, max_new_tokens=8, seeds=[1, 2, 3, 4])
    seen, hook = prompt_tokens_run(engine.model)
    try:
        with engine.reusing_prompts(budget):
            assert [r.token_ids for r in engine.generate(ps, 1, max_new_tokens=8, temperature=0.0)] == \
                [r.token_ids for r in greedy]
            first = len(seen)
            assert [r.token_ids for r in engine.generate(ps, 3, max_new_tokens=8, seeds=[1, 2, 3, 4])] == \
                [r.token_ids for r in sampled]
        assert first == 1 and sum(seen) == 4 * (max(map(len, ps)) - 1) if budget is None else len(seen) > first
        assert engine._prompts is None  # freed with the block
        seen.clear()
        engine.generate(ps, 3, max_new_tokens=2, seeds=[1, 2, 3, 4])
        assert seen  # outside the block every call prefills
    finally:
        hook.remove()


def test_greedy_matches_hf_greedy(engine, tiny_model, tokenizer):
    ps = prompts(tokenizer, ["Hello?"])
    ours = engine.generate(ps, 1, max_new_tokens=8, temperature=0.0)[0]
    ids = torch.tensor(ps)
    ref = tiny_model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                              max_new_tokens=8, pad_token_id=tokenizer.pad_token_id)[0, ids.shape[1]:].tolist()
    assert ours.token_ids == ref[:len(ours.token_ids)]


def test_sampler_follows_the_distribution():
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1]])).repeat(4000, 1)
    chosen = PerRowSampler(list(range(4000)))(None, logits).argmax(-1)
    freq = torch.bincount(chosen, minlength=3).float() / 4000
    assert torch.allclose(freq, torch.tensor([0.7, 0.2, 0.1]), atol=0.03)
    nucleus = PerRowSampler(list(range(500)), top_p=0.6)(None, logits[:500]).argmax(-1)
    assert (nucleus == 0).all()  # top-p 0.6 keeps only the 0.7 token
    hot = PerRowSampler(list(range(4000)), temperature=0.5)(None, logits).argmax(-1)
    p = torch.tensor([0.7, 0.2, 0.1]) ** 2
    assert torch.allclose(torch.bincount(hot, minlength=3).float() / 4000, p / p.sum(), atol=0.03)


def test_blocked_inverse_cdf_equals_full_cumsum():
    """The two-level search picks the token a full-vocabulary float64 cumsum picks."""
    gen = torch.Generator().manual_seed(0)
    for vocab, block in [(49152, 1024), (1000, 64), (5, 1024), (1030, 16)]:
        probs = torch.softmax(torch.randn(64, vocab, generator=gen) * 3, -1)
        probs[:, ::7] = 0.0  # flat stretches of the cdf, where a search could land differently
        u = torch.rand(64, generator=gen, dtype=torch.float64)
        u[:3] = torch.tensor([0.0, 1.0 - 1e-12, 0.5])
        cdf = probs.double().cumsum(-1)
        plain = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None]).clamp(max=vocab - 1)[:, 0]
        assert torch.equal(inverse_cdf(probs, u, block), plain), (vocab, block)


def test_sync_copies_merged_lora_weights(tokenizer):
    from peft import LoraConfig, get_peft_model

    from rlpr.model.loading import tiny_llama

    policy = get_peft_model(tiny_llama(tokenizer, seed=5), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    engine = HFRollout(policy, tokenizer, torch.float32)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    engine.sync(policy)
    ids = torch.tensor(prompts(tokenizer, ["Hi"]))
    with torch.no_grad():
        want = policy(input_ids=ids).logits
        got = engine.model(input_ids=ids).logits
    assert torch.allclose(want, got, atol=1e-5)
    assert set(merged_weights(policy)) == set(engine.model.state_dict())


def test_bf16_output_layer_gets_contiguous_rows_with_identical_logits(tiny_model, tokenizer):
    """The rollout copy's output layer copies generate's strided last-position view before the
    bf16 projection (avoids a [B, H, vocab] weight copy on CPU): logits and samples unchanged."""
    engine = HFRollout(tiny_model, tokenizer, torch.bfloat16, batch_sequences=8)
    head = engine.model.get_output_embeddings()
    hidden = torch.randn(8, 13, head.in_features).to(torch.bfloat16)
    with torch.no_grad():
        hooked = head(hidden[:, -1:, :])
        plain = torch.nn.functional.linear(hidden[:, -1:, :], head.weight)
        assert torch.equal(hooked, plain)
        assert torch.equal(head(hidden), torch.nn.functional.linear(hidden, head.weight))  # no-op when contiguous
    ps = prompts(tokenizer, ["Capital of France?", "A much longer question about rivers and mountains?"])
    ours = engine.generate(ps, 4, max_new_tokens=12, seeds=[3, 4])
    greedy = engine.generate(ps, 1, max_new_tokens=12, temperature=0.0)
    head._forward_pre_hooks.clear()
    assert [r.token_ids for r in engine.generate(ps, 4, max_new_tokens=12, seeds=[3, 4])] == \
        [r.token_ids for r in ours]
    assert [r.token_ids for r in engine.generate(ps, 1, max_new_tokens=12, temperature=0.0)] == \
        [r.token_ids for r in greedy]


@pytest.fixture(scope="module")
def eos_prone_model(tiny_model, tokenizer):
    """The tiny model with its EOS logit raised to about 8 over a near-uniform vocabulary, so that
    sampled rows finish at different steps (1 to 20 tokens at these seeds)."""
    import copy

    model = copy.deepcopy(tiny_model)
    with torch.no_grad():
        ps = prompts(tokenizer, ["A much longer question about rivers and mountains?"])
        h = model.model(input_ids=torch.tensor(ps)).last_hidden_state[0].mean(0)
        model.get_output_embeddings().weight[tokenizer.eos_token_id] = 8 * h / h.norm() ** 2
    return model


@pytest.mark.parametrize("share_prefill", [True, False])
@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9), (0.0, 1.0)])
def test_own_decode_loop_equals_generate(eos_prone_model, tokenizer, share_prefill, temperature, top_p):
    """rlpr's loop (preallocated cache, finished rows dropped from the batch) samples exactly what
    `generate` samples (fp32), with rows finishing at different steps and a group split across
    generate calls (batch 5, groups of 4)."""
    ps = prompts(tokenizer, ["Capital of France?", "A much longer question about rivers and mountains?",
                             "Why is the sky blue?"])
    runs = [HFRollout(eos_prone_model, tokenizer, torch.float32, batch_sequences=5, share_prefill=share_prefill,
                      loop=loop).generate(ps, 4, max_new_tokens=20, temperature=temperature, top_p=top_p,
                                          seeds=[1, 2, 3]) for loop in ("rlpr", "generate")]
    ours, theirs = ([(r.prompt_index, r.token_ids, r.finished) for r in run] for run in runs)
    assert ours == theirs
    if temperature == 1.0:
        lengths = {len(r.token_ids) for r in runs[0]}
        assert min(lengths) < 5 and 20 in lengths and len(lengths) >= 3  # compaction happened mid-way


def test_preallocated_cache_layer_equals_concatenation():
    """Writes in place, grows past its capacity, selects rows: the same tensors as `DynamicLayer`."""
    from transformers.cache_utils import DynamicLayer

    from rlpr.rollout.decode import PreallocatedLayer

    ours, plain = PreallocatedLayer(capacity=4), DynamicLayer()
    g = torch.Generator().manual_seed(0)
    for t in (3, 1, 2, 1):  # 7 positions: past the capacity of 4
        k, v = torch.randn(3, 2, t, 5, generator=g), torch.randn(3, 2, t, 5, generator=g)
        for a, b in zip(ours.update(k, v), plain.update(k, v)):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    ours.batch_select_indices(torch.tensor([2, 0]))
    plain.batch_select_indices(torch.tensor([2, 0]))
    k, v = torch.randn(2, 2, 1, 5, generator=g), torch.randn(2, 2, 1, 5, generator=g)
    for a, b in zip(ours.update(k, v), plain.update(k, v)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert ours.get_seq_length() == plain.get_seq_length() == 8


def test_vllm_engine_without_vllm_is_a_one_line_error(tiny_model, tokenizer):
    """rollout.engine=vllm where vLLM is not importable: a ConfigError saying what to install."""
    import importlib.util

    from rlpr.config import RolloutConfig
    from rlpr.errors import ConfigError
    from rlpr.rollout.engines import build_engine

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here (tests/test_vllm_engine.py runs it)")
    with pytest.raises(ConfigError, match="pip install vllm") as info:
        build_engine(tiny_model, tokenizer, RolloutConfig(engine="vllm"), torch.float32)
    assert "\n" not in str(info.value)


def test_vllm_ranks_split_the_cores():
    """Under torchrun each rank's vLLM engine binds its own slice of the cores (spinning OpenMP
    threads of two engines on one core slow both tenfold); fewer cores than ranks: all of them."""
    from rlpr.rollout.vllm import rank_cores

    assert rank_cores([0, 1], 0, 1) == [0, 1]
    assert [rank_cores([0, 1], r, 2) for r in (0, 1)] == [[0], [1]]
    assert [rank_cores(list(range(8)), r, 2) for r in (0, 1)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [rank_cores([4, 5, 6], r, 2) for r in (0, 1)] == [[4], [5]]
    assert rank_cores([3], 1, 2) == [3]


def test_vllm_lora_needs_the_vllm_engine_and_a_lora_policy():
    from rlpr.config import load_config
    from rlpr.errors import ConfigError

    assert load_config("demo", ["rollout.engine=vllm", "rollout.vllm_lora=true"]).rollout.vllm_lora is True
    for extra in (["rollout.engine=hf"], ["rollout.engine=vllm", "model.lora=false"]):
        with pytest.raises(ConfigError, match="rollout.vllm_lora serves the LoRA adapter through vLLM"):
            load_config("demo", ["rollout.vllm_lora=true", *extra])


def test_rollouts_on_cuda_leave_cudnn_attention_out_and_cpu_rollouts_change_nothing(engine, tokenizer):
    """cuDNN's SDPA kernel plans every new sequence length (a decode loop's every token): 10-13x slower
    first rollouts on an H100 (benchmarks/results/gpu_check.md). The CUDA branch only sets torch's
    backend flags, so it is checked here without a GPU; tests/test_cuda.py checks it inside a rollout."""
    from rlpr.rollout.hf import decode_attention

    flags = torch.backends.cuda
    assert flags.cudnn_sdp_enabled()
    with decode_attention(torch.device("cuda", 0)):
        assert not flags.cudnn_sdp_enabled()
        assert flags.flash_sdp_enabled() and flags.mem_efficient_sdp_enabled() and flags.math_sdp_enabled()
    assert flags.cudnn_sdp_enabled()  # restored
    seen = []
    hook = engine.model.register_forward_pre_hook(lambda *_: seen.append(flags.cudnn_sdp_enabled()))
    try:
        engine.generate([tokenizer("Hi")["input_ids"]], 1, max_new_tokens=3, temperature=1.0, top_p=1.0)
    finally:
        hook.remove()
    assert seen and all(seen)  # on the CPU: torch's choice of kernels untouched
