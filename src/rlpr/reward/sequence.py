"""Build the scored sequences o' (score B) and prompt + reference (score A), tokenize them with
character offsets and mark the reference tokens (spec sections 1.2-1.3, 1b and 2).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlpr.reward.parsing import ANSWER_CLOSE, parse_response

DEFAULT_ANSWER_CUE = "\n<answer> "
FALLBACKS = ("none", "free")
# How o' becomes token ids (`reward.splice`): `text` tokenizes the whole text at once; `ids`
# tokenizes the reasoning (Q + z) and the answer block (`<answer>` + gap + y* + " </answer>" + EOS)
# separately and concatenates the ids, so no token spans the boundary (VeriFree's splicing).
SPLICES = ("text", "ids")
# Which characters of o' are scored (`reward.score_span`): `reference`, y* itself (RLPR: the tokens
# overlapping it); `block`, the whole answer block after the reasoning, from `<answer>` (or
# `\boxed{`, or the fallback's cue) through the closing tag, EOS excluded (VeriFree scores its
# whole rendered answer block, tags included).
SCORE_SPANS = ("reference", "block")


TURN_MARKER = "\x00rlpr-response\x00"


def turn_cue(tokenizer, question: str) -> str:
    """The text between a response and the next assistant turn when the user asks `question`
    after it: the end of the assistant turn, the user turn and the generation prompt, as the
    model's own chat template writes them (for SmolLM2: "<|im_end|>\\n<|im_start|>user\\n" +
    question + "<|im_end|>\\n<|im_start|>assistant\\n"). Used as the fallback's answer cue, it
    asks the model to restate the answer of the response in a second turn, where y* is scored."""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Q"}, {"role": "assistant", "content": TURN_MARKER},
         {"role": "user", "content": question}], tokenize=False, add_generation_prompt=True)
    cue = text.split(TURN_MARKER, 1)[1] if TURN_MARKER in text else ""
    if question not in cue or not cue.split(question, 1)[1].strip():
        raise ValueError("reward.answer_turn: the tokenizer's chat template does not write an assistant turn, "
                         "a user turn and the start of the next assistant turn; set reward.answer_cue instead")
    return cue


@dataclass(frozen=True)
class ScoredText:
    """A text whose characters [ref_start, ref_end) are the reference answer to score."""

    text: str
    ref_start: int
    ref_end: int
    fallback: bool = False  # scored through the section-1b fallback (response not format-valid)
    prefix_chars: int = 0  # length of the prompt text Q at the start (shared by a group's texts)
    block_start: int | None = None  # where the answer block starts (splice=ids cuts here; None: never)


def _with_reference(head: str, reference: str, tail: str, eos: str, fallback: bool = False,
                    prefix_chars: int = 0, block_start: int | None = None, span: str = "reference") -> ScoredText:
    if span not in SCORE_SPANS:
        raise ValueError(f"unknown score span {span!r}; choose one of {', '.join(SCORE_SPANS)}")
    start, end = len(head), len(head) + len(reference)
    if span == "block" and block_start is not None:
        start, end = block_start, end + len(tail)
    return ScoredText(head + reference + tail + eos, start, end, fallback, prefix_chars, block_start)


def strip_response(response: str, eos: str) -> str:
    """The response without trailing whitespace and EOS tokens (the fallback keeps all the rest)."""
    text = response.rstrip()
    while eos and text.endswith(eos):
        text = text[: -len(eos)].rstrip()
    return text


def build_score_b_text(prompt_text: str, response: str, reference: str, eos: str, *,
                       mode: str = "r1", fallback: str = "none",
                       cue: str = DEFAULT_ANSWER_CUE, span: str = "reference") -> ScoredText | None:
    """o' = Q + reasoning + the model's whitespace + y* + " </answer>" + EOS; None when the
    response is invalid (and the fallback is off). `span`: the scored characters (SCORE_SPANS)."""
    parsed = parse_response(response, mode)
    if parsed.valid:
        return _with_reference(prompt_text + parsed.head + parsed.gap, reference, parsed.tail, eos,
                               prefix_chars=len(prompt_text), block_start=len(prompt_text) + parsed.block,
                               span=span)
    if fallback == "free":
        reasoning = prompt_text + strip_response(response, eos)
        return _with_reference(reasoning + cue, reference, " " + ANSWER_CLOSE, eos, fallback=True,
                               prefix_chars=len(prompt_text), block_start=len(reasoning), span=span)
    if fallback != "none":
        raise ValueError(f"unknown invalid_fallback {fallback!r}; choose one of {', '.join(FALLBACKS)}")
    return None


def build_score_a_text(prompt_text: str, reference: str, eos: str, *, cue: str | None = None) -> ScoredText:
    """Q + " " + y* + " " + EOS (no reasoning, no tags); with the fallback cue: Q + cue + y* + " </answer>" + EOS."""
    if cue is None:
        return _with_reference(prompt_text + " ", reference, " ", eos, prefix_chars=len(prompt_text),
                               block_start=len(prompt_text))
    return _with_reference(prompt_text + cue, reference, " " + ANSWER_CLOSE, eos, fallback=True,
                           prefix_chars=len(prompt_text), block_start=len(prompt_text))


@dataclass
class TokenizedBatch:
    """Token ids per text and the boolean reference mask per text (same lengths)."""

    input_ids: list[list[int]]
    ref_mask: list[list[bool]]


def reference_mask(offsets: list[tuple[int, int]], start: int, end: int) -> list[bool]:
    """A token is scored iff its character span overlaps [start, end): " Paris" counts."""
    return [s < end and e > start and e > s for s, e in offsets]


def tokenize_scored(tokenizer, items: list[ScoredText], splice: str = "text") -> TokenizedBatch:
    """Tokenize o' texts (special-token text such as <|im_end|> becomes the special token).

    splice="text": the whole text at once; a token may span the end of the reasoning and the start
    of the answer block. splice="ids": the text before `block_start` (Q + reasoning) and the answer
    block are tokenized separately and their ids concatenated, so every token lies on one side and
    the reference tokens are those of the answer block alone (items without `block_start`: as text).
    """
    if splice not in SPLICES:
        raise ValueError(f"unknown splice {splice!r}; choose one of {', '.join(SPLICES)}")
    cut = [it.block_start if splice == "ids" and it.block_start is not None else None for it in items]
    texts = [it.text if c is None else it.text[:c] for it, c in zip(items, cut)]
    enc = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
    ids = [list(x) for x in enc["input_ids"]]
    offsets = [list(x) for x in enc["offset_mapping"]]
    split = [k for k, c in enumerate(cut) if c is not None]
    if split:
        blocks = tokenizer([items[k].text[cut[k]:] for k in split], add_special_tokens=False,
                           return_offsets_mapping=True)
        for k, more, off in zip(split, blocks["input_ids"], blocks["offset_mapping"]):
            ids[k] += list(more)
            offsets[k] += [(s + cut[k], e + cut[k]) for s, e in off]
    masks = [reference_mask(off, it.ref_start, it.ref_end) for off, it in zip(offsets, items)]
    return TokenizedBatch(ids, masks)


def reasoning_token_count(tokenizer, token_ids: list[int], chars: int) -> int:
    """How many leading tokens of `token_ids` decode (as the rollout decodes them, special tokens
    skipped) to at most `chars` characters: the tokens that end at or before character `chars`,
    a token that spans it excluded. Binary search over prefix lengths."""
    def length(k: int) -> int:
        return len(tokenizer.decode(token_ids[:k], skip_special_tokens=True))

    low, high = 0, len(token_ids)  # length(low) <= chars holds; find the largest such k
    if length(high) <= chars:
        return high
    while high - low > 1:
        mid = (low + high) // 2
        if length(mid) <= chars:
            low = mid
        else:
            high = mid
    return low


def pad_batch(sequences: list[list[int]], masks: list[list[bool]], pad_id: int,
              side: str = "right") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, target_mask) tensors [B, T], padded on `side`."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(sequences), width), dtype=torch.long)
    target = torch.zeros((len(sequences), width), dtype=torch.bool)
    for i, (seq, mask) in enumerate(zip(sequences, masks)):
        sl = slice(0, len(seq)) if side == "right" else slice(width - len(seq), width)
        ids[i, sl] = torch.tensor(seq, dtype=torch.long)
        attn[i, sl] = 1
        target[i, sl] = torch.tensor(mask, dtype=torch.bool)
    return ids, attn, target
