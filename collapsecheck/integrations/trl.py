"""collapsecheck inside a TRL (or any transformers `Trainer`) training loop, in one line:

    trainer.add_callback(CollapseCallback(trainer, "probe.jsonl", every=50))

Every `every` optimizer steps it diagnoses the live policy, with no checkpoint written: K
responses sampled for each prompt of a fixed probe set, cross-scored, measured and judged as
`collapsecheck scan` does (the same settings, by name: `k=8`, `num_prompts=32`, ...). Then:

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

import logging
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from collapsecheck.backends.hf import TransformersBackend
from collapsecheck.config import GateConfig, parse_fail_on
from collapsecheck.errors import CollapsecheckError
from collapsecheck.flow import FlowThresholds
from collapsecheck.gate import check_report, failures
from collapsecheck.report import Report
from collapsecheck.scan import read_prompt_set, scan
from collapsecheck.setting_checks import checked
from collapsecheck.settings import Settings, resolve_settings
from collapsecheck.verdict import Thresholds

__all__ = ["CollapseCallback"]

logger = logging.getLogger("collapsecheck")
REPORTS = "collapsecheck"  # under output_dir: step-N/ per diagnosis


def tokenizer_of(processing_class: Any) -> Any:
    """A processor's tokenizer, or the tokenizer itself."""
    return getattr(processing_class, "tokenizer", processing_class)


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


class CollapseCallback(TrainerCallback):
    """Diagnose the live policy every `every` steps on `probe_prompts` (JSONL, parquet or
    text, rendered as `scan` renders them: `as_chat=True` for plain-text prompts to a chat
    model). `fail_on`: regimes that stop training (e.g. "template_collapse,
    low_entropy_collapse"); `minimums`: metric floors that stop it; none by default (monitor
    only). `settings` and `flags`: as for `scan` (`k`, `num_prompts`, `max_new_tokens`, ...);
    the probe file and the settings are checked here, before training starts."""

    def __init__(
        self,
        trainer: Any,
        probe_prompts: str | Path,
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
        self.probe = Path(probe_prompts)
        self.every = every
        self.settings = checked(resolve_settings(settings, flags))
        read_prompt_set(self.probe, self.settings)  # a bad probe file fails now, not at step N
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
        outcome = self.diagnose(args, step) if state.is_world_process_zero else None
        scalars, failed = from_rank_zero(outcome)
        self.log(scalars)
        if failed:
            if state.is_world_process_zero:
                logger.warning("collapsecheck stops training at step %d: %s", step, failed)
            control.should_training_stop = True
        return control

    def diagnose(self, args: TrainingArguments, step: int) -> tuple[dict[str, float], str]:
        """The live policy's diagnosis at `step`: its keys for the log and, when a gate rule
        failed, why (else "")."""
        model = self.trainer.model
        was_training = model.training
        model.eval()
        started = time.perf_counter()
        try:
            backend = TransformersBackend(
                model, tokenizer_of(self.trainer.processing_class),
                batch_tokens=self.settings.load.batch_tokens,
                sample_batch=self.settings.load.sample_batch,
            )  # fmt: skip
            report = scan(
                f"{args.output_dir} at step {step} (live policy)", self.probe, self.settings,
                thresholds=self.gate.thresholds, flow_thresholds=self.gate.flow_thresholds,
                dump=Path(args.output_dir) / REPORTS / f"step-{step}", loaded=backend,
            )  # fmt: skip
        finally:
            model.train(was_training)
        self.reports[step] = report
        scalars = report.scalars()
        scalars["collapse/diagnosis_s"] = round(time.perf_counter() - started, 3)
        failed = failures(check_report(report, self.gate))
        scalars["collapse/gate_failed"] = float(bool(failed))
        return scalars, "; ".join(f"rule {r.name}: {r.message}" for r in failed)

    def log(self, scalars: dict[str, float]) -> None:
        """Through transformers' `Trainer.log` (log_history, every reporter), not TRL's
        override (see the module's docstring)."""
        from transformers import Trainer

        Trainer.log(self.trainer, dict(scalars))
