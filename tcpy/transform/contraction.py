"""The contraction engine's planning: how a recognised contraction (:mod:`.recognition`) runs.

:func:`plan` chooses, for a :class:`~tcpy.target.Target`, the micro-tile (``MR x NR``, from the
register file), the cache blocks ``kc``, ``mc``, ``nc`` (a footprint model of L1, L2 and L3,
after Low et al., "Analytical modeling is enough for high-performance BLIS"), the path
(``packed``: both operands packed into slivers, BLIS's five loops; ``small``: operands read in
place by a register-blocked kernel when everything already fits in L2 and one K block;
``winograd``: a 3x3 stride-1 convolution as Winograd's F(2x2, 3x3) or F(4x4, 3x3), :mod:`.winograd`, when its
estimated time beats the GEMM's; ``winograd_taps``: its weight gradient as F(3x3, 2x2),
:mod:`.winograd_taps`, likewise) and the thread grid (batch x M x N x K cells, from a cost model
of compute, packing and split-K combination). :mod:`tcpy.codegen.contraction` renders the C
(:mod:`tcpy.codegen.contraction.winograd` the winograd path's).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from types import MappingProxyType
from typing import Mapping, Optional

import cython
import numpy as np

from ..contraction_ir import POINTS, TILE, WINOGRAD_TILES, Contraction, ConvForm, Plan, WinogradForm, WinogradTapsForm
from ..errors import TCOptionError
from ..options import PLAN_PATHS
from ..schedule import CHUNKS_PER_THREAD
from ..target import DEFAULT_COST_MODEL, CostModel, Target
from .direct_conv import conv_form, register_tile
from .direct_conv import cycles as direct_conv_cycles
from .winograd import cycles as winograd_cycles
from .winograd import direct_cycles as gemm_cycles
from .winograd import slivers_per_block, winograd_form
from .winograd_taps import chunk_tiles, winograd_taps_form
from .winograd_taps import cycles as winograd_taps_cycles
from .winograd_taps import direct_cycles as taps_gemm_cycles


# ----------------------------------------------------------------------------- planning




COPY_B_MIN_TILES = 4
PACK_SHARE_MAX = 0.05  # packing A may cost this share of the FMA time (else the stream path)
# Rows of a micro-tile: taller tiles with fewer B vectors (14x2 with 32 registers: 14 broadcasts
# per k, every register taken) ran 5-15% below 8x3 with 32 wide registers in float and double,
# GEMMs and convolutions alike; with 16 registers the bound leaves 6x2, the tallest that fits.
MAX_TILE_ROWS = 8
NARROW_N_GAIN = 1.05  # a tile fitting N's extent better must win by this (8x3 ran ~5% above 6x4)
# B's runs along N must be this many slivers long for the kernel to pack B (most slivers inside a
# run: a 7x7 image's 49 pixels hold one 48-wide sliver at 1 of 49 offsets)
IN_KERNEL_RUN_SLIVERS = 4
UNROLL = 4  # k steps per iteration of the micro-kernels' loops (kc is a multiple)
ONE_K_BLOCK_SLACK = 1.5  # K up to this many L1-sized K blocks runs as one when the output is beyond L2


@functools.lru_cache(maxsize=32)
def register_tiles(target: Target) -> Mapping[int, int]:
    """The tallest ``MR`` for each width of ``NR vectors`` (1 to 4) whose accumulators ``MR x NRv``,
    ``NRv`` vectors of B and one broadcast of A fit the vector registers, with no more loads
    (MR broadcasts + NRv vectors) than FMAs and at most ``MAX_TILE_ROWS`` rows (found once per
    target: every plan asks)."""
    tallest = {}
    for nv in range(1, 5):
        fits = [mr for mr in range(1, MAX_TILE_ROWS + 1)
                if mr * nv + nv + 1 <= target.vector_registers and mr + nv <= mr * nv]
        if fits:
            tallest[nv] = max(fits)
    return MappingProxyType(tallest)


@functools.lru_cache(maxsize=4096)  # (a size-generic kernel plans each new call shape: N's extents repeat)
def micro_tile(target: Target, element_bytes: int, n: Optional[int] = None) -> tuple[int, int]:
    """``(MR, NR vectors)``: accumulators ``MR x NRv`` + ``NRv`` vectors of B + one broadcast of
    A fit the vector registers, with no more loads (MR broadcasts + NRv vectors) than FMAs and
    at most ``MAX_TILE_ROWS`` rows. Most FMAs per k, on ties the taller tile (a narrower B
    sliver leaves L1 room for kc); given N's extent ``n``, a tile whose useful share of its
    columns (N in whole tiles) is ``NARROW_N_GAIN`` higher replaces it, on ties the one with
    more FMAs per k (N = 64 with 48-wide tiles would compute 96 columns). Every such tile keeps
    the FMA pipes busy (no more loads than FMAs), so the time is the columns computed: with
    N = 25, 8x32 tiles ran 1.45x faster than 8x48 ones (AMD Zen 5), which the FMAs per k
    times the useful share (equal for both) missed."""
    lanes = target.lanes(element_bytes)
    tallest = register_tiles(target)
    if not tallest:  # a tiny register file: one row, one vector
        return 1, 1
    best = max([(mr, nv) for nv, mr in tallest.items()], key=lambda t: (t[0] * t[1], t[0]))
    if n is None:
        return best

    def useful(tile):
        nr = tile[1] * lanes
        return n / (-(-n // nr) * nr)

    narrow = max([(mr, nv) for nv, mr in tallest.items()], key=lambda t: (useful(t), t[0] * t[1], t[0]))
    return narrow if useful(narrow) > NARROW_N_GAIN * useful(best) else best


def _round_down(x: int, m: int) -> int:
    return max(m, x // m * m)


# ----------------------------------------------------------------------------- plan overrides



def _bad_plan(name: str, expected: str, got) -> None:
    raise TCOptionError(f"Options.plan[{name!r}] must be {expected}, got {got!r}")


def _multiple_of(name: str, value: int, multiple: int) -> int:
    if value % multiple:
        _bad_plan(name, f"a multiple of {multiple} for this contraction", value)
    return value


def _micro_tile_of(target: Target, element_bytes: int, n: int, overrides) -> tuple[int, int]:
    """``(MR, NR vectors)``: the planner's (:func:`micro_tile`), or the one ``overrides`` set,
    which must be whole vectors fitting the registers as :func:`micro_tile`'s do."""
    both = "mr" in overrides and "nr" in overrides  # (a run-time block's plan: no need for the planner's)
    mr, nv = (0, 0) if both else micro_tile(target, element_bytes, n)
    if "mr" not in overrides and "nr" not in overrides:
        return mr, nv
    lanes = target.lanes(element_bytes)
    mr = overrides.get("mr", mr)
    nr = _multiple_of("nr", overrides["nr"] if "nr" in overrides else nv * lanes, lanes)
    nv = nr // lanes
    if mr > MAX_TILE_ROWS or nv > 4 or mr * nv + nv + 1 > target.vector_registers:
        _bad_plan("mr" if "mr" in overrides else "nr",
                  f"a micro-tile of at most {MAX_TILE_ROWS} rows and 4 vectors of {lanes} whose accumulators, "
                  f"B vectors and broadcast fit {target.vector_registers} registers (mr {mr}, nr {nr} do not)",
                  overrides.get("mr", overrides.get("nr")))
    return mr, nv


