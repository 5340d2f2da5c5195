"""TC scalar types and TC's promotion rule (``match_types`` in TC's sema)."""
from __future__ import annotations

import enum


class ScalarType(enum.Enum):
    """A TC scalar type. ``value`` is (kind, bits, canonical TC spelling, C type, NumPy dtype name)."""

    BOOL = ("bool", 1, "bool", "bool", "bool")
    UINT8 = ("uint", 8, "uint8", "uint8_t", "uint8")
    UINT16 = ("uint", 16, "uint16", "uint16_t", "uint16")
    UINT32 = ("uint", 32, "uint32", "uint32_t", "uint32")
    UINT64 = ("uint", 64, "uint64", "uint64_t", "uint64")
    INT8 = ("int", 8, "int8", "int8_t", "int8")
    INT16 = ("int", 16, "int16", "int16_t", "int16")
    INT32 = ("int", 32, "int32", "int32_t", "int32")
    INT64 = ("int", 64, "int64", "int64_t", "int64")
    FLOAT16 = ("float", 16, "half", "_Float16", "float16")
    FLOAT32 = ("float", 32, "float", "float", "float32")
    FLOAT64 = ("float", 64, "double", "double", "float64")

    # (plain attributes of each member, not properties: the planner reads them many times a call shape)
    def __init__(self, kind: str, bits: int, tc_name: str, c_type: str, numpy_name: str):
        self.kind = kind
        self.bits = bits
        self.tc_name = tc_name  # the canonical TC spelling, used when printing source
        self.c_type = c_type
        self.numpy_name = numpy_name
        self.is_float = kind == "float"
        self.is_integral = kind != "float"  # integers and bool: what may index a tensor
        self.is_signed = kind in ("int", "float")

    def __str__(self) -> str:
        return self.tc_name

    def __repr__(self) -> str:
        return f"ScalarType.{self.name}"


# Every spelling the lexer accepts. `half` is tcpy's addition (TC's lexer has float16 only).
TYPE_NAMES: dict[str, ScalarType] = {
    "bool": ScalarType.BOOL,
    "uint8": ScalarType.UINT8,
    "uint16": ScalarType.UINT16,
    "uint32": ScalarType.UINT32,
    "uint64": ScalarType.UINT64,
    "int8": ScalarType.INT8,
    "int16": ScalarType.INT16,
    "int32": ScalarType.INT32,
    "int64": ScalarType.INT64,
    "float16": ScalarType.FLOAT16,
    "half": ScalarType.FLOAT16,
    "float32": ScalarType.FLOAT32,
    "float": ScalarType.FLOAT32,
    "float64": ScalarType.FLOAT64,
    "double": ScalarType.FLOAT64,
}

_INT_BY_BITS = {8: ScalarType.INT8, 16: ScalarType.INT16, 32: ScalarType.INT32, 64: ScalarType.INT64}

# Index variables, size variables and dimension references have TC's type, int32: an output
# defined from them is int32, as TC programs expect. Kernels compute their values in
# INDEX_VALUE_TYPE (see ``tcpy.lang.visit.is_index_value``), so nothing wraps at 2**31: a call
# whose sizes would put an int32 index result out of range raises, and ``int64(i)`` is exact.
INDEX_TYPE = ScalarType.INT32
INDEX_VALUE_TYPE = ScalarType.INT64


def promote(a: ScalarType, b: ScalarType) -> ScalarType:
    """TC's ``match_types``: the type of ``a op b``.

    int with float gives the float; two floats give the wider; two unsigned give the wider
    unsigned; signed with (un)signed gives the signed integer of the wider width.
    """
    if a is b:
        return a
    if a.is_float and b.is_float:
        return a if a.bits > b.bits else b
    if a.is_float:
        return a
    if b.is_float:
        return b
    if a.kind in ("uint", "bool") and b.kind in ("uint", "bool"):
        return a if a.bits > b.bits else b
    return _INT_BY_BITS[max(a.bits, b.bits, 8)]


def promote_all(types, start: ScalarType | None = None) -> ScalarType:
    """Fold :func:`promote` over ``types`` (optionally starting from ``start``)."""
    result = start
    for t in types:
        result = t if result is None else promote(result, t)
    if result is None:
        raise ValueError("promote_all needs at least one type")
    return result


def accumulator_type(t: ScalarType) -> ScalarType:
    """The type a reduction into a ``t`` tensor accumulates in: half in float32 (PTIR's
    accumulator policy), every other type in itself."""
    return ScalarType.FLOAT32 if t is ScalarType.FLOAT16 else t
