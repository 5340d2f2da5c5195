"""``tcpy.grad`` against the forward it differentiates and against PyTorch's backward.

Run it as::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/grad.py [--threads N] [--only TEXT]

One line per case: the forward's time, the backward's (``tcpy.grad`` of every floating-point
input, attention's of Q, K and V as PyTorch's (its scale is a number there), called on the
forward's inputs and the output's cotangent), their ratio, and with PyTorch
installed the time of ``loss.backward()`` for the same math (``(out * cotangent).sum()``, the
forward's graph built outside the timed call, ``retain_graph``) and ``torch/tcpy``, its time over
tcpy's backward (above 1x tcpy is faster). Times are the best of repeated calls after a first
call that compiles.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import tcpy  # noqa: E402
from bench import machine  # noqa: E402
from tcpy import demo  # noqa: E402

try:
    import torch
except ImportError:  # the comparison is optional
    torch = None

GEMM = "def gemm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
ATTENTION = demo.ATTENTION


def cases():
    """(name, shapes, source, make_args(rng), torch forward or None, wrt)."""
    f32 = lambda rng, *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    yield ("gemm", "1024x1024 @ 1024x1024", GEMM, lambda rng: (f32(rng, 1024, 1024), f32(rng, 1024, 1024)),
           lambda A, B: A @ B, None)
    for n, c, f, hw, k, s in ((1, 64, 64, 56, 3, 1), (1, 128, 128, 28, 3, 1), (1, 256, 256, 14, 3, 1),
                              (1, 64, 256, 56, 1, 1), (1, 128, 128, 56, 3, 2), (1, 256, 512, 56, 1, 2)):
        pad = k // 2
        yield ("conv", f"N={n} {c}->{f} {hw}x{hw} {k}x{k} s{s}", demo.padded_conv2d_source(k, s, pad),
               lambda rng, n=n, c=c, f=f, hw=hw, k=k: (f32(rng, n, c, hw, hw), f32(rng, f, c, k, k)),
               lambda I, W, s=s, pad=pad: torch.nn.functional.conv2d(I, W, stride=s, padding=pad), None)
    b, h, length, d = 1, 8, 2048, 64
    scale = float(1.0 / np.sqrt(d))

    def torch_attention(Q, K, V, scale):
        return torch.softmax(Q @ K.transpose(-1, -2) * scale, dim=-1) @ V
    yield ("attention", f"B={b} H={h} L=S={length} D={d}", ATTENTION,
           lambda rng: (f32(rng, b, h, length, d), f32(rng, b, h, length, d), f32(rng, b, h, length, d), scale),
           torch_attention, ("Q", "K", "V"))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=None, help="threads for tcpy and torch")
    parser.add_argument("--only", default="", help="run only cases whose name or shapes contain this text")
    parser.add_argument("--budget", type=float, default=1.0, help="seconds of repeats per contender and case")
    parser.add_argument("--specialize", choices=("always", "never", "auto"), default="always",
                        help="tcpy's Options.specialize (default: kernels specialised to the shapes, as bench.py)")
    args = parser.parse_args(argv)
    if args.threads is not None:
        tcpy.set_num_threads(args.threads)
        if torch is not None:
            torch.set_num_threads(args.threads)
    print(f"machine: {machine()}; tcpy threads: {tcpy.get_num_threads()}; specialize: {args.specialize}; torch {torch.__version__ if torch else 'not installed'}")
    print("load average (1, 5, 15 min): {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    rng = np.random.default_rng(0)
    for name, shapes, source, make_args, torch_forward, wrt in cases():
        if args.only and args.only not in f"{name} {shapes}":
            continue
        forward = tcpy.define(source, options=tcpy.Options(specialize=args.specialize))
        backward = tcpy.grad(forward, wrt)
        inputs = make_args(rng)
        out = forward(*inputs)
        seed = rng.standard_normal(out.shape).astype(out.dtype)
        backward(*inputs, seed)  # compiles
        t_fwd = demo.best_time(forward, *inputs, budget=args.budget)
        t_bwd = demo.best_time(backward, *inputs, seed, budget=args.budget)
        line = (f"{name:<10} {shapes:<28} forward {t_fwd * 1e3:9.3f} ms | backward {t_bwd * 1e3:9.3f} ms | "
                f"backward/forward {t_bwd / t_fwd:5.2f}")
        if torch is not None:
            leaves = [torch.from_numpy(a).requires_grad_() if isinstance(a, np.ndarray) else a for a in inputs]
            loss = (torch_forward(*leaves) * torch.from_numpy(seed)).sum()
            t_torch = demo.best_time(lambda: loss.backward(retain_graph=True), budget=args.budget)
            line += f" | torch backward {t_torch * 1e3:9.3f} ms | torch/tcpy {t_torch / t_bwd:5.2f}x"
        print(line, flush=True)


if __name__ == "__main__":
    main()
