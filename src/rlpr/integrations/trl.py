"""The RLPR reward inside TRL's `GRPOTrainer` (TRL >= 1.16): `RLPRReward`.

TRL calls a reward function with the prompts, the decoded completions, their token ids and the
dataset's other columns, never with the policy; the RLPR reward needs it (score B is the current
policy's probability of the reference answer after the response). `RLPRReward` is a reward
function that, once bound to the trainer (`reward.bind(trainer)`, after the trainer is built),
scores every completion with the trainer's current policy through rlpr's own `ProbabilityReward`
(rlpr/reward/probability_reward.py): the same texts o', score B, score A (by default from the
initial policy: the adapter-off base under LoRA, TRL's reference model when `beta > 0`, else
computed for every dataset prompt when bound), shaping, format and repetition terms, all set by
`RewardConfig`. Nothing of the reward is re-implemented here: this module only translates TRL's
calling convention (prompts as TRL renders them, completions as text, the reference column,
group ids) and logs rlpr's per-response scores through TRL's `log_metric` / `log_extra`.

What does not map (docs/trl.md): rlpr's EMA std filter with dynamic sampling (a sampling filter,
not a reward), its advantage estimators and loss (TRL's `scale_rewards`, `loss_type`, `epsilon`
and `beta` take their place). TRL is imported only by `bind`; rlpr does not depend on it
(`pip install 'rlpr[trl]'`).
"""

from __future__ import annotations

from rlpr.config import Config, RewardConfig, validate
from rlpr.errors import ConfigError, DataError
from rlpr.reward.kinds import REWARD_KINDS
from rlpr.model.forward import causal_lm
from rlpr.reward.probability_reward import ProbabilityReward, RewardOutput
from rlpr.reward.scoring import GROUP_AGGREGATIONS

MIN_TRL = "1.16"
# the keyword arguments TRL adds to the dataset's columns (they are not data)
TRL_KWARGS = ("trainer_state", "log_extra", "log_metric", "environments")


def require_trl():
    """The `trl` module, or a one-line error saying how to install it."""
    try:
        import trl
    except ImportError:
        raise ConfigError(f"rlpr.integrations.trl needs TRL >= {MIN_TRL}: pip install 'rlpr[trl]'") from None
    from packaging.version import Version

    if Version(trl.__version__) < Version(MIN_TRL):
        raise ConfigError(f"rlpr.integrations.trl needs TRL >= {MIN_TRL}, found {trl.__version__}: "
                          "pip install -U 'rlpr[trl]'")
    return trl


def _is_peft(model) -> bool:
    return callable(getattr(model, "disable_adapter", None)) and hasattr(model, "peft_config")


def _zero_stage(trainer) -> int | None:
    plugin = getattr(getattr(trainer.accelerator, "state", None), "deepspeed_plugin", None)
    return getattr(plugin, "zero_stage", None)


