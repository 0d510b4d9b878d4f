"""Runs with a weight column and strata (issue 14): weighted fit, metrics per measurement-count bin,
per-stratum recalibration fitted on the validation split only, recorded in the run."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from gpcore import DataError
from gpcore.cli import main
from gpcore.run.config import RunConfig
from gpcore.run.pipeline import NO_RECAL, execute_run, prepare
from tests.sample_files import write_speeds_csv

FAST = {"epochs": 2, "rank": 8, "hidden": 8, "batch_size": 256}


@pytest.fixture(scope="module")
def csv_file(tmp_path_factory):
    return write_speeds_csv(tmp_path_factory.mktemp("runs") / "speeds.csv", n=700, seed=4)


def _cfg(csv_file, **kw):
    return RunConfig(data=str(csv_file), x=("lon", "lat"), y="download_mbps", transform="log10", model="dbk",
                     settings=dict(FAST), grid_kind="none", **kw)


@pytest.fixture(scope="module")
def weighted_run(csv_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "w"
    rc = main(["fit", "--data", str(csv_file), "--x", "lon,lat", "--y", "download_mbps", "--transform", "log10",
               "--model", "dbk", "--weight", "tests", "--strata", "column:county_metro", "--grid", "none",
               "--out", str(out), *[a for k, v in FAST.items() for a in ("--set", f"{k}={v}")]])
    assert rc == 0
    return out


def test_weight_column_reaches_the_model_and_the_metrics(weighted_run, csv_file):
    manifest = json.loads((weighted_run / "run.json").read_text())
    assert manifest["config"]["weight"] == "tests"
    assert manifest["weights"]["column"] == "tests" and manifest["weights"]["nugget_variance"] > 0
    from gpcore.models import load_model

    model = load_model(weighted_run / "model")
    assert model.weighted
    test = pd.read_parquet(weighted_run / "test_predictions.parquet")
    df = pd.read_csv(csv_file)
    assert test["weight"].min() >= 1 and set(test["weight"]) <= set(df["tests"])
    # each test row's var_y is for its own number of tests
    pred = model.predict(test[["lon", "lat"]].to_numpy(float), weights=test["weight"].to_numpy(float),
                         groups=test["stratum"].to_numpy())
    np.testing.assert_allclose(pred.var_y, test["var_y"], rtol=1e-6)
    groups = {m["group"]: m for m in manifest["metrics"]}
    bins = ["tests 1", "tests 2-4", "tests 5-16", "tests >16"]
    present = [b for b in bins if b in groups]
    assert len(present) >= 3
    assert sum(groups[b]["n"] for b in present) == groups["all"]["n"]
    edges = {"tests 1": (0, 1), "tests 2-4": (1, 4), "tests 5-16": (4, 16), "tests >16": (16, np.inf)}
    for b in present:
        lo, hi = edges[b]
        assert groups[b]["n"] == int(((test["weight"] > lo) & (test["weight"] <= hi)).sum())


def test_strata_runs_recalibrate_per_group_and_report_both(weighted_run):
    manifest = json.loads((weighted_run / "run.json").read_text())
    assert manifest["model_config"]["recalibrate"] == "group"
    rec = manifest["recalibration"]
    assert rec["kind"] == "group" and rec["n"] == manifest["data"]["n_val"]
    groups = {m["group"]: m for m in manifest["metrics"]}
    for g in ("all", "metro", "non-metro", "tests 1"):
        if g in groups:
            assert g + NO_RECAL in groups
            assert groups[g]["nll"] != groups[g + NO_RECAL]["nll"] or groups[g]["n"] == 0
    metrics_csv = pd.read_csv(weighted_run / "metrics.csv")
    assert ("all" + NO_RECAL) in set(metrics_csv["group"])


def test_recalibration_never_reads_the_test_split(csv_file, tmp_path):
    cfg = _cfg(csv_file, strata="column:county_metro")
    prep = prepare(cfg)
    a = json.loads((execute_run(cfg, tmp_path / "a", prepared=prep) / "run.json").read_text())
    y = prep.y.copy()
    y[prep.test_idx] = y[prep.test_idx][::-1] + 3.0  # scramble the test targets only
    b = json.loads((execute_run(cfg, tmp_path / "b", prepared=dataclasses.replace(prep, y=y)) / "run.json")
                   .read_text())
    assert a["recalibration"] == b["recalibration"]
    assert a["metrics"][0]["nll"] != b["metrics"][0]["nll"]  # the test split did change


def test_explicit_recalibrate_none_and_no_strata_keep_todays_run(csv_file, tmp_path):
    plain = json.loads((execute_run(_cfg(csv_file), tmp_path / "p") / "run.json").read_text())
    assert plain["recalibration"] is None and plain["model_config"]["recalibrate"] == "none"
    assert not any(NO_RECAL in m["group"] for m in plain["metrics"])
    cfg = dataclasses.replace(_cfg(csv_file, strata="column:county_metro"),
                              settings={**FAST, "recalibrate": "none"})
    off = json.loads((execute_run(cfg, tmp_path / "n") / "run.json").read_text())
    assert off["recalibration"] is None


def test_zero_weights_are_a_clear_data_error(csv_file, tmp_path):
    df = pd.read_csv(csv_file)
    df.loc[[3, 8], "tests"] = 0
    path = tmp_path / "zero.csv"
    df.to_csv(path, index=False)
    with pytest.raises(DataError, match=r"column 'tests': 2 row\(s\) have weight 0 \(rows 3, 8\)"):
        prepare(_cfg(path, weight="tests"))


@pytest.mark.parametrize("settings,expect", [({}, "none"), ({"recalibrate": "group"}, "group")])
def test_vecchia_runs_do_not_recalibrate_unless_asked(csv_file, tmp_path, settings, expect):
    """The Vecchia family's run default is ``none`` (its ``run_recalibration``): calibrated as fitted, and its
    validation rows join the posterior instead; asked for, ``group`` is fitted before they join."""
    cfg = dataclasses.replace(_cfg(csv_file, strata="column:county_metro", weight="tests"), model="vecchia",
                              settings={"epochs": 3, **settings})
    manifest = json.loads((execute_run(cfg, tmp_path / "v") / "run.json").read_text())
    assert manifest["model_config"]["recalibrate"] == expect
    assert bool(manifest["recalibration"]) == (expect == "group")
    # without recalibration the run's cross-validated latent scale (rows folds: a random split); one or the other
    assert (manifest["model_config"]["cv_calibration"] == "rows") == (expect == "none")
    assert bool(manifest["train_info"].get("cv_calibration")) == (expect == "none")
    groups = {m["group"] for m in manifest["metrics"]}
    assert "all" + NO_RECAL in groups  # the metrics before either calibration are reported too
    assert manifest["train_info"]["conditioned_on"]["validation"] == manifest["data"]["n_val"]


@pytest.mark.parametrize("split", ["random", "block"])
def test_a_vecchia_run_reports_its_metrics_before_the_cross_validated_scale(csv_file, tmp_path, split):
    """The run's test rows scored with the skewed predictive the cross-validation fitted (its shape in the test
    table), and before it with the Gaussian ``var_f / c + s``: the intervals before the latent scale and the shape."""
    from gpcore import metrics as M
    from gpcore.models.noise_shape import NoiseShape, of_rows
    from gpcore.models.vecchia_cv import count_bins

    cfg = dataclasses.replace(_cfg(csv_file, weight="tests", split=split, block_km=2.0), model="vecchia",
                              settings={"epochs": 3})
    out = execute_run(cfg, tmp_path / "v")
    manifest = json.loads((out / "run.json").read_text())
    cv = manifest["train_info"]["cv_calibration"]
    assert cv["folds"] == {"random": "rows", "block": "blocks"}[split] and cv["rows"] == manifest["data"]["n_train"] \
        + manifest["data"]["n_val"]
    test = pd.read_parquet(out / "test_predictions.parquet")
    shape = of_rows(test)
    assert shape == NoiseShape.from_dict(cv["noise_shape"]) and shape.latent_scale == cv["scale"]
    assert manifest["model_config"]["noise_shape"] == "two_component"
    noise = (test["var_y"] - test["var_f"]) / shape.noise_factor()
    # a weighted run: the noise scaled per tests-count bin (vecchia_cv.count_scales); before calibration without it
    scales = np.asarray(cv["count_scales"]["scales"])[count_bins(test["weight"])]
    raw = test["var_f"] / cv["scale"] + noise / scales
    groups = {m["group"]: m for m in manifest["metrics"]}
    np.testing.assert_allclose(groups["all" + NO_RECAL]["nll"], M.nll(test["mean"], raw, test["y"]), rtol=1e-9)
    np.testing.assert_allclose(groups["all"]["nll"], -np.mean(shape.logpdf(test["y"] - test["mean"], test["var_f"],
                                                                           noise)), rtol=1e-9)
    lo, hi = shape.interval(0.95, test["var_f"].to_numpy(), noise.to_numpy())
    r = (test["y"] - test["mean"]).to_numpy()
    np.testing.assert_allclose(groups["all"]["coverage"], np.mean((r >= lo) & (r <= hi)))
    assert groups["all"]["nll"] != groups["all" + NO_RECAL]["nll"]


def test_a_run_without_the_cross_validation_has_no_shape(csv_file, tmp_path):
    cfg = dataclasses.replace(_cfg(csv_file, weight="tests"), model="vecchia",
                              settings={"epochs": 3, "cv_calibration": "none"})
    out = execute_run(cfg, tmp_path / "v")
    manifest = json.loads((out / "run.json").read_text())
    assert manifest["model_config"]["noise_shape"] == "gaussian" and not manifest["train_info"].get("cv_calibration")
    assert "noise_c" not in pd.read_parquet(out / "test_predictions.parquet").columns
