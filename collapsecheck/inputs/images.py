"""Images in prompts (SPEC "Inputs", images): chat messages whose content holds image parts,
read and checked before any model loads, and how a rendered prompt carries them.

A chat message's content may be a list of parts, as transformers' chat templates take them:
`{"type": "text", "text": "..."}` and `{"type": "image", "image": "boards/17.png"}` (also
`"path"` or `"url"` for the file; a path is relative to the prompt file). Nothing is fetched:
an http(s) URL is refused. In the rendered prompt's token ids, each image's placeholder tokens
hold the image's *slot*, a negative id (-1 for the first distinct image of the scan, -2 for
the next, ...), so that everything above the backend, which works on token ids only, sees two
prompts that differ only in their image as different, and an image swap as a change of ids.
The vision-language backend maps the slots back to the model's image token and the image."""

from __future__ import annotations

import hashlib
import io
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from collapsecheck.errors import CollapsecheckError
from collapsecheck.files import write_atomic

IMAGE_KEYS = ("image", "path", "url", "image_url")


@dataclass(frozen=True)
class PromptImage:
    """One image of a prompt: where it came from (for messages) and its bytes."""

    source: str
    data: bytes = field(repr=False)

    @cached_property
    def sha256(self) -> str:
        """Hashed once: slots, dumps, the cache key and resuming all ask for it."""
        return hashlib.sha256(self.data).hexdigest()

    def open(self) -> Any:
        """The image as an RGB PIL image."""
        from PIL import Image

        with Image.open(io.BytesIO(self.data)) as image:
            return image.convert("RGB")


def _image_reference(part: dict[str, Any]) -> Any:
    for key in IMAGE_KEYS:
        value = part.get(key)
        if isinstance(value, dict):  # {"image_url": {"url": ...}} and {"bytes": ..., "path": ...}
            value = value.get("url") or value.get("path") or value.get("bytes")
        if value:
            return value
    return None


def read_image(reference: Any, base: Path, where: str) -> PromptImage:
    """An image named by a prompt row (a path relative to `base`, or bytes), checked to be
    an image PIL can read: any fault is one line naming the row and the file."""
    if isinstance(reference, bytes | bytearray):
        image = PromptImage(f"{where} (embedded image)", bytes(reference))
    else:
        text = str(reference)
        if text.startswith(("http://", "https://")):
            raise CollapsecheckError(
                f"{where}: image {text}: collapsecheck reads images from files only (download it "
                "and name the file)"
            )
        path = Path(text.removeprefix("file://"))
        path = path if path.is_absolute() else base / path
        try:
            image = PromptImage(str(path), path.read_bytes())
        except OSError as err:
            raise CollapsecheckError(
                f"{where}: image {path}: {err.strerror or 'cannot be read'}"
            ) from None
    check_image(image, where)
    return image


def check_image(image: PromptImage, where: str) -> None:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(image.data)) as opened:
            opened.verify()
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as err:
        raise CollapsecheckError(
            f"{where}: image {image.source}: not an image PIL can read ({err})"
        ) from None


def message_parts(
    content: list[Any], base: Path, where: str, row_images: list[PromptImage]
) -> list[dict[str, Any]]:
    """A message's list of parts, each checked: text parts keep their text, image parts
    carry the image read from its file, or, where they name none, the row's next image
    (TRL's datasets: `{"type": "image"}` placeholders and an `images` column)."""
    parts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind in ("image", "image_url"):
            reference = _image_reference(part)
            if reference is None and not row_images:  # TRL's completion logs: {"type": "image"}
                raise CollapsecheckError(
                    f"{where}: an image part names no image file and the row has no image left "
                    "to fill it (TRL's completion logs drop a vision-language run's images: scan "
                    "its checkpoints with --sample and its prompt set)"
                )
            image = row_images.pop(0) if reference is None else read_image(reference, base, where)
            parts.append({"type": "image", "image": image})
        else:
            raise CollapsecheckError(
                f"{where}: a message part must be {{'type': 'text', 'text': ...}} or "
                "{'type': 'image', 'image': FILE}"
            )
    return parts


def split_placeholders(text: str, images: list[PromptImage], where: str) -> list[dict[str, Any]]:
    """veRL's convention: a message's `<image>` placeholders take the row's `images` in
    order (its RLHFDataset splits the content the same way)."""
    pieces = text.split("<image>")
    if len(pieces) - 1 > len(images):
        raise CollapsecheckError(
            f"{where}: {len(pieces) - 1} <image> placeholders but {len(images)} images"
        )
    parts: list[dict[str, Any]] = []
    for i, piece in enumerate(pieces):
        if i:
            parts.append({"type": "image", "image": images.pop(0)})
        if piece:
            parts.append({"type": "text", "text": piece})
    return parts


def with_leading_images(messages: list[Any], count: int) -> list[Any]:
    """TRL's convention for string messages and an image column: the images go before the
    first user message's text, as `{"type": "image"}` parts (`prepare_multimodal_messages`)."""
    out, placed = [], False
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if not placed and message.get("role") == "user" and isinstance(content, str):
            parts = [{"type": "image"}] * count + [{"type": "text", "text": content}]
            message, placed = {**message, "content": parts}, True
        out.append(message)
    return out


