"""Size-generic kernels (Options(specialize=...)): one compile serves every shape, with the
results of the reference evaluator and the errors of a specialised kernel."""
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tcpy
import tcpy.api
from tcpy.demo import LAYERNORM, SOFTMAX
from tcpy.target import Target

# a window (the output is shorter than the input), a size in a value, an integer max
WINDOW = """
def window(float(N) I, float(K) W, int32(N) J) -> (O, P, Q) {
    O(i) +=! I(i + k) * W(k)
    P(i) = I(i) * N + K
    Q(i) max=! J(i + k) where k in 0:K, i in 0:N - K + 1
}
"""
MATMUL = """
def matmul(float(M,K) A, float(K,N) B) -> (C) {
    C(m, n) +=! A(m, k) * B(k, n)
}
"""
# element-wise statements on temporaries: one fused loop nest, the temporaries per point
CHAIN = """
def chain(float(N,M) A, float(M) b) -> (C) {
    T(n, m) = A(n, m) * 2 + b(m)
    U(n, m) = tanh(T(n, m))
    C(n, m) = U(n, m) * T(n, m) - A(n, m)
}
"""

# sizes around vector widths and tiles: 0, 1, primes, multiples of 16 and 64, one off
SIZES = (0, 1, 2, 3, 7, 13, 15, 16, 17, 31, 33, 63, 64, 65, 97)


def _arguments(name, rng, sizes):
    f32 = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    if name == "softmax":
        return (f32(*sizes),)
    if name == "layernorm":
        n, d = sizes
        return f32(n, d), f32(d), f32(d)
    if name == "window":
        n, k = sizes
        return f32(n), f32(k), rng.integers(-50, 50, n).astype(np.int32)
    if name == "chain":
        n, m = sizes
        return f32(n, m), f32(m)
    m, n, k = sizes
    return f32(m, k), f32(k, n)


# ("tiled": the matmul with its contraction as loops, in register tiles)
SOURCES = {"softmax": SOFTMAX, "layernorm": LAYERNORM, "window": WINDOW, "matmul": MATMUL, "chain": CHAIN,
           "tiled": MATMUL}
# The sizes each generic kernel is planned at (its first call), and what its plan must show
# there: fused groups, a register tile.
PLANNED = {
    "softmax": ((40, 100), r"generic kernel: fused S0-S3 over n; per-thread buffers e -> local.0\[100\]"),
    "layernorm": ((40, 100), r"generic kernel: fused S0-S2 over n; per-thread buffers mean -> local.0\[\]"),
    "window": ((100, 5), None),
    "matmul": ((64, 64, 64), None),
    "chain": ((40, 100), r"generic kernel: fused S0-S2 over n, m"),
    "tiled": ((64, 64, 64), r"generic kernel: C\(m, n\) \+=! A\(m, k\) \* B\(k, n\): .*register tile m:8"),
}


def _runnable_presets():
    presets = ["x86-64-v3", "x86-64"]
    if Target.preset("x86-64-v4").can_run_here():
        presets.append("x86-64-v4")
    return [p for p in presets if Target.preset(p).can_run_here()]


# (def, preset, threads): every def, every runnable preset, 1, 2 and 7 threads
CONFIGS = [(name, preset, (1, 2, 7)[(k + p) % 3]) for k, name in enumerate(SOURCES)
           for p, preset in enumerate(_runnable_presets())]


_kernels = {}


def _check(got, want):
    """The results of a kernel (an array or a tuple) are the reference evaluator's."""
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5)


def _kernel(name, preset, threads):
    """One kernel per configuration for the whole module (hypothesis calls it with many
    shapes), planned at the sizes of :data:`PLANNED`."""
    key = (name, preset, threads)
    if key not in _kernels:
        options = tcpy.Options(specialize="never", target=preset, num_threads=threads, contraction=name != "tiled")
        kernel, reference = tcpy.define(SOURCES[name], options=options), tcpy.define(SOURCES[name], backend="reference")
        args = _arguments(name, np.random.default_rng(4), PLANNED[name][0])
        _check(kernel(*args), reference(*args))
        _kernels[key] = kernel, reference
    return _kernels[key]


