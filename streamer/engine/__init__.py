"""The engine package: everything that touches torch lives here, behind :class:`~streamer.engine.types.Engine`.

Import :func:`load_engine` lazily-safe: this module imports no torch until it is called.
"""

from __future__ import annotations

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
    "cuda_available",
    "load_engine",
]

PRECISIONS = ("fp32", "fp16", "bf16", "int8")


@dataclass(frozen=True)
class EngineOptions:
    """Per-component precision and placement. ``None`` picks the default for the machine: without CUDA an INT8
    encoder and an FP32 decoder on the CPU; with CUDA, FP16 for both on the GPU."""

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

    def validate(self) -> None:
        for name in ("encoder_precision", "decoder_precision"):
            value = getattr(self, name)
            if value is not None and value not in PRECISIONS:
                raise ConfigError(f"{name.replace('_', ' ')} must be one of {', '.join(PRECISIONS)}, not {value!r}")
        for name in ("encoder_device", "decoder_device"):
            value = getattr(self, name)
            if value is not None and not (value == "cpu" or value.startswith("cuda")):
                raise ConfigError(f"{name.replace('_', ' ')} must be 'cpu' or 'cuda', not {value!r}")
        if self.threads is not None and self.threads < 1:
            raise ConfigError("threads must be at least 1")


# Named configurations for `streamer eval --config` and the benchmarks (the seed experiment's table).
CONFIGS: dict[str, EngineOptions] = {
    name: EngineOptions(encoder_precision=ep, encoder_device=ed, decoder_precision=dp, decoder_device=dd)
    for name, (ep, ed, dp, dd) in {
        "fp32": ("fp32", "cpu", "fp32", "cpu"),
        "int8-encoder": ("int8", "cpu", "fp32", "cpu"),
        "int8": ("int8", "cpu", "int8", "cpu"),
        "fp16-decoder": ("fp32", "cpu", "fp16", "cuda"),
        "int8-encoder+fp16-decoder": ("int8", "cpu", "fp16", "cuda"),
        "fp16": ("fp16", "cuda", "fp16", "cuda"),
    }.items()
}


def cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def load_engine(model: str = "tiny.en", options: EngineOptions | None = None) -> WhisperEngine:
    """Resolve, convert (once, cached), load and warm up ``model``. Blocks for seconds; call before serving."""
    options = options or EngineOptions()
    options.validate()
    from streamer.engine.models import prepare
    from streamer.engine.runtime import Placement, Precision
    from streamer.engine.whisper import WhisperEngine

    files = prepare(model)
    cuda = cuda_available()
    default_device = "cuda" if cuda else "cpu"
    default_enc = "fp16" if cuda else "int8"
    default_dec = "fp16" if cuda else "fp32"
    encoder = Placement(Precision(options.encoder_precision or default_enc), options.encoder_device or default_device)
    decoder = Placement(Precision(options.decoder_precision or default_dec), options.decoder_device or default_device)
    engine = WhisperEngine(files, encoder, decoder, threads=options.threads, draft_decoding=options.draft_decoding)
    if options.warmup:
        engine.warmup()
    return engine
