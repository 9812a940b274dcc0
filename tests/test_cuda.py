"""rlpr's CUDA-only branches, on a real GPU: device placement of the policy, its rollout copy and
every input; the bf16 choices (`auto`) and autocast dtype; `rlpr plan`'s weight and rollout-copy
terms against torch's CUDA allocator; seeded sampling on CUDA; the CUDA RNG in checkpoints, and a
checkpoint saved from CUDA loaded on the CPU. Skipped (one line) where torch sees no GPU;
benchmarks/gpu_check.py runs this file on a GPU machine (docs/distributed.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA (benchmarks/gpu_check.py runs these on a GPU)", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from gpubench import models, train  # noqa: E402

pytestmark = pytest.mark.integration

CUDA = torch.device("cuda", 0)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A random 2-layer Qwen2-layout model (tied embeddings, GQA, q/k/v biases), vocabulary 4096."""
    return models.random_model_dir(tmp_path_factory.mktemp("tiny-qwen"), "tiny", "cpu")


def overrides(model_dir, out, name, **kw):
    args = dict(device="cuda", response_tokens=12, prompt_tokens=256, steps=2)
    args.update(kw)
    return train.paper_overrides(model_dir, out, name, **args)


def test_auto_device_and_precisions_choose_the_gpu():
    from rlpr.model.precision import fast_bf16, resolve_mixed_precision, resolve_rollout_dtype
    from rlpr.parallel import distributed as dist

    assert dist.resolve_device("auto") == CUDA and dist.resolve_device("cuda") == CUDA
    assert fast_bf16(CUDA) == torch.cuda.is_bf16_supported()
    want = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    assert resolve_rollout_dtype("auto", CUDA) == want
    assert resolve_mixed_precision("auto", CUDA) == ("bf16" if want == torch.bfloat16 else "none")


def test_update_autocast_computes_in_bf16_on_cuda_and_keeps_fp32_weights():
    from rlpr.model.precision import update_autocast

    if not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    layer = torch.nn.Linear(64, 64).to(CUDA)
    x = torch.randn(8, 64, device=CUDA)
    with update_autocast("bf16", CUDA):
        y = layer(x)
    assert y.dtype == torch.bfloat16 and layer.weight.dtype == torch.float32
    with update_autocast("none", CUDA):
        assert layer(x).dtype == torch.float32
    y.float().sum().backward()
    assert layer.weight.grad.dtype == torch.float32


def test_plan_weight_and_rollout_copy_terms_match_the_cuda_allocator(tmp_path):
    """The plan's fp32 weights (4 B x P) and bf16 rollout copy (2 B x P) are what torch allocates."""
    from rlpr.config import load_config
    from rlpr.model.loading import load_model
    from rlpr.rollout.hf import plain_copy

    path = models.random_model_dir(tmp_path / "small", "qwen-small", "cpu")
    cfg = load_config("paper", overrides(path, tmp_path, "plan", prompt_tokens=64))
    plan = train.planned(cfg, None)
    terms = {t["name"]: t["gib"] * train.GiB for t in plan["terms"]}
    model, _ = load_model(path)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    model.to(CUDA)
    weights = torch.cuda.memory_allocated() - before
    assert weights == pytest.approx(terms["weights (fp32)"], rel=0.01)
    before = torch.cuda.memory_allocated()
    copy = plain_copy(model, torch.bfloat16, CUDA)
    assert copy.device.type == "cuda"
    assert torch.cuda.memory_allocated() - before == pytest.approx(terms["rollout copy (hf engine)"], rel=0.01)


def test_seeded_sampling_on_cuda_is_reproducible_and_follows_the_cpu(model_dir):
    from rlpr.model.loading import load_model
    from rlpr.rollout.hf import HFRollout

    model, tok = load_model(model_dir)
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True)
               for q in ("What is the capital of France?", "Spell cat backwards.")]
    prompts = [p["input_ids"] if hasattr(p, "keys") else p for p in prompts]  # transformers 5: a BatchEncoding

    def sample(device, seeds):
        engine = HFRollout(model.to(device), tok, dtype=torch.float32, batch_sequences=8)
        assert next(engine.model.parameters()).device.type == torch.device(device).type
        return [r.token_ids for r in engine.generate(prompts, 3, max_new_tokens=16, temperature=1.0, seeds=seeds)]

    on_gpu = sample(CUDA, [11, 12])
    assert sample(CUDA, [11, 12]) == on_gpu  # the same seeds, the same responses
    assert sample(CUDA, [13, 12])[:3] != on_gpu[:3]  # prompt 0's draws follow its seed
    on_cpu = sample("cpu", [11, 12])
    # the draws are the CPU generator's; only a logit within fp32 rounding of a boundary can differ
    assert [r[:4] for r in on_cpu] == [r[:4] for r in on_gpu]


