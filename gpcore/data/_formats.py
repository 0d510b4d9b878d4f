"""Turning a path or an upload into a table: size limit, format detection and the parsers.

Internal to :mod:`gpcore.data.readers`. Every failure becomes a :class:`DataError` naming the file.
"""

from __future__ import annotations

import csv
import io
import os
import re
import tempfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import geopandas as gpd
import pandas as pd

from gpcore.data.report import ReadReport
from gpcore.errors import DataError

#: Largest file read by default: 200 MB (the dashboard's upload limit matches it).
DEFAULT_MAX_BYTES = 200 * 1024 * 1024

TEXT_SUFFIXES = {".csv", ".tsv", ".tab", ".txt", ".dat", ".xyz", ".psv"}
PARQUET_SUFFIXES = {".parquet", ".geoparquet", ".pq", ".parq"}
JSON_SUFFIXES = {".geojson", ".json", ".geojsonl"}
EXCEL_SUFFIXES = {".xlsx", ".xls", ".xlsm", ".xlsb", ".ods", ".numbers"}
SUPPORTED = (
    "CSV/TSV text, Parquet/GeoParquet, GeoJSON, GeoPackage (.gpkg), or a zipped Shapefile (.zip with .shp, .shx, "
    ".dbf, .prj)"
)
#: Column names (normalised) kept as text when reading CSV, so leading zeros survive.
ID_COLUMNS = {"quadkey", "fips", "countyfips", "geoid", "zip", "zipcode", "postcode", "statefp", "countyfp"}


def norm_name(column) -> str:
    """Lower-case a column name and keep only letters and digits (``"Lon (deg)"`` -> ``"londeg"``)."""
    return re.sub(r"[^a-z0-9]", "", str(column).lower())


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


def _too_big(src: Source, what: str, size: float) -> DataError:
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
        raise _too_big(src, f"the zip's {', '.join(names[:5])}", declared)


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
                        raise _too_big(src, f"the zip member '{name}'", total)
                    buf.write(chunk)
    except DataError:
        raise
    except (zipfile.BadZipFile, zlib.error, OSError, ValueError, EOFError, NotImplementedError, RuntimeError) as e:
        raise DataError(f"{src.where()}: the zip member '{name}' cannot be unpacked ({_short(e)}); re-create the zip") \
            from None
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


def _zip_names(src: Source) -> list[str]:
    try:
        with zipfile.ZipFile(src.buffer()) as zf:
            return [n for n in zf.namelist() if not n.endswith("/") and "__MACOSX" not in n]
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError) as e:
        raise DataError(f"{src.where()} is not a readable zip archive ({e}); re-create the zip") from None


def detect_format(src: Source) -> str:
    """One of ``csv``, ``parquet``, ``geojson``, ``gpkg``, ``zip``, ``shp``, judged from content, then suffix."""
    head = src.head(8192)
    suffix = src.suffix
    if head.startswith(b"\xd0\xcf\x11\xe0") or suffix in EXCEL_SUFFIXES:
        raise DataError(
            f"{src.where()} is a spreadsheet workbook ({suffix or 'Excel/OLE'}), which is not read; save the sheet as "
            "CSV (in Excel: File > Save As > 'CSV UTF-8') and load that"
        )
    if head.startswith(b"PAR1"):
        return "parquet"
    if head.startswith(b"SQLite format 3\x00"):
        return "gpkg"
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        names = _zip_names(src)
        if any(n.startswith(("xl/", "word/", "ppt/")) for n in names) or "mimetype" in names:
            raise DataError(
                f"{src.where()} is an Office document (e.g. an Excel workbook), which is not read; save the sheet "
                "as CSV (File > Save As > 'CSV UTF-8') and load that"
            )
        return "zip"
    if suffix in PARQUET_SUFFIXES:
        raise DataError(
            f"{src.where()} has a Parquet name but is not a Parquet file (no 'PAR1' header); check the file"
        )
    if suffix == ".gpkg":
        raise DataError(f"{src.where()} has a GeoPackage name but is not a GeoPackage (SQLite) file; check the file")
    if suffix == ".shp":
        return "shp"
    if suffix in {".shx", ".dbf", ".prj", ".cpg"}:
        raise DataError(
            f"{src.where()} is one part of a Shapefile; zip the .shp, .shx, .dbf and .prj together and load the .zip"
        )
    stripped = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if stripped.startswith((b"{", b"[")) or suffix in JSON_SUFFIXES:
        return "geojson"
    if _looks_utf16(head):
        return "csv"  # decode_text explains how to save it as UTF-8
    if _looks_binary(head):
        raise DataError(
            f"{src.where()} is not a text file and not a format that is read (it looks like binary data); "
            f"supported: {SUPPORTED}"
        )
    return "csv"


