"""Training strategies: `trainer.strategy: ddp` (a full replica per process, gradients summed
once per optimizer step), `fsdp` (FSDP2 `fully_shard`: weights, gradients and optimizer states
sharded over the processes, ZeRO-3-like) or `deepspeed` (DeepSpeed ZeRO stage 1 or 2: optimizer
states, and with stage 2 gradients, sharded; full weights on every process).

FSDP all-gathers a module's weights in its forward and reduce-scatters its gradients in its
backward: collectives that every process must call in the same order. rlpr's processes do
unequal amounts of forward work (score A is cached per prompt, generation lengths differ, a
process may own no group). So the sharded model is used in two ways only:

- `gathered()`: no-grad phases (weight sync to the rollout copy, reward scoring, old/reference
  log-probs, evaluation). Every process all-gathers every module once on entry and frees the
  copies on exit; forwards inside do no collectives, so their number may differ per process.
  The cost: these phases hold the full weights, like DDP.
- `training()` + lock-step micro-batches: in the update every process runs the same number of
  forward/backward passes (`update.accumulate_gradients(lockstep=True)` pads with zero-weight
  micro-batches), each layer is gathered for its forward and backward only, and gradients are
  reduce-scattered with SUM (losses are normalised by global counts).

rlpr calls the decoder and the output layer directly (`forward.py`), not the root module's
forward, so the root group (embeddings, final norm, tied output layer) is gathered explicitly for
the update and stays gathered until its end.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext

import torch

from rlpr.parallel import distributed as dist
from rlpr.errors import ConfigError
from rlpr.model.forward import causal_lm
from rlpr.model.weights import merged_weights


class Replicated:
    """DDP-style: every process holds the whole model; one all-reduce per optimizer step."""

    lockstep = False
    autocast_cache = True  # reuse bf16 weight casts within an update (torch.autocast's cache)

    def attach(self, optimizer, params, grad_clip: float) -> None:
        """What `step` updates: the AdamW over `params`, clipping their gradient norm at `grad_clip`."""
        self.optimizer, self.params, self.grad_clip = optimizer, list(params), grad_clip

    def gathered(self):
        return nullcontext()

    def training(self):
        return nullcontext()

    def full_weights(self, policy):
        """(name, tensor) pairs of the policy's full weights, LoRA merged, for the rollout engine's
        sync; here every process holds them already."""
        yield from merged_weights(policy).items()

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def reduce_gradients(self, params) -> None:
        dist.sum_gradients(params)

    def step(self) -> float:
        """Sum the gradients over processes, clip, take the optimizer step; the norm before clipping."""
        self.reduce_gradients(self.params)
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip).item()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    def discard(self) -> None:
        """Drop the accumulated gradients without a step (algorithm.early_stop_ratio): the weights and
        the optimizer's state (moments, step count) stay as they were."""
        self.optimizer.zero_grad(set_to_none=True)

    def model_state(self, policy):
        """None: save the module itself."""
        return None

    def optimizer_state(self, policy, optimizer) -> dict:
        return optimizer.state_dict()

    def load_optimizer_state(self, policy, optimizer, state: dict) -> None:
        check_optimizer_state(optimizer, state)  # torch checks the counts only; a wrong shape failed steps later
        optimizer.load_state_dict(state)

    def load_weights_context(self):
        return nullcontext()


def check_optimizer_state(optimizer, state) -> None:
    """A saved AdamW state must fit the weights it will update: one entry per trainable weight, each
    tensor (the moments) of its weight's shape. torch's load_state_dict checks only the counts, so a
    moment of another shape loaded and the first optimizer step failed with a traceback; now it is a
    CorruptCheckpoint, and `--resume` falls back to the previous checkpoint (issue 43)."""
    from rlpr.model.checkpoint_files import CorruptCheckpoint

    params = [p for group in optimizer.param_groups for p in group["params"]]
    groups, per_param = state.get("param_groups"), state.get("state")
    if not isinstance(groups, list) or not isinstance(per_param, dict) \
            or not all(isinstance(g, dict) and isinstance(g.get("params"), list) for g in groups):
        raise CorruptCheckpoint("malformed optimizer state (no param_groups or state)")
    ids = [i for g in groups for i in g["params"]]
    if len(ids) != len(params):
        raise CorruptCheckpoint(f"optimizer state for {len(ids)} weights; the model trains {len(params)}")
    for i, p in zip(ids, params):
        entry = per_param.get(i, {})
        if not isinstance(entry, dict):
            raise CorruptCheckpoint(f"malformed optimizer state of weight {i}")
        for name, value in entry.items():
            if isinstance(value, torch.Tensor) and value.dim() and value.shape != p.shape:
                raise CorruptCheckpoint(f"optimizer state {name} of weight {i} has shape {tuple(value.shape)}, "
                                        f"the weight {tuple(p.shape)}")


