"""Which tokens each phase of a training step runs through the model, against the step's unique tokens
(issue 42; benchmarks/speed.py reports both for rlpr and TRL).

`TokenCounter` hooks modules that see every forward's input ids (the policy's decoder, the rollout
copy's input embedding: rlpr's decode steps call the copy's layers directly) and adds the query
positions of every forward to the phase that is current (`with counter.phase("rollout"): ...`):
`run` counts every position computed, padding included; `real` only positions whose attention mask
is 1, where the hooked module is given the mask (a decode step of a row that already ended still
counts as real: it was computed). Backward passes
are not counted: each update forward has one.

The step's unique tokens are what any implementation must run through the model at least once: each
group's prompt once, each response's tokens fed back while decoding (all but the last drawn), and
each response's reference tail (the tokens of o' after its longest common prefix with those through
its last scored token, `reference_tails`: score B's answer turn or block and the reference). The rest
is recomputation.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch


class TokenCounter:
    def __init__(self):
        self.current: str | None = None
        self.run: dict[str, int] = {}
        self.real: dict[str, int] = {}
        self.handles = []

    def watch(self, module) -> None:
        self.handles.append(module.register_forward_pre_hook(self._count, with_kwargs=True))

    def _count(self, module, args, kwargs) -> None:
        if self.current is None:
            return
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            ids = kwargs.get("inputs_embeds")
            if ids is None:
                return
            ids = ids[..., 0]
        queries = ids.shape[-1]
        mask = kwargs.get("attention_mask")
        real = int(mask[:, -queries:].sum()) if isinstance(mask, torch.Tensor) and mask.dim() == 2 else ids.numel()
        self.run[self.current] = self.run.get(self.current, 0) + ids.numel()
        self.real[self.current] = self.real.get(self.current, 0) + real

    @contextmanager
    def phase(self, name: str):
        before, self.current = self.current, name
        try:
            yield
        finally:
            self.current = before

    def take(self) -> dict:
        """The counts so far, per phase ({phase: {"run", "real"}}), and reset."""
        out = {k: {"run": self.run[k], "real": self.real.get(k, 0)} for k in self.run}
        self.run, self.real = {}, {}
        return out

    def close(self) -> None:
        for h in self.handles:
            h.remove()


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def reference_tails(reward, tokenizer, prompt_ids: list[list[int]], response_ids: list[list[int]], texts, responses,
                    references) -> list[int]:
    """Per response, the tokens of its o' (as score B tokenizes it) that score B must run beyond the
    prompt ids + the response ids but the last: from their longest common prefix (at most the position
    before the first scored token) through the last scored token (0 where the response has no o')."""
    from rlpr.reward.sequence import tokenize_scored

    items = [reward.score_b_text(p, r, y) for p, r, y in zip(texts, responses, references)]
    todo = [i for i, it in enumerate(items) if it is not None]
    tails = [0] * len(items)
    if todo:
        enc = tokenize_scored(tokenizer, [items[i] for i in todo], reward.cfg.splice)
        for i, ids, mask in zip(todo, enc.input_ids, enc.ref_mask):
            if any(mask):
                start = min(common_prefix(ids, prompt_ids[i] + response_ids[i][:-1]), mask.index(True) - 1)
                tails[i] = len(mask) - mask[::-1].index(True) - start
    return tails


def unique_tokens(prompt_ids: list[list[int]], groups: list, response_ids: list[list[int]], tails: list[int]) -> dict:
    """The step's unique tokens: each group's prompt once, each response's fed tokens, each reference tail."""
    prompts = {}
    for g, ids in zip(groups, prompt_ids):
        prompts.setdefault(g, len(ids))
    out = {"prompts": sum(prompts.values()), "responses": sum(max(len(r) - 1, 0) for r in response_ids),
           "reference_tails": sum(tails)}
    out["total"] = sum(out.values())
    return out
