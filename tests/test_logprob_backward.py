"""The output layer's log-prob + entropy with its backward written out (rlpr/model/forward.py) against
autograd through the same ops, and both against fp64."""

import copy

import pytest
import torch

import rlpr.model.forward as forward

pytestmark = pytest.mark.unit


def _head_grads(model, hidden0, targets, weights, temperature, with_entropy, fused, dtype=torch.float32):
    forward_was, forward.FUSED_BACKWARD = forward.FUSED_BACKWARD, fused
    try:
        model = copy.deepcopy(model).to(dtype)
        hidden = hidden0.detach().to(dtype).clone().requires_grad_(True)
        logp, ent = forward.project_logprobs(model, hidden, targets, temperature, with_entropy=with_entropy, chunk=16)
        loss = (weights.to(dtype) * logp).sum() - (0.3 * ent.sum() if with_entropy else 0.0)
        loss.backward()
        return logp.detach(), (ent.detach() if with_entropy else None), hidden.grad, model.lm_head.weight.grad
    finally:
        forward.FUSED_BACKWARD = forward_was


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("with_entropy", [True, False])
def test_written_out_backward_equals_autograd_through_the_softmax(tokenizer, temperature, with_entropy):
    """The same log-probs and entropies bit for bit (the same forward ops); gradients to the hidden states
    and the output layer within fp32 rounding of autograd's, both measured against fp64 autograd."""
    from rlpr.model.loading import tiny_llama

    model = tiny_llama(tokenizer, seed=3).train()
    g = torch.Generator().manual_seed(0)
    hidden0 = 3 * torch.randn(37, model.config.hidden_size, generator=g)  # spread logits: entropy far from log V
    targets = torch.randint(0, len(tokenizer), (37,), generator=g)
    weights = torch.randn(37, generator=g)
    ours = _head_grads(model, hidden0, targets, weights, temperature, with_entropy, fused=True)
    theirs = _head_grads(model, hidden0, targets, weights, temperature, with_entropy, fused=False)
    exact = _head_grads(model, hidden0, targets, weights, temperature, with_entropy, fused=False, dtype=torch.float64)
    assert torch.equal(ours[0], theirs[0]) and (not with_entropy or torch.equal(ours[1], theirs[1]))
    for a, b, ref in zip(ours[2:], theirs[2:], exact[2:]):
        ref = ref.float()
        scale = ref.abs().max().item()
        assert scale > 0
        assert (a - ref).abs().max() <= max(2 * (b - ref).abs().max().item(), 1e-6 * scale)


def test_the_fused_backward_is_what_the_update_takes_and_keeps_only_the_logits(tokenizer):
    """Under autograd the projection saves no fp32 [rows, vocab] tensor of its own (only the logits)."""
    from rlpr.model.loading import tiny_llama

    model = tiny_llama(tokenizer, seed=3).train()
    hidden = torch.randn(20, model.config.hidden_size, requires_grad=True)
    targets = torch.randint(0, len(tokenizer), (20,))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
        forward.project_logprobs(model, hidden, targets, with_entropy=True, recompute_head=False)
    assert sum(shape == (20, len(tokenizer)) for shape in saved) == 1, saved
