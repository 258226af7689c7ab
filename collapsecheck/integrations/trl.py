"""collapsecheck inside a TRL (or any transformers `Trainer`) training loop, in one line:

    trainer.add_callback(CollapseCallback(trainer, every=50))                 # the step's own
    trainer.add_callback(CollapseCallback(trainer, "probe.jsonl", every=50))  # a probe set

Every `every` optimizer steps it diagnoses the live policy, with no checkpoint written, from
either source:

- the step's own completions (no `probe_prompts`): the latest generation batch TRL's
  GRPOTrainer keeps for its completions log (prompts, completions, each reward function's
  values, weighted by `reward_weights` as TRL weights them), cross-scored as `collapsecheck
  score` does; nothing is sampled, so it costs little, but N is the batch's prompt count;
- a fixed probe set: K responses sampled for each probe prompt and judged as `collapsecheck
  scan` does, the same prompts at every step, so the numbers compare along the run.

A vision-language policy (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) works the same: TRL keeps the step's
prompts with their images, which are saved beside the completions and scored under (see
docs/vision.md).

Settings by name as for `scan` (`k=8`, `num_prompts=32`, `no_flow=True`, ...). Then:

- RAGEN-2's keys under `collapse/` (`Report.scalars`) go through the trainer's own `log`,
  so they land in `trainer_state.json`'s log_history and wherever the run reports (W&B,
  TensorBoard, ...), at the step they measure;
- the report and its SPEC dump are written to `output_dir/collapsecheck/step-N/`;
- with a gate (`fail_on`, `minimums`, as `--fail-on` and `--min-*`), a failed rule stops
  training (`control.should_training_stop`) and says why in the log.

Why the trainer is passed: the callback logs through `Trainer.log`, which a callback cannot
reach otherwise (transformers hands callbacks the logs only after the reporters have them).
TRL's `GRPOTrainer.log` is bypassed on purpose: it would flush TRL's own running metrics and
write its completions file at the callback's step.

Several processes (accelerate, torchrun): rank 0 runs the diagnosis, the others wait for its
numbers (a `torch.distributed` broadcast), so every rank logs the same keys and stops at the
same step. Parameters sharded across ranks (FSDP, DeepSpeed ZeRO-3) are refused when training
begins: a forward pass on rank 0 alone would need every rank; use
`collapsecheck.integrations.any_trainer.diagnose_batch` with the trainer's own log-probs there.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from collapsecheck.config import GateConfig, parse_fail_on
from collapsecheck.engines.backends.hf import TransformersBackend
from collapsecheck.engines.backends.hf_vlm import Vision, VisionLanguageBackend
from collapsecheck.errors import CollapsecheckError
from collapsecheck.files import write_text_atomic
from collapsecheck.inputs.images import with_image_files
from collapsecheck.inputs.trainer_rollouts.trl_completions import completion_row
from collapsecheck.measures.flow import FlowThresholds
from collapsecheck.measures.verdict import Thresholds
from collapsecheck.reports.dump import IMAGES_DIR
from collapsecheck.reports.gate import check_report, failures
from collapsecheck.reports.report import Report
from collapsecheck.runs.diagnose import scan, score
from collapsecheck.runs.preparation import read_prompt_set
from collapsecheck.setting_checks import checked
from collapsecheck.settings import LoadSettings, Settings, resolve_settings

__all__ = ["CollapseCallback"]

logger = logging.getLogger("collapsecheck")
REPORTS = "collapsecheck"  # under output_dir: step-N/ per diagnosis
COMPLETIONS = "completions.jsonl"  # in step-N/: the step's own completions, as scored


def tokenizer_of(processing_class: Any) -> Any:
    """A processor's tokenizer, or the tokenizer itself."""
    return getattr(processing_class, "tokenizer", processing_class)