def _looks_utf16(head: bytes) -> bool:
    """A UTF-16 byte-order mark, or text where every other byte is NUL (ASCII in UTF-16 without BOM)."""
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        return True
    if len(head) < 8:
        return False
    even, odd = head[0::2], head[1::2]
    return (odd.count(0) > 0.9 * len(odd) and even.count(0) < 0.1 * len(even)) or (
        even.count(0) > 0.9 * len(even) and odd.count(0) < 0.1 * len(odd)
    )


def _looks_binary(head: bytes) -> bool:
    if not head:
        return False
    if b"\x00" in head:
        return True
    control = sum(1 for b in head if b < 32 and b not in (9, 10, 12, 13))
    return control / len(head) > 0.05


def decode_text(raw: bytes, src: Source, report: ReadReport) -> str:
    """Decode CSV bytes as UTF-8 (with or without BOM), else Latin-1 with a note; reject binary content."""
    if _looks_utf16(raw[:4096]):
        raise DataError(
            f"{src.where()} is UTF-16 text (as Excel's 'Unicode Text' writes it), which is not read; save it as "
            "UTF-8 (in Excel: File > Save As > 'CSV UTF-8'; in an editor: encoding UTF-8) and load that"
        )
    if _looks_binary(raw[:65536]):
        raise DataError(f"{src.where()} does not look like a text (CSV) file; supported: {SUPPORTED}")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        report.notes.append("not valid UTF-8: decoded as Latin-1 (Windows-1252); check accented names")
        return raw.decode("cp1252", errors="replace")


def sniff_delimiter(text: str, suffix: str) -> str:
    """The delimiter among ``, TAB ; |`` that splits the first lines into the same number (> 1) of fields."""
    lines = [ln for ln in text.splitlines()[:60] if ln.strip()][:40]
    if not lines:
        return ","
    order = ["\t", ",", ";", "|"] if suffix in {".tsv", ".tab"} else [",", "\t", ";", "|"]
    best, best_key = ",", (-1, -1)
    for i, d in enumerate(order):
        try:
            counts = [len(row) for row in csv.reader(lines, delimiter=d)]
        except csv.Error:
            continue
        if not counts:
            continue
        consistent = len(set(counts)) == 1 and counts[0] > 1
        key = (2 if consistent else (1 if counts[0] > 1 else 0), counts[0] if consistent else 0, -i)
        if key > best_key:
            best, best_key = d, key
    return best


def _check_field_counts(text: str, delim: str, src: Source) -> bool:
    """Rows with more fields than the header make pandas take the first column(s) as the index, shifting
    every column silently (``-94.58,39.09,68,89`` under ``lon,lat,mbps``: a decimal comma). Raise DataError
    when the data rows all carry extra non-empty fields; return True when the extras are only trailing
    delimiters (empty), which are dropped."""
    lines = [ln for ln in text.splitlines()[:201] if ln.strip()]
    try:
        rows = list(csv.reader(lines, delimiter=delim))
    except csv.Error:
        return False
    if len(rows) < 2:
        return False
    width, data = len(rows[0]), rows[1:]
    extra = [(i, r) for i, r in enumerate(data, start=1) if len(r) > width]
    if not extra:
        return False
    if all(not v.strip() for _, r in extra for v in r[width:]):
        return True
    if len(extra) == len(data):
        i, r = extra[0]
        comma = (
            f" — values like '{r[-2]}{delim}{r[-1]}' look like a number with a decimal comma" if delim == "," else ""
        )
        raise DataError(
            f"{src.where()}: data row {i} has {len(r)} fields but the header has {width} ({delim.join(r)[:80]!r})"
            f"{comma}; the columns would shift. Write decimals with '.', or save the file with ';' as the "
            "delimiter (then decimal commas are read), or quote values that contain the delimiter"
        )
    return False


_FIELDS_RE = re.compile(r"Expected (\d+) fields in line (\d+), saw (\d+)")


