"""The sampling stage of a scan: K traces per prompt, sampled once.

- Kept: with a results cache, each prompt's traces go to a samples entry keyed by what
  changes sampling alone (`Settings.sampling_key`), as soon as its batch is drawn. Another
  scan of the same checkpoint and prompts with other scoring settings (another reasoning
  segment, negatives, flow or rewards), or the same scan after a kill, reads them back and
  samples only what is missing.
- Checked early: the first prompts' traces are sampled before the rest (at least
  PROBE_RESPONSES of them), and when none holds a reasoning segment, nor even one of its
  tags, the scan stops there, saying which option to pass, instead of after sampling
  everything.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collapsecheck.engines.backends.base import Backend, SamplingParams
from collapsecheck.engines.reasoning import TAGS, ReasoningSpec, extract_traces, reasoning_spec
from collapsecheck.errors import CollapsecheckError
from collapsecheck.files import locked, write_text_atomic
from collapsecheck.inputs.prompts import RenderedPrompt
from collapsecheck.inputs.samples import Sample
from collapsecheck.inputs.scan_dump import PROMPTS_FILE
from collapsecheck.progress import ProgressHook
from collapsecheck.reports.dump import prompt_rows, write_images
from collapsecheck.runs.preparation import Prepared
from collapsecheck.settings import PromptSettings, Settings

SAMPLES_FILE = "samples.jsonl"  # one line per prompt: its K samples' ids, appended as drawn
PROBE_RESPONSES = 8  # responses sampled first, to see whether they hold a reasoning segment
SHOWN_CHARS = 160  # of the response shown when none holds a reasoning segment


@dataclass(frozen=True)
class SampleStore:
    """A samples entry of the results cache: the rendered prompts (prompts.jsonl, the
    dump's format) and samples.jsonl. A line cut short by a kill is ignored on reading."""

    directory: Path

    def open(self, rendered: Sequence[RenderedPrompt], k: int) -> dict[int, list[Sample]]:
        """Carry on the entry for these prompts, or begin it (an entry made for other prompts
        is begun again): the samples it keeps for them, by prompt index."""
        prompts = self.directory / PROMPTS_FILE
        text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in prompt_rows(rendered))
        if prompts.is_file() and prompts.read_text(encoding="utf-8") == text:
            self._drop_cut_line()
            return self._kept(len(rendered), k)
        (self.directory / SAMPLES_FILE).unlink(missing_ok=True)
        write_images(self.directory, rendered)
        write_text_atomic(prompts, text)
        return {}

    def _kept(self, count: int, k: int) -> dict[int, list[Sample]]:
        """The whole lines of samples.jsonl, for prompts below `count` with K samples each."""
        samples = self.directory / SAMPLES_FILE
        if not samples.is_file():
            return {}
        kept: dict[int, list[Sample]] = {}
        for line in samples.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
                group = [Sample(tuple(s["ids"]), bool(s["truncated"])) for s in row["samples"]]
                index = int(row["prompt_index"])
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                continue  # not a whole line
            if 0 <= index < count and len(group) == k:
                kept[index] = group
        return kept

    def clear(self) -> None:
        """Forget the samples kept (--rescan samples afresh)."""
        with locked(self.directory):
            (self.directory / SAMPLES_FILE).unlink(missing_ok=True)

    def _drop_cut_line(self) -> None:
        """Cut off a last line a kill left without its end, so the next one starts afresh."""
        path = self.directory / SAMPLES_FILE
        if not path.is_file():
            return
        data = path.read_bytes()
        if data and not data.endswith(b"\n"):
            with path.open("r+b") as stream:
                stream.truncate(data.rfind(b"\n") + 1)

    def add(self, first: int, groups: Sequence[Sequence[Sample]]) -> None:
        """Append the samples of prompts `first`, `first + 1`, ..., one line each."""
        lines = "".join(
            json.dumps(
                {
                    "prompt_index": first + offset,
                    "samples": [{"ids": list(s.ids), "truncated": s.truncated} for s in group],
                }
            )
            + "\n"
            for offset, group in enumerate(groups)
        )
        with (self.directory / SAMPLES_FILE).open("a", encoding="utf-8") as stream:
            stream.write(lines)


Check = Callable[[dict[int, list[Sample]]], None]


def missing_runs(done: set[int], count: int) -> list[range]:
    """The prompt indices not in `done`, as runs of consecutive indices."""
    runs: list[range] = []
    for index in range(count):
        if index in done:
            continue
        if runs and runs[-1].stop == index:
            runs[-1] = range(runs[-1].start, index + 1)
        else:
            runs.append(range(index, index + 1))
    return runs


def probe_split(runs: list[range], k: int) -> list[range]:
    """The runs with the first cut after ceil(PROBE_RESPONSES / K) prompts: those are
    sampled, and checked, before the rest."""
    if not runs:
        return runs
    first, size = runs[0], math.ceil(PROBE_RESPONSES / k)
    if len(first) <= size:
        return runs
    return [first[:size], first[size:], *runs[1:]]


