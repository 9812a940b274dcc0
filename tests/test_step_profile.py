"""rlpr/rollout/step_profile.py: what a decode step of the static loop spends its time on, by class,
from torch.profiler's ops on the CPU (on a GPU the same code reads kernels: benchmarks/gpubench/decode.py)."""

import copy

import pytest
import torch
from transformers import AttentionInterface

from rlpr.rollout import graph_decode, step_profile
from rlpr.rollout.sampling import PerRowSampler

pytestmark = pytest.mark.unit


def test_a_profiled_step_has_every_class_and_leaves_the_model_as_it_was(tiny_model):
    """A frozen copy (the rollout engine's: its step runs on the fused products, fused_step.py)."""
    tiny_model = copy.deepcopy(tiny_model).requires_grad_(False)
    ids = torch.randint(10, 1000, (4, 12), generator=torch.Generator().manual_seed(0))
    attention = AttentionInterface()[graph_decode.DECODE_ATTENTION]
    hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in tiny_model.modules())
    out = step_profile.profile_decode(tiny_model, ids, torch.ones_like(ids), lambda: PerRowSampler([1, 2, 3, 4]),
                                      steps=3, eos=-1, pad=0)
    assert out["steps"] == 3 and out["rows"] == 4 and out["ops_per_step"] > 50
    for cls in ("projections", "output_layer", "attention", "norms", "rotary", "sampling", "copies", "other", "host"):
        assert out["class_ms_per_step"][cls] > 0, cls
    assert abs(sum(out["class_share"].values()) - 1) < 1e-9
    assert 0 < out["matrix_ms_per_step"] < out["busy_ms_per_step"] and 0 < out["non_matrix_share"] < 1
    assert any(o["op"] in step_profile.MATRIX_OPS for o in out["top_ops"])
    # the scopes are gone: the attention function, the step and the modules' hooks are the loop's own
    assert AttentionInterface()[graph_decode.DECODE_ATTENTION] is attention
    assert graph_decode._step.__name__ == "_step"
    assert sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in tiny_model.modules()) == hooks


@pytest.mark.parametrize("op,scope,cls", [
    ("aten::mm", "projections", "projections"), ("aten::bmm", "attention", "attention"),
    ("aten::mul", "attention_module", "rotary"), ("aten::index_copy_", "attention_module", "copies"),
    ("aten::add", "model", "other"), ("aten::_to_copy", "model", "copies"),
    ("aten::searchsorted", None, "sampling"), ("aten::index_put_", None, "copies"), ("aten::mean", "norms", "norms")])
def test_op_classes(op, scope, cls):
    assert step_profile.op_class(op, scope) == cls
