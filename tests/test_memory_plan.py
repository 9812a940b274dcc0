"""`rlpr plan` (rlpr/parallel/memory_plan.py, rlpr/model/architecture.py, rlpr/cli/plan.py): the
arithmetic against hand computations and against torch's own count of saved activations, the
parameter counts against real models, the command's table and its one-line errors."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from rlpr.cli.main import main
from rlpr.parallel import memory_plan as mp

pytestmark = pytest.mark.unit

GiB = mp.GiB
P7 = 7_615_616_512  # Qwen2.5-7B, counted on the meta device (test_builtin_qwen_counts_match_its_published_size)


def qwen7b(**kw) -> mp.Architecture:
    base = dict(name="qwen2.5-7b", hidden=3584, intermediate=18944, layers=28, heads=28, kv_heads=4, head_dim=128,
                vocab=152064, tied=False, max_position=32768, params=P7, layer_params=233_057_792,
                largest_param=544_997_376)
    return mp.Architecture(**{**base, **kw})


def states(arch, s) -> float:
    """Weights + optimizer states + gradients: the 16 bytes per parameter of full fine-tuning."""
    terms = [mp.weights(arch, s), *mp.optimizer_states(arch, s), *mp.gradients(arch, s)]
    return sum(t.bytes for t in terms if not t.name.startswith("DeepSpeed gradient bucket"))


# -- the arithmetic -----------------------------------------------------------------------------

def test_full_fine_tuning_of_7b_under_ddp_is_16_bytes_per_parameter_and_does_not_fit_80_gb():
    s = mp.Setup(processes=8, strategy="ddp", lora=False)
    assert states(qwen7b(), s) == 16 * P7
    assert 16 * P7 / GiB == pytest.approx(113.5, abs=0.1)  # ~122 GB: more than one 80 GB GPU
    assert mp.plan(qwen7b(), s).verdict() == "DOES NOT FIT"


def test_fsdp_over_8_gpus_shards_the_16_bytes():
    s = mp.Setup(processes=8, strategy="fsdp", lora=False)
    assert states(qwen7b(), s) == 16 * P7 / 8  # 14.2 GiB per GPU
    assert states(qwen7b(), s) < 80 * GiB
    # ... but the no-grad phases gather the full fp32 weights on every process
    gathered = [t for t in mp.scoring(qwen7b(), s) if t.name.startswith("fsdp: full weights")]
    assert gathered[0].bytes == 4 * P7


def test_deepspeed_stages_keep_whole_weights_and_shard_states():
    arch = qwen7b()
    one = mp.Setup(processes=8, strategy="deepspeed", zero_stage=1, lora=False)
    two = replace(one, zero_stage=2)
    # stage 1: 4 (weights) + 4 (gradients) + 12/N (AdamW + master) + its 4/N reduced partition
    assert states(arch, one) == pytest.approx(P7 * (4 + 4 + 12 / 8 + 4 / 8))
    # stage 2: 4 + 16/N
    assert states(arch, two) == pytest.approx(P7 * (4 + 16 / 8))
    bucket = [t for t in mp.gradients(arch, two) if t.name == "DeepSpeed gradient bucket"][0]
    assert bucket.bytes == 4 * 500_000_000
    offloaded = replace(two, cpu_offload=True)
    gpu = states(arch, offloaded)
    assert gpu == 4 * P7  # the weights stay; master, moments and gradient partition go to the CPU
    assert sum(t.host for t in mp.plan(arch, offloaded).terms) >= P7 * 16 / 8


def test_one_process_runs_every_strategy_as_ddp():
    s = mp.Setup(processes=1, strategy="ddp", lora=False)
    assert states(qwen7b(), s) == 16 * P7
    assert [setup.label for setup, _, _ in mp.alternatives(qwen7b(), s)] == ["ddp (1 process)"]


def test_lora_trains_few_parameters():
    arch = qwen7b(lora_params=40_370_176, lora_base_params=6_525_288_448, frozen_linear_params=7_070_285_824,
                  largest_param=303_104)
    s = mp.Setup(processes=1, lora=True)
    grads = sum(t.bytes for t in mp.gradients(arch, s))
    assert grads == 4 * 40_370_176
    assert mp.weights(arch, s).bytes == 4 * (P7 + 40_370_176)
    assert mp.reference_copy(arch, replace(s, reference_copy=True)).bytes == 4 * P7


def test_kv_cache_bytes_per_token_from_the_config():
    # 2 (keys and values) x 28 layers x 4 kv heads x 128 dims x 2 bytes (bf16)
    assert qwen7b().kv_bytes_per_token(2) == 2 * 28 * 4 * 128 * 2 == 57344
    s = mp.Setup(rollout_rows=64, prompt_tokens=2048, response_tokens=3072, responses_per_prompt=8, rollout_bytes=2)
    assert mp.kv_cache(qwen7b(), s).bytes == 64 * 5120 * 57344 * (1 + 1 / 8)


def test_kept_caches_for_score_b_from_the_cache():
    """reward.score_b_from_cache keeps a rollout round's KV caches through scoring (or the evaluation's
    greedy responses', whichever is larger) and pads one scoring batch's pasts in fp32."""
    from rlpr.config import load_config

    s = mp.Setup(round_rows=64, prompt_tokens=2048, response_tokens=3072, rollout_bytes=2, keep_caches=True,
                 scoring_tokens=8192)
    kept, past = mp.kept_caches(qwen7b(), s)
    assert kept.bytes == 64 * 5120 * 57344 and kept.phases == ("rollout", "scoring")
    assert past.bytes == 8192 * 57344 * 2 and past.phases == ("scoring",)
    assert mp.kept_caches(qwen7b(), replace(s, eval_questions=100, eval_response_tokens=3072))[0].bytes == \
        100 * 5120 * 57344
    assert mp.kept_caches(qwen7b(), replace(s, keep_caches=False)) == []
    assert mp.plan(qwen7b(), s).total("scoring") == pytest.approx(
        mp.plan(qwen7b(), replace(s, keep_caches=False)).total("scoring") + kept.bytes + past.bytes)
    # as the trainer resolves it: always (the default) keeps them from any rollout copy; auto from fp32 only
    cpu = load_config("demo")
    assert mp.setup_from_config(cpu, 1, "cpu", 16 * GiB, fast_bf16=False).keep_caches
    assert mp.setup_from_config(cpu, 1, "cpu", 16 * GiB, fast_bf16=True).keep_caches
    exact = load_config("demo", ["reward.score_b_from_cache=auto"])
    assert mp.setup_from_config(exact, 1, "cpu", 16 * GiB, fast_bf16=False).keep_caches
    assert not mp.setup_from_config(exact, 1, "cpu", 16 * GiB, fast_bf16=True).keep_caches
    assert not mp.setup_from_config(load_config("demo", ["reward.kind=entropy"]), 1, "cpu", 16 * GiB,
                                    fast_bf16=False).keep_caches


def test_vllm_takes_its_share_of_the_gpu_and_sleeps_through_the_update():
    s = mp.Setup(engine="vllm", device_bytes=80 * GiB, vllm_gpu_fraction=0.3, processes=8, strategy="fsdp", lora=False)
    p = mp.plan(qwen7b(), s)
    vllm = [t for t in p.terms if t.name.startswith("vLLM")]
    assert sum(t.bytes for t in vllm) == pytest.approx(0.3 * 80 * GiB)
    assert all("update" not in t.phases and "rollout" in t.phases for t in vllm)
    awake = mp.plan(qwen7b(), replace(s, vllm_sleep=False))
    assert awake.total("update") == pytest.approx(p.total("update") + 0.3 * 80 * GiB)
    cpu = mp.plan(qwen7b(), replace(s, device="cpu", vllm_kv_cache_gb=2.0))
    assert [t.bytes for t in cpu.terms if t.name == "vLLM KV cache"] == [2 * GiB]


def test_micro_batch_shape_follows_the_token_budget():
    s = mp.Setup(prompt_tokens=2048, response_tokens=3072, micro_tokens=16384, mini_rows=192, share_prefix=False,
                 gradient_checkpointing=True)
    mb = mp.micro_batch(s)
    assert (mb.rows, mb.length, mb.targets) == (3, 5120, 3072)  # 16384 // 5120 rows of full length
    by_count = mp.micro_batch(replace(s, micro_tokens=0, micro_rows=8))
    assert by_count.rows == 8
    shared = mp.micro_batch(replace(s, micro_tokens=0, micro_rows=16, gradient_checkpointing=False,
                                    share_prefix=True, responses_per_prompt=8))
    assert (shared.rows, shared.prefix, shared.length) == (8, 2048, 3072)  # one prompt's responses


def test_checkpointing_keeps_one_hidden_state_per_layer_and_token():
    arch = qwen7b()
    s = mp.Setup(prompt_tokens=2048, response_tokens=3072, micro_tokens=16384, mini_rows=192, share_prefix=False,
                 gradient_checkpointing=True, lora=False)
    on = {t.name: t.bytes for t in mp.activations(arch, s)}
    off = {t.name: t.bytes for t in mp.activations(arch, s, checkpointing=False)}
    assert on["activations: layer inputs (checkpointed)"] == 28 * 3 * 5120 * 3584 * 4
    assert off["activations: all layers"] == pytest.approx(28 * on["activations: one layer recomputed"])
    assert sum(on.values()) < sum(off.values()) / 5
    # without checkpointing the logits of every response token stay for the checkpointed fp32 softmax
    # (fp32: no autocast); with it the output layer is recomputed in backward (recompute_head)
    assert on["logits kept for backward"] == 0
    off_ckpt = replace(s, gradient_checkpointing=False)
    assert off["logits kept for backward"] == 3 * 3072 * 152064 * 4
    bf16 = {t.name: t.bytes for t in mp.activations(arch, replace(off_ckpt, bf16=True))}
    assert bf16["logits kept for backward"] == 3 * 3072 * 152064 * 2


def test_peak_is_the_largest_phase_not_the_sum_of_terms():
    p = mp.plan(qwen7b(), mp.Setup(processes=8, strategy="fsdp", lora=False, gradient_checkpointing=True))
    assert p.peak == max(p.total(ph) for ph in mp.PHASES)
    assert p.peak < sum(t.bytes for t in p.terms)
    assert all(t.phases for t in p.terms)


def test_verdicts_and_the_recommendation():
    assert mp.verdict(68 * GiB, 80 * GiB) == "FITS"
    assert mp.verdict(70 * GiB, 80 * GiB) == "TIGHT"  # reserved memory ran 1.14-1.17x the plan on an H100
    assert mp.verdict(75 * GiB, 80 * GiB) == "TIGHT"
    assert mp.verdict(81 * GiB, 80 * GiB) == "DOES NOT FIT"
    small = qwen7b(hidden=576, intermediate=1536, layers=30, heads=9, kv_heads=3, head_dim=64, vocab=49152, tied=True,
                   params=134_515_008, layer_params=3_540_096, largest_param=28_311_552)
    s = mp.Setup(processes=8, strategy="fsdp", lora=False, prompt_tokens=128, response_tokens=128, micro_rows=8)
    setup, ckpt, plan = mp.recommend(mp.alternatives(small, s))
    assert (setup.strategy, ckpt, plan.verdict()) == ("ddp", False, "FITS")  # a small model needs no sharding


def test_the_layer_formula_matches_torch_saved_tensors():
    """Per decoder layer, the bytes autograd saves (deduplicated storages, weights excluded), measured
    on a Llama with a padding mask, fp32 and under CPU bf16 autocast with rlpr's fp32 attention."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from rlpr.model.attention import use_fp32_attention_under_autocast

    def saved(layers: int, bf16: bool, rows: int = 2, length: int = 64) -> float:
        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=128, hidden_size=96, intermediate_size=256, num_hidden_layers=layers,
                             num_attention_heads=6, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True)
        model = LlamaForCausalLM(config).train()
        if bf16:
            use_fp32_attention_under_autocast(model)
        ids = torch.randint(0, 128, (rows, length))
        mask = torch.ones(rows, length, dtype=torch.long)
        mask[0, :5] = 0  # padding: the 4-D mask and repeated kv heads, as in rlpr's batches
        params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        store: dict[int, int] = {}

        def pack(t):
            s = t.untyped_storage()
            if s.data_ptr() not in params:
                store[s.data_ptr()] = max(store.get(s.data_ptr(), 0), s.nbytes())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
                torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            model.model(input_ids=ids, attention_mask=mask)
        return sum(store.values())

    arch = mp.Architecture("t", hidden=96, intermediate=256, layers=1, heads=6, kv_heads=2, head_dim=16, vocab=128,
                           tied=True, max_position=2048, params=0, layer_params=0)
    rows, length = 2, 64
    for bf16 in (False, True):
        s = mp.Setup(device="cpu", bf16=bf16, fp32_attention=True)
        per_layer = saved(2, bf16) - saved(1, bf16)
        if bf16:  # autocast's cache keeps each trainable weight's bf16 cast: weights, not activations
            per_layer -= 2 * (96 * 96 * 2 + 96 * 32 * 2 + 3 * 96 * 256)
        planned = mp._full_layer_bytes(arch, s, rows * length, rows * length)
        assert planned == pytest.approx(per_layer, rel=0.05), (bf16, planned, per_layer)


