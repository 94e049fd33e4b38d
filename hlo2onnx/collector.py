"""The cyclic garbage collector, paused while a translation runs.

Translation allocates hundreds of thousands of small objects (onnx-ir nodes, values, attributes), which
triggers the collector hundreds of times; its full collections walk every live object of the process
(jax's and the MLIR module's too), so they cost more the larger the model: a quarter of a 64-layer
transformer's translation (measured with gc.callbacks). The objects translation drops are few and are
collected after it. Reference counting still frees everything acyclic at once.
"""
from __future__ import annotations

import gc
import threading
from contextlib import contextmanager
from typing import Iterator

# The collector is one per process: pauses from several threads are counted, and the first one to start
# remembers whether it was enabled, so the last one to end restores that (a caller's gc.disable() stays).
_lock = threading.Lock()
_active = 0
_was_enabled = False


@contextmanager
def paused() -> Iterator[None]:
    """Runs the block with automatic garbage collection off; restores the collector's state after."""
    global _active, _was_enabled  # noqa: PLW0603 (the process's collector is global state itself)
    with _lock:
        if _active == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _active += 1
    try:
        yield
    finally:
        with _lock:
            _active -= 1
            if _active == 0 and _was_enabled:
                gc.enable()
