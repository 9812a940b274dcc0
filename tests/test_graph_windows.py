"""The static-shape decode loop (rollout/graph_decode.py) on every family a user brings: full attention
(Llama, Qwen2) and sliding windows (Gemma 2 alternating with soft-capped attention and logits, Gemma 3
alternating, Mistral sliding in every layer, Qwen2 with use_sliding_window). Tiny random models of a
256-token vocabulary (SmolLM2's tokenizer reads its first 256 ids; EOS is id 2), a window of 8
positions under prompts of 26 to 35 tokens and 20 new ones (the window hides most of each sequence):
the graph loop's tokens equal the eager loop's, greedy and seeded, with rows ending at different
steps (smaller batch buckets) and spans crossing several buckets.

Why a small vocabulary: the loops' attention kernels differ (grouped matmuls against SDPA), so their
logits differ by ~2e-6; a seeded draw flips to the neighbouring token when its uniform falls that
close to a boundary of the cumulative distribution, which over 49k near-equal probabilities happens
about once in a few thousand draws, over 256 a hundred times more rarely."""

import copy

import pytest
import torch

from rlpr.rollout import graph_decode
from rlpr.rollout.hf import HFRollout, resolve_loop

pytestmark = pytest.mark.unit

WINDOW = 8
VOCAB = 256
LENGTHS = (26, 35, 31)  # the prompts' tokens


def _family(name, tokenizer, window=WINDOW):
    import transformers as tf

    base = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, initializer_range=0.1,
                pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                eos_token_id=tokenizer.eos_token_id)
    gemma = dict(head_dim=16, query_pre_attn_scalar=16, sliding_window=window, tie_word_embeddings=True)
    if name == "qwen2":
        return tf.Qwen2ForCausalLM(tf.Qwen2Config(**base))
    if name == "qwen2-sliding":  # layer 0 full, layer 1 sliding (transformers: layers >= max_window_layers slide)
        return tf.Qwen2ForCausalLM(tf.Qwen2Config(**base, use_sliding_window=True, sliding_window=window,
                                                  max_window_layers=1))
    if name == "gemma2":
        return tf.Gemma2ForCausalLM(tf.Gemma2Config(**base, **gemma, final_logit_softcapping=30.0,
                                                    attn_logit_softcapping=5.0))
    if name == "gemma3":
        return tf.Gemma3ForCausalLM(tf.Gemma3TextConfig(**base, **gemma,
                                                        layer_types=["sliding_attention", "full_attention"]))
    if name == "mistral":
        return tf.MistralForCausalLM(tf.MistralConfig(**base, sliding_window=window))
    raise KeyError(name)


FAMILIES = ["qwen2", "qwen2-sliding", "gemma2", "gemma3", "mistral"]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def prompts(tokenizer):
    g = torch.Generator().manual_seed(0)
    return [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in LENGTHS]


def eos_prone(model, tokenizer):
    """`model` with a raised EOS logit, so that sampled rows end at different steps."""
    with torch.no_grad():
        ids = torch.tensor(prompts(tokenizer)[1:2])
        h = model.model(input_ids=ids).last_hidden_state[0].mean(0)
        model.get_output_embeddings().weight[tokenizer.eos_token_id] += 7 * h / h.norm() ** 2
    return model


@pytest.fixture(scope="module")
def family(tokenizer):
    built = {}

    def get(name, window=WINDOW):
        if (name, window) not in built:
            torch.manual_seed(0)
            built[name, window] = eos_prone(_family(name, tokenizer, window).eval(), tokenizer)
        return built[name, window]

    return get


@pytest.fixture
def small_buckets(monkeypatch):
    """Spans of 8 positions and a look at the rows every 3 steps: buckets change within 20 tokens."""
    monkeypatch.setattr(graph_decode, "SPAN_STEP", 8)
    monkeypatch.setattr(graph_decode, "CHECK_EVERY", 3)


def run(model, tokenizer, loop, batch=12, **kw):
    engine = HFRollout(model, tokenizer, torch.float32, batch_sequences=batch, loop=loop)
    assert engine.loop == loop  # no silent fall back to the eager loop
    out = engine.generate(prompts(tokenizer), 4, seeds=[1, 2, 3], **kw)
    run.shapes = graph_decode.decoder_for(engine.model).shapes if loop == "graph" else set()
    return [(r.prompt_index, r.token_ids, r.finished) for r in out]


@pytest.mark.parametrize("name", FAMILIES)
def test_graph_loop_equals_the_eager_loop_for_every_family(family, tokenizer, small_buckets, name):
    """Seeded tokens in one batch of all 12 rows and in batches of 5 (a group split across calls);
    temperature with top-p, and greedy, in one batch."""
    model = family(name)
    assert min(len(p) for p in prompts(tokenizer)) > 3 * WINDOW
    shapes = set()
    for temperature, top_p, batch in ((1.0, 1.0, 12), (1.0, 1.0, 5), (0.7, 0.9, 12), (0.0, 1.0, 12)):
        kw = dict(max_new_tokens=20, temperature=temperature, top_p=top_p)
        ours = run(model, tokenizer, "graph", batch=batch, **kw)
        shapes |= run.shapes
        assert ours == run(model, tokenizer, "rlpr", batch=batch, **kw), (name, temperature, batch)
        if temperature == 1.0:  # real samples: many distinct tokens, not one repeated
            assert len({t for _, tokens, _ in ours for t in tokens}) > 40
    assert len({span for _, span in shapes}) >= 3  # the spans grew past several buckets


