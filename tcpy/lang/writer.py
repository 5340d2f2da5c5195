"""Writing TC source text: exact constants of every scalar type, casts, reads, where clauses, defs.

The front doors that generate TC (:mod:`tcpy.ops`, :mod:`tcpy.tinyir`) write through these
helpers, so a constant means the same number whichever wrote it. TC's literals are int32
(``5``) and float32 (``0.5``); a constant of another type is written as a cast of exact
pieces: a double as a sum of up to three float32 values, an integer outside int32 from 16- and
32-bit pieces, inf and NaN as divisions by zero.
"""
from __future__ import annotations

import math
import struct
from typing import Sequence

from ..errors import TCError
from .types import ScalarType


class LiteralError(TCError, ValueError):
    """A constant that the requested scalar type cannot hold (the caller adds where it came from)."""


def _rounded(x: float, dtype: ScalarType) -> float:
    """``x`` rounded to nearest even in ``dtype`` (a float type); LiteralError beyond its range."""
    if dtype is ScalarType.FLOAT64:
        return x
    code = "e" if dtype is ScalarType.FLOAT16 else "f"
    try:
        rounded = struct.unpack(code, struct.pack(code, x))[0]
    except OverflowError:  # struct raises for float16 ...
        rounded = math.inf
    if math.isinf(rounded):  # ... and gives inf for float32
        raise LiteralError(f"the constant {x!r} is outside the {dtype.numpy_name} range")
    return rounded


def _float32_text(x: float) -> str:
    """The shortest decimal that reads back as the float32 ``x`` (>= 0), as a TC float literal."""
    for digits in range(1, 10):  # 9 significant digits always identify a float32
        text = f"{x:.{digits}g}"
        if struct.unpack("f", struct.pack("f", float(text)))[0] == x:  # (inf past float32's maximum)
            break
    return text if any(c in text for c in ".e") else text + ".0"


def _negated(text: str, negative: bool) -> str:
    return f"(-{text})" if negative else text


def _float32_pieces(x: float) -> list[float] | None:
    """Up to three float32 values summing exactly to ``x``, or None (3 x 24 bits hold a double's
    53 unless ``x`` lies beyond float32's exponent range)."""
    pieces, rest = [], x
    for _ in range(3):
        if rest == 0 and pieces:
            break
        try:
            piece = _rounded(rest, ScalarType.FLOAT32)
        except LiteralError:
            return None
        pieces.append(piece)
        rest -= piece
    return pieces if rest == 0 else None


def _power_of_two_factors(exponent: int) -> list[float]:
    """Powers of two, each a normal float32, whose product is ``2**exponent``."""
    factors = []
    while exponent:
        step = max(-126, min(127, exponent))
        factors.append(2.0 ** step)
        exponent -= step
    return factors


def _float_literal(value: float, dtype: ScalarType) -> str:
    if math.isnan(value):
        return f"{dtype.tc_name}(0.0 / 0.0)"
    if math.isinf(value):
        return f"{dtype.tc_name}({'-' if value < 0 else ''}1.0 / 0.0)"
    value = _rounded(value, dtype)
    if dtype is not ScalarType.FLOAT64:  # a float16 value is also a float32 one
        text = _negated(_float32_text(abs(value)), math.copysign(1, value) < 0)
        return text if dtype is ScalarType.FLOAT32 else f"{dtype.tc_name}({text})"
    pieces = _float32_pieces(value)
    factors: list[float] = []
    if pieces is None:  # beyond float32's exponents: a mantissa in [0.5, 1) times powers of two
        mantissa, exponent = math.frexp(value)
        pieces, factors = _float32_pieces(mantissa), _power_of_two_factors(exponent)
    terms = [f"double({_negated(_float32_text(abs(p)), math.copysign(1, p) < 0)})" for p in pieces]
    text = terms[0] if len(terms) == 1 else "(" + " + ".join(terms) + ")"
    # scaling a double by powers of two toward its final value is exact
    return " * ".join([text] + [f"double({_float32_text(f)})" for f in factors])


def int_range(dtype: ScalarType) -> tuple[int, int]:
    """The smallest and largest value of an integer (or bool) type."""
    if dtype is ScalarType.BOOL:
        return 0, 1
    if dtype.kind == "uint":
        return 0, 2 ** dtype.bits - 1
    return -2 ** (dtype.bits - 1), 2 ** (dtype.bits - 1) - 1