def live_backend(model: Any, processing_class: Any, load: LoadSettings) -> TransformersBackend:
    """The live policy behind the two operations; a vision-language policy (a vision tower in
    its config) gets the vision-language backend, with its processor's image processor."""
    options = {"batch_tokens": load.batch_tokens, "sample_batch": load.sample_batch}
    tokenizer = tokenizer_of(processing_class)
    if getattr(model.config, "vision_config", None) is None:
        return TransformersBackend(model, tokenizer, **options)
    return VisionLanguageBackend(model, tokenizer, Vision.live(model, processing_class), **options)


def sharded(trainer: Any) -> str | None:
    """Which sharding of the parameters rules out a forward pass on rank 0 alone, if any."""
    if getattr(trainer, "is_fsdp_enabled", False):
        return "FSDP"
    if getattr(trainer, "is_deepspeed_enabled", False):
        from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

        if is_deepspeed_zero3_enabled():
            return "DeepSpeed ZeRO-3"
    return None


def from_rank_zero(payload: Any) -> Any:
    """Rank 0's `payload` on every rank (the others wait for it); as is in one process."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return payload
    box = [payload]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def require_completions(trainer: Any) -> tuple[dict[str, Any], list[str]]:
    """The trainer's completions log and its reward functions' names, or why there are none."""
    logs = getattr(trainer, "_logs", None)
    names = getattr(trainer, "reward_func_names", None)
    if not (isinstance(logs, dict) and {"prompt", "completion", "rewards"} <= set(logs) and names):
        raise CollapsecheckError(
            f"{type(trainer).__name__} keeps no completions a callback can read (TRL's "
            "GRPOTrainer does): give CollapseCallback probe_prompts to sample from"
        )
    return logs, names


def step_completions(trainer: Any, images: Path) -> list[dict[str, Any]]:
    """The trainer's latest generation batch as rollout rows (all processes' rows: TRL gathers
    them): what TRL's GRPOTrainer keeps in `_logs` for its completions log. A vision-language
    run's prompts hold their images (PIL): each is saved under `images`, and the row names
    it there."""
    logs, names = require_completions(trainer)
    weights = dict(zip(names, (float(w) for w in trainer.reward_weights), strict=True))
    source = f"{type(trainer).__name__}'s latest completions"
    rows = []
    for i, (prompt, completion) in enumerate(zip(logs["prompt"], logs["completion"], strict=True)):
        rewards = {name: float(logs["rewards"][name][i]) for name in names}
        prompt = with_image_files(prompt, images)
        rows.append(completion_row(prompt, completion, rewards, weights, f"{source}, row {i + 1}"))
    return rows


@dataclass(frozen=True)
class Outcome:
    """Rank 0's diagnosis of a step, as every rank receives it."""

    scalars: dict[str, float] = field(default_factory=dict)
    failed: str = ""  # the gate rules that failed, and why
    error: str = ""  # why there is no diagnosis
    fatal: bool = False  # a bug, not bad input: training stops on every rank


