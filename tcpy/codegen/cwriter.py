"""What every C renderer in :mod:`tcpy.codegen` shares: the line writer, C literals, the
runtime's scratch slots and the schedule clause of a dynamically claimed parallel loop."""
from __future__ import annotations

import enum

from ..lang.types import ScalarType


class CWriter:
    """Lines of C, indented four spaces a level."""

    def __init__(self):
        self.lines: list[str] = []

    def __call__(self, text: str = "", depth: int = 0):
        """Append ``text`` (one line or several) at ``depth``; empty lines carry no indentation."""
        for line in text.split("\n"):
            self.lines.append("    " * depth + line if line else "")

    def text(self) -> str:
        """The lines written so far, each ended by a newline."""
        return "\n".join(self.lines) + "\n"


def c_literal(value, stype: ScalarType) -> str:
    """C for the constant ``value`` in type ``stype`` (inf and NaN through the header's macros)."""
    if stype.is_float:
        text = repr(float(value))
        if text in ("inf", "-inf", "nan"):
            text = {"inf": "INFINITY", "-inf": "(-INFINITY)", "nan": "NAN"}[text]
            return f"(({stype.c_type}){text})"
        if stype is ScalarType.FLOAT32:
            return text + "f"
        return f"(({stype.c_type}){text})" if stype is ScalarType.FLOAT16 else text
    return f"(({stype.c_type}){int(value)})"


class ScratchSlot(enum.IntEnum):
    """The per-thread buffers of ``tcpy_scratch(slot, bytes)`` (csrc/tcpy_runtime.h). A slot in
    use must never be asked for again until its user is done: a second request overwrites it,
    or frees it when it grows."""
    PACKED_A = 0  # the packed path's A slivers; the winograd path's transformed weights U
    PACKED_B = 1  # packed B panels, the small path's edge sliver, a padded copy, winograd's V
    PARTIALS = 2  # split-K partial sums; the winograd path's block products
    CHAIN_BLOCKS = 3  # a fused chain's per-thread block buffers and operands packed per thread
    CHAIN_SHARED = 4  # a fused chain's operands packed once for all threads (the caller's buffer)
    B_COLUMNS = 5  # pack_b's table of B's column offsets (while a chain's slot 3 is live)


# A parallel loop's iterations are claimed in about this many chunks per thread: a thread the
# OS deschedules holds back one small chunk, and a few claims per thread cost nothing.
CLAIMS_PER_THREAD = 8


def dynamic_schedule(iterations: int, threads: int) -> str:
    """The ``schedule`` clause of a parallel loop of ``iterations`` planned for ``threads``:
    chunks claimed dynamically, each iteration still computing the same data whichever thread
    claims it (a reduction's parts are iterations, combined in order afterwards)."""
    chunk = max(1, iterations // (CLAIMS_PER_THREAD * max(1, threads)))
    return f"schedule(dynamic, {chunk})"