def test_setup_from_the_paper_preset():
    from rlpr.config import load_config

    cfg = load_config("paper", [])
    s = mp.setup_from_config(cfg, 8, "cuda", 80 * GiB)
    assert (s.strategy, s.lora, s.gradient_checkpointing, s.bf16, s.rollout_bytes) == ("fsdp", False, True, False, 2)
    assert (s.micro_tokens, s.prompt_tokens, s.response_tokens) == (16384, 2048, 3072)
    assert s.rollout_rows == 96 and s.mini_rows == 192 // 8 * 8
    assert mp.setup_from_config(cfg, 1, "cuda", 80 * GiB).strategy == "ddp"


# -- parameter counts -----------------------------------------------------------------------------

def test_counts_match_a_real_model_and_its_lora_adapter(tiny_dir, tiny_model):
    from peft import LoraConfig, get_peft_model

    from rlpr.config import ModelConfig
    from rlpr.model.architecture import architecture

    arch = architecture(ModelConfig(path=tiny_dir, lora=False))
    assert arch.params == sum(p.numel() for p in tiny_model.parameters())
    assert (arch.layers, arch.hidden, arch.tied) == (2, 64, True)
    assert arch.layer_params == sum(p.numel() for p in tiny_model.model.layers[0].parameters())
    lora = architecture(ModelConfig(path=tiny_dir, lora=True, lora_rank=4))
    import copy

    peft_model = get_peft_model(copy.deepcopy(tiny_model), LoraConfig(
        r=4, lora_alpha=32, target_modules=list(ModelConfig().lora_target_modules), task_type="CAUSAL_LM"))
    assert lora.lora_params == sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    assert lora.params == arch.params


