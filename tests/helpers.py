"""Helpers that several test modules use: the tiny-run config, the torchrun launchers, and the
shared public data sets (a test that needs them skips with one line when they are absent)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from rlpr.config import load_config
from rlpr.train.checkpoint import latest_checkpoint

# ../shared/data beside the repository (never copied into it); RLPR_SHARED_DATA points elsewhere
SHARED_DATA = Path(os.environ.get("RLPR_SHARED_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data")


def shared_data(rel: str = "") -> Path:
    """`rel` under the shared data folder; skips the calling test when that folder is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"needs the shared data sets in {SHARED_DATA} (absent)")
    return SHARED_DATA / rel


@contextmanager
def small_filesystem(path: Path, size: str = "64k"):
    """A tmpfs of `size` mounted at `path`: a really full disk for the write tests (CI runs as
    root). Skips the calling test with one line where mounting is not permitted."""
    path.mkdir(parents=True, exist_ok=True)
    try:
        result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0777", "tmpfs", str(path)],
                                capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        result = subprocess.CompletedProcess([], 1, "", str(e))
    if result.returncode != 0:
        pytest.skip(f"needs permission to mount a small tmpfs (a really full disk): "
                    f"{(result.stderr or 'mount failed').strip().splitlines()[-1]}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


# -- single-process training runs on the tiny model ------------------------------------------------

# The run report (matplotlib: about 30% of a tiny 2-step run's time) is drawn only where a test asks for it
# (trainer.report=true: tests/test_report*.py); `rlpr train` in a subprocess (test_console.py)
# keeps the default. A failed report is a warning, so other runs could not assert on it anyway.
NO_REPORT = "trainer.report=false"


def tiny_cfg(tiny_dir, out, name, *extra):
    """A tiny in-process run's config. Its threads are pinned: `model.threads=0` picks them from the
    machine's load at each start (rlpr/parallel/threads.py), and runs compared bit for bit (straight
    against resumed) then summed in another order whenever the load changed between them."""
    return load_config("demo", [
        f"model.path={tiny_dir}", f"trainer.output_dir={out}", f"trainer.name={name}",
        "rollout.max_new_tokens=8", "rollout.responses_per_prompt=4", "trainer.prompts_per_step=4",
        "trainer.mini_batch_prompts=2", "trainer.micro_batch_sequences=3", "data.demo_train_size=40",
        "data.demo_val_size=4", "trainer.progress=false", "trainer.tensorboard=false", NO_REPORT,
        "algorithm.filter_warmup_steps=2", "algorithm.filter_init_steps=1", "trainer.lr=1e-3", "model.threads=2",
        *extra])


def adapter_tensors(run_dir):
    from safetensors.torch import load_file

    return load_file(str(latest_checkpoint(run_dir) / "adapter" / "adapter_model.safetensors"))


# -- multi-process runs (torchrun, accelerate) ----------------------------------------------------

TIMEOUT = 300


def common(tiny_dir, out, name, steps):
    return [f"model.path={tiny_dir}", f"trainer.output_dir={out}", f"trainer.name={name}",
            f"trainer.max_steps={steps}", "rollout.max_new_tokens=8", "rollout.responses_per_prompt=4",
            "trainer.prompts_per_step=4", "trainer.mini_batch_prompts=2", "trainer.micro_batch_sequences=3",
            "data.demo_train_size=40", "data.val=", "model.rollout_dtype=float32", "trainer.lr=1e-3",
            "trainer.tensorboard=false", "trainer.mixed_precision=none", "trainer.sample_every=0", NO_REPORT]


LAUNCHERS = {
    "torchrun": [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"],
    # accelerate's multi-process launcher (torch elastic underneath); with no GPU, rlpr picks gloo
    "accelerate": [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes=2",
                   "--num_machines=1", "--mixed_precision=no", "--dynamo_backend=no", "--main_process_port=0"],
}


def at_a_terminal():  # a subprocess preexec_fn
    """The child takes the stop signals as a terminal's foreground job does, also where this test runs
    in a background job of a script (`cmd &` starts it with SIGINT ignored) or under `nohup` (SIGHUP
    ignored): rlpr keeps a stop signal its process was started ignoring (errors.stop_signals)."""
    import signal

    from rlpr.errors import STOP_SIGNALS

    for name in STOP_SIGNALS:
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)


class Zygote:
    """This test worker's forked_ranks.py server: started at its first launch, ended with the worker."""
    process = None

    @classmethod
    def run(cls, args, env):
        import atexit
        import tempfile

        if cls.process is None or cls.process.poll() is not None:
            cls.log = tempfile.TemporaryFile("w+")
            cls.process = subprocess.Popen([sys.executable, str(Path(__file__).with_name("forked_ranks.py"))],
                                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=cls.log, text=True,
                                           env={**os.environ, "OMP_NUM_THREADS": "1"})
            atexit.register(cls.process.kill)
            cls.reply()
        with tempfile.TemporaryDirectory() as logs:
            request = {"argv": args, "env": {**os.environ, **env}, "cwd": os.getcwd(), "logs": logs, "timeout": TIMEOUT}
            cls.process.stdin.write(json.dumps(request) + "\n")
            cls.process.stdin.flush()
            reply = cls.reply()
        assert not reply["timed_out"], f"ranks still running after {TIMEOUT} s: {reply['stderr'][-3000:]}"
        return reply

    @classmethod
    def reply(cls):
        line = cls.process.stdout.readline()
        if not line:  # the server ended: its own error
            cls.log.seek(0)
            raise AssertionError(f"the forked-ranks server ended: {cls.log.read()[-3000:]}")
        return json.loads(line)


def launch(args, launcher=None, **env):
    """`args` on 2 processes of `launcher`, one thread each; the finished process (exit status 0).
    "forked": two ranks forked from a server that imported torch and rlpr once (forked_ranks.py);
    the real launchers (torchrun, accelerate) where the launch itself is under test.
    RLPR_TEST_LAUNCHER=torchrun runs every launch that names none under torchrun instead."""
    launcher = launcher or os.environ.get("RLPR_TEST_LAUNCHER", "forked")
    if launcher == "forked":
        reply = Zygote.run(args, {"OMP_NUM_THREADS": "1", **env})
        assert reply["codes"] == [0, 0], (reply["codes"], reply["stderr"][-3000:])
        return reply
    result = subprocess.run([*LAUNCHERS[launcher], *args], env={**os.environ, "OMP_NUM_THREADS": "1", **env},
                            capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def torchrun(args, resume=None, launcher=None):
    return launch(["-m", "rlpr", "train", *(["--resume", resume] if resume else []), *args], launcher)


REPORT = """
def report(*values):  # one line per rank in its own file: the ranks' stdout lines can interleave
    import os
    with open(os.path.join(os.environ["RANK_REPORTS"], f"rank{os.environ['RANK']}"), "w") as f:
        f.write(" ".join(map(str, values)))
"""


def rank_reports(worker, tmp_path, *args):
    """Run `worker` (Python source that may call report(*values)) on 2 torchrun processes; the
    values each rank reported, as strings, in rank order."""
    script, out = tmp_path / "worker.py", tmp_path / "reports"
    script.write_text(REPORT + worker)
    out.mkdir()
    launch([str(script), *args], RANK_REPORTS=str(out))
    return [(out / f"rank{r}").read_text().split() for r in range(2)]


def assert_close(a, b, atol):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k], b[k], atol=atol, rtol=0), (k, (a[k] - b[k]).abs().max())


