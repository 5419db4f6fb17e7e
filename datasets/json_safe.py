"""Strict JSON values: NaN / inf become None, numpy scalars and arrays become Python values.

One helper for every JSON wmcheck writes with `allow_nan=False` (validate --json, the quality
card, the report's model section).
"""

from __future__ import annotations

import numpy as np


def json_safe(x):
    """x with NaN / inf -> None and numpy -> Python, recursively through dicts, lists and tuples."""
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, np.ndarray)):
        return [json_safe(v) for v in (x.tolist() if isinstance(x, np.ndarray) else x)]
    if isinstance(x, (float, np.floating)):
        return float(x) if np.isfinite(x) else None
    if isinstance(x, np.integer):
        return int(x)
    return x
