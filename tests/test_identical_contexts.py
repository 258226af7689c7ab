"""Identical contexts are one prompt (SPEC "Identical contexts are one prompt"): the same
traces as RAGEN's evaluation export (8 environment groups of 8 trajectories), as rollouts with
and without a group field, and a prompt file that repeats its rows give the same N, the same
normalized MI and the same verdict; every number is checked against the dump's matrix by hand,
never by the project's metric code."""

import json
import math

import numpy as np
import pytest
from transformers import AutoTokenizer

from collapsecheck import scan, score
from collapsecheck.inputs.rollouts import RolloutOptions
from collapsecheck.inputs.scan_dump import read_jsonl
from collapsecheck.integrations.any_trainer import diagnose_batch
from tests.conftest import HEALTHY, PROMPTS
from tests.test_any_trainer import policy_loglikelihood
from tests.tolerances import metric_atol

GROUPS, K = 8, 8
FAST = {"device": "cpu", "bootstrap": 200, "max_new_tokens": 48}


def by_hand(dump):
    """N, mi_seq_estimate and normalized_mi from a dump's files alone."""
    matrix = np.load(dump / "cross_logprobs.npz")
    sums, own = matrix["sum"], matrix["row_prompt_index"]
    n = sums.shape[1]
    matched = sums[np.arange(len(own)), own]
    top = sums.max(axis=1)
    marginal = top + np.log(np.exp(sums - top[:, None]).sum(axis=1)) - math.log(n)
    mi = float(np.mean(matched - marginal))
    return n, mi, min(max(mi / math.log(n), 0.0), 1.0)