def literal(value, dtype: ScalarType) -> str:
    """TC text of the constant ``value`` of type ``dtype``, exact for every value the type holds.

    Raises :class:`LiteralError` for a value the type cannot hold (a fraction for an integer
    type, an integer out of its range, a float beyond float32 for a float32 constant).
    """
    if dtype is ScalarType.BOOL:
        return f"bool({int(bool(value))})"
    if dtype.is_float:
        return _float_literal(float(value), dtype)
    if not isinstance(value, int) and not float(value).is_integer():  # (NumPy's float32 is no float)
        raise LiteralError(f"the constant {value!r} is not an integer, as {dtype.numpy_name} needs")
    value = int(value)
    low, high = int_range(dtype)
    if not low <= value <= high:
        raise LiteralError(f"the constant {value} does not fit {dtype.numpy_name} [{low}, {high}]")
    if -2**31 < value < 2**31:
        text = _negated(str(abs(value)), value < 0)
        return text if dtype is ScalarType.INT32 else f"{dtype.tc_name}({text})"
    if dtype is ScalarType.INT32:  # -2**31: its magnitude is no int32 literal
        return "(-2147483647 - 1)"
    if dtype is ScalarType.UINT64:  # four 16-bit pieces, combined in uint64
        text = f"uint64({value >> 48})"
        for shift in (32, 16, 0):
            text = f"({text} * uint64(65536) + uint64({(value >> shift) & 0xFFFF}))"
        return text
    # high * 2^32 + mid * 2^16 + low, each piece an int32 literal
    top, rest = divmod(value, 2**32)
    mid, bottom = divmod(rest, 2**16)
    top_text = "(int64(-2147483647) - int64(1))" if top == -2**31 else f"int64({_negated(str(abs(top)), top < 0)})"
    return (f"{dtype.tc_name}({top_text} * int64(65536) * int64(65536) + int64({mid}) * int64(65536) + "
            f"int64({bottom}))")


def lowest(dtype: ScalarType) -> str:
    """The identity of ``max``: -inf, the type's minimum, or false."""
    return literal(-math.inf if dtype.is_float else int_range(dtype)[0], dtype)


def highest(dtype: ScalarType) -> str:
    """The identity of ``min``: +inf, the type's maximum, or true."""
    return literal(math.inf if dtype.is_float else int_range(dtype)[1], dtype)


def cast(text: str, to: ScalarType, frm: ScalarType | None = None) -> str:
    """``text`` converted to ``to`` (written as is when ``frm``, its type, is already ``to``)."""
    return text if frm is to else f"{to.tc_name}({text})"


def fresh_name(base: str, taken: set) -> str:
    """``base``, or ``base_1``, ``base_2``, ... : the first not in ``taken`` (which it joins)."""
    name, k = base, 1
    while name in taken:
        name, k = f"{base}_{k}", k + 1
    taken.add(name)
    return name


def read(tensor: str, indices: Sequence[str]) -> str:
    """A read of ``tensor`` at ``indices`` (a rank-0 tensor is read by its name)."""
    return f"{tensor}({', '.join(indices)})" if indices else tensor


def statement(lhs: str, op: str, rhs: str, ranges: Sequence[tuple[str, str]] = (),
              lets: Sequence[str] = ()) -> str:
    """``lhs op rhs where v in 0:extent, ..., lets`` (no where clause when both are empty)."""
    clauses = [f"{var} in 0:{extent}" for var, extent in ranges] + list(lets)
    return f"{lhs} {op} {rhs}" + (f" where {', '.join(clauses)}" if clauses else "")


def def_source(name: str, params: Sequence[tuple[ScalarType, Sequence[str], str]],
               outputs: Sequence[str], statements: Sequence[str]) -> str:
    """A TC def: ``params`` as ``(type, size expressions, name)``, the returned tensor names and
    the statements, one per line."""
    param_text = ", ".join(f"{dtype.tc_name}{'(' + ', '.join(dims) + ')' if dims else ''} {tensor}"
                           for dtype, dims, tensor in params)
    body = "\n".join(f"    {s}" for s in statements)
    return f"def {name}({param_text}) -> ({', '.join(outputs)}) {{\n{body}\n}}\n"
