"""The floating-point peak of one core, measured: what no GEMM on this machine can beat.

A loop of independent vector FMAs (as many accumulators as the Target has registers to hide
the FMA latency), built with the Target's compiler flags and timed. Ratios to NumPy near this
peak cannot grow much: when OpenBLAS already runs at 90% of it, 1.3x NumPy is out of reach.

    python benchmarks/peak.py            # float32 and float64 GFLOP/s of one core
"""
from __future__ import annotations

import ctypes
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from tcpy.runtime.build import _compiler_name_version  # noqa: E402
from tcpy.target import Target  # noqa: E402

_SOURCE = """
#include <stdint.h>
typedef {T} v __attribute__((vector_size({VB})));
double fma_loop(int64_t n) {{
    v x = {{0}}, y;
    for (int i = 0; i < {VB} / (int)sizeof({T}); i++) {{ x[i] = ({T})1e-9 * i; }}
    y = x + ({T})1;
    {DECL}
    for (int64_t i = 0; i < n; i++) {{
        {BODY}
        {FENCES}
    }}
    v s = {SUM};
    double out = 0;
    for (int i = 0; i < {VB} / (int)sizeof({T}); i++) out += s[i];
    return out;
}}
"""


def fma_peak(target: Target, dtype: str = "float", seconds: float = 0.3) -> float:
    """GFLOP/s of one core doing independent vector FMAs of ``dtype`` ("float" or "double")."""
    accs = max(2, min(16, target.vector_registers - 4))  # more than the FMA latency x ports, no spills
    # An empty asm per few accumulators keeps the FMAs from being folded away; gcc allows at most
    # 30 operands per asm and counts an in-out operand twice.
    fences = " ".join('__asm__ volatile("" : ' + ", ".join(f'"+x"(c{i})' for i in range(lo, min(lo + 12, accs))) + ");"
                      for lo in range(0, accs, 12))
    src = _SOURCE.format(T=dtype, VB=target.vector_bytes,
                         DECL="v " + ", ".join(f"c{i} = x" for i in range(accs)) + ";",
                         BODY=" ".join(f"c{i} = c{i} * y + x;" for i in range(accs)),
                         FENCES=fences, SUM=" + ".join(f"c{i}" for i in range(accs)))
    with tempfile.TemporaryDirectory() as tmp:
        c, so = Path(tmp) / "peak.c", Path(tmp) / "peak.so"
        c.write_text(src)
        subprocess.run(["gcc", "-O2", "-shared", "-fPIC", *target.compiler_flags(*_compiler_name_version("gcc")), str(c), "-o", str(so)],
                       check=True)
        fn = ctypes.CDLL(str(so)).fma_loop
        fn.argtypes, fn.restype = [ctypes.c_int64], ctypes.c_double
        lanes = target.vector_bytes // (4 if dtype == "float" else 8)
        n, best = 1 << 16, float("inf")
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            t = time.perf_counter()
            fn(n)
            best = min(best, time.perf_counter() - t)
            if best < 1e-3:
                n *= 2
                best = float("inf")
        return 2.0 * accs * lanes * n / best / 1e9


def main() -> int:
    target = Target.host()
    print(f"target: {target.describe()}")
    for dtype in ("float", "double"):
        print(f"peak {dtype:<6} one core: {fma_peak(target, dtype):6.1f} GFLOP/s (independent vector FMAs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
