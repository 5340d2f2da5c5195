"""Winograd's minimal filtering F(2x2, 3x3) and F(4x4, 3x3) for convolutions the contraction
engine recognises.

A 3x3 window at stride 1 slides over two output axes (``h + kh``, ``w + kw``). Over a 2x2 tile
of outputs, the 36 products of each (output channel, input channel) pair become 16 (Lavin and
Gray, "Fast Algorithms for Convolutional Neural Networks", 2016)::

    Y = A^T [ (G g G^T) . (B^T d B) ] A        g: 3x3 weights, d: 4x4 input patch, Y: 2x2 outputs

    B^T = | 1  0 -1  0 |     G = | 1    0    0   |     A^T = | 1  1  1  0 |
          | 0  1  1  0 |         | 1/2  1/2  1/2 |           | 0  1 -1  1 |
          | 0 -1  1  0 |         | 1/2 -1/2  1/2 |
          | 0 -1  0  1 |         | 0    0    1   |

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

F(4x4, 3x3) is the second tile size (``WinogradForm.tile``; the matrices of both are made from
their points in :mod:`tcpy.winograd_matrices`): its 4x4 outputs per tile take 36 products (2.25
per output against 4), its transforms of 6x6 patches 3.5x (input), 4.1x (output) and 2.1x
(weights, per pair of channels) the operations of F(2x2, 3x3)'s per tile (loads, stores, terms),
which scale F(2x2)'s measured constants until F(4x4)'s own are measured. The planner estimates
both and takes F(4x4) when F(2x2) costs ``winograd_f4_gain_min`` times more: it pays on large
images with many channels (ResNet's 56x56 and 28x28 layers), not where few tiles fill few
slivers (14x14 and 7x7 at N=1). Its float32 rounding is larger (constants up to 8 and 1/24
against 1 and 1/2): on random normal data, max |error| / max |result| against float64 sums is
5e-6 for a padded 64-channel 22x22 layer (F(2x2): 3.3e-7, PyTorch's float32 convolution:
2.8e-7) and 6e-6 to 1.3e-5 on ResNet's 3x3 layers (F(2x2): 3e-7 to 6e-7); the tests hold it
below 5e-5. A size-generic kernel's run-time engine holds both and plans the tile size per call.
"""
from __future__ import annotations

import functools
import math
from typing import Optional

from ..contraction_ir import MAX_SLIVERS, TAPS, TILE, Axis, WinogradForm
from ..target import CostModel
from ..winograd_matrices import operation_counts


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
    return WinogradForm(image, rows, cols, tuple([var(v) for v in con.role_vars(channel_role)]),
                        tuple([var(v) for v in pixels if v not in used]),
                        tuple([var(v) for v in taps if v not in used]))


@functools.lru_cache(maxsize=64)  # (the winograd planner weighs every tile size per call shape)
def transform_costs(cost: CostModel, tile: int) -> tuple[float, float, float]:
    """Cycles of the input transform per tile and input channel, the output transform per tile
    and output channel and the weights' per pair of channels, for F(tile x tile, 3x3): measured
    (``cost``), or F(2x2)'s scaled by the operation counts while F(4x4)'s are unmeasured."""
    base = (cost.winograd_input, cost.winograd_output, cost.winograd_weights)
    if tile == TILE:
        return base
    measured = (cost.winograd_f4_input, cost.winograd_f4_output, cost.winograd_f4_weights)
    if None not in measured:
        return measured
    return tuple([c * ops / ops2 for c, ops, ops2 in zip(base, operation_counts(tile), operation_counts(TILE))])


def cycles(form: WinogradForm, mr: int, nr: int, fmas_per_cycle: int, cost: CostModel) -> float:
    """Estimated cycles of one batch index: the form's products on whole micro-tiles (rows padded
    to ``mr``, tiles to ``nr``) and the three transforms (:func:`transform_costs`)."""
    rows, cols = -(-form.M // mr) * mr, -(-form.tiles // nr) * nr
    products = form.points * rows * form.K * cols / fmas_per_cycle
    inputs, outputs, weights = transform_costs(cost, form.tile)
    return products + inputs * form.tiles * form.K + outputs * form.tiles * form.M + weights * form.M * form.K


def direct_cycles(form: WinogradForm, fmas_per_cycle: int) -> float:
    """Cycles of the same batch index as a GEMM over all 9 taps (at the same FMA rate)."""
    outputs = math.prod([v.extent for v in form.n]) * form.rows.out.extent * form.cols.out.extent
    return form.M * outputs * form.K * TAPS * TAPS / fmas_per_cycle


def slivers_per_block(form: WinogradForm, nr: int, element_bytes: int, l2: int, slivers: int) -> int:
    """Tile slivers per block: the block's transformed input and products (P x (K + M) x NR
    each, P points per tile) in half of L2; at least 4 when the transformed weights do not fit
    L2 (each block reads all of them once)."""
    per_sliver = form.points * (form.K + form.M) * nr * element_bytes
    weights = form.points * form.M * form.K * element_bytes
    wanted = max(l2 // 2 // per_sliver, 4 if weights > l2 else 1)
    return max(1, min(wanted, MAX_SLIVERS, slivers))
