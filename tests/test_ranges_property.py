"""Range inference against brute force: the inferred range is exactly the set of in-bounds values."""
from hypothesis import given, settings, strategies as st

import tcpy
from tcpy.errors import TCPreconditionError, TCRangeError
from tcpy.ranges import infer

coefficient = st.integers(-3, 3).filter(bool)
offset = st.integers(-6, 6)


def index_text(a, b):
    return f"{a}*i + {b}" if b >= 0 else f"{a}*i - {-b}"


@settings(max_examples=60, deadline=None)
@given(accesses=st.lists(st.tuples(coefficient, offset), min_size=1, max_size=3),
       divisor=st.sampled_from([None, 2, 3]))
def test_one_variable_ranges_match_brute_force(accesses, divisor):
    def index(a, b, i):
        return (a * i + b) // divisor if divisor else a * i + b

    reads = " + ".join(
        f"B(({index_text(a, b)}) / {divisor})" if divisor else f"B({index_text(a, b)})" for a, b in accesses
    )
    src = f"def f(float(N) B) -> (A) {{ A(i) = {reads} }}"
    try:
        dr = infer(tcpy.parse(src).defs[0], src)
    except TCRangeError:
        # only when for every N the values are empty or reach below 0
        for n in range(1, 13):
            valid = [i for i in range(-60, 60) if all(0 <= index(a, b, i) < n for a, b in accesses)]
            assert not valid or min(valid) < 0, (src, n, valid)
        return
    for n in range(0, 13):
        valid = [i for i in range(-60, 60) if all(0 <= index(a, b, i) < n for a, b in accesses)]
        if valid and min(valid) < 0:
            try:
                dr.bind({"N": n})
            except TCPreconditionError:
                continue
            raise AssertionError(f"{src}: N={n} lets output index i start at {min(valid)}")
        bound = dr.bind({"N": n})
        if valid:
            assert bound.statements[0]["i"] == (min(valid), max(valid) + 1), (src, n)
            assert bound.shapes["A"] == (max(valid) + 1,)
        else:
            assert bound.statements[0]["i"] == (0, 0) and bound.shapes["A"] == (0,), (src, n)


@settings(max_examples=40, deadline=None)
@given(stride=st.integers(1, 3), dilation=st.integers(1, 2), shift=st.integers(0, 2))
def test_strided_dilated_stencil_matches_brute_force(stride, dilation, shift):
    # B(s*i + d*k - shift): i starts at shift/s rounded up, >= 0, so no output index is negative
    src = (f"def f(float(N) B, float(K) W) -> (A) "
           f"{{ A(i) +=! B({stride}*i + {dilation}*k - {shift}) * W(k) }}")
    dr = infer(tcpy.parse(src).defs[0], src)
    for n in range(0, 14):
        for k in range(1, 5):
            valid = [i for i in range(-40, 40)
                     if all(0 <= stride * i + dilation * kk - shift < n for kk in range(k))]
            bound = dr.bind({"N": n, "K": k})
            assert bound.shapes["A"] == ((max(valid) + 1) if valid else 0,), (src, n, k)


@settings(max_examples=40, deadline=None)
@given(a=st.integers(-2, 2), b=st.integers(-2, 2), c=st.integers(-3, 3))
def test_preconditions_reject_exactly_the_out_of_bounds_sizes(a, b, c):
    src = f"def f(float(N) B, float(P) C, float(M) D) -> (A) {{ A(i, j) = B(i) * C({a}*i + {b}*j + {c}) * D(j) }}"
    try:
        dr = infer(tcpy.parse(src).defs[0], src)
    except TCRangeError:  # out of bounds for every size that runs anything
        for n, m, p in [(1, 1, 1), (2, 3, 4), (3, 3, 12)]:
            assert any(not 0 <= a * i + b * j + c < p for i in range(n) for j in range(m))
        return
    for n in range(0, 4):
        for m in range(0, 4):
            for p in range(0, 8):
                reads_out = any(not 0 <= a * i + b * j + c < p for i in range(n) for j in range(m))
                try:
                    dr.bind({"N": n, "P": p, "M": m})
                except TCPreconditionError as err:
                    assert reads_out, (src, n, m, p)
                    assert f"N={n}, P={p}, M={m}" in str(err)
                else:
                    assert not reads_out, (src, n, m, p)
