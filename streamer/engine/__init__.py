"""The engine package: everything that touches torch lives here, behind :class:`~streamer.engine.types.Engine`.

Import :func:`load_engine` lazily-safe: this module imports no torch until it is called.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from streamer.engine.types import (
    DecodeOptions,
    DecodeRequest,
    DecodeResult,
    Engine,
    EngineInfo,
    SegmentResult,
    StreamId,
    Task,
    WordTiming,
)
from streamer.errors import ConfigError

if TYPE_CHECKING:
    from streamer.engine.whisper import WhisperEngine

__all__ = [
    "CONFIGS",
    "DecodeOptions",
    "DecodeRequest",
    "DecodeResult",
    "Engine",
    "EngineInfo",
    "EngineOptions",
    "SegmentResult",
    "StreamId",
    "Task",
    "WordTiming",
    "cpu_has_native_bf16",
    "cuda_available",
    "default_encoder_precision",
    "gpu_memory_allocated",
    "load_engine",
]

PRECISIONS = ("fp32", "fp16", "bf16", "int8")


@dataclass(frozen=True)
class EngineOptions:
    """Per-component precision and placement. ``None`` picks the default for the machine: without CUDA the encoder
    in bf16 where the CPU has native bf16, else INT8, and an FP32 decoder, on the CPU; with CUDA, FP16 for both on
    the GPU (see :func:`default_encoder_precision`)."""

    # encoder precision: fp32, fp16, bf16 or int8 (int8 on the CPU only)
    encoder_precision: str | None = None
    # encoder device: cpu or cuda
    encoder_device: str | None = None
    # decoder precision: fp32, fp16, bf16 or int8 (int8 on the CPU only)
    decoder_precision: str | None = None
    # decoder device: cpu or cuda
    decoder_device: str | None = None
    # torch intra-op threads (None leaves torch's default: one per core)
    threads: int | None = None
    # run one short window at load so the first request pays no start-up cost
    warmup: bool = True
    # verify each stream's previous hypothesis as a draft in one pass (same output as plain greedy, fewer passes)
    draft_decoding: bool = True
    # reuse the log-mel frames a stream's previous window already computed (same features, less work)
    incremental_features: bool = True
    # vocabulary projection: int8 or fp32; None is int8 for a float decoder on the CPU, else the decoder's precision
    projection_precision: str | None = None

    def validate(self) -> None:
        for name in ("encoder_precision", "decoder_precision"):
            value = getattr(self, name)
            if value is not None and value not in PRECISIONS:
                raise ConfigError(f"{name.replace('_', ' ')} must be one of {', '.join(PRECISIONS)}, not {value!r}")
        if self.projection_precision not in (None, "int8", "fp32"):
            raise ConfigError(f"projection precision must be int8 or fp32, not {self.projection_precision!r}")
        for name in ("encoder_device", "decoder_device"):
            value = getattr(self, name)
            if value is not None and not (value == "cpu" or value.startswith("cuda")):
                raise ConfigError(f"{name.replace('_', ' ')} must be 'cpu' or 'cuda', not {value!r}")
        if self.threads is not None and self.threads < 1:
            raise ConfigError("threads must be at least 1")


# Named configurations for `streamer eval --config` and the benchmarks (the seed experiment's table).
CONFIGS: dict[str, EngineOptions] = {
    "default": EngineOptions(),  # the machine's defaults (see EngineOptions)
    "fp32": EngineOptions("fp32", "cpu", "fp32", "cpu", projection_precision="fp32"),  # float32 throughout
} | {
    name: EngineOptions(encoder_precision=ep, encoder_device=ed, decoder_precision=dp, decoder_device=dd)
    for name, (ep, ed, dp, dd) in {
        "int8-encoder": ("int8", "cpu", "fp32", "cpu"),
        "bf16-encoder": ("bf16", "cpu", "fp32", "cpu"),
        "int8": ("int8", "cpu", "int8", "cpu"),
        "bf16": ("bf16", "cpu", "bf16", "cpu"),
        "fp16-decoder": ("fp32", "cpu", "fp16", "cuda"),
        "int8-encoder+fp16-decoder": ("int8", "cpu", "fp16", "cuda"),
        "fp16": ("fp16", "cuda", "fp16", "cuda"),
    }.items()
}


def cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (AMX tiles or AVX512-BF16), where oneDNN runs bf16 GEMMs
    several times faster than fp32; without it bf16 is emulated and slower."""
    import torch

    cpu = torch.cpu
    checks = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    return any(bool(getattr(cpu, name)()) for name in checks if hasattr(cpu, name))


def default_encoder_precision(cuda: bool) -> str:
    """fp16 on a GPU. On a CPU, bf16 where the CPU has native bf16 (measured on 66 LibriSpeech utterances, tiny.en,
    greedy, on an AMX Xeon: fp32 8.94% WER, INT8 encoder 9.26%, bf16 encoder 8.78% at about half the INT8
    encoder's time), else the INT8 encoder (dynamic quantization, per-channel weight scales)."""
    if cuda:
        return "fp16"
    return "bf16" if cpu_has_native_bf16() else "int8"


def gpu_memory_allocated() -> int | None:
    """Bytes of GPU memory held by tensors on every CUDA device, or None when no engine uses a GPU.

    Cheap enough for every ``GET /metrics``: it never imports torch itself (an engine that uses the GPU already
    has), and never initialises CUDA (a CPU engine must not pay for a CUDA context).
    """
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    return sum(int(torch.cuda.memory_allocated(device)) for device in range(torch.cuda.device_count()))


def load_engine(model: str = "tiny.en", options: EngineOptions | None = None) -> WhisperEngine:
    """Resolve, convert (once, cached), load and warm up ``model``. Blocks for seconds; call before serving."""
    options = options or EngineOptions()
    options.validate()
    from streamer.engine.memory import configure_malloc
    from streamer.engine.models import prepare
    from streamer.engine.runtime import Placement, Precision

    configure_malloc()
    from streamer.engine.whisper import WhisperEngine

    files = prepare(model)
    cuda = cuda_available()
    default_device = "cuda" if cuda else "cpu"
    default_enc = default_encoder_precision(cuda)
    # fp32 on the CPU even where bf16 is native: a bf16 decoder is faster at the same WER, but rounds a batched
    # pass differently from single steps, so draft-verified decoding would no longer equal plain greedy decoding
    default_dec = "fp16" if cuda else "fp32"
    encoder = Placement(Precision(options.encoder_precision or default_enc), options.encoder_device or default_device)
    decoder = Placement(Precision(options.decoder_precision or default_dec), options.decoder_device or default_device)
    engine = WhisperEngine(
        files,
        encoder,
        decoder,
        threads=options.threads,
        draft_decoding=options.draft_decoding,
        incremental_features=options.incremental_features,
        projection=None if options.projection_precision is None else Precision(options.projection_precision),
    )
    if options.warmup:
        engine.warmup()
    return engine
