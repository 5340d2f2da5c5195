"""Running generated C: build and cache shared libraries (:mod:`.build`), call kernels (:mod:`.launch`).

``Launcher`` and ``LaunchEntry`` live in the Cython module :mod:`tcpy.runtime.launch`; they are
loaded on first use so that :mod:`.build` stays importable without compiled extensions.

OpenMP's wait policy is left to the environment: a waiting GNU OpenMP thread spins for about
3 ms before it sleeps, which keeps back-to-back calls of short kernels fast on a quiet machine
(with a 0.1 ms spin, GEMM 512 at two threads ran 0.71-1.36 ms instead of 0.56-0.61); on a machine
shared with other work, ``OMP_WAIT_POLICY=passive`` gives the time slices back.
"""
from .build import (
    build_library,
    cache_dir,
    cache_info,
    clear_cache,
    load_symbol,
    runtime_include_dir,
)

__all__ = [
    "build_library",
    "load_symbol",
    "cache_dir",
    "cache_info",
    "clear_cache",
    "runtime_include_dir",
    "Launcher",
    "LaunchEntry",
]


def __getattr__(name):
    if name in ("Launcher", "LaunchEntry"):
        from . import launch

        return getattr(launch, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
