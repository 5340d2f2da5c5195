"""Autotuning picks among schedules, and later kernels of the same def and sizes use the winner."""
import time

import numpy as np

import tcpy
from tcpy import tuning

MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }"


def test_autotune_records_the_winner_for_later_kernels(tmp_path, monkeypatch):
    monkeypatch.setenv("TCPY_CACHE_DIR", str(tmp_path))
    rng = np.random.default_rng(1)
    A, B = rng.random((40, 30), np.float32), rng.random((30, 50), np.float32)
    kernel = tcpy.define(MATMUL)
    only = tcpy.Options(loop_order=("n", "m", "k"), register_tile=False)
    best = tcpy.autotune(kernel, A, B, options=[only], repeat=1, progress=False)
    assert best == only
    assert "order n, m, k" in kernel.explain(A, B)
    np.testing.assert_allclose(kernel(A, B), A @ B, rtol=1e-5)
    tuning._memory.clear()  # a new process: the winner comes from tuned.json
    assert (tmp_path / "tuned.json").is_file()
    fresh = tcpy.define(MATMUL)
    assert "order n, m, k" in fresh.explain(A, B)
    assert "order n, m, k" not in fresh.explain((41, 30), (30, 50))  # other sizes: default


def test_a_record_another_process_writes_is_used_once_the_store_is_looked_at_again(tmp_path, monkeypatch):
    monkeypatch.setattr(tuning, "STORE_RECHECK_S", 0.05)
    rng = np.random.default_rng(4)
    A, B = rng.random((24, 16), np.float32), rng.random((16, 40), np.float32)
    tuned, other = tmp_path / "tuned", tmp_path / "other"
    monkeypatch.setenv("TCPY_CACHE_DIR", str(tuned))
    tcpy.autotune(tcpy.define(MATMUL), A, B, options=[tcpy.Options(loop_order=("n", "m", "k"))], repeat=1,
                  progress=False)
    tuning._memory.clear()
    monkeypatch.setenv("TCPY_CACHE_DIR", str(other))  # this process's store: nothing tuned in it
    assert "order n, m, k" not in tcpy.define(MATMUL).explain(A, B)
    other.mkdir(exist_ok=True)
    (other / "tuned.json").write_bytes((tuned / "tuned.json").read_bytes())  # another process's record
    time.sleep(0.06)
    assert "order n, m, k" in tcpy.define(MATMUL).explain(A, B)


def test_default_candidates_time_and_keep_one(tmp_path, monkeypatch):
    monkeypatch.setenv("TCPY_CACHE_DIR", str(tmp_path))
    rng = np.random.default_rng(2)
    A, B = rng.random((300, 64), np.float32), rng.random((64, 300), np.float32)
    kernel = tcpy.define(MATMUL)
    sizes = {"M": 300, "K": 64, "N": 300}
    options = tuning.candidates(kernel, sizes)
    assert len(options) >= 3 and options[0] == kernel.options
    best = tcpy.autotune(kernel, A, B, repeat=1, progress=False)
    assert best in options
    np.testing.assert_allclose(kernel(A, B), A @ B, rtol=1e-4)


def test_clear_tuned_forgets_the_winner(tmp_path, monkeypatch):
    monkeypatch.setenv("TCPY_CACHE_DIR", str(tmp_path))
    rng = np.random.default_rng(3)
    A, B = rng.random((20, 10), np.float32), rng.random((10, 30), np.float32)
    kernel = tcpy.define(MATMUL)
    tcpy.autotune(kernel, A, B, options=[tcpy.Options(loop_order=("n", "m", "k"))], repeat=1, progress=False)
    assert tuning.clear_tuned() is True
    assert not (tmp_path / "tuned.json").exists()
    assert "order n, m, k" not in tcpy.define(MATMUL).explain(A, B)
    assert tuning.clear_tuned() is False


def test_omp_num_threads_is_the_default_thread_count(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert tcpy.Options().threads == 1
    assert tcpy.Options(num_threads=3).threads == 3


def test_autotune_on_a_contraction_searches_engine_plans(tmp_path, monkeypatch):
    monkeypatch.setenv("TCPY_CACHE_DIR", str(tmp_path))
    kernel = tcpy.define(MATMUL, options=tcpy.Options(target="x86-64-v3", num_threads=2))
    options = tuning.candidates(kernel, {"M": 96, "K": 200, "N": 400})
    assert options[0] == kernel.options
    tried = {name for o in options[1:] for name in o.plan}
    assert {"mr", "nr", "kc", "mc", "nc", "path", "grid"} <= tried  # plans, not loop tiles
    assert not any(o.tile_sizes or o.loop_order for o in options)


def test_autotune_keeps_the_default_unless_another_is_clearly_faster(tmp_path, monkeypatch):
    monkeypatch.setenv("TCPY_CACHE_DIR", str(tmp_path))
    A, B = np.ones((20, 10), np.float32), np.ones((10, 30), np.float32)
    trials = [tcpy.Options(), tcpy.Options(plan={"kc": 8}), tcpy.Options(plan={"kc": 4})]
    for timings, winner in (([1.0, 0.99, 1.2], 0), ([1.0, 0.9, 0.95], 1)):
        monkeypatch.setattr(tuning, "_time", lambda kernel, arrays, repeat, t=iter(timings): next(t))
        tuning._memory.clear()
        assert tcpy.autotune(tcpy.define(MATMUL), A, B, options=trials, progress=False) == trials[winner]
