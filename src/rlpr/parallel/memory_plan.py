"""Memory per process of an rlpr training run, computed before the run (`rlpr plan`).

Pure arithmetic: no torch, no files. An `Architecture` (the model's shapes and exact parameter
counts, read from its config.json by `rlpr.model.architecture`) and a `Setup` (the settings of a
`Config` that move memory, resolved for a number of processes and a device) give a `Plan`: a list
of `Term`s, each the bytes one process holds for one reason, with the phases of a training step in
which it is held. A step passes through five phases, one after the other:

- ``sync``: the policy's weights (LoRA merged) are copied into the rollout engine;
- ``rollout``: responses are sampled (also the held-out evaluation's generation);
- ``scoring``: forwards without backward: score B and A, old and reference log-probs;
- ``update``: forwards and backwards over micro-batches (the activations);
- ``step``: the AdamW step (the activations are gone, the gradients and the step's temporaries not).

The peak of a process is the largest phase total, not the sum of every term (the KV cache is gone
before the update's activations exist). Each term's function says why its term exists in rlpr's
implementation (docs/distributed.md) and its formula; B is bytes, P the model's parameters, T the
trainable ones (P under full fine-tuning, the LoRA adapter's otherwise), N the processes.

This module puts the terms together (`plan`), compares strategies (`alternatives`, `recommend`,
`smaller_batches`) and is the one place the rest of rlpr imports from; the parts live beside it,
arrows running down: memory_types.py (units, phases, `Architecture`, `Setup`, `Term`, `Plan`),
memory_states.py (weights, optimizer states, gradients, copies, runtime), memory_rollout.py (the
rollout engine), memory_activations.py (the update's activations and the no-grad forwards) and
memory_setup.py (a Config's `Setup`). Every name they define is importable from here.

What is not modelled: allocator caching and fragmentation (PyTorch's CUDA caching allocator, glibc
arenas on CPU), kernels' workspaces, NCCL's buffers (one estimated `cuda runtime` line on GPUs) and
Python objects (one measured `runtime` line on CPU). docs/memory-plan.md holds the comparison with
measured peaks.
"""

from __future__ import annotations

from dataclasses import replace

from rlpr.parallel.memory_activations import (  # noqa: F401 (re-exported: rlpr.parallel.memory_plan.NAME)
    LOGIT_CHUNK, SOFTMAX_ROWS, MicroBatch, _full_layer_bytes, _layer_saved_per_kv, _layer_saved_per_token,
    _mask_bytes, _no_grad_bytes, activations, fsdp_update_gathers, micro_batch, scoring, weight_casts)
from rlpr.parallel.memory_rollout import (  # noqa: F401 (re-exported)
    decode_working_set, kept_caches, kv_cache, prompt_prefills, rollout_copy, rollout_kv_rows, sync_transient,
    vllm_engine)
from rlpr.parallel.memory_setup import keeps_caches, setup_from_config  # noqa: F401 (re-exported)
from rlpr.parallel.memory_states import (  # noqa: F401 (re-exported)
    CPU_RUNTIME_BYTES, CUDA_RUNTIME_BYTES, DEEPSPEED_BUCKET_ELEMENTS, gradients, lagged_copy, optimizer_states,
    optimizer_step, reference_copy, runtime, weights)
from rlpr.parallel.memory_types import (  # noqa: F401 (re-exported)
    ALL, BF16, FIT_MARGIN, FP32, PHASES, Architecture, GiB, Plan, Setup, Term, _count, gib, verdict)


def plan(arch: Architecture, s: Setup) -> Plan:
    """Every term of one process's memory for this architecture and setup."""
    terms: list[Term | None] = [runtime(s), weights(arch, s), *optimizer_states(arch, s), reference_copy(arch, s),
                                lagged_copy(arch, s), rollout_copy(arch, s), *vllm_engine(arch, s),
                                sync_transient(arch, s), kv_cache(arch, s), *kept_caches(arch, s),
                                prompt_prefills(arch, s), decode_working_set(arch, s),
                                *scoring(arch, s), *gradients(arch, s), optimizer_step(arch, s),
                                *fsdp_update_gathers(arch, s), weight_casts(arch, s), *activations(arch, s)]
    return Plan(arch, s, [t for t in terms if t is not None])


# the alternatives `rlpr plan` compares, least communication first (the order of preference)
STRATEGY_CHOICES: tuple[tuple[str, int, bool], ...] = (
    ("ddp", 2, False), ("deepspeed", 1, False), ("deepspeed", 2, False), ("fsdp", 2, False),
    ("deepspeed", 2, True), ("fsdp", 2, True),
)


def alternatives(arch: Architecture, s: Setup) -> list[tuple[Setup, Plan, Plan]]:
    """(setup, plan without checkpointing, plan with it) for each strategy of STRATEGY_CHOICES; one
    row (ddp) with a single process, where every strategy runs as ddp."""
    choices = STRATEGY_CHOICES if s.processes > 1 else (("ddp", 2, False),)
    out = []
    for strategy, stage, offload in choices:
        alt = replace(s, strategy=strategy, zero_stage=stage, cpu_offload=offload)
        off = replace(alt, gradient_checkpointing=False, share_prefix=s.share_prefix or s.gradient_checkpointing)
        on = replace(alt, gradient_checkpointing=True)
        out.append((alt, plan(arch, off), plan(arch, on)))
    return out


def recommend(rows: list[tuple[Setup, Plan, Plan]]) -> tuple[Setup, bool, Plan] | None:
    """The first setting that FITS, in STRATEGY_CHOICES order, without checkpointing before with it
    (each costs time: sharding in communication and lock-step micro-batches, checkpointing a second
    forward); else the first that is TIGHT; None when nothing fits."""
    for wanted in ("FITS", "TIGHT"):
        for setup, off, on in rows:
            for ckpt, p in ((False, off), (True, on)):
                if p.verdict() == wanted:
                    return setup, ckpt, p
    return None


def _halvings(value: int, floor: int) -> list[int]:
    out = [value]
    while out[-1] // 2 >= floor:
        out.append(out[-1] // 2)
    return out


def smaller_batches(arch: Architecture, s: Setup) -> tuple[dict, tuple[Setup, bool, Plan]] | None:
    """When no strategy fits as configured: the largest rollout batch (rollout.batch_sequences,
    halved) and then the largest update token budget (trainer.micro_batch_tokens, halved, down to one
    full-length sequence) with which one does; ({key: value}, `recommend`'s answer), or None."""
    length = s.prompt_tokens + s.response_tokens
    budgets = _halvings(s.micro_tokens, length) if s.micro_tokens else [0]
    for rows in _halvings(s.rollout_rows, 1):
        for budget in budgets:
            alt = replace(s, rollout_rows=rows, eval_rows=min(s.eval_rows, rows), micro_tokens=budget)
            best = recommend(alternatives(arch, alt))
            if best is not None and best[2].verdict() == "FITS":
                changes = {}
                if rows != s.rollout_rows:
                    changes["rollout.batch_sequences"] = rows
                if budget != s.micro_tokens:
                    changes["trainer.micro_batch_tokens"] = budget
                return changes, best
    return None
