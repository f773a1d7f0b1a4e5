"""A native build killed midway blocks no later build; a waiting process says whose build it
waits for; Ctrl-C during a build ends the process (issue 48, item 1), in a background job too,
where only the compiler sees it (issue 57), and is never a reason to build another variant.

Each test builds a one-function library through ``native_build.load_library`` in child
processes, with ``CXX`` a wrapper around the real compiler that marks when it compiles and
then sleeps (``SLOW``), so a child can be killed while its build really runs (ninja and the
compiler are running). Before the fix a killed build left torch's ``lock`` file behind and
every later build of that folder waited for ever.
"""

from __future__ import annotations

import os
import select
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict

import pytest
from plugin_util import ROOT

from npudet.ops.msda.backends import cpu_isa, cpu_library
from npudet.ops.msda.kernels import native_build

pytestmark = pytest.mark.skipif(
    native_build.compiler_missing() is not None, reason="needs a C++ compiler"
)

SOURCE = "int npudet_lock_test() { return 48; }\n"
# The child: load_library from a source root of its own; prints the result.
CHILD = (
    "import sys\n"
    "from pathlib import Path\n"
    "from npudet.ops.msda.kernels import native_build\n"
    "native_build.SOURCE_ROOTS = (Path(sys.argv[1]),)\n"
    "print('RESULT', native_build.load_library('npudet_lock_test', ['lib.cpp'],"
    " what='the lock test library'), flush=True)\n"
)


