"""The Train page starts a run with time as an input (issue 23): the "Time as an input" toggle, the quarter range, the
space-time covariance and the forecast split's test period, driven by widgets on a tiny uploaded 8-quarter CSV; bad
combinations name the control to change and keep the data set and the runs; the finished run gets the Maps slider."""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from tests.app.conftest import APP, TIMEOUT, open_page, wait_for_job

QUARTERS = [f"{y}Q{q}" for y in (2019, 2020) for q in range(1, 5)]


@pytest.fixture(scope="module")
def st_csv(tmp_path_factory) -> bytes:
    from tests.gpcore.test_cli_time import write_spacetime_csv

    return write_spacetime_csv(tmp_path_factory.mktemp("train-time") / "st.csv", n=480).read_bytes()


def train_page(st_csv: bytes) -> AppTest:
    """The Train page after uploading the 8-quarter CSV on the Data page and using it (Period: all)."""
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.run()
    at.radio(key="w_src_kind").set_value("Upload a file").run()
    at.file_uploader(key="w_upload").upload("st.csv", st_csv, "text/csv").run()
    at.button(key="w_load_data").click().run()
    open_page(at, "train").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def by_label(at: AppTest, label: str):
    hits = [w for w in at.selectbox if w.label == label]
    assert hits, f"no selectbox {label!r}: {[w.label for w in at.selectbox]}"
    return hits[0]


def labels(at: AppTest) -> list[str]:
    return [w.label for w in at.selectbox]


def errors(at: AppTest) -> list[str]:
    return [e.value for e in at.error]


def train(at: AppTest):
    """Press Train, wait for the run and return it (:class:`gpcore.run.store.RunInfo`)."""
    from gpcore.run.store import RunStore

    at.button(key="w_train").click().run()
    assert not at.exception and not errors(at), errors(at)
    job = wait_for_job(at, 150)
    assert any("is in the run store" in s.value for s in at.success)
    return {r.run_id: r for r in RunStore().list()}[job.run_id]


def test_time_is_off_by_default_and_the_page_is_unchanged(st_csv, empty_store):
    at = train_page(st_csv)
    toggle = at.toggle(key="w_time_input")
    assert toggle.label == "Time as an input" and toggle.value is False
    assert by_label(at, "Split (8:1:1)").options == ["random", "spatial blocks"], "no forecast without time"
    assert "First quarter" not in labels(at) and "Space-time covariance" not in labels(at)
    assert "space time" not in labels(at), "space_time is the time section's, never a More-settings box"

    toggle.set_value(True).run()
    first, last = by_label(at, "First quarter"), by_label(at, "Last quarter")
    assert first.options == QUARTERS and (first.value, last.value) == ("2019Q1", "2020Q4"), "all quarters"
    assert by_label(at, "Space-time covariance").value == "separable", "dbk-nn (the default) has space_time"
    assert "forecast (later quarters)" in by_label(at, "Split (8:1:1)").options
    assert any("One model over 2019Q1–2020Q4 (480 rows)" in c.value for c in at.caption)
    assert at.text_input(key="w_label").placeholder == "dbk-nn · st.csv · time 2019Q1–2020Q4", "the default label"

    at.selectbox(key="w_model").select("svgp").run()
    assert "Space-time covariance" not in labels(at)
    assert any("`svgp` takes t as one more input" in c.value for c in at.caption)
    at.toggle(key="w_time_input").set_value(False).run()
    assert "First quarter" not in labels(at) and by_label(at, "Split (8:1:1)").value == "random"

    # with the toggle off a run trains as before: space only, on the data set's rows
    at.selectbox(key="w_model").select("vecchia").run()
    at.number_input(key="w_set_vecchia_epochs").set_value(1)
    at.number_input(key="w_set_vecchia_neighbors").set_value(8)
    at.number_input(key="w_cell_km").set_value(20.0)
    run = train(at)
    cfg = run.manifest["config"]
    assert (cfg["time_input"], cfg["split"], cfg["quarter"], cfg["test_period"]) == (False, "random", None, None)
    assert "space_time" not in cfg["settings"] and run.manifest["label"] == "vecchia · st.csv"


