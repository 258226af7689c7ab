"""Train the tool-calling demo agent (`examples/agents/tool-caller`; tests of SPEC "Agents
behind an OpenAI client"). Tests never run this.

A byte-level tokenizer with Qwen's special tokens and Qwen3's chat template (as TRL ships it),
so the endpoint renders tools and reads replies in Qwen's `<tool_call>` format. The agent is
fine-tuned on two turns of an adding game rendered with the `add` tool's schema:
- the user asks "add N" (a digit): it writes "I add N." and calls `add` with n = N;
- the tool answers "total T": it writes "The total is T." and answers `<answer>T</answer>`.
Both copy a number from the input, so the reasoning depends on it. Like Qwen2.5's tool-calling
agents it writes no reasoning tags: its reasoning is the text before its tool calls (SPEC
"Agents across turns"). Seeded; about six minutes on
2 CPU cores."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
from trl.chat_template_utils import qwen3_chat_template

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_fixtures import EXAMPLES, build_model, save, train_on

TARGET = EXAMPLES / "agents" / "tool-caller"
# the `add` tool as verifiers describes it (tests/fixtures/environments/verifiers/cc_adder.py):
# 0.1.9 without `strict`, 0.3.1 with it
PARAMETERS = {"properties": {"n": {"description": "The number to add.", "title": "N",
                                   "type": "integer"}},
              "required": ["n"], "title": "add_args", "type": "object",
              "additionalProperties": False}  # fmt: skip
ADD = {"name": "add", "description": "Add n to the running total.", "parameters": PARAMETERS}
SCHEMAS = [{"type": "function", "function": ADD},
           {"type": "function", "function": {**ADD, "strict": True}}]  # fmt: skip


def build_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    inner = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    inner.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    inner.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=inner)
    tokenizer.add_special_tokens({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                                  "additional_special_tokens": ["<|im_start|>"]})  # fmt: skip
    tokenizer.add_tokens(["<tool_call>", "</tool_call>", "<think>", "</think>",
                          "<tool_response>", "</tool_response>"])  # fmt: skip
    tokenizer.chat_template = qwen3_chat_template
    return tokenizer


def call(n: int) -> str:
    return f"<tool_call>\n{json.dumps({'name': 'add', 'arguments': {'n': n}})}\n</tool_call>"


def example(tokenizer: PreTrainedTokenizerFast, rng: random.Random) -> tuple[list[int], int]:
    """One turn of the game in its rendered context: its ids and where the reply starts."""
    n, start = rng.randint(0, 9), rng.randint(0, 9)
    chat = [{"role": "user", "content": f"add {n}"}]
    reply = f"I add {n}.\n{call(n)}"
    if rng.random() < 0.5:
        called = {"type": "function", "function": {"name": "add", "arguments": {"n": n}}}
        chat += [{"role": "assistant", "content": "", "tool_calls": [called]},
                 {"role": "tool", "content": f"total {start + n}"}]  # fmt: skip
        reply = f"The total is {start + n}.\n<answer>{start + n}</answer>"
    tools = [rng.choice(SCHEMAS)]
    context = tokenizer.apply_chat_template(chat, tools=tools, add_generation_prompt=True,
                                            tokenize=False)  # fmt: skip
    ids = tokenizer(context, add_special_tokens=False)["input_ids"]
    answer = tokenizer(reply + "<|im_end|>", add_special_tokens=False)["input_ids"]
    return ids + answer, len(ids)


def main() -> None:
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, hidden_size=64, intermediate_size=128, layers=2, heads=2)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    train_on(model, tokenizer, lambda rng: example(tokenizer, rng), steps=900, seed=0, batch=16,
             lr=3e-3)  # fmt: skip
    save(model, tokenizer, TARGET)
    print(f"saved {TARGET}")


if __name__ == "__main__":
    main()
