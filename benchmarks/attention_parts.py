"""Where attention's time goes: the fused kernel next to its parts, each a tcpy kernel of its own.

Run it as::

    python benchmarks/attention_parts.py [--threads N] [--shape B,H,L,D ...]

For each shape it prints one line::

    attention  B=1 H=8 L=S=512 D=64   fused  7.661 ms | Q.K^T  3.270 ms  82.1 GFLOP/s | P.V ... | softmax rows ...

``fused`` is ``demo.ATTENTION`` (the six statements, one parallel pass over blocks of query rows);
``Q.K^T`` and ``P.V`` are the two products as batched contractions over full tensors, with their
GFLOP/s against the FMA peak of one core times the threads; ``softmax rows`` are the four row
statements over a full score tensor (it streams through memory, the fused kernel's rows do not),
with their cost per score. The parts do not add up to the fused time: the fused kernel keeps its
blocks in cache. ``products only`` is the two products chained without the softmax between them
(``O = (Q K^T) V``, fused the same way): the fused kernel's floor. With PyTorch installed,
``torch`` is ``scaled_dot_product_attention`` and ``torch/products`` the most ``torch/fused``
could reach if the softmax cost nothing. Times are the best of repeated calls, contenders in turn.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

import tcpy  # noqa: E402
from tcpy import demo  # noqa: E402

from peak import fma_peak  # noqa: E402

SCORES = "def qk(float(B,H,L,D) Q, float(B,H,S,D) K) -> (Sc) { Sc(b,h,l,s) +=! Q(b,h,l,d) * K(b,h,s,d) }"
TIMES_V = "def pv(float(B,H,L,S) P, float(B,H,S,D) V) -> (O) { O(b,h,l,d) +=! P(b,h,l,s) * V(b,h,s,d) }"
PRODUCTS = """
def products(float(B,H,L,D) Q, float(B,H,S,D) K, float(B,H,S,D) V) -> (O) {
    Sc(b, h, l, s) +=! Q(b, h, l, d) * K(b, h, s, d)
    O(b, h, l, d) +=! Sc(b, h, l, s) * V(b, h, s, d)
}
"""
ROWS = """
def rows(float(B,H,L,S) Sc, float scale) -> (P) {
    Mx(b, h, l) max=! Sc(b, h, l, s)
    E(b, h, l, s) = exp(scale * (Sc(b, h, l, s) - Mx(b, h, l)))
    Sm(b, h, l) +=! E(b, h, l, s)
    P(b, h, l, s) = E(b, h, l, s) / Sm(b, h, l)
}
"""


def best_times(calls: dict, rounds: int, repeat: int) -> dict:
    """Best time in ms of each call, the calls timed in turn ``rounds`` times ``repeat`` calls."""
    best = {name: float("inf") for name in calls}
    for name, call in calls.items():
        call()  # compile
    for _ in range(rounds):
        for name, call in calls.items():
            for _ in range(repeat):
                start = time.perf_counter()
                call()
                best[name] = min(best[name], time.perf_counter() - start)
    return {name: t * 1e3 for name, t in best.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--shape", action="append", help="B,H,L,D (default: the benchmark's four)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    tcpy.set_num_threads(args.threads)
    shapes = [tuple(int(x) for x in s.split(",")) for s in args.shape] if args.shape else \
        [(1, 8, 512, 64), (1, 8, 2048, 64), (4, 12, 256, 64), (1, 1, 4096, 128)]
    peak = fma_peak(tcpy.Target.host(), "float") * args.threads
    print(f"threads {args.threads}; FMA peak {peak:.1f} GFLOP/s; {tcpy.Target.host()}")
    fused, scores, times_v, rows, products = (tcpy.define(s) for s in (demo.ATTENTION, SCORES, TIMES_V, ROWS,
                                                                      PRODUCTS))
    try:
        import torch
        torch.set_num_threads(args.threads)
    except ImportError:
        torch = None
    rng = np.random.default_rng(0)
    for b, h, length, d in shapes:
        q, k, v = (rng.standard_normal((b, h, length, d), dtype=np.float32) for _ in range(3))
        scale = np.float32(1 / np.sqrt(d))
        sc = scores(q, k)
        p = rows(sc, scale)
        calls = {"fused": lambda: fused(q, k, v, scale), "qk": lambda: scores(q, k),
                 "pv": lambda: times_v(p, v), "rows": lambda: rows(sc, scale),
                 "products": lambda: products(q, k, v)}
        if torch is not None:
            tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
            calls["torch"] = lambda: torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, scale=float(scale))
        t = best_times(calls, args.rounds, args.repeat)
        flops = 2.0 * b * h * length * length * d
        n_scores = b * h * length * length
        line = (f"attention  B={b} H={h} L=S={length} D={d}".ljust(36)
                + f" fused {t['fused']:8.3f} ms"
                + f" | Q.K^T {t['qk']:8.3f} ms {flops / t['qk'] / 1e6:6.1f} GFLOP/s ({flops / t['qk'] / 1e6 / peak:.0%})"
                + f" | P.V {t['pv']:8.3f} ms {flops / t['pv'] / 1e6:6.1f} GFLOP/s ({flops / t['pv'] / 1e6 / peak:.0%})"
                + f" | softmax rows {t['rows']:8.3f} ms {t['rows'] * 1e6 / n_scores:.2f} ns/score"
                + f" | products only {t['products']:8.3f} ms ({2 * flops / t['products'] / 1e6 / peak:.0%})")
        if torch is not None:
            line += (f" | torch {t['torch']:8.3f} ms torch/fused {t['torch'] / t['fused']:.2f}x"
                     f" torch/products {t['torch'] / t['products']:.2f}x")
        print(line, flush=True)


if __name__ == "__main__":
    main()