def test_rollouts_on_cuda_run_without_cudnn_attention(model_dir):
    """rollout.hf.decode_attention: every forward of a CUDA rollout runs with cuDNN's SDPA kernel off
    (it re-plans each new length: the first rollout of a model ran 10-13x slower), and it is back on after."""
    from rlpr.model.loading import load_model
    from rlpr.rollout.hf import HFRollout

    model, tok = load_model(model_dir)
    engine = HFRollout(model.to(CUDA), tok, dtype=torch.bfloat16, batch_sequences=8)
    seen = []
    engine.model.register_forward_pre_hook(lambda *_: seen.append(torch.backends.cuda.cudnn_sdp_enabled()))
    engine.generate([tok("Hello there")["input_ids"]], 2, max_new_tokens=8, temperature=1.0, top_p=1.0)
    assert seen and not any(seen)
    assert torch.backends.cuda.cudnn_sdp_enabled()


def test_cuda_rng_state_is_saved_and_restored():
    from rlpr.train.checkpoint import rng_state, set_rng_state

    torch.cuda.manual_seed(3)
    torch.randn(4, device=CUDA)
    state = rng_state()
    assert "cuda" in state
    first = torch.randn(4, device=CUDA)
    torch.randn(100, device=CUDA)
    set_rng_state(state)
    assert torch.equal(torch.randn(4, device=CUDA), first)


def test_training_on_cuda_places_everything_on_the_gpu_and_checkpoints_load_on_the_cpu(model_dir, tmp_path,
                                                                                       monkeypatch):
    """`--preset paper` on one GPU (2 steps): the policy, its rollout copy and the optimizer states on
    cuda:0; the checkpoint (written from CUDA tensors) loads on the CPU with the same weights, its
    trainer state holds the CUDA RNG, and a resume on the GPU continues from it."""
    from safetensors.torch import load_file

    from rlpr.config import load_config
    from rlpr.train import trainer as tr
    from rlpr.train.checkpoint import latest_checkpoint, load_state
    from rlpr.train.tracking import read_metrics

    seen = {}
    setup = tr.Trainer._setup

    def capture(self):
        setup(self)
        seen["trainer"] = self

    monkeypatch.setattr(tr.Trainer, "_setup", capture)
    args = overrides(model_dir, tmp_path, "cuda-run", save_every=1)
    tr.train(load_config("paper", args))
    t = seen["trainer"]
    assert t.device == CUDA
    assert {p.device for p in t.policy.parameters()} == {CUDA}
    assert {p.device for p in t.engine.model.parameters()} == {CUDA}
    assert next(t.engine.model.parameters()).dtype == torch.bfloat16  # the preset's model.rollout_dtype
    assert {v.device for s in t.optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.dim()} == {CUDA}
    metrics = [m for m in read_metrics(tmp_path / "cuda-run") if "perf/step_s" in m]
    assert len(metrics) == 2 and all(m["policy/updates"] > 0 for m in metrics)
    assert all(m["rollout/response_len_mean"] == 12 for m in metrics)  # rollout.min_new_tokens forces the length
    ckpt = latest_checkpoint(tmp_path / "cuda-run")
    saved = load_file(str(ckpt / "model" / "model.safetensors"))  # on the CPU
    live = {k: v.detach().cpu() for k, v in t.policy.state_dict().items()}
    for k, v in saved.items():
        assert v.device.type == "cpu" and torch.equal(v, live[k]), k
    state = load_state(ckpt, resumable=True)
    assert "cuda" in state["ranks"][0]["rng"]
    tr.train(load_config("paper", [*args, "trainer.max_steps=3"]), resume=str(tmp_path / "cuda-run"))
    assert [m["step"] for m in read_metrics(tmp_path / "cuda-run") if "perf/step_s" in m] == [1, 2, 3]


def test_phase_meter_records_cuda_peaks(model_dir, tmp_path):
    """The check's own instrument: a peak per phase, each at least the weights it holds."""
    from safetensors.torch import load_file

    from rlpr.config import load_config
    from rlpr.train.trainer import train

    meter = train.PhaseMeter(cuda=True)
    with train.instrumented(meter, save=False):
        train(load_config("paper", overrides(model_dir, tmp_path, "meter")))
    phases = meter.summary(2)
    weights = sum(v.numel() * 4 for v in load_file(str(model_dir / "model.safetensors")).values())
    for ph in train.PHASES:
        assert phases[ph]["calls"] >= 1, ph
        assert phases[ph]["allocated_gib"] * train.GiB >= weights, ph
        assert phases[ph]["reserved_gib"] >= phases[ph]["allocated_gib"], ph


