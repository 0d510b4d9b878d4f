"""The settings of a run: :class:`RunConfig`, validated when built, stored as ``run.json["config"]``."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from gpcore.errors import ConfigError, GPCoreError
from gpcore.models.registry import DEFAULT_MODEL

#: the split kinds of a run: rows at random, whole spatial blocks, or later quarters (docs/methods/spacetime.md)
SPLITS = ("random", "block", "forecast")


@dataclass(frozen=True)
class RunConfig:
    """Everything needed to reproduce a run. The UI builds it, :func:`gpcore.run.pipeline.execute_run` consumes it,
    ``run.json`` stores it.

    ``data`` is a file path or ``sample:<key>`` for bundled data (``sample:puerto_rico``).
    ``strata`` is ``None``, ``"county_metro"``, ``"column:<NAME>"`` or ``"polygons:<PATH>"``.
    ``region`` (grid extent) is ``"auto"`` (state boundary of a bundled sample, else the data's
    convex hull), ``"hull"``, ``"bbox"`` or ``"state:<CODE>"``.

    Time (docs/methods/spacetime.md): ``time_input=True`` makes the decimal year of the time column (``time``, or
    the one found) the last model input, one model over all the quarters read (``quarter`` may be a range
    ``"2019Q1:2022Q4"``; none reads every quarter, for a bundled sample too); a model with the ``space_time``
    setting gets ``"separable"`` unless its settings say otherwise. ``split="forecast"`` tests on the rows of
    ``test_period`` (``"2023Q1:2023Q4"``, read besides ``quarter``) and trains and validates on the quarters before
    it (:func:`gpcore.data.splits.forecast_split`).
    """

    data: str
    y: str
    model: str = DEFAULT_MODEL
    settings: dict = field(default_factory=dict)
    x: tuple[str, str] | None = None
    transform: str = "identity"
    quarter: str | None = None
    weight: str | None = None
    time: str | None = None
    strata: str | None = None
    split: str = "random"
    block_km: float = 10.0
    seed: int = 0
    allow_drop: bool = True
    grid_kind: str = "square"
    grid_cell_km: float = 0.0
    grid_zoom: int = 13
    grid_target_cells: int = 20000
    region: str = "auto"
    label: str = ""
    time_input: bool = False
    test_period: str | None = None

    def __post_init__(self):
        if self.split not in SPLITS:
            raise ConfigError(f"split={self.split!r} is not allowed; allowed values: 'random', 'block', 'forecast'")
        if not isinstance(self.time_input, bool):
            raise ConfigError(f"time_input={self.time_input!r} must be true or false")
        if self.test_period is not None:
            from gpcore.data.temporal import period_bounds

            if not isinstance(self.test_period, str):
                raise ConfigError(f"test_period={self.test_period!r} must be text like '2023Q1:2023Q4'")
            try:
                period_bounds(self.test_period, "test_period (--test-period)")
            except GPCoreError as e:
                raise ConfigError(str(e)) from None
        elif self.split == "forecast":
            raise ConfigError("split='forecast' needs the quarters to test on: test_period (--test-period), e.g. "
                              "'2023Q1:2023Q4'")
        if self.grid_kind not in ("square", "quadkey", "none"):
            raise ConfigError(f"grid_kind={self.grid_kind!r} is not allowed; allowed: 'square', 'quadkey', 'none'")
        if self.strata is not None and not (
            self.strata == "county_metro" or self.strata.startswith(("column:", "polygons:"))
        ):
            raise ConfigError(
                f"strata={self.strata!r} is not allowed; use 'county_metro', 'column:<NAME>' or 'polygons:<PATH>'"
            )
        for name in ("data", "y", "model", "transform", "region", "label"):
            if not isinstance(getattr(self, name), str):
                raise ConfigError(f"{name}={getattr(self, name)!r} must be text")
        if not isinstance(self.settings, dict):
            raise ConfigError(f"settings={self.settings!r} must be a mapping of model settings")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"seed={self.seed!r} is not allowed; use a whole number >= 0 (e.g. --seed 0)")
        for name, lo, strict in (("block_km", 0.0, True), ("grid_cell_km", 0.0, False)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < lo or (
                strict and v == lo
            ):
                raise ConfigError(f"{name}={v!r} is not allowed; use a finite number {'>' if strict else '>='} {lo:g}")
        if isinstance(self.grid_zoom, bool) or not isinstance(self.grid_zoom, int) or not 0 <= self.grid_zoom <= 24:
            raise ConfigError(f"grid_zoom={self.grid_zoom!r} is not allowed; use a quadkey zoom level 0..24")
        if not isinstance(self.grid_target_cells, int) or self.grid_target_cells < 1:
            raise ConfigError(f"grid_target_cells={self.grid_target_cells!r} is not allowed; use a count >= 1")
        from gpcore.models import model_spec

        model_spec(self.model)  # raises ConfigError for unknown models

    @classmethod
    def from_dict(cls, d: dict) -> RunConfig:
        if not isinstance(d, dict):
            raise ConfigError(f"a run configuration must be an object of settings, not {type(d).__name__}")
        allowed = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - allowed
        if unknown:
            raise ConfigError(f"unknown run setting(s) {sorted(unknown)}; allowed: {sorted(allowed)}")
        d = dict(d)
        if d.get("x") is not None:
            x = d["x"]
            if not isinstance(x, (list, tuple)) or len(x) != 2 or not all(isinstance(c, str) for c in x):
                raise ConfigError(f"x={x!r} must name two coordinate columns, e.g. ['lon', 'lat']")
            d["x"] = tuple(x)
        return cls(**d)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["x"] = list(self.x) if self.x else None
        return d

    def model_settings(self) -> dict:
        return {"seed": self.seed, **self.settings}


def fit_command(cfg: dict, out: str = "runs/reproduced") -> str:
    """The ``python -m gpcore fit`` command that reproduces a run configuration (``RunConfig.to_dict()``)."""
    parts = ["python -m gpcore fit", f"--data {cfg.get('data')}", f"--y {cfg.get('y')}"]
    if cfg.get("x"):
        parts.append(f"--x {','.join(cfg['x'])}")
    cfg = dict(cfg)
    if cfg.get("test_period") and cfg.get("split") != "forecast" and cfg.get("quarter"):
        cfg["quarter"] = f"{cfg['quarter']},{cfg['test_period']}"  # a compare run read the test period too
    for key, flag in (("transform", "--transform"), ("quarter", "--quarter"), ("weight", "--weight"),
                      ("time", "--time"), ("strata", "--strata")):
        if cfg.get(key) not in (None, "", "identity"):
            parts.append(f"{flag} {cfg[key]}")
    if cfg.get("time_input"):
        parts.append("--time-input")
    if cfg.get("split") == "forecast":
        parts.append(f"--split forecast --test-period {cfg.get('test_period')}")
    elif cfg.get("split", "random") != "random":
        parts.append(f"--split {cfg['split']} --block-km {cfg.get('block_km', 10.0):g}")
    parts.append(f"--seed {cfg.get('seed', 0)}")
    if cfg.get("grid_cell_km"):
        parts.append(f"--cell-km {cfg['grid_cell_km']:g}")
    parts.append(f"--model {cfg.get('model')}")
    for k, v in (cfg.get("settings") or {}).items():
        parts.append(f"--set {k}={v}")
    parts.append(f"--out {out}")
    return " \\\n    ".join(parts)
