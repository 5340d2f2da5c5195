"""csrc/tcpy_runtime.h: integer division, casts, identities, NaN-propagating max/min, builtins.

Each helper is wrapped in an exported C function, compiled once with build_library, and called
through ctypes against Python's own arithmetic, math module and NumPy.
"""
import ctypes
import math
import mmap
import resource
import subprocess

import numpy as np
import pytest

from tcpy.runtime import build

WRAPPERS = r"""
#include "tcpy_runtime.h"
int32_t floordiv_i32(int32_t a, int32_t b) { return tcpy_floordiv_int32(a, b); }
int32_t floormod_i32(int32_t a, int32_t b) { return tcpy_floormod_int32(a, b); }
int64_t floordiv_i64(int64_t a, int64_t b) { return tcpy_floordiv_int64(a, b); }
int64_t floormod_i64(int64_t a, int64_t b) { return tcpy_floormod_int64(a, b); }
int8_t floordiv_i8(int8_t a, int8_t b) { return tcpy_floordiv_int8(a, b); }
int32_t div_i32(int32_t a, int32_t b, int *z) { return tcpy_div_int32(a, b, z); }
int32_t mod_i32(int32_t a, int32_t b, int *z) { return tcpy_mod_int32(a, b, z); }
uint16_t div_u16(uint16_t a, uint16_t b, int *z) { return tcpy_div_uint16(a, b, z); }
int8_t f32_to_i8(float x) { return tcpy_cast_float32_to_int8(x); }
int32_t f32_to_i32(float x) { return tcpy_cast_float32_to_int32(x); }
int64_t f64_to_i64(double x) { return tcpy_cast_float64_to_int64(x); }
uint8_t f64_to_u8(double x) { return tcpy_cast_float64_to_uint8(x); }
uint64_t f32_to_u64(float x) { return tcpy_cast_float32_to_uint64(x); }
int16_t f16_to_i16(float x) { return tcpy_cast_float16_to_int16((float16)x); }
uint32_t f16_to_u32(float x) { return tcpy_cast_float16_to_uint32((float16)x); }
int8_t i64_to_i8(int64_t x) { return tcpy_cast_int64_to_int8(x); }
uint8_t i64_to_u8(int64_t x) { return tcpy_cast_int64_to_uint8(x); }
int64_t u64_to_i64(uint64_t x) { return tcpy_cast_uint64_to_int64(x); }
uint32_t i32_to_u32(int32_t x) { return tcpy_cast_int32_to_uint32(x); }
int16_t u16_to_i16(uint16_t x) { return tcpy_cast_uint16_to_int16(x); }
bool f64_to_bool(double x) { return tcpy_cast_float64_to_bool(x); }
int32_t bool_to_i32(bool x) { return tcpy_cast_bool_to_int32(x); }
double max_f64(double a, double b) { return tcpy_max_float64(a, b); }
double min_f64(double a, double b) { return tcpy_min_float64(a, b); }
float max_f32(float a, float b) { return tcpy_max_float32(a, b); }
float min_f16(float a, float b) { return tcpy_min_float16((float16)a, (float16)b); }
int8_t max_i8(int8_t a, int8_t b) { return tcpy_max_int8(a, b); }
double max_id_f64(void) { return TCPY_MAX_IDENTITY_float64; }
float min_id_f32(void) { return TCPY_MIN_IDENTITY_float32; }
float max_id_f16(void) { return TCPY_MAX_IDENTITY_float16; }
int64_t max_id_i16(void) { return TCPY_MAX_IDENTITY_int16; }
int64_t min_id_i16(void) { return TCPY_MIN_IDENTITY_int16; }
uint64_t min_id_u64(void) { return TCPY_MIN_IDENTITY_uint64; }
int64_t max_id_u8(void) { return TCPY_MAX_IDENTITY_uint8; }
double rsqrt(double x) { return tcpy_rsqrt(x); }
float rsqrtf_(float x) { return tcpy_rsqrtf(x); }
double rcbrt(double x) { return tcpy_rcbrt(x); }
double exp10_(double x) { return tcpy_exp10(x); }
float exp10f_(float x) { return tcpy_exp10f(x); }
double fdivide(double a, double b) { return tcpy_fdivide(a, b); }
double rhypot(double a, double b) { return tcpy_rhypot(a, b); }
double norm3d(double a, double b, double c) { return tcpy_norm3d(a, b, c); }
double norm4d(double a, double b, double c, double d) { return tcpy_norm4d(a, b, c, d); }
double rnorm3d(double a, double b, double c) { return tcpy_rnorm3d(a, b, c); }
float rnorm4df(float a, float b, float c, float d) { return tcpy_rnorm4df(a, b, c, d); }
double sinpi(double x) { return tcpy_sinpi(x); }
double cospi(double x) { return tcpy_cospi(x); }
float sinpif(float x) { return tcpy_sinpif(x); }
double erfcx(double x) { return tcpy_erfcx(x); }
double erfinv(double x) { return tcpy_erfinv(x); }
double erfcinv(double x) { return tcpy_erfcinv(x); }
float erfinvf(float x) { return tcpy_erfinvf(x); }
double normcdf(double x) { return tcpy_normcdf(x); }
double normcdfinv(double x) { return tcpy_normcdfinv(x); }
double i0(double x) { return tcpy_cyl_bessel_i0(x); }
double i1(double x) { return tcpy_cyl_bessel_i1(x); }
float i0f(float x) { return tcpy_cyl_bessel_i0f(x); }
void *scratch(int slot, uint64_t bytes) { return tcpy_scratch(slot, (size_t)bytes); }
"""

