"""The static-shape decode loop (rollout.decode_loop=graph; CUDA graphs on a GPU): on the CPU the same
code runs without graphs, and its tokens equal the eager loop's, token for token (tests/test_cuda.py
checks the captured graphs on a GPU)."""

import copy

import pytest
import torch

from rlpr.rollout import graph_decode
from rlpr.rollout.graph_decode import grouped_decode_attention, static_sample
from rlpr.rollout.hf import HFRollout, PerRowSampler, resolve_loop

pytestmark = pytest.mark.unit


def prompts(tokenizer, questions):
    return [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                          tokenize=True, return_dict=False) for q in questions]


QUESTIONS = ["Capital of France?", "A much longer question about rivers and mountains?", "Why is the sky blue?"]


@pytest.fixture(scope="module")
def eos_prone(tiny_model, tokenizer):
    """The tiny model with a raised EOS logit: sampled rows end at different steps (1 to 30 tokens)."""
    model = copy.deepcopy(tiny_model)
    with torch.no_grad():
        h = model.model(input_ids=torch.tensor(prompts(tokenizer, QUESTIONS[1:2]))).last_hidden_state[0].mean(0)
        model.get_output_embeddings().weight[tokenizer.eos_token_id] = 7 * h / h.norm() ** 2
    return model


@pytest.fixture
def small_buckets(monkeypatch):
    """Attention spans of 8 positions and a look at the rows every 3 steps, so that short responses
    cross span buckets and move into smaller batch buckets."""
    monkeypatch.setattr(graph_decode, "SPAN_STEP", 8)
    monkeypatch.setattr(graph_decode, "CHECK_EVERY", 3)


def run(model, tokenizer, loop, n=4, **kw):
    engine = HFRollout(model, tokenizer, torch.float32, batch_sequences=kw.pop("batch", 12), loop=loop,
                       min_new_tokens=kw.pop("min_new", 0), stop=kw.pop("stop", ()))
    assert engine.loop == loop
    out = engine.generate(prompts(tokenizer, QUESTIONS), n, seeds=[1, 2, 3], **kw)
    run.last = engine
    return [(r.prompt_index, r.token_ids, r.finished) for r in out]


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9), (0.0, 1.0)])
def test_static_loop_equals_the_eager_loop(eos_prone, tokenizer, small_buckets, temperature, top_p):
    """Seeded and greedy tokens of the static loop equal the eager loop's, with rows ending at
    different steps (smaller batch buckets), spans growing past several buckets, a group split across
    calls (batch 5) and one call of all 12 rows."""
    kw = dict(max_new_tokens=30, temperature=temperature, top_p=top_p)
    for batch in (5, 12):
        ours = run(eos_prone, tokenizer, "graph", batch=batch, **kw)
        shapes = graph_decode.decoder_for(run.last.model).shapes
        assert ours == run(eos_prone, tokenizer, "rlpr", batch=batch, **kw)
    if temperature == 1.0:
        lengths = {len(t) for _, t, _ in ours}
        assert min(lengths) < 4 and 30 in lengths and len(lengths) >= 4  # rows ended early, some ran to the cap
        assert {rows for rows, _ in shapes} > {12} and len({span for _, span in shapes}) >= 4  # buckets were used


def test_min_new_tokens_and_stop_tokens_as_the_eager_loop(eos_prone, tokenizer, small_buckets):
    stop = [tokenizer.decode([t]) for t in tokenizer("the")["input_ids"]]
    for extra in (dict(min_new=6), dict(stop=stop)):
        kw = dict(max_new_tokens=20, temperature=1.0, top_p=1.0)
        assert run(eos_prone, tokenizer, "graph", **extra, **kw) == run(eos_prone, tokenizer, "rlpr", **extra, **kw)
    lengths = [len(t) for _, t, _ in run(eos_prone, tokenizer, "graph", min_new=6, max_new_tokens=20)]
    assert min(lengths) >= 6


def test_buffers_and_graph_state_are_reused_across_calls(tiny_model, tokenizer, small_buckets):
    """A second call with fewer rows and a shorter response reuses the first call's buffers; its tokens
    equal a fresh copy's (nothing of the first call leaks into the second)."""
    engine = HFRollout(tiny_model, tokenizer, torch.float32, batch_sequences=12, loop="graph")
    ps = prompts(tokenizer, QUESTIONS)
    engine.generate(ps, 4, max_new_tokens=25, seeds=[7, 8, 9])
    buffers = graph_decode.decoder_for(engine.model).keys[0]
    second = engine.generate(ps[:2], 2, max_new_tokens=9, seeds=[4, 5])
    assert graph_decode.decoder_for(engine.model).keys[0] is buffers
    fresh = HFRollout(tiny_model, tokenizer, torch.float32, batch_sequences=12, loop="rlpr")
    assert [r.token_ids for r in second] == [r.token_ids for r in fresh.generate(ps[:2], 2, max_new_tokens=9, seeds=[4, 5])]


def test_one_token_prompts_and_no_shared_prefill(tiny_model, tokenizer):
    """Prompts of one token (nothing to prefill) and distinct prompts (no shared prefill): the loop
    prefills what it needs itself."""
    ids = torch.tensor([[tokenizer.bos_token_id or 1], [5]])
    sampler = PerRowSampler([3, 4])
    ours = static_sample(tiny_model, ids, torch.ones_like(ids), sampler, max_new_tokens=6, eos=-1, pad=0)
    from rlpr.rollout.decode import sample

    theirs = sample(tiny_model, ids, torch.ones_like(ids), PerRowSampler([3, 4]).draw, max_new_tokens=6, eos=-1, pad=0)
    assert torch.equal(ours, theirs)


