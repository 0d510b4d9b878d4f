"""The Train page's "Time as an input" (issue 23): one model over several quarters of the active data set.

Offered when the data set holds more than one quarter (its time column). With the toggle on, the page asks for the
range of quarters (first / last, default all), the space-time covariance of a model that has the ``space_time``
setting (``vecchia``, ``dbk-nn``: separable or Gneiting, docs/methods/spacetime.md; any other model takes t as one
more input) and, for the forecast split, the test period (default the range's last 4 quarters, or its last one
when it has fewer than 6). The choices become RunConfig fields through
:func:`gpcore.run.timespan.time_run_fields`, whose errors name these controls; the run itself is built and
checked like every other run (:meth:`app.state.DatasetSpec.run_config`, ``RunConfig``, ``prepare``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import streamlit as st

from app import cache
from app.safe_html import md_code, md_text
from gpcore.errors import GPCoreError

#: how the page's time controls are named, in the page and in gpcore's messages about them
LABELS = {"first": "First quarter", "last": "Last quarter", "test_from": "Test from", "test_to": "Test to"}
COVARIANCES = {"separable": "separable (space × time)", "gneiting": "Gneiting (non-separable)"}
TEST_KEYS = ("w_test_from", "w_test_to")


@dataclass(frozen=True)
class TimePlan:
    """The time choices of a run: RunConfig fields, the model's ``space_time`` setting and the rows used."""

    fields: dict = field(default_factory=dict)  # time_input, quarter, split, test_period ({}: time is off)
    space_time: str | None = None  # for a model with the space_time setting
    rows: np.ndarray | None = None  # mask of the data set's rows in the range
    error: str | None = None  # a bad combination, worded for these controls
    span: str = ""  # the quarters of the run, "2023Q1–2023Q4"

    @property
    def label(self) -> str:
        """What the default run label adds: the quarters and, for the forecast split, the test period."""
        if not self.fields:
            return ""
        test = self.fields["test_period"]
        return f"time {self.span}" + (f" · forecast {test.replace(':', '–')}" if test else "")


@st.cache_data(show_spinner=False, max_entries=8)
def st_quarters(data_hash: str, _t: np.ndarray) -> list[str]:
    """The quarters (``"2023Q1"``, sorted) of the data set ``data_hash``, from its rows' decimal years ``_t``."""
    from gpcore.data.temporal import quarter_index, quarter_label

    t = np.asarray(_t, dtype=float)
    return [quarter_label(i) for i in np.unique(quarter_index(t[np.isfinite(t)]))]


def data_quarters(data: cache.LoadedData) -> list[str]:
    """The quarters of the active data set ([] without a time column)."""
    if "time_year" not in data.frame.columns:
        return []
    return st_quarters(data.data_hash, data.frame["time_year"].to_numpy(dtype=float))


def data_period(data: cache.LoadedData) -> str | None:
    """The period the data set was read with: its own, or for a bundled sample without one the sample's default
    quarter (what :func:`gpcore.run.pipeline.load_frame` reads for it)."""
    if data.spec.quarter or not data.spec.sample_key:
        return data.spec.quarter
    from gpcore.data import SAMPLES

    info = SAMPLES.get(data.spec.sample_key)
    return getattr(info, "default_quarter", None)


def _forget_test_period() -> None:
    """A new range re-seeds the test period with the range's default (:func:`test_period_controls`)."""
    for key in TEST_KEYS:
        st.session_state.pop(key, None)


