"""The memory terms of the training states that outlive a phase: weights, AdamW, gradients, copies.

What one process keeps through a step (or from the first backward of an update to its optimizer
step) depends mainly on the strategy (ddp, fsdp, DeepSpeed ZeRO-1/2), the number of processes and
trainer.cpu_offload: the fp32 master weights, AdamW's moments and DeepSpeed's master partition, the
gradients and DeepSpeed's reduction bucket, the optimizer step's temporaries, the reference and
EMA-lagged copies, and the runtime baseline of the process itself. These are the terms of
rlpr/parallel/memory_plan.py that the strategy (rlpr/parallel/sharding.py) shapes and the batch
sizes do not move; each function's docstring says why its term exists and its formula. Pure
arithmetic on rlpr.parallel.memory_types.
"""

from __future__ import annotations

from rlpr.parallel.memory_types import ALL, FP32, GiB, Architecture, Setup, Term, _count

# DeepSpeed ZeRO-1/2's contiguous gradient bucket (its default reduce_bucket_size, in elements),
# allocated whole with torch.empty on a GPU
DEEPSPEED_BUCKET_ELEMENTS = 500_000_000
# CPU: the process before any model (Python, torch, transformers, peft, the tokenizer, tensorboard,
# the grader): measured here as RSS after importing rlpr's trainer and loading the embedded
# tokenizer (benchmarks/memory_plan.py measures it again on each run of the benchmark)
CPU_RUNTIME_BYTES = int(0.45 * GiB)
# GPU: the CUDA context, cuBLAS/cuDNN workspaces and NCCL's buffers of one process: an estimate
# (no GPU was available to measure it), added on GPUs only
CUDA_RUNTIME_BYTES = int(1.0 * GiB)


def weights(arch: Architecture, s: Setup) -> Term:
    """The policy's fp32 master weights, 4 B x P: ddp and deepspeed keep all of them on every process
    (DeepSpeed ZeRO-1/2 shards states, not weights); fsdp keeps a 1/N shard (4 B x P / N), which
    trainer.cpu_offload moves to CPU memory (FSDP2's CPUOffloadPolicy). LoRA's base weights are
    frozen fp32 and sharded the same way; the adapter is counted with them."""
    total = FP32 * (arch.params + (arch.lora_params if s.lora else 0))
    if s.strategy == "fsdp" and s.processes > 1:
        shard = total / s.processes
        if s.offloaded:
            return Term("weights (fp32, fsdp shard)", 0.0, ALL, f"4 B x {_count(total / 4)} / {s.processes} on the CPU",
                        host=shard)
        return Term("weights (fp32, fsdp shard)", shard, ALL, f"4 B x {_count(total / 4)} params / {s.processes}")
    return Term("weights (fp32)", total, ALL, f"4 B x {_count(total / 4)} params")


def optimizer_states(arch: Architecture, s: Setup) -> list[Term]:
    """AdamW's two fp32 moments, 8 B x T, kept between steps: whole under ddp, 1/N under fsdp and
    DeepSpeed ZeRO-1/2; DeepSpeed also keeps an fp32 master copy of its partition (4 B x T / N,
    `single_partition_of_fp32_groups`). trainer.cpu_offload keeps them in CPU memory (0 on the GPU;
    on a CPU device they stay in the same memory)."""
    t = arch.trainable(s.lora)
    n = s.processes if s.sharded else 1
    states = 2 * FP32 * t / n
    share = f" / {n}" if n > 1 else ""
    out = []
    if s.offloaded and s.device == "cuda":
        out.append(Term("optimizer states (AdamW, 2 x fp32)", 0.0, ALL, f"8 B x {_count(t)}{share} on the CPU",
                        host=states))
    else:
        out.append(Term("optimizer states (AdamW, 2 x fp32)", states, ALL, f"8 B x {_count(t)} trainable{share}"))
    if s.strategy == "deepspeed" and s.processes > 1:
        master = FP32 * t / n
        on_gpu = not (s.offloaded and s.device == "cuda")
        out.append(Term("DeepSpeed fp32 master partition", master if on_gpu else 0.0, ALL,
                        f"4 B x {_count(t)} / {n}" + ("" if on_gpu else " on the CPU"), host=0.0 if on_gpu else master))
    return out


