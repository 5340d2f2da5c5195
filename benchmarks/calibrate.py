"""Measure a target's Winograd cost constants on this machine and print them as CostModel fields.

    python benchmarks/calibrate.py                      # the host's ISA family
    python benchmarks/calibrate.py --target x86-64-v3   # AVX2 kernels, on a machine that runs them

The planner's unit is one vector FMA on one of ``fma_pipes`` pipes (:class:`tcpy.target.CostModel`):

1. the cycle: one core's FMA peak (``benchmarks/peak.py``) is ``fma_pipes`` vector FMAs a cycle;
2. the transforms: convolutions chosen so that each transform dominates one of them run on the
   Winograd path (forced: ``winograd_gain_min`` 0) at one thread; their best time minus the 16
   products at peak is fitted (least squares on relative error, no negative constant) as
   ``winograd_input * tiles * K + winograd_output * tiles * M + winograd_weights * M * K +
   winograd_call`` (tiny layers give the last: the scan's and the weights' phase before the
   blocks, whatever the sizes); then likewise F(4x4, 3x3)'s (forced: ``winograd_f4_gain_min``
   0; its 36 products taken off) as the ``winograd_f4_*`` constants;
3. the gain threshold: ResNet's 3x3 layers (padded and unpadded, N=1 and 8) planned with the
   fitted constants, at 1 and 2 threads, each timed on the Winograd path and on the plan the
   engine takes without it (alternating, the median of the ratios of calls side by side): the
   ``winograd_gain_min`` whose choices miss the fewest measured winners.

The last table says, for each layer, what the planner chooses with the printed constants and
which contender was faster; ``--check`` prints it for the recorded constants, measuring nothing
else. Timings on a busy machine are noisy: run it on a quiet one.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

import tcpy  # noqa: E402
import tcpy.target  # noqa: E402
from tcpy import demo  # noqa: E402
from tcpy.contraction_ir import TAPS, TILE  # noqa: E402
from tcpy.target import Target, cost_model  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peak import fma_peak  # noqa: E402

# (n, c, f, hw, padded): per tile, input channels (c) or output channels (f) dominate, or the
# weights' pairs (c x f against few tiles)
TRANSFORM_LAYERS = ((1, 64, 64, 56, True), (1, 16, 128, 56, True), (1, 128, 16, 56, True),
                    (1, 128, 128, 28, True), (1, 256, 256, 14, True), (1, 512, 512, 7, True),
                    (8, 32, 32, 28, True), (1, 4, 4, 8, True), (1, 8, 8, 8, False))
RESNET_3X3 = ((64, 56), (128, 28), (256, 14), (512, 7))  # (channels, image side)
GAIN = re.compile(r"estimated ([0-9.]+)x less time than")
MICRO_TILE = re.compile(r"winograd path; .*?micro-tile (\d+)x(\d+)")
PATH = re.compile(r"; ([\w-]+) path[;:]")


def samples(kernels, args, repeats: int) -> list[list[float]]:
    """Seconds of ``repeats`` calls of each kernel, the kernels alternating."""
    for k in kernels:
        k(*args)  # compile and warm
    times = [[] for _ in kernels]
    for _ in range(repeats):
        for k, ts in zip(kernels, times):
            t = time.perf_counter()
            k(*args)
            ts.append(time.perf_counter() - t)
    return times


def repeats_for(flops: float) -> int:
    """Enough calls for a stable median, few for long ones."""
    return max(9, min(61, int(6e9 / max(flops, 1.0))))


def layer(n, c, f, hw, padded):
    """The demo's ResNet-style convolution case and its arguments."""
    case = demo.resnet_conv_case(n, c, f, hw, 3, 1, padded=padded)
    return case, case.make_args(np.random.default_rng(0))


def options(target: Target, threads: int, **kw) -> tcpy.Options:
    return tcpy.Options(target=target, num_threads=threads, specialize="always", **kw)


def use_costs(target: Target, cost) -> None:
    """Plan ``target``'s ISA family with ``cost`` from now on (in this process)."""
    tcpy.target.COST_MODELS[target.isa_family] = cost