def test_builtin_qwen_counts_match_its_published_size():
    from rlpr.config import ModelConfig
    from rlpr.model.architecture import architecture

    arch = architecture(ModelConfig(path="qwen2.5-7b", lora=False))
    assert arch.params == P7  # Qwen2.5-7B: 7.61e9 parameters
    assert (arch.hidden, arch.intermediate, arch.layers, arch.heads, arch.kv_heads, arch.vocab, arch.tied,
            arch.max_position) == (3584, 18944, 28, 28, 4, 152064, False, 32768)
    assert arch.root_params == 2 * 152064 * 3584 + 3584  # untied embeddings + output layer + final norm


# -- the command ----------------------------------------------------------------------------------

def test_plan_prints_the_tables_and_exits_0(capsys):
    assert main(["plan", "--preset", "paper", "--model", "qwen2.5-7b", "--gpus", "8", "--gpu-gb", "80"]) == 0
    out = capsys.readouterr().out
    for text in ("weights (fp32, fsdp shard)", "optimizer states", "KV cache (hf rollout)", "logits kept for backward",
                 "fsdp: full weights gathered", "peak:", "checkpointing off", "deepspeed ZeRO-2", "recommended:"):
        assert text in out, text
    assert "runtime (CPU process baseline)" not in out  # a GPU plan


