"""The Whisper network as plain torch modules, loaded straight from a transformers-format directory.

The parameter names are transformers' (``encoder.layers.0.self_attn.q_proj.weight`` ...), so its checkpoints load
as they are, but nothing here imports transformers: a serving process does not pay for that library's import
(about 115 MB of resident memory) nor for its generic code paths. The encoder's forward is ours too, fusing the
first feed-forward projection with its GELU on the CPU (oneDNN) where the weights are float. The decoder's forward
lives in :mod:`streamer.engine.runtime`, which owns the KV cache; this module only holds its weights.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from streamer.core.errors import ModelFilesError

__all__ = ["AudioEncoder", "NetworkConfig", "TextDecoder", "Whisper", "blocked_attention", "load_network"]


@dataclass(frozen=True)
class NetworkConfig:
    """The shape of a Whisper network, from a transformers ``config.json``."""

    vocab_size: int
    num_mel_bins: int
    d_model: int
    encoder_layers: int
    decoder_layers: int
    encoder_attention_heads: int
    decoder_attention_heads: int
    encoder_ffn_dim: int
    decoder_ffn_dim: int
    max_source_positions: int
    max_target_positions: int

    @classmethod
    def read(cls, path: Path) -> NetworkConfig:
        try:
            raw: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise ModelFilesError(f"cannot read {path}: {error}") from None
        if raw.get("model_type") != "whisper":
            raise ModelFilesError(f"{path} describes a {raw.get('model_type')!r} model, not a Whisper model")
        if raw.get("activation_function", "gelu") != "gelu" or raw.get("scale_embedding", False):
            raise ModelFilesError(f"{path}: only Whisper's own architecture (GELU, unscaled embeddings) is supported")
        try:
            return cls(**{name: int(raw[name]) for name in cls.__dataclass_fields__})
        except (KeyError, TypeError, ValueError) as error:
            raise ModelFilesError(f"{path} lacks a valid {error} entry") from None


class Attention(nn.Module):
    """Multi-head attention's four projections (transformers' ``WhisperAttention`` names); ``k_proj`` has no bias."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim, bias=False)
        self.v_proj = nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)
        # None: torch's scaled-dot-product attention; else blocked_attention over this many queries at a time (the
        # runtime chooses: streamer.engine.runtime.encoder_attention_block)
        self.query_block: int | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Bidirectional self-attention over ``x`` ``[batch, time, dim]`` (the encoder's)."""
        batch, time, dim = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, time, self.heads, dim // self.heads).transpose(1, 2)

        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        if self.query_block is None:
            out = F.scaled_dot_product_attention(q, k, v)
        else:
            out = blocked_attention(q, k, v, self.query_block)
        projected: torch.Tensor = self.out_proj(out.transpose(1, 2).reshape(batch, time, dim))
        return projected


def blocked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block: int) -> torch.Tensor:
    """``softmax(q kᵀ / √d) v`` for ``[batch, heads, time, d]`` tensors, ``block`` queries at a time, as plain
    matrix products and a softmax: what :func:`torch.nn.functional.scaled_dot_product_attention` computes, with
    the scores rounded to the inputs' precision before the softmax (which accumulates in float32), as transformers'
    eager attention does. Memory: one block's scores, ``batch x heads x block x keys``.

    Why: on a CPU with AVX512-BF16 and no AMX, torch's fused CPU kernel ran bf16 no faster than float32 (6.7 ms for
    one encoder layer's attention over 860 frames, tiny.en's 6 heads, 2 cores), while oneDNN's bf16 products here
    take 2.9 ms (streamer.engine.runtime.CPU_BF16_ATTENTION_BLOCK has the measurements)."""
    if block < 1:
        raise ValueError("block must be >= 1")
    out = torch.empty_like(q)
    keys = k.transpose(-1, -2)
    scale = q.shape[-1] ** -0.5
    for start in range(0, q.shape[-2], block):
        scores = torch.matmul(q[:, :, start : start + block] * scale, keys)
        torch.matmul(scores.softmax(-1), v, out=out[:, :, start : start + block])
    return out


