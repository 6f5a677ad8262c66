"""Run the workspace's scripts as users do (a fresh interpreter) and check how they fail."""

import contextlib
import functools
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from fidev.core.manifest import ROOT


def task_path(root, script):
    """A task's script (scripts/) or a maintainer tool (tools/) of the workspace at `root`."""
    return next(
        (root / folder / script for folder in ("scripts", "tools") if (root / folder / script).is_file()),
        root / "scripts" / script,
    )


def run(script, *args, flags=(), env=None, timeout=120, root=ROOT):
    """A task's script, or a tool, of the workspace at `root` (this one unless given) run to its end, `env` over this
    process's environment."""
    return subprocess.run(
        [sys.executable, *flags, str(task_path(root, script)), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


UNWRITABLE = "FIDEV_TEST_UNWRITABLE"


def final_write_fails(tmp, target, env=None) -> dict:
    """`env` with a sitecustomize on PYTHONPATH that makes every rename onto `target` fail with EROFS, as on
    a file system made read-only after a run checked it (files.output_file) and before its final write
    (write_whole renames a temporary file into place): the run's other writes go on as ever."""
    site = tmp / "unwritable-site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(
        "import errno, os\n"
        "_replace = os.replace\n"
        "def replace(src, dst, **kw):\n"
        f"    if os.fspath(dst) == os.environ.get({UNWRITABLE!r}):\n"
        "        raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fspath(dst))\n"
        "    return _replace(src, dst, **kw)\n"
        "os.replace = replace\n"
    )
    env = dict(env or {})
    path = [str(site), *filter(None, [env.get("PYTHONPATH", os.environ.get("PYTHONPATH"))])]
    return {**env, "PYTHONPATH": os.pathsep.join(path), UNWRITABLE: os.path.realpath(target)}


def expect_unwritten(done, target, status=1, ended=""):
    """A run whose final write of `target` failed (final_write_fails): two lines naming the path, the OS
    error (and how the run ended), the run's status, no traceback, no temporary file beside it."""
    two_line_failure(done, f"{os.path.realpath(target)} could not be written: Read-only file system", status)
    assert ended in done.stderr.strip().splitlines()[-2], done.stderr
    assert not os.path.exists(target) and os.listdir(os.path.dirname(target)) == [], os.listdir(os.path.dirname(target))


def two_line_failure(done, problem, status=1):
    """Exit status 1 (2 for bad usage; `status` may be a set of those allowed), and the last two
    lines of stderr: the problem, then the fix; no traceback."""
    out = done.stdout + done.stderr
    assert "Traceback" not in out, out[-3000:]
    assert done.returncode in (status if isinstance(status, set) else {status}), (
        f"exit {done.returncode}: {out[-2000:]}"
    )
    lines = done.stderr.strip().splitlines()
    assert len(lines) >= 2 and lines[-2].startswith("error: ") and problem in lines[-2], lines
    assert lines[-1].lstrip().startswith("fix: "), lines


def wait_until(condition, seconds: float, what: str, proc=None) -> None:
    """Poll `condition` until it holds; fail, saying what did not happen, after `seconds`, or at
    once where `proc` ended first (with its output)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"{what} did not happen: the process ended first: {proc.communicate(timeout=5)[0]}")
        assert time.monotonic() < deadline, f"not within {seconds} s: {what}"
        time.sleep(0.05)


CI_VENV = "FIDEV_CI_VENV"  # set by .ci/run in its flashinfer-dev venv, which must have everything


def require(*modules, why):
    """Skip where a module is missing (e.g. pyelftools in pixi's `default` environment, and in
    .ci/run's replica of it), except in .ci/run's flashinfer-dev venv, which must provide them all."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        if os.environ.get(CI_VENV):
            pytest.fail(
                f"the CI's flashinfer-dev venv lacks {missing} (flashinfer-dev's packages in the manifest, "
                f"and .ci/requirements.txt): {why}",
                pytrace=False,
            )
        pytest.skip(f"{', '.join(missing)} not installed here: {why}", allow_module_level=True)


BUILD_TOOLS = ("ninja", "c++")  # what the tests that build a real ninja module need; .ci/requirements.txt brings ninja


def missing_tools(*tools, why) -> list[str]:
    """The programs of `tools` not on PATH; in .ci/run's flashinfer-dev venv, which must run every
    test it can, a missing one fails the collection, with what needs it, instead of a silent skip."""
    missing = [t for t in tools if shutil.which(t) is None]
    if missing and os.environ.get(CI_VENV):
        pytest.fail(f"the CI host lacks {', '.join(missing)} on PATH: {why}", pytrace=False)
    return missing


def require_tools(*tools, why):
    """Skip the module where a program is missing (fail in .ci/run's flashinfer-dev venv)."""
    missing = missing_tools(*tools, why=why)
    if missing:
        pytest.skip(f"{', '.join(missing)} not on PATH here: {why}", allow_module_level=True)


@functools.cache
def task_module(path, name: str):
    """A script or tool (`path`) loaded as the module `name`, for its tables, readers and steps called in this
    process. Its first import, fidev.core.task_start, installs our Ctrl-C and SIGTERM handlers (exit 130 at
    once): pytest's own are put back, so that this process keeps its teardown."""
    handlers = {stop: signal.getsignal(stop) for stop in (signal.SIGINT, signal.SIGTERM)}
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
    finally:
        for stop, handler in handlers.items():
            signal.signal(stop, handler)
    return module


def tool_module(name: str):
    """tools/<name>.py as a module (task_module), its main never run: one load for every test."""
    return task_module(task_path(ROOT, f"{name}.py"), f"{name}_tool")


def acceptance_tool():
    """tools/gpu_acceptance.py as a module (tool_module)."""
    return tool_module("gpu_acceptance")


@functools.cache
def acceptance_digest() -> str:
    """tools/gpu_acceptance.py's checkout_digest of this checkout: what a WORK made here holds in its
    checkout.sha256, for a test that writes a WORK by hand."""
    return acceptance_tool().checkout_digest(ROOT)


def acceptance_run(work, *args, timeout: float = 60) -> subprocess.CompletedProcess:
    """tools/gpu_acceptance.py --work WORK ARGS..., run to its end (within `timeout`), its output captured."""
    return run("gpu_acceptance.py", "--work", work, *args, timeout=timeout)


# A rendezvous a test puts before a task: written as sitecustomize.py into a folder first on PYTHONPATH, it holds
# the task where FIDEV_TEST_HOLD says, once it has written its pid to FIDEV_TEST_MET, so that a signal comes there
# and nowhere else (no sleep-based guess)
HOLD = '''import atexit, importlib.util, os, sys, time

WHERE, MET, GO = os.environ["FIDEV_TEST_HOLD"], os.environ["FIDEV_TEST_MET"], os.environ["FIDEV_TEST_GO"]
BOOTSTRAP = {"__future__", "fidev", "fidev.core", "fidev.core.task_start", "fidev.core.interrupts"}  # its first import
INITS = (os.path.join("fidev", "__init__.py"), os.path.join("fidev", "core", "__init__.py"))  # on its way, with theirs


def bootstraps(name):
    """Whether importing `name` is the bootstrap's: itself, its packages, or what their __init__ imports."""
    frame = sys._getframe()
    while frame is not None and not frame.f_code.co_filename.endswith(INITS):
        frame = frame.f_back
    return name in BOOTSTRAP or frame is not None


def hold():
    """Until the test's signal ends the wait (a KeyboardInterrupt, the process's end) or the test says go on."""
    with open(MET, "w") as met:
        met.write(str(os.getpid()))
    while not os.path.exists(GO):
        time.sleep(0.01)


class Hold:
    """start: at the first import the task's code makes but the bootstrap's (what it imports before run_main);
    import MODULE: as that module is first imported (by anyone: torch's C++ start-up imports numpy);
    MODULE:FUNCTION: as the task calls that function of that module."""

    def find_spec(self, name, path=None, target=None):
        started = getattr(sys.modules.get("__main__"), "__file__", None)
        if (WHERE == "start" and started and not bootstraps(name)) or WHERE == f"import {name}":
            sys.meta_path.remove(self)
            hold()
        elif WHERE.partition(":")[0] == name:
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            run = spec.loader.exec_module

            def run_then_hold(module):
                run(module)
                setattr(module, WHERE.partition(":")[2], lambda *args, **kwargs: hold())

            spec.loader.exec_module = run_then_hold
            return spec
        return None


if WHERE == "end":  # as the process ends, once its answer is out (atexit: the last callback), until told
    atexit.register(hold)
else:
    sys.meta_path.insert(0, Hold())
'''


def start_held(folder, where: str, script: str, *args, env=None) -> tuple[subprocess.Popen, str]:
    """Start a task of this workspace held where HOLD says (`where`), Ctrl-C's default action as a terminal
    gives it; (the process, the file it writes once held). `folder` takes the rendezvous."""
    (folder / "sitecustomize.py").write_text(HOLD)
    met = str(folder / "met")
    path = os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))
    hold = {"FIDEV_TEST_HOLD": where, "FIDEV_TEST_MET": met, "FIDEV_TEST_GO": str(folder / "go")}
    proc = subprocess.Popen(
        [sys.executable, str(task_path(ROOT, script)), *map(str, args)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {}), **hold, "PYTHONPATH": path},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    return proc, met


def signal_held(proc: subprocess.Popen, met: str, signum: int, what: str, go=None) -> subprocess.CompletedProcess:
    """`signum` to a task once it is held (start_held), then (with `go`, a file) let it go on; what it did."""
    try:
        wait_until(lambda: os.path.isfile(met) and open(met).read().strip().isdigit(), 60, what, proc)
        proc.send_signal(signum)
        if go is not None:  # the signal is pending in the task once kill() returns: its handler runs before
            go.write_text("")  # the task can see the file
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@contextlib.contextmanager
def within(seconds: float, what: str):
    """The block ends within `seconds`, or the test fails saying so: a read that waits (a FIFO) or a loop that
    never ends is stopped by SIGALRM, whose handler's exception ends even a system call (PEP 475). In the main
    thread only, where Python runs signal handlers."""

    def expired(signum, frame):
        pytest.fail(f"{what} took more than {seconds:g} s: a wait or a loop", pytrace=False)

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
