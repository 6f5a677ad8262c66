"""smoke's and abi-smoke's tests of the changed modules, run in affected's own process as smoke runs them
(fidev.smoke.gpu_suite), each once the modules it loads are built, beside the builds of smoke's modules that
nothing built yet."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable

from fidev.affected.report import short
from fidev.builds import module_builds, smoke_modules
from fidev.core.failure import Failure
from fidev.core.manifest import ROOT
from fidev.smoke import gpu_suite, run_loop

NOTHING_PASSED = -1  # pytest's status 0 with every test skipped: not a pass


def collector(stop: Callable[[], bool] | None = None):
    """The plugin run_ours gives smoke's pytest session: it collects the failing node ids (`ids`)
    and Ctrl-C (`interrupted`); with `stop` (a callable that says FlashInfer's tests failed), no
    test runs once stop() is true, and the session ends as -x ends it (`stopped`; pytest's
    shouldfail, not a KeyboardInterrupt). pytest is imported here: this runs in pytest's process."""
    import pytest

    class Failed:
        REASON = "FlashInfer's tests failed: the first failure ends the run (--keep-going runs every test)"

        def __init__(self):
            self.ids, self.interrupted, self.stopped = set(), False, False

        def pytest_runtest_logreport(self, report):
            if report.failed:
                self.ids.add(report.nodeid)

        def pytest_keyboard_interrupt(self, excinfo):  # pytest.main keeps Ctrl-C (SIGTERM, here) to itself: status 2
            self.interrupted = True

        @pytest.hookimpl(tryfirst=True)
        def pytest_runtest_protocol(self, item, nextitem):
            if stop is None or self.stopped or not stop():
                return None
            self.stopped = True
            item.session.shouldfail = self.REASON
            return True  # not run

    return Failed()


WAIT_S = 0.1  # how often ready_first looks again while every test left waits for a module still building


def ready_first(loaded: list[tuple[tuple[str, ...], str]], pending: Callable[[], set[str]], stop=None):
    """The plugin whose run loop replaces pytest's for smoke's tests in affected's process: each test runs
    once none of the modules it loads is still building (`pending()`: the rebuild's and the builds
    beside it; `loaded`: (tests, module) pairs, as smoke_modules names them), the first such in
    pytest's order; while none is ready it waits. So a test of a module rebuilt early runs, and may be
    the first failure, while the others still build. A test that loads no module named is ready.
    pytest's `nextitem`, which says which fixtures a test's teardown keeps, is a test ready as the test
    before it starts, and that one runs next; where none is ready yet it is None, and every fixture is
    torn down, to be set up again by the next test. With `stop()` true, it waits for nothing (the
    collector ends the run). pytest is imported here."""
    import pytest

    class ReadyFirst:
        def __init__(self):
            self.modules: dict[str, set[str]] = {}

        def needs(self, item) -> set[str]:
            if item.nodeid not in self.modules:
                test = item.nodeid.removeprefix("tests/")
                self.modules[item.nodeid] = {name for tests, name in loaded if loads(test, tests)}
            return self.modules[item.nodeid]

        def ready(self, left: list):
            building = pending()
            return next((item for item in left if not self.needs(item) & building), None), building

        def next_ready(self, left: list):
            while True:
                item, building = self.ready(left)
                if item is not None or not building or (stop is not None and stop()):
                    return item or left[0]
                time.sleep(WAIT_S)

        @pytest.hookimpl(tryfirst=True)
        def pytest_runtestloop(self, session):
            return run_loop.run_in_order(session, self.next_ready, lambda left: self.ready(left)[0])

    return ReadyFirst()


def run_ours(
    tests: list[str], wide: list[str], mode: str, stop: Callable[[], bool] | None = None, order=None
) -> tuple[int, set[str], bool]:
    """smoke's and abi-smoke's tests, in this process as smoke runs them (fidev.smoke.gpu_suite: no
    third-party plugin), so that a flashinfer the regeneration imported is not imported again:
    (status, the node ids that failed or errored, whether tests were left unrun). With `stop`, the
    first failure ends them (-x), and so does `stop()` turning true before a test (Failed). `order`: the
    plugin that runs each test once its modules are built (ready_first). Our conftest redirects
    FlashInfer's variables for the session; the environment is restored after it, for FlashInfer's
    own tests."""

    print(f"affected: smoke and abi-smoke tests: {short(tests, 4)}", flush=True)
    plugin, saved = collector(stop), dict(os.environ)
    os.environ[gpu_suite.NO_AUTOLOAD] = "1"
    first = ["-x"] if stop is not None else []
    try:
        status = gpu_suite.run_paths(
            "affected",
            [str(ROOT / "tests" / t) for t in tests],
            ["-q", *first, *wide],
            mode,
            plugins=(plugin,) if order is None else (plugin, order),
        )
    except Failure as failure:  # nothing passed: every test skipped, or none selected
        print(f"affected: {failure.problem}")
        status = NOTHING_PASSED
    finally:
        os.environ.clear()
        os.environ.update(saved)
    if plugin.interrupted:
        raise KeyboardInterrupt  # so that what runs beside them is stopped too
    return status, plugin.ids, plugin.stopped or bool(first and plugin.ids)


def import_meanwhile() -> threading.Thread | None:
    """flashinfer imported in a thread while the build runs, since smoke's tests run in this
    process and would pay for it after. Only a head start: where it fails, the tests' own import
    fails again and says why, as smoke does (a host without torch: they skip)."""
    if "flashinfer" in sys.modules:
        return None

    def work() -> None:
        try:
            import flashinfer  # noqa: F401
        except BaseException:  # noqa: BLE001, S110 (said by the tests' own import)
            pass

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    return thread


def smoke_loaded(names, tier: dict[str, str], ours: list[str]) -> frozenset[str]:
    """Which of the modules `names` the selected smoke and abi-smoke tests load (`tier`: smoke's module
    key by name, from build's stamps: no import)."""
    return frozenset(
        name
        for name in names
        if (key := tier.get(name)) in smoke_modules.BY_KEY
        and any(loads(t, smoke_modules.BY_KEY[key].tests) for t in ours)
    )


def loads(test: str, tests: tuple[str, ...]) -> bool:
    """A selected test (a node id, or a function for all its cases) that is, or has a case among, `tests`."""
    return any(test == t or t.startswith(test + "[") or test.startswith(t + "[") for t in tests)


def smoke_specs(ours: list[str]) -> list:
    """(module, its JitSpec) of smoke's and abi-smoke's modules (fidev.builds.smoke_modules, the wide tier
    too) that the selected tests load, for this GPU's architectures. flashinfer is imported by now
    (import_meanwhile, joined)."""
    from flashinfer.jit import core

    sm90 = any(major == 9 for major, _ in core.current_compilation_context.TARGET_CUDA_ARCHS)
    return [(m, m.make()) for m in smoke_modules.select(True, sm90, True) if any(loads(t, m.tests) for t in ours)]


def loaded_modules(ours: list[str]) -> list[tuple[tuple[str, ...], str]]:
    """(tests, module name) of each smoke module the selected tests load (ready_first's); none where
    flashinfer cannot name them (SmokeBuilds says so): every test is ready then."""
    try:
        return [(module.tests, spec.name) for module, spec in smoke_specs(ours)]
    except (ImportError, AttributeError):
        return []


def unbuilt_smoke_specs(ours: list[str]) -> list:
    """The JitSpecs of smoke's and abi-smoke's modules (fidev.builds.smoke_modules, the wide tier
    too) that the selected tests load and that are neither built nor prebuilt, for this GPU's
    architectures. flashinfer is imported by now (import_meanwhile, joined)."""
    return [spec for _, spec in smoke_specs(ours) if not spec.is_aot and not spec.jit_library_path.exists()]


class SmokeBuilds:
    """smoke's modules the selected tests load and nothing built (the wide tier's, which `build`
    leaves out by default), built side by side beside the rebuild, each under its own lock, taken
    before the tests start (module_builds.Ahead, at the rebuild's priority: the edit's tests wait
    for them as for it), so that smoke's tests do not compile them one after another: a test that
    loads one waits for it alone. Where the modules cannot be named (no flashinfer here), each test
    builds its own, and fails where it fails."""

    def __init__(self, ours: list[str], say: Callable[[str], None] = lambda line: print(line, flush=True)):
        """`say`: where their lines go (tests.screen(): smoke's session captures stdout meanwhile)."""
        self.ahead: module_builds.Ahead | None = None
        self.said = say
        try:
            specs = unbuilt_smoke_specs(ours)
        except (ImportError, AttributeError) as e:
            print(f"affected: smoke's modules not named up front ({type(e).__name__}: {e}): each test builds its own")
            return
        if specs:
            print(
                f"affected: {len(specs)} module(s) smoke's tests load and nothing built build side by side now: "
                f"{short([spec.name for spec in specs], 3)}",
                flush=True,
            )
            # ninja's environment now: smoke's session changes and restores this process's while they build
            self.ahead = module_builds.Ahead(specs, self.say, nice=0, env=dict(os.environ))
            for spec in specs:  # smoke's modules, whoever's tests load them next (`build` stamps its own)
                smoke_modules.mark_built(spec)

    def say(self, line: str) -> None:
        self.said(f"affected: smoke's modules: {line.strip()}")

    def pending(self) -> set[str]:
        return set() if self.ahead is None else self.ahead.pending()

    def stop(self) -> None:
        """Stopped where they still run (the tests are done, or the run ended)."""
        if self.ahead is not None:
            self.ahead.stop()
