"""Property-based fuzzing of the CSV reader: any input gives a frame or a DataError, never another exception."""

from __future__ import annotations

import string

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpcore.data import DataError, read_measurements

FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _read_or_dataerror(data: bytes, name: str, **kw):
    try:
        gdf = read_measurements(data, name=name, **kw)
    except DataError as e:
        assert str(e)  # every error says something
        return None
    assert gdf.crs.to_epsg() == 4326
    assert np.isfinite(gdf["lon"]).all() and np.isfinite(gdf["lat"]).all()
    assert (gdf["lat"].abs() <= 90).all() and (gdf["lon"].abs() <= 180).all()
    rep = gdf.attrs["report"]
    assert rep.rows_kept == len(gdf) <= rep.rows_read
    return gdf


@FUZZ
@given(data=st.binary(max_size=2000), name=st.sampled_from(["x.csv", "x.tsv", "x.txt", "upload", "x.json", "x.zip"]))
def test_random_bytes(data, name):
    _read_or_dataerror(data, name)


_TEXT_CHARS = string.ascii_letters + string.digits + ",;\t|.-+eE \"'\n\r#/:()" + "äé€"


@FUZZ
@given(text=st.text(alphabet=_TEXT_CHARS, max_size=600), allow_drop=st.booleans())
def test_random_text(text, allow_drop):
    _read_or_dataerror(text.encode("utf-8"), "t.csv", allow_drop=allow_drop)


_CELLS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, width=64),
    st.floats(min_value=-200, max_value=200),
    st.integers(min_value=-(10**12), max_value=10**12),
    st.sampled_from(["", "n/a", "NA", "null", "12,5", "abc", "1e400", "-", " 7 ", "POINT (1 2)", "0323002122001010"]),
    st.text(alphabet=string.printable, max_size=8),
)
_NAMES = st.sampled_from(
    [
        "lon",
        "lat",
        "x",
        "y",
        "longitude",
        "Latitude",
        "quadkey",
        "tile",
        "geometry",
        "mbps",
        "quarter",
        "tests",
        "avg_d_kbps",
        "a",
        "b",
        "c",
    ]
)


@st.composite
def tables(draw):
    n_cols = draw(st.integers(min_value=1, max_value=6))
    names = draw(st.lists(_NAMES, min_size=n_cols, max_size=n_cols, unique=True))
    n_rows = draw(st.integers(min_value=0, max_value=25))
    cols = {c: draw(st.lists(_CELLS, min_size=n_rows, max_size=n_rows)) for c in names}
    return pd.DataFrame(cols, columns=names)


@FUZZ
@given(
    df=tables(),
    sep=st.sampled_from([",", ";", "\t"]),
    target=st.sampled_from([None, "mbps", "download_mbps", "a"]),
    transform=st.sampled_from(["identity", "log10"]),
    allow_drop=st.booleans(),
    quarter=st.sampled_from([None, "2023", "all"]),
)
def test_random_tables(df, sep, target, transform, allow_drop, quarter):
    data = df.to_csv(index=False, sep=sep).encode("utf-8")
    _read_or_dataerror(
        data, "table.csv", target=target, transform=transform, allow_drop=allow_drop, quarter=quarter, min_points=1
    )


@FUZZ
@given(
    lon=st.lists(st.floats(min_value=-66.9, max_value=-65.7), min_size=10, max_size=40),
    seed=st.integers(0, 10**6),
)
def test_valid_points_always_read_back_exactly(lon, seed):
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({"lon": lon, "lat": rng.uniform(18.0, 18.5, len(lon)), "v": rng.uniform(1, 10, len(lon))})
    gdf = read_measurements(df.to_csv(index=False).encode(), name="ok.csv", target="v", transform="log10")
    np.testing.assert_allclose(gdf["lon"], df["lon"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(gdf["v"], df["v"], rtol=1e-15)
