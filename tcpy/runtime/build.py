"""Compile generated C into shared libraries, with a content-addressed cache in memory and on disk.

``build_library(c_source)`` returns the path of a ``.so`` built from ``c_source``. The disk
cache key is the sha256 of the source, the runtime header, the compiler command, the flags and
the :class:`~tcpy.target.Target` (which gives the ``-march`` flags), so a second process
building the same kernel finds it and runs no subprocess at all (also where no compiler is
installed: a deployment image with a warm cache).

Safety between processes: a per-key file lock makes one process compile while the others wait
and then reuse its result; files appear atomically (written under a temporary name in the cache
directory, then ``os.replace``); each ``.so`` has a sidecar with its sha256, and an entry whose
bytes do not match (truncated, corrupt, half-copied, or another entry's files copied over it:
the checksum covers the key) is rebuilt, never loaded. The sidecar also names the compiler
binary (path, size, mtime) that built the entry: a changed compiler rebuilds it.

A source in *units* (:data:`UNIT_MARK`: a size-generic kernel's, :mod:`tcpy.codegen.units`) is
compiled as several translation units, one gcc process per core this process may run on, then
linked into the one library of its key: the cache, its lock and its files are a single
source's.

Environment:

- ``TCPY_CACHE_DIR``: cache root (default: ``platformdirs.user_cache_dir("tcpy")``); kernels
  live in its ``kernels/`` folder. A read-only or unusable directory gives one warning and a
  private temporary directory instead.
- ``TCPY_CC``: the C compiler (default ``gcc``). ``TCPY_CFLAGS``: extra flags, appended.
- ``TCPY_SANITIZE=1``: build with AddressSanitizer and UBSan (Python must then be started with
  the ASan runtime preloaded, e.g. ``LD_PRELOAD=$(gcc -print-file-name=libasan.so)``).
- ``TCPY_DEBUG>=1``: print each compiler command line to stderr; ``TCPY_DEBUG=2`` also the IR
  after each pass of a specialisation (:data:`tcpy.api.PASSES`).
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional, Sequence

import platformdirs
from filelock import FileLock

from ..errors import TCCompilerError, TCOptionError
from ..target import Target

DEFAULT_FLAGS = ("-O3", "-fopenmp", "-shared", "-fPIC", "-std=gnu11")
SANITIZE_FLAGS = ("-fsanitize=address,undefined", "-fno-omit-frame-pointer")
# Flags with which gcc (before 13) links crtfastmath.o into the library: its constructor turns on
# flush-to-zero and denormals-are-zero in the thread that loads it, for all the process's later
# float arithmetic (NumPy's included). With them, the kernel is compiled with them and linked
# without them.
FAST_MATH_LINK_FLAGS = frozenset({"-ffast-math", "-Ofast", "-funsafe-math-optimizations"})
# Sanitizers whose runtime must be loaded before anything else in the process: a library built
# with them aborts the interpreter when it is loaded into a Python started without it.
PRELOADED_SANITIZERS = {"address": "libasan", "hwaddress": "libhwasan", "thread": "libtsan", "leak": "liblsan"}
# Part of every cache key: raised when the way a library is built changes (not its flags), so
# that no entry built the old way is loaded. 2: fast-math flags no longer reach the link.
BUILD_RECIPE = "2"
HEADER_NAME = "tcpy_runtime.h"
#: A line that starts a unit of a source compiled as several translation units: ``/* tcpy unit
#: */``, or with the flags the unit needs after tcpy's defaults, ``/* tcpy unit: -O2 */``. The
#: lines before the first mark are the declarations every translation unit starts with.
UNIT_MARK = "/* tcpy unit"
# gcc's time for a unit, in characters of its C: about 2 us a character, 4 ms a loop and 25 ms
# an OpenMP construct, at -O2 and -O3 alike (gcc 12, AMD Zen 5; within 20% for GEMM, convolution
# and attention libraries). What cuts a build into pieces of about equal time.
LOOP_CHARS, OPENMP_CHARS = 2000, 12500

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
                  target: Optional[Target] = None, user_flags: Sequence[str] = ()) -> Path:
    """Compile ``c_source`` for ``target`` (default: the host) into a shared library and return
    its path, using the caches.

    The target's ``-march`` flags follow :data:`DEFAULT_FLAGS`; ``flags`` (tcpy's) and then
    ``user_flags`` (the user's ``Options.cflags``) are appended (so they can override them, e.g.
    ``["-ffast-math"]`` or ``["-O1"]``), then come ``$TCPY_CFLAGS`` and, with ``TCPY_SANITIZE=1``,
    the sanitizer flags. ``cc`` defaults to ``$TCPY_CC`` or ``gcc``.

    A cache hit starts no subprocess: the key needs no compiler, and an entry records the
    compiler binary (path, size, mtime) that built it; when that compiler is installed but
    changed, the entry is rebuilt, and when none is installed the entry is used as it is.
    Raises :class:`~tcpy.TCCompilerError` if the compiler rejects the source, or
    :class:`~tcpy.TCOptionError` if only the user's flags make it fail.
    """
    cc = cc or os.environ.get("TCPY_CC") or "gcc"
    target = target or Target.host()
    extra = tuple(flags or ()) + tuple(user_flags) + _environment_flags()
    key = _cache_key(c_source, cc, extra, target)
    path = _memory.get(key)
    if path is not None and path.is_file():
        return path
    kernels = _kernel_dir()
    blocked = [p for p in (kernels / f"{key}{suffix}" for suffix in (".so", ".lock", ".sha256", ".c"))
               if p.exists() and not p.is_file()]
    if blocked:  # (a directory where an entry's file belongs: build it where it can be written)
        _warn_once(str(blocked[0]), f"tcpy: {blocked[0]} is not a file, so this kernel cannot be cached there; "
                   "it is built in a temporary directory for this process. Remove it to cache the kernel again.")
        kernels = _temporary_kernel_dir()
    so_path = kernels / f"{key}.so"
    compiler = _compiler_file(cc)
    if not _entry_is_valid(so_path, key, compiler):
        with FileLock(str(kernels / f"{key}.lock")):
            if not _entry_is_valid(so_path, key, compiler):  # another process may have built it meanwhile
                base = DEFAULT_FLAGS + target.compiler_flags(*_compiler_name_version(cc))
                user = tuple(user_flags) + _environment_flags(sanitize=False)
                _compile(c_source, cc, base, extra, user, kernels, key, compiler)
    _memory[key] = so_path
    return so_path


def load_symbol(path: os.PathLike, name: str) -> int:
    """Load the shared library at ``path`` (once per process) and return the address of ``name``.

    A library that does not load or lacks ``name`` (a damaged cache entry) is removed from the
    cache and reported as :class:`~tcpy.TCCompilerError`; building it again replaces it.
    """
    key = str(path)
    try:
        lib = _handles.get(key)
        if lib is None:
            lib = _handles[key] = ctypes.CDLL(key)
        return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
    except (OSError, AttributeError) as err:
        _handles.pop(key, None)
        _forget(Path(path))
        raise TCCompilerError(f"cannot load {name} from the cached kernel {path} ({err}); "
                              "the entry was removed and is rebuilt on the next call") from None


def check_loadable(user_flags: Sequence[str] = ()) -> None:
    """Raise :class:`~tcpy.TCOptionError` when a library built with ``user_flags`` and the
    environment's flags could not be loaded into this process: a ``-fsanitize=`` flag whose
    runtime the process did not load at start (loading would abort the interpreter)."""
    flags = tuple(user_flags) + _environment_flags()
    wanted = [name for flag in flags if flag.startswith("-fsanitize=") for name in flag.split("=", 1)[1].split(",")]
    missing = [name for name in wanted if name in PRELOADED_SANITIZERS
               and PRELOADED_SANITIZERS[name] not in _loaded_libraries()]
    if missing:
        runtime = PRELOADED_SANITIZERS[missing[0]]
        raise TCOptionError(
            f"the compiler flag -fsanitize={missing[0]} (from Options.cflags, TCPY_CFLAGS or TCPY_SANITIZE) needs "
            f"{runtime} loaded when Python starts, or loading the kernel aborts the interpreter: start Python with "
            f'LD_PRELOAD="$(gcc -print-file-name={runtime}.so)", or leave the flag out')


def _loaded_libraries() -> str:
    """The paths of the shared libraries mapped into this process (Linux), as one text."""
    try:
        return Path("/proc/self/maps").read_text()
    except OSError:
        return ""


#: The first line of a size-generic kernel's C (:mod:`tcpy.generic`): how the cache tells its
#: entries apart from kernels specialised to shapes.
GENERIC_MARK = "/* Generated by tcpy: size-generic. */"


def cache_dir() -> Path:
    """The cache root in use: ``$TCPY_CACHE_DIR``, the user cache dir, or the temporary fallback."""
    return _kernel_dir().parent


def cache_info() -> dict:
    """``{"dir": str, "entries": number of compiled kernels, "generic": how many of them are
    size-generic (the others are specialised to shapes), "bytes": total size of the files}``."""
    kernels = _kernel_dir()
    files = [f for f in kernels.iterdir() if f.is_file()]
    libraries = [f for f in files if f.suffix == ".so"]
    return {
        "dir": str(kernels.parent),
        "entries": len(libraries),
        "generic": sum(_is_generic(f.with_suffix(".c")) for f in libraries),
        "bytes": sum(f.stat().st_size for f in files),
    }


def _is_generic(c_file: Path) -> bool:
    """Whether the C source of a cache entry is a size-generic kernel's (its first line says so)."""
    try:
        with open(c_file, encoding="utf-8", errors="replace") as f:
            return f.readline().rstrip("\n") == GENERIC_MARK
    except OSError:
        return False


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


