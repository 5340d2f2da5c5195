"""Compiled kernels under AddressSanitizer + UBSan: no out-of-bounds access, no undefined behaviour.

With ``TCPY_SANITIZE=1`` the kernel builds add ``-fsanitize=address,undefined`` (see
``tcpy/runtime/build.py``). A sanitized shared library can only be loaded into a process that
started with the ASan runtime, so this test runs a child Python with (libstdc++ is preloaded
too, or ASan cannot intercept the C++ exceptions islpy throws: "real___cxa_throw" CHECK failure)::

    LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libstdc++.so)" \\
    ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \\
    TCPY_SANITIZE=1 TCPY_CACHE_DIR=<a fresh directory> python -c <CHILD>

The child compiles and runs GEMM, conv2d (stride 1 and 2; padded 3x3 ones forced onto the Winograd
path, NCHW and NHWC), attention as several statements, a
fused chain whose last product gathers its B columns (at two threads), a chain that defers its
quotient past the last product (rows that take the quotient itself included), a chain in the
online-softmax form (rows computed again whole included), two products back to back, a padded stencil whose
untaken ternary branches would read out of bounds, a LUT gather whose run-time check must fire
before the read, gathers from tensors without elements (where no element 0 exists to fall back
to), and ``TCPY_SANITIZE_EXAMPLES`` (default 15) random programs from ``tests/strategies.py``,
each compared with the reference evaluator. Any sanitizer report aborts the child; the test
fails and shows it.

Run it alone::

    python -m pytest tests/test_sanitizer.py -q

It skips (with the reason) when gcc has no libasan, or when Python cannot start with it
preloaded (e.g. a Python built with another sanitizer, or an ASan-incompatible kernel setting).
"""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
EXAMPLES = int(os.environ.get("TCPY_SANITIZE_EXAMPLES", "15"))

