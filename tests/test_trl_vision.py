"""CollapseCallback inside a real TRL GRPOTrainer run of a vision-language policy on CPU: the
demo's board-reading Qwen2-VL policy, trained on the visual gridworld with the boards in an
`image` column as TRL's vision datasets hold them. From the step's own completions (whose
prompts TRL keeps with their PIL images) and from a probe set with images, the report is
scored under the boards the policy saw.

TRL needs the model's processor; `Qwen2VLProcessor` wants torchvision for its video processor,
which does not load on these CPU machines (docs/vision.md). `ImageOnlyProcessor` is that
processor with the video part left out: its call, chat template and image-token expansion are
Qwen2VLProcessor's own."""

import hashlib
import json

import pytest
import torch
from datasets import Dataset, Features, Image, Value
from PIL import Image as PILImage
from transformers import (
    AutoImageProcessor,
    AutoTokenizer,
    Qwen2VLForConditionalGeneration,
    Qwen2VLProcessor,
)
from transformers.processing_utils import ProcessorMixin
from trl import GRPOConfig, GRPOTrainer

from collapsecheck.integrations.trl import CollapseCallback
from tests.conftest import EXAMPLES

POLICY = EXAMPLES / "checkpoints" / "vision" / "grounded"
PROMPTS = EXAMPLES / "prompts" / "visual-gridworld.jsonl"


class ImageOnlyProcessor(Qwen2VLProcessor):
    attributes = ("image_processor", "tokenizer")  # no video processor

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        self.image_token, self.video_token = "<|image_pad|>", "<|video_pad|>"
        self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
        self.video_token_id = None
        ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)


def moved(completions, **_):
    """1 when the completion gives an answer: a reward that varies little."""
    return [float("<answer>" in c[0]["content"]) for c in completions]


def boards() -> list[str]:
    rows = [json.loads(line) for line in PROMPTS.read_text().splitlines()]
    return [str(PROMPTS.parent / row["messages"][1]["content"][0]["image"]) for row in rows]


def vision_trainer(out, steps: int) -> GRPOTrainer:
    tokenizer = AutoTokenizer.from_pretrained(POLICY)
    processor = ImageOnlyProcessor(AutoImageProcessor.from_pretrained(POLICY), tokenizer,
                                   chat_template=tokenizer.chat_template)  # fmt: skip
    system = {"role": "system", "content": "grid agent. the board is in the image."}
    images = boards()
    rows = {"prompt": [[system, {"role": "user", "content": "your move?"}]] * len(images),
            "image": images}  # fmt: skip
    message = {"role": Value("string"), "content": Value("string")}
    features = Features({"prompt": [message], "image": Image()})
    config = GRPOConfig(
        output_dir=str(out), max_steps=steps, learning_rate=1e-5,
        per_device_train_batch_size=16, num_generations=4, max_completion_length=40,
        logging_steps=1, save_strategy="no", report_to="none", use_cpu=True, bf16=False, seed=0,
    )  # fmt: skip
    return GRPOTrainer(
        model=Qwen2VLForConditionalGeneration.from_pretrained(POLICY, dtype=torch.float32),
        reward_funcs=[moved], args=config, processing_class=processor,
        train_dataset=Dataset.from_dict(rows, features=features),
    )  # fmt: skip


def pixels_hash(path) -> str:
    with PILImage.open(path) as image:
        return hashlib.sha256(image.convert("RGB").tobytes()).hexdigest()


def test_the_steps_own_completions_are_scored_under_the_boards_the_policy_saw(tmp_path):
    trainer = vision_trainer(tmp_path, steps=2)
    callback = CollapseCallback(trainer, every=2, bootstrap=100)
    trainer.add_callback(callback)
    trainer.train()
    report = callback.reports[2]
    step = tmp_path / "collapsecheck" / "step-2"
    rows = [json.loads(line) for line in (step / "completions.jsonl").read_text().splitlines()]
    assert len(rows) == 16  # 4 prompts x 4 completions, TRL's generation batch
    named = {part["image"] for row in rows for part in row["prompt"][1]["content"]
             if part["type"] == "image"}  # fmt: skip
    assert len(named) == 4 and report.counts["prompts"] == 4  # grouped by their boards
    # each image the completions name is one of the dataset's boards, pixel for pixel
    assert {pixels_hash(step / name) for name in named} <= {pixels_hash(b) for b in boards()}
    assert report.settings["images"]["prompts_with_images"] == 4
    assert report.value("normalized_mi") > 0.5  # the policy names the cells it sees
    logged = [e for e in trainer.state.log_history if "collapse/normalized_mi" in e]
    assert [e["step"] for e in logged] == [2]
    assert logged[0]["collapse/normalized_mi"] == pytest.approx(report.value("normalized_mi"))


def test_a_probe_set_with_images_is_sampled_by_the_live_policy(tmp_path):
    trainer = vision_trainer(tmp_path, steps=1)
    callback = CollapseCallback(trainer, PROMPTS, every=1, k=4, num_prompts=8,
                                max_new_tokens=40, bootstrap=100)  # fmt: skip
    trainer.add_callback(callback)
    trainer.train()
    report = callback.reports[1]
    assert report.verdict.regime == "grounded", report.verdict.reason
    assert report.settings["image_processor"] == "Qwen2VLImageProcessorPil"
