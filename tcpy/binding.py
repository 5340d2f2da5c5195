"""Call-time argument checks: bind a def's size variables from the arrays it is called with.

Nothing is cast or broadcast. Each argument must have exactly the dtype of its TC type and its
rank; constant dims must match; a size variable must get one value from every place it appears
(``size K is 4 from A.shape[1] but B.shape[0] is 5``). Rank-0 parameters also take Python
numbers (``bool`` for ``bool``, ``int`` for integer types, ``int``/``float`` for float types)
and NumPy scalars of the exact dtype; they are returned as 0-d arrays.
"""
from __future__ import annotations

import functools
import numbers

import numpy as np

from .errors import TCArgumentError, TCOverflowError, TCShapeError
from .lang import ast
from .lang.types import ScalarType

# Sizes are values of TC's index type, int32.
MAX_SIZE = 2**31 - 1


@functools.cache  # (a new call shape's entry asks for every array)
def numpy_dtype(scalar: ScalarType) -> np.dtype:
    """The NumPy dtype of a TC scalar type."""
    return np.dtype(scalar.numpy_name)


def bind_arguments(def_: ast.Def, args) -> tuple[list, dict]:
    """Check ``args`` against ``def_``'s signature; return ``(arrays, sizes)``.

    ``arrays`` holds one ndarray per parameter (rank-0 numbers become 0-d arrays, other arrays
    are returned as given); ``sizes`` maps every size variable to its int value. Raises
    :class:`~tcpy.errors.TCArgumentError` for a wrong count, kind, dtype or rank and
    :class:`~tcpy.errors.TCShapeError` for sizes that disagree.
    """
    where = f"def '{def_.name}'"
    params = def_.params
    if len(args) != len(params):
        names = ", ".join(p.name for p in params)
        raise TCArgumentError(
            f"{where} takes {len(params)} argument{'s' if len(params) != 1 else ''} ({names}), got {len(args)}"
        )
    arrays = []
    sizes: dict[str, int] = {}
    origin: dict[str, tuple[str, int]] = {}  # size -> (parameter, dimension) it was read from
    for param, arg in zip(params, args):
        ttype = param.type
        array = _as_array(where, param, ttype, arg)
        for d, dim in enumerate(ttype.dims):
            got = array.shape[d]
            if isinstance(dim, ast.IntLit):
                if got != dim.value:
                    raise TCShapeError(
                        f"{where}: argument {param.name} must have shape {ast.tuple_text(map(str, ttype.dims))}: "
                        f"{_place(param.name, d)} must be {dim.value}, got {got} (shape {tuple(array.shape)})"
                    )
            elif dim.name in sizes:
                if sizes[dim.name] != got:
                    raise TCShapeError(
                        f"{where}: size {dim.name} is {sizes[dim.name]} from {_place(*origin[dim.name])} "
                        f"but {_place(param.name, d)} is {got}"
                    )
            else:
                if got > MAX_SIZE:
                    raise TCShapeError(f"{where}: {_place(param.name, d)} is {got}, larger than the int32 index range")
                sizes[dim.name] = int(got)
                origin[dim.name] = (param.name, d)
        arrays.append(array)
    return arrays, sizes  # sema makes every size variable appear in some input


def _place(name: str, dim: int) -> str:
    """``A.shape[1]``: where a size was read (named only in errors: a new call shape binds many)."""
    return f"{name}.shape[{dim}]"


def _expected(param: ast.Param) -> str:
    """``float(M,K) A``: what an argument must be (named only in errors)."""
    return f"{param.type} {param.name}"


def _shown(arg) -> str:
    """A number as an error shows it (str() of an int of more than 4300 digits raises, and the
    digits say nothing anyway)."""
    return str(arg) if not isinstance(arg, int) or abs(arg) < 10**20 else f"an int of {arg.bit_length()} bits"


def _as_array(where: str, param: ast.Param, ttype: ast.TensorType, arg) -> np.ndarray:
    dtype = numpy_dtype(ttype.scalar)
    if ttype.rank == 0 and not isinstance(arg, np.ndarray):
        return _scalar(where, param, ttype, dtype, arg)
    if not isinstance(arg, np.ndarray):
        raise TCArgumentError(
            f"{where}: argument {param.name} must be a numpy.ndarray ({_expected(param)}), got {type(arg).__name__}"
        )
    if arg.dtype != dtype:
        raise TCArgumentError(
            f"{where}: argument {param.name} must have dtype {dtype.name} ({_expected(param)}), got {arg.dtype}; "
            f"nothing is cast implicitly: pass {param.name}.astype(numpy.{dtype.name})"
        )
    if arg.ndim != ttype.rank:
        raise TCArgumentError(
            f"{where}: argument {param.name} must have rank {ttype.rank} ({_expected(param)}), "
            f"got rank {arg.ndim} (shape {tuple(arg.shape)})"
        )
    return arg


def _scalar(where, param, ttype, dtype, arg) -> np.ndarray:
    if isinstance(arg, np.generic):
        if arg.dtype != dtype:
            raise TCArgumentError(
                f"{where}: argument {param.name} must have dtype {dtype.name} ({_expected(param)}), got {arg.dtype}"
            )
        return np.array(arg)
    scalar = ttype.scalar
    if type(arg) is float or type(arg) is int:  # (first: the checks below ask abstract classes, slowly)
        ok = scalar.is_float if type(arg) is float else scalar is not ScalarType.BOOL
    elif scalar is ScalarType.BOOL:
        ok = isinstance(arg, bool)
    elif scalar.is_float:
        ok = isinstance(arg, (numbers.Integral, numbers.Real)) and not isinstance(arg, bool)
    else:
        ok = isinstance(arg, numbers.Integral) and not isinstance(arg, bool)
    if not ok:
        want = "a bool" if scalar is ScalarType.BOOL else "a float or int" if scalar.is_float else "an int"
        raise TCArgumentError(
            f"{where}: argument {param.name} ({_expected(param)}) must be {want} or a 0-d {dtype.name} array, "
            f"got {type(arg).__name__}"
        )
    if scalar.is_float and isinstance(arg, numbers.Integral) and abs(arg) > float(np.finfo(dtype).max):
        raise TCOverflowError(
            f"{where}: argument {param.name} ({_expected(param)}) = {_shown(arg)} is outside the range of "
            f"{dtype.name} (largest magnitude {np.finfo(dtype).max})")
    if scalar.kind in ("int", "uint"):
        info = np.iinfo(dtype)
        if not info.min <= arg <= info.max:
            raise TCOverflowError(
                f"{where}: argument {param.name} ({_expected(param)}) = {_shown(arg)} is outside the range of "
                f"{dtype.name} [{info.min}, {info.max}]"
            )
    return np.array(arg, dtype=dtype)
