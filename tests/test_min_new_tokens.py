"""rollout.min_new_tokens: EOS cannot end a training rollout before N tokens (vLLM's min_tokens);
0 changes nothing; evaluation's and serving's calls do not apply it."""

import copy

import pytest
import torch

from rlpr.config import RolloutConfig
from rlpr.data.records import Example
from rlpr.rollout.engines import build_engine
from rlpr.rollout.hf import HFRollout, PerRowSampler, row_seed

pytestmark = pytest.mark.unit

QUESTIONS = ["Capital of France?", "A much longer question about rivers and mountains?"]
SEEDS = [5, 6]


def prompts(tokenizer, questions=QUESTIONS):
    return [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                          tokenize=True, return_dict=False) for q in questions]


def eos_biased(model, tokenizer, strength: float):
    """A copy whose EOS logit is raised by about `strength` (its output row along the mean hidden state)."""
    model = copy.deepcopy(model)
    with torch.no_grad():
        h = model.model(input_ids=torch.tensor(prompts(tokenizer)[1:])).last_hidden_state[0].mean(0)
        model.get_output_embeddings().weight[tokenizer.eos_token_id] = strength * h / h.norm() ** 2
    return model


@pytest.fixture(scope="module")
def eos_model(tiny_model, tokenizer):
    """EOS is sampled (and greedy) at the first token of every row when nothing stops it."""
    return eos_biased(tiny_model, tokenizer, 30.0)


@pytest.fixture(scope="module")
def eos_prone(tiny_model, tokenizer):
    """EOS likely but not certain: rows end at different steps (as tests/test_rollout.py's)."""
    return eos_biased(tiny_model, tokenizer, 8.0)


@torch.no_grad()
def reference(model, tokenizer, ps, n, *, max_new_tokens, temperature, min_new_tokens):
    """The plainest decode: each row alone, a full forward per token (no cache, no batch), EOS's
    logit -inf for the first min_new_tokens tokens, the same per-row draws."""
    eos = tokenizer.eos_token_id
    out = []
    for i, p in enumerate(ps):
        for j in range(n):
            sampler = PerRowSampler([row_seed(SEEDS[i], j)], temperature) if temperature > 0 else None
            ids, new = list(p), []
            for step in range(max_new_tokens):
                logits = model(input_ids=torch.tensor([ids])).logits[:, -1].float()
                if step < min_new_tokens:
                    logits[:, eos] = float("-inf")
                token = int(sampler.draw(logits, torch.tensor([0]))[0]) if sampler else int(logits.argmax(-1))
                new.append(token)
                ids.append(token)
                if token == eos:
                    break
            out.append(new)
    return out


@pytest.mark.parametrize("loop", ["rlpr", "generate"])
@pytest.mark.parametrize("share_prefill", [True, False])
@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_no_response_ends_before_min_new_tokens(eos_model, tokenizer, loop, share_prefill, temperature):
    ps = prompts(tokenizer)
    engine = HFRollout(eos_model, tokenizer, torch.float32, batch_sequences=3, share_prefill=share_prefill,
                       loop=loop, min_new_tokens=6)
    n = 3 if temperature else 1
    free = engine.generate(ps, n, max_new_tokens=12, temperature=temperature, seeds=SEEDS, min_new_tokens=0)
    assert [len(r.token_ids) for r in free] == [1] * len(free)  # EOS at once when nothing stops it
    held = engine.generate(ps, n, max_new_tokens=12, temperature=temperature, seeds=SEEDS)  # the configured 6
    eos = tokenizer.eos_token_id
    assert all(len(r.token_ids) >= 6 and eos not in r.token_ids[:6] for r in held)
    assert any(r.finished for r in held)  # EOS still ends them once allowed
    assert [r.token_ids for r in held] == reference(eos_model, tokenizer, ps, n, max_new_tokens=12,
                                                    temperature=temperature, min_new_tokens=6)


def test_min_new_tokens_above_max_new_tokens_gives_full_length(eos_model, tokenizer):
    engine = HFRollout(eos_model, tokenizer, torch.float32, min_new_tokens=50)
    out = engine.generate(prompts(tokenizer), 2, max_new_tokens=8, seeds=SEEDS)
    assert [(len(r.token_ids), r.finished) for r in out] == [(8, False)] * 4


