"""Compile generated C into shared libraries, with a content-addressed cache in memory and on disk.

``build_library(c_source)`` returns the path of a ``.so`` built from ``c_source``. The disk
cache key is the sha256 of the source, the runtime header, the compiler's version line, the
flags and the :class:`~tcpy.target.Target` (which gives the ``-march`` flags), so a second
process building the same kernel finds it and does not run the compiler.

Safety between processes: a per-key file lock makes one process compile while the others wait
and then reuse its result; files appear atomically (written under a temporary name in the cache
directory, then ``os.replace``); each ``.so`` has a sidecar with its sha256, and an entry whose
bytes do not match (truncated, corrupt, half-copied) is rebuilt, never loaded.

Environment:

- ``TCPY_CACHE_DIR``: cache root (default: ``platformdirs.user_cache_dir("tcpy")``); kernels
  live in its ``kernels/`` folder. A read-only or unusable directory gives one warning and a
  private temporary directory instead.
- ``TCPY_CC``: the C compiler (default ``gcc``). ``TCPY_CFLAGS``: extra flags, appended.
- ``TCPY_SANITIZE=1``: build with AddressSanitizer and UBSan (Python must then be started with
  the ASan runtime preloaded, e.g. ``LD_PRELOAD=$(gcc -print-file-name=libasan.so)``).
- ``TCPY_DEBUG>=1``: print each compiler command line to stderr.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Optional, Sequence

import platformdirs
from filelock import FileLock

from ..errors import TCCompilerError
from ..target import Target

DEFAULT_FLAGS = ("-O3", "-fopenmp", "-shared", "-fPIC", "-std=gnu11")
SANITIZE_FLAGS = ("-fsanitize=address,undefined", "-fno-omit-frame-pointer")
HEADER_NAME = "tcpy_runtime.h"

#: Number of times this process ran the C compiler (tests assert that cache hits do not).
compiler_invocations = 0

_memory: dict[str, Path] = {}  # cache key -> .so path, for this process
_handles: dict[str, ctypes.CDLL] = {}  # .so path -> loaded library, kept alive forever
_compiler_ids: dict[str, str] = {}  # compiler command -> first line of `cc --version`
_header_hash: Optional[str] = None
_warned_dirs: set[str] = set()
_fallback_dir: Optional[Path] = None


def runtime_include_dir() -> Path:
    """The directory holding ``tcpy_runtime.h``.

    In a source checkout (also an editable install) that is ``csrc/``, the file itself; an
    installed package carries a copy in ``tcpy/include/``.
    """
    package = Path(__file__).resolve().parent.parent
    for candidate in (package.parent / "csrc", package / "include"):
        if (candidate / HEADER_NAME).is_file():
            return candidate
    raise TCCompilerError(
        f"cannot find {HEADER_NAME} in {package.parent / 'csrc'} or {package / 'include'}; "
        "the tcpy installation is incomplete (reinstall it with pip)"
    )


def build_library(c_source: str, *, flags: Optional[Sequence[str]] = None, cc: Optional[str] = None,
                  target: Optional[Target] = None) -> Path:
    """Compile ``c_source`` for ``target`` (default: the host) into a shared library and return
    its path, using the caches.

    The target's ``-march`` flags follow :data:`DEFAULT_FLAGS`; ``flags`` are appended (so they
    can override them, e.g. ``["-ffast-math"]`` or ``["-O1"]``), then come ``$TCPY_CFLAGS`` and,
    with ``TCPY_SANITIZE=1``, the sanitizer flags. ``cc`` defaults to ``$TCPY_CC`` or ``gcc``.
    Raises :class:`~tcpy.TCCompilerError` if the compiler rejects the source.
    """
    cc = cc or os.environ.get("TCPY_CC") or "gcc"
    target = target or Target.host()
    all_flags = _effective_flags(target.compiler_flags(*_compiler_name_version(cc)), flags)
    key = _cache_key(c_source, cc, all_flags, target)
    path = _memory.get(key)
    if path is not None and path.is_file():
        return path
    kernels = _kernel_dir()
    so_path = kernels / f"{key}.so"
    if not _entry_is_valid(so_path):
        with FileLock(str(kernels / f"{key}.lock")):
            if not _entry_is_valid(so_path):  # another process may have built it meanwhile
                _compile(c_source, cc, all_flags, kernels, key)
    _memory[key] = so_path
    return so_path


def load_symbol(path: os.PathLike, name: str) -> int:
    """Load the shared library at ``path`` (once per process) and return the address of ``name``."""
    key = str(path)
    lib = _handles.get(key)
    if lib is None:
        lib = _handles[key] = ctypes.CDLL(key)
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


def cache_dir() -> Path:
    """The cache root in use: ``$TCPY_CACHE_DIR``, the user cache dir, or the temporary fallback."""
    return _kernel_dir().parent


def cache_info() -> dict:
    """``{"dir": str, "entries": number of compiled kernels, "bytes": total size of the files}``."""
    kernels = _kernel_dir()
    files = [f for f in kernels.iterdir() if f.is_file()]
    return {
        "dir": str(kernels.parent),
        "entries": sum(1 for f in files if f.suffix == ".so"),
        "bytes": sum(f.stat().st_size for f in files),
    }


def clear_cache() -> int:
    """Delete every compiled kernel on disk (and forget them in memory); return how many."""
    kernels = _kernel_dir()
    removed = 0
    for f in kernels.iterdir():
        if f.is_file() and f.suffix != ".lock":  # a lock may be held by another process
            removed += f.suffix == ".so"
            f.unlink(missing_ok=True)
        elif f.is_dir():
            shutil.rmtree(f, ignore_errors=True)
    _memory.clear()
    return removed


# ---------------------------------------------------------------------------------------------


def _effective_flags(target_flags: Sequence[str], flags: Optional[Sequence[str]]) -> tuple[str, ...]:
    result = list(DEFAULT_FLAGS) + list(target_flags)
    result += list(flags or ())
    result += shlex.split(os.environ.get("TCPY_CFLAGS", ""))
    if os.environ.get("TCPY_SANITIZE", "0") not in ("", "0"):
        result += SANITIZE_FLAGS
    return tuple(result)


def _cache_key(c_source: str, cc: str, flags: tuple[str, ...], target: Target) -> str:
    h = hashlib.sha256()
    for part in (c_source, _header_digest(), _compiler_id(cc), "\0".join(flags), target.key()):
        h.update(part.encode())
        h.update(b"\0\1")  # separator: no two different tuples hash the same text
    return h.hexdigest()


def _header_digest() -> str:
    global _header_hash
    if _header_hash is None:
        _header_hash = hashlib.sha256((runtime_include_dir() / HEADER_NAME).read_bytes()).hexdigest()
    return _header_hash


def _compiler_id(cc: str) -> str:
    """First line of ``cc --version``, once per process and compiler."""
    ident = _compiler_ids.get(cc)
    if ident is None:
        try:
            out = subprocess.run([cc, "--version"], capture_output=True, text=True, check=True).stdout
        except (OSError, subprocess.CalledProcessError) as e:
            raise TCCompilerError(
                f"cannot run the C compiler {cc!r} ({e}); install gcc or set TCPY_CC to a C compiler"
            ) from None
        ident = _compiler_ids[cc] = out.splitlines()[0] if out else cc
    return ident


def _compiler_name_version(cc: str) -> tuple[str, Optional[str]]:
    """(``gcc`` or ``clang`` or the command's name, its version) from ``cc --version``: what
    archspec needs to pick the ``-march`` flags for a target."""
    ident = _compiler_id(cc)
    name = "clang" if "clang" in ident else "gcc" if ("gcc" in ident or "GCC" in ident) else Path(cc).name
    version = next((w for w in reversed(ident.split()) if w[:1].isdigit() and w.count(".") >= 1), None)
    return name, version


def _kernel_dir() -> Path:
    """``<cache root>/kernels``, created if needed; falls back to a temporary directory."""
    global _fallback_dir
    root = Path(os.environ.get("TCPY_CACHE_DIR") or platformdirs.user_cache_dir("tcpy"))
    kernels = root / "kernels"
    problem = _unusable(kernels)
    if problem is None:
        return kernels
    if str(kernels) not in _warned_dirs:
        _warned_dirs.add(str(kernels))
        warnings.warn(
            f"tcpy: cannot use the kernel cache directory {kernels} ({problem}); compiled kernels "
            "go to a temporary directory for this process. Set TCPY_CACHE_DIR to a writable directory.",
            RuntimeWarning,
            stacklevel=3,
        )
    if _fallback_dir is None:
        _fallback_dir = Path(tempfile.mkdtemp(prefix="tcpy-cache-"))
    kernels = _fallback_dir / "kernels"
    kernels.mkdir(exist_ok=True)
    return kernels


def _unusable(directory: Path) -> Optional[str]:
    """Why ``directory`` cannot hold cache files, or None if it can (tried, not guessed)."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".probe-"):
            pass
    except OSError as e:
        return e.strerror or str(e)
    return None


def _entry_is_valid(so_path: Path) -> bool:
    """The .so exists and its bytes match the sha256 written beside it when it was built."""
    try:
        expected = so_path.with_suffix(".sha256").read_text().strip()
        actual = hashlib.sha256(so_path.read_bytes()).hexdigest()
    except OSError:
        return False
    return actual == expected


def _compile(c_source: str, cc: str, flags: tuple[str, ...], kernels: Path, key: str) -> None:
    """Run the compiler (the caller holds the key's lock) and publish .c, .sha256, .so atomically.

    The compiler reads ``<key>.c`` and writes a fixed temporary name, so the same input gives
    the same bytes (the file name ends up in the library's symbol table).
    """
    global compiler_invocations
    c_path, so_tmp = kernels / f"{key}.c", kernels / f".{key}.so.tmp"
    _write_atomic(c_path, c_source.encode())
    cmd = [cc, *flags, "-I", str(runtime_include_dir()), str(c_path), "-o", str(so_tmp), "-lm"]
    if _debug_level() >= 1:
        print("tcpy: " + shlex.join(cmd), file=sys.stderr)
    compiler_invocations += 1
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"})
    except OSError as e:
        raise TCCompilerError(f"cannot run the C compiler {cc!r}: {e}") from None
    if result.returncode != 0:
        so_tmp.unlink(missing_ok=True)
        (kernels / "failed").mkdir(exist_ok=True)
        kept = kernels / "failed" / c_path.name
        os.replace(c_path, kept)
        raise TCCompilerError(
            f"tcpy generated C that {Path(cc).name} rejected; this is a bug in tcpy, please report it "
            f"with {kept}\n{result.stderr.replace(str(c_path), str(kept)).strip()}"
        )
    so_bytes = so_tmp.read_bytes()
    _write_atomic(kernels / f"{key}.sha256", (hashlib.sha256(so_bytes).hexdigest() + "\n").encode())
    os.replace(so_tmp, kernels / f"{key}.so")


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _debug_level() -> int:
    try:
        return int(os.environ.get("TCPY_DEBUG", "0"))
    except ValueError:
        return 0
