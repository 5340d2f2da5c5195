"""One size-generic attention kernel (Options(specialize="never")) serves every sequence length
and head size: the results of the reference evaluator at sizes 0, lengths 1, primes and block
multiples +- 1 (attention's online chain: its blocks of rows and of keys), with a scale, a causal
mask or keys limited by a where clause, in double precision, from one compile; the precondition errors of a
specialised kernel; one set of temporaries for every shape, none shared by concurrent calls."""
import tracemalloc
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import tcpy
from tcpy.demo import ATTENTION
from tcpy.target import Target
from test_chain import SCALED_DOUBLE_ATTENTION

# a causal mask: key s is seen from query l only when s <= l (masked scores are -1e30)
CAUSAL = """
def causal(float(B,H,L,D) Q, float(B,H,L,D) K, float(B,H,L,D) V, float scale) -> (O) {
    Sc(b, h, l, s) +=! Q(b, h, l, d) * K(b, h, s, d)
    Ms(b, h, l, s) = s <= l ? scale * Sc(b, h, l, s) : -1e30
    Mx(b, h, l) max=! Ms(b, h, l, s)
    E(b, h, l, s) = exp(Ms(b, h, l, s) - Mx(b, h, l))
    Sm(b, h, l) +=! E(b, h, l, s)
    O(b, h, l, d) +=! E(b, h, l, s) * V(b, h, s, d) / Sm(b, h, l)
}
"""
# a where clause: queries attend to the first L keys only (K and V may be longer)
PREFIX = """
def prefix(float(B,H,L,D) Q, float(B,H,S,D) K, float(B,H,S,D) V, float scale) -> (O) {
    Sc(b, h, l, s) +=! Q(b, h, l, d) * K(b, h, s, d) where s in 0:L
    Mx(b, h, l) max=! Sc(b, h, l, s)
    E(b, h, l, s) = exp(scale * (Sc(b, h, l, s) - Mx(b, h, l)))
    Sm(b, h, l) +=! E(b, h, l, s)
    O(b, h, l, d) +=! E(b, h, l, s) * V(b, h, s, d) / Sm(b, h, l)
}
"""
SOURCES = {"attention": ATTENTION, "causal": CAUSAL, "prefix": PREFIX}

# lengths: 1, primes, around vector widths, micro-tiles and blocks (multiples of 16 and 64 +- 1),
# and attention's blocks of rows and of keys in its online chain (24 rows; 1360 keys on x86-64-v3,
# 680 on x86-64; multiples +- 1)
LENGTHS = (1, 2, 3, 7, 13, 15, 16, 17, 31, 47, 63, 64, 65, 97, 127, 128, 129)
ROW_BLOCKS = (23, 24, 25, 47, 48, 49, 95, 96, 97)
KEY_BLOCKS = (679, 680, 681, 1359, 1360, 1361)
HEADS = (1, 3, 16, 17, 64)

# (def, preset, threads): every def, both presets, 1, 2 and 7 threads among them
CONFIGS = [("attention", "x86-64-v3", 1), ("attention", "x86-64", 7), ("causal", "x86-64-v3", 2),
           ("causal", "x86-64", 1), ("prefix", "x86-64-v3", 7)]


_kernels = {}


def _kernel(name, preset, threads):
    """One kernel per configuration for the whole module (hypothesis calls it with many shapes)."""
    key = (name, preset, threads)
    if key not in _kernels:
        options = tcpy.Options(specialize="never", target=preset, num_threads=threads)
        _kernels[key] = (tcpy.define(SOURCES[name], options=options), tcpy.define(SOURCES[name], backend="reference"))
    return _kernels[key]


def _arguments(rng, batch, heads, length, keys, depth):
    f32 = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    return (f32(batch, heads, length, depth), f32(batch, heads, keys, depth), f32(batch, heads, keys, depth),
            np.float32(rng.uniform(0.05, 0.5)))


