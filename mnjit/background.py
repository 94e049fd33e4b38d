"""The process's one background thread for target="auto" (mnjit/tiering.py): compiles and comparisons run
there in order, never on a caller's thread."""
from __future__ import annotations

import atexit
import os
import queue
import threading
from typing import Callable

MAX_JOBS = 64  # queued background jobs per process (compiles and comparisons)


class Worker:
    """The process's one background thread (a daemon, started on first use) and its bounded queue."""

    def __init__(self) -> None:
        self._queue: queue.Queue = queue.Queue(MAX_JOBS)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._stopped = False
        self._busy = False

    def submit(self, job: Callable[[], None]) -> bool:
        with self._lock:
            if self._stopped:
                return False
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="mnjit-tiering", daemon=True)
                self._thread.start()
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            return False
        return True

    def _loop(self) -> None:
        while True:
            job = self._queue.get()
            if not self._stopped:
                self._busy = True
                job()  # jobs catch their own errors
                self._busy = False
            # A daemon thread's frame outlives the interpreter: it must not keep a signature's runners alive.
            del job

    @property
    def busy(self) -> bool:
        """Whether a job is running now (at exit: one that will not finish)."""
        return self._busy

    def stop(self) -> None:
        """At exit: start no more jobs (a compile under way is not waited for)."""
        self._stopped = True

    def after_fork(self) -> None:
        """The child has no worker thread: it starts its own on first use, with an empty queue."""
        self._queue, self._thread, self._lock = queue.Queue(MAX_JOBS), None, threading.Lock()


WORKER = Worker()
atexit.register(WORKER.stop)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=WORKER.after_fork)
