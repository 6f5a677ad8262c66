"""What an interrupted task says and its status, and the handler a task's first import installs
(fidev.core.task_start), with nothing installed here: fidev.core.failure takes them too, and a process that imports
the library without being a task (pytest's, running the GPU suites or the CPU tests) keeps its own handlers.
Standard library only, and only what a bare interpreter has loaded: the handler is a plain function, the object
`signal.getsignal` gives back."""

import os

INTERRUPTED = 130  # the shell's status for a process ended by SIGINT
LINE = "error: interrupted; nothing was left half-written"


def before_main(signum, frame):
    """Until run_main takes over, the task only imports: nothing has started and nothing is being written, so the
    line is said and the process ends at once."""
    try:
        os.write(2, f"{LINE}\n".encode())
    except OSError:  # no stderr to say it on: the status says it
        pass
    os._exit(INTERRUPTED)
