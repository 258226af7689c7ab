"""Vision-language policies (Qwen2-VL, Qwen2.5-VL, Qwen3-VL and its MoE: `VISION_FAMILIES` in
`inputs.formats.huggingface`) behind the transformers backend's two operations. A rendered
prompt's image placeholders hold image slots (`inputs.images`); here they become the model's
image token again, with the images' pixels run through the model's own image processor, and
the model's own 3D rotary positions (`get_rope_index`). Qwen3-VL's deepstack features (its
vision tower's middle layers, added to the first decoder layers at the image's tokens) go to
its language model beside the embeddings, which the model's own forward would take from
pixel values only.

The cached scorer keeps its idea: each prompt (its image features and its text) runs once and
its traces ride behind it on the key/value cache. After the last image a Qwen2-VL position is
the token's index plus the prompt's `rope_delta` in all three axes, so every continuation
token is placed at `context length + delta + offset`: exact, and tested against a plain
forward pass of the whole sequence (tests/test_vision.py).

The processor: `AutoProcessor` where it loads (users' GPU machines, with torchvision);
where it does not (torchvision missing, as on CPU-only machines here), its exact equivalent:
the model's image processor (`AutoImageProcessor`, which falls back to its PIL version) for
the pixels and grid, and the tokenizer for the text, with each image's one placeholder
expanded to grid_t x grid_h x grid_w / merge^2 image tokens, as the processor does.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers.modeling_outputs import CausalLMOutputWithPast

from collapsecheck.engines.backends.base import Progress, ScoreRequest
from collapsecheck.engines.backends.hf import TransformersBackend
from collapsecheck.engines.backends.hf_layout import cells_on_device
from collapsecheck.engines.backends.hf_scoring import Scored, returned_cache, token_logprobs
from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.formats.huggingface import VISION_FAMILIES
from collapsecheck.inputs.images import ImageSlots, PromptImage, image_runs
from collapsecheck.inputs.prompts import RenderedPrompt
from collapsecheck.settings import LoadSettings

DEEPSTACK = "deepstack_visual_embeds"
# the field a forward's output keeps its key/value cache in (renamed in the newer transformers)
OUTPUT_CACHE = (
    "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"
)


def require_family(checkpoint: Any) -> None:
    """A vision-language checkpoint of a family this backend knows, before any weight loads."""
    from collapsecheck.inputs.formats.huggingface import vision_model_type

    require_model_type(vision_model_type(Path(checkpoint.config_dir)), checkpoint.path)


def require_model_type(kind: str | None, where: Any) -> None:
    """A `model_type` among VISION_FAMILIES, or one line naming `where` it came from."""
    if kind not in VISION_FAMILIES:
        raise CollapsecheckError(
            f"{where}: a {kind} vision-language checkpoint; collapsecheck scores images for "
            f"{', '.join(VISION_FAMILIES)} only (docs/vision.md)"
        )


class Vision:
    """What rendering and the backend need of images: the model's image token, the scan's
    image slots, and the image processor."""

    def __init__(self, processor: Any, image_token_id: int, merge: int) -> None:
        self.processor = processor
        self.image_token_id = image_token_id
        self.merge = merge
        self.slots = ImageSlots()
        self._pixels: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    @classmethod
    def of(cls, model: Any, processor: Any) -> Vision:
        """The model's image token and merge size, with `processor` for the pixels."""
        config = model.config
        return cls(
            processor, int(config.image_token_id), int(config.vision_config.spatial_merge_size)
        )

    @classmethod
    def live(cls, model: Any, processing_class: Any) -> Vision:
        """A model in memory (a trainer's): its processor's image processor where the trainer
        has one, else the one saved beside its weights (`model.name_or_path`)."""
        require_model_type(model.config.model_type, type(model).__name__)
        processor = getattr(processing_class, "image_processor", None)
        return cls.of(model, processor or image_processor(Path(model.name_or_path)))

    def read_rendered(self, rendered: Sequence[RenderedPrompt], where: str) -> None:
        """Score prompts another backend rendered (a policy's, under its baseline): their
        images at the slots they hold, each run of a slot's tokens checked to be whole
        images as this backend's processor sizes them."""
        self.slots, self._pixels = ImageSlots(), {}
        for prompt in rendered:
            for slot, image in prompt.images:
                self.slots.hold(slot, image, where)
            for _, length, slot in image_runs(prompt.ids):
                tokens = self.placeholders(self.slots.images[slot])
                if length % tokens:
                    raise CollapsecheckError(
                        f"{where}: its image processor makes {tokens} image tokens of "
                        f"{self.slots.images[slot].source}, which the policy's prompt does not "
                        f"hold ({length}): the baseline cannot read the policy's prompts"
                    )

    def pixels(self, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The image of a slot as the model takes it: pixel patches and its (t, h, w) grid."""
        if slot not in self._pixels:
            image = self.slots.images[slot]
            out = self.processor(images=[image.open()], return_tensors="pt")
            self._pixels[slot] = (out["pixel_values"], out["image_grid_thw"])
        return self._pixels[slot]

    def placeholders(self, image: PromptImage) -> int:
        """How many image tokens the image takes in the text."""
        _, grid = self.pixels(self.slots.slot(image))
        return int(grid.prod()) // self.merge**2

    def images_in(self, ids: Sequence[int]) -> list[int]:
        """The slots of a sequence's images, in order: a run of one slot's tokens holds its
        image once per `placeholders` tokens."""
        slots: list[int] = []
        for token, run in itertools.groupby(ids):
            if token < 0:
                _, grid = self.pixels(token)
                slots += [token] * (len(list(run)) // (int(grid.prod()) // self.merge**2))
        return slots


def image_processor(path: Path) -> Any:
    """The checkpoint's processor where it builds, else its image processor (see above)."""
    from transformers import AutoImageProcessor, AutoProcessor

    try:
        return AutoProcessor.from_pretrained(path, local_files_only=True).image_processor
    except Exception:  # torchvision missing, or no processor files: the image processor alone
        pass
    try:
        return AutoImageProcessor.from_pretrained(path, local_files_only=True)
    except Exception as err:
        raise CollapsecheckError(
            f"{path}: a vision-language checkpoint needs its image processor "
            f"(preprocessor_config.json): {err}"
        ) from None


class VisionLanguageBackend(TransformersBackend):
    """The transformers backend for a vision-language checkpoint: prompts carry images."""

    def __init__(self, model: Any, tokenizer: Any, vision: Vision, **kwargs: Any) -> None:
        super().__init__(model, tokenizer, **kwargs)
        self.vision = vision
        self._offsets: dict[tuple[int, ...], int] = {}  # per context: its rope delta
        self.max_length = getattr(model.config.get_text_config(), "max_position_embeddings", None)

    @classmethod
    def from_checkpoint(
        cls, checkpoint: Any, settings: LoadSettings | None = None, scorer: str | None = "cached"
    ) -> VisionLanguageBackend:
        require_family(checkpoint)
        checkpoint, model, tokenizer, options = cls.load_parts(checkpoint, settings, scorer)
        vision = Vision.of(model, image_processor(checkpoint.config_dir))
        return cls(model, tokenizer, vision, **options)

    def describe(self) -> dict[str, str]:
        return {**super().describe(), "image_processor": type(self.vision.processor).__name__}

    def _model_inputs(self, ids: Sequence[int]) -> dict[str, Any]:
        """The sequence as input embeddings with each image's features in its slot's
        tokens (a sampled token that happens to be the image token stays text), and its 3D
        positions; `delta`: what a later text token adds to its index."""
        tokens = torch.tensor([list(ids)], dtype=torch.long, device=self.device)
        is_image = tokens < 0
        embeds = self.model.get_input_embeddings()(tokens.clamp(min=0))
        slots = self.vision.images_in(ids)
        if not slots:
            return {"inputs_embeds": embeds, "delta": 0}
        pixels = [self.vision.pixels(s) for s in slots]
        grids = torch.cat([g for _, g in pixels]).to(self.device)
        values = torch.cat([p for p, _ in pixels]).to(self.device, self.model.dtype)
        features = self.model.model.get_image_features(values, grids, return_dict=True)
        embeds = embeds.clone()
        embeds[is_image] = torch.cat(features.pooler_output).to(embeds.dtype)
        placeholders = tokens.masked_fill(is_image, self.vision.image_token_id)
        positions, delta = self.model.model.get_rope_index(placeholders, is_image.int(), grids)
        inputs = {"inputs_embeds": embeds, "position_ids": positions, "delta": int(delta.item())}
        deepstack = getattr(features, "deepstack_features", None)
        if deepstack:  # Qwen3-VL: features of the vision tower's middle layers too
            inputs["visual_pos_masks"] = is_image
            inputs[DEEPSTACK] = [torch.cat(layer).to(embeds.dtype) for layer in deepstack]
        return inputs

    def _forward(self, inputs: dict[str, Any], **call: Any) -> Any:
        """The model on prepared embeddings. Deepstack features (Qwen3-VL: image features
        added to the first layers' hidden states at the image's tokens) go to its language
        model directly: the model's own forward takes them from pixel values only."""
        if DEEPSTACK not in inputs:
            return self.model(**inputs, **call)
        keep = call.pop("logits_to_keep", 0)
        out = self.model.model.language_model(**inputs, **call)
        hidden = out.last_hidden_state[:, -keep:] if keep else out.last_hidden_state
        return CausalLMOutputWithPast(
            logits=self.model.lm_head(hidden), **{OUTPUT_CACHE: returned_cache(out)}
        )

    def _hidden_states(self, inputs: dict[str, Any]) -> torch.Tensor:
        """The decoder's last hidden states on prepared embeddings (`_forward` less the LM
        head), deepstack features going to the language model as there."""
        if DEEPSTACK in inputs:
            return self.model.model.language_model(**inputs).last_hidden_state
        return self._hidden(**inputs)

    def _prefill(self, context: Sequence[int]) -> tuple[Any, torch.Tensor]:
        inputs = self._model_inputs(context)
        self._offsets[tuple(context)] = inputs.pop("delta")
        out = self._forward(inputs, use_cache=True, logits_to_keep=1)
        return returned_cache(out), out.logits[:, -1, :]

    def position_offset(self, context: Sequence[int]) -> int:
        return self._offsets.get(tuple(context), 0)

    def _prefill_contexts(
        self, contexts: Sequence[tuple[int, ...]]
    ) -> Iterator[tuple[tuple[int, ...], Any, torch.Tensor]]:
        """Each context run whole: its images are most of it, and they differ."""
        for context in contexts:
            yield context, *self._prefill(context)

    def _score_naive(
        self, requests: Sequence[ScoreRequest], out: Scored, progress: Progress,
        temperature: float,
    ) -> None:  # fmt: skip
        """One plain forward pass of [context | continuation] per request, images and all."""
        for index, request in enumerate(requests):
            row = request.context + request.continuation
            inputs = self._model_inputs(row)
            inputs.pop("delta")
            targets = torch.tensor(row[1:], device=self.device).clamp(min=0)
            start = len(request.context) + request.scored_from - 1
            if self.head is None:
                logits = self._forward(inputs).logits[0, :-1]
                logprobs = token_logprobs(logits[None], targets[None], temperature)
            else:  # the head on the scored positions only
                hidden = self._hidden_states(inputs)[:, :-1]
                scored = np.arange(len(row) - 1)[None] >= start
                cells = cells_on_device(scored, self.device)
                logprobs = self.head.logprobs_at(hidden, targets[None], cells, temperature)
            total = logprobs[:, start:].double().sum(dim=1)
            out.put([index], total, logprobs, [(0, start, len(row) - 1)])
            progress(1)

    def prefill_together(self, prompts: Sequence[Sequence[int]]) -> tuple[Any, ...]:
        """One prefill of several prompts: each prompt's embeddings (image features in
        place) and 3D positions built on their own, then left-padded as the text backend pads
        ids. Returns the cache, each prompt's last logits, the mask and each prompt's last
        position (what a text token's position continues from)."""
        inputs = [self._model_inputs(prompt) for prompt in prompts]
        width = max(len(prompt) for prompt in prompts)
        embeds = torch.zeros(
            (len(prompts), width, inputs[0]["inputs_embeds"].shape[-1]),
            dtype=inputs[0]["inputs_embeds"].dtype, device=self.device,
        )  # fmt: skip
        positions = torch.zeros((3, len(prompts), width), dtype=torch.long, device=self.device)
        mask = torch.zeros((len(prompts), width), dtype=torch.long, device=self.device)
        visual = torch.zeros((len(prompts), width), dtype=torch.bool, device=self.device)
        ends = []
        for row, (prompt, given) in enumerate(zip(prompts, inputs, strict=True)):
            start = width - len(prompt)
            embeds[row, start:] = given["inputs_embeds"][0]
            positions[:, row, start:] = self._positions(given, len(prompt))
            mask[row, start:] = 1
            visual[row, start:] = torch.tensor(prompt, device=self.device) < 0
            ends.append(len(prompt) - 1 + given["delta"])
        batch = {"inputs_embeds": embeds, "attention_mask": mask, "position_ids": positions}
        deepstack = [given[DEEPSTACK] for given in inputs if DEEPSTACK in given]
        if deepstack:  # each layer's features, row after row, as the mask reads them
            batch |= {
                "visual_pos_masks": visual,
                DEEPSTACK: [torch.cat(f) for f in zip(*deepstack, strict=True)],
            }
        out = self._forward(batch, use_cache=True, logits_to_keep=1)
        last = torch.tensor(ends, device=self.device)[:, None]
        return returned_cache(out), out.logits[:, -1, :], mask, last

    def _positions(self, inputs: dict[str, Any], length: int) -> torch.Tensor:
        """A prompt's (3, length) positions: its images' 3D ones, or the text's index on all
        three axes."""
        if "position_ids" in inputs:
            return inputs["position_ids"][:, 0]
        return torch.arange(length, device=self.device).expand(3, length)
