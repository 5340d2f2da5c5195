"""Running generated C: build and cache shared libraries (:mod:`.build`), call kernels (:mod:`.launch`).

``Launcher`` and ``LaunchEntry`` live in the Cython module :mod:`tcpy.runtime.launch`; they are
loaded on first use so that :mod:`.build` stays importable without compiled extensions.

OpenMP's wait policy: a thread of GNU OpenMP that waits (at the end of a parallel loop, or for
the next kernel) spins for about 3 ms by default before it sleeps. On a busy machine those
spinning threads take time slices from the thread that still has work (and from other
programs). Unless the environment sets ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT``, tcpy loads
libgomp with a short spin (``GOMP_SPINCOUNT`` = :data:`SPIN_COUNT`, about 0.1 ms) before anything
else loads it; the variable is removed again, so child processes do not inherit it. A process
that loaded libgomp before importing tcpy keeps that library's policy.
"""
import ctypes
import os

SPIN_COUNT = 10000  # libgomp's spins before a waiting thread sleeps (its default: 300000)


def _load_openmp_with_short_spin() -> None:
    """Load libgomp (which reads its environment once, when loaded) with a short spin count,
    unless the user's environment chose a wait policy."""
    if "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ:
        return
    os.environ["GOMP_SPINCOUNT"] = str(SPIN_COUNT)
    try:
        ctypes.CDLL("libgomp.so.1", mode=ctypes.RTLD_GLOBAL)
    except OSError:  # another OpenMP runtime (or none): the kernels' own loads it
        pass
    finally:
        del os.environ["GOMP_SPINCOUNT"]


_load_openmp_with_short_spin()

from .build import (  # noqa: E402
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
