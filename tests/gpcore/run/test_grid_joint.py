"""A run keeps its grid's joint factor (gpcore/run/grid_joint.py, docs/decide.md "A run keeps its grid's factor"):
a ``vecchia`` / ``dbk-nn`` fit writes it (a time run at its grid's quarter), opening the run puts it back so
decisions start from it (they do not rebuild it), and the stored factor gives exactly what a fresh build gives; a
factor that does not match the run's grid and model, or is damaged, is left alone and the factor is built on
demand."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

import gpcore.models.vecchia_joint as VJ
from gpcore import decide, make_model
from gpcore.cli import main
from gpcore.run import decisions, grid_joint, rundir
from tests.gpcore.test_cli_time import FAST, write_spacetime_csv

DBK_FEATURES = ["--set", "feature_check=false", "--set", "dbk_epochs=2", "--set", "dbk_rank=8",
                "--set", "dbk_hidden=8"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("grid-joint")
    csv = write_spacetime_csv(root / "st.csv")
    common = ["--data", str(csv), "--y", "download_mbps", "--transform", "log10", "--quarter", "2020Q4"]
    out = {}
    for key, name, extra in (("vecchia", "vecchia", FAST), ("dbk-nn", "dbk-nn", FAST + DBK_FEATURES),
                             ("vecchia-weighted", "vecchia", FAST + ["--weight", "tests"]),
                             ("svgp", "svgp", ["--set", "epochs=2", "--set", "num_inducing=8", "--cell-km", "25"])):
        assert main(["fit", *common, "--model", name, *extra, "--out", str(root / key)]) == 0
        out[key] = root / key
    return out


def _labels(grid):
    return np.where(grid["lon"].to_numpy() < np.median(grid["lon"]), "west", "east").astype(object)


def _decide(run):
    """Area posteriors and joint samples over the run's grid (at its quarter for a run with time as an input)."""
    table = decisions.area_table(run.model, run.grid, _labels(run.grid), t=run.t).sort_values("area")
    return table.select_dtypes("number").to_numpy(), decisions.samples(run.model, run.grid, 3, seed=5, t=run.t)


def _copy(run_dir, tmp_path, name="copy"):
    return shutil.copytree(run_dir, tmp_path / name)


@pytest.fixture
def no_build(monkeypatch):
    """Decisions that would build a factor fail: what they compute must come from the stored one."""
    def refuse(*a, **k):
        raise AssertionError("the joint factor was rebuilt")
    monkeypatch.setattr(VJ, "build_joint", refuse)


@pytest.mark.parametrize("name", ["vecchia", "dbk-nn", "vecchia-weighted"])
def test_the_stored_factor_is_used_and_equals_a_fresh_build(runs, name, tmp_path, monkeypatch):
    run_dir = runs[name]
    manifest = json.loads((run_dir / "run.json").read_text())
    assert (run_dir / rundir.JOINT).is_file() and manifest["timings"]["grid_joint_seconds"] > 0
    mode = (run_dir / rundir.GRID).stat().st_mode & 0o777  # readable like the grid (not safetensors' 0600)
    assert (run_dir / rundir.JOINT).stat().st_mode & 0o777 == mode
    run = decisions.open_run(run_dir)
    if name == "dbk-nn":
        assert run.model.module_.features_on and run.model._joint_lowrank() is not None  # the low-rank part stored
    assert run.model.weighted == (name == "vecchia-weighted")  # per-row noise in the training neighbours' groups
    with monkeypatch.context() as m:
        m.setattr(VJ, "build_joint", lambda *a, **k: (_ for _ in ()).throw(AssertionError("rebuilt")))
        stored = _decide(run)
    fresh_dir = _copy(run_dir, tmp_path)
    (fresh_dir / rundir.JOINT).unlink()
    fresh = _decide(decisions.open_run(fresh_dir))  # built on demand, as before
    np.testing.assert_allclose(stored[0], fresh[0], rtol=1e-12, atol=1e-14)  # the same numbers (features: rebuilt)
    np.testing.assert_allclose(stored[1], fresh[1], rtol=1e-12, atol=1e-14)


def test_a_grid_in_another_row_order_is_primed_by_cell_id(runs, no_build):
    run = decisions.open_run(runs["dbk-nn"])
    flipped = run.grid.iloc[::-1].reset_index(drop=True)
    model = rundir.load_model(runs["dbk-nn"])
    assert grid_joint.prime(runs["dbk-nn"], model, flipped)
    table = decisions.area_table(model, flipped, _labels(flipped)).sort_values("area")
    same = decisions.area_table(run.model, run.grid, _labels(run.grid)).sort_values("area")
    np.testing.assert_allclose(table.select_dtypes("number").to_numpy(), same.select_dtypes("number").to_numpy(),
                               rtol=1e-12, atol=1e-12)