def _environment_flags(sanitize: bool = True) -> tuple[str, ...]:
    """``$TCPY_CFLAGS``, then (with ``sanitize``) the sanitizer flags if ``TCPY_SANITIZE`` asks."""
    try:
        result = shlex.split(os.environ.get("TCPY_CFLAGS", ""))
    except ValueError as err:
        raise TCOptionError(f"TCPY_CFLAGS must be shell-quoted compiler flags, got "
                            f"{os.environ['TCPY_CFLAGS']!r} ({err})") from None
    if sanitize and os.environ.get("TCPY_SANITIZE", "0") not in ("", "0"):
        result += SANITIZE_FLAGS
    return tuple(result)


def _cache_key(c_source: str, cc: str, flags: tuple[str, ...], target: Target) -> str:
    """The entry's name. The compiler's version is not in it (finding it would start a
    subprocess); the entry's sidecar records the compiler binary instead (see _entry_is_valid),
    and the target gives the -march flags."""
    h = hashlib.sha256()
    for part in (c_source, _header_digest(), cc, "\0".join(flags), target.key(), BUILD_RECIPE):
        h.update(part.encode())
        h.update(b"\0\1")  # separator: no two different tuples hash the same text
    return h.hexdigest()


def _header_digest() -> str:
    global _header_hash
    if _header_hash is None:
        _header_hash = hashlib.sha256((runtime_include_dir() / HEADER_NAME).read_bytes()).hexdigest()
    return _header_hash


