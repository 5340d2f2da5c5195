"""Many shapes, one def: compiles and time when a def meets shapes it has not seen.

Two measurements, each in a fresh kernel cache (a temporary ``TCPY_CACHE_DIR``):

``sweep``: for GEMM, a convolution, attention and softmax, one kernel is called with ``--count``
random shapes. Per def: the libraries compiled (size-generic and specialised), the first call
(which compiles), and for every later new shape its first call minus the kernel's own time
(the best of three repeat calls): what a new shape costs beyond the kernel. NumPy's code for the
same def is timed the same way on the same shapes: its figures are what a first call at a new
shape costs with no planning at all (fresh output memory faulted in, caches and allocators).
A second kernel of the def, in a fresh cache too (its first call compiles), then meets the same
shapes with ``out=`` arrays made and written beforehand: its new-shape cost leaves out the first
touch of fresh output memory, which the kernel's stores pay on a first call at any size, as
NumPy's do (what is left: the planning, the first run of the kernel at the shape, its temporaries).
With ``--repeat R`` the sweep runs R times (each in fresh caches, the same shapes and arguments)
and a shape's cost is the least of its R: a virtual machine's host takes its CPU away now and
then (for more than a millisecond about once a second on a shared cloud host), which is no cost
of the shape; what a shape costs every time stays. The largest single figure is reported too.

``varlen``: attention over ``--batches`` batches whose sequence length is drawn from 64 to 2048
(one head size), the total wall time of the loop, compiles included, for tcpy under
``specialize="never"``, ``"auto"`` and ``"always"``, and for NumPy.

    python benchmarks/shapes.py --threads 1
    python benchmarks/shapes.py --only varlen --threads 2 --json varlen.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

import tcpy
from tcpy import demo
from tcpy.runtime.build import cache_info

SWEEP_CASES = ("gemm", "conv", "attention", "softmax")
VARLEN_MODES = ("never", "auto", "always", "numpy")


@contextmanager
def fresh_cache():
    """A new, empty kernel cache for the duration (compiles are counted from it)."""
    before = os.environ.get("TCPY_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="tcpy-shapes-") as directory:
        os.environ["TCPY_CACHE_DIR"] = directory
        try:
            yield
        finally:
            if before is None:
                del os.environ["TCPY_CACHE_DIR"]
            else:
                os.environ["TCPY_CACHE_DIR"] = before


def random_shapes(case: str, count: int, rng: np.random.Generator) -> list[tuple]:
    """``count`` distinct argument shapes for ``case`` (sizes drawn log-uniformly)."""
    def size(lo: int, hi: int) -> int:
        return int(round(np.exp(rng.uniform(np.log(lo), np.log(hi)))))

    shapes: list[tuple] = []
    while len(shapes) < count:
        if case == "gemm":
            m, n, k = size(8, 768), size(8, 768), size(8, 768)
            shape = ((m, k), (k, n))
        elif case == "conv":  # 3x3 over a pre-padded NCHW image
            n, c, f, hw = size(1, 4), size(3, 96), size(8, 96), size(6, 48)
            shape = ((n, c, hw + 2, hw + 2), (f, c, 3, 3))
        elif case == "attention":
            h, length, d = size(1, 8), size(16, 768), int(rng.choice((32, 64)))
            shape = ((1, h, length, d),) * 3
        else:
            shape = ((size(1, 2048), size(8, 4096)),)
        if shape not in shapes:
            shapes.append(shape)
    return shapes


def make_args(case: str, shape: tuple, rng: np.random.Generator) -> tuple:
    arrays = tuple(rng.standard_normal(s, dtype=np.float32) for s in shape)
    return arrays + ((float(1.0 / np.sqrt(shape[0][-1])),) if case == "attention" else ())


SOURCES = {"gemm": demo.GEMM, "conv": demo.CONV2D, "attention": demo.ATTENTION, "softmax": demo.SOFTMAX}
NUMPY = {"gemm": demo.numpy_gemm, "conv": demo.im2col_conv2d, "attention": demo.numpy_attention,
         "softmax": demo.numpy_softmax}


def sweep(case: str, count: int, threads: int, seed: int, repeat: int = 1) -> dict:
    """One kernel (``specialize="auto"``) called with ``count`` new shapes of ``case``; then
    NumPy's code for the def on the same shapes and arguments; ``repeat`` times, each shape's
    costs the least of its runs'."""
    shapes = random_shapes(case, count, np.random.default_rng(seed))
    runs = []  # per run: the new-shape costs plain, with out= and NumPy's
    for _ in range(repeat):
        with fresh_cache():
            kernel = tcpy.define(SOURCES[case], options=tcpy.Options(num_threads=threads))
            start = time.perf_counter()
            first, beyond = _new_shape_costs(kernel, case, shapes, seed)
            wall = time.perf_counter() - start
            kernel.finish_specializations()
            info = cache_info()
        with fresh_cache():  # (its first call compiles too: the shapes after it meet the same caches)
            again = tcpy.define(SOURCES[case], options=tcpy.Options(num_threads=threads))
            _, out_beyond = _new_shape_costs(again, case, shapes, seed, out=True)
            again.finish_specializations()
        _, numpy_beyond = _new_shape_costs(NUMPY[case], case, shapes, seed)
        runs.append((beyond, out_beyond, numpy_beyond))
        if len(runs) == 1:  # (the first run's compiles, first call and wall time)
            row = {"case": case, "shapes": len(shapes), "compiles_generic": info["generic"],
                   "compiles_specialised": info["entries"] - info["generic"], "first_call_s": first, "wall_s": wall}
    row["repeat"] = repeat
    for which, prefix in enumerate(("", "out_", "numpy_")):
        costs = [min(run[which][i] for run in runs) for i in range(len(shapes) - 1)]
        row.update({f"{prefix}new_shape_ms_median": 1e3 * statistics.median(costs),
                    f"{prefix}new_shape_ms_p90": 1e3 * _p90(costs), f"{prefix}new_shape_ms_max": 1e3 * max(costs),
                    f"{prefix}new_shape_ms_max_single": 1e3 * max(max(run[which]) for run in runs),
                    f"{prefix}new_shape_ms": [round(1e3 * c, 4) for c in costs]})  # (per shape, for a look at the largest)
    row["shape_list"] = [list(map(list, shape)) for shape in shapes[1:]]
    return row


