"""The INT8 decoder's layers: each position's output depends on that position alone, follows the float product,
is the same on every kernel (issue 38: AVX2's INT8 GEMM clips), and survives the weight cache (the decoder's
accuracy: tests/engine/test_whisper.py, on the accuracy set)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from streamer.engine import rowwise
from streamer.engine.models import prepare
from streamer.engine.network import NetworkConfig, Whisper, load_network
from streamer.engine.rowwise import (
    RowwiseInt8Linear,
    _int8_product,
    fuse_self_attention,
    quantize_rowwise,
    rowwise_skeleton,
)
from streamer.engine.weights import restore, tensors_of


@pytest.fixture(scope="module")
def fc1() -> nn.Linear:
    """tiny.en's real first FFN layer of the first decoder layer."""
    return load_network(prepare("tiny.en").directory).decoder.layers[0].fc1


@pytest.fixture(params=["kernels", "split"])
def product(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test twice: with the product these kernels get, and with the split one that AVX2's kernels get (forced
    here, so that any machine checks it)."""
    if request.param == "split":
        monkeypatch.setattr(rowwise, "int8_products_exact", lambda: False)
    return str(request.param)


def _inputs(rows: int, width: int = 384, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, width, generator=generator)
    x[::3] *= 40  # rows of very different magnitudes in one call
    x[1, 7] = 300.0  # an outlier in one position only
    return x


def test_a_positions_output_does_not_depend_on_what_is_multiplied_with_it(fc1: nn.Linear, product: str) -> None:
    layer = RowwiseInt8Linear.from_linear(fc1)
    x = _inputs(40)
    together = layer(x)
    for row in (0, 1, 2, 17, 39):
        assert torch.equal(layer(x[row : row + 1])[0], together[row])  # bit for bit
    assert torch.equal(layer(x[5:9].view(2, 2, 384)).view(4, -1), together[5:9])


@pytest.mark.kernels
def test_the_int8_product_follows_the_float_one(fc1: nn.Linear, product: str) -> None:
    layer = RowwiseInt8Linear.from_linear(fc1)
    x = _inputs(64, seed=1)
    exact = fc1(x).detach()
    approx = layer(x)
    assert approx.shape == exact.shape and approx.dtype == torch.float32
    error = (approx - exact).norm(dim=1) / exact.norm(dim=1)
    others = torch.cat([error[:1], error[2:]])
    assert float(others.max()) < 0.02  # within 2 % of the float product for every position...
    assert float(error[1]) < 0.06  # ... but the one whose outlier coarsens the scale of its own values alone


@pytest.mark.kernels
def test_the_int8_product_is_exact_where_vpmaddubsw_would_clip(product: str) -> None:
    """Every pair of products at (127 + 128) * 127, twice int16's range: without VNNI a plain ``torch._int_mm``
    clips each pair at 32,767 (issue 38), which would leave the first two rows near half their value."""
    signs = torch.ones(4, 384)
    signs[1] = -1
    signs[2, ::2] = -1
    signs[3, ::3] = -1
    layer = RowwiseInt8Linear.from_float(signs, None)  # rows of 127 and -127
    out = layer(signs)  # every position's largest magnitude maps to 127 too
    expected = signs @ signs.T  # small integers, exact in float
    assert torch.allclose(out, expected, rtol=1e-5, atol=1e-4)


@pytest.mark.kernels
def test_the_int32_sums_are_the_same_on_every_kernel(product: str) -> None:
    generator = torch.Generator().manual_seed(4)
    x = torch.randint(-127, 128, (7, 1536), generator=generator, dtype=torch.int8)
    weight = torch.randint(-127, 128, (384, 1536), generator=generator, dtype=torch.int8)
    x[0], weight[0] = 127, 127  # at the extremes as well
    x[1], weight[1] = -127, -127
    assert torch.equal(_int8_product(x, weight), x.int() @ weight.int().T)  # ATen's int32 matmul: a plain loop


def test_a_zero_position_gives_the_bias(fc1: nn.Linear) -> None:
    layer = RowwiseInt8Linear.from_linear(fc1)
    out = layer(torch.zeros(2, 384))
    assert layer.bias is not None and torch.equal(out, layer.bias.expand(2, -1))


def test_stacked_layers_compute_each_layers_output(fc1: nn.Linear) -> None:
    first = RowwiseInt8Linear.from_linear(fc1)
    second = RowwiseInt8Linear.from_float(fc1.weight[:384] * 0.5, None)  # no bias: zeros in the stack
    stacked = RowwiseInt8Linear.stacked([first, second])
    x = _inputs(5, seed=2)
    ours = stacked(x)
    assert torch.equal(ours[:, :1536], first(x)) and torch.equal(ours[:, 1536:], second(x))
    with pytest.raises(ValueError, match="same input width"):
        RowwiseInt8Linear.stacked([first, RowwiseInt8Linear.from_float(torch.ones(3, 5), None)])


def test_a_quantized_decoder_restored_into_its_skeleton_computes_the_same() -> None:
    files = prepare("tiny.en")
    built = quantize_rowwise(load_network(files.directory).decoder)
    fuse_self_attention(built)
    assert not any(type(module) is nn.Linear for module in built.modules())
    assert all(not hasattr(layer.self_attn, "q_proj") for layer in built.layers)
    with torch.device("meta"):
        skeleton = rowwise_skeleton(Whisper(NetworkConfig.read(files.directory / "config.json")).decoder)
    fuse_self_attention(skeleton)
    restore(skeleton, "decoder", tensors_of(built, "decoder"))
    for name in ("layers.1.self_attn.qkv", "layers.3.encoder_attn.out_proj", "layers.3.fc2"):
        ours, theirs = skeleton.get_submodule(name), built.get_submodule(name)
        x = _inputs(3, width=ours.in_features, seed=3)
        assert torch.equal(ours(x), theirs(x))
