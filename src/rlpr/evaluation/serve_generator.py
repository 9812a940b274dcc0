"""The model side of `rlpr serve`: chat messages to one completion with the request's sampling
settings, by the policy's own `generate` or by a rollout engine. It is kept apart from the HTTP
code because it is the only part that needs torch and a model: generation is serialized by a lock
(one CPU model cannot usefully run two generations at once), a prompt over `max_prompt_tokens` is
refused before it can take that lock, and tests drive the generator directly, without a server.
"""

from __future__ import annotations

import threading

import torch

from rlpr.data.prompts import chat_text
from rlpr.evaluation.serve_protocol import Completion, RequestError


def check_context(context: int | None, max_new_tokens: int, max_prompt_tokens: int | None) -> None:
    """At start, one line (issue 60, S15): a --max-new-tokens that leaves no room for a prompt in the
    model's context (a server that refuses everything), or a --max-prompt-tokens that with it runs
    past the context (answers the model computes from positions it was never trained on)."""
    if not context:
        return
    if max_new_tokens >= context:
        raise ValueError(f"--max-new-tokens {max_new_tokens} leaves no room for a prompt in the model's context of "
                         f"{context} tokens (rollout.max_new_tokens); lower it")
    if max_prompt_tokens and max_prompt_tokens + max_new_tokens > context:
        raise ValueError(f"--max-prompt-tokens {max_prompt_tokens} plus --max-new-tokens {max_new_tokens} exceed the "
                         f"model's context of {context} tokens; keep their sum within it (0: the context minus "
                         f"--max-new-tokens)")


class ChatGenerator:
    """Chat messages -> one completion, with the request's sampling settings: by the model's own
    `generate`, or by a rollout engine (`engine`, e.g. rollout.engine=vllm) when one is given."""

    def __init__(self, model, tokenizer, max_new_tokens: int = 256, max_prompt_tokens: int | None = None,
                 engine=None):
        self.model = model
        self.engine = engine
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
        check_context(context, max_new_tokens, max_prompt_tokens)
        # default: what fits in the model's context beside the longest completion
        self.max_prompt_tokens = max_prompt_tokens or (context - max_new_tokens if context else None)
        self.lock = threading.Lock()

    @torch.no_grad()
    def __call__(self, messages: list[dict], *, temperature: float = 1.0, top_p: float = 1.0,
                 max_tokens: int | None = None, seed: int | None = None,
                 stop: list[str] | None = None) -> Completion:
        from transformers import GenerationConfig

        tok = self.tokenizer
        text = chat_text(tok, messages)
        ids = tok(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        if self.max_prompt_tokens and ids.shape[1] > self.max_prompt_tokens:
            raise RequestError(f"the prompt has {ids.shape[1]} tokens; this server accepts at most "
                               f"{self.max_prompt_tokens}")
        limit = min(max_tokens or self.max_new_tokens, self.max_new_tokens)
        sampling = dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=0) if temperature > 0 \
            else dict(do_sample=False)
        config = GenerationConfig(max_new_tokens=limit, eos_token_id=tok.eos_token_id,
                                  pad_token_id=tok.pad_token_id, **sampling)
        with self.lock:
            if self.engine is not None:
                seed = seed if seed is not None else int(torch.randint(0, 2**62, ()).item())
                tokens = self.engine.generate([ids[0].tolist()], 1, max_new_tokens=limit, temperature=temperature,
                                              top_p=top_p, seeds=[seed], min_new_tokens=0)[0].token_ids
            else:
                if seed is not None:
                    torch.manual_seed(seed)
                ids = ids.to(self.model.device)
                out = self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                          generation_config=config)
                tokens = out[0, ids.shape[1]:].tolist()
        finish = "length"
        if tok.eos_token_id in tokens:
            tokens, finish = tokens[:tokens.index(tok.eos_token_id)], "stop"
        content = tok.decode(tokens, skip_special_tokens=True)
        for s in stop or []:
            if s and s in content:
                content, finish = content[:content.index(s)], "stop"
        return Completion(content, ids.shape[1], len(tokens), finish)
