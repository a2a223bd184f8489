"""The Whisper network as plain torch modules, loaded straight from a transformers-format directory.

The parameter names are transformers' (``encoder.layers.0.self_attn.q_proj.weight`` ...), so its checkpoints load
as they are, but nothing here imports transformers: a serving process does not pay for that library's import
(about 115 MB of resident memory) nor for its generic code paths. The encoder's forward is ours too, fusing the
first feed-forward projection with its GELU on the CPU (oneDNN) where the weights are float. The decoder's forward
lives in :mod:`streamer.engine.runtime`, which owns the KV cache; this module only holds its weights.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from streamer.errors import ModelFilesError

__all__ = ["Decoder", "Encoder", "NetworkConfig", "Whisper", "load_network"]


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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Bidirectional self-attention over ``x`` ``[batch, time, dim]`` (the encoder's)."""
        batch, time, dim = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, time, self.heads, dim // self.heads).transpose(1, 2)

        out = F.scaled_dot_product_attention(heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x)))
        projected: torch.Tensor = self.out_proj(out.transpose(1, 2).reshape(batch, time, dim))
        return projected


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


class Encoder(nn.Module):
    """Log-mel features ``[batch, n_mels, 3000]`` to states ``[batch, 1500, d_model]``."""

    def __init__(self, config: NetworkConfig) -> None:
        super().__init__()
        dim = config.d_model
        self.conv1 = nn.Conv1d(config.num_mel_bins, dim, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(dim, dim, kernel_size=3, stride=2, padding=1)
        self.embed_positions = nn.Embedding(config.max_source_positions, dim)
        self.layers = nn.ModuleList(
            EncoderLayer(dim, config.encoder_attention_heads, config.encoder_ffn_dim)
            for _ in range(config.encoder_layers)
        )
        self.layer_norm = nn.LayerNorm(dim)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        x = F.gelu(self.conv1(features))
        x = F.gelu(self.conv2(x)).permute(0, 2, 1)
        if x.shape[1] != self.embed_positions.weight.shape[0]:
            raise ValueError(f"the encoder takes {2 * self.embed_positions.weight.shape[0]} feature frames")
        x = x + self.embed_positions.weight
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


class Decoder(nn.Module):
    """The decoder's weights; :class:`~streamer.engine.runtime.WhisperRuntime` runs them with its KV cache."""

    def __init__(self, config: NetworkConfig) -> None:
        super().__init__()
        dim = config.d_model
        self.embed_tokens = nn.Embedding(config.vocab_size, dim)
        self.embed_positions = nn.Embedding(config.max_target_positions, dim)
        self.layers = nn.ModuleList(
            DecoderLayer(dim, config.decoder_attention_heads, config.decoder_ffn_dim)
            for _ in range(config.decoder_layers)
        )
        self.layer_norm = nn.LayerNorm(dim)


class Whisper(nn.Module):
    def __init__(self, config: NetworkConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)


def _read_weights(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint in ``directory``: model.safetensors (or its shards), else pytorch_model.bin."""
    from safetensors.torch import load_file

    single = directory / "model.safetensors"
    index = directory / "model.safetensors.index.json"
    try:
        if single.is_file():
            return load_file(str(single))
        if index.is_file():
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
            weights: dict[str, torch.Tensor] = {}
            for shard in shards:
                weights.update(load_file(str(directory / shard)))
            return weights
        legacy = directory / "pytorch_model.bin"
        if legacy.is_file():
            loaded: dict[str, torch.Tensor] = torch.load(legacy, map_location="cpu", weights_only=True)
            return loaded
    except Exception as error:
        raise ModelFilesError(f"cannot read the weights in {directory}: {error}") from None
    raise ModelFilesError(f"{directory} has no model.safetensors, model.safetensors.index.json or pytorch_model.bin")


def load_network(directory: Path) -> Whisper:
    """The network in the transformers-format ``directory``, in float32 on the CPU, weights owned by the process
    (not memory-mapped). Raises :class:`~streamer.errors.ModelFilesError` for missing or mismatched files."""
    config = NetworkConfig.read(directory / "config.json")
    with torch.device("meta"):
        network = Whisper(config)
    state = {}
    for name, tensor in _read_weights(directory).items():
        key = name.removeprefix("model.")
        if key == "proj_out.weight":  # tied to decoder.embed_tokens.weight
            continue
        state[key] = tensor.to(torch.float32)
    try:
        network.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as error:
        raise ModelFilesError(f"the weights in {directory} do not fit config.json: {error}") from None
    return network.eval()
