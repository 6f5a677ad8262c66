"""pytest's usage errors as the workspace's two lines and status 2.

smoke, abi-smoke and upstream-tests hand the arguments they do not know to pytest, so pytest is
the one that finds an option nobody knows (`smoke.py --bogus`) or a bad -k/-m expression. It
reports those with its own `ERROR:` lines and exit status 4; the plugin here keeps the message
instead, and `pytest_main` raises it as a Failure with the usage status. upstream-tests runs each
test file in a pytest process of its own (fidev.upstream.runs) and turns every file's status 4
into the same two lines itself (upstream_tests.refused).

The paths among those arguments are checked before pytest starts (refuse_odd_paths), as the tasks check
their own: pytest would wait forever on a FIFO named as its JUnit XML or config file, and fail on
/dev/full with its own traceback.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterator

from fidev.core.failure import USAGE, Failure
from fidev.core.files import not_a_file, not_a_folder, output_file, output_folder

# pytest's options (8 and 9) that name a path, by what pytest does with it: a file it writes (--debug's value
# may be left out: pytestdebug.log), a file it reads, a folder it reads, a folder it makes (and empties)
WRITES = ("--junitxml", "--junit-xml", "--log-file", "--debug")
READS = ("-c", "--config-file")
FOLDERS = ("--rootdir", "--confcutdir")
MAKES = ("--basetemp",)
INI_WRITES = ("log_file",)  # the ini keys -o/--override-ini may set to a file pytest writes
OVERRIDE = ("-o", "--override-ini")
TAKES_VALUE = (*WRITES, *READS, *FOLDERS, *MAKES, *OVERRIDE)


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


def refuse_odd_paths(task: str, args: list[str]) -> None:
    """Two lines, status 2, where a path `args` (pytest's arguments, and PYTEST_ADDOPTS', which pytest reads too)
    names for pytest is not what its option needs: a file pytest writes (--junitxml, --log-file, -o log_file=)
    checked as the tasks check their own outputs (fidev.core.files.output_file: a FIFO, a device, a folder is
    refused), a config file (-c) that is no regular file, a folder that is none (--rootdir, --confcutdir,
    --basetemp)."""
    try:
        added = shlex.split(os.environ.get("PYTEST_ADDOPTS", ""))
    except ValueError:  # pytest refuses it itself
        added = []
    for where, given in (("", args), ("PYTEST_ADDOPTS: ", added)):
        for option, value in path_options(given):
            why = _odd_path(option, value)
            if why is not None:
                raise Failure(f"{task}: {where}pytest's {option} {why[0]}", why[1], exit_status=USAGE)


def _odd_path(option: str, value: str) -> tuple[str, str] | None:
    """(problem, fix) where `value` is no path of the kind `option` needs; None where it is one. os.devnull is
    one to write to and to read (pytest's own default log file, and an empty configuration)."""
    if value == os.devnull and option not in (*FOLDERS, *MAKES):
        return None
    if option in WRITES or option == "-o log_file":
        why = not_a_file(value)
        if why is not None and why != "does not exist":  # pytest writes through it: it would wait on a FIFO
            return f"{value} {why}", "name a regular file, or a path where nothing is yet"
        return _refusal(output_file, value)
    if option in MAKES:
        return _refusal(output_folder, value)
    if option in READS:
        why = not_a_file(value)
        return (f"{value} {why}", "name a regular file, the pytest configuration to read") if why else None
    value = os.path.expandvars(value) if option == "--rootdir" else value  # pytest expands $HOME there
    why = not_a_folder(value)
    if option == "--confcutdir" and why == "does not exist":  # a bound on where conftests are read: none past it
        return None
    return (f"{value} {why}", "name a folder that exists") if why else None


def _refusal(check, value: str) -> tuple[str, str] | None:
    """(problem, fix) of the Failure `check(value)` raises (an output's own check), else None."""
    try:
        check(value)
    except Failure as failure:
        return failure.problem, failure.fix
    return None


def path_options(args: list[str]) -> Iterator[tuple[str, str]]:
    """(option, path) of each path option in pytest's arguments, as pytest's argparse reads them: `--opt PATH`,
    `--opt=PATH`, `-c PATH`, `-c=PATH`, `-cPATH`; -o's `log_file=PATH` as the option `-o log_file`. Up to `--`."""
    i = 0
    while i < len(args):
        arg, i = args[i], i + 1
        if arg == "--":
            return
        name, value = _split(arg)
        if name not in TAKES_VALUE:
            continue
        if value is None:
            if name == "--debug" and (i >= len(args) or args[i].startswith("-")):
                value = "pytestdebug.log"  # its value left out: pytest's default, in the current folder
            elif i < len(args):
                value, i = args[i], i + 1
            else:
                continue  # pytest says a value is missing
        if name in OVERRIDE:
            key, equals, value = value.partition("=")
            if not equals or key.strip() not in INI_WRITES:
                continue
            name = f"-o {key.strip()}"
        yield name, value


def _split(arg: str) -> tuple[str, str | None]:
    """(option, its value where given in the same argument) of one of pytest's arguments."""
    if arg.startswith("--"):
        name, equals, value = arg.partition("=")
        return name, value if equals else None
    if arg.startswith("-") and len(arg) > 2 and arg[:2] in TAKES_VALUE:  # -cPATH, -c=PATH
        return arg[:2], arg[3:] if arg[2] == "=" else arg[2:]
    return arg, None