def test_the_bundled_sample_offers_its_quarters_and_a_short_test_period(empty_store):
    """Puerto Rico 2023 (the default data set): four quarters, so the forecast tests on the last one."""
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.run()
    open_page(at, "train").run()
    at.toggle(key="w_time_input").set_value(True).run()
    assert by_label(at, "First quarter").options == ["2023Q1", "2023Q2", "2023Q3", "2023Q4"]
    by_label(at, "Split (8:1:1)").select("forecast").run()
    assert (by_label(at, "Test from").value, by_label(at, "Test to").value) == ("2023Q4", "2023Q4")
    assert any("One model over 2023Q1–2023Q4 (26,397 rows)" in c.value and "tested on 2023Q4" in c.value
               for c in at.caption), [c.value for c in at.caption]
    assert not at.exception and not errors(at)


def test_bad_combinations_name_the_control_and_keep_the_data_and_runs(st_csv, empty_store):
    from gpcore.run.store import RunStore

    before = {r.run_id for r in RunStore().list()}
    at = train_page(st_csv)
    at.toggle(key="w_time_input").set_value(True).run()
    by_label(at, "First quarter").select("2020Q4").run()
    assert any("at least 2 quarters" in e and "earlier First quarter" in e for e in errors(at)), errors(at)
    assert at.button(key="w_train").disabled, "no training while the time settings need a fix"

    by_label(at, "First quarter").select("2019Q1").run()
    assert not errors(at) and not at.button(key="w_train").disabled
    by_label(at, "Split (8:1:1)").select("forecast").run()
    assert (by_label(at, "Test from").value, by_label(at, "Test to").value) == ("2020Q1", "2020Q4"), "the last year"
    by_label(at, "Test from").select("2019Q1").run()
    assert any("Nothing is left to train on" in e and "later Test from" in e for e in errors(at)), errors(at)

    by_label(at, "Last quarter").select("2019Q4").run()  # a new range: the test period starts again from its default
    assert (by_label(at, "Test from").value, by_label(at, "Test to").value) == ("2019Q4", "2019Q4")
    by_label(at, "Test to").select("2020Q2").run()
    assert any("is not inside the quarters of the run (2019Q1:2019Q4)" in e and "Test to" in e
               for e in errors(at)), errors(at)
    assert at.button(key="w_train").disabled
    assert not at.exception
    sidebar = "\n".join(m.value for m in at.sidebar.markdown)
    assert "st.csv" in sidebar, "the uploaded data set stays active"
    assert {r.run_id for r in RunStore().list()} == before, "no run was written or lost"


def test_a_forecast_run_trains_from_the_page_and_gets_the_quarter_slider(st_csv, empty_store):
    at = train_page(st_csv)
    at.selectbox(key="w_model").select("vecchia").run()
    at.number_input(key="w_set_vecchia_epochs").set_value(2)
    at.number_input(key="w_set_vecchia_neighbors").set_value(8)
    at.number_input(key="w_cell_km").set_value(20.0)
    at.toggle(key="w_time_input").set_value(True).run()
    by_label(at, "Space-time covariance").select("gneiting").run()
    by_label(at, "Split (8:1:1)").select("forecast").run()
    by_label(at, "Test from").select("2020Q3").run()
    assert any("Forecast: tested on 2020Q3–2020Q4" in c.value for c in at.caption)
    run = train(at)
    cfg = run.manifest["config"]
    assert (cfg["time_input"], cfg["split"], cfg["test_period"], cfg["quarter"]) == (True, "forecast", "2020Q3:2020Q4",
                                                                                    None)
    assert cfg["settings"]["space_time"] == "gneiting" and run.manifest["model_config"]["space_time"] == "gneiting"
    assert run.manifest["time"]["grid_quarters"] == QUARTERS
    assert run.manifest["label"] == "vecchia · st.csv · time 2019Q1–2020Q4 · forecast 2020Q3–2020Q4"
    sidebar = "\n".join(m.value for m in at.sidebar.markdown)
    assert "1 on this data set" in sidebar, "a run over every quarter is on the active data set (Compare lists it)"

    open_page(at, "maps").run()  # the new run is the active one: its quarter slider, at the latest quarter
    assert not at.exception, [e.value for e in at.exception]
    slider = at.select_slider(key="w_quarter")
    assert slider.options == QUARTERS and slider.value == "2020Q4"
    assert "Change" in at.segmented_control(key="w_map_kind").options


def test_period_all_of_the_bundled_sample_reads_its_twenty_quarters(empty_store):
    """Period "all" on the Data page reads every quarter of Puerto Rico (2019Q1-2023Q4), not its default year, so
    the Train page's time range offers all twenty."""
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.run()
    assert at.selectbox(key="w_quarter_sample:puerto_rico").value == "2023"
    at.selectbox(key="w_quarter_sample:puerto_rico").select("all").run()
    at.button(key="w_load_data").click().run()
    assert not at.exception, [e.value for e in at.exception]
    open_page(at, "train").run()
    at.toggle(key="w_time_input").set_value(True).run()
    first = by_label(at, "First quarter").options
    assert (len(first), first[0], first[-1]) == (20, "2019Q1", "2023Q4")
    assert any("One model over 2019Q1–2023Q4 (142,803 rows)" in c.value for c in at.caption), \
        [c.value for c in at.caption]


