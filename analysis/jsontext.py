"""The JSON every file of a run folder is written in: plain data only (numpy scalars as numbers,
NaN and infinities as null). Its own module: the last frame stage writes each frame's records as
this text, in parallel, so the one collector appends text instead of encoding every record."""

from __future__ import annotations

import json
import math
from typing import Any


def json_safe(value: Any) -> Any:
    """Plain JSON data: numpy scalars to int/float, tuples to lists, NaN and infinities to None."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return int(value)
    if hasattr(value, "item") and not isinstance(value, float):  # numpy scalar
        return json_safe(value.item())
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else None
    raise ValueError(f"report: expected JSON-able data, got {type(value).__name__} {value!r}")


def json_text(data: Any, indent: int | None = None) -> str:
    return json.dumps(json_safe(data), indent=indent, allow_nan=False)


def records_text(records: list) -> tuple[str, int]:
    """``records`` as the lines of a JSON list (",\n" between them) and how many there are; a
    record that is not plain JSON is left out (counted by its absence)."""
    lines = []
    for record in records:
        try:
            lines.append(json_text(record))
        except (ValueError, TypeError):
            continue
    return ",\n".join(lines), len(lines)