CHILD = textwrap.dedent(
    """
    import sys
    import numpy as np
    import tcpy
    from hypothesis import HealthCheck, Phase, given, settings

    rng = np.random.default_rng(0)

    def rand(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    def same(src, *args, threads=None, target=None, specialize="auto"):
        got = tcpy.define(src, options=tcpy.Options(num_threads=threads, target=target, specialize=specialize))(*args)
        want = tcpy.define(src, backend="reference")(*args)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)

    same("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }",
         rand(33, 17), rand(17, 29))
    # Winograd F(2x2, 3x3) forced onto small padded convolutions: vector loads of 8 tiles side by
    # side, border tiles, the last partial sliver, NCHW and NHWC, at two threads
    import dataclasses
    import tcpy.target
    measured_costs = tcpy.target.cost_model  # (every ISA family's constants, any gain taken)
    tcpy.target.cost_model = lambda target: dataclasses.replace(measured_costs(target), winograd_gain_min=0.0)
    conv_nchw = '''def conv(float(N,C,H,W) I, float(F,C,3,3) Wt) -> (O) {
             O(n, f, h, w) +=! (h + kh >= 1 && h + kh <= H && w + kw >= 1 && w + kw <= W)
                               ? I(n, c, h + kh - 1, w + kw - 1) * Wt(f, c, kh, kw) : 0.0
                 where h in 0:H, w in 0:W, kh in 0:3, kw in 0:3
         }'''
    conv_nhwc = '''def conv(float(N,H,W,C) I, float(3,3,C,F) Wt) -> (O) {
             O(n, h, w, f) +=! (h + kh >= 1 && h + kh <= H && w + kw >= 1 && w + kw <= W)
                               ? I(n, h + kh - 1, w + kw - 1, c) * Wt(kh, kw, c, f) : 0.0
                 where h in 0:H, w in 0:W, kh in 0:3, kw in 0:3
         }'''
    same(conv_nchw, rand(2, 3, 9, 37), rand(7, 3, 3, 3), threads=2)
    same(conv_nhwc, rand(1, 11, 7, 5), rand(3, 3, 5, 16), threads=2)
    # F(4x4, 3x3) forced likewise, on kernels specialised to these shapes and on size-generic
    # ones: gathered groups of tiles, partial tiles at the border, NCHW and NHWC
    tcpy.target.cost_model = lambda target: dataclasses.replace(measured_costs(target), winograd_gain_min=0.0,
                                                                winograd_f4_gain_min=0.0)
    for specialize in ("always", "never"):
        same(conv_nchw, rand(2, 3, 9, 37), rand(7, 3, 3, 3), threads=2, specialize=specialize)
        same(conv_nhwc, rand(1, 11, 7, 5), rand(3, 3, 5, 16), threads=2, specialize=specialize)
    tcpy.target.cost_model = lambda target: dataclasses.replace(measured_costs(target), winograd_gain_min=0.0)
    # and the weight gradient's F(3x3, 2x2): odd sizes (partial tiles at the image's border)
    same('''def wgrad(float(N,C,H,W) I, float(N,F,H,W) dO) -> (dW) {
             dW(f, c, kh, kw) +=! (h + kh >= 1 && h + kh <= H && w + kw >= 1 && w + kw <= W)
                                  ? dO(n, f, h, w) * I(n, c, h + kh - 1, w + kw - 1) : 0.0
                 where h in 0:H, w in 0:W, kh in 0:3, kw in 0:3
         }''', rand(2, 3, 9, 13), rand(2, 7, 9, 13), threads=2, specialize="always")
    tcpy.target.cost_model = measured_costs
    for stride in (1, 2):
        same(f'''def conv(float(N,C,H,W) I, float(O,C,KH,KW) Wt) -> (Out) {{
                 Out(n, o, h, w) +=! I(n, c, {stride} * h + kh, {stride} * w + kw) * Wt(o, c, kh, kw)
             }}''', rand(2, 3, 11, 10), rand(4, 3, 3, 3))
    same('''def attention(float(B,M,D) Q, float(B,N,D) K, float(B,N,E) V) -> (O) {
             S(b, m, n) +=! Q(b, m, d) * K(b, n, d)
             mx(b, m) max=! S(b, m, n)
             P(b, m, n) = exp(S(b, m, n) - mx(b, m))
             s(b, m) +=! P(b, m, n)
             O(b, m, e) +=! P(b, m, n) * V(b, n, e) / s(b, m)
         }''', rand(2, 7, 8), rand(2, 9, 8), rand(2, 9, 5))
    # a chain whose last product gathers B's columns (e, f do not merge in V): pack_b's table of
    # their offsets once grew the scratch slot of the block buffers under the running chain
    same('''def chain(float(B,L,D) Q, float(B,S,D) K, float(B,E,S,F) V) -> (O) {
             Sc(b, l, s) +=! Q(b, l, d) * K(b, s, d)
             Mx(b, l) max=! Sc(b, l, s)
             P(b, l, s) = exp(Sc(b, l, s) - Mx(b, l))
             O(b, l, e, f) +=! P(b, l, s) * V(b, e, s, f)
         }''', rand(1, 64, 8), rand(1, 4, 8), rand(1, 16, 4, 64), threads=2)
    # a quotient deferred past the last product, with rows that take the quotient itself: a zero
    # divisor (0 / 0), and a sum that overflows before the division (the product runs again)
    w = np.ones(13, np.float32)
    w[[1, 4]] = [0.0, 1e30]
    same('''def deferred(float(M,K) X, float(N,K) Y, float(N,P) Z, float(M) W) -> (O) {
             T(m, n) +=! X(m, k) * Y(n, k)
             R(m) max=! T(m, n)
             E(m, n) = exp(T(m, n) - R(m)) * W(m)
             S(m) +=! E(m, n)
             Q(m, n) = E(m, n) / S(m)
             O(m, p) +=! Q(m, n) * Z(n, p)
         }''', abs(rand(13, 3)), abs(rand(11, 3)), abs(rand(11, 6)) * 1e10, w, threads=2)
    # the online form (caches so small that rows of 100 scores run in blocks of 32 columns and a
    # last one of 4), with rows whose first blocks are -inf (computed again whole)
    import dataclasses
    host = tcpy.Target.host()
    tiny = dataclasses.replace(host, name=host.name + "-tiny", l1d=1024, l2=6144, l3=24576, l3_sharing=1)
    y = rand(100, 3)
    y[:40, 0] = -np.inf
    same('''def online(float(M,K) X, float(N,K) Y, float(N,P) Z, float t) -> (O) {
             T(m, n) +=! X(m, k) * Y(n, k)
             R(m) max=! T(m, n)
             E(m, n) = exp(t * (T(m, n) - R(m)))
             S(m) +=! E(m, n)
             Q(m, n) = E(m, n) / S(m)
             O(m, p) +=! Q(m, n) * Z(n, p)
         }''', abs(rand(13, 3)) + 0.1, y, rand(100, 6), np.float32(0.5), threads=2, target=tiny)
    # two products back to back: the first's rows in a block buffer, several blocks per thread
    same('''def pair(float(B,M,K) X, float(B,N,K) Y, float(B,N,P) Z) -> (O) {
             T(b, m, n) +=! X(b, m, k) * Y(b, n, k)
             O(b, m, p) +=! T(b, m, n) * Z(b, n, p)
         }''', rand(2, 41, 5), rand(2, 23, 5), rand(2, 23, 7), threads=2, target=tiny)
    same('''def pad(float(N) X) -> (Y) {
             Y(i) = (i >= 1 ? X(i - 1) : 0.0) + X(i) + (i + 1 < N ? X(i + 1) : 0.0) where i in 0:N
         }''', rand(13))
    lut = tcpy.define("def lut(float(N) T, int32(M) I) -> (O) { O(i) = T(I(i)) }")
    try:
        lut(rand(5), np.array([0, 5], np.int32))
        sys.exit("the out-of-range LUT index was not caught")
    except tcpy.TCRuntimeError:
        pass
    # gathers from tensors without elements (issue 15, item 1): the check fires, nothing is read
    for src, args in [
        ("def g(float(N) A, int32(M) I) -> (O) { O(i) = A(I(i)) }",
         [np.zeros(0, np.float32), np.array([3], np.int32)]),
        ("def g(float(N,K) A, int32(M) I) -> (O) { O(i, k) = A(I(i), k) }",
         [np.zeros((0, 1000), np.float32), np.array([0], np.int32)]),
        ("def g(float(N) A, float(M, M) B) -> (O) { O(i) = A(i) * B(i % M, (i + 1) % M) where i in 0:N }",
         [np.ones(1, np.float32), np.zeros((0, 0), np.float32)]),
    ]:
        try:
            tcpy.define(src)(*args)
            sys.exit(f"the read from an empty tensor was not caught: {src}")
        except tcpy.TCRuntimeError:
            pass

    sys.path.insert(0, sys.argv[1])
    from strategies import programs
    from test_differential import check_program

    @settings(max_examples=int(sys.argv[2]), deadline=None, derandomize=True, database=None,
              phases=(Phase.generate,), suppress_health_check=list(HealthCheck))
    @given(programs())
    def random_programs(prog):
        check_program(prog)

    random_programs()
    print("SANITIZER-RUN-OK")
    """
)


