"""Prompt preparation: chat templating, skipped overlong prompts, pre-filled assistant turns."""

import pytest

from rlpr.data.demo_tasks import demo_examples
from rlpr.data.prompts import PromptStream, prepare_prompts
from rlpr.reward.parsing import parse_response

pytestmark = pytest.mark.unit


def test_prefill_is_in_the_prompt_tokens_and_the_rewarded_response(tokenizer):
    examples = demo_examples("val", n=3, template="r1_user")
    plain, _ = prepare_prompts(examples, tokenizer, 4096)
    filled, _ = prepare_prompts(examples, tokenizer, 4096, prefill="<think>")
    for p, f in zip(plain, filled):
        assert f.text == p.text  # the reward's Q is the chat prompt without the prefill
        assert tokenizer.decode(f.token_ids).endswith("<think>")
        assert len(f.token_ids) > len(p.token_ids)
    response = filled[0].response_text(" 2 + 2 = 4 </think> <answer> 4 </answer>")
    assert response.startswith("<think>") and parse_response(response, "r1").valid


def test_overlong_prompts_are_skipped_and_counted(tokenizer):
    examples = demo_examples("val", n=5)
    prompts, skipped = prepare_prompts(examples, tokenizer, max_prompt_tokens=1)
    assert prompts == [] and skipped == 5


def test_stream_serves_cache_first_and_walks_epochs():
    stream = PromptStream(3, seed=1)
    first = stream.take(3)
    assert sorted(first) == [0, 1, 2]
    stream.give_back([2])
    assert stream.take(1) == [2]
    assert sorted(stream.take(3)) == [0, 1, 2] and stream.epoch == 1
