"""The dashboard's view state: one typed accessor over ``st.session_state`` and its mirror in the URL.

Every ``ua_*`` session key is a field of :class:`ViewState` (the key is ``"ua_" + field name``): its
default, the widget that controls it (if any), the values it may take and the URL query parameter that
mirrors it (if any). Pages read a frozen snapshot (:func:`view`), write with :func:`update` (unknown
names and values outside a field's choices are errors) and draw every control bound to a field with
:func:`control`; no other module spells a session key.

The URL mirrors the data set (``data``, ``quarter``, ``y``, ``transform``, ``strata``, ``lon``, ``lat``,
``weight``, ``time``: :class:`DatasetSpec`), the active run and the second run (``run``, ``run2``), the
kernel-slice reference point (``xref=lon,lat``), the map kind (``map=mean|width|data|exceed|change``) and, for a
run with time as an input, the quarter of the maps and of Decide (``at=2023Q4``) and the Change map's quarters
(``from``, ``to``).
:func:`init_session` reads the URL once per session; :func:`sync_query` writes the state back after
every run, so a copied URL reopens the same view.
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import streamlit as st

from app.uploads import is_reference, resolve_upload
from gpcore.errors import GPCoreError

DEFAULT_SAMPLE = "puerto_rico"
MAP_KINDS = ("mean", "width", "data", "exceed", "change")  # change: runs with time as an input only
SAMPLE_PREFIX = "sample:"


def data_name(source: str) -> str:
    """A data source in words: a bundled sample's short label (``"sample:puerto_rico"`` → ``"Puerto Rico - Ookla
    mobile"``), else the file's name (of a ``DatasetSpec.source`` or of a run configuration's ``data`` path)."""
    from pathlib import PurePath

    from gpcore.data import SAMPLES

    key = source[len(SAMPLE_PREFIX):] if source.startswith(SAMPLE_PREFIX) else None
    return SAMPLES[key].label.split(",")[0] if key in SAMPLES else PurePath(source).name


@dataclass(frozen=True)
class DatasetSpec:
    """Everything that defines the active data set (mirrors the data part of ``RunConfig``).

    ``source`` is ``"sample:<key>"`` or ``"upload:<digest>/<file name>"`` (a file saved in the run
    store's ``_uploads`` folder, so a URL can name it). ``strata`` is ``None``, ``"county_metro"``,
    ``"column:<NAME>"`` or ``"polygons:upload:<digest>/<name>"``.
    """

    source: str = SAMPLE_PREFIX + DEFAULT_SAMPLE
    quarter: str | None = "2023"
    y: str = "download_mbps"
    transform: str = "log10"
    lon: str | None = None
    lat: str | None = None
    weight: str | None = "tests"  # the sample's measurement counts: weighted fits are the better default
    time: str | None = None
    strata: str | None = "county_metro"

    # ------------------------------------------------------------------ naming
    @property
    def sample_key(self) -> str | None:
        return self.source[len(SAMPLE_PREFIX) :] if self.source.startswith(SAMPLE_PREFIX) else None

    @property
    def file_name(self) -> str:
        if self.sample_key:
            return self.sample_key
        return self.source.rsplit("/", 1)[-1]

    def label(self) -> str:
        period = f", {self.quarter}" if self.quarter else ""
        return f"{data_name(self.source)}{period}"

    # ------------------------------------------------------------------ gpcore
    def run_config(self, model: str | None = None, settings: dict | None = None, **run) -> object:
        """The :class:`gpcore.run.config.RunConfig` of a run on this data set (``model`` default: DEFAULT_MODEL);
        ``run`` holds the other RunConfig fields (a run with time as an input also its own ``quarter`` range)."""
        from gpcore.models import DEFAULT_MODEL
        from gpcore.run.config import RunConfig

        fields = {
            "data": self.source if self.sample_key else str(source_path(self.source)),
            "y": self.y,
            "model": model or DEFAULT_MODEL,
            "settings": dict(settings or {}),
            "x": (self.lon, self.lat) if self.lon and self.lat else None,
            "transform": self.transform,
            "quarter": self.quarter,
            "weight": self.weight,
            "strata": self._strata_arg(),
            **run,
        }
        if self.time and "time" in RunConfig.__dataclass_fields__:  # needs RunConfig.time (see app/README.md)
            fields["time"] = self.time
        return RunConfig(**fields)

    def _strata_arg(self) -> str | None:
        """The RunConfig ``strata``: polygon layers only as ``upload:`` or ``file:`` references (never a bare path)."""
        if self.strata and self.strata.startswith("polygons:"):
            return "polygons:" + str(source_path(self.strata[len("polygons:") :]))
        return self.strata

    # ------------------------------------------------------------------ URL
    def to_query(self) -> dict[str, str]:
        default = DatasetSpec()
        out = {"data": self.source}
        for key, value in asdict(self).items():
            if key == "source":
                continue
            if value != getattr(default, key) or key in ("quarter", "y"):
                out[key] = "" if value is None else str(value)
        return out

    @classmethod
    def from_query(cls, qp) -> DatasetSpec | None:
        """The spec a URL names (None without ``data``). URL parameters may name bundled samples and
        uploads only: any other data source or polygon layer raises :class:`DataError` (never a server path)."""
        source = qp.get("data")
        if not source:
            return None
        check_url_reference("data", source)
        if qp.get("strata"):
            check_url_reference("strata", qp.get("strata"))
        base = cls.for_sample(source[len(SAMPLE_PREFIX) :]) if source.startswith(SAMPLE_PREFIX) else cls(source=source)
        changes = {}
        for key in ("quarter", "y", "transform", "lon", "lat", "weight", "time", "strata"):
            if key in qp:
                value = qp.get(key)
                changes[key] = value if value not in ("", "None") else None
        if changes.get("y") is None and "y" in changes:
            changes.pop("y")
        if changes.get("transform") is None and "transform" in changes:
            changes.pop("transform")
        return replace(base, **changes)

    @classmethod
    def for_sample(cls, key: str) -> DatasetSpec:
        """The default spec of a bundled sample (its target, transform, default quarter, county strata)."""
        from gpcore.data import SAMPLES

        info = SAMPLES.get(key)
        if info is None:
            return cls(source=SAMPLE_PREFIX + key)
        return cls(
            source=SAMPLE_PREFIX + key,
            quarter=info.default_quarter,
            y=info.target,
            transform=info.transform,
            weight=info.weight,
            strata="county_metro",
        )


