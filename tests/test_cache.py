"""The kernel cache: in memory, on disk across processes, under concurrency, corruption, bad dirs."""
import os
import subprocess
import sys
import textwrap
import uuid
import warnings

import pytest

from tcpy import TCCompilerError
from tcpy.runtime import build


def kernel_source(tag=None):
    """A small valid kernel; a fresh tag makes a source no cache has seen."""
    tag = tag or uuid.uuid4().hex
    return textwrap.dedent(f"""\
        #include "tcpy_runtime.h"
        /* {tag} */
        int k(void *const *buffers, int num_threads, int64_t *err, const volatile int *stop) {{
            (void)num_threads; (void)err;
            float *out = buffers[0];
            out[0] = 42.0f;
            return 0;
        }}
        """)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A private cache dir for the test, and clean process-level state."""
    monkeypatch.setenv("TCPY_CACHE_DIR", str(tmp_path / "cache"))
    for var in ("TCPY_CFLAGS", "TCPY_SANITIZE", "TCPY_CC", "TCPY_DEBUG"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(build, "_memory", {})
    return tmp_path / "cache" / "kernels"


# A second Python process that builds the given source (from a file) with the test's cache dir and
# reports how often it ran the compiler and whether the kernel works.
CHILD = textwrap.dedent("""\
    import ctypes, sys
    from tcpy.runtime import build
    path = build.build_library(open(sys.argv[1]).read())
    out = (ctypes.c_float * 1)()
    fn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p)(build.load_symbol(path, "k"))
    buffers = (ctypes.c_void_p * 1)(ctypes.addressof(out))
    assert fn(buffers, 1, None) == 0 and out[0] == 42.0
    print(build.compiler_invocations)
    """)


def spawn(source_file, cache_root):
    env = dict(os.environ, TCPY_CACHE_DIR=str(cache_root))
    return subprocess.Popen([sys.executable, "-c", CHILD, str(source_file)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc):
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return int(out.strip())


def test_second_call_in_process_does_not_compile(cache):
    src = kernel_source()
    before = build.compiler_invocations
    path = build.build_library(src)
    assert build.compiler_invocations == before + 1
    assert path.parent == cache and path.suffix == ".so"
    assert build.build_library(src) == path
    build._memory.clear()  # the disk entry alone is enough
    assert build.build_library(src) == path
    assert build.compiler_invocations == before + 1


def test_flags_are_part_of_the_key(cache):
    src = kernel_source()
    assert build.build_library(src) != build.build_library(src, flags=["-O1"])


def test_second_process_does_not_run_the_compiler(cache, tmp_path):
    source_file = tmp_path / "k.c"
    source_file.write_text(kernel_source())
    assert finish(spawn(source_file, cache.parent)) == 1
    assert finish(spawn(source_file, cache.parent)) == 0
    # and this process finds it too
    before = build.compiler_invocations
    build.build_library(source_file.read_text())
    assert build.compiler_invocations == before


def test_two_processes_compiling_the_same_new_kernel_both_succeed(cache, tmp_path):
    source_file = tmp_path / "k.c"
    source_file.write_text(kernel_source())
    procs = [spawn(source_file, cache.parent) for _ in range(2)]
    counts = [finish(p) for p in procs]
    assert sorted(counts) == [0, 1]  # the file lock lets exactly one of them run gcc
    assert len(list(cache.glob("*.so"))) == 1
    assert not [f for f in cache.iterdir() if f.name.startswith(".")]  # no temp files left


@pytest.mark.parametrize("damage", ["truncate", "garbage", "delete sidecar"])
def test_corrupt_entry_is_rebuilt_not_loaded(cache, damage):
    src = kernel_source()
    path = build.build_library(src)
    good = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(good[: len(good) // 3])
    elif damage == "garbage":
        path.write_bytes(b"\x7fELF" + b"\0" * 100)
    else:
        path.with_suffix(".sha256").unlink()
    build._memory.clear()  # as in a new process
    before = build.compiler_invocations
    assert build.build_library(src) == path
    assert build.compiler_invocations == before + 1
    assert path.read_bytes() == good  # gcc is deterministic for the same input
    assert build.load_symbol(path, "k")


def test_unusable_cache_dir_falls_back_with_one_warning(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache dir should be")
    monkeypatch.setenv("TCPY_CACHE_DIR", str(blocker / "cache"))
    monkeypatch.setattr(build, "_memory", {})
    monkeypatch.setattr(build, "_warned_dirs", set())
    monkeypatch.setattr(build, "_fallback_dir", None)
    with pytest.warns(RuntimeWarning, match=r"cannot use the kernel cache directory .*not-a-dir/cache/kernels"):
        path = build.build_library(kernel_source())
    assert not str(path).startswith(str(blocker)) and path.is_file()
    assert build.load_symbol(path, "k")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # only one warning per directory
        build.build_library(kernel_source())
    assert build.cache_info()["dir"] == str(path.parent.parent)


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write to a read-only directory")
def test_read_only_cache_dir_falls_back(tmp_path, monkeypatch):
    ro = tmp_path / "ro"
    (ro / "kernels").mkdir(parents=True)
    os.chmod(ro / "kernels", 0o555)
    monkeypatch.setenv("TCPY_CACHE_DIR", str(ro))
    monkeypatch.setattr(build, "_memory", {})
    monkeypatch.setattr(build, "_warned_dirs", set())
    monkeypatch.setattr(build, "_fallback_dir", None)
    try:
        with pytest.warns(RuntimeWarning, match="cannot use the kernel cache directory"):
            path = build.build_library(kernel_source())
        assert path.is_file() and ro not in path.parents
    finally:
        os.chmod(ro / "kernels", 0o755)


def test_compiler_error_is_reported_as_a_tcpy_bug_and_keeps_the_source(cache):
    src = kernel_source() + "\nint broken(void) { return undefined_name; }\n"
    with pytest.raises(TCCompilerError) as info:
        build.build_library(src)
    message = str(info.value)
    assert message.startswith("tcpy generated C that gcc rejected; this is a bug in tcpy, please report it with ")
    kept = message.split(" with ", 1)[1].splitlines()[0]
    assert kept.endswith(".c") and open(kept).read() == src
    assert "'undefined_name' undeclared" in message  # gcc's own diagnostic follows (in LC_ALL=C)
    assert f"{kept}:" in message  # and it names the kept file, not a temporary one
    assert not list(cache.glob("*.so"))


def test_missing_compiler_is_a_clear_error(cache):
    with pytest.raises(TCCompilerError, match="cannot run the C compiler 'no-such-cc-tcpy'"):
        build.build_library(kernel_source(), cc="no-such-cc-tcpy")


def test_environment_flags_sanitizer_and_debug_log(cache, monkeypatch, capfd):
    monkeypatch.setenv("TCPY_CFLAGS", "-DTCPY_TEST_FLAG=1 -O2")
    monkeypatch.setenv("TCPY_SANITIZE", "1")
    monkeypatch.setenv("TCPY_DEBUG", "1")
    build.build_library(kernel_source())  # built, not loaded: loading ASan code needs LD_PRELOAD
    logged = capfd.readouterr().err
    assert logged.startswith("tcpy: gcc -O3 -fopenmp -shared -fPIC -std=gnu11 -march=")
    assert "-DTCPY_TEST_FLAG=1 -O2 -fsanitize=address,undefined -fno-omit-frame-pointer" in logged


def test_cache_info_and_clear(cache):
    assert build.cache_info() == {"dir": str(cache.parent), "entries": 0, "generic": 0, "bytes": 0}
    build.build_library(kernel_source())
    build.build_library(kernel_source())
    info = build.cache_info()
    assert info["entries"] == 2 and info["bytes"] > 0
    assert build.clear_cache() == 2
    assert build.cache_info()["entries"] == 0
    before = build.compiler_invocations
    build.build_library(kernel_source("same"))
    build.clear_cache()
    build.build_library(kernel_source("same"))  # cleared from memory too
    assert build.compiler_invocations == before + 2


def test_runtime_header_is_found():
    assert (build.runtime_include_dir() / "tcpy_runtime.h").is_file()


def test_another_kernels_files_copied_over_an_entry_are_rebuilt(cache):
    """Issue 15, item 6: the checksum covers the entry's key, so a swapped .so is not run."""
    src, other = kernel_source(), kernel_source()
    path, other_path = build.build_library(src), build.build_library(other)
    for suffix in (".so", ".sha256"):
        path.with_suffix(suffix).write_bytes(other_path.with_suffix(suffix).read_bytes())
    build._memory.clear()
    before = build.compiler_invocations
    assert build.build_library(src) == path
    assert build.compiler_invocations == before + 1


