"""tcpy vs NumPy (and PyTorch, if installed): GEMM, convolutions, attention, call overhead.

Run it as (see BENCHMARKS.md for why the environment variables go)::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench.py [--threads N] [--target NAME]
        [--suite resnet|long] [--only TEXT] [--json PATH] [--specialize never|auto | --generic]

Prints the machine, NumPy's BLAS and threads, then one line per case::

    gemm       M=N=K=512                  tcpy    12.345 ms   21.7 GFLOP/s | numpy ... | numpy/tcpy 0.31x | ...

``numpy/tcpy`` is NumPy's time divided by tcpy's (above 1x: tcpy is faster). Times are the
best of repeated calls after a first call that compiles (its time is shown as ``compile``).
``--generic`` adds tcpy's size-generic kernel to each case's rounds (``specialised/generic``: the
specialised kernel's time over the generic one's, 1 when they are as fast).
``--json PATH`` also writes the header, every case's times and the other lines to PATH;
``benchmarks/compare.py A.json B.json`` prints the ratios between two such runs.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import subprocess
import sys
import time
import timeit
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

import tcpy  # noqa: E402
from tcpy import demo  # noqa: E402
from tcpy.api import SPECIALIZE_AFTER_CALLS  # noqa: E402
from tcpy.target import PRESETS  # noqa: E402

from peak import fma_peak  # noqa: E402

try:
    import torch
except ImportError:
    torch = None

ROUNDS = 3  # measurement rounds per case, contenders in turn

TINY_ADD = """
def add(float(N) A, float(N) B) -> (C) {
    C(i) = A(i) + B(i)
}
"""


def machine() -> str:
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        model = next(line.split(":", 1)[1].strip() for line in lscpu.splitlines()
                     if line.startswith("Model name"))
    except (OSError, StopIteration):
        model = platform.processor() or "unknown CPU"
    return f"{model}; {os.cpu_count()} CPUs; {platform.system()} {platform.release()}"


def blas_info() -> list[str]:
    from threadpoolctl import threadpool_info

    return [f"{p.get('internal_api')} {p.get('version')} ({p.get('user_api')}, "
            f"kernel {p.get('architecture')}, {p.get('num_threads')} threads) {p.get('filepath')}"
            for p in threadpool_info()]


def torch_fn(name: str):
    """The same computation in PyTorch on the CPU (inputs converted outside the timed call)."""
    if torch is None:
        return None
    fns = {"gemm": torch.matmul, "dgemm": torch.matmul, "bmm": torch.matmul, "gemm_nt": lambda a, b: a @ b.t(),
           "conv2d": torch.nn.functional.conv2d,
           "attention": lambda q, k, v, s: torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=s),
           "linear": lambda a, b, bias: torch.relu(torch.addmm(bias, a, b)),
           "softmax": lambda x: torch.softmax(x, -1),
           "layernorm": lambda x, g, b: torch.nn.functional.layer_norm(x, (x.shape[-1],), g, b, 1e-5)}
    return fns[name]


DGEMM = demo.GEMM.replace("float", "double")

BMM = """
def bmm(float(B,M,K) A, float(B,K,N) Bt) -> (C) {
    C(b, m, n) +=! A(b, m, k) * Bt(b, k, n)
}
"""


def dgemm_case(m: int, n: int, k: int) -> demo.Case:
    """(m x k) @ (k x n) in float64."""
    return demo.Case("dgemm", DGEMM, f"{m}x{k} @ {k}x{n}",
                     lambda rng: (rng.standard_normal((m, k)), rng.standard_normal((k, n))),
                     demo.numpy_gemm, 2.0 * m * n * k)


GEMM_NT = """
def gemm_nt(float(M,K) A, float(N,K) B) -> (C) {
    C(m, n) +=! A(m, k) * B(n, k)
}
"""


def gemm_nt_case(m: int, n: int, k: int) -> demo.Case:
    """(m x k) @ (n x k)^T in float32: B read transposed (a linear layer's weights, Q.K^T)."""
    return demo.Case("gemm_nt", GEMM_NT, f"{m}x{k} @ ({n}x{k})^T",
                     lambda rng: (demo._f32(rng, m, k), demo._f32(rng, n, k)), lambda a, b: a @ b.T,
                     2.0 * m * n * k)


def bmm_case(b: int, m: int, n: int, k: int) -> demo.Case:
    """b independent (m x k) @ (k x n) in float32."""
    return demo.Case("bmm", BMM, f"{b} x {m}x{k} @ {k}x{n}",
                     lambda rng: (rng.standard_normal((b, m, k), dtype=np.float32),
                                  rng.standard_normal((b, k, n), dtype=np.float32)),
                     np.matmul, 2.0 * b * m * n * k)


LINEAR = """
def linear(float(M,K) A, float(K,N) B, float(N) bias) -> (Y) {
    C(m, n) +=! A(m, k) * B(k, n)
    Y(m, n) = fmax(C(m, n) + bias(n), 0.0)
}
"""


def linear_case(m: int, n: int, k: int) -> demo.Case:
    """A fully connected layer: relu(A @ B + bias) in float32 (the contraction and its epilogue)."""
    return demo.Case("linear", LINEAR, f"relu({m}x{k} @ {k}x{n} + b)",
                     lambda rng: (demo._f32(rng, m, k), demo._f32(rng, k, n), demo._f32(rng, n)),
                     lambda a, b, bias: np.maximum(a @ b + bias, 0), 2.0 * m * n * k)


def numpy_layernorm(x, g, b):
    mean = x.mean(axis=1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-5) * g + b


def softmax_case(n: int, d: int) -> demo.Case:
    """Softmax over the rows of an n x d matrix (4 statements: max, exp, sum, divide)."""
    return demo.Case("softmax", demo.SOFTMAX, f"{n}x{d} rows", lambda rng: (demo._f32(rng, n, d),),
                     demo.numpy_softmax, 4.0 * n * d)


def layernorm_case(n: int, d: int) -> demo.Case:
    """Layer norm over the rows of an n x d matrix, with gain and bias."""
    return demo.Case("layernorm", demo.LAYERNORM, f"{n}x{d} rows",
                     lambda rng: (demo._f32(rng, n, d), demo._f32(rng, d), demo._f32(rng, d)),
                     numpy_layernorm, 8.0 * n * d)


def cases(quick: bool):
    gemm = [256, 512] if quick else [256, 512, 1024, 2048]
    yield from (demo.gemm_case(n, n, n) for n in gemm)
    yield from (dgemm_case(n, n, n) for n in gemm)
    yield from (demo.gemm_case(n, n, n) for n in (64, 128))
    if not quick:  # tall-skinny M x N x K, and batched
        yield from (demo.gemm_case(m, n, k) for m, n, k in ((1024, 1024, 64), (128, 128, 4096), (4096, 64, 512)))
        yield gemm_nt_case(1024, 1024, 1024)
        yield gemm_nt_case(64, 2048, 2048)  # a linear layer on 64 tokens: packing B is most of the work
        yield bmm_case(32, 128, 128, 64)
        yield from (linear_case(n, n, n) for n in (256, 1024))
    yield from (demo.conv2d_case(n, 64, 64, 56) for n in ([1] if quick else [1, 8]))
    if not quick:
        yield demo.conv2d_case(8, 128, 128, 28)
    yield demo.attention_case(1, 8, 512 if not quick else 128, 64)
    if not quick:
        yield from (demo.attention_case(b, h, s, d) for b, h, s, d in ((1, 8, 2048, 64), (4, 12, 256, 64),
                                                                          (1, 1, 4096, 128)))
        yield softmax_case(4096, 4096)
        yield layernorm_case(4096, 4096)


# The ResNet-50 convolution layers (batch, c, f, input hw, kernel, stride) and a depthwise 3x3.
RESNET = ((64, 64, 56, 3, 1), (128, 128, 28, 3, 1), (256, 256, 14, 3, 1), (512, 512, 7, 3, 1),
          (64, 256, 56, 1, 1), (256, 64, 56, 1, 1), (128, 128, 56, 3, 2), (256, 512, 56, 1, 2), (3, 64, 224, 7, 2))


def resnet_cases():
    for n in (1, 8):
        yield from (demo.resnet_conv_case(n, c, f, hw, k, s) for c, f, hw, k, s in RESNET)
    yield from (demo.resnet_conv_case(n, 256, 256, 56, 3, 1, depthwise=True) for n in (1, 8))
    for n in (1, 8):  # the 3x3 layers without padding (the image read whole, no guard)
        yield from (demo.resnet_conv_case(n, c, f, hw, k, s, padded=False) for c, f, hw, k, s in RESNET if k == 3)


def torch_conv(case):
    """PyTorch's convolution of a resnet case, NCHW and channels_last (the faster one counts)."""
    stride = int(case.shapes.rsplit("s", 1)[1])
    depthwise = case.shapes.startswith("depthwise")
    padded = "unpadded" not in case.shapes

    def conv(memory_format):
        def fn(I, Wt):
            weight = Wt[:, None] if depthwise else Wt
            return torch.nn.functional.conv2d(I.contiguous(memory_format=memory_format),
                                              weight.contiguous(memory_format=memory_format), stride=stride,
                                              padding=Wt.shape[-1] // 2 if padded else 0,
                                              groups=I.shape[1] if depthwise else 1)
        return fn
    return {"torch": conv(torch.contiguous_format), "torch-cl": conv(torch.channels_last)}


def run_case(case, rng, budget: float, options: "tcpy.Options", generic: bool = False) -> dict:
    """Compile, check and time one case against its contenders: a record of the results
    (:func:`case_line` prints it; ``--json`` writes it). ``generic``: tcpy's size-generic kernel
    (``specialize="never"``) is a contender too."""
    kernel = tcpy.define(case.source, options=options)
    args = case.make_args(rng)
    compile_s = timeit.default_timer()
    got = kernel(*args)
    compile_s = timeit.default_timer() - compile_s
    want = case.reference(*args)
    ok = demo.close(got, want, want.dtype)
    contenders = {"tcpy": (kernel, args), "numpy": (case.reference, args)}
    if generic:
        size_generic = tcpy.define(case.source, options=dataclasses.replace(options, specialize="never"))
        ok = ok and demo.close(size_generic(*args), want, want.dtype)
        contenders["generic"] = (size_generic, args)
    t_args = [torch.from_numpy(a) if isinstance(a, np.ndarray) else a for a in args] if torch else None
    if torch is not None and case.name == "conv":  # input converted outside the timed call
        for name, fn in torch_conv(case).items():
            layout = torch.channels_last if name == "torch-cl" else torch.contiguous_format
            contenders[name] = (fn, [a.contiguous(memory_format=layout) if a.dim() == 4 else a for a in t_args])
    elif torch is not None:
        contenders["torch"] = (torch_fn(case.name), t_args)
    # Rounds in turn, best of all: a burst of other work on the machine hits every contender.
    best = dict.fromkeys(contenders, float("inf"))
    for _ in range(ROUNDS):
        for name, (f, f_args) in contenders.items():
            best[name] = min(best[name], demo.best_time(f, *f_args, budget=budget / ROUNDS))
    seconds = {name: best[name] for name in ("tcpy", "numpy", "generic") if name in best}
    if "torch" in best:  # the faster of torch's layouts
        seconds["torch"] = min(t for name, t in best.items() if name.startswith("torch"))
    return {"name": case.name, "shapes": case.shapes, "flops": case.flops, "seconds": seconds,
            "compile_seconds": compile_s, "correct": bool(ok)}


def case_line(record: dict) -> str:
    """One case as the line of the text output (see the module docstring)."""
    t_tc, t_np = record["seconds"]["tcpy"], record["seconds"]["numpy"]
    gflops = lambda t: record["flops"] / t / 1e9  # noqa: E731
    line = (f"{record['name']:<10} {record['shapes']:<28} tcpy {t_tc * 1e3:9.3f} ms {gflops(t_tc):6.1f} GFLOP/s"
            f" | numpy {t_np * 1e3:9.3f} ms {gflops(t_np):6.1f} GFLOP/s | numpy/tcpy {t_np / t_tc:5.2f}x")
    if "torch" in record["seconds"]:
        t_torch = record["seconds"]["torch"]
        line += f" | torch {t_torch * 1e3:9.3f} ms torch/tcpy {t_torch / t_tc:5.2f}x"
    if "generic" in record["seconds"]:
        t_generic = record["seconds"]["generic"]
        line += f" | generic {t_generic * 1e3:9.3f} ms specialised/generic {t_tc / t_generic:4.2f}"
    return line + f" | compile {record['compile_seconds']:5.2f} s | correct {'yes' if record['correct'] else 'NO'}"


def git_commit() -> str:
    """The checkout's commit (with ``+`` when it has uncommitted changes), or ``unknown``."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+" if dirty else "")


MEMORY_PROBE = """
import json, sys, numpy as np, tcpy
from tcpy import demo
case = getattr(demo, sys.argv[1])(*json.loads(sys.argv[2]))
args = case.make_args(np.random.default_rng(0))
kernel = tcpy.define(case.source, options=tcpy.Options(**json.loads(sys.argv[3])))
rss = lambda key: int(next(l for l in open("/proc/self/status") if l.startswith(key)).split()[1])  # KiB
before = rss("VmRSS:")
open("/proc/self/clear_refs", "w").write("5")  # reset the peak (VmHWM) to the current size
out = kernel(*args)
print(rss("VmHWM:") - before - out.nbytes // 1024)
"""


def probe_memory(make: str, sizes, **options) -> float:
    """MiB that one call of ``demo.<make>(*sizes)`` adds beyond its inputs and output, in a
    fresh process with the kernel in the disk cache: packing buffers, thread stacks, the loaded
    kernel."""
    probe = subprocess.run([sys.executable, "-c", MEMORY_PROBE, make, json.dumps(list(sizes)), json.dumps(options)],
                           capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
    return int(probe.stdout.split()[-1]) / 1024


def memory_line(layer: tuple, options: "tcpy.Options") -> str:
    """The resident memory a call of the resnet ``layer`` (n, c, f, hw, k, stride) adds beyond
    its inputs and output, in a fresh process with the kernel in the disk cache: packing
    buffers, thread stacks, the loaded kernel. An im2col copy would hold c*k*k values per
    output pixel."""
    n, c, f, hw, k, stride = layer
    target = options.target.name if options.target.name in PRESETS else "host"
    grown = probe_memory("resnet_conv_case", layer, target=target)
    out = (hw + 2 * (k // 2) - k) // stride + 1
    im2col = n * c * k * k * out * out * 4 / 2**20
    return (f"{'memory':<10} {demo.resnet_conv_case(*layer).shapes:<28} one call needs {grown:6.1f} MiB beyond "
            f"its inputs and output (an im2col buffer: {im2col:.0f} MiB)")


def overhead_line(options: tcpy.Options, n: int = 4, number: int = 20000) -> str:
    """Per-call cost of a tiny elementwise kernel against numpy.add (both allocate the result),
    with the run's ``options`` (``--specialize``: under ``"auto"``, once the kernel specialised
    to the shape has replaced the size-generic one, as for any shape called repeatedly)."""
    add = tcpy.define(TINY_ADD, options=options)
    a, b = np.ones(n, np.float32), np.ones(n, np.float32)
    for _ in range(SPECIALIZE_AFTER_CALLS + 1):  # compile, and call often enough to be specialised under "auto"
        add(a, b)
    add.finish_specializations()
    out = np.empty(n, np.float32)

    def per_call(fn):
        return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6

    t_tc = per_call(lambda: add(a, b))
    t_np = per_call(lambda: np.add(a, b))
    t_tc_out = per_call(lambda: add(a, b, out=out))
    t_np_out = per_call(lambda: np.add(a, b, out=out))
    return (f"{'overhead':<10} {f'add N={n}':<28} tcpy {t_tc:7.2f} us/call | numpy.add {t_np:7.2f} us/call"
            f" | with out=: tcpy {t_tc_out:7.2f} us, numpy {t_np_out:7.2f} us")


def attention_memory_line(b: int, h: int, s: int, d: int, threads: int, unfused: bool = True) -> str:
    """Peak memory of attention beyond inputs and output, fused and (with ``unfused``) unfused,
    in fresh processes."""
    case = demo.attention_case(b, h, s, d)
    args = case.make_args(np.random.default_rng(0))
    peaks = []
    for fuse in (True, False) if unfused else (True,):
        tcpy.define(case.source, options=tcpy.Options(num_threads=threads, fuse=fuse))(*args)  # into the cache
        peaks.append(probe_memory("attention_case", (b, h, s, d), num_threads=threads, fuse=fuse))
    scores = b * h * s * s * 4 / 2**20
    return (f"{'memory':<10} {case.shapes:<28} peak beyond inputs and output {peaks[0]:7.2f} MiB "
            f"({peaks[0] / scores:.3f} of the {scores:.0f} MiB score matrix)"
            + (f" | unfused {peaks[1]:7.2f} MiB" if unfused else "") + f" | threads {threads}")


# Attention whose score rows do not fit L2 (tcpy's online-softmax form): (batch, heads, length, d).
LONG_ATTENTION = ((1, 4, 8192, 64), (1, 1, 16384, 64))


def threads_line(n: int, options: "tcpy.Options", repeat: int = 5) -> str:
    """GEMM with 1 thread and with all: wall time, and CPU time / wall time, which shows how many
    threads really ran (the count is passed into the kernel, not set in global OpenMP state)."""
    A = np.ones((n, n), np.float32)
    parts = []
    for threads in (1, options.target.cores):
        kernel = tcpy.define(demo.GEMM, options=dataclasses.replace(options, num_threads=threads))
        kernel(A, A)  # compile
        best_wall, cpu_per_wall = float("inf"), 0.0
        for _ in range(repeat):
            wall, cpu = time.perf_counter(), time.process_time()
            kernel(A, A)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            if wall < best_wall:
                best_wall, cpu_per_wall = wall, cpu / wall
        parts.append(f"{threads} thread{'s' if threads > 1 else ''} {best_wall * 1e3:8.3f} ms cpu/wall {cpu_per_wall:4.2f}")
    return f"{'threads':<10} {f'gemm {n}':<28} " + " | ".join(parts)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes only (a smoke test)")
    parser.add_argument("--budget", type=float, default=1.0,
                        help="seconds of repeats per contender and case, split over the rounds")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads for every contender (tcpy, OpenBLAS via threadpoolctl, torch)")
    parser.add_argument("--target", default=None,
                        help="tcpy target preset (x86-64, x86-64-v3, x86-64-v4) instead of this machine; "
                             "for x86-64-v3 compare with OPENBLAS_CORETYPE=Haswell")
    parser.add_argument("--only", default=None, help="run only cases whose name or shapes contain this text")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH",
                        help="also write the header and every result to PATH as JSON "
                             "(benchmarks/compare.py compares two such files)")
    parser.add_argument("--suite", choices=("default", "resnet", "long"), default="default",
                        help="resnet: the ResNet-50 convolution layers (padded by guarded reads) at N=1 and 8, "
                             "a depthwise 3x3, the 3x3 layers unpadded, and the memory the N=8 56x56 layer needs beyond its arrays; "
                             "long: attention over sequences whose score rows do not fit L2, and its memory")
    parser.add_argument("--specialize", choices=("always", "never", "auto"), default="always",
                        help="tcpy's kernels specialised to each case's shapes (always, the default: the "
                             "speed of a kernel called repeatedly), size-generic (never), or tcpy's default "
                             "tiering (auto)")
    parser.add_argument("--generic", action="store_true",
                        help="also time tcpy's size-generic kernel (specialize='never') in the same rounds "
                             "as the specialised one: their ratio, measured in one process")
    args = parser.parse_args(argv)
    if args.generic and args.specialize != "always":
        parser.error("--generic compares the size-generic kernel with the specialised one (--specialize always)")
    if args.threads is not None:
        from threadpoolctl import threadpool_limits

        threadpool_limits(args.threads)  # OpenBLAS and OpenMP (tcpy's default and torch's)
        tcpy.set_num_threads(args.threads)
        if torch is not None:
            torch.set_num_threads(args.threads)
    options = tcpy.Options(target=args.target, specialize=args.specialize)

    report = {"date": f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}",
              "machine": machine(), "commit": git_commit(), "threads": tcpy.get_num_threads(),
              "target": options.target.describe(), "specialize": args.specialize, "suite": args.suite,
              "quick": args.quick,
              "header": [], "cases": [], "lines": []}

    def show(line: str, section: str = "lines") -> None:
        """Print a line of the text output and keep it for the JSON."""
        print(line, flush=True)
        report[section].append(line)
        if args.json is not None:  # rewritten after every line: an interrupted run keeps its results
            args.json.write_text(json.dumps(report, indent=1) + "\n")

    show(f"date: {report['date']}", "header")
    show(f"machine: {report['machine']}", "header")
    show(f"python {platform.python_version()}, numpy {np.__version__}, tcpy {tcpy.__version__}, "
         f"torch {torch.__version__ if torch else 'not installed'}", "header")
    for line in blas_info():
        show(f"threadpool: {line}", "header")
    show(f"tcpy threads: {tcpy.get_num_threads()}; target: {options.target.describe()}; "
         f"specialize: {args.specialize}", "header")
    show("peak of one core (benchmarks/peak.py): float {:.1f}, double {:.1f} GFLOP/s".format(
        fma_peak(options.target, "float"), fma_peak(options.target, "double")), "header")
    show("load average (1, 5, 15 min): {:.2f} {:.2f} {:.2f} (other work on the machine skews timings)"
         .format(*os.getloadavg()), "header")
    for var in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        if var in os.environ:
            show(f"WARNING: {var} is set; it slows numpy's GEMM here. "
                 "Run: env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench.py", "header")
    rng = np.random.default_rng(0)
    suite = {"resnet": resnet_cases, "long": lambda: (demo.attention_case(*shape) for shape in LONG_ATTENTION)}
    for case in suite.get(args.suite, lambda: cases(args.quick))():
        if args.only and args.only not in f"{case.name} {case.shapes}":
            continue
        record = run_case(case, rng, args.budget, options, args.generic)
        report["cases"].append(record)
        show(case_line(record))
    if args.suite == "resnet":
        show(memory_line((8, 64, 64, 56, 3, 1), options))
    if args.suite == "long":
        for shape in LONG_ATTENTION:
            show(attention_memory_line(*shape, tcpy.get_num_threads(), unfused=False))
    long_attention = "attention B=1 H=1 L=S=4096 D=128"
    if args.suite == "default" and not args.quick and (not args.only or args.only in long_attention):
        show(attention_memory_line(1, 1, 4096, 128, tcpy.get_num_threads()))
    if args.only or args.suite != "default":
        return 0
    show(overhead_line(options))
    show(threads_line(256 if args.quick else 1024, options))
    return 0


if __name__ == "__main__":
    sys.exit(main())