def test_graph_decode_on_cuda_captures_graphs_and_equals_the_eager_loop(model_dir):
    """rollout.decode_loop=graph (the default on CUDA): the step is captured as CUDA graphs (no capture
    failure, no host synchronisation inside it) and its seeded and greedy tokens equal rlpr's eager loop
    on the same GPU in fp32, with rows ending early (min lengths differ) across batch buckets."""
    from rlpr.model.loading import load_model
    from rlpr.rollout import graph_decode
    from rlpr.rollout.hf import HFRollout

    model, tok = load_model(model_dir)
    model = model.to(CUDA)
    prompts = [tok(q)["input_ids"] for q in ("What is the capital of France?", "Spell cat backwards.", "Why?")]

    def run(loop, dtype, **kw):
        engine = HFRollout(model, tok, dtype=dtype, batch_sequences=12, loop=loop)
        out = engine.generate(prompts, 4, max_new_tokens=40, seeds=[3, 4, 5], **kw)
        return engine, [r.token_ids for r in out]

    assert HFRollout(model, tok, dtype=torch.float32).loop == "graph"
    for kw in (dict(temperature=1.0), dict(temperature=0.7, top_p=0.9), dict(temperature=0.0)):
        engine, graph = run("graph", torch.float32, **kw)
        dec = graph_decode.decoder_for(engine.model)
        assert dec.failed == "" and dec.graphs, dec.failed
        assert graph == run("rlpr", torch.float32, **kw)[1]
    _, graph = run("graph", torch.bfloat16, temperature=1.0)
    _, eager = run("rlpr", torch.bfloat16, temperature=1.0)
    assert [r[:4] for r in graph] == [r[:4] for r in eager]  # bf16: kernels differ, the first draws agree


def test_graph_decode_on_cuda_recaptures_after_its_buffers_grow(model_dir):
    """A later call with more rows, a longer prompt and a longer response reallocates the static buffers:
    the old graphs and their memory pool are dropped and new ones captured (a capture into the freed
    pool's handle failed an allocator assert, and a failed capture leaves CUDA's RNG unusable)."""
    from rlpr.model.loading import load_model
    from rlpr.rollout import graph_decode
    from rlpr.rollout.hf import HFRollout

    model, tok = load_model(model_dir)
    model = model.to(CUDA)
    engine = HFRollout(model, tok, dtype=torch.bfloat16, batch_sequences=64)
    dec = graph_decode.decoder_for(engine.model)
    short, long = tok("Hi")["input_ids"], tok("A much longer question about rivers and mountains " * 30)["input_ids"]
    engine.generate([short], 4, max_new_tokens=8, temperature=1.0)
    first = dec.keys[0]
    engine.generate([short, long], 16, max_new_tokens=300, temperature=1.0)
    engine.generate([short], 4, max_new_tokens=8, temperature=0.0)
    assert dec.keys[0] is not first and dec.failed == "" and dec.graphs, dec.failed
    torch.randn(4, device=CUDA)  # CUDA's generator is not left in capture mode


@pytest.mark.parametrize("name", ["gemma3", "mistral"])
def test_sliding_windows_decode_in_captured_graphs_as_the_eager_loop(name):
    """Sliding-window families (issue 63) in the graph loop on CUDA: captured (no failure) and, in fp32,
    the eager loop's tokens, seeded and greedy, with a window of 8 under ~55-position sequences (the
    CPU test's tiny models; the check's own tokenizer, whose EOS is id 2 as SmolLM2's)."""
    from test_graph_windows import _family, eos_prone, prompts

    tokenizer = models.synthetic_tokenizer(4096)
    assert tokenizer.eos_token_id == 2

    from rlpr.rollout import graph_decode
    from rlpr.rollout.hf import HFRollout

    torch.manual_seed(0)
    model = eos_prone(_family(name, tokenizer).eval(), tokenizer).to(CUDA)

    def run(loop, **kw):
        engine = HFRollout(model, tokenizer, dtype=torch.float32, batch_sequences=12, loop=loop)
        assert engine.loop == loop
        out = engine.generate(prompts(tokenizer), 4, max_new_tokens=20, seeds=[1, 2, 3], **kw)
        return engine, [r.token_ids for r in out]

    for kw in (dict(temperature=1.0), dict(temperature=0.0)):
        engine, graph = run("graph", **kw)
        dec = graph_decode.decoder_for(engine.model)
        assert dec.failed == "" and dec.graphs, dec.failed
        assert graph == run("rlpr", **kw)[1]
