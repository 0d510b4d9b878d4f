"""Time on the command line (issue 23 part 2; docs/cli.md, docs/methods/spacetime.md): ``fit --time-input`` with
``--quarter A:B`` and ``--split forecast --test-period``, ``predict --at``, ``change``, ``compare`` with the forecast
split, and their user errors (exit 2, one ``error:`` line naming the flag), end to end on a tiny space-time CSV."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from scipy.stats import norm

from gpcore.cli import main
from gpcore.data.temporal import decimal_year
from gpcore.run.config import RunConfig
from gpcore.run.pipeline import prepare, run_model_settings

QUARTERS = [f"{y}Q{q}" for y in (2019, 2020) for q in range(1, 5)]
FAST = ["--set", "epochs=2", "--set", "neighbors=8", "--cell-km", "25"]


def write_spacetime_csv(path, n: int = 320, seed: int = 0, trend: float = 0.2):
    """``n`` rows over 2019Q1..2020Q4: quarter, lon, lat (Puerto Rico), download_mbps rising in time by ``trend``
    log10 units a year, tests."""
    rng = np.random.default_rng(seed)
    quarter = rng.choice(QUARTERS, n)
    lon, lat = rng.uniform(-67.2, -65.6, n), rng.uniform(17.95, 18.45, n)
    f = 1.3 + 0.3 * np.sin(3 * lon) * np.cos(4 * lat) + trend * (decimal_year(quarter) - 2019)
    pd.DataFrame({"quarter": quarter, "lon": lon.round(5), "lat": lat.round(5),
                  "download_mbps": (10 ** (f + 0.05 * rng.normal(size=n))).round(3),
                  "tests": rng.integers(1, 9, n)}).to_csv(path, index=False)
    return path


@pytest.fixture(scope="module")
def st_csv(tmp_path_factory):
    return write_spacetime_csv(tmp_path_factory.mktemp("st") / "st.csv")


@pytest.fixture(scope="module")
def st_run(st_csv, tmp_path_factory):
    out = tmp_path_factory.mktemp("st") / "run"
    rc = main(["fit", "--data", str(st_csv), "--y", "download_mbps", "--transform", "log10", "--model", "vecchia",
               "--quarter", "2019Q1:2020Q2", "--time-input", "--split", "forecast", "--test-period", "2020Q2:2020Q3",
               "--out", str(out), *FAST])
    assert rc == 0
    return out


@pytest.fixture(scope="module")
def spatial_run(st_csv, tmp_path_factory):
    out = tmp_path_factory.mktemp("st") / "spatial"
    assert main(["fit", "--data", str(st_csv), "--y", "download_mbps", "--model", "vecchia", "--quarter", "2020Q4",
                 "--out", str(out), *FAST]) == 0
    return out


def _expect_user_error(capsys, argv, needle: str) -> str:
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, (argv, rc, err)
    errors = [line for line in err.strip().splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and err.strip().splitlines()[-1] == errors[0] and "Traceback" not in err, err
    assert needle in errors[0], errors[0]
    return errors[0]


def test_quarter_range_selects_those_quarters(st_csv):
    cfg = RunConfig(data=str(st_csv), y="download_mbps", quarter="2019Q2:2019Q4", grid_kind="none")
    prep = prepare(cfg)
    assert set(prep.frame["quarter"]) == {"2019Q2", "2019Q3", "2019Q4"} and prep.X.shape[1] == 2
    assert len(prep.y) == pd.read_csv(st_csv)["quarter"].isin(["2019Q2", "2019Q3", "2019Q4"]).sum()


def test_fit_time_input_writes_a_space_time_run(st_run, st_csv):
    manifest = json.loads((st_run / "run.json").read_text())
    assert manifest["config"]["time_input"] and manifest["config"]["split"] == "forecast"
    assert manifest["model_config"]["space_time"] == "separable", "vecchia gets a space-time covariance by default"
    from gpcore.run.store import load_run

    _, model = load_run(st_run)
    assert model.d_ == 3 and model.config.space_time == "separable"
    read = QUARTERS[:6] + ["2020Q3"]  # --quarter 2019Q1:2020Q2 and the test period 2020Q2:2020Q3
    tm = manifest["time"]
    assert tm["column"] == "quarter" and tm["quarters"] == read and tm["test_period"] == "2020Q2:2020Q3"
    assert sorted(p.stem for p in (st_run / "grids").iterdir()) == read == tm["grid_quarters"]
    latest = pd.read_parquet(st_run / "grids" / "2020Q3.parquet")
    pd.testing.assert_frame_equal(pd.read_parquet(st_run / "grid.parquet"), latest)
    first = pd.read_parquet(st_run / "grids" / "2019Q1.parquet")
    assert not np.allclose(first["mean_t"], latest["mean_t"]), "the grids differ by quarter"
    test = pd.read_parquet(st_run / "test_predictions.parquet")
    assert set(test["t"]) <= {decimal_year(["2020Q2"])[0], decimal_year(["2020Q3"])[0]}
    rows = pd.read_csv(st_csv)
    d = manifest["data"]
    assert d["n_test"] == rows["quarter"].isin(["2020Q2", "2020Q3"]).sum()
    assert d["n_val"] == (rows["quarter"] == "2020Q1").sum(), "validation = the last quarter before the test period"
    assert d["n_train"] == rows["quarter"].isin(QUARTERS[:4]).sum()


def test_time_input_settings_per_model(st_csv):
    cfg = RunConfig(data=str(st_csv), y="download_mbps", time_input=True, grid_kind="none", model="dbk-nn")
    prep = prepare(cfg)
    assert prep.X.shape[1] == 3 and np.allclose(prep.X[:, 2], decimal_year(prep.frame["quarter"]))
    assert run_model_settings(cfg, prep)["space_time"] == "separable"
    gneiting = RunConfig(**{**cfg.to_dict(), "x": None, "settings": {"space_time": "gneiting"}})
    assert run_model_settings(gneiting, prep)["space_time"] == "gneiting", "--set space_time=... wins"
    assert "space_time" not in run_model_settings(RunConfig(**{**cfg.to_dict(), "x": None, "model": "svgp"}), prep)


def test_a_forecast_run_recalibrates_its_variances_on_the_validation_quarter(st_csv):
    """Forecast split: ``recalibrate`` defaults to "global" without strata and "group" with them (the model's own
    run default where that is not "none"); a random split keeps the model's default; ``--set recalibrate=...``
    wins."""
    base = {"data": str(st_csv), "y": "download_mbps", "time_input": True, "grid_kind": "none"}
    forecast = {"split": "forecast", "test_period": "2020Q2:2020Q3"}
    for model in ("vecchia", "dbk-nn", "svgp"):
        cfg = RunConfig(**base, **forecast, model=model)
        assert run_model_settings(cfg, prepare(cfg))["recalibrate"] == "global", model
        cfg = RunConfig(**base, model=model)
        assert "recalibrate" not in run_model_settings(cfg, prepare(cfg)), model
    cfg = RunConfig(**base, **forecast, model="vecchia", settings={"recalibrate": "none"})
    assert run_model_settings(cfg, prepare(cfg))["recalibrate"] == "none"
    strata = RunConfig(**base, **forecast, model="svgp", strata="county_metro")
    assert run_model_settings(strata, prepare(strata))["recalibrate"] == "group", "the model's own default kept"
    for model in ("vecchia", "dbk-nn"):  # their own default is "none": a forecast with strata scales per stratum
        strata = RunConfig(**base, **forecast, model=model, strata="county_metro")
        assert run_model_settings(strata, prepare(strata))["recalibrate"] == "group", model
        random = RunConfig(**base, model=model, strata="county_metro")
        assert run_model_settings(random, prepare(random))["recalibrate"] == "none", model


def test_a_model_without_space_time_takes_t_as_an_input(st_csv, tmp_path):
    out = tmp_path / "exact"
    assert main(["fit", "--data", str(st_csv), "--y", "download_mbps", "--model", "exact", "--time-input",
                 "--grid", "none", "--set", "epochs=2", "--out", str(out)]) == 0
    from gpcore.run.store import load_run

    manifest, model = load_run(out)
    assert model.d_ == 3 and "space_time" not in manifest["model_config"]
    assert manifest["time"]["quarters"] == QUARTERS, "no --quarter: every quarter"


def test_predict_at_a_quarter(st_run, st_csv, tmp_path):
    cells = pd.read_parquet(st_run / "grids" / "2019Q3.parquet")
    cells[["lon", "lat"]].to_csv(tmp_path / "cells.csv", index=False)  # no time column
    assert main(["predict", str(st_run), "--data", str(tmp_path / "cells.csv"), "--at", "2019Q3",
                 "--out", str(tmp_path / "p.parquet")]) == 0
    p = pd.read_parquet(tmp_path / "p.parquet")
    assert np.all(p["t"] == 2019.625)
    np.testing.assert_allclose(p["mean_t"], cells["mean_t"], rtol=1e-6)  # the run's grid at that quarter
    np.testing.assert_allclose(p["sd_t"], cells["sd_t"], rtol=1e-6)
    assert main(["predict", str(st_run), "--data", str(tmp_path / "cells.csv"), "--at", "2024Q1",
                 "--out", str(tmp_path / "future.csv")]) == 0
    future = pd.read_csv(tmp_path / "future.csv")
    assert np.all(future["t"] == 2024.125) and np.all(future["sd_t"] > p["sd_t"]), "far ahead: wider"
    assert main(["predict", str(st_run), "--data", str(st_csv), "--out", str(tmp_path / "own.parquet")]) == 0
    own = pd.read_parquet(tmp_path / "own.parquet")
    assert np.allclose(own["t"], decimal_year(pd.read_csv(st_csv)["quarter"])), "each row at its own quarter"


def test_change_command(st_run, tmp_path, capsys):
    out = tmp_path / "change.csv"
    assert main(["change", str(st_run), "--from", "2019Q2", "--to", "2020Q3", "--hyper-draws", "0",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "log10(download_mbps)" in text and "2019Q2 -> 2020Q3" in text and "at the fitted hyperparameters" in text
    t = pd.read_csv(out)
    assert list(t.columns) == ["cell_id", "lon", "lat", "change_mean", "change_sd", "change_lo", "change_hi",
                               "p_increase"]
    grid = pd.read_parquet(st_run / "grid.parquet")
    assert t["cell_id"].tolist() == grid["cell_id"].tolist()
    assert (t["change_sd"] > 0).all()
    np.testing.assert_allclose(t["p_increase"], norm.cdf(t["change_mean"] / t["change_sd"]), atol=1e-9)
    np.testing.assert_allclose(t["change_hi"] - t["change_lo"], 2 * norm.ppf(0.975) * t["change_sd"], rtol=1e-6)
    a = pd.read_parquet(st_run / "grids" / "2019Q2.parquet")["mean_t"]
    b = pd.read_parquet(st_run / "grids" / "2020Q3.parquet")["mean_t"]
    # vecchia's change conditions both quarters on the union of their neighbours (gpcore.models.vecchia_pairs): close
    # to, not equal to, the difference of the two quarters' maps (each on its own neighbours)
    np.testing.assert_allclose(t["change_mean"], b - a, atol=0.03)
    assert np.abs(t["change_mean"] - (b - a)).max() > 1e-6
    # the default: averaged over the hyperparameters' draws (a mixture: wider, P from the draws)
    mixed = tmp_path / "mixed.parquet"
    assert main(["change", str(st_run), "--from", "2019Q2", "--to", "2020Q3", "--out", str(mixed)]) == 0
    assert "averaged over 16 draws of the hyperparameters" in capsys.readouterr().out
    m = pd.read_parquet(mixed)
    assert m["cell_id"].tolist() == t["cell_id"].tolist()
    assert ((m["change_lo"] < m["change_mean"]) & (m["change_mean"] < m["change_hi"])).all()
    assert m["p_increase"].between(0, 1).all() and not np.allclose(m["p_increase"], t["p_increase"], atol=1e-3)


def test_change_as_geojson_and_geotiff_on_the_grid_cells(st_run, tmp_path, capsys):
    """``change --out`` also writes GeoJSON (the table on the cells' polygons) and a GeoTIFF (one band per change
    column on the grid's layout), each holding the numbers of the table."""
    import geopandas as gpd
    import rasterio

    from gpcore.run.rundir import read_grid_frame

    args = ["change", str(st_run), "--from", "2019Q2", "--to", "2020Q3", "--hyper-draws", "0"]
    assert main([*args, "--out", str(tmp_path / "c.csv")]) == 0
    table = pd.read_csv(tmp_path / "c.csv")
    assert main([*args, "--out", str(tmp_path / "c.geojson")]) == 0
    geo = gpd.read_file(tmp_path / "c.geojson")
    assert geo["cell_id"].tolist() == table["cell_id"].tolist()
    assert set(geo.geom_type) == {"Polygon"}
    for col in ("change_mean", "change_sd", "change_lo", "change_hi", "p_increase"):
        np.testing.assert_allclose(geo[col], table[col], rtol=1e-9, atol=1e-12)
    assert main([*args, "--out", str(tmp_path / "c.tif")]) == 0
    assert "wrote" in capsys.readouterr().out
    cells = read_grid_frame(st_run)
    with rasterio.open(tmp_path / "c.tif") as src:
        assert src.descriptions == ("change_mean", "change_sd", "change_lo", "change_hi", "p_increase")
        assert (src.tags()["change_from"], src.tags()["change_to"]) == ("2019Q2", "2020Q3")
        data = src.read()
    at = table.set_index("cell_id").loc[cells["cell_id"]]
    for band, col in enumerate(("change_mean", "change_sd", "change_lo", "change_hi", "p_increase")):
        np.testing.assert_allclose(data[band, cells["row"], cells["col"]], at[col], rtol=1e-6, atol=1e-7)


def test_the_grid_exports_at_a_quarter(st_run):
    """A space-time run's grid export is the chosen quarter's grid (default: the latest), not always the latest."""
    from io import StringIO

    from gpcore.run.decisions import export_grid_bytes

    early = pd.read_csv(StringIO(export_grid_bytes(st_run, "csv", "2019Q2").decode()))
    late = pd.read_csv(StringIO(export_grid_bytes(st_run, "csv").decode()))
    for frame, quarter in ((early, "2019Q2"), (late, json.loads((st_run / "run.json").read_text())["time"][
            "grid_quarters"][-1])):
        stored = pd.read_parquet(st_run / "grids" / f"{quarter}.parquet")
        np.testing.assert_allclose(frame["mean_t"], stored["mean_t"], rtol=1e-6)
    assert not np.allclose(early["mean_t"], late["mean_t"])


def test_compare_with_the_forecast_split(st_csv, tmp_path):
    out = tmp_path / "cmp"
    assert main(["compare", "--data", str(st_csv), "--y", "download_mbps", "--models", "vecchia", "--time-input",
                 "--splits", "random,forecast", "--test-period", "2020Q4", "--grid", "none", "--out", str(out),
                 "--set", "epochs=2", "--set", "neighbors=8"]) == 0
    table = pd.read_csv(out / "metrics.csv")
    assert set(table["split"]) == {"random", "forecast"}
    forecast = json.loads((out / "runs" / "forecast" / "vecchia" / "run.json").read_text())
    assert forecast["data"]["n_test"] == (pd.read_csv(st_csv)["quarter"] == "2020Q4").sum()
    assert "Forecast: test on 2020Q4" in (out / "metrics.md").read_text()


def _fit_args(st_csv, tmp_path, *extra):
    return ["fit", "--data", str(st_csv), "--y", "download_mbps", "--model", "vecchia", "--grid", "none",
            "--out", str(tmp_path / "bad"), "--set", "epochs=1", *extra]


@pytest.mark.parametrize("extra, needle", [
    (["--split", "forecast"], "--test-period"),
    (["--split", "forecast", "--test-period", "2020Q5"], "--test-period '2020Q5' is not a period"),
    (["--test-period", "2020Q4"], "only used by --split forecast"),
    (["--split", "forecast", "--test-period", "2022Q1"], "--test-period '2022Q1': no row falls in it"),
    (["--split", "forecast", "--test-period", "2019Q1"], "no row comes before it"),
    (["--quarter", "2019Q1:2019Q9"], "2019Q9"),
])
def test_fit_errors(st_csv, tmp_path, capsys, extra, needle):
    _expect_user_error(capsys, _fit_args(st_csv, tmp_path, *extra), needle)
    assert not (tmp_path / "bad").exists()


def test_time_input_without_a_time_column(tmp_path, capsys):
    pd.DataFrame({"lon": np.linspace(-67, -66, 40), "lat": np.linspace(18, 18.4, 40),
                  "mbps": np.linspace(5, 50, 40)}).to_csv(tmp_path / "no_time.csv", index=False)
    _expect_user_error(capsys, ["fit", "--data", str(tmp_path / "no_time.csv"), "--y", "mbps", "--time-input",
                                "--grid", "none", "--out", str(tmp_path / "r")], "--time-input needs a time column")


def test_command_errors(st_run, spatial_run, tmp_path, capsys):
    out = str(tmp_path / "x.parquet")
    _expect_user_error(capsys, ["change", str(st_run), "--from", "2019Q5", "--to", "2020Q1", "--out", out],
                       "--from '2019Q5' is not a quarter")
    _expect_user_error(capsys, ["change", str(st_run), "--from", "2019Q1", "--to", "2020", "--out", out],
                       "--to '2020' is not a quarter")
    _expect_user_error(capsys, ["change", str(st_run), "--from", "2019Q1", "--to", "2019Q1", "--out", out],
                       "same quarter")
    _expect_user_error(capsys, ["change", str(st_run), "--from", "2019Q1", "--to", "2020Q1", "--out", "x.txt"],
                       "--out")
    _expect_user_error(capsys, ["change", str(spatial_run), "--from", "2019Q1", "--to", "2020Q1", "--out", out],
                       "not fitted with time as an input")
    _expect_user_error(capsys, ["change", str(st_run), "--from", "2019Q1", "--to", "2020Q1", "--hyper-draws", "-1",
                                "--out", out], "--hyper-draws -1")
    pd.DataFrame({"lon": np.linspace(-66.9, -66.0, 12), "lat": np.linspace(18.0, 18.4, 12)}).to_csv(
        tmp_path / "one.csv", index=False)
    _expect_user_error(capsys, ["predict", str(spatial_run), "--data", str(tmp_path / "one.csv"), "--at", "2020Q1",
                                "--out", out], "--at 2020Q1: this run was not fitted with time as an input")
    _expect_user_error(capsys, ["predict", str(st_run), "--data", str(tmp_path / "one.csv"), "--out", out],
                       "--at QUARTER")
    _expect_user_error(capsys, ["predict", str(st_run), "--data", str(tmp_path / "one.csv"), "--at", "Q5-2020",
                                "--out", out], "--at 'Q5-2020' is not a quarter")


def test_run_folder_reads_per_quarter_grids_and_reproduces_the_fit(st_run):
    from gpcore.errors import RunError
    from gpcore.run import rundir
    from gpcore.run.config import fit_command

    assert rundir.grid_quarters(st_run) == QUARTERS[:6] + ["2020Q3"]
    g = rundir.read_grid(st_run, "2019Q3")
    pd.testing.assert_frame_equal(g, pd.read_parquet(st_run / "grids" / "2019Q3.parquet").astype(
        {c: float for c in rundir.GRID_COLUMNS if c != "cell_id"}))
    assert len(rundir.read_grid_frame(st_run, quarter="2019Q3")) == len(g)
    with pytest.raises(RunError, match="no grid for the quarter '2024Q1'; it has 2019Q1"):
        rundir.read_grid(st_run, "2024Q1")
    cmd = fit_command(json.loads((st_run / "run.json").read_text())["config"])
    assert "--time-input" in cmd and "--split forecast --test-period 2020Q2:2020Q3" in cmd
    assert "--quarter 2019Q1:2020Q2" in cmd