@pytest.mark.parametrize("name, preset, threads", CONFIGS)
@settings(max_examples=3, deadline=None, phases=(Phase.explicit, Phase.generate), suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_one_generic_attention_kernel_serves_every_length(builds, name, preset, threads, data):
    kernel, reference = _kernel(name, preset, threads)
    rng = np.random.default_rng(0)
    lengths = st.sampled_from(LENGTHS)
    shapes = data.draw(st.lists(st.tuples(st.sampled_from((1, 2)), st.sampled_from((1, 3)), lengths,
                                          lengths, st.sampled_from(HEADS)), min_size=3, max_size=5))
    blocks = data.draw(st.tuples(st.sampled_from(ROW_BLOCKS), st.sampled_from(KEY_BLOCKS)))
    # (first a shape whose sizes are not 1: the kernel is planned at its first call's sizes, and a
    # product with one row or column is recognised without it, so it would make no chain)
    empty = [(1, 2, 0, 5, 3), (1, 1, 7, 0, 3), (2, 1, 9, 13, 0)]  # no queries, no keys, no head dimension
    for batch, heads, length, keys, depth in [(1, 2, 129, 127, 17)] + shapes + empty + [(1, 1, *blocks, 5)]:
        if name == "causal":
            keys = length
        elif name == "prefix":
            keys = max(keys, length)
        args = _arguments(rng, batch, heads, length, keys, depth)
        got, want = kernel(*args), reference(*args)
        assert got.shape == want.shape == (batch, heads, length, depth) and got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    text = str(kernel.explain(*args))
    assert "kernel: generic" in text
    if name == "attention":  # its products and softmax: one chain over blocks of rows and of keys
        assert "online softmax at every size" in text and "in the chain, on blocks of" in text
    # one build in the kernel's life (this test's examples are its only calls)
    assert len(builds) == 1 and "generic" in builds[0]


def test_a_generic_attention_kernel_checks_each_calls_sizes():
    rng = np.random.default_rng(1)
    generic = tcpy.define(PREFIX, options=tcpy.Options(specialize="never", target="x86-64-v3"))
    specialised = tcpy.define(PREFIX, options=tcpy.Options(specialize="always", target="x86-64-v3"))
    generic(*_arguments(rng, 1, 2, 9, 12, 4))  # (the generic kernel is built at other sizes)
    bad = _arguments(rng, 1, 2, 9, 5, 4)  # 9 queries read 9 keys of 5
    errors = []
    for kernel in (generic, specialised):
        with pytest.raises(tcpy.TCError) as caught:
            kernel(*bad)
        errors.append((type(caught.value), str(caught.value)))
    assert errors[0] == errors[1]
    assert errors[0][0] is tcpy.TCPreconditionError and "must satisfy L <= S" in errors[0][1]


def test_a_generic_kernel_keeps_one_set_of_temporaries_for_every_shape():
    rng = np.random.default_rng(2)
    # (a causal mask: its generic kernel holds score-sized temporaries, attention's chain none)
    kernel = tcpy.define(CAUSAL, options=tcpy.Options(specialize="never", target="x86-64-v3", num_threads=1))
    reference = tcpy.define(CAUSAL, backend="reference")
    calls = [_arguments(rng, 1, 1, length, length, 16) for length in (300, 280, 260, 240, 220, 300)]
    kernel(*_arguments(rng, 1, 1, 8, 8, 16))  # (built, and what a process allocates once, before counting)
    tracemalloc.start()
    try:
        for args in calls:
            kernel(*args)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # the scores and probabilities (300 x 300 floats each) at the largest length, not one pair per length
    assert held < 2 * (2 * 300 * 300 * 4)
    for args in calls[-3:]:  # the shared memory reused by shorter and longer lengths
        np.testing.assert_allclose(kernel(*args), reference(*args), rtol=1e-4, atol=1e-5)


def test_concurrent_calls_of_a_generic_kernel_do_not_share_temporaries():
    rng = np.random.default_rng(3)
    kernel = tcpy.define(ATTENTION, options=tcpy.Options(specialize="never", target="x86-64-v3", num_threads=1))
    reference = tcpy.define(ATTENTION, backend="reference")
    calls = [_arguments(rng, 1, 2, length, length, 16) for length in (200, 150, 97, 64, 180, 120) * 2]
    wants = [reference(*args) for args in calls]
    with ThreadPoolExecutor(max_workers=4) as pool:
        gots = list(pool.map(lambda args: kernel(*args), calls))
    for got, want in zip(gots, wants):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_a_first_shape_with_huge_temporaries_builds_no_generic_kernel(builds):
    """Under "auto" such a shape (a causal mask: its chain is no online one, which a generic
    kernel would run) is specialised from its first call; the generic kernel is only planned
    (built at the first shape that runs on it), so no compile is spent on it."""
    kernel = tcpy.define(CAUSAL, options=tcpy.Options(target="x86-64-v3", num_threads=1))
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 2, 512, 16)).astype(np.float32) for _ in range(3))
    want = tcpy.define(CAUSAL, backend="reference")(q, k, v, 0.25)
    np.testing.assert_allclose(kernel(q, k, v, 0.25), want, rtol=1e-4, atol=1e-5)
    assert "its temporaries whole" in kernel.explain(q, k, v, 0.25)
    assert len(builds) == 1 and "generic" not in builds[0], builds
    small = [a[:, :, :8] for a in (q, k, v)]  # a shape the generic kernel serves: built now
    kernel(*small, 0.25)
    assert len(builds) == 2 and "generic" in builds[1], builds


