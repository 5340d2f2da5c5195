"""Winograd's minimal filtering F(2x2, 3x3) for convolutions the contraction engine recognises.

A 3x3 window at stride 1 slides over two output axes (``h + kh``, ``w + kw``). Over a 2x2 tile
of outputs, the 36 products of each (output channel, input channel) pair become 16 (Lavin and
Gray, "Fast Algorithms for Convolutional Neural Networks", 2016)::

    Y = A^T [ (G g G^T) . (B^T d B) ] A        g: 3x3 weights, d: 4x4 input patch, Y: 2x2 outputs

    B^T = | 1  0 -1  0 |     G = | 1    0    0   |     A^T = | 1  1  1  0 |
          | 0  1  1  0 |         | 1/2  1/2  1/2 |           | 0  1 -1 -1 |
          | 0 -1  1  0 |         | 1/2 -1/2  1/2 |
          | 0  1  0 -1 |         | 0    0    1   |

so the sum over input channels becomes 16 independent products (one per element ``xi`` of the
4x4 transformed tile), each an ordinary GEMM: ``M[xi] = U[xi] (M x K') . V[xi] (K' x tiles)``,
with M the output channels, K' the input channels and the tiles as columns. 2.25x fewer
multiplications; the transforms use only additions and halvings, so results differ from the
direct sums by rounding only (a few units in the last place of the largest terms).

The engine runs it block by block (:mod:`tcpy.codegen.contraction.winograd`): the weights' transform ``U``
once per call, then per block of tiles the input transform into packed slivers, the 16 products
through the micro-kernel into a block buffer and the output transform into the output; no
buffer grows with the image. Guards (a padded convolution) are tested on the transformed
input's gather, which reads zeros where they fail; a guard must bound ``h + kh`` as a whole
(the same coefficient for both), which padding does.

Inputs with inf, NaN or huge magnitudes (where the transforms' differences would turn one
infinite term into NaN for a whole tile) take the point-by-point sums instead: the generated
kernel scans both operands first.

F(4x4, 3x3) is not a tile size here yet. Its 4x4 outputs per tile take 36 products (2.25 per
output against 4), its transforms of 6x6 patches 3.4x (input), 3.9x (output) and 2.25x
(weights, per pair of channels) the operations of F(2x2, 3x3)'s per tile (additions,
multiplications by constants, loads, stores). With the transforms' constants measured on AMD
Zen 5 (16- and 8-lane vectors) scaled by those counts, the model estimates F(4x4) faster than
F(2x2) for ResNet's 64-channel 56x56 layer (1.2-1.4x, more at N=8) and its 28x28 layer at N=8
(1.2-1.6x), equal for the 28x28 layer unpadded at N=1, and slower at N=1 for the 14x14 layer
(0.57-0.95x: 16 tiles fill a third of one sliver, and the weights' transform per pair of
channels grows) and the 7x7 layer (0.45x). Where it would pay, the estimate assumes transforms
as fast per operation as F(2x2)'s vectorised ones (tiles 4 apart along a row need other
shuffles than :func:`tcpy.codegen.contraction.winograd.load_patches`'), and float32 rounding
grows (transform constants up to 8 and 1/24, against 1 and 1/2 here).
"""
from __future__ import annotations

import math
from typing import Optional

from ..contraction_ir import MAX_SLIVERS, POINTS, TAPS, TILE, Axis, WinogradForm
from ..target import CostModel


def winograd_form(con) -> Optional[WinogradForm]:
    """The F(2x2, 3x3) form of ``con``, or None: two output variables ``h``, ``w`` read by one
    operand (the image) with the strides of two reduction variables of extent 3 (``h + kh``:
    stride 1, no dilation), the guards (if any) on the image and bounding ``h + kh`` and
    ``w + kw`` as wholes, and output channels on the other operand's side."""
    if not con.extents:
        return None
    return next(filter(None, (_form(con, image) for image in con.image_operands())), None)


def _form(con, image: str) -> Optional[WinogradForm]:
    """:func:`winograd_form` with ``image`` the image operand (``con``: a
    :class:`~tcpy.contraction_ir.Contraction`)."""
    pixel_role, channel_role = ("n", "m") if image == "b" else ("m", "n")
    img = getattr(con, image)
    extents = dict(con.extents)
    var = con.image_vars(image).__getitem__  # (a name -> its Var)

    pixels, taps = con.role_vars(pixel_role), con.role_vars("k")
    axes: list[Axis] = []
    for tap in sorted(taps, key=lambda v: abs(img.stride(v))):
        if extents[tap] != TAPS or img.stride(tap) == 0:
            continue
        out = next((v for v in pixels if img.stride(v) == img.stride(tap) and extents[v] >= TILE
                    and all(g.stride(v) == g.stride(tap) for g in con.guards)
                    and all(v != axis.out.name for axis in axes)), None)
        if out is not None:
            axes.append(Axis(var(out), var(tap)))
        if len(axes) == 2:
            break
    if len(axes) < 2 or not con.role_vars(channel_role):
        return None
    cols, rows = axes  # the inner axis (smaller stride in the image) along the columns
    used = {rows.out.name, rows.tap.name, cols.out.name, cols.tap.name}
    return WinogradForm(image, rows, cols, tuple(var(v) for v in con.role_vars(channel_role)),
                        tuple(var(v) for v in pixels if v not in used),
                        tuple(var(v) for v in taps if v not in used))


def cycles(form: WinogradForm, mr: int, nr: int, fmas_per_cycle: int, cost: CostModel) -> float:
    """Estimated cycles of one batch index: the 16 products on whole micro-tiles (rows padded to
    ``mr``, tiles to ``nr``) and the three transforms (``cost``'s constants)."""
    rows, cols = -(-form.M // mr) * mr, -(-form.tiles // nr) * nr
    products = POINTS * rows * form.K * cols / fmas_per_cycle
    return (products + cost.winograd_input * form.tiles * form.K + cost.winograd_output * form.tiles * form.M
            + cost.winograd_weights * form.M * form.K)


def direct_cycles(form: WinogradForm, fmas_per_cycle: int) -> float:
    """Cycles of the same batch index as a GEMM over all 9 taps (at the same FMA rate)."""
    outputs = math.prod(v.extent for v in form.n) * form.rows.out.extent * form.cols.out.extent
    return form.M * outputs * form.K * TAPS * TAPS / fmas_per_cycle


def slivers_per_block(form: WinogradForm, nr: int, element_bytes: int, l2: int, slivers: int) -> int:
    """Tile slivers per block: the block's transformed input and products (16 x (K + M) x NR
    each) in half of L2; at least 4 when the transformed weights do not fit L2 (each block
    reads all of them once)."""
    per_sliver = POINTS * (form.K + form.M) * nr * element_bytes
    weights = POINTS * form.M * form.K * element_bytes
    wanted = max(l2 // 2 // per_sliver, 4 if weights > l2 else 1)
    return max(1, min(wanted, MAX_SLIVERS, slivers))
