"""Ctrl-C during translation propagates: from a rewrite rule, and from a garbage-collector callback.

A SIGINT's KeyboardInterrupt is raised at whatever bytecode the main thread runs next; during translation
that is often a gc callback (jax registers one), where CPython only reports the exception and goes on.
The tests raise it in both places from inside a fusion rule's check (our own Fusion.available, patched).
"""
from __future__ import annotations

import gc
import sys

import jax
import pytest

import hlo2onnx
from harness import assert_same, rand
from hlo2onnx.interrupts import InterruptGuard, checkpoint
from hlo2onnx.patterns.base import Fusion
from mnjit import mnjit


def _gelu_mlp(x, w):
    return jax.nn.gelu(x @ w + 1.0, approximate=False).sum(-1)


def _interrupt_in_gc_callback() -> None:
    """What a SIGINT landing in jax's gc callback does: a KeyboardInterrupt CPython can only report."""
    def callback(phase, info):
        if phase == "start":
            raise KeyboardInterrupt

    gc.callbacks.insert(0, callback)
    try:
        gc.collect()
    finally:
        gc.callbacks.remove(callback)


def _interrupt_directly() -> None:
    raise KeyboardInterrupt


@pytest.mark.parametrize("interrupt", [_interrupt_directly, _interrupt_in_gc_callback])
@pytest.mark.parametrize("entry", ["mnjit", "translate", "convert"])
def test_interrupt_inside_a_rule_propagates(monkeypatch, interrupt, entry):
    args = (rand((5, 8)), rand((8, 4), seed=1))
    calls = []
    available = Fusion.available

    def interrupted(self, *a, **k):
        if not calls:
            calls.append(type(self).__name__)
            interrupt()
        return available(self, *a, **k)

    monkeypatch.setattr(Fusion, "available", interrupted)
    f = mnjit(_gelu_mlp)
    module = jax.jit(_gelu_mlp).lower(*args).compiler_ir("stablehlo")
    run = {"mnjit": lambda: f(*args), "translate": lambda: hlo2onnx.translate(module),
           "convert": lambda: hlo2onnx.convert(module)}[entry]
    with pytest.raises(KeyboardInterrupt):
        run()
    assert calls, "no rule reached the hook"
    # The interrupted translation left nothing behind: the next one is right (the rule sets were reused).
    assert f.cache_size == 0
    assert_same(f(*args), jax.jit(_gelu_mlp)(*args))


def test_guard_leaves_other_unraisable_exceptions_to_the_previous_hook(monkeypatch):
    seen = []

    class Noisy:
        def __del__(self):
            raise ValueError("in __del__")

    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: seen.append(unraisable.exc_type))
    with InterruptGuard():
        Noisy()
        checkpoint()  # no interrupt was taken: nothing raised
    assert seen == [ValueError]
    assert sys.unraisablehook is not None and not isinstance(sys.unraisablehook, InterruptGuard)
