"""Session state of the dashboard and its mirror in the URL (``st.query_params``).

What defines a view lives in a few canonical session keys (never widget keys, which Streamlit
drops when a page stops drawing the widget):

* ``ua_dataset`` — the active :class:`DatasetSpec` (query params ``data``, ``quarter``, ``y``,
  ``transform``, ``strata``, ``lon``, ``lat``, ``weight``, ``time``);
* ``ua_run`` / ``ua_run2`` — the run shown on Maps / Export and the optional second run (``run``, ``run2``);
* ``ua_xref`` — the kernel-slice reference point ``(lon, lat)`` (``xref=lon,lat``);
* ``ua_map`` — which map is shown (``map=mean|width|data|exceed``);
* ``ua_threshold`` — the Decide page's threshold in original units (also drawn as P(below) on Maps).

:func:`init_session` reads the URL once per session; :func:`sync_query` writes the state back
after every run, so a copied URL reopens the same view.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import streamlit as st

from gpcore.errors import GPCoreError

DEFAULT_SAMPLE = "puerto_rico"
MAP_KINDS = ("mean", "width", "data", "exceed")
UPLOAD_PREFIX = "upload:"
SAMPLE_PREFIX = "sample:"


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
    weight: str | None = None
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
        from gpcore.data import SAMPLES

        if self.sample_key in SAMPLES:
            base = SAMPLES[self.sample_key].label.split(",")[0]
        else:
            base = self.file_name
        period = f", {self.quarter}" if self.quarter else ""
        return f"{base}{period}"

    # ------------------------------------------------------------------ gpcore
    def run_config(self, model: str = "dbk", settings: dict | None = None, **run) -> object:
        """The :class:`gpcore.runs.RunConfig` of a run on this data set."""
        from gpcore.runs import RunConfig

        fields = dict(
            data=self.source if self.sample_key else str(source_path(self.source)),
            y=self.y,
            model=model,
            settings=dict(settings or {}),
            x=(self.lon, self.lat) if self.lon and self.lat else None,
            transform=self.transform,
            quarter=self.quarter,
            weight=self.weight,
            strata=self._strata_arg(),
            **run,
        )
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
            strata="county_metro",
        )


# ---------------------------------------------------------------------------------------------
# uploads: content-addressed files under the run store
# ---------------------------------------------------------------------------------------------


def uploads_dir() -> Path:
    from gpcore.store import default_store_dir

    return default_store_dir() / "_uploads"


_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")
_UPLOAD_REF = re.compile(r"[0-9a-f]{16}/[A-Za-z0-9_.-]{1,200}")


#: Longest stored upload name (file systems allow 255 bytes; the suffix is kept).
MAX_UPLOAD_NAME = 120
#: Uploads kept in ``_uploads`` (MB, newest kept; ``UA_UPLOAD_CACHE_MB`` overrides).
UPLOAD_CACHE_MB = 2048


def safe_upload_name(name: str) -> str:
    """A file name made of ``[A-Za-z0-9_.-]``, at most :data:`MAX_UPLOAD_NAME` characters, suffix kept."""
    safe = _SAFE.sub("_", Path(str(name)).name).strip("._") or "upload"
    if len(safe) > MAX_UPLOAD_NAME:
        stem, dot, suffix = safe.rpartition(".")
        suffix = suffix[:16] if dot and stem else ""
        safe = safe[: MAX_UPLOAD_NAME - len(suffix) - 1].rstrip("._") + ("." + suffix if suffix else "")
    return safe


def save_upload(name: str, data: bytes) -> str:
    """Store uploaded bytes once (by content digest); return the ``upload:<digest>/<name>`` reference.

    The store is a size-capped cache (:func:`prune_uploads`); a file that fails validation is removed
    again with :func:`discard_upload`.
    """
    digest = hashlib.sha256(data).hexdigest()[:16]
    safe = safe_upload_name(name)
    folder = uploads_dir() / digest
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / safe
    if not path.exists():
        tmp = folder / f".{safe}.{os.getpid()}.part"
        tmp.write_bytes(data)
        os.replace(tmp, path)
        prune_uploads(keep=folder)
    else:
        os.utime(folder)  # recently used: kept longest
    return f"{UPLOAD_PREFIX}{digest}/{safe}"


def discard_upload(ref: str) -> None:
    """Remove an upload that failed validation (its folder, when nothing else is in it)."""
    try:
        path = resolve_upload(ref)
    except GPCoreError:
        return
    path.unlink(missing_ok=True)
    try:
        path.parent.rmdir()
    except OSError:
        pass


def prune_uploads(keep: Path | None = None, cap_mb: float | None = None) -> list[str]:
    """Delete the least recently used upload folders until ``_uploads`` fits the cap; returns their digests."""
    cap = float(os.environ.get("UA_UPLOAD_CACHE_MB", UPLOAD_CACHE_MB) if cap_mb is None else cap_mb) * 1024**2
    root = uploads_dir()
    if not root.is_dir():
        return []
    folders = []
    for p in root.iterdir():
        if p.is_dir() and not p.is_symlink():
            size = sum(f.stat().st_size for f in p.iterdir() if f.is_file())
            folders.append((p.stat().st_mtime, size, p))
    total = sum(s for _, s, _ in folders)
    removed = []
    for _, size, p in sorted(folders, key=lambda t: t[0]):
        if total <= cap:
            break
        if keep is not None and p == keep:
            continue
        shutil.rmtree(p, ignore_errors=True)
        total -= size
        removed.append(p.name)
    return removed


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
        if value.startswith(UPLOAD_PREFIX) and _UPLOAD_REF.fullmatch(value[len(UPLOAD_PREFIX) :]):
            return
        raise DataError(
            f"the link's data={value[:80]!r} is not allowed: a link may name a bundled sample "
            f"({', '.join(SAMPLE_PREFIX + k for k in SAMPLES)}) or an uploaded file (upload:<digest>/<name>)"
        )
    if value == "county_metro" or value.startswith("column:"):
        return
    ref = value[len("polygons:") :] if value.startswith("polygons:") else ""
    if ref.startswith(UPLOAD_PREFIX) and _UPLOAD_REF.fullmatch(ref[len(UPLOAD_PREFIX) :]):
        return
    raise DataError(
        f"the link's strata={value[:80]!r} is not allowed: use county_metro, column:<NAME> or an uploaded "
        "polygon layer (polygons:upload:<digest>/<name>)"
    )


def resolve_upload(ref: str) -> Path:
    """File path of an ``upload:<digest>/<name>`` reference."""
    from gpcore.errors import DataError

    rel = ref[len(UPLOAD_PREFIX) :] if ref.startswith(UPLOAD_PREFIX) else ref
    digest, _, name = rel.partition("/")
    if not re.fullmatch(r"[0-9a-f]{16}", digest) or not name or "/" in name or name.startswith("."):
        raise DataError(f"'{ref}' is not an uploaded file reference")
    path = uploads_dir() / digest / name
    if not path.is_file():
        raise DataError(f"the uploaded file '{name}' is no longer on the server; upload it again")
    return path


# ---------------------------------------------------------------------------------------------
# session <-> URL
# ---------------------------------------------------------------------------------------------


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


def init_session() -> None:
    """Fill the canonical keys from the URL (first run of a session) or defaults."""
    ss = st.session_state
    if ss.get("ua_initialised"):
        return
    qp = st.query_params
    try:
        ss.ua_dataset = DatasetSpec.from_query(qp) or DatasetSpec.for_sample(DEFAULT_SAMPLE)
    except GPCoreError as exc:  # the URL names something links may not (see check_url_reference)
        ss.ua_url_error = str(exc)
        ss.ua_dataset = DatasetSpec.for_sample(DEFAULT_SAMPLE)
    ss.ua_run = qp.get("run") or None
    ss.ua_run2 = qp.get("run2") or None
    ss.ua_xref = parse_xref(qp.get("xref"))
    ss.ua_map = qp.get("map") if qp.get("map") in MAP_KINDS else "mean"
    ss.ua_initialised = True


def sync_query() -> None:
    """Write the canonical state to ``st.query_params`` (only when something changed)."""
    ss = st.session_state
    want: dict[str, str] = dict(ss.ua_dataset.to_query())
    if ss.get("ua_run"):
        want["run"] = ss.ua_run
    if ss.get("ua_run2"):
        want["run2"] = ss.ua_run2
    if ss.get("ua_xref"):
        want["xref"] = format_xref(ss.ua_xref)
    if ss.get("ua_map", "mean") != "mean":
        want["map"] = ss.ua_map
    current = {k: st.query_params.get(k) for k in st.query_params}
    if current != want:
        st.query_params.from_dict(want)


def set_dataset(spec: DatasetSpec) -> None:
    st.session_state.ua_dataset = spec


def dataset() -> DatasetSpec:
    return st.session_state.ua_dataset


_MISSING = object()


def bound(widget, label: str, *args, state_key: str, key: str, valid=lambda v: True, **kwargs):
    """Draw ``widget(label, *args, key=key, ...)`` bound to the canonical session key ``state_key``.

    One source of truth per value: the user's change reaches the canonical key in the widget's
    ``on_change`` callback (and the URL at the end of the rerun: query parameters set inside a callback
    do not reach the browser), which Streamlit runs *before* the script reruns, so nothing can
    overwrite it. The widget is seeded from the canonical key only when they differ — on its first draw
    on a page (Streamlit drops a widget's key when a page stops drawing it) or after another widget
    bound to the same value (the sidebar's and the Maps page's run selectors) changed it. A value the
    widget cannot show (``valid`` false: a deleted run) is not seeded; the widget's own default then
    becomes the canonical value. Deselecting a segmented control keeps the current value.
    """
    ss = st.session_state
    canonical = ss.get(state_key)
    if canonical is not None and valid(canonical) and ss.get(key, _MISSING) != canonical:
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
    if ss.get(state_key) != value:
        ss[state_key] = value
    return value
