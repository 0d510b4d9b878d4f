"""Train: a model from the registry with its main settings, the split and the seed; for a data set with several
quarters, time as an input (:mod:`app.train_time`).

Training runs in a background thread (:mod:`app.jobs`) over :func:`gpcore.run.pipeline.execute_run`;
this page polls it with a fragment that redraws the progress bar and the loss / validation-NLL
chart, and offers Cancel (the best model so far is kept and saved).
"""

from __future__ import annotations

import inspect

import pandas as pd
import streamlit as st

from app import bands, cache, jobs, navigation, state, train_time, widgets
from app.modelinfo import training_note
from app.safe_html import md_code, md_text
from gpcore.errors import GPCoreError

POLL_SECONDS = 0.7
SPLIT_NAMES = {"random": "random", "block": "spatial blocks", "forecast": "forecast (later quarters)"}


def model_picker() -> str:
    from gpcore.models import DEFAULT_MODEL, available_models, model_spec

    names = available_models()
    default = DEFAULT_MODEL if DEFAULT_MODEL in names else names[0]
    current = st.session_state.get("w_model", default)
    return st.selectbox(
        "Model", names, index=names.index(current) if current in names else 0, key="w_model",
        format_func=lambda n: f"{n} — {model_spec(n).description}",
    )


def start(data: cache.LoadedData, model: str, settings: dict, run: dict, time_plan: train_time.TimePlan) -> None:
    """Build the run's config (``run``: split, block_km, seed, grid_cell_km, label; the time fields of
    ``time_plan``), check it and its data, and start training in the background."""
    from gpcore.run.pipeline import new_run_id, prepare
    from gpcore.run.store import RunStore

    if time_plan.space_time is not None:
        settings = {**settings, "space_time": time_plan.space_time}
    try:
        cfg = data.spec.run_config(model=model, settings=settings, **{**run, **time_plan.fields})
        from gpcore.models import make_model

        make_model(cfg.model, **cfg.model_settings())  # validate settings before starting a thread
        gdf = data.frame if time_plan.rows is None else data.frame[time_plan.rows]
        prepared = prepare(cfg, gdf=gdf)
        run_dir = RunStore().new_run_dir(new_run_id(cfg))
    except GPCoreError as exc:
        st.error(md_text(exc))
        return
    state.update(job=jobs.start_training(cfg, run_dir, prepared=prepared, label=cfg.label), job_seen=False)


def history_chart(history: list[dict]) -> None:
    if not history:
        return
    df = pd.DataFrame(history).set_index("epoch")
    cols = [c for c in ("loss", "val_nll") if c in df.columns and df[c].notna().any()]
    st.line_chart(df[cols], height=220, x_label="epoch", y_label="training loss / validation NLL")


@st.fragment(run_every=POLL_SECONDS)
def progress_panel() -> None:
    """Redrawn every ``POLL_SECONDS`` while a job runs; a full rerun when it ends (sidebar, run list)."""
    job = state.view().job
    if job is None:
        return
    hist = job.snapshot()
    st.progress(job.fraction, text=f"{job.label}: {job.stage}")
    last = hist[-1] if hist else None
    if last is not None:
        val = f", validation NLL {last['val_nll']:.4f}" if last.get("val_nll") is not None else ""
        st.caption(f"epoch {last['epoch']}/{last['epochs']}: loss {last['loss']:.4f}{val}, {last['elapsed']:.1f} s")
    history_chart(hist)
    if not job.done:
        st.button("Cancel", key="w_cancel", on_click=job.cancel, disabled=job.cancelled,
                  help="Stop after this epoch; the best model so far is kept and saved as a run.")
    elif not state.view().job_seen:
        state.update(job_seen=True)
        st.rerun(scope="app")


