"""Convolutions whose output tiles fill no micro-tile: a few pixels per image (a 7x7 layer, 5x5
outputs unpadded) against tiles of 16 to 64 columns, so that most tiles are partial or cross
from one image row or batch index to the next, stored as the stretches of columns that are
contiguous in the output; with and without an epilogue, on every runnable preset and 1, 2 or
7 threads, against the reference evaluator."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tcpy
from tcpy.target import Target
from tcpy.transform.contraction import micro_tile, plan, register_tiles
from test_contraction import RUNNABLE, recognized

UNPADDED = """
def conv(float(N,C,H,W) I, float(F,C,3,3) Wt) -> (O) {
    O(n, f, h, w) +=! I(n, c, h + kh, w + kw) * Wt(f, c, kh, kw) where kh in 0:3, kw in 0:3
}
"""

# padded by a guarded read, a bias and ReLU fused into the engine's stores
PADDED_RELU = """
def conv(float(N,C,H,W) I, float(F,C,3,3) Wt, float(F) bias) -> (O, Y) {
    O(n, f, h, w) +=! (h + kh >= 1 && h + kh <= H && w + kw >= 1 && w + kw <= W)
                      ? I(n, c, h + kh - 1, w + kw - 1) * Wt(f, c, kh, kw) : 0.0
        where h in 0:H, w in 0:W, kh in 0:3, kw in 0:3
    Y(n, f, h, w) = max(O(n, f, h, w) + bias(f), 0.0)
}
"""


def test_narrow_outputs_take_the_tile_that_computes_fewest_columns():
    """25 output pixels fill 32 columns of an 8x32 tile and 48 of an 8x48 one (which ran 1.45x
    slower on AMD Zen 5); 200 (8 images of 5x5) fill 224 and 240."""
    v4 = Target.preset("x86-64-v4")
    assert micro_tile(v4, 4, 25) == (8, 2) and micro_tile(v4, 4, 200) == (8, 2)
    con = recognized(UNPADDED, (8, 512, 7, 7), (512, 512, 3, 3))
    chosen = plan(con, v4, 1)
    assert (chosen.path, chosen.mr, chosen.nr) == ("stream", 8, 32)


@st.composite
def cases(draw):
    target = draw(st.sampled_from(RUNNABLE))
    t = Target.preset(target) if target != "host" else Target.host()
    tiles = sorted((mr, nv) for nv, mr in register_tiles(t).items())
    mr_max, nv = draw(st.sampled_from(tiles))
    return dict(target=target, threads=draw(st.sampled_from([1, 2, 7])),
                path=draw(st.sampled_from(["stream", "packed"])), mr=draw(st.integers(1, mr_max)),
                nr=nv * t.lanes(4), n=draw(st.integers(1, 3)), c=draw(st.integers(1, 6)),
                f=draw(st.integers(1, 19)), h=draw(st.integers(3, 8)), w=draw(st.integers(3, 8)),
                padded=draw(st.booleans()), seed=draw(st.integers(0, 2**16)))


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_partial_tiles_match_the_reference(case):
    rng = np.random.default_rng(case["seed"])
    I = rng.standard_normal((case["n"], case["c"], case["h"], case["w"]), dtype=np.float32)
    Wt = rng.standard_normal((case["f"], case["c"], 3, 3), dtype=np.float32)
    args = (I, Wt, rng.standard_normal(case["f"], dtype=np.float32)) if case["padded"] else (I, Wt)
    source = PADDED_RELU if case["padded"] else UNPADDED
    options = tcpy.Options(target=case["target"], num_threads=case["threads"], specialize="always",
                           plan={"path": case["path"], "mr": case["mr"], "nr": case["nr"]})
    kernel = tcpy.define(source, options=options)
    assert f"{case['path']} path" in str(kernel.explain(*args))
    got, want = kernel(*args), tcpy.define(source, backend="reference")(*args)
    for g, r in zip(got if case["padded"] else (got,), want if case["padded"] else (want,)):
        assert g.shape == r.shape and g.dtype == np.float32
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("target", RUNNABLE)
def test_the_512_channel_7x7_layer_matches_the_reference(target):
    """ResNet's last 3x3 layer (scaled down in channels, not in pixels) on its default plan:
    2 images of 7x7, unpadded (5x5 outputs) and padded, 2 threads."""
    rng = np.random.default_rng(1)
    I = rng.standard_normal((2, 64, 7, 7), dtype=np.float32)
    Wt = rng.standard_normal((96, 64, 3, 3), dtype=np.float32)
    bias = rng.standard_normal(96, dtype=np.float32)
    options = tcpy.Options(target=target, num_threads=2, specialize="always")
    for source, args in ((UNPADDED, (I, Wt)), (PADDED_RELU, (I, Wt, bias))):
        got = tcpy.define(source, options=options)(*args)
        want = tcpy.define(source, backend="reference")(*args)
        for g, r in zip(got if len(args) == 3 else (got,), want if len(args) == 3 else (want,)):
            np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4)