def decoder_layers(lm) -> list[torch.nn.Module]:
    """The transformer blocks of a HF causal LM (Llama, Qwen, Mistral, Gemma, SmolLM...)."""
    layers = getattr(lm.get_decoder(), "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or not len(layers):
        raise ConfigError(f"trainer.strategy=fsdp: cannot find the decoder layers of {type(lm).__name__}")
    return list(layers)


class FullySharded(Replicated):
    """FSDP2 over all processes: one group per decoder layer and one for the rest (the root)."""

    lockstep = True
    # autocast's cache keeps the bf16 cast of a gathered weight from one micro-batch for the next,
    # across FSDP's reshard/re-gather: gradients then went missing (grad norm 0.28 instead of 0.34
    # on the demo's first step; tests/test_fsdp.py). Each forward re-casts instead.
    autocast_cache = False

    def __init__(self, policy, cpu_offload: bool = False):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

        device = next(policy.parameters()).device
        mesh = init_device_mesh(device.type, (dist.world_size(),))
        lm = causal_lm(policy)
        # trainer.cpu_offload: FSDP2 keeps the shards (weights, gradients, AdamW states) on the CPU
        # and runs the optimizer step there; each layer is copied to the device for its gather
        offload = CPUOffloadPolicy(pin_memory=device.type == "cuda") if cpu_offload else OffloadPolicy()
        self.layers = [fully_shard(layer, mesh=mesh, offload_policy=offload) for layer in decoder_layers(lm)]
        self.root = fully_shard(lm, mesh=mesh, offload_policy=offload)
        for module in (*self.layers, self.root):
            # rlpr normalises losses by global counts: it needs the SUM over processes, not the mean
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
            # a trainable weight without a gradient on one process must not desynchronise the rest
            module.set_reduce_scatter_unused_params(True, recurse=False)
        self.root.set_reshard_after_backward(False, recurse=False)
        self._depth = 0
        # FSDP picks its root at the first forward: run one through the real root, on every process
        with torch.no_grad():
            lm(input_ids=torch.zeros((1, 1), dtype=torch.long, device=device), use_cache=False)
        self.root.reset_iter_state()

    @contextmanager
    def gathered(self):
        """Full weights on every process for forwards without backward (re-entrant)."""
        self._depth += 1
        if self._depth == 1:
            for module in (*self.layers, self.root):
                module.set_reshard_after_forward(False, recurse=False)
                module.unshard()
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                for module in self.layers:
                    module.set_reshard_after_forward(True, recurse=False)
                # reshards everything and forgets the forward order recorded by this phase's
                # forwards (their number differs per process; backward prefetching reads it)
                self.root.reset_iter_state()

    def full_weights(self, policy):
        """The full weights for the rollout engine's sync, gathered one decoder layer at a time:
        each layer is all-gathered, its (name, tensor) pairs yielded for the engine to copy, and
        resharded before the next; the root group (embeddings, final norm, output layer) stays
        gathered throughout. So the sync never holds the whole model gathered beside the engine's
        copy. Every process must consume it whole and in step (the gathers are collectives)."""
        lm = causal_lm(policy)
        names = {id(module): name for name, module in lm.named_modules()}
        prefixes = [names[id(layer)] for layer in self.layers]

        def under(prefix):
            return lambda name: name == prefix or name.startswith(prefix + ".")

        self.root.unshard()
        try:
            for layer, prefix in zip(self.layers, prefixes):
                layer.unshard()
                yield from merged_weights(policy, under(prefix)).items()
                layer.reshard()
            yield from merged_weights(policy, lambda name: not any(under(p)(name) for p in prefixes)).items()
        finally:
            self.root.reshard()

    @contextmanager
    def training(self):
        """The update: the root group gathered throughout, layers gathered per forward/backward."""
        self.root.unshard()
        try:
            yield
        finally:
            self.root.reset_iter_state()

    def reduce_gradients(self, params) -> None:
        """Nothing to do: FSDP reduce-scattered (summed) them in every backward."""

    def model_state(self, policy) -> dict:
        """The full trainable state (a LoRA adapter, or all weights) on process 0, on CPU."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
        state = get_model_state_dict(policy, options=options)
        # a tied weight once, under its first name, as the unsharded module's save would write it
        names = {n for n, _ in policy.named_parameters()} | {n for n, _ in policy.named_buffers()}
        return {k: v for k, v in state.items() if k in names}

    def optimizer_state(self, policy, optimizer) -> dict:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_optimizer_state_dict(policy, optimizer, options=options)

    def load_optimizer_state(self, policy, optimizer, state: dict) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(policy, optimizer, state, options=StateDictOptions(full_state_dict=True))

    def load_weights_context(self):
        """Loading full tensors into sharded parameters: each process keeps its own slice."""
        from torch.distributed.tensor.experimental import implicit_replication

        return implicit_replication()


class DeepSpeedZero(Replicated):
    """DeepSpeed ZeRO stage 1 (AdamW states sharded) or 2 (gradients too) over all processes.

    Every process keeps the full fp32 weights (DeepSpeed all-gathers them after each optimizer
    step), so the no-grad phases need no gathering. DeepSpeed runs in fp32; bf16 comes from the
    trainer's autocast, as with ddp. Its engine is used for the backward passes and the step
    only: rlpr calls the decoder and the output layer itself (`forward.py`), not `engine(...)`.
    """

    # stage 2 reduce-scatters gradients in every backward: collectives every process must call
    # in step, so every process runs as many micro-batches as the busiest one
    lockstep = True

    def __init__(self, policy, stage: int, cpu_offload: bool = False):
        self.policy, self.stage, self.cpu_offload = policy, stage, cpu_offload

    def attach(self, optimizer, params, grad_clip: float) -> None:
        """Wrap the trainer's AdamW (its param groups, so the LambdaLR schedule, stay the same)."""
        deepspeed = _import_deepspeed()
        config = {
            # rlpr splits and accumulates micro-batches itself: `step` is the accumulation boundary
            "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
            "managed_gradient_accumulation": False,
            "zero_optimization": {"stage": self.stage, **self._offload()}, "zero_allow_untested_optimizer": True,
            "gradient_clipping": grad_clip, **self._client_optimizer(),
        }
        self.engine, *_ = deepspeed.initialize(model=self.policy, optimizer=optimizer, config=config,
                                               dist_init_required=False)

    def _offload(self) -> dict:
        """trainer.cpu_offload: ZeRO-Offload keeps the fp32 master weights' shard and the AdamW
        states on the CPU, where the step runs; rlpr's own AdamW (torch's, not DeepSpeedCPUAdam,
        whose C++ op would be compiled on first use) does the step."""
        if not self.cpu_offload:
            return {}
        return {"offload_optimizer": {"device": "cpu", "pin_memory": torch.cuda.is_available()}}

    def _client_optimizer(self) -> dict:
        """ZeRO-Offload refuses a client optimizer unless told: rlpr's AdamW keeps its exact
        semantics (and needs no compiled op); DeepSpeedCPUAdam would step faster on the CPU."""
        return {"zero_force_ds_cpu_optimizer": False} if self.cpu_offload else {}

    def backward(self, loss: torch.Tensor) -> None:
        # DeepSpeed averages gradients over processes; rlpr's losses are normalised by global
        # counts and need the sum
        self.engine.backward(loss * dist.world_size(), scale_wrt_gas=False)

    def step(self) -> float:
        """Reduce, clip at trainer.grad_clip, AdamW step, zero the gradients (all DeepSpeed's)."""
        self.engine.step()
        return float(self.engine.get_global_grad_norm())

    def optimizer_state(self, policy, optimizer) -> list[dict] | None:
        """Every process's ZeRO state (its shard of the AdamW states and fp32 weights) on process 0,
        which saves them; None on the others. Plain data only (checkpoints load with
        weights_only=True): DeepSpeed's LossScaler object and its parameter-slice map are left out;
        its loader keeps the engine's own loss scaler when the key is absent (a static scale of 1
        for rlpr's fp32/bf16 training) and never reads the map; the ZeRO stage enum is saved as its
        int (also never read back)."""
        import enum

        from deepspeed.checkpoint.constants import LOSS_SCALER, PARAM_SLICE_MAPPINGS

        state = {k: (v.value if isinstance(v, enum.Enum) else v)
                 for k, v in self.engine.optimizer.state_dict().items()
                 if k not in (LOSS_SCALER, PARAM_SLICE_MAPPINGS)}
        return dist.gather_to_main(state)

    def load_optimizer_state(self, policy, optimizer, state: list[dict]) -> None:
        self.engine.optimizer.load_state_dict(state, load_from_fp32_weights=True)


def _import_deepspeed():
    """DeepSpeed, without its shared-memory all-reduce kernel.

    That kernel serves DeepSpeed's inference all-reduce only (not ZeRO), and on a CPU machine its
    first use compiles C++ for 40-70 s per process. DeepSpeed has no switch for it: marking the
    op incompatible in its op table makes `TorchBackend` skip the build. (That DeepSpeed is
    installed is checked when the configuration loads.)
    """
    import deepspeed

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    return deepspeed


# trainer.strategy -> how to build it from (policy, zero_stage, cpu_offload); the configuration's allowed values
STRATEGIES = {
    "ddp": lambda policy, zero_stage, cpu_offload: Replicated(),
    "fsdp": lambda policy, zero_stage, cpu_offload: FullySharded(policy, cpu_offload),
    "deepspeed": lambda policy, zero_stage, cpu_offload: DeepSpeedZero(policy, zero_stage, cpu_offload),
}
OFFLOADING = ("fsdp", "deepspeed")  # the strategies that take trainer.cpu_offload


def make_strategy(name: str, policy, zero_stage: int = 2, cpu_offload: bool = False):
    """`ddp` (the default), `fsdp` or `deepspeed`; with one process nothing is sharded and all
    three run as ddp. An unknown name is an error (it used to fall through to ddp)."""
    if name not in STRATEGIES:
        raise ValueError(f"unknown trainer.strategy {name!r}; choose one of {', '.join(STRATEGIES)}")
    if dist.world_size() == 1:
        return Replicated()
    return STRATEGIES[name](policy, zero_stage, cpu_offload)
