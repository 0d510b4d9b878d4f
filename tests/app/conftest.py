"""Fixtures for the dashboard tests: a temporary run store with tiny trained runs.

The user's real run store is never touched: every test points ``UA_RUN_STORE`` at a temporary
folder. Runs are trained once per session on the bundled Puerto Rico sample with tiny settings
and a coarse grid, so they take seconds.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

APP = str(Path(__file__).resolve().parents[2] / "app" / "main.py")
TIMEOUT = 180

TINY = {"epochs": 2, "rank": 8, "hidden": 8, "batch_size": 2048}


def tiny_config(model: str = "dbk-rbf", seed: int = 0, **run):
    from app.state import DatasetSpec

    spec = DatasetSpec()  # the default: Puerto Rico 2023, download_mbps, log10, county metro strata
    return spec.run_config(model=model, settings=dict(TINY), seed=seed, grid_cell_km=4.0, **run)


def make_run(store: Path, run_id: str, model: str = "dbk-rbf", seed: int = 0) -> Path:
    from gpcore.run.pipeline import execute_run

    return execute_run(tiny_config(model, seed, label=f"{model} tiny"), store / run_id)


@pytest.fixture(scope="session")
def trained_store(tmp_path_factory) -> Path:
    """A store with two tiny runs on the default data set (dbk-rbf and dbk-silu)."""
    store = tmp_path_factory.mktemp("runs")
    make_run(store, "20240101-000000-000-dbk-rbf", "dbk-rbf")
    make_run(store, "20240101-000001-000-dbk-silu", "dbk-silu", seed=1)
    return store


@pytest.fixture
def store(trained_store, tmp_path, monkeypatch) -> Path:
    """A fresh copy of the trained store as ``UA_RUN_STORE`` (tests may add runs to it)."""
    path = tmp_path / "runs"
    shutil.copytree(trained_store, path)
    monkeypatch.setenv("UA_RUN_STORE", str(path))
    monkeypatch.setenv("UA_TORCH_THREADS", "1")
    return path


@pytest.fixture
def empty_store(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "empty-runs"
    monkeypatch.setenv("UA_RUN_STORE", str(path))
    monkeypatch.setenv("UA_TORCH_THREADS", "1")
    return path


@pytest.fixture
def app(store):
    from streamlit.testing.v1 import AppTest

    return AppTest.from_file(APP, default_timeout=TIMEOUT)


# ---------------------------------------------------------------------------------------------
# the grid-map component (app/gridmap.py) in AppTest, which draws custom components as unknown elements
# ---------------------------------------------------------------------------------------------


def gridmaps(at) -> dict:
    """``{widget key: component args}`` of every grid map on the page (mean/width maps and kernel slices)."""
    import json

    out = {}

    def walk(node):
        for child in getattr(node, "children", {}).values():
            if getattr(child, "type", None) == "component_instance":
                ci = child.proto
                out[child.key] = {**json.loads(ci.json_args), "_id": ci.id}
            walk(child)

    walk(at._tree)
    return out


def click_grid(at, key: str, cell: int, lon: float = 0.0, lat: float = 0.0):
    """Send a click on grid row ``cell`` of the grid map ``key``, as the browser component reports it."""
    import json
    import time

    from streamlit.proto.WidgetStates_pb2 import WidgetStates

    maps = gridmaps(at)
    assert key in maps, f"no grid map keyed {key!r}; keys: {list(maps)}"
    states = WidgetStates()
    states.CopyFrom(at._tree.get_widget_states())
    w = states.widgets.add()
    w.id = maps[key]["_id"]
    w.json_value = json.dumps({"cell": int(cell), "lon": lon, "lat": lat, "t": time.time()})
    return at._run(states)


def linked_page(path: str, run_id: str, **params):
    """The page at URL path ``path`` of ``run_id``, opened by a link (``?run=...`` and any other URL parameters)."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update({"run": run_id, **params})
    at.run()
    open_page(at, path).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


@pytest.fixture
def deferred(monkeypatch) -> dict:
    """``{deferred_file_id: (file name, callable)}`` of every download button drawn while the test runs: a page that
    passes a callable (generated on click) leaves it with Streamlit's media file manager, which AppTest replaces on
    every run; the registration is recorded here so that :func:`download` can run it as a click does."""
    from streamlit.runtime.media_file_manager import MediaFileManager

    seen: dict = {}
    add = MediaFileManager.add_deferred

    def recording(self, data_callable, mimetype, coordinates, file_name=None, **kw):
        file_id = add(self, data_callable, mimetype, coordinates, file_name=file_name, **kw)
        seen[file_id] = (file_name, data_callable)
        return file_id

    monkeypatch.setattr(MediaFileManager, "add_deferred", recording)
    return seen