def _compiler_file(cc: str) -> Optional[str]:
    """``path|size|mtime`` of the compiler binary ``cc`` resolves to, or None if it is not
    installed: what tells a changed compiler apart, without running it."""
    found = shutil.which(cc)
    if found is None:
        return None
    real = os.path.realpath(found)
    try:
        st = os.stat(real)
    except OSError:
        return None
    return f"{real}|{st.st_size}|{st.st_mtime_ns}"


def _compiler_id(cc: str) -> str:
    """First line of ``cc --version``, once per process and compiler (only for builds)."""
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
    kernels = _kernels_in(configured_cache_root())
    problem = _unusable(kernels)
    if problem is None:
        return kernels
    _warn_once(str(kernels), f"tcpy: cannot use the kernel cache directory {kernels} ({problem}); compiled kernels "
               "go to a temporary directory for this process. Set TCPY_CACHE_DIR to a writable directory.")
    return _temporary_kernel_dir()


def configured_cache_root() -> str:
    """The cache root the environment names: ``$TCPY_CACHE_DIR``, else the user cache dir; not
    checked (:func:`cache_dir` is the one in use, a temporary fallback when this one cannot be
    written; a lookup that only reads, as a new call shape's of tuned options, needs no check)."""
    return os.environ.get("TCPY_CACHE_DIR") or _user_cache_root(os.environ.get("XDG_CACHE_HOME"),
                                                                os.environ.get("HOME"))


@functools.lru_cache(maxsize=16)
def _user_cache_root(xdg_cache_home: Optional[str], home: Optional[str]) -> str:
    """The user's cache directory for tcpy, asked of platformdirs once per value of the variables
    it reads (every new call shape's tuning lookup needs it; platformdirs takes some 5 us)."""
    return platformdirs.user_cache_dir("tcpy")


@functools.lru_cache(maxsize=16)
def _kernels_in(root: str) -> Path:
    """``<root>/kernels`` (made once per root: a new call shape's tuning lookup asks)."""
    return Path(root) / "kernels"


def _temporary_kernel_dir() -> Path:
    """A private ``kernels`` directory for this process, created on first use."""
    global _fallback_dir
    if _fallback_dir is None:
        _fallback_dir = Path(tempfile.mkdtemp(prefix="tcpy-cache-"))
    kernels = _fallback_dir / "kernels"
    kernels.mkdir(exist_ok=True)
    return kernels