@pytest.mark.parametrize("name, preset, threads", CONFIGS)
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_one_generic_kernel_serves_every_shape(builds, name, preset, threads, data):
    kernel, reference = _kernel(name, preset, threads)
    rank = len(PLANNED[name][0])
    rng = np.random.default_rng(0)
    shapes = data.draw(st.lists(st.tuples(*[st.sampled_from(SIZES)] * rank), min_size=3, max_size=6))
    for sizes in shapes + [(17, 3, 5)[:rank]]:
        if name == "window" and sizes[1] > sizes[0]:
            continue  # (a precondition: tested below)
        args = _arguments(name, rng, sizes)
        _check(kernel(*args), reference(*args))
    text = kernel.explain(*args)
    assert "kernel: generic" in text
    if PLANNED[name][1]:  # planned fused (register-tiled) for every size
        assert re.search(PLANNED[name][1], text), text
    # one build in the kernel's life (this test's examples are its only calls)
    assert len(builds) == 1 and "generic" in builds[0]


def test_a_sweep_compiles_once(builds):
    kernel = tcpy.define(SOFTMAX, options=tcpy.Options(specialize="never"))
    reference = tcpy.define(SOFTMAX, backend="reference")
    rng = np.random.default_rng(1)
    for n, d in [(5, 9), (1, 1), (0, 3), (3, 0), (128, 129), (31, 64), (2, 257)]:
        x = rng.standard_normal((n, d)).astype(np.float32)
        np.testing.assert_allclose(kernel(x), reference(x), rtol=1e-5, atol=1e-6)
    assert len(builds) == 1 and "generic" in builds[0]
    assert len(kernel.table) == 7  # one launcher entry per shape, all calling the same function


# B(i, 0) is B(i, j) when M is 1 (j is 0): fused over i and j only at that size
DEGENERATE = """
def f(float(N,M) A) -> (C) {
    B(i, j) = A(i, j) * 2
    C(i, j) = B(i, j) + B(i, 0)
}
"""


def test_statements_fuse_only_where_legal_at_every_size(builds):
    a = np.arange(5, dtype=np.float32).reshape(5, 1)
    specialised = tcpy.define(DEGENERATE, options=tcpy.Options(specialize="always"))
    assert "fused S0-S1 over i, j" in specialised.explain(a)
    generic = tcpy.define(DEGENERATE, options=tcpy.Options(specialize="never"))
    np.testing.assert_array_equal(generic(a), 4 * a)  # planned at M=1
    assert "generic kernel: fused" not in generic.explain(a)
    b = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(generic(b), 2 * b + 2 * b[:, :1])
    assert len([s for s in builds if "generic" in s]) == 1


SCALE = """
def scale(float(N,D) X, double(D) Z) -> (Y, W) {
    Y(n, d) = X(n, d) / D
    W(d) = Z(d) / (2 * D - 3)
}
"""


@pytest.mark.parametrize("planned", [(3, 64), (3, 7)])
def test_divisions_by_sizes_are_exact_at_every_size(planned):
    # (a power of two's reciprocal is exact: multiplying by it is dividing)
    kernel = tcpy.define(SCALE, options=tcpy.Options(specialize="never"))
    rng = np.random.default_rng(5)
    for n, d in [planned, (2, 1), (2, 2), (1, 1024), (2, 3), (2, 2 ** 16 + 1), (1, 2 ** 17)]:
        x, z = rng.standard_normal((n, d)).astype(np.float32), rng.standard_normal(d)
        y, w = kernel(x, z)
        np.testing.assert_array_equal(y, x / np.float32(d))
        np.testing.assert_array_equal(w, z / np.float64(2 * d - 3))


def _error(fn):
    with pytest.raises(tcpy.TCError) as info:
        fn()
    return type(info.value), str(info.value)


# C(i + j) is not used to infer i or j: the sizes must satisfy L >= N + M - 1
PRECONDITION = """
def outer(float(N) A, float(M) B, float(L) C) -> (O) {
    O(i, j) = A(i) * B(j) + C(i + j)
}
"""


@pytest.mark.parametrize("source, good, bad", [
    (PRECONDITION, (4, 3, 6), (np.zeros(4, np.float32), np.zeros(3, np.float32), np.zeros(5, np.float32))),
    (WINDOW, (9, 3, 9), (np.zeros(6, np.float32), np.zeros(2, np.float32), np.zeros(5, np.int32))),  # N: 6 and 5
    (WINDOW, (9, 3, 9), (np.zeros(6, np.float64), np.zeros(2, np.float32), np.zeros(6, np.int32))),  # a dtype
    (WINDOW, (9, 3, 9), (np.zeros((6, 1), np.float32), np.zeros(2, np.float32), np.zeros(6, np.int32))),  # a rank
])
def test_bad_shapes_raise_what_a_specialised_kernel_raises(source, good, bad):
    generic = tcpy.define(source, options=tcpy.Options(specialize="never", contraction=False))
    good_args = [np.zeros(n, a.dtype if a.dtype != np.float64 else np.float32) for n, a in zip(good, bad)]
    generic(*good_args)  # the generic kernel exists, planned at good sizes
    specialised = tcpy.define(source, options=tcpy.Options(specialize="always", contraction=False))
    expected = _error(lambda: specialised(*bad))
    assert _error(lambda: generic(*bad)) == expected
    assert "kernel: generic" in generic.explain(*good_args)