def _fused_linear_gelu() -> Any | None:
    ops = getattr(torch.ops, "mkldnn", None)
    available = bool(torch.backends.mkldnn.is_available())  # type: ignore[no-untyped-call]
    return getattr(ops, "_linear_pointwise", None) if ops is not None and available else None


_LINEAR_GELU = _fused_linear_gelu()


def linear_gelu(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``gelu(layer(x))``: one oneDNN kernel on the CPU for a float ``nn.Linear`` (the bias add, the exact-erf GELU
    and the product fused, about a third less time than two kernels), else the two steps (INT8, CUDA)."""
    weight = getattr(layer, "weight", None)
    fusable = (
        _LINEAR_GELU is not None
        and type(layer) is nn.Linear
        and isinstance(weight, torch.Tensor)
        and x.device.type == "cpu"
        and x.dtype in (torch.float32, torch.bfloat16)
        and x.dtype == weight.dtype
    )
    if not fusable or _LINEAR_GELU is None:
        return F.gelu(layer(x))
    flat = x.reshape(-1, x.shape[-1])
    out: torch.Tensor = _LINEAR_GELU(flat, layer.weight, layer.bias, "gelu", [], "none")
    return out.view(*x.shape[:-1], out.shape[-1])


def _embedding(count: int, dim: int) -> nn.Embedding:
    """An embedding table whose weights the checkpoint supplies, left uninitialised: ``nn.Embedding``'s own
    ``normal_`` initialisation, run on the meta device where :func:`load_network` builds the network, imports sympy
    for torch's symbolic shapes, which stays resident: about 67 MB measured."""
    return nn.Embedding(count, dim, _weight=torch.empty(count, dim))


class EncoderLayer(nn.Module):
    def __init__(self, dim: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.self_attn = Attention(dim, heads)
        self.self_attn_layer_norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, ffn)
        self.fc2 = nn.Linear(ffn, dim)
        self.final_layer_norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.self_attn_layer_norm(x))
        x = x + self.fc2(linear_gelu(self.fc1, self.final_layer_norm(x)))
        if x.dtype == torch.float16:  # as transformers does: keep fp16 activations finite
            limit = torch.finfo(torch.float16).max - 1000
            x = x.clamp(-limit, limit)
        return x