def read_csv(
    src: Source, report: ReadReport, *, sep: str | None = None, decimal: str = "."
) -> tuple[pd.DataFrame, str]:
    """Parse delimited text; returns the frame (all rows, original columns) and the delimiter used."""
    text = decode_text(src.read_bytes(), src, report)
    if not text.strip():
        raise DataError(f"{src.where()} is empty (only blank lines); choose the file that holds the data")
    delim = sep or sniff_delimiter(text, src.suffix)
    trailing = _check_field_counts(text, delim, src)
    try:
        header = pd.read_csv(io.StringIO(text), sep=delim, nrows=0, engine="c")
        dtype = {c: "string" for c in header.columns if norm_name(c) in ID_COLUMNS}
        df = pd.read_csv(
            io.StringIO(text),
            sep=delim,
            dtype=dtype,
            decimal=decimal,
            skipinitialspace=True,
            low_memory=False,
            engine="c",
            index_col=False if trailing else None,
        )
    except pd.errors.EmptyDataError:
        raise DataError(f"{src.where()} has no header and no rows; choose the file that holds the data") from None
    except pd.errors.ParserError as e:
        m = _FIELDS_RE.search(str(e))
        if m:
            expected, line, saw = (int(g) for g in m.groups())
            comma = " (a decimal comma such as '12,5' in a comma-separated file?)" if delim == "," else ""
            raise DataError(
                f"{src.where()}: line {line} (data row {line - 1}) has {saw} fields but the header has {expected}"
                f"{comma}; quote values that contain the delimiter {delim!r}, or fix that row"
            ) from None
        raise DataError(f"{src.where()} could not be parsed as delimited text ({_short(e)}); check the file") from None
    except (ValueError, TypeError, OverflowError, MemoryError, UnicodeError, csv.Error) as e:
        raise DataError(f"{src.where()} could not be parsed as delimited text ({_short(e)}); check the file") from None
    if len(df.columns) == 0:
        raise DataError(f"{src.where()} has no columns; the first line must be a header with column names")
    if len(df) == 0:
        cols = ", ".join(map(str, df.columns[:20]))
        raise DataError(f"{src.where()} has a header ({cols}) but no data rows; add the measurements below the header")
    return df, delim


def _short(e: BaseException) -> str:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    msg = re.sub(r"/vsimem/\S+|/vsizip/\S+", "<file>", msg)
    return msg[:300]


def read_parquet(src: Source, report: ReadReport) -> tuple[pd.DataFrame, str]:
    """Parquet -> DataFrame; GeoParquet (``geo`` metadata) -> GeoDataFrame with its CRS."""
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(src.buffer())
        decoded = pf.metadata.num_rows * max(pf.metadata.num_columns, 1) * 8
        if src.limit is not None and decoded > DECODED_FACTOR * src.limit:
            raise _too_big(src, f"the Parquet file's {pf.metadata.num_rows:,} rows x {pf.metadata.num_columns} columns",
                           decoded)
        meta = pf.schema_arrow.metadata or {}
        if b"geo" in meta:
            df = gpd.read_parquet(src.buffer())
            return df, "geoparquet"
        return pf.read().to_pandas(), "parquet"
    except DataError:
        raise
    except Exception as e:  # pyarrow raises many types for corrupt files
        raise DataError(f"{src.where()} is not a readable Parquet file ({_short(e)}); check or re-export it") from None


def _ogr_target(src: Source):
    return str(src.path) if src.path is not None else src.data


