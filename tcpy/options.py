"""Options of a kernel: schedule choices a user can override, build flags, the target."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Mapping, Optional, Union

from .errors import TCOptionError
from .target import Target

# Limits that keep every option a valid C program: gcc's `#pragma GCC unroll` takes at most
# 65534; OpenMP's num_threads and tile sizes are ints in the C source.
MAX_UNROLL = 65534
MAX_THREADS = 1 << 16
MAX_TILE = 1 << 30


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
        semantics are no longer guaranteed) for this kernel only: the process's floating-point
        modes (denormals) are left alone. Off by default.
    check_indices: bounds-check data-dependent indices such as ``B(C(i))`` at run time.
    cflags: extra compiler flags.
    register_tile: keep blocks of outputs in registers across reductions (GEMM-like nests).
    contraction: run GEMM-class statements (a product of two accesses summed over shared
        indices) through the contraction engine (packing, micro-kernel, cache blocks); off keeps
        the plain loop nests.
    fuse: run consecutive statements that share outer output loops under them (see
        :mod:`tcpy.transform.fusion`).
    winograd: let the contraction engine run a 3x3 stride-1 convolution as Winograd's
        F(2x2, 3x3) or, on large images, F(4x4, 3x3) when it estimates a gain (:mod:`tcpy.transform.winograd`: 2.25x fewer
        multiplications, results that differ from the direct sums by rounding only), and such a
        convolution's weight gradient as F(3x3, 2x2) (:mod:`tcpy.transform.winograd_taps`); off
        keeps the direct sums.
    plan: fields of the contraction engine's plan instead of its cost model's choice, for
        every statement the engine runs: ``path`` (``"packed"``, ``"small"``, ``"stream"``,
        ``"direct"``, ``"batch_lanes"``), ``mr`` and ``nr`` (the micro-tile's rows and
        columns), ``kc``, ``mc``, ``nc`` (cache blocks), ``grid`` (threads over batch, M, N, K)
        and, for a fused chain, ``rows`` (its row block). Values a statement cannot run with
        raise :class:`~tcpy.TCOptionError` when it is specialised.
    target: the machine to build for: a :class:`~tcpy.Target`, a preset name (``"x86-64-v3"``)
        or None for ``$TCPY_TARGET``, else this machine.
    specialize: ``"auto"`` (default): one size-generic kernel serves every shape of a def (its
        loop nests and its contractions' run-time engine: see :mod:`tcpy.generic`), and a shape called often
        gets a kernel specialised for it, compiled in the background; ``"never"``: the generic
        kernel only; ``"always"``: a kernel compiled for each shape. A def the generic kernel
        cannot run yet gets specialised kernels whatever this says (``explain()`` says why).
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
    winograd: bool = True
    target: Union[None, str, Target] = None
    plan: Mapping[str, object] = field(default_factory=dict)
    specialize: str = "auto"

    def __post_init__(self):
        object.__setattr__(self, "target", Target.resolve(self.target))
        if not isinstance(self.tile_sizes, Mapping):
            _bad("tile_sizes", "a mapping from index variable to tile size, e.g. {'m': 64}", self.tile_sizes)
        object.__setattr__(self, "tile_sizes", dict(self.tile_sizes))
        object.__setattr__(self, "loop_order", _names("loop_order", self.loop_order))
        object.__setattr__(self, "cflags", _names("cflags", self.cflags, "compiler flags such as ('-O1',)"))
        for name in ("parallel", "vectorize", "fast_math", "check_indices", "register_tile", "contraction", "fuse",
                     "winograd"):
            if not isinstance(getattr(self, name), bool):
                _bad(name, "True or False", getattr(self, name))
        if self.num_threads is not None and not _int_in(self.num_threads, 1, MAX_THREADS):
            _bad("num_threads", f"None or an int from 1 to {MAX_THREADS}", self.num_threads)
        if not _int_in(self.unroll, 0, MAX_UNROLL):
            _bad("unroll", f"an int from 0 to {MAX_UNROLL} (gcc's limit)", self.unroll)
        for var, size in self.tile_sizes.items():
            if not isinstance(var, str) or not var.isidentifier():
                _bad("tile_sizes", "index variable names as keys", var)
            if not _int_in(size, 0, MAX_TILE):
                _bad(f"tile_sizes[{var!r}]", f"an int from 0 to {MAX_TILE}", size)
        object.__setattr__(self, "plan", _plan_overrides(self.plan))
        if self.specialize not in SPECIALIZE_MODES:
            _bad("specialize", f"one of {', '.join(map(repr, SPECIALIZE_MODES))}", self.specialize)

    @property
    def threads(self) -> int:
        """``num_threads``, else ``$OMP_NUM_THREADS``, else the target's cores."""
        if self.num_threads:
            return self.num_threads
        env = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
        if env.isdigit() and 0 < int(env) <= MAX_THREADS:  # (above: the launcher warns, runs on the CPUs)
            return int(env)
        return self.target.cores

    def key(self) -> tuple:
        """A hashable summary for cache keys."""
        return (
            tuple(sorted(self.tile_sizes.items())), self.loop_order, self.unroll, self.threads,
            self.parallel, self.vectorize, self.fast_math, self.check_indices, self.cflags,
            self.register_tile, self.contraction, self.fuse, self.winograd, self.target.key(),
            tuple(sorted(self.plan.items())), self.specialize,
        )


def _bad(name: str, expected: str, got) -> None:
    raise TCOptionError(f"Options.{name} must be {expected}, got {got!r} ({type(got).__name__})")


def _int_in(value, lo: int, hi: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi


def _names(field_name: str, value, expected: str = "a sequence of index variable names") -> tuple[str, ...]:
    """A tuple of strings; a bare string is refused (it would be split into characters)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (tuple, list)):
        _bad(field_name, expected, value)
    if not all(isinstance(v, str) for v in value):
        _bad(field_name, expected, value)
    return tuple(value)


SPECIALIZE_MODES = ("auto", "always", "never")
PLAN_PATHS = ("packed", "small", "stream", "direct", "batch_lanes", "direct_conv")
PLAN_SIZES = ("mr", "nr", "kc", "mc", "nc", "rows")


def _plan_overrides(plan) -> dict:
    """``Options.plan`` checked for names and types (what a contraction can run with is
    checked when it is planned): a dict, ``grid`` as a tuple."""
    if not isinstance(plan, Mapping):
        _bad("plan", "a mapping from plan field to value, e.g. {'mr': 4, 'kc': 128}", plan)
    checked = {}
    for name, value in plan.items():
        if name == "path":
            if value not in PLAN_PATHS:
                _bad("plan['path']", f"one of {', '.join(map(repr, PLAN_PATHS))}", value)
        elif name == "grid":
            if (not isinstance(value, (tuple, list)) or len(value) != 4
                    or not all(_int_in(v, 1, MAX_THREADS) for v in value)):
                _bad("plan['grid']", f"4 ints from 1 to {MAX_THREADS}: threads over (batch, M, N, K)", value)
            value = tuple(value)
        elif name in PLAN_SIZES:
            if not _int_in(value, 1, MAX_TILE):
                _bad(f"plan[{name!r}]", f"an int from 1 to {MAX_TILE}", value)
        else:
            _bad("plan", f"fields among {', '.join(('path', 'grid') + PLAN_SIZES)}", name)
        checked[name] = value
    return checked