class AudioEncoder(nn.Module):
    """Log-mel features ``[batch, n_mels, frames]`` to states ``[batch, frames / 2, d_model]``: Whisper's 3000
    frames (30 s), or the first frames of them (see :func:`~streamer.engine.features.encoder_frames`)."""

    def __init__(self, config: NetworkConfig) -> None:
        super().__init__()
        dim = config.d_model
        self.conv1 = nn.Conv1d(config.num_mel_bins, dim, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(dim, dim, kernel_size=3, stride=2, padding=1)
        self.embed_positions = _embedding(config.max_source_positions, dim)
        self.layers = nn.ModuleList(
            EncoderLayer(dim, config.encoder_attention_heads, config.encoder_ffn_dim)
            for _ in range(config.encoder_layers)
        )
        self.layer_norm = nn.LayerNorm(dim)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        x = F.gelu(self.conv1(features))
        x = F.gelu(self.conv2(x)).permute(0, 2, 1)
        positions = self.embed_positions.weight.shape[0]
        if features.shape[-1] % 2 or x.shape[1] > positions:
            raise ValueError(f"the encoder takes an even number of feature frames, at most {2 * positions}")
        x = x + self.embed_positions.weight[: x.shape[1]]
        for layer in self.layers:
            x = layer(x)
        states: torch.Tensor = self.layer_norm(x)
        return states


class DecoderLayer(nn.Module):
    def __init__(self, dim: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.self_attn = Attention(dim, heads)
        self.self_attn_layer_norm = nn.LayerNorm(dim)
        self.encoder_attn = Attention(dim, heads)
        self.encoder_attn_layer_norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, ffn)
        self.fc2 = nn.Linear(ffn, dim)
        self.final_layer_norm = nn.LayerNorm(dim)


class TextDecoder(nn.Module):
    """The decoder's weights; :class:`~streamer.engine.runtime.WhisperRuntime` runs them with its KV cache."""

    def __init__(self, config: NetworkConfig) -> None:
        super().__init__()
        dim = config.d_model
        self.embed_tokens = _embedding(config.vocab_size, dim)
        self.embed_positions = _embedding(config.max_target_positions, dim)
        self.layers = nn.ModuleList(
            DecoderLayer(dim, config.decoder_attention_heads, config.decoder_ffn_dim)
            for _ in range(config.decoder_layers)
        )
        self.layer_norm = nn.LayerNorm(dim)


class Whisper(nn.Module):
    def __init__(self, config: NetworkConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = AudioEncoder(config)
        self.decoder = TextDecoder(config)


# safetensors dtype names (https://github.com/huggingface/safetensors, "Format") to torch dtypes
_SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


def _read_safetensors(path: Path, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file, read straight into tensors the process owns, floats converted to
    ``dtype``.

    Not ``safetensors.torch.load_file``: it memory-maps the file, and a loader that then copies (or converts) each
    tensor has the whole file resident on top of its own copy at the peak, and the file's pages stay counted in
    the process's resident size for as long as any tensor still points into the map. Reading tensor by tensor
    with ``readinto`` holds one copy, plus one tensor in flight when ``dtype`` differs from the file's.
    """
    with path.open("rb") as file:
        (size,) = struct.unpack("<Q", file.read(8))
        header: dict[str, Any] = json.loads(file.read(size))
        header.pop("__metadata__", None)
        base = 8 + size
        tensors: dict[str, torch.Tensor] = {}
        for name, entry in sorted(header.items(), key=lambda item: int(item[1]["data_offsets"][0])):
            stored = _SAFETENSORS_DTYPES[entry["dtype"]]
            start, end = (int(offset) for offset in entry["data_offsets"])
            tensor = torch.empty([int(n) for n in entry["shape"]], dtype=stored)
            view = tensor.view(-1).view(torch.uint8).numpy().data if tensor.numel() else memoryview(bytearray())
            if view.nbytes != end - start:
                raise ValueError(f"{name}: {end - start} bytes for a {list(tensor.shape)} {entry['dtype']} tensor")
            file.seek(base + start)
            if view.nbytes and file.readinto(view) != view.nbytes:
                raise ValueError(f"{name}: the file ends inside the tensor")
            tensors[name] = tensor.to(dtype) if tensor.is_floating_point() else tensor
        return tensors


def _read_weights(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint in ``directory``, floats in float32, owned by the process (not memory-mapped):
    model.safetensors (or its shards), else pytorch_model.bin."""
    single = directory / "model.safetensors"
    index = directory / "model.safetensors.index.json"
    try:
        if single.is_file():
            return _read_safetensors(single, torch.float32)
        if index.is_file():
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
            weights: dict[str, torch.Tensor] = {}
            for shard in shards:
                weights.update(_read_safetensors(directory / shard, torch.float32))
            return weights
        legacy = directory / "pytorch_model.bin"
        if legacy.is_file():
            loaded: dict[str, torch.Tensor] = torch.load(legacy, map_location="cpu", weights_only=True)
            return {name: t.float() if t.is_floating_point() else t for name, t in loaded.items()}
    except Exception as error:
        raise ModelFilesError(f"cannot read the weights in {directory}: {error}") from None
    raise ModelFilesError(f"{directory} has no model.safetensors, model.safetensors.index.json or pytorch_model.bin")


def load_network(directory: Path) -> Whisper:
    """The network in the transformers-format ``directory``, in float32 on the CPU, weights owned by the process
    (not memory-mapped). Raises :class:`~streamer.core.errors.ModelFilesError` for missing or mismatched files."""
    config = NetworkConfig.read(directory / "config.json")
    with torch.device("meta"):
        network = Whisper(config)
    state = {}
    for name, tensor in _read_weights(directory).items():
        key = name.removeprefix("model.")
        if key == "proj_out.weight":  # tied to decoder.embed_tokens.weight
            continue
        state[key] = tensor
    try:
        network.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as error:
        raise ModelFilesError(f"the weights in {directory} do not fit config.json: {error}") from None
    return network.eval()