def source_path(source: str) -> Path:
    """File path of an ``upload:`` reference or of a ``file:<path>`` source (runs made by the CLI)."""
    if source.startswith("file:"):
        return Path(source[len("file:") :])
    return resolve_upload(source)


def check_url_reference(param: str, value: str) -> None:
    """The path policy of URL parameters: ``data`` names a bundled sample or an upload; ``strata`` is
    ``county_metro``, ``column:<NAME>`` or ``polygons:upload:<digest>/<name>``. Anything else (a server
    path, ``file:``) raises :class:`DataError` without touching the file system."""
    from gpcore.data import SAMPLES
    from gpcore.errors import DataError

    if param == "data":
        if value.startswith(SAMPLE_PREFIX) and value[len(SAMPLE_PREFIX) :] in SAMPLES:
            return
        if is_reference(value):
            return
        raise DataError(
            f"the link's data={value[:80]!r} is not allowed: a link may name a bundled sample "
            f"({', '.join(SAMPLE_PREFIX + k for k in SAMPLES)}) or an uploaded file (upload:<digest>/<name>)"
        )
    if value == "county_metro" or value.startswith("column:"):
        return
    ref = value[len("polygons:") :] if value.startswith("polygons:") else ""
    if is_reference(ref):
        return
    raise DataError(
        f"the link's strata={value[:80]!r} is not allowed: use county_metro, column:<NAME> or an uploaded "
        "polygon layer (polygons:upload:<digest>/<name>)"
    )


def parse_xref(text: str | None) -> tuple[float, float] | None:
    """``"lon,lat"`` -> ``(lon, lat)`` (None when malformed or out of range)."""
    if not text:
        return None
    try:
        lon, lat = (float(v) for v in str(text).split(","))
    except ValueError:
        return None
    if not (-180 <= lon <= 180 and -90 <= lat <= 90):
        return None
    return lon, lat


def format_xref(xref) -> str:
    return f"{xref[0]:.5f},{xref[1]:.5f}"


def parse_quarter_label(text: str | None) -> str | None:
    """``"2023Q4"`` as written in a link (None when it is not a quarter label)."""
    import re

    text = str(text or "").strip().upper()
    return text if re.fullmatch(r"\d{4}Q[1-4]", text) else None




# ---------------------------------------------------------------------------------------------
# the view state
# ---------------------------------------------------------------------------------------------

PREFIX = "ua_"


def _key(default: Any = None, *, widget: str | None = None, query: str | None = None,
         choices: tuple | None = None) -> Any:
    """A :class:`ViewState` field: its default, controlling widget key, URL parameter and allowed values."""
    return field(default=default, metadata={"widget": widget, "query": query, "choices": choices})


