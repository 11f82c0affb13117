"""On-disk persistence of thresholds: cache directory, host identity key, file lock,
atomic write, validation of a cache document, and a picker's cache file."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import pathlib
import tempfile
import time
from collections.abc import Iterator, Mapping
from typing import Any, TypeGuard

from .values import DIRECTIONS, MAX_THRESHOLD, log

SCHEMA_VERSION = 1
_CACHE_KIND = "gdrpy-threshold-cache"
_MAX_CACHE_BYTES = 1 << 20

ENV_CACHE_DIR = "GDRPY_CACHE_DIR"

_JSON_SCALARS = (str, int, float, bool, type(None))


def _check_identity(identity: object) -> dict[str, Any]:
    if not isinstance(identity, Mapping):
        raise TypeError(f"identity must be a dict, got {type(identity).__name__} {identity!r}")
    out: dict[str, Any] = {}
    for k, v in identity.items():
        if not isinstance(k, str):
            raise TypeError(f"identity keys must be str, got {type(k).__name__} {k!r}")
        if not isinstance(v, _JSON_SCALARS):
            raise TypeError(
                f"identity[{k!r}] must be str, int, float, bool or None, "
                f"got {type(v).__name__} {v!r}")
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"identity[{k!r}] must be finite, got {v!r}")
        out[k] = v
    return out


def identity_key(identity: Mapping[str, Any]) -> str:
    """Stable short hash of a host identity dict (keys sorted, canonical JSON)."""
    ident = _check_identity(identity)
    blob = json.dumps(ident, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def cache_dir(env: Mapping[str, str] | None = None) -> pathlib.Path | None:
    """The directory holding threshold caches, or None if no home can be found.

    ``$GDRPY_CACHE_DIR`` (read from ``env``, default ``os.environ``) if set and non-empty,
    else the user cache directory of platformdirs (on Linux ``$XDG_CACHE_HOME/gdrpy``,
    else ``~/.cache/gdrpy``); a relative ``$XDG_CACHE_HOME`` is ignored, as the XDG spec
    says.
    """
    env = os.environ if env is None else env
    d = env.get(ENV_CACHE_DIR, "")
    if d:
        return pathlib.Path(d).expanduser()
    try:
        import platformdirs
        p = platformdirs.user_cache_path("gdrpy", appauthor=False)
    except ImportError:         # a dependency, but keep working where it is missing:
        xdg = env.get("XDG_CACHE_HOME", "")     # platformdirs' rule (a relative one: below)
        p = (pathlib.Path(xdg) if xdg else pathlib.Path("~/.cache").expanduser()) / "gdrpy"
    if not p.is_absolute():     # relative $XDG_CACHE_HOME, or no home to expand ~ into
        try:
            p = pathlib.Path.home() / ".cache" / "gdrpy"
        except (RuntimeError, KeyError, OSError):   # no $HOME and no passwd entry
            return None
    return p


class _CacheInvalid(Exception):
    pass


class InsecureCacheDir(OSError):
    """The cache directory is not owned by this user or is writable by others."""


_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def check_dir(d: pathlib.Path) -> None:
    """Refuse (InsecureCacheDir, with the fix) a cache directory that another user
    owns or that group/others can write, as ssh does for ~/.ssh: anyone who can write
    there could plant thresholds or point our files elsewhere."""
    if not hasattr(os, "geteuid"):
        return
    st = os.stat(d)
    me = os.geteuid()
    if st.st_uid != me:
        raise InsecureCacheDir(
            f"threshold cache directory {d} is owned by uid {st.st_uid}, not by you "
            f"(uid {me}); it is not used. Fix: remove it, or set {ENV_CACHE_DIR} to a "
            "directory of your own (mkdir -m 700 DIR)")
    if st.st_mode & 0o022:
        raise InsecureCacheDir(
            f"threshold cache directory {d} is writable by group or others (mode "
            f"{st.st_mode & 0o777:o}); it is not used. Fix: chmod go-w {d}")


def open_nofollow(path: pathlib.Path, flags: int, mode: int = 0o600) -> int:
    """os.open with O_NOFOLLOW (a symlink planted at ``path`` fails with ELOOP) after
    checking the directory holding it."""
    check_dir(path.parent)
    return os.open(path, flags | _O_NOFOLLOW | _O_CLOEXEC, mode)


_warned_no_filelock = False


@contextlib.contextmanager
def _file_lock(path: pathlib.Path, timeout_s: float) -> Iterator[bool]:
    """Exclusive lock (filelock: flock, lock file opened O_NOFOLLOW, 0600) on ``path``;
    yields whether it was taken.

    Never raises for lock trouble: on an unwritable directory, after ``timeout_s``, or
    without the filelock package it yields False and the caller proceeds (writes stay
    atomic anyway).
    """
    global _warned_no_filelock
    try:
        check_dir(path.parent)
    except InsecureCacheDir as e:
        log.warning("threshold cache: %s", e)
        yield False
        return
    except OSError:
        pass        # no directory yet: the lock below reports it
    try:
        import filelock
    except ImportError:
        if not _warned_no_filelock:
            _warned_no_filelock = True
            log.warning("threshold cache: the filelock package is missing; caches are "
                        "written without a lock (atomically)")
        yield False
        return
    lock = filelock.FileLock(str(path), mode=0o600)
    try:
        lock.acquire(timeout=timeout_s, poll_interval=0.01)
    except filelock.Timeout:
        log.warning("threshold cache: lock %s still held after %.0f s; going on without it",
                    path, timeout_s)
        yield False
        return
    except OSError as e:
        log.debug("threshold cache: cannot lock %s: %s", path, e)
        yield False
        return
    try:
        yield True
    finally:
        with contextlib.suppress(OSError):
            lock.release()


def _atomic_write(path: pathlib.Path, data: bytes) -> None:
    check_dir(path.parent)   # mkstemp is O_EXCL; os.replace replaces a link itself
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _finite(x: object) -> TypeGuard[float]:
    return (isinstance(x, (int, float)) and not isinstance(x, bool)
            and math.isfinite(x))


def _validate_cache(obj: object, identity: dict[str, Any], key: str, now: float,
                    max_age_s: float | None) -> dict[str, dict[str, Any]]:
    """Return the valid per-direction entries of a cache document or raise _CacheInvalid."""
    if not isinstance(obj, dict) or obj.get("kind") != _CACHE_KIND:
        raise _CacheInvalid("not a gdrpy threshold cache (no kind "
                            f"{_CACHE_KIND!r})")
    schema = obj.get("schema")
    if schema != SCHEMA_VERSION:
        raise _CacheInvalid(f"schema {schema!r} is not {SCHEMA_VERSION}")
    ident = obj.get("identity")
    if not isinstance(ident, dict):
        raise _CacheInvalid("identity missing or not an object")
    if ident != identity or obj.get("key") != key:
        diff = sorted(k for k in set(ident) | set(identity) if ident.get(k) != identity.get(k))
        shown = ", ".join(f"{k}: cached {ident.get(k)!r} != current {identity.get(k)!r}"
                          for k in diff[:4])
        raise _CacheInvalid(f"identity mismatch ({shown or 'key differs'})")
    created = obj.get("created")
    if not _finite(created) or created <= 0:
        raise _CacheInvalid(f"created {created!r} is not a Unix time")
    if created > now + 86400:
        raise _CacheInvalid(f"created {created!r} lies in the future")
    if max_age_s is not None and now - created > max_age_s:
        raise _CacheInvalid(f"older than max_age_s={max_age_s:g} s "
                            f"(created {now - created:.0f} s ago)")
    entries = obj.get("directions")
    if not isinstance(entries, dict):
        raise _CacheInvalid("directions missing or not an object")
    out: dict[str, dict[str, Any]] = {}
    for d, e in entries.items():
        if d not in DIRECTIONS:
            raise _CacheInvalid(f"unknown direction {d!r}")
        if not isinstance(e, dict):
            raise _CacheInvalid(f"{d}: entry is not an object")
        t = e.get("threshold")
        if not isinstance(t, int) or isinstance(t, bool):
            raise _CacheInvalid(f"{d}: threshold {t!r} is not an integer")
        if not 0 <= t <= MAX_THRESHOLD:
            raise _CacheInvalid(f"{d}: threshold {t!r} is absurd (not in 0..{MAX_THRESHOLD})")
        src = e.get("source")
        if src not in ("calibration", "adapted"):
            raise _CacheInvalid(f"{d}: source {src!r} is not 'calibration' or 'adapted'")
        sweep = e.get("sweep", [])
        if not isinstance(sweep, list) or len(sweep) > 4096 or not all(
                isinstance(r, list) and len(r) == 3 and isinstance(r[0], int)
                and not isinstance(r[0], bool) and r[0] >= 0
                and all(_finite(v) and v >= 0 for v in r[1:]) for r in sweep):
            raise _CacheInvalid(f"{d}: sweep table malformed")
        tm = e.get("time", created)
        if not _finite(tm):
            raise _CacheInvalid(f"{d}: time {tm!r} is not a number")
        out[d] = {"threshold": t, "source": src, "sweep": sweep, "time": float(tm)}
    cal = obj.get("calibration")
    if cal is not None:
        if not isinstance(cal, dict):
            raise _CacheInvalid("calibration is not an object")
        dur = cal.get("duration_s")
        if not _finite(dur) or not 0 <= dur < 86400:
            raise _CacheInvalid(f"calibration duration_s {dur!r} is absurd")
    return out



class CacheFile:
    """One picker's cache file, ``threshold-<key>.json`` in ``directory``:
    :meth:`read` validates it against ``identity``, :meth:`write` replaces it
    atomically, :meth:`lock` serialises writers (and calibrations) across
    processes.  Reading creates nothing: neither the directory nor a lock file."""

    def __init__(self, directory: pathlib.Path, identity: dict[str, Any], key: str, *,
                 lock_timeout_s: float, max_age_s: float | None) -> None:
        self.directory = directory
        self.path = directory / f"threshold-{key}.json"
        self._identity = identity
        self._key = key
        self._lock_timeout = lock_timeout_s
        self._max_age = max_age_s

    def read(self) -> tuple[dict[str, dict[str, Any]], Any]:
        """(valid entries per direction, calibration info); raises _CacheInvalid."""
        f = self.path
        try:
            with os.fdopen(open_nofollow(f, os.O_RDONLY), "rb") as fh:
                data = fh.read(_MAX_CACHE_BYTES + 1)
        except FileNotFoundError:
            raise _CacheInvalid(f"no cache file {f}") from None
        except OSError as e:
            raise _CacheInvalid(f"cannot read {f}: {e}") from None
        if len(data) > _MAX_CACHE_BYTES:
            raise _CacheInvalid(f"{f} is larger than {_MAX_CACHE_BYTES} bytes")
        try:
            obj = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise _CacheInvalid(f"corrupt cache file {f}: {e}") from None
        try:
            entries = _validate_cache(obj, self._identity, self._key, time.time(),
                                      self._max_age)
        except _CacheInvalid as e:
            raise _CacheInvalid(f"{f}: {e}") from None
        return entries, obj.get("calibration")

    def ensure_dir(self) -> str | None:
        """Create the directory (0700) and check it: None, or why it cannot be used."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            check_dir(self.directory)
        except InsecureCacheDir as e:
            return str(e)
        except OSError as e:
            return f"cannot create cache directory {self.directory}: {e}"
        return None

    def lock(self) -> contextlib.AbstractContextManager[bool]:
        """The cross-process lock (``threshold-<key>.lock``); yields whether it was
        taken (see _file_lock)."""
        return _file_lock(self.path.with_suffix(".lock"), self._lock_timeout)

    def write(self, directions: dict[str, Any], calibration: Any) -> None:
        """Replace the file with these entries; raises OSError / ValueError."""
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        doc = {"kind": _CACHE_KIND, "schema": SCHEMA_VERSION, "key": self._key,
               "identity": self._identity, "created": time.time(),
               "calibration": calibration, "directions": directions}
        _atomic_write(self.path, json.dumps(doc, indent=1, sort_keys=True,
                                            allow_nan=False).encode())
