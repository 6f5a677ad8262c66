"""upstream-tests' view of a run while it runs, from what its processes write (fidev.upstream.plugin:
each one's progress file, PROGRESS_SCHEMA, and the run's file of failing cases, STOP_FILE), never
from their output: cases done of those to run, failures so far, the time spent and an estimate of
the time left. On a terminal it is one line rewritten in place about every TTY_EVERY_S; where the
output is not a terminal (a log), a plain line every `every_s` seconds (--progress, EVERY_S by
default). The same watch stops the run early: once the run's processes have named --stop-after
failing cases, it calls the run's stop.

The estimate of the time left is the cases left at the rate so far; the cases of processes not yet
started are not known (they have not collected): each such process is taken to hold as many as
the started ones hold on average, and the line says how many have started.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fidev.core.failure import Failure
from fidev.core.files import MayLack, count, fits, read_record
from fidev.upstream.outcomes import PROGRESS_SCHEMA, failures_named

EVERY_S = 30  # in a log: a progress line this often (--progress SECONDS)
TTY_EVERY_S = 1  # on a terminal: the line rewritten this often
TICK_S = 0.25  # how often the watch reads the processes' files
STOP_GRACE_S = 10  # after the early stop's interrupt, how long a process may take to end before it is killed
STOP_FILE = "failing-cases"  # in the run folder: fidev.upstream.settings.STOP_FILE


class Board:
    """The run's terminal lines: plain lines, and on a terminal the progress line below them,
    cleared before each plain line and drawn again after it."""

    def __init__(self):
        self.lock = threading.Lock()
        self.shown = ""

    def write(self, text: str) -> None:
        try:
            sys.stdout.write(text)
            sys.stdout.flush()
        except OSError:  # a closed terminal (`| head`) cannot turn into a dead worker thread
            pass

    def say(self, line: str) -> None:
        with self.lock:
            self.write(("\r\033[K" if self.shown else "") + line + "\n" + self.shown)

    def show(self, line: str) -> None:
        """The progress line, in place (cut to the terminal's width, so that it stays one line)."""
        width = shutil.get_terminal_size((100, 24)).columns - 1
        with self.lock:
            self.shown = line[:width]
            self.write("\r\033[K" + self.shown)

    def clear(self) -> None:
        with self.lock:
            if self.shown:
                self.write("\r\033[K")
            self.shown = ""


BOARD = Board()


@dataclass
class Tally:
    """The run's progress, summed over its processes' files."""

    done: int = 0
    total: int = 0  # the cases to run of the processes that wrote a total
    failed: int = 0
    counted: int = 0  # processes whose total is known
    started: int = 0  # processes started
    processes: int = 0  # processes in the run


# A process's progress, as fidev.upstream.plugin writes it (Outcomes.progress), less its schema
PROGRESS = {
    "total": MayLack(lambda v: v is None or count(v)),
    "done": MayLack(count),
    "failed": MayLack(count),
    "t": MayLack(float),
}


def read_progress(path: Path) -> dict | None:
    """A process's progress; None before its first write (it is written whole: never half), and
    where it is of another shape than PROGRESS."""
    try:
        data = read_record(path, PROGRESS_SCHEMA, "a test process's progress", "")
    except Failure:
        return None
    return data if fits(data, PROGRESS) else None


def tally(run_dir: Path, started: int, processes: int) -> Tally:
    found = Tally(started=started, processes=processes)
    for path in run_dir.glob("*.jsonl.progress"):
        data = read_progress(path)
        if data is None:
            continue
        found.done += int(data.get("done") or 0)
        found.failed += int(data.get("failed") or 0)
        if isinstance(data.get("total"), int):
            found.total += data["total"]
            found.counted += 1
    found.failed = max(found.failed, len(failures_named(run_dir / STOP_FILE)))
    return found


def duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def left_s(t: Tally, spent: float) -> float | None:
    """The time left at the rate so far; None before a case is done or a total is known."""
    if t.done == 0 or t.counted == 0 or spent <= 0:
        return None
    expected = t.total + (t.processes - t.counted) * t.total / t.counted  # processes not yet counted: the average
    return max(0.0, expected - t.done) * spent / t.done


def line(t: Tally, spent: float) -> str:
    """ "upstream-tests: progress: 120 of 480 cases done, 2 failed, 1 min 05 s spent, about 3 min 15 s left"
    (where some processes have not counted their cases yet: "of 480+", or "of ?" where none has, and
    how many have started)."""
    of = "?" if not t.counted else f"{t.total}{'' if t.counted == t.processes else '+'}"
    left = left_s(t, spent)
    text = f"upstream-tests: progress: {t.done} of {of} cases done, {t.failed} failed, {duration(spent)} spent, " + (
        f"about {duration(left)} left" if left is not None else "time left not known yet"
    )
    return text + (f" ({t.started} of {t.processes} processes started)" if t.counted < t.processes else "")


class Watch:
    """A thread that shows the run's progress and stops it early: `stop_early` once the run's
    failing cases reach `stop_after` (0: never), then `kill` STOP_GRACE_S later for what still runs."""

    def __init__(
        self,
        run_dir: Path,
        processes: int,
        stop_after: int,
        every_s: float,
        stop_early: Callable[[], None],
        kill: Callable[[], None],
        tty: bool | None = None,
    ):
        self.run_dir, self.processes, self.stop_after = run_dir, processes, stop_after
        self.tty = sys.stdout.isatty() if tty is None else tty
        self.every_s = (TTY_EVERY_S if every_s else 0) if self.tty else every_s  # 0: no progress shown
        self.stop_early, self.kill = stop_early, kill
        self.started = 0  # processes started, counted by the run
        self.stopped_at: float | None = None
        self.lock = threading.Lock()
        self.clock = time.perf_counter()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def end(self) -> None:
        self.done.set()
        self.thread.join(timeout=10)
        BOARD.clear()

    def check_stop(self) -> None:
        """The run's early stop, where its failing cases reached stop_after (also asked by the run
        before it starts a process, so that none starts between two of the watch's reads)."""
        with self.lock:
            self.check_stop_locked()

    def check_stop_locked(self) -> None:
        if (
            self.stopped_at is None
            and self.stop_after
            and len(failures_named(self.run_dir / STOP_FILE)) >= self.stop_after
        ):
            self.stopped_at = time.perf_counter()
            self.stop_early()
        elif self.stopped_at is not None and time.perf_counter() - self.stopped_at > STOP_GRACE_S:
            self.kill()

    def loop(self) -> None:
        said = time.perf_counter()
        while not self.done.wait(TICK_S):
            self.check_stop()
            if self.every_s and time.perf_counter() - said >= self.every_s:
                said = time.perf_counter()
                text = line(tally(self.run_dir, self.started, self.processes), said - self.clock)
                (BOARD.show if self.tty else BOARD.say)(text)