def _p90(values: list[float]) -> float:
    # (inclusive: between the two values around it, never beyond the largest, as the exclusive
    # method extrapolates for a few values)
    return statistics.quantiles(values, n=10, method="inclusive")[-1] if len(values) > 1 else values[0]


def output_shape(case: str, shape: tuple) -> tuple:
    """The shape of ``case``'s output for arguments of ``shape``."""
    if case == "gemm":
        (m, _), (_, n) = shape
        return (m, n)
    if case == "conv":
        (n, _, h, w), (f, _, kh, kw) = shape
        return (n, f, h - kh + 1, w - kw + 1)
    return shape[0]


def _new_shape_costs(fn, case: str, shapes: list[tuple], seed: int, out: bool = False
                     ) -> tuple[float, list[float]]:
    """``fn``'s first call (s) on the first of ``shapes``, and for each later one its first call
    minus the best of three repeats (s); the arguments drawn from ``seed`` (the same for every fn);
    ``out``: the calls write into an ``out=`` array made (and its memory touched) beforehand."""
    rng = np.random.default_rng(seed + 1)
    first, beyond = None, []
    for shape in shapes:
        args = make_args(case, shape, rng)
        if out:
            target = np.full(output_shape(case, shape), 0.0, np.float32)
            call = _timed(fn, args, out=target)
            own = min(_timed(fn, args, out=target) for _ in range(3))
        else:
            call = _timed(fn, args)
            own = min(_timed(fn, args) for _ in range(3))
        if first is None:
            first = call
        else:
            beyond.append(call - own)
    return first, beyond


def _timed(fn, args, **kwargs) -> float:
    t0 = time.perf_counter()
    fn(*args, **kwargs)
    return time.perf_counter() - t0


