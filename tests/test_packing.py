"""trainer.pack_responses: one prompt's responses packed into rows after its keys/values compute what
each response alone computes, in the update and its log-prob passes."""

import pytest
import torch

from rlpr.errors import ConfigError
from rlpr.model.forward import PrefixState, hidden_states
from rlpr.model.packing import (pack_rows, packed_continuation_hidden, packed_layout, packed_mask, resolve_packing,
                                row_capacity)
from rlpr.train.tracking import read_metrics
from rlpr.train.trainer import train

from helpers import tiny_cfg

pytestmark = pytest.mark.unit

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
    starts, seg, pos = packed_layout([3, 2, 1], [[0, 1], [2]])
    assert starts == {0: (0, 0), 1: (0, 3), 2: (1, 0)} and seg.shape == (2, 5)
    assert pos[0].tolist() == [0, 1, 2, 0, 1] and seg[1].tolist() == [2, -1, -1, -1, -1]
    m = packed_mask(seg, pos, 2)[:, 0]
    assert m.shape == (2, 5, 7) and m[:, :, :2].all()  # everyone sees the prompt
    assert m[0, 2, 2:].tolist() == [True, True, True, False, False]  # response 0's last token: its own three
    assert m[0, 4, 2:].tolist() == [False, False, False, True, True]  # response 1's second: only response 1
    assert m[1, 1:, 2:].sum() == 0 and m[1, 0, 2:].tolist() == [True, False, False, False, False]  # padding: prompt


def test_a_sliding_window_mask_sees_only_the_window():
    """A window of 3 after a 5-token prompt whose layer holds its last 2 keys (positions 3, 4)."""
    starts, seg, pos = packed_layout([4], [[0]])
    m = packed_mask(seg, pos, 5, held=2, window=3)[0, 0]
    # query j sits at position 5 + j and sees positions 5 + j - 2 .. 5 + j: the held keys 3, 4, then its own
    assert m.tolist() == [[True, True, True, False, False, False],
                          [False, True, True, True, False, False],
                          [False, False, True, True, True, False],
                          [False, False, False, True, True, True]]


@pytest.mark.parametrize("capacity", [None, 9, 10, 12])
def test_packed_hidden_states_equal_each_response_run_alone(tiny_model, capacity):
    g = torch.Generator().manual_seed(0)
    prefix = torch.randint(3, 1000, (7,), generator=g).tolist()
    conts = [torch.randint(3, 1000, (n,), generator=g).tolist() for n in (5, 1, 9, 3, 4)]
    with torch.no_grad():
        hidden, tokens = packed_continuation_hidden(tiny_model, PrefixState(tiny_model, prefix), conts,
                                                    capacity=capacity)
        want = []
        for c in conts:  # the sequence alone, one forward from its first token
            ids = torch.tensor([prefix + c])
            want.append(hidden_states(tiny_model, ids, torch.ones_like(ids))[0, len(prefix) - 1:-1])
    assert tokens.tolist() == [t for c in conts for t in c]
    assert torch.allclose(hidden, torch.cat(want), atol=1e-5)


def test_packed_targets_are_the_marked_tokens_as_the_padded_path_has_them(tiny_model):
    """Scoring marks some tokens only (score B: the reference's): the same hidden states and tokens."""
    from rlpr.model.forward import continuation_hidden

    g = torch.Generator().manual_seed(1)
    prefix = torch.randint(3, 1000, (6,), generator=g).tolist()
    conts = [torch.randint(3, 1000, (n,), generator=g).tolist() for n in (6, 2, 8)]
    marks = [[j >= 3 for j in range(6)], [False, True], [j in (0, 5, 7) for j in range(8)]]
    with torch.no_grad():
        state = PrefixState(tiny_model, prefix)
        want, want_tokens = continuation_hidden(tiny_model, state, conts, marks)
        got, tokens = packed_continuation_hidden(tiny_model, state, conts, marks, capacity=8)
    assert torch.equal(tokens, want_tokens) and torch.allclose(got, want, atol=1e-5)


def test_auto_packs_on_the_cpu_with_the_shared_prefix_and_on_says_why_it_cannot(tokenizer, tiny_model):
    from rlpr.model.loading import tiny_llama

    assert resolve_packing("auto", tiny_model, CPU, True)
    assert not resolve_packing("auto", tiny_model, torch.device("cuda"), True)  # a GPU: padded rows
    assert resolve_packing("on", tiny_model, torch.device("cuda"), True)
    assert not resolve_packing("auto", tiny_model, CPU, False) and not resolve_packing("off", tiny_model, CPU, True)
    with pytest.raises(ConfigError, match="share_prompt_prefix"):
        resolve_packing("on", tiny_model, CPU, False)
    with pytest.raises(ConfigError, match="not one of"):
        resolve_packing("yes", tiny_model, CPU, True)
    eager = tiny_llama(tokenizer)
    eager.set_attn_implementation("eager")  # adds a float mask to the scores: a boolean one would be wrong
    assert not resolve_packing("auto", eager, CPU, True)
    with pytest.raises(ConfigError, match="attention implementation is 'eager'"):
        resolve_packing("on", eager, CPU, True)


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
    layout = update.prefix_continuation_hidden
    monkeypatch.setattr(update, "prefix_continuation_hidden",
                        lambda *a, **k: (packed.append(1) if k.get("pack") else None) or layout(*a, **k))
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
