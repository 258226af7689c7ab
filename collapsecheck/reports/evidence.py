"""What a page draws beyond a report's numbers: the cross log-probability matrix, the
reasoning of each of its rows, and the flow's action matrices. A scan with a dump (every
cached scan, and `--dump`) reads them back from it; a scan without one keeps them in memory
on its report."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.episodes import Episode
from collapsecheck.inputs.images import PromptImage
from collapsecheck.inputs.scan_dump import PROMPTS_FILE, TRACES_FILE, read_images, read_jsonl
from collapsecheck.measures.flow import FlowLogProbs
from collapsecheck.measures.metrics import CrossLogProbs
from collapsecheck.measures.token_information import TokenInformation
from collapsecheck.reports.dump import (
    MATRIX_FILE,
    read_dump_episodes,
    read_flow,
    read_matrix,
    read_token_information,
)


@dataclass(frozen=True)
class Evidence:
    """`matrix` (SPEC "The cross log-probability matrix"); `reasoning[r]`: the reasoning Z of
    matrix row r; `prompts[j]`: the rendered text of column j; `flow`: the action matrices
    where the flow was scored; `images[j]`: column j's images, where its prompt has any and
    they are at hand (a dump keeps them); `tokens`, each row's per-token information and
    posterior with each token's text (`token_text`), where measured (SPEC "Where the input
    shows")."""

    matrix: CrossLogProbs
    reasoning: list[str]
    prompts: list[str]
    flow: FlowLogProbs | None = None
    images: list[tuple[PromptImage, ...]] = field(default_factory=list)
    tokens: TokenInformation | None = None
    token_text: list[str] = field(default_factory=list)

    def token_row(self, row: int) -> list[tuple[str, float, float]] | None:
        """Row `row`'s tokens as (text, information, own posterior), where measured."""
        if self.tokens is None:
            return None
        span = slice(self.tokens.offsets[row], self.tokens.offsets[row + 1])
        information, posterior = self.tokens.of_row(row)
        return list(zip(self.token_text[span], information, posterior, strict=True))

    def images_of(self, prompt: int) -> tuple[PromptImage, ...]:
        return self.images[prompt] if prompt < len(self.images) else ()


def has_matrix(directory: Path | None) -> bool:
    return directory is not None and (directory / MATRIX_FILE).is_file()


def read_evidence(directory: Path) -> Evidence:
    """A dump's matrix with its rows' reasoning and its flow's matrices."""
    matrix, row_trace_index = read_matrix(directory)
    traces = read_jsonl(directory / TRACES_FILE)
    prompts = read_jsonl(directory / PROMPTS_FILE)
    tokens, text = read_token_information(directory) or (None, [])
    return Evidence(
        matrix,
        [traces[int(i)]["reasoning"] for i in row_trace_index],
        [row["text"] for row in prompts],
        read_flow(directory),
        [kept_images(directory, row) for row in prompts],
        tokens,
        text,
    )


def kept_images(directory: Path, row: dict[str, Any]) -> tuple[PromptImage, ...]:
    """A dump row's images, or none where the dump no longer keeps them: the page then
    names each image by its label in the prompt's text alone."""
    try:
        return tuple(image for _, image in read_images(directory, row, str(directory)))
    except CollapsecheckError:
        return ()


def evidence_of(report: Any) -> Evidence | None:
    """The report's evidence: kept in memory by a scan without a dump, else read from its
    dump; None where there is neither (a report.json copied away from its dump)."""
    if report.evidence is not None:
        return report.evidence
    return read_evidence(report.dump_dir) if has_matrix(report.dump_dir) else None


def episodes_of(report: Any) -> list[Episode] | None:
    """The report's episodes (SPEC "Agents across turns"): kept in memory by the scan, else
    read from its dump; None for single-turn prompts, or a report.json without its dump."""
    if report.episode_records:
        return report.episode_records
    return read_dump_episodes(report.dump_dir) if report.dump_dir is not None else None


def matrix_of(report: Any) -> CrossLogProbs | None:
    """Only the matrix (what a run's small per-step pictures need), read without the
    traces."""
    if report.evidence is not None:
        return report.evidence.matrix
    return read_matrix(report.dump_dir)[0] if has_matrix(report.dump_dir) else None
