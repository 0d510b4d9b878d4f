"""One parser per format, turning an opened :class:`~gpcore.data._source.Source` into a table.

:func:`read_frame` detects the format and dispatches: delimited text, Parquet/GeoParquet, and the OGR formats
(GeoJSON, GeoPackage, Shapefile, plain or zipped; a zip holding one table or one zip). Internal to
:mod:`gpcore.data.readers`. Every failure becomes a :class:`DataError` naming the file.
"""

from __future__ import annotations

import csv
import io
import re
import tempfile
from pathlib import Path

import geopandas as gpd
import pandas as pd

from gpcore.data._sniff import PARQUET_SUFFIXES, TEXT_SUFFIXES, decode_text, detect_format, sniff_delimiter
from gpcore.data._source import (
    DECODED_FACTOR,
    MAX_ZIP_DEPTH,
    Source,
    extract_zip_members,
    mb,
    read_zip_member,
    short_error,
    too_big,
    zip_names,
)
from gpcore.data.report import ReadReport
from gpcore.errors import DataError

#: Column names (normalised) kept as text when reading CSV, so leading zeros survive.
ID_COLUMNS = {"quadkey", "fips", "countyfips", "geoid", "zip", "zipcode", "postcode", "statefp", "countyfp"}


def norm_name(column) -> str:
    """Lower-case a column name and keep only letters and digits (``"Lon (deg)"`` -> ``"londeg"``)."""
    return re.sub(r"[^a-z0-9]", "", str(column).lower())


def read_frame(src: Source, report: ReadReport, *, layer, sep, decimal) -> tuple[pd.DataFrame, str, str | None]:
    """The table read from ``src`` (all rows, original columns), a label of its format, and the CSV delimiter
    (None for non-text formats)."""
    fmt = detect_format(src)
    if fmt == "csv":
        df, delim = read_csv(src, report, sep=sep, decimal=decimal)
        return df, "csv" if delim == "," else f"csv (delimiter {delim!r})", delim
    if fmt == "parquet":
        df, kind = read_parquet(src, report)
        return df, kind, None
    df, kind = read_ogr(src, fmt, report, layer=layer)
    return df, kind, ";" if kind.startswith("csv (") else ("," if kind == "csv" else None)


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
        raise DataError(
            f"{src.where()} could not be parsed as delimited text ({short_error(e)}); check the file"
        ) from None
    except (ValueError, TypeError, OverflowError, MemoryError, UnicodeError, csv.Error) as e:
        raise DataError(
            f"{src.where()} could not be parsed as delimited text ({short_error(e)}); check the file"
        ) from None
    if len(df.columns) == 0:
        raise DataError(f"{src.where()} has no columns; the first line must be a header with column names")
    if len(df) == 0:
        cols = ", ".join(map(str, df.columns[:20]))
        raise DataError(f"{src.where()} has a header ({cols}) but no data rows; add the measurements below the header")
    return df, delim


def read_parquet(src: Source, report: ReadReport) -> tuple[pd.DataFrame, str]:
    """Parquet -> DataFrame; GeoParquet (``geo`` metadata) -> GeoDataFrame with its CRS."""
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(src.buffer())
        decoded = pf.metadata.num_rows * max(pf.metadata.num_columns, 1) * 8
        if src.limit is not None and decoded > DECODED_FACTOR * src.limit:
            raise too_big(src, f"the Parquet file's {pf.metadata.num_rows:,} rows x {pf.metadata.num_columns} columns",
                           decoded)
        meta = pf.schema_arrow.metadata or {}
        if b"geo" in meta:
            df = gpd.read_parquet(src.buffer())
            return df, "geoparquet"
        return pf.read().to_pandas(), "parquet"
    except DataError:
        raise
    except Exception as e:  # pyarrow raises many types for corrupt files
        raise DataError(
            f"{src.where()} is not a readable Parquet file ({short_error(e)}); check or re-export it"
        ) from None


def _ogr_target(src: Source):
    return str(src.path) if src.path is not None else src.data


def read_ogr(src: Source, fmt: str, report: ReadReport, layer=None) -> tuple[pd.DataFrame, str]:
    """GeoJSON, GeoPackage, Shapefile (plain or zipped) via pyogrio; picks the layer."""
    import pyogrio

    label = {"geojson": "GeoJSON", "gpkg": "GeoPackage", "zip": "zipped Shapefile", "shp": "Shapefile"}[fmt]
    with tempfile.TemporaryDirectory() as tmpdir:
        if fmt == "zip":
            names = zip_names(src)
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
            raise DataError(f"{src.where()} cannot be opened as {label}{hint}: {short_error(e)}") from None
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
        raise DataError(f"{src.where()} cannot be read as {label}: {short_error(e)}") from None
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
