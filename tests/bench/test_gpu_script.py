"""``bench/gpu.sh``: it parses, it stops at once and clearly where there is no CUDA (before installing anything),
and its plumbing (the steps, the time guards, the final line) works over a stand-in Python."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from tests.conftest import TESTS

REPO = TESTS.parent
SCRIPT = REPO / "bench" / "gpu.sh"
BASH = shutil.which("bash")

pytestmark = pytest.mark.skipif(BASH is None, reason="needs bash")


def _executable(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _run(
    tmp_path: Path, *args: str, nvidia_smi: str = "exit 0", python: Path | None = None, repo: Path = REPO
) -> subprocess.CompletedProcess[str]:
    """The script (from ``repo``) with a stand-in ``nvidia-smi`` first on PATH, OUT in ``tmp_path``; the timeout
    only guards against a hang."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    _executable(bin_dir / "nvidia-smi", f"#!/bin/sh\n{nvidia_smi}\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "MODEL", "OUT", "PYTHONPATH")}
    env |= {"PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", "OUT": str(tmp_path / "out")}
    if python is not None:
        env["PYTHON"] = str(python)
    assert BASH is not None
    return subprocess.run(
        [BASH, str(repo / "bench" / "gpu.sh"), *args], env=env, capture_output=True, text=True, timeout=300
    )


def test_the_script_parses() -> None:
    assert BASH is not None
    subprocess.run([BASH, "-n", str(SCRIPT)], check=True)


def test_without_a_driver_it_exits_2_at_once(tmp_path: Path) -> None:
    # "at once": before it runs any Python (a stand-in that notes each call it gets)
    calls = tmp_path / "python-calls"
    python = _executable(tmp_path / "python3", f'#!/bin/sh\necho "$*" >>{calls}\nexit 0\n')
    done = _run(tmp_path, nvidia_smi="echo 'NVIDIA-SMI has failed' >&2; exit 9", python=python)
    assert done.returncode == 2
    assert "no NVIDIA GPU here" in done.stdout + done.stderr
    assert not calls.exists()
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["gpu.log"]  # its log, and no report