def time_controls(data: cache.LoadedData, model: str) -> tuple[str, str, str | None] | None:
    """The "Time as an input" toggle and, with it on, the quarter range and the space-time covariance.

    Returns ``(first, last, space_time)`` with the toggle on (``space_time`` None for a model without that setting),
    None with it off or for a data set with fewer than 2 quarters (nothing is drawn then)."""
    from gpcore.models import available_models, model_spec

    quarters = data_quarters(data)
    if len(quarters) < 2:
        return None
    st.markdown("**Time**")
    on = st.toggle("Time as an input", value=False, key="w_time_input",
                   help=f"One model over the quarters of the data set ({quarters[0]}–{quarters[-1]}): its inputs are "
                        "lon, lat and t, the decimal year of each row's quarter. Maps then get a quarter slider and "
                        "a Change map; the forecast split tests on later quarters.")
    if not on:
        return None
    c = st.columns(3)
    first = c[0].selectbox(LABELS["first"], quarters, index=0, key="w_time_first", on_change=_forget_test_period)
    last = c[1].selectbox(LABELS["last"], quarters, index=len(quarters) - 1, key="w_time_last",
                          on_change=_forget_test_period)
    space_time = None
    if "space_time" in model_spec(model).cls.Config.field_names():
        space_time = c[2].selectbox("Space-time covariance", list(COVARIANCES), key="w_space_time",
                                    format_func=COVARIANCES.get,
                                    help="Separable: the spatial kernel times a time kernel. Gneiting: "
                                         "non-separable, the spatial range changes with the time lag "
                                         "(docs/methods/spacetime.md).")
    else:
        with_cov = [n for n in available_models() if "space_time" in model_spec(n).cls.Config.field_names()]
        c[2].caption(f"{md_code(model)} takes t as one more input, scaled like lon and lat; "
                     f"{', '.join(md_code(n) for n in with_cov)} have a space-time covariance.")
    return first, last, space_time


def test_period_controls(quarters: list[str], first: str, last: str) -> tuple[str, str]:
    """The forecast test period (default the range's last 4 quarters, or its last one when it has fewer than 6)."""
    from gpcore.run.timespan import default_test_period

    in_range = [q for q in quarters if first <= q <= last] or quarters
    for key, default in zip(TEST_KEYS, default_test_period(in_range), strict=True):
        if st.session_state.get(key) not in quarters:  # seeded once per range; then the user's pick stays
            st.session_state[key] = default
    c = st.columns(2)
    test_from = c[0].selectbox(LABELS["test_from"], quarters, key=TEST_KEYS[0],
                               help="The first quarter the run is tested on; it trains on the quarters before it.")
    test_to = c[1].selectbox(LABELS["test_to"], quarters, key=TEST_KEYS[1],
                             help="The last quarter the run is tested on.")
    return test_from, test_to


def plan(data: cache.LoadedData, choice: tuple[str, str, str | None] | None, split: str,
         test: tuple[str, str] | None = None) -> TimePlan:
    """The :class:`TimePlan` of the page's choices (``choice`` from :func:`time_controls`; None: time is off)."""
    if choice is None:
        return TimePlan()
    from gpcore.run.timespan import rows_in, time_run_fields

    first, last, space_time = choice
    try:
        fields = time_run_fields(data_quarters(data), first, last, split, *(test or (None, None)),
                                 period=data_period(data), names=LABELS)
    except GPCoreError as exc:
        return TimePlan(error=str(exc))
    rows = rows_in(data.frame["time_year"].to_numpy(dtype=float), first, last)
    return TimePlan(fields=fields, space_time=space_time, rows=rows, span=f"{first}–{last}")


def plan_note(plan: TimePlan) -> None:
    """Under the controls: what the run will read and test on, or what to change."""
    if plan.error is not None:
        st.error(md_text(plan.error[:1].upper() + plan.error[1:]), icon=":material/error:")
        return
    if not plan.fields:
        return
    n = int(plan.rows.sum()) if plan.rows is not None else 0
    text = f"One model over {plan.span} ({n:,} rows); inputs lon, lat and t (decimal years)."
    test = plan.fields["test_period"]
    if test:
        first = test.split(":")[0]
        text += f" Forecast: tested on {test.replace(':', '–')}, trained and validated on the quarters before {first}."
    st.caption(text)
