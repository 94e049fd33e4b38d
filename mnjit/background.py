"""The process's one background thread for target="auto" (mnjit/tiering.py): compiles and comparisons run
there in order, never on a caller's thread.

At exit the interpreter waits for the job under way, up to EXIT_WAIT_S: a daemon thread left running native
code (MLIR's passes over a module, XLA's compiler, ORT or IREE) while the interpreter tears down crashed the
process at exit (a segmentation fault in the garbage collector's last pass, or an abort; measured on a script
that exits right after its first call). Exit does not wait while the job waits for IREE's compiler, a
subprocess (`unguarded`): a thread blocked on another process is safe to abandon.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import queue
import threading
from typing import Callable

MAX_JOBS = 64  # queued background jobs per process (compiles and comparisons)
EXIT_WAIT_S = 30.0  # the longest exit waits for a job's native step; past it, exit goes on regardless


class Worker:
    """The process's one background thread (a daemon, started on first use) and its bounded queue."""

    def __init__(self) -> None:
        self._queue: queue.Queue = queue.Queue(MAX_JOBS)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._stopped = False
        self._busy = False
        # Held while a job runs, except around waits for other processes; exit takes it and never gives it back.
        self._guard = threading.Lock()

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
            with self._guard:  # at exit, blocks here for good
                if not self._stopped:
                    self._busy = True
                    job()  # jobs catch their own errors
                    self._busy = False
            # A daemon thread's frame outlives the interpreter: it must not keep a signature's runners alive.
            del job

    @contextlib.contextmanager
    def unguarded(self):
        """Around a wait for another process (IREE's compiler): exit need not wait for it. A no-op on other
        threads. Once exit has begun, the worker stays blocked where the block ends."""
        on_worker = threading.current_thread() is self._thread
        if on_worker:
            self._guard.release()
        try:
            yield
        finally:
            if on_worker:
                self._guard.acquire()

    @property
    def busy(self) -> bool:
        """Whether a job is running now."""
        return self._busy

    def stop(self) -> None:
        """At exit: start no more jobs, and wait for the job under way to finish or to reach a wait for another
        process (at most EXIT_WAIT_S); the guard stays taken, so the worker runs nothing more."""
        self._stopped = True
        self._guard.acquire(timeout=EXIT_WAIT_S)

    def after_fork(self) -> None:
        """The child has no worker thread: it starts its own on first use, with an empty queue."""
        self._queue, self._thread, self._lock = queue.Queue(MAX_JOBS), None, threading.Lock()
        self._guard, self._busy = threading.Lock(), False


WORKER = Worker()
atexit.register(WORKER.stop)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=WORKER.after_fork)
