"""The output-layer projection: the checkpointed, row-chunked softmax is bit-identical to the plain one."""

import pytest
import torch

from rlpr.model.forward import project_logprobs

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 0.8])
def test_checkpointed_softmax_rows_match_plain_values_and_gradients(tokenizer, bf16, temperature):
    from rlpr.model.loading import tiny_llama

    model = tiny_llama(tokenizer, seed=7).train()
    g = torch.Generator().manual_seed(0)
    hidden0 = torch.randn(23, model.config.hidden_size, generator=g)
    targets = torch.randint(0, len(tokenizer), (23,), generator=g)
    weights = torch.randn(23, generator=g)
    results = []
    for rows in (None, 4, 64):
        model.zero_grad(set_to_none=True)
        hidden = hidden0.clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logp, ent = project_logprobs(model, hidden, targets, temperature, with_entropy=True, chunk=10,
                                         softmax_rows=rows)
            loss = (weights * logp).sum() - 0.01 * ent.sum()
        loss.backward()
        head_grad = model.get_output_embeddings().weight.grad.clone()
        results.append((logp.detach(), ent.detach(), hidden.grad.clone(), head_grad))
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            nograd, _ = project_logprobs(model, hidden0, targets, temperature, chunk=10, softmax_rows=rows)
        assert torch.equal(nograd, logp.detach())  # the no-grad path (old log-probs, scores)
    plain, *chunked = results
    for got in chunked:
        for a, b in zip(plain, got):
            assert torch.equal(a, b)
    # the output layer recomputed in backward too (the default under gradient checkpointing): the
    # same values and gradients, up to the matmul's float summation order over fewer rows
    model.zero_grad(set_to_none=True)
    hidden = hidden0.clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logp, ent = project_logprobs(model, hidden, targets, temperature, with_entropy=True, chunk=10,
                                     softmax_rows=4, recompute_head=True)
        loss = (weights * logp).sum() - 0.01 * ent.sum()
    loss.backward()
    got = (logp.detach(), ent.detach(), hidden.grad, model.get_output_embeddings().weight.grad)
    for a, b in zip(plain, got):
        scale = a.abs().max().item()
        assert torch.allclose(a, b, rtol=0, atol=(2e-2 if bf16 else 1e-5) * max(scale, 1.0)), (a - b).abs().max()


def test_recomputed_output_layer_keeps_no_logits_for_backward(tokenizer):
    """With the output layer recomputed, what autograd saves for the projection is the hidden states
    only: no [rows, vocab] tensor."""
    from rlpr.model.loading import tiny_llama

    model = tiny_llama(tokenizer, seed=7).train()
    hidden = torch.randn(40, model.config.hidden_size, requires_grad=True)
    targets = torch.randint(0, len(tokenizer), (40,))
    for recompute, expect_logits in ((False, True), (True, False)):
        saved = []

        def pack(t):
            saved.append(tuple(t.shape))
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            project_logprobs(model, hidden, targets, with_entropy=True, recompute_head=recompute)
        logits_rows = [shape for shape in saved if len(shape) == 2 and shape[1] == len(tokenizer)]  # not the weight
        assert bool(logits_rows) == expect_logits, saved
