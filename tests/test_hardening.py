"""Issue 15 (hardening): each numbered item's reproducer. No crash, no silent wrong result, only
TCErrors with messages that say what was expected; TC's accumulation into existing values.

Items covered elsewhere: 2 in ``test_keyword_names.py``; 5 (flags), 6 and 11 in
``test_cache.py``; the ASan run of item 1's gathers in ``test_sanitizer.py``; the CLI's
one-line errors in ``test_cli.py``.
"""
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import numpy as np
import pytest

import tcpy

BACKENDS = ["compiled", "reference"]


def define(source, backend="compiled", **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tcpy.TCWarning)
        return tcpy.define(source, backend=backend, **kw)


# -- item 1: gathers from zero-size tensors --------------------------------------------------

GATHERS = [
    ("def g(float(N,K) A, int32(M) I) -> (O) { O(i, k) = A(I(i), k) }",
     lambda: [np.zeros((0, 50_000_000), np.float32), np.array([0], np.int32)]),
    ("def g(float(N) A, int32(M) I) -> (O) { O(i) = A(I(i)) }",
     lambda: [np.zeros(0, np.float32), np.array([3], np.int32)]),
    ("def g(float(N) A, float(M, M) B) -> (O) { O(i) = A(i) * B(i % M, (i + 1) % M) where i in 0:N }",
     lambda: [np.ones(1, np.float32), np.zeros((0, 0), np.float32)]),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("source, args", GATHERS)
def test_gather_from_an_empty_tensor_is_an_error_not_a_read(source, args, backend):
    with pytest.raises(tcpy.TCRuntimeError, match="out of bounds|(division|modulo) by zero"):
        define(source, backend)(*args())


# -- item 3: index values beyond 2**31 ---------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_index_arithmetic_does_not_wrap_at_2_to_the_31(backend):
    A = np.zeros((2**31 - 2, 0), np.float32)  # N = 2**31 - 2 without the memory
    k = define("def f(float(N, Z) A) -> (O) { O(i) = int64(i + N) + int64(i * N) where i in 0:4 }", backend)
    N = 2**31 - 2
    np.testing.assert_array_equal(k(A), [N + i + i * N for i in range(4)])


# -- item 4: every error is a TCError ------------------------------------------------------------

K1 = "def f(float(N) A) -> (O) { O(i) = A(i) + 1 }"


@pytest.mark.parametrize("make, cls, words", [
    (lambda: tcpy.define("def f(float(N) A) -> (O) { O(i) = A(i) + " + "9" * 5000 + " }"),
     tcpy.TCSyntaxError, "integer constant of 5000 digits is too large"),
    (lambda: tcpy.define("def f(float a, float(N) A) -> (O) { O(i) = A(i) + a }")(10**400, np.ones(2, np.float32)),
     tcpy.TCOverflowError, "argument a (float a) = an int of 1329 bits is outside the range of float32"),
    (lambda: tcpy.define("def f(float(N) A) -> (O) { O(%s) = A(x0) }" % ", ".join(f"x{k}" for k in range(33))),
     tcpy.TCSemanticError, "'O' is written with 33 indices; tensors have at most 32 dimensions"),
    (lambda: tcpy.define(K1)(A=np.ones(2, np.float32)), tcpy.TCArgumentError,
     "kernels take their arrays by position, in the order of the signature; got keyword argument 'A'"),
    (lambda: tcpy.define(K1, backend="reference")(A=np.ones(2, np.float32)), tcpy.TCArgumentError,
     "kernels take their arrays by position; got keyword argument 'A'"),
    (lambda: tcpy.Options(unroll="4"), tcpy.TCOptionError, "Options.unroll must be an int from 0 to 65534"),
    (lambda: tcpy.Options(tile_sizes=[("m", 4)]), tcpy.TCOptionError, "Options.tile_sizes must be a mapping"),
    (lambda: tcpy.Options(parallel="no"), tcpy.TCOptionError, "Options.parallel must be True or False"),
    (lambda: tcpy.define(K1, options={"unroll": 2}), tcpy.TCOptionError, "options must be a tcpy.Options, got dict"),
    (lambda: tcpy.define(K1.encode()), tcpy.TCArgumentError, "TC source must be a str, got bytes (decode it first"),
    (lambda: tcpy.define(None), tcpy.TCArgumentError, "TC source must be a str, got NoneType"),
    (lambda: tcpy.define(K1).explain(N=2**70), tcpy.TCOverflowError, "size N of def 'f' must be from 0 to 2147483647 (the int32 index range)"),
    (lambda: tcpy.define(K1).explain(N=-1), tcpy.TCOverflowError, "size N of def 'f' must be from 0"),
    (lambda: tcpy.define(K1).explain(N="4"), tcpy.TCArgumentError, "size N of def 'f' must be an int, got '4'"),
    (lambda: tcpy.define(K1 + "\n" + K1.replace("def f", "def g"))["zz"], tcpy.TCLookupError,
     "no def named 'zz'; the source defines 'f', 'g'"),
    (lambda: tcpy.autotune(tcpy.define(K1), np.ones(2, np.float32), options=[], progress=False),
     tcpy.TCOptionError, "autotune's options= must list one or more tcpy.Options, got []"),
])
def test_bad_inputs_raise_tc_errors_that_say_what_was_expected(make, cls, words):
    with pytest.raises(cls, match=re.escape(words)):
        make()


def test_tc_errors_keep_the_matching_builtin_base():
    assert issubclass(tcpy.TCOverflowError, OverflowError) and issubclass(tcpy.TCOptionError, ValueError)
    assert issubclass(tcpy.TCLookupError, KeyError) and issubclass(tcpy.TCArgumentError, TypeError)
    assert issubclass(tcpy.TCWarning, UserWarning) and not issubclass(tcpy.TCWarning, tcpy.TCError)


# -- item 7: bool bytes other than 0 and 1 ------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_bool_inputs_with_other_bytes_are_true(backend):
    raw = np.array([0, 1, 2, 255, 128], np.uint8)
    k = define("def f(bool(N) A, bool(N) B) -> (O, P) { O(i) = int32(A(i)) + int32(A(i) == B(i))\n"
               " P(i) = !A(i) }", backend)
    o, p = k(raw.view(bool), np.ones(5, bool))
    np.testing.assert_array_equal(o, [0, 2, 2, 2, 2])
    np.testing.assert_array_equal(p, [True, False, False, False, False])
    o, p = k(raw.view(bool)[::2], np.ones(3, bool))  # strided: copied, then normalised
    np.testing.assert_array_equal(o, [0, 2, 2])


# -- item 9: TC's accumulation into existing values --------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_accumulating_into_an_unwritten_output_adds_to_out_or_to_zeros(backend):
    src = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m, n) += A(m, k) * B(k, n) }"
    with pytest.warns(tcpy.TCWarning, match=r"line 1: in def 'mm': output 'C' is accumulated with '\+=' before "
                                            r"anything writes it, so it adds to the values of the caller's out="):
        k = tcpy.define(src, backend=backend)
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((37, 19), np.float32), rng.standard_normal((19, 23), np.float32)
    C0 = rng.standard_normal((37, 23)).astype(np.float32)
    np.testing.assert_allclose(k(A, B), A @ B, rtol=1e-4, atol=1e-4)
    C = C0.copy()
    assert k(A, B, out=C) is C
    np.testing.assert_allclose(C, C0 + A @ B, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op, expected", [("+=", [3, 4, 5, 6]), ("*=", [2, 4, 6, 8]), ("max=", [2, 2, 3, 4]),
                                          ("min=", [1, 2, 2, 2])])
