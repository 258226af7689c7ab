"""The temperature rollouts were sampled at, decided before any model loads (SPEC "Traces the
trainer sampled: their temperature"), from the first of:

1. their rows (a `temperature` field, ROLL's `sampling_params`; a scan's dump: its
   report.json); a --temperature naming another is refused;
2. --temperature (where a saved configuration says otherwise, a warning names it);
3. the trainer's saved configuration beside the rollouts or the checkpoint
   (`inputs.trainer_configs`; the reader of the trainer's files says where and which keys);
4. else 1, with one warning naming the trainer's default and --temperature.

Scoring then reads the policy at that temperature (SPEC "Sampling")."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.rollouts import ParsedRollouts
from collapsecheck.inputs.scan_dump import dump_temperature
from collapsecheck.inputs.trainer_configs import (
    ConfigReading,
    SavedConfig,
    kind_of,
    saved_temperature,
)
from collapsecheck.inputs.trainer_rollouts import saved_config

ROWS = "the rollouts' rows"
DUMP = "the scan's report.json"
FLAG = "--temperature"
UNSAID = "not said (1 assumed)"
PASS_FLAG = "pass --temperature T if they were sampled at another"
NOTHING_SAYS = "nothing says the temperature these rollouts were sampled at"


@dataclass(frozen=True)
class SampledTemperature:
    """The temperature, where it came from (`source`, in words), whether it came from outside
    the rollout file (`keyed`: the flag or a configuration, so it keys the results cache) and
    what the user is told."""

    value: float
    source: str
    keyed: bool = False
    warnings: tuple[str, ...] = ()

    def recorded(self) -> dict[str, Any]:
        """report.json's `settings.sampled_temperature` and its source."""
        return {"sampled_temperature": self.value, "sampled_temperature_source": self.source}


def sampled_temperature(
    rollouts: Path, parsed: ParsedRollouts | None, given: float | None, checkpoint: Path | None
) -> SampledTemperature:
    """The temperature the rollouts at `rollouts` (`parsed`: their rows, None for a scan's
    dump) were sampled at; `given`: --temperature; `checkpoint`: the policy scoring them,
    beside which a saved configuration is also looked for."""
    named, source = named_by_file(rollouts, parsed)
    if named is not None:
        if given is not None and float(given) != named:
            raise CollapsecheckError(
                f"--temperature {given:g}: {rollouts} names {named:g} as the temperature its "
                "responses were sampled at (drop --temperature, or score other rollouts)"
            )
        return SampledTemperature(named, source)
    saved = saved_config(rollouts)
    found, unsaid = saved_temperature(saved, rollouts, checkpoint) if saved else (None, [])
    if given is not None:
        disagrees = found is not None and found.temperature != float(given)
        said = (
            f"--temperature {given:g} is used, though {found.where} says {found.temperature:g}"
            if disagrees
            else None
        )
        return SampledTemperature(float(given), FLAG, True, (said,) if said else ())
    if found is not None:
        return SampledTemperature(found.temperature, found.where, True)
    return SampledTemperature(1.0, UNSAID, False, (unsaid_warning(rollouts, saved, unsaid),))


def run_temperature_notes(steps: list[SampledTemperature]) -> list[str]:
    """A run's rollout steps in a few lines: each saved configuration read (and the value it
    gave), each warning of a --temperature a configuration contradicts, and how many steps
    nothing said the temperature of (with the first one's warning)."""
    notes = [
        read_from(value, source)
        for value, source in dict.fromkeys((s.value, s.source) for s in steps if s.keyed)
        if source != FLAG
    ]
    notes += list(dict.fromkeys(w for s in steps if s.source == FLAG for w in s.warnings))
    unsaid = [s for s in steps if s.source == UNSAID]
    if unsaid:
        notes.append(f"{len(unsaid)} of {len(steps)} rollout steps, first: {unsaid[0].warnings[0]}")
    return notes


def read_from(value: float, source: str) -> str:
    return f"rollouts sampled at temperature {value:g}, as {source} says"


def temperature_line(settings: dict[str, Any], warnings: list[str]) -> tuple[str, str] | None:
    """What a report says of where its rollouts' temperature came from, keyed by its source
    (a `watch` says each once): a saved configuration read, or nothing said; else None."""
    source = settings.get("sampled_temperature_source")
    if source == UNSAID:
        said = next((w for w in warnings if NOTHING_SAYS in w), None)
        return None if said is None else (source, said)
    if source in (None, ROWS, DUMP, FLAG):
        return None
    return source, read_from(settings["sampled_temperature"], source)


def named_by_file(rollouts: Path, parsed: ParsedRollouts | None) -> tuple[float | None, str]:
    """The temperature the rollout file names itself, and where (rows, or a dump's report;
    not a dump of rollouts whose temperature was assumed)."""
    if parsed is None:
        saved = dump_temperature(rollouts)
        if saved.get("sampled_temperature_source") == UNSAID:
            return None, DUMP
        return saved.get("sampled_temperature"), DUMP
    return parsed.settings.get("sampled_temperature"), ROWS


def unsaid_warning(rollouts: Path, saved: SavedConfig | None, unsaid: list[ConfigReading]) -> str:
    """The one line where nothing says the temperature: scored at 1, the trainer's default
    where it is known, the configurations found that do not say it, and --temperature."""
    head = f"{rollouts}: {NOTHING_SAYS}"
    if saved is None:
        return f"{head} (no temperature in their rows, no --temperature): scored at 1; {PASS_FLAG}"
    keys = kind_of(saved, rollouts)
    looked = "; ".join(
        f"{r.path}: {r.problem or 'sets none of ' + ', '.join(keys.keys)}" for r in unsaid
    )
    if not looked and saved.files:
        looked = f"no {' or '.join(saved.files)} beside them or the checkpoint"
    elif not looked:
        looked = f"{saved.trainer} saves no configuration that can be read without running code"
    return f"{head} ({looked}): scored at 1; {keys.default}: {pass_flag(keys.usual)}"


def pass_flag(usual: float | None) -> str:
    """What to pass where the trainer's default is not 1 (or not known)."""
    if usual is not None and usual != 1:
        return f"pass --temperature {usual:g} if they were sampled so"
    return PASS_FLAG
