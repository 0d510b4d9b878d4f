"""One size guard for every archive path: a small zip may not unpack past the byte limit (issue 12).

The limit is lowered to a few hundred KB so each bomb is tiny and fast; the same code runs with the
default 200 MB limit. Each case checks the reader stops with a DataError naming the file and the limit
(and, for the streamed check, before unpacking much more than the limit).
"""

from __future__ import annotations

import io
import struct
import zipfile

import geopandas as gpd
import pandas as pd
import pytest
from shapely.geometry import Point

from gpcore.data import DataError, read_measurements
from tests.gpcore.data.conftest import pr_table

LIMIT = 300_000  # bytes: the zips below are a few KB and unpack to about 1 MB


def _csv_bytes(rows: int) -> bytes:
    t = pr_table(30)
    big = pd.concat([t] * (rows // 30 + 1), ignore_index=True).iloc[:rows]
    return big.to_csv(index=False).encode()


def _zip(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


def _understate_sizes(data: bytes, fake: int = 1000) -> bytes:
    """Rewrite every declared uncompressed size (local headers and central directory) to ``fake`` bytes,
    as a hostile zip would, so only the streamed count can catch it."""
    b = bytearray(data)
    i = 0
    while (i := b.find(b"PK\x03\x04", i)) != -1:
        struct.pack_into("<I", b, i + 22, fake)
        i += 4
    i = 0
    while (i := b.find(b"PK\x01\x02", i)) != -1:
        struct.pack_into("<I", b, i + 24, fake)
        i += 4
    return bytes(b)


def _shapefile_zip(n: int, pad_text: int = 0) -> bytes:
    """A zipped Shapefile of ``n`` points in Puerto Rico; ``pad_text`` adds a wide text field (a big .dbf)."""
    import tempfile
    from pathlib import Path

    t = pr_table(30)
    t = pd.concat([t] * (n // 30 + 1), ignore_index=True).iloc[:n]
    gdf = gpd.GeoDataFrame(t, geometry=[Point(x, y) for x, y in zip(t.lon, t.lat, strict=True)], crs="EPSG:4326")
    if pad_text:
        gdf["note"] = "x" * pad_text
    with tempfile.TemporaryDirectory() as d:
        gdf.to_file(Path(d) / "pts.shp", engine="pyogrio")
        return _zip({p.name: p.read_bytes() for p in sorted(Path(d).iterdir())})


def _expect_too_big(data: bytes, name: str, **kw) -> str:
    with pytest.raises(DataError) as e:
        read_measurements(data, name=name, max_bytes=LIMIT, allow_drop=True, **kw)
    msg = str(e.value)
    assert name in msg and "limit" in msg, msg
    return msg


def _expect_stopped(data: bytes, name: str, **kw) -> str:
    """A zip whose headers understate its sizes: Python's zipfile reads only the declared bytes, so the member
    fails its CRC check; either way the reader stops with a DataError naming the file (never unpacks it all)."""
    with pytest.raises(DataError) as e:
        read_measurements(data, name=name, max_bytes=LIMIT, allow_drop=True, **kw)
    msg = str(e.value)
    assert name in msg, msg
    return msg


def test_csv_in_zip_declared_size_over_the_limit():
    csv = _csv_bytes(30_000)
    assert len(csv) > 3 * LIMIT
    data = _zip({"speeds.csv": csv})
    assert len(data) < LIMIT, "the zip itself passes the byte limit"
    msg = _expect_too_big(data, "bomb.zip", target="mbps")
    assert "unpacks to more than" in msg


def test_csv_in_zip_with_understated_sizes_is_stopped_while_streaming():
    data = _understate_sizes(_zip({"speeds.csv": _csv_bytes(30_000)}))
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        assert zf.getinfo("speeds.csv").file_size == 1000, "the header lies about the size"
    msg = _expect_stopped(data, "liar.zip", target="mbps")
    assert "speeds.csv" in msg


def test_zipped_shapefile_with_a_huge_dbf_is_refused():
    data = _shapefile_zip(2000, pad_text=250)
    assert len(data) < LIMIT
    _expect_too_big(data, "shape_bomb.zip", target="mbps")


def test_zipped_shapefile_with_understated_sizes_is_stopped_while_streaming():
    data = _understate_sizes(_shapefile_zip(2000, pad_text=250))
    _expect_stopped(data, "shape_liar.zip", target="mbps")


def test_nested_zip_bomb_is_refused_and_a_small_nested_zip_is_read():
    inner = _zip({"speeds.csv": _csv_bytes(30_000)})
    _expect_too_big(_zip({"inner.zip": inner}), "outer.zip", target="mbps")
    ok = _zip({"inner.zip": _zip({"speeds.csv": _csv_bytes(60)})})
    gdf = read_measurements(ok, name="outer.zip", max_bytes=LIMIT, target="mbps")
    assert len(gdf) == 60


def test_zips_nested_two_levels_are_refused():
    two = _zip({"a.zip": _zip({"b.zip": _zip({"speeds.csv": _csv_bytes(60)})})})
    with pytest.raises(DataError, match="nested"):
        read_measurements(two, name="deep.zip", max_bytes=LIMIT, target="mbps")


def test_small_archives_still_read():
    gdf = read_measurements(_zip({"speeds.csv": _csv_bytes(60)}), name="ok.zip", max_bytes=LIMIT, target="mbps")
    assert len(gdf) == 60
    gdf = read_measurements(_shapefile_zip(60), name="pts.zip", max_bytes=LIMIT, target="mbps")
    assert len(gdf) == 60


def test_parquet_that_decodes_far_past_the_limit_is_refused(tmp_path):
    n = 400_000  # one repeated value per column: a few KB of Parquet, 400k x 4 x 8 bytes decoded
    df = pd.DataFrame({"lon": [-66.5] * n, "lat": [18.2] * n, "mbps": [10.0] * n, "tests": [1] * n})
    path = tmp_path / "rle.parquet"
    df.to_parquet(path, index=False)
    size = path.stat().st_size
    assert size < LIMIT
    with pytest.raises(DataError, match="unpacks to more than"):  # the file itself is within its limit
        read_measurements(path, max_bytes=size + 1, target="mbps")
    assert len(read_measurements(path, max_bytes=None, target="mbps")) == n


def test_the_streamed_count_stops_a_member_even_without_the_declared_check(monkeypatch):
    """Defence in depth: with the declared-size check switched off the streamed count still stops at the limit."""
    from gpcore.data import _source

    monkeypatch.setattr(_source, "check_zip_sizes", lambda *a, **k: None)
    msg = _expect_too_big(_zip({"speeds.csv": _csv_bytes(30_000)}), "stream.zip", target="mbps")
    assert "the zip member 'speeds.csv' unpacks to more than" in msg
    _expect_too_big(_shapefile_zip(2000, pad_text=250), "stream_shape.zip", target="mbps")