@dataclass(frozen=True)
class ViewState:
    """Every value the dashboard keeps between reruns, read as one frozen snapshot (:func:`view`).

    A field ``name`` lives in the session key ``"ua_" + name``; a field with a ``widget`` is drawn only
    by :func:`control` under that widget key; a field with a ``query`` is mirrored in the URL.
    """

    # what a link reopens (mirrored in the URL)
    dataset: DatasetSpec | None = _key(query="data")  # the active data set; set by init_session
    run: str | None = _key(widget="w_sidebar_run", query="run")  # the one run picker: the sidebar's
    run2: str | None = _key(widget="w_maps_run2", query="run2")  # Maps: the second run side by side
    xref: tuple[float, float] | None = _key(query="xref")  # Maps: the kernel-slice reference point
    map: str = _key("mean", widget="w_map_kind", query="map", choices=MAP_KINDS)
    # a run with time as an input: the quarter every map and the Decide page show (the slider), and the Change
    # map's quarters; None until a time run is shown (then its latest quarter, or the first for change_from)
    at: str | None = _key(widget="w_quarter", query="at")
    change_from: str | None = _key(widget="w_change_from", query="from")
    change_to: str | None = _key(widget="w_change_to", query="to")
    slice_at: str = _key("", widget="w_slice_at")  # the quarter the kernel slice is shown at ("" = the slider's)
    # Maps controls
    scale: str = _key("viridis", widget="w_scale")
    slice_mode: str = _key("kernel", widget="w_slice_mode", choices=("kernel", "correlation", "max"))
    width_units: str = _key("model", widget="w_width_units", choices=("model", "original"))
    strata_outline: bool = _key(False, widget="w_strata_outline")
    basemap: bool = _key(False, widget="w_basemap")
    side: bool = _key(False, widget="w_side")
    shared_scale: bool = _key(True, widget="w_shared_scale")
    # Decide (the threshold is also drawn as P(below) on Maps)
    threshold: float | None = _key(widget="w_decide_threshold")
    threshold_run: str | None = _key()  # the run the threshold was defaulted for
    direction: str = _key("below", widget="w_decide_direction", choices=("below", "above"))
    areas: str = _key("counties", widget="w_decide_areas", choices=("counties", "strata"))
    area_weights: str = _key("uniform", widget="w_decide_weights", choices=("uniform", "area"))
    decide_area: str | None = _key()  # the area whose posterior is shown (a click on the choropleth)
    sample_seed: int = _key(0, widget="w_decide_seed")
    sites_k: int = _key(10, widget="w_decide_k")
    sites_target: str = _key("all", widget="w_decide_target")
    sites_min_km: float = _key(0.0, widget="w_decide_min_km")
    decide_request: tuple | None = _key()  # (k, target, min_km) the suggestions are computed for
    # Compare
    cmp_split: str | None = _key(widget="w_cmp_split")
    # session bookkeeping
    job: Any = _key()  # the session's app.jobs.TrainingJob
    job_seen: bool = _key(False)  # the progress panel saw the job end (one full rerun)
    job_selected: bool = _key(False)  # the finished job's run was made the active run once
    flash: str | None = _key()  # a message shown once on the next rerun of the Data page
    url_error: str | None = _key()  # why the link's data set was refused (shown once)
    initialised: bool = _key(False)
    page: str | None = _key()  # the URL path of the page this run draws (set by main.py after st.navigation)
    drawn_on: tuple = _key(())  # (field, page) pairs: the page each control was last drawn on (see control)
    script_ms: float | None = _key()  # server time of the last script run (read by benchmarks/bench_app.py)


FIELDS = {f.name: f for f in fields(ViewState)}


def session_key(name: str) -> str:
    """The session key of field ``name`` (``KeyError`` for a name that is not a field)."""
    return PREFIX + FIELDS[name].name


def widget_key(name: str) -> str:
    """The key of the widget that controls field ``name``."""
    key = FIELDS[name].metadata["widget"]
    if key is None:
        raise KeyError(f"no widget controls the view-state field {name!r}")
    return key


def _default(f) -> Any:
    return None if f.default is MISSING else f.default


def view() -> ViewState:
    """A snapshot of the view state (defaults where a key is not set)."""
    ss = st.session_state
    return ViewState(**{name: ss.get(PREFIX + name, _default(f)) for name, f in FIELDS.items()})


def _check(name: str, value: Any) -> None:
    if name not in FIELDS:
        raise KeyError(f"{name!r} is not a view-state field; fields: {', '.join(FIELDS)}")
    choices = FIELDS[name].metadata["choices"]
    if choices is not None and value is not None and value not in choices:
        raise ValueError(f"view-state field {name!r} cannot be {value!r}; allowed: {', '.join(choices)}")


def update(**changes: Any) -> None:
    """Set view-state fields (checked against :class:`ViewState`: names and choices)."""
    for name, value in changes.items():
        _check(name, value)
        st.session_state[PREFIX + name] = value


def take(name: str) -> Any:
    """Read a field and reset it to its default (messages shown once)."""
    return st.session_state.pop(session_key(name), _default(FIELDS[name]))