def test_plan_json_and_the_cpu_runtime_line(capsys, tiny_dir):
    assert main(["plan", f"model.path={tiny_dir}", "model.device=cpu", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    names = [t["name"] for t in data["terms"]]
    assert names[0] == "runtime (CPU process baseline)"
    assert data["setup"]["device"] == "cpu" and data["peak_gib"] > 0
    assert data["peak_gib"] == pytest.approx(max(data["phases_gib"].values()))


def test_model_flag_and_override_the_later_wins(capsys):
    assert main(["plan", "--model", "qwen2.5-7b", "model.path=smollm2-135m", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["architecture"]["hidden"] == 576
    assert main(["plan", "model.path=smollm2-135m", "--model", "qwen2.5-7b", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["architecture"]["hidden"] == 3584


@pytest.mark.parametrize("argv, message", [
    (["--gpus", "0"], "--gpus"),
    (["--gpu-gb", "-1"], "--gpu-gb"),
    (["--gpu-gb", "inf"], "--gpu-gb: the memory of one GPU (or CPU process) in GiB must be in (0, 1048576], got inf"),
    (["--gpu-gb", "nan"], "--gpu-gb"),
    # issue 43: 1e308 GiB is infinite in bytes (the plan said every phase FITS); 1 PiB is the most
    (["--gpu-gb", "1e308"], "--gpu-gb: the memory of one GPU (or CPU process) in GiB must be in (0, 1048576], got 1e+308"),
    (["--gpu-gb", "2e6"], "--gpu-gb"),
    (["--gpus", "10000000"], "--gpus: the number of GPUs (processes) must be in 1..1048576"),
    (["--gpus", "3"], "divisible by the number of processes"),
    (["trainer.cpu_offload=true"], "trainer.cpu_offload"),
    (["trainer.strategy=zero"], "trainer.strategy"),
])
def test_bad_input_is_one_line(capsys, argv, message):
    assert main(["plan", "--model", "smollm2-135m", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rlpr: error:") and message in err and err.count("\n") == 1


def test_a_model_path_without_config_json_is_one_line(capsys, tmp_path):
    assert main(["plan", f"model.path={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert "no config.json" in err and err.count("\n") == 1
    (tmp_path / "config.json").write_text("{not json")
    assert main(["plan", f"model.path={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert "cannot read config.json" in err and err.count("\n") == 1
    (tmp_path / "config.json").write_text('{"model_type": "llama", "x": ' + "[" * 5000 + "]" * 5000 + "}")
    assert main(["plan", f"model.path={tmp_path}"]) == 2  # nested a thousand deep: a RecursionError traceback before
    assert capsys.readouterr().err == f"rlpr: error: {tmp_path / 'config.json'}: cannot read config.json (nested too deep)\n"


@pytest.mark.parametrize("change, message", [
    ({"vocab_size": "abc"}, "vocab_size must be a positive whole number, got 'abc'"),
    ({"num_attention_heads": 0}, "num_attention_heads must be a positive whole number, got 0"),
    ({"num_hidden_layers": -1}, "num_hidden_layers must be a positive whole number"),
    ({"hidden_size": 64.5}, "hidden_size must be a positive whole number"),
    ({"hidden_size": True}, "hidden_size must be a positive whole number"),
    ({"intermediate_size": None}, "intermediate_size must be a positive whole number"),
    ({"num_attention_heads": 7}, "not a valid 'llama' configuration"),
    ({"model_type": ["llama"]}, "model_type must be a string"),
    ({"vocab_size": 10 ** 30}, "cannot build the model from its config"),
])
def test_plan_on_a_hostile_config_json_is_one_line(capsys, tmp_path, change, message):
    """issue 35, N13 (and N12 above: --gpu-gb inf was accepted and --json printed Infinity): a
    config.json with vocab_size "abc" or zero heads gave transformers' validator tracebacks or a
    ZeroDivisionError; now one line naming the file and the key."""
    base = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000, "max_position_embeddings": 256}
    (tmp_path / "config.json").write_text(json.dumps({**base, **change}))
    assert main(["plan", "--model", str(tmp_path), "--json"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rlpr: error:") and message in err and err.count("\n") == 1, err
    (tmp_path / "config.json").write_text(json.dumps(base))
    assert main(["plan", "--model", str(tmp_path), "--json", "--gpu-gb", "1e6"]) == 0
    json.loads(capsys.readouterr().out)  # strict JSON
