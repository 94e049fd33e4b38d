"""mnjit's persistent cache (mnjit/disk_cache.py, mnjit/persist.py): translations, IREE modules and tier
decisions on disk, shared by processes.

Each test has its own folder (the suite runs with the cache off: conftest.py). Results are compared with
jax.jit's in every case, warm or cold; the reliability cases (two processes at once, a truncated entry, an entry
of another version, a full disk, a read-only folder) must leave every call's result right and the cache valid.
"""
from __future__ import annotations

import errno
import importlib.util
import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import mnjit as mnjit_package
from harness import assert_same, rand
from mnjit import cache_key, disk_cache, mnjit, persist

ROOT = Path(__file__).resolve().parent.parent
TOL = (1e-5, 1e-5)
CACHED = "Translation: read from mnjit's persistent cache"  # the report's line for a translation read from disk
needs_iree = pytest.mark.skipif(importlib.util.find_spec("iree") is None, reason="IREE is not installed")


def _mlp(x, w):
    return jnp.tanh(x @ w).sum(axis=0) * 0.5


def _entries(path: Path, kind: str = persist.TRANSLATION) -> list[Path]:
    return sorted(path.glob(f"{kind}/*.bin"))


def _run(code: str, cache_dir: Path) -> subprocess.Popen:
    # The folder by configure_cache: MNJIT_CACHE_DIR would also move the fast path's extension (a rebuild).
    code = f"import mnjit\nmnjit.configure_cache({str(cache_dir)!r})\n" + textwrap.dedent(code)
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", code], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(process: subprocess.Popen, timeout: float = 300) -> dict:
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def test_translation_is_stored_and_read(cache):
    x, w = rand((16, 8)), rand((8, 8), seed=1)
    assert_same(mnjit(_mlp)(x, w), jax.jit(_mlp)(x, w), TOL)
    assert len(_entries(cache, persist.TRANSLATION)) == 1
    fresh = mnjit(_mlp)  # another function of the same program: the translation comes from the disk
    assert_same(fresh(x, w), jax.jit(_mlp)(x, w), TOL)
    assert CACHED in fresh.lower(x, w).report()
    assert len(_entries(cache)) == 1
    other = rand((4, 8), seed=3)  # another signature, another entry
    assert_same(fresh(other, w), jax.jit(_mlp)(other, w), TOL)
    assert len(_entries(cache, persist.TRANSLATION)) == 2


def test_const_args_are_in_the_key(cache):
    """Closed-over arrays that jax passes as jax.const arguments (not embedded in the module) key the entry by
    value: another array of the same shape is another translation."""
    x = rand((1024,))
    for value in (1.0, 2.0):
        table = jnp.full((1024,), value, jnp.float32)
        f = lambda x: x * table  # noqa: E731
        assert_same(mnjit(f)(x), jax.jit(f)(x), TOL)
    assert len(_entries(cache, persist.TRANSLATION)) == 2


def test_disabled_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("MNJIT_CACHE", "off")
    mnjit_package.configure_cache(True)
    assert disk_cache.current() is None
    mnjit_package.configure_cache(tmp_path / "c")
    mnjit_package.configure_cache(False)  # the setting wins over the folder set before
    x, w = rand((16, 8)), rand((8, 8), seed=1)
    assert_same(mnjit(_mlp)(x, w), jax.jit(_mlp)(x, w), TOL)
    assert not (tmp_path / "c").exists()
    mnjit_package.configure_cache(True)