def _path_runs(path: str, con: Contraction) -> bool:
    """Whether ``path`` can compute ``con`` at all (whatever it would cost)."""
    if path == "direct":
        return direct_ok(con)
    if path == "batch_lanes":
        return _batch_lanes_ok(con)
    if path == "small":
        return _small_layout_ok(con)
    if path == "stream":
        return _stream_layout_ok(con)
    if path == "direct_conv":
        return conv_form(con) is not None
    return path == "packed"


def _grid_of(con, path, mr, nr, kc, mc, nc, lanes, threads, overrides, cost,
             b_in_kernel: bool = False) -> tuple[int, int, int, int]:
    """The least-cost thread grid (:func:`_grid`), or the one ``overrides`` set: at most
    ``threads`` cells, none empty, K split only on the packed path."""
    if "grid" not in overrides:
        return _grid(con, path, mr, nr, kc, mc, nc, lanes, threads, cost, b_in_kernel)
    grid = tuple(overrides["grid"])
    batch, M, N, K = con.sizes
    limits = (batch, -(-M // mr), -(-N // nr), max(1, K // (2 * kc)) if path == "packed" else 1)
    if math.prod(grid) > threads or any(g > limit for g, limit in zip(grid, limits)):
        _bad_plan("grid", f"(batch, M, N, K) cells of at most {threads} thread(s) in all and at most "
                  f"{limits} for this contraction on the {path} path", grid)
    return grid


def _balanced(total: int, block: int, multiple: int) -> int:
    """A block size <= ``block`` (a multiple of ``multiple``) splitting ``total`` into equal
    blocks: 300 with block 200 gives 152, not 200 + 100."""
    if total <= block:
        return -(-total // multiple) * multiple
    count = -(-total // block)
    return -(-(-(-total // count)) // multiple) * multiple


def plan(con: Contraction, target: Target, threads: int, b_packed_once: bool = False,
         winograd: bool = True, overrides: Mapping[str, object] = MappingProxyType({}), direct_conv: bool = True,
         pack_b_in_kernel: bool = True, winograd_tiles: tuple[int, ...] = WINOGRAD_TILES,
         explain: bool = True) -> Plan:
    """Micro-tile, cache blocks, path and thread grid of ``con`` on ``target`` with ``threads``.

    ``b_packed_once``: B is packed once for many calls (the blocks of a fused chain), so the
    small path (B read in place) never pays: ``stream`` or ``packed``. ``winograd``: the
    winograd path may be chosen (``Options.winograd``). ``overrides`` (``Options.plan``) set
    plan fields instead of the cost model: ``path``, ``mr``, ``nr``, ``kc``, ``mc``, ``nc``,
    ``grid``; a value this contraction cannot run with raises :class:`TCOptionError`.
    ``direct_conv``: the direct_conv path may be chosen (a size-generic kernel holds none: the
    winograd path is then weighed against the implicit GEMM). ``pack_b_in_kernel``: the packed
    path's first micro-tile of each B sliver may read B in place and pack it (a size-generic
    kernel's run-time engine packs B in a pass). ``winograd_tiles``: the tile sizes the winograd
    path may take (a size-generic kernel's: those it holds routines of). ``explain``: say why in
    the plan's ``reasons`` (on the packed, small, stream and winograd paths: without, a
    size-generic kernel's plan at a call shape, which nothing shows, is found without formatting
    them)."""
    s = con.dtype.bits // 8
    lanes = target.lanes(s)
    batch, M, N, K = con.sizes
    mr, nv = _micro_tile_of(target, s, N, overrides)
    nr = nv * lanes
    unroll = UNROLL
    path_set = overrides.get("path")
    if path_set is not None and not _path_runs(path_set, con):
        _bad_plan("path", f"a path this contraction can run ({', '.join([p for p in PLAN_PATHS if _path_runs(p, con)])})",
                  path_set)
    if path_set in (None, "batch_lanes") and _batch_lanes_ok(con):
        # cells split M: each thread reads and writes whole rows of batch lanes (a pixel's
        # channels), contiguous in memory; the batch only when M has fewer rows than threads
        tm = min(M, threads)
        grid = (min(batch, threads // tm), tm, 1, 1)
        reasons = (f"batch-lanes path: N = 1, K = {K} (a window) and the batch ({batch}) contiguous in every "
                   "tensor, as in a depthwise convolution in NHWC: the vector lanes hold consecutive batch "
                   "indices, each output's K taps summed in registers (a guard decides a tap for all lanes)",
                   f"thread grid {'x'.join(map(str, grid))} for {threads} thread(s): rows of M first (each "
                   "thread's rows of batch lanes contiguous in memory)")
        return Plan("batch_lanes", 1, lanes, lanes, K, 1, 1, unroll, grid, threads, reasons,
                    cache_line=target.cache_line)
    if path_set in (None, "direct") and direct_ok(con):
        # M = 1: a micro-tile would fill one of its rows. Runs along N stop at nc outputs so that
        # the K rows of B a run reads stay in L1.
        nc = _round_down(target.l1d // 2 // (K * s), lanes)
        grid = _grid_of(con, "direct", mr, nr, K, 1, nc, lanes, threads, overrides, target.cost)
        reasons = (f"direct path: M = 1 and K = {K} (a window, as in a depthwise convolution): each run of up "
                   f"to {nc} outputs along N sums its K taps in registers, vectorised along the run",
                   f"thread grid {'x'.join(map(str, grid))} for {threads} thread(s): least estimated time")
        # A cell that computes all of N for its batch indices copies each one's slice of B once,
        # with zeros around it, and reads the copy with no guards (no per-position tap lists
        # at the padded ends of a run), when the copy fits half of L2.
        copy_bytes = con.padded.elements * s if con.padded else 0
        padded_copy = bool(con.padded) and grid[2] == 1 and copy_bytes <= target.l2 // 2
        if padded_copy:
            reasons += (f"B's guards bound its own indices: each batch index's slice is copied with zeros around "
                        f"it ({copy_bytes // 1024} KiB, in half of L2) and read with no guards; "
                        + ("the zeros multiply the taps, as written" if con.padding_multiplies else
                           "batch indices whose taps are not all finite sum point by point (0 x inf must stay 0)"),)
        # (without the copy a run leaves out the taps whose guard fails: not a guarded factor's 0 x tap)
        if padded_copy or not con.padding_multiplies:
            runs = con.padded.contraction if padded_copy else con
            rows, row_vectors = _row_block(runs, target, lanes, nc, padded_copy)
            if rows > 1:
                reasons += (f"whole rows of {con.n[-1].extent} outputs {rows} at a time (the taps of neighbouring "
                            f"rows read the same rows of B: one load feeds up to {rows} rows), in steps of "
                            f"{row_vectors} vectors: {rows * row_vectors} accumulators + the {K} taps' weights "
                            f"within {target.vector_registers} registers"
                            + (f"; a row shorter than a vector is summed in one vector (its last "
                               f"{lanes - con.n[-1].extent} lanes read the copy's next elements and are not "
                               "stored)" if con.n[-1].extent < lanes else ""),)
            # as on the packed path: an output beyond the threads' halves of L3 bypasses the caches
            # (a row block is contiguous in C when its rows are: set through an L1 buffer, the
            # buffer's aligned vectors stored non-temporally)
            out_bytes = batch * N * s
            stream_stores = (rows > 1 and lanes <= runs.n[-1].extent == runs.n[-2].c
                             and out_bytes > threads * target.l3_per_core // 2)
            if stream_stores:
                reasons += (f"non-temporal stores: each row block ({rows * runs.n[-1].extent * s} bytes, contiguous) "
                            f"is written once and the output ({out_bytes / 2**20:.1f} MiB) exceeds half of the "
                            "threads' L3 shares",)
            return Plan("direct", mr, nr, lanes, K, 1, nc, unroll, grid, threads, reasons, padded_copy=padded_copy,
                        stream_stores=stream_stores, rows=rows, row_vectors=row_vectors,
                        cache_line=target.cache_line)
    # (the reasons only where they are read: a size-generic kernel's run-time plans are not explained)
    reasons = []
    if explain:
        reasons.append(f"micro-tile {mr}x{nr}: {mr * nv} accumulators + {nv} B vectors + 1 broadcast "
                       f"<= {target.vector_registers} registers of {target.vector_bytes} bytes"
                       + (" (set by Options.plan)" if "mr" in overrides or "nr" in overrides else ""))
    # Footprints (Low et al.): the B sliver (kc x NR) stays in L1 while A slivers (MR x kc)
    # stream through it. Of an L1 of W ways, A's slivers need C_A = floor((W - 1) / (1 + NR/MR))
    # ways and one way stays free for C, so B's sliver may fill W - 1 - C_A ways. The packed A
    # block (mc x kc) stays in half of L2; the packed B panel (kc x nc) in half of this core's
    # share of L3.
    a_ways, b_ways, kc_max = _l1_fit(target, mr, nr, s)
    conv = conv_form(con) if not b_packed_once and (path_set == "direct_conv" or not overrides) else None
    dplan = None
    if conv is not None and (direct_conv or path_set == "direct_conv"):
        gemm = _implicit_gemm_cycles(con, conv, mr, nr, lanes, kc_max, 1, target.cost)
        dplan = _direct_conv_plan(con, conv, target, threads, gemm, forced=path_set == "direct_conv")
        if path_set == "direct_conv":
            return dplan
    form = winograd_form(con) if winograd and not b_packed_once and not overrides else None
    if form is not None:
        wplan = _winograd_choice(con, form, conv, dplan, target, threads, mr, nr, kc_max, winograd_tiles, explain)
        if wplan is not None:
            return wplan
    taps = winograd_taps_form(con) if winograd and not b_packed_once and not overrides else None
    if taps is not None:
        direct = None if dplan is None else batch * direct_conv_cycles(
            conv, dplan.mr, dplan.nr_vectors, lanes, s, target.l2, target.cost) / dplan.grid[2]
        tplan = _winograd_taps_plan(con, taps, target, threads, unroll, direct)
        if tplan is not None:
            return tplan
    if dplan is not None:
        return dplan
    kc = _balanced(K, kc_max, unroll)
    if explain:
        reasons.append(f"kc {kc}: the B sliver kc x NR ({kc * nr * s // 1024} KiB) fills {b_ways} of {target.l1d_ways} "
                       f"ways of L1 ({target.l1d // 1024} KiB; A slivers {a_ways}, C 1); K = {K} in "
                       f"{-(-K // kc)} equal blocks")
    out_bytes = batch * M * N * s
    if kc < K <= ONE_K_BLOCK_SLACK * kc_max and out_bytes > target.l2:
        kc = _balanced(K, K, unroll)
        if explain:
            reasons.append(f"kc {kc}: K = {K} in one block, longer than the L1 fit ({kc_max}): a second block "
                           f"would read and write the output ({out_bytes // 1024} KiB, beyond L2) once more")
    if "kc" in overrides:
        kc = _multiple_of("kc", overrides["kc"], unroll)
        if explain:
            reasons.append(f"kc {kc}: set by Options.plan")
    mc_max = _round_down(target.l2 // 2 // (kc * s), mr)
    nc_max = _round_down(target.l3_per_core // 2 // (kc * s), nr)
    if path_set is not None:
        small = path_set == "small"
    else:
        small = _small_ok(con, target, kc, s) and not b_packed_once
        if small and batch * -(-M // mr) * -(-N // nr) < threads and K >= 2 * kc:
            small = False  # fewer micro-tiles than threads: the packed path can split K
            if explain:
                reasons.append(f"packed path: {threads} threads and fewer micro-tiles; K = {K} can be split")
    if small:
        path = "small"
        if explain:
            reasons.append(f"small path: a K block of A and B ((M + N) x kc = {(M + N) * kc * s // 1024} KiB) "
                           f"fits half of L2: packing cannot pay")
    elif (path_set == "stream" or path_set is None and _stream_ok(
            con, target, kc_stream := min(kc, _stream_kc(target, N, s, unroll)), s, lanes) and (
            b_packed_once or batch * -(-M // mr) >= threads)):
        path = "stream"
        kc_stream = kc if "kc" in overrides else min(kc, _stream_kc(target, N, s, unroll))
        if kc_stream < kc:
            kc = _balanced(K, kc_stream, unroll)
            if explain:
                reasons.append(f"kc {kc} for the stream path: a K block of B fits half of L2")
        if explain:
            reasons.append(f"stream path: N = {N} is narrow, so packing A would cost more than "
                           f"{PACK_SHARE_MAX:.0%} of the FMAs; A is read in place, one micro-tile of rows at a "
                           f"time, against a packed K block of B (kc x N = {kc * N * s // 1024} KiB, in half of L2)")
    else:
        path = "packed"
    if explain and path_set is not None:
        reasons.append(f"{path} path: set by Options.plan")
    # the packed path's B, beyond L2, read in place by the kernel where it can (cell_cost's `read`)
    b_bytes = batch * N * K * s
    in_kernel = (pack_b_in_kernel and path == "packed" and not b_packed_once and b_bytes > target.l2
                 and _b_in_kernel_ok(con, nr))
    grid = _grid_of(con, path, mr, nr, kc, mc_max, nc_max, lanes, threads, overrides, target.cost, in_kernel)
    tb, tm, tn, tk = grid
    # Small path: a B sliver (kc x NR) is copied to be contiguous when enough micro-tiles reuse
    # it and its rows, read in place, would crowd a few L1 sets (a stride of a multiple of 4 KiB
    # maps every row to the same sets); rows that spread over the sets (N = 64: B's sliver is
    # already contiguous) are read in place, a copy would only cost time.
    if small and -(-(-(-M // mr)) // tm) >= COPY_B_MIN_TILES:
        crowd = _sliver_lines_per_set(con.k[0].b * s, kc, nr * s, target)
        packed = max(b_ways, _sliver_lines_per_set(nr * s, kc, nr * s, target))
        copy_b = crowd > packed
        if explain:
            reasons.append(f"small path {'copies each B sliver' if copy_b else 'reads B in place'}: "
                           f"{COPY_B_MIN_TILES}+ micro-tiles reuse a sliver, whose rows read in place put up to "
                           f"{crowd} lines in one L1 set ({'more' if copy_b else 'no more'} than {packed}: its ways "
                           "or a copy's)")
    else:
        copy_b = False
    m_part = -(-(-(-M // mr)) // tm) * mr
    n_part = -(-(-(-N // nr)) // tn) * nr
    # A cell whose rows fit one mc block packs its whole A (M rows by all of K) once (a
    # convolution's weights, a GEMM with few rows), in half of L2 or, K blocks beyond it, of
    # this core's L3 share: B panels then need no reuse across A blocks, so they stay in the
    # other half of L2 between packing and use (not in L3), and so does the output panel they
    # update, across K blocks (with L3-sized panels each K block re-read the output from L3).
    a_bytes = m_part * -(-K // kc) * kc * s
    a_once = path == "packed" and m_part <= mc_max and a_bytes <= max(target.l2, target.l3_per_core) // 2
    if a_once:
        nc_max = _round_down(target.l2 // 2 // (kc * s), nr)
    mc = _balanced(m_part, mc_max, mr)
    nc = _balanced(n_part, nc_max, nr)
    if "mc" in overrides or "nc" in overrides:
        mc = _multiple_of("mc", overrides.get("mc", mc), mr)
        nc = _multiple_of("nc", overrides.get("nc", nc), nr)
        a_once = a_once and m_part <= mc
        if explain:
            reasons.append(f"mc {mc}, nc {nc}: set by Options.plan")
    if a_once:
        where = f"L2 ({target.l2 // 1024} KiB)" if a_bytes <= target.l2 // 2 else \
            f"this core's L3 share ({target.l3_per_core // 1024} KiB; one mc block)"
        if explain:
            reasons.append(f"A packed once per cell: its {m_part} rows x K ({m_part * K * s // 1024} KiB) fit half "
                           f"of {where}")
            reasons.append(f"nc {nc}: the packed B panel kc x nc ({kc * nc * s // 1024} KiB) fits the other half of "
                           "L2 (no A block reuses it)")
    elif path == "packed":
        if explain:
            reasons.append(f"mc {mc}: the packed A block mc x kc ({mc * kc * s // 1024} KiB) fits half of L2 "
                           f"({target.l2 // 1024} KiB)")
            reasons.append(f"nc {nc}: the packed B panel kc x nc ({kc * nc * s // 1024} KiB) fits half of "
                           f"this core's L3 share ({target.l3_per_core // 1024} KiB)")
    if explain:
        reasons.append(f"thread grid {tb}x{tm}x{tn}x{tk} for {threads} thread(s): " + (
            "set by Options.plan" if "grid" in overrides else
            "least estimated time of compute + packing + split-K combination"))
    # An output written once (one K block) that is larger than the threads' halves of L3 would
    # only evict the operands: its whole tiles bypass the caches (no read for ownership, half
    # the memory traffic of the stores).
    stream_stores = (path != "direct" and con.init and K <= kc and tk == 1
                     and out_bytes > threads * target.l3_per_core // 2)
    if explain and stream_stores:
        reasons.append(f"non-temporal stores: each output tile is written once (K = {K} in one block) and the "
                       f"output ({out_bytes / 2**20:.1f} MiB) exceeds half of the threads' L3 shares")
    if explain and in_kernel and tk == 1:
        reasons.append(f"B packed by the kernel: the first micro-tile of each sliver reads it in place "
                       f"(its {con.n[-1].extent}-long runs along N unit-stride, K linear) and stores its rows "
                       f"into the packed sliver, so B ({b_bytes / 2**20:.1f} MiB, beyond L2) is read from memory "
                       "once, by the FMAs' loads, not by a packing pass and again from the cache")
    return Plan(path, mr, nr, lanes, kc, mc, nc, unroll, grid, threads, tuple(reasons), copy_b, a_once,
                stream_stores, pack_b_in_kernel=in_kernel and tk == 1, cache_line=target.cache_line)


def _direct_conv_plan(con: Contraction, form: ConvForm, target: Target, threads: int, gemm: float,
                      forced: bool) -> Optional[Plan]:
    """The direct_conv path's plan when its estimated time (:mod:`.direct_conv`) is below
    ``gemm``'s (the implicit GEMM's estimated cycles for all batch indices on one thread) by the
    cost model's ``direct_conv_gain_min``, or when ``forced`` (``Options.plan``)."""
    s = con.dtype.bits // 8
    lanes = target.lanes(s)
    cost = target.cost
    pixels, vectors = register_tile(form, lanes, target.vector_registers, cost)
    batch = con.size("batch")
    estimate = batch * direct_conv_cycles(form, pixels, vectors, lanes, s, target.l2, cost)
    if estimate * cost.direct_conv_gain_min >= gemm and not forced:
        return None
    blocks = -(-form.channel_count // (vectors * lanes))
    # an item is a row's tiles for one channel block; rows split into segments of tiles when
    # there are fewer than CHUNKS_PER_THREAD items per thread (many cores, few rows)
    tiles = -(-form.run.extent // pixels)
    segments = min(tiles, -(-CHUNKS_PER_THREAD * threads // (batch * form.row_count * blocks)))
    segment = -(-tiles // segments) * pixels
    items = batch * form.row_count * -(-form.run.extent // segment) * blocks
    grid = (1, 1, min(threads, items), 1)
    weights_bytes = batch * blocks * vectors * lanes * form.tap_count * s
    reasons = (f"direct_conv path: {form.describe()}; estimated {gemm / estimate:.2f}x less time than the "
               "implicit GEMM (whose packing gathers the window)" + (" (set by Options.plan)" if forced else ""),
               f"register tile {pixels} pixels x {vectors} vectors of {lanes} output channels: {pixels * vectors} "
               f"accumulators + {vectors} weight vectors + 1 broadcast <= {target.vector_registers} registers, "
               f"the least estimated time for rows of {form.run.extent} pixels",
               f"weights rearranged once per call into blocks of {vectors * lanes} channels per tap "
               f"({weights_bytes // 1024} KiB)",
               f"thread grid {'x'.join(map(str, grid))} for {threads} thread(s): the threads claim "
               f"(batch index, row, {segment} pixels, channel block) items, {items} in all")
    return Plan("direct_conv", pixels, vectors * lanes, lanes, form.tap_count, 1, segment, 1, grid,
                threads, reasons, conv=form, cache_line=target.cache_line)


def _l1_fit(target: Target, mr: int, nr: int, element_bytes: int) -> tuple[int, int, int]:
    """The L1 ways of the A slivers (MR x kc) and of the B sliver (kc x NR) of an MR x NR
    micro-tile, and the longest kc whose B sliver fits its ways (see :func:`plan`: one way stays
    free for C)."""
    a_ways = max(1, int((target.l1d_ways - 1) / (1 + nr / mr)))
    b_ways = max(1, target.l1d_ways - 1 - a_ways)
    return a_ways, b_ways, _round_down(target.l1d * b_ways // target.l1d_ways // (nr * element_bytes), UNROLL)


def winograd_over_gemm(con: Contraction, target: Target, threads: int, tiles: tuple[int, ...]) -> Optional[Plan]:
    """The winograd path's plan of ``con`` (with the tile sizes ``tiles``) when the cost model
    prefers it to the implicit GEMM, else None: :func:`plan`'s choice between those two alone
    (a size-generic kernel's at a call shape: it holds no direct_conv or winograd_taps routine,
    so what :func:`plan` would weigh besides is not needed)."""
    if _batch_lanes_ok(con) or direct_ok(con):
        return None  # (paths plan() takes before weighing Winograd)
    form = winograd_form(con)
    if form is None:
        return None
    s = con.dtype.bits // 8
    mr, nv = micro_tile(target, s, con.size("n"))
    nr = nv * target.lanes(s)
    return _winograd_choice(con, form, conv_form(con), None, target, threads, mr, nr, _l1_fit(target, mr, nr, s)[2],
                            tiles, explain=False)


def _winograd_choice(con: Contraction, form: WinogradForm, conv: Optional[ConvForm], dplan: Optional[Plan],
                     target: Target, threads: int, mr: int, nr: int, kc_max: int, tiles: tuple[int, ...],
                     explain: bool = True) -> Optional[Plan]:
    """The winograd path's plan of ``con`` (its ``form``) when it beats what would run instead:
    the direct convolution's ``dplan``, else the implicit GEMM on the MR x NR micro-tile (its
    ``conv`` form's gather included), else the FMAs of a GEMM over all 9 taps."""
    s = con.dtype.bits // 8
    lanes = target.lanes(s)
    baseline = None  # per thread, what would run instead of Winograd
    if dplan is not None:
        baseline = con.size("batch") * direct_conv_cycles(conv, dplan.mr, dplan.nr_vectors, lanes, s, target.l2,
                                                          target.cost) / dplan.grid[2]
    elif conv is not None:
        baseline = _implicit_gemm_cycles(con, conv, mr, nr, lanes, kc_max, threads, target.cost)
    return _winograd_plan(con, form, target, threads, kc_max, UNROLL, baseline, dplan is not None, tiles, explain)


def _implicit_gemm_cycles(con: Contraction, conv: ConvForm, mr: int, nr: int, lanes: int, kc: int, threads: int,
                          cost: CostModel) -> float:
    """Estimated cycles of the slowest of ``threads`` running ``con`` as an implicit GEMM (the
    packed or stream path, on its least-cost grid): its FMAs on whole micro-tiles, its packing
    (B's alone when A can be read in place) and the gather of the image's windows into B (each
    element of a strided window from its own stretch of a row), which each cell does for its
    share of the batch and of N."""
    batch, M, N, K = con.sizes
    gather = batch * K * N * (cost.pack_window * max(1, abs(conv.run.image)) - cost.pack)
    estimates = []
    for path in ("packed", "stream"):
        if path == "stream" and not _stream_layout_ok(con):
            continue
        grid = _grid(con, path, mr, nr, kc, 1, N, lanes, threads, cost)
        rounds = -(-math.prod(grid) // threads)
        estimates.append(cell_cost(con, path, mr, nr, N, lanes, grid, threads, cost)
                         + rounds * gather / (grid[0] * grid[2]))
    return min(estimates)


def _winograd_plan(con: Contraction, form: WinogradForm, target: Target, threads: int, kc_max: int,
                   unroll: int, baseline: Optional[float] = None, direct: bool = False,
                   tiles: tuple[int, ...] = WINOGRAD_TILES, explain: bool = True) -> Optional[Plan]:
    """The winograd path's plan when its estimated time beats, by the cost model's
    ``winograd_gain_min``, ``baseline``'s (the estimated cycles per thread of the implicit GEMM,
    its packing and the window's gather included, or of the direct convolution when ``direct``,
    which would run instead), or without a baseline the FMAs of a GEMM over all 9 taps. Of the
    tile sizes ``tiles`` that fit the output axes, F(4x4, 3x3) when F(2x2, 3x3)'s estimate is
    ``winograd_f4_gain_min`` times its own."""
    s = con.dtype.bits // 8
    lanes = target.lanes(s)
    cost = target.cost
    fmas = cost.fma_pipes * lanes
    batch, M, N, _ = con.sizes

    def shares(form, tile):  # the threads that get tile slivers
        return min(threads, batch * -(-form.tiles // (tile[1] * lanes)))

    def per_thread(form, tile):
        estimate = winograd_cycles(form, tile[0], tile[1] * lanes, fmas, cost)
        return estimate * batch / shares(form, tile) + cost.winograd_call

    def best_tile(form):
        # a small image's few tiles fill one wide sliver: a narrower tile that gives more threads
        # a sliver, if its estimate per thread is lower (ResNet's 14x14 layer at N=1, 2 threads: 8x32)
        widest = micro_tile(target, s, form.tiles)
        narrower = [(mr, nv) for nv, mr in register_tiles(target).items()
                    if shares(form, (mr, nv)) > shares(form, widest)]
        return min([(per_thread(form, tile), tile) for tile in (widest, *narrower)], key=lambda pair: pair[0])

    candidates = [dataclasses.replace(form, tile=t) for t in tiles
                  if min(form.rows.out.extent, form.cols.out.extent) >= t]
    estimates = [(estimate, f, tile) for f in candidates for estimate, tile in (best_tile(f),)]
    fast, form, (mr, nv) = estimates[0]
    f2_estimate = fast
    for estimate, f, tile in estimates[1:]:
        if f2_estimate >= cost.winograd_f4_gain_min * estimate:
            fast, form, (mr, nv) = estimate, f, tile
    nr = nv * lanes
    slivers = -(-form.tiles // nr)
    # per thread: the GEMM splits its micro-tiles over the threads, Winograd its tile slivers
    # (a few slivers cannot keep many threads busy); FMAs alone missed the GEMM's padded gather
    # (ResNet's 14x14 layer at N=1 ran 1.25x faster as Winograd on AMD Zen 5, estimated 0.95x)
    gemm = baseline if baseline is not None else \
        gemm_cycles(form, fmas) * batch / min(threads, batch * -(-M // mr) * -(-N // nr))
    if gemm < cost.winograd_gain_min * fast:
        return None
    kc = _balanced(form.K, kc_max, unroll)
    per_thread = -(-batch * slivers // threads)
    blocks = slivers_per_block(form, nr, s, target.l2, per_thread)
    rows = -(-form.M // mr) * mr
    mc = max(mr, min(rows, _round_down(target.l2 // 2 // (kc * s), mr)))
    grid = (1, 1, min(threads, batch * slivers), 1)
    reasons = ()  # (unless explained: :func:`plan`'s ``explain``)
    if explain:
        u_bytes = batch * form.points * rows * form.K * s
        against = ("the direct convolution" if direct else "the implicit GEMM" if baseline is not None
                   else "the GEMM over all 9 taps")
        reasons = (f"winograd path: {form.describe()}; estimated {gemm / fast:.2f}x less time than {against} "
                   f"with {threads} thread(s) ({form.points} products on {mr}x{nr} micro-tiles and the "
                   "transforms; the threads split the tile slivers)"
                   + (f"; F(2x2, 3x3) estimated {f2_estimate / fast:.2f}x slower" if form.tile != TILE else ""),
                   f"transformed weights once per call: {form.points} x {rows} x {form.K} ({u_bytes // 1024} KiB)",
                   f"blocks of {blocks * nr} tiles: the block's transformed input and products "
                   f"({form.points * (form.K + rows) * blocks * nr * s // 1024} KiB) per thread",
                   f"kc {kc}: a transformed input sliver kc x NR ({kc * nr * s // 1024} KiB) stays in L1",
                   f"mc {mc}: a block of one point's transformed weights mc x kc ({mc * kc * s // 1024} KiB) stays "
                   f"in half of L2 while the block's tile slivers pass",
                   f"thread grid {'x'.join(map(str, grid))} for {threads} thread(s): the threads claim blocks "
                   "of tile slivers, transform and multiply them")
    return Plan("winograd", mr, nr, lanes, kc, mc, blocks * nr, unroll, grid, threads, reasons, winograd=form,
                cache_line=target.cache_line)


def _winograd_taps_plan(con: Contraction, form: WinogradTapsForm, target: Target, threads: int,
                        unroll: int, direct: Optional[float] = None) -> Optional[Plan]:
    """The winograd_taps path's plan when its estimated time per thread beats, by the cost
    model's ``winograd_gain_min``, the implicit GEMM's (its FMAs over all 9 taps and the gather of
    the image's window into packed B, split over the threads) or, when the pixels make a direct
    convolution (``direct``: its estimated cycles per thread), that one's."""
    s = con.dtype.bits // 8
    lanes = target.lanes(s)
    cost = target.cost
    fmas = cost.fma_pipes * lanes
    mr, nv = micro_tile(target, s, form.N)
    nr = nv * lanes
    slivers = -(-form.N // nr)
    gemm = (taps_gemm_cycles(form, fmas) + con.size("k") * con.size("n") * cost.pack_window) / threads
    against = "the implicit GEMM (all 9 taps' FMAs and the window's gather)"
    if direct is not None and direct < gemm:
        gemm, against = direct, "the direct convolution"
    # the products split over points and column slivers; the transforms over slivers and tiles
    fast = winograd_taps_cycles(form, mr, nr, fmas, cost) / min(threads, POINTS * slivers)
    if gemm < cost.winograd_gain_min * fast:
        return None
    _, b_ways, kc_max = _l1_fit(target, mr, nr, s)
    kc = _balanced(form.tiles, kc_max, unroll)
    chunk = chunk_tiles(form, kc, s, threads * target.l3_per_core)
    rows = -(-form.M // mr) * mr
    grid = (1, 1, min(threads, POINTS * slivers), 1)
    reasons = (f"winograd_taps path: {form.describe()}; estimated {gemm / fast:.2f}x less time than {against} "
               f"with {threads} thread(s) (16 products on {mr}x{nr} micro-tiles and the transforms)",
               f"chunks of {chunk} tiles: their transformed operands (16 x ({rows} + {slivers * nr}) values a tile, "
               f"{POINTS * (rows + slivers * nr) * chunk * s // 1024} KiB) in half of the threads' L3 share",
               f"kc {kc}: a transformed image sliver kc x NR ({kc * nr * s // 1024} KiB) fills {b_ways} of "
               f"{target.l1d_ways} ways of L1 while the gradient's slivers pass",
               f"thread grid {'x'.join(map(str, grid))} for {threads} thread(s): per chunk the threads claim "
               "blocks of tiles to transform, then (point, column sliver) products; each product sums the "
               "tiles in one fixed order")
    return Plan("winograd_taps", mr, nr, lanes, kc, mr, chunk, unroll, grid, threads, reasons, taps=form,
                cache_line=target.cache_line)


DIRECT_K_MAX = 64  # longest reduction the direct path takes (a window; beyond, a GEMM's reuse wins)
ROW_BLOCK_MAX = 8  # rows of the direct path computed together (a 3-tap window: 10 B rows for 8)
ROW_STEP_VECTORS_MAX = 4  # vectors of a row-block step along the row
ROW_BLOCK_OPERANDS = 3  # registers a row block keeps for B's loaded vectors


def direct_ok(con: Contraction) -> bool:
    """M = 1 (no M variables) with a short K: a micro-tile would fill one of its MR rows, so each
    output row is computed directly (depthwise convolution, pooling-like windows). The output's
    inner N variable must be contiguous (vector stores), and a guard must be B's (its runs along N
    are what the path clamps)."""
    return (not con.m and con.size("k") <= DIRECT_K_MAX and bool(con.n) and con.n[-1].c == 1
            and con.guarded != "a")


def _row_block(con: Contraction, target: Target, lanes: int, nc: int, padded_copy: bool) -> tuple[int, int]:
    """Rows computed together by the direct path on ``con`` (the unguarded contraction it runs),
    and the vectors of each step along a row: ``(1, 0)`` when it cannot block. A block is whole
    runs of the inner N group at consecutive values of the next group; where the taps step over
    that group too (a window's rows), neighbouring rows read the same B rows and one load feeds
    several rows' sums. The step is the width that computes the fewest vectors per row (its
    last step overlapping the previous one: overwrites only); the rows fill the registers the
    taps' weights and a few operands leave. A row shorter than a vector is one vector when B
    is the zero-padded copy (``padded_copy``: its buffer has room for the lanes beyond)."""
    if (con.guards or not con.init or len(con.n) < 2 or con.n[-1].b != 1 or con.b.dtype is not con.dtype
            or not (lanes if not padded_copy else 2) <= con.n[-1].extent <= nc):
        return 1, 0
    extent = con.n[-1].extent
    widths = [v for v in range(1, ROW_STEP_VECTORS_MAX + 1) if v * lanes <= extent] or [1]
    row_vectors = min(widths, key=lambda v: (-(-extent // (v * lanes)) * v, -v))
    free = target.vector_registers - min(con.size("k"), target.vector_registers // 2) - ROW_BLOCK_OPERANDS
    rows = min(con.n[-2].extent, ROW_BLOCK_MAX, free // row_vectors)
    return (rows, row_vectors) if rows > 1 else (1, 0)


def _batch_lanes_ok(con: Contraction) -> bool:
    """N = 1 (no N variables) with a short K, the batch's inner group contiguous in all three
    tensors, and guards (if any) on A that do not depend on the batch: a depthwise convolution
    in NHWC (batch = channels, M = pixels, K = the window). A micro-tile would fill one of its
    NR columns; instead the vector lanes hold consecutive batch indices, and a guard decides a
    tap for all of them at once (so it leaves out a failing tap: not for a guarded factor, whose
    failing taps are 0 times the other operand)."""
    if (con.n or not con.m or not con.batch or con.size("k") > DIRECT_K_MAX or con.guarded == "b"
            or con.padding_multiplies):
        return False
    inner = con.batch[-1]
    return (inner.a == inner.b == inner.c == 1 and con.a.dtype is con.dtype and con.b.dtype is con.dtype
            and all(g.stride(f"g{i}") == 0 for g in con.batch for i in range(len(con.guards))))


def _stream_ok(con: Contraction, target: Target, kc: int, s: int, lanes: int) -> bool:
    """A read in place when packing it costs too much for its reuse: each A element feeds
    ``N / lanes`` vector FMAs (``N / lanes / fma_pipes`` cycles) and its copy ``pack`` cycles
    (``pack_far`` when A does not fit in L2; the target's :class:`~tcpy.target.CostModel`). The K block of B (``kc x N``) must
    fit half of L2."""
    _, M, N, K = con.sizes
    model = target.cost
    cost = model.pack if M * K * s <= target.l2 else model.pack_far
    if cost * lanes * model.fma_pipes / max(1, N) <= PACK_SHARE_MAX or kc * N * s > target.l2 // 2:
        return False
    return _stream_layout_ok(con)


def _stream_layout_ok(con: Contraction) -> bool:
    """A can be read in place: unguarded, of the contraction's type, linear along M and K."""
    m_stride = con.linear_stride("m", "a")
    return (con.a.dtype is con.dtype and bool(con.k) and con.linear_stride("k", "a") is not None
            and con.guarded != "a" and m_stride is not None and (not con.m or m_stride != 0))


def _stream_kc(target: Target, N: int, s: int, unroll: int) -> int:
    """The longest K block of B (``kc x N``) that fits half of L2, at least ``4 * unroll``
    (shorter blocks would spend more on the output tile's loads and stores than on FMAs)."""
    return max(4 * unroll, _round_down(target.l2 // 2 // max(1, N * s), unroll))


@functools.lru_cache(maxsize=1024)
def _sliver_lines_per_set(row_stride: int, rows: int, row_bytes: int, target: Target) -> int:
    """The most cache lines that ``rows`` rows of ``row_bytes`` at ``row_stride`` bytes from
    each other put in one L1 set (each row over one more line: its start need not be aligned)."""
    line = target.cache_line
    return _lines_per_set(row_stride, rows, -(-row_bytes // line) + 1, line,
                          max(1, target.l1d // (target.l1d_ways * line)))


# (the planner's annotations are not C types, see setup.py: this loop declares its own)
@cython.cfunc
@cython.returns(cython.long)
@cython.boundscheck(False)
@cython.wraparound(False)
@cython.locals(row_stride=cython.long, rows=cython.Py_ssize_t, span=cython.long, line=cython.long, sets=cython.long,
               row=cython.Py_ssize_t, start=cython.long, end=cython.long, first=cython.long, index=cython.long,
               set_=cython.Py_ssize_t, most=cython.long, counts=cython.long[::1])
def _lines_per_set(row_stride, rows, span, line, sets):
    """:func:`_sliver_lines_per_set` of rows of ``span`` lines of ``line`` bytes, an L1 of
    ``sets`` sets. The rows by their first line (in their order, or the reverse for a negative
    stride): a line of one row is another's only if it is the previous row's (their spans are
    equal), so each row counts those past the previous row's."""
    counts = np.zeros(sets, np.int64)
    end = -(2 ** 62)
    most = 0
    for row in range(rows):
        start = (row if row_stride >= 0 else rows - 1 - row) * row_stride // line
        first = max(start, end)
        end = start + span
        for index in range(first, end):
            set_ = index % sets
            counts[set_] += 1
            most = max(most, counts[set_])
    return most


def _b_in_kernel_ok(con: Contraction, nr: int) -> bool:
    """The packed path's kernel can read B's slivers in place (and pack them as it goes): B
    unguarded, of the contraction's type, linear along K, its inner N group unit-stride and
    ``IN_KERNEL_RUN_SLIVERS`` slivers long (a sliver inside one of its runs is rows at K's
    stride; one that crosses a run is packed alone, by a call of its own)."""
    return (con.guarded != "b" and con.b.dtype is con.dtype and bool(con.n) and con.n[-1].b == 1
            and con.n[-1].extent >= IN_KERNEL_RUN_SLIVERS * nr and con.linear_stride("k", "b") is not None)


def _small_ok(con: Contraction, target: Target, kc: int, s: int) -> bool:
    """Operands read in place when a K block of both (``(M + N) x kc``) already sits in half of
    L2: each packed element would be reused too few times to pay for its copy."""
    _, M, N, K = con.sizes
    return (M + N) * kc * s <= target.l2 // 2 and _small_layout_ok(con)


def _small_layout_ok(con: Contraction) -> bool:
    """Both operands can be read in place: unguarded (a guarded operand is only read by
    packing), of the contraction's type, one variable per role, B's N unit-stride."""
    if con.guards or con.a.dtype is not con.dtype or con.b.dtype is not con.dtype:
        return False
    single = all(len(getattr(con, r)) <= 1 for r in ("m", "n", "k"))
    unit = bool(con.n) and con.n[0].b == 1 and con.n[0].c == 1
    return single and unit and bool(con.k)


def cell_cost(con: Contraction, path: str, mr: int, nr: int, nc: int, lanes: int, grid, threads: int,
              cost: CostModel = DEFAULT_COST_MODEL, b_in_kernel: bool = False):
    """Estimated cycles of the slowest thread for a thread grid (the cost model of :func:`plan`,
    the target's ``cost``); ``grid`` (tb, tm, tn, tk), or an array of such rows (then an array
    of their estimates, as floats: no product overflows, each within a few ulps of the one grid's).
    ``b_in_kernel``: the packed path's kernel reads B in place and packs it as it goes (``read``
    per element, not ``pack``) unless the grid splits K."""
    batch, M, N, K = con.sizes
    tb, tm, tn, tk = grid.T.astype(np.float64) if isinstance(grid, np.ndarray) else grid
    cells = tb * tm * tn * tk
    rounds = -(-cells // threads)
    bp = -(-batch // tb)
    mp = -(-(-(-M // mr)) // tm) * mr
    np_ = -(-(-(-N // nr)) // tn) * nr
    kp = -(-K // tk)
    compute = bp * mp * np_ * kp / lanes / cost.fma_pipes
    pack = 0.0
    if path == "packed":
        b_cost = _where(b_in_kernel and tk == 1, cost.read, cost.pack)
        pack = bp * (mp * kp * -(-np_ // nc) * cost.pack + kp * np_ * b_cost)
    elif path == "stream":  # B's block packed; A read in place by every cell that needs it
        pack = bp * kp * (np_ * cost.pack + mp * cost.read)
    if path == "direct":  # each batch index a cell starts: its A values, tap tables, padded rows
        pack = bp * cost.direct_batch
    combine = _where(tk > 1, batch * M * N * tk / threads * cost.combine, 0.0)
    spawn = _where(cells > 1, cost.spawn, 0.0)
    return rounds * (compute + pack) + combine + spawn


def _where(condition, yes, no):
    """``yes if condition else no``; elementwise where ``condition`` is an array (of grids)."""
    return np.where(condition, yes, no) if isinstance(condition, np.ndarray) else (yes if condition else no)


# candidate grids from which the vectorised estimates (one array pass) first keep those near
# the least, which alone are then weighed one by one (a convolution at a hundred-odd threads
# has some two thousand)
GRID_SCAN_MIN = 32
# candidate grids in one array at most: more (a thread count far beyond a machine's cores) are
# weighed array by array, and not cached
GRID_BLOCK_ROWS = 1 << 14


def _grid(con, path, mr, nr, kc, mc, nc, lanes, threads, cost, b_in_kernel: bool = False) -> tuple[int, int, int, int]:
    if threads <= 1:
        return (1, 1, 1, 1)  # (the only grid of one cell: a chain's block, a one-thread call)
    batch, M, N, K = con.sizes
    limits = (batch, -(-M // mr), -(-N // nr), max(1, K // (2 * kc)) if path == "packed" else 1)
    near = []
    for grids in _grid_blocks(tuple([min(limit, threads) for limit in limits]), threads):
        if len(grids) >= GRID_SCAN_MIN:
            # (exact: the kept grids are those whose estimate, rounded to 6 places as below, could
            # tie the block's least; the array's arithmetic differs from Python's by a few ulps)
            estimates = cell_cost(con, path, mr, nr, nc, lanes, grids, threads, cost, b_in_kernel)
            least = float(estimates.min())
            grids = grids[estimates <= least + max(1e-6, 1e-9 * abs(least))]
        near.extend(map(tuple, grids.tolist()))
    best = None
    for grid in near:
        estimate = cell_cost(con, path, mr, nr, nc, lanes, grid, threads, cost, b_in_kernel)
        # ties: no split K, then more cells (the same slowest cell, less work for the others and
        # for a descheduled thread), then split N before M (each thread packs its own B)
        key = (round(estimate, 6), grid[3], -math.prod(grid), grid[1])
        if best is None or key < best[0]:
            best = (key, grid)
    return best[1]


def _grid_blocks(limits: tuple[int, ...], threads: int):
    """Every grid (one count per limit, at least 1, at most the limit) of at most ``threads``
    cells, in lexicographic order (the first of equal estimates wins), in arrays of one grid
    per row: one (:func:`_grids`), or, when there are more than :data:`GRID_BLOCK_ROWS`, one or
    more per value of the first count (the rest split the same way)."""
    grids = _grids(limits, threads)
    if grids is not None:
        yield grids
        return
    for t in range(1, min(limits[0], threads) + 1):
        for block in _grid_blocks(limits[1:], threads // t):
            yield np.column_stack((np.full(len(block), t, np.int64), block))


@functools.lru_cache(maxsize=32)
def _grids(limits: tuple[int, ...], threads: int) -> Optional[np.ndarray]:
    """:func:`_grid_blocks`' grids in one read-only array, or None when there are more than
    :data:`GRID_BLOCK_ROWS` (built a count at a time: each row with each count its cells left allow)."""
    rows, left = np.zeros((1, 0), np.int64), np.array([max(1, threads)], np.int64)
    for limit in limits:
        counts = np.minimum(limit, left)
        total = int(counts.sum())
        if total > GRID_BLOCK_ROWS:
            return None
        which = np.repeat(np.arange(len(rows)), counts)
        t = np.arange(1, total + 1) - np.repeat(np.cumsum(counts) - counts, counts)
        rows, left = np.column_stack((rows[which], t)), left[which] // t
    rows.flags.writeable = False
    return rows
