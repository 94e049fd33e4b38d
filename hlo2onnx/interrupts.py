"""Ctrl-C during translation: raised, never lost in a garbage-collector callback.

Python runs the SIGINT handler at the next bytecode the main thread executes. Translation makes much
cyclic garbage, so that is often inside a callback the garbage collector runs (jax registers one), and
an exception there cannot propagate: CPython hands it to `sys.unraisablehook`, prints "Exception
ignored" and goes on, so the interrupt was lost (measured: 2 of 6 Ctrl-Cs during a translation loop).

`InterruptGuard` takes such interrupts while a translation runs and raises KeyboardInterrupt at the next
`checkpoint()` (once per op and per rewrite rule) or when the translation ends.
"""
from __future__ import annotations

import sys
import threading
from types import TracebackType


class InterruptGuard:
    """A context manager that keeps KeyboardInterrupts raised where Python can only report them.

    Only the main thread receives SIGINT, so only there is the hook installed; elsewhere it does nothing.
    Guards nest (an inner one's interrupt propagates through the outer one).
    """

    def __init__(self) -> None:
        self.interrupted = False
        self._previous = None

    def __call__(self, unraisable) -> None:  # the unraisable hook while the guard is active
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            self.interrupted = True
        else:
            self._previous(unraisable)

    def __enter__(self) -> InterruptGuard:
        if threading.current_thread() is threading.main_thread():
            self._previous, sys.unraisablehook = sys.unraisablehook, self
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._previous is not None:
            if sys.unraisablehook is self:  # else someone replaced it meanwhile: theirs stays
                sys.unraisablehook = self._previous
            self._previous = None
        # Ctrl-C wins over an error raised after it (that error stays attached as the context).
        if self.interrupted and not (exc_type is not None and issubclass(exc_type, KeyboardInterrupt)):
            raise KeyboardInterrupt


def checkpoint() -> None:
    """Raises KeyboardInterrupt if the active guard took one; cheap enough to call once per op."""
    hook = sys.unraisablehook
    # The guard belongs to the main thread: another thread's checkpoint must not take its interrupt.
    if isinstance(hook, InterruptGuard) and hook.interrupted and threading.current_thread() is threading.main_thread():
        hook.interrupted = False  # raised once; the guard's exit sees the KeyboardInterrupt pass
        raise KeyboardInterrupt
