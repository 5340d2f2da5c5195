"""tcpy.dask on a two-worker LocalCluster against the same kernel in one process on the same cores.

Run it as::

    python benchmarks/dask_scale.py [--scale S] [--repeat R] [--only conv|gemm]

Cases (``--scale S`` divides H and W of the convolution and M and K of the GEMM by S):

* a 3x3 convolution, 64 -> 64 channels, over an (8, 64, 512, 512) float32 stack in 16 chunks
  (8 images x 2 row blocks: batches blockwise, rows with a halo of 2);
* (4096 x 65536) @ (65536 x 512) float32 chunked along K in 8 chunks (partials summed by Dask).

The single process runs the kernel on the whole arrays with 2 threads; the cluster has 2
worker processes of 1 thread (each kernel runs on 1 thread), inputs generated and kept on the
workers, outputs kept there (``persist``). Runs alternate; the median of ``--repeat`` is shown,
after a first untimed run of each (compilation). Results are checked against each other.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

import dask.array as da  # noqa: E402
from dask.core import flatten  # noqa: E402
from distributed import Client, LocalCluster, wait  # noqa: E402

import tcpy  # noqa: E402
import tcpy.dask  # noqa: E402

CONV = """
def conv(float(N, C, H, W) I, float(F, C, KH, KW) Wt) -> (O) {
    O(n, f, h, w) +=! I(n, c, h + kh, w + kw) * Wt(f, c, kh, kw)
}
"""
GEMM = "def gemm(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }"


def cases(scale: int):
    """(name, source, [(shape, chunks)] of the chunked inputs, the rest as NumPy arrays, flops)."""
    rng = np.random.default_rng(1)
    n, c, h, w, f = 8, 64, 512 // scale, 512 // scale, 64
    wt = (rng.random((f, c, 3, 3), dtype=np.float32) - 0.5) / 24
    yield ("conv", CONV, [((n, c, h, w), (1, c, h // 2, w))], [wt], 2 * n * f * (h - 2) * (w - 2) * c * 9)
    m, k, nn = 4096 // scale, 65536 // scale, 512
    yield ("gemm", GEMM, [((m, k), (m, k // 8)), ((k, nn), (k // 8, nn))], [], 2 * m * k * nn)


def release(client, collection):
    """Forget a persisted result on the cluster and wait until no worker holds it."""
    if collection is None:
        return
    keys = set(flatten(collection.__dask_keys__()))
    client.cancel(collection)
    while keys & set(client.who_has()):  # every key in the workers' memory
        time.sleep(0.05)


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", choices=("conv", "gemm"))
    args = parser.parse_args()
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                      silence_logs=40) as cluster, Client(cluster) as client:
        for name, source, chunked, rest, flops in cases(args.scale):
            if args.only and name != args.only:
                continue
            kernel = tcpy.define(source)
            single_kernel = kernel.with_options(tcpy.Options(num_threads=2))
            rng = da.random.default_rng(2)
            inputs = [rng.random(shape, dtype=np.float32, chunks=chunks) - 0.5 for shape, chunks in chunked]
            inputs = client.persist(inputs)
            wait(inputs)
            local = [np.asarray(x) for x in client.compute(inputs, sync=True)]
            print(f"{name}: inputs {[x.shape for x in local]}, chunks {[x.npartitions for x in inputs]}")
            print(tcpy.dask.explain(kernel, *inputs, *rest), end="")
            result = {}

            def on_cluster():
                out = tcpy.dask.apply(kernel, *inputs, *rest).persist()
                wait(out)
                result["cluster"] = out

            def in_process():
                result["single"] = single_kernel(*local, *rest)

            on_cluster(), in_process()  # compile everywhere
            times = {"cluster": [], "single": []}
            for _ in range(args.repeat):
                times["single"].append(timed(in_process))
                release(client, result.pop("cluster"))  # else Dask reuses the result it holds
                times["cluster"].append(timed(on_cluster))
            got = result["cluster"].compute()
            error = np.max(np.abs(got - result["single"])) / np.max(np.abs(result["single"]))
            np.testing.assert_allclose(got, result["single"], rtol=1e-5, atol=1e-5 * np.abs(result["single"]).max())
            single, cluster = statistics.median(times["single"]), statistics.median(times["cluster"])
            print(f"  single process (2 threads) {single:8.3f} s {flops / single / 1e9:6.1f} GFLOP/s | "
                  f"LocalCluster 2x1 {cluster:8.3f} s {flops / cluster / 1e9:6.1f} GFLOP/s | "
                  f"cluster/single {cluster / single:.2f}x | max error / max |result| {error:.1e}")
            print(f"  all times: single {[round(t, 3) for t in times['single']]}, "
                  f"cluster {[round(t, 3) for t in times['cluster']]}")
            del result, local, inputs


if __name__ == "__main__":
    main()