def dataset() -> DatasetSpec:
    return view().dataset


_MISSING = object()


def control(widget, label: str, *args, name: str, valid=None, **kwargs):
    """Draw ``widget(label, *args, ...)`` as the control of view-state field ``name``; returns its value.

    One source of truth per value: the widget's key comes from :class:`ViewState`; the user's change
    reaches the session key in the widget's ``on_change`` callback (and the URL at the end of the rerun:
    query parameters set inside a callback do not reach the browser), which Streamlit runs *before* the
    script reruns, so nothing can overwrite it. The widget is seeded from the field (its default until
    set) only when they differ: on its first draw on a page (Streamlit drops a widget's key when a page
    stops drawing it) or after a callback changed the field. A value the widget cannot show (``valid``
    false, e.g. a deleted run; by default: outside the field's choices) is not seeded; the widget's own
    first option then becomes the field's value. Deselecting a segmented control keeps the current value.
    """
    ss = st.session_state
    state_key, key = session_key(name), widget_key(name)
    if valid is None:
        choices = FIELDS[name].metadata["choices"]
        valid = (lambda v: True) if choices is None else choices.__contains__
    canonical = ss.get(state_key, _default(FIELDS[name]))
    if canonical is not None and valid(canonical) and (_moved(name) or ss.get(key, _MISSING) != canonical):
        ss[key] = canonical

    def changed() -> None:
        value = ss.get(key)
        if value is None and ss.get(state_key) is not None:
            ss[key] = ss[state_key]  # a click on the selected option of a segmented control
            return
        ss[state_key] = value  # the URL follows at the end of this rerun (main.py: sync_query)

    value = widget(label, *args, key=key, on_change=changed, **kwargs)
    if value is None:
        value = ss.get(state_key)
    if ss.get(state_key, _MISSING) != value:
        ss[state_key] = value
    return value


def _moved(name: str) -> bool:
    """Whether field ``name``'s control is drawn on another page than last time (and note this page).

    Streamlit gives a widget on each page its own identity, so a control two pages share (the quarter slider on
    Maps, Decide and Export) holds, right after a page switch, the value of the other page's widget under its key:
    it reads as set, but the new page's widget would start at its first option. Such a control is seeded again."""
    ss = st.session_state
    page = ss.get(session_key("page"))
    drawn = dict(ss.get(session_key("drawn_on"), ()))
    if name in drawn and drawn[name] == page:
        return False
    drawn[name] = page
    ss[session_key("drawn_on")] = tuple(sorted(drawn.items(), key=lambda kv: kv[0]))
    return True


def on_page(path: str) -> None:
    """Note the page this run draws (``main.py``, after ``st.navigation``): :func:`control` seeds a control again on
    a page other than the one it was last drawn on."""
    update(page=path)


# ---------------------------------------------------------------------------------------------
# view state <-> URL
# ---------------------------------------------------------------------------------------------

#: URL codecs of the fields that are not plain strings: ``(parse, format)``.
_CODECS = {"xref": (parse_xref, format_xref), "at": (parse_quarter_label, str),
           "change_from": (parse_quarter_label, str), "change_to": (parse_quarter_label, str)}


def init_session() -> None:
    """Fill the URL-mirrored fields from the URL (first run of a session) or their defaults."""
    if view().initialised:
        return
    qp = st.query_params
    try:
        spec = DatasetSpec.from_query(qp) or DatasetSpec.for_sample(DEFAULT_SAMPLE)
    except GPCoreError as exc:  # the URL names something links may not (see check_url_reference)
        update(url_error=str(exc))
        spec = DatasetSpec.for_sample(DEFAULT_SAMPLE)
    changes: dict[str, Any] = {"dataset": spec}
    for name, f in FIELDS.items():
        param = f.metadata["query"]
        if param is None or name == "dataset":
            continue
        parse = _CODECS.get(name, (lambda v: v or None, None))[0]
        value = parse(qp.get(param))
        choices = f.metadata["choices"]
        changes[name] = value if value is not None and (choices is None or value in choices) else _default(f)
    changes["side"] = bool(changes["run2"])
    update(**changes, initialised=True)


def sync_query() -> None:
    """Write the URL-mirrored fields to ``st.query_params`` (only when something changed)."""
    v = view()
    want: dict[str, str] = dict(v.dataset.to_query())
    for name, f in FIELDS.items():
        param = f.metadata["query"]
        value = getattr(v, name)
        if param is None or name == "dataset" or value is None or value == _default(f):
            continue
        show = _CODECS.get(name, (None, str))[1]
        want[param] = show(value)
    current = {k: st.query_params.get(k) for k in st.query_params}
    if current != want:
        st.query_params.from_dict(want)
