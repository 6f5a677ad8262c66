"""A task's first import (a script's first line, a maintainer tool's once its sys.path names fidev): from
then on Ctrl-C or SIGTERM is our line and status 130, never Python's KeyboardInterrupt traceback nor a
death by SIGTERM without a word. Until run_main takes over (fidev.core.failure), the task only imports:
nothing has started and nothing is being written, so the line is said and the process ends at once.
It comes before the task's other imports, and imports only what a bare interpreter has loaded and `_signal`,
the built-in module `signal` wraps (`signal` imports enum: 3 ms of the start this module is there to cover).
Its handlers are plain functions, the objects `signal.getsignal` gives back."""

import _signal
import os

INTERRUPTED = 130  # the shell's status for a process ended by SIGINT
LINE = "error: interrupted; nothing was left half-written"


def before_main(signum, frame):
    try:
        os.write(2, f"{LINE}\n".encode())
    except OSError:  # no stderr to say it on: the status says it
        pass
    os._exit(INTERRUPTED)


_signal.signal(_signal.SIGTERM, before_main)
if _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler:  # not where inherited ignored (a background job)
    _signal.signal(_signal.SIGINT, before_main)