def test_a_damaged_library_with_a_matching_checksum_is_removed_and_rebuilt(cache):
    """Issue 15, item 4: a .so that fails to load is a TCCompilerError and leaves the cache."""
    src = kernel_source()
    path = build.build_library(src)
    digest, compiler = path.with_suffix(".sha256").read_text().split("\n")[:2]
    garbage = b"\x7fELF" + b"\0" * 200
    path.write_bytes(garbage)
    path.with_suffix(".sha256").write_text(f"{build._entry_digest(path.stem, compiler, garbage)}\n{compiler}\n")
    build._memory.clear()
    assert build.build_library(src) == path  # the checksum matches: a hit
    with pytest.raises(TCCompilerError, match="cannot load k from the cached kernel .*rebuilt on the next call"):
        build.load_symbol(path, "k")
    assert not path.exists()
    assert build.load_symbol(build.build_library(src), "k")


def test_a_warm_cache_needs_no_compiler_and_starts_no_subprocess(cache, tmp_path, monkeypatch):
    """Issue 15, item 11: a deployment image without gcc runs the kernels it has cached."""
    import numpy as np

    import tcpy

    source = "def f(float(N) A) -> (O) { O(i) = A(i) * 2 }"
    A = np.arange(4, dtype=np.float32)
    tcpy.define(source)(A)
    build._memory.clear()
    monkeypatch.setattr(build, "_compiler_ids", {})
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no gcc on the PATH

    def no_subprocess(*args, **kwargs):
        raise AssertionError(f"a cache hit started a subprocess: {args}")

    monkeypatch.setattr(subprocess, "Popen", no_subprocess)
    np.testing.assert_array_equal(tcpy.define(source)(A), A * 2)


