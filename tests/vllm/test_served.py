"""The policy where it is served (SPEC "The policy where it is served"): a real vLLM server
(its CPU build) started by the test on 127.0.0.1 with a demo checkpoint in float32, scanned
through its HTTP API as a live RL job's would be: its scores equal the in-process reference's
on the same traces, its verdict the checkpoint's; the weights swapped under a scan (the server
restarted with another checkpoint on the same port) are caught; each fault is one line."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from bench.vllm_server import VLLMServer, free_port
from collapsecheck.engines.backends.base import SamplingParams, ScoreRequest, no_progress
from collapsecheck.engines.backends.hf import TransformersBackend
from collapsecheck.engines.backends.served import ServedBackend
from collapsecheck.inputs.prompts import load_prompts, render_prompt
from collapsecheck.settings import LoadSettings
from tests.conftest import COLLAPSED, HEALTHY, PROMPTS, ROOT
from tests.conftest import run_collapsecheck as collapsecheck

SCAN = ("-p", PROMPTS, "-n", "8", "-k", "4", "--max-new-tokens", "48", "--fail-on", "none")


@pytest.fixture(scope="module")
def server():
    """The healthy demo checkpoint served as an RL job's vLLM may be: in its RL mode
    (VLLM_SERVER_DEV_MODE=1: `/weight_info`, `/update_weight_version`) and with
    `--max-logprobs 0` (no top alternatives; `prompt_logprobs: 0`, each position's own token,
    is all collapsecheck reads, so every test here also shows it scores there)."""
    served = VLLMServer(HEALTHY, free_port(), "--max-logprobs", "0", dev_mode=True)
    yield served
    served.stop()


def test_served_scores_equal_the_reference_on_the_same_traces(server):
    """The server's own chat template and tokenizer give the checkpoint's ids; the traces it
    samples, scored through its prompt log-probabilities, equal the transformers reference's
    scores of them (float32 both, SPEC "The policy where it is served": within 1e-4 nats a
    token)."""
    backend = ServedBackend(server.url)
    reference = TransformersBackend.from_checkpoint(
        HEALTHY, LoadSettings(device="cpu", dtype="float32"), scorer="naive"
    )
    prompts = load_prompts(PROMPTS, num_prompts=4)
    ours = [render_prompt(p, backend.tokenizer) for p in prompts]
    theirs = [render_prompt(p, reference.tokenizer) for p in prompts]
    assert [(r.text, r.ids) for r in ours] == [(r.text, r.ids) for r in theirs]
    params = SamplingParams(4, 1.0, 1.0, 48, 0)
    drawn = backend.generate([r.ids for r in ours], params, no_progress)
    # the same seeds draw the same traces (one server, nothing else in its batches)
    assert drawn == backend.generate([r.ids for r in ours], params, no_progress)
    requests = [ScoreRequest(c.ids, s.ids) for c in ours for row in drawn for s in row]
    served = backend.loglikelihood_per_token(requests, no_progress)
    local = reference.loglikelihood_per_token(requests, no_progress)
    assert np.abs(served.values - local.values).max() < 1e-4
    lengths = np.diff(served.offsets)
    assert (np.abs(served.sums - local.sums) <= 1e-4 * lengths).all()
    assert backend.decode(drawn[0][0].ids) == reference.decode(drawn[0][0].ids)
    assert backend.canary_digest() == backend.canary_digest()


def test_scan_url_gives_the_checkpoints_verdict(server, tmp_path):
    """`scan URL` (the URL where a checkpoint would stand) writes the same report a checkpoint
    scan does, says what it describes, and its verdict is the checkpoint's own scan's."""
    served = collapsecheck("scan", server.url, *SCAN, "--json", tmp_path / "served.json",
                           "--dump", tmp_path / "dump")  # fmt: skip
    assert served.returncode == 0, served.stderr
    local = collapsecheck("scan", HEALTHY, *SCAN, "--json", tmp_path / "local.json")
    assert local.returncode == 0, local.stderr
    report = json.loads((tmp_path / "served.json").read_text())
    local_report = json.loads((tmp_path / "local.json").read_text())
    assert report["verdict"]["regime"] == local_report["verdict"]["regime"] == "grounded"
    assert report["settings"]["checkpoint"] == server.url
    assert "weights" in report["settings"]["checkpoint_note"]
    assert (tmp_path / "dump" / "traces.jsonl").is_file()
    assert "the policy served at" in " ".join(served.stdout.split())


def test_score_rollouts_through_the_server(server, tmp_path):
    """`score ROLLOUTS --server URL`: the rollouts scored through the served policy give the
    numbers `score -c CHECKPOINT` gives (float32 both) and its verdict; neither or both of
    --server and --checkpoint is one line."""
    rollouts = ROOT / "examples" / "rollouts" / "gridworld.jsonl"
    served = collapsecheck("score", rollouts, "--server", server.url, "--fail-on", "none",
                           "--json", tmp_path / "served.json")  # fmt: skip
    assert served.returncode == 0, served.stderr
    local = collapsecheck("score", rollouts, "-c", HEALTHY, "--dtype", "float32",
                          "--fail-on", "none", "--json", tmp_path / "local.json")  # fmt: skip
    assert local.returncode == 0, local.stderr
    ours, theirs = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("served", "local"))
    assert ours["verdict"]["regime"] == theirs["verdict"]["regime"]
    for name in ("mi_estimate", "normalized_mi", "retrieval_accuracy"):
        assert ours["metrics"][name]["value"] == pytest.approx(
            theirs["metrics"][name]["value"], abs=1e-4)  # fmt: skip
    both = collapsecheck("score", rollouts, "--server", server.url, "-c", HEALTHY)
    assert both.returncode == 2 and "--checkpoint DIR or --server URL" in both.stderr


def test_compare_takes_a_url_on_either_side(server, tmp_path):
    """`compare CHECKPOINT URL`: the served policy's scan beside the checkpoint's; its
    reasoning is not scored under A (said), and the same weights lose nothing."""
    done = collapsecheck("compare", HEALTHY, server.url, *SCAN[:-2], "--dtype", "float32",
                         "--out", tmp_path / "cache")  # fmt: skip
    assert done.returncode == 0, done.stderr
    said = " ".join((done.stdout + done.stderr).split())
    assert f"B: grounded (diverse) {server.url}" in said
    assert "is served: its reasoning is not also scored under A" in said
    assert "B did not lose input dependence relative to A" in said


def test_watch_url_diagnoses_each_interval_into_the_run_table_and_dashboard(server, tmp_path):
    """`watch URL --every 0s`: a diagnosis after another, each a row of the run (its step its
    number) in --json, on the page and in TensorBoard; --until's file ends it."""
    import subprocess
    import sys

    until = tmp_path / "done"
    command = [sys.executable, "-c", "from collapsecheck.cli import main; main()", "watch",
               server.url, "--every", "0s", *map(str, SCAN), "--until", str(until),
               "--json", str(tmp_path / "run.json"), "--html", str(tmp_path / "run.html"),
               "--tensorboard", str(tmp_path / "tb")]  # fmt: skip
    watching = subprocess.Popen(command, cwd=ROOT, stderr=subprocess.PIPE, text=True,
                                env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})  # fmt: skip
    lines = []
    for line in watching.stderr:
        lines.append(line)
        if line.startswith("sampling, step 2"):
            until.touch()  # while the second diagnosis runs
    assert watching.wait(60) == 0, "".join(lines)
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["run_dir"] == server.url
    assert [s["step"] for s in run["steps"]] == [1, 2]
    assert all(s["checkpoint"] == server.url for s in run["steps"])
    assert any(line.startswith("diagnosis 2 at") for line in lines)
    assert (tmp_path / "run.html").is_file() and list((tmp_path / "tb").rglob("events.*"))


