"""The `--dump DIR` files of SPEC "Dump format", written and read back: enough to redo the
analysis elsewhere, to resume a scan from its samples, or to score its traces again.
Every file is written atomically (`collapsecheck.files`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np

from collapsecheck.engines.cross_scoring import (
    CrossScores,
    FlowScores,
    first_of_each,
)
from collapsecheck.engines.reasoning import Trace
from collapsecheck.errors import CollapsecheckError
from collapsecheck.files import write_atomic, write_jsonl_atomic
from collapsecheck.inputs.episodes import EPISODES_FILE, Episode
from collapsecheck.inputs.prompts import RenderedPrompt
from collapsecheck.inputs.scan_dump import IMAGES_DIR, PROMPTS_FILE, TRACES_FILE, read_jsonl
from collapsecheck.measures.early_answer import EarlyLogProbs
from collapsecheck.measures.flow import FlowLogProbs
from collapsecheck.measures.metrics import CrossLogProbs, PromptCounts, count_per_prompt
from collapsecheck.measures.token_information import TokenInformation

MATRIX_FILE = "cross_logprobs.npz"
FLOW_FILE = "action_logprobs.npz"
PRIOR_FILE = "prior_logprobs.npz"
TOKENS_FILE = "token_information.npz"
PER_PROMPT_FILE = "per_prompt.jsonl"
REPORT_FILE = "report.json"


def prompt_rows(rendered: Sequence[RenderedPrompt]) -> list[dict[str, Any]]:
    rows = [{"index": i, "text": p.text, "ids": list(p.ids)} for i, p in enumerate(rendered)]
    for row, prompt in zip(rows, rendered, strict=True):
        if prompt.images:
            row["images"] = [
                {"slot": slot, "source": image.source, "sha256": image.sha256}
                for slot, image in prompt.images
            ]
    return rows


def write_images(directory: Path, rendered: Sequence[RenderedPrompt]) -> None:
    """The prompts' images under IMAGES_DIR, so that the dump can be scored again anywhere."""
    for prompt in rendered:
        for _, image in prompt.images:
            path = directory / IMAGES_DIR / image.sha256
            if not path.is_file():
                write_atomic(path, "wb", lambda stream, data=image.data: stream.write(data))


def trace_rows(traces: Sequence[Trace]) -> list[dict[str, Any]]:
    return [
        {
            "prompt_index": t.prompt_index,
            "sample_index": t.sample_index,
            "response": t.response,
            "response_ids": list(t.response_ids),
            "prefix_ids": list(t.prefix_ids),
            "reasoning_ids": list(t.reasoning_ids),
            "reasoning": t.reasoning,
            "valid": t.valid,
            "truncated": t.truncated,
            "mid_ids": list(t.mid_ids),
            "action_ids": list(t.action_ids),
            "action": t.action,
            "flow_valid": t.flow_valid,
        }
        for t in traces
    ]


def write_samples(
    directory: Path, rendered: Sequence[RenderedPrompt], traces: Sequence[Trace]
) -> None:
    """prompts.jsonl (and the prompts' images) and traces.jsonl: written as soon as sampling
    ends."""
    write_images(directory, rendered)
    write_jsonl_atomic(directory / PROMPTS_FILE, prompt_rows(rendered))
    write_jsonl_atomic(directory / TRACES_FILE, trace_rows(traces))


def write_per_prompt(directory: Path, table: Sequence[dict[str, Any]]) -> None:
    """SPEC "Per-prompt table": one row per prompt."""
    write_jsonl_atomic(directory / PER_PROMPT_FILE, table)


def write_matrix(directory: Path, scores: CrossScores) -> None:
    def save(stream: IO[bytes]) -> None:
        np.savez(
            stream,
            sum=scores.matrix.sum,
            mean=scores.matrix.mean,
            row_prompt_index=scores.matrix.row_prompt,
            row_trace_index=scores.row_trace_index,
            reasoning_tokens=scores.reasoning_tokens,
            **({} if scores.matrix.is_full else {"scored": scores.matrix.scored}),
            **({} if scores.image_swapped is None else {"image_swapped_sum": scores.image_swapped}),
        )

    write_atomic(directory / MATRIX_FILE, "wb", save)
    if scores.flow is not None:
        write_flow(directory, scores.flow)


