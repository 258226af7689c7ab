"""RAGEN's own environments, played as RAGEN's managers play them at validation (SPEC "RAGEN's
own environments"; `ragen/llm_agent/ctx_manager.py` and `es_manager.py`, RAGEN 20daedc).

`--env ragen:TAG` plays the `custom_envs` entry TAG of the run's RAGEN config
(`ragen_config`) in RAGEN's own class for its `env_type` (`ragen_classes`), one instance per
episode, built from the entry's `env_config`:

- the episode resets with `reset(seed=s, mode="val")` and is seen through `render()`, after the
  reset and after every action (what `reset` and `step` return is not read, as RAGEN's manager
  does not read it);
- each turn's prompt is RAGEN's: its system message, the user text of each turn (its number, the
  state, the warning after a turn with no valid action, the actions left, the format reminder),
  the reward message after each turn, earlier replies as RAGEN normalised them, then the chat
  template's generation prompt and `<think>` (or `<answer>` where `enable_think` is off), which
  the response continues;
- the reply is parsed as RAGEN parses it, each action name mapped through the environment's
  `config.action_lookup` (read after the reset) case-insensitively, and the valid ones executed
  in order within the episode's action budget, stopping at done; the format penalty is charged
  where any name was not valid or none was.

The quirks of RAGEN's rendering are kept (its system message reads the entry's top-level keys
over the config class's defaults, not the nested `env_config`): the policy was trained on what
RAGEN rendered."""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import numbers
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.environments.factories import kept_info
from collapsecheck.inputs.environments.protocol import (
    Adapter,
    Loading,
    Resolved,
    TurnPlayed,
    refuse_unused,
)
from collapsecheck.inputs.environments.ragen_classes import RagenClasses, ragen_classes
from collapsecheck.inputs.environments.ragen_config import (
    RagenSetup,
    find_config,
    setup_for,
)
from collapsecheck.inputs.episodes import EpisodeTurn
from collapsecheck.inputs.prompts import Prompt, RenderedPrompt, apply_chat_template

if TYPE_CHECKING:
    from collapsecheck.settings import EnvSettings, PromptSettings, SamplingSettings

OPENING = "You're a helpful assistant. "
FORMAT_THINK = "<think> [Your thoughts] </think> <answer> [your answer] </answer>"
FORMAT_ANSWER = "<answer> [your answer] </answer>"
NO_VALID_ACTION = (
    "No valid action provided previously. Environment state remains the same. Please try again.\n"
)
SPECIAL_TOKENS = ("<think>", "</think>", "<answer>", "</answer>", "<|im_start|>", "<|im_end|>")
COORD_HINT = (
    "\nStates are provided as coordinate lists using zero-based indexing "
    "with the format (row, col) for each entity type: Walls, Targets, Boxes, "
    "Boxes on target, Player, and Player on target when applicable."
)
PLAYED_MODES = ("full", "limited_multi_turn")


def system_message(setup: RagenSetup, classes: RagenClasses, action_sep: str) -> str:
    """`ContextManager._build_system_content`: RAGEN's opening and the tag's instruction, with
    the grid's vocabulary, the coordinate hint and the available actions where the config
    class's defaults, overridden by the entry's top-level keys, have them."""
    seen = dataclasses.asdict(classes.config_class()) | dict(setup.entry)
    instruction = seen.get("env_instruction", "") or ""
    layout = seen.get("observation_format", "grid")
    if layout == "grid" and seen.get("grid_vocab", False):
        vocabulary = ", ".join(f"{k}: {v}" for k, v in seen["grid_vocab"].items())
        instruction += "\nThe meaning of each symbol in the state is:\n" + vocabulary
    if layout == "coord":
        instruction += COORD_HINT
    if seen.get("action_lookup", False):
        instruction += "\nYour available actions are:\n" + ", ".join(
            f"{v}" for v in seen["action_lookup"].values()
        )
        instruction += (
            f"\nYou can make up to {seen['max_actions_per_traj']} actions, separated by the "
            f'action separator " {action_sep} "\n'
        )
    return OPENING + instruction


def turn_text(entry: Mapping[str, Any], number: int, enable_think: bool, max_tokens: Any) -> str:
    """`ContextManager._build_turn_state_content` of one history entry (with its warning)."""
    reminder = FORMAT_THINK if enable_think else FORMAT_ANSWER
    warning = NO_VALID_ACTION if entry.get("manager_invalid_action") else ""
    return (
        f"\nTurn {number}:\nState:\n{entry['state']}\n{warning}"
        f"You have {entry['actions_left']} actions left. Always output: {reminder} "
        f"with no extra text. Strictly follow this format. "
        f"Max response length: {max_tokens} words (tokens).\n"
    )