def _warn_once(about: str, message: str) -> None:
    """A RuntimeWarning about a cache path, once per process and path."""
    if about not in _warned_dirs:
        _warned_dirs.add(about)
        warnings.warn(message, RuntimeWarning, stacklevel=4)


_probed: set[str] = set()  # directories a file was created in by this process


def _unusable(directory: Path) -> Optional[str]:
    """Why ``directory`` cannot hold cache files, or None if it can (tried once per process and
    directory, not guessed; later only its permissions are checked: every new call shape asks)."""
    if str(directory) in _probed and os.access(directory, os.W_OK | os.X_OK):
        return None
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".probe-"):
            pass
    except OSError as e:
        return e.strerror or str(e)
    _probed.add(str(directory))
    return None


def _entry_digest(key: str, compiler: str, so_bytes: bytes) -> str:
    """Checksum of an entry, bound to its key and compiler: another kernel's .so and sidecar
    copied over this entry do not match."""
    return hashlib.sha256(key.encode() + b"\0" + compiler.encode() + b"\0" + so_bytes).hexdigest()


def _entry_is_valid(so_path: Path, key: str, compiler: Optional[str]) -> bool:
    """The .so exists, its sidecar's checksum matches its bytes and its key, and it was built by
    ``compiler`` (when one is installed: a missing compiler accepts any compiler's entry)."""
    try:
        digest, built_by = so_path.with_suffix(".sha256").read_text().split("\n")[:2]
        so_bytes = so_path.read_bytes()
    except (OSError, ValueError):
        return False
    if compiler is not None and built_by != compiler:
        return False
    return digest == _entry_digest(key, built_by, so_bytes)


def _forget(so_path: Path) -> None:
    """Remove a cache entry (its .so and sidecar) from disk and from memory."""
    for path in (so_path, so_path.with_suffix(".sha256")):
        path.unlink(missing_ok=True)
    for key in [k for k, p in _memory.items() if p == so_path]:
        del _memory[key]


def _compile(c_source: str, cc: str, base: tuple[str, ...], flags: tuple[str, ...], user_flags: tuple[str, ...],
             kernels: Path, key: str, compiler: Optional[str]) -> None:
    """Run the compiler (the caller holds the key's lock) and publish .c, .sha256, .so atomically.

    The compiler reads ``<key>.c`` and writes a fixed temporary name, so the same input gives
    the same bytes (the file name ends up in the library's symbol table). ``base``: tcpy's
    defaults and the target's flags, ``flags`` the others. If it fails and the build without
    ``user_flags`` (a subset of ``flags``) succeeds, the user's flags are blamed.
    """
    c_path, so_tmp = kernels / f"{key}.c", kernels / f".{key}.so.tmp"
    _write_atomic(c_path, c_source.encode())
    result = _run_compiler(cc, base, flags, c_path, c_source, so_tmp)
    if result.returncode != 0:
        so_tmp.unlink(missing_ok=True)
        if user_flags:
            without = list(flags)
            for flag in user_flags:
                without.remove(flag)
            if _run_compiler(cc, base, tuple(without), c_path, c_source, so_tmp).returncode == 0:
                so_tmp.unlink(missing_ok=True)
                raise TCOptionError(
                    f"{Path(cc).name} fails with your extra flags {shlex.join(user_flags)} (from "
                    f"Options.cflags or TCPY_CFLAGS) and succeeds without them:\n{result.stderr.strip()}")
        (kernels / "failed").mkdir(exist_ok=True)
        kept = kernels / "failed" / c_path.name
        os.replace(c_path, kept)
        raise TCCompilerError(
            f"tcpy generated C that {Path(cc).name} rejected; this is a bug in tcpy, please report it "
            f"with {kept}\n{result.stderr.replace(str(c_path), str(kept)).strip()}"
        )
    so_bytes = so_tmp.read_bytes()
    built_by = compiler or cc
    sidecar = f"{_entry_digest(key, built_by, so_bytes)}\n{built_by}\n"
    _write_atomic(kernels / f"{key}.sha256", sidecar.encode())
    os.replace(so_tmp, kernels / f"{key}.so")


