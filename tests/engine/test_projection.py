from __future__ import annotations

import threading

import pytest
import torch

from streamer.core.errors import ConfigError
from streamer.engine import CONFIGS, EngineOptions, load_engine
from streamer.engine.models import prepare
from streamer.engine.network import load_network
from streamer.engine.projection import HalfEmbedding, Int8Projection


@pytest.fixture(scope="module")
def embedding() -> torch.Tensor:
    """tiny.en's real token embedding (the tied projection matrix)."""
    return load_network(prepare("tiny.en").directory).decoder.embed_tokens.weight.detach()


@pytest.fixture(scope="module")
def projection(embedding: torch.Tensor) -> Int8Projection:
    return Int8Projection(embedding)


def _hidden(rows: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(rows, 384, generator=generator)
    hidden[::3] *= 7  # rows of very different magnitudes in one call
    return hidden


def test_a_positions_logits_do_not_depend_on_what_is_projected_with_it(projection: Int8Projection) -> None:
    hidden = _hidden(40)
    together = projection(hidden)
    for row in (0, 1, 17, 39):
        alone = projection(hidden[row : row + 1])
        assert torch.equal(alone[0], together[row])  # bit for bit: draft verification stays plain greedy
    assert torch.equal(projection(hidden[5:9].view(2, 2, 384)).view(4, -1), together[5:9])


def test_int8_logits_follow_the_float_product(projection: Int8Projection, embedding: torch.Tensor) -> None:
    hidden = _hidden(64, seed=1)
    exact = hidden @ embedding.t()
    approx = projection(hidden)
    assert approx.shape == exact.shape and approx.dtype == torch.float32
    # random states are a hard case (real ones point at a few tokens, with a far wider spread of logits)
    centred = [t - t.mean(dim=1, keepdim=True) for t in (approx, exact)]
    assert float(torch.nn.functional.cosine_similarity(*centred, dim=1).min()) > 0.99
    top = exact.topk(5, dim=1).indices
    assert bool((approx.argmax(dim=1).view(-1, 1) == top).any(dim=1).all())  # the best is always among the top 5


def test_a_zero_hidden_state_projects_to_zero_logits(projection: Int8Projection) -> None:
    logits = projection(torch.zeros(2, 384))
    assert bool(torch.isfinite(logits).all()) and float(logits.abs().max()) == 0.0


def _skeleton() -> Int8Projection:
    return Int8Projection(torch.empty(51864, 384, device="meta"))


def test_a_matrix_packed_in_the_background_projects_as_one_packed_at_once(projection: Int8Projection) -> None:
    later = _skeleton()
    started = threading.Event()
    release = threading.Event()
    set_weight_bias = later.linear.set_weight_bias

    def slow(weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        started.set()
        release.wait()
        set_weight_bias(weight, bias)

    later.linear.set_weight_bias = slow
    later.pack_in_background(projection.linear.weight())
    assert started.wait(60) and later.packing  # still packing: the caller went on meanwhile
    hidden = _hidden(12, seed=2)
    release.set()
    assert torch.equal(later(hidden), projection(hidden))  # the first product waited for the packing
    assert not later.packing


def test_a_packing_that_fails_fails_every_product_and_a_misfit_at_once(projection: Int8Projection) -> None:
    later = _skeleton()

    def broken(weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        raise RuntimeError("fbgemm refused")

    later.linear.set_weight_bias = broken
    later.pack_in_background(projection.linear.weight())
    for _ in range(2):  # never the placeholder's logits
        with pytest.raises(RuntimeError, match="fbgemm refused"):
            later(torch.ones(1, 384))
    with pytest.raises(ValueError, match="qint8 weight"):
        _skeleton().pack_in_background(projection.linear.weight()[:100])


def test_the_half_embedding_looks_up_the_float16_rows(embedding: torch.Tensor) -> None:
    lookup = HalfEmbedding(embedding)
    tokens = torch.tensor([[0, 50256, 13], [440, 1, 2]])
    expected = embedding.half().float()[tokens]
    assert torch.equal(lookup(tokens), expected)
    assert torch.equal(expected, embedding[tokens])  # tiny.en ships in float16: the lookup is exact


def test_the_default_cpu_engine_projects_in_int8_and_the_fp32_config_in_float() -> None:
    default = load_engine("tiny.en", EngineOptions(warmup=False))
    assert isinstance(default.runtime.projection, Int8Projection)
    assert isinstance(default.runtime.decoder.embed_tokens, HalfEmbedding)
    fp32 = load_engine("tiny.en", CONFIGS["fp32"])
    assert not isinstance(fp32.runtime.projection, Int8Projection)


def test_an_unknown_projection_precision_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="projection precision"):
        EngineOptions(projection_precision="fp16").validate()