def parsed_reply(
    response: str, enable_think: bool, action_sep: str, most: int
) -> tuple[str, list[str]]:
    """`ContextManager._parse_response`: the reply as the history keeps it and its action
    names (at most `most`, the rest dropped unsaid, as RAGEN drops them)."""
    pattern = r"<think>(.*?)</think>\s*<answer>(.*?)</answer>" if enable_think else (
        r"<answer>(.*?)</answer>"
    )  # fmt: skip
    match = re.search(pattern, response, re.DOTALL)
    if match is None:
        return response, []
    think, answer = (match.group(1), match.group(2)) if enable_think else ("", match.group(1))
    for token in SPECIAL_TOKENS:
        answer = answer.replace(token, "").strip()
        think = think.replace(token, "").strip()
    actions = [a.strip() for a in answer.split(action_sep) if a.strip()]
    if len(actions) > most:
        actions = actions[:most]
        answer = f" {action_sep} ".join(actions)
    if enable_think:
        return f"<think>{think}</think><answer>{answer}</answer>", actions
    return f"<answer>{answer}</answer>", actions


@dataclasses.dataclass(frozen=True)
class RagenRules:
    """The values one tag is played by, resolved (the config's, or the flags' over them)."""

    setup: RagenSetup
    classes: RagenClasses
    system: str

    @property
    def opening_tag(self) -> str:
        return "<think>" if self.setup.enable_think.value else "<answer>"


def rules_for(setup: RagenSetup, classes: RagenClasses) -> RagenRules:
    mode = setup.context_window_mode.value
    if mode not in PLAYED_MODES:
        raise CollapsecheckError(
            f"{setup.context_window_mode.source}: context_window_mode {mode!r} is not played "
            f"by collapsecheck yet ({' and '.join(PLAYED_MODES)} are)"
        )
    return RagenRules(setup, classes, system_message(setup, classes, setup.action_sep.value))


