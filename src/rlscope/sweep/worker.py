"""A sweep's worker process: ``python -m rlscope.sweep.worker PARENT_PID TASKS_FD RESULTS_FD``.

Started by `rlscope.sweep.processes.Workers`; it dies with the sweep (`die_with_parent`) and
runs the runs it is sent one after another (`rlscope.sweep.runner.execute`). Its own module, so
that the process machinery does not import the runner that uses it.
"""

from __future__ import annotations

import os
import pickle
import sys
from collections.abc import Sequence

from rlscope.sweep.processes import die_with_parent


def worker_main(argv: Sequence[str]) -> int:
    """A worker: ``PARENT_PID TASKS_FD RESULTS_FD``. Reads pickled ``(log, task)`` pairs from
    TASKS_FD until it closes; for each, sends its console output (file descriptors 1 and 2) to
    the log, runs the task (`rlscope.sweep.runner.execute`) and writes the pickled outcome to
    RESULTS_FD."""
    parent, tasks_fd, results_fd = (int(a) for a in argv[:3])
    die_with_parent(parent)  # before torch loads: a sweep killed meanwhile takes this along
    from rlscope.sweep.runner import execute


    with os.fdopen(tasks_fd, "rb") as tasks, os.fdopen(results_fd, "wb") as results:
        while True:
            try:
                log, task = pickle.load(tasks)
            except EOFError:
                return 0
            fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.close(fd)
            outcome = execute(task)
            sys.stdout.flush()
            sys.stderr.flush()
            pickle.dump(outcome, results)
            results.flush()


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1:]))