def _run_compiler(cc: str, base: tuple[str, ...], flags: tuple[str, ...], c_path: Path, c_source: str,
                  so_path: Path) -> subprocess.CompletedProcess:
    """Compile ``c_source`` (written at ``c_path``) with ``base`` and ``flags`` (a unit's flags
    between them) into ``so_path``: in one gcc run, or, for a source in units or with fast-math
    flags, into objects (units side by side) and a link without fast-math flags (see
    FAST_MATH_LINK_FLAGS)."""
    global compiler_invocations
    compiler_invocations += 1
    include = ("-I", str(runtime_include_dir()))
    units = translation_units(c_source, str(c_path), _build_jobs())
    if len(units) == 1 and FAST_MATH_LINK_FLAGS.isdisjoint(base + flags):
        return _run(cc, [cc, *base, *flags, *include, str(c_path), "-o", str(so_path), "-lm"])
    # fixed names (from the key): the same source gives the same bytes
    stem = so_path.parent / f".{c_path.stem}"
    written = [] if len(units) == 1 else [Path(f"{stem}.{n}.c") for n in range(len(units))]
    sources = written or [c_path]
    objects = [Path(f"{stem}.{n}.o") for n in range(len(units))]
    try:
        for path, (_, text) in zip(written, units):
            path.write_text(text)
        commands = [[cc, *base, *unit_flags, *flags, *include, "-c", str(source), "-o", str(obj)]
                    for (unit_flags, _), source, obj in zip(units, sources, objects)]
        with ThreadPoolExecutor(max_workers=_build_jobs()) as pool:  # (each takes the next when it is done)
            results = list(pool.map(lambda command: _run(cc, command), commands))
        failed = next((result for result in results if result.returncode != 0), None)
        if failed is not None:
            return failed
        link = [f for f in base + flags if f not in FAST_MATH_LINK_FLAGS]
        return _run(cc, [cc, *link, *map(str, objects), "-o", str(so_path), "-lm"])
    finally:
        for path in objects + written:
            path.unlink(missing_ok=True)


def translation_units(c_source: str, file_name: str, jobs: int) -> list[tuple[tuple[str, ...], str]]:
    """``(flags, C)`` of each translation unit to compile ``c_source`` (its path ``file_name`` in
    diagnostics) from, the longest (estimated) first: ``c_source`` itself when it holds no unit
    marks (:data:`UNIT_MARK`); else its declarations, then a run of its units of one flags (in
    the order of the source: callees before callers, as gcc laid them out in one file, measured
    faster), the runs cut at about half of a job's share of the estimated time: ``jobs`` gcc
    processes that take the next one when they finish end together (a ``#line`` before each
    unit: gcc reports the lines of ``c_source``)."""
    lines = c_source.split("\n")
    starts = [n for n, line in enumerate(lines) if line.startswith(UNIT_MARK)]
    if not starts:
        return [((), c_source)]
    head = "\n".join(lines[:starts[0]]) + "\n"
    groups: dict[tuple[str, ...], list[tuple[int, str]]] = {}
    for start, end in zip(starts, starts[1:] + [len(lines)]):
        mark = lines[start][len(UNIT_MARK):].strip().removesuffix("*/").strip()
        flags = tuple(shlex.split(mark.removeprefix(":")))
        text = f'#line {start + 2} "{file_name}"\n' + "\n".join(lines[start + 1:end]) + "\n"
        weight = len(text) + LOOP_CHARS * text.count("for (") + OPENMP_CHARS * text.count("#pragma omp")
        groups.setdefault(flags, []).append((weight, text))
    piece = sum(weight for units in groups.values() for weight, _ in units) / (2 * jobs)
    pieces = []  # [weight, flags, text]
    for flags, units in groups.items():
        for weight, text in units:
            if not pieces or pieces[-1][1] != flags or pieces[-1][0] + weight / 2 > piece:
                pieces.append([0, flags, head])
            pieces[-1][0] += weight
            pieces[-1][2] += text
    return [(flags, text) for _, flags, text in sorted(pieces, key=lambda p: -p[0])]


def _build_jobs() -> int:
    """How many gcc processes a build runs at once: the cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # (not on Linux)
        return os.cpu_count() or 1


def _run(cc: str, cmd: list[str]) -> subprocess.CompletedProcess:
    if debug_level() >= 1:
        print("tcpy: " + shlex.join(cmd), file=sys.stderr)
    try:
        return subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"})
    except OSError as e:
        raise TCCompilerError(f"cannot run the C compiler {cc!r}: {e}") from None


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def debug_level() -> int:
    """``$TCPY_DEBUG`` as an int (0 when unset or not a number): 1 prints each compiler command,
    2 also the IR after each pass of a specialisation."""
    try:
        return int(os.environ.get("TCPY_DEBUG", "0"))
    except ValueError:
        return 0
