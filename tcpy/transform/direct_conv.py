"""Direct convolution for contractions the engine recognises as a window over an image.

An implicit GEMM gathers the window into packed B slivers: each packed element then feeds only
the M output channels' FMAs, and with wide vectors that gather is the bottleneck. A direct
convolution (as oneDNN's on AVX-512) reads the image in place instead::

    for each (batch index, row of output pixels, block of nr output channels), claimed in turn:
      for each tile of mr output pixels along the row (the run variable):
        acc[mr][nr / lanes] = 0
        for each tap k (input channel x window position):
          nr / lanes weight vectors (the weights rearranged once per call: [block][k][nr])
          for each pixel r: acc[r][:] += broadcast(image at pixel r, tap k) * weights
        store the tile (alpha, +=, the epilogue)

so each image element loaded feeds ``nr / lanes`` vector FMAs and no copy of the image is
made. Padding (guards on the image) is tested on the tiles that touch it only: such a tile
clamps each tap's run of pixels to where the guards hold, the interior runs unguarded.

:func:`conv_form` finds the form, :func:`register_tile` the tile and :func:`cycles` the
estimate the planner weighs against the GEMM's and Winograd's; :mod:`tcpy.codegen.direct_conv`
renders the C.
"""
from __future__ import annotations

from typing import Optional

from ..contraction_ir import ConvForm
from ..target import CostModel

MAX_TILE_PIXELS = 14  # pixels per register tile (longer runs gain no reuse of the weight vectors)
MAX_TILE_VECTORS = 4  # output-channel vectors per register tile


def conv_form(con) -> Optional[ConvForm]:
    """The direct-convolution form of ``con`` (a
    :class:`~tcpy.contraction_ir.Contraction`), or None: an image operand read through a
    window (a pixel and a tap variable slide over one of its axes: neighbouring outputs read
    the same elements, so this is no GEMM), of the contraction's type, guards (if any) on it,
    and output channels on the weights' side."""
    if not con.extents:
        return None
    return next(filter(None, (_form(con, image) for image in con.image_operands())), None)


def _form(con, image: str) -> Optional[ConvForm]:
    pixel_role, channel_role = ("n", "m") if image == "b" else ("m", "n")
    img = getattr(con, image)
    if img.dtype is not con.dtype or img.elements <= 0:
        return None
    extents = dict(con.extents)
    pixels, channels, taps = con.role_vars(pixel_role), con.role_vars(channel_role), con.role_vars("k")
    if not pixels or not channels or not taps:
        return None
    if not any(_overlap(img.stride(p), extents[p], img.stride(t), extents[t]) for p in pixels for t in taps):
        return None  # each image element read once per output channel: a GEMM's operand
    var = con.image_vars(image).__getitem__  # (a name -> its Var)

    # the run: the pixel variable nearest in the image (consecutive pixels share cache lines),
    # then in the output
    run = min([v for v in pixels if img.stride(v)], key=lambda v: (abs(img.stride(v)), abs(con.c.stride(v))),
              default=None)
    if run is None:
        return None
    return ConvForm(image, var(run), tuple([var(v) for v in pixels if v != run]), tuple([var(v) for v in channels]),
                    tuple([var(v) for v in taps]))


def _overlap(stride_a: int, extent_a: int, stride_b: int, extent_b: int) -> bool:
    """Whether two variables slide over one image axis as a window (``h + kh``, ``2*w + kw``):
    their strides in it divide each other and the finer one's reach spans the coarser stride."""
    fine, coarse = sorted(((abs(stride_a), extent_a), (abs(stride_b), extent_b)))
    return fine[0] > 0 and coarse[0] % fine[0] == 0 and fine[0] * (fine[1] - 1) >= coarse[0]


def tile_cycles(pixels: int, vectors: int, cost: CostModel) -> float:
    """Cycles of one tap of a tile of ``pixels`` x ``vectors``: its FMAs or its loads (a
    broadcast per pixel, a weight vector per vector), whichever issue takes longer, plus the
    tap's own overhead (its offset, the loop)."""
    return max(pixels * vectors / cost.fma_pipes, (pixels + vectors) / cost.loads) + cost.direct_conv_tap


def row_cycles(run: int, pixels: int, vectors: int, cost: CostModel) -> float:
    """Cycles of one tap over a row of ``run`` pixels in tiles of ``pixels`` (a shorter last tile),
    with the first tile's weight vectors from L2."""
    full, tail = divmod(run, pixels)
    return (full * tile_cycles(pixels, vectors, cost) + (tile_cycles(tail, vectors, cost) if tail else 0.0)
            + vectors * cost.direct_conv_row)


def register_tile(form: ConvForm, lanes: int, registers: int, cost: CostModel) -> tuple[int, int]:
    """``(pixels, vectors)``: the tile whose accumulators (``pixels x vectors``), weight
    vectors and one broadcast fit the ``registers`` with the least estimated time for all
    output channels of a row (channels padded to whole blocks of ``vectors x lanes``); on ties
    fewer vectors (a block's weights take less cache)."""
    best = None
    for vectors in range(1, MAX_TILE_VECTORS + 1):
        most = min(MAX_TILE_PIXELS, form.run.extent, (registers - 1 - vectors) // vectors)
        if most < 1:
            continue
        blocks = -(-form.channel_count // (vectors * lanes))
        for pixels in range(1, most + 1):
            estimate = blocks * row_cycles(form.run.extent, pixels, vectors, cost)
            key = (round(estimate, 6), vectors, -pixels)
            if best is None or key < best[0]:
                best = (key, (pixels, vectors))
    return best[1] if best else (1, 1)


def cycles(form: ConvForm, pixels: int, vectors: int, lanes: int, element_bytes: int, l2: int,
           cost: CostModel) -> float:
    """Estimated cycles of one batch index: every row's taps for every block of output channels
    (:func:`row_cycles`), the weights' rearrangement, the weights read again for every row from
    beyond L2 when they do not fit in it (``cost.read`` per element), and the stores of outputs
    whose channels are not contiguous."""
    blocks = -(-form.channel_count // (vectors * lanes))
    weights = blocks * vectors * lanes * form.tap_count
    compute = blocks * form.row_count * form.tap_count * row_cycles(form.run.extent, pixels, vectors, cost)
    far = form.row_count * weights * cost.read if weights * element_bytes > l2 else 0.0
    stores = 0.0 if form.channels_last else form.channel_count * form.row_count * form.run.extent * cost.direct_conv_store
    return compute + weights * cost.pack + far + stores
