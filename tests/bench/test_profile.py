from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from torch.profiler import DeviceType

from streamer.bench.profile import profile_figures
from streamer.cli.main import main
from tests.conftest import DATA


@dataclass
class _Range:
    start: float
    end: float

    def elapsed_us(self) -> float:
        return self.end - self.start


@dataclass
class _Event:
    name: str
    device_type: DeviceType
    time_range: _Range
    self_cpu_time_total: float = 0.0


def test_profile_figures_count_launches_and_waits_per_pass_and_the_gpu_s_busy_union() -> None:
    cpu, gpu = DeviceType.CPU, DeviceType.CUDA
    events = [
        *[_Event("cudaLaunchKernel", cpu, _Range(0, 1)) for _ in range(30)],
        *[_Event("cudaGraphLaunch", cpu, _Range(0, 1)) for _ in range(2)],
        *[_Event("cudaStreamSynchronize", cpu, _Range(0, 1)) for _ in range(3)],
        _Event("cudaMemcpyAsync", cpu, _Range(0, 1)),  # no wait by itself
        _Event("aten::mm", cpu, _Range(0, 500), self_cpu_time_total=400_000),
        _Event("aten::mm", cpu, _Range(0, 500), self_cpu_time_total=200_000),
        _Event("aten::add", cpu, _Range(0, 500), self_cpu_time_total=100_000),
        # kernels at 0-100 and 50-150 overlap (150 us busy), 300-400 apart: 250 us in all
        _Event("gemm", gpu, _Range(0, 100)),
        _Event("gemm", gpu, _Range(50, 150)),
        _Event("softmax", gpu, _Range(300, 400)),
    ]
    found = profile_figures(events, wall_seconds=0.001, passes=4, cuda=True)
    assert (found.launches, found.syncs, found.passes) == (32, 3, 4)
    assert found.gpu_busy_seconds == pytest.approx(250e-6)
    assert found.gpu_busy_share == pytest.approx(0.25)
    assert found.top_operators == [("aten::mm", pytest.approx(0.6), 2), ("aten::add", pytest.approx(0.1), 1)]
    assert [(n, c) for n, _, c in found.top_kernels] == [("gemm", 2), ("softmax", 1)]
    assert profile_figures(events, 0.001, 4, cuda=False).gpu_busy_share is None


@pytest.mark.model
def test_profile_bench_reports_speed_and_wer_per_batch_size(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """On the CPU: the same transcripts at every batch size (the WER column agrees), and a profile section that says
    there is no GPU instead of inventing kernel figures."""
    code = main(
        [
            "bench",
            "profile",
            "--tsv",
            str(DATA / "transcripts.tsv"),
            "--batch-size",
            "1",
            "--batch-size",
            "3",
            "--docs",
            str(tmp_path),
        ]  # fmt: skip
    )
    out = capsys.readouterr().out
    assert code == 0, out
    figures = json.loads((tmp_path / "benchmarks" / "profile.json").read_text())
    assert figures["windows"] == 3
    assert figures["batch_1"]["wer"] == figures["batch_3"]["wer"] < 20
    assert figures["batch_3"]["passes"] < figures["batch_1"]["passes"]  # rows of a batch step together
    assert figures["profile"]["gpu_busy_share"] is None and figures["profile"]["batch_size"] == 3
    written = (tmp_path / "benchmarks.md").read_text()
    assert "## profile" in written and "GPU busy: no CUDA device here" in written