class RLPRReward:
    """A TRL reward function: rlpr's probability reward, scored with the bound trainer's current policy.

    ```python
    reward = RLPRReward(RewardConfig(), reference_column="reference")
    trainer = GRPOTrainer(model=..., args=GRPOConfig(...), reward_funcs=reward, train_dataset=...)
    reward.bind(trainer)  # the policy, tokenizer, temperature and chat template come from the trainer
    trainer.train()
    ```

    `reference_column`: the dataset column with the reference answer y* (a string or a number).
    `score_a_column`: an optional column with a precomputed score A (used as rlpr uses its
    dataset's `score_a`: for format-valid responses). `data_source_column`: picks rlpr's grader
    (only the `verifier` and `hybrid` kinds grade). `name`: TRL's name for the reward (its
    metrics are `rewards/<name>/mean`, ...); rlpr's own scores are logged as `rlpr/score_b_mean`,
    `rlpr/score_a_mean`, ... and as `rlpr/score_b`, `rlpr/score_a` columns of the completions table.
    """

    def __init__(self, config: RewardConfig | None = None, *, reference_column: str = "reference",
                 score_a_column: str = "score_a", data_source_column: str = "data_source", name: str = "rlpr"):
        self.config = config or RewardConfig()
        validate(Config(reward=self.config), sections=("reward",))
        if REWARD_KINDS[self.config.kind].token_signal is not None:
            raise ConfigError(f"RLPRReward: reward.kind={self.config.kind} is a per-token signal of rlpr's own trainer "
                              "(docs/opsd.md), not a reward per completion; use rlpr train")
        self.reference_column = reference_column
        self.score_a_column = score_a_column
        self.data_source_column = data_source_column
        self.__name__ = name  # what TRL's get_callable_name reads
        self.trainer = None
        self.reward: ProbabilityReward | None = None

    # -- binding --------------------------------------------------------------------------------
    def bind(self, trainer) -> "RLPRReward":
        """Score with `trainer`'s policy (a `trl.GRPOTrainer` whose `reward_funcs` hold this reward).

        Under `reward.score_a=initial` with neither LoRA nor a TRL reference model (`beta=0`, full
        fine-tuning), score A of every prompt of the train and eval datasets is computed now, with
        the policy before training, as `rlpr train` does."""
        trl = require_trl()
        if not isinstance(trainer, trl.GRPOTrainer):
            raise ConfigError(f"RLPRReward.bind: expected a trl.GRPOTrainer, got {type(trainer).__name__}")
        if not any(f is self for f in trainer.reward_funcs):
            raise ConfigError("RLPRReward.bind: this reward is not among the trainer's reward_funcs")
        if getattr(trainer, "is_fsdp_enabled", False) or _zero_stage(trainer) == 3:
            raise ConfigError("RLPRReward: FSDP and DeepSpeed ZeRO-3 are not supported (the reward runs the "
                              "policy's decoder and output layer outside the sharded forward); use DDP or ZeRO-1/2")
        self.trainer = trainer
        processing = trainer.processing_class
        self.tokenizer = getattr(processing, "tokenizer", processing)
        policy = self.policy()
        max_length = getattr(causal_lm(policy).config, "max_position_embeddings", None)
        self.reward = ProbabilityReward(self.config, self.tokenizer, trainer.args.temperature, max_length)
        self._bind_score_a(policy)
        if self.reward.score_a.needs_upfront:
            self.precompute(trainer.train_dataset, trainer.eval_dataset)
        return self

    def policy(self):
        """The trainer's current policy, unwrapped from its distributed wrapper."""
        return self.trainer.accelerator.unwrap_model(self.trainer.model)

    def _bind_score_a(self, policy) -> None:
        ref = self.trainer.ref_model
        ref = self.trainer.accelerator.unwrap_model(ref) if ref is not None else None
        self.reward.score_a.bind(policy, lora=_is_peft(policy), reference=ref)

    def precompute(self, *datasets) -> None:
        """Score A with the policy as it is now for every (prompt, reference) of `datasets`
        (datasets.Dataset objects, lists of rows, dicts of them, or None)."""
        rows = []
        for dataset in datasets:
            for part in (dataset.values() if isinstance(dataset, dict) else [dataset]):
                if part is None:
                    continue
                try:
                    len(part)
                except TypeError:
                    raise ConfigError(
                        "RLPRReward: reward.score_a=initial with full fine-tuning and no reference model (beta=0) "
                        "computes score A for every prompt before training, which an IterableDataset cannot "
                        "give; use LoRA (peft_config), beta > 0 or reward.score_a=current") from None
                columns = getattr(part, "column_names", None) or (list(part[0]) if len(part) else [])
                for column in ("prompt", self.reference_column):
                    if column not in columns:
                        raise ConfigError(f"RLPRReward: the dataset has no column '{column}' (its columns: "
                                          f"{', '.join(sorted(columns)) or 'none'})")
                for i, row in enumerate(part):
                    rows.append((self.prompt_text(row["prompt"]), self._reference(row.get(self.reference_column), i),
                                 self._given_a(row.get(self.score_a_column))))
        self.reward.score_a.precompute_texts(rows)

    # -- the reward function ----------------------------------------------------------------------
    def __call__(self, prompts: list, completions: list, completion_ids: list | None = None,
                 **columns) -> list[float]:
        """TRL's reward-function call: one float per completion."""
        if self.reward is None:
            raise ConfigError("RLPRReward is not bound to a trainer: call reward.bind(trainer) after building "
                              "the GRPOTrainer")
        outputs = self.score(prompts, completions, **columns)
        self._log(outputs, columns.get("log_metric"), columns.get("log_extra"))
        return [o.reward for o in outputs]

    def score(self, prompts: list, completions: list, **columns) -> list[RewardOutput]:
        """rlpr's full output per completion (score B, score A, format, ...), with the current policy."""
        n = len(prompts)
        data = {k: v for k, v in columns.items() if k not in TRL_KWARGS}
        if self.reference_column not in data:
            raise ConfigError(f"RLPRReward: the dataset has no column '{self.reference_column}' (its columns: "
                              f"{', '.join(sorted(data)) or 'none'}); pass reference_column=...")
        references = [self._reference(r, i) for i, r in enumerate(data[self.reference_column])]
        given_a = [self._given_a(a) for a in data.get(self.score_a_column, [None] * n)]
        texts = [self.prompt_text(p) for p in prompts]
        responses = [self._response_text(c) for c in completions]
        policy = self.policy()
        if policy is not self.reward.score_a.policy:  # e.g. wrapped after bind
            self._bind_score_a(policy)
        correct = self._grades(prompts, responses, references, data) if self.reward.kind.needs_grader else None
        return self.reward(policy, texts, responses, references, precomputed_a=given_a, correct=correct,
                           groups=self._groups(n))

    # -- TRL's conventions ------------------------------------------------------------------------
    def prompt_text(self, prompt) -> str:
        """The prompt as TRL feeds it to the model: a string as is, chat messages through the
        tokenizer's chat template (TRL's tools, template and chat_template_kwargs) with the
        generation prompt."""
        if isinstance(prompt, str):
            return prompt
        t = self.trainer
        return self.tokenizer.apply_chat_template(
            prompt, tools=t.tools or None, chat_template=t.chat_template, add_generation_prompt=True,
            tokenize=False, **t.chat_template_kwargs)

    @staticmethod
    def _response_text(completion) -> str:
        if isinstance(completion, str):
            return completion
        if len(completion) == 1 and isinstance(completion[0].get("content"), str):
            return completion[0]["content"]
        raise ConfigError("RLPRReward: a completion of several messages or of non-text content (tool calls, "
                          "images) is not supported; the RLPR reward scores one text response")

    def _reference(self, value, row: int) -> str:
        if isinstance(value, bool) or not isinstance(value, (str, int, float)) or not str(value).strip():
            raise DataError(f"RLPRReward: column '{self.reference_column}', row {row}: the reference must be a "
                            f"non-empty string or a number, got {value!r:.60}")
        return str(value).strip()  # as rlpr's loaders and `rlpr score` read it

    def _given_a(self, value) -> float | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise DataError(f"RLPRReward: column '{self.score_a_column}' must hold numbers, got {value!r:.60}")
        return float(value)

    def _groups(self, n: int) -> list[int]:
        """A group id per completion: TRL's groups are runs of num_generations completions of the
        global batch, of which this process holds the slice [process_index * n, (process_index + 1) * n)."""
        t = self.trainer
        size = t.num_generations if t.model.training else t.num_generations_eval
        start = t.accelerator.process_index * n
        if (self.reward.kind.group_transform is not None or self.config.aggregation in GROUP_AGGREGATIONS) \
                and (start % size or n % size):
            raise ConfigError(f"RLPRReward: reward.kind={self.config.kind} / reward.aggregation="
                              f"{self.config.aggregation} need whole groups on each process; make "
                              "per_device_train_batch_size * steps_per_generation a multiple of num_generations")
        return [(start + i) // size for i in range(n)]

    def _grades(self, prompts, responses, references, data) -> list[bool]:
        """rlpr's rule grader's verdicts (the verifier and hybrid kinds)."""
        from rlpr.data.records import Example
        from rlpr.grading import grade_example

        sources = data.get(self.data_source_column, [""] * len(prompts))
        return [grade_example(Example(prompt=[{"role": "user", "content": p}] if isinstance(p, str) else list(p),
                                      reference=y, data_source=str(s or "")), r).correct
                for p, r, y, s in zip(prompts, responses, references, sources)]

    @staticmethod
    def _log(outputs: list[RewardOutput], log_metric, log_extra) -> None:
        n = max(len(outputs), 1)
        if log_metric is not None:
            for key, value in (("score_b_mean", sum(o.score_b for o in outputs) / n),
                               ("score_a_mean", sum(o.score_a for o in outputs) / n),
                               ("delta_mean", sum(o.delta for o in outputs) / n),
                               ("format_rate", sum(o.format for o in outputs) / n),
                               ("valid_frac", sum(o.valid for o in outputs) / n),
                               ("fallback_frac", sum(o.fallback for o in outputs) / n),
                               ("repetition_frac", sum(o.penalty < 0 for o in outputs) / n)):
                log_metric(f"rlpr/{key}", float(value))
            graded = [o.correct for o in outputs if o.correct is not None]
            if graded:
                log_metric("rlpr/accuracy", sum(graded) / len(graded))
        if log_extra is not None:
            log_extra("rlpr/score_b", [o.score_b for o in outputs])
            log_extra("rlpr/score_a", [o.score_a for o in outputs])
