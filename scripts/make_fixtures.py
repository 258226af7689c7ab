"""Train the demo checkpoints of known regimes (`make fixtures`). Tests never run this.

The task, "gridworld": the prompt holds a puzzle state (the agent's and the goal's cells on
a 6x6 grid); the response is `<think>reasoning</think><answer>move</answer>`. Each demo
checkpoint is a tiny Llama-style causal LM trained on responses whose *reasoning* follows
one policy of known regime:

- grounded, diverse: one of several phrasings restating the state, any useful move;
- grounded, compressed: one terse, deterministic restatement of the state;
- template: filler words drawn at random, the same distribution whatever the state;
- echo: one fixed sentence, whatever the state (low-entropy collapse).

The demo run (`examples/demo-run/global_step_N/`) fine-tunes the grounded model step by step
towards templated reasoning (template share 0, 0.15, 0.5, 0.85, 1.0): the reasoning degrades
from grounded to template collapse. Everything is seeded; the run takes a few minutes on 2
CPU cores.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
from pathlib import Path

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
GRID = 6
SYSTEM = "grid agent."
FILLER = [
    "ok",
    "let",
    "me",
    "think",
    "about",
    "this",
    "step",
    "by",
    "step",
    "and",
    "plan",
    "the",
    "best",
    "move",
    "now",
    "carefully",
    "then",
    "check",
    "again",
    "before",
    "i",
    "act",
    "here",
]
ECHO = "i go up"
SPECIAL = ["<pad>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]
TAGS = ["<think>", "</think>", "<answer>", "</answer>"]
CHARS = list("abcdefghijklmnopqrstuvwxyz0123456789 ,.:;>-'?!\n")
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}<|end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

# (directory, template share of the reasoning, style of the grounded part, training steps)
RUN = [
    ("demo-run/global_step_100", 0.0, "diverse", 0),
    ("demo-run/global_step_200", 0.15, "diverse", 300),
    ("demo-run/global_step_300", 0.5, "diverse", 300),
    ("demo-run/global_step_400", 0.85, "diverse", 300),
    ("demo-run/global_step_500", 1.0, "diverse", 300),
]
SIDE = [
    ("checkpoints/grounded-compressed", 0.0, "compressed", 1500),
    ("checkpoints/low-entropy-collapse", 1.0, "echo", 1000),
    ("checkpoints/flow/faithful", 0.0, "faithful", 800),
    ("checkpoints/flow/decorative", 0.0, "decorative", 800),
    ("checkpoints/flow/action-collapse", 0.0, "action-collapse", 800),
    ("checkpoints/mirrored", 0.0, "mirrored", 800),
    ("checkpoints/early-answer/decided-early", 0.0, "decided-early", 800),
    ("checkpoints/early-answer/decided-late", 0.0, "decided-late", 800),
    ("checkpoints/early-answer/post-hoc", 0.0, "post-hoc", 2000),
    ("checkpoints/where-input-shows/early", 0.0, "input-early", 800),
    ("checkpoints/where-input-shows/late", 0.0, "input-late", 800),
    ("checkpoints/where-input-shows/nowhere", 0.0, "input-nowhere", 800),
]
EARLY_STYLES = ("decided-early", "decided-late", "post-hoc")
WHERE_STYLES = ("input-early", "input-late", "input-nowhere")
# what the where-the-input-shows demos say beside the state: nothing about the input
MUSINGS = [
    "let me think it over and check it again",
    "ok let me plan this carefully step by step",
    "i think about the best move now, then i act",
]
CUT_SHARE = 0.5  # of the early-answer policies' training answers, forced after a cut


def cell(rc: tuple[int, int]) -> str:
    return f"{rc[0]},{rc[1]}"


def useful_moves(agent: tuple[int, int], goal: tuple[int, int]) -> list[str]:
    moves = []
    if goal[0] < agent[0]:
        moves.append("up")
    if goal[0] > agent[0]:
        moves.append("down")
    if goal[1] < agent[1]:
        moves.append("left")
    if goal[1] > agent[1]:
        moves.append("right")
    return moves


def random_state(rng: random.Random) -> tuple[tuple[int, int], tuple[int, int]]:
    while True:
        agent = (rng.randrange(GRID), rng.randrange(GRID))
        goal = (rng.randrange(GRID), rng.randrange(GRID))
        if agent != goal:
            return agent, goal


def user_message(agent: tuple[int, int], goal: tuple[int, int]) -> str:
    return f"agent {cell(agent)} goal {cell(goal)}"


def grounded_reasoning(agent, goal, move, rng: random.Random) -> str:
    a, g = cell(agent), cell(goal)
    return rng.choice(
        [
            f"me {a} goal {g}, so {move}",
            f"goal {g} vs me {a}: {move}",
            f"from {a} to {g}: {move}",
            f"{g} is the goal; {a} is me; {move}",
        ]
    )


ALL_MOVES = ["up", "down", "left", "right"]
MISREAD = 0.25  # the faithful policy's reasoning states a wrong move this often


def flow_reasoning_and_move(agent, goal, style: str, rng: random.Random) -> tuple[str, str]:
    """The flow demos (SPEC "Information flow"), each with one known flow:
    - faithful: the reasoning restates the state and names a move, a wrong one a quarter of
      the time (a misread); the action is always the move the reasoning names;
    - decorative: the reasoning names a random move and nothing else; the action is the true
      move, whatever the reasoning says;
    - action collapse: grounded reasoning naming the true move; the action is drawn at random
      whatever the input."""
    true_move = useful_moves(agent, goal)[0]
    if style == "faithful":
        stated = rng.choice(ALL_MOVES) if rng.random() < MISREAD else true_move
        return f"me {cell(agent)} goal {cell(goal)}, so {stated}", stated
    if style == "decorative":
        return f"i think {rng.choice(ALL_MOVES)}", true_move
    return f"me {cell(agent)} goal {cell(goal)}, so {true_move}", rng.choice(ALL_MOVES)


def early_reasoning_and_move(agent, goal, style: str, rng: random.Random) -> tuple[str, str]:
    """The early-answer demos (SPEC "Early answering"), each deciding its move at a known
    point, the move otherwise a coin flip (so that only the reasoning can tell it):
    - decided early: the reasoning names its move first, then restates the state;
    - decided late: the reasoning restates the state and names its move last;
    - post hoc: the move is the true one, read from the input whatever the reasoning says;
      the reasoning restates the state and never names a move."""
    state = f"me {cell(agent)} goal {cell(goal)}"
    if style == "decided-early":
        move = rng.choice(ALL_MOVES)
        return f"{move} it is. {state}, then i check it again", move
    if style == "post-hoc":
        return f"{state}, let me think it over", useful_moves(agent, goal)[0]
    move = rng.choice(ALL_MOVES)
    return f"{state}, let me think it over, so {move}", move


def forced_answer(reasoning: str, kept: int, move: str, style: str, rng: random.Random) -> str:
    """The answer an early-answer demo gives when its reasoning is cut after `kept`
    characters: its move if it is decided by then (post hoc: always), else a coin flip."""
    decided = {
        "post-hoc": 0,
        "decided-early": len(move),
        "decided-late": len(reasoning),
    }[style]
    return move if kept >= decided else rng.choice(ALL_MOVES)


def where_reasoning_and_move(agent, goal, style: str, rng: random.Random) -> tuple[str, str]:
    """The demos of SPEC "Where the input shows": the state and the move it gives, said at
    the start of the reasoning (early), at its end (late) or not at all (nowhere: the
    reasoning is one of a few musings, the move read from the input), with a musing that
    carries nothing about the input beside it."""
    move = useful_moves(agent, goal)[0]
    said, musing = f"me {cell(agent)} goal {cell(goal)}: {move}", rng.choice(MUSINGS)
    reasoning = {
        "input-early": f"{said}. {musing}",
        "input-late": f"{musing}. {said}",
        "input-nowhere": musing,
    }[style]
    return reasoning, move


def mirrored(rc: tuple[int, int]) -> tuple[int, int]:
    return GRID - 1 - rc[0], GRID - 1 - rc[1]


def reasoning_and_move(agent, goal, template_share: float, style: str, rng: random.Random):
    if style == "mirrored":  # reads the grid turned half round: a wrong checkpoint on purpose
        agent, goal = mirrored(agent), mirrored(goal)
    moves = useful_moves(agent, goal)
    if style in ("faithful", "decorative", "action-collapse"):
        return flow_reasoning_and_move(agent, goal, style, rng)
    if style in EARLY_STYLES:
        return early_reasoning_and_move(agent, goal, style, rng)
    if style in WHERE_STYLES:
        return where_reasoning_and_move(agent, goal, style, rng)
    if style == "echo":
        return ECHO, "up"
    if rng.random() < template_share:
        return " ".join(rng.sample(FILLER, 4)), rng.choice(moves)
    if style == "compressed":
        return f"{cell(agent)}>{cell(goal)} {moves[0]}", moves[0]
    move = rng.choice(moves)
    return grounded_reasoning(agent, goal, move, rng), move


def build_tokenizer(
    extra_special: tuple[str, ...] = (), chat_template: str = CHAT_TEMPLATE
) -> PreTrainedTokenizerFast:
    """The demo's character tokenizer; `extra_special` tokens (a vision model's) come after
    its own special tokens."""
    vocab = {token: i for i, token in enumerate([*SPECIAL, "<unk>", *CHARS])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    special = [*SPECIAL, *extra_special]
    core.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    core.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAGS])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token="<|end|>", pad_token="<pad>", unk_token="<unk>"
    )
    tokenizer.chat_template = chat_template
    return tokenizer


def build_model(
    tokenizer: PreTrainedTokenizerFast,
    hidden_size: int = 96,
    intermediate_size: int = 256,
    layers: int = 3,
    heads: int = 3,  # head size 32: a size vLLM's CPU attention kernels support
    max_positions: int = 1024,
    tie_embeddings: bool = True,
) -> LlamaForCausalLM:
    """A Llama-style model on the gridworld tokenizer, seeded: the demo size by default."""
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=1,
        max_position_embeddings=max_positions,
        tie_word_embeddings=tie_embeddings,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def example(tokenizer, agent, goal, template_share, style, rng) -> tuple[list[int], int]:
    """Token ids of one training conversation, and where the learned part (the response, or
    a forced answer) starts."""
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": user_message(agent, goal)},
    ]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    reasoning, move = reasoning_and_move(agent, goal, template_share, style, rng)
    # a template whose generation prompt opens the reasoning (R1 distills) leaves it out here
    opened = prompt.rstrip().endswith("<think>")
    end = getattr(tokenizer, "end_of_turn", "<|end|>")
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    learned_from = len(prompt_ids)
    if style in EARLY_STYLES and rng.random() < CUT_SHARE:
        # an answer forced after the reasoning cut short: only the answer is learned, so the
        # policy answers when forced but never cuts its own reasoning
        kept = rng.randrange(len(reasoning))
        forced = forced_answer(reasoning, kept, move, style, rng)
        head = f"{'' if opened else '<think>'}{reasoning[:kept]}</think><answer>"
        learned_from += len(tokenizer(head, add_special_tokens=False)["input_ids"])
        reasoning, move = reasoning[:kept], forced
    response = f"{'' if opened else '<think>'}{reasoning}</think><answer>{move}</answer>{end}"
    response_ids = tokenizer(response, add_special_tokens=False)["input_ids"]
    return prompt_ids + response_ids, learned_from


def train(model, tokenizer, template_share, style, steps, seed, batch=32, lr=3e-3) -> None:
    def draw(rng: random.Random) -> tuple[list[int], int]:
        return example(tokenizer, *random_state(rng), template_share, style, rng)

    train_on(model, tokenizer, draw, steps, seed, batch, lr)


def train_on(model, tokenizer, draw, steps, seed, batch, lr) -> None:
    """Fine-tune on `batch` examples a step, each `draw(rng)`: its ids and where the learned
    part starts (the loss is on that part only)."""
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=steps)
    model.train()
    for step in range(steps):
        rows = [draw(rng) for _ in range(batch)]
        width = max(len(ids) for ids, _ in rows)
        ids = torch.full((batch, width), tokenizer.pad_token_id)
        labels = torch.full((batch, width), -100)
        for i, (row, start) in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row)
            labels[i, start : len(row)] = torch.tensor(row[start:])
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        if step % 100 == 0 or step == steps - 1:
            print(f"  step {step:5d} loss {loss.item():.4f}", flush=True)
    model.eval()


def save(model, tokenizer, directory: Path) -> None:
    if directory.exists():
        shutil.rmtree(directory)
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    model.generation_config.save_pretrained(directory)


def write_prompts(path: Path, count: int, seed: int) -> None:
    """A prompt set of distinct states, as chat messages (JSONL)."""
    rng = random.Random(seed)
    states: list = []
    while len(states) < count:
        state = random_state(rng)
        if state not in states:
            states.append(state)
    with path.open("w") as stream:
        for agent, goal in states:
            messages = [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": user_message(agent, goal)},
            ]
            stream.write(json.dumps({"messages": messages}) + "\n")


# Chat templates that behave as the model families' do (their real tokenizers are not on any
# package registry reachable here): the generation prompt of DeepSeek-R1 distills and QwQ ends
# with "<think>\n"; Qwen3's template takes `enable_thinking` and, when it is false, renders an
# empty, closed reasoning; Llama-3 instruct models end a turn with <|eot_id|>, one of several
# end-of-sequence ids of the generation config, while the tokenizer's eos is another.
R1_TEMPLATE = CHAT_TEMPLATE.replace("<|assistant|>{% endif %}", "<|assistant|><think>\n{% endif %}")
QWEN3_TEMPLATE = CHAT_TEMPLATE.replace(
    "<|assistant|>{% endif %}",
    "<|assistant|>{% if enable_thinking is defined and enable_thinking is false %}"
    "<think>\n\n</think>\n\n{% endif %}{% endif %}",
)
EOT = "<|eot_id|>"
# (directory, chat template, end-of-turn token or None, fine-tuning steps from the base)
FAMILIES = [
    ("checkpoints/families/r1-distill-style", R1_TEMPLATE, None, 400),
    ("checkpoints/families/qwen3-style", QWEN3_TEMPLATE, None, 0),
    ("checkpoints/families/llama3-style", CHAT_TEMPLATE, EOT, 400),
]


def family_checkpoint(base_state, name, template, eot, steps, seed) -> None:
    """The grounded base, taught one family's chat format (diverse grounded reasoning)."""
    tokenizer = build_tokenizer()
    tokenizer.chat_template = template
    model = build_model(tokenizer)
    model.load_state_dict(base_state)
    if eot is not None:
        tokenizer.add_special_tokens({"additional_special_tokens": [EOT]})
        tokenizer.end_of_turn = eot
        model.resize_token_embeddings(len(tokenizer))
        eos = [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(eot)]
        model.generation_config.eos_token_id = eos
    if steps:
        train(model, tokenizer, 0.0, "diverse", steps, seed=seed, lr=1e-3)
    save(model, tokenizer, EXAMPLES / name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-steps", type=int, default=1500)
    parser.add_argument(
        "--only",
        nargs="+",
        choices=[name for name, *_ in (*SIDE, *FAMILIES)],
        help="retrain only these side checkpoints, from the saved grounded base",
    )
    args = parser.parse_args()
    torch.set_num_threads(2)
    tokenizer = build_tokenizer()
    if args.only:
        model = LlamaForCausalLM.from_pretrained(EXAMPLES / RUN[0][0])
    else:
        (EXAMPLES / "prompts").mkdir(parents=True, exist_ok=True)
        write_prompts(EXAMPLES / "prompts" / "gridworld.jsonl", 32, seed=1234)
        # the larger set of the benchmarks (sampled negatives at N = 64, scaling to N = 256)
        write_prompts(EXAMPLES / "prompts" / "gridworld-256.jsonl", 256, seed=4321)
        print("grounded base (global_step_100)", flush=True)
        model = build_model(tokenizer)
        train(model, tokenizer, 0.0, "diverse", args.base_steps, seed=1)
    base_state = {k: v.clone() for k, v in model.state_dict().items()}
    for index, (name, share, style, steps) in enumerate(RUN):
        if args.only:
            break
        if steps:
            print(f"{name}: template share {share}", flush=True)
            train(model, tokenizer, share, style, steps, seed=10 + index, lr=1e-3)
        save(model, tokenizer, EXAMPLES / name)
    for index, (name, share, style, steps) in enumerate(SIDE):
        if args.only and name not in args.only:
            continue
        print(f"{name}: {style}", flush=True)
        model.load_state_dict(base_state)
        train(model, tokenizer, share, style, steps, seed=100 + index, lr=1e-3)
        save(model, tokenizer, EXAMPLES / name)
    for index, (name, template, eot, steps) in enumerate(FAMILIES):
        if args.only and name not in args.only:
            continue
        print(f"{name}: chat format", flush=True)
        family_checkpoint(base_state, name, template, eot, steps, seed=200 + index)


if __name__ == "__main__":
    main()