@pytest.fixture(scope="module")
def sampled(tmp_path_factory):
    """A grounded policy's traces: 8 prompts x 8 samples, and the prompts' messages."""
    dump = tmp_path_factory.mktemp("sampled")
    scan(HEALTHY, PROMPTS, dump=dump, k=K, num_prompts=GROUPS, **FAST)
    rows = [json.loads(line) for line in PROMPTS.read_text().splitlines()[:GROUPS]]
    traces = read_jsonl(dump / "traces.jsonl")
    return [(rows[t["prompt_index"]]["messages"], t["response"]) for t in traces]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def ragen_export(path, sampled):
    """RAGEN's `output.format=jsonl`: one line per trajectory, one turn each, its environment
    group in metadata.group_id (RAGEN's _save_as_jsonl)."""
    rows = [
        {
            "custom_id": f"traj_{i}",
            "messages": [*messages, {"role": "assistant", "content": response}],
            "metadata": {"env_id": i, "group_id": i // K, "num_turns": 1, "total_reward": 1.0},
        }
        for i, (messages, response) in enumerate(sampled)
    ]
    return write_jsonl(path, rows)


def test_the_same_traces_in_every_layout_give_one_n_one_mi_one_verdict(sampled, tmp_path):
    layouts = {
        "ragen": ragen_export(tmp_path / "val_rollouts_20261125_120000.jsonl", sampled),
        "grouped": write_jsonl(
            tmp_path / "grouped.jsonl",
            [{"prompt": m, "response": r, "uid": i // K} for i, (m, r) in enumerate(sampled)],
        ),
        # no group field, and each group's rows spread apart: still one prompt per context
        "ungrouped": write_jsonl(
            tmp_path / "ungrouped.jsonl",
            [{"prompt": m, "response": r} for m, r in sampled[1::2] + sampled[::2]],
        ),
    }
    readings = {}
    for name, path in layouts.items():
        dump = tmp_path / f"dump-{name}"
        report = score(HEALTHY, path, dump=dump, **FAST)
        n, mi, nmi = by_hand(dump)
        assert n == GROUPS == report.counts["prompts"], name
        assert report.value("mi_seq_estimate") == pytest.approx(mi, abs=1e-9), name
        assert report.value("normalized_mi") == pytest.approx(nmi, abs=1e-9), name
        assert report.metrics["retrieval_chance_level"] == pytest.approx(1 / GROUPS)
        assert report.value("mi_upper_bound_distinct") == pytest.approx(math.log(GROUPS))
        assert report.verdict.regime == "grounded", (name, report.verdict.reason)
        readings[name] = (report.value("normalized_mi"), report.value("retrieval_accuracy"))
    ragen = score(HEALTHY, layouts["ragen"], **FAST)
    # RAGEN's columns: one per trajectory; its bound kept beside the corrected one
    assert ragen.counts["input_rows"] == GROUPS * K
    assert ragen.value("mi_upper_bound") == pytest.approx(math.log(GROUPS * K))
    values = list(readings.values())
    # each layout scores its rows in other batches: float32 sums in another order
    assert all(v == pytest.approx(values[0], abs=metric_atol(48)) for v in values), readings


def test_a_prompt_file_that_repeats_its_rows_reads_as_the_file_written_once(tmp_path):
    lines = PROMPTS.read_text().splitlines()[:GROUPS]
    twice = tmp_path / "twice.jsonl"
    twice.write_text("".join(f"{line}\n{line}\n" for line in lines))
    once = tmp_path / "once.jsonl"
    once.write_text("".join(f"{line}\n" for line in lines))
    settings = {**FAST, "k": 4, "num_prompts": None}
    repeated = scan(HEALTHY, twice, dump=tmp_path / "twice", **settings)
    single = scan(HEALTHY, once, **settings)
    assert (repeated.counts["prompts"], repeated.counts["input_rows"]) == (GROUPS, 2 * GROUPS)
    assert repeated.settings["prompt_sources"] == [[2 * i, 2 * i + 1] for i in range(GROUPS)]
    assert repeated.verdict == single.verdict
    # every number alike but RAGEN's bound, log of the 16 rows
    assert repeated.metrics.pop("mi_upper_bound") == pytest.approx(math.log(2 * GROUPS))
    assert single.metrics.pop("mi_upper_bound") == pytest.approx(math.log(GROUPS))
    assert repeated.metrics == single.metrics
    n, _, nmi = by_hand(tmp_path / "twice")
    assert (n, repeated.value("normalized_mi")) == (GROUPS, pytest.approx(nmi, abs=1e-9))
    per_prompt = read_jsonl(tmp_path / "twice" / "per_prompt.jsonl")
    assert len(per_prompt) == GROUPS


def distinct_contexts_by_hand(path, sampling):
    """The distinct contexts of a RAGEN file's (trajectory, turn) pairs: each assistant
    message's context is the conversation before it."""
    contexts = []
    for line in path.read_text().splitlines():
        messages = json.loads(line)["messages"]
        turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        for turn in turns[:1] if sampling == "first" else turns:
            contexts.append(json.dumps(messages[:turn]))
    return len(contexts), len(set(contexts))


@pytest.mark.parametrize("sampling", ["first", "turn", "trajectory"])
def test_ragen_multi_turn_first_turns_of_a_group_are_one_prompt(sampling, tmp_path):
    path = next((PROMPTS.parent.parent.parent / "tests/fixtures/trainer-dumps/ragen").iterdir())
    pairs, distinct = distinct_contexts_by_hand(path, sampling)
    options = RolloutOptions(turn_sampling=sampling)
    report = score(
        HEALTHY, path, rollout_options=options, dump=tmp_path / "d", negatives="all", **FAST
    )
    assert (report.counts["input_rows"], report.counts["prompts"]) == (pairs, distinct)
    assert distinct < pairs  # the first turns of each environment group share their state
    n, mi, nmi = by_hand(tmp_path / "d")
    assert n == distinct
    assert report.value("normalized_mi") == pytest.approx(nmi, abs=1e-9)
    assert report.value("mi_seq_estimate") == pytest.approx(mi, abs=1e-9)


def test_diagnose_batch_merges_a_batch_whose_prompts_repeat(tmp_path):
    dump = tmp_path / "dump"
    scan(HEALTHY, PROMPTS, dump=dump, k=4, num_prompts=4, **FAST)
    prompts = read_jsonl(dump / "prompts.jsonl")
    traces = read_jsonl(dump / "traces.jsonl")
    responses = [[t["response_ids"] for t in traces if t["prompt_index"] == p["index"]]
                 for p in prompts]  # fmt: skip
    # veRL's batch, each prompt's group split in two halves as two uids
    prompt_ids = [p["ids"] for p in prompts for _ in (0, 1)]
    halves = [group[h * 2 : h * 2 + 2] for group in responses for h in (0, 1)]
    rewards = [[float(i), float(i) + 0.5] for i in range(len(halves))]
    report = diagnose_batch(
        prompt_ids, halves, policy_loglikelihood(HEALTHY), AutoTokenizer.from_pretrained(HEALTHY),
        rewards=rewards, device="cpu", bootstrap=200,
    )  # fmt: skip
    assert (report.counts["prompts"], report.counts["input_rows"]) == (4, 8)
    reference = score(HEALTHY, dump, device="cpu", bootstrap=200)
    assert report.value("normalized_mi") == pytest.approx(reference.value("normalized_mi"))
    # each merged prompt's rewards: both halves', in row order
    assert [row["reward_mean"] for row in report.per_prompt] == pytest.approx(
        [np.mean(rewards[2 * i] + rewards[2 * i + 1]) for i in range(4)]
    )


def test_the_trl_callback_counts_a_batchs_repeated_prompts_once(tmp_path):
    """A GRPOTrainer whose dataset holds each of two prompts twice: a step's own 16
    completions come from 4 rows, 2 contexts."""
    from datasets import Dataset
    from transformers import LlamaForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    from collapsecheck.integrations.trl import CollapseCallback
    from tests.test_trl_callback import answered

    rows = [json.loads(line)["messages"] for line in PROMPTS.read_text().splitlines()[:2]]
    config = GRPOConfig(
        output_dir=str(tmp_path), max_steps=1, learning_rate=1e-6, per_device_train_batch_size=16,
        num_generations=4, max_completion_length=32, logging_steps=1, save_strategy="no",
        report_to="none", use_cpu=True, bf16=False, seed=0,
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=LlamaForCausalLM.from_pretrained(HEALTHY), reward_funcs=[answered], args=config,
        train_dataset=Dataset.from_list([{"prompt": m} for m in rows + rows]),
        processing_class=AutoTokenizer.from_pretrained(HEALTHY),
    )  # fmt: skip
    callback = CollapseCallback(trainer, every=1, bootstrap=100)
    trainer.add_callback(callback)
    trainer.train()
    report = callback.reports[1]
    assert report.counts["responses"] == 16 and report.counts["prompts"] == 2
    assert report.metrics["retrieval_chance_level"] == pytest.approx(1 / 2)
    (logged,) = [e for e in trainer.state.log_history if "collapse/normalized_mi" in e]
    assert logged["collapse/mi_upper_bound_distinct"] == pytest.approx(math.log(2))


def test_keep_prompts_writes_every_row_of_a_merged_prompt(sampled, tmp_path):
    """Two uids per context; only context 0's rewards vary, so the SNR filter keeps it: both
    of its groups' rows are written, verbatim."""
    from typer.testing import CliRunner

    from collapsecheck.cli import app

    rows = []
    for i, (messages, response) in enumerate(sampled[: 4 * K]):
        group, context = i // (K // 2), i // K
        reward = float(i % 2) if context == 0 else 1.0
        rows.append({"prompt": messages, "response": response, "uid": group, "reward": reward})
    path = write_jsonl(tmp_path / "split.jsonl", rows)
    kept = tmp_path / "kept.jsonl"
    args = ["score", str(path), "-c", str(HEALTHY), "--device", "cpu", "--bootstrap", "100",
            "--keep-prompts", str(kept)]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    lines = path.read_text().splitlines()
    # the first row of each of context 0's two groups (uids 0 and 1)
    assert kept.read_text().splitlines() == [lines[0], lines[K // 2]]
    assert "kept 1 of 4 prompts" in " ".join(result.output.split())
