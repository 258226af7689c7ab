"""The sampler's key/value cache laid out for decoding: each layer's keys and values in one
buffer as long as the whole decode, written in place a token at a time.

transformers' `DynamicLayer` concatenates a layer's whole cache with each step's token, so a
step copies every key and value decoded so far, in every layer (on a CPU the stage ran
1.13-1.18x faster without it: docs/benchmarks.md, "Where the CPU's sampling time goes"). Here a
step writes its own token's keys and values, and the layer's `keys` and `values` are views of
the buffer's filled part: attention reads the same numbers as before, so the traces are the
same.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer


@dataclass(frozen=True)
class Readers:
    """Which decoded rows read each prefilled row: `groups` (prefilled row, the decoded rows'
    numbers), `decoded` rows in all; `repeats` where every prefilled row is read by that many
    rows in a row, in order (a plain scan's K samples of each prompt): one copy does them."""

    groups: tuple[tuple[int, torch.Tensor], ...]
    decoded: int
    repeats: int | None

    @classmethod
    def of(cls, picked: torch.Tensor) -> Readers:
        """From `picked`, decoded row r's prefilled row at r."""
        rows = picked.tolist()
        groups: dict[int, list[int]] = {}
        for decoded, row in enumerate(rows):
            groups.setdefault(row, []).append(decoded)
        repeats = len(rows) // max(len(groups), 1)
        in_order = rows == [row for row in range(len(groups)) for _ in range(repeats)]
        where = picked.device
        return cls(
            tuple((row, torch.tensor(read, device=where)) for row, read in groups.items()),
            len(rows), repeats if in_order else None,
        )  # fmt: skip

    def copy(self, states: torch.Tensor, buffer: torch.Tensor) -> None:
        """The prefilled `states` into the first positions of the decoded rows' `buffer`."""
        length = states.shape[-2]
        if self.repeats is not None:
            batch, heads, capacity, width = states.shape[0], *buffer.shape[1:]
            spread = buffer.view(batch, self.repeats, heads, capacity, width)
            spread[..., :length, :] = states[:, None]
            return
        for row, rows in self.groups:
            buffer[rows, :, :length, :] = states[row]


class PreallocatedLayer(DynamicLayer):
    """A `DynamicLayer` whose keys and values are views of the filled part of buffers sized
    for the whole decode."""

    def __init__(
        self, keys: torch.Tensor, values: torch.Tensor, readers: Readers, capacity: int
    ) -> None:
        """The prefilled `keys` and `values` (prefilled rows, heads, length, head dim) copied
        into buffers of `capacity` positions, each prefilled row into the decoded rows that
        read it (`readers`)."""
        super().__init__()
        self.device, self.is_initialized = keys.device, True
        self.key_buffer = self._buffer(keys, readers, capacity)
        self.value_buffer = self._buffer(values, readers, capacity)
        self._show_filled(keys.shape[-2])

    @staticmethod
    def _buffer(states: torch.Tensor, readers: Readers, capacity: int) -> torch.Tensor:
        """The decoded rows' buffer, its first positions the prefilled rows that each reads
        (`Readers.copy`: no gathered copy of the whole prefix beside the buffer)."""
        _, heads, _, width = states.shape
        buffer = states.new_empty((readers.decoded, heads, capacity, width))
        readers.copy(states, buffer)
        return buffer

    def _show_filled(self, length: int) -> None:
        """`keys` and `values`: the buffers' first `length` positions, as views."""
        self.keys = self.key_buffer[..., :length, :]
        self.values = self.value_buffer[..., :length, :]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        start = self.keys.shape[-2]
        end = start + key_states.shape[-2]
        if end > self.key_buffer.shape[-2]:  # more than the decode was sized for
            self.key_buffer = torch.cat([self.keys, key_states], dim=-2)
            self.value_buffer = torch.cat([self.values, value_states], dim=-2)
        else:
            self.key_buffer[..., start:end, :] = key_states
            self.value_buffer[..., start:end, :] = value_states
        self._show_filled(end)
        return self.keys, self.values

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove < 0:
            self._show_filled(max(0, self.keys.shape[-2] + tokens_to_remove))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._change_rows(lambda buffer: buffer[indices])

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.batch_select_indices(beam_idx.to(self.device))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._change_rows(lambda buffer: buffer.repeat_interleave(repeats, dim=0))

    def _change_rows(self, change: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Both buffers' rows changed by `change`, the filled length kept."""
        length = self.keys.shape[-2]
        self.key_buffer, self.value_buffer = change(self.key_buffer), change(self.value_buffer)
        self._show_filled(length)


def preallocate(cache: Any, picked: torch.Tensor, new_tokens: int) -> bool:
    """Lay a prefilled cache out for decoding: decoded row r reads prefilled row `picked[r]`
    (a prompt's K samples, and rows whose contexts are identical, read one prefill: SPEC
    "Sampling"). Its plain (`DynamicLayer`) layers go into buffers with room for `new_tokens`
    more positions; every other layer (sliding windows, layers that carry a state:
    `layer_kinds`) has its rows picked by `reorder_cache`, the method each kind of layer
    implements whole. A cache of a model's own class (MiniMax's, an older transformers'
    without layers) keeps state that its layers do not show: its rows are picked by its own
    `batch_select_indices`, and kept to the end of the decode. Returns whether rows may leave
    the batch (`reorder_cache`)."""
    layers = getattr(cache, "layers", None)
    if type(cache) is not DynamicCache or layers is None:
        cache.batch_select_indices(picked)
        return False
    readers = Readers.of(picked)
    for place, layer in enumerate(layers):
        if type(layer) is DynamicLayer and layer.is_initialized and layer.keys.numel():
            capacity = layer.keys.shape[-2] + new_tokens
            layers[place] = PreallocatedLayer(layer.keys, layer.values, readers, capacity)
        else:
            layer.reorder_cache(picked)
    return True
