"""What a read did: :class:`ReadReport`, attached to every frame as ``gdf.attrs["report"]``.

Row numbers in reports and error messages are the ones a user sees: 1-based data rows (1 = the
first row after a CSV header, or the first feature of a layer).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

#: How many example rows or values a message shows.
MAX_EXAMPLES = 5
ROWS_NOTE = "1-based data rows"


def rows_text(rows, total: int | None = None) -> str:
    """``"rows 3, 8, 15 and 9 more"`` for 1-based row numbers (at most :data:`MAX_EXAMPLES` shown)."""
    rows = [int(r) for r in np.asarray(rows).ravel()[:MAX_EXAMPLES]]
    total = len(rows) if total is None else int(total)
    if total == 0:
        return "no rows"
    word = "row" if total == 1 else "rows"
    shown = ", ".join(str(r) for r in rows)
    more = f" and {total - len(rows)} more" if total > len(rows) else ""
    return f"{word} {shown}{more}"


def values_text(values) -> str:
    """``"'n/a', '12,5'"``: distinct example values, quoted, at most :data:`MAX_EXAMPLES`."""
    seen: list[str] = []
    for v in values:
        r = repr(v)
        if r not in seen:
            seen.append(r)
        if len(seen) == MAX_EXAMPLES:
            break
    return ", ".join(seen)


class JSONFields(dict):
    """Base of the dataclasses kept in ``DataFrame.attrs``: a dict of their own fields.

    ``DataFrame.to_parquet`` stores ``attrs`` with ``json.dumps``, which accepts dicts only; mirroring the
    fields into the dict keeps frames that carry a report or a grid layout savable (they come back as dicts).
    """

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            dict.__setitem__(self, f.name, getattr(self, f.name))

    def __setattr__(self, name, value) -> None:
        super().__setattr__(name, value)
        if name in self.__dataclass_fields__:
            dict.__setitem__(self, name, value)


@dataclass(eq=False)
class Dropped(JSONFields):
    """Rows removed for one reason: ``reason``, how many (``count``) and the first row numbers."""

    reason: str
    count: int
    rows: list[int] = field(default_factory=list)

    def __iter__(self):  # lets callers unpack ``reason, count, rows = d``
        return iter((self.reason, self.count, self.rows))


@dataclass(eq=False)
class ReadReport(JSONFields):
    """Summary of one :func:`gpcore.data.read_measurements` call.

    Attributes
    ----------
    file : str
        File name as given (or the upload's name).
    format : str
        ``"csv"``, ``"parquet"``, ``"geoparquet"``, ``"geojson"``, ``"gpkg"``, ``"shapefile"``, ``"table"``...
    rows_read, rows_kept : int
        Data rows in the file (after a layer was picked) and in the result.
    dropped : list of Dropped
        ``(reason, count, example_rows)`` per reason; includes rows outside a requested time period.
    columns : dict
        Columns picked: keys ``lon``, ``lat``, ``geometry``, ``target``, ``weight``, ``time`` (value None when unused).
    coordinates : str
        How locations were found, e.g. ``"columns 'lon'/'lat'"`` or ``"quadkey tile centres"``.
    crs_in : str
        CRS of the input (the result is always EPSG:4326).
    transform : str
        Target transform the target was validated for.
    notes : list of str
        Everything else worth knowing (assumptions, layers, fixes applied).
    """

    file: str
    format: str = ""
    rows_read: int = 0
    rows_kept: int = 0
    dropped: list[Dropped] = field(default_factory=list)
    columns: dict[str, str | None] = field(
        default_factory=lambda: dict.fromkeys(("lon", "lat", "geometry", "target", "weight", "time"))
    )
    coordinates: str = ""
    crs_in: str = ""
    transform: str = "identity"
    layer: str | None = None
    notes: list[str] = field(default_factory=list)
    target_summary: dict[str, float] | None = None
    strata: dict[str, int] | None = None
    strata_label: str | None = None

    def drop(self, reason: str, rows) -> None:
        """Record that the rows ``rows`` (1-based) were dropped for ``reason``."""
        rows = np.asarray(rows).ravel()
        if len(rows):
            self.dropped.append(Dropped(reason, int(len(rows)), [int(r) for r in rows[:MAX_EXAMPLES]]))

    def to_text(self) -> str:
        """A printable multi-line summary (what ``python -m gpcore data inspect`` shows)."""
        lines = [
            f"file:        {self.file}",
            f"format:      {self.format}" + (f" (layer '{self.layer}')" if self.layer else ""),
        ]
        lines.append(f"rows:        {self.rows_read} read, {self.rows_kept} kept")
        lines.append(f"coordinates: {self.coordinates}")
        lines.append(f"CRS:         {self.crs_in} -> EPSG:4326")
        picked = ", ".join(f"{k}={v!r}" for k, v in self.columns.items() if v)
        lines.append(f"columns:     {picked or '-'}")
        if self.columns.get("target"):
            lines.append(f"transform:   {self.transform}")
        if self.target_summary:
            s = self.target_summary
            lines.append("target:      " + ", ".join(f"{k} {v:.4g}" for k, v in s.items()))
        if self.dropped:
            lines.append("dropped:")
            for d in self.dropped:
                lines.append(
                    f"  - {d.count} {'row' if d.count == 1 else 'rows'}: {d.reason} ({rows_text(d.rows, d.count)})"
                )
        else:
            lines.append("dropped:     none")
        if self.strata is not None:
            label = f" [{self.strata_label}]" if self.strata_label else ""
            lines.append(f"strata{label}:")
            total = sum(self.strata.values()) or 1
            for k, v in self.strata.items():
                lines.append(f"  - {k}: {v} ({100 * v / total:.1f}%)")
        for note in self.notes:
            lines.append(f"note:        {note}")
        return "\n".join(lines)
