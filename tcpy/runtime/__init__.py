"""Running generated C: build and cache shared libraries (:mod:`.build`), call kernels (:mod:`.launch`).

``Launcher`` and ``LaunchEntry`` live in the Cython module :mod:`tcpy.runtime.launch`; they are
loaded on first use so that :mod:`.build` stays importable without compiled extensions.
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