def test_a_factor_of_another_grid_or_model_is_not_used(runs, tmp_path):
    run_dir = _copy(runs["vecchia"], tmp_path, "changed-grid")
    grid = rundir.read_grid(run_dir)
    grid.loc[0, "mean_t"] += 1.0  # the run's grid was rewritten after the factor
    grid.to_parquet(run_dir / rundir.GRID, index=False)
    assert not grid_joint.prime(run_dir, rundir.load_model(run_dir), rundir.read_grid(run_dir))
    other = _copy(runs["vecchia"], tmp_path, "other-model")
    shutil.copy(runs["dbk-nn"] / rundir.JOINT, other / rundir.JOINT)  # the factor of another run's model
    assert not grid_joint.prime(other, rundir.load_model(other), rundir.read_grid(other))
    assert decisions.open_run(other).model._joint_cache is None  # nothing kept: built when a decision asks


def test_a_damaged_factor_warns_and_is_built_on_demand(runs, tmp_path):
    run_dir = _copy(runs["vecchia"], tmp_path, "garbage")
    (run_dir / rundir.JOINT).write_bytes(b"not a safetensors file")
    with pytest.warns(UserWarning, match="cannot be read"):
        run = decisions.open_run(run_dir)
    assert _decide(run)[0].shape[0] == 2
    tensors, identity = rundir.read_joint(runs["vecchia"])
    bad = dict(tensors, order=torch.zeros_like(tensors["order"]))  # same identity, not a permutation
    tampered = _copy(runs["vecchia"], tmp_path, "tampered")
    rundir.write_joint(tampered, bad, identity)
    with pytest.warns(UserWarning, match="not a permutation"):
        assert not grid_joint.prime(tampered, rundir.load_model(tampered), rundir.read_grid(tampered))


def test_grids_above_the_cap_store_none(runs, tmp_path, monkeypatch):
    run_dir = _copy(runs["vecchia"], tmp_path, "capped")
    (run_dir / rundir.JOINT).unlink()
    grid = rundir.read_grid(run_dir)
    monkeypatch.setattr(grid_joint, "MAX_CELLS", len(grid) - 1)
    assert grid_joint.write(run_dir, rundir.load_model(run_dir), grid) is None
    assert not (run_dir / rundir.JOINT).exists()
    monkeypatch.setattr(grid_joint, "MAX_CELLS", len(grid))
    assert grid_joint.write(run_dir, rundir.load_model(run_dir), grid) > 0 and (run_dir / rundir.JOINT).is_file()


def test_runs_of_other_models_store_none(runs):
    assert not (runs["svgp"] / rundir.JOINT).exists()
    assert json.loads((runs["svgp"] / "run.json").read_text())["timings"]["grid_joint_seconds"] is None