def test_tiering_switches_a_hot_shape_to_a_specialised_kernel(builds, monkeypatch):
    monkeypatch.setattr(tcpy.api, "SPECIALIZE_AFTER_CALLS", 3)
    kernel = tcpy.define(LAYERNORM)  # specialize="auto"
    rng = np.random.default_rng(2)
    args = _arguments("layernorm", rng, (9, 20))
    first = kernel(*args)
    assert "kernel: generic" in kernel.explain(*args)
    for _ in range(3):
        np.testing.assert_array_equal(kernel(*args), first)
    kernel.finish_specializations(timeout=120)
    assert "kernel: specialised to these sizes: compiled in the background" in kernel.explain(*args)
    (entry,) = kernel.table.values()
    assert entry.constants == ()  # the specialised kernel's entry: sizes baked in
    np.testing.assert_allclose(kernel(*args), first, rtol=1e-6, atol=1e-6)
    other = _arguments("layernorm", rng, (4, 7))  # another shape still runs generic
    np.testing.assert_allclose(kernel(*other), tcpy.define(LAYERNORM, backend="reference")(*other), rtol=1e-5,
                               atol=1e-5)
    assert len(builds) == 1 and "generic" in builds[0]  # (the specialised kernel: built by the worker process)


def test_a_background_specialisation_whose_cached_library_does_not_load_is_built_once_more(monkeypatch):
    monkeypatch.setattr(tcpy.api, "SPECIALIZE_AFTER_CALLS", 2)
    load, requests, refused = tcpy.api.load_symbol, [], []

    def load_once_refused(path, symbol):  # (as load_symbol does with a damaged library)
        if "generic" not in symbol and not refused:
            refused.append(symbol)
            raise tcpy.TCCompilerError(f"cannot load {symbol} from the cached kernel {path}")
        return load(path, symbol)

    run = tcpy.api.worker.run
    monkeypatch.setattr(tcpy.api, "load_symbol", load_once_refused)
    monkeypatch.setattr(tcpy.api.worker, "run", lambda *args: requests.append(args) or run(*args))
    kernel = tcpy.define(LAYERNORM)
    args = _arguments("layernorm", np.random.default_rng(4), (9, 20))
    first = kernel(*args)
    kernel(*args)
    kernel.finish_specializations(timeout=120)
    assert len(refused) == 1 and len(requests) == 2
    assert "kernel: specialised to these sizes: compiled in the background" in kernel.explain(*args)
    np.testing.assert_allclose(kernel(*args), first, rtol=1e-6, atol=1e-6)


def test_a_shape_with_much_work_is_specialised_sooner(monkeypatch):
    monkeypatch.setattr(tcpy.api, "SPECIALIZE_AFTER_POINTS", 2 * 9 * 20 * 3)  # two calls of this shape
    kernel = tcpy.define(LAYERNORM)
    args = _arguments("layernorm", np.random.default_rng(3), (9, 20))
    first = kernel(*args)
    kernel.finish_specializations(timeout=120)
    assert "kernel: generic" in kernel.explain(*args)  # one call: not hot yet
    np.testing.assert_array_equal(kernel(*args), first)
    kernel.finish_specializations(timeout=120)
    assert "compiled in the background after 2 calls" in kernel.explain(*args)
    np.testing.assert_allclose(kernel(*args), first, rtol=1e-6, atol=1e-6)


# the second statement reads what it writes: through a copy of Y, planned at fixed sizes
REVERSE = """
def reverse(float(N) X) -> (Y) {
    Y(i) = X(i)
    Y(i) = Y(N - 1 - i) + 1.0 where i in 0:N
}
"""


def test_a_def_the_generic_kernel_cannot_run_is_specialised_and_explain_says_why(builds):
    kernel = tcpy.define(REVERSE, options=tcpy.Options(specialize="never", target="x86-64-v3"))
    x = np.arange(5, dtype=np.float32)
    np.testing.assert_array_equal(kernel(x), x[::-1] + 1)
    kernel(x[:3])
    assert len(builds) == 2 and not [s for s in builds if "generic" in s]
    text = kernel.explain(x)
    assert re.search(r"kernel: specialised to these sizes: no generic kernel, a statement reads what it writes",
                     text), text