@pytest.mark.skipif(Path("/dev/nvidia0").exists(), reason="this machine has a GPU")
def test_with_torch_but_no_cuda_it_exits_2_before_installing_anything(tmp_path: Path) -> None:
    # the driver answers, but the project's torch (the CPU build here) sees no CUDA
    done = _run(tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "CUDA is not available to" in output and "this script measures a GPU" in output
    assert "installing" not in output and "quant" not in output


def test_unknown_arguments_are_refused(tmp_path: Path) -> None:
    done = _run(tmp_path, "--fast")
    assert done.returncode == 1 and "usage: bash bench/gpu.sh [prepare]" in done.stderr


# A stand-in for the GPU machine's python3: torch with CUDA, the benchmarks answering as they do. It lets the test
# follow every step of the script in a second, without a GPU or a model.
FAKE_PYTHON = r"""#!/bin/bash
case "$*" in
    *"is_available()"*) exit 0 ;;
    *"print(f\"Python"*) echo "Python 3.12.3, torch 2.11.0+cu130" ;;
    *"importlib.util"*) echo "" ;;
    *"from streamer.engine.models import prepare"*) echo "gpu.sh: model: /cache/tiny.en" ;;
    *"from streamer.engine import CONFIGS"*) echo "--config fp16 --config int8-encoder+fp16-decoder" ;;
    "-c import torch") exit 0 ;;
    *"bench quant"*) echo "quant called with: $*" ;;
    *"bench profile"*) echo "profile called with: $*" ;;
    *"bench capacity --help"*) echo "usage: streamer bench capacity [--max-streams MAX_STREAMS]" ;;
    *"bench capacity"*)
        echo "capacity called with: $*"
        for n in 1 2 4; do echo "$n concurrent stream(s) of 10 s ..." >&2; echo "  final p95 300 ms, held" >&2; done
        echo "6 concurrent stream(s) of 10 s ..." >&2
        echo "  final p95 2500 ms, ('final p95 2500 ms > 2000 ms',)" >&2
        echo "Largest number of concurrent real-time streams held: 4"
        ;;
    *"bench load"*)
        echo "load called with: $*"
        for n in 64 128; do echo "$n concurrent stream(s) of 10 s ..." >&2; echo "  final p95 900 ms, held" >&2; done
        echo "256 concurrent stream(s) of 10 s ..." >&2
        echo "  final p95 2100 ms, ('final p95 2100 ms > 1500 ms',)" >&2
        echo "Largest number of concurrent real-time streams held: 128"
        ;;
    *) echo "unexpected: $*" >&2; exit 99 ;;
esac
"""


# how the script's load ramp spreads its engine processes here: one port's workers where redis-server is installed
WORKERS = shutil.which("redis-server") is not None
LOAD_SPREAD = (
    "streamer serve --workers 8 on one port" if WORKERS else "8 server processes (no redis-server for --workers)"
)


def _checkout(tmp_path: Path) -> Path:
    """A checkout holding only the script and the committed clips (no staged .gpu, no shared data beside it)."""
    repo = tmp_path / "repo"
    (repo / "bench").mkdir(parents=True)
    shutil.copy(SCRIPT, repo / "bench" / "gpu.sh")
    shutil.copytree(TESTS / "data", repo / "tests" / "data")
    return repo


def test_every_step_runs_and_the_last_line_is_the_streams_held(tmp_path: Path) -> None:
    python = _executable(tmp_path / "python3", FAKE_PYTHON)
    done = _run(tmp_path, python=python, repo=_checkout(tmp_path), nvidia_smi="echo 'GPU 0: NVIDIA H200'")
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "quant called with: -m streamer bench quant --config fp16 --config int8-encoder+fp16-decoder" in output
    assert "--tsv tests/data/transcripts.tsv" in output  # no shared data here: the committed clips
    for config in ("fp16", "fp16-dynamic-shapes"):
        assert f"profile called with: -m streamer bench profile --config {config} --model tiny.en" in output
    assert "batch-size sweep skipped: streamer bench capacity has no --max-batch-size" in output
    assert "--config fp16 --model tiny.en --max-streams 64 --duration 10 --file tests/data/" in output
    # the ramp to a thousand: eight engine processes sharing the cores out (one port's workers where redis-server is
    # there for them, else eight servers), clients in eight more
    threads = max(1, int(subprocess.run(["nproc"], capture_output=True, text=True, check=True).stdout) // 8)
    spread = "--workers 8" if WORKERS else "--server-processes 8"
    assert (
        "load called with: -m streamer bench load --engine whisper --model tiny.en --streams 64,128,256,512,1024 "
        f"{spread} --client-processes 8 --server-arg=--threads --server-arg={threads} --duration 10 "
        "--file tests/data/"
    ) in output
    assert "batch size default: 4 real-time streams held" in output and "load: 128 real-time streams held" in output
    # the last line is the more of the two ramps, and says which
    assert (
        output.rstrip().splitlines()[-1]
        == f"GPU real-time streams held: 128 (bench load, {LOAD_SPREAD}, 8 client processes)"
    )
    assert (tmp_path / "out" / "gpu.log").read_text().count("GPU real-time streams held: 128") == 1


@pytest.mark.parametrize(
    ("ramp", "said", "last"),
    [
        # a crash is a failure even though the other ramp held streams afterwards
        (
            "capacity",
            "batch size default: 0 real-time streams held; capacity failed with exit 1, see above",
            f"GPU real-time streams held: 128 (bench load, {LOAD_SPREAD}, 8 client processes)",
        ),
        (
            "load",
            "load: 0 real-time streams held; load failed with exit 1, see above",
            "GPU real-time streams held: 4 (batch size default)",
        ),
    ],
)
def test_a_ramp_that_crashes_is_a_failure(tmp_path: Path, ramp: str, said: str, last: str) -> None:
    python = _executable(
        tmp_path / "python3",
        FAKE_PYTHON.replace(f'echo "{ramp} called with: $*"', 'echo "CUDA error: out of memory" >&2; exit 1'),
    )
    done = _run(tmp_path, python=python, repo=_checkout(tmp_path))
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert said in output
    assert output.rstrip().splitlines()[-1] == last