def has_image_places(messages: list[Any]) -> bool:
    """Whether the messages say where images go: `<image>` placeholders (veRL) or image
    parts (chat templates, TRL)."""
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str) and "<image>" in content:
            return True
        if isinstance(content, list) and any(
            isinstance(p, dict) and p.get("type") in ("image", "image_url") for p in content
        ):
            return True
    return False


def images_of(content: Any) -> list[PromptImage]:
    """The images of a prompt's content, in order (none for a plain string)."""
    if not isinstance(content, list):
        return []
    return [
        part["image"]
        for message in content
        if isinstance(message.get("content"), list)
        for part in message["content"]
        if part["type"] == "image"
    ]


class ImageSlots:
    """The scan's distinct images, each given a slot id (-1, -2, ...) in first-seen order."""

    def __init__(self) -> None:
        self.images: dict[int, PromptImage] = {}
        self._by_hash: dict[str, int] = {}

    def slot(self, image: PromptImage) -> int:
        key = image.sha256
        if key not in self._by_hash:
            self._by_hash[key] = min(self.images, default=0) - 1
            self.images[self._by_hash[key]] = image
        return self._by_hash[key]

    def hold(self, slot: int, image: PromptImage, where: str) -> None:
        """Hold `image` at the slot a dump gave it."""
        if self.images.setdefault(slot, image).sha256 != image.sha256:
            raise CollapsecheckError(f"{where}: image slot {slot} holds two different images")
        self._by_hash.setdefault(image.sha256, slot)

    def __bool__(self) -> bool:
        return bool(self.images)


def image_runs(ids: Sequence[int]) -> list[tuple[int, int, int]]:
    """(start, length, slot) of each run of image tokens in rendered ids."""
    runs, start = [], 0
    for slot, run in itertools.groupby(ids):
        length = len(list(run))
        if slot < 0:
            runs.append((start, length, slot))
        start += length
    return runs


def swap_reason(prompt_ids: Sequence[Sequence[int]]) -> str | None:
    """Why the image-swap scoring cannot be done for these prompts (None: it can): every
    prompt needs images laid out alike (the same number, each the same number of tokens), and
    the prompts must differ in both their images and their text."""
    layouts = {tuple(length for _, length, _ in image_runs(ids)) for ids in prompt_ids}
    if layouts == {()}:
        return "the prompts hold no images"
    if len(layouts) > 1:
        return "the prompts' images differ in number or size: an image swap would change the text"
    texts = {tuple(t for t in ids if t >= 0) for ids in prompt_ids}
    images = {tuple(slot for _, _, slot in image_runs(ids)) for ids in prompt_ids}
    if len(texts) < 2:
        return "every prompt has the same text: X->Z already measures the image alone"
    if len(images) < 2:
        return "every prompt has the same image"
    return None


def with_images_of(ids: Sequence[int], donor: Sequence[int]) -> tuple[int, ...]:
    """`ids` (a rendered prompt) with each of its images replaced by the donor prompt's image
    in the same place (laid out alike: `swap_reason`)."""
    out = list(ids)
    for (start, length, _), (_, _, slot) in zip(image_runs(ids), image_runs(donor), strict=True):
        out[start : start + length] = [slot] * length
    return tuple(out)


def hold_images(rendered: Sequence[Any], vision: Any, where: str) -> None:
    """Rendered prompts read back from a dump: each image held at the slot the scan gave it
    (`vision`: the backend's), and every slot in their ids accounted for."""
    held = {slot for prompt in rendered for slot, _ in prompt.images}
    if held and vision is None:
        raise CollapsecheckError(
            f"{where}: the prompts hold images but the checkpoint is a text-only model"
        )
    for prompt in rendered:
        for slot, image in prompt.images:
            vision.slots.hold(slot, image, where)
    if {t for prompt in rendered for t in prompt.ids if t < 0} - held:
        raise CollapsecheckError(
            f"{where}: the prompts' ids hold images the dump does not keep (a dump written "
            "before collapsecheck kept them): scan again"
        )


def images_digest(prompts: Sequence[Any]) -> str | None:
    """One sha256 over every image the prompts name, in order (None: they name none): what
    keys the results cache beside the prompt file, which holds only the images' paths."""
    hashes = [image.sha256 for prompt in prompts for image in images_of(prompt.content)]
    return hashlib.sha256("".join(hashes).encode()).hexdigest() if hashes else None


def with_image_files(messages: Any, folder: Path) -> Any:
    """Messages whose image parts hold image objects (TRL keeps PIL images in its log) with
    each image saved under `folder` as PNG, by its hash, and named by its path relative to
    the folder's parent: what a rollout file beside that folder can name."""
    if not isinstance(messages, list):
        return messages
    out = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            content = [_image_file_part(part, folder) for part in content]
            message = {**message, "content": content}
        out.append(message)
    return out


def _image_file_part(part: Any, folder: Path) -> Any:
    image = part.get("image") if isinstance(part, dict) and part.get("type") == "image" else None
    if image is None or not hasattr(image, "save"):
        return part
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    data = buffer.getvalue()
    name = hashlib.sha256(data).hexdigest()
    path = folder / name
    if not path.is_file():
        write_atomic(path, "wb", lambda stream: stream.write(data))
    return {**part, "image": f"{folder.name}/{name}"}
