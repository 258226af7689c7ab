"""Bad inputs and faults: each gets a clear error or an honest number (docs/robustness.md)."""

import json
import shutil

import pytest
import torch

from collapsecheck import scan, score
from collapsecheck.errors import CollapsecheckError
from tests.conftest import HEALTHY, PROMPTS, tiny_model

FAST = {"k": 4, "num_prompts": 6, "max_new_tokens": 48, "device": "cpu", "bootstrap": 100}


def broken_copy(tmp_path, change):
    """The healthy demo checkpoint with its weights changed by `change(state_dict)`."""
    from transformers import AutoModelForCausalLM

    destination = tmp_path / "broken"
    shutil.copytree(HEALTHY, destination)
    model = AutoModelForCausalLM.from_pretrained(HEALTHY)
    with torch.no_grad():
        change(model.state_dict())
    model.save_pretrained(destination)
    return destination


def test_nan_weights_refuse_a_verdict_while_sampling(tmp_path):
    checkpoint = broken_copy(tmp_path, lambda state: state["model.norm.weight"].fill_(float("nan")))
    with pytest.raises(CollapsecheckError, match="NaN or infinite logits while sampling"):
        scan(checkpoint, PROMPTS, **FAST)


def test_nan_log_probabilities_refuse_a_verdict_while_scoring(tmp_path):
    dump = tmp_path / "dump"
    scan(HEALTHY, PROMPTS, dump=dump, **FAST)
    checkpoint = broken_copy(tmp_path, lambda state: state["model.norm.weight"].fill_(float("nan")))
    with pytest.raises(
        CollapsecheckError, match=r"NaN or infinite log-probabilities for (\d+) of \1 "
    ):
        score(checkpoint, dump, device="cpu")


def test_tokenizer_larger_than_the_model_vocabulary(tmp_path, demo_tokenizer):
    model = tiny_model("llama", len(demo_tokenizer) - 5)
    model.save_pretrained(tmp_path)
    demo_tokenizer.save_pretrained(tmp_path)
    with pytest.raises(CollapsecheckError, match="tokens but the model's embedding only"):
        scan(tmp_path, PROMPTS, **FAST)


