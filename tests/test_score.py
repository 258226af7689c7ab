"""`score`: traces already sampled, from a dump, rollout files and multi-turn trajectories,
give the numbers `scan` gives for the same traces."""

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from collapsecheck import scan, score
from collapsecheck.cli import app
from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.prompts import load_prompts
from collapsecheck.inputs.rollouts import RolloutOptions
from collapsecheck.measures.episodes import EPISODE_KEYS
from tests.conftest import EXAMPLES, HEALTHY, PROMPTS

SCORE = {"device": "cpu", "bootstrap": 200}
FAST = {"k": 4, "num_prompts": 6, "max_new_tokens": 48, **SCORE}


@pytest.fixture(scope="module")
def scanned(tmp_path_factory):
    dump = tmp_path_factory.mktemp("dump")
    report = scan(HEALTHY, PROMPTS, dump=dump, **FAST)
    traces = [json.loads(line) for line in (dump / "traces.jsonl").read_text().splitlines()]
    prompts = [p.content for p in load_prompts(PROMPTS, num_prompts=6)]
    return report, dump, traces, prompts


def rollout_rows(prompts, traces):
    return [
        {"uid": f"q{t['prompt_index']}", "prompt": prompts[t["prompt_index"]],
         "response": t["response"]}
        for t in traces
    ]  # fmt: skip


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def same_numbers(report, reference):
    assert report.metrics == reference.metrics
    assert report.verdict == reference.verdict


def test_score_a_dump_reproduces_the_scan(scanned):
    report, dump, _, _ = scanned
    same_numbers(score(HEALTHY, dump, **SCORE), report)


def test_score_jsonl_and_parquet_rollouts(scanned, tmp_path):
    report, _, traces, prompts = scanned
    rows = rollout_rows(prompts, traces)
    same_numbers(score(HEALTHY, write_jsonl(tmp_path / "r.jsonl", rows), **SCORE), report)
    pd.DataFrame(rows).to_parquet(tmp_path / "r.parquet")
    same_numbers(score(HEALTHY, tmp_path / "r.parquet", **SCORE), report)
    # grouped by the prompt when there is no group id; other field names by option
    renamed = [{"question": r["prompt"], "completion_text": r["response"]} for r in rows]
    options = RolloutOptions(prompt_field="question", response_field="completion_text")
    same_numbers(
        score(HEALTHY, write_jsonl(tmp_path / "n.jsonl", renamed), rollout_options=options,
              **SCORE),
        report,
    )  # fmt: skip


def test_sampled_token_ids_are_used_as_they_are(scanned, tmp_path):
    report, _, traces, prompts = scanned
    rows = [
        {**row, "response": "ignored", "response_ids": trace["response_ids"]}
        for row, trace in zip(rollout_rows(prompts, traces), traces, strict=True)
    ]
    options = RolloutOptions(response_ids_field="response_ids")
    path = write_jsonl(tmp_path / "ids.jsonl", rows)
    same_numbers(score(HEALTHY, path, rollout_options=options, **SCORE), report)


def test_multi_turn_first_turns_equal_single_turn_rollouts(scanned, tmp_path):
    _, _, traces, prompts = scanned
    firsts = [t for t in traces if t["sample_index"] == 0]
    single = score(HEALTHY, write_jsonl(tmp_path / "s.jsonl", rollout_rows(prompts, firsts)),
                   **SCORE)  # fmt: skip
    trajectories = [
        {"turns": [{"messages": prompts[t["prompt_index"]], "response": t["response"]},
                   {"messages": [{"role": "user", "content": "later"}], "response": "x"}]}
        for t in firsts
    ]  # fmt: skip
    path = write_jsonl(tmp_path / "m.jsonl", trajectories)
    first = score(HEALTHY, path, rollout_options=RolloutOptions(turn_sampling="first"), **SCORE)
    # the trajectories' own metrics (SPEC "Agents across turns") come on top: the states
    # "prompt" -> "later", every step new
    episodes = {key: first.metrics.pop(key) for key in EPISODE_KEYS}
    assert episodes["revisit_rate"].value == episodes["stall_rate"].value == 0
    assert episodes["turns_per_episode"].value == 2
    same_numbers(first, single)
    assert first.settings["multi_turn"] == {"turn_sampling": "first", "pairs": 6, "available": 6}