def write_flow(directory: Path, flow: FlowScores) -> None:
    """SPEC's action_logprobs.npz: the three action matrices (NaN where not scored) and,
    with early answering, `early` (M_A x |F|) and `early_fractions` (F)."""
    early = {}
    if flow.early is not None:
        early = {"early": flow.early.values, "early_fractions": np.array(flow.early.fractions)}

    def save(stream: IO[bytes]) -> None:
        np.savez(
            stream,
            input=flow.logprobs.input,
            reasoning=flow.logprobs.reasoning,
            natural=flow.logprobs.natural,
            row_trace_index=flow.row_trace_index,
            action_tokens=flow.action_tokens,
            **early,
        )

    write_atomic(directory / FLOW_FILE, "wb", save)


def write_prior(directory: Path, prior: np.ndarray, scores: CrossScores) -> None:
    """SPEC's prior_logprobs.npz: each scored row's reasoning under the baseline, in the
    rows of cross_logprobs.npz."""

    def save(stream: IO[bytes]) -> None:
        np.savez(
            stream, prior=prior, row_trace_index=scores.row_trace_index,
            reasoning_tokens=scores.reasoning_tokens,
        )  # fmt: skip

    write_atomic(directory / PRIOR_FILE, "wb", save)


def write_token_information(directory: Path, tokens: TokenInformation, text: Sequence[str]) -> None:
    """SPEC's token_information.npz: each scored row's tokens one after another (rows in
    cross_logprobs.npz's order), their `information` and `own_posterior`, `offsets` (M + 1)
    and each token's text (`token_text`, what a page shades)."""

    def save(stream: IO[bytes]) -> None:
        np.savez_compressed(
            stream, information=tokens.information, own_posterior=tokens.own_posterior,
            offsets=tokens.offsets, token_text=np.array(text, dtype=str),
        )  # fmt: skip

    write_atomic(directory / TOKENS_FILE, "wb", save)


def read_token_information(directory: str | Path) -> tuple[TokenInformation, list[str]] | None:
    """A dump's per-token information and each token's text; None where it has none (not
    measured, or a dump written before it was)."""
    path = Path(directory) / TOKENS_FILE
    if not path.is_file():
        return None
    try:
        with np.load(path) as npz:
            tokens = TokenInformation(npz["information"], npz["own_posterior"], npz["offsets"])
            text = [str(piece) for piece in npz["token_text"]]
    except (KeyError, ValueError, OSError) as err:
        raise CollapsecheckError(f"{path}: not a complete token information file ({err})") from None
    if not (len(text) == len(tokens.information) == tokens.offsets[-1]):
        raise CollapsecheckError(f"{path}: its arrays disagree on the number of tokens")
    return tokens, text


def distinct_prompts(directory: Path) -> list[dict[str, Any]]:
    """A dump's prompts, refused where two are one context: a dump written before identical
    contexts were merged (SPEC "Identical contexts are one prompt") has matrices whose N is
    wrong, and `collapsecheck score DIR` scores its traces again, merged."""
    prompts = read_jsonl(directory / PROMPTS_FILE)
    seen: dict[Any, int] = {}
    for row in prompts:
        key = json.dumps([row["ids"], [image["sha256"] for image in row.get("images", [])]])
        if key in seen:
            raise CollapsecheckError(
                f"{directory / PROMPTS_FILE}: prompts {seen[key]} and {row['index']} are one "
                "context (a dump written before identical contexts counted as one prompt): "
                f"score it again with `collapsecheck score {directory} --checkpoint CKPT`"
            )
        seen[key] = row["index"]
    return prompts


def read_flow(directory: str | Path) -> FlowLogProbs | None:
    """The action matrices of a dump, with what the flow metrics need from its traces; None
    when the dump has none (the flow was not measured)."""
    directory = Path(directory)
    if not (directory / FLOW_FILE).is_file():
        return None
    prompts = distinct_prompts(directory)
    traces = read_jsonl(directory / TRACES_FILE)
    try:
        with np.load(directory / FLOW_FILE) as npz:
            arrays = {key: npz[key] for key in npz.files}
        acting = [traces[int(i)] for i in arrays["row_trace_index"]]
        return FlowLogProbs(
            input=arrays["input"],
            reasoning=arrays["reasoning"],
            natural=arrays["natural"],
            row_prompt=np.array([t["prompt_index"] for t in acting], dtype=np.int64),
            reasoning_group=first_of_each(
                [tuple(t["prefix_ids"] + t["reasoning_ids"]) for t in acting]
            ),
            actions=[t["action"] for t in acting],
            responses_per_prompt=np.bincount(
                [t["prompt_index"] for t in traces], minlength=len(prompts)
            ).astype(float),
        )
    except (KeyError, ValueError, OSError, IndexError) as err:
        raise CollapsecheckError(
            f"{directory / FLOW_FILE}: not a complete flow dump ({err})"
        ) from None


