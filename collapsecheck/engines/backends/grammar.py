"""Constrained decoding on the transformers backends (SPEC "Agents behind an OpenAI client",
"Constrained replies"): each row's next token limited to those a JSON schema's grammar allows
after what the row has drawn, by xgrammar compiled as vLLM's xgrammar backend compiles it
(`compile_json_schema`, any whitespace, the checkpoint's stop tokens ending it). The limit is
applied to the logits before the temperature, nucleus and draw, so a constrained row draws
from the policy's distribution renormalised over the allowed tokens, as vLLM samples it.
xgrammar is the optional `grammar` extra: a request that needs it without it is one line."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from collapsecheck.errors import CollapsecheckError

GRAMMAR_EXTRA = "pip install 'collapsecheck[grammar]'"
UNWRITABLE = (
    "a constrained reply cannot be written in the checkpoint's vocabulary: no token it has is "
    "one the JSON schema's grammar allows next (a tokenizer without '{' or '\"', say)"
)


def xgrammar() -> Any:
    """The grammar library, or one line naming the extra that installs it."""
    try:
        import xgrammar
    except ImportError:
        raise CollapsecheckError(
            "a request asks for a constrained reply (response_format, or a tool_choice that "
            f"forces a call), which needs the grammar library xgrammar: {GRAMMAR_EXTRA}"
        ) from None
    return xgrammar


class Grammars:
    """The JSON-schema grammars of one checkpoint's tokenizer, each compiled once."""

    def __init__(self, tokenizer: Any, stop_ids: Sequence[int]) -> None:
        self.tokenizer, self.stop_ids = tokenizer, list(stop_ids)
        self.compiler: Any = None
        self.compiled: dict[str, Any] = {}
        self.vocab_size = 0

    def rows(self, schema: str, count: int, vocab_size: int) -> RowGrammars:
        """A matcher for each of `count` rows, all under `schema`, over logits of
        `vocab_size` tokens (the model's, which may pass the tokenizer's)."""
        xgr = xgrammar()
        if self.compiler is None:
            self.vocab_size = vocab_size
            info = xgr.TokenizerInfo.from_huggingface(
                self.tokenizer, vocab_size=vocab_size, stop_token_ids=self.stop_ids
            )
            self.compiler = xgr.GrammarCompiler(info, max_threads=1)
        if schema not in self.compiled:
            try:
                self.compiled[schema] = self.compiler.compile_json_schema(schema)
            except (RuntimeError, ValueError) as err:
                raise CollapsecheckError(f"the JSON schema cannot be compiled: {err}") from None
        return RowGrammars(xgr, self.compiled[schema], count, self.vocab_size)


class RowGrammars:
    """One matcher per decoded row: the tokens each may draw next, and what it drew."""

    def __init__(self, xgr: Any, compiled: Any, count: int, vocab_size: int) -> None:
        self.xgr = xgr
        self.matchers = [xgr.GrammarMatcher(compiled) for _ in range(count)]
        self.bitmask = xgr.allocate_token_bitmask(count, vocab_size)

    def limited(self, logits: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """`logits` of the decoded `rows` (row numbers, in the order of the logits' rows) in
        float32, each token its grammar does not allow next at -inf; a row whose grammar has
        ended (it drew a stop token) unlimited: its token is padding."""
        numbers = rows.tolist()
        mask = self.bitmask[: len(numbers)]
        self.xgr.reset_token_bitmask(mask)
        for place, row in enumerate(numbers):
            if not self.matchers[row].is_terminated():
                self.matchers[row].fill_next_token_bitmask(mask, place)
        limited = logits.float().contiguous()
        self.xgr.apply_token_bitmask_inplace(limited, mask.to(limited.device))
        if not bool(torch.isfinite(limited.amax(dim=-1)).all()):
            raise CollapsecheckError(UNWRITABLE)
        return limited

    def drew(self, tokens: torch.Tensor, rows: torch.Tensor) -> None:
        """Each live row's drawn token, advanced through its grammar."""
        for row, token in zip(rows.tolist(), tokens.tolist(), strict=True):
            matcher = self.matchers[row]
            if not matcher.is_terminated() and not matcher.accept_token(token):
                raise CollapsecheckError(
                    f"constrained decoding drew token {token}, which its grammar does not allow"
                )
