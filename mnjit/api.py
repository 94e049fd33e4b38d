"""The mnjit decorator: jax.jit's capture and cache, ONNX Runtime's execution."""
from __future__ import annotations

import collections
import functools
import threading
import types
import warnings
from typing import Any, Callable, Hashable, Iterable

import jax
from jax import core

import hlo2onnx
from hlo2onnx import compat
from hlo2onnx.interrupts import InterruptGuard
from hlo2onnx.pipeline import resolve_opset
from mnjit import ffi, iree_tier, jit_options, tiering
from mnjit.capture import AnyLowered, CacheEntry, Capture, Pending
from mnjit.device import own_ort_cpu, require as require_runtime  # (mnjit's `device` parameter shadows the module)
from mnjit.fast_call import PythonPath, Routed, TracerSeen, leaf_signature, runner_for
from mnjit.stages import Compiled

_flatten = jax.tree_util.tree_flatten


class MnjitFunction:
    """A function compiled to ONNX and run on ONNX Runtime; call it like jax.jit's result."""

    def __init__(self, fun: Callable, *, static_argnums=None, static_argnames=None,
                 target: str | hlo2onnx.Target = "ort-cpu", opset: int | None = None,
                 max_cache_size: int | None = None, donate_argnums=None, donate_argnames=None,
                 fallback: bool = False, tier_policy: tiering.TierPolicy | None = None, keep_unused: bool = False,
                 inline: bool = False, compiler_options: dict | None = None, device: Any = None,
                 backend: str | None = None, in_shardings: Any = None, out_shardings: Any = None):
        if not callable(fun):
            raise TypeError(f"mnjit expects a callable, got {type(fun).__name__}")
        if max_cache_size is not None and max_cache_size < 1:
            raise ValueError(f"max_cache_size must be at least 1 (or None), got {max_cache_size}")
        functools.update_wrapper(self, fun)
        self._fun = fun
        self._static_argnums, self._static_argnames = jit_options.normalize_static(fun, static_argnums, static_argnames)
        # "auto": ort-cpu's translation and runners, with a compiled tier built behind them (mnjit/tiering.py).
        auto = isinstance(target, str) and target == "auto"
        if tier_policy is not None and not auto:
            raise ValueError("tier_policy applies to target='auto' only")
        self._target = hlo2onnx.targets.get(tiering.BASE if auto else target)
        jit_options.check_placement(self._target, device, backend, in_shardings, out_shardings)
        require_runtime(self._target)  # a missing runtime or device is refused now, never run elsewhere
        self._opset = resolve_opset(self._target, opset)  # a ValueError now: ORT would refuse it at the first call
        self._fallback = bool(fallback)  # split the program: what the target cannot run goes to jax.jit
        # donate_* are accepted for drop-in compatibility; ORT allocates fresh outputs anyway.
        # keep_unused: jit would drop unused arguments and shift the inputs (docs/runtime.md); a caller's
        # keep_unused changes nothing they can see. inline and compiler_options apply where jax.jit runs the function
        # (under a transformation, and the partitions fallback=True leaves to XLA).
        self._jitted = jax.jit(fun, static_argnums=self._static_argnums, static_argnames=self._static_argnames,
                               keep_unused=True, inline=inline, compiler_options=compiler_options)
        self._capture = Capture(self._jitted, self._target, self._opset, getattr(fun, "__name__", "main"),
                                self._fallback)
        # The fast path: jax.jit's own C++ dispatch, whose trace runs the ONNX model as a custom call
        # (mnjit/ffi.py). Signatures it cannot take (slow runs, loops, other targets) use the Python path, and so
        # does a capped cache: jax.jit's hits are invisible to mnjit, which could not keep LRU order. A fallback
        # function's partitions all run inside that one jax.jit (mnjit/fallback.py, `fused`).
        self._fast_ok = own_ort_cpu(self._target) and max_cache_size is None

        def dispatch(*args, **kwargs):
            return self._traced_call(*args, **kwargs)
        functools.update_wrapper(dispatch, fun)  # jax's errors name the user's function and argument paths
        self._dispatch = jax.jit(dispatch, static_argnums=self._static_argnums,
                                 static_argnames=self._static_argnames, keep_unused=True)
        # Least recently used first when capped (like XLA's compilation cache); a plain dict otherwise.
        self._cache: dict[Hashable, CacheEntry] = collections.OrderedDict() if max_cache_size else {}
        self._max_cache_size = max_cache_size
        # Guards the cache, `_pending` and `translations` (threads call one function at once, like jax.jit);
        # never held while translating.
        self._lock = threading.Lock()
        self._pending: dict[Hashable, Pending] = {}
        self.translations = 0  # how many signatures were translated (a cache miss each)
        self._nnx_warned = False  # warned once that nnx objects' updates are dropped (checked on misses only)
        self._tiers = tiering.Tiering(tier_policy or tiering.TierPolicy(), functools.partial(
            iree_tier.iree_tier, opset=self._opset, name=getattr(fun, "__name__", "main"), make_runner=runner_for),
            iree_tier.unavailable_reason()) if auto else None

    # -- calling -----------------------------------------------------------------
    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        """A bound method when it decorates one, as jax.jit's result is (`self` is then argument 0)."""
        return self if instance is None else types.MethodType(self, instance)

    def __deepcopy__(self, memo: dict) -> MnjitFunction:
        return self  # as a Python function's (jax.jit's copy shares its function and cache); locks do not copy

    def __call__(self, *args, **kwargs):
        """One call: jax.jit's C++ dispatch of the fast path where the function has one, else the Python path.
        The fast path is inline: one Python frame before jax.jit's dispatch (each one more costs 0.1-0.3 us)."""
        if compat.disable_jit_state.value:  # as jax.jit's: the function runs op by op (print, pdb, concrete values)
            return self._fun(*args, **kwargs)
        tiers, result = self._tiers, None
        try:
            # Under target="auto", a signature that runs or tries its compiled tier needs the Python path.
            if self._fast_ok and (tiers is None or not tiers.active) and compat.trace_state_clean():
                try:
                    result = self._dispatch(*args, **kwargs)
                except Exception:
                    result = self._fast_path_failed(args, kwargs)
            else:
                result = self._call_python(args, kwargs)
            return result
        finally:
            if tiers is not None:  # target="auto": a build this call deferred starts once it is done (release)
                tiers.release(result)

    def _fast_path_failed(self, args: tuple, kwargs: dict):
        """In the except block of a fast-path call: the call again where it can run, or the error re-raised."""
        try:
            raise  # the exception being handled, by its type
        except PythonPath:
            self._fast_ok = False  # this function has a signature the fast path cannot run
        except Routed:
            pass
        except FloatingPointError:  # jax_debug_nans/infs: jax.jit's run names the primitive, not the ORT call
            return self._jitted(*args, **kwargs)
        except (jax.errors.JaxRuntimeError, ValueError) as e:
            # Non-hashable static arguments: the Python path's error. A session another thread's clear_cache
            # released under this executable: the Python path runs the signature anew (jax.jit's clear_cache
            # fails no call in flight; jaxlib raises either type, by where the run was).
            if "hashable" not in str(e) and ffi.RELEASED not in str(e):
                raise
        return self._call_python(args, kwargs)

    def _traced_call(self, *args, **kwargs):
        """jax.jit's trace of one signature: the cached entry's custom call, or PythonPath."""
        static, dyn_args, dyn_kwargs = self._split(args, kwargs)
        leaves, treedef = _flatten((dyn_args, dyn_kwargs))
        signature = tuple((leaf.aval.shape, leaf.aval.dtype, leaf.aval.weak_type) for leaf in leaves)
        key = (treedef, signature, static, compat.trace_context(), jax.config.jax_enable_x64)
        entry = self._cache.get(key)
        if entry is None:
            abstract = jax.tree_util.tree_map(
                lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, weak_type=leaf.aval.weak_type)
                if isinstance(leaf, core.Tracer) else leaf, (args, kwargs))
            entry = self._lookup_or_compile(key, *abstract, fast=True)
            if entry.tier is not None and self._tiers.routed(entry.tier):
                raise Routed
        if entry.fast is None:
            raise PythonPath
        return jax.tree_util.tree_unflatten(entry.out_tree, entry.fast(list(leaves)))

    def _key(self, args: tuple, kwargs: dict) -> tuple[Hashable, list]:
        """The cache key of a call (arrays or ShapeDtypeStructs; TracerSeen for tracers) and its leaves."""
        static, dyn_args, dyn_kwargs = self._split(args, kwargs)
        leaves, treedef = _flatten((dyn_args, dyn_kwargs))
        # jax.jit's configuration too (compat.trace_context): threefry_partitionable changes random values.
        return (treedef, tuple(map(leaf_signature, leaves)), static, compat.trace_context(),
                jax.config.jax_enable_x64), leaves

    def _cached(self, key: Hashable) -> CacheEntry | None:
        try:
            return self._cache.get(key)  # lock-free: a lookup is atomic, and a hit is the hot path
        except TypeError as e:
            raise ValueError(f"non-hashable static arguments are not supported: {e}") from None

    def _call_python(self, args: tuple, kwargs: dict):
        try:
            # Under grad/vmap/an outer jit, or a trace closing over concrete arguments (checkify, an outer jit's
            # constants): staged exactly like jax.jit's call, effects running with the program, not at trace time.
            if not compat.trace_state_clean():
                raise TracerSeen
            key, leaves = self._key(args, kwargs)
        except TracerSeen:
            return self._jitted(*args, **kwargs)
        except TypeError:
            self._jitted.trace(*args, **kwargs)  # a non-array argument: jax.jit's error names the function and path
            raise
        entry = self._cached(key)
        if entry is None or self._max_cache_size:  # the capped LRU reorders on every hit, under the lock
            # An auto function takes this path while another signature tries IREE, and a fast one after its session
            # was released under it: the entry keeps its fast call.
            entry = self._lookup_or_compile(key, args, kwargs, fast=self._fast_ok)
        if entry.tier is not None:
            outputs = self._tiers.run(entry.tier, leaves, functools.partial(self._run_base, entry, args, kwargs))
        else:
            outputs = entry.runner.run(leaves)
        if jit_options.debug_check_fails(outputs):  # as jax.jit's dispatch: its run raises FloatingPointError
            return self._jitted(*args, **kwargs)
        return jax.tree_util.tree_unflatten(entry.out_tree, outputs)

    def _run_base(self, entry: CacheEntry, args: tuple, kwargs: dict, leaves: list) -> list:
        """target="auto": one call on ort-cpu, through its fast path where the signature has one."""
        if entry.fast is not None and self._fast_ok and compat.trace_state_clean():
            try:
                return _flatten(self._dispatch(*args, **kwargs))[0]
            except PythonPath:
                pass
        return entry.runner.run(leaves)

    def _lookup_or_compile(self, key: Hashable, args: tuple, kwargs: dict, fast: bool = False,
                           lowered: AnyLowered | None = None) -> CacheEntry:
        """The cached entry, or a new one: the first thread to miss a signature translates it (or takes
        `lowered`, this signature's translation already made), and threads missing it meanwhile wait for that
        result."""
        while True:
            with self._lock:
                entry = self._cache.get(key)
                if entry is not None:
                    if self._max_cache_size:
                        self._cache.move_to_end(key)
                    return entry
                pending = self._pending.get(key)
                owner = pending is None
                if owner:
                    pending = self._pending[key] = Pending()
            if not owner:
                pending.done.wait()
                if pending.entry is not None:
                    return pending.entry
                continue  # the translating thread failed (or was interrupted): try on our own
            try:
                pending.entry = self._compile(args, kwargs, fast, lowered, key[-1])
            finally:
                with self._lock:
                    del self._pending[key]
                    if pending.entry is not None:
                        self.translations += 1
                        self._cache[key] = pending.entry
                        if self._max_cache_size and len(self._cache) > self._max_cache_size:
                            self._cancel_tier(self._cache.popitem(last=False)[1])
                            # jax.jit's executables may name the evicted session: they must be traced again.
                            self._dispatch.clear_cache()
                pending.done.set()
            return pending.entry

    def _split(self, args: tuple, kwargs: dict) -> tuple[tuple, tuple, dict]:
        if not self._static_argnums and not self._static_argnames:
            return (), args, kwargs
        nums = self._static_argnums
        if nums and nums[0] < 0:  # only a function with *args keeps negative positions (jit_options)
            nums = jit_options.resolve_argnums(nums, len(args))
        positional = tuple(args[i] for i in nums if i < len(args))
        dyn_args = tuple(a for i, a in enumerate(args) if i not in nums)
        names = self._static_argnames
        keyword = tuple((k, kwargs[k]) for k in names if k in kwargs)
        dyn_kwargs = {k: v for k, v in kwargs.items() if k not in names}
        return jit_options.static_key(positional, keyword), dyn_args, dyn_kwargs

    # -- capture and translation -------------------------------------------------------
    def lower(self, *args, **kwargs) -> AnyLowered:
        """Captures and translates one signature. Arguments may be arrays or jax.ShapeDtypeStructs; shapes
        may hold symbolic dims (`jax.export.symbolic_shape("b, 3")`), which the model keeps as ONNX
        dim_params named as written (for `save`: mnjit itself runs concrete shapes)."""
        if jit_options.has_symbolic_dims((args, kwargs)):
            return self._capture.lower_symbolic(args, kwargs)
        lowered = self._capture.lower(args, kwargs)
        try:
            key = self._key(args, kwargs)[0]
        except TracerSeen:  # lowered under a trace: no signature of this function's cache
            return lowered
        lowered.compiler = functools.partial(self._compiled, lowered, key, args, kwargs)
        if self._tiers is not None:  # the report says which tier serves the signature when it is printed
            lowered.tier = functools.partial(self._tier_of, key)
        return lowered

    def _compiled(self, lowered, key: Hashable, lowered_args: tuple, kwargs: dict) -> Compiled:
        self._lookup_or_compile(key, lowered_args, kwargs, fast=self._fast_ok, lowered=lowered)  # cached now
        if self._tiers is not None:
            self._tiers.release(None)  # the signature's compiled tier builds from now
        positions = jit_options.resolve_argnums(self._static_argnums, len(lowered_args))
        static_kwargs = {k: kwargs[k] for k in self._static_argnames if k in kwargs}

        def call(dynamic_args: tuple, dynamic_kwargs: dict):
            # Called like jax's Compiled: with the dynamic arguments only; the static ones are the lowering's.
            jit_options.refuse_static_keywords(self.__name__, dynamic_kwargs, self._static_argnames)
            args = list(dynamic_args)
            for i in positions:
                args.insert(i, lowered_args[i])
            args = tuple(args)  # the key's tree holds the arguments' tuple: a list is another structure
            kwargs = {**dynamic_kwargs, **static_kwargs}
            try:
                other, leaves = self._key(args, kwargs)
            except TracerSeen:  # under a transformation: as the function itself (jax.jit's behaviour)
                other = key
            if other == key:
                return self(*args, **kwargs)
            if jit_options.call_types(other) != jit_options.call_types(key):
                raise TypeError(f"{self.__name__} was compiled for {jit_options.describe(key)} and called with "
                                f"{jit_options.describe(other)}")
            # jax's Compiled checks types without their weakness (a Python float for a float32[] argument, or a
            # float32[] for a weak one) or the x64 mode, and runs what it compiled: so does this.
            entry = self._lookup_or_compile(key, lowered_args, kwargs, lowered=lowered)
            return jax.tree_util.tree_unflatten(entry.out_tree, entry.runner.run(leaves))
        return Compiled(lowered, call)

    def trace(self, *args, **kwargs) -> jax.stages.Traced:
        """jax.jit's trace (its jaxpr and output types); `lower` gives the ONNX model."""
        return self._jitted.trace(*args, **kwargs)

    def eval_shape(self, *args, **kwargs):
        return self._jitted.eval_shape(*args, **kwargs)

    def _compile(self, args: tuple, kwargs: dict, fast: bool, lowered: AnyLowered | None, x64: bool) -> CacheEntry:
        if not self._nnx_warned and jit_options.holds_nnx_objects((args, kwargs)):
            self._nnx_warned = True
            warnings.warn(f"{self.__name__}: nnx objects (a Module, Optimizer, Rngs, Metric or Variable) among the "
                          "arguments run as their arrays, and what the function does to them is dropped, as under "
                          "jax.jit: use `from mnjit import nnx_jit` (nnx.jit's semantics)", stacklevel=4)
        # target="auto": the tier is started (its build queued, or a stored decision taken) before the entry is made:
        # a signature whose compiled tier serves from the first call needs no ORT session of its own.
        start_tier = None if self._tiers is None else lambda made: self._tiers.start(
            made.traced, x64, getattr(made, "cache_key", None))
        if own_ort_cpu(self._target):
            ffi.preload()  # ORT's library loads on a thread while this signature traces (at a call: not before a fork)
        with InterruptGuard():
            return self._capture.entry(args, kwargs, fast, lowered, start_tier)

    def clear_cache(self) -> None:
        with self._lock:
            for entry in self._cache.values():
                self._cancel_tier(entry)
            self._cache.clear()
        self._dispatch.clear_cache()

    def _cancel_tier(self, entry: CacheEntry) -> None:
        if entry.tier is not None:
            self._tiers.cancel(entry.tier)

    # -- target="auto" -----------------------------------------------------------------------------------
    def tier_status(self, *args, **kwargs) -> tiering.TierStatus | None:
        """Under target="auto", which tier serves these arguments' signature, whether that is decided, and
        why (arrays or ShapeDtypeStructs); None for other targets."""
        return None if self._tiers is None else self._tier_of(self._key(args, kwargs)[0])

    def _tier_of(self, key: Hashable) -> tiering.TierStatus:
        entry = self._cached(key)
        return self._tiers.status(entry.tier if entry is not None else None)

    def wait_for_tiering(self, timeout: float | None = None) -> bool:
        """Blocks until no background tiering job of this function (a compile, a comparison) is queued or
        running; False if `timeout` seconds passed first. For tests and benchmarks: calls never wait."""
        return self._tiers is None or self._tiers.wait(timeout)

    @property
    def cache_size(self) -> int:
        return len(self._cache)