def download(at, deferred: dict, key: str) -> tuple[str, bytes]:
    """``(file name, bytes)`` the browser gets from the download button with widget key ``key`` (its callable run as
    a click runs it; ``deferred``: the fixture of that name)."""
    hits = [b.proto for b in at.get("download_button") if b.proto.id.endswith(f"-{key}")]
    assert len(hits) == 1, [b.proto.id for b in at.get("download_button")]
    assert hits[0].deferred_file_id in deferred, f"{key}: not a deferred download"
    name, make = deferred[hits[0].deferred_file_id]
    data = make()
    return name, data.encode() if isinstance(data, str) else bytes(data)


def open_page(at, path: str):
    """Switch to the page at URL path ``path`` (``"maps"``): the pages are ``render(data, runs)`` callables
    registered by ``st.navigation`` (app/navigation.py), which ``AppTest.switch_page`` (file pages) cannot
    name. Call ``run()`` once before (navigation registers the pages) and after (to draw the page)."""
    from app.navigation import PAGES

    default = PAGES[0][0]  # the default page is registered at the URL's root
    hashes = [h for h, info in at._registered_pages.items()
              if info.get("url_pathname") == path or (path == default and info.get("url_pathname") == "")]
    assert hashes, f"no page at /{path}; pages: {[i.get('url_pathname') for i in at._registered_pages.values()]}"
    at._page_hash = hashes[0]
    return at


# ---------------------------------------------------------------------------------------------
# a tiny run with time as an input (issue 23): the Maps quarter slider, the Change map, Decide at a quarter
# ---------------------------------------------------------------------------------------------

TIME_RUN = "20240102-000000-000-vecchia-st"
PLAIN_RUN = "20240102-000001-000-vecchia-plain"
FORECAST_RUN = "20240102-000002-000-vecchia-forecast"


def time_config(csv, **run):
    """A tiny space-time ``vecchia`` run on the synthetic multi-quarter CSV (2019Q1-2020Q4, Puerto Rico)."""
    from gpcore.run.config import RunConfig

    base = dict(data=str(csv), y="download_mbps", transform="log10", model="vecchia", weight="tests",
                settings={"epochs": 2, "neighbors": 8}, grid_cell_km=20.0)
    return RunConfig(**{**base, **run})


@pytest.fixture(scope="session")
def time_store(tmp_path_factory) -> Path:
    """Three tiny runs on a synthetic 8-quarter CSV: time as an input over every quarter (per-quarter grids), the
    same model on one quarter (no time), and a forecast run (trained on 2019Q1-2020Q3, tested on 2020Q4)."""
    from gpcore.run.pipeline import execute_run
    from tests.gpcore.test_cli_time import write_spacetime_csv

    root = tmp_path_factory.mktemp("time")
    csv = write_spacetime_csv(root / "st.csv", n=480)
    store = root / "runs"
    execute_run(time_config(csv, time_input=True, label="vecchia space-time tiny"), store / TIME_RUN)
    execute_run(time_config(csv, quarter="2020Q4", label="vecchia one quarter tiny"), store / PLAIN_RUN)
    execute_run(time_config(csv, time_input=True, quarter="2019Q1:2020Q3", split="forecast", test_period="2020Q4",
                            grid_kind="none", label="vecchia forecast tiny"), store / FORECAST_RUN)
    return store


def use_store(src: Path, tmp_path, monkeypatch) -> Path:
    """``src`` copied as ``UA_RUN_STORE``, without the bundled runs (so the runs here are all there is)."""
    path = tmp_path / "runs"
    shutil.copytree(src, path)
    (tmp_path / "no-bundled").mkdir()
    monkeypatch.setattr("gpcore.run.store.BUNDLED_RUNS", tmp_path / "no-bundled")
    monkeypatch.setenv("UA_RUN_STORE", str(path))
    monkeypatch.setenv("UA_TORCH_THREADS", "1")
    return path


@pytest.fixture
def time_env(time_store, tmp_path, monkeypatch) -> Path:
    """``time_store`` copied as ``UA_RUN_STORE``, without the bundled runs."""
    return use_store(time_store, tmp_path, monkeypatch)


def wait_for_job(at, timeout: float = 150.0, poll: float = 0.4):
    """The training job the last Train click started, after rerunning the page until it is done (or ``timeout`` s);
    the page is rerun once more after it finished."""
    import time

    job = at.session_state["ua_job"]
    deadline = time.time() + timeout
    while not job.done and time.time() < deadline:
        time.sleep(poll)
        at.run()
    assert job.done and job.error is None, job.error
    at.run()
    return job
