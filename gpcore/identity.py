"""What identifies a data set: the source file's bytes and the spec that turns them into (X, y).

Two runs are "on the same data set" when they read the same file content with the same columns,
period, transform, weight, time and strata — never when floating-point results happen to agree.
Hashing transformed floats (``log10`` of the target) gave a different identity on another CPU for
the same file, so a bundled run looked like "other data" on a fresh machine.

:func:`file_digest` is the SHA-256 of a file's bytes (cached by path, size and mtime, so listing
runs re-reads nothing); :func:`dataset_identity` hashes it with the data part of a run
configuration. Files that no longer exist give ``None``.
"""

from __future__ import annotations

import hashlib
import json
import os
from functools import lru_cache
from pathlib import Path

#: Fields of :class:`gpcore.run.config.RunConfig` that define the data set (not the model or the split).
SPEC_FIELDS = ("x", "y", "transform", "quarter", "weight", "time", "strata", "allow_drop")


@lru_cache(maxsize=256)
def _digest(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def file_digest(path: str | os.PathLike) -> str | None:
    """SHA-256 hex digest of a file's content (None when it is not a readable file)."""
    p = Path(path)
    try:
        st = p.stat()
        if not p.is_file():
            return None
        return _digest(str(p.resolve()), st.st_size, st.st_mtime_ns)
    except OSError:
        return None


def _source_file(data: str) -> Path:
    if data.startswith("sample:"):
        from gpcore.data import sample_path

        return sample_path(data.split(":", 1)[1])
    return Path(data[len("file:"):] if data.startswith("file:") else data)


def dataset_identity(config: dict) -> str | None:
    """16-hex identity of the data set a run configuration (``RunConfig.to_dict()``) reads.

    None when the source file (or an uploaded strata layer) is not available to hash.
    """
    data = str(config.get("data") or "")
    try:
        content = file_digest(_source_file(data))
    except Exception:  # noqa: BLE001 - an unknown sample key is simply not identifiable
        content = None
    if content is None:
        return None
    spec = {k: config.get(k) for k in SPEC_FIELDS}
    spec["x"] = list(spec["x"]) if spec.get("x") else None
    if data.startswith("sample:") and not spec.get("quarter"):
        from gpcore.data import SAMPLES

        info = SAMPLES.get(data.split(":", 1)[1])
        spec["quarter"] = getattr(info, "default_quarter", None)
    strata = spec.get("strata")
    if isinstance(strata, str) and strata.startswith("polygons:"):
        layer = file_digest(_source_file(strata[len("polygons:"):]))
        if layer is None:
            return None
        spec["strata"] = "polygons:" + layer
    text = json.dumps({"content": content, **spec}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]
