"""Call-time argument checks: count, kind, dtype, rank, constant dims, consistent sizes."""
import numpy as np
import pytest

import tcpy
from tcpy.binding import bind_arguments
from tcpy.errors import TCArgumentError, TCShapeError


def parse(src):
    return tcpy.parse(src).defs[0]


MATMUL = parse("def matmul(float(M,K) A, float(K,N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }")
SCALE = parse("def scale(float(N) X, float a, int32 b, bool c, double d) -> (Y) "
              "{ Y(i) = c ? X(i) * a + float(b) + float(d) : 0.0 }")


def f32(*shape):
    return np.zeros(shape, dtype=np.float32)


def test_binds_sizes_and_returns_arrays_as_given():
    a, b = f32(2, 3), f32(3, 4)
    arrays, sizes = bind_arguments(MATMUL, (a, b))
    assert sizes == {"M": 2, "K": 3, "N": 4}
    assert arrays[0] is a and arrays[1] is b


def test_non_contiguous_views_are_accepted():
    a = np.zeros((3, 2), dtype=np.float32).T
    arrays, sizes = bind_arguments(MATMUL, (a, f32(3, 1)))
    assert sizes == {"M": 2, "K": 3, "N": 1} and arrays[0] is a


def test_zero_sizes_are_bound():
    assert bind_arguments(MATMUL, (f32(0, 3), f32(3, 0)))[1] == {"M": 0, "K": 3, "N": 0}


def test_wrong_number_of_arguments():
    with pytest.raises(TCArgumentError, match=r"^def 'matmul' takes 2 arguments \(A, B\), got 3$"):
        bind_arguments(MATMUL, (f32(2, 3), f32(3, 4), f32(1)))
    with pytest.raises(TCArgumentError, match=r"takes 2 arguments \(A, B\), got 1$"):
        bind_arguments(MATMUL, (f32(2, 3),))


def test_non_array_argument():
    with pytest.raises(TCArgumentError) as info:
        bind_arguments(MATMUL, ([[1.0]], f32(1, 1)))
    assert str(info.value) == "def 'matmul': argument A must be a numpy.ndarray (float(M, K) A), got list"
    assert not isinstance(info.value, TCShapeError)


def test_wrong_dtype_is_never_cast():
    with pytest.raises(TCArgumentError) as info:
        bind_arguments(MATMUL, (f32(2, 3), np.zeros((3, 4))))
    assert str(info.value) == (
        "def 'matmul': argument B must have dtype float32 (float(K, N) B), got float64; "
        "nothing is cast implicitly: pass B.astype(numpy.float32)"
    )


def test_wrong_rank():
    with pytest.raises(TCArgumentError) as info:
        bind_arguments(MATMUL, (f32(6), f32(3, 4)))
    assert str(info.value) == "def 'matmul': argument A must have rank 2 (float(M, K) A), got rank 1 (shape (6,))"


def test_size_bound_to_two_values():
    with pytest.raises(TCShapeError) as info:
        bind_arguments(MATMUL, (f32(2, 4), f32(5, 3)))
    assert str(info.value) == "def 'matmul': size K is 4 from A.shape[1] but B.shape[0] is 5"


def test_size_repeated_in_one_argument():
    d = parse("def tr(float(N,N) A) -> (S) { S +=! A(i, i) }")
    assert bind_arguments(d, (f32(3, 3),))[1] == {"N": 3}
    with pytest.raises(TCShapeError, match=r"size N is 3 from A.shape\[0\] but A.shape\[1\] is 4"):
        bind_arguments(d, (f32(3, 4),))


def test_constant_dim_mismatch():
    d = parse("def f(float(3,N) X) -> (Y) { Y(i, j) = X(i, j) }")
    assert bind_arguments(d, (f32(3, 7),))[1] == {"N": 7}
    with pytest.raises(TCShapeError) as info:
        bind_arguments(d, (f32(4, 7),))
    assert str(info.value) == "def 'f': argument X must have shape (3, N): X.shape[0] must be 3, got 4 (shape (4, 7))"


