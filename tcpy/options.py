"""Options of a kernel: schedule choices a user can override, build flags, the target."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Mapping, Optional, Union

from .target import Target


@dataclass(frozen=True)
class Options:
    """Schedule and build options of a kernel.

    tile_sizes: ``{"m": 64, "k": 256}``: tile these index variables (in every statement they
        appear in) with these sizes; ``0`` disables tiling of that variable. Unlisted variables
        use the default heuristic.
    loop_order: index variables from outermost to innermost; variables of a statement that are
        not listed keep their heuristic position after the listed ones.
    unroll: unroll factor for innermost loops (``#pragma GCC unroll``), 0 lets gcc decide.
    num_threads: OpenMP threads (default: ``$OMP_NUM_THREADS``, else every CPU available).
    parallel, vectorize: turn OpenMP parallel loops / ``omp simd`` off.
    fast_math: compile with ``-ffast-math`` (vectorized libm calls, reassociation; NaN/inf
        semantics are no longer guaranteed). Off by default.
    check_indices: bounds-check data-dependent indices such as ``B(C(i))`` at run time.
    cflags: extra compiler flags.
    register_tile: keep blocks of outputs in registers across reductions (GEMM-like nests).
    contraction: run GEMM-class statements (a product of two accesses summed over shared
        indices) through the contraction engine (packing, micro-kernel, cache blocks); off keeps
        the plain loop nests.
    fuse: run consecutive statements that share outer output loops under them (see
        :mod:`tcpy.transform.fusion`).
    target: the machine to build for: a :class:`~tcpy.Target`, a preset name (``"x86-64-v3"``)
        or None for ``$TCPY_TARGET``, else this machine.
    """

    tile_sizes: Mapping[str, int] = field(default_factory=dict)
    loop_order: tuple[str, ...] = ()
    unroll: int = 0
    num_threads: Optional[int] = None
    parallel: bool = True
    vectorize: bool = True
    fast_math: bool = False
    check_indices: bool = True
    cflags: tuple[str, ...] = ()
    register_tile: bool = True
    contraction: bool = True
    fuse: bool = True
    target: Union[None, str, Target] = None

    def __post_init__(self):
        object.__setattr__(self, "target", Target.resolve(self.target))
        object.__setattr__(self, "tile_sizes", dict(self.tile_sizes))
        object.__setattr__(self, "loop_order", tuple(self.loop_order))
        object.__setattr__(self, "cflags", tuple(self.cflags))
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {self.num_threads}")
        if self.unroll < 0:
            raise ValueError(f"unroll must be >= 0, got {self.unroll}")
        for var, size in self.tile_sizes.items():
            if not isinstance(size, int) or size < 0:
                raise ValueError(f"tile size of {var!r} must be an int >= 0, got {size!r}")

    @property
    def threads(self) -> int:
        """``num_threads``, else ``$OMP_NUM_THREADS``, else the target's cores."""
        if self.num_threads:
            return self.num_threads
        env = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
        if env.isdigit() and int(env) > 0:
            return int(env)
        return self.target.cores

    def key(self) -> tuple:
        """A hashable summary for cache keys."""
        return (
            tuple(sorted(self.tile_sizes.items())), self.loop_order, self.unroll, self.threads,
            self.parallel, self.vectorize, self.fast_math, self.check_indices, self.cflags,
            self.register_tile, self.contraction, self.fuse, self.target.key(),
        )
