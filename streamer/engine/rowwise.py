"""The INT8 decoder: linear layers whose products are exact to batch composition, with a quarter of float32's bytes.

A decoding step multiplies one position (or a few) by every decoder matrix: 33 MB of float32 weights per step for
tiny, more than the CPU's caches hold, so each step waits on memory rather than on arithmetic. INT8 weights read a
quarter of that.

torch's dynamic INT8 layers (fbgemm, :func:`streamer.engine.runtime._quantize_int8`) scale the activations by the
range of the whole input, so a position's output would depend on the other positions multiplied with it: a batched
pass (draft verification, several streams) would not give single steps' tokens. Here each position gets its own
scale (its largest magnitude maps to 127), each weight row its own, the product of the INT8 values accumulates
exactly in int32 (``torch._int_mm``: oneDNN's s8s8 GEMM), and the result is scaled back per position and row. The
outliers that made a per-tensor activation scale cost WER in the second FFN projection stay within their own
position's scale, so every layer is INT8.

Without VNNI that GEMM clips sums of two products at int16 (:func:`streamer.engine.kernels.int8_products_exact`):
on an AVX2 machine the product was 4.1 % off the float one where it is 1.1 % elsewhere (issue 38). There each
position goes in as two rows, its negative and its negated positive values, which cannot clip, and the product is
their difference: the same int32 sums, so the same outputs as on a VNNI machine, bit for bit. PyTorch's answer,
7-bit activations (``reduce_range``), keeps one row but loses half a bit: 1.9 % off, not 1.1 %.

It is ``--decoder-precision int8`` (config ``int8-decoder``), not the default: a batched pass still rounds the
float operations around these products differently from single steps, and INT8 rounding turns those differences
into token changes in near ties, so draft-verified decoding would no longer give plain greedy decoding's tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from streamer.engine.kernels import int8_products_exact

__all__ = ["RowwiseInt8Linear", "fuse_self_attention", "quantize_rowwise", "rowwise_skeleton"]

# below this a position's largest magnitude counts as zero (its product is then the bias alone)
_TINY = 1e-12


class RowwiseInt8Linear(nn.Module):
    """``x @ weight.T + bias`` for ``x`` ``[..., in_features]``: INT8 weights with one scale per output row, INT8
    activations with one scale per position. Built empty (on the meta device, say) for the weight cache to fill,
    or from float weights with :meth:`from_float`."""

    weight: torch.Tensor
    scale: torch.Tensor
    bias: torch.Tensor | None

    def __init__(self, in_features: int, out_features: int, bias: bool, device: torch.device | str | None = None):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        # buffers, not parameters: nothing trains them, and the weight cache stores buffers as they are
        self.register_buffer("weight", torch.empty(out_features, in_features, dtype=torch.int8, device=device))
        # the weight row's scale divided by 127, the activations' INT8 range
        self.register_buffer("scale", torch.empty(out_features, dtype=torch.float32, device=device))
        self.register_buffer("bias", torch.empty(out_features, device=device) if bias else None)

    @classmethod
    def from_float(cls, weight: torch.Tensor, bias: torch.Tensor | None) -> RowwiseInt8Linear:
        """Symmetric INT8 per output row of ``weight`` ``[out, in]`` (its largest magnitude maps to 127)."""
        weight = weight.detach().float().cpu()
        out_features, in_features = weight.shape
        layer = cls(in_features, out_features, bias is not None)
        scales = weight.abs().amax(dim=1).clamp_min(_TINY) / 127
        layer.weight = (weight / scales[:, None]).round_().clamp_(-127, 127).to(torch.int8).contiguous()
        layer.scale = (scales / 127).contiguous()
        if bias is not None:
            layer.bias = bias.detach().float().cpu().contiguous()
        return layer

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> RowwiseInt8Linear:
        return cls.from_float(linear.weight, linear.bias)

    @classmethod
    def stacked(cls, layers: Sequence[RowwiseInt8Linear]) -> RowwiseInt8Linear:
        """One layer computing ``layers``' outputs side by side (the rows of each, in order; a missing bias is
        zero): the same values as each alone, since every row keeps its own scale."""
        in_features = layers[0].in_features
        if any(layer.in_features != in_features for layer in layers):
            raise ValueError("stacked layers must read the same input width")
        out = cls(
            in_features, sum(layer.out_features for layer in layers), any(layer.bias is not None for layer in layers)
        )
        out.weight = torch.cat([layer.weight for layer in layers])
        out.scale = torch.cat([layer.scale for layer in layers])
        if out.bias is not None:
            out.bias = torch.cat(
                [layer.bias if layer.bias is not None else torch.zeros(layer.out_features) for layer in layers]
            )
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).float()
        peak = flat.abs().amax(dim=1, keepdim=True).clamp_min_(_TINY)
        quantized = flat.mul(peak.reciprocal().mul_(127)).round_().to(torch.int8)
        out = _int8_product(quantized, self.weight).float().mul_(peak).mul_(self.scale)
        if self.bias is not None:
            out.add_(self.bias)
        return out.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def _int8_product(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ weight.T`` summed exactly in int32, for INT8 ``x`` ``[rows, in]`` and ``weight`` ``[out, in]`` whose
    values lie in [-127, 127]."""
    if int8_products_exact():
        return torch._int_mm(x, weight.t())
    # oneDNN shifts the left operand by 128 into u8 and vpmaddubsw sums two u8 x s8 products in a saturating int16.
    # Values in [-127, 0] shift into [1, 128]: 128 * 127 * 2 = 32,512 fits. So x = min(x, 0) - min(-x, 0), one
    # product of both halves (twice the rows, the same weight reads) and a subtraction.
    rows = x.shape[0]
    halves = torch.stack((x, x.neg())).clamp_(max=0).view(2 * rows, -1)
    both = torch._int_mm(halves, weight.t())
    return both[:rows].sub_(both[rows:])


def quantize_rowwise(module: nn.Module) -> nn.Module:
    """``module`` with every ``nn.Linear`` replaced by its :class:`RowwiseInt8Linear` (in place; returned)."""
    return _swap_linears(module, RowwiseInt8Linear.from_linear)


def rowwise_skeleton(module: nn.Module) -> nn.Module:
    """``module`` (on the meta device) with every ``nn.Linear`` swapped for an empty :class:`RowwiseInt8Linear` of
    its shape on the meta device: the structure :func:`quantize_rowwise` gives, for the weight cache to fill."""
    return _swap_linears(
        module,
        lambda linear: RowwiseInt8Linear(linear.in_features, linear.out_features, linear.bias is not None, "meta"),
    )


def _swap_linears(module: nn.Module, make: Callable[[nn.Linear], RowwiseInt8Linear]) -> nn.Module:
    for child in list(module.modules()):
        for attribute, grandchild in list(child.named_children()):
            if type(grandchild) is nn.Linear:
                setattr(child, attribute, make(grandchild))
    return module


def fuse_self_attention(decoder: nn.Module) -> None:
    """Give each decoder layer's self-attention one ``qkv`` layer for its three input projections (one
    quantization of the input and one product where there were three), removing them. On the meta device too."""
    for layer in decoder.layers:  # type: ignore[union-attr]
        attention = layer.self_attn
        parts = [attention.q_proj, attention.k_proj, attention.v_proj]
        if parts[0].weight.device.type == "meta":
            fused = RowwiseInt8Linear(parts[0].in_features, sum(p.out_features for p in parts), True, device="meta")
        else:
            fused = RowwiseInt8Linear.stacked(parts)
        attention.qkv = fused
        del attention.q_proj, attention.k_proj, attention.v_proj
