"""`scan URL`: the policy a live RL job serves, diagnosed through its server (SPEC "The policy
where it is served"). The scan is the one every checkpoint gets (`diagnose.scan`), on the
served backend; around it, the weights are watched: a canary scored before the work and after
it must agree, else the scan is done again (the samples too), and a policy that keeps changing
is one line. What cannot go with a served policy is refused before any request."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collapsecheck.engines.backends.served_api import api_base
from collapsecheck.errors import CollapsecheckError
from collapsecheck.progress import ProgressHook, silent
from collapsecheck.settings import AUTO, OutputSettings, Settings

if TYPE_CHECKING:
    from collapsecheck.engines.backends.base import Backend
    from collapsecheck.inputs.rollouts import ParsedRollouts, RolloutOptions
    from collapsecheck.reports.report import Report

SCANS = 3  # a scan done again at most twice while the weights change under it


@dataclass(frozen=True)
class ServedScan:
    """What `scan URL` was asked: the server, the prompts, the settings and outputs."""

    url: str
    prompts: Path | None
    settings: Settings
    outputs: OutputSettings


def require_servable(request: ServedScan, refused: dict[str, bool]) -> None:
    """Everything a served scan cannot do, one line before any request: the options that need
    a checkpoint's files or a run (`refused`: each flag given), a temperature other than 1
    (the server's prompt log-probabilities are untempered), another engine."""
    for flag, given in refused.items():
        if given:
            raise CollapsecheckError(
                f"{flag} needs a checkpoint's files or a run directory: {request.url} is a "
                "served policy (scan its checkpoint's folder for it)"
            )
    if request.prompts is None:
        raise CollapsecheckError(f"{request.url}: a served policy is scanned on -p PROMPTS")
    temperature = request.settings.sampling.sampling_temperature
    if temperature != 1:
        raise CollapsecheckError(
            f"--temperature {temperature:g}: a served policy is scored at temperature 1 only "
            "(its server's prompt log-probabilities ignore temperature, and a tempered number "
            "is never made from them): sample at --temperature 1, or scan the checkpoint's files"
        )
    load = request.settings.load
    for flag, value in (("--backend", load.backend), ("--scorer", load.scorer)):
        if value != AUTO:
            raise CollapsecheckError(
                f"{flag} {value}: a served policy is sampled and scored by its server"
            )


def scan_served(
    request: ServedScan, say: Callable[[str], None], progress: ProgressHook = silent
) -> Report:
    """`scan URL`: the served policy sampled and scored as a checkpoint is (`diagnose.scan`),
    its weights watched (`watched`)."""
    from collapsecheck.runs.diagnose import scan

    def work(backend: Backend) -> Report:
        return scan(api_base(request.url), request.prompts, request.settings,
                    dump=request.outputs.dump, progress=progress, loaded=backend)  # fmt: skip

    return watched(request.url, work, say)


def score_served(
    url: str, rollouts: Path, settings: Settings, options: RolloutOptions,
    training_prompts: Path | None, dump: Path | None, parsed: ParsedRollouts,
    say: Callable[[str], None], progress: ProgressHook = silent,
) -> Report:  # fmt: skip
    """`score ROLLOUTS --server URL`: the rollouts scored through the served policy as under
    a checkpoint (`diagnose.score`), its weights watched (`watched`)."""
    from collapsecheck.runs.diagnose import score

    def work(backend: Backend) -> Report:
        return score(api_base(url), rollouts, settings, rollout_options=options, dump=dump,
                     progress=progress, loaded=backend, training_prompts=training_prompts,
                     parsed=parsed)  # fmt: skip

    return watched(url, work, say)


def watched(url: str, work: Callable[[Backend], Report], say: Callable[[str], None]) -> Report:
    """`work` done on the served policy with its weights the same from before it to after it
    (the version the server states and the canary's digest: `ServedBackend.weights`); done
    again where they changed (the samples too), one line where they keep changing."""
    from collapsecheck.engines.backends.served import ServedBackend

    backend = ServedBackend(url)
    try:
        before = backend.weights()
        for _ in range(SCANS):
            backend.policy_note = policy_note(backend, before)
            report = work(backend)
            after = backend.weights()
            if after == before:
                if backend.server.retries:
                    say(f"note: {url}: {backend.server.retries} request(s) retried through "
                        "transient faults (a server restarting, say)")  # fmt: skip
                return report
            say(f"note: {url}: the served weights changed during the scan ({before} -> "
                f"{after}): scanning again, samples included")  # fmt: skip
            before = after
    finally:
        backend.close()
    raise CollapsecheckError(
        f"{url}: the served weights changed during each of {SCANS} scans: no diagnosis "
        "describes one policy (scan between weight updates, or scan a saved checkpoint)"
    )


def policy_note(backend: Any, weights: Any) -> str:
    """What the report says it describes: the server, its model, the weights (their stated
    version, their canary's digest), and that the traces are not exactly resampled unless the
    server is batch-invariant."""
    info = backend.info
    return (
        f"the policy served at {info.url} ({info.model}, vllm {info.version}), weights "
        f"{weights}, the same before sampling and after scoring; a server not launched "
        "batch-invariant (VLLM_BATCH_INVARIANT=1) does not resample these traces exactly"
    )