def mnjit(fun: Callable | None = None, *, static_argnums: int | Iterable[int] | None = None,
          static_argnames: str | Iterable[str] | None = None, **options) -> MnjitFunction | Callable:
    """Drop-in for jax.jit that runs the compiled function on ONNX Runtime.

    jax.jit's options are accepted: `keep_unused`, `donate_*` (nothing visible changes), `inline` and
    `compiler_options` (where jax.jit runs the function: under a transformation, fallback partitions), and
    `device`/`backend` naming the target's own device; shardings are refused (one device).

    Options beyond jax.jit's: `target` (where the model runs and which ops it may use: a name in
    `hlo2onnx.TARGETS`; or "auto": ort-cpu at once, and iree-cpu once it is built in the background, where it
    agrees and is faster: mnjit/tiering.py, tuned by `tier_policy`), `opset`, `fallback` (run what the target
    cannot under jax.jit instead of raising UnsupportedOpError: mnjit/fallback.py), and `max_cache_size` (how many
    signatures to keep, least recently used dropped first; default unlimited, like jax.jit).
    """
    if fun is None:
        return functools.partial(mnjit, static_argnums=static_argnums, static_argnames=static_argnames, **options)
    return MnjitFunction(fun, static_argnums=static_argnums, static_argnames=static_argnames, **options)
