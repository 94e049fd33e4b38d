"""mnjit's persistent cache on disk: bytes by kind and key, shared by processes, bounded in size.

What goes in it and under which keys is mnjit/persist.py's; this module only stores. The design is lock-free:

- An entry is one file, `<dir>/<kind>/<key>.bin`, written whole to a temporary file in that folder, fsynced and
  renamed over its name (os.replace): a reader sees the old entry, the new one, or none, never half of one.
  Two processes writing one key write the same bytes (a key names everything the value depends on); the
  last rename wins.
- Each file starts with a header (magic, format version, the key it was written under, the payload's length and
  SHA-256): a truncated, corrupt or foreign file (another format, another key) is a miss, deleted, and the
  value is rebuilt and written again. Nothing read is trusted before its checksum matches.
- A hit touches the file's mtime: eviction removes the least recently used files (oldest mtime) once the
  folder holds more than `max_bytes`, down to 90% of it. A file another process removes meanwhile is skipped.
- Any OSError on writing (a read-only folder, a full disk, a quota) disables writing for the rest of the process
  with one warning (logger "mnjit"); reads go on. Calls never fail because of the cache.

Configuration, in this order: `configure(...)` (mnjit.configure_cache), the environment (MNJIT_CACHE=off to
disable it; MNJIT_CACHE_DIR, the folder, which also holds the fast path's compiled extension, mnjit/ffi.py;
MNJIT_CACHE_MAX_BYTES), then the default: $XDG_CACHE_HOME/mnjit (~/.cache/mnjit), 1 GiB. Entries live in one
subfolder per kind; the size cap counts those only. docs/runtime.md, Persistent cache.
"""
from __future__ import annotations

import errno
import hashlib
import logging
import os
import struct
import tempfile
import threading
from pathlib import Path

logger = logging.getLogger("mnjit")

FORMAT = 1  # bump when the file layout or any payload's layout changes: older files become misses
_MAGIC = b"MNJITCACHE"
# magic, format, key length, payload length, payload SHA-256; then the key (ASCII) and the payload
_HEADER = struct.Struct(f"<{len(_MAGIC)}sHHQ32s")
DEFAULT_MAX_BYTES = 1 << 30
_OFF = {"", "0", "off", "none", "false", "no"}


class Store:
    """One cache folder. Methods never raise OSError: a failed read is a miss, a failed write a warning."""

    def __init__(self, path: str | os.PathLike, max_bytes: int = DEFAULT_MAX_BYTES):
        if max_bytes < 1:
            raise ValueError(f"the cache's max_bytes must be positive, got {max_bytes}")
        self.path = Path(path).expanduser()
        self.max_bytes = int(max_bytes)
        self._writable = True
        self._lock = threading.Lock()
        self._written = 0  # bytes written since the last eviction scan: scans happen when it could matter
        self._size: int | None = None  # the folder's size at the last scan

    def _file(self, kind: str, key: str) -> Path:
        if not (kind.isidentifier() and key.isalnum()):
            raise ValueError(f"bad cache kind or key: {kind!r}, {key!r}")
        return self.path / kind / f"{key}.bin"

    def get(self, kind: str, key: str) -> bytes | None:
        """The payload stored under `key`, or None (absent, or not a valid entry: then it is removed)."""
        file = self._file(kind, key)
        try:
            with open(file, "rb") as f:
                data = f.read()
        except OSError:
            return None
        payload = _unpack(data, key)
        if payload is None:
            logger.info("mnjit cache: ignoring an invalid entry %s (truncated, corrupt or another format)", file)
            self._remove(file)
            return None
        try:
            os.utime(file)  # least recently used order; a read-only folder keeps its order
        except OSError:
            pass
        return payload

    def put(self, kind: str, key: str, payload: bytes) -> bool:
        """Stores `payload` under `key` atomically; False if it could not be written (warned once)."""
        if not self._writable:
            return False
        file = self._file(kind, key)
        data = _pack(key, payload)
        if len(data) > self.max_bytes:
            return False  # larger than the whole cache: never kept
        temp = None
        try:
            file.parent.mkdir(parents=True, exist_ok=True)
            fd, temp = tempfile.mkstemp(dir=file.parent, prefix=".tmp-", suffix=".part")
            with os.fdopen(fd, "wb") as f:
                _write(f, data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temp, file)
            temp = None
        except OSError as e:
            self._disable(e)
            return False
        finally:
            if temp is not None:
                self._remove(Path(temp))
        with self._lock:
            self._written += len(data)
            due = self._size is None or self._size + self._written > self.max_bytes
        if due:
            self.evict()
        return True

    def evict(self) -> int:
        """Removes the least recently used entries while the folder holds more than max_bytes (down to 90%);
        returns the bytes it holds after."""
        entries = []
        for folder in _folders(self.path):
            for entry in _scan(folder):
                # Entries and temporary files of unfinished writes only: the folder may hold others' files
                # (the fast path's extension builds in a temporary folder beside the entries).
                if not entry.is_file(follow_symlinks=False) or not (
                        entry.name.endswith(".bin") or entry.name.startswith(".tmp-") and entry.name.endswith(".part")):
                    continue
                try:
                    stat = entry.stat()
                except OSError:  # removed by another process meanwhile
                    continue
                entries.append((stat.st_mtime, stat.st_size, entry.path))
        total = sum(size for _, size, _ in entries)
        if total > self.max_bytes:
            goal = int(self.max_bytes * 0.9)
            for _, size, path in sorted(entries):
                if total <= goal:
                    break
                self._remove(Path(path))
                total -= size
        with self._lock:
            self._size, self._written = total, 0
        return total

    def _disable(self, error: OSError) -> None:
        with self._lock:
            if not self._writable:
                return
            self._writable = False
        why = errno.errorcode.get(error.errno, "") if error.errno else ""
        logger.warning("mnjit cache: cannot write to %s (%s%s); this process goes on without storing in it",
                       self.path, f"{why}: " if why else "", error.strerror or error)

    @staticmethod
    def _remove(file: Path) -> None:
        try:
            file.unlink()
        except OSError:
            pass