def test_default_location_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.delenv("MNJIT_CACHE_DIR", raising=False)
    monkeypatch.setenv("MNJIT_CACHE", "on")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert disk_cache.current().path == tmp_path / "mnjit"
    monkeypatch.setenv("MNJIT_CACHE_DIR", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("MNJIT_CACHE_MAX_BYTES", "12345")
    store = disk_cache.current()
    assert store.path == tmp_path / "elsewhere" and store.max_bytes == 12345


def test_truncated_entry_is_rebuilt(cache):
    x, w = rand((16, 8)), rand((8, 8), seed=1)
    mnjit(_mlp)(x, w)
    (entry,) = _entries(cache)
    whole = entry.read_bytes()
    entry.write_bytes(whole[: len(whole) // 2])
    fresh = mnjit(_mlp)
    assert_same(fresh(x, w), jax.jit(_mlp)(x, w), TOL)
    assert entry.read_bytes() == whole  # translated again and written again
    corrupt = bytearray(whole)
    corrupt[-10] ^= 0xFF  # a flipped bit in the model: the checksum refuses it
    entry.write_bytes(bytes(corrupt))
    assert disk_cache.current().get(persist.TRANSLATION, entry.stem) is None
    assert not entry.exists()  # removed, to be written again by the next miss


def test_entry_from_another_version_is_ignored(cache, monkeypatch):
    x, w = rand((16, 8)), rand((8, 8), seed=1)
    mnjit(_mlp)(x, w)
    (entry,) = _entries(cache)
    whole = entry.read_bytes()
    # Another version of a package (any of the environment's): another key, so the old entry is never read.
    monkeypatch.setattr(cache_key, "environment", lambda: b"jax 99.0")
    assert_same(mnjit(_mlp)(x, w), jax.jit(_mlp)(x, w), TOL)
    assert len(_entries(cache)) == 2
    monkeypatch.undo()
    # A file of another format under this version's name (written by a future mnjit): a miss, rebuilt.
    monkeypatch.setattr(disk_cache, "FORMAT", disk_cache.FORMAT + 1)
    disk_cache.current().put(persist.TRANSLATION, entry.stem, b"not a model")
    monkeypatch.undo()
    fresh = mnjit(_mlp)
    assert_same(fresh(x, w), jax.jit(_mlp)(x, w), TOL)
    assert entry.read_bytes() == whole


def test_full_disk_goes_on_uncached_with_one_warning(cache, monkeypatch, caplog):
    def full(f, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(disk_cache, "_write", full)
    x, w = rand((16, 8)), rand((8, 8), seed=1)
    with caplog.at_level(logging.WARNING, logger="mnjit"):
        for n in (4, 5, 6):
            x = rand((n, 8), seed=n)
            assert_same(mnjit(_mlp)(x, w), jax.jit(_mlp)(x, w), TOL)
    warnings = [r for r in caplog.records if "cannot write" in r.getMessage()]
    assert len(warnings) == 1 and "ENOSPC" in warnings[0].getMessage(), caplog.records
    assert not [p for p in cache.rglob("*") if p.is_file()]  # no entry, no temporary file left behind


def test_read_only_folder_reads_and_goes_on_uncached(cache, monkeypatch, caplog):
    x, w = rand((16, 8)), rand((8, 8), seed=1)
    mnjit(_mlp)(x, w)  # one entry written while the folder was writable
    if os.geteuid() != 0:
        for folder in (cache, *cache.iterdir()):
            folder.chmod(0o555)
    else:  # root writes anywhere: the write fails as on a read-only file system
        def read_only(*args, **kwargs):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        monkeypatch.setattr(disk_cache.tempfile, "mkstemp", read_only)
    try:
        with caplog.at_level(logging.WARNING, logger="mnjit"):
            fresh = mnjit(_mlp)
            assert_same(fresh(x, w), jax.jit(_mlp)(x, w), TOL)  # read from the cache
            assert CACHED in fresh.lower(x, w).report()
            for n in (3, 5):
                other = rand((n, 8), seed=n)
                assert_same(fresh(other, w), jax.jit(_mlp)(other, w), TOL)  # translated, not stored
    finally:
        for folder in (cache, *cache.iterdir()):
            folder.chmod(0o755)
    assert len([r for r in caplog.records if "cannot write" in r.getMessage()]) == 1
    assert len(_entries(cache)) == 1


def test_size_cap_evicts_least_recently_used(tmp_path):
    store = disk_cache.Store(tmp_path, max_bytes=10_000)
    for i in range(4):
        assert store.put("translation", f"k{i}", bytes(2000))
        os.utime(store._file("translation", f"k{i}"), (1000 + i, 1000 + i))  # a clear order, oldest first
    assert store.get("translation", "k0") == bytes(2000)  # used now: the most recent
    assert store.put("translation", "k4", bytes(3000))  # over 10 000 bytes: the oldest go, down to 9 000
    kept = {p.stem for p in tmp_path.glob("translation/*.bin")}
    assert kept == {"k0", "k3", "k4"}, kept
    assert store.evict() <= 9_000
    assert not store.put("translation", "huge", bytes(20_000))  # larger than the whole cache: never stored


def test_two_processes_fill_one_cache_at_once(tmp_path):
    code = """
        import json, jax, jax.numpy as jnp, numpy as np
        from mnjit import mnjit
        results = []
        for n in range(1, 7):
            f = lambda x: jnp.tanh(x * n).sum(axis=0) + x.mean()
            x = jnp.asarray(np.linspace(-1, 1, 8 * n, dtype=np.float32).reshape(n, 8))
            results.append(bool(np.allclose(mnjit(f)(x), jax.jit(f)(x), rtol=1e-5, atol=1e-5)))
        print(json.dumps({"ok": all(results)}))
    """
    cache = tmp_path / "shared"
    processes = [_run(code, cache) for _ in range(2)]
    assert all(_finish(p)["ok"] for p in processes)
    assert len(_entries(cache)) == 6  # one translation per program: both wrote each, the last rename won
    entries = _entries(cache, "*")
    store = disk_cache.Store(cache)
    assert all(store.get(e.parent.name, e.stem) is not None for e in entries)  # every entry whole and valid
    assert not list(cache.rglob(".tmp-*"))
    assert _finish(_run(code, cache))["ok"]  # a third process reads them all


WARM = """
    import json, time
    import hlo2onnx, jax, jax.numpy as jnp, numpy as np
    from mnjit import mnjit, tiering

    def mlp(x, w):
        return jnp.tanh(x @ w).sum(axis=0) * 0.5

    x = jnp.asarray(np.linspace(-1, 1, 64 * 32, dtype=np.float32).reshape(64, 32))
    w = jnp.asarray(np.linspace(-0.5, 0.5, 32 * 32, dtype=np.float32).reshape(32, 32))
    if WARM:
        def refuse(*args, **kwargs):
            raise AssertionError("translated in the warm process")
        hlo2onnx.translate_report = refuse  # every translation goes through it: none may run
    from mnjit import device
    drivers, make_runner = [], device.make_runner
    def counting(*args, iree_driver=None, **kwargs):
        drivers.append(iree_driver)
        return make_runner(*args, iree_driver=iree_driver, **kwargs)
    device.make_runner = counting
    f = mnjit(mlp, target="auto", tier_policy=tiering.TierPolicy(min_speedup=0))
    start = time.perf_counter()
    out = jax.block_until_ready(f(x, w))
    first = time.perf_counter() - start
    status = f.tier_status(x, w)  # right after the first call: decided already when warm
    ok = bool(np.allclose(out, jax.jit(mlp)(x, w), rtol=1e-5, atol=1e-5))
    if not WARM:
        status = tiering.settle(f, x, w)
    print(json.dumps({"ok": ok, "serving": status.serving, "decided": status.decided, "cached": status.cached,
                      "report": f.lower(x, w).report(), "first": first,
                      "active": f._tiers.active, "drivers": drivers}))
"""


@needs_iree
def test_warm_process_runs_its_first_call_on_the_decided_tier(tmp_path):
    cache = tmp_path / "warm"
    cold = _finish(_run("WARM = False\n" + textwrap.dedent(WARM), cache))
    assert cold["ok"] and cold["decided"] and not cold["cached"], cold
    assert _entries(cache, persist.DECISION) and _entries(cache, persist.TRANSLATION)
    warm = _finish(_run("WARM = True\n" + textwrap.dedent(WARM), cache))
    assert warm["ok"] and warm["decided"] and warm["cached"], warm
    assert warm["serving"] == cold["serving"], (cold, warm)
    assert "persistent cache" in warm["report"].splitlines()[0] and CACHED in warm["report"], warm
    if warm["serving"] == "iree-cpu":  # min_speedup=0 keeps IREE wherever it agrees
        assert warm["active"] == 1  # the first call took the compiled tier's path
        # Only the decided variant's runtime is loaded (both drivers' when it was built and timed).
        iree = [d for d in warm["drivers"] if d is not None]
        assert len(iree) == 1 and iree[0] in warm["report"], warm
        assert {d for d in cold["drivers"] if d is not None} == {"local-task", "local-sync"}, cold