@pytest.mark.parametrize("sampling", ["turn", "trajectory"])
def test_turn_sampling_draws_distinct_pairs_reproducibly(sampling):
    path = EXAMPLES / "rollouts" / "gridworld-multiturn.jsonl"
    options = RolloutOptions(turn_sampling=sampling, pairs=10, seed=3)
    first = score(HEALTHY, path, rollout_options=options, **SCORE)
    again = score(HEALTHY, path, rollout_options=options, **SCORE)
    assert first.metrics == again.metrics
    assert first.settings["multi_turn"] == {"turn_sampling": sampling, "pairs": 10,
                                            "available": 45}  # fmt: skip
    assert first.counts["input_rows"] == 10 and first.counts["responses"] == 10
    # pairs whose contexts are identical (the same opening turn, say) are one prompt
    assert first.counts["prompts"] == len(first.settings["prompt_sources"]) <= 10


def test_bad_rollouts_name_the_line(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "a", "response": "b"}, {"prompt": "c"}])
    with pytest.raises(CollapsecheckError, match=r"bad.jsonl:2: no 'response' or 'output'"):
        score(HEALTHY, path, **SCORE)
    with pytest.raises(CollapsecheckError, match="--turn-sampling must be one of"):
        RolloutOptions(turn_sampling="random")


def test_score_command_on_the_example_rollouts(tmp_path):
    result = CliRunner().invoke(
        app,
        ["score", str(EXAMPLES / "rollouts" / "gridworld.jsonl"), "--checkpoint", str(HEALTHY),
         "--device", "cpu", "--json", str(tmp_path / "report.json")],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "verdict: grounded" in result.output
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["counts"]["responses"] == 64
    assert report["settings"]["rollouts"].endswith("gridworld.jsonl")


def test_the_multi_turn_example_is_grounded_on_the_policy_that_sampled_it():
    """Sampled turn by turn from the healthy policy in an environment whose state follows the
    moves (scripts/make_examples.py): grounded, with matched above marginal."""
    report = score(HEALTHY, EXAMPLES / "rollouts" / "gridworld-multiturn.jsonl", **SCORE)
    assert report.verdict.regime == "grounded", report.verdict.reason
    assert report.metrics["mi_seq_estimate"].low > 0


def test_traces_under_other_contexts_are_called_a_mismatch_not_a_collapse(scanned, tmp_path):
    """Each response paired with the next prompt's context: matched falls far below the
    marginal, which says the traces do not belong to these contexts, not that they collapsed."""
    _, _, traces, prompts = scanned
    shifted = [{**row, "prompt": prompts[(int(row["uid"][1:]) + 1) % len(prompts)]}
               for row in rollout_rows(prompts, traces)]  # fmt: skip
    report = score(HEALTHY, write_jsonl(tmp_path / "shifted.jsonl", shifted), **SCORE)
    assert report.value("mi_seq_estimate") < 0
    assert report.verdict.regime == "inconclusive"
    assert "unlikely under this checkpoint and these contexts" in report.verdict.reason


def test_one_scored_trace_of_rollouts_carries_no_verdict(scanned, tmp_path):
    """SPEC "Enough to carry a verdict" on `score`: rollouts of which one response holds a
    reasoning segment are inconclusive, never grounded, whatever that one trace says; the
    gate passes it as undecided unless --fail-on inconclusive."""
    report, _, traces, prompts = scanned
    assert report.verdict.regime == "grounded"
    rows = rollout_rows(prompts, traces)
    for row in rows[1:]:
        row["response"] = "<answer>Up</answer>"
    rollouts = write_jsonl(tmp_path / "one.jsonl", rows)
    scored = score(HEALTHY, rollouts, **SCORE)
    assert scored.counts["scored_traces"] == 1 and scored.counts["responses"] == len(rows)
    assert scored.verdict.regime == "inconclusive"
    assert scored.verdict.reason.startswith(
        f"1 trace scored of {len(rows)}: {len(rows) - 1} have no reasoning segment"
    )
    args = ["score", str(rollouts), "-c", str(HEALTHY), "--device", "cpu", "--bootstrap", "200"]
    result = CliRunner().invoke(app, [*args, "--fail-on", "inconclusive"])
    assert result.exit_code == 1 and "verdict: inconclusive" in result.output
