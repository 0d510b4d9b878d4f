"""One exception family per layer, all rooted at :class:`GPCoreError`.

* :class:`ConfigError` — an unknown or out-of-range model/run setting.
* :class:`InputError` — arrays handed to a model are unusable (NaN, wrong shape, ...).
* :class:`DataError` — a file or table a user brought cannot be used (raised by ``gpcore.data``).
* :class:`TrainingError` — training never produced a finite model (diverged from the first epoch).
* :class:`RunError` — a run directory cannot be written or read (exists, malformed run.json, bad model files).

Each message names what is wrong (setting, column, rows) and how to fix it. The app and the
CLI catch :class:`GPCoreError` and show the message.
"""


class GPCoreError(Exception):
    """Base class of every error gpcore raises on purpose."""


class ConfigError(GPCoreError, ValueError):
    """A setting is unknown or out of range."""


class InputError(GPCoreError, ValueError):
    """Arrays passed to a model are unusable."""


class DataError(GPCoreError, ValueError):
    """A data file or table cannot be used; the message names file, column, rows and the fix."""


class TrainingError(GPCoreError, FloatingPointError):
    """Training produced no finite model (e.g. a learning rate so large the first epoch is NaN)."""


class RunError(GPCoreError):
    """A run directory cannot be written (``--out`` not empty) or read (malformed ``run.json`` or model files)."""
