"""Small files a user might upload, made in memory (shared by the AppTest and browser tests)."""

from __future__ import annotations

import numpy as np
import pandas as pd

#: Coordinates under names no reader recognises (px / py).
NO_COORD_NAMES = b"px,py,speed\n" + b"".join(
    f"{-66.5 + 0.01 * i:.3f},{18.2 + 0.005 * (i % 7):.3f},{10 + i % 9}\n".encode() for i in range(60)
)


def housing_with_text(n: int = 2000) -> bytes:
    """Block-group-like rows (California housing columns) whose target holds three text values."""
    rng = np.random.default_rng(0)
    df = pd.DataFrame({
        "longitude": rng.uniform(-122.5, -117.0, n).round(4),
        "latitude": rng.uniform(33.5, 38.5, n).round(4),
        "housing_median_age": rng.integers(1, 52, n).astype(float),
        "median_house_value": (10 ** rng.normal(5.2, 0.3, n)).round(0).astype(object),
    })
    df.loc[[5, 100, 1500], "median_house_value"] = ["n/a", "expensive", "500k+"]
    return df.to_csv(index=False).encode()


def swapped_lon_lat(n: int = 80) -> bytes:
    """Puerto Rico points whose 'lon' column holds latitudes and 'lat' longitudes."""
    rng = np.random.default_rng(1)
    lon, lat = rng.uniform(-67.1, -65.7, n).round(4), rng.uniform(18.0, 18.45, n).round(4)
    return pd.DataFrame({"lon": lat, "lat": lon, "mbps": rng.uniform(5, 200, n).round(1)}).to_csv(index=False).encode()


def write_speeds_csv(path, n: int, seed: int):
    """A synthetic Ookla-like CSV (lon, lat, download_mbps, tests, ...; no quadkey) at ``path``; returns ``path``."""
    from gpcore.data import synthetic

    df = synthetic.synthetic_ookla(n=n, seed=seed)
    df["download_mbps"] = df["avg_d_kbps"] / 1000
    df.drop(columns=["quadkey"]).to_csv(path, index=False)
    return path
