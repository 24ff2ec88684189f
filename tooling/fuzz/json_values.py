"""Hypothesis strategies for JSON values of any shape, and the Struct-safe form of them:
shared by the ext_proc bodies and metadata and the access-log entries' metadata."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=40)
)
json_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)
struct_values = st.dictionaries(
    st.text(max_size=12),
    json_values.filter(lambda v: not isinstance(v, float) or v == v),
    max_size=4,
)


def finite(value: Any) -> Any:
    """Struct values are JSON: no NaN or infinity (protobuf's Struct refuses none, but keep
    what json.dumps would write)."""
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return 0.0
    if isinstance(value, list):
        return [finite(v) for v in value]
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, int) and abs(value) > 2**53:
        return float(value)
    return value