def test_a_changed_compiler_invalidates_entries(cache, tmp_path, monkeypatch):
    """Issue 15, item 11: the entry records the compiler binary (path, size, mtime)."""
    import shutil

    wrapper = tmp_path / "bin" / "cc"
    wrapper.parent.mkdir()
    wrapper.write_text(f"#!/bin/sh\nexec {shutil.which('gcc')} \"$@\"\n")
    wrapper.chmod(0o755)
    src = kernel_source()
    build.build_library(src, cc=str(wrapper))
    build._memory.clear()
    before = build.compiler_invocations
    build.build_library(src, cc=str(wrapper))
    assert build.compiler_invocations == before  # unchanged compiler: a hit
    wrapper.write_text(wrapper.read_text() + "# a new version\n")
    build._memory.clear()
    build.build_library(src, cc=str(wrapper))
    assert build.compiler_invocations == before + 1


def test_a_user_flag_that_breaks_the_build_is_blamed_on_the_flag(cache):
    """Issue 15, item 5: not reported as a tcpy bug."""
    from tcpy import TCOptionError

    with pytest.raises(TCOptionError, match="fails with your extra flags -fno-such-flag-tcpy .*succeeds without"):
        build.build_library(kernel_source(), user_flags=["-fno-such-flag-tcpy"])
    assert not list(cache.glob("*.so"))


def test_unbalanced_quote_in_tcpy_cflags_is_an_option_error(cache, monkeypatch):
    from tcpy import TCOptionError

    monkeypatch.setenv("TCPY_CFLAGS", "-DX='1")
    with pytest.raises(TCOptionError, match="TCPY_CFLAGS must be shell-quoted compiler flags, got \"-DX='1\""):
        build.build_library(kernel_source())