def finished_panel(job: jobs.TrainingJob) -> None:
    if job.error is not None:
        st.error(f"Training failed: {md_text(job.error)}")
        return
    v = state.view()
    if v.run != job.run_id and not v.job_selected:
        state.update(run=job.run_id, job_selected=True)
        st.rerun()
    run = cache.get_run(job.run_id)
    verb = "was cancelled; the best model so far was saved" if job.cancelled else "finished"
    st.success(f"Run **{job.run_id}** {verb} and is in the run store.")
    if run is not None:
        m = next((r for r in run.manifest.get("metrics", []) if r.get("group") == "all"), {})
        c = st.columns(4)
        c[0].metric("Test NLL", f"{m.get('nll', float('nan')):.3f}")
        c[1].metric("Test MAE", f"{m.get('mae', float('nan')):.3f}")
        value, band = bands.overall(run, m.get("coverage", float("nan")))
        c[2].metric("95% coverage", value, help=band)
        c[3].metric("Fit time", f"{run.manifest.get('timings', {}).get('fit_seconds', float('nan')):.1f} s")
        st.caption(f"Metrics on the test split in {run.t_units or 'target units'}.")
        decided = training_note(run.manifest)
        if decided:
            st.info(f"Training: {decided}", icon=":material/info:")
    history_chart(job.snapshot())
    c1, c2 = st.columns(2)
    with c1:
        navigation.link("maps", label="Open the maps", icon=":material/map:")
    with c2:
        navigation.link("compare", label="Compare runs", icon=":material/leaderboard:")


def render(data: cache.LoadedData, runs: list) -> None:
    """The Train page: a model on ``data``; the new run joins the store and becomes the active run."""
    from gpcore.models import model_spec

    st.title("Train")
    st.caption(f"Data set: {md_text(data.spec.label())} · {md_code(data.spec.y)} ({data.spec.transform}) · "
               f"{data.n:,} rows")
    job = state.view().job
    running = job is not None and not job.done

    model = model_picker()
    spec = model_spec(model)
    st.markdown("**Main settings** (defaults scaled to a 2-core CPU)")
    doc = inspect.getdoc(spec.cls.Config) or ""
    if doc:
        with st.expander("The paper's settings and these defaults"):
            st.text(doc)
    settings = widgets.settings_form(model, main=True)
    with st.expander("More settings"):
        settings.update(widgets.settings_form(model, main=False))
    choice = train_time.time_controls(data, model)
    st.markdown("**Split, seed and grid**")
    c = st.columns(4)
    splits = ["random", "block", "forecast"] if choice else ["random", "block"]
    split = c[0].selectbox("Split (8:1:1)", splits, key="w_split", format_func=SPLIT_NAMES.get,
                           help="The test split the run's metrics come from. Random: test rows lie between training "
                                "rows. Spatial blocks: whole squares of the block size are held out, so test rows "
                                "lie inside gaps (how the intervals do where nothing was measured). Forecast (time "
                                "as an input): tested on the test period, trained on the quarters before it. "
                                "Compare shows the kinds apart.")
    block_km = c[1].number_input("Block size (km)", min_value=0.5, value=10.0, step=1.0, key="w_block_km",
                                 disabled=split != "block")
    seed = int(c[2].number_input("Seed", min_value=0, value=0, step=1, key="w_seed"))
    cell_km = float(c[3].number_input("Grid cell (km, 0 = auto)", min_value=0.0, value=0.0, step=0.25,
                                      key="w_cell_km", help="Auto gives about 20,000 cells over the region."))
    test = None
    if choice and split == "forecast":
        test = train_time.test_period_controls(train_time.data_quarters(data), choice[0], choice[1])
    time_plan = train_time.plan(data, choice, split, test)
    train_time.plan_note(time_plan)
    default_label = " · ".join(p for p in (model, data.spec.label(), time_plan.label) if p)
    label = st.text_input("Run label (optional)", key="w_label", placeholder=default_label)
    st.caption(spec.description)

    if st.button("Train", type="primary", disabled=running or time_plan.error is not None, key="w_train",
                 help="Disabled while a model trains (Cancel is below the progress bar) or while the time settings "
                      "above need a fix."):
        run = {"split": split, "block_km": block_km, "seed": seed, "grid_cell_km": cell_km,
               "label": label.strip() or default_label}
        start(data, model, settings, run, time_plan)
        state.update(job_selected=False)
        if state.view().job is not job:  # started: redraw at once so the button shows disabled
            st.rerun()

    if job is not None:
        st.divider()
        if not job.done:
            progress_panel()
        else:
            finished_panel(job)

