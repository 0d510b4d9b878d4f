"""A data set's identity is its file content and data spec, never floating-point results."""

from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest

from gpcore.identity import dataset_identity, file_digest
from gpcore.run.config import RunConfig

BASE = dict(data="sample:puerto_rico", y="download_mbps", model="dbk", transform="log10", quarter="2023",
            strata="county_metro")


def ident(**changes) -> str | None:
    return dataset_identity(RunConfig(**{**BASE, **changes}).to_dict())


def test_identity_ignores_the_model_and_split_but_not_the_spec():
    a = ident()
    assert a is not None and len(a) == 16
    assert ident(model="svgp", seed=3, split="block", block_km=5.0, settings={"epochs": 2}) == a
    for change in (dict(transform="identity"), dict(quarter="2022"), dict(y="upload_mbps"), dict(strata=None),
                   dict(weight="tests"), dict(x=("lon", "lat"))):
        assert ident(**change) != a, change
    assert ident(quarter=None) == a, "a sample's default period is its period"


def test_identity_is_the_file_content_wherever_it_lies(tmp_path):
    from gpcore.data import sample_path

    copy = tmp_path / "pr.parquet"
    shutil.copyfile(sample_path("puerto_rico"), copy)
    assert ident(data=str(copy)) == ident()
    assert file_digest(copy) == file_digest(sample_path("puerto_rico"))
    with open(copy, "r+b") as fh:  # one byte more is another data set
        fh.seek(0, 2)
        fh.write(b"\0")
    assert ident(data=str(copy)) != ident()
    assert ident(data=str(tmp_path / "missing.csv")) is None
    assert file_digest(tmp_path) is None


def test_polygon_strata_are_identified_by_their_layer_content(tmp_path):
    layer = tmp_path / "urban.geojson"
    layer.write_text(json.dumps({"type": "FeatureCollection", "features": []}))
    a = ident(strata=f"polygons:{layer}")
    layer.write_text(json.dumps({"type": "FeatureCollection", "features": [], "name": "other"}))
    assert ident(strata=f"polygons:{layer}") != a
    assert ident(strata=f"polygons:{tmp_path / 'gone.geojson'}") is None


def test_a_run_matches_its_data_set_when_floats_differ_by_one_ulp(tmp_path, monkeypatch):
    """Another CPU's log10 may round differently: the run must still be on the same data set."""
    import gpcore.data.transforms as T
    from gpcore.run import pipeline
    from gpcore.run.store import RunInfo

    cfg = RunConfig(**BASE)
    prep = pipeline.prepare(cfg)
    log10 = T.TRANSFORMS["log10"]
    shifted = dataclasses.replace(log10, _forward=lambda y: np.nextafter(np.log10(y), np.inf))
    monkeypatch.setitem(T.TRANSFORMS, "log10", shifted)
    other_cpu = pipeline.prepare(cfg)
    assert not np.array_equal(other_cpu.y, prep.y)
    assert other_cpu.data_hash == prep.data_hash
    # a manifest written by the older code (a float hash, no note) is matched by its configuration
    old = RunInfo("old", tmp_path, {"config": cfg.to_dict(), "data": {"hash": pipeline.frame_hash(prep.X, prep.y)}},
                  False)
    assert old.data_hash == prep.data_hash


@pytest.mark.parametrize("bad", [{"data": "sample:nope"}, {"data": ""}, {}])
def test_unidentifiable_configs_give_none(bad):
    assert dataset_identity(bad) is None


def test_a_period_is_identified_by_the_quarters_it_selects():
    """One selection of quarters, however written, is one data set; the Data page's "all" on the bundled Puerto Rico
    file is the README's ``--quarter 2019Q1:2023Q4`` (every row of the sample has one of its 20 quarters)."""
    every = ident(quarter="all")
    assert ident(quarter="2019Q1:2023Q4") == every
    assert ident(quarter="2019:2023") == ident(quarter="2018Q3:2031Q1") == every
    assert ident(quarter="2023") == ident(quarter="2023Q1:2023Q4") == ident(quarter="2023Q4, 2023Q1:2023Q3") == ident()
    assert ident(quarter="2019Q2:2023Q4") != every, "a quarter less is another data set"
    assert ident(quarter="2022") != ident(quarter="2023")


def test_the_time_column_is_the_one_the_reader_finds(tmp_path):
    """``--time quarter`` (the issue's command) and the Data page's "auto" read the same column of the sample."""
    assert ident(time="quarter") == ident()
    csv = tmp_path / "t.csv"
    rows = ["lon,lat,download_mbps,quarter,date"]
    rows += [f"{-66 - i / 100},{18 + i / 100},{10 + i},2023Q{1 + i % 4},2022-0{1 + i % 9}-15" for i in range(40)]
    csv.write_text("\n".join(rows) + "\n")
    f = dict(data=str(csv), strata=None, quarter=None)
    assert ident(**f) == ident(**f, time="quarter") != ident(**f, time="date")
    csv.write_text("\n".join(r.replace(",2023Q", ",Z") for r in rows) + "\n")
    assert ident(**f) == ident(**f, time=None) != ident(**f, time="quarter"), "a quarter column of no times is unused"
    # for a user file the quarters are not known in advance: "all" keeps rows without a time, a range does not
    assert ident(**{**f, "quarter": "all"}) == ident(**f) != ident(**{**f, "quarter": "2019Q1:2023Q4"})


def test_a_run_written_by_older_identity_code_is_matched_by_its_configuration(tmp_path):
    from gpcore.identity import HASH_OF
    from gpcore.run.store import RunInfo

    cfg = RunConfig(**{**BASE, "quarter": "2019Q1:2023Q4"}).to_dict()
    older = {"config": cfg, "data": {"hash": "0123456789abcdef", "hash_of": "file content + data spec"}}
    assert RunInfo("older", tmp_path, older, False).data_hash == ident(quarter="all")
    current = {"config": cfg, "data": {"hash": "0123456789abcdef", "hash_of": HASH_OF}}
    assert RunInfo("current", tmp_path, current, False).data_hash == "0123456789abcdef", "the stored hash is used"


def test_the_identity_whatever_the_period_ignores_only_the_period():
    def free(**changes):
        return dataset_identity(RunConfig(**{**BASE, **changes}).to_dict(), period=False)

    assert free(quarter="2019Q1") == free(quarter="2023") == free(quarter="all") is not None
    assert free() not in (ident(), ident(quarter="all")), "never equal to a data set's own identity"
    for change in (dict(y="upload_mbps"), dict(transform="identity"), dict(strata=None), dict(weight="tests")):
        assert free(**change) != free(), change