def write_eval_data(tmp_path):
    """A verl-layout parquet (math) and a flat multiple-choice jsonl with an _Avg2 suffix."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rlpr.data.templates import build_messages

    rows = [{"data_source": "math500", "prompt": build_messages(f"What is {i} + {i}?", "r1"),
             "ability": "math", "reward_model": {"ground_truth": str(2 * i), "style": "rule"},
             "extra_info": {"index": f"m{i}"}} for i in range(3)]
    math_file = tmp_path / "math500.parquet"
    pq.write_table(pa.Table.from_pylist(rows), math_file)
    mc_file = tmp_path / "gpqa_tiny_Avg2.jsonl"
    with open(mc_file, "w") as f:
        for i in range(2):
            f.write(json.dumps({"question": f"Pick {i}", "answer": "B", "choices": ["x", "y", "z"]}) + "\n")
    return math_file, mc_file


class ScriptedEngine:
    """Returns fixed responses (cycled), so grading outcomes are known."""

    def __init__(self, tokenizer, responses):
        self.tokenizer, self.responses, self.i = tokenizer, responses, 0

    def sync(self, policy, weights=None):
        pass  # scripted responses do not depend on the weights

    def sleep(self):
        pass

    def generate(self, prompts, n, **kw):
        from rlpr.rollout.hf import Rollout

        out = []
        for p in range(len(prompts)):
            for _ in range(n):
                text = self.responses[self.i % len(self.responses)]
                self.i += 1
                out.append(Rollout(p, self.tokenizer(text)["input_ids"], text, True))
        return out


# -- run directories and trackers ------------------------------------------------------------------

def fake_run(path, steps=3, *, lr=1e-6, eval_samples=2, with_samples=True, config=None):
    """A run directory as `rlpr train` leaves it (metrics.jsonl, config.yaml, summary.yaml, samples/),
    written without training: for the report's tests."""
    import yaml

    from rlpr.config import Config

    path.mkdir(parents=True, exist_ok=True)
    cfg = Config().to_dict()
    cfg["trainer"]["lr"] = lr
    for key, value in (config or {}).items():
        section, name = key.split(".")
        cfg[section][name] = value
    (path / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))

    def evaluation(acc):
        return {"eval/reward_mean": 0.05 + acc / 10, "eval/score_b_mean": 0.2, "eval/greedy_accuracy": acc,
                "eval/greedy_accuracy_se": 0.1, "eval/format_rate": 0.5, "eval/response_len_mean": 12.0,
                "eval/questions": 8, "eval/accuracy": acc, "eval/accuracy_se": 0.1,
                f"eval/pass@{eval_samples}": acc + 0.1, "eval/samples": eval_samples}

    records = [{"step": 0, **evaluation(0.25)}]
    for s in range(1, steps + 1):
        records.append({"step": s, "reward/mean": 0.1 * s, "reward/score_b_mean": 0.3 + 0.01 * s,
                        "reward/score_a_mean": 0.2 + 0.005 * s, "filter/kept_frac": 1.0, "filter/ema_std": None,
                        "policy/entropy": 2.0 - 0.1 * s, "policy/grad_norm": 0.4 + 0.05 * s,
                        "rollout/response_len_mean": 20.0 + s, "perf/rollout_s": 2.0, "perf/reward_s": 1.0,
                        "perf/update_s": 3.0, "perf/step_s": 6.5, "perf/peak_rss_gb": 2.4 + 0.01 * s})
    records.append({"step": steps, **evaluation(0.5)})
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (path / "summary.yaml").write_text(yaml.safe_dump({"before": records[0], "after": records[-1], "step": steps}))
    if with_samples:
        (path / "samples").mkdir(exist_ok=True)
        rows = [{"prompt": f"Q{q}?", "reference": f"A{q}", "response": f"<answer>{q}-{i} & <b>x</b></answer>",
                 "reward": 0.1 * i, "score_b": 0.5, "score_a": 0.4, "format": 1.0, "correct": float(i == 3)}
                for q in range(5) for i in range(4)]
        (path / "samples" / f"step_{steps:06d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def wandb_history(run_dir):
    """The history rows (step -> {key: value}) of the offline wandb run in `run_dir/wandb`, read
    from its transaction log (LevelDB-log framing: 32 KiB blocks of records with a 7-byte header
    checksum/length/type; 1 full, 2 first, 3 middle, 4 last) with wandb's own protobuf classes."""
    import struct

    from wandb.proto import wandb_internal_pb2

    (path,) = Path(run_dir).glob("wandb/offline-run-*/run-*.wandb")
    data = path.read_bytes()
    ident, magic, _ = struct.unpack("<4sHB", data[:7])
    assert ident == b":W&B" and magic == 0xBEE1, "not a wandb transaction log"
    pos, chunk, rows = 7, b"", {}
    while pos + 7 <= len(data):
        room = 32768 - pos % 32768
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7]) if room >= 7 else (0, 0, 0)
        if room < 7 or (kind == 0 and length == 0):
            pos += room  # block trailer / padding
            continue
        chunk += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunk)
            chunk = b""
            if record.WhichOneof("record_type") == "history":
                row = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in record.history.item}
                rows.setdefault(row["_step"], {}).update(row)
    return rows


