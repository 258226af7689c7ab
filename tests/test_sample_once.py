"""A scan samples once: a mistake the first traces show stops it before the rest are sampled,
and traces already sampled are scored again, never sampled again, under other scoring
settings (SPEC "Sampling")."""

import json

from typer.testing import CliRunner

from collapsecheck.cli import app
from tests.conftest import HEALTHY, PROMPTS

runner = CliRunner()
FAST = ["-p", PROMPTS, "-n", "6", "-k", "4", "--max-new-tokens", "48", "--device", "cpu",
        "--bootstrap", "100", "--fail-on", "none"]  # fmt: skip


def scan(*args):
    result = runner.invoke(app, ["scan", str(HEALTHY), *[str(a) for a in [*FAST, *args]]])
    return result, " ".join(result.output.split())


def test_no_reasoning_stops_after_the_first_traces_and_the_next_scan_samples_only_the_rest(
    tmp_path,
):
    out = tmp_path / "cache"
    wrong, said = scan("--reasoning-tags", "<reason>,</reason>", "--out", out)
    assert wrong.exit_code == 2, wrong.output
    assert "none of the first 8 responses (prompts 0-1) has a reasoning segment" in said
    assert "stopped before sampling the rest" in said and "--whole-response" in said
    assert "The first response: '" in said  # one response shown, cut short
    assert "sampling: 2/6" in said and "sampling: 6/6" not in said  # 2 of 6 prompts sampled

    whole, said = scan("--whole-response", "--out", out, "--json", tmp_path / "whole.json")
    assert whole.exit_code == 0, whole.output
    assert "sampling: 0/4" in said  # only the 4 prompts not sampled before
    assert "traces of 2 prompts read from the samples cache" in said
    report = json.loads((tmp_path / "whole.json").read_text())
    assert report["timing"]["samples_reused"] == 2

    fresh, _ = scan("--whole-response", "--out", tmp_path / "fresh", "--json", tmp_path / "f.json")
    assert fresh.exit_code == 0, fresh.output
    again = json.loads((tmp_path / "f.json").read_text())
    assert again["metrics"] == report["metrics"]  # sampled in parts: the same traces

    other, said = scan("--whole-response", "--negatives", "2", "--out", out)
    assert other.exit_code == 0, other.output
    assert "sampling:" not in said  # another scoring setting: nothing sampled again
    assert "traces of 6 prompts read from the samples cache" in said

    reseeded, said = scan("--whole-response", "--seed", "1", "--out", out)
    assert reseeded.exit_code == 0, reseeded.output
    assert "sampling: 0/6" in said and "read from the samples cache" not in said


