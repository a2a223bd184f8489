"""A model-loading command's start-up: the collector paused until the model is ready, then the start-up's objects
frozen out of later collections (issue 19: 0.2 s of a one-file ``streamer transcribe``); a one-shot command's torch
imported without its meta registrations until something asks for them (0.25 s)."""

from __future__ import annotations

import gc
import subprocess
import sys
from collections.abc import Iterator

import pytest

from streamer import startup


@pytest.fixture(autouse=True)
def collector() -> Iterator[None]:
    """Whatever a test does, the collector ends on and nothing frozen, as the suite expects."""
    yield
    startup._paused = False
    gc.unfreeze()
    gc.enable()


def test_a_pause_turns_the_collector_off_and_the_resume_freezes_then_turns_it_on() -> None:
    startup.pause_collection()
    assert not gc.isenabled()
    kept = [object() for _ in range(1000)]  # start-up's objects
    before = gc.get_freeze_count()
    assert startup.resume_collection()
    assert gc.isenabled()
    assert gc.get_freeze_count() >= before + len(kept)  # frozen: later collections skip them
    assert not startup.resume_collection()  # once


def test_without_a_pause_the_resume_leaves_the_collector_as_it_is() -> None:
    assert not startup.resume_collection()
    assert gc.isenabled() and gc.get_freeze_count() == 0
    gc.disable()  # a program that turned it off itself
    startup.pause_collection()  # finds it off: not its pause
    assert not startup.resume_collection()
    assert not gc.isenabled()


# A fresh interpreter (this one has imported torch long ago): torch imported with its meta registrations deferred,
# then `then` run; prints the loaded modules, the size of torch's meta kernel table and whether the registrations
# were imported before `then`, and a report on torch's modules.
_DEFERRED = """\
import sys
from streamer import startup
print(startup.defer_meta_registrations())
import torch
print(startup.META_REGISTRATIONS in sys.modules, "torch._decomp" in sys.modules)
{then}
from torch._decomp import global_decomposition_table
print(len(global_decomposition_table["meta"]))
{report}
"""
# What both print last: torch's modules; which of them are not the attribute their parent package holds (a module
# imported twice is one of these); the loaders their specs name.
_REPORT = """\
torch_modules = {name: module for name, module in sys.modules.items() if name.split(".")[0] == "torch"}
print(sorted(torch_modules))
print(sorted(name for name, module in torch_modules.items() if "." in name
             and getattr(sys.modules[name.rpartition(".")[0]], name.rpartition(".")[2], None) is not module))
print(sorted({type(getattr(module.__spec__, "loader", None)).__name__ for module in torch_modules.values()}))
"""
# The same in a process that imports torch whole.
_WHOLE = """\
import sys
import torch
{then}
from torch._decomp import global_decomposition_table
print(len(global_decomposition_table["meta"]))
{report}
"""


def _run(script: str) -> list[str]:
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


@pytest.mark.parametrize(
    "then",
    [
        "import torch._decomp",  # torch.compile's way in; the registrations import it on their own way
        "import torch._meta_registrations",
        "from torch._refs import _broadcast_shapes",  # a module the registrations import midway
        "torch._meta_registrations.meta_index_Tensor",  # a name read from the module torch bound
        "import torch.utils._pytree as tree",  # public, loaded with torch: nothing imported yet
        # a sampled decode's generator: torch.Generator() needs the RNG prims the registrations import
        "from streamer.engine.decoding import seeded_generator\nprint(torch.rand(3, generator=seeded_generator()))",
    ],
)
def test_deferred_registrations_come_whole_with_the_first_private_torch_module(then: str) -> None:
    deferred = _run(_DEFERRED.format(then=then, report=_REPORT))
    whole = _run(_WHOLE.format(then=then, report=_REPORT))
    assert deferred[:2] == ["True", "False False"]  # torch imported without them
    # once anything imported or read them: the same meta kernels and the same modules as torch imported whole,
    # each module loaded once (a second copy would be a second entry under another name, or a failed import)
    assert deferred[2:] == whole


def test_the_deferral_leaves_a_torch_already_imported_alone() -> None:
    import torch  # noqa: F401  # this process's: the suite's engines import it

    finders = list(sys.meta_path)
    assert not startup.defer_meta_registrations()
    assert sys.meta_path == finders
    assert hasattr(sys.modules[startup.META_REGISTRATIONS], "meta_index_Tensor")  # the real one, untouched
