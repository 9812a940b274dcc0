"""rollout.prepacked_weights: the rollout copy's Linear layers on oneDNN-prepacked weights, and the
weight sync that lays them out again (model/prepacked.py, rollout/hf.py)."""

import pytest
import torch
import torch.nn.functional as F

from rlpr.model import prepacked
from rlpr.model.prepacked import MAX_ROWS, PrepackedLinear
from rlpr.rollout.hf import HFRollout

pytestmark = pytest.mark.unit

needs_fp32 = pytest.mark.skipif(not prepacked.available(torch.float32), reason="no oneDNN fp32 prepacking here")
needs_bf16 = pytest.mark.skipif(not prepacked.available(torch.bfloat16),
                                reason="this CPU cannot prepack bf16 (needs AVX512-BW/VL/DQ or AVX-NE-CONVERT)")


def prompts(tokenizer, questions):
    return [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                          tokenize=True, return_dict=False) for q in questions]


def layer(dtype, bias=True):
    torch.manual_seed(0)
    lin = torch.nn.Linear(48, 40, bias=bias).to(dtype).requires_grad_(False)
    plain = torch.nn.Linear(48, 40, bias=bias).to(dtype).requires_grad_(False)
    plain.load_state_dict(lin.state_dict())
    assert prepacked.prepack(lin) == [""] and isinstance(lin, PrepackedLinear)
    return lin, plain


@pytest.mark.parametrize("dtype", [pytest.param(torch.bfloat16, marks=needs_bf16),
                                   pytest.param(torch.float32, marks=needs_fp32)])
@pytest.mark.parametrize("bias", [True, False])
def test_prepacked_linear_equals_linear(dtype, bias):
    """bf16 without a bias: the same bits as F.linear (both oneDNN, fp32 accumulation); with one, the
    bias is added before the one rounding to bf16 (F.linear may round twice); fp32: float rounding
    (MKL's summation order differs). Decode rows, a batch of prompts and a non-contiguous view."""
    lin, plain = layer(dtype, bias)
    for x in (torch.randn(7, 48), torch.randn(5, 1, 48), torch.randn(2, 30, 48), torch.randn(30, 2, 48).transpose(0, 1)):
        x = x.to(dtype)
        got, want = lin(x), plain(x)
        assert got.shape == want.shape and got.dtype == dtype
        if dtype == torch.bfloat16 and not bias:
            assert torch.equal(got, want)
        elif dtype == torch.bfloat16:
            torch.testing.assert_close(got, want, rtol=1.6e-2, atol=1e-2)  # one bf16 rounding step
        else:
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@needs_fp32
def test_large_inputs_grad_and_other_dtypes_take_linear(monkeypatch):
    """Decode-sized no-grad inputs take the prepacked kernel; over MAX_ROWS rows, under autograd or in
    another dtype the layer is F.linear, to the bit, and the gradient flows (the prepacked kernel
    has no backward)."""
    lin, plain = layer(torch.float32)
    calls = []
    real = torch.ops.mkldnn._linear_pointwise
    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", lambda *a: calls.append(a[0].shape) or real(*a))
    lin(torch.randn(MAX_ROWS, 48))
    assert calls == [(MAX_ROWS, 48)]
    big = torch.randn(MAX_ROWS + 1, 48)
    assert torch.equal(lin(big), F.linear(big, plain.weight, plain.bias))
    x = torch.randn(4, 48, requires_grad=True)
    lin(x).sum().backward()
    torch.testing.assert_close(x.grad, torch.ones(4, 40) @ plain.weight)
    wide = torch.randn(4, 48, dtype=torch.float64)
    assert torch.equal(lin.double()(wide), F.linear(wide, plain.weight.double(), plain.bias.double()))
    assert calls == [(MAX_ROWS, 48)]