def read_ogr(src: Source, fmt: str, report: ReadReport, layer=None) -> tuple[pd.DataFrame, str]:
    """GeoJSON, GeoPackage, Shapefile (plain or zipped) via pyogrio; picks the layer."""
    import pyogrio

    label = {"geojson": "GeoJSON", "gpkg": "GeoPackage", "zip": "zipped Shapefile", "shp": "Shapefile"}[fmt]
    with tempfile.TemporaryDirectory() as tmpdir:
        if fmt == "zip":
            names = _zip_names(src)
            shps = [n for n in names if n.lower().endswith(".shp")]
            others = [n for n in names if n.lower().endswith((".gpkg", ".geojson", ".json"))]
            members = shps or others
            inner_zips = [n for n in names if n.lower().endswith(".zip")]
            if not members and len(inner_zips) == 1 and len(names) == 1:
                return _read_nested_zip(src, inner_zips[0], report, layer)
            if not members:
                return _read_zip_table(src, names, report)
            layers = {Path(n).stem: n for n in members}
            chosen = _choose_layer(src, list(layers), layer, report)
            member = layers[chosen]
            if member.lower().endswith(".shp"):
                stem = member[:-4]
                missing = [e for e in (".shx", ".dbf") if not any(n.lower() == (stem + e).lower() for n in names)]
                if missing:
                    raise DataError(
                        f"{src.where()}: the Shapefile '{member}' lacks its {' and '.join(missing)} part(s); "
                        "zip all parts (.shp, .shx, .dbf, .prj) together"
                    )
                if not any(n.lower() == (stem + ".prj").lower() for n in names):
                    report.notes.append(f"'{member}' has no .prj: CRS unknown (EPSG:4326 assumed unless crs= is given)")
                label = "zipped Shapefile"
            else:
                label = f"zipped {Path(member).suffix.lstrip('.')}"
            stem = member.rsplit(".", 1)[0].lower()
            parts = [n for n in names if n.rsplit(".", 1)[0].lower() == stem] if member.lower().endswith(".shp") \
                else [member]
            folder = extract_zip_members(src, parts, tmpdir)
            target = str(folder / re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(member).name))
            report.layer = chosen if len(layers) > 1 else None
            return _read_ogr_layer(src, target, None, label), "shapefile" if member.lower().endswith(".shp") else fmt
        if fmt == "shp" and src.path is None:
            raise DataError(
                f"{src.where()}: a bare .shp upload lacks its .shx/.dbf/.prj parts; "
                "zip them together and upload the .zip"
            )
        target = _ogr_target(src)
        try:
            infos = pyogrio.list_layers(target if isinstance(target, str) else io.BytesIO(target))
        except Exception as e:
            hint = " (JSON that is not GeoJSON? a GeoJSON FeatureCollection is needed)" if fmt == "geojson" else ""
            raise DataError(f"{src.where()} cannot be opened as {label}{hint}: {_short(e)}") from None
        names = [str(r[0]) for r in infos]
        if not names:
            raise DataError(f"{src.where()} holds no layers; check that it is a {label} with features")
        chosen = _choose_layer(src, names, layer, report)
        report.layer = chosen if (len(names) > 1 or layer is not None) and fmt == "gpkg" else None
        df = _read_ogr_layer(src, target if isinstance(target, str) else io.BytesIO(target), chosen, label)
        return df, "shapefile" if fmt == "shp" else fmt


def _choose_layer(src: Source, names: list[str], layer, report: ReadReport) -> str:
    if layer is None:
        if len(names) > 1:
            report.notes.append(f"{len(names)} layers ({', '.join(names)}); read '{names[0]}' (pass layer= to choose)")
        return names[0]
    if isinstance(layer, int) and not isinstance(layer, bool):
        if 0 <= layer < len(names):
            return names[layer]
    elif str(layer) in names:
        return str(layer)
    raise DataError(f"{src.where()} has no layer {layer!r}; layers: {', '.join(names)}")


def _read_ogr_layer(src: Source, target, layer, label: str) -> pd.DataFrame:
    import pyogrio

    try:
        df = pyogrio.read_dataframe(target, layer=layer)
    except Exception as e:
        raise DataError(f"{src.where()} cannot be read as {label}: {_short(e)}") from None
    if len(df) == 0:
        which = f"layer '{layer}'" if layer else "the file"
        raise DataError(f"{src.where()}: {which} has no features; choose a layer or file with data")
    return df


def _read_nested_zip(src: Source, name: str, report: ReadReport, layer) -> tuple[pd.DataFrame, str]:
    """A zip holding one zip: unpack it under the same limit and read it (one level deep)."""
    if src.depth >= MAX_ZIP_DEPTH:
        raise DataError(f"{src.where()}: zips nested more than {MAX_ZIP_DEPTH} level deep are not read; unzip it first")
    data = read_zip_member(src, name)
    inner = Source(f"{src.name}!{name}", data=data, limit=src.limit, depth=src.depth + 1)
    if not data.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        raise DataError(f"{inner.where()} is not a zip archive; re-create the zip")
    report.notes.append(f"read the zip '{name}' inside the zip")
    return read_ogr(inner, "zip", report, layer=layer)


def _read_zip_table(src: Source, names: list[str], report: ReadReport) -> tuple[pd.DataFrame, str]:
    tables = [n for n in names if Path(n).suffix.lower() in TEXT_SUFFIXES | PARQUET_SUFFIXES]
    if len(tables) != 1:
        listing = ", ".join(names[:15]) or "nothing"
        raise DataError(
            f"{src.where()}: the zip holds {listing}; expected one Shapefile (.shp with .shx, .dbf, .prj), GeoPackage, "
            "GeoJSON, or a single CSV/Parquet file"
        )
    data = read_zip_member(src, tables[0])
    report.notes.append(f"read '{tables[0]}' from the zip ({mb(len(data))} uncompressed)")
    inner = Source(f"{src.name}!{tables[0]}", data=data, limit=src.limit, depth=src.depth)
    if data.startswith(b"PAR1"):
        return read_parquet(inner, report)
    df, delim = read_csv(inner, report)
    return df, "csv" if delim == "," else f"csv (delimiter {delim!r})"