def test_attention_sweeps_its_lengths_on_one_generic_chain(builds):
    """Attention's online chain runs in the generic kernel (its block buffers sized from the
    blocks): under "auto" a sweep of lengths, long ones first, compiles once, and each call's
    rows per block and products are planned for its shape: several blocks of keys, the last
    one shorter, and rows per block fewer than planned where the blocks would not occupy the
    threads."""
    kernel = tcpy.define(ATTENTION, options=tcpy.Options(target="x86-64-v3", num_threads=2))
    reference = tcpy.define(ATTENTION, backend="reference")
    rng = np.random.default_rng(4)
    for length, keys, depth in ((97, 2723, 16), (672, 1360, 8), (49, 1361, 7), (64, 5, 3), (1, 1, 1)):
        args = _arguments(rng, 1, 1, length, keys, depth)
        np.testing.assert_allclose(kernel(*args), reference(*args), rtol=1e-4, atol=1e-5)
        text = str(kernel.explain(*args))
        assert "kernel: generic" in text and "online softmax at every size" in text
        assert "in the chain, on blocks of" in text
    assert builds == ["tcpy_attention_generic"]


def test_shapes_that_share_planned_parts_keep_the_reference_results(builds):
    """A new call shape reuses what earlier shapes planned where it is the same (the offset
    tables of a chain product's roles along the same head size or keys, the bounds of the
    ranges): shapes sharing those parts give the reference evaluator's results, and a shape
    planned again after many others (by a second kernel of the same def) gives the same values
    as at first."""
    options = tcpy.Options(specialize="never", target="x86-64-v3", num_threads=2)
    kernel = tcpy.define(ATTENTION, options=options)
    reference = tcpy.define(ATTENTION, backend="reference")
    rng = np.random.default_rng(5)
    first = _arguments(rng, 1, 2, 40, 33, 16)
    at_first = kernel(*first)
    np.testing.assert_allclose(at_first, reference(*first), rtol=1e-4, atol=1e-5)
    # the same keys and head size with other heads, batches and queries; the same queries with
    # other keys or head size; then lengths around a block of keys (1360: several blocks)
    shared = [(1, 3, 40, 33, 16), (2, 2, 17, 33, 16), (1, 2, 40, 70, 16), (1, 2, 40, 33, 9), (1, 1, 5, 33, 16)]
    others = [(1, int(rng.integers(1, 4)), int(rng.integers(1, 90)), int(rng.integers(1, 90)), int(rng.integers(1, 33)))
              for _ in range(10)]
    for shape in shared + others + [(1, 1, 30, 1361, 16), (1, 2, 40, 1360, 16)]:
        args = _arguments(rng, *shape)
        np.testing.assert_allclose(kernel(*args), reference(*args), rtol=1e-4, atol=1e-5)
    again = tcpy.define(ATTENTION, options=options)(*first)
    np.testing.assert_array_equal(again, at_first)
    assert builds == ["tcpy_attention_generic"] * 2  # (the second kernel finds the library built)


