"""The vision-language fixtures (`make vlm-fixtures`). Tests never run this.

The task, "visual gridworld": the board (a 6x6 grid, the agent's row and column lit red, the
goal's green) is only in the image; the text is the same for every prompt. The response is
`<think>reasoning</think><answer>move</answer>`. Each policy is a tiny Qwen2-VL-shaped model
(a vision tower of two blocks, 14-pixel patches merged 2x2, so an 84x84 board is 9 image
tokens; a three-layer language model with Qwen2-VL's 3D rotary positions), built from a
config on the demo's character tokenizer with Qwen2-VL's vision tokens, and trained on CPU:

- `examples/checkpoints/vision/grounded`: the reasoning names the cells the image shows
  ("me 3,4 goal 0,1, so up") and the move follows it;
- `examples/checkpoints/vision/template`: fluent filler, the same whatever the board (visually
  ungrounded template collapse), and a move that does not read the board either;
- `examples/checkpoints/vision/reads-text`: trained with the state in the text and another
  state's board in the image, so its reasoning reads the text and ignores the picture: on
  `visual-gridworld-mixed.jsonl`, where both hold the state, it scans grounded and the
  image's share is 0.000 [-0.000, 0.002] (docs/vision.md has the table).

Why crosshairs: a board with one marked cell per piece was not learned in 3,000 steps (the
loss stayed at the level of guessing the cells; docs/vision.md); with the pieces' rows and
columns lit, every image token shows part of the state, and the model learns to read it.

Also writes the prompt sets `examples/prompts/visual-gridworld.jsonl` (the text the same for
every board) and `visual-gridworld-mixed.jsonl` (the state in the text too), their boards
(`examples/prompts/boards/`) with the reward function's ground truth in each row, and
`tests/fixtures/qwen2-vl-tiny/`, `qwen2.5-vl-tiny/`, `qwen3-vl-tiny/` and `qwen3-vl-moe-tiny/`
(the same shapes in each Qwen-VL generation, random weights: the exactness tests').
Seeded; about 20 minutes on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
from pathlib import Path

import make_fixtures
import torch
from make_fixtures import (
    EXAMPLES,
    FILLER,
    cell,
    random_state,
    useful_moves,
    user_message,
)
from PIL import Image, ImageDraw
from transformers import (
    PreTrainedTokenizerFast,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
    Qwen3VLMoeConfig,
    Qwen3VLMoeForConditionalGeneration,
)
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

GRID, CELL = 6, 14  # one 14-pixel patch per cell: an 84 x 84 board
VISION = ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>"]
SYSTEM = "grid agent. the board is in the image."
QUESTION = "your move?"
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% else %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<|end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
POLICIES = {"grounded": 4000, "template": 600, "reads-text": 2500}  # training steps
PROMPTS = EXAMPLES / "prompts" / "visual-gridworld.jsonl"
# the same boards, each with its state also in the text: the image's share is measured there
MIXED = EXAMPLES / "prompts" / "visual-gridworld-mixed.jsonl"
BOARDS = EXAMPLES / "prompts" / "boards"


def build_tokenizer() -> PreTrainedTokenizerFast:
    """The demo's tokenizer with Qwen2-VL's vision tokens and a template for image parts."""
    return make_fixtures.build_tokenizer(tuple(VISION), CHAT_TEMPLATE)


def image_processor() -> Qwen2VLImageProcessorPil:
    side = GRID * CELL
    return Qwen2VLImageProcessorPil(min_pixels=side * side, max_pixels=side * side)


def language_config(tokenizer: PreTrainedTokenizerFast) -> dict:
    return {
        "vocab_size": len(tokenizer), "hidden_size": 96, "intermediate_size": 256,
        "num_hidden_layers": 3, "num_attention_heads": 3, "num_key_value_heads": 1,
        "max_position_embeddings": 1024, "tie_word_embeddings": True,
        "bos_token_id": None, "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }  # fmt: skip


# The tiny vision towers of the three Qwen-VL generations: 14-pixel patches merged 2x2.
VISION_CONFIGS = {
    "qwen2_vl": {"depth": 2, "embed_dim": 48, "num_heads": 2, "hidden_size": 96, "mlp_ratio": 2},
    "qwen2_5_vl": {"depth": 2, "hidden_size": 48, "num_heads": 2, "intermediate_size": 96,
                   "out_hidden_size": 96, "window_size": 56, "fullatt_block_indexes": [1]},
    # Qwen3-VL adds deepstack: features of the tower's first block into the first layer
    "qwen3_vl": {"depth": 2, "hidden_size": 48, "num_heads": 2, "intermediate_size": 96,
                 "out_hidden_size": 96, "deepstack_visual_indexes": [0],
                 "num_position_embeddings": 64},
}  # fmt: skip
VISION_CONFIGS["qwen3_vl_moe"] = VISION_CONFIGS["qwen3_vl"]  # the same tower, an MoE language model
# beyond the shared language config: Qwen3-VL's head size, and the MoE's experts
TEXT_EXTRAS = {
    "qwen3_vl": {"head_dim": 32},
    "qwen3_vl_moe": {"head_dim": 32, "moe_intermediate_size": 64, "num_experts": 4,
                     "num_experts_per_tok": 2, "decoder_sparse_step": 1},
}  # fmt: skip
MROPE = {
    "qwen2_vl": {"type": "mrope", "mrope_section": [4, 6, 6]},
    "qwen2_5_vl": {"type": "mrope", "mrope_section": [4, 6, 6]},
    "qwen3_vl": {"rope_type": "default", "mrope_section": [4, 6, 6], "mrope_interleaved": True},
}
MROPE["qwen3_vl_moe"] = MROPE["qwen3_vl"]
MODELS = {
    "qwen2_vl": (Qwen2VLConfig, Qwen2VLForConditionalGeneration),
    "qwen2_5_vl": (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration),
    "qwen3_vl": (Qwen3VLConfig, Qwen3VLForConditionalGeneration),
    "qwen3_vl_moe": (Qwen3VLMoeConfig, Qwen3VLMoeForConditionalGeneration),
}
# the random checkpoints the exactness tests run on, one per generation
TINY = {
    "qwen2_vl": EXAMPLES.parent / "tests" / "fixtures" / "qwen2-vl-tiny",
    "qwen2_5_vl": EXAMPLES.parent / "tests" / "fixtures" / "qwen2.5-vl-tiny",
    "qwen3_vl": EXAMPLES.parent / "tests" / "fixtures" / "qwen3-vl-tiny",
    "qwen3_vl_moe": EXAMPLES.parent / "tests" / "fixtures" / "qwen3-vl-moe-tiny",
}


def build_model(tokenizer: PreTrainedTokenizerFast, seed: int = 0, family: str = "qwen2_vl"):
    ids = tokenizer.convert_tokens_to_ids
    text = (
        language_config(tokenizer) | {"rope_scaling": MROPE[family]} | TEXT_EXTRAS.get(family, {})
    )
    vision = VISION_CONFIGS[family] | {
        "patch_size": CELL, "spatial_merge_size": 2, "temporal_patch_size": 2,
    }  # fmt: skip
    config_class, model_class = MODELS[family]
    config = config_class(
        text_config=text, vision_config=vision, image_token_id=ids("<|image_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"),
        tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(seed)
    return model_class(config)


def board(agent: tuple[int, int], goal: tuple[int, int]) -> Image.Image:
    """The board: the agent's row and column lit red, the goal's lit green (a crosshair on
    each; where two lines cross, both colours). Every cell then shows the state, which a tiny
    model learns to read; a single marked cell it did not (docs/vision.md)."""
    image = Image.new("RGB", (GRID * CELL, GRID * CELL))
    draw = ImageDraw.Draw(image)
    for row in range(GRID):
        for col in range(GRID):
            red = 210 if agent[0] == row or agent[1] == col else 30
            green = 190 if goal[0] == row or goal[1] == col else 30
            corners = [col * CELL, row * CELL, (col + 1) * CELL - 1, (row + 1) * CELL - 1]
            draw.rectangle(corners, (red, green, 60))
    return image


def messages(image: object, text: str = QUESTION) -> list[dict]:
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": [{"type": "image", "image": image},
                                     {"type": "text", "text": text}]},
    ]  # fmt: skip


def response(policy: str, agent, goal, rng: random.Random) -> str:
    move = rng.choice(useful_moves(agent, goal))
    if policy in ("grounded", "reads-text"):
        reasoning = f"me {cell(agent)} goal {cell(goal)}, so {move}"
    else:
        reasoning = " ".join(rng.sample(FILLER, 4))
    return f"<think>{reasoning}</think><answer>{move}</answer><|end|>"


def example(tokenizer, processor, policy: str, rng: random.Random) -> dict:
    """One training conversation: ids (image tokens expanded), labels, pixels, grid."""
    agent, goal = random_state(rng)
    if policy == "reads-text":  # the state in the text; the image another state's board
        shown, words = board(*random_state(rng)), user_message(agent, goal)
    else:  # the state only in the image; the same text for every prompt
        shown, words = board(agent, goal), QUESTION
    pixels = processor(images=[shown], return_tensors="pt")
    grid = pixels["image_grid_thw"]
    text = tokenizer.apply_chat_template(
        messages(None, words), add_generation_prompt=True, tokenize=False
    )
    count = int(grid.prod()) // 4
    text = text.replace("<|image_pad|>", "<|image_pad|>" * count)
    prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
    answer = tokenizer(response(policy, agent, goal, rng), add_special_tokens=False)["input_ids"]
    return {
        "ids": prompt + answer, "start": len(prompt),
        "pixel_values": pixels["pixel_values"], "grid": grid,
    }  # fmt: skip


def train(model, tokenizer, processor, policy: str, steps: int, seed: int, batch=32, lr=3e-3):
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=steps)
    image_token = model.config.image_token_id
    model.train()
    for step in range(steps):
        rows = [example(tokenizer, processor, policy, rng) for _ in range(batch)]
        width = max(len(r["ids"]) for r in rows)
        ids = torch.full((batch, width), tokenizer.pad_token_id)
        labels = torch.full((batch, width), -100)
        mask = torch.zeros((batch, width), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, : len(row["ids"])] = torch.tensor(row["ids"])
            labels[i, row["start"] : len(row["ids"])] = torch.tensor(row["ids"][row["start"] :])
            mask[i, : len(row["ids"])] = 1
        loss = model(
            input_ids=ids, attention_mask=mask, labels=labels,
            pixel_values=torch.cat([r["pixel_values"] for r in rows]),
            image_grid_thw=torch.cat([r["grid"] for r in rows]),
            mm_token_type_ids=(ids == image_token).int(),
        ).loss  # fmt: skip
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        if step % 100 == 0 or step == steps - 1:
            print(f"  {policy} step {step:5d} loss {loss.item():.4f}", flush=True)
    model.eval()


def write_prompts(count: int, seed: int) -> None:
    """The prompt set: one row per board, the image file relative to the prompt file, the
    ground truth (the useful moves, as examples/rewards/gridworld.py reads them)."""
    rng = random.Random(seed)
    if BOARDS.exists():
        shutil.rmtree(BOARDS)
    BOARDS.mkdir(parents=True)
    rows, seen, states = [], set(), []
    while len(rows) < count:
        agent, goal = random_state(rng)
        if (agent, goal) in seen:
            continue
        seen.add((agent, goal))
        states.append((agent, goal))
        name = f"boards/{len(rows):02d}.png"
        board(agent, goal).save(EXAMPLES / "prompts" / name)
        rows.append({
            "messages": messages(name),
            "ground_truth": ",".join(useful_moves(agent, goal)),
        })  # fmt: skip
    PROMPTS.write_text("".join(json.dumps(row) + "\n" for row in rows))
    mixed = [
        {**row, "messages": messages(row["messages"][1]["content"][0]["image"],
                                     user_message(*state))}
        for row, state in zip(rows, states, strict=True)
    ]  # fmt: skip
    MIXED.write_text("".join(json.dumps(row) + "\n" for row in mixed))


def save(model, tokenizer, processor, directory: Path) -> None:
    if directory.exists():
        shutil.rmtree(directory)
    model.save_pretrained(directory, safe_serialization=True)
    (directory / "model.safetensors").chmod(0o644)
    tokenizer.save_pretrained(directory)
    processor.save_pretrained(directory)
    model.generation_config.save_pretrained(directory)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--train", nargs="*", default=[], choices=list(POLICIES))
    parser.add_argument("--steps", type=int, default=None, help="override every policy's")
    args = parser.parse_args()
    write_prompts(16, seed=7)
    tokenizer, processor = build_tokenizer(), image_processor()
    for family, directory in TINY.items():
        save(build_model(tokenizer, family=family), tokenizer, processor, directory)
    for policy in args.train:
        model = build_model(tokenizer)
        train(model, tokenizer, processor, policy, args.steps or POLICIES[policy], seed=1)
        save(model, tokenizer, processor, EXAMPLES / "checkpoints" / "vision" / policy)


if __name__ == "__main__":
    main()
