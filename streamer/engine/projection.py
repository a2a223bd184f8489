"""The vocabulary projection in INT8 on the CPU, exact to batch composition, and the token embedding it shares.

The projection (51864 x 384 for the English models) is the largest matrix of the decoder and the costliest product of
a decoding step: in float32 it is 80 MB that every step reads. fbgemm's dynamic INT8 product reads a quarter of
that and runs 3 to 7 times faster on 2 cores (measured: 0.5 against 1.9 ms for one position, 7.7 against 17.8 ms
for 96).

Dynamic quantization scales the activations by the range of the whole input, so a position's logits would depend
on the other positions projected with it, and draft-verified decoding (many positions in one call) would no longer
give plain greedy decoding's tokens (one position per call). Each position is therefore scaled to a maximum
magnitude of 1 first, and two constant columns (+1 and -1, against zero weights) pin every input's range to exactly
[-1, 1]: the quantization of a position depends on that position alone, the INT8 product accumulates exactly in
int32, and the logits are multiplied back by the position's scale. The weights get one scale per vocabulary row.

The token embedding is the same matrix (Whisper ties them): lookups read a float16 copy, so the float32 matrix is not
kept at all (80 MB for tiny, against 20 MB of INT8 and 40 MB of float16).

Loaded from the weight cache, the INT8 matrix still has to be packed into fbgemm's layout, 0.15 to 0.2 s for tiny's
on one core: it is done on a thread of its own (:meth:`Int8Projection.packer`, after the encoder's INT8 layers; the
packing releases the GIL) while the rest of the engine loads, and the first product waits for it.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import torch
from torch import nn

__all__ = ["HalfEmbedding", "Int8Projection"]

# below this a position's hidden state counts as zero (its logits are then zero too)
_TINY = 1e-12
# vocabulary rows quantized at once while the weights are built (a 3 MB float32 temporary for 384 columns)
_BLOCK_ROWS = 2048


class HalfEmbedding(nn.Module):
    """Token embedding lookups from a float16 copy of the matrix: exact for checkpoints that ship in float16, as the
    bundled ones do. INT8 rows would save 20 MB more, but as embeddings they cost WER (66 LibriSpeech utterances,
    tiny.en: 9.26% against 8.94% with these float16 rows), where as a projection they cost nothing measurable."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight: torch.Tensor
        self.register_buffer("weight", weight.detach().to(torch.float16))  # a buffer: the weight cache stores it

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.weight[tokens].float()


class Int8Projection(nn.Module):
    """``hidden @ weight.T`` for hidden states ``[..., dim]`` with INT8 weights and per-position INT8 activations;
    float32 logits ``[..., vocab]``. Build from the float32 ``[vocab, dim]`` matrix, which can then be dropped."""

    def __init__(self, weight: torch.Tensor) -> None:
        """From the float ``[vocab, dim]`` matrix; a matrix on the meta device gives the module's structure only, for
        :func:`streamer.engine.weights.restore` to fill from the weight cache."""
        super().__init__()
        from streamer.engine.weights import dynamic_linear

        vocab, dim = weight.shape
        self.dim = dim
        self.vocab = vocab
        self.linear: Any = dynamic_linear(dim + 2, vocab, bias=False)
        self.embedding = HalfEmbedding(weight)
        self.ends = torch.tensor([1.0, -1.0], device="cpu")
        self._packing: Future[None] | None = None
        if weight.device.type == "meta":
            return
        # symmetric INT8 per vocabulary row, quantized a block of rows at a time: no float32 copy of the matrix
        scales = weight.detach().abs().amax(dim=1).float().clamp_min(_TINY) / 127
        padded = torch.zeros(vocab, dim + 2, dtype=torch.int8)
        for start in range(0, vocab, _BLOCK_ROWS):
            block = weight[start : start + _BLOCK_ROWS].detach().float() / scales[start : start + _BLOCK_ROWS, None]
            padded[start : start + _BLOCK_ROWS, :dim] = block.round_().clamp_(-127, 127).to(torch.int8)
        zeros = torch.zeros(vocab, dtype=torch.long)
        quantized = torch._make_per_channel_quantized_tensor(padded, scales.double(), zeros, 0)
        self.linear.set_weight_bias(quantized, None)  # fbgemm packs its own copy

    def packer(self, quantized: torch.Tensor) -> Callable[[], None]:
        """The packing of ``quantized`` (the ``[vocab, dim + 2]`` qint8 matrix the weight cache holds) for fbgemm,
        with one check of the packed product, to run on another thread, its Future handed to :meth:`packed_by`.
        ValueError at once if the matrix does not fit this module."""
        from streamer.engine.weights import check_int8_weight

        check_int8_weight("projection.linear", self.linear, quantized)

        def pack() -> None:
            with torch.inference_mode():
                self.linear.set_weight_bias(quantized, None)
                self.linear(torch.zeros(1, self.dim + 2))  # fbgemm's kernels run here, as a probe would see

        return pack

    def packed_by(self, done: Future[None]) -> None:
        """:meth:`forward` waits for ``done`` (the :meth:`packer`'s run) first, and raises what it raised."""
        self._packing = done

    def pack_in_background(self, quantized: torch.Tensor) -> None:
        """:meth:`packer` on a thread of its own; ValueError at once if the matrix does not fit this module."""
        from streamer.engine.weights import on_a_thread

        self.packed_by(on_a_thread([self.packer(quantized)], "streamer-pack-projection")[0])

    @property
    def packing(self) -> bool:
        """Whether :meth:`pack_in_background` started packing that :meth:`wait` has not seen finish."""
        return self._packing is not None

    def wait(self) -> None:
        """Block until the background packing is done; raise what it raised (on every call, if it failed)."""
        if self._packing is not None:
            self._packing.result()
            self._packing = None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        self.wait()
        flat = hidden.reshape(-1, self.dim).float()
        scale = flat.abs().amax(dim=1, keepdim=True).clamp_min(_TINY)
        pinned = torch.cat([flat / scale, self.ends.expand(flat.shape[0], 2)], dim=1)
        logits: torch.Tensor = self.linear(pinned)
        return logits.mul_(scale).view(*hidden.shape[:-1], self.vocab)
