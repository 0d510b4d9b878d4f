"""Uploaded files: content-addressed copies under the run store's ``_uploads`` folder.

An upload is stored once per content digest as ``<run store>/_uploads/<digest>/<safe name>`` and named
by the reference ``upload:<digest>/<safe name>``, so a URL can name it without naming a server path.
The folder is a least-recently-used cache capped at :data:`UPLOAD_CACHE_MB` (``UA_UPLOAD_CACHE_MB``
overrides); a file that fails validation is removed again with :func:`discard_upload`.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from pathlib import Path

from gpcore.errors import GPCoreError

UPLOAD_PREFIX = "upload:"
#: Longest stored upload name (file systems allow 255 bytes; the suffix is kept).
MAX_UPLOAD_NAME = 120
#: Uploads kept in ``_uploads`` (MB, newest kept; ``UA_UPLOAD_CACHE_MB`` overrides).
UPLOAD_CACHE_MB = 2048

_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")
_REF = re.compile(r"[0-9a-f]{16}/[A-Za-z0-9_.-]{1,200}")


def uploads_dir() -> Path:
    from gpcore.run.store import default_store_dir

    return default_store_dir() / "_uploads"


def is_reference(value: str) -> bool:
    """Whether ``value`` is a well-formed ``upload:<digest>/<name>`` reference (the file system is not read)."""
    return value.startswith(UPLOAD_PREFIX) and _REF.fullmatch(value[len(UPLOAD_PREFIX) :]) is not None


def safe_upload_name(name: str) -> str:
    """A file name made of ``[A-Za-z0-9_.-]``, at most :data:`MAX_UPLOAD_NAME` characters, suffix kept."""
    safe = _SAFE.sub("_", Path(str(name)).name).strip("._") or "upload"
    if len(safe) > MAX_UPLOAD_NAME:
        stem, dot, suffix = safe.rpartition(".")
        suffix = suffix[:16] if dot and stem else ""
        safe = safe[: MAX_UPLOAD_NAME - len(suffix) - 1].rstrip("._") + ("." + suffix if suffix else "")
    return safe


def save_upload(name: str, data: bytes) -> str:
    """Store uploaded bytes once (by content digest); return the ``upload:<digest>/<name>`` reference.

    The store is a size-capped cache (:func:`prune_uploads`); a file that fails validation is removed
    again with :func:`discard_upload`.
    """
    digest = hashlib.sha256(data).hexdigest()[:16]
    safe = safe_upload_name(name)
    folder = uploads_dir() / digest
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / safe
    if not path.exists():
        tmp = folder / f".{safe}.{os.getpid()}.part"
        tmp.write_bytes(data)
        os.replace(tmp, path)
        prune_uploads(keep=folder)
    else:
        os.utime(folder)  # recently used: kept longest
    return f"{UPLOAD_PREFIX}{digest}/{safe}"


def discard_upload(ref: str) -> None:
    """Remove an upload that failed validation (its folder, when nothing else is in it)."""
    try:
        path = resolve_upload(ref)
    except GPCoreError:
        return
    path.unlink(missing_ok=True)
    try:
        path.parent.rmdir()
    except OSError:
        pass


def prune_uploads(keep: Path | None = None, cap_mb: float | None = None) -> list[str]:
    """Delete the least recently used upload folders until ``_uploads`` fits the cap; returns their digests."""
    cap = float(os.environ.get("UA_UPLOAD_CACHE_MB", UPLOAD_CACHE_MB) if cap_mb is None else cap_mb) * 1024**2
    root = uploads_dir()
    if not root.is_dir():
        return []
    folders = []
    for p in root.iterdir():
        if p.is_dir() and not p.is_symlink():
            size = sum(f.stat().st_size for f in p.iterdir() if f.is_file())
            folders.append((p.stat().st_mtime, size, p))
    total = sum(s for _, s, _ in folders)
    removed = []
    for _, size, p in sorted(folders, key=lambda t: t[0]):
        if total <= cap:
            break
        if keep is not None and p == keep:
            continue
        shutil.rmtree(p, ignore_errors=True)
        total -= size
        removed.append(p.name)
    return removed


def resolve_upload(ref: str) -> Path:
    """File path of an ``upload:<digest>/<name>`` reference."""
    from gpcore.errors import DataError

    rel = ref[len(UPLOAD_PREFIX) :] if ref.startswith(UPLOAD_PREFIX) else ref
    digest, _, name = rel.partition("/")
    if not re.fullmatch(r"[0-9a-f]{16}", digest) or not name or "/" in name or name.startswith("."):
        raise DataError(f"'{ref}' is not an uploaded file reference")
    path = uploads_dir() / digest / name
    if not path.is_file():
        raise DataError(f"the uploaded file '{name}' is no longer on the server; upload it again")
    return path


def reference_of(path: Path) -> str | None:
    """The ``upload:`` reference of a file inside ``_uploads`` (None for any other path)."""
    try:
        rel = Path(path).resolve().relative_to(uploads_dir().resolve())
    except ValueError:
        return None
    return f"{UPLOAD_PREFIX}{rel.as_posix()}"
