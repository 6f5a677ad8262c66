"""How every script of the workspace fails: one line naming the problem, one line with the fix,
never a traceback."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import signal
import sys
import threading

from fidev.core import interrupts, shown

USAGE = 2  # argparse's status for bad usage
INTERRUPTED = interrupts.INTERRUPTED
BROKEN_PIPE = 141  # and for one ended by SIGPIPE


class Failure(Exception):
    def __init__(self, problem: str, fix: str, *, exit_status: int = 1):
        super().__init__(problem)
        self.problem = problem
        self.fix = fix
        self.exit_status = (
            exit_status  # USAGE for bad usage that shows only past argparse (a combination of options, pytest's own)
        )


def one_line(text: str) -> str:
    """`text` as one line: a line break in it (a path named with one) written as `\\n` (`\\r`), and any other
    character that is not printable (NUL, an escape) as Python writes it (fidev.core.shown.printable), so that
    the problem and its fix stay two lines whatever they quote, and put nothing raw on the terminal."""
    return shown.printable(text)


def report(failure: Failure) -> None:
    print(f"error: {one_line(failure.problem)}", file=sys.stderr)
    print(f"  fix: {one_line(failure.fix)}", file=sys.stderr)


def exit_now(status: int):
    """sys.exit(status) less the interpreter's teardown of every module, which a process that
    imported torch pays once its work is done, between its last line and its end (docs/measurements.md,
    row "interpreter teardown of torch at a process's end"): what was registered to run at exit still
    runs, and the standard streams are flushed first. Daemon threads are left, as at any exit."""
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader that went away, a stream closed
            pass
    os._exit(status)


_INTERRUPTED = threading.Event()  # Ctrl-C (or SIGTERM) came since run_main started, whatever became of what it raised
_answered = False  # main's answer is out (its output flushed), or being said (a failure's lines): it stands
_holding = 0  # within interrupts_held: an interrupt is noted (_held), and raised as the outermost ends
_held = False
STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # what run_main ignores once the answer is out


def _interrupt(signum, frame):
    global _held
    if _answered:  # an interrupt that comes after the answer changes nothing
        return
    _INTERRUPTED.set()
    if _holding:
        _held = True
        return
    raise KeyboardInterrupt


@contextlib.contextmanager
def interrupts_held():
    """Ctrl-C or SIGTERM within waits for its end, then raises KeyboardInterrupt. For torch's first import
    (and flashinfer's, which imports it): its C++ start-up runs Python (its extension imports numpy), where a
    KeyboardInterrupt is swallowed, torch taking numpy for missing and the task going on as if no Ctrl-C came,
    or aborts the process (pybind11's error through C++'s terminate: SIGABRT, no line)."""
    global _holding, _held
    _holding += 1
    try:
        yield
    finally:
        _holding -= 1
        if not _holding and _held:  # also in place of what the import raised meanwhile
            _held = False
            raise KeyboardInterrupt


def stop_as_ctrl_c(signum: int) -> None:
    """Another signal (SIGHUP: a closed terminal or ssh session) stops the task as Ctrl-C and SIGTERM do:
    KeyboardInterrupt while main runs, nothing once its answer is out."""
    signal.signal(signum, _interrupt)


def interrupted() -> bool:
    """Whether Ctrl-C (or SIGTERM) came since run_main started: also where its KeyboardInterrupt was
    swallowed on the way (a library's bare `except`, an object's finalizer, whose exceptions Python
    only prints), so that a task can end as interrupted all the same (fidev.smoke.gpu_suite)."""
    return _INTERRUPTED.is_set()


def run_main(main) -> int:
    """Call main(); a Failure becomes the two lines and its exit status (1 unless it says USAGE), Ctrl-C (or
    SIGTERM) one line and status 130 (whatever was being written is removed by the `finally` blocks on the way
    out), and a reader that went away (`| head`) ends the output quietly. Before it, the task's first import
    said an interrupt itself (fidev.core.task_start); once main's answer is out (its output flushed, or its
    failure being said), an interrupt changes nothing: the status is the answer's, and Ctrl-C, SIGTERM and
    SIGHUP are ignored for the rest of the process, whose teardown would otherwise die of one without a
    line (Python puts the default action back as it ends) or print a traceback."""
    # A CI timeout or `kill` sends SIGTERM: unwind the same way as Ctrl-C, so that the `finally`
    # blocks remove what was being written. Ctrl-C is noted too (where it is not ignored: a job a
    # shell started in the background keeps ignoring it).
    global _answered
    _answered = False
    _INTERRUPTED.clear()
    signal.signal(signal.SIGTERM, _interrupt)
    if signal.getsignal(signal.SIGINT) in (signal.default_int_handler, interrupts.before_main):
        signal.signal(signal.SIGINT, _interrupt)
    try:
        return _answer(main)
    finally:
        _answered = True  # also for an exit of main's own (argparse's usage error, --help)
        for signum in STOPS:
            signal.signal(signum, signal.SIG_IGN)


def _answer(main) -> int:
    global _answered
    try:
        try:
            status = main() or 0
        finally:
            sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit (also after --help)
        _answered = True
        return status
    except Failure as failure:
        _answered = True
        report(failure)
        return failure.exit_status
    except KeyboardInterrupt:
        _answered = True
        print(interrupts.LINE, file=sys.stderr)
        return INTERRUPTED
    except BrokenPipeError:
        _answered = True
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's flush at exit must not fail again
        return BROKEN_PIPE


# Between a usage error's problem and its fix (usage, option): a character no one types, so that a line break
# in what the user gave, quoted in either, is never taken for it (argparse's own messages quote it too).
_FIX = "\x1e"


def usage(problem: str, fix: str) -> str:
    """A usage error's message for ArgumentParser.error: the problem, then its fix."""
    return f"{problem}{_FIX}{fix}"


def split_usage(message: str) -> tuple[str, str | None]:
    """(problem, fix) of a usage error's message, each one line (one_line); fix None where it names none
    (argparse's own messages)."""
    problem, sep, fix = message.partition(_FIX)
    return one_line(problem), one_line(fix) if sep else None


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose usage errors keep the contract too: two lines, status 2."""

    def error(self, message: str):
        problem, fix = split_usage(message)
        print(f"error: {problem}", file=sys.stderr)
        print(f"  fix: {fix or f'see `{self.prog} --help`'}", file=sys.stderr)
        sys.exit(USAGE)


def option(parse):
    """An argparse `type` from a parser that raises Failure: a bad value is then a usage error
    (two lines, status 2) that names the option."""

    def convert(text: str):
        try:
            return parse(text)
        except Failure as failure:
            raise argparse.ArgumentTypeError(usage(failure.problem, failure.fix)) from failure

    convert.__name__ = getattr(parse, "__name__", "value")
    return convert
