"""GEMM, a convolution and attention written as TC comprehensions, checked and timed against NumPy.

``python -m tcpy demo`` runs :func:`main`. The kernels and their NumPy counterparts are also
used by ``benchmarks/bench.py`` and the notebooks, so there is one copy of each.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

GEMM = """
def gemm(float(M,K) A, float(K,N) B) -> (C) {
    C(m, n) +=! A(m, k) * B(k, n)
}
"""

# NCHW convolution over a pre-padded input: a 3x3 "same" convolution of an HxW image reads
# an (H+2)x(W+2) input, and the output shape (H+2 - KH + 1) follows from range inference.
CONV2D = """
def conv2d(float(N,C,H,W) I, float(F,C,KH,KW) Wt) -> (O) {
    O(n, f, h, w) +=! I(n, c, h + kh, w + kw) * Wt(f, c, kh, kw)
}
"""

# Scaled dot-product attention, softmax written out: scores, row max, exp, row sum, normalise,
# times V. Every intermediate is a temporary, allocated by the launcher and never returned.
ATTENTION = """
def attention(float(B,H,L,D) Q, float(B,H,S,D) K, float(B,H,S,D) V, float scale) -> (O) {
    Sc(b, h, l, s) +=! Q(b, h, l, d) * K(b, h, s, d)
    Mx(b, h, l) max=! Sc(b, h, l, s)
    E(b, h, l, s) = exp(scale * (Sc(b, h, l, s) - Mx(b, h, l)))
    Sm(b, h, l) +=! E(b, h, l, s)
    P(b, h, l, s) = E(b, h, l, s) / Sm(b, h, l)
    O(b, h, l, d) +=! P(b, h, l, s) * V(b, h, s, d)
}
"""

# Softmax and layer norm over the rows of a matrix (bench.py's row cases).
SOFTMAX = """
def softmax(float(N,D) X) -> (Y) {
    mx(n) max=! X(n, d)
    e(n, d) = exp(X(n, d) - mx(n))
    s(n) +=! e(n, d)
    Y(n, d) = e(n, d) / s(n)
}
"""

LAYERNORM = """
def layernorm(float(N,D) X, float(D) g, float(D) b) -> (Y) {
    mean(n) +=! X(n, d) / D
    var(n) +=! (X(n, d) - mean(n)) * (X(n, d) - mean(n)) / D
    Y(n, d) = (X(n, d) - mean(n)) * rsqrt(var(n) + 1e-5) * g(d) + b(d)
}
"""


def numpy_gemm(A, B):
    """C = A @ B."""
    return A @ B


def im2col_conv2d(I, Wt):
    """Valid NCHW convolution as im2col + one matmul (what a NumPy user would write)."""
    n, c, h, w = I.shape
    f, _, kh, kw = Wt.shape
    oh, ow = h - kh + 1, w - kw + 1
    windows = np.lib.stride_tricks.sliding_window_view(I, (kh, kw), axis=(2, 3))  # n,c,oh,ow,kh,kw
    cols = windows.transpose(0, 2, 3, 1, 4, 5).reshape(n * oh * ow, c * kh * kw)
    out = cols @ Wt.reshape(f, c * kh * kw).T  # (n*oh*ow, f)
    return out.reshape(n, oh, ow, f).transpose(0, 3, 1, 2)


def padded_conv2d_source(k: int, stride: int = 1, pad: int = 0, depthwise: bool = False) -> str:
    """A k x k NCHW convolution with zero padding written as a guarded read (no padded copy of
    the input); ``depthwise``: one channel per group (weights ``Wt(c, kh, kw)``)."""
    y, x = f"{stride}*h + kh", f"{stride}*w + kw"
    weight = "Wt(c, kh, kw)" if depthwise else "Wt(f, c, kh, kw)"
    out = "O(n, c, h, w)" if depthwise else "O(n, f, h, w)"
    weights = "float(C,KH,KW) Wt" if depthwise else "float(F,C,KH,KW) Wt"
    read = f"I(n, c, {y} - {pad}, {x} - {pad}) * {weight}" if pad else f"I(n, c, {y}, {x}) * {weight}"
    if pad:
        read = (f"({y} >= {pad} && {y} < H + {pad} && {x} >= {pad} && {x} < W + {pad})\n"
                f"                      ? {read} : 0.0")
    grow = 2 * pad - k
    extent = lambda size: (f"({size} + {grow}) / {stride} + 1" if grow >= 0  # noqa: E731
                           else f"({size} - {-grow}) / {stride} + 1")
    return (f"def conv2d(float(N,C,H,W) I, {weights}) -> (O) {{\n"
            f"    {out} +=! {read}\n"
            f"        where h in 0:{extent('H')}, w in 0:{extent('W')}, kh in 0:KH, kw in 0:KW\n}}\n")


def im2col_padded_conv2d(stride: int, pad: int):
    """NCHW convolution with zero padding as NumPy users write it fast: pad, copy the windows
    into columns along contiguous rows (one strided copy per kernel tap), one batched matmul."""
    def conv(I, Wt):
        n, c, h, w = I.shape
        f, _, kh, kw = Wt.shape
        oh, ow = (h + 2 * pad - kh) // stride + 1, (w + 2 * pad - kw) // stride + 1
        if kh == kw == 1 and stride == 1 and pad == 0:  # a 1x1 convolution: a plain GEMM per image
            return np.matmul(Wt.reshape(f, c), I.reshape(n, c, h * w)).reshape(n, f, oh, ow)
        xp = np.pad(I, ((0, 0), (0, 0), (pad, pad), (pad, pad))) if pad else I
        cols = np.empty((n, c, kh, kw, oh, ow), I.dtype)
        for i in range(kh):
            for j in range(kw):
                cols[:, :, i, j] = xp[:, :, i:i + stride * oh:stride, j:j + stride * ow:stride]
        return np.matmul(Wt.reshape(f, c * kh * kw), cols.reshape(n, c * kh * kw, oh * ow)).reshape(n, f, oh, ow)
    return conv


def depthwise_conv2d(pad: int):
    """Depthwise 3x3 (stride 1) in NumPy: one shifted multiply-add per kernel tap."""
    def conv(I, Wt):
        n, c, h, w = I.shape
        _, kh, kw = Wt.shape
        oh, ow = h + 2 * pad - kh + 1, w + 2 * pad - kw + 1
        xp = np.pad(I, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
        out = np.zeros((n, c, oh, ow), I.dtype)
        for i in range(kh):
            for j in range(kw):
                out += xp[:, :, i:i + oh, j:j + ow] * Wt[None, :, i, j, None, None]
        return out
    return conv


def numpy_attention(Q, K, V, scale):
    """softmax(scale * Q K^T) V over the last two axes, with the usual max subtraction."""
    scores = scale * (Q @ K.swapaxes(-1, -2))
    scores -= scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(axis=-1, keepdims=True)
    return p @ V


def numpy_softmax(X):
    """softmax of each row of ``X``, with the usual max subtraction."""
    e = np.exp(X - X.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@dataclass(frozen=True)
class Case:
    """One demo/benchmark case: a TC kernel, its inputs, its NumPy counterpart and its flops."""

    name: str
    source: str
    shapes: str
    make_args: Callable[[np.random.Generator], tuple]
    reference: Callable
    flops: float


def _f32(rng, *shape):
    """Standard normal float32 data."""
    return rng.standard_normal(shape, dtype=np.float32)


def gemm_case(m: int, n: int, k: int) -> Case:
    """(m x k) @ (k x n) in float32."""
    return Case("gemm", GEMM, f"{m}x{k} @ {k}x{n}",
                lambda rng: (_f32(rng, m, k), _f32(rng, k, n)), numpy_gemm, 2.0 * m * n * k)


def conv2d_case(n: int, c: int, f: int, hw: int, k: int = 3) -> Case:
    """A k x k convolution, c -> f channels, hw x hw output, over a pre-padded NCHW input."""
    pad = hw + k - 1  # pre-padded input: output is hw x hw
    return Case("conv2d", CONV2D, f"N={n} C={c} F={f} {hw}x{hw} {k}x{k}",
                lambda rng: (_f32(rng, n, c, pad, pad), _f32(rng, f, c, k, k)),
                im2col_conv2d, 2.0 * n * f * hw * hw * c * k * k)


def resnet_conv_case(n: int, c: int, f: int, hw: int, k: int, stride: int = 1, depthwise: bool = False,
                     padded: bool = True) -> Case:
    """A ResNet layer: k x k, c -> f channels, an hw x hw input, "same" zero padding (k // 2)
    written as a guarded read, NCHW float32; ``depthwise``: f = c, one channel per group;
    ``padded=False``: the same layer without padding (an output k - 1 smaller)."""
    pad = k // 2 if padded else 0
    out = (hw + 2 * pad - k) // stride + 1
    reference = depthwise_conv2d(pad) if depthwise else im2col_padded_conv2d(stride, pad)
    w_shape = (c, k, k) if depthwise else (f, c, k, k)
    kind = ("depthwise " if depthwise else "") + ("" if padded else "unpadded ")
    return Case("conv", padded_conv2d_source(k, stride, pad, depthwise),
                f"{kind}N={n} {c}->{f} {hw}x{hw} {k}x{k} s{stride}",
                lambda rng: (_f32(rng, n, c, hw, hw), _f32(rng, *w_shape)),
                reference, 2.0 * n * f * out * out * (1 if depthwise else c) * k * k)


def attention_case(b: int, h: int, length: int, d: int) -> Case:
    """Self-attention shapes (batch, heads, sequence length, head size), scale 1/sqrt(d)."""
    scale = float(1.0 / np.sqrt(d))
    return Case("attention", ATTENTION, f"B={b} H={h} L=S={length} D={d}",
                lambda rng: (_f32(rng, b, h, length, d), _f32(rng, b, h, length, d),
                             _f32(rng, b, h, length, d), scale),
                numpy_attention, 4.0 * b * h * length * length * d)


def best_time(fn: Callable, *args, budget: float = 0.3, max_repeats: int = 50) -> float:
    """Smallest wall time of ``fn(*args)`` in seconds, over repeats filling about ``budget`` s."""
    best = float("inf")
    start = time.perf_counter()
    for _ in range(max_repeats):
        t0 = time.perf_counter()
        fn(*args)
        best = min(best, time.perf_counter() - t0)
        if time.perf_counter() - start > budget:
            break
    return best


def close(got, want, dtype) -> bool:
    """float32 results of long reductions: compare relative to the result's magnitude."""
    scale = max(float(np.abs(want).max()), 1.0)
    return got.shape == want.shape and got.dtype == dtype and float(np.abs(got - want).max()) <= 1e-4 * scale


DEMO_CASES = (
    gemm_case(512, 512, 512),
    conv2d_case(1, 64, 64, 56),
    attention_case(1, 8, 256, 64),
)


def main(out=sys.stdout) -> int:
    """Compile, check and time the demo kernels; print a table. Returns 0 when all match NumPy."""
    from tqdm import tqdm

    import tcpy
    from tcpy.api import SPECIALIZE_AFTER_CALLS

    rng = np.random.default_rng(0)
    rows, ok = [], True
    progress = tqdm(DEMO_CASES, desc="compiling", unit="kernel", file=sys.stderr, leave=False)
    for case in progress:
        progress.set_postfix_str(case.name)
        kernel = tcpy.define(case.source)
        args = case.make_args(rng)
        got = kernel(*args)  # first call: the size-generic kernel (gcc once, or the disk cache)
        want = case.reference(*args)
        match = close(got, want, np.float32)
        ok &= match
        # a shape called often gets a kernel specialised to it, compiled in the background:
        # time that steady state, as a program calling the kernel in a loop gets it
        for _ in range(SPECIALIZE_AFTER_CALLS):
            kernel(*args)
        kernel.finish_specializations()
        t_tc = best_time(kernel, *args)
        t_np = best_time(case.reference, *args)
        rows.append((case.name, case.shapes, "yes" if match else "NO", f"{t_tc * 1e3:.2f}",
                     f"{case.flops / t_tc / 1e9:.1f}", f"{t_np * 1e3:.2f}", f"{t_np / t_tc:.2f}x"))
    progress.close()
    header = ("kernel", "shapes", "matches NumPy", "tcpy ms", "GFLOP/s", "NumPy ms", "speed vs NumPy")
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
    for row in [header] + rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip(), file=out)
    print("speed vs NumPy = NumPy time / tcpy time (above 1x: tcpy is faster); "
          f"best of repeated calls (after the first ones: kernels specialised to the shapes), "
          f"{tcpy.Options().threads} threads.", file=out)
    return 0 if ok else 1
