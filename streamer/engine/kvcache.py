"""The decoder's self-attention KV cache: preallocated once per decoding, written in place, never reallocated per
token; and the cross-attention keys/values, computed once per encoder output."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["CrossKV", "KVCache"]


@dataclass
class CrossKV:
    """Per decoder layer, ``[batch, heads, frames, head_dim]`` keys and values of the encoder states (1500 frames
    for Whisper's whole 30 s, fewer for a shorter span).

    Rows may come from windows encoded over spans of different lengths (each over its own, where the encoder runs
    one window at a time): ``lengths`` then says how many of its frames each row holds, and the keys and values past
    them are padding that :meth:`mask` hides from attention, so a row attends exactly as it would alone."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    # each row's frames (``frames`` for every row when None)
    lengths: list[int] | None = None

    @property
    def batch(self) -> int:
        return int(self.keys[0].shape[0])

    @property
    def frames(self) -> int:
        return int(self.keys[0].shape[2])

    def row_lengths(self) -> list[int]:
        return list(self.lengths) if self.lengths is not None else [self.frames] * self.batch

    def mask(self) -> torch.Tensor | None:
        """``[batch, 1, 1, frames]``, true where a row's query may attend; None when every row holds every frame."""
        lengths = self.row_lengths()
        if all(n == self.frames for n in lengths):
            return None
        device = self.keys[0].device
        held = torch.arange(self.frames, device=device).view(1, -1) < torch.tensor(lengths, device=device).view(-1, 1)
        return held.view(self.batch, 1, 1, self.frames)

    def row(self, index: int) -> CrossKV:
        """Row ``index`` as a batch-1 cross cache over its own frames (views, no copy)."""
        frames = self.row_lengths()[index]
        keys = [k[index : index + 1, :, :frames] for k in self.keys]
        return CrossKV(keys, [v[index : index + 1, :, :frames] for v in self.values])

    @classmethod
    def concat(cls, parts: list[CrossKV]) -> CrossKV:
        """The rows of several windows' cross caches as one batch, in order, over the longest one's frames (the
        shorter ones padded, and masked by their lengths). Consecutive rows of one batch (as :meth:`row` gives them)
        are joined as a view, without copying."""
        if len(parts) == 1:
            return parts[0]
        lengths = [n for part in parts for n in part.row_lengths()]
        frames = max(part.frames for part in parts)
        joined = _adjacent_rows(parts, frames)
        if joined is None:
            layers = range(len(parts[0].keys))

            def padded(tensor: torch.Tensor) -> torch.Tensor:
                return torch.nn.functional.pad(tensor, (0, 0, 0, frames - tensor.shape[2]))

            joined = cls(
                [torch.cat([padded(p.keys[i]) for p in parts]) for i in layers],
                [torch.cat([padded(p.values[i]) for p in parts]) for i in layers],
            )
        joined.lengths = None if all(n == frames for n in lengths) else lengths
        return joined

    def narrow(self, rows: int) -> CrossKV:
        """The first ``rows`` rows (views)."""
        lengths = None if self.lengths is None else self.lengths[:rows]
        return CrossKV([k[:rows] for k in self.keys], [v[:rows] for v in self.values], lengths)

    def swap_rows(self, a: int, b: int) -> None:
        """Exchange rows ``a`` and ``b`` in place (a row's worth of scratch, no new batch)."""
        _swap_rows([*self.keys, *self.values], a, b)
        if self.lengths is not None:
            self.lengths[a], self.lengths[b] = self.lengths[b], self.lengths[a]

    def expand(self, batch: int) -> CrossKV:
        """A batch-1 cross cache seen as ``batch`` rows without copying."""
        return CrossKV(
            [k.expand(batch, -1, -1, -1) for k in self.keys],
            [v.expand(batch, -1, -1, -1) for v in self.values],
            None if self.lengths is None else self.lengths * batch,
        )


def _swap_rows(tensors: list[torch.Tensor], a: int, b: int) -> None:
    if a == b:
        return
    for tensor in tensors:
        held = tensor[a].clone()
        tensor[a].copy_(tensor[b])
        tensor[b].copy_(held)


def _adjacent_rows(parts: list[CrossKV], frames: int) -> CrossKV | None:
    """``parts`` as one view over ``frames`` frames if each starts where the previous one ends in the same storage
    (rows of one batch, each narrowed to its own frames), else None."""
    first = parts[0]
    rows = sum(p.batch for p in parts)
    joined: list[list[torch.Tensor]] = [[], []]
    for kind, tensors in enumerate((first.keys, first.values)):
        for layer, head in enumerate(tensors):
            pointer = head.data_ptr()
            storage = head.untyped_storage()
            for part in parts:
                tensor = (part.keys, part.values)[kind][layer]
                same = tensor.untyped_storage().data_ptr() == storage.data_ptr()
                if not same or tensor.data_ptr() != pointer or tensor.stride() != head.stride():
                    return None
                pointer += tensor.shape[0] * tensor.stride(0) * tensor.element_size()
            shape = (rows, head.shape[1], frames, head.shape[3])
            view = head.as_strided(shape, head.stride(), head.storage_offset())
            end = view.storage_offset() + sum((n - 1) * st for n, st in zip(shape, view.stride(), strict=True)) + 1
            if frames > head.shape[2] and end * view.element_size() > storage.nbytes():
                return None  # the rows were cut from fewer frames than the longest part holds
            joined[kind].append(view)
    return CrossKV(joined[0], joined[1])


class KVCache:
    """``[layers][batch, heads, context + scratch, head_dim]`` keys and values, filled up to :attr:`length`
    positions; the ``scratch`` positions past :attr:`context` hold padding no query attends to.

    Positions are zeroed as they come into use (:meth:`clear_to`), not at allocation: a row shorter than its batch's
    longest attends (with weight 0) to slots it never wrote, and 0 times a NaN left in recycled memory is NaN (the
    capacity bench hit exactly that once the INT8 projection refused NaN inputs). Zeroing all of a greedy batch's
    448 positions up front made every page of it resident (17 MB for 3 rows of tiny), where a window uses a few
    hundred positions; the rest is never touched."""

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], scratch: int = 0) -> None:
        self.keys = keys
        self.values = values
        self.length = 0
        self._scratch = scratch
        self.context = int(keys[0].shape[2]) - scratch if keys else 0
        # per row: positions [0, _clear[row]) hold zeros or written keys/values, never garbage (shared with views)
        self._clear = [0] * (int(keys[0].shape[0]) if keys else 0)

    @classmethod
    def allocate(
        cls,
        *,
        layers: int,
        batch: int,
        heads: int,
        length: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        scratch: int = 0,
    ) -> KVCache:
        shape = (batch, heads, length + scratch, head_dim)
        return cls(
            [torch.empty(shape, dtype=dtype, device=device) for _ in range(layers)],
            [torch.empty(shape, dtype=dtype, device=device) for _ in range(layers)],
            scratch,
        )

    def clear_to(self, end: int) -> None:
        """Zero every row's positions up to ``end`` that were never cleared or written (call before writing or
        reading positions there)."""
        rows = range(self.batch)
        starts = {self._clear[row] for row in rows if self._clear[row] < end}
        for start in starts:  # rows cleared as far go together (usually all of them)
            chosen = [row for row in rows if self._clear[row] == start]
            for tensor in (*self.keys, *self.values):
                if len(chosen) == self.batch:
                    tensor[:, :, start:end].zero_()
                else:
                    for row in chosen:
                        tensor[row, :, start:end].zero_()
            for row in chosen:
                self._clear[row] = end

    @property
    def batch(self) -> int:
        return int(self.keys[0].shape[0])

    def write(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new block's keys/values at ``length ..`` and return views of everything up to its end.

        Call for every layer, then :meth:`advance` once with the block's length.
        """
        end = self.length + keys.shape[2]
        self.clear_to(end)
        self.keys[layer][:, :, self.length : end] = keys
        self.values[layer][:, :, self.length : end] = values
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]

    def advance(self, count: int) -> None:
        self.length += count

    def truncate(self, length: int) -> None:
        """Forget every position from ``length`` on (the next write starts there)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a cache of {self.length} positions to {length}")
        self.length = length

    def narrow(self, rows: int) -> KVCache:
        """The first ``rows`` rows, sharing this cache's storage and length."""
        view = KVCache([k[:rows] for k in self.keys], [v[:rows] for v in self.values], self._scratch)
        view.length = self.length
        view._clear = self._clear  # the same list: a view's row r is this cache's row r
        return view

    def swap_rows(self, a: int, b: int) -> None:
        """Exchange rows ``a`` and ``b`` in place (the positions either has in use: the rest stays untouched)."""
        upto = max(self._clear[a], self._clear[b])
        _swap_rows([t[:, :, :upto] for t in (*self.keys, *self.values)], a, b)
        self._clear[a], self._clear[b] = self._clear[b], self._clear[a]

    def reorder(self, rows: torch.Tensor) -> None:
        """Keep row ``rows[i]`` as the new row ``i`` (beam search), in place."""
        for tensors in (self.keys, self.values):
            for index, tensor in enumerate(tensors):
                tensors[index] = tensor.index_select(0, rows.to(tensor.device))
        self._clear[:] = [self._clear[row] for row in rows.tolist()]