def fit_transforms(target: Target, cycle: float, tile: int = TILE) -> tuple[float, float, float, float]:
    """(input, output, weights, call) cycles per tile and input channel, per tile and output
    channel, per pair of channels and per call of F(tile x tile, 3x3) (step 2 of the module's
    docstring)."""
    cost = cost_model(target)
    use_costs(target, dataclasses.replace(cost, winograd_gain_min=0.0,
                                          winograd_f4_gain_min=math.inf if tile == TILE else 0.0))
    points = (tile + TAPS - 1) ** 2
    lanes, rows, rest = target.lanes(4), [], []
    # a call's own cost (the launcher's checks, the team's wake), which every path pays: taken off
    copy = tcpy.define("def copy(float(N) A) -> (B) { B(i) = A(i) }", options=options(target, 1))
    launch = min(samples([copy], (np.zeros(4, np.float32),), 201)[0])
    print(f"a call's own cost: {launch * 1e6:.2f} us (taken off)")
    print(f"{'layer':<34} {'ms':>8} {'products ms':>12} {'transforms ms':>14}")
    for n, c, f, hw, padded in TRANSFORM_LAYERS:
        case, args = layer(n, c, f, hw, padded)
        kernel = tcpy.define(case.source, options=options(target, 1))
        text = str(kernel.explain(*args))
        found = MICRO_TILE.search(text)
        if found is None or f"F({tile}x{tile}, 3x3)" not in text:
            print(f"{case.shapes:<26} not on the winograd path; skipped")
            continue
        mr, nr = map(int, found.groups())
        side = (hw if padded else hw - 2)
        tiles = n * (-(-side // tile)) ** 2
        products = points * -(-f // mr) * mr * c * -(-tiles // nr) * nr / (cost.fma_pipes * lanes)
        seconds = min(samples([kernel], args, repeats_for(case.flops))[0]) - launch  # others only add to it
        print(f"{case.shapes:<34} {seconds * 1e3:8.3f} {products * cycle * 1e3:12.3f} "
              f"{seconds * 1e3 - products * cycle * 1e3:14.3f}")
        rows.append((tiles * c, tiles * f, c * f, 1))
        rest.append(seconds / cycle - products)
    return _nonnegative_fit(np.array(rows, dtype=float), np.array(rest))


def _nonnegative_fit(x: np.ndarray, y: np.ndarray) -> tuple[float, ...]:
    """Least squares of ``x @ coef ~ y`` relative to ``y``'s magnitude, dropping a column whose
    coefficient comes out negative and fitting again."""
    weight = 1.0 / np.maximum(np.abs(y), 1.0)
    active = list(range(x.shape[1]))
    while True:
        coef = np.zeros(x.shape[1])
        found, *_ = np.linalg.lstsq(x[:, active] * weight[:, None], y * weight, rcond=None)
        coef[active] = found
        negative = [i for i in active if coef[i] < 0]
        if not negative:
            return tuple(float(v) for v in coef)
        active.remove(min(negative, key=lambda i: coef[i]))


def gains(target: Target, threads: tuple[int, ...]) -> list[tuple[str, int, float, float, str]]:
    """(layer, threads, estimated gain, measured gain, baseline path) of each ResNet 3x3 layer the
    planner can run as Winograd, with the current constants and any gain allowed."""
    found = []
    for th in threads:
        for n in (1, 8):
            for padded in (True, False):
                for c, hw in RESNET_3X3:
                    case, args = layer(n, c, c, hw, padded)
                    wino = tcpy.define(case.source, options=options(target, th))
                    estimate = GAIN.search(wino.explain(*args))
                    if estimate is None:
                        continue
                    other = tcpy.define(case.source, options=options(target, th, winograd=False))
                    path = PATH.search(other.explain(*args))
                    t_wino, t_other = samples([wino, other], args, repeats_for(case.flops))
                    ratio = statistics.median(o / w for w, o in zip(t_wino, t_other))  # calls side by side
                    found.append((case.shapes, th, float(estimate.group(1)), ratio,
                                  path.group(1) if path else "?"))
    return found


def threshold(pairs: list[tuple[float, float]]) -> float:
    """The gain threshold whose choices miss the fewest measured winners: a layer chosen as
    Winograd (its estimated gain at least the threshold) that ran slower, or one left out that
    ran faster, by more than 3% (closer is noise on a shared machine; a count, so that one call
    slowed by another process does not move the threshold); on ties the threshold nearest 1.
    It may be below 1 where the estimates of what Winograd replaces run low."""
    def misses(gain_min):
        return sum(1 for est, measured in pairs
                   if abs(np.log(measured)) > np.log(1.03) and (est >= gain_min) != (measured >= 1.0))
    ests = sorted({est for est, _ in pairs})
    # between two estimates, 1 (no margin) if it lies there, else halfway (the least committed)
    candidates = [1.0, *ests[:1], *((lo + hi) / 2 for lo, hi in zip(ests, ests[1:])), *(e + 0.01 for e in ests[-1:])]
    best = min(candidates, key=lambda g: (misses(g), abs(np.log(g))))
    return math.ceil(best * 100 - 1e-9) / 100  # (up: the estimates are printed to 0.01)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="host", help="a preset name or host (default)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="thread counts of the gain check")
    parser.add_argument("--check", action="store_true",
                        help="measure nothing but the gains: the planner's choices with the recorded constants")
    args = parser.parse_args()
    target = Target.resolve(args.target)
    if not target.can_run_here():
        print(f"{target.name} does not run on this machine")
        return 1
    cost = cost_model(target)
    print(f"target: {target.describe()}; ISA family {target.isa_family}")
    if args.check:
        fitted = cost
    else:
        peak = fma_peak(target, "float")
        cycle = 2.0 * cost.fma_pipes * target.lanes(4) / (peak * 1e9)
        print(f"FMA peak one core {peak:.1f} GFLOP/s: a cycle of the model is {cycle * 1e9:.3f} ns")
        w_in, w_out, w_weights, w_call = fit_transforms(target, cycle)
        f4_in, f4_out, f4_weights, _ = fit_transforms(target, cycle, 4)
        fitted = dataclasses.replace(cost, winograd_input=round(w_in, 1), winograd_output=round(w_out, 1),
                                     winograd_weights=round(w_weights, 1), winograd_call=round(w_call, -2),
                                     winograd_f4_input=round(f4_in, 1), winograd_f4_output=round(f4_out, 1),
                                     winograd_f4_weights=round(f4_weights, 1))
    use_costs(target, dataclasses.replace(fitted, winograd_gain_min=0.0))
    rows = gains(target, tuple(args.threads))
    gain_min = cost.winograd_gain_min if args.check else threshold([(est, measured) for _, _, est, measured, _ in rows])
    print(f"\n{'layer':<34} {'threads':>7} {'estimated':>9} {'measured':>9}  baseline  chosen  faster")
    for shapes, th, est, measured, path in rows:
        chosen = "wino" if est >= gain_min else path
        faster = "wino" if measured >= 1.0 else path
        print(f"{shapes:<34} {th:>7} {est:9.2f} {measured:9.2f}  {path:<8}  {chosen:<6}  {faster}"
              f"{'' if chosen == faster else '   (miss)'}")
    misses = sum(1 for _, _, est, measured, _ in rows if (est >= gain_min) != (measured >= 1.0))
    print(f"\n{misses} of {len(rows)} choices missed the measured winner")
    if not args.check:
        print(f"# measured on {target.describe()}\n"
              f"CostModel(winograd_input={fitted.winograd_input}, winograd_output={fitted.winograd_output}, "
              f"winograd_weights={fitted.winograd_weights}, winograd_call={fitted.winograd_call}, "
              f"winograd_gain_min={gain_min}, winograd_f4_input={fitted.winograd_f4_input}, "
              f"winograd_f4_output={fitted.winograd_f4_output}, winograd_f4_weights={fitted.winograd_f4_weights})")
    return 0

if __name__ == "__main__":
    sys.exit(main())
