"""Prompt sets in: JSONL (`{"prompt": ...}` or `{"messages": [...]}`), parquet (veRL's datasets:
a `prompt` column of chat messages beside `data_source`, `reward_model`, `extra_info`) or
plain text, and their rendering to token ids (SPEC "Inputs": chat messages through the chat
template with the generation prompt added; plain strings verbatim).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collapsecheck.errors import CollapsecheckError

if TYPE_CHECKING:
    from collapsecheck.inputs.images import PromptImage
    from collapsecheck.settings import PromptSettings

JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
PARQUET_SUFFIXES = (".parquet", ".pq")
TEXT_FIELDS = ("prompt", "messages")

Messages = list[dict[str, Any]]  # content: a string, or a list of text and image parts


@dataclass(frozen=True)
class Prompt:
    """One prompt as the user wrote it: a verbatim string or a list of chat messages."""

    content: str | Messages
    origin: str  # "FILE:LINE", for messages that name the line at fault
    # the whole row it came from (reward inputs: data_source, ground truth, extra_info) and its
    # number in the file (a line of JSONL or text, a row of parquet), for --keep-prompts
    row: dict[str, Any] | None = field(default=None, compare=False)
    number: int | None = None

    @property
    def is_chat(self) -> bool:
        return isinstance(self.content, list)


def content_key(prompt: Prompt) -> str:
    """A prompt as written, an image by its content: prompts with equal keys render to one
    context (the plan counts prompts by it before any tokenizer; `prepare` merges by the
    rendered ids)."""
    return json.dumps(prompt.content, sort_keys=True, default=lambda image: image.sha256)


@dataclass(frozen=True)
class RenderedPrompt:
    text: str
    ids: tuple[int, ...]
    # each image with the slot its tokens hold, in the order the prompt shows them
    images: tuple[tuple[int, PromptImage], ...] = field(default=(), compare=False, repr=False)

    @property
    def identity(self) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """What makes two renderings the same prompt: the ids and the images' contents (a
        slot says which image of its scan, not which image)."""
        return self.ids, tuple(image.sha256 for _, image in self.images)


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def content_sha256(path: Path) -> str:
    """A file's hash, or a folder's: of every file in it, by its path within the folder."""
    if path.is_file():
        return file_sha256(path)
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(f"{file.relative_to(path)}\0{file_sha256(file)}\n".encode())
    return digest.hexdigest()


def _decode_lines(path: Path) -> list[str]:
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise CollapsecheckError(f"{path}:{line}: not valid UTF-8 text") from None
    return text.splitlines()


def _messages(value: Any, where: str, base: Path, images: list[Any] | None = None) -> Messages:
    """Chat messages, checked: string contents (with veRL's `<image>` placeholders taking
    the row's `images` in order), or lists of text and image parts (`inputs.images`; parts
    that name no file take the row's images in order, as TRL fills them). Where the messages
    say nowhere where the row's images go, they go before the first user message's text, as
    TRL puts them."""
    from collapsecheck.inputs.images import (
        has_image_places,
        message_parts,
        read_image,
        split_placeholders,
        with_leading_images,
    )

    if not isinstance(value, list) or not value:
        raise CollapsecheckError(f"{where}: chat messages must be a non-empty list")
    row_images = [read_image(_embedded(i), base, where) for i in images or []]
    if row_images and not has_image_places(value):
        value = with_leading_images(value, len(row_images))
    messages: Messages = []
    for message in value:
        content = message.get("content") if isinstance(message, dict) else None
        if not (isinstance(message, dict) and isinstance(message.get("role"), str)) or not (
            isinstance(content, str | list)
        ):
            raise CollapsecheckError(
                f"{where}: each chat message needs a string 'role' and a 'content' (a string, "
                "or a list of text and image parts)"
            )
        if isinstance(content, list):
            content = message_parts(content, base, where, row_images)
        elif row_images and "<image>" in content:
            content = split_placeholders(content, row_images, where)
        messages.append({"role": message["role"], "content": content})
    if row_images:
        raise CollapsecheckError(
            f"{where}: {len(row_images)} of the row's images have no place in the messages (an "
            "<image> placeholder or an image part each)"
        )
    return messages


def _embedded(image: Any) -> Any:
    """An entry of veRL's `images` column: a path, bytes, or {"bytes": ..., "path": ...}."""
    if isinstance(image, dict):
        return image.get("bytes") or image.get("path") or image.get("image")
    return image


def prompt_from_row(row: Any, field: str | None, where: str, base: Path) -> str | Messages:
    """A row's prompt: a string, or chat messages (images relative to `base`, the folder of
    the file)."""
    fields = (field,) if field else TEXT_FIELDS
    name = next((f for f in fields if f in row), None)
    if name is None:
        wanted = " or ".join(repr(f) for f in fields)
        raise CollapsecheckError(f"{where}: no {wanted} field in this row")
    value = row[name]
    if isinstance(value, str):
        if not value.strip():
            raise CollapsecheckError(f"{where}: the {name!r} field is empty")
        return value
    return _messages(value, f"{where} ({name!r})", base, image_column(row))


def image_column(row: Any) -> list[Any] | None:
    """A row's image column: `images` (veRL, TRL), or TRL's single `image`."""
    if row.get("images") is not None:
        return list(row["images"])
    return [row["image"]] if row.get("image") is not None else None


def plain_value(value: Any) -> Any:
    """A value read from parquet as plain Python: arrays become lists, recursively."""
    if hasattr(value, "tolist") and not isinstance(value, str):
        value = value.tolist()
    if isinstance(value, list):
        return [plain_value(v) for v in value]
    if isinstance(value, dict):
        return {k: plain_value(v) for k, v in value.items()}
    return value


def read_parquet_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a parquet file as plain dictionaries."""
    import pandas as pd

    try:
        frame = pd.read_parquet(path)
    except Exception as err:  # pyarrow raises several types for a bad file
        raise CollapsecheckError(f"{path}: not a readable parquet file ({err})") from None
    return [plain_value(row) for row in frame.to_dict(orient="records")]


def _is_jsonl(path: Path, lines: list[str]) -> bool:
    if path.suffix.lower() in JSONL_SUFFIXES:
        return True
    if path.suffix.lower() == ".txt":
        return False
    first = next((line.strip() for line in lines if line.strip()), "")
    return first.startswith("{")


def jsonl_rows(path: Path, lines: list[str]) -> list[tuple[str, dict[str, Any], int]]:
    """(where, row, line number) of each non-blank JSON-object line; anything else is an
    error naming FILE:LINE."""
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise CollapsecheckError(f"{where}: malformed JSON ({err.msg})") from None
        if not isinstance(row, dict):
            raise CollapsecheckError(f"{where}: expected a JSON object, got {type(row).__name__}")
        rows.append((where, row, number))
    return rows


def numbered_rows(path: Path) -> list[tuple[str, dict[str, Any], int]]:
    if path.suffix.lower() in PARQUET_SUFFIXES:
        return [(f"{path}: row {n}", row, n) for n, row in enumerate(read_parquet_rows(path), 1)]
    return jsonl_rows(path, _decode_lines(path))


def load_prompts(
    path: str | Path, *, num_prompts: int | None = None, field: str | None = None
) -> list[Prompt]:
    """Read a prompt set; `num_prompts` keeps the first N. Blank lines are skipped."""
    path = Path(path)
    if not path.is_file():
        raise CollapsecheckError(f"prompt file not found: {path}")
    if path.suffix.lower() in PARQUET_SUFFIXES:
        rows = numbered_rows(path)
    else:
        lines = _decode_lines(path)
        if _is_jsonl(path, lines):
            rows = jsonl_rows(path, lines)
        else:
            rows = [
                (f"{path}:{n}", {"prompt": line}, n)
                for n, line in enumerate(lines, 1)
                if line.strip()
            ]
            field = None
    prompts = [
        Prompt(prompt_from_row(row, field, where, path.parent), where, row, number)
        for where, row, number in rows[:num_prompts]
    ]
    if not prompts:
        raise CollapsecheckError(f"{path}: no prompts found (the file is empty or blank)")
    return prompts


def render_prompt(
    prompt: Prompt,
    tokenizer: Any,
    *,
    as_chat: bool = False,
    system_prompt: str | None = None,
    template_kwargs: dict[str, Any] | None = None,
    vision: Any = None,
) -> RenderedPrompt:
    """Render one prompt to text and token ids with the checkpoint's tokenizer.

    `as_chat` or a `system_prompt` turn a plain string into a user message; the system prompt
    is added to chat prompts that do not begin with one of their own. `template_kwargs` go to
    the chat template as given (`enable_thinking`, say). A prompt with images needs the
    backend's `vision` (`engines.backends.hf_vlm.Vision`): each image's placeholder becomes
    its image tokens, holding the image's slot (`inputs.images`)."""
    from collapsecheck.inputs.images import images_of

    content = prompt.content
    if isinstance(content, str) and (as_chat or system_prompt):
        content = [{"role": "user", "content": content}]
    if system_prompt and isinstance(content, list) and content[0]["role"] != "system":
        content = [{"role": "system", "content": system_prompt}, *content]
    images = images_of(content)
    if images and vision is None:
        raise CollapsecheckError(
            f"{prompt.origin}: the prompt holds images but the checkpoint is a text-only model"
        )
    if isinstance(content, list):
        if not getattr(tokenizer, "chat_template", None):
            raise CollapsecheckError(
                f"{prompt.origin}: the prompt is chat messages but the checkpoint's tokenizer "
                "has no chat template; give plain-string prompts or a tokenizer with one"
            )
        text = apply_chat_template(tokenizer, content, template_kwargs, prompt.origin, bool(images))
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    else:
        text = content
        ids = tokenizer(text)["input_ids"]
    if not ids:
        raise CollapsecheckError(f"{prompt.origin}: the prompt renders to no tokens")
    slotted = _slotted(images, vision) if images else ()
    if slotted:
        ids = _with_images(ids, slotted, vision, prompt.origin)
    return RenderedPrompt(text=text, ids=tuple(int(i) for i in ids), images=slotted)


def template_source(tokenizer: Any) -> str:
    """Where the checkpoint's chat template was read from, to name it in a message."""
    folder = Path(getattr(tokenizer, "name_or_path", "") or ".")
    for name in ("chat_template.jinja", "chat_template.json", "tokenizer_config.json"):
        if (folder / name).is_file():
            return str(folder / name)
    return f"the chat template of {folder}"


def apply_chat_template(
    tokenizer: Any,
    messages: Messages,
    template_kwargs: dict[str, Any] | None,
    where: str,
    with_images: bool = False,
) -> str:
    """The messages rendered by the checkpoint's chat template with the generation prompt. The
    template is the user's code (Jinja): whatever it raises on a row is the row's or the
    template's fault, said in one line naming both, never an internal error."""
    try:
        return tokenizer.apply_chat_template(
            _template_messages(messages), add_generation_prompt=True, tokenize=False,
            **(template_kwargs or {}),
        )  # fmt: skip
    except Exception as err:  # a user's template (Jinja) can raise anything
        hint = ""
        if with_images:
            hint = (
                "; the row holds image parts: does the template render them? (a text-only "
                "template saved beside a vision-language checkpoint cannot)"
            )
        raise CollapsecheckError(
            f"{where}: {template_source(tokenizer)} cannot render this row's messages "
            f"({type(err).__name__}: {err}){hint}"
        ) from None


def _template_messages(messages: Messages) -> Messages:
    """Messages as a chat template takes them: an image part without its image."""
    return [
        {**m, "content": [{"type": "image"} if p["type"] == "image" else p for p in m["content"]]}
        if isinstance(m["content"], list)
        else m
        for m in messages
    ]


def _slotted(images: list[PromptImage], vision: Any) -> tuple[tuple[int, PromptImage], ...]:
    return tuple((vision.slots.slot(image), image) for image in images)


def _with_images(
    ids: Sequence[int], images: Sequence[tuple[int, PromptImage]], vision: Any, where: str
) -> list[int]:
    """Each image placeholder the template wrote expanded to the image's tokens, which hold
    its slot."""
    pending, out = list(images), []
    for token in ids:
        if token != vision.image_token_id:
            out.append(token)
            continue
        if not pending:
            raise CollapsecheckError(f"{where}: the chat template wrote more images than it has")
        slot, image = pending.pop(0)
        out += [slot] * vision.placeholders(image)
    if pending:
        raise CollapsecheckError(
            f"{where}: the chat template wrote {len(images) - len(pending)} of the prompt's "
            f"{len(images)} images (does it render image parts?)"
        )
    return out


def kept_ids_with_images(
    ids: Sequence[int], images: Sequence[PromptImage], vision: Any, where: str
) -> tuple[list[int], tuple[tuple[int, PromptImage], ...]]:
    """A context a trainer kept as ids, with its images: each image's placeholder tokens (as
    the trainer's processor expanded them, or one placeholder) hold the image's slot, checked
    to be as many as this checkpoint's processor makes of that image."""
    if vision is None:
        raise CollapsecheckError(
            f"{where}: the prompt holds images but the checkpoint is a text-only model"
        )
    collapsed, runs = [], []
    for token in ids:
        if token == vision.image_token_id and collapsed and collapsed[-1] == token:
            runs[-1] += 1
            continue
        collapsed.append(token)
        runs += [1] if token == vision.image_token_id else []
    slotted = _slotted(list(images), vision)
    for length, (_, image) in zip(runs, slotted, strict=False):
        if length not in (1, vision.placeholders(image)):
            raise CollapsecheckError(
                f"{where}: an image has {length} tokens in the trainer's ids but "
                f"{vision.placeholders(image)} by this checkpoint's processor"
            )
    return _with_images(collapsed, slotted, vision, where), slotted


def render_prompts(
    prompts: list[Prompt], tokenizer: Any, settings: PromptSettings, vision: Any = None
) -> list[RenderedPrompt]:
    """Render prompts as the `--as-chat`, `--system-prompt` and `--chat-template-kwargs`
    settings say (`vision`: the backend's, for prompts with images)."""
    return [
        render_prompt(
            prompt,
            tokenizer,
            as_chat=settings.as_chat,
            system_prompt=settings.system_prompt,
            template_kwargs=settings.chat_template_kwargs,
            vision=vision,
        )
        for prompt in prompts
    ]


def check_same_format(source: Path, target: Path, option: str) -> None:
    """Kept rows go out in the input's own format: a parquet input needs a parquet target."""
    source_parquet = source.suffix.lower() in PARQUET_SUFFIXES
    if source_parquet != (target.suffix.lower() in PARQUET_SUFFIXES):
        kind = "parquet" if source_parquet else "JSONL or text"
        raise CollapsecheckError(
            f"{option} {target}: the prompts are {kind} ({source}); give a file of that format"
        )


def write_prompt_rows(source: Path, numbers: Sequence[int], target: Path) -> Path:
    """Rows of `source` (by their numbers: a JSONL or text line, a parquet row) exactly as it
    holds them, in its format: JSONL and text lines verbatim, parquet rows with every column
    (for the next training round)."""
    from collapsecheck.files import write_atomic, write_text_atomic

    if source.suffix.lower() in PARQUET_SUFFIXES:
        import pandas as pd

        frame = pd.read_parquet(source).iloc[[n - 1 for n in numbers]]
        return write_atomic(target, "wb", lambda stream: frame.to_parquet(stream, index=False))
    lines = _decode_lines(source)
    return write_text_atomic(target, "".join(lines[n - 1] + "\n" for n in numbers))