class RagenGame:
    """One episode of the tag's environment as RAGEN's managers play it (module docstring)."""

    def __init__(self, rules: RagenRules, seed: int, where: str) -> None:
        self.rules, self.seed, self.where = rules, seed, where
        setup = rules.setup
        options = setup.entry.get("env_config") or {}
        self.env = self._call(None, lambda: rules.classes.env_class(
            rules.classes.config_class(**options)
        ))  # fmt: skip
        self.budget = int(setup.max_actions_per_traj.value)
        self.executed = 0
        self._call(None, lambda: self.env.reset(seed=seed, mode="val"))
        self.history: list[dict[str, Any]] = [
            {"state": self._render(None), "actions_left": self.budget}
        ]

    @property
    def observation(self) -> str:
        return self.history[-1]["state"]

    def _where(self, turn: int | None) -> str:
        return f"{self.where} (seed {self.seed}, {'reset' if turn is None else f'turn {turn}'})"

    def _call(self, turn: int | None, call: Any) -> Any:
        try:
            return call()
        except Exception as err:  # RAGEN's environment can fail in any way
            raise CollapsecheckError(
                f"{self._where(turn)}: the environment raised {type(err).__name__}: {err}"
            ) from None

    def _render(self, turn: int | None) -> str:
        shown = self._call(turn, self.env.render)
        if not isinstance(shown, str):
            raise CollapsecheckError(
                f"{self._where(turn)}: render() gave a {type(shown).__name__}, not text "
                "(collapsecheck plays RAGEN's text environments)"
            )
        return shown

    def messages(self) -> list[dict[str, str]]:
        """`_build_infer_multi_turn_messages` over the history the context window keeps."""
        setup = self.rules.setup
        history, offset = self.history, 0
        window = setup.max_context_window.value
        limited = setup.context_window_mode.value == "limited_multi_turn"
        if limited and window is not None and window > 0 and len(history) > window:
            offset, history = len(history) - window, history[-window:]
        messages = [{"role": "system", "content": self.rules.system},
                    {"role": "user", "content": ""}]  # fmt: skip
        for index, entry in enumerate(history):
            if "state" in entry:
                messages[-1]["content"] += turn_text(
                    entry, index + 1 + offset, setup.enable_think.value, setup.max_tokens.value
                )
            if "llm_response" in entry:
                messages.append({"role": "assistant", "content": entry["llm_response"]})
            if "reward" in entry:
                messages.append({"role": "user", "content": f"Reward:\n{entry['reward']}\n"})
        return messages

    def context(
        self, tokenizer: Any, settings: PromptSettings, origin: str
    ) -> tuple[Prompt, RenderedPrompt]:
        """The turn's prompt as RAGEN renders and tokenizes it (`_build_infer_samples`); the
        prompt flags do not apply (RAGEN's template call takes none)."""
        messages = kept_within(self.messages(), tokenizer, self.rules.setup.max_model_len.value,
                               origin)  # fmt: skip
        text = apply_chat_template(tokenizer, messages, None, origin) + self.rules.opening_tag
        ids = tokenizer(text)["input_ids"]
        return Prompt(messages, origin), RenderedPrompt(text, tuple(int(i) for i in ids))

    def play(self, response: str, located: str, turn: int) -> TurnPlayed:
        """`get_env_inputs` then `EnvStateManager.step` for this episode's reply (the action
        is what RAGEN parses, not the located segment)."""
        setup = self.rules.setup
        raw = self.rules.opening_tag + response
        normalised, actions = parsed_reply(
            raw, setup.enable_think.value, setup.action_sep.value,
            int(setup.max_actions_per_turn.value),
        )  # fmt: skip
        lookup = getattr(getattr(self.env, "config", None), "action_lookup", None)
        if lookup is None:
            valid: list[Any] = list(actions)
        else:
            names = {str(v).lower(): k for k, v in lookup.items()}
            valid = [names[a.lower()] for a in actions if a.lower() in names]
        left = self.budget - self.executed
        reward: Any = 0
        info: dict[str, Any] = {}
        done, ids, renders = False, [], []
        for action in valid[:left]:
            answer = self._call(turn, lambda a=action: self.env.step(a))
            if not isinstance(answer, tuple) or len(answer) != 4:
                raise CollapsecheckError(
                    f"{self._where(turn)}: step returned {type(answer).__name__}; RAGEN's "
                    "managers read (observation, reward, done, info)"
                )
            _, gained, ended, step_info = answer
            reward += gained
            info.update(step_info or {})
            ids.append(action)
            renders.append(self._render(turn))
            if ended:
                done = True
                break
        charged = len(valid) != len(actions) or not valid
        penalty = float(setup.format_penalty.value) if charged else 0.0
        self.executed += len(ids)
        entry = self.history[-1]
        state = entry["state"]
        entry.update({"llm_response": normalised, "reward": reward, "actions": ids})
        left = self.budget - self.executed
        self.history.append({"state": self._render(turn), "actions_left": left})
        if not valid:
            self.history[-1]["manager_invalid_action"] = True
        # es_manager: success where the environment ended the episode and said so; an
        # exhausted action budget ends it as a failure
        success = done and bool(info.get("success", False))
        done = done or self.executed >= self.budget
        played = EpisodeTurn(
            state, response, f" {setup.action_sep.value} ".join(actions), float(reward),
            kept_info(info), tuple(actions), tuple(plain(i) for i in ids), tuple(renders), penalty,
        )  # fmt: skip
        return TurnPlayed(played, self.observation, done, success)

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if callable(close):
            self._call(None, close)


def plain(action: Any) -> int | str:
    """An action id as the dump keeps it: an integer (numpy's too), else its text."""
    return int(action) if isinstance(action, numbers.Integral) else str(action)


def kept_within(messages: list[dict[str, str]], tokenizer: Any, limit: Any, origin: str) -> list:
    """`ContextManager._apply_max_length`: the oldest turns dropped, the system message kept,
    while the rendered chat (generation prompt included, `<think>` not) is over
    `max_model_len` tokens; RAGEN sends what is left even where it is still over."""
    if limit is None:
        return messages

    def length(kept: list[dict[str, str]]) -> int:
        text = apply_chat_template(tokenizer, kept, None, origin)
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    system, conversation = messages[0], messages[1:]
    size = length(messages)
    while size > limit and len(conversation) > 2:
        first, second, third = conversation[0], conversation[1], conversation[2]
        if (first["role"], second["role"], third["role"]) == ("user", "assistant", "user") and (
            "Reward" in third.get("content", "")
        ):
            conversation = conversation[3:]
        elif (first["role"], second["role"]) == ("user", "assistant"):
            conversation = conversation[2:]
        else:
            conversation = conversation[1:]
        size = length([system, *conversation])
    return [system, *conversation]


