"""Traces are scored at the temperature they were sampled at (SPEC "Sampling"): a scan's,
its dump's when scored again, and a trainer's rollouts that name theirs (a `temperature`
field; ROLL's `sampling_params`)."""

import json

import numpy as np
import pytest

from collapsecheck import scan, score
from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.scan_dump import read_jsonl
from tests.conftest import EXAMPLES, HEALTHY, PROMPTS

FAST = {"device": "cpu", "bootstrap": 200, "max_new_tokens": 48}


@pytest.fixture(scope="module")
def tempered(tmp_path_factory):
    dump = tmp_path_factory.mktemp("tempered")
    report = scan(HEALTHY, PROMPTS, dump=dump, k=4, num_prompts=6, temperature=0.7, **FAST)
    return dump, report


def rollout_rows(dump, **extra):
    rows = [json.loads(line) for line in PROMPTS.read_text().splitlines()]
    return [
        {"prompt": rows[t["prompt_index"]]["messages"], "response_ids": t["response_ids"],
         "uid": t["prompt_index"], **extra}
        for t in read_jsonl(dump / "traces.jsonl")
    ]  # fmt: skip


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_a_dump_and_rollouts_that_name_their_temperature_are_scored_there(tempered, tmp_path):
    dump, sampled = tempered
    assert sampled.settings["scoring_temperature"] == 0.7
    again = score(HEALTHY, dump, **FAST)
    assert again.settings["scoring_temperature"] == 0.7
    assert again.value("mi_seq_estimate") == pytest.approx(sampled.value("mi_seq_estimate"))
    named = write_jsonl(tmp_path / "named.jsonl", rollout_rows(dump, temperature=0.7))
    rescored = score(HEALTHY, named, dump=tmp_path / "named", **FAST)
    assert rescored.settings["scoring_temperature"] == 0.7
    assert any("sampled at temperature 0.7 and scored there" in w for w in rescored.warnings)
    ours = np.load(dump / "cross_logprobs.npz")["sum"]
    theirs = np.load(tmp_path / "named" / "cross_logprobs.npz")["sum"]
    assert np.abs(ours - theirs).max() < 1e-4
    # the same rows without a temperature read the untempered policy, said in one warning
    plain = write_jsonl(tmp_path / "plain.jsonl", rollout_rows(dump))
    untempered = score(HEALTHY, plain, **FAST)
    assert untempered.settings["scoring_temperature"] == 1.0
    assert untempered.warnings == [
        f"{plain}: nothing says the temperature these rollouts were sampled at (no temperature "
        "in their rows, no --temperature): scored at 1; pass --temperature T if they were "
        "sampled at another"
    ]
    assert untempered.value("conditional_entropy_est") != pytest.approx(
        sampled.value("conditional_entropy_est"), abs=1e-3
    )
    # told the temperature, they are scored as the rows that name it
    told = score(HEALTHY, plain, dump=tmp_path / "told", temperature=0.7, **FAST)
    assert told.settings["sampled_temperature_source"] == "--temperature"
    assert told.settings["scoring_temperature"] == 0.7
    flagged = np.load(tmp_path / "told" / "cross_logprobs.npz")["sum"]
    assert np.abs(flagged - theirs).max() < 1e-9


def test_rows_at_two_temperatures_are_refused(tempered, tmp_path):
    dump, _ = tempered
    rows = rollout_rows(dump, temperature=0.7)
    rows[3]["temperature"] = 1.0
    mixed = write_jsonl(tmp_path / "mixed.jsonl", rows)
    with pytest.raises(CollapsecheckError, match=r"sampled at temperatures 0\.7, 1"):
        score(HEALTHY, mixed, **FAST)


def test_rolls_sampling_params_name_the_temperature():
    roll = EXAMPLES.parent / "tests" / "fixtures" / "trainer-dumps" / "roll"
    report = score(HEALTHY, roll / "rollout_dump_data.step_7.jsonl", **FAST)
    assert report.settings["sampled_temperature"] == 1.0  # ROLL's generation_config
    assert report.settings["scoring_temperature"] == 1.0