def logged_numbers(run_dir):
    """metrics.jsonl as step -> {key: value}, finite numbers only (what the other trackers get)."""
    from rlpr.train.tracking import numbers, read_metrics

    out = {}
    for record in read_metrics(run_dir):
        step = record.pop("step")
        out.setdefault(step, {}).update(numbers(record))
    return out


# -- score B from the rollout's cache --------------------------------------------------------------

QUESTIONS = ["Capital of France?", "A much longer question about rivers and mountains?", "Why?"]


def forced_rollouts(model, tokenizer, prompts: list[list[int]], responses: list[list[int]]):
    """The rlpr decode loop drawing the given responses (ending at EOS, or cut at the longest's
    length), each row's cache kept as the engine keeps it."""
    steps = max(map(len, responses))
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), tokenizer.pad_token_id)
    attn = torch.zeros_like(ids)
    for r, p in enumerate(prompts):
        ids[r, width - len(p):], attn[r, width - len(p):] = torch.tensor(p), 1
    drawn = [0]

    def draw(logits, rows):
        step, drawn[0] = drawn[0], drawn[0] + 1
        return torch.tensor([responses[r][step] if step < len(responses[r]) else tokenizer.pad_token_id
                             for r in rows.tolist()])

    from rlpr.rollout.decode import sample
    from rlpr.rollout.kept_cache import KeptCaches

    keep = KeptCaches([len(p) for p in prompts], width, (tokenizer.eos_token_id,), None, model)
    new = sample(model, ids, attn, draw, max_new_tokens=steps, eos=tokenizer.eos_token_id,
                 pad=tokenizer.pad_token_id, keep=keep)
    for r, resp in enumerate(responses):
        assert new[r, :len(resp)].tolist() == resp
    return [keep.row(r, p, resp) for r, (p, resp) in enumerate(zip(prompts, responses))]


