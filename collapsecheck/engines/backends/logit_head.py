"""Log-probabilities of given tokens without the vocabulary-wide logits, as TRL's chunked
log-prob (`fused_lm_head`), prime-rl's and veRL's fused kernels compute them: the decoder's
hidden states at the scored positions only, the LM head applied in tiles of tokens x
vocabulary with a running log-sum-exp in float32, and each target's logit picked by one dot
product with its row of the head. No tensor of positions x vocabulary outlives one tile.

Each model's own logit transform is kept: Granite's `logits / logits_scaling`, Cohere's
`logits * logit_scale`, Gemma 2 and 3's final soft-capping `cap * tanh(logits / cap)`; then
the sampling temperature, as the full logits had it (SPEC "Sampling"). A model whose causal-LM
forward is not known to be `lm_head(base_model(...).last_hidden_state)` with at most those
transforms keeps the full logits (`LogitHead.of` is None; the report's `settings.logits` says
so)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

# (scored positions, vocabulary entries) per tile, by device type. On a CPU, 16 MiB of float32
# logits: the whole scoring call ran as fast as with 64 MiB tiles (docs/benchmarks.md, "Where
# the CPU's scoring time goes") on a quarter of the work space. Elsewhere the size first chosen,
# until a GPU profile chooses (bench/gpu_profile.py times several; issue 57)
TILES = {"cpu": (512, 8192), "other": (1024, 16384)}
# model types whose forward is the base model, the LM head and (config) one transform below
KNOWN_HEADS = frozenset({
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma",
    "gemma2", "gemma3_text", "gemma3", "granite", "granitemoe", "cohere", "cohere2", "phi3",
    "olmo", "olmo2", "smollm3", "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe",
    "qwen3_5_text", "granitemoehybrid",
})  # fmt: skip
FULL_LOGITS = "full logits"


@dataclass(frozen=True)
class LogitHead:
    """The LM head's weight (V, H) and bias, and the model's own transform of its logits."""

    weight: torch.Tensor
    tiles: tuple[int, int]  # (scored positions, vocabulary entries) per tile
    bias: torch.Tensor | None = None
    multiply: float | None = None  # Cohere's logit_scale
    divide: float | None = None  # Granite's logits_scaling
    softcap: float | None = None  # Gemma's final_logit_softcapping

    @classmethod
    def of(cls, model: Any) -> LogitHead | None:
        """The head of a model whose forward is known, else None (the full logits)."""
        config = model.config
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        if config.model_type not in KNOWN_HEADS or not isinstance(head, torch.nn.Linear):
            return None
        if head.weight.device.type == "meta":  # offloaded by --device-map: its hook loads it
            return None
        text = config.get_text_config()
        return cls(
            head.weight,
            tiles_on(head.weight.device),
            head.bias,
            multiply=getattr(text, "logit_scale", None),
            divide=getattr(text, "logits_scaling", None),
            softcap=getattr(text, "final_logit_softcapping", None),
        )

    def describe(self) -> str:
        tokens, vocabulary = self.tiles
        return f"tiled LM head ({tokens} tokens x {vocabulary} vocabulary, float32)"

    def transformed(self, logits: torch.Tensor, temperature: float) -> torch.Tensor:
        """Logits (float32) as the model's forward returns them, then / temperature."""
        if self.multiply is not None:
            logits = logits * self.multiply
        if self.divide is not None:
            logits = logits / self.divide
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits if temperature == 1 else logits / temperature

    def logprobs(
        self, hidden: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0
    ) -> torch.Tensor:
        """log softmax(transformed logits / temperature)[target] of each hidden state (M, H)
        and its target (M,), in float32: (M,), on the hidden states' device (the head may sit
        on another, placed by --device-map)."""
        device = self.weight.device
        hidden, at = hidden.to(device), targets.to(device)
        out = torch.empty(at.shape[0], dtype=torch.float32, device=device)
        tokens = self.tiles[0]
        for start in range(0, at.shape[0], tokens):
            rows = slice(start, start + tokens)
            out[rows] = self._tile_logprobs(hidden[rows], at[rows], temperature)
        return out.to(targets.device)

    def logprobs_at(
        self, hidden: torch.Tensor, targets: torch.Tensor,
        cells: tuple[torch.Tensor, torch.Tensor], temperature: float = 1.0,
    ) -> torch.Tensor:  # fmt: skip
        """`logprobs` of the positions `cells` (row and position indices) of rows of hidden
        states (B, T, H), each for its target in (B, T); 0 elsewhere: (B, T) float32."""
        out = torch.zeros(targets.shape, dtype=torch.float32, device=targets.device)
        out[cells] = self.logprobs(hidden[cells], targets[cells], temperature)
        return out

    def _tile_logprobs(
        self, hidden: torch.Tensor, targets: torch.Tensor, temperature: float
    ) -> torch.Tensor:
        # each target's logit as the head's matmul gives it: accumulated in float32, rounded
        # once to the model's dtype (so it never exceeds the log-sum-exp of the same logits)
        picked = (hidden.float() * self.weight[targets].float()).sum(-1)
        if self.bias is not None:
            picked = picked + self.bias[targets].float()
        picked = picked.to(hidden.dtype).float()
        lse = torch.full_like(picked, -torch.inf)
        vocabulary = self.tiles[1]
        for start in range(0, self.weight.shape[0], vocabulary):
            rows = slice(start, start + vocabulary)
            logits = torch.nn.functional.linear(
                hidden, self.weight[rows], None if self.bias is None else self.bias[rows]
            )
            lse = torch.logaddexp(lse, logsumexp_(self.transformed(logits.float(), temperature)))
        return self.transformed(picked, temperature) - lse


def tiles_on(device: torch.device) -> tuple[int, int]:
    """The tile size for the device the head sits on (`TILES`)."""
    return TILES.get(device.type, TILES["other"])


def tile_bytes(device: torch.device) -> int:
    """The tiles' work space on `device`: a tile's logits in the model's dtype and in float32
    (at most 4 bytes each)."""
    tokens, vocabulary = tiles_on(device)
    return 2 * tokens * vocabulary * 4


def logsumexp_(tile: torch.Tensor) -> torch.Tensor:
    """logsumexp over the last dimension, overwriting `tile` (a temporary): its maximum taken
    off, exponentiated and summed in place, so no second tile is allocated. A row of -inf
    gives -inf, as torch.logsumexp does."""
    top = tile.amax(dim=-1, keepdim=True)
    top.masked_fill_(top == -torch.inf, 0)
    return tile.sub_(top).exp_().sum(dim=-1).log_().add_(top.squeeze(-1))