C = ctypes
SIGNATURES = {
    "floordiv_i32": (C.c_int32, C.c_int32, C.c_int32), "floormod_i32": (C.c_int32, C.c_int32, C.c_int32),
    "floordiv_i64": (C.c_int64, C.c_int64, C.c_int64), "floormod_i64": (C.c_int64, C.c_int64, C.c_int64),
    "floordiv_i8": (C.c_int8, C.c_int8, C.c_int8),
    "div_i32": (C.c_int32, C.c_int32, C.c_int32, C.POINTER(C.c_int)),
    "mod_i32": (C.c_int32, C.c_int32, C.c_int32, C.POINTER(C.c_int)),
    "div_u16": (C.c_uint16, C.c_uint16, C.c_uint16, C.POINTER(C.c_int)),
    "f32_to_i8": (C.c_int8, C.c_float), "f32_to_i32": (C.c_int32, C.c_float),
    "f64_to_i64": (C.c_int64, C.c_double), "f64_to_u8": (C.c_uint8, C.c_double),
    "f32_to_u64": (C.c_uint64, C.c_float), "f16_to_i16": (C.c_int16, C.c_float),
    "f16_to_u32": (C.c_uint32, C.c_float),
    "i64_to_i8": (C.c_int8, C.c_int64), "i64_to_u8": (C.c_uint8, C.c_int64),
    "u64_to_i64": (C.c_int64, C.c_uint64), "i32_to_u32": (C.c_uint32, C.c_int32),
    "u16_to_i16": (C.c_int16, C.c_uint16), "f64_to_bool": (C.c_bool, C.c_double),
    "bool_to_i32": (C.c_int32, C.c_bool),
    "max_f64": (C.c_double, C.c_double, C.c_double), "min_f64": (C.c_double, C.c_double, C.c_double),
    "max_f32": (C.c_float, C.c_float, C.c_float), "min_f16": (C.c_float, C.c_float, C.c_float),
    "max_i8": (C.c_int8, C.c_int8, C.c_int8),
    "max_id_f64": (C.c_double,), "min_id_f32": (C.c_float,), "max_id_f16": (C.c_float,),
    "max_id_i16": (C.c_int64,), "min_id_i16": (C.c_int64,), "min_id_u64": (C.c_uint64,),
    "max_id_u8": (C.c_int64,),
    "rsqrt": (C.c_double, C.c_double), "rsqrtf_": (C.c_float, C.c_float), "rcbrt": (C.c_double, C.c_double),
    "exp10_": (C.c_double, C.c_double), "exp10f_": (C.c_float, C.c_float),
    "fdivide": (C.c_double, C.c_double, C.c_double), "rhypot": (C.c_double, C.c_double, C.c_double),
    "norm3d": (C.c_double,) * 4, "norm4d": (C.c_double,) * 5, "rnorm3d": (C.c_double,) * 4,
    "rnorm4df": (C.c_float,) * 5,
    "sinpi": (C.c_double, C.c_double), "cospi": (C.c_double, C.c_double), "sinpif": (C.c_float, C.c_float),
    "erfcx": (C.c_double, C.c_double), "erfinv": (C.c_double, C.c_double),
    "erfcinv": (C.c_double, C.c_double), "erfinvf": (C.c_float, C.c_float),
    "normcdf": (C.c_double, C.c_double), "normcdfinv": (C.c_double, C.c_double),
    "i0": (C.c_double, C.c_double), "i1": (C.c_double, C.c_double), "i0f": (C.c_float, C.c_float),
    "scratch": (C.c_void_p, C.c_int, C.c_uint64),
}


