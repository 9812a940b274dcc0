"""Tokenized prompts for training, and the resumable stream that hands them out.

The stream walks a seeded permutation per epoch; prompts returned by dynamic sampling (surplus
kept groups) go to a cache that is served first, so they are re-rolled later with a newer policy.
Its whole state is three small values and the cache, saved in every checkpoint.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from rlpr.seeding import SEED_MIX
from rlpr.data.records import Example


@dataclass
class Prompt:
    """A training/evaluation prompt: chat-templated text and its token ids."""

    index: int  # position in the prepared list (stable across runs with the same data)
    text: str  # chat-templated, ending with the generation prompt
    token_ids: list[int]  # tokens of text + prefill: what the policy is conditioned on
    example: Example
    prefill: str = ""  # start of the assistant turn written for the model (e.g. "<think>")

    def response_text(self, generated: str) -> str:
        """The response as the reward sees it: the pre-filled start plus what the model wrote."""
        return self.prefill + generated


def chat_text(tokenizer, messages: list[dict]) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def prepare_prompts(examples: list[Example], tokenizer, max_prompt_tokens: int,
                    prefill: str = "") -> tuple[list[Prompt], int]:
    """Chat-template and tokenize; prompts over `max_prompt_tokens` are skipped and counted."""
    prompts, skipped = [], 0
    for ex in examples:
        text = chat_text(tokenizer, ex.prompt)
        ids = tokenizer(text + prefill, add_special_tokens=False)["input_ids"]
        if len(ids) > max_prompt_tokens:
            skipped += 1
            continue
        prompts.append(Prompt(len(prompts), text, ids, ex, prefill))
    return prompts, skipped


class PromptStream:
    """Endless, seeded, resumable order over prompt indices, with a re-roll cache served first."""

    def __init__(self, size: int, seed: int = 0, shuffle: bool = True):
        if size <= 0:
            raise ValueError("no training prompts (all skipped or the data is empty)")
        self.size, self.seed, self.shuffle = size, seed, shuffle
        self.epoch, self.position = 0, 0
        self.cache: list[int] = []
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(self.size))
        if self.shuffle:
            random.Random(self.seed * SEED_MIX + epoch).shuffle(order)
        return order

    def take(self, k: int) -> list[int]:
        """The next k prompt indices: cached ones first, then the epoch order."""
        out = self.cache[:k]
        self.cache = self.cache[k:]
        while len(out) < k:
            if self.position >= self.size:
                self.epoch += 1
                self.position = 0
                self._order = self._permutation(self.epoch)
            out.append(self._order[self.position])
            self.position += 1
        return out

    def give_back(self, indices: list[int]) -> None:
        self.cache.extend(indices)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "cache": list(self.cache)}

    def load_state_dict(self, state: dict) -> None:
        """A saved position; one that does not fit this data (past its end, a cached index of no
        prompt) is a ValueError: a checkpoint that does not load, never a later IndexError."""
        epoch, position, cache = state["epoch"], state["position"], list(state["cache"])
        if not (0 <= position <= self.size and epoch >= 0 and all(0 <= i < self.size for i in cache)):
            raise ValueError(f"prompt stream at epoch {epoch}, position {position} with {len(cache)} cached prompts "
                             f"does not fit {self.size} prompts")
        self.epoch, self.position, self.cache = epoch, position, cache
        self._order = self._permutation(self.epoch)
