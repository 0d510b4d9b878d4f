"""Telling a file's format from its first bytes (then its name), its text encoding and its CSV delimiter.

Internal to the readers (:mod:`gpcore.data._parsers`, :func:`gpcore.data.read_polygons`). Every failure becomes a
:class:`DataError` naming the file.
"""

from __future__ import annotations

import csv

from gpcore.data._source import Source, zip_names
from gpcore.data.report import ReadReport
from gpcore.errors import DataError

#: File name suffixes, lower case, by format (the content decides first; see :func:`detect_format`).
TEXT_SUFFIXES = {".csv", ".tsv", ".tab", ".txt", ".dat", ".xyz", ".psv"}
PARQUET_SUFFIXES = {".parquet", ".geoparquet", ".pq", ".parq"}
JSON_SUFFIXES = {".geojson", ".json", ".geojsonl"}
EXCEL_SUFFIXES = {".xlsx", ".xls", ".xlsm", ".xlsb", ".ods", ".numbers"}
SUPPORTED = (
    "CSV/TSV text, Parquet/GeoParquet, GeoJSON, GeoPackage (.gpkg), or a zipped Shapefile (.zip with .shp, .shx, "
    ".dbf, .prj)"
)


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
        names = zip_names(src)
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
