"""Data: pick a bundled sample or upload a file, map its columns, choose transform and strata."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import cache, mapview, state, uploads
from app.colors import legend_html
from app.messages import for_page
from app.safe_html import md_code, md_text
from gpcore.errors import GPCoreError

UPLOAD_TYPES = ["csv", "tsv", "txt", "parquet", "geoparquet", "geojson", "json", "gpkg", "zip"]
TRANSFORMS = ["identity", "log10", "log"]
STRATA_KINDS = {
    "county_metro": "Bundled counties: metro / non-metro (USDA RUCC 2023)",
    "column": "A column of the data",
    "polygons": "An uploaded polygon layer (inside = urban)",
    "none": "No strata",
}
AUTO = "(auto-detect)"
NONE = "(none)"


def _strata_kind(spec: state.DatasetSpec) -> str:
    if not spec.strata:
        return "none"
    if spec.strata.startswith("column:"):
        return "column"
    if spec.strata.startswith("polygons:"):
        return "polygons"
    return "county_metro"


def source_picker(active: state.DatasetSpec) -> str | None:
    """Sample or upload; returns the chosen ``source`` (None while an upload is missing or unusable)."""
    from gpcore.data import SAMPLES

    kind = st.radio(
        "Source", ["Bundled sample", "Upload a file"], horizontal=True, key="w_src_kind",
        index=0 if active.sample_key else 1,
    )
    if kind == "Bundled sample":
        keys = [k for k in SAMPLES if k != "synthetic"] + [k for k in SAMPLES if k == "synthetic"]
        current = active.sample_key if active.sample_key in keys else keys[0]
        key = st.selectbox(
            "Data set", keys, index=keys.index(current), format_func=lambda k: SAMPLES[k].label, key="w_sample"
        )
        st.caption(SAMPLES[key].description)
        return state.SAMPLE_PREFIX + key
    upload = st.file_uploader(
        "CSV, Parquet, GeoJSON, GeoPackage or zipped Shapefile", type=UPLOAD_TYPES, key="w_upload",
        help="Point measurements with coordinates (lon/lat columns, a geometry, or Ookla quadkeys) "
        "and a numeric target.",
    )
    if upload is None:
        if not active.sample_key:
            return active.source
        st.caption("The active data set stays until a new file is read without errors.")
        return None
    ref = uploads.save_upload(upload.name, upload.getvalue())
    try:
        cache.st_columns(ref)
    except GPCoreError as exc:
        uploads.discard_upload(ref)  # an unusable file is not kept
        st.error(f"**{md_text(upload.name)}** cannot be used: {md_text(for_page(exc))}")
        st.caption("The previous data set and all runs are kept.")
        return None
    return ref


def column_mapping(source: str, active: state.DatasetSpec) -> state.DatasetSpec | None:
    """Coordinate, target, weight and time columns (auto-detected, editable), period, transform, strata.

    The Longitude / Latitude selectors come first and stay visible when the file fails, so the fix a
    message names (another column, swapped columns) can be applied right here.
    """
    from gpcore.data import SAMPLES
    from gpcore.data.columns import default_transform

    name = state.DatasetSpec(source=source).file_name
    try:
        raw_cols, profiles = cache.st_columns(source)
    except GPCoreError as exc:
        st.error(f"**{md_text(name)}** cannot be used: {md_text(for_page(exc))}")
        return None
    same = source == active.source
    base = active if same else (
        state.DatasetSpec.for_sample(source[len(state.SAMPLE_PREFIX):]) if source.startswith(state.SAMPLE_PREFIX)
        else state.DatasetSpec(source=source, quarter=None, y="", transform="", strata=None)
    )
    sfx = source.replace("/", "_")
    c1, c2 = st.columns(2)
    with c1:
        opts = [AUTO, *raw_cols]
        lon = st.selectbox("Longitude column", opts, index=opts.index(base.lon) if base.lon in raw_cols else 0,
                           key=f"w_lon_{sfx}", help="Auto-detect finds lon/lng/longitude, x, a geometry or quadkeys.")
        lat = st.selectbox("Latitude column", opts, index=opts.index(base.lat) if base.lat in raw_cols else 0,
                           key=f"w_lat_{sfx}", help="Auto-detect finds lat/latitude, y, a geometry or quadkeys.")
    lon_arg, lat_arg = (None if lon == AUTO else lon), (None if lat == AUTO else lat)
    if (lon_arg is None) != (lat_arg is None):
        st.info("Choose both a Longitude column and a Latitude column (or set both to auto-detect).")
        return None
    try:
        ins = cache.st_inspect(source, lon_arg, lat_arg)
    except GPCoreError as exc:
        st.error(f"**{md_text(name)}** cannot be used yet: {md_text(for_page(exc))}")
        st.caption("The previous data set and all runs are kept.")
        return None
    with c1:
        st.caption(f"Coordinates: {md_code(ins.lon or '?')} / {md_code(ins.lat or '?')}" if ins.lon else
                   "Coordinates from the file's geometry or quadkeys.")
    cols = ins.columns
    numeric = ins.numeric
    if not numeric:
        st.error("The file has no numeric column to model besides the coordinates; add one (e.g. a speed or a "
                 "concentration).")
        return None
    default_y = base.y if base.y in numeric else ins.default_target()
    with c2:
        y = st.selectbox("Target column", numeric, index=numeric.index(default_y), key=f"w_y_{sfx}",
                         help="Number columns that are not coordinates; a few text cells are dropped (listed below).")
        note = ins.profiles[y].drop_note() if y in ins.profiles else ""
        if note:
            st.warning(note + ".")
        w_opts = [NONE, *[c for c in numeric if c != y]]
        weight = st.selectbox("Weight column (optional)", w_opts,
                              index=w_opts.index(base.weight) if base.weight in w_opts else 0, key=f"w_weight_{sfx}",
                              help="Measurements behind each value (Ookla: tests): a row's noise is "
                                   "tau^2 + sigma^2 / w, both learned; metrics get bins 1, 2-4, 5-16, >16.")
    c3, c4 = st.columns(2)
    with c3:
        t_opts = [AUTO, NONE, *cols]
        t_index = t_opts.index(base.time) if base.time in cols else 0
        time = st.selectbox("Time column (optional)", t_opts, index=t_index, key=f"w_time_{sfx}",
                            help=f"Auto-detected: {ins.time or 'none'}")
        time_col = ins.time if time == AUTO else (None if time == NONE else time)
        quarter = None
        if time_col:
            periods = ["all", *sorted({q[:4] for q in ins.quarters}), *ins.quarters]
            default_q = base.quarter if base.quarter in periods else (
                SAMPLES[base.sample_key].default_quarter if base.sample_key in SAMPLES else None) or "all"
            if default_q not in periods:
                default_q = "all"
            q = st.selectbox("Period", periods, index=periods.index(default_q), key=f"w_quarter_{sfx}",
                             help="A year keeps its four quarters; 'all' keeps every record.")
            # a bundled sample with a default period (Puerto Rico: 2023) reads only that one without a period, so
            # "all" is passed on as "all" there; for a file no period already means every record
            sample_default = SAMPLES[base.sample_key].default_quarter if base.sample_key in SAMPLES else None
            quarter = (q if sample_default else None) if q == "all" else q
    with c4:
        default_t = base.transform if base.transform in TRANSFORMS else default_transform(ins.profiles.get(y))
        transform = st.selectbox("Target transform", TRANSFORMS, index=TRANSFORMS.index(default_t),
                                 key=f"w_tr_{sfx}_{y}",
                                 help="Models train on the transformed target; maps show the original units. "
                                 "log10 is the default for positive speeds, prices and counts.")
    strata_cols = [c for c in cols if c not in cache.INTERNAL_COLUMNS and c not in (ins.lon, ins.lat)]
    strata = strata_picker(base, strata_cols, sfx)
    if strata is False:
        return None
    return state.DatasetSpec(
        source=source,
        quarter=quarter,
        y=y,
        transform=transform,
        lon=lon_arg,
        lat=lat_arg,
        weight=None if weight == NONE else weight,
        time=None if time in (AUTO, NONE) else time,
        strata=strata,
    )


def strata_picker(base: state.DatasetSpec, cols: list[str], sfx: str):
    """The strata source; returns the ``strata`` string, None, or False when an upload is unusable."""
    kinds = list(STRATA_KINDS)
    kind = st.radio("Strata (urban / rural split for the metrics and violins)", kinds,
                    index=kinds.index(_strata_kind(base)), format_func=STRATA_KINDS.get, key=f"w_strata_{sfx}")
    if kind == "none":
        return None
    if kind == "county_metro":
        return "county_metro"
    if kind == "column":
        current = base.strata.split(":", 1)[1] if base.strata and base.strata.startswith("column:") else None
        default = current if current in cols else ("county_metro" if "county_metro" in cols else cols[0])
        col = st.selectbox("Strata column", cols, index=cols.index(default), key=f"w_strata_col_{sfx}")
        return f"column:{col}"
    up = st.file_uploader("Polygon layer (GeoJSON, GeoPackage, zipped Shapefile)",
                          type=["geojson", "json", "gpkg", "zip", "parquet"], key="w_strata_upload")
    if up is None:
        if base.strata and base.strata.startswith("polygons:"):
            return base.strata
        st.info("Upload a polygon layer, e.g. Census urban areas.")
        return False
    ref = uploads.save_upload(up.name, up.getvalue())
    try:
        from gpcore.data import read_polygons

        read_polygons(uploads.resolve_upload(ref))
    except GPCoreError as exc:
        uploads.discard_upload(ref)
        st.error(f"**{md_text(up.name)}** cannot be used as strata: {md_text(exc)}")
        return False
    return f"polygons:{ref}"


def load_button(spec: state.DatasetSpec | None, active: state.DatasetSpec) -> None:
    changed = spec is not None and spec != active
    if st.button("Use this data set", type="primary", disabled=not changed, key="w_load_data"):
        try:
            cache.st_load_dataset(spec)
        except GPCoreError as exc:
            st.error(md_text(exc))
            st.caption("The previous data set and all runs are kept.")
            return
        state.update(dataset=spec, xref=None, flash=f"Loaded {spec.label()}.")
        st.rerun()
    if not changed and spec is not None:
        st.caption("These settings are the active data set.")


def summary(data: cache.LoadedData) -> None:
    rep = data.report
    st.subheader(md_text(data.spec.label()))
    c = st.columns(4)
    c[0].metric("Rows used", f"{data.n:,}")
    c[1].metric("Rows read", f"{getattr(rep, 'rows_read', data.n):,}")
    dropped = sum(d.count for d in getattr(rep, "dropped", []) or [])
    c[2].metric("Rows dropped", f"{dropped:,}")
    c[3].metric("Strata", f"{len(data.strata_counts) or '–'}", help="groups used for per-stratum metrics")
    st.markdown(f"Target {md_code(data.spec.y)} ({data.units or 'units unknown'}), "
                f"transform {md_code(data.spec.transform)}")
    if rep is not None and rep.dropped:
        st.markdown("**Dropped rows and why**")
        st.dataframe(
            pd.DataFrame([{"rows": d.count, "reason": d.reason, "first rows": ", ".join(map(str, d.rows))}
                          for d in rep.dropped]),
            hide_index=True, width="stretch",
        )
    counts = data.strata_counts
    if counts:
        label = data.frame.attrs.get("strata_label", "strata")
        total = sum(counts.values()) or 1
        st.markdown(f"**Strata** — {md_text(label)}")
        st.dataframe(
            pd.DataFrame([{"stratum": k, "points": v, "share": f"{100 * v / total:.1f}%"} for k, v in counts.items()]),
            hide_index=True, width="stretch",
        )
    with st.expander("Read report", expanded=False):
        st.code(rep.to_text() if rep is not None else "(no report)", language=None)


#: the width (px) the measurement map's first view fits the region into: its column is about 530 px wide in a 1,400 px
#: window, and pydeck's view cannot follow the width it is drawn at (the grid maps' component does)
MAP_WIDTH_PX = 480


def measurement_map(data: cache.LoadedData) -> None:
    scale, title = mapview.measurement_scale(data, "viridis")
    region_json, bounds = cache.st_region_outline(data.state, data.data_hash, _frame=data.frame)
    deck = mapview.points_deck(data, scale, mapview.outline_layers(region_json, None), bounds=bounds,
                                width_px=MAP_WIDTH_PX)
    st.pydeck_chart(deck, height=deck.map_height, key="data_map")
    st.html(legend_html(scale, title))
    note = cache.map_sample_note(data.n)
    if note:
        st.caption(note)
    if data.spec.sample_key:
        from gpcore.data import SAMPLES

        info = SAMPLES.get(data.spec.sample_key)
        if info is not None and info.attribution:
            st.caption(info.attribution)


def render(data: cache.LoadedData, runs: list) -> None:
    """The Data page: choose the active data set (the sidebar shows it); ``runs`` are not needed here."""
    st.title("Data")
    flash = state.take("flash")
    if flash:
        st.success(flash)
    active = data.spec
    left, right = st.columns([2, 3], gap="large")
    with left:
        st.subheader("Choose a data set")
        source = source_picker(active)
        spec = column_mapping(source, active) if source else None
        load_button(spec, active)
    with right:
        summary(data)
        measurement_map(data)