def gradients(arch: Architecture, s: Setup) -> list[Term]:
    """fp32 gradients of the trainable parameters, 4 B x T, from the first backward of an update to
    its optimizer step (rlpr zeroes them with set_to_none). ddp and ZeRO-1 hold them whole (ZeRO-1
    adds its reduced 1/N partition); fsdp and ZeRO-2 keep a 1/N shard (reduce-scattered in every
    backward). ZeRO-1/2 allocate a contiguous reduction bucket of 5e8 elements (fp32: 1.86 GiB) on
    a GPU; on a CPU only the pages written count, at most 4 B x T. With trainer.cpu_offload the
    shards move to CPU memory (ZeRO-1 still accumulates whole gradients on the GPU)."""
    t = arch.trainable(s.lora)
    n = s.processes
    upd = ("update", "step")
    if not s.sharded:
        return [Term("gradients (fp32)", FP32 * t, upd, f"4 B x {_count(t)} trainable")]
    out = []
    if s.strategy == "fsdp":
        shard = FP32 * t / n
        if s.offloaded and s.device == "cuda":
            out.append(Term("gradients (fp32, fsdp shard)", 0.0, upd, f"4 B x {_count(t)} / {n} on the CPU",
                            host=shard))
        else:
            out.append(Term("gradients (fp32, fsdp shard)", shard, upd, f"4 B x {_count(t)} / {n}"))
        return out
    offload_gpu = s.offloaded and s.device == "cuda"
    if s.zero_stage == 1:
        out.append(Term("gradients (fp32, ZeRO-1: whole)", FP32 * t, upd, f"4 B x {_count(t)} trainable"))
        part = FP32 * t / n
        out.append(Term("gradients (ZeRO-1 reduced partition)", 0.0 if offload_gpu else part, upd,
                        f"4 B x {_count(t)} / {n}", host=part if offload_gpu else 0.0))
    else:
        part = FP32 * t / n
        out.append(Term("gradients (fp32, ZeRO-2 partition)", 0.0 if offload_gpu else part, upd,
                        f"4 B x {_count(t)} / {n}" + (" on the CPU" if offload_gpu else ""),
                        host=part if offload_gpu else 0.0))
    bucket = FP32 * (DEEPSPEED_BUCKET_ELEMENTS if s.device == "cuda" else min(DEEPSPEED_BUCKET_ELEMENTS, t))
    out.append(Term("DeepSpeed gradient bucket", bucket, upd,
                    "4 B x 5e8 (reduce_bucket_size)" if s.device == "cuda" else f"4 B x min(5e8, {_count(t)})"))
    return out


def optimizer_step(arch: Architecture, s: Setup) -> Term:
    """The AdamW step's temporaries: on a GPU torch's foreach implementation builds the square roots
    of all second moments at once (4 B x T, over the process's shard); on a CPU it steps tensor by
    tensor (two temporaries of the largest trainable tensor). With trainer.cpu_offload the step runs
    in CPU memory."""
    t = arch.trainable(s.lora)
    n = s.processes if s.sharded else 1
    if s.device == "cpu":
        return Term("AdamW step temporaries", 2 * FP32 * arch.largest_param, ("step",),
                    f"2 x 4 B x {_count(arch.largest_param)} (largest tensor)")
    if s.offloaded:
        return Term("AdamW step temporaries", 0.0, ("step",), "on the CPU", host=FP32 * t / n)
    return Term("AdamW step temporaries", FP32 * t / n, ("step",), f"4 B x {_count(t)}" + (f" / {n}" if n > 1 else ""))


def reference_copy(arch: Architecture, s: Setup) -> Term | None:
    """Full fine-tuning with algorithm.kl_coef > 0 or reward.scorer=initial keeps a frozen fp32 copy of
    the initial policy, whole on every process (rlpr/train/setup.py reference_copy; with LoRA the
    reference is the adapter-off base and costs nothing): 4 B x P."""
    if not s.reference_copy:
        return None
    return Term("reference copy (fp32)", FP32 * arch.params, ALL, f"4 B x {_count(arch.params)}")


def lagged_copy(arch: Architecture, s: Setup) -> Term | None:
    """reward.scorer=ema or score_a=ema: an EMA of the trainable weights (rlpr/reward/lagged.py), 4 B x T."""
    if not s.lagged_copy:
        return None
    t = arch.trainable(s.lora)
    return Term("EMA-lagged weights (fp32)", FP32 * t, ALL, f"4 B x {_count(t)}")


def runtime(s: Setup) -> Term | None:
    """CPU only: the process before any model (Python, torch, transformers, the tokenizer), measured;
    on GPUs an estimate of the CUDA context, library workspaces and NCCL buffers."""
    if s.device == "cpu":
        b = CPU_RUNTIME_BYTES if s.runtime_bytes is None else s.runtime_bytes
        return Term("runtime (CPU process baseline)", b, ALL, "measured: imports + tokenizer")
    b = CUDA_RUNTIME_BYTES if s.runtime_bytes is None else s.runtime_bytes
    return Term("cuda runtime (context, NCCL; estimate)", b, ALL, "estimate, not measured")