def test_a_dimension_beyond_the_int32_index_range():
    # (an empty array may be that long: it holds no element)
    with pytest.raises(TCShapeError) as info:
        bind_arguments(MATMUL, (f32(2**31, 0), f32(0, 3)))
    assert str(info.value) == "def 'matmul': A.shape[0] is 2147483648, larger than the int32 index range"


def test_rank_0_accepts_python_numbers_of_the_right_kind():
    arrays, sizes = bind_arguments(SCALE, (f32(2), 1.5, 3, True, 2))
    assert sizes == {"N": 2}
    assert [a.dtype for a in arrays[1:]] == [np.float32, np.int32, np.bool_, np.float64]
    assert [a.shape for a in arrays[1:]] == [(), (), (), ()]
    assert arrays[1] == np.float32(1.5) and arrays[2] == 3 and arrays[3] and arrays[4] == 2.0


def test_rank_0_accepts_0d_arrays_and_numpy_scalars_of_exact_dtype():
    arrays, _ = bind_arguments(SCALE, (f32(2), np.array(2.0, np.float32), np.int32(4), np.bool_(False), 1.0))
    assert arrays[1].shape == () and arrays[2] == 4 and arrays[2].dtype == np.int32
    with pytest.raises(TCArgumentError, match=r"argument a must have dtype float32 \(float a\), got float64"):
        bind_arguments(SCALE, (f32(2), np.array(2.0), 1, True, 1.0))
    with pytest.raises(TCArgumentError, match=r"argument b must have dtype int32 \(int32 b\), got int64"):
        bind_arguments(SCALE, (f32(2), 1.0, np.int64(1), True, 1.0))
    with pytest.raises(TCArgumentError, match=r"argument a must have rank 0 \(float a\), got rank 1 \(shape \(1,\)\)"):
        bind_arguments(SCALE, (f32(2), f32(1), 1, True, 1.0))


@pytest.mark.parametrize("position,value,message", [
    (2, 1.5, "argument b (int32 b) must be an int or a 0-d int32 array, got float"),
    (2, True, "argument b (int32 b) must be an int or a 0-d int32 array, got bool"),
    (1, True, "argument a (float a) must be a float or int or a 0-d float32 array, got bool"),
    (1, "1.0", "argument a (float a) must be a float or int or a 0-d float32 array, got str"),
    (3, 1, "argument c (bool c) must be a bool or a 0-d bool array, got int"),
    (2, 2**31, "argument b (int32 b) = 2147483648 is outside the range of int32 [-2147483648, 2147483647]"),
])
def test_rank_0_rejects_other_kinds(position, value, message):
    args = [f32(2), 1.0, 1, True, 1.0]
    args[position] = value
    with pytest.raises(TCArgumentError) as info:
        bind_arguments(SCALE, tuple(args))
    assert str(info.value) == "def 'scale': " + message


@pytest.mark.parametrize("tc,np_dtype", [
    ("bool", np.bool_), ("uint8", np.uint8), ("uint16", np.uint16), ("uint32", np.uint32), ("uint64", np.uint64),
    ("int8", np.int8), ("int16", np.int16), ("int32", np.int32), ("int64", np.int64),
    ("half", np.float16), ("float16", np.float16), ("float", np.float32), ("float32", np.float32),
    ("double", np.float64), ("float64", np.float64),
])
def test_every_tc_type_maps_to_its_numpy_dtype(tc, np_dtype):
    d = parse(f"def f({tc}(N) X) -> (Y) {{ Y(i) = X(i) }}")
    x = np.zeros(3, dtype=np_dtype)
    assert bind_arguments(d, (x,))[1] == {"N": 3}
    other = np.zeros(3, dtype=np.complex64)
    with pytest.raises(TCArgumentError, match=f"must have dtype {np.dtype(np_dtype).name}"):
        bind_arguments(d, (other,))


def test_bind_then_ranges_end_to_end():
    from tcpy.ranges import infer

    d = parse("def conv1d(float(I) B, float(K) W) -> (A) { A(i) +=! B(i + k) * W(k) }")
    _, sizes = bind_arguments(d, (f32(10), f32(3)))
    assert infer(d).bind(sizes).shapes == {"A": (8,)}