def test_prompt_beyond_the_context_is_refused_or_truncated_and_reported(tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(
        "agent 1,1 goal 2,2\n" + "agent 3,3 goal 0,0 " * 80 + "\nagent 2,0 goal 0,2\n"
    )
    with pytest.raises(CollapsecheckError, match=r"prompts.txt:2: the prompt has 1520 tokens"):
        scan(HEALTHY, prompts, **FAST)
    report = scan(HEALTHY, prompts, truncate_prompts=True, as_chat=True, **FAST)
    assert report.settings["truncated_prompts"] == 1


def test_one_sample_per_prompt_still_reports(tmp_path):
    report = scan(HEALTHY, PROMPTS, **{**FAST, "k": 1})
    assert report.counts["responses"] == 6
    assert report.value("distinct_reasoning_rate") == 1.0
    assert report.value("conditional_entropy_seq_est") > 0


def test_identical_reasoning_from_elsewhere_is_a_mismatch_at_chance(tmp_path):
    rows = [
        {"uid": i, "prompt": f"agent {i},0 goal 0,{i}", "response": "<think>i go up</think>up"}
        for i in range(1, 6)
        for _ in range(3)
    ]
    path = tmp_path / "same.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = score(HEALTHY, path, device="cpu", bootstrap=100)
    assert report.value("retrieval_accuracy") == pytest.approx(
        report.value("retrieval_chance_level")
    )
    assert report.value("distinct_reasoning_rate") == pytest.approx(1 / 3)
    assert report.value("normalized_mi") < 0.05
    # the healthy policy never writes "i go up" for these states, and one reasoning scored
    # under many prompts sits below their mixture (Jensen): these are not its traces
    assert report.verdict.regime == "inconclusive"
    assert "unlikely under this checkpoint" in report.verdict.reason


def test_scoring_interrupted_resumes_from_the_saved_samples(tmp_path):
    from collapsecheck.inputs.checkpoint import require_checkpoint
    from collapsecheck.runs.run import cached_scan

    checkpoint = require_checkpoint(HEALTHY)
    complete = cached_scan(checkpoint, PROMPTS, cache_root=tmp_path / "a", **FAST)

    def stop_while_scoring(stage, total):
        if stage == "scoring":
            raise KeyboardInterrupt
        return lambda n: None

    with pytest.raises(KeyboardInterrupt):
        cached_scan(checkpoint, PROMPTS, cache_root=tmp_path / "b", progress=stop_while_scoring,
                    **FAST)  # fmt: skip
    stages = []
    resumed = cached_scan(
        checkpoint, PROMPTS, cache_root=tmp_path / "b",
        progress=lambda stage, total: stages.append(stage) or (lambda n: None), **FAST,
    )  # fmt: skip
    assert stages == ["scoring"]  # the samples were kept: no sampling again
    assert resumed.metrics == complete.metrics


def test_two_scans_writing_one_directory(tmp_path):
    import fcntl

    from collapsecheck.files import LOCK_FILE

    dump = tmp_path / "dump"
    dump.mkdir()
    with (dump / LOCK_FILE).open("w") as held:  # a scan in progress holds the directory
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(CollapsecheckError, match="another collapsecheck scan is writing"):
            scan(HEALTHY, PROMPTS, dump=dump, **FAST)
    scan(HEALTHY, PROMPTS, dump=dump, **FAST)  # free again
    assert not (dump / LOCK_FILE).exists()


def test_a_full_disk_is_a_clear_error_and_leaves_no_partial_file(tmp_path, monkeypatch):
    import errno
    import os

    import collapsecheck.files

    def disk_full(source, destination):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(collapsecheck.files.os, "replace", disk_full)
    dump = tmp_path / "dump"
    with pytest.raises(CollapsecheckError, match=r"prompts.jsonl: cannot write \(No space left"):
        scan(HEALTHY, PROMPTS, dump=dump, **FAST)
    assert not dump.exists()  # nothing of the stopped scan's is left, its folder included
    dump.mkdir()
    with pytest.raises(CollapsecheckError, match=r"prompts.jsonl: cannot write \(No space left"):
        scan(HEALTHY, PROMPTS, dump=dump, **FAST)
    assert [p.name for p in dump.iterdir()] == []  # a folder the user made stays, empty


def test_sigterm_keeps_finished_checkpoints(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "out"
    command = [sys.executable, "-m", "collapsecheck", "scan", str(HEALTHY.parent), "-p",
               str(PROMPTS), "-n", "6", "-k", "4", "--max-new-tokens", "48", "--device", "cpu",
               "--out", str(out), "--fail-on", "none"]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list(out.glob("*/report.json")) and time.monotonic() < deadline:
        time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert "interrupted" in stderr and "Traceback" not in stderr
    done = len(list(out.glob("*/report.json")))
    assert 1 <= done < 5
    again = subprocess.run(command, capture_output=True, text=True, timeout=300,
                           env={**os.environ, "COLUMNS": "200"})  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert f"{done} of 5 checkpoints answered from the cache" in again.stdout


def test_duplicate_prompts_count_once_and_two_prompts_suffice(tmp_path):
    lines = PROMPTS.read_text().splitlines()
    duplicated = tmp_path / "dup.jsonl"
    duplicated.write_text("\n".join([lines[0], lines[1], lines[0], lines[2]]) + "\n")
    report = scan(HEALTHY, duplicated, **{**FAST, "num_prompts": None})
    # identical contexts are one prompt: 3 columns, chance 1/3, the plain file's numbers
    assert (report.counts["prompts"], report.counts["input_rows"]) == (3, 4)
    assert report.settings["prompt_sources"] == [[0, 2], [1], [3]]
    assert report.metrics["retrieval_chance_level"] == pytest.approx(1 / 3)
    plain = tmp_path / "plain.jsonl"
    plain.write_text("\n".join(lines[:3]) + "\n")
    once = scan(HEALTHY, plain, **{**FAST, "num_prompts": None})
    assert report.verdict == once.verdict
    assert report.metrics.pop("mi_upper_bound") > once.metrics.pop("mi_upper_bound")  # RAGEN's
    assert report.metrics == once.metrics
    two = tmp_path / "two.jsonl"
    two.write_text("\n".join(lines[:2]) + "\n")
    assert scan(HEALTHY, two, **{**FAST, "num_prompts": None}).settings["num_prompts"] == 2


def test_the_report_holds_no_environment_secret(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value_123")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws_secret_value_456")
    scan(HEALTHY, PROMPTS, dump=tmp_path, **FAST)
    for path in tmp_path.iterdir():
        if path.suffix in (".json", ".jsonl"):
            text = path.read_text()
            assert "secret_value" not in text


def _probe_many(root: str) -> int:
    from pathlib import Path

    from collapsecheck.files import writable

    return sum(writable(Path(root) / f"step{n}" / "cache") for n in range(60))


def test_shards_probing_the_same_new_folder_at_once_all_may_write(tmp_path):
    """A run's shards (here four real processes) probe the same --out folder at once: each
    one's probe removes the folder it made, under the others; none is told it cannot write
    (make test-cluster's Slurm array met this)."""
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(4) as pool:
        counts = list(pool.map(_probe_many, [str(tmp_path)] * 4))
    assert counts == [60] * 4
