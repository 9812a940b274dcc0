"""Frozen weights held in bf16 for a bf16-autocast update: the same numbers as autocast's
per-forward casts, and the fp32 weights back afterwards."""

import pytest
import torch

from rlpr.config import load_config
from rlpr.model.loading import load_model
from rlpr.model.precision import frozen_linear_weights_in, update_autocast, update_precision
from rlpr.train.setup import build_policy
from rlpr.train.trainer import train

from helpers import adapter_tensors, tiny_cfg

pytestmark = pytest.mark.integration


def test_frozen_linear_weights_are_bf16_inside_and_restored_after(tiny_dir):
    cfg = load_config("demo", [f"model.path={tiny_dir}"])
    policy = build_policy(cfg, load_model(tiny_dir)[0])
    before = {n: (p.data_ptr(), p.dtype) for n, p in policy.named_parameters()}
    with frozen_linear_weights_in(policy, torch.bfloat16) as swapped:
        dtypes = {n: p.dtype for n, p in policy.named_parameters()}
    assert swapped == 2 * 7  # 2 layers x q, k, v, o, gate, up, down (the output layer is the tied embedding)
    assert all(dtypes[n] == torch.bfloat16 for n in dtypes if "base_layer" in n)
    assert all(dtypes[n] == torch.float32 for n in dtypes if "lora_" in n or "embed" in n or "norm" in n)
    assert {n: (p.data_ptr(), p.dtype) for n, p in policy.named_parameters()} == before


def test_training_with_bf16_frozen_weights_equals_per_forward_casts(tiny_dir, tmp_path):
    """Two bf16 steps with LoRA and the KL term (the adapter-off reference pass): bit-identical adapters."""
    runs = {}
    for on in ("true", "false"):
        train(tiny_cfg(tiny_dir, tmp_path, f"frozen_{on}", "trainer.max_steps=2", "data.val=", "trainer.mixed_precision=bf16",
                       "algorithm.kl_coef=0.1", f"trainer.bf16_frozen_weights={on}"))
        runs[on] = adapter_tensors(tmp_path / f"frozen_{on}")
    assert runs["true"].keys() == runs["false"].keys()
    assert any("lora_B" in k and v.abs().sum() > 0 for k, v in runs["true"].items())
    for k in runs["true"]:
        torch.testing.assert_close(runs["true"][k], runs["false"][k], rtol=0, atol=0)


@pytest.mark.parametrize("dropout", [0.0, 0.5])
def test_lora_inputs_left_in_bf16_under_autocast_change_no_gradient(tiny_dir, dropout):
    """update_precision skips peft's cast of each adapter's input to fp32 (autocast casts it back):
    the loss and every adapter gradient bit-identical to update_autocast's (with dropout too, same seed),
    the cast disabled only inside the block and only under autocast."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    cfg = load_config("demo", [f"model.path={tiny_dir}", f"model.lora_dropout={dropout}"])
    policy = build_policy(cfg, load_model(tiny_dir)[0]).train()
    ids = torch.randint(0, 100, (3, 12))
    cpu = torch.device("cpu")

    def grads(context):
        policy.zero_grad(set_to_none=True)
        torch.manual_seed(0)
        with context:
            loss = policy(input_ids=ids).logits.float().logsumexp(-1).mean()
            loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}

    def casting():
        return {m.cast_input_dtype_enabled for m in policy.modules() if isinstance(m, BaseTunerLayer)}

    loss_cast, cast = grads(update_autocast("bf16", cpu))
    with update_precision(policy, "bf16", cpu):
        assert casting() == {False}
    with update_precision(policy, "none", cpu):
        assert casting() == {True}  # fp32 weights and inputs: nothing to skip
    loss_kept, kept = grads(update_precision(policy, "bf16", cpu))
    assert casting() == {True}
    assert torch.equal(loss_cast, loss_kept) and cast.keys() == kept.keys() and any("lora_A" in n for n in cast)
    for n in cast:
        assert torch.equal(cast[n], kept[n]), n


def test_auto_precision_follows_the_hardware(monkeypatch):
    """bf16 only where it is fast: 3-6x slower than fp32 on a CPU without AVX512-BF16/AMX."""
    import torch

    from rlpr.model import precision

    cpu = torch.device("cpu")
    for fast in (True, False):
        monkeypatch.setattr(precision, "cpu_has_fast_bf16", lambda fast=fast: fast)
        assert precision.resolve_rollout_dtype("auto", cpu) == (torch.bfloat16 if fast else torch.float32)
        assert precision.resolve_mixed_precision("auto", cpu) == ("bf16" if fast else "none")
    assert precision.resolve_rollout_dtype("float32", cpu) == torch.float32
    assert precision.resolve_mixed_precision("bf16", cpu) == "bf16"


def test_a_capped_instruction_set_counts_as_slow_bf16(monkeypatch):
    """ATEN_CPU_CAPABILITY / ONEDNN_MAX_CPU_ISA below AVX512-BF16 make bf16 the slow path on any CPU."""
    from rlpr.model import precision

    for name in precision.ISA_CAP_VARS:  # the suite itself may run capped (an emulated AVX2 laptop)
        monkeypatch.delenv(name, raising=False)
    capped = precision.isa_capped_below_bf16
    assert not capped({}) and not capped({"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "ALL"})
    for env in ({"ATEN_CPU_CAPABILITY": "avx2"}, {"ATEN_CPU_CAPABILITY": "default"}, {"ONEDNN_MAX_CPU_ISA": "AVX2"},
                {"DNNL_MAX_CPU_ISA": "avx512_core_vnni"}, {"ONEDNN_MAX_CPU_ISA": "AVX2_VNNI_2"}):
        assert capped(env), env
    assert capped(precision.AVX2_LAPTOP) and set(precision.AVX2_LAPTOP) <= set(precision.ISA_CAP_VARS)
    for isa in ("AVX512_CORE_BF16", "avx512_core_amx", "AVX10_1_512", "AVX512_CORE_FP16", "default"):
        assert not capped({"ONEDNN_MAX_CPU_ISA": isa}), isa
    monkeypatch.setattr(precision, "_hardware_bf16", lambda: True)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert not precision.cpu_has_fast_bf16()
    assert precision.resolve_rollout_dtype("auto", torch.device("cpu")) == torch.float32
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    assert precision.cpu_has_fast_bf16()


def test_building_the_lora_policy_warns_nothing(tiny_dir):
    """peft 0.21 reads transformers 5's deprecated `is_gradient_checkpointing`: a FutureWarning
    every `rlpr train` printed to users; build_policy silences exactly that one."""
    import warnings

    cfg = load_config("demo", [f"model.path={tiny_dir}"])
    model = load_model(tiny_dir)[0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        policy = build_policy(cfg, model)
    assert [str(w.message) for w in caught if "is_gradient_checkpointing" in str(w.message)] == []
    assert any("lora_" in n for n, _ in policy.named_parameters())
