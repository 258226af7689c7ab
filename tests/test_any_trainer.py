"""The backend-free entry point: a trainer's own token ids and its own batched log-likelihood
function (here a transformers model, called as a trainer would call its policy) give the
numbers `score` gives on the same traces."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from collapsecheck import scan, score
from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.scan_dump import read_dump_samples
from collapsecheck.integrations.any_trainer import diagnose_batch
from tests.conftest import HEALTHY, PROMPTS

SETTINGS = {"device": "cpu", "bootstrap": 200}


def policy_loglikelihood(path):
    """What a trainer brings: its policy scoring (context, continuation) pairs, one forward
    pass each, log-softmax in float32."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()

    def loglikelihood(contexts, continuations):
        sums = []
        with torch.no_grad():
            for context, continuation in zip(contexts, continuations, strict=True):
                ids = torch.tensor([context + continuation])
                logits = model(ids).logits[0, len(context) - 1 : -1]
                logprobs = torch.log_softmax(logits.float(), dim=-1)
                sums.append(logprobs.gather(1, torch.tensor(continuation)[:, None]).sum().item())
        return sums

    return loglikelihood


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    dump = tmp_path_factory.mktemp("dump")
    scan(HEALTHY, PROMPTS, dump=dump, k=4, num_prompts=6, max_new_tokens=48, **SETTINGS)
    sampled = read_dump_samples(dump)
    prompt_ids = [list(r.ids) for r in sampled.rendered]
    response_ids = [[list(s.ids) for s in group] for group in sampled.samples]
    return dump, prompt_ids, response_ids


def test_the_trainers_function_gives_the_numbers_score_gives(batch):
    dump, prompt_ids, response_ids = batch
    tokenizer = AutoTokenizer.from_pretrained(HEALTHY)
    rewards = [[float(i % 2), 1.0, 0.0, 0.5] for i in range(len(prompt_ids))]
    report = diagnose_batch(
        prompt_ids, response_ids, policy_loglikelihood(HEALTHY), tokenizer, rewards=rewards,
        **SETTINGS,
    )  # fmt: skip
    reference = score(HEALTHY, dump, **SETTINGS)
    assert report.verdict.regime == reference.verdict.regime == "grounded"
    assert report.flow.regime == reference.flow.regime
    for key in ("normalized_mi", "mi_estimate", "retrieval_accuracy", "conditional_entropy_est",
                "action_state_share", "early_answer_aoc",
                "early_answer_without_reasoning"):  # fmt: skip
        assert report.value(key) == pytest.approx(reference.value(key), abs=1e-4), key
    assert report.early_answer.regime == reference.early_answer.regime != "not_measured"
    assert report.counts["scored_traces"] == reference.counts["scored_traces"]
    assert report.settings["scorer"].startswith("the caller's function")
    logged = report.scalars()
    assert logged["collapse/mi_estimate"] == pytest.approx(report.value("mi_estimate"))
    assert logged["collapse/collapsed"] == 0.0
    assert "collapse/rollout/in_group_reward_std" in logged
    json.dumps(logged)  # plain numbers, for any logger


def test_a_function_returning_the_wrong_shape_is_one_clear_error(batch):
    _, prompt_ids, response_ids = batch
    tokenizer = AutoTokenizer.from_pretrained(HEALTHY)
    with pytest.raises(CollapsecheckError, match="must return one number per pair"):
        diagnose_batch(prompt_ids, response_ids, lambda c, x: [0.0], tokenizer, **SETTINGS)
    with pytest.raises(CollapsecheckError, match="rewards: one value per response"):
        diagnose_batch(prompt_ids, response_ids, policy_loglikelihood(HEALTHY), tokenizer,
                       rewards=[[1.0]] * len(prompt_ids), **SETTINGS)  # fmt: skip