def test_uniforms_drawn_at_once_are_the_per_token_draws():
    """The static loop draws each row's uniforms for the whole response up front: the same numbers
    the eager loop takes one per token."""
    a, b = PerRowSampler([11, 2**62]), PerRowSampler([11, 2**62])
    upfront = a.uniforms(300)
    one_by_one = torch.stack([torch.cat([torch.rand(1, generator=g, dtype=torch.float64) for _ in range(300)])
                              for g in b.generators])
    assert torch.equal(upfront, one_by_one)


@pytest.mark.parametrize("heads,kv_heads,q", [(4, 2, 1), (14, 2, 1), (8, 8, 3)])
def test_grouped_attention_equals_transformers_eager_attention(heads, kv_heads, q):
    """Grouped-query attention without repeating the KV heads equals transformers' eager attention
    (which repeats them), with an additive mask."""
    from transformers.models.llama.modeling_llama import eager_attention_forward

    g = torch.Generator().manual_seed(0)
    b, length, d = 3, 10, 16
    query = torch.randn(b, heads, q, d, generator=g)
    key, value = torch.randn(b, kv_heads, length, d, generator=g), torch.randn(b, kv_heads, length, d, generator=g)
    mask = torch.zeros(b, 1, q, length)
    mask[0, ..., :4] = torch.finfo(torch.float32).min
    mask[2, ..., 7:] = torch.finfo(torch.float32).min
    module = torch.nn.Module()
    module.num_key_value_groups, module.training = heads // kv_heads, False
    ours, _ = grouped_decode_attention(module, query, key, value, mask, scaling=d ** -0.5)
    theirs, _ = eager_attention_forward(module, query, key, value, mask, scaling=d ** -0.5)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_a_step_never_waits_on_the_host(tiny_model, tokenizer, monkeypatch):
    """A CUDA graph cannot hold a host synchronisation (`.item()`, `bool(tensor)`, `.cpu()`): one decode
    step runs here on the meta device, where each of those raises."""
    model = copy.deepcopy(tiny_model).to("meta").requires_grad_(False)  # frozen, as a rollout copy
    dec = graph_decode.StaticDecoder()
    graph_decode._ensure_buffers(dec, model, 4, 16, 8, 2, 16)
    s = dec.state
    s.rows, s.span, s.length = 4, 16, 3
    cache = graph_decode.DynamicCache(config=model.config)
    cache.layers = [graph_decode.StaticLayer(k, v, s) for k, v in zip(dec.keys, dec.values)]
    stop = torch.tensor([2, 5], device="meta")
    sampler = PerRowSampler([1, 2, 3, 4], temperature=0.7, top_p=0.9)
    from rlpr.rollout.fused_step import fused_step

    fused = fused_step(model, graph_decode.DECODE_ATTENTION)  # q/k/v and gate/up fused (tests/test_fused_step.py): as capturable
    assert fused is not None
    for temperature, forward, kernel in ((0.7, None, "matmul"), (0.0, None, "matmul"), (0.7, fused, "matmul"),
                                         (0.7, fused, "sdpa")):
        spec = graph_decode.StepSpec(eos=2, pad=0, stops=(5,), min_new_tokens=2, temperature=temperature, top_p=0.9)
        model.config._attn_implementation = graph_decode.DECODE_ATTENTION
        monkeypatch.setattr(graph_decode, "KERNEL", kernel)
        graph_decode._step(model, cache, s, spec, stop, sampler.probabilities, forward)
    with pytest.raises(Exception):  # the check is not vacuous: a synchronisation fails on meta
        bool(s.done.any())


def test_auto_takes_the_graph_loop_on_a_gpu_only(tiny_model):
    """`auto` (the default) means rlpr's eager loop on a CPU and the graph loop on CUDA; a model with
    sliding-window layers (Gemma 3) takes the graph loop too (tests/test_graph_windows.py)."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    assert resolve_loop("auto", tiny_model) == "rlpr"
    assert resolve_loop("graph", tiny_model) == "graph"
    gemma = Gemma3ForCausalLM(Gemma3TextConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                               num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                               sliding_window=8))
    assert resolve_loop("graph", gemma) == "graph"
    assert resolve_loop("auto", gemma) == "rlpr"  # on a CPU
    assert resolve_loop("generate", gemma) == "generate"


def test_growing_buffers_drop_the_graphs_and_their_pool(tiny_model, tokenizer):
    """More rows, positions or steps than the buffers hold: new buffers, and the graphs that read the old
    ones are dropped with their memory pool (a freed pool's handle cannot take another capture)."""
    dec = graph_decode.StaticDecoder()
    graph_decode._ensure_buffers(dec, tiny_model, 4, 16, 8, 2, 16)
    dec.graphs[(4, 16, None)], dec.pool = object(), object()
    keys = dec.keys[0]
    graph_decode._ensure_buffers(dec, tiny_model, 2, 16, 8, 2, 16)  # fits: kept
    assert dec.keys[0] is keys and dec.graphs and dec.pool is not None
    graph_decode._ensure_buffers(dec, tiny_model, 4, 32, 8, 2, 16)  # more positions
    assert dec.keys[0] is not keys and not dec.graphs and dec.pool is None
    assert dec.keys[0].shape == (5, 2, 32, 16) and dec.state.uniforms.shape == (5, 8)
