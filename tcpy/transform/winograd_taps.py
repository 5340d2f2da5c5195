"""Winograd's minimal filtering F(3x3, 2x2) for a convolution's weight gradient.

The gradient of a 3x3 stride-1 convolution's weights sums, over every output pixel, the output
gradient times the image's window there: ``dW(f, c, kh, kw) +=! dO(n, f, h, w) * I(n, c, h + kh,
w + kw)``. Its outputs are the window's taps and its reduction the pixels: a GEMM of a short
M x N (channels by channels x 9 taps) and a long K (the pixels), whose packing gathers the
image's window nine times over. Over a 2x2 tile of pixels it is F(2x2, 3x3) transposed (Lavin
and Gray, 2016, section 4: the same three matrices in other roles)::

    dW = G^T [ sum over tiles (A o A^T) . (B^T d B) ] G
         o: 2x2 output gradient, d: 4x4 image patch (the forward's input transform), dW: 3x3

    A = | 1  0 |    B^T and G as in :mod:`.winograd`
        | 1  1 |
        | 1 -1 |
        | 0 -1 |

so the sum over pixels becomes 16 GEMMs (one per point of the 4x4 transformed tile) of M x N
with the tiles as their reduction, 2.25x fewer multiplications, and the output transform runs
once per (f, c) pair instead of once per tile. The transforms add, subtract and halve: results
differ from the direct sums by rounding only. Operands with inf, NaN or huge magnitudes take the
point-by-point sums, as on the winograd path. The C is :mod:`tcpy.codegen.contraction.winograd_taps`.
"""
from __future__ import annotations

import math
from typing import Optional

from ..contraction_ir import POINTS, TAPS, TILE, Axis, WinogradTapsForm
from ..target import CostModel


def winograd_taps_form(con) -> Optional[WinogradTapsForm]:
    """The F(3x3, 2x2) form of ``con``, or None: two output variables of extent 3 (the taps
    ``kh``, ``kw``) read by one operand (the image) alone, each with the stride there of a
    reduction variable (``h + kh``: stride 1, no dilation) that the other operand reads too, the
    guards (if any) on the image, bounding ``h + kh`` and ``w + kw`` as wholes and free of the
    other operand's channels, and no batch."""
    if not con.extents or con.batch:
        return None
    return next(filter(None, (_form(con, image) for image in con.image_operands())), None)


def _form(con, image: str) -> Optional[WinogradTapsForm]:
    """:func:`winograd_taps_form` with ``image`` the image operand."""
    tap_role, channel_role = ("n", "m") if image == "b" else ("m", "n")
    img, other = getattr(con, image), getattr(con, "a" if image == "b" else "b")
    extents = dict(con.extents)
    var = con.image_vars(image).__getitem__
    pixels = [v for v in con.role_vars("k") if extents[v] >= TILE and other.stride(v)]
    axes: list[Axis] = []
    for tap in sorted(con.role_vars(tap_role), key=lambda v: abs(img.stride(v))):
        if extents[tap] != TAPS or img.stride(tap) == 0:
            continue
        out = next((v for v in pixels if img.stride(v) == img.stride(tap)
                    and all(g.stride(v) == g.stride(tap) for g in con.guards)
                    and all(v != axis.out.name for axis in axes)), None)
        if out is not None:
            axes.append(Axis(var(out), var(tap)))
        if len(axes) == 2:
            break
    channels = con.role_vars(channel_role)
    if len(axes) < 2 or any(g.stride(v) for g in con.guards for v in channels):
        return None  # (a guard on the gradient's channels would not hold for a whole tile)
    cols, rows = axes  # the inner axis (smaller stride in the image) along the columns
    used = {rows.out.name, rows.tap.name, cols.out.name, cols.tap.name}
    return WinogradTapsForm(image, rows, cols, tuple(var(v) for v in channels),
                            tuple(var(v) for v in con.role_vars(tap_role) if v not in used),
                            tuple(var(v) for v in con.role_vars("k") if v not in used))


def cycles(form: WinogradTapsForm, mr: int, nr: int, fmas_per_cycle: int, cost: CostModel) -> float:
    """Estimated cycles on one thread: the 16 products on whole micro-tiles (rows padded to
    ``mr``, columns to ``nr``) and the transforms (``cost``'s constants: the image's as the
    forward's input transform, the gradient's as its output transform, the taps' as its weights')."""
    rows, cols = -(-form.M // mr) * mr, -(-form.N // nr) * nr
    products = POINTS * rows * cols * form.tiles / fmas_per_cycle
    return (products + cost.winograd_input * form.tiles * form.N + cost.winograd_output * form.tiles * form.M
            + cost.winograd_weights * form.M * form.N)


def direct_cycles(form: WinogradTapsForm, fmas_per_cycle: int) -> float:
    """Cycles of the same sums as a GEMM over all 9 taps (at the same FMA rate)."""
    pixels = math.prod(v.extent for v in form.k) * form.rows.out.extent * form.cols.out.extent
    return form.M * form.N * TAPS * TAPS * pixels / fmas_per_cycle


def chunk_tiles(form: WinogradTapsForm, kc: int, element_bytes: int, l3_share: int) -> int:
    """Tiles transformed per chunk (a multiple of ``kc``): the chunk's transformed operands
    (16 x (M + N) values a tile) in half of the threads' L3 share, all the tiles when they fit."""
    per_tile = POINTS * (form.M + form.N) * element_bytes
    fit = max(kc, l3_share // 2 // per_tile // kc * kc)
    return min(fit, -(-form.tiles // kc) * kc)

