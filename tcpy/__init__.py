"""tcpy: Tensor Comprehensions for Python.

Write a kernel in TC index notation, call it on NumPy arrays, get a tiled OpenMP C kernel::

    import numpy as np, tcpy
    matmul = tcpy.define('''
    def matmul(float(M,K) A, float(K,N) B) -> (C) {
        C(m, n) +=! A(m, k) * B(k, n)
    }
    ''')
    C = matmul(A, B)
"""
from .errors import (
    TCArgumentError,
    TCCompilerError,
    TCError,
    TCLookupError,
    TCMemoryError,
    TCOpError,
    TCOptionError,
    TCOverflowError,
    TCPreconditionError,
    TCProgramError,
    TCRangeError,
    TCRuntimeError,
    TCSemanticError,
    TCShapeError,
    TCSyntaxError,
    TCWarning,
)
from .compiled import select_modules as _select_modules

_select_modules()  # (before any compiled module is imported)

from .lang import parse  # noqa: E402 (after the choice of compiled modules)
from .api import Kernel, Library, define
from .autodiff import grad, value_and_grad, vjp
from .options import Options
from .target import Target
from .tuning import autotune
from .runtime.launch import get_num_threads, set_num_threads
from . import ops, tinyir

__version__ = "0.1.0"

__all__ = [
    "define",
    "Kernel",
    "Library",
    "Options",
    "Target",
    "autotune",
    "grad",
    "vjp",
    "value_and_grad",
    "get_num_threads",
    "set_num_threads",
    "parse",
    "ops",
    "TCError",
    "TCProgramError",
    "TCSyntaxError",
    "TCSemanticError",
    "TCRangeError",
    "TCLookupError",
    "TCArgumentError",
    "TCShapeError",
    "TCMemoryError",
    "TCPreconditionError",
    "TCRuntimeError",
    "TCCompilerError",
    "TCOptionError",
    "TCOpError",
    "TCOverflowError",
    "TCWarning",
]