def test_every_reduction_without_bang_accumulates_into_out(backend, op, expected):
    k = define(f"def f(float(N) A) -> (C) {{ C(i) {op} A(i) }}", backend)
    C = np.full(4, 2, np.float32)
    k(np.arange(1, 5, dtype=np.float32), out=C)
    np.testing.assert_array_equal(C, expected)


def test_accumulating_into_an_unwritten_temporary_is_still_an_error():
    with pytest.raises(tcpy.TCSemanticError, match="temporary 'T' is accumulated with '\\+='"):
        tcpy.define("def f(float(N) A) -> (C) { T(i) += A(i)\n C(i) = T(i) }")


# -- item 8: Ctrl-C stops a running kernel ------------------------------------------------------

SPIN = textwrap.dedent("""
    import signal, sys, time
    import numpy as np
    import tcpy
    signal.signal(signal.SIGINT, signal.default_int_handler)  # (as an interactive session; a harness may start us with SIGINT ignored)
    spin = tcpy.define("def spin(float(N) A, float(M, Z) B) -> (O) { O(i) +=! sin(A(i) + float(j)) where j in 0:M }")
    A, B = np.ones(300, np.float32), np.ones((30_000_000, 0), np.float32)  # 9e9 sines: seconds
    spin(*(np.ones((1,) * a.ndim, np.float32) for a in (A, B)))  # built now: no compile after "ready"
    print("ready", flush=True)
    start = time.time()
    try:
        spin(A, B)
        print("finished", time.time() - start)
    except KeyboardInterrupt:
        print("interrupted", time.time(), flush=True)
    """)


# a GEMM runs through the contraction engine's own loops (about a teraflop: seconds)
SPIN_GEMM = SPIN.replace(
    'spin = tcpy.define("def spin(float(N) A, float(M, Z) B) -> (O) { O(i) +=! sin(A(i) + float(j)) where j in 0:M }")',
    'spin = tcpy.define("def spin(float(M,K) A, float(K,N) B) -> (O) { O(m, n) +=! A(m, k) * B(k, n) }")').replace(
    "A, B = np.ones(300, np.float32), np.ones((30_000_000, 0), np.float32)  # 9e9 sines: seconds",
    "A = B = np.ones((8192, 8192), np.float32)")


@pytest.mark.parametrize("script", [SPIN, SPIN_GEMM], ids=["loop_nest", "contraction_engine"])
def test_ctrl_c_stops_a_running_kernel_promptly(script):
    env = dict(os.environ, OMP_NUM_THREADS="2")
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env)
    assert child.stdout.readline().strip() == "ready"
    time.sleep(2.0)  # compiled and running
    sent = time.time()
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=60)
    assert out.startswith("interrupted"), out + err
    latency = float(out.split()[1]) - sent
    assert latency < 1.0, f"the kernel stopped {latency:.2f} s after Ctrl-C"