@needs_bf16
def test_bf16_rollout_is_the_same_with_prepacked_weights(tiny_model, tokenizer):
    """The default on a CPU with fast bf16: every sampled and greedy token as without it."""
    ps = prompts(tokenizer, ["Capital of France?", "A much longer question about rivers and mountains?"])
    on = HFRollout(tiny_model, tokenizer, torch.bfloat16, batch_sequences=5, prepacked_weights="on")
    off = HFRollout(tiny_model, tokenizer, torch.bfloat16, batch_sequences=5, prepacked_weights="off")
    assert on.prepacked and not off.prepacked
    assert any(isinstance(m, PrepackedLinear) and m.packed is not None for m in on.model.modules())
    assert not any(isinstance(m, PrepackedLinear) for m in off.model.modules())
    for kw in ({"seeds": [1, 2]}, {"temperature": 0.0}):
        a = on.generate(ps, 3, max_new_tokens=12, **kw)
        b = off.generate(ps, 3, max_new_tokens=12, **kw)
        assert [r.token_ids for r in a] == [r.token_ids for r in b]


@needs_fp32
def test_sync_lays_out_changed_weights_again(tokenizer):
    """After the policy changes (LoRA deltas, and a frozen norm changed in place), a synced engine
    samples what a fresh engine on the changed policy samples: no stale layout; a frozen weight
    left alone is not copied again."""
    from peft import LoraConfig, get_peft_model

    from rlpr.model.loading import tiny_llama

    policy = get_peft_model(tiny_llama(tokenizer, seed=5), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    engine = HFRollout(policy, tokenizer, torch.float32, batch_sequences=6, prepacked_weights="on")
    ps = prompts(tokenizer, ["Capital of France?", "Why is the sky blue?"])
    before = engine.generate(ps, 3, max_new_tokens=16, seeds=[1, 2])
    copy = engine.model.state_dict()
    embedding = copy["model.embed_tokens.weight"]
    embedding_version = embedding._version
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
        norm = policy.base_model.model.model.layers[0].input_layernorm.weight
        norm.mul_(1.5)
    engine.sync(policy)
    assert embedding._version == embedding_version  # frozen and unchanged: not written
    assert torch.equal(copy["model.layers.0.input_layernorm.weight"], norm)  # frozen, changed in place: copied
    fresh = HFRollout(policy, tokenizer, torch.float32, batch_sequences=6, prepacked_weights="on")
    after = engine.generate(ps, 3, max_new_tokens=16, seeds=[1, 2])
    assert [r.token_ids for r in after] == [r.token_ids for r in fresh.generate(ps, 3, max_new_tokens=16, seeds=[1, 2])]
    assert [r.token_ids for r in after] != [r.token_ids for r in before]
    ids = torch.tensor(ps[:1])
    with torch.no_grad():
        torch.testing.assert_close(engine.model(input_ids=ids).logits, policy(input_ids=ids).logits, rtol=1e-4, atol=1e-4)


def test_modes():
    """auto resolves per device and dtype; on is refused with one line where it cannot run; an
    unknown mode names the key."""
    assert prepacked.resolve("off", "cpu", torch.float32) is False
    assert prepacked.resolve("auto", "cuda", torch.bfloat16) is False
    assert prepacked.resolve("auto", "cpu", torch.float32) is prepacked.available(torch.float32)
    with pytest.raises(ValueError, match="rollout.prepacked_weights=on needs a CPU rollout copy"):
        prepacked.resolve("on", "cuda", torch.bfloat16)
    with pytest.raises(ValueError, match="unknown rollout.prepacked_weights 'yes'"):
        prepacked.resolve("yes", "cpu", torch.float32)


def test_on_needs_the_hf_engine():
    """`on` with another engine is refused at configuration time, in one line naming both keys."""
    from rlpr.config import load_config
    from rlpr.errors import ConfigError

    assert load_config("demo", ["rollout.prepacked_weights=on"]).rollout.prepacked_weights == "on"
    assert load_config("demo", ["rollout.engine=vllm"]).rollout.prepacked_weights == "auto"  # auto: nothing to do
    with pytest.raises(ConfigError, match="rollout.prepacked_weights=on .* needs rollout.engine=hf"):
        load_config("demo", ["rollout.engine=vllm", "rollout.prepacked_weights=on"])