@pytest.mark.parametrize("name", ["vecchia", "dbk-nn"])
def test_a_time_run_stores_the_factor_at_its_grid_quarter(name, tmp_path, monkeypatch):
    csv = write_spacetime_csv(tmp_path / "st.csv")
    run_dir = tmp_path / "st"
    extra = DBK_FEATURES if name == "dbk-nn" else []
    assert main(["fit", "--data", str(csv), "--y", "download_mbps", "--transform", "log10", "--model", name,
                 *FAST, *extra, "--time-input", "--quarter", "2019Q1:2020Q4", "--out", str(run_dir)]) == 0
    manifest = json.loads((run_dir / "run.json").read_text())
    latest, first = manifest["time"]["grid_quarter"], manifest["time"]["grid_quarters"][0]
    assert latest == "2020Q4" and first != latest and manifest["timings"]["grid_joint_seconds"] > 0
    assert rundir.read_joint(run_dir)[1]["quarter"] == latest
    run = decisions.open_run(run_dir)  # the grid's quarter: the stored factor, nothing rebuilt
    assert run.quarter == latest and run.model._joint_cache is not None
    if name == "dbk-nn":  # the low-rank part stored, and completed from the features at (lon, lat, t)
        assert run.model.module_.features_on and run.model._joint_cache[1].F is not None

    with monkeypatch.context() as m:
        m.setattr(VJ, "build_joint", lambda *a, **k: (_ for _ in ()).throw(AssertionError("rebuilt")))
        stored = _decide(run)
    fresh_dir = _copy(run_dir, tmp_path)
    (fresh_dir / rundir.JOINT).unlink()
    fresh = _decide(decisions.open_run(fresh_dir))
    np.testing.assert_allclose(stored[0], fresh[0], rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(stored[1], fresh[1], rtol=1e-12, atol=1e-14)
    other = decisions.open_run(run_dir, at=first)  # another quarter: not that factor; built when a decision asks
    assert other.model._joint_cache is None
    assert not grid_joint.prime(run_dir, other.model, other.grid, first)
    assert _decide(other)[0].shape[0] == 2 and other.model._joint_cache is not None


# ------------------------------------------------------------------ VecchiaJoint.tensors / from_tensors / reindexed


@pytest.fixture(scope="module")
def fitted():
    rng = np.random.default_rng(2)
    X = rng.uniform(0, 1, (80, 2))
    y = np.sin(4 * X[:, 0]) + 0.1 * rng.standard_normal(80)
    model = make_model("dbk-nn", epochs=2, dtype="float64", device="cpu", neighbors=8, dbk_epochs=2, dbk_rank=8,
                       dbk_hidden=8, feature_check=False).fit(X, y)
    Xs = model.scale_x(rng.uniform(0, 1, (40, 2)))
    return model, Xs, model.joint_s(Xs)


def test_tensors_round_trip_and_reindex(fitted):
    model, Xs, joint = fitted
    t = joint.tensors()
    assert {"T", "Bt"} <= set(t) and not {"Phi", "BPhi", "F"} & set(t)  # the features come from the model
    back = VJ.VecchiaJoint.from_tensors(t, joint.n)
    assert back.F is None
    model.keep_joint(Xs, back)  # completes the low-rank part from the model's features
    kept = model.joint_s(Xs)
    assert kept is not joint and kept.F is not None
    W = np.random.default_rng(0).uniform(0, 1, (joint.n, 3))
    np.testing.assert_allclose(kept.linear(W)[1], joint.linear(W)[1], rtol=1e-12)
    np.testing.assert_allclose(kept.cov(), joint.cov(), rtol=1e-12, atol=1e-15)
    perm = np.random.default_rng(1).permutation(joint.n)
    moved = joint.reindexed(perm)  # new place r is old place perm[r]
    np.testing.assert_allclose(moved.cov(), joint.cov()[np.ix_(perm, perm)], rtol=1e-12, atol=1e-15)
    np.testing.assert_array_equal(moved.mean, joint.mean[perm])
    model.keep_joint(Xs, joint)


def test_a_low_rank_factor_needs_a_model_with_features(fitted):
    model, Xs, joint = fitted
    back = VJ.VecchiaJoint.from_tensors(joint.tensors(), joint.n)
    model.module_.features_on = False
    try:
        with pytest.raises(ValueError, match="low-rank part"):
            model.keep_joint(Xs, back)
    finally:
        model.module_.features_on = True


@pytest.mark.parametrize("damage,match", [
    (lambda t: t.pop("d"), "entries"),
    (lambda t: t.pop("Bt"), "entries"),
    (lambda t: t.update(d=t["d"].float()), "float32"),
    (lambda t: t.update(mean=t["mean"][:-1]), "shape"),
    (lambda t: t.update(U_data=torch.where(torch.arange(len(t["U_data"])) == 0, torch.nan, t["U_data"])),
     "non-finite"),
    (lambda t: t.update(d=-t["d"]), "negative"),
    (lambda t: t.update(U_indices=t["U_indptr"].new_full(t["U_indices"].shape, 0)), "unit lower triangular"),
    (lambda t: t.update(U_indices=torch.flip(t["U_indices"], [0])), "unit lower triangular"),
    (lambda t: t.update(U_indptr=t["U_indptr"] * 0), "CSR"),
    (lambda t: t.update(Bt=t["Bt"][:, :-1]), "low-rank"),
    (lambda t: t.update(T=-t["T"] - 1), "low-rank"),
])
def test_from_tensors_says_what_is_wrong(fitted, damage, match):
    t = fitted[2].tensors()
    damage(t)
    with pytest.raises(ValueError, match=match):
        VJ.VecchiaJoint.from_tensors(t, fitted[2].n)


def test_neighbours_beyond_the_training_rows_are_refused(fitted):
    model, Xs, joint = fitted
    t = joint.tensors()
    t["T"] = t["T"] + 10_000
    with pytest.raises(ValueError, match="beyond"):
        model.keep_joint(Xs, VJ.VecchiaJoint.from_tensors(t, joint.n))


@pytest.mark.parametrize("key", ["vecchia", "vecchia-weighted", "dbk-nn"])
def test_suggestions_on_the_runs_grid_take_its_stored_marginals(runs, key, monkeypatch):
    """The Vecchia engine's marginal variances come from the grid's stored marginals, not a new prediction of every
    cell, and give what predicting them gives."""
    run = decisions.open_run(runs[key])
    X = decisions.place_inputs(run.grid, run.t, run.model.d_)
    mask = run.grid["lon"].to_numpy() < np.median(run.grid["lon"])
    want = decide.suggest(run.model, X, X[mask], k=3)

    def refuse(*a, **k):
        raise AssertionError("predicted again")
    monkeypatch.setattr(run.model, "predict_scaled", refuse)
    got = decisions.suggest(run.model, run.grid, mask, 3)
    np.testing.assert_array_equal(got.index, want.index)
    np.testing.assert_allclose(got.reduction, want.reduction, rtol=1e-6)
    np.testing.assert_allclose(got.var_after_targets, want.var_after_targets, rtol=1e-6, atol=1e-12)
    assert got.mean_var_before == pytest.approx(want.mean_var_before, rel=1e-6)