class Lib:
    def __init__(self, path):
        self._lib = ctypes.CDLL(str(path))
        for name, (restype, *argtypes) in SIGNATURES.items():
            fn = getattr(self._lib, name)
            fn.restype, fn.argtypes = restype, argtypes
            setattr(self, name, fn)


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("TCPY_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    try:
        yield Lib(build.build_library(WRAPPERS))
    finally:
        mp.undo()


def test_header_compiles_without_warnings(tmp_path):
    src = tmp_path / "k.c"
    src.write_text(WRAPPERS)
    cmd = ["gcc", *build.DEFAULT_FLAGS, "-Wall", "-Wextra", "-Werror", "-I", str(build.runtime_include_dir()),
           str(src), "-o", str(tmp_path / "k.so"), "-lm"]
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


PAIRS = [(a, b) for a in (-9, -8, -7, -1, 0, 1, 7, 8, 9, -2**31 + 1, 2**31 - 1) for b in (-8, -3, -1, 1, 3, 8)]


@pytest.mark.parametrize("a,b", PAIRS)
def test_floor_division_and_modulo_match_python(lib, a, b):
    assert lib.floordiv_i32(a, b) == a // b
    assert lib.floormod_i32(a, b) == a % b
    assert lib.floordiv_i64(a * 2**20, b) == (a * 2**20) // b
    assert lib.floormod_i64(a * 2**20, b) == (a * 2**20) % b


@pytest.mark.parametrize("a,b", [(-7, 2), (7, -2), (-128, 3), (127, -5)])
def test_floordiv_small_type(lib, a, b):
    assert lib.floordiv_i8(a, b) == a // b


@pytest.mark.parametrize("a,b", [(7, 2), (-7, 2), (7, -2), (-7, -2), (0, 5), (-2**31, -1), (-2**31, 3)])
def test_value_division_truncates_like_c(lib, a, b):
    z = ctypes.c_int(0)
    q = lib.div_i32(a, b, ctypes.byref(z))
    r = lib.mod_i32(a, b, ctypes.byref(z))
    if (a, b) == (-2**31, -1):  # the one overflow: wraps, documented
        assert (q, r) == (-2**31, 0)
    else:
        assert q == (abs(a) // abs(b)) * (1 if (a < 0) == (b < 0) else -1)
        assert r == a - b * q
    assert z.value == 0


def test_value_division_by_zero_sets_the_flag(lib):
    z = ctypes.c_int(0)
    assert lib.div_i32(5, 0, ctypes.byref(z)) == 0 and z.value == 1
    z.value = 0
    assert lib.mod_i32(-5, 0, ctypes.byref(z)) == 0 and z.value == 1
    z.value = 0
    assert lib.div_u16(5, 0, ctypes.byref(z)) == 0 and z.value == 1
    z.value = 0
    assert lib.div_u16(65535, 2, ctypes.byref(z)) == 32767 and z.value == 0


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("fn,x,expected", [
    ("f32_to_i8", 3.9, 3), ("f32_to_i8", -3.9, -3), ("f32_to_i8", 127.9, 127), ("f32_to_i8", 128.0, 127),
    ("f32_to_i8", -128.9, -128), ("f32_to_i8", -1e30, -128), ("f32_to_i8", NAN, 0), ("f32_to_i8", INF, 127),
    ("f32_to_i32", 3e9, 2**31 - 1), ("f32_to_i32", -3e9, -2**31), ("f32_to_i32", -INF, -2**31),
    ("f32_to_i32", 2147483520.0, 2147483520), ("f32_to_i32", NAN, 0),
    ("f64_to_i64", 1e19, 2**63 - 1), ("f64_to_i64", -1e19, -2**63), ("f64_to_i64", 2.0**62, 2**62),
    ("f64_to_u8", -0.5, 0), ("f64_to_u8", -7.0, 0), ("f64_to_u8", 255.99, 255), ("f64_to_u8", 256.0, 255),
    ("f64_to_u8", NAN, 0),
    ("f32_to_u64", 1e20, 2**64 - 1), ("f32_to_u64", -1.0, 0), ("f32_to_u64", 2.0**63, 2**63),
    ("f16_to_i16", 65504.0, 2**15 - 1), ("f16_to_i16", -INF, -2**15), ("f16_to_i16", -1234.5, -1234),
    ("f16_to_u32", INF, 2**32 - 1), ("f16_to_u32", 65504.0, 65504), ("f16_to_u32", NAN, 0),
    ("i64_to_i8", 300, 127), ("i64_to_i8", -300, -128), ("i64_to_i8", -5, -5),
    ("i64_to_u8", -5, 0), ("i64_to_u8", 256, 255), ("i64_to_u8", 200, 200),
    ("u64_to_i64", 2**64 - 1, 2**63 - 1), ("u64_to_i64", 5, 5),
    ("i32_to_u32", -1, 0), ("i32_to_u32", 2**31 - 1, 2**31 - 1),
    ("u16_to_i16", 65535, 32767), ("u16_to_i16", 100, 100),
    ("f64_to_bool", NAN, True), ("f64_to_bool", 0.0, False), ("f64_to_bool", -0.0, False), ("f64_to_bool", 0.1, True),
    ("bool_to_i32", True, 1),
])
def test_casts_truncate_and_saturate(lib, fn, x, expected):
    assert getattr(lib, fn)(x) == expected


def test_max_min_propagate_nan_like_numpy(lib):
    cases = [(1.0, 2.0), (2.0, 1.0), (NAN, 1.0), (1.0, NAN), (NAN, NAN), (-INF, 3.0)]
    for a, b in cases:
        np.testing.assert_equal(lib.max_f64(a, b), np.maximum(a, b))
        np.testing.assert_equal(lib.min_f64(a, b), np.minimum(a, b))
        np.testing.assert_equal(lib.max_f32(a, b), np.maximum(np.float32(a), np.float32(b)))
        np.testing.assert_equal(lib.min_f16(a, b), np.minimum(np.float16(a), np.float16(b)))
    assert lib.max_i8(-3, 5) == 5 and lib.max_i8(-128, -127) == -127


def test_reduction_identities(lib):
    assert lib.max_id_f64() == -INF and lib.min_id_f32() == INF and lib.max_id_f16() == -INF
    assert (lib.max_id_i16(), lib.min_id_i16()) == (-2**15, 2**15 - 1)
    assert lib.min_id_u64() == 2**64 - 1 and lib.max_id_u8() == 0


def close(a, b, rel=1e-14):
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-300)


def test_simple_builtins(lib):
    assert close(lib.rsqrt(4.0), 0.5) and close(lib.rsqrtf_(16.0), 0.25, 1e-7)
    assert close(lib.rcbrt(27.0), 1 / 3) and close(lib.exp10_(3.0), 1000.0)
    assert close(lib.exp10f_(2.0), 100.0, 1e-6) and lib.fdivide(1.0, 0.0) == INF
    assert close(lib.rhypot(3.0, 4.0), 0.2)
    assert close(lib.norm3d(1e200, 2e200, 2e200), 3e200)  # no overflow in the squares
    assert close(lib.norm4d(1.0, 1.0, 1.0, 1.0), 2.0) and close(lib.rnorm3d(2.0, 3.0, 6.0), 1 / 7)
    assert close(lib.rnorm4df(2.0, 2.0, 2.0, 2.0), 0.25, 1e-7)


def test_sinpi_cospi_exact_at_integers_and_halves(lib):
    for k in range(-6, 7):
        assert lib.sinpi(float(k)) == 0.0
        assert lib.cospi(float(k)) == (1.0 if k % 2 == 0 else -1.0)
        assert lib.cospi(k + 0.5) == 0.0
        assert lib.sinpi(k + 0.5) == (1.0 if k % 2 == 0 else -1.0)
    assert close(lib.sinpi(1 / 6), 0.5, 1e-15) and close(lib.cospi(1 / 3), 0.5, 1e-15)
    assert close(lib.sinpi(1e6 + 0.25), math.sqrt(0.5), 1e-15)
    assert math.isnan(lib.sinpi(INF)) and math.isnan(lib.cospi(NAN))
    assert close(lib.sinpif(0.25), math.sqrt(0.5), 1e-7)


@pytest.mark.parametrize("x", [-3.0, -0.5, 0.0, 0.5, 2.0, 10.0, 25.9, 26.1, 100.0, 1e5])
def test_erfcx(lib, x):
    expected = math.exp(x * x) * math.erfc(x) if x < 25 else None
    if expected is None:  # asymptotic: 1/(x sqrt(pi)) (1 - 1/(2x^2) + 3/(4x^4) ...)
        expected = 1 / (x * math.sqrt(math.pi)) * (1 - 1 / (2 * x * x) + 3 / (4 * x**4) - 15 / (8 * x**6))
        assert close(lib.erfcx(x), expected, 1e-9)
    else:
        assert close(lib.erfcx(x), expected, 1e-13)


@pytest.mark.parametrize("y", [-0.999999, -0.9, -0.5, -0.1, 1e-10, 0.3, 0.49, 0.5, 0.7, 0.99, 1 - 1e-12])
def test_erfinv_inverts_erf(lib, y):
    x = lib.erfinv(y)
    assert close(math.erf(x), y, 1e-14)
    if abs(y) >= 0.5:  # in the tail, check the complement, which carries the digits
        assert close(math.erfc(abs(x)), 1 - abs(y), 1e-13)
    y32 = float(np.float32(y))
    assert close(lib.erfinvf(y32), float(np.float32(lib.erfinv(y32))), 1e-7)


@pytest.mark.parametrize("c", [1e-300, 1e-100, 1e-20, 1e-5, 0.1, 0.5, 0.9, 1.0, 1.5, 1.99, 2 - 1e-12])
def test_erfcinv_inverts_erfc(lib, c):
    x = lib.erfcinv(c)
    assert close(math.erfc(x), c, 1e-13)


def test_inverse_error_functions_at_the_edges(lib):
    assert lib.erfinv(1.0) == INF and lib.erfinv(-1.0) == -INF and lib.erfinv(0.0) == 0.0
    assert math.isnan(lib.erfinv(1.5)) and math.isnan(lib.erfinv(NAN))
    assert lib.erfcinv(0.0) == INF and lib.erfcinv(2.0) == -INF and math.isnan(lib.erfcinv(-0.1))


def test_normcdf_and_inverse(lib):
    for x in (-30.0, -5.0, -1.0, 0.0, 0.5, 3.0):
        # the tail amplifies the last-bit difference in x / sqrt(2): 2 x^2 ulp
        assert close(lib.normcdf(x), 0.5 * math.erfc(-x / math.sqrt(2)), 1e-12)
    for p in (1e-200, 1e-8, 0.025, 0.5, 0.975, 1 - 1e-9):
        assert close(lib.normcdf(lib.normcdfinv(p)), p, 1e-12)
    assert close(lib.normcdfinv(0.975), 1.959963984540054, 1e-14)


@pytest.mark.parametrize("x", [0.0, 1e-3, 0.5, 1.0, 5.0, 29.9, 30.1, 100.0, 700.0])
def test_bessel_i0_i1(lib, x):
    assert close(lib.i0(x), float(np.i0(x)), 1e-13)
    assert close(lib.i0(-x), lib.i0(x), 0)
    # I1 = I0': compare with a central difference of NumPy's I0, and with the series at 1e-3
    if 0.5 <= x <= 100:
        h = 1e-6 * x
        assert close(lib.i1(x), float((np.i0(x + h) - np.i0(x - h)) / (2 * h)), 1e-7)
    assert lib.i1(-x) == -lib.i1(x)
    with np.errstate(over="ignore"):  # beyond float's range both are inf
        np.testing.assert_allclose(lib.i0f(x), np.float32(lib.i0(x)), rtol=1e-6)
    assert close(lib.i1(1e-3), 5.000000625000026e-4, 1e-14)


def _populate_write_supported() -> bool:
    """Whether this system's madvise populates pages for writing (Linux 5.14 and later)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    region = mmap.mmap(-1, mmap.PAGESIZE)
    try:
        address = ctypes.addressof(ctypes.c_char.from_buffer(region))
        return libc.madvise(address, mmap.PAGESIZE, 23) == 0  # MADV_POPULATE_WRITE
    finally:
        region.close()


@pytest.mark.skipif(not _populate_write_supported(), reason="madvise cannot populate pages on this system")
def test_scratch_comes_with_its_pages_in(lib):
    # a scratch buffer that grows (a larger call shape) has its new pages faulted in by one system
    # call: the kernel's first stores into it take no page fault per 4 KiB page (below, at and
    # above the size from which buffers take 2 MiB pages)
    for slot, sizes in ((0, (64 << 10, 900 << 10, 3 << 20)), (1, (5 << 20,))):
        for nbytes in sizes:
            address = lib.scratch(slot, nbytes)
            assert address % 64 == 0
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            ctypes.memset(address, 1, nbytes)
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
            assert faults <= nbytes // mmap.PAGESIZE // 16, f"{faults} page faults writing {nbytes} new bytes"
            assert ctypes.string_at(address + nbytes - 3, 3) == b"\x01" * 3