def _setup(tmp_path: Path) -> Dict[str, str]:
    """A source root, a cache and a slow compiler wrapper under ``tmp_path``; the env."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "lib.cpp").write_text(SOURCE)
    wrapper = tmp_path / "slow-cxx"
    cxx = native_build.compiler()
    # --version answers at once (it is part of the build key); a compile marks and sleeps
    # until SLOW is removed, so the test decides how long the build lasts.
    wrapper.write_text(
        "#!/bin/sh\n"
        f'[ "$1" = --version ] && exec {cxx} "$@"\n'
        f'touch "{tmp_path}/compiling"\n'
        f'while [ -e "{tmp_path}/SLOW" ]; do sleep 0.1; done\n'
        f'exec {cxx} "$@"\n'
    )
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    (tmp_path / "SLOW").touch()
    return dict(
        os.environ, NPUDET_EXT_CACHE=str(tmp_path / "cache"), CXX=str(wrapper), PYTHONWARNINGS=""
    )


def _default_sigint() -> None:
    # A suite started in the background (`cmd &` without job control) ignores SIGINT, and
    # children inherit that: give the child a terminal's Ctrl-C as a foreground job has.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _ignore_sigint() -> None:
    # bash starts a background job (`cmd &`) with SIGINT ignored: Python never raises
    # KeyboardInterrupt there, while ninja and the compiler still take the signal.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _start(
    tmp_path: Path, env: Dict[str, str], preexec: Callable[[], None] = _default_sigint
) -> subprocess.Popen:
    # Its own session, as a job under a shell is: a signal can go to the whole group.
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path / "src")],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=preexec,
    )


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < end, f"{path} never appeared"
        time.sleep(0.05)


def _stderr_until(proc: subprocess.Popen, text: str, timeout: float = 120) -> str:
    """What ``proc`` writes to stderr up to the first line holding ``text`` (or its exit)."""
    seen = b""
    end = time.monotonic() + timeout
    fd = proc.stderr.fileno()
    while text.encode() not in seen and time.monotonic() < end:
        ready, _, _ = select.select([fd], [], [], 0.5)
        chunk = os.read(fd, 4096) if ready else b""
        if ready and not chunk:
            break  # the process closed stderr
        seen += chunk
    return seen.decode()


def _build_folder(tmp_path: Path) -> Path:
    (folder,) = (tmp_path / "cache").glob("npudet_lock_test-*")
    return folder


def test_a_killed_build_blocks_no_one_and_the_waiter_says_whose_it_is(tmp_path) -> None:
    env = _setup(tmp_path)
    first = _start(tmp_path, env)
    _wait_for(tmp_path / "compiling", first)
    second = _start(tmp_path, env)
    # The second waits for the first's build and says so, naming the first's process.
    said = _stderr_until(second, "waiting for")
    assert f"waiting for process {first.pid}" in said and "the lock test library" in said, said
    os.killpg(first.pid, signal.SIGKILL)  # kill -9 of the build: python, ninja, compiler
    first.wait()
    # What hung every later run before: torch's lock file of the killed build is still there.
    assert (_build_folder(tmp_path) / "lock").exists()
    (tmp_path / "SLOW").unlink()
    out, err = second.communicate(timeout=300)
    assert second.returncode == 0, err
    assert "after" in err and "s of waiting" in err, err
    assert "RESULT " in out and out.strip().endswith("npudet_lock_test.so"), out
    # A third process loads the finished build without building or waiting.
    third = _start(tmp_path, env)
    out, err = third.communicate(timeout=120)
    assert third.returncode == 0 and out.strip().endswith(".so") and "building" not in err, err


def test_ctrl_c_during_a_build_ends_the_process(tmp_path) -> None:
    env = _setup(tmp_path)
    proc = _start(tmp_path, env)
    try:
        _wait_for(tmp_path / "compiling", proc)
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in a terminal: the foreground group
        out, err = proc.communicate(timeout=120)
    finally:
        (tmp_path / "SLOW").unlink(missing_ok=True)  # no waiting compiler outlives the test
    # Not a failed build (which would warn "building ... failed" and go on without it).
    assert proc.returncode != 0 and "KeyboardInterrupt" in err, (out, err)
    assert "RESULT" not in out and "failed" not in err, (out, err)


def test_ctrl_c_in_a_background_job_ends_the_build_too(tmp_path) -> None:
    """A training started in the background ignores SIGINT in Python: Ctrl-C to its group
    stopped only ninja and the compiler, and the failed build fell back to the slower
    ``baseline`` variant. A build stopped by SIGINT now ends the process, saying so."""
    env = _setup(tmp_path)
    # torch's compiler probes (-v, -dumpversion) run straight from Python, ignoring SIGINT
    # as it does: only a compile (-c, run by ninja) waits for the signal
    cxx = native_build.compiler()
    wrapper = Path(env["CXX"])
    wrapper.write_text(
        wrapper.read_text().replace(
            "#!/bin/sh\n", f'#!/bin/sh\ncase " $* " in *" -c "*) ;; *) exec {cxx} "$@";; esac\n', 1
        )
    )
    proc = _start(tmp_path, env, preexec=_ignore_sigint)
    try:
        _wait_for(tmp_path / "compiling", proc)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        (tmp_path / "SLOW").unlink(missing_ok=True)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # a build that went on: the test fails
    assert proc.returncode != 0 and "RESULT" not in out, (out, err)
    assert (
        "BuildInterrupted: building the lock test library stopped: its compiler was "
        "interrupted (SIGINT)"
    ) in err, err
    assert "failed" not in err, err


def test_an_interrupted_build_tries_no_other_variant(monkeypatch) -> None:
    """The ``cpu`` kernel builds the next instruction-set variant when one fails; not when
    the build was interrupted."""
    tried = []

    def interrupted(name: str, *args, **kwargs):
        tried.append(name)
        raise native_build.BuildInterrupted(f"building {name} stopped")

    monkeypatch.setattr(cpu_library, "_state", {})
    monkeypatch.setattr(cpu_library, "load_library", interrupted)
    monkeypatch.setattr(cpu_isa, "candidates", lambda: list(cpu_isa.VARIANTS["x86_64"]))
    with pytest.raises(native_build.BuildInterrupted):
        cpu_library.load()
    assert len(tried) == 1  # the best variant only: no fallback
