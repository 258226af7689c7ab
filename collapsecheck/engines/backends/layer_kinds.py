"""Which of a model's layers attend and which carry a state.

An attention layer keeps keys and values for every token, so the cached scorer can run a
context once and attend to it from packed rows with a mask (`hf_scoring`). A layer that
carries a state (linear attention such as Qwen3.5's and Qwen3-Next's gated DeltaNet, the
state-space layers of Mamba, Nemotron-H, Granite 4.0 and Jamba, Falcon-H1's parallel
hybrid, LFM2's short convolutions) folds the tokens it has seen into a state of fixed size:
a mask cannot hide part of it, so packed branches would read each other, and a transformers
layer of this kind may not carry a state into a chunk of several tokens. transformers 5
names each layer's kind in the text config's `layer_types`.
"""

from __future__ import annotations

from typing import Any

ATTENTION_KINDS = frozenset(
    {"full_attention", "sliding_attention", "chunked_attention", "attention"}
)
STATELESS_KINDS = frozenset({"mlp", "moe"})  # Nemotron-H's feed-forward-only layers
NOT_ATTENDING_KINDS = STATELESS_KINDS | {"linear_attention", "conv"}


def layer_kinds(model: Any) -> tuple[str, ...]:
    """The kind of each layer, as the model's text config names it; a config without
    `layer_types` (an older transformers, a plain decoder) is all full attention."""
    config = model.config.get_text_config()
    kinds = getattr(config, "layer_types", None)
    if not kinds:
        return ("full_attention",) * int(getattr(config, "num_hidden_layers", 0) or 0)
    return tuple(str(kind) for kind in kinds)


def stateful_kinds(model: Any) -> tuple[str, ...]:
    """The kinds of layer, in order of first appearance, that carry a state instead of (or
    beside) keys and values: every kind that is neither attention nor feed-forward only, an
    unknown one included."""
    kinds = layer_kinds(model)
    stateful = [k for k in kinds if k not in ATTENTION_KINDS | STATELESS_KINDS]
    return tuple(dict.fromkeys(stateful))


def attending_layers(model: Any) -> int:
    """Layers that keep keys and values per token: attention layers and any kind not known
    to lack them (Falcon-H1's `hybrid` layers attend and carry a state)."""
    return sum(1 for kind in layer_kinds(model) if kind not in NOT_ATTENDING_KINDS)
