"""The loaded Whisper network with per-component precision and placement, and the engine's own decoder forward.

The modules and the encoder's forward are :mod:`streamer.engine.network` (transformers' parameter names, without
transformers). The decoder forward is our own loop over its modules, so that the self-attention KV cache
(:class:`~streamer.engine.kvcache.KVCache`) is preallocated and private to the engine, cross-attention keys and
values are computed once per window, and the alignment heads' cross-attention can be read for word timestamps.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from enum import StrEnum
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from streamer.core.errors import ConfigError
from streamer.engine.kvcache import CrossKV, KVCache
from streamer.engine.models import ModelFiles
from streamer.engine.network import Attention, NetworkConfig, Whisper, load_network
from streamer.engine.projection import Int8Projection
from streamer.engine.rowwise import fuse_self_attention, quantize_rowwise, rowwise_skeleton

__all__ = [
    "CPU_BF16_ATTENTION_BLOCK",
    "Placement",
    "Precision",
    "WhisperRuntime",
    "attention_backends",
    "encoder_attention_block",
]

if TYPE_CHECKING:
    from streamer.engine.kernels import KernelClass
    from streamer.engine.weights import Int8Weight

log = logging.getLogger(__name__)


class Precision(StrEnum):
    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"
    INT8 = "int8"


@dataclass(frozen=True)
class Placement:
    """Where one component (encoder or decoder) runs and in which precision."""

    precision: Precision
    device: str  # "cpu" or "cuda[:N]"

    def validate(self, component: str) -> None:
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            raise ConfigError(f"{component} device must be 'cpu' or 'cuda', not {self.device!r}")
        if self.precision is Precision.INT8 and self.device != "cpu":
            raise ConfigError(f"{component}: int8 runs on the CPU only (dynamic quantization has no CUDA kernels)")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError(f"{component} device {self.device!r} asked for, but no CUDA device is available")

    @property
    def dtype(self) -> torch.dtype:
        return {Precision.FP16: torch.float16, Precision.BF16: torch.bfloat16}.get(self.precision, torch.float32)

    def __str__(self) -> str:
        return f"{self.precision.value}/{self.device}"


# Linear layers kept in float when the encoder is INT8 (an INT8 decoder is streamer.engine.rowwise's, every layer
# INT8, with one activation scale per position): the second FFN projection reads the GELU output, whose
# outliers a per-tensor activation scale cannot cover. Measured on 50 LibriSpeech test-other utterances (tiny.en,
# greedy): fp32 11.24% WER, every Linear INT8 13.28%, every Linear but fc2 INT8 11.36%.
FLOAT_LINEARS = ("fc2",)

# windows a float encoder on the CPU runs at once (see WhisperRuntime.encode): 1 ran as fast as 2 on 232 recorded
# streaming windows in batches of 3 and 4, with a 10 to 15 MB lower peak
CPU_ENCODER_CHUNK = 1

# the encoder's self-attention over a bf16 encoder's activations on a CPU with AVX512-BF16 and no AMX is computed
# this many queries at a time as oneDNN's bf16 matrix products and a softmax (streamer.engine.network.
# blocked_attention), not by torch's fused CPU kernel, which ran bf16 no faster than float32 there. One layer's
# attention (tiny.en's 6 heads of 64), median of 60 on 2 cores of a Zen 4 EPYC, fused against blocked: 3.5 against
# 1.7 ms over 600 frames, 6.7 against 2.9 ms over 860 (a streaming window of 7.2 s and the 10 s of silence after it),
# 19.6 against 8.9 ms over 1500 (Whisper's 30 s); blocks of 128 queries 3.4 ms over 860, of 512 5.8 ms. On the
# tuning half (`streamer bench accuracy --half tune`, the same hour): a window's encoder 71 against 57 ms, streamed
# WER 8.80 against 8.80 %, offline 8.80 against 8.65 % (docs/benchmarks.md, "The encoder's attention in bf16"). Not
# on AMX, whose fused kernel multiplies in tiles of its own and is not measured against it
CPU_BF16_ATTENTION_BLOCK = 256


def encoder_attention_block(kernel_class: KernelClass, placement: Placement) -> int | None:
    """The query block of the encoder's self-attention for ``placement`` on a CPU of ``kernel_class`` (None: torch's
    fused kernel): :data:`CPU_BF16_ATTENTION_BLOCK` for a bf16 encoder on the CPU of the avx512-bf16 class only."""
    from streamer.engine.kernels import KernelClass

    if placement.device == "cpu" and placement.precision is Precision.BF16 and kernel_class is KernelClass.AVX512_BF16:
        return CPU_BF16_ATTENTION_BLOCK
    return None


def _set_attention_block(encoder: nn.Module, block: int | None) -> None:
    for module in encoder.modules():
        if isinstance(module, Attention):
            module.query_block = block


def attention_backends(device: torch.device) -> contextlib.AbstractContextManager[None]:
    """The scaled-dot-product attention kernels allowed on ``device``: on CUDA, flash, then memory-efficient, then the
    math fallback, and never cuDNN's, which builds an execution plan per new shape (issue 37: on an H200, a decoder
    step whose key length had not been seen took 60 to 80 ms instead of 2, and a first pass over a set was 7 times
    slower than a second); elsewhere whatever torch picks."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    return sdpa_kernel(backends, set_priority=True)