def test_weights_swapped_under_a_scan_are_caught(tmp_path):
    """The server restarted with the collapsed checkpoint on the same port while the healthy
    one's traces are scored: the canary's digest differs after the scan, the scan is done
    again (samples too) through the retries that wait for the server, and the report
    describes the weights now served, never a mix of two policies."""
    from collapsecheck.runs.served import ServedScan, scan_served
    from collapsecheck.settings import OutputSettings, SamplingSettings, Settings

    port = free_port()
    first = VLLMServer(HEALTHY, port)
    swapped: list[VLLMServer] = []

    def progress(stage: str, total: int):
        if stage.startswith("scoring") and not swapped:
            first.stop()
            swapped.append(VLLMServer(COLLAPSED, port))
        return lambda n: None

    said: list[str] = []
    settings = Settings(sampling=SamplingSettings(k=4, num_prompts=8, max_new_tokens=48))
    request = ServedScan(first.url, PROMPTS, settings, OutputSettings())
    try:
        report = scan_served(request, said.append, progress)
    finally:
        (swapped or [first])[0].stop()
    assert swapped, "the scan never reached its scoring"
    (changed,) = [s for s in said if "the served weights changed during the scan" in s]
    now = changed.split(" -> ")[1].split("): ")[0]
    assert now.startswith("canary digest ")  # a server that states no weight version
    assert f"weights {now}, the same before" in report.settings["checkpoint_note"]
    assert report.verdict.regime != "grounded"  # the collapsed checkpoint's, scanned again


def test_a_weight_version_the_server_states_is_read_and_its_change_caught(server):
    """vLLM's server in its RL mode states its weights' version (`GET /weight_info`), set by
    the trainer (`POST /update_weight_version`): a version set while the scan scores is a
    change, the scan is done again, and the report names the version it describes."""
    from collapsecheck.runs.served import ServedScan, scan_served
    from collapsecheck.settings import OutputSettings, SamplingSettings, Settings

    root = server.url.removesuffix("/v1")
    set_version: list[int] = []

    def progress(stage: str, total: int):
        if stage.startswith("scoring") and not set_version:
            answer = httpx.post(f"{root}/update_weight_version", json={"new_version": "step-7"})
            set_version.append(answer.status_code)
        return lambda n: None

    said: list[str] = []
    settings = Settings(sampling=SamplingSettings(k=2, num_prompts=4, max_new_tokens=32))
    report = scan_served(ServedScan(server.url, PROMPTS, settings, OutputSettings()),
                         said.append, progress)  # fmt: skip
    assert set_version == [200]
    (changed,) = [s for s in said if "the served weights changed during the scan" in s]
    assert "-> version step-7, canary digest" in changed
    assert "weights version step-7, canary digest" in report.settings["checkpoint_note"]


def test_a_window_too_small_for_prompt_and_trace_is_one_line(server, tmp_path):
    """The server's window (`max_model_len`, 1024 here) leaves no room for the asked trace:
    one line naming the prompt, exit 2, nothing written."""
    args = ("-p", PROMPTS, "-n", "4", "-k", "2", "--max-new-tokens", "2000")
    done = collapsecheck("scan", server.url, *args, "--json", tmp_path / "r.json")
    assert done.returncode == 2 and "of the model's 1024-token context" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "r.json").exists()
