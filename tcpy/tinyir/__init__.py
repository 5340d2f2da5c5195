"""Tiny IR programs (seed ``004_*``) compiled by tcpy.

A Tiny IR program is a JSON DAG of UOps (INPUT, movement ops, element-wise ops, REDUCE) in
which GEMM, convolution and attention are written naively: movement, an element-wise MUL,
REDUCE(SUM). :func:`load` turns one into a single ordinary :class:`tcpy.Kernel` through
generated TC source (``kernel.source``): movement ops fold into index expressions, element-wise
ops into expressions, each REDUCE into a reduction statement in its accumulation dtype, shape
symbols into size variables. So the naive graphs reach the contraction engine and the fusion
pass like hand-written comprehensions::

    gemm = tcpy.tinyir.load("gemm.json")       # JSON text, a path, a file or a dict
    C = gemm(A, B)                               # inputs in INPUT order, outputs as a tuple if several
    print(gemm.source)                           # the TC it became

The spec's validation errors are raised as :class:`TinyIRError` subclasses of the spec's
names, with the offending node id in ``err.node`` and in the message.
"""
from __future__ import annotations

import json
import os
from typing import Mapping, Optional, Union

from ..api import define as define_tc
from .errors import (AccDtypeMissing, AxisSizeMismatch, BroadcastMismatch, DtypeMismatch,
                     ExcessivePiecewise, InvalidPermutation, TinyIRError)
from .graph import Graph, check
from .lower import MAX_PIECEWISE, to_tc

__all__ = ["load", "define", "translate", "check", "Graph", "TinyIRError", "BroadcastMismatch",
           "AxisSizeMismatch", "InvalidPermutation", "AccDtypeMissing", "ExcessivePiecewise",
           "DtypeMismatch"]


def translate(program: Mapping, *, sizes: Optional[Mapping[str, int]] = None,
              outputs: Optional[list] = None, name: str = "tinyir",
              max_piecewise: int = MAX_PIECEWISE) -> str:
    """The TC source of a Tiny IR ``program`` (a dict): one def named ``name``.

    ``sizes`` gives shape symbols int values (added to the program's ``"sizes"`` object);
    symbols an INPUT's shape names become size variables of the def. ``outputs`` lists the node
    ids to return (default: the program's ``"outputs"``, else every node nothing reads).
    ``max_piecewise`` bounds the guards and floor divisions of one read (ExcessivePiecewise).
    """
    return to_tc(check(program, sizes, outputs), name, max_piecewise)


def define(program: Mapping, *, sizes: Optional[Mapping[str, int]] = None,
           outputs: Optional[list] = None, name: str = "tinyir", options=None,
           backend: str = "compiled", max_piecewise: int = MAX_PIECEWISE):
    """Compile a Tiny IR ``program`` (a dict) to a :class:`tcpy.Kernel` (see :func:`translate`
    for the arguments; ``options`` and ``backend`` as in :func:`tcpy.define`).

    The kernel takes the INPUT tensors in program order, as NumPy arrays of their dtypes
    (fp16: float16, fp32 and bf16: float32, i32: int32, bool: bool).
    """
    source = translate(program, sizes=sizes, outputs=outputs, name=name, max_piecewise=max_piecewise)
    return define_tc(source, options=options, backend=backend)


def _strip_line_comments(text: str) -> str:
    """JSON text without ``// ...`` line comments (the spec's listings carry them), strings kept."""
    out, in_string, k = [], False, 0
    while k < len(text):
        c = text[k]
        if in_string:
            if c == "\\":
                out.append(text[k:k + 2])
                k += 2
                continue
            in_string = c != '"'
        elif c == '"':
            in_string = True
        elif text.startswith("//", k):
            end = text.find("\n", k)
            k = len(text) if end < 0 else end
            continue
        out.append(c)
        k += 1
    return "".join(out)


def load(source: Union[str, bytes, os.PathLike, Mapping], **kwargs):
    """Read a Tiny IR program (JSON text, a path to a JSON file, an open file or a dict) and
    compile it with :func:`define` (same keyword arguments). ``//`` line comments, which the
    spec's listings carry, are allowed in the text."""
    if isinstance(source, Mapping):
        return define(source, **kwargs)
    if hasattr(source, "read"):
        text = source.read()
    elif isinstance(source, os.PathLike) or (isinstance(source, str) and not source.lstrip().startswith("{")):
        try:
            with open(source, encoding="utf-8") as f:
                text = f.read()
        except OSError as err:
            raise TinyIRError(None, f"cannot read the program file {os.fspath(source)!r}: {err.strerror}") from None
    else:
        text = source
    try:
        program = json.loads(_strip_line_comments(text))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise TinyIRError(None, f"the program is not valid JSON: {err}") from None
    return define(program, **kwargs)