def sample_prompts(
    backend: Backend,
    rendered: Sequence[RenderedPrompt],
    params: SamplingParams,
    progress: ProgressHook,
    store: SampleStore | None,
    check: Check,
) -> tuple[list[list[Sample]], int]:
    """K samples per prompt, and how many prompts' samples were read from `store` rather
    than sampled. `check` sees the first samples in hand (kept, or the first
    PROBE_RESPONSES drawn) before the rest are drawn, and raises to stop the scan."""
    kept = store.open(rendered, params.k) if store is not None else {}
    if kept:
        check(kept)
    runs = probe_split(missing_runs(set(kept), len(rendered)), params.k)
    if runs:
        advance = progress("sampling", sum(len(run) for run in runs))
        ids = [r.ids for r in rendered]
        for number, run in enumerate(runs):
            drawn = backend.generate([ids[i] for i in run], params, advance, offset=run.start)
            if store is not None:
                store.add(run.start, drawn)
            kept.update(zip(run, drawn, strict=True))
            if number == 0 and len(kept) == len(run):
                check(dict(zip(run, drawn, strict=True)))
    return [kept[i] for i in range(len(rendered))], len(rendered) - sum(map(len, runs))


def mentions_a_tag(response: str, spec: ReasoningSpec) -> bool:
    """Whether a response holds the open or the close tag of a tag-delimited segment."""
    return spec.mode == TAGS and (spec.open_tag in response or spec.close_tag in response)


def reasoning_check(
    decode: Callable[[Sequence[int]], str],
    spec: ReasoningSpec,
    opened: Sequence[bool],
    hint: str,
) -> Check:
    """A `Check` that stops the scan when none of the samples in hand holds a reasoning
    segment, nor even one of its tags (a policy that writes the tags, if not yet a whole
    segment, is sampled to the end and counted as usual): the error says how many were
    looked at, shows one response cut short, and what to pass (`hint`)."""

    def check(samples: dict[int, list[Sample]]) -> None:
        indices = sorted(samples)
        traces = extract_traces(
            [samples[i] for i in indices], decode, spec, [opened[i] for i in indices]
        )
        if any(t.valid or mentions_a_tag(t.response, spec) for t in traces):
            return
        shown = traces[0].response if traces else ""
        shown = shown[:SHOWN_CHARS] + ("..." if len(shown) > SHOWN_CHARS else "")
        raise CollapsecheckError(
            f"none of the first {len(traces)} responses (prompts {indices[0]}-{indices[-1]}) "
            f"has a reasoning segment {spec.describe()}, so the scan stopped before sampling "
            f"the rest; {hint}. The first response: {shown!r}"
        )

    return check


def scoring_temperature(sampled_at: float) -> float:
    """The temperature scoring reads the policy at: the one the traces were sampled at, as
    veRL's `compute_log_prob` divides by the rollout temperature (greedy, 0: 1, warned)."""
    return sampled_at if sampled_at > 0 else 1.0


def temperature_warnings(sampled_at: float, how: str = "sampled") -> list[str]:
    """What the numbers describe when the traces were `how` at a temperature other than 1."""
    if sampled_at == 0:
        return [
            f"{how} greedily (temperature 0): the traces are the policy's single most likely "
            "ones, scored at temperature 1; entropy and MI describe these, not the policy"
        ]
    if sampled_at != 1:
        return [
            f"{how} at temperature {sampled_at:g} and scored there: every number describes the "
            f"policy at temperature {sampled_at:g}, not at 1"
        ]
    return []


def sampling_warnings(params: SamplingParams) -> tuple[str, ...]:
    """What the numbers describe when the sampling was not the policy's own distribution."""
    said = temperature_warnings(params.temperature)
    if params.top_p < 1:
        said.append(
            f"sampled with top-p {params.top_p:g}, scored without the cut (a nucleus differs from "
            "context to context, so cross-scoring cannot apply it): entropy and MI describe these "
            "trimmed traces under the untrimmed policy"
        )
    return tuple(said)


def sample(
    backend: Backend,
    prepared: Prepared,
    params: SamplingParams,
    settings: Settings,
    progress: ProgressHook,
    samples: Path | None,
) -> tuple[list[list[Sample]], int]:
    """K samples per prompt (`runs.sampling`): those a samples entry keeps read back, the
    rest sampled, the first checked for a reasoning segment before the others are drawn.
    Returns them and how many prompts' samples were read back."""
    check = reasoning_check(
        backend.decode, reasoning_spec(settings.scoring), prepared.opened,
        no_reasoning_hint(prepared, backend.tokenizer, settings.prompts),
    )  # fmt: skip
    store = SampleStore(samples) if samples is not None else None
    return sample_prompts(backend, prepared.rendered, params, progress, store, check)


def no_reasoning_hint(prepared: Prepared, tokenizer: Any, rendering: PromptSettings) -> str:
    """What to try when no response has a reasoning segment: the prompt rendering first, when
    plain-text prompts went to a chat model verbatim, else another segment."""
    plain = not any(p.is_chat for p in prepared.prompts)
    if plain and not rendering.as_chat and getattr(tokenizer, "chat_template", None):
        return (
            "the prompts are plain text given to the model verbatim, but the checkpoint has a "
            "chat template: pass --as-chat (and --system-prompt TEXT if the policy was trained "
            "with one) so they are rendered as in training"
        )
    return (
        "pick another segment with --reasoning-tags OPEN,CLOSE, --reasoning-regex or "
        "--whole-response"
    )
