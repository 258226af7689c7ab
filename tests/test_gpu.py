"""The GPU path on a real CUDA device (../shared/GPU.md, step 1): `pytest -m gpu`. Every test
here is skipped where no CUDA device is visible (CI has none); `make test-gpu` runs them."""

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from collapsecheck import scan, score
from collapsecheck.cli import app
from collapsecheck.engines.backends.base import ScoreRequest, no_progress
from collapsecheck.engines.backends.hf import TransformersBackend, memory_budget
from collapsecheck.engines.backends.hf_vlm import Vision
from collapsecheck.engines.backends.registry import load_backend
from collapsecheck.inputs.checkpoint import require_checkpoint
from collapsecheck.inputs.prompts import load_prompts, render_prompts
from collapsecheck.settings import LoadSettings, PromptSettings
from tests.conftest import COLLAPSED, EXAMPLES, HEALTHY, PROMPTS
from tests.test_scoring import branching_requests, cut_reasoning_requests

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
SCAN = dict(num_prompts=16, k=4, max_new_tokens=64, bootstrap=300)
VISION = EXAMPLES / "checkpoints" / "vision"
runner = CliRunner()


def matrix(dump):
    with np.load(dump / "cross_logprobs.npz") as saved:
        return saved["sum"]


@pytest.mark.parametrize("policy", [HEALTHY, COLLAPSED], ids=["grounded", "template"])
def test_cuda_float32_scores_each_trace_as_the_cpu_does(policy, tmp_path):
    """The CPU scan's own traces, scored again on the GPU in float32: within 1e-3 nats."""
    on_cpu = scan(policy, PROMPTS, dump=tmp_path / "cpu", device="cpu", **SCAN)
    on_gpu = score(policy, tmp_path / "cpu", dump=tmp_path / "gpu", device="cuda",
                   dtype="float32", bootstrap=300)  # fmt: skip
    cpu, gpu = matrix(tmp_path / "cpu"), matrix(tmp_path / "gpu")
    assert np.array_equal(np.isnan(cpu), np.isnan(gpu))
    assert np.nanmax(np.abs(cpu - gpu)) < 1e-3
    assert on_gpu.verdict.regime == on_cpu.verdict.regime


@pytest.mark.parametrize(
    "policy, regime", [(HEALTHY, "grounded"), (COLLAPSED, "template_collapse")],
    ids=["grounded", "template"],
)  # fmt: skip
def test_a_bfloat16_scan_on_cuda_gives_the_cpu_verdicts(policy, regime):
    report = scan(policy, PROMPTS, device="cuda", dtype="bfloat16", **SCAN)
    assert report.verdict.regime == regime, report.verdict.reason
    assert report.settings["device"].startswith("cuda")


def test_device_map_auto_on_one_gpu(tmp_path):
    out = tmp_path / "report.json"
    result = runner.invoke(app, ["scan", str(HEALTHY), "-p", str(PROMPTS), "-n", "16", "-k", "4",
                                 "--max-new-tokens", "64", "--device-map", "auto", "--fail-on",
                                 "none", "--json", str(out)])  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["verdict"]["regime"] == "grounded"
    assert report["settings"]["device"].startswith("cuda")


@pytest.mark.parametrize("requests", [branching_requests, cut_reasoning_requests])
def test_packed_branches_in_bfloat16_match_a_plain_forward_pass(random_checkpoint, requests):
    """The cached scorer's 4D-masked branch rows on CUDA in bfloat16 against one plain
    bfloat16 forward pass per request: within bfloat16's rounding of the ~20-token sums."""
    backend = TransformersBackend.from_checkpoint(
        random_checkpoint, LoadSettings(device="cuda", dtype="bfloat16", batch_tokens=4096)
    )
    asked = requests()
    scores = backend.loglikelihood(asked, no_progress)
    expected = np.array([cuda_reference(backend.model, r) for r in asked])
    assert np.abs(scores - expected).max() < 0.05


@pytest.mark.parametrize("requests", [branching_requests, cut_reasoning_requests])
def test_per_token_values_on_cuda_match_a_plain_forward_pass(random_checkpoint, requests):
    """SPEC "Where the input shows" on CUDA in float32: each scored token's log-probability
    from the cached scorer's packed rows against one plain forward pass per request, and
    their sums equal `loglikelihood`'s."""
    backend = TransformersBackend.from_checkpoint(
        random_checkpoint, LoadSettings(device="cuda", dtype="float32", batch_tokens=4096)
    )
    asked = requests()
    per_token = backend.loglikelihood_per_token(asked, no_progress)
    assert np.abs(per_token.sums - backend.loglikelihood(asked, no_progress)).max() < 1e-9
    for index, request in enumerate(asked):
        expected = cuda_token_reference(backend.model, request)
        assert np.abs(per_token.of_request(index) - expected).max() < 1e-3


def cuda_token_reference(model, request) -> np.ndarray:
    ids = torch.tensor([request.context + request.continuation], device="cuda")
    with torch.no_grad():
        logprobs = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
    start = len(request.context) + request.scored_from
    return np.array([float(logprobs[t - 1, ids[0, t]]) for t in range(start, ids.shape[1])])


