"""Optimisations as passes over the loop IR (:mod:`tcpy.loopir`), one module per family.

Each pass takes IR and returns new IR; none mutates what it was given. Their decisions read the
:class:`~tcpy.target.Target` in the options.

* :mod:`.snapshot` — a statement that reads elements of its own target that it also writes
  reads a copy taken before it (TC's semantics; done when the program is built, so every path
  sees it; Program -> Program).
* :mod:`.zeros` — a temporary summed over an empty range at the bound sizes (a strided
  read's phase no tap reaches) is zero: no statement, no buffer, its reads zeros (Program ->
  Program).
* :mod:`.engines` — how each statement runs (the contraction engine with its plan, or loops),
  decided once and stamped on it; the later passes read the stamp (Program -> Program).
* :mod:`.packing` — operand copies (Program -> Program): transposed copies that turn dot-product
  reductions into GEMM-like nests, and panel copies of the operand a register tile streams.
* :mod:`.fusion` — consecutive statements that share outer output loops run under them, legal
  by isl dependence analysis; their private temporaries shrink to per-thread buffers; a
  contraction -> rows -> contraction chain (attention) runs over blocks of rows (Program -> Program).
* :mod:`.chains` — how each fused group and chain runs (parallel loops, chunks, where b is
  packed, the products' plans on a block), decided once and stamped on it (Program -> Program).
* :mod:`.phases` — an element-wise statement selecting by ``v % s`` (a strided read's
  gradient interleaving its phases) runs in pieces, one per residue, each with its selects
  resolved (Program -> Program).
* :mod:`.epilogue` — element-wise consumers of a contraction's output run in the engine's
  store (Program -> Program).
* :mod:`.register_tile` — blocks of outputs kept in registers across reductions
  (KernelIR -> KernelIR).
"""
from .chains import plan_chains
from .engines import decide_engines, runtime_gap
from .epilogue import attach_epilogues
from .fusion import fuse_statements
from .packing import pack_operands
from .phases import split_phases
from .register_tile import register_tiles
from .zeros import drop_empty_sums

__all__ = ["attach_epilogues", "decide_engines", "drop_empty_sums", "fuse_statements", "pack_operands", "plan_chains",
           "register_tiles", "runtime_gap", "split_phases"]