def varlen(batches: int, threads: int, seed: int, modes=VARLEN_MODES, heads: int = 8, head_size: int = 64) -> dict:
    """Attention over ``batches`` batches of sequence lengths drawn from 64 to 2048: the total
    wall time of the loop, compiles included, per mode (and NumPy's)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(64, 2049, size=batches)
    data = [make_args("attention", ((1, heads, int(t), head_size),) * 3, rng) for t in lengths]
    result = {"batches": batches, "distinct_lengths": len(set(lengths.tolist())), "heads": heads,
              "head_size": head_size, "modes": {}}
    for mode in modes:
        with fresh_cache():
            if mode == "numpy":
                run = demo.numpy_attention
            else:
                run = tcpy.define(demo.ATTENTION, options=tcpy.Options(num_threads=threads, specialize=mode))
            t0 = time.perf_counter()
            for args in data:
                run(*args)
            wall = time.perf_counter() - t0
            if mode != "numpy":  # (background specialisations still compiling write to the cache)
                run.finish_specializations()
            compiles = cache_info()["entries"] if mode != "numpy" else 0
        result["modes"][mode] = {"wall_s": wall, "compiles": compiles}
        print(f"  varlen {mode:>7}: {wall:8.2f} s, {compiles} compiles", file=sys.stderr)
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--count", type=int, default=50, help="shapes per def in the sweep")
    parser.add_argument("--batches", type=int, default=100, help="batches of the variable-length attention loop")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=1,
                        help="sweeps per def (fresh caches, the same shapes): a shape's cost is the least of them")
    parser.add_argument("--only", choices=("sweep", "varlen"), default=None)
    parser.add_argument("--modes", default=",".join(VARLEN_MODES),
                        help="the varlen contenders, comma-separated (never, auto, always, numpy)")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH")
    args = parser.parse_args(argv)
    from threadpoolctl import threadpool_limits
    threadpool_limits(args.threads)
    if args.repeat < 1:
        parser.error(f"--repeat takes a count of 1 or more, got {args.repeat}")
    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    unknown = [m for m in modes if m not in VARLEN_MODES]
    if unknown:
        parser.error(f"--modes takes {', '.join(VARLEN_MODES)}, got {', '.join(unknown)}")
    load = os.getloadavg()[0]
    print(f"# tcpy {tcpy.__version__} shape sweeps, {platform.processor() or platform.machine()}, "
          f"target {tcpy.Options().target.describe()}, threads {args.threads}, load {load:.2f}"
          + (f", {args.repeat} sweeps per def (a shape's cost: the least of its {args.repeat})" if args.repeat > 1 else ""))
    report: dict = {"threads": args.threads, "load": load, "target": tcpy.Options().target.describe()}
    if args.only in (None, "sweep"):
        print(f"{'def':<10} {'shapes':>6} {'generic':>8} {'special.':>8} {'1st call s':>10} "
              f"{'new shape ms (median / max)':>28} {'wall s':>8} {'numpy new shape ms':>19} "
              f"{'with out= ms':>15}")
        report["sweep"] = []
        for case in SWEEP_CASES:
            row = sweep(case, args.count, args.threads, args.seed, args.repeat)
            report["sweep"].append(row)
            print(f"{case:<10} {row['shapes']:>6} {row['compiles_generic']:>8} {row['compiles_specialised']:>8} "
                  f"{row['first_call_s']:>10.2f} {row['new_shape_ms_median']:>16.2f} / {row['new_shape_ms_max']:<9.2f}"
                  f"{row['wall_s']:>8.2f} {row['numpy_new_shape_ms_median']:>8.2f} / {row['numpy_new_shape_ms_max']:<8.2f}"
                  f"{row['out_new_shape_ms_median']:>7.2f} / {row['out_new_shape_ms_max']:<7.2f}")
    if args.only in (None, "varlen"):
        row = varlen(args.batches, args.threads, args.seed, modes)
        report["varlen"] = row
        print(f"varlen attention: {row['batches']} batches, {row['distinct_lengths']} lengths from 64 to 2048, "
              f"H={row['heads']} D={row['head_size']}")
        for mode, figures in row["modes"].items():
            print(f"  {mode:>7}: {figures['wall_s']:8.2f} s  {figures['compiles']:>4} compiles")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