def cuda_reference(model, request):
    ids = torch.tensor([request.context + request.continuation], device="cuda")
    with torch.no_grad():
        logprobs = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
    start = len(request.context) + request.scored_from
    return float(sum(logprobs[t - 1, ids[0, t]] for t in range(start, ids.shape[1])))


def test_a_scoring_batch_the_planner_sizes_stays_under_its_budget():
    """`--batch-tokens auto` sizes batches to half the free memory: a workload many batches
    long (a 151,936-token vocabulary, whose float32 logits dominate) never allocates more
    than that budget above the weights."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=151936, hidden_size=512, intermediate_size=1536, num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=2,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(device="cuda", dtype=torch.bfloat16).eval()
    backend = TransformersBackend(model, _IdsOnly(), scorer="cached")
    rng = np.random.default_rng(0)
    prompts = [tuple(rng.integers(1, 151936, size=256).tolist()) for _ in range(16)]
    traces = [tuple(rng.integers(1, 151936, size=256).tolist()) for _ in range(64)]
    requests = [ScoreRequest(p, t, 0) for t in traces for p in prompts]
    torch.cuda.synchronize()
    budget, weights = memory_budget(torch.device("cuda")), torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    backend.loglikelihood(requests, no_progress)
    used = torch.cuda.max_memory_allocated() - weights
    assert len(requests) * 256 > 3 * backend.batch_tokens  # the plan had to split the work
    assert used <= budget, f"{used / 2**30:.1f} GiB over a {budget / 2**30:.1f} GiB plan"


class _IdsOnly:
    """A backend that only scores ids needs no vocabulary."""

    eos_token_id = 0
    chat_template = None

    def __len__(self) -> int:
        return 0


@pytest.mark.parametrize(
    "policy, regime", [("grounded", "grounded"), ("template", "template_collapse")]
)
def test_the_vision_demo_on_cuda(policy, regime, tmp_path):
    out = tmp_path / "report.json"
    result = runner.invoke(app, [
        "scan", str(VISION / policy), "-p", str(EXAMPLES / "prompts" / "visual-gridworld.jsonl"),
        "-n", "16", "-k", "8", "--max-new-tokens", "64", "--device", "cuda", "--fail-on", "none",
        "--json", str(out)])  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["verdict"]["regime"] == regime, report["verdict"]["reason"]


def test_autoprocessor_and_the_pil_image_processor_read_the_boards_alike():
    """With torchvision, AutoProcessor gives the fast (torchvision) image processor; without,
    the scan falls back to the PIL one. Both give the same image grid and scores within
    0.05 nats per trace on the vision demo's boards."""
    from transformers import AutoImageProcessor, AutoProcessor

    checkpoint = require_checkpoint(VISION / "grounded", None)
    backend = load_backend(checkpoint, LoadSettings(device="cuda", dtype="float32"))
    fast = AutoProcessor.from_pretrained(checkpoint.config_dir).image_processor
    slow = AutoImageProcessor.from_pretrained(checkpoint.config_dir, use_fast=False)
    assert type(fast) is not type(slow), (type(fast), type(slow))
    prompts = load_prompts(EXAMPLES / "prompts" / "visual-gridworld.jsonl", num_prompts=4)
    scores = []
    for processor in (fast, slow):
        backend.vision = Vision.of(backend.model, processor)
        rendered = render_prompts(prompts, backend.tokenizer, PromptSettings(), backend.vision)
        stem = tuple(backend.tokenizer("<think> agent at", add_special_tokens=False)["input_ids"])
        requests = [ScoreRequest(p.ids, stem, 0) for p in rendered]
        scores.append(backend.loglikelihood(requests, no_progress))
    assert np.abs(scores[0] - scores[1]).max() < 0.05


def test_a_run_from_its_trainers_rollouts_on_cuda(tmp_path):
    from tests.test_rollout_runs import START, TRL_RUN

    report = tmp_path / "run.json"
    result = runner.invoke(app, ["scan", str(TRL_RUN), "--baseline", str(START), "--out",
                                 str(tmp_path / "cache"), "--json", str(report), "--device",
                                 "cuda", "--bootstrap", "200", "--fail-on", "none"])  # fmt: skip
    assert result.exit_code == 0, result.output
    steps = json.loads(report.read_text())["steps"]
    assert [s["step"] for s in steps] == [2, 4, 6]
    assert all(s["report"]["settings"]["device"].startswith("cuda") for s in steps)


def test_the_trl_callback_inside_grpo_on_cuda(tmp_path):
    from collapsecheck.integrations.trl import CollapseCallback
    from tests.test_trl_callback import PROBE, grpo_trainer

    trainer = grpo_trainer(EXAMPLES / "demo-run" / "global_step_100", tmp_path, 2, use_cpu=False)
    assert trainer.model.device.type == "cuda"
    callback = CollapseCallback(trainer, PROMPTS, every=2, **PROBE)
    trainer.add_callback(callback)
    trainer.train()
    assert callback.reports[2].verdict.regime == "grounded"
    assert callback.reports[2].settings["device"].startswith("cuda")