@pytest.mark.parametrize("loop", ["rlpr", "generate"])
def test_zero_changes_nothing(eos_prone, tokenizer, loop):
    """min_new_tokens=0 (configured or passed) samples exactly what the plain decode samples, with rows
    that end at different steps."""
    ps = prompts(tokenizer)
    kw = dict(max_new_tokens=16, temperature=1.0, seeds=SEEDS)
    default = HFRollout(eos_prone, tokenizer, torch.float32, batch_sequences=5, loop=loop).generate(ps, 4, **kw)
    configured = build_engine(eos_prone, tokenizer, RolloutConfig(batch_sequences=5, decode_loop=loop),
                              torch.float32).generate(ps, 4, **kw)
    passed = HFRollout(eos_prone, tokenizer, torch.float32, batch_sequences=5, loop=loop,
                       min_new_tokens=9).generate(ps, 4, **kw, min_new_tokens=0)
    tokens = [r.token_ids for r in default]
    assert len({len(t) for t in tokens}) > 1  # rows finish at different steps
    assert tokens == [r.token_ids for r in configured] == [r.token_ids for r in passed]
    assert tokens == reference(eos_prone, tokenizer, ps, 4, max_new_tokens=16, temperature=1.0, min_new_tokens=0)


def test_build_engine_takes_it_from_the_rollout_config(eos_model, tokenizer):
    engine = build_engine(eos_model, tokenizer, RolloutConfig(min_new_tokens=5), torch.float32)
    assert engine.min_new_tokens == 5
    out = engine.generate(prompts(tokenizer), 2, max_new_tokens=10, seeds=SEEDS)  # as the trainer calls it
    assert min(len(r.token_ids) for r in out) >= 5


def test_benchmark_evaluation_does_not_apply_it(eos_model, tokenizer):
    """rlpr eval / rlpr.evaluate sample through evaluation.benchmark.sample_and_grade: min_new_tokens=0."""
    from rlpr.evaluation.benchmark import sample_and_grade

    engine = build_engine(eos_model, tokenizer, RolloutConfig(min_new_tokens=5), torch.float32)
    examples = [Example(prompt=[{"role": "user", "content": q}], reference="x", uid=str(i))
                for i, q in enumerate(QUESTIONS)]
    groups = sample_and_grade(engine, tokenizer, examples, 2, max_new_tokens=10, temperature=1.0, top_p=1.0,
                              seed=0, questions_per_call=2)
    assert [s.n_tokens for g in groups for s in g] == [1] * 4


def test_serve_does_not_apply_it(eos_model, tokenizer):
    from rlpr.evaluation.serve import ChatGenerator

    engine = build_engine(eos_model, tokenizer, RolloutConfig(min_new_tokens=5), torch.float32)
    calls = []
    generate = engine.generate

    def recording(*a, **k):
        calls.append(k)
        return generate(*a, **k)

    engine.generate = recording
    ChatGenerator(eos_model, tokenizer, 10, None, engine)(
        [{"role": "user", "content": QUESTIONS[0]}], max_tokens=10, temperature=1.0, top_p=1.0, seed=1)
    assert calls and calls[0]["min_new_tokens"] == 0


def test_vllm_engine_passes_min_tokens(tokenizer):
    """rollout.engine=vllm: the configured value becomes SamplingParams(min_tokens=...), capped at
    max_tokens (vLLM refuses min_tokens > max_tokens); an explicit 0 turns it off. vLLM itself is not
    needed: the engine's SamplingParams and LLM are stand-ins here (tests/test_vllm_engine.py runs the real one)."""
    from types import SimpleNamespace

    from rlpr.rollout.vllm import VLLMRollout

    eos = tokenizer.eos_token_id
    params = []
    engine = VLLMRollout.__new__(VLLMRollout)  # no vLLM engine behind it
    engine.tokenizer, engine.min_new_tokens, engine._asleep, engine._lora = tokenizer, 6, False, None
    engine._sampling = lambda **k: params.append(k) or k
    completion = SimpleNamespace(token_ids=[5] * 6 + [eos], logprobs=None)
    engine.llm = SimpleNamespace(generate=lambda requests, sampling, **k: [SimpleNamespace(outputs=[completion])
                                                                         for _ in requests])
    out = engine.generate([[1, 2]], 2, max_new_tokens=10, seeds=[0])
    assert [p["min_tokens"] for p in params] == [6, 6] and all(r.finished for r in out)
    params.clear()
    engine.generate([[1, 2]], 1, max_new_tokens=4, seeds=[0])
    engine.generate([[1, 2]], 1, max_new_tokens=10, temperature=0.0, min_new_tokens=0)
    assert [p["min_tokens"] for p in params] == [4, 0]
