"""Decisions at a quarter (issue 23 part 3): ``gpcore.run.decisions`` appends the quarter's decimal year to the places
of a run with time as an input, ``open_run(at=)`` reads (or predicts) the grid at that quarter, and the decision
commands take ``--at``."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy.stats import norm

from gpcore.cli import main
from gpcore.errors import GPCoreError
from gpcore.run import decisions
from tests.gpcore.test_cli_time import FAST, write_spacetime_csv


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("dec-time")
    csv = write_spacetime_csv(root / "st.csv")
    common = ["--data", str(csv), "--y", "download_mbps", "--transform", "log10", "--model", "vecchia", *FAST]
    assert main(["fit", *common, "--time-input", "--quarter", "2019Q1:2020Q4", "--out", str(root / "st")]) == 0
    assert main(["fit", *common, "--quarter", "2020Q4", "--out", str(root / "plain")]) == 0
    return root / "st", root / "plain"


def test_open_run_reads_the_grid_at_a_quarter(runs):
    st_run, _ = runs
    latest = decisions.open_run(st_run)
    assert latest.quarter == "2020Q4" and latest.t == pytest.approx(2020.875)
    q2 = decisions.open_run(st_run, at="2019Q2")
    assert q2.t == pytest.approx(2019.375)
    stored = pd.read_parquet(st_run / "grids" / "2019Q2.parquet").set_index("cell_id")
    np.testing.assert_allclose(q2.grid.set_index("cell_id").loc[stored.index, "mean_t"], stored["mean_t"])
    ahead = decisions.open_run(st_run, at="2021Q2")  # no stored grid: predicted at that quarter
    X = np.column_stack([ahead.grid[["lon", "lat"]].to_numpy(float), np.full(len(ahead.grid), 2021.375)])
    np.testing.assert_allclose(ahead.grid["mean_t"], ahead.model.predict(X).mean, rtol=1e-6)


def test_every_decision_takes_the_quarters_time(runs):
    st_run, _ = runs
    run = decisions.open_run(st_run, at="2019Q3")
    e = decisions.exceedance(run.model, run.grid, 20.0, units="original", transform=run.transform, t=run.t)
    X = decisions.place_inputs(run.grid, run.t)
    assert X.shape[1] == 3 and np.all(X[:, 2] == run.t)
    pred = run.model.predict(X)
    np.testing.assert_allclose(e.p_f, norm.cdf((np.log10(20.0) - pred.mean) / np.sqrt(pred.var_f)), atol=1e-6)
    labels = np.where(run.grid["lon"].to_numpy() < -66.4, "west", "east").astype(object)
    table = decisions.area_table(run.model, run.grid, labels, t=run.t)
    assert set(table["area"]) == {"west", "east"}
    assert decisions.samples(run.model, run.grid, 2, t=run.t).shape == (2, len(run.grid))
    res = decisions.suggest(run.model, run.grid, np.ones(len(run.grid), bool), 2, t=run.t)
    assert len(res.index) == 2
    with pytest.raises(GPCoreError, match="--at"):
        decisions.area_table(run.model, run.grid, labels)  # a d = 3 model without a time names the flag


def test_decision_commands_take_at(runs, tmp_path, capsys):
    st_run, plain = runs
    assert main(["exceed", str(st_run), "--threshold", "20", "--at", "2019Q2", "--out", str(tmp_path / "p.csv")]) == 0
    out = pd.read_csv(tmp_path / "p.csv")
    run = decisions.open_run(st_run, at="2019Q2")
    np.testing.assert_allclose(out["p_below"], decisions.exceedance(
        run.model, run.grid, 20.0, units="original", transform=run.transform, t=run.t).p_f, atol=1e-9)
    assert main(["sample", str(st_run), "--at", "2019Q1", "--n", "2", "--out", str(tmp_path / "s.csv")]) == 0
    assert main(["suggest", str(st_run), "--k", "2", "--at", "2021Q1"]) == 0
    capsys.readouterr()
    assert main(["exceed", str(plain), "--threshold", "20", "--at", "2019Q2"]) == 2
    assert "--at" in capsys.readouterr().err
