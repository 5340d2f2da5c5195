"""Optimisations as passes over the loop IR (:mod:`tcpy.loopir`), one module per family.

Each pass takes IR and returns new IR; none mutates what it was given. Their decisions read the
:class:`~tcpy.target.Target` in the options.

* :mod:`.packing` — operand copies (Program -> Program): transposed copies that turn dot-product
  reductions into GEMM-like nests, and panel copies of the operand a register tile streams.
* :mod:`.register_tile` — blocks of outputs kept in registers across reductions
  (KernelIR -> KernelIR).
"""
from .packing import pack_operands
from .register_tile import register_tiles

__all__ = ["pack_operands", "register_tiles"]