def test_always_compiles_each_shape(builds):
    kernel = tcpy.define(SOFTMAX, options=tcpy.Options(specialize="always"))
    kernel(np.ones((2, 3), np.float32))
    kernel(np.ones((3, 3), np.float32))
    assert len(builds) == 2 and not [s for s in builds if "generic" in s]
    assert "kernel: specialised to these sizes (Options(specialize='always'))" in kernel.explain((2, 3))


def test_specialize_option_is_checked():
    with pytest.raises(tcpy.TCOptionError, match=r"Options.specialize must be one of 'auto', 'always', 'never', "
                                                 r"got 'sometimes'"):
        tcpy.Options(specialize="sometimes")
    assert tcpy.Options().specialize == "auto"
    assert tcpy.Options(specialize="never").key() != tcpy.Options().key()


LUT = """
def lut(float(N) T, int32(M) I) -> (O) {
    O(i) = T(I(i)) * 2
}
"""


def test_data_dependent_indices_are_checked_against_each_calls_sizes(builds):
    generic = tcpy.define(LUT, options=tcpy.Options(specialize="never"))
    specialised = tcpy.define(LUT, options=tcpy.Options(specialize="always"))
    table = np.arange(10, dtype=np.float32)
    calls = [
        (table, np.array([3, 0, 9, 9, 2], np.int32)),
        (table[:0], np.array([0], np.int32)),  # an empty table: every index is out of bounds
        (table[:3], np.array([1, 5, 2], np.int32)),
        (table[:7], np.zeros(0, np.int32)),
        (table[:4], np.array([-1], np.int32)),
    ]
    for args in calls:
        try:
            expected = specialised(*args)
        except tcpy.TCError as err:
            assert _error(lambda: generic(*args)) == (type(err), str(err))
        else:
            np.testing.assert_array_equal(generic(*args), expected)
    assert len([s for s in builds if "generic" in s]) == 1


# products scaled by factors that read no reduction variable: the engine runs the sum, a
# statement scales it (a divisor of a row, a factor of a column)
SCALED = {
    "rows": """
def rows(float(M,K) A, float(K,N) B, float(M) s, float(N) f) -> (C) {
    C(m, n) +=! A(m, k) * B(k, n) * f(n) / s(m)
}
""",
    "attention": """
def attention(float(B,H,L,D) Q, float(B,H,S,D) K, float(B,H,S,D) V) -> (O) {
    Sc(b, h, l, s) +=! 0.125 * Q(b, h, l, d) * K(b, h, s, d)
    Mx(b, h, l) max=! Sc(b, h, l, s)
    E(b, h, l, s) = exp(Sc(b, h, l, s) - Mx(b, h, l))
    Sm(b, h, l) +=! E(b, h, l, s)
    O(b, h, l, d) +=! E(b, h, l, s) * V(b, h, s, d) / Sm(b, h, l)
}
""",
}


def _scaled_arguments(name, rng, n):
    f32 = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    if name == "rows":  # divisors of 0 (and an infinite factor) where K may be 0
        s, f = f32(5), f32(4)
        s[::2], f[1] = 0, np.inf
        return f32(5, n), f32(n, 4), s, f
    return f32(1, 2, 3, 8), f32(1, 2, n, 8), f32(1, 2, n, 8)


@pytest.mark.parametrize("name", sorted(SCALED))
@pytest.mark.parametrize("specialize, preset, fuse", [("never", "x86-64-v3", True), ("never", None, True),
                                                      ("always", None, True), ("always", None, False)])
def test_an_empty_sum_is_not_scaled(builds, name, specialize, preset, fuse):
    """An empty sum is 0 (it has no terms to scale), also where the scale is a divisor of 0 or
    infinite: a generic kernel planned with terms (and one planned without) and specialised
    kernels (the scaling in the product's stores, or apart with ``fuse=False``) agree with the
    reference evaluator at every length of the sum, 0 included."""
    reference = tcpy.define(SCALED[name], backend="reference")
    rng = np.random.default_rng(5)
    for first in (3, 0):
        options = tcpy.Options(specialize=specialize, target=preset, num_threads=2, fuse=fuse)
        kernel = tcpy.define(SCALED[name], options=options)
        for n in (first, 0, 1, 7, 0):
            args = _scaled_arguments(name, rng, n)
            got, want = kernel(*args), reference(*args)
            if n == 0:
                assert not np.isnan(want).any() and not np.isnan(got).any()
            elif name == "rows":  # (a sum scaled once by an infinite scale: its sign decides, not each term's)
                finite = (args[2] != 0)[:, None] & np.isfinite(args[3])[None, :]
                got, want = got[finite], want[finite]
            np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    if specialize == "never":
        assert len(builds) == 2  # (one generic kernel planned with terms, one without)
