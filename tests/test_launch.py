"""The Cython launcher, driven with hand-written kernels that follow the kernel ABI."""
import threading
import time

import numpy as np
import pytest

import tcpy
from tcpy import TCArgumentError, TCRuntimeError
from tcpy.runtime import build
from tcpy.runtime.launch import LaunchEntry, Launcher, get_num_threads, set_num_threads
from tcpy.target import available_cpus

KERNELS = r"""
#include "tcpy_runtime.h"
#include <unistd.h>

/* C(3,4) = A(3,4) + B(3,4), float32 */
int add2d(void *const *buffers, int num_threads, int64_t *err, const volatile int *stop) {
    const float *A = buffers[0], *B = buffers[1];
    float *C = buffers[2];
    (void)num_threads; (void)err;
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++) C[i * 4 + j] = A[i * 4 + j] + B[i * 4 + j];
    return 0;
}

/* O(5) = A(5) * s, float64, s rank 0 */
int scale(void *const *buffers, int num_threads, int64_t *err, const volatile int *stop) {
    const double *A = buffers[0], *s = buffers[1];
    double *O = buffers[2];
    (void)num_threads; (void)err;
    for (int i = 0; i < 5; i++) O[i] = A[i] * s[0];
    return 0;
}

/* O(i) = A(i - 1) for i in 1:5: O(0) is never written */
int shifted(void *const *buffers, int num_threads, int64_t *err, const volatile int *stop) {
    const float *A = buffers[0];
    float *O = buffers[1];
    (void)num_threads; (void)err;
    for (int i = 1; i < 5; i++) O[i] = A[i - 1];
    return 0;
}

int noop(void *const *buffers, int num_threads, int64_t *err, const volatile int *stop) {
    (void)buffers; (void)num_threads; (void)err;
    return 0;
}

/* error 2 of the entry's table, with two details */
int fail(void *const *buffers, int num_threads, int64_t *err, const volatile int *stop) {
    (void)buffers; (void)num_threads;
    err[0] = 7;
    err[1] = 3;
    return 2;
}

/* T = 2 A (temporary); S = T + B, D = T - B; int32 of shape (4,) */
int two_outputs(void *const *buffers, int num_threads, int64_t *err, const volatile int *stop) {
    const int32_t *A = buffers[0], *B = buffers[1];
    int32_t *S = buffers[2], *D = buffers[3], *T = buffers[4];
    (void)num_threads; (void)err;
    for (int i = 0; i < 4; i++) T[i] = 2 * A[i];
    for (int i = 0; i < 4; i++) { S[i] = T[i] + B[i]; D[i] = T[i] - B[i]; }
    return 0;
}

/* sleeps 200 ms: shows whether the GIL is held */
int nap(void *const *buffers, int num_threads, int64_t *err, const volatile int *stop) {
    (void)buffers; (void)num_threads; (void)err;
    usleep(200000);
    return 0;
}

/* O() = num_threads */
int threads(void *const *buffers, int num_threads, int64_t *err, const volatile int *stop) {
    (void)err;
    *(int32_t *)buffers[0] = num_threads;
    return 0;
}

/* O() = sum of 40 rank-0 int64 inputs: more buffers than the launcher keeps on its stack */
int many(void *const *buffers, int num_threads, int64_t *err, const volatile int *stop) {
    (void)num_threads; (void)err;
    int64_t s = 0;
    for (int i = 0; i < 40; i++) s += *(const int64_t *)buffers[i];
    *(int64_t *)buffers[40] = s;
    return 0;
}
"""