def _write(f, data: bytes) -> None:
    """One place for the write itself (tests replace it to simulate a full disk)."""
    f.write(data)


def _pack(key: str, payload: bytes) -> bytes:
    encoded = key.encode("ascii")
    return _HEADER.pack(_MAGIC, FORMAT, len(encoded), len(payload), hashlib.sha256(payload).digest()) \
        + encoded + payload


def _unpack(data: bytes, key: str) -> bytes | None:
    if len(data) < _HEADER.size:
        return None
    magic, version, key_length, length, digest = _HEADER.unpack_from(data)
    start = _HEADER.size + key_length
    if magic != _MAGIC or version != FORMAT or len(data) != start + length:
        return None
    if data[_HEADER.size:start] != key.encode("ascii"):
        return None  # another key's value (a copied or renamed file)
    payload = data[start:]
    return payload if hashlib.sha256(payload).digest() == digest else None


def _folders(path: Path) -> list[str]:
    return [entry.path for entry in _scan(str(path)) if entry.is_dir(follow_symlinks=False)]


def _scan(folder: str) -> list[os.DirEntry]:
    try:
        with os.scandir(folder) as entries:
            return list(entries)
    except OSError:
        return []


# -- configuration ---------------------------------------------------------------------------------------------
_configured: tuple[str | None, int] | None = None  # configure()'s (path or None for off, max_bytes)
_stores: dict[tuple[str, int], Store] = {}
_config_lock = threading.Lock()


def default_path() -> Path:
    """$XDG_CACHE_HOME/mnjit, or ~/.cache/mnjit."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mnjit"


def configure(path: str | os.PathLike | None | bool = True, max_bytes: int | None = None) -> None:
    """Sets the persistent cache for this process (mnjit.configure_cache): a folder, False or None to disable
    it (nothing is read or written), True for the environment's or the default. `max_bytes` caps its size
    (default MNJIT_CACHE_MAX_BYTES, or 1 GiB). Signatures already cached in memory are not affected."""
    global _configured
    if max_bytes is not None and max_bytes < 1:
        raise ValueError(f"max_bytes must be positive, got {max_bytes}")
    with _config_lock:
        if path is True:
            _configured = None if max_bytes is None else (_env_path(), max_bytes)
        else:
            _configured = (os.fspath(path) if path else None, max_bytes or _env_max_bytes())


def _env_path() -> str | None:
    if os.environ.get("MNJIT_CACHE", "on").strip().lower() in _OFF:
        return None
    return os.environ.get("MNJIT_CACHE_DIR") or os.fspath(default_path())


def _env_max_bytes() -> int:
    value = os.environ.get("MNJIT_CACHE_MAX_BYTES")
    try:
        return max(1, int(value)) if value else DEFAULT_MAX_BYTES
    except ValueError:
        logger.warning("mnjit cache: MNJIT_CACHE_MAX_BYTES=%r is not a number of bytes; using %d", value,
                       DEFAULT_MAX_BYTES)
        return DEFAULT_MAX_BYTES


def current() -> Store | None:
    """The store this process uses now (None: disabled). Read on each translation, never per call."""
    with _config_lock:
        path, max_bytes = _configured if _configured is not None else (_env_path(), _env_max_bytes())
        if path is None:
            return None
        key = (os.path.abspath(os.path.expanduser(path)), max_bytes)
        store = _stores.get(key)
        if store is None:
            store = _stores[key] = Store(key[0], max_bytes)
        return store