# the second response of each list is the longest: cut at max_new_tokens (no EOS)
R1_RESPONSES = ["<think>\nThe capital of France is Paris.\n</think>\n<answer> Paris </answer>",
                "<think>\nRivers flow downhill, always towards the sea, and the longest of them all is the Nile in "
                "Africa.\n</think>\n<answer>the Nile</answer>",
                "<think>\nhmm</think> <answer> because </answer>"]
FREE_RESPONSES = ["The capital of France is Paris.", "Rivers flow downhill, always towards the sea, and the longest "
                  "of them all is the Nile in Africa, so the Nile.  ", "I do not know"]


def score_b_both_ways(policy, tokenizer, case: str, on_copy: str = "auto") -> dict:
    """Score B of written responses (R1_RESPONSES with answer tags for case="r1", FREE_RESPONSES through
    the demo's fallback answer turn for "free"), recomputed and from caches kept by the decode loop
    drawing them from `policy`'s fp32 rollout copy: the reference log-probs ("fresh", "cached") and
    the reward outputs ("recomputed", "with_cache"). Checks that every text continued its cache past
    its prompt, on the rollout copy where reward.score_b_on_copy=`on_copy` says so (fp32: auto and
    always) and else on the policy."""
    from rlpr.config import load_config
    from rlpr.reward.probability_reward import ProbabilityReward
    from rlpr.rollout.hf import HFRollout

    overrides = ["reward.invalid_fallback=none", "reward.format_mode=r1", "reward.alpha=0.1"] if case == "r1" else []
    cfg = load_config("demo", overrides + [f"reward.score_b_on_copy={on_copy}"]).reward
    reward = ProbabilityReward(cfg, tokenizer, 1.0, 2048)
    engine = HFRollout(policy, tokenizer, torch.float32)
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                           tokenize=False) for q in QUESTIONS] * 2
    prompts = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    written = (R1_RESPONSES if case == "r1" else FREE_RESPONSES) * 2
    responses = [tokenizer(w, add_special_tokens=False)["input_ids"] + ([tokenizer.eos_token_id] if k % 3 != 1 else [])
                 for k, w in enumerate(written)]
    assert len(responses[1]) > max(len(r) for k, r in enumerate(responses) if k % 3 != 1)  # cut at max_new_tokens
    decoded = [tokenizer.decode(r, skip_special_tokens=True) for r in responses]
    caches = forced_rollouts(engine.model, tokenizer, prompts, responses)
    refs = ["Paris", "the Nile river", "because"] * 2
    items = [reward.score_b_text(p, r, y) for p, r, y in zip(texts, decoded, refs)]
    assert all(it is not None and it.fallback == (case == "free") for it in items)

    import rlpr.reward.scoring as scoring

    continued, runners = [], set()
    original = scoring.past_continuation_hidden

    def counted(model, pasts, *args):
        continued.extend(p.shape[-2] for p in pasts)
        runners.add(id(model))
        return original(model, pasts, *args)

    scoring.past_continuation_hidden = counted
    try:
        fresh = reward.reference_logprobs(policy, items)
        cached = reward.reference_logprobs(policy, items, caches=caches)
        with_cache = reward(policy, texts, decoded, refs, caches=caches)
    finally:
        scoring.past_continuation_hidden = original
    assert len(continued) == 2 * len(items)  # every text continued its cache (twice: two calls)
    assert sum(continued) > 2 * sum(map(len, prompts)) + len(items)  # past the prompts, into the responses
    assert runners == {id(engine.model) if on_copy != "never" else id(policy)}
    return {"fresh": fresh, "cached": cached, "with_cache": with_cache, "recomputed": reward(policy, texts, decoded, refs)}


def direct_logprobs(model, ids: list[int], start: int, temperature: float) -> torch.Tensor:
    """log_softmax(logits / T) of the full vocabulary [len(ids) - start, V] before each token from `start`:
    one plain forward over the whole sequence, no prefix sharing."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits[start - 1:len(ids) - 1] / temperature, dim=-1)


def step_samples(trainer, step: int = 1):
    """One step's trained responses with their old log-probs and OPSD's signal (as `Trainer._update` has
    them before its updates)."""
    from rlpr.train.update import fill_step_logprobs

    groups, _ = trainer.collect(step)
    samples = [s for g in trainer.make_samples(groups) for s in g]
    fill_step_logprobs(trainer.policy, samples, trainer.cfg, trainer.tokenizer.pad_token_id, old=True)
    return samples, trainer.distiller.prepare(samples, step)
