"""What identifies a data set: the source file's bytes and the spec that turns them into (X, y).

Two runs are "on the same data set" when they read the same file content with the same columns,
period, transform, weight, time and strata — never when floating-point results happen to agree.
A period counts by the quarters it selects, not by how it is written
(:func:`gpcore.data.temporal.canonical_period`): on the bundled Puerto Rico file ``--quarter
2019Q1:2023Q4`` and the Data page's "all" are one data set, and so are ``2023`` and ``2023Q1:2023Q4``.
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

#: What a run's ``data.hash`` was computed from; a run whose manifest says anything else (written by older
#: code: transformed floats, or periods as written) gets its identity recomputed from its configuration.
HASH_OF = "file content + data spec, periods by their quarters"


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


def dataset_identity(config: dict, period: bool = True) -> str | None:
    """16-hex identity of the data set a run configuration (``RunConfig.to_dict()``) reads.

    ``period=False``: of the data set whatever its period, so that runs on other quarters of one file and spec can be
    named as such ("other period") rather than as other data. None when the source file (or an uploaded strata
    layer) is not available to hash.
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
    _canonical_time(data, spec, content)
    strata = spec.get("strata")
    if isinstance(strata, str) and strata.startswith("polygons:"):
        layer = file_digest(_source_file(strata[len("polygons:"):]))
        if layer is None:
            return None
        spec["strata"] = "polygons:" + layer
    if not period:
        spec["quarter"] = "any period"
    text = json.dumps({"content": content, **spec}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _canonical_time(data: str, spec: dict, content: str) -> None:
    """Write ``spec``'s time column and period in their one canonical form: the column the reader finds when none
    is named, and the quarters the period selects (within a bundled sample's quarters, which every row has)."""
    from gpcore.data import SAMPLES
    from gpcore.data.temporal import canonical_period
    from gpcore.errors import DataError

    info = SAMPLES.get(data.split(":", 1)[1]) if data.startswith("sample:") else None
    quarter = spec.get("quarter")
    if info is not None and not quarter:
        quarter = info.default_quarter
    if spec.get("time") is None:
        spec["time"] = _detected_time(str(_source_file(data)), content)
    try:
        spec["quarter"] = canonical_period(quarter, known=info.quarters if info is not None else None)
    except DataError:  # a period no reader accepts identifies nothing it could read; keep it as written
        spec["quarter"] = quarter


@lru_cache(maxsize=64)
def _detected_time(path: str, content: str) -> str | None:
    """The time column the reader finds in the file at ``path`` whose digest is ``content`` (the cache key: an edited
    file is read again); None when it finds none or refuses the file (its runs fail there)."""
    from gpcore.data.readers import detected_time_column
    from gpcore.errors import DataError

    try:
        return detected_time_column(path)
    except DataError:
        return None
