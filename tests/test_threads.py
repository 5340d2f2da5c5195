"""Thread control: tcpy.set_num_threads, Options(num_threads=), OMP_NUM_THREADS and threadpoolctl
each decide how many threads a running kernel uses (seen as CPU time / wall time)."""
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

import tcpy
from tcpy import demo

N = 1024
pytestmark = pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs 2 CPUs to tell 1 thread from several")


def cpu_per_wall(kernel, *args) -> float:
    """CPU time / wall time of the fastest of a few calls (about the threads that ran)."""
    kernel(*args)  # compile, warm
    best_wall, ratio = float("inf"), 0.0
    for _ in range(3):
        wall, cpu = time.perf_counter(), time.process_time()
        kernel(*args)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        if wall < best_wall:
            best_wall, ratio = wall, cpu / wall
    return ratio


@pytest.fixture(scope="module")
def gemm_args():
    rng = np.random.default_rng(0)
    return rng.random((N, N), np.float32), rng.random((N, N), np.float32)


def test_threadpool_limits_reach_a_running_kernel(gemm_args):
    kernel = tcpy.define(demo.GEMM)
    with threadpool_limits(1):
        assert tcpy.get_num_threads() == 1
        assert cpu_per_wall(kernel, *gemm_args) <= 1.2


def test_set_num_threads_and_options_pinning(gemm_args):
    kernel = tcpy.define(demo.GEMM)
    pinned = tcpy.define(demo.GEMM, options=tcpy.Options(num_threads=1))
    tcpy.set_num_threads(1)
    try:
        assert tcpy.get_num_threads() == 1
        assert cpu_per_wall(kernel, *gemm_args) <= 1.2
    finally:
        tcpy.set_num_threads(None)
    assert cpu_per_wall(pinned, *gemm_args) <= 1.2  # options win over the default


def test_kernels_are_planned_for_the_threads_a_call_runs_with():
    """Without Options(num_threads=), the thread grid follows set_num_threads / threadpoolctl:
    one thread gets one cell (no work split for threads that will not run), and each count
    keeps its own specialisation."""
    A, B = np.ones((300, 200), np.float32), np.ones((200, 400), np.float32)
    kernel = tcpy.define(demo.GEMM)

    def grid():
        line = next(line for line in str(kernel.explain(A, B)).splitlines() if "thread grid batch" in line)
        return line[line.index("thread grid batch"):].split(";")[0]

    try:
        tcpy.set_num_threads(1)
        assert grid() == "thread grid batch 1 x M 1 x N 1 x K 1"
        one = kernel(A, B)
        tcpy.set_num_threads(2)
        assert grid() != "thread grid batch 1 x M 1 x N 1 x K 1"
        two = kernel(A, B)
    finally:
        tcpy.set_num_threads(None)
    with threadpool_limits(1):
        assert grid() == "thread grid batch 1 x M 1 x N 1 x K 1"
        np.testing.assert_array_equal(kernel(A, B), one)
    assert len(kernel.table) == 2  # the 1-thread entry served threadpoolctl's limit too
    np.testing.assert_allclose(two, A @ B, rtol=1e-6)
    np.testing.assert_array_equal(one, two)  # the grid splits M or N, never K, here


def test_set_num_threads_rejects_bad_counts():
    with pytest.raises(tcpy.TCArgumentError, match=r"expects a number of threads from 1 to 65536 \(or None\), got -2"):
        tcpy.set_num_threads(-2)
    with pytest.raises(tcpy.TCArgumentError, match="got 'four'"):
        tcpy.set_num_threads("four")


def test_omp_num_threads_is_honoured():
    script = f"""
import time, numpy as np, tcpy
from tcpy import demo
A = np.ones(({N}, {N}), np.float32)
k = tcpy.define(demo.GEMM); k(A, A)
wall, cpu = time.perf_counter(), time.process_time(); k(A, A); k(A, A)
print(tcpy.get_num_threads(), (time.process_time() - cpu) / (time.perf_counter() - wall))
"""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True).stdout
    threads, ratio = out.split()
    assert int(threads) == 1 and float(ratio) <= 1.2
