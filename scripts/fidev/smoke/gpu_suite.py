"""Run a GPU pytest suite (tests/smoke, tests/abi_smoke, FlashInfer's own) as a task: it fails unless
something passed.

pytest skips every GPU test on a host without a GPU, which keeps CPU CI green; run as a task,
"nothing ran" is a failure.
"""

from __future__ import annotations

import os
import sys
import time

from fidev.core.failure import INTERRUPTED, Failure, exit_now, interrupted, interrupts_held, run_main
from fidev.core.manifest import ROOT, pins
from fidev.jit import module_choice
from fidev.jit.flashinfer_import import REINSTALL
from fidev.smoke import pytest_usage

NO_AUTOLOAD = "PYTEST_DISABLE_PLUGIN_AUTOLOAD"  # pytest reads it when a session starts


class Outcomes:
    """A pytest plugin that counts what each test did: the call's outcome, a skip in setup, and as
    errors a failed setup or teardown and a file that did not collect (pytest reports those apart
    from failures, and a count that left them out read as nothing wrong)."""

    def __init__(self):
        self.counts = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}

    def pytest_runtest_logreport(self, report):
        if report.when == "call":
            self.counts[report.outcome] += 1
        elif report.skipped:
            self.counts["skipped"] += 1
        elif report.failed:
            self.counts["errors"] += 1

    def pytest_collectreport(self, report):
        if report.skipped:  # a whole module skipped, e.g. no torch
            self.counts["skipped"] += 1
        elif report.failed:
            self.counts["errors"] += 1


def run(task: str, suite: str, pytest_args: list[str], mode: str) -> int:
    """One of this workspace's suites, under tests/. They use no third-party pytest plugin, so none
    is loaded: on a host with many installed, loading them costs the warm chain a second. The paths in
    `pytest_args` are checked first (pytest_usage.refuse_odd_paths)."""
    pytest_usage.refuse_odd_paths(task, pytest_args)
    torch_imports(task)
    autoload = os.environ.get(NO_AUTOLOAD)
    os.environ[NO_AUTOLOAD] = "1"
    try:
        return run_paths(task, [str(ROOT / "tests" / suite)], pytest_args, mode)
    finally:
        if autoload is None:
            os.environ.pop(NO_AUTOLOAD)
        else:
            os.environ[NO_AUTOLOAD] = autoload


def torch_imports(task: str) -> None:
    """torch imported ahead of pytest, whose collection would say a torch that raises as its own errors
    (status 2, no fix): a Failure naming the exception. Where torch is not installed at all, the suite's
    tests skip and say so, as before (and the task fails as nothing having passed)."""
    try:
        with interrupts_held():  # Ctrl-C in its C++ start-up is swallowed or aborts the process
            import torch  # noqa: F401
    except ModuleNotFoundError as e:
        if e.name != "torch":  # torch is there, one of its own imports is not
            raise _broken_torch(task, e) from e
    except Exception as e:  # an ImportError of its libraries, a RuntimeError of its start-up
        raise _broken_torch(task, e) from e


def _broken_torch(task: str, e: Exception) -> Failure:
    first = str(e).splitlines()[0] if str(e) else ""
    return Failure(f"{task} cannot run: import torch failed: {type(e).__name__}: {first}", REINSTALL)


def run_paths(
    task: str, paths: list[str], pytest_args: list[str], mode: str, options: tuple[str, ...] = (), plugins: tuple = ()
) -> int:
    """pytest on `paths` in this interpreter, in the task's kernel source `mode` (applied before
    anything imports flashinfer), with a one-line count at the end; `plugins` join pytest's."""
    import pytest

    pins()  # pytest reads pyproject.toml too: a broken one is the manifest's two lines, not pytest's ERROR
    module_choice.apply(mode)
    outcomes = Outcomes()
    started = time.perf_counter()
    code = pytest_usage.pytest_main(
        task,
        [*paths, "-ra", "-p", "no:cacheprovider", *options, *pytest_args],
        [outcomes, _interrupts(pytest), *plugins],
    )
    if interrupted():  # where something swallowed it after the last test: the run is still an interrupted one
        raise KeyboardInterrupt
    c = outcomes.counts
    for line in module_choice.report(task):
        print(line)
    print(
        f"{task}: {c['passed']} passed, {c['skipped']} skipped, {c['failed']} failed, {c['errors']} errors; "
        f"kernel source {mode}; {time.perf_counter() - started:.1f} s"
    )
    if c["errors"] and code == pytest.ExitCode.OK:
        code = pytest.ExitCode.TESTS_FAILED  # an error in a teardown leaves pytest's status 0
    if code in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED) and c["passed"] == 0:
        if not any(c.values()):
            raise Failure(
                f"no {task} test was selected ({' '.join(pytest_args) or 'none collected'})",
                f"check the -k/-m expression; `{task} --collect-only -q` lists the tests",
            )
        raise Failure(
            f"no {task} test passed: every one was skipped (reasons above)",
            "run it on a host with an NVIDIA GPU, inside the flashinfer-dev environment",
        )
    return int(code)


def _interrupts(pytest):
    """A plugin that hands Ctrl-C on to the task (fidev.core.failure.run_main: one line, status 130).
    pytest.main keeps a KeyboardInterrupt to itself (status 2, after the last line of the traceback it
    ended, as pytest's own); and one that something swallowed (a library's bare `except`, a finalizer)
    it never sees, and would run on: raised again before the next collector or test."""

    class Interrupts:
        def pytest_configure(self, config):  # one a finalizer swallowed is no warning of pytest's: it is said as Ctrl-C
            config.addinivalue_line(
                "filterwarnings", "ignore:(?s).*KeyboardInterrupt:pytest.PytestUnraisableExceptionWarning"
            )

        @pytest.hookimpl(tryfirst=True)
        def pytest_keyboard_interrupt(self, excinfo):
            if interrupted():  # Ctrl-C, not pytest's own stop (session.Interrupted: an error in collection)
                raise KeyboardInterrupt  # out of pytest.main: the session still finishes, with no report of it

        @pytest.hookimpl(tryfirst=True)
        def pytest_collectstart(self, collector):
            if interrupted():
                raise KeyboardInterrupt

        @pytest.hookimpl(tryfirst=True)
        def pytest_runtest_protocol(self, item, nextitem):
            if interrupted():
                raise KeyboardInterrupt

    return Interrupts()


def exit_task(main) -> None:
    """A suite's task to its end: sys.exit(run_main(main)), where Ctrl-C came after torch was imported less
    the interpreter's teardown of it (fidev.core.failure.exit_now): a CUDA call it interrupted may
    leave torch in a state its teardown crashes on."""
    status = run_main(main)
    if status == INTERRUPTED and "torch" in sys.modules:
        exit_now(status)
    sys.exit(status)