def _quantize_int8(module: nn.Module) -> nn.Module:
    """Dynamic INT8 quantization of the ``nn.Linear`` layers (but :data:`FLOAT_LINEARS`) with per-output-channel
    weight scales.

    Why ``torch.ao.quantization.quantize_dynamic`` and not torchao: on a CPU without ``torch.compile``, torchao's
    int8 dynamic-activation path runs as unfused eager ops and is slower than fp32 for tiny/base-sized matrices,
    while the ``torch.ao`` path calls fbgemm's fused int8 GEMM directly. It is deprecated, not removed, in torch 2.x;
    its warning is silenced here on purpose. Per-channel scales: per-tensor weight scales cost small Whisper models
    WER. Activations get one dynamic scale per tensor, which is why the outlier-prone layers stay in float.
    """
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    names = {
        name
        for name, child in module.named_modules()
        if isinstance(child, nn.Linear) and not name.endswith(FLOAT_LINEARS)
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantized: nn.Module = quantize_dynamic(  # type: ignore[no-untyped-call]
            module, {name: per_channel_dynamic_qconfig for name in names}, dtype=torch.qint8, inplace=False
        )
        return quantized


def _shares_cross(encoder: Placement, decoder: Placement) -> bool:
    """Whether the cross-attention key/value projections run in the encoder's (half) precision: see
    :func:`_cross_projections`."""
    return encoder.precision in (Precision.BF16, Precision.FP16) and encoder.device == decoder.device


# a layer's cross-attention projections in the weight cache: key weight, value weight, value bias
_CROSS_NAMES = ("k_weight", "v_weight", "v_bias")


def _cross_projections(
    decoder: Any, encoder: Placement, placement: Placement
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None:
    """Each decoder layer's cross-attention key/value weights in the encoder's precision, when that is half
    precision on the decoder's device (the projections then read the encoder's output as it is); else None."""
    if not _shares_cross(encoder, placement):
        return None
    out: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    for layer in decoder.layers:
        attn = layer.encoder_attn
        k, v = attn.k_proj, attn.v_proj
        k_weight, v_weight, v_bias = (
            t.detach().to(encoder.device, encoder.dtype).clone() for t in (k.weight, v.weight, v.bias)
        )
        out.append((k_weight, v_weight, v_bias))
    return out


def _pop_tensor(tensors: dict[str, Any], key: str, dtype: torch.dtype) -> torch.Tensor:
    tensor = tensors.pop(key)
    if not isinstance(tensor, torch.Tensor) or tensor.dtype != dtype:
        raise ValueError(f"{key} is not a {dtype} tensor")
    return tensor


def _projection(placed: torch.Tensor, original: torch.Tensor, placement: Placement) -> nn.Module:
    """The vocabulary projection (a container, so INT8 can swap its Linear): the decoder's own embedding matrix,
    shared rather than copied (80 MB for the small models) when it is already in the projection's precision."""
    with torch.device("meta"):  # no random initialisation of a matrix that is replaced at once
        linear = nn.Linear(original.shape[1], original.shape[0], bias=False)
    if placement.precision is not Precision.INT8 and placed.dtype == placement.dtype:
        linear.weight = placed if isinstance(placed, nn.Parameter) else nn.Parameter(placed)
        return nn.Sequential(linear)
    linear.weight = nn.Parameter(original.detach().clone())
    return _place(nn.Sequential(linear), placement)


def _place(module: nn.Module, placement: Placement) -> nn.Module:
    if placement.precision is Precision.INT8:
        return _quantize_int8(module.float().cpu())
    return module.to(device=placement.device, dtype=placement.dtype)


def _place_decoder(module: nn.Module, placement: Placement) -> nn.Module:
    """The decoder placed: an INT8 one gets :mod:`streamer.engine.rowwise`'s layers (exact to batch composition, where
    :func:`_quantize_int8`'s are not), with each self-attention's three input projections fused into one."""
    if placement.precision is not Precision.INT8:
        return _place(module, placement)
    placed = quantize_rowwise(module.float().cpu())
    fuse_self_attention(placed)
    return placed


class WhisperRuntime:
    """The network, ready to run: call :meth:`encode`, then :meth:`cross_kv`, then :meth:`decode_step` repeatedly."""

    def __init__(
        self,
        files: ModelFiles,
        encoder: Placement,
        decoder: Placement,
        projection: Precision | None = None,
        *,
        weight_cache: bool = False,
    ) -> None:
        """``projection``: the vocabulary projection's precision; None is INT8 for a float decoder on the CPU, else
        the decoder's. INT8 (:mod:`streamer.engine.projection`) measured on 66 LibriSpeech utterances with tiny.en
        (``streamer bench offline``): 8.94% WER against 8.86% in float32, a quarter less time.

        ``weight_cache``: read the placed weights from :mod:`streamer.engine.weights`'s cache when it holds them
        (CPU placements only), else build them from the checkpoint and write them there for the next process."""
        encoder.validate("encoder")
        decoder.validate("decoder")
        if projection is None:  # INT8 on the CPU (an INT8 decoder's too); elsewhere the decoder's precision
            float_on_cpu = decoder.device == "cpu" and decoder.precision in (Precision.FP32, Precision.BF16)
            projection = Precision.INT8 if float_on_cpu else decoder.precision
        if projection not in (Precision.INT8, Precision.FP32, decoder.precision):
            raise ConfigError(f"the projection runs in int8, fp32 or the decoder's precision, not {projection.value}")
        if projection is Precision.INT8 and decoder.device != "cpu":
            raise ConfigError("an int8 projection runs on the CPU only (fbgemm)")
        self.config = NetworkConfig.read(files.directory / "config.json")
        self.encoder_placement = encoder
        self.decoder_placement = decoder
        self.n_heads = self.config.decoder_attention_heads
        self.n_layers = self.config.decoder_layers
        self.d_model = self.config.d_model
        self.n_ctx = self.config.max_target_positions
        self.n_audio_ctx = self.config.max_source_positions
        self.head_dim = self.d_model // self.n_heads
        # bf16 logits would round to 1/8 near typical values and flip close choices: a bf16 decoder projects in fp32
        # (an INT8 projection takes float32 hidden states too)
        int8_projection = projection is Precision.INT8
        float32_projection = int8_projection or decoder.precision is Precision.BF16 or projection is Precision.FP32
        self._projection_placement = Placement(Precision.FP32, decoder.device) if float32_projection else decoder
        self.encoder: Any
        self.decoder: Any
        self.projection: Any
        self._cross_projections: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None
        self._encoder_packing: Future[None] | None = None  # the encoder's INT8 layers, packed on a thread
        cache = None
        # float32 throughout converts nothing (the checkpoint is read as it is): nothing to gain from a cached copy
        converts = any(p is not Precision.FP32 for p in (encoder.precision, decoder.precision, projection))
        if weight_cache and converts and encoder.device == decoder.device == "cpu":
            from streamer.engine import weights
            from streamer.engine.kernels import kernel_report

            placement = f"encoder {encoder}, decoder {decoder}, projection {projection.value}"
            cache = weights.cache_file(files, placement, kernel_report().kernel_class.label)
            tensors = weights.read(cache)
            if tensors is not None and self._restore(tensors, int8_projection, cache):
                cache = None  # nothing to write
            else:
                self._build(files, int8_projection)
        else:
            self._build(files, int8_projection)
        if cache is not None:
            weights.write(cache, self._tensors())
        if encoder.device == "cpu" and encoder.precision is Precision.BF16:
            from streamer.engine.kernels import kernel_report

            _set_attention_block(self.encoder, encoder_attention_block(kernel_report().kernel_class, encoder))
        self.decoder_dtype = decoder.dtype
        self.decoder_device = torch.device(decoder.device)
        self.encoder_device = torch.device(encoder.device)
        self.encoder_dtype = encoder.dtype

    def _build(self, files: ModelFiles, int8_projection: bool) -> None:
        """Place the checkpoint's float32 network: cast, quantize, share the cross-attention projections."""
        encoder, decoder = self.encoder_placement, self.decoder_placement
        model = load_network(files.directory)
        self.encoder = _place(model.encoder, encoder)
        decoder_module: Any = model.decoder
        self._cross_projections = _cross_projections(decoder_module, encoder, decoder)
        if self._cross_projections is not None:  # the float originals would never run: 4.7 MB for tiny
            for layer in decoder_module.layers:
                del layer.encoder_attn.k_proj, layer.encoder_attn.v_proj
        embedding = decoder_module.embed_tokens.weight  # the output projection is tied to it (as in Whisper)
        placed: Any = _place_decoder(decoder_module, decoder)
        self.decoder = placed
        if int8_projection:  # no float32 matrix is kept
            self.projection = Int8Projection(embedding)
            placed.embed_tokens = self.projection.embedding
        else:
            self.projection = _projection(placed.embed_tokens.weight, embedding, self._projection_placement)
        del embedding, model  # the float32 embedding goes with them when the projection is INT8

    def _tensors(self) -> dict[str, Any]:
        """Every placed tensor, for the weight cache (:meth:`_restore` reads them back)."""
        from streamer.engine.weights import tensors_of

        self._encoder_ready()
        if isinstance(self.projection, Int8Projection):
            self.projection.wait()  # its packed matrix is what is stored
        out = {
            **tensors_of(self.encoder, "encoder"),
            **tensors_of(self.decoder, "decoder"),
            **tensors_of(self.projection, "projection"),
        }
        for layer, triple in enumerate(self._cross_projections or ()):
            out |= {f"cross.{layer}.{name}": t for name, t in zip(_CROSS_NAMES, triple, strict=True)}
        return out

    def _restore(self, tensors: dict[str, Any], int8_projection: bool, path: object) -> bool:
        """The modules :meth:`_build` would make, built empty on the meta device and filled with the cached
        ``tensors``; False (with a log line) when they do not fit."""
        from streamer.engine.weights import int8_skeleton, on_a_thread, restore, take_int8_weight

        def skeleton(module: nn.Module, placement: Placement) -> nn.Module:
            if placement.precision is Precision.INT8:
                return int8_skeleton(module.float(), FLOAT_LINEARS)
            return module.to(dtype=placement.dtype)

        encoder, decoder = self.encoder_placement, self.decoder_placement
        network: Any
        with torch.device("meta"):  # INT8 layers are made outside: their placeholders are real CPU tensors
            network = Whisper(self.config)
            linear = nn.Linear(self.d_model, self.config.vocab_size, bias=False)
        cross = _shares_cross(encoder, decoder)
        if cross:
            for layer in network.decoder.layers:
                del layer.encoder_attn.k_proj, layer.encoder_attn.v_proj
        placed_encoder = skeleton(network.encoder, encoder)
        placed_decoder: Any
        if decoder.precision is Precision.INT8:
            placed_decoder = rowwise_skeleton(network.decoder.float())
            fuse_self_attention(placed_decoder)
        else:
            placed_decoder = skeleton(network.decoder, decoder)
        projection: nn.Module
        if int8_projection:
            projection = Int8Projection(torch.empty(self.config.vocab_size, self.d_model, device="meta"))
            placed_decoder.embed_tokens = projection.embedding
        else:
            projection = skeleton(nn.Sequential(linear), self._projection_placement)
        encoder_weights: list[Int8Weight] = []  # packed on a thread of their own, below
        try:
            restore(placed_encoder, "encoder", tensors, unpacked=encoder_weights)
            restore(placed_decoder, "decoder", tensors)
            quantized: torch.Tensor | None = None
            if isinstance(projection, Int8Projection):  # its matrix is packed on a thread of its own, below
                restore(projection.embedding, "projection.embedding", tensors)
                quantized = take_int8_weight(tensors, "projection.linear", projection.linear)
            else:
                restore(projection, "projection", tensors)
            triples = [
                tuple(_pop_tensor(tensors, f"cross.{layer}.{name}", encoder.dtype) for name in _CROSS_NAMES)
                for layer in range(self.n_layers if cross else 0)
            ]
            if tensors:
                raise ValueError(f"{next(iter(tensors))} is not a tensor of this network")
            jobs: list[Callable[[], None]] = [partial(_pack_all, encoder_weights)] if encoder_weights else []
            if isinstance(projection, Int8Projection) and quantized is not None:
                jobs.append(projection.packer(quantized))
        except (KeyError, ValueError) as error:
            log.warning("ignoring the weight cache %s, whose tensors do not fit (%s); rebuilding it", path, error)
            return False
        # fbgemm packs the encoder's INT8 layers, then the vocabulary projection, on one thread of their own while
        # the tokenizer loads (holding the GIL, which the packing releases) and the probe runs: the encoder's first
        # use waits for its layers (:meth:`_encoder_ready`), the projection's first product for its matrix
        done = on_a_thread(jobs, "streamer-pack") if jobs else []
        self._encoder_packing = done[0] if encoder_weights else None
        if isinstance(projection, Int8Projection) and quantized is not None:
            projection.packed_by(done[-1])
        self.encoder, self.decoder, self.projection = placed_encoder.eval(), placed_decoder.eval(), projection.eval()
        self._cross_projections = [(k, v, b) for k, v, b in triples] if cross else None
        return True

    @torch.inference_mode()
    def probe(self) -> None:
        """Run every kind of product the network runs once, on a few frames and one token (milliseconds, where a
        warm-up's full window takes a second): raises the RuntimeError that kernels torch cannot run here raise (a
        bf16 encoder under an oneDNN cap below bf16: "could not create a primitive descriptor"). Call after loading
        when no warm-up decode runs; the caller falls back to another precision or reports the error.

        The same modules as :meth:`encode` and :meth:`decode_step`, in the same precisions and order: the encoder's
        convolutions and layers (the fused linear+GELU included), the cross-attention projections, one decoder
        step with its KV cache and the vocabulary projection. On one thread: each product here is too small to share,
        and a parallel region per product costs a thread wake-up each, which on a busy machine took the probe from
        tens of milliseconds to over a second (measured on 2 loaded cores)."""
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            self._probe()
        finally:
            torch.set_num_threads(threads)

    def _encoder_ready(self) -> None:
        """Wait for the encoder's INT8 layers packed on a thread (:meth:`_restore`); raise what the packing raised
        (on every call, if it failed)."""
        if self._encoder_packing is not None:
            self._encoder_packing.result()
            self._encoder_packing = None

    def _probe(self) -> None:
        self._encoder_ready()
        encoder = self.encoder
        frames = torch.zeros(1, self.config.num_mel_bins, 8, dtype=self.encoder_dtype, device=self.encoder_device)
        x = F.gelu(encoder.conv2(F.gelu(encoder.conv1(frames)))).permute(0, 2, 1)
        for layer in encoder.layers:
            x = layer(x)
        states = encoder.layer_norm(x)
        if self._cross_projections is None:
            states = states.to(self.decoder_device, self.decoder_dtype)
        cross = self.cross_kv(states)
        token = torch.zeros(1, 1, dtype=torch.long, device=self.decoder_device)
        hidden, _ = self.decode_hidden(token, self.new_cache(1, context=1), cross)
        # an INT8 projection being packed in the background checks its own product once packed (the first decode
        # waits for it): waiting here would end the overlap with the rest of the start-up
        if not (isinstance(self.projection, Int8Projection) and self.projection.packing):
            self.project(hidden)

    # -- encoder ------------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def encode(self, features: torch.Tensor, frames: Sequence[int] | None = None) -> torch.Tensor:
        """Encoder states ``[batch, 1500, d_model]`` on the decoder's device, for features ``[batch, 80, 3000]``, in the
        decoder's precision (or the encoder's, when :meth:`cross_kv` reads them in it).

        ``frames`` (where :attr:`encodes_windows_apart`): each window is encoded over its own first ``frames[i]``
        feature frames, not the batch's, and its states past ``frames[i] // 2`` are zeros (padding, which the cross
        keys and values made from them must mask: :class:`~streamer.engine.kvcache.CrossKV`'s ``lengths``). A
        window then reads as much of its silence as it would alone, whatever it is batched with.

        An INT8 encoder runs one window at a time: dynamic quantization scales activations by the min/max of the
        whole input tensor, so batching windows together would make a window's transcript depend on its batch
        neighbours. On the CPU float encoders run :data:`CPU_ENCODER_CHUNK` windows at a time: one 1500-row window
        already fills the GEMMs, and the activations of a whole batch would cost resident memory for nothing.
        """
        self._encoder_ready()
        features = features.to(self.encoder_device, self.encoder_dtype)
        chunk = self._encoder_chunk() or features.shape[0]
        if frames is not None and chunk != 1:
            raise ValueError("windows are encoded over their own spans only where the encoder takes one at a time")
        with attention_backends(self.encoder_device):
            if frames is not None:
                parts = [self.encoder(features[i : i + 1, :, : frames[i]]) for i in range(features.shape[0])]
                longest = max(p.shape[1] for p in parts)
                parts = [F.pad(p, (0, 0, 0, longest - p.shape[1])) if p.shape[1] < longest else p for p in parts]
            else:
                parts = [self.encoder(features[i : i + chunk]) for i in range(0, features.shape[0], chunk)]
        states: torch.Tensor = parts[0] if len(parts) == 1 else torch.cat(parts)
        if self._cross_projections is not None:  # cross_kv reads the states in the encoder's precision
            return states
        return states.to(self.decoder_device, self.decoder_dtype)

    def _encoder_chunk(self) -> int | None:
        """How many windows :meth:`encode` passes through the encoder at a time (None: the whole batch at once)."""
        if self.encoder_placement.precision is Precision.INT8:
            return 1
        return CPU_ENCODER_CHUNK if self.encoder_device.type == "cpu" else None

    @property
    def encodes_windows_apart(self) -> bool:
        """Whether :meth:`encode` takes a batch's windows one at a time (on the CPU, or INT8), so that each can be
        encoded over its own span."""
        return self._encoder_chunk() == 1

    @torch.inference_mode()
    def cross_kv(self, states: torch.Tensor) -> CrossKV:
        """Cross-attention keys and values of every decoder layer for encoder ``states`` ``[batch, 1500, d_model]``
        (as :meth:`encode` returns them), computed once per window, for the whole batch in one product per layer.

        With a half-precision encoder on the decoder's device the projections run in the encoder's precision (on
        bf16-capable CPUs several times faster than in float32) and their outputs are stored in the decoder's."""
        batch = states.shape[0]
        keys, values = [], []
        if self._cross_projections is not None:
            # one allocation for every layer's keys and values, each product written into it through one
            # half-precision scratch: no per-layer temporaries for the allocator to keep
            store = torch.empty((2, self.n_layers, *states.shape), dtype=self.decoder_dtype, device=states.device)
            scratch = torch.empty(states.shape, dtype=states.dtype, device=states.device)
            for layer, (k_weight, v_weight, v_bias) in enumerate(self._cross_projections):
                store[0, layer].copy_(torch.matmul(states, k_weight.t(), out=scratch))
                flat = scratch.flatten(0, 1)
                store[1, layer].copy_(
                    torch.addmm(v_bias, states.flatten(0, 1), v_weight.t(), out=flat).view_as(scratch)
                )
                keys.append(self._heads(store[0, layer], batch))
                values.append(self._heads(store[1, layer], batch))
            return CrossKV(keys=keys, values=values)
        for layer in self.decoder.layers:
            attn = layer.encoder_attn
            keys.append(self._heads(attn.k_proj(states), batch))
            values.append(self._heads(attn.v_proj(states), batch))
        return CrossKV(keys=keys, values=values)

    def new_cache(self, batch: int, scratch: int = 0, context: int | None = None) -> KVCache:
        """A KV cache for ``batch`` rows of ``context`` positions (default and at most the decoder's whole context;
        a caller that knows its longest sequence asks for no more), plus ``scratch`` positions past it where
        :meth:`decode_ragged` parks the padding of short rows."""
        context = self.n_ctx if context is None else max(1, min(context, self.n_ctx))
        return KVCache.allocate(
            layers=self.n_layers,
            batch=batch,
            heads=self.n_heads,
            length=context,
            scratch=scratch,
            head_dim=self.head_dim,
            dtype=self.decoder_dtype,
            device=self.decoder_device,
        )

    def _heads(self, x: torch.Tensor, batch: int) -> torch.Tensor:
        return x.view(batch, -1, self.n_heads, self.head_dim).transpose(1, 2)

    # -- decoder ------------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def decode_step(
        self, tokens: torch.Tensor, cache: KVCache, cross: CrossKV, qk_heads: tuple[tuple[int, int], ...] = ()
    ) -> tuple[torch.Tensor, dict[tuple[int, int], torch.Tensor]]:
        """Run ``tokens`` ``[batch, T]`` at positions ``cache.length ..``; returns float32 logits ``[batch, T, vocab]``
        and, for each ``(layer, head)`` in ``qk_heads``, that head's raw cross-attention scores ``[batch, T, 1500]``.

        The new keys and values are written into ``cache`` and its length advances by ``T``.
        """
        hidden, qks = self.decode_hidden(tokens, cache, cross, qk_heads)
        return self.project(hidden), qks

    @torch.inference_mode()
    def project(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits of final hidden states. The vocabulary projection is the costliest matrix of a decoder
        pass (51864 x 384): callers project only the positions whose predictions they read."""
        logits: torch.Tensor = self.projection(hidden.to(self._projection_placement.dtype)).float()
        return logits

    @torch.inference_mode()
    def decode_hidden(
        self, tokens: torch.Tensor, cache: KVCache, cross: CrossKV, qk_heads: tuple[tuple[int, int], ...] = ()
    ) -> tuple[torch.Tensor, dict[tuple[int, int], torch.Tensor]]:
        """:meth:`decode_step` without the vocabulary projection: final hidden states ``[batch, T, d_model]``."""
        batch, count = tokens.shape
        offset = cache.length
        if offset + count > cache.context:
            raise ValueError(f"the cache holds {cache.context} tokens; {offset + count} asked for")
        positions = torch.arange(offset, offset + count, device=self.decoder_device).expand(batch, count)
        mask = None
        if count > 1:  # causal within the new block, everything before it visible
            cols = torch.arange(offset + count, device=self.decoder_device)
            mask = cols.view(1, -1) <= positions[0].view(-1, 1)

        def write(index: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return cache.write(index, keys, values)

        hidden, qks = self._forward(tokens, positions, write, mask, cross, qk_heads)
        cache.advance(count)
        return hidden, qks

    @torch.inference_mode()
    def decode_ragged(
        self, sequences: list[list[int]], starts: list[int], cache: KVCache, cross: CrossKV
    ) -> torch.Tensor:
        """Row ``r`` feeds ``sequences[r]`` at positions ``starts[r]..`` of its own cache row (continuous batching
        with a different number of tokens per row); returns hidden states ``[batch, longest, d_model]``, of which
        row ``r``'s first ``len(sequences[r])`` are meaningful. The cache needs ``scratch`` room for the padding
        (see :meth:`new_cache`); the caller tracks each row's length."""
        batch = len(sequences)
        width = max(len(seq) for seq in sequences)
        context = cache.context
        if max(s + len(q) for s, q in zip(starts, sequences, strict=True)) > context:
            raise ValueError(f"the cache holds {context} tokens")
        if cache.keys[0].shape[2] < context + width:
            raise ValueError("the cache has too little scratch room for this step")
        device = self.decoder_device
        tokens = torch.tensor([seq + [0] * (width - len(seq)) for seq in sequences], device=device)
        offsets = torch.arange(width, device=device).view(1, -1)
        positions = torch.tensor(starts, device=device).view(-1, 1) + offsets
        lengths = torch.tensor([len(seq) for seq in sequences], device=device).view(-1, 1)
        padding = offsets >= lengths
        # padding is written past the context, where no real query looks, and embedded at a valid position
        slots = torch.where(padding, context + offsets, positions)
        embed_at = positions.clamp(max=context - 1)
        end = int(positions.masked_fill(padding, 0).max()) + 1
        cache.clear_to(end)  # a short row attends (with weight 0) to positions up to the longest row's end
        cols = torch.arange(end, device=device)
        mask = (cols.view(1, 1, -1) <= positions.unsqueeze(-1)).unsqueeze(1)  # [batch, 1, width, end]
        rows = torch.arange(batch, device=device).view(-1, 1)

        def write(index: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            cache.keys[index][rows, :, slots] = keys.transpose(1, 2)
            cache.values[index][rows, :, slots] = values.transpose(1, 2)
            return cache.keys[index][:, :, :end], cache.values[index][:, :, :end]

        hidden, _ = self._forward(tokens, embed_at, write, mask, cross, ())
        return hidden

    def new_static_cache(self, batch: int, scratch: int) -> KVCache:
        """A KV cache for :meth:`decode_static`: the decoder's whole context plus ``scratch`` positions, zeroed once
        (every later pass attends over all of it, masked: nothing in it may be NaN)."""
        cache = self.new_cache(batch, scratch=scratch)
        cache.clear_to(cache.context + scratch)
        return cache

    @torch.inference_mode()
    def decode_static(
        self, tokens: torch.Tensor, starts: torch.Tensor, lengths: torch.Tensor, cache: KVCache, cross: CrossKV
    ) -> torch.Tensor:
        """:meth:`decode_ragged` in static shapes, from device tensors, with no host synchronisation: row ``r``
        feeds its first ``lengths[r]`` of ``tokens`` ``[batch, T]`` at positions ``starts[r]..`` of its cache row
        (a :meth:`new_static_cache`), and every query attends over the cache's whole length under a mask, so one
        shape serves every step (and a CUDA graph can replay it). Returns hidden states ``[batch, T, d_model]``.

        Padding (the tokens past a row's length) is written where no real query looks: at its own position (past
        the row's last real token, and overwritten by the row's next real token there before anything attends to
        it), or past the context into the scratch positions (``T`` of them needed). The caller keeps every row
        within the context."""
        batch, width = tokens.shape
        context = cache.context
        device = self.decoder_device
        offsets = torch.arange(width, device=device).view(1, -1)
        positions = starts.view(-1, 1) + offsets
        padding = offsets >= lengths.view(-1, 1)
        slots = torch.where(padding & (positions >= context), context + offsets, positions)
        embed_at = positions.clamp(max=context - 1)
        cols = torch.arange(cache.keys[0].shape[2], device=device).view(1, 1, -1)
        mask = ((cols <= positions.unsqueeze(-1)) & (cols < context)).unsqueeze(1)  # [batch, 1, T, length]
        rows = torch.arange(batch, device=device).view(-1, 1)

        def write(index: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            cache.keys[index][rows, :, slots] = keys.transpose(1, 2)
            cache.values[index][rows, :, slots] = values.transpose(1, 2)
            return cache.keys[index], cache.values[index]

        hidden, _ = self._forward(tokens, embed_at, write, mask, cross, ())
        return hidden

    def _forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        write: Callable[[int, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
        mask: torch.Tensor | None,
        cross: CrossKV,
        qk_heads: tuple[tuple[int, int], ...],
    ) -> tuple[torch.Tensor, dict[tuple[int, int], torch.Tensor]]:
        """The decoder layers over ``tokens`` at ``positions``; ``write`` stores each layer's new keys/values and
        returns the keys/values to attend to. Returns the final (normalised) hidden states."""
        batch, count = tokens.shape
        dec = self.decoder
        tokens = tokens.to(self.decoder_device)
        x = (dec.embed_tokens(tokens) + dec.embed_positions.weight[positions]).to(self.decoder_dtype)
        qks: dict[tuple[int, int], torch.Tensor] = {}
        cross_mask = cross.mask()  # rows encoded over shorter spans than the longest: their padding hidden
        with attention_backends(self.decoder_device):
            for index, layer in enumerate(dec.layers):
                h = layer.self_attn_layer_norm(x)
                sa = layer.self_attn
                if hasattr(sa, "qkv"):  # an INT8 decoder's fused input projections (streamer.engine.rowwise)
                    q, k, v = (self._heads(part, batch) for part in sa.qkv(h).split(self.d_model, dim=-1))
                else:
                    q, k, v = (
                        self._heads(sa.q_proj(h), batch),
                        self._heads(sa.k_proj(h), batch),
                        self._heads(sa.v_proj(h), batch),
                    )
                keys, values = write(index, k, v)
                a = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
                x = x + sa.out_proj(a.transpose(1, 2).reshape(batch, count, self.d_model))
                h = layer.encoder_attn_layer_norm(x)
                ca = layer.encoder_attn
                q = self._heads(ca.q_proj(h), batch)
                ck, cv = cross.keys[index], cross.values[index]
                heads = [head for layer, head in qk_heads if layer == index]
                if heads:  # only the heads asked for, in float32 (the alignment heads: a few of all heads)
                    chosen = torch.tensor(heads, device=q.device)
                    scores = q[:, chosen].float() @ ck[:, chosen].float().transpose(-1, -2) * self.head_dim**-0.5
                    qks.update({(index, head): scores[:, slot] for slot, head in enumerate(heads)})
                a = F.scaled_dot_product_attention(q, ck, cv, attn_mask=cross_mask)
                x = x + ca.out_proj(a.transpose(1, 2).reshape(batch, count, self.d_model))
                h = layer.final_layer_norm(x)
                x = x + layer.fc2(F.gelu(layer.fc1(h)))
        return dec.layer_norm(x), qks


def _pack_all(weights: list[Int8Weight]) -> None:
    for weight in weights:
        weight.pack()
