"""The sidebar every page shares: the active data set, the runs trained so far, the device."""

from __future__ import annotations

import streamlit as st

from app import cache, state
from app.safe_html import md_code, md_text
from gpcore.errors import GPCoreError


def active_data():
    """The active :class:`~app.cache.LoadedData`; on failure fall back to the default sample (with an error)."""
    url_error = state.take("url_error")
    if url_error:
        st.error(f"The data set in the link could not be loaded: {md_text(url_error)}")
    try:
        return cache.st_load_dataset(state.dataset())
    except GPCoreError as exc:
        st.error(f"The data set in the link could not be loaded: {md_text(exc)}")
        state.update(dataset=state.DatasetSpec.for_sample(state.DEFAULT_SAMPLE), xref=None)
        return cache.st_load_dataset(state.dataset())


def choose_default_run(runs, data_hash: str) -> str | None:
    """The newest run on the active data set, else the newest run (the bundled one on a fresh install)."""
    for r in runs:
        if r.data_hash == data_hash:
            return r.run_id
    return runs[0].run_id if runs else None


def render_sidebar(data) -> list:
    """Draw the sidebar with the one run picker (the active run of Maps, Decide and Export); returns the run
    list, which the pages get as an argument."""
    from gpcore.device import describe_device
    from gpcore.run.store import default_store_dir

    runs, skipped = cache.list_runs_checked()
    ids = [r.run_id for r in runs]
    v = state.view()
    if v.run not in ids:
        state.update(run=choose_default_run(runs, data.data_hash))
    if v.run2 is not None and v.run2 not in ids:  # a deleted run, or a link naming one: one map again
        state.update(run2=None, side=False)
    with st.sidebar:
        st.markdown("### Uncertainty Atlas")
        st.markdown("**Data set**")
        tr = data.spec.transform
        st.markdown(
            f"{md_text(data.spec.label())}  \n{md_code(data.spec.y)}"
            + (f" ({tr})" if tr != "identity" else "")
            + f" · {data.n:,} rows"
        )
        on_data = [r for r in runs if r.data_hash == data.data_hash]
        st.markdown(f"**Runs** ({len(runs)} in the store, {len(on_data)} on this data set)")
        if runs:
            titles = cache.unique_labels({r.run_id: _run_label(r, data) for r in runs})
            state.control(
                st.selectbox, "Active run", ids, format_func=titles.get, name="run", valid=lambda v: v in ids,
                help="The run shown on Maps, Decide and Export. Runs persist in the run store across restarts.",
            )
            with st.expander("All runs", expanded=False):
                for r in runs[:30]:
                    st.markdown(f"- {md_text(titles[r.run_id])}")
        else:
            st.caption("No runs yet: train one on the Train page.")
        if skipped:
            names = ", ".join(md_code(run_id) for run_id, _ in skipped[:5]) + (" ..." if len(skipped) > 5 else "")
            st.warning(f"{len(skipped)} run(s) skipped (malformed run.json): {names}")
            with st.expander("Why", expanded=False):
                for _, reason in skipped[:20]:
                    st.caption(md_text(reason))
        st.markdown("**Device**")
        st.markdown(describe_device("auto"))
        job = state.view().job
        if job is not None and not job.done:
            st.info(f"Training {md_text(job.label)}: {md_text(job.stage)}")
        st.caption(f"Run store: `{default_store_dir()}`")
    return runs


def _run_label(info, data) -> str:
    m = info.manifest
    created = (m.get("created") or "")[:16].replace("T", " ")
    nll = next((r.get("nll") for r in m.get("metrics", []) if r.get("group") == "all"), None)
    bits = [info.model]
    if nll is not None:  # before the date: the narrow sidebar cuts a long label's end
        bits.append(f"NLL {nll:.3f}")
    if created:
        bits.append(created)
    tag = " (bundled)" if info.bundled else ""
    same_but_period = bool(data.period_free_hash) and info.period_free_hash == data.period_free_hash
    other = "" if info.data_hash == data.data_hash else (" [other period]" if same_but_period else " [other data]")
    return " · ".join(bits) + tag + other
