"""The command line: a thin typer layer over `collapsecheck.scan`.

Exit codes: 0 ok; 1 the verdict is one of `--fail-on`; 2 usage or input error (one line on
stderr naming the file, line or option at fault).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from collapsecheck.backends.base import DEFAULT_BATCH_TOKENS, DEFAULT_SAMPLE_ROWS
from collapsecheck.errors import CollapsecheckError
from collapsecheck.metrics import DEFAULT_RESAMPLES
from collapsecheck.reasoning import REGEX, WHOLE, ReasoningSpec
from collapsecheck.verdict import COLLAPSES, REGIMES, Thresholds

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Detect template collapse in RL-trained LLM agents (see SPEC.md).",
)
out = Console()
err = Console(stderr=True)


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn bad input into one line on stderr and exit code 2; Ctrl-C into exit code 130."""
    try:
        yield
    except CollapsecheckError as error:
        err.print(f"[bold red]error:[/] {escape(str(error))}", highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_USAGE) from None
    except KeyboardInterrupt:
        err.print("[bold red]interrupted[/]")
        raise typer.Exit(130) from None


def parse_fail_on(value: str) -> set[str]:
    if value.strip().lower() == "none":
        return set()
    regimes = {v.strip() for v in value.split(",") if v.strip()}
    unknown = regimes - set(REGIMES)
    if unknown:
        raise CollapsecheckError(
            f"--fail-on: unknown regime {', '.join(sorted(unknown))} "
            f"(choose from {', '.join(REGIMES)}, or none)"
        )
    return regimes


def reasoning_spec(tags: str | None, regex: str | None, whole: bool) -> ReasoningSpec:
    chosen = [
        name
        for name, given in (
            ("--reasoning-tags", tags),
            ("--reasoning-regex", regex),
            ("--whole-response", whole),
        )
        if given
    ]
    if len(chosen) > 1:
        raise CollapsecheckError(f"choose one of {' and '.join(chosen)}, not both")
    if tags:
        return ReasoningSpec.from_tags(tags)
    if regex:
        return ReasoningSpec(REGEX, regex=regex)
    return ReasoningSpec(WHOLE) if whole else ReasoningSpec()


@app.command()
def scan(
    checkpoint: Annotated[Path, typer.Argument(help="Hugging Face checkpoint directory.")],
    prompts: Annotated[
        Path, typer.Option("--prompts", "-p", help="Prompt set: JSONL or plain text.")
    ],
    samples: Annotated[int, typer.Option("-k", "--samples", help="Samples per prompt.")] = 8,
    num_prompts: Annotated[
        int | None, typer.Option("--num-prompts", "-n", help="Use the first N prompts.")
    ] = None,
    max_new_tokens: Annotated[int, typer.Option(help="Length limit per response.")] = 256,
    temperature: Annotated[float, typer.Option(help="Sampling temperature.")] = 1.0,
    top_p: Annotated[float, typer.Option(help="Nucleus sampling threshold.")] = 1.0,
    seed: Annotated[int, typer.Option(help="Seed of sampling and bootstrap.")] = 0,
    reasoning_tags: Annotated[
        str | None, typer.Option(help="Reasoning between OPEN,CLOSE (default <think>,</think>).")
    ] = None,
    reasoning_regex: Annotated[
        str | None, typer.Option(help="Reasoning matched by a regex (its group 1 if any).")
    ] = None,
    whole_response: Annotated[
        bool, typer.Option("--whole-response", help="Score the whole response as reasoning.")
    ] = False,
    as_chat: Annotated[
        bool, typer.Option("--as-chat", help="Wrap plain-string prompts as one user message.")
    ] = False,
    prompt_field: Annotated[
        str | None, typer.Option(help="JSONL field holding the prompt (default prompt/messages).")
    ] = None,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda[:N].")] = "auto",
    dtype: Annotated[str, typer.Option(help="auto, float32, bfloat16 or float16.")] = "auto",
    scorer: Annotated[str, typer.Option(help="cached (default) or naive (reference).")] = "cached",
    batch_tokens: Annotated[
        int, typer.Option(help="Tokens per scoring batch (batch size x length).")
    ] = DEFAULT_BATCH_TOKENS,
    sample_batch: Annotated[
        int, typer.Option(help="Sequences decoded together while sampling.")
    ] = DEFAULT_SAMPLE_ROWS,
    bootstrap: Annotated[int, typer.Option(help="Bootstrap resamples.")] = DEFAULT_RESAMPLES,
    dependence_high: Annotated[
        float, typer.Option(help="Input dependence is high at or above this.")
    ] = Thresholds.dependence_high,
    dependence_collapsed: Annotated[
        float, typer.Option(help="Input dependence is collapsed at or below this.")
    ] = Thresholds.dependence_collapsed,
    entropy_low: Annotated[
        float, typer.Option(help="Conditional entropy (nats/trace) below this is low.")
    ] = Thresholds.entropy_low,
    fail_on: Annotated[
        str, typer.Option(help="Regimes that exit with code 1, comma-separated, or none.")
    ] = ",".join(COLLAPSES),
    json_path: Annotated[Path | None, typer.Option("--json", help="Write report.json.")] = None,
    dump: Annotated[
        Path | None, typer.Option(help="Write the SPEC dump to this directory.")
    ] = None,
) -> None:
    """Sample, cross-score and diagnose one checkpoint."""
    from collapsecheck.console import print_report, progress_bars
    from collapsecheck.scan import scan as run_scan

    with user_errors():
        failing = parse_fail_on(fail_on)
        try:
            thresholds = Thresholds(dependence_high, dependence_collapsed, entropy_low)
        except ValueError as error:
            raise CollapsecheckError(f"--dependence-high/--dependence-collapsed: {error}") from None
        if bootstrap < 0:
            raise CollapsecheckError(f"--bootstrap must be >= 0, got {bootstrap}")
        spec = reasoning_spec(reasoning_tags, reasoning_regex, whole_response)
        with progress_bars(err) as progress:
            report = run_scan(
                checkpoint,
                prompts,
                k=samples,
                num_prompts=num_prompts,
                max_new_tokens=max_new_tokens,
                temperature=temperature,
                top_p=top_p,
                seed=seed,
                reasoning=spec,
                thresholds=thresholds,
                device=device,
                dtype=dtype,
                scorer=scorer,
                batch_tokens=batch_tokens,
                sample_rows=sample_batch,
                as_chat=as_chat,
                prompt_field=prompt_field,
                resamples=bootstrap,
                dump=dump,
                progress=progress,
            )
        if json_path is not None:
            report.save(json_path)
    print_report(out, report)
    if report.verdict.regime in failing:
        err.print(f"failing: the verdict {report.verdict.regime} is in --fail-on")
        raise typer.Exit(EXIT_FAIL)


@app.callback()
def _root() -> None:
    """collapsecheck: is the reasoning of an RL-trained policy still grounded in its input?"""


def main() -> None:
    """Console entry point; usage errors from typer exit with code 2 as well."""
    app(prog_name="collapsecheck")


if __name__ == "__main__":
    main()