def _gcc_library(name):
    try:
        path = subprocess.run(["gcc", f"-print-file-name={name}"], capture_output=True, text=True,
                              timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"cannot run gcc to find {name}: {exc}")
    if not path or not os.path.isabs(path) or not os.path.exists(path):
        pytest.skip(f"gcc has no {name} (gcc -print-file-name={name} found nothing)")
    return path


def _preload():
    return f"{_gcc_library('libasan.so')} {_gcc_library('libstdc++.so')}"


def _env(tmp_path, libasan):
    env = dict(os.environ)
    env.update(
        LD_PRELOAD=libasan,
        ASAN_OPTIONS="detect_leaks=0:abort_on_error=0:halt_on_error=1",
        UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1",
        TCPY_SANITIZE="1",
        TCPY_CACHE_DIR=str(tmp_path / "cache"),
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p),
    )
    return env


@pytest.mark.sanitizer
def test_kernels_run_clean_under_address_and_undefined_behaviour_sanitizers(tmp_path):
    libasan = _preload()
    env = _env(tmp_path, libasan)
    probe = subprocess.run([sys.executable, "-c", "import numpy, tcpy"], env=env, capture_output=True,
                           text=True, timeout=300)
    if probe.returncode != 0:
        pytest.skip(f"Python does not start with {libasan} preloaded: {probe.stderr.strip()[-500:]}")
    child = subprocess.run([sys.executable, "-c", CHILD, str(TESTS), str(EXAMPLES)], env=env, cwd=tmp_path,
                           capture_output=True, text=True, timeout=1200)
    report = (child.stdout + child.stderr)[-6000:]
    assert "ERROR: AddressSanitizer" not in report, report
    assert "runtime error:" not in report, report
    assert child.returncode == 0 and "SANITIZER-RUN-OK" in child.stdout, report
    built = list((tmp_path / "cache").rglob("*.so"))
    assert built, "no kernel was built in the sanitizer cache directory"
    assert all(b"__asan_" in so.read_bytes() for so in built), "kernels were built without ASan"


OOB_CHILD = textwrap.dedent(
    """
    import ctypes
    import numpy as np
    from tcpy.runtime.build import build_library, load_symbol

    src = "float peek(const float *x, int n) { return x[n]; }"  # reads one past the end
    addr = load_symbol(build_library(src), "peek")
    peek = ctypes.CFUNCTYPE(ctypes.c_float, ctypes.c_void_p, ctypes.c_int)(addr)
    x = np.ones(7, np.float32)
    print(peek(x.ctypes.data, 7))
    """
)


@pytest.mark.sanitizer
def test_the_sanitizer_harness_catches_an_out_of_bounds_read(tmp_path):
    """The setup above is not vacuous: a sanitized build reading past a NumPy buffer is reported."""
    env = _env(tmp_path, _preload())
    child = subprocess.run([sys.executable, "-c", OOB_CHILD], env=env, cwd=tmp_path, capture_output=True,
                           text=True, timeout=300)
    assert child.returncode != 0
    assert "ERROR: AddressSanitizer: heap-buffer-overflow" in child.stderr, child.stderr[-3000:]