def test_a_killed_sampling_keeps_what_it_drew(tmp_path):
    """The samples entry gets each batch as it is drawn: a scan killed while sampling loses
    only the batch in hand; a line cut short by the kill is ignored."""
    from collapsecheck.runs.cache import SAMPLES_DIR
    from collapsecheck.runs.sampling import SAMPLES_FILE

    out = tmp_path / "cache"
    first, _ = scan("--whole-response", "--out", out, "--json", tmp_path / "a.json")
    assert first.exit_code == 0, first.output
    (entry,) = (out / SAMPLES_DIR).iterdir()
    lines = (entry / SAMPLES_FILE).read_text().splitlines(keepends=True)
    assert len(lines) == 6
    (entry / SAMPLES_FILE).write_text("".join(lines[:3]) + lines[3][: len(lines[3]) // 2])
    for report in out.glob("*/report.json"):
        report.unlink()  # as if killed before any report was written
    resumed, said = scan("--whole-response", "--out", out, "--json", tmp_path / "b.json")
    assert resumed.exit_code == 0, resumed.output
    assert "sampling: 0/3" in said and "traces of 3 prompts read from the samples cache" in said
    a, b = (json.loads((tmp_path / f"{n}.json").read_text()) for n in "ab")
    assert a["metrics"] == b["metrics"]
    assert len((entry / SAMPLES_FILE).read_text().splitlines()) == 6  # the cut line dropped
    whole, said = scan("--whole-response", "--negatives", "3", "--out", out)
    assert whole.exit_code == 0 and "sampling:" not in said


def test_the_plan_counts_flow_pairs_as_a_bound():
    """Before sampling, whether the responses hold an action is not known: the plan says
    so instead of counting flow pairs that may never be scored."""
    result, said = scan("--dry-run")
    assert result.exit_code == 0, result.output
    assert "flow pairs per checkpoint (if the responses hold an action segment)" in said
    assert "up to " in said
    quiet, said = scan("--dry-run", "--no-flow")
    assert quiet.exit_code == 0 and "flow pairs" not in said


def test_verbose_says_where_the_time_went(tmp_path):
    result, said = scan("--whole-response", "--verbose", "--json", tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    timing = json.loads((tmp_path / "r.json").read_text())["timing"]
    assert timing["sampled_tokens"] > 0 and timing["tokens_scored"] > 0
    line = next(x for x in result.output.splitlines() if x.startswith("time: "))
    assert line.startswith(f"time: loading {timing['load_s']:.1f} s, sampling ")
    assert "new tokens," in line and "/s), scoring " in line and " tokens, " in line
    quiet, said = scan("--whole-response")
    assert quiet.exit_code == 0 and "time: " not in said


def test_a_response_writing_a_tag_lets_the_scan_go_on(demo_tokenizer):
    """The early check stops only where nothing of the segment shows: a response with a tag
    but no whole segment (a policy still learning the format) is sampled to the end."""
    import pytest

    from collapsecheck.engines.backends.base import Sample, decode_ids
    from collapsecheck.engines.reasoning import ReasoningSpec
    from collapsecheck.errors import CollapsecheckError
    from collapsecheck.runs.sampling import reasoning_check

    def samples(text):
        ids = tuple(demo_tokenizer(text, add_special_tokens=False)["input_ids"])
        return {0: [Sample(ids, False)] * 4, 1: [Sample(ids, False)] * 4}

    check = reasoning_check(
        lambda ids: decode_ids(demo_tokenizer, ids), ReasoningSpec(), [False, False], "HINT"
    )
    check(samples("up </think><answer>up</answer>"))  # a close tag: goes on
    check(samples("<think>go up</think><answer>up</answer>"))  # a segment: goes on
    with pytest.raises(CollapsecheckError, match=r"none of the first 8 responses .* HINT"):
        check(samples("up up down <answer>up</answer>"))


def test_a_scan_without_out_keeps_its_traces_and_rescan_draws_them_anew(tmp_path):
    """Results of a single scan are cached only with --out; its traces always are (in the
    default cache): the second scan of the same checkpoint and prompts samples nothing, and
    --rescan samples afresh."""
    first, said = scan("--whole-response", "--json", tmp_path / "a.json")
    assert first.exit_code == 0 and "sampling: 0/6" in said
    again, said = scan("--whole-response", "--negatives", "3", "--json", tmp_path / "b.json")
    assert again.exit_code == 0 and "sampling:" not in said
    assert "traces of 6 prompts read from the samples cache" in said
    fresh, said = scan("--whole-response", "--rescan")
    assert fresh.exit_code == 0 and "sampling: 0/6" in said
    assert "read from the samples cache" not in said


def test_a_new_sampler_version_samples_again_and_never_answers_from_the_old_scans(
    tmp_path, monkeypatch
):
    """A code change that alters the traces of unchanged settings bumps SAMPLES_VERSION:
    neither the samples cache nor the results cache may answer with the old version's
    traces or numbers."""
    from collapsecheck import settings

    out = tmp_path / "cache"
    first, said = scan("--whole-response", "--out", out)
    assert first.exit_code == 0 and "sampling: 0/6" in said
    cached, said = scan("--whole-response", "--out", out)
    assert cached.exit_code == 0 and "sampling:" not in said
    assert "plan: 1 checkpoint (1 cached)" in said  # answered from the results cache
    monkeypatch.setattr(settings, "SAMPLES_VERSION", settings.SAMPLES_VERSION + 1)
    newer, said = scan("--whole-response", "--out", out)
    assert newer.exit_code == 0, newer.output
    assert "sampling: 0/6" in said and "from the samples cache" not in said
    assert "(1 cached)" not in said