F32, F64, I32, I64 = (np.dtype(t) for t in ("float32", "float64", "int32", "int64"))


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("TCPY_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    try:
        yield build.build_library(KERNELS)
    finally:
        mp.undo()


def launcher(library, symbol, **entry):
    """A Launcher whose miss handler returns a fixed entry and records its calls."""
    misses = []

    def miss(args):
        misses.append(args)
        return LaunchEntry(build.load_symbol(library, symbol), **entry)

    return Launcher(miss), misses


def add2d(library):
    return launcher(library, "add2d", n_inputs=2, output_specs=[((3, 4), F32)], input_dtypes=[F32, F32])


def test_call_returns_new_output_and_hits_the_table(library):
    run, misses = add2d(library)
    a = np.arange(12, dtype=F32).reshape(3, 4)
    b = np.full((3, 4), 0.5, F32)
    c = run(a, b)
    assert c.dtype == F32 and c.shape == (3, 4) and c.flags.c_contiguous
    np.testing.assert_array_equal(c, a + b)
    c2 = run(b, a)
    assert c2 is not c
    np.testing.assert_array_equal(c2, a + b)
    assert len(misses) == 1 and len(run.table) == 1
    run(np.zeros((3, 5), F32), np.zeros((3, 5), F32))  # a new signature asks again
    assert len(misses) == 2


def test_a_repeated_signature_reuses_its_entry_and_every_change_is_seen(library):
    """The last call's signature is compared in place (no key built or looked up): repeats hit
    it, and a change of shape, rank, dtype, argument kind or count is told apart as before; an
    equal dtype in another object takes the table's way to the same entry."""
    run, misses = add2d(library)
    a = np.arange(12, dtype=F32).reshape(3, 4)
    b = np.full((3, 4), 0.5, F32)
    for _ in range(3):
        np.testing.assert_array_equal(run(a, b), a + b)
    assert len(misses) == 1
    changed = [(np.zeros((3, 5), F32), b), (a.astype(F64), b), (a.reshape(12), b), (a, 1.0), (a.reshape(1, 3, 4), b),
               (a,), (a, b, b)]
    for args in changed:
        for _ in range(2):
            if len(args) == 2:
                run(*args)
            else:  # (this handler accepts any count; the entry does not)
                with pytest.raises(tcpy.TCArgumentError, match=f"expected 2 arguments, got {len(args)}"):
                    run(*args)
    assert len(misses) == 1 + len(changed)
    other = np.dtype("float32").newbyteorder("=")
    assert other is not F32 and other == F32
    np.testing.assert_array_equal(run(a.view(other), b), a + b)
    np.testing.assert_array_equal(run(a, b), a + b)
    assert len(misses) == 1 + len(changed)


def test_a_replaced_entry_serves_the_next_call(library):
    """Launcher.replace (a background specialisation taking over) is seen by the next call even
    when it repeats the last call's signature; a stale expected entry replaces nothing."""
    run, _ = add2d(library)
    a = np.arange(12, dtype=F32).reshape(3, 4)
    np.testing.assert_array_equal(run(a, a), 2 * a)
    (key, entry), = run.table.items()
    zeros = LaunchEntry(build.load_symbol(library, "noop"), 2, [((3, 4), F32)], input_dtypes=[F32, F32])
    assert not run.replace(key, zeros, entry)
    assert run.replace(key, entry, zeros)
    np.testing.assert_array_equal(run(a, a), np.zeros((3, 4), F32))  # noop: the zero-filled output


def test_signature_includes_dtype_shape_and_python_types(library):
    run, misses = launcher(library, "scale", n_inputs=2, output_specs=[((5,), F64)], input_dtypes=[F64, F64])
    a = np.arange(5, dtype=F64)
    np.testing.assert_array_equal(run(a, 2.5), a * 2.5)
    np.testing.assert_array_equal(run(a, np.array(3.0)), a * 3)  # a 0-d array is another signature
    np.testing.assert_array_equal(run(a, -1.0), -a)
    assert len(misses) == 2
    run(a.astype(np.float32), 1.0)  # the miss handler (here: no checks) is asked for new dtypes
    assert len(misses) == 3


def test_table_key_tells_apart_shapes_ranks_dtypes_and_number_types(library):
    misses = []
    address = build.load_symbol(library, "noop")

    def miss(args):
        misses.append(args)
        dtypes = [a.dtype if isinstance(a, np.ndarray) else np.dtype(type(a)) for a in args]
        return LaunchEntry(address, len(args), [((), F32)], input_dtypes=dtypes)

    run = Launcher(miss)
    calls = [(np.zeros((3, 4)),), (np.zeros((4, 3)),), (np.zeros(12),), (np.zeros((3, 4), F32),),
             (np.zeros((3, 4)), np.zeros(())), (np.zeros(()), np.zeros((3, 4))), (np.zeros((1, 3, 4)),),
             (1,), (1.0,), (True,), (np.zeros((3, 4)), 1)]
    for args in calls + calls:
        run(*args)
    assert len(misses) == len(run.table) == len(calls)


def test_number_that_does_not_fit_the_parameter_type(library):
    run_scale, _ = launcher(library, "scale", n_inputs=2, output_specs=[((5,), F64)],
                            input_dtypes=[F64, np.dtype("int8")])
    with pytest.raises(TCArgumentError, match=r"argument 1: 1000 does not fit the parameter's type int8"):
        run_scale(np.zeros(5), 1000)


@pytest.mark.parametrize("view", ["transposed", "strided", "reversed", "unaligned"])
def test_non_contiguous_inputs_give_correct_results(library, view):
    run, _ = add2d(library)
    base = np.arange(100, dtype=F32)
    if view == "transposed":
        a = base[:12].reshape(4, 3).T
    elif view == "strided":
        a = base.reshape(10, 10)[1:7:2, 2:10:2]
    elif view == "reversed":
        a = base[:12].reshape(3, 4)[::-1, ::-1]
    else:
        raw = np.zeros(12 * 4 + 1, np.uint8)[1:]
        a = raw.view(F32).reshape(3, 4)
        a[...] = base[:12].reshape(3, 4)
        assert not a.flags.aligned
    assert a.shape == (3, 4) and not (a.flags.c_contiguous and a.flags.aligned)
    b = np.ones((3, 4), F32)
    np.testing.assert_array_equal(run(a, b), a + b)


def test_out_is_written_zero_filled_and_returned(library):
    run, _ = launcher(library, "shifted", n_inputs=1, output_specs=[((5,), F32)], input_dtypes=[F32])
    a = np.arange(1, 6, dtype=F32)
    out = np.full(5, 99.0, F32)
    result = run(a, out=out)
    assert result is out
    np.testing.assert_array_equal(out, [0, 1, 2, 3, 4])  # O(0) is unwritten, so zero
    assert run(a, out=(out,)) is out


@pytest.mark.parametrize("bad,message", [
    (np.zeros((3, 5), F32), r"out: expected a C-contiguous writeable float32 array of shape \(3, 4\), "
                            r"got a float32 array of shape \(3, 5\)"),
    (np.zeros((3, 4), F64), r"got a float64 array of shape \(3, 4\)"),
    (np.zeros((4, 3), F32).T, r"got an array that is not C-contiguous"),
    ([[0.0] * 4] * 3, r"out= must be an array \(or a 1-tuple\), got 3 arrays"),
    ("C", r"out= must be an array \(or a 1-tuple\), got a str"),
    ((np.zeros((3, 4), F32), np.zeros((3, 4), F32)), r"got 2 arrays"),
])
def test_wrong_out_is_rejected_with_expected_and_got(library, bad, message):
    run, _ = add2d(library)
    with pytest.raises(TCArgumentError, match=message):
        run(np.zeros((3, 4), F32), np.zeros((3, 4), F32), out=bad)


def test_read_only_and_overlapping_out_are_rejected(library):
    run, _ = add2d(library)
    a, b = np.ones((3, 4), F32), np.ones((3, 4), F32)
    ro = np.zeros((3, 4), F32)
    ro.flags.writeable = False
    with pytest.raises(TCArgumentError, match="got an array that is read-only"):
        run(a, b, out=ro)
    with pytest.raises(TCArgumentError, match="out shares memory with input 1; kernels do not work in place"):
        run(a, b, out=b)
    np.testing.assert_array_equal(b, 1)  # untouched


def test_several_outputs_and_a_temporary(library):
    run, _ = launcher(library, "two_outputs", n_inputs=2, output_specs=[((4,), I32), ((4,), I32)],
                      temp_specs=[((4,), I32)], single_output=False, input_dtypes=[I32, I32])
    a, b = np.arange(4, dtype=I32), np.full(4, 10, I32)
    s, d = run(a, b)
    np.testing.assert_array_equal(s, 2 * a + b)
    np.testing.assert_array_equal(d, 2 * a - b)
    assert s.dtype == I32
    outs = (np.empty(4, I32), np.empty(4, I32))
    result = run(a, b, out=outs)
    assert result[0] is outs[0] and result[1] is outs[1]
    np.testing.assert_array_equal(outs[0], 2 * a + b)
    with pytest.raises(TCArgumentError, match=r"out\[1\] shares memory with out\[0\]"):
        run(a, b, out=(outs[0], outs[0]))
    with pytest.raises(TCArgumentError, match=r"out= must be a tuple of 2 arrays, got one array$"):
        run(a, b, out=np.empty(4, I32))
    with pytest.raises(TCArgumentError, match=r"out= must be a tuple of 2 arrays, got 1 array$"):
        run(a, b, out=[np.empty(4, I32)])
    with pytest.raises(TCArgumentError, match=r"out\[1\]: expected .* int32 array of shape \(4,\), got a int64"):
        run(a, b, out=(np.empty(4, I32), np.empty(4, I64)))


def test_error_code_maps_to_message_with_details(library):
    messages = ["first error {0}", "index {0} out of bounds for size {1} (also {2}, {3})"]
    run, _ = launcher(library, "fail", n_inputs=0, output_specs=[((), F32)], error_messages=messages)
    with pytest.raises(TCRuntimeError, match=r"^index 7 out of bounds for size 3 \(also 0, 0\)$"):
        run()
    run, _ = launcher(library, "fail", n_inputs=0, output_specs=[((), F32)], error_messages=["only one"])
    with pytest.raises(TCRuntimeError, match=r"unknown error code 2 \(details: \[7, 3, 0, 0\]\)"):
        run()


def test_miss_handler_errors_propagate_and_nothing_is_stored(library):
    def miss(args):
        raise TCArgumentError("expected 2 arguments, got 1")

    run = Launcher(miss)
    with pytest.raises(TCArgumentError, match="expected 2 arguments"):
        run(np.zeros(3))
    assert run.table == {}


def test_num_threads_reaches_the_kernel(library):
    """The kernel gets the count asked for, but never more than the CPUs the process can get."""
    cpus = available_cpus()
    run, _ = launcher(library, "threads", n_inputs=0, output_specs=[((), I32)], num_threads=3)
    assert int(run()) == min(3, cpus)
    run, _ = launcher(library, "threads", n_inputs=0, output_specs=[((), I32)])
    assert int(run()) == min(get_num_threads(), cpus)  # OpenMP's count
    set_num_threads(5)
    try:
        assert int(run()) == min(5, cpus) and get_num_threads() == 5
    finally:
        set_num_threads(None)
    assert get_num_threads() >= 1


def test_more_buffers_than_the_stack_array(library):
    run, _ = launcher(library, "many", n_inputs=40, output_specs=[((), I64)], input_dtypes=[I64] * 40)
    result = run(*range(40))
    assert result.shape == () and result.dtype == I64 and int(result) == sum(range(40))


def test_kernel_runs_without_the_gil(library):
    run, _ = launcher(library, "nap", n_inputs=0, output_specs=[((), F32)], num_threads=1)
    run()  # warm: load the library
    worker = threading.Thread(target=run)
    worker.start()
    spins = 0
    while worker.is_alive():  # Python runs here while the kernel sleeps 200 ms
        spins += 1
    assert spins > 10000, f"the main thread ran {spins} loop iterations during the kernel: the GIL was held"


def test_a_quick_entry_keeps_the_gil(library):
    # quick kernels skip the GIL release (and the SIGINT handler's system calls): the naps queue
    run, _ = launcher(library, "nap", n_inputs=0, output_specs=[((), F32)], quick=True)
    run()
    assert _in_threads(run, 3) >= 0.55


def _in_threads(run, n: int) -> float:
    """Seconds for n Python threads each calling ``run`` once, all started together."""
    start = time.perf_counter()
    workers = [threading.Thread(target=run) for _ in range(n)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return time.perf_counter() - start


def test_only_kernels_with_little_work_are_quick():
    add = tcpy.define("def add(float(N) A, float(N) B) -> (C) { C(i) = A(i) + B(i) }")
    for n in (4, 1 << 16):
        a = np.ones(n, np.float32)
        np.testing.assert_array_equal(add(a, a), a + a)
    assert sorted(entry.quick for entry in add.table.values()) == [False, True]


def test_entry_validates_its_description(library):
    address = build.load_symbol(library, "add2d")
    with pytest.raises(ValueError, match="2 input dtypes for 3 inputs"):
        LaunchEntry(address, 3, [((3,), F32)], input_dtypes=[F32, F32])
    with pytest.raises(ValueError, match="native numeric dtype"):
        LaunchEntry(address, 0, [((3,), np.dtype(object))])
    for dtype in ("float16", "bool", "uint64", "int8"):  # every TC scalar type is allowed
        assert LaunchEntry(address, 0, [((2,), dtype)]).output_specs == (((2,), np.dtype(dtype)),)
    with pytest.raises(ValueError, match="native numeric dtype"):
        LaunchEntry(address, 0, [((3,), np.dtype(">f4"))])
    entry = LaunchEntry(address, 2, [((3, 4), "float32")], num_threads=2)
    assert entry.output_specs == (((3, 4), F32),) and entry.num_threads == 2
    assert repr(entry).endswith("inputs=2, outputs=[float32[3, 4]], temps=0, threads=2)")


def test_large_outputs_kept_or_dropped_keep_their_values():
    """Outputs above 32 MiB come from blocks reused once their arrays die: an output kept
    (or a view of it) keeps its values through later calls, a dropped one is no loss."""
    scale = tcpy.define("def scale(float(N) A, float k) -> (O) { O(i) = A(i) * k }")
    A = np.arange(9 << 20, dtype=np.float32)  # 36 MiB
    kept = [scale(A, 1.0), scale(A, 2.0)]
    view = scale(A, 3.0)[::-1]
    for k in (4.0, 5.0, 6.0):
        dropped = scale(A, k)
        np.testing.assert_array_equal(dropped, A * k)
        del dropped
    for k, out in zip((1.0, 2.0), kept):
        assert out.flags.c_contiguous and out.ctypes.data % 64 == 0
        np.testing.assert_array_equal(out, A * k)
    np.testing.assert_array_equal(view, (A * 3.0)[::-1])
    assert len({out.ctypes.data for out in kept}) == 2 and not np.shares_memory(view, kept[0])