class CollapseCallback(TrainerCallback):
    """Diagnose the live policy every `every` steps, from the step's own completions or, with
    `probe_prompts` (JSONL, parquet or text, rendered as `scan` renders them), from responses
    sampled on that fixed set. `fail_on`: regimes that stop training (e.g.
    "template_collapse,low_entropy_collapse"); `minimums`: metric floors that stop it; none by
    default (monitor only). `settings` and `flags`: as for `scan`. The source and the settings
    are checked here, before training starts. A step whose traces cannot be diagnosed (bad
    input: no reasoning segment, one distinct prompt) is logged as a warning and training goes
    on; a bug in collapsecheck stops training on every rank."""

    def __init__(
        self,
        trainer: Any,
        probe_prompts: str | Path | None = None,
        every: int = 50,
        settings: Settings | None = None,
        *,
        fail_on: str | Iterable[str] | None = None,
        minimums: Mapping[str, float] | None = None,
        thresholds: Thresholds | None = None,
        flow_thresholds: FlowThresholds | None = None,
        **flags: Any,
    ) -> None:
        if every < 1:
            raise CollapsecheckError(f"every must be at least 1, got {every}")
        self.trainer = trainer
        self.probe = Path(probe_prompts) if probe_prompts is not None else None
        self.every = every
        self.settings = checked(resolve_settings(settings, flags))
        if self.probe is not None:
            read_prompt_set(self.probe, self.settings)  # a bad probe file fails now
        else:
            require_completions(trainer)  # a trainer that keeps no completions fails now
        regimes = "none" if fail_on is None else fail_on
        self.gate = GateConfig(
            thresholds=thresholds or Thresholds(),
            flow_thresholds=flow_thresholds or FlowThresholds(),
            fail_on=parse_fail_on(regimes if isinstance(regimes, str) else list(regimes),
                                  "fail_on"),
            minimums=dict(minimums or {}),
            source="CollapseCallback",
        )  # fmt: skip
        self.reports: dict[int, Report] = {}  # on rank 0: the diagnosis of each step

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **_: Any
    ) -> None:
        how = sharded(self.trainer)
        if how is not None:
            raise CollapsecheckError(
                f"CollapseCallback needs the whole model on rank 0, but {how} shards it: use "
                "collapsecheck.integrations.any_trainer.diagnose_batch with the trainer's own "
                "log-probabilities"
            )

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **_: Any
    ) -> TrainerControl:
        step = state.global_step
        if step % self.every != 0:
            return control
        outcome = from_rank_zero(self.attempt(args, step) if state.is_world_process_zero else None)
        if outcome.fatal:
            raise RuntimeError(f"collapsecheck failed at step {step}: {outcome.error}")
        self.log(outcome.scalars)
        if state.is_world_process_zero and (outcome.error or outcome.failed):
            what = "could not diagnose" if outcome.error else "stops training at"
            logger.warning(
                "collapsecheck %s step %d: %s", what, step, outcome.error or outcome.failed
            )
        if outcome.failed:
            control.should_training_stop = True
        return control

    def attempt(self, args: TrainingArguments, step: int) -> Outcome:
        """The diagnosis of `step` on rank 0, whatever happens (the other ranks wait for it)."""
        try:
            return self.diagnose(args, step)
        except CollapsecheckError as error:
            return Outcome({"collapse/diagnosis_failed": 1.0}, error=str(error))
        except Exception as error:  # every rank must hear of it, or they wait forever
            return Outcome(error=f"{type(error).__name__}: {error}", fatal=True)

    def diagnose(self, args: TrainingArguments, step: int) -> Outcome:
        """The live policy's diagnosis at `step`: its keys for the log and the failed rules;
        the report and its dump in output_dir/collapsecheck/step-N/."""
        model = self.trainer.model
        was_training = model.training
        model.eval()
        started = time.perf_counter()
        dump = Path(args.output_dir) / REPORTS / f"step-{step}"
        common = {
            "thresholds": self.gate.thresholds, "flow_thresholds": self.gate.flow_thresholds,
            "dump": dump,
        }  # fmt: skip
        name = f"{args.output_dir} at step {step} (live policy)"
        try:
            backend = live_backend(model, self.trainer.processing_class, self.settings.load)
            if self.probe is not None:
                report = scan(name, self.probe, self.settings, loaded=backend, **common)
            else:
                rows = step_completions(self.trainer, dump / IMAGES_DIR)
                text = "".join(json.dumps(row, default=str) + "\n" for row in rows)
                completions = write_text_atomic(dump / COMPLETIONS, text)
                report = score(name, completions, self.settings, loaded=backend, **common)
        finally:
            model.train(was_training)
        self.reports[step] = report
        scalars = report.scalars()
        scalars["collapse/diagnosis_s"] = round(time.perf_counter() - started, 3)
        failed = failures(check_report(report, self.gate))
        scalars["collapse/gate_failed"] = float(bool(failed))
        return Outcome(scalars, "; ".join(f"rule {r.name}: {r.message}" for r in failed))

    def log(self, scalars: dict[str, float]) -> None:
        """Through transformers' `Trainer.log` (log_history, every reporter), not TRL's
        override (see the module's docstring)."""
        from transformers import Trainer

        Trainer.log(self.trainer, dict(scalars))
