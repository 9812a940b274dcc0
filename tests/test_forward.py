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