def read_early(directory: str | Path, flow: FlowLogProbs) -> EarlyLogProbs | None:
    """SPEC "Early answering"'s E of a dump, beside its action matrices `flow` (as
    `read_flow` read them); None where it has none (not measured)."""
    path = Path(directory) / FLOW_FILE
    with np.load(path) as npz:
        if "early" not in npz.files:
            return None
        values, fractions = npz["early"], npz["early_fractions"]
    if values.shape != (len(flow.row_prompt), len(fractions)):
        raise CollapsecheckError(
            f"{path}: early is {values.shape}, expected ({len(flow.row_prompt)}, {len(fractions)})"
        )
    fractions = tuple(float(f) for f in fractions)
    return EarlyLogProbs(values, fractions, flow.row_prompt, flow.num_prompts)


def read_matrix(directory: str | Path) -> tuple[CrossLogProbs, np.ndarray]:
    """The cross log-probability matrix of a dump, and each row's index in traces.jsonl."""
    directory = Path(directory)
    distinct_prompts(directory)
    try:
        with np.load(directory / MATRIX_FILE) as npz:
            arrays = {key: npz[key] for key in npz.files}
        matrix = CrossLogProbs(
            sum=arrays["sum"],
            mean=arrays["mean"],
            row_prompt=arrays["row_prompt_index"],
            scored=arrays.get("scored"),
        )
        return matrix, arrays["row_trace_index"]
    except FileNotFoundError:
        raise CollapsecheckError(f"{directory / MATRIX_FILE}: missing from the dump") from None
    except (KeyError, ValueError, OSError) as err:
        raise CollapsecheckError(
            f"{directory}: not a complete collapsecheck dump ({err})"
        ) from None


def read_image_swapped(directory: str | Path) -> np.ndarray:
    """The dump's image-swapped matrix (SPEC "What the image carries": `L_image`)."""
    path = Path(directory) / MATRIX_FILE
    try:
        with np.load(path) as npz:
            return npz["image_swapped_sum"]
    except (KeyError, ValueError, OSError) as err:
        raise CollapsecheckError(f"{path}: no image-swapped matrix ({err})") from None


def read_dump(directory: str | Path) -> tuple[CrossLogProbs, PromptCounts]:
    """The matrix and per-prompt counts of a dump: what `compute_metrics` needs to redo the
    analysis."""
    directory = Path(directory)
    matrix, _ = read_matrix(directory)
    traces = read_jsonl(directory / TRACES_FILE)
    try:
        counts = count_per_prompt(
            matrix.num_prompts,
            [row["prompt_index"] for row in traces],
            [row["valid"] for row in traces],
            [row["truncated"] for row in traces],
            [row["reasoning"] for row in traces],
        )
    except (KeyError, ValueError) as err:
        raise CollapsecheckError(
            f"{directory / TRACES_FILE}: not a complete collapsecheck dump ({err})"
        ) from None
    return matrix, counts


def write_episodes(directory: Path, episodes: Sequence[Episode]) -> None:
    """SPEC's episodes.jsonl: one line per episode (played, or a multi-turn file's), with
    its start, seed, turns (state, response, action, reward, info), final state, done and
    success; nothing where there are none (single-turn prompts)."""
    if not episodes:
        return
    write_jsonl_atomic(directory / EPISODES_FILE, [episode.to_json() for episode in episodes])


def read_dump_episodes(directory: str | Path) -> list[Episode] | None:
    """A dump's episodes; None where it has none (single-turn prompts)."""
    path = Path(directory) / EPISODES_FILE
    if not path.is_file():
        return None
    try:
        return [Episode.from_json(row) for row in read_jsonl(path)]
    except (KeyError, TypeError, ValueError) as err:
        raise CollapsecheckError(f"{path}: not an episodes file ({err})") from None
