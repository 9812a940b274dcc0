"""Rollouts with Hugging Face `generate`, behind the small `RolloutEngine` interface.

The engine samples from its own copy of the policy, by default in bf16 (about 1.7x faster than
fp32 on CPU); `sync` copies the current fp32 master weights (LoRA merged) into it before each
step. Old log-probs are recomputed by the training model, so the rollout dtype only changes which
responses are sampled, never the loss.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Protocol

import torch

from rlpr.forward import causal_lm


@dataclass
class Rollout:
    """One sampled response: token ids (EOS included when the model stopped), and its text."""

    prompt_index: int
    token_ids: list[int]
    text: str
    finished: bool  # stopped at EOS (False: cut at max_new_tokens)


class RolloutEngine(Protocol):
    def sync(self, policy) -> None: ...

    def generate(self, prompts: list[list[int]], n: int, *, max_new_tokens: int, temperature: float,
                 top_p: float, seed: int) -> list[Rollout]: ...


def merged_weights(policy) -> dict[str, torch.Tensor]:
    """The policy's weights as a plain (un-wrapped) state dict, LoRA deltas merged in."""
    lm = causal_lm(policy)
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:  # pragma: no cover - peft is a dependency
        LoraLayer = ()
    out: dict[str, torch.Tensor] = {}
    lora_prefixes = []
    for name, module in lm.named_modules():
        if LoraLayer and isinstance(module, LoraLayer):
            weight = module.get_base_layer().weight.detach()
            if not getattr(module, "disable_adapters", False):
                for adapter in module.active_adapters:
                    if adapter in module.lora_A:
                        weight = weight + module.get_delta_weight(adapter).detach()
            out[f"{name}.weight"] = weight
            lora_prefixes.append(name + ".")
    for name, tensor in lm.state_dict().items():
        if any(name.startswith(p) for p in lora_prefixes):
            continue
        out.setdefault(name, tensor)
    return out


class HFRollout:
    """Sampling with `model.generate` on a (possibly lower-precision) copy of the policy."""

    def __init__(self, policy, tokenizer, dtype: torch.dtype = torch.bfloat16, batch_sequences: int = 32):
        self.tokenizer = tokenizer
        self.batch_sequences = batch_sequences
        self.model = copy.deepcopy(causal_lm(policy)).to(dtype).eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.sync(policy)

    @torch.no_grad()
    def sync(self, policy) -> None:
        """Copy the current policy weights (LoRA merged) into the sampling model."""
        target = self.model.state_dict()
        for name, tensor in merged_weights(policy).items():
            if name in target:
                target[name].copy_(tensor.to(target[name].dtype))

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], n: int, *, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, seed: int = 0) -> list[Rollout]:
        """n responses per prompt, grouped by prompt (prompt 0's n first). Deterministic in `seed`;
        temperature 0 decodes greedily."""
        from transformers import GenerationConfig

        eos = self.tokenizer.eos_token_id
        pad = self.tokenizer.pad_token_id
        sampling = dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=0) if temperature > 0 \
            else dict(do_sample=False)  # temperature 0: greedy
        gen_config = GenerationConfig(max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=pad,
                                      **sampling)
        flat = [(i, p) for i, p in enumerate(prompts) for _ in range(n)]
        out: list[Rollout] = []
        for b, start in enumerate(range(0, len(flat), self.batch_sequences)):
            chunk = flat[start:start + self.batch_sequences]
            width = max(len(p) for _, p in chunk)
            ids = torch.full((len(chunk), width), pad, dtype=torch.long)
            attn = torch.zeros_like(ids)
            for r, (_, p) in enumerate(chunk):
                ids[r, width - len(p):] = torch.tensor(p)
                attn[r, width - len(p):] = 1
            torch.manual_seed(seed * 100_003 + b)
            generated = self.model.generate(input_ids=ids, attention_mask=attn, generation_config=gen_config)
            for r, (i, _) in enumerate(chunk):
                tokens = generated[r, width:].tolist()
                finished = eos in tokens
                if finished:
                    tokens = tokens[:tokens.index(eos) + 1]
                text = self.tokenizer.decode(tokens, skip_special_tokens=True)
                out.append(Rollout(i, tokens, text, finished))
        return out