def test_a_cli_run_over_every_quarter_is_on_the_data_page_s_period_all(store):
    """The README's space-time run (``--quarter 2019Q1:2023Q4``, ``--time quarter``) reads the rows Period "all" reads:
    the sidebar counts it on that data set and does not label it "[other data]" (it did before periods were
    identified by their quarters)."""
    import json
    import shutil

    from gpcore.identity import HASH_OF, dataset_identity

    cli_run = store / "20240103-000000-000-vecchia-st"
    shutil.copytree(store / "20240101-000000-000-dbk-rbf", cli_run)  # a tiny run's files; the manifest is the subject
    manifest = json.loads((cli_run / "run.json").read_text())
    manifest["config"].update(quarter="2019Q1:2023Q4", time="quarter", label="cli space-time")
    manifest["label"] = "cli space-time"
    manifest["data"].update(hash=dataset_identity(manifest["config"]), hash_of=HASH_OF)  # as execute_run writes it
    (cli_run / "run.json").write_text(json.dumps(manifest))

    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.run()
    at.selectbox(key="w_quarter_sample:puerto_rico").select("all").run()
    at.button(key="w_load_data").click().run()
    assert not at.exception, [e.value for e in at.exception]
    sidebar = "\n".join(m.value for m in at.sidebar.markdown)
    assert "1 on this data set" in sidebar, sidebar
    titles = {o for o in at.sidebar.selectbox[0].options}
    mine = [t for t in titles if not t.endswith("]")]
    assert len(mine) == 1 and mine[0].startswith("dbk-rbf"), titles  # the crafted run (its model still dbk-rbf)
    assert sum(t.endswith(" [other period]") for t in titles) == len(titles) - 1, \
        "the 2023 runs read other quarters of the same file and spec"


def test_runs_on_other_quarters_of_the_data_set_are_named_so(store):
    """Period "all" with only runs on 2023 (the store's tiny runs and the bundled ones): the sidebar marks them
    "[other period]", not "[other data]", and Compare says that runs on other periods of the data set exist and how
    to include them (a time run trained on some quarters from the Train page is such a run); other data stays so."""
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.run()
    at.selectbox(key="w_quarter_sample:puerto_rico").select("all").run()
    at.button(key="w_load_data").click().run()
    titles = at.sidebar.selectbox[0].options
    assert titles and all(t.endswith(" [other period]") for t in titles), titles
    open_page(at, "compare").run()
    assert not at.exception, [e.value for e in at.exception]
    info = " ".join(i.value for i in at.info)
    assert f"but {len(titles)} on other periods of it" in info and "Include runs on other data sets" in info, info

    open_page(at, "data").run()  # another target is other data, whatever the period
    at.selectbox(key="w_y_sample:puerto_rico").select("upload_mbps").run()
    at.button(key="w_load_data").click().run()
    assert all(t.endswith(" [other data]") for t in at.sidebar.selectbox[0].options)


def test_the_readme_s_space_time_command_reads_the_data_page_s_puerto_rico_all():
    """The README's headless space-time fit, parsed as ``python -m gpcore`` parses it, is on the data set the Data
    page's Puerto Rico with Period "all" (and its other defaults) loads; its 2023 fit is on the default data set."""
    import re
    import shlex
    from pathlib import Path

    from app.state import DatasetSpec
    from gpcore.cli import _run_config, build_parser
    from gpcore.identity import dataset_identity

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text().replace("\\\n", " ")
    fits = {m.group(1).split()[-1]: m.group(1) for m in re.finditer(r"python -m gpcore (fit [^#\n]+)", readme)}
    assert {"runs/pr", "runs/pr-st"} <= set(fits), fits

    def cli_identity(command: str) -> str:
        args = build_parser().parse_args(shlex.split(command))
        return dataset_identity(_run_config(args, "vecchia", {}).to_dict())

    def page_identity(**spec) -> str:
        return dataset_identity(DatasetSpec(**spec).run_config(model="vecchia").to_dict())

    assert cli_identity(fits["runs/pr-st"]) == page_identity(quarter="all") != page_identity()
    assert cli_identity(fits["runs/pr"]) == page_identity()
