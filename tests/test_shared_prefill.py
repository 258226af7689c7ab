"""Played scans share a prefill (SPEC "Sampling", "Agents across turns"): the K episodes of a
start state, and episodes still identical at a later turn, are prefilled once and decoded
from that one prefill, each from its own seed, so every episode is what it was before."""

import json
import tempfile
from pathlib import Path

import pytest

from collapsecheck import load_environment, play
from collapsecheck.engines.backends.hf import TransformersBackend
from collapsecheck.settings import EnvSettings, LoadSettings, Settings
from tests.conftest import EXAMPLES, ROOT
from tests.test_ragen_env import SHAPED, ragen_importable
from tests.test_sampling import prefilled_rows

BEFORE = ROOT / "tests" / "fixtures" / "played-before-sharing" / "episodes.json"
WALKER = EXAMPLES / "agents" / "walker"
GRIDWORLD = f"{EXAMPLES / 'environments' / 'gridworld.py'}:make"
STARTS, K = 4, 4
SETTINGS = {"num_prompts": STARTS, "k": K, "max_new_tokens": 32, "device": "cpu",
            "bootstrap": 50}  # fmt: skip


@pytest.fixture(scope="module")
def walker():
    return TransformersBackend.from_checkpoint(WALKER, LoadSettings(device="cpu"))


def played_dump(backend, spec: str, env: EnvSettings, config: Path | None, folder: Path) -> Path:
    """A played scan's dump, in `folder`."""
    environment = load_environment(spec, {}, config=config)
    play(WALKER, environment, Settings.build(**SETTINGS), env=env, dump=folder, loaded=backend)
    return folder


def played_ids(backend, spec: str, env: EnvSettings, config: Path | None = None) -> list:
    """Each trace of a played scan's dump as [prompt_index, sample_index, response_ids]."""
    with tempfile.TemporaryDirectory() as folder:
        dump = played_dump(backend, spec, env, config, Path(folder))
        rows = [json.loads(line) for line in (dump / "traces.jsonl").open()]
    return [[r["prompt_index"], r["sample_index"], r["response_ids"]] for r in rows]


def test_a_played_scan_draws_every_episode_it_drew_before_sharing(walker):
    """The demo gridworld (twins that took the same moves share later turns' contexts too)
    and RAGEN's 500-token contexts: the same ids, byte for byte, as before."""
    before = json.loads(BEFORE.read_text())
    env = EnvSettings(env=GRIDWORLD, max_turns=4, context_window=1)
    assert played_ids(walker, GRIDWORLD, env) == before["gridworld"]
    with ragen_importable(SHAPED):
        env = EnvSettings(env="ragen:GridWorld", env_config=SHAPED / "config.yaml", max_turns=2)
        ragen = played_ids(walker, "ragen:GridWorld", env, SHAPED / "config.yaml")
    assert ragen == before["ragen"]


def test_the_k_episodes_of_a_start_state_are_prefilled_once(walker, tmp_path):
    """RAGEN's GridWorld: at turn 1, N start states with K identical contexts each are N
    prefilled rows; at turn 2, one row per distinct context (the dump keeps each distinct
    context once: turn 1's N, then turn 2's)."""
    rows, hook = prefilled_rows(walker.model)
    try:
        with ragen_importable(SHAPED):
            env = EnvSettings(env="ragen:GridWorld", env_config=SHAPED / "config.yaml",
                              max_turns=2)  # fmt: skip
            dump = played_dump(walker, "ragen:GridWorld", env, SHAPED / "config.yaml", tmp_path)
    finally:
        hook.remove()
    first, second = rows[:2]  # the two turns' prefills; the scorer's passes follow
    contexts = len((dump / "prompts.jsonl").read_text().splitlines())
    assert first == STARTS
    assert second == contexts - STARTS < STARTS * K
