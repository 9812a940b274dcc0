"""trainer.pack_responses: one prompt's responses packed into rows after its keys/values compute what
each response alone computes, in the update and its log-prob passes."""

import pytest
import torch

from rlpr.errors import ConfigError
from rlpr.model.forward import PrefixState, hidden_states
from rlpr.model.packing import pack_rows, packed_continuation_hidden, packed_layout, resolve_packing, row_capacity
from rlpr.train.tracking import read_metrics
from rlpr.train.trainer import train

from helpers import tiny_cfg

CPU = torch.device("cpu")


@pytest.mark.parametrize("lengths, capacity", [([5, 1, 9, 3, 4], 9), ([5, 1, 9, 3, 4], 100), ([7, 7, 7], 10),
                                               ([30, 2, 2], 8), ([1], 1)])
def test_pack_rows_places_every_response_once_within_the_capacity(lengths, capacity):
    rows = pack_rows(lengths, capacity)
    assert sorted(i for row in rows for i in row) == list(range(len(lengths)))
    for row in rows:  # within the capacity, unless one response longer than it is alone
        assert sum(lengths[i] for i in row) <= capacity or len(row) == 1


def test_the_mask_shows_each_token_the_prompt_and_its_own_earlier_tokens_only():
    # prompt of 2; row 0 holds responses 0 (3 tokens) then 1 (2 tokens); row 1 holds response 2 (1 token) + padding
    starts, width, positions, mask = packed_layout(2, [3, 2, 1], [[0, 1], [2]])
    assert starts == {0: (0, 0), 1: (0, 3), 2: (1, 0)} and width == 5
    assert positions[0].tolist() == [2, 3, 4, 2, 3] and positions[1, 0].item() == 2
    m = mask[:, 0]
    assert m.shape == (2, 5, 7) and m[:, :, :2].all()  # everyone sees the prompt
    assert m[0, 2, 2:].tolist() == [True, True, True, False, False]  # response 0's last token: its own three
    assert m[0, 4, 2:].tolist() == [False, False, False, True, True]  # response 1's second: only response 1
    assert m[1, 1:, 2:].sum() == 0 and m[1, 0, 2:].tolist() == [True, False, False, False, False]  # padding: prompt


@pytest.mark.parametrize("capacity", [None, 9, 10, 12])
def test_packed_hidden_states_equal_each_response_run_alone(tiny_model, capacity):
    g = torch.Generator().manual_seed(0)
    prefix = torch.randint(3, 1000, (7,), generator=g).tolist()
    conts = [torch.randint(3, 1000, (n,), generator=g).tolist() for n in (5, 1, 9, 3, 4)]
    with torch.no_grad():
        hidden, tokens = packed_continuation_hidden(tiny_model, PrefixState(tiny_model, prefix), conts, capacity)
        want = []
        for c in conts:  # the sequence alone, one forward from its first token
            ids = torch.tensor([prefix + c])
            want.append(hidden_states(tiny_model, ids, torch.ones_like(ids))[0, len(prefix) - 1:-1])
    assert tokens.tolist() == [t for c in conts for t in c]
    assert torch.allclose(hidden, torch.cat(want), atol=1e-5)


def test_auto_packs_on_the_cpu_with_the_shared_prefix_and_on_says_why_it_cannot(tiny_model):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    assert resolve_packing("auto", tiny_model, CPU, True)
    assert not resolve_packing("auto", tiny_model, torch.device("cuda"), True)  # a GPU: padded rows
    assert resolve_packing("on", tiny_model, torch.device("cuda"), True)
    assert not resolve_packing("auto", tiny_model, CPU, False) and not resolve_packing("off", tiny_model, CPU, True)
    with pytest.raises(ConfigError, match="share_prompt_prefix"):
        resolve_packing("on", tiny_model, CPU, False)
    with pytest.raises(ConfigError, match="not one of"):
        resolve_packing("yes", tiny_model, CPU, True)
    gemma = Gemma3ForCausalLM(Gemma3TextConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                               num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                               sliding_window=8))
    assert not resolve_packing("auto", gemma, CPU, True)
    with pytest.raises(ConfigError, match="sliding window"):
        resolve_packing("on", gemma, CPU, True)


def test_row_capacity_follows_the_model_and_never_cuts_a_response(tiny_model):
    from transformers import LlamaConfig

    smollm2 = LlamaConfig(hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3)
    assert row_capacity(smollm2, 64) == 614
    assert row_capacity(tiny_model.config, 3000) == 3000


@pytest.mark.integration
def test_a_packed_run_trains_as_the_padded_one(tiny_dir, tmp_path, monkeypatch):
    """One step each way in fp32: the same loss, entropy and gradient norm; only `on` packs."""
    import rlpr.train.update as update

    packed = []
    monkeypatch.setattr(update, "packed_continuation_hidden",
                        lambda *a, **k: packed.append(1) or packed_continuation_hidden(*a, **k))
    runs, calls = {}, {}
    for mode in ("on", "off"):
        cfg = tiny_cfg(tiny_dir, tmp_path, mode, "trainer.max_steps=1", f"trainer.pack_responses={mode}",
                       "trainer.mixed_precision=none", "model.rollout_dtype=float32", "algorithm.std_filter=false",
                       "trainer.micro_batch_sequences=4", "data.val=")
        train(cfg)
        runs[mode], calls[mode] = read_metrics(tmp_path / mode)[0], len(packed)
    on, off = runs["on"], runs["off"]
    # two updates a step: each micro-batch packed in the old log-probs' pass and in the update, only with `on`
    assert calls["on"] == 2 * on["perf/micro_batches"] > 0 and calls["off"] == calls["on"]
    assert on["policy/tokens"] == off["policy/tokens"] > 0
    for key in ("policy/pg_loss", "policy/entropy", "policy/grad_norm"):
        assert on[key] == pytest.approx(off[key], rel=1e-4, abs=1e-6), key