@pytest.mark.parametrize("name", ["attention", "causal"])
def test_a_generic_chains_rows_per_block_follow_each_calls_key_width(builds, name):
    """The block buffers of a generic chain hold the rows of a block of keys: a call with a
    short key row lays its rows closer and takes more of them per block (its packed keys serve
    more queries). One kernel, calls alternating short and long keys (several blocks of keys,
    the last one shorter), queries leaving a partial last block of rows, gives the reference
    evaluator's results; with a chain, short keys take more rows per block than long ones."""
    kernel, reference = _kernel(name, "x86-64-v3", 2)
    rng = np.random.default_rng(6)
    rows_at = {}
    for length, keys in ((129, 127), (301, 5), (97, 2723), (700, 17), (45, 1361), (301, 5), (250, 250)):
        if name == "causal":
            keys = length
        args = _arguments(rng, 1, 2, length, keys, 16)
        np.testing.assert_allclose(kernel(*args), reference(*args), rtol=1e-4, atol=1e-5)
        blocks = [line.split("on blocks of ")[1].split(" rows")[0]
                  for line in str(kernel.explain(*args)).splitlines() if "in the chain, on blocks of" in line]
        if blocks:
            rows_at[keys] = int(blocks[0])
    if name == "attention":  # (the others' scores are no online chain in a generic kernel)
        assert rows_at[17] > rows_at[127] > rows_at[2723], rows_at
    assert len(builds) <= 1


# key lengths and head sizes around the micro-tiles' widths (48 and 64 columns with AVX-512: a
# call takes the one that fits its N) and a block of keys (2016 on x86-64-v4)
TILE_LENGTHS = (47, 48, 49, 63, 64, 65, 95, 96, 97, 191, 192, 193, 255, 256, 257, 287, 288, 289, 2015, 2016, 2017)
TILE_HEADS = (16, 47, 48, 63, 64, 96, 97)
TILE_CONFIGS = [(preset, threads) for preset, threads in (("x86-64-v4", 1), ("x86-64-v4", 7), ("x86-64-v3", 7))
                if Target.preset(preset).can_run_here()] + [(None, 2)]


