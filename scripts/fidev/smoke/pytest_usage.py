"""pytest's usage errors as the workspace's two lines and status 2.

smoke, abi-smoke and upstream-tests hand the arguments they do not know to pytest, so pytest is
the one that finds an option nobody knows (`smoke.py --bogus`) or a bad -k/-m expression. It
reports those with its own `ERROR:` lines and exit status 4; the plugin here keeps the message
instead, and `pytest_main` raises it as a Failure with the usage status. upstream-tests runs each
test file in a pytest process of its own (fidev.upstream.runs) and turns every file's status 4
into the same two lines itself (upstream_tests.refused).
"""

from __future__ import annotations

from fidev.core.failure import USAGE, Failure


def pytest_main(task: str, args: list[str], plugins: list) -> int:
    """pytest.main(args, plugins=plugins) for `task`; a usage error is raised as a Failure with
    status 2 (pytest's own message as the error line), and pytest failing to start for a reason it
    printed itself (a conftest that cannot be imported) as one with status 1."""
    import pytest

    refusal = _refusal_plugin(pytest)
    code = pytest.main(args, plugins=[*plugins, refusal])
    if code != pytest.ExitCode.USAGE_ERROR:
        return code
    if refusal.message is None:
        raise Failure(
            f"pytest could not start the {task} suite (exit status {int(code)}): its ERROR above says why",
            "fix what it names",
        )
    lines = [line.strip() for line in refusal.message.splitlines() if line.strip()]
    said = next(
        (line.split("error: ", 1)[1] for line in lines if "error: " in line), lines[0] if lines else "no message"
    )
    raise Failure(
        f"{task}: pytest refused the arguments: {said}",
        f"see `{task} --help`; what {task} does not take goes to pytest (`python -m pytest --help` lists its options)",
        exit_status=USAGE,
    )


def _refusal_plugin(pytest):
    """A plugin that keeps pytest's usage error instead of letting pytest print it: an option
    nobody knows, found while pytest parses its arguments (pytest_cmdline_parse, which pytest calls
    for the plugins pytest.main is handed), or a -k/-m expression it cannot read, found once the
    session runs."""

    class Refusal:
        message: str | None = None

        @pytest.hookimpl(wrapper=True)
        def pytest_cmdline_parse(self, pluginmanager):
            try:
                return (yield)
            except pytest.UsageError as e:
                self.message = str(e)
                # Raised on, pytest.main would print it as its own ERROR: the config as far as it
                # got goes on instead, to a session that ends at once (below).
                return pluginmanager.get_plugin("pytestconfig")

        @pytest.hookimpl(tryfirst=True)
        def pytest_cmdline_main(self):
            if self.message is not None:
                return pytest.ExitCode.USAGE_ERROR  # nothing runs on arguments pytest refused
            return None

        @pytest.hookimpl(wrapper=True, specname="pytest_cmdline_main")
        def pytest_cmdline_main_wrapper(self):  # pytest registers only names that start with pytest_
            try:
                return (yield)
            except pytest.UsageError as e:
                self.message = str(e)
                return pytest.ExitCode.USAGE_ERROR

    return Refusal()
