"""Fuzzing the command line (issue 12): CSV content and byte-mutated Parquet, GeoJSON, GeoPackage and zip
files through ``python -m gpcore data inspect`` and ``fit``. Every file ends in exit 0 or 2 with an
``error:`` line, never a traceback or an internal error.

Seeded and bounded (``derandomize=True``); ``UA_FUZZ_EXAMPLES`` raises the number of examples per case
for a longer local run (the closing counts of issue 12 were taken that way).
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
import zipfile
from pathlib import Path

import geopandas as gpd
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from shapely.geometry import Point

from gpcore.cli import main
from tests.gpcore.data.conftest import pr_table

N = int(os.environ.get("UA_FUZZ_EXAMPLES", "30"))
FUZZ = settings(max_examples=N, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
TALLY = {"files": 0, "exit0": 0, "exit2": 0}


@pytest.fixture(scope="module", autouse=True)
def _print_tally():
    """Prints how many fuzzed files were tried and how they ended (the issue's closing numbers; run with -s)."""
    yield
    print(f"\nfuzz tally: {TALLY}")


def run_cli(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(argv)
    return rc, err.getvalue()


def check(path: Path, *extra: str, command: str = "inspect") -> int:
    if command == "inspect":
        argv = ["data", "inspect", str(path), "--y", "mbps", "--allow-drop", "--max-mb", "5", *extra]
    else:
        out = path.parent / "fuzz-run"
        argv = ["fit", "--data", str(path), "--y", "mbps", "--grid", "none", "--out", str(out), "--overwrite",
                "--set", "epochs=1", "--set", "rank=4", "--set", "hidden=4", "--set", "batch_size=64", *extra]
    rc, err = run_cli(argv)
    TALLY["files"] += 1
    TALLY[f"exit{rc}"] = TALLY.get(f"exit{rc}", 0) + 1
    assert rc in (0, 2), (rc, err[-2000:])
    assert "Traceback" not in err and "internal error" not in err, err[-2000:]
    if rc == 2:
        assert err.strip().splitlines()[-1].startswith("error: "), err[-500:]
    if command == "fit" and rc == 0:  # a run written is a real run: valid manifest, finite model and metrics
        from gpcore.run.store import load_run

        manifest, model = load_run(out)
        pred = model.predict(np.array([[-66.5, 18.2], [-66.0, 18.3]]))
        assert np.isfinite(pred.mean).all() and np.isfinite(pred.var_y).all()
        TALLY["runs written"] = TALLY.get("runs written", 0) + 1
    return rc


# ------------------------------------------------------------------------------------------ seeds


def _seeds() -> dict[str, bytes]:
    t = pr_table(40, seed=1)
    gdf = gpd.GeoDataFrame(t, geometry=[Point(x, y) for x, y in zip(t.lon, t.lat, strict=True)], crs="EPSG:4326")
    out: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        t.to_parquet(d / "a.parquet", index=False)
        gdf.to_file(d / "a.geojson", driver="GeoJSON", engine="pyogrio")
        gdf.to_file(d / "a.gpkg", driver="GPKG", engine="pyogrio")
        (d / "shp").mkdir()
        gdf.to_file(d / "shp" / "a.shp", engine="pyogrio")
        for name in ("a.parquet", "a.geojson", "a.gpkg"):
            out[name] = (d / name).read_bytes()
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
            for p in sorted((d / "shp").iterdir()):
                zf.write(p, p.name)
        out["shape.zip"] = buf.getvalue()
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
            zf.writestr("a.csv", t.to_csv(index=False))
        out["csv.zip"] = buf.getvalue()
    return out


SEEDS = _seeds()


@st.composite
def mutated(draw, seed: bytes) -> bytes:
    data = bytearray(seed)
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["flip", "truncate", "insert", "zero-run"]))
        pos = draw(st.integers(0, max(len(data) - 1, 0)))
        if kind == "flip" and data:
            data[pos] = draw(st.integers(0, 255))
        elif kind == "truncate":
            del data[pos:]
        elif kind == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        elif data:
            data[pos : pos + draw(st.integers(1, 64))] = b"\x00" * 8
    return bytes(data)


def test_the_seeds_are_valid(tmp_path):
    for name, data in SEEDS.items():
        (tmp_path / name).write_bytes(data)
        assert check(tmp_path / name) == 0, name


@pytest.mark.parametrize("name", sorted(SEEDS))
def test_byte_mutated_files(name):
    @FUZZ
    @given(data=mutated(SEEDS[name]))
    def run(data):
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / name
            path.write_bytes(data)
            check(path)

    run()


_CELL = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(-10**6, 10**6).map(str),
    st.sampled_from(["", "NA", "-", "1,5", "1e308", "-1e308", "=cmd|' /C calc'!A0", "<img src=x onerror=alert(1)>",
                     "\"", "'", "18.2", "-66.5", "2023Q1", "null"]),
    st.text(max_size=8),
)


@st.composite
def csv_text(draw) -> str:
    header = draw(st.sampled_from([["lon", "lat", "mbps"], ["x", "y", "mbps"], ["lon", "lat", "mbps", "tests"],
                                   ["longitude", "latitude", "mbps"], ["lon", "mbps"]]))
    sep = draw(st.sampled_from([",", ";", "\t", "|"]))
    rows = []
    clean = draw(st.integers(0, 10))  # how many rows in 10 are well-formed
    for _ in range(draw(st.integers(0, 40))):
        if draw(st.integers(0, 9)) < clean:
            rows.append([str(draw(st.floats(-66.9, -65.7))), str(draw(st.floats(18.05, 18.45))),
                         str(draw(st.floats(0.1, 500)))][: len(header)])
        else:
            rows.append([draw(_CELL) for _ in range(draw(st.integers(len(header) - 1, len(header) + 1)))])
    return "\n".join(sep.join(r) for r in [header, *rows]) + draw(st.sampled_from(["", "\n", "\r\n"]))


@FUZZ
@given(text=csv_text(), encoding=st.sampled_from(["utf-8", "utf-8-sig", "cp1252", "utf-16"]))
def test_fuzzed_csv_content(text, encoding):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "fuzz.csv"
        path.write_bytes(text.encode(encoding, errors="replace"))
        check(path)


@settings(max_examples=max(N // 5, 3), deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(text=csv_text())
def test_fuzzed_csv_through_fit(text):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "fuzz.csv"
        path.write_text(text)
        check(path, command="fit")
