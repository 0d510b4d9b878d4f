"""Four sessions at once (issue 12): two train while two browse (one on an upload, one on the sample).
No session sees another's data set, run choice or job; every run lands under its own id; memory stays
bounded."""

from __future__ import annotations

import resource
import time

import numpy as np
import pandas as pd
from streamlit.testing.v1 import AppTest

from tests.app.conftest import APP, TIMEOUT, TINY, open_page

PAGES = ["data", "maps", "compare", "export",
         "train", "decide"]


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def test_four_sessions_train_and_browse_without_cross_talk(store):
    from app import uploads
    from gpcore.run.store import RunStore

    rss0 = _rss_mb()
    before = {r.run_id for r in RunStore().list()}
    sessions = {name: AppTest.from_file(APP, default_timeout=TIMEOUT) for name in ("A", "B", "C", "D")}
    sessions["D"].query_params.update({"run": "20240101-000001-000-dbk-silu", "map": "width"})
    for at in sessions.values():
        at.run()
        assert not at.exception, [e.value for e in at.exception]

    # C switches to its own upload
    rng = np.random.default_rng(1)
    rows = pd.DataFrame({"lon": rng.uniform(-66.9, -65.7, 80), "lat": rng.uniform(18.05, 18.45, 80),
                         "speed_c": rng.uniform(5, 50, 80)})
    ref = uploads.save_upload("session_c.csv", rows.to_csv(index=False).encode())
    c = sessions["C"]
    c.radio(key="w_src_kind").set_value("Upload a file").run()
    c.file_uploader(key="w_upload").upload("session_c.csv", rows.to_csv(index=False).encode(), "text/csv").run()
    next(r for r in c.radio if r.label.startswith("Strata")).set_value("none").run()
    c.button(key="w_load_data").click().run()
    spec_c = c.session_state["ua_dataset"]
    assert spec_c.source == ref and spec_c.y == "speed_c"

    # A and B press Train on the Train page one right after the other
    started = {}
    for name, seed in (("A", 11), ("B", 12)):
        at = sessions[name]
        open_page(at, "train").run()
        at.selectbox(key="w_model").select("dbk-rbf").run()  # tiny and quick (the default is dbk-nn)
        for key, value in (*TINY.items(), ("epochs", 6)):
            at.number_input(key=f"w_set_dbk-rbf_{key}").set_value(value)
        at.number_input(key="w_seed").set_value(seed)
        at.number_input(key="w_cell_km").set_value(4.0)
        at.text_input(key="w_label").input(f"session {name}")
        at.button(key="w_train").click().run()
        assert not at.exception, [e.value for e in at.exception]
        started[name] = at.session_state["ua_job"]
    assert started["A"].run_id != started["B"].run_id

    # everyone browses every page while the two jobs train
    deadline = time.time() + 240
    rounds = 0
    while (not all(j.done for j in started.values()) or rounds < 2) and time.time() < deadline:
        for name, at in sessions.items():
            open_page(at, PAGES[rounds % len(PAGES)]).run()
            assert not at.exception, (name, rounds, [e.value for e in at.exception])
        rounds += 1
    for name, job in started.items():
        assert job.done and job.error is None, (name, job.stage, job.error)

    # no cross-talk
    for at in sessions.values():
        at.run()
    assert sessions["A"].session_state["ua_job"].run_id == started["A"].run_id
    assert sessions["B"].session_state["ua_job"].run_id == started["B"].run_id
    for name in ("C", "D"):
        assert "ua_job" not in sessions[name].session_state, f"session {name} never trained"
    assert sessions["C"].session_state["ua_dataset"] == spec_c
    for name in ("A", "B", "D"):
        assert sessions[name].session_state["ua_dataset"].source == "sample:puerto_rico"
    assert sessions["D"].session_state["ua_run"] == "20240101-000001-000-dbk-silu"
    assert sessions["D"].session_state["ua_map"] == "width"
    assert sessions["C"].query_params["data"] == ref and sessions["D"].query_params["data"] == "sample:puerto_rico"
    after = {r.run_id: r for r in RunStore().list()}
    new = set(after) - before
    assert new == {started["A"].run_id, started["B"].run_id}
    assert {after[i].manifest["label"] for i in new} == {"session A", "session B"}
    assert {after[i].manifest["config"]["seed"] for i in new} == {11, 12}
    grown = _rss_mb() - rss0
    print(f"\nfour sessions, {rounds} rounds of page views, peak memory grew by {grown:.0f} MB")
    assert grown < 1500, f"memory grew by {grown:.0f} MB"
