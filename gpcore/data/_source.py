"""Opening a path or an upload under a byte limit, and unpacking zip members under the same limit.

Internal to the readers (:mod:`gpcore.data._sniff`, :mod:`gpcore.data._parsers`). Every failure becomes a
:class:`DataError` naming the file.
"""

from __future__ import annotations

import io
import os
import re
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from gpcore.errors import DataError

#: Largest file read by default: 200 MB (the dashboard's upload limit matches it).
DEFAULT_MAX_BYTES = 200 * 1024 * 1024


def mb(n: float) -> str:
    return f"{n / 1024**2:.1f} MB" if n < 10 * 1024**2 else f"{n / 1024**2:.0f} MB"


#: Decoded size allowed for a columnar file, as a multiple of the byte limit (Parquet compresses ~3-10x).
DECODED_FACTOR = 10
#: Zips inside zips are opened this many levels deep (a zip holding one zipped Shapefile).
MAX_ZIP_DEPTH = 1
_CHUNK = 1 << 20


@dataclass
class Source:
    """A file on disk (``path``) or in memory (``data``), with the name used in messages.

    ``limit`` is the byte limit the file was opened under: everything unpacked from it (zip members,
    nested zips) counts against the same limit, checked while streaming (:func:`read_zip_member`).
    """

    name: str
    path: Path | None = None
    data: bytes | None = None
    limit: int | None = None
    depth: int = 0

    @property
    def suffix(self) -> str:
        return Path(self.name).suffix.lower()

    def head(self, n: int = 65536) -> bytes:
        if self.data is not None:
            return self.data[:n]
        with open(self.path, "rb") as fh:  # type: ignore[arg-type]
            return fh.read(n)

    def read_bytes(self) -> bytes:
        return self.data if self.data is not None else self.path.read_bytes()  # type: ignore[union-attr]

    def buffer(self):
        """Something parsers accept: the path, or a fresh BytesIO."""
        return str(self.path) if self.path is not None else io.BytesIO(self.data)  # type: ignore[arg-type]

    def where(self) -> str:
        return f"file '{self.name}'"


def open_source(source, name: str | None, max_bytes: int | None) -> Source:
    """Wrap a path, bytes or a file-like object; check that it exists, is not empty and fits ``max_bytes``."""
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        label = name or path.name
        if not path.exists():
            raise DataError(f"file '{path}' not found; check the path (the working folder is {Path.cwd()})")
        if path.is_dir():
            raise DataError(
                f"'{path}' is a folder, not a file; pass the data file itself (a folder of Shapefile parts: zip them)"
            )
        size = path.stat().st_size
        src = Source(label, path=path)
    elif isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
        size = len(data)
        src = Source(name or "upload", data=data)
    elif hasattr(source, "getvalue") or hasattr(source, "read"):
        label = name or os.path.basename(str(getattr(source, "name", "") or "")) or "upload"
        if hasattr(source, "getvalue"):
            data = source.getvalue()
        else:
            limit = -1 if max_bytes is None else int(max_bytes) + 1
            data = source.read(limit)
        if isinstance(data, str):
            data = data.encode("utf-8")
        size = len(data)
        src = Source(label, data=bytes(data))
    else:
        raise DataError(
            f"cannot read a {type(source).__name__}; pass a file path, bytes, an uploaded file or a DataFrame"
        )
    if max_bytes is not None and size > max_bytes:
        raise DataError(
            f"{src.where()} is {mb(size)}, above the limit of {mb(max_bytes)}; load a smaller extract (one quarter, "
            "one region, or fewer columns), convert it to Parquet, or raise the limit with max_bytes="
        )
    if size == 0:
        raise DataError(f"{src.where()} is empty (0 bytes); choose the file that holds the data")
    src.limit = max_bytes
    return src


def too_big(src: Source, what: str, size: float) -> DataError:
    return DataError(
        f"{src.where()}: {what} unpacks to more than {mb(size)}, above the limit of {mb(src.limit or 0)} (the same "
        "limit as for a plain file; a zip cannot lift it); load a smaller extract, or raise the limit with max_bytes="
    )


def check_zip_sizes(src: Source, zf: zipfile.ZipFile, names: list[str]) -> None:
    """Declared uncompressed sizes of ``names`` must fit the limit (checked before anything is unpacked)."""
    if src.limit is None:
        return
    declared = sum(zf.getinfo(n).file_size for n in names)
    if declared > src.limit:
        raise too_big(src, f"the zip's {', '.join(names[:5])}", declared)


def read_zip_member(src: Source, name: str, out=None) -> bytes | None:
    """Unpack one member, counting the bytes actually produced against the limit while streaming (a member
    whose header understates its size is stopped at the limit). Returns the bytes, or writes them to ``out``."""
    try:
        with zipfile.ZipFile(src.buffer()) as zf:
            check_zip_sizes(src, zf, [name])
            buf = io.BytesIO() if out is None else out
            total = 0
            with zf.open(name) as fh:
                while True:
                    chunk = fh.read(_CHUNK)
                    if not chunk:
                        break
                    total += len(chunk)
                    if src.limit is not None and total > src.limit:
                        raise too_big(src, f"the zip member '{name}'", total)
                    buf.write(chunk)
    except DataError:
        raise
    except (zipfile.BadZipFile, zlib.error, OSError, ValueError, EOFError, NotImplementedError, RuntimeError) as e:
        raise DataError(
            f"{src.where()}: the zip member '{name}' cannot be unpacked ({short_error(e)}); re-create the zip"
        ) from None
    return buf.getvalue() if out is None else None


def extract_zip_members(src: Source, names: list[str], folder: str) -> Path:
    """Unpack ``names`` into ``folder`` (flat, sanitised names) under one shared size budget; returns the folder."""
    base = Path(folder)
    with zipfile.ZipFile(src.buffer()) as zf:
        check_zip_sizes(src, zf, names)
    spent = 0
    for name in names:
        target = base / re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(name).name)
        part = Source(src.name, path=src.path, data=src.data,
                      limit=None if src.limit is None else src.limit - spent, depth=src.depth)
        with open(target, "wb") as fh:
            read_zip_member(part, name, out=fh)
        spent += target.stat().st_size
    return base


def zip_names(src: Source) -> list[str]:
    try:
        with zipfile.ZipFile(src.buffer()) as zf:
            return [n for n in zf.namelist() if not n.endswith("/") and "__MACOSX" not in n]
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError) as e:
        raise DataError(f"{src.where()} is not a readable zip archive ({e}); re-create the zip") from None


def short_error(e: BaseException) -> str:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    msg = re.sub(r"/vsimem/\S+|/vsizip/\S+", "<file>", msg)
    return msg[:300]