@pytest.mark.parametrize("preset, threads", TILE_CONFIGS)
@settings(max_examples=3, deadline=None, phases=(Phase.explicit, Phase.generate), suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_each_call_takes_the_micro_tile_that_fits_its_keys_and_head_size(builds, preset, threads, data):
    """A generic attention kernel's chain products hold two micro-tiles where the target has
    them (8x48 and 6x64 with AVX-512) and each call runs the one whose columns its N fills
    best: the reference evaluator's results at key lengths and head sizes around both widths,
    from one compile."""
    kernel, reference = _kernel("attention", preset, threads)
    rng = np.random.default_rng(6)
    shapes = data.draw(st.lists(st.tuples(st.sampled_from((1, 2)), st.integers(1, 40), st.sampled_from(TILE_LENGTHS),
                                          st.sampled_from(TILE_HEADS)), min_size=2, max_size=4))
    for batch, length, keys, depth in [(1, 50, 256, 64)] + shapes:
        args = _arguments(rng, batch, 2, length, keys, depth)
        got, want = kernel(*args), reference(*args)
        assert got.shape == want.shape == (batch, 2, length, depth) and got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    # one generic build at most (none when an earlier test built the same kernel)
    assert len(builds) <= 1 and all("generic" in symbol for symbol in builds)


@pytest.mark.skipif(not Target.preset("x86-64-v4").can_run_here(), reason="needs AVX-512")
def test_attention_products_take_the_micro_tile_of_each_calls_widths():
    """With AVX-512, 256 keys run Q K^T on 6x64 tiles (8x48 would compute 288 columns) and the
    head size 64 the product with V too; 288 keys and a head size of 96 take 8x48 for both."""
    kernel = tcpy.define(ATTENTION, options=tcpy.Options(specialize="never", target="x86-64-v4", num_threads=2))
    rng = np.random.default_rng(7)
    for keys, depth, tiles in ((256, 64, ["6x64", "6x64"]), (288, 96, ["8x48", "8x48"]), (288, 64, ["8x48", "6x64"])):
        args = _arguments(rng, 1, 2, 40, keys, depth)
        kernel(*args)
        lines = [line for line in str(kernel.explain(*args)).splitlines() if "in the chain, on blocks of" in line]
        assert [line.split("micro-tile ")[1].split(";")[0] for line in lines] == tiles


# (SCALED_DOUBLE_ATTENTION: double precision, the scale a literal inside the product: 8-byte block
# buffers, fewer rows per block at a pitch, and a scaled product in both of the chain's per-call plans)


@pytest.mark.parametrize("preset, threads", [("x86-64-v3", 2), ("x86-64", 1)])
@settings(max_examples=3, deadline=None, phases=(Phase.explicit, Phase.generate), suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_one_double_precision_chain_kernel_plans_every_shape(builds, preset, threads, data):
    """A double-precision attention chain, its plans for each new shape made from what the
    kernel fixed once: the reference evaluator's results at many shapes (lengths around its
    blocks of rows and keys, no queries, no keys) in one process, from one compile."""
    key = ("double", preset, threads)
    if key not in _kernels:  # (one kernel for all of hypothesis's examples)
        _kernels[key] = (tcpy.define(SCALED_DOUBLE_ATTENTION, options=tcpy.Options(specialize="never", target=preset, num_threads=threads)),
                         tcpy.define(SCALED_DOUBLE_ATTENTION, backend="reference"))
    kernel, reference = _kernels[key]
    rng = np.random.default_rng(8)
    lengths = st.sampled_from(LENGTHS + ROW_BLOCKS + KEY_BLOCKS[:3])
    shapes = data.draw(st.lists(st.tuples(st.sampled_from((1, 2)), st.sampled_from((1, 3)), lengths, lengths,
                                          st.sampled_from(HEADS[:4])), min_size=4, max_size=6))
    calls = []
    for batch, heads, length, keys, depth in [(1, 2, 129, 700, 17)] + shapes + [(1, 2, 0, 5, 3), (1, 1, 7, 0, 3)]:
        calls.append([rng.standard_normal((batch, heads, n, depth)) for n in (length, keys, keys)])
        got, want = kernel(*calls[-1]), reference(*calls[-1])
        assert got.shape == want.shape == (batch, heads, length, depth) and got.dtype == np.float64
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    assert "in the chain, on blocks of" in str(kernel.explain(*calls[0]))
    # one build in the kernel's life (this test's examples are its only calls)
    assert len(builds) == 1 and "generic" in builds[0]


# V laid out otherwise than its packed slivers: its rows W > D apart, or transposed (the chain's
# second product reads V in place only where it is laid out as packed: its rows one micro-tile
# width apart, as attention's V at a head size of that width)
def _attention_reading_v(name: str, v_type: str, v_read: str) -> str:
    """Attention whose V is declared ``v_type`` and read as ``v_read`` by the second product."""
    return f"""
def {name}(float(B,H,L,D) Q, float(B,H,S,D) K, {v_type} V, float scale) -> (O) {{
    Sc(b, h, l, s) +=! Q(b, h, l, d) * K(b, h, s, d)
    Mx(b, h, l) max=! Sc(b, h, l, s)
    E(b, h, l, s) = exp(scale * (Sc(b, h, l, s) - Mx(b, h, l)))
    Sm(b, h, l) +=! E(b, h, l, s)
    P(b, h, l, s) = E(b, h, l, s) / Sm(b, h, l)
    O(b, h, l, d) +=! P(b, h, l, s) * {v_read}
}}
"""


WIDE_V = _attention_reading_v("wide", "float(B,H,S,W)", "V(b, h, s, d) where d in 0:D")
TRANSPOSED_V = _attention_reading_v("transposed", "float(B,H,D,S)", "V(b, h, d, s)")
V_LAYOUTS = {"attention": (ATTENTION, lambda keys, depth, extra: (keys, depth)),
             "wide": (WIDE_V, lambda keys, depth, extra: (keys, depth + extra)),
             "transposed": (TRANSPOSED_V, lambda keys, depth, extra: (depth, keys))}
# head sizes at the micro-tiles' widths (16 to 64 columns: a call's V in place) and beside them
V_HEADS = (8, 15, 16, 17, 24, 32, 47, 48, 49, 64, 65)
V_CONFIGS = [("wide", "x86-64-v3", 2), ("transposed", None, 7), ("wide", None, 1), ("attention", "x86-64-v3", 7)]


@pytest.mark.parametrize("name, preset, threads", V_CONFIGS)
@settings(max_examples=3, deadline=None, phases=(Phase.explicit, Phase.generate), suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_the_chains_second_product_reads_v_in_place_only_where_it_is_laid_out_as_packed(builds, name, preset,
                                                                                         threads, data):
    """V at head sizes around the micro-tiles' widths, its rows one width apart (read in
    place when on a vector's boundary), further apart or transposed (packed), with key lengths
    around the tiles and a block of keys: the reference evaluator's results, from one compile."""
    source, v_shape = V_LAYOUTS[name]
    key = (name, preset, threads)
    if key not in _kernels:  # (one kernel for all of hypothesis's examples)
        options = tcpy.Options(specialize="never", target=preset, num_threads=threads)
        _kernels[key] = (tcpy.define(source, options=options), tcpy.define(source, backend="reference"))
    kernel, reference = _kernels[key]
    rng = np.random.default_rng(9)
    shapes = data.draw(st.lists(st.tuples(st.sampled_from((1, 2)), st.integers(1, 30), st.sampled_from(TILE_LENGTHS),
                                          st.sampled_from(V_HEADS), st.sampled_from((1, 16)), st.booleans()),
                                min_size=3, max_size=5))
    for batch, length, keys, depth, extra, aligned in [(1, 40, 256, 64, 16, True), (1, 9, 256, 64, 16, False)] + shapes:
        f32 = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
        v = f32(batch, 2, *v_shape(keys, depth, extra))
        if aligned:  # (on a vector: read in place where laid out as packed; NumPy's arrays are on 16 bytes)
            memory = np.empty(v.size + 16, np.float32)
            start = -memory.ctypes.data % 64 // 4
            memory[start:start + v.size] = v.ravel()
            v = memory[start:start + v.size].reshape(v.shape)
        args = (f32(batch, 2, length, depth), f32(batch, 2, keys, depth), v, np.float32(0.2))
        got, want = kernel(*args), reference(*args)
        assert got.shape == want.shape == (batch, 2, length, depth) and got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert "in the chain, on blocks of" in str(kernel.explain(*args))
    assert len(builds) <= 1 and all("generic" in symbol for symbol in builds)