@dataclasses.dataclass(frozen=True, eq=False)
class RagenSpec:
    """`--env ragen:TAG` loaded: the tag's rules, the config they came from, and what the
    report says of them."""

    spec: str
    rules: RagenRules
    near: Path | None
    named: Path | None
    notes: tuple[str, ...] = ()

    @property
    def origin(self) -> Path:
        return self.rules.setup.config.path

    @property
    def code_sha256(self) -> str:
        """The config file's bytes and the environment's and its config class's code."""
        digest = hashlib.sha256(self.origin.read_bytes())
        for cls in (self.rules.classes.env_class, self.rules.classes.config_class):
            digest.update(Path(inspect.getfile(cls)).read_bytes())
        return digest.hexdigest()

    def key(self) -> dict[str, Any]:
        return {"env": self.spec, "env_config": str(self.origin)}

    def resolved(self, env: EnvSettings, sampling: SamplingSettings) -> Resolved:
        """RAGEN's validation values where the flags do not give them: the first seed, the
        turns, the start states (the tag's groups), the episodes from each (the group size) and
        the temperature; each with where it came from."""
        setup = self.rules.setup
        if env.context_window != -1:
            raise CollapsecheckError(
                f"--context-window goes with FILE.py:FACTORY environments: --env {self.spec} "
                "keeps what its config's max_context_window keeps "
                f"({setup.max_context_window.source})"
            )
        chosen = {
            "env_seed": (env.env_seed, "--env-seed", setup.first_seed),
            "max_turns": (env.max_turns, "--max-turns", setup.max_turn),
            "num_prompts": (sampling.num_prompts, "-n", setup.groups),
            "k": (sampling.k, "-k", setup.group_size),
            "temperature": (sampling.temperature, "--temperature", setup.temperature),
        }
        values, sources = {}, {}
        for name, (given, flag, read) in chosen.items():
            values[name] = read.value if given is None else given
            sources[name] = f"{values[name]!r} ({read.source if given is None else flag})"
        sources |= {k: v for k, v in setup.sources().items() if k not in RESOLVED_KEYS}
        return Resolved(
            dataclasses.replace(env, env_seed=values["env_seed"], max_turns=values["max_turns"]),
            dataclasses.replace(sampling, num_prompts=values["num_prompts"], k=values["k"],
                                temperature=values["temperature"]),
            sources,
        )  # fmt: skip

    def game(self, seed: int, env: EnvSettings, prompts: PromptSettings) -> RagenGame:
        return RagenGame(self.rules, seed, f"--env {self.spec}")

    def __reduce__(self) -> tuple[Any, tuple[str, Path | None, Path | None]]:
        """Pickled as its tag and where its config was found, loaded again where it is
        unpickled (a Ray task's process)."""
        return load_ragen, (self.spec.partition(":")[2], self.near, self.named)


# the values `RagenSpec.resolved` reports as the flags or the config gave them
RESOLVED_KEYS = ("max_turn", "group_size", "groups", "first_seed", "temperature")


def load_ragen(tag: str, near: Path | None, named: Path | None) -> RagenSpec:
    """`--env ragen:TAG`: the run's config (or --env-config), the tag's entry, RAGEN's own
    classes for its env_type; each missing piece one line, before any model loads."""
    spec = f"ragen:{tag}"
    if not tag:
        raise CollapsecheckError("--env ragen:TAG needs the tag: a custom_envs entry of the config")
    config = find_config(near, named)
    setup = setup_for(config, tag)
    classes = ragen_classes(setup.env_type, f"--env {spec}")
    rules = rules_for(setup, classes)
    notes = [*setup.notes, *([f"{config.path}: composed without {', '.join(config.missing)} "
                             "(not found beside it): their keys are unread"]
                            if config.missing else [])]  # fmt: skip
    first = int(setup.first_seed.value)
    differs = next((seed for seed in range(first, first + CHECKED_SEEDS)
                    if not reproducible(rules, seed, spec)), None)  # fmt: skip
    if differs is not None:
        notes.append(
            f"--env {spec}: two {classes.env_class.__name__}s reset at seed {differs} render "
            "differently (the class draws from more than the seed): RAGEN's own run may differ "
            "from these episodes"
        )
    # where to find them again in another process (a Ray task's), whatever its folder
    near, named = (None if p is None else p.resolve() for p in (near, named))
    return RagenSpec(spec, rules, near, named, tuple(notes))


# the first start states checked for a class that draws from more than the seed: two draws can
# render alike by chance (Bandit's arms come from a short list of names)
CHECKED_SEEDS = 3


def reproducible(rules: RagenRules, seed: int, spec: str) -> bool:
    """Whether two fresh environments reset at one seed render alike."""
    one, two = (RagenGame(rules, seed, f"--env {spec}") for _ in range(2))
    same = one.observation == two.observation
    one.close()
    two.close()
    return same


def load_tag(tag: str, loading: Loading) -> RagenSpec:
    """`--env ragen:TAG` as the registry loads it: built from its config alone."""
    refuse_unused(f"ragen:{tag}", loading, ("--env-config",), "it is built from its config")
    return load_ragen(tag, loading.near, loading.config)


RAGEN = Adapter(load_tag)