def test_the_window_bites(family, tokenizer, small_buckets):
    """The same weights and seeds with a window longer than every sequence draw other tokens: the
    equality above compares windowed attention, not attention that never reaches the window."""
    kw = dict(max_new_tokens=20, temperature=1.0)
    narrow = run(family("gemma3"), tokenizer, "graph", **kw)
    wide_model = copy.deepcopy(family("gemma3"))
    wide_model.config.sliding_window = 4096
    for layer in wide_model.model.layers:
        if layer.self_attn.sliding_window:
            layer.self_attn.sliding_window = 4096
    wide = run(wide_model, tokenizer, "graph", **kw)
    assert wide == run(wide_model, tokenizer, "rlpr", **kw)
    assert narrow != wide


@pytest.mark.parametrize("name", ["gemma3", "mistral"])
def test_sampled_rows_end_at_different_steps(family, tokenizer, small_buckets, name):
    """The eos-prone models end rows early, so the windows' masks move with the rows into smaller
    batch buckets (the equality test's first run: seeded, 12 rows)."""
    out = run(family(name), tokenizer, "graph", max_new_tokens=20, temperature=1.0)
    lengths = sorted(len(tokens) for _, tokens, _ in out)
    assert lengths[0] < 4 and lengths[-1] == 20
    assert {rows for rows, _ in run.shapes} > {12}


def test_layers_other_than_full_and_sliding_take_the_eager_loop(family, tokenizer):
    """A cache layer that is neither full attention nor a sliding window (here Llama 4's chunked
    attention) keeps the model on the eager loop; the sliding families take the graph loop."""
    from transformers import Llama4ForCausalLM, Llama4TextConfig

    chunked = Llama4ForCausalLM(Llama4TextConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                                 intermediate_size_mlp=64, num_hidden_layers=2,
                                                 num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                                 attention_chunk_size=8, num_local_experts=1))
    from rlpr.model.packing import attention_windows

    assert attention_windows(chunked) is None  # transformers caches it as a sliding window; its mask differs
    assert not graph_decode.supports_static_decode(chunked)
    assert resolve_loop("graph", chunked) == "rlpr"
    for name in FAMILIES:
        assert resolve_loop("graph", family(name)) == "graph"
    with pytest.raises(ValueError, match="neither full attention nor a sliding window"):
        graph_decode.static_sample(chunked, torch.ones(1, 3, dtype=torch.long), torch.ones(1, 3, dtype=torch.long),
                                   None, max_new_tokens=2, eos=0, pad=0)


def test_a_windowed_step_never_waits_on_the_host(family, tokenizer):
    """The windows' masks are made on the device (a CUDA graph holds no host synchronisation): one
    Gemma 3 step on the meta device, where `.item()`, `bool(tensor)` or `.cpu()` would raise."""
    model = copy.deepcopy(family("gemma3")).to("meta")
    dec = graph_decode.StaticDecoder()
    graph_decode._ensure_buffers(dec, model, 4, 16, 8, 2, 16)
    s = dec.state
    s.rows, s.span, s.length = 4, 16, 3
    cache = graph_decode.DynamicCache(config=model.config)
    cache.layers = [graph_decode.StaticLayer(k, v, s) for k, v in zip(dec.keys, dec.values)]
    spec = graph_decode.StepSpec(eos=2, pad=0, stops=(), min_new_tokens=0, temperature=0.0, top_p=1.0,
                                 windows=(WINDOW,))
    previous = model.config._attn_implementation
    model.config._attn_implementation = graph_decode.DECODE_ATTENTION
    graph_decode._Windows.layers = graph_decode.attention_windows(model)
    try:
        graph_decode._step(model, cache, s, spec, torch.tensor([2], device="meta"), None)
        assert set(graph_decode._Windows.masks) == {WINDOW}
    finally:
        graph_decode._Windows.layers, graph_decode._Windows.masks = [], {}
        model.config._attn_implementation = previous


@pytest.mark.parametrize("name", ["qwen2", "gemma3", "mistral"])
def test_sdpa_attention_kernel_draws_the_same_tokens(family, tokenizer, small_buckets, monkeypatch, name):
    """graph_decode.KERNEL="sdpa" (torch's fused attention over the grouped heads, which the GPU check
    measures against the grouped matmuls): the eager loop's tokens too, windows and all."""
    monkeypatch.setattr(graph_decode, "KERNEL", "sdpa")
    for kw in (dict(temperature=1.0), dict(temperature=0.0)):
        kw.update(max_new_tokens=20)
        assert run(family(name), tokenizer, "graph", **kw) == run(family(name), tokenizer, "rlpr", **kw)
