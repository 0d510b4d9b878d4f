"""The Compare page keeps random and spatial-block test splits apart: a "Test split" control, the split named in
every table row and caption, a random-vs-blocks table, and a note with the command when only one kind exists."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from tests.app.conftest import APP, TIMEOUT, open_page, tiny_config, use_store

BLOCK_RUNS = {"20240101-000002-000-dbk-rbf-block": "dbk-rbf", "20240101-000003-000-dbk-silu-block": "dbk-silu"}


@pytest.fixture(scope="session")
def split_store(trained_store, tmp_path_factory) -> Path:
    """The two random tiny runs plus the same models on 10 km spatial blocks (no grid: Compare needs none)."""
    from gpcore.run.pipeline import execute_run

    store = tmp_path_factory.mktemp("split-runs")
    shutil.copytree(trained_store, store, dirs_exist_ok=True)
    for run_id, model in BLOCK_RUNS.items():
        execute_run(tiny_config(model, seed=0, split="block", block_km=10.0, grid_kind="none",
                                label=f"{model} tiny"), store / run_id)
    return store


def overall_nll(store: Path, run_id: str) -> float:
    manifest = json.loads((store / run_id / "run.json").read_text())
    return next(m["nll"] for m in manifest["metrics"] if m["group"] == "all")


def compare_page(store_env) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.run()
    open_page(at, "compare").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def texts(at) -> str:
    return "\n".join([m.value for m in at.markdown] + [c.value for c in at.caption])


def test_the_split_control_switches_every_table_between_random_and_blocks(split_store, tmp_path, monkeypatch):
    store = use_store(split_store, tmp_path, monkeypatch)
    at = compare_page(store)
    control = at.segmented_control(key="w_cmp_split")
    assert control.options == ["Random", "Spatial blocks (10 km)"] and control.value == "random"
    ranking = at.dataframe[0].value
    assert set(ranking["split"]) == {"Random"} and set(ranking["model"]) == {"dbk-rbf", "dbk-silu"}
    assert float(ranking.set_index("model").loc["dbk-rbf", "nll"]) == pytest.approx(
        overall_nll(store, "20240101-000000-000-dbk-rbf"), abs=1e-4)
    assert "Test split: **random** 8:1:1" in texts(at)
    assert set(at.dataframe[1].value["split"]) == {"Random"}, "the per-stratum rows name their split too"

    # both kinds exist: the random-vs-blocks table sets each model's two runs side by side
    heads = [h.value for h in at.subheader]
    assert "Random vs spatial blocks" in heads
    summary = at.dataframe[heads.index("Random vs spatial blocks")].value.set_index("model")  # one table each
    for random_id, block_id, model in (("20240101-000000-000-dbk-rbf", "20240101-000002-000-dbk-rbf-block", "dbk-rbf"),
                                       ("20240101-000001-000-dbk-silu", "20240101-000003-000-dbk-silu-block",
                                        "dbk-silu")):
        r, b = overall_nll(store, random_id), overall_nll(store, block_id)
        row = summary.loc[model]
        assert row["split"] == "Spatial blocks (10 km)"
        assert row["NLL random"] == f"{r:.4f}" and row["NLL blocks"] == f"{b:.4f}"
        assert row["NLL change"] == f"{b - r:+.4f}"

    at.segmented_control(key="w_cmp_split").set_value("block:10").run()
    assert not at.exception, [e.value for e in at.exception]
    ranking = at.dataframe[0].value
    assert set(ranking["split"]) == {"Spatial blocks (10 km)"} and set(ranking["model"]) == {"dbk-rbf", "dbk-silu"}
    assert float(ranking.set_index("model").loc["dbk-rbf", "nll"]) == pytest.approx(
        overall_nll(store, "20240101-000002-000-dbk-rbf-block"), abs=1e-4)
    assert ranking["run"].str.contains("spatial blocks 10 km").all(), "run titles say which split they were tested on"
    assert "Test split: **spatial blocks of 10 km**" in texts(at)
    assert "Test split: **random**" not in texts(at)
    assert at.segmented_control(key="w_cmp_split").value == "block:10", "the control does not spring back"
    violins = [json.loads(c.proto.spec) for c in at.get("plotly_chart") if '"violin"' in c.proto.spec]
    assert violins and {x for t in violins[0]["data"] for x in t["x"]} == {"dbk-rbf", "dbk-silu"}


def test_one_split_kind_says_so_and_shows_the_command_for_the_other(trained_store, tmp_path, monkeypatch):
    store = use_store(trained_store, tmp_path, monkeypatch)
    at = compare_page(store)
    assert not at.get("segmented_control"), "no control with one split kind"
    notes = [i.value for i in at.info]
    assert any("tested on one kind of split: **Random**" in n for n in notes), notes
    code = "\n".join(c.value for c in at.code)
    assert "python -m gpcore fit" in code and "--split block --block-km 10" in code
    assert f"--out {store}/" in code, "the command writes into the run store the dashboard reads"
    assert set(at.dataframe[0].value["split"]) == {"Random"}
    assert "Random vs spatial blocks" not in [h.value for h in at.subheader]
    # dbk-rbf on seed 0, dbk-silu on seed 1: no seed in common, so the page says how to compare across seeds
    assert "Across split seeds" not in [h.value for h in at.subheader]
    assert any("One split seed per model" in c.value and "--seeds 0,1,2" in c.value for c in at.caption)


def test_coverage_carries_the_band_of_its_split_in_the_tables_and_the_chart(split_store, tmp_path, monkeypatch):
    """Random runs: two binomial SEs; block runs: two SEs by held-out block (computed here from each run's test
    rows and the formula), in the ranking's "± 2 SE" column and as the coverage chart's error bars."""
    import numpy as np

    from gpcore import metrics as M
    from gpcore.data.splits import block_ids
    from gpcore.run.rundir import read_test_predictions

    store = use_store(split_store, tmp_path, monkeypatch)
    at = compare_page(store)
    ranking = at.dataframe[0].value.set_index("model")
    test = read_test_predictions(store / "20240101-000000-000-dbk-rbf")
    two = 2 * M.coverage_se(len(test))
    assert ranking.loc["dbk-rbf", "± 2 SE"].startswith(f"± {100 * two:.1f}")
    assert "two binomial standard errors" in texts(at)

    at.segmented_control(key="w_cmp_split").set_value("block:10").run()
    assert not at.exception, [e.value for e in at.exception]
    assert "*by held-out block*" in texts(at) and "binomial" not in texts(at)
    ranking = at.dataframe[0].value.set_index("model")
    test = read_test_predictions(store / "20240101-000002-000-dbk-rbf-block")
    inside = (np.abs(test["y"] - test["mean"]) <= M.Z95 * np.sqrt(test["var_y"])).to_numpy()
    blocks = block_ids(test["lon"].to_numpy(), test["lat"].to_numpy(), 10.0)
    r = np.array([np.sum(inside[blocks == b] - 0.95) for b in np.unique(blocks)])
    by_block = 2 * np.sqrt(np.sum(r**2)) / len(test)
    cov = inside.mean()
    mark = " ✗" if abs(cov - 0.95) > by_block else ""
    assert ranking.loc["dbk-rbf", "± 2 SE"] == f"± {100 * by_block:.1f}{mark}"
    bars = next(json.loads(c.proto.spec) for c in at.get("plotly_chart") if "coverage of the 95%" in c.proto.spec)
    overall = next(t for t in bars["data"] if t["name"] in ("all", "All", "overall", "Overall"))
    errors = dict(zip(overall["x"], overall["error_y"]["array"], strict=True))
    assert errors["dbk-rbf"] == pytest.approx(by_block, rel=1e-9)


def test_runs_on_other_test_rows_are_ranked_apart(trained_store, tmp_path, monkeypatch):
    """With 'Include runs on other data sets' the ranking never sets an NLL on one set of test rows above one on
    another: runs on Puerto Rico 2023 and on 2022Q4 (and the seed-1 run) are ranked within their own rows."""
    from gpcore.run.pipeline import execute_run

    store = use_store(trained_store, tmp_path, monkeypatch)
    other = "20240101-000004-000-dbk-rbf-2022q4"
    execute_run(tiny_config("dbk-rbf", quarter="2022Q4", grid_kind="none", label="dbk-rbf 2022Q4"), store / other)
    at = compare_page(store)
    assert set(at.dataframe[0].value["model"]) == {"dbk-rbf", "dbk-silu"}, "other data stays out by default"
    assert [w.value for w in at.warning if "sets of test rows" in w.value][0].startswith("These runs were scored on 2 ")
    at.toggle(key="w_cmp_all").set_value(True).run()
    assert not at.exception, [e.value for e in at.exception]
    ranking = at.dataframe[0].value
    rows = {r: overall_nll(store, r) for r in ("20240101-000000-000-dbk-rbf", "20240101-000001-000-dbk-silu", other)}
    got = {(t, m): (int(k), float(v)) for t, m, k, v in ranking[["test rows", "model", "rank", "nll"]].itertuples(
        index=False)}
    # the active data set's rows first (seed 0, then seed 1), then the other data set's; each ranked from 1
    assert list(ranking["test rows"]) == ["2023 · seed 0", "2023 · seed 1", "2022Q4 · seed 0"], ranking
    assert [k for k, _ in got.values()] == [1, 1, 1]
    assert [round(v, 4) for _, v in got.values()] == [round(v, 4) for v in rows.values()]
    assert any("3 different sets of test rows" in w.value for w in at.warning)
    per = at.dataframe[1].value
    assert "test rows" in per.columns and set(per["test rows"]) == set(ranking["test rows"])


def test_data_sets_alike_in_name_are_told_apart_by_their_spec(trained_store, tmp_path, monkeypatch):
    """A run on the same rows without strata is another data set (strata are part of it): the test rows' names say
    what differs between the sets, and only that."""
    import dataclasses

    from gpcore.run.pipeline import execute_run

    store = use_store(trained_store, tmp_path, monkeypatch)
    cfg = dataclasses.replace(tiny_config("dbk-rbf", grid_kind="none", label="dbk-rbf no strata"), strata=None)
    execute_run(cfg, store / "20240101-000005-000-dbk-rbf-nostrata")
    at = compare_page(store)
    at.toggle(key="w_cmp_all").set_value(True).run()
    assert not at.exception, [e.value for e in at.exception]
    rows = list(at.dataframe[0].value["test rows"])
    assert rows == ["strata county_metro · seed 0", "strata county_metro · seed 1", "strata none · seed 0"], rows


def test_models_on_several_seeds_are_compared_across_them(trained_store, tmp_path, monkeypatch):
    """Two models, each on split seeds 0 and 1: 'Across split seeds' pairs them on both seeds (means, the paired
    difference and the wins read from the runs' own metrics), next to the per-seed rankings."""
    from tests.app.conftest import make_run

    store = use_store(trained_store, tmp_path, monkeypatch)
    make_run(store, "20240101-000006-000-dbk-rbf-seed1", "dbk-rbf", seed=1)
    make_run(store, "20240101-000007-000-dbk-silu-seed0", "dbk-silu", seed=0)
    at = compare_page(store)
    heads = [h.value for h in at.subheader]
    assert "Across split seeds" in heads
    assert not any("One split seed per model" in c.value for c in at.caption)
    table = next(d.value for d in at.dataframe if "ΔNLL vs best" in d.value.columns).set_index("model")
    nll = {("dbk-rbf", 0): overall_nll(store, "20240101-000000-000-dbk-rbf"),
           ("dbk-rbf", 1): overall_nll(store, "20240101-000006-000-dbk-rbf-seed1"),
           ("dbk-silu", 0): overall_nll(store, "20240101-000007-000-dbk-silu-seed0"),
           ("dbk-silu", 1): overall_nll(store, "20240101-000001-000-dbk-silu")}
    mean = {m: (nll[(m, 0)] + nll[(m, 1)]) / 2 for m in ("dbk-rbf", "dbk-silu")}
    best, other = sorted(mean, key=mean.get)
    assert list(table.index) == [best, other] and set(table["seeds"]) == {2}
    assert float(table.loc[other, "mean nll"]) == pytest.approx(mean[other], abs=1e-4)
    assert table.loc[best, "ΔNLL vs best"] == "best"
    diff = float(table.loc[other, "ΔNLL vs best"].split(" ± ")[0])
    assert diff == pytest.approx(mean[other] - mean[best], abs=1e-4)
    wins = sum(nll[(best, s)] < nll[(other, s)] for s in (0, 1))
    assert int(table.loc[best, "best on (seeds)"]) == wins and int(table.loc[other, "best on (seeds)"]) == 2 - wins
