"""A task's first import (a script's first line, a maintainer tool's once its sys.path names fidev): from
then on Ctrl-C or SIGTERM is our line and status 130, never Python's KeyboardInterrupt traceback nor a
death by SIGTERM without a word. Until run_main takes over (fidev.core.failure), the task only imports:
nothing has started and nothing is being written, so the line is said and the process ends at once.
It comes before the task's other imports, and imports only what a bare interpreter has loaded, `_signal`,
the built-in module `signal` wraps (`signal` imports enum: 3 ms of the start this module is there to cover), and
fidev.core.interrupts, whose handler it installs: importing this module installs it, so only a task imports it
(a process that imports the library, pytest's, keeps its own handlers: fidev.core.failure imports interrupts)."""

import _signal

from fidev.core.interrupts import before_main

_signal.signal(_signal.SIGTERM, before_main)
if _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler:  # not where inherited ignored (a background job)
    _signal.signal(_signal.SIGINT, before_main)
