"""The one place that picks the torch device and dtype.

Every model, the trainer and the CLI call :func:`resolve_device`; nothing else in the
package inspects ``torch.cuda`` directly.
"""

from __future__ import annotations

import torch

from gpcore.errors import ConfigError

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """Return ``cuda`` when ``device="auto"`` and a GPU is present, else ``cpu``.

    An explicit ``"cuda"`` without a GPU raises a clear error instead of failing later.
    """
    if isinstance(device, torch.device):
        return device
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device='cuda' was requested but no CUDA GPU is available; use device='auto' or 'cpu'")
    return dev


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return DTYPES[dtype]
    except KeyError:
        raise ConfigError(f"dtype={dtype!r} is not supported; allowed: {sorted(DTYPES)}") from None


def describe_device(device: str | torch.device = "auto") -> str:
    """A human-readable name of the device in use (GPU name or 'CPU (n threads)')."""
    dev = resolve_device(device)
    if dev.type == "cuda":
        return f"GPU: {torch.cuda.get_device_name(dev)}"
    n = torch.get_num_threads()
    return f"CPU ({n} thread{'s' if n != 1 else ''})"
