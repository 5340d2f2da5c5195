"""Every machine fact the compiler uses: ISA, vector registers, caches, cores, compiler flags.

A :class:`Target` is what a kernel is built for. ``Target.host()`` describes this machine
(detected once per process, with no subprocess): the microarchitecture and its ISA features from
archspec (Spack's microarchitecture database), cache sizes from sysfs, the cores from this
process's CPU affinity. Named presets describe ISA levels, so one machine can build and test for
another it can execute (``x86-64-v3`` on an AVX-512 CPU):

=============  ==========================  ==========================
preset         ISA                         vector registers
=============  ==========================  ==========================
``x86-64``     SSE2                        16 x 16 bytes
``x86-64-v3``  AVX2 + FMA                  16 x 32 bytes
``x86-64-v4``  AVX-512 (F, BW, DQ, VL)     32 x 64 bytes
``aarch64``    NEON (ASIMD) + FMA          32 x 16 bytes
=============  ==========================  ==========================

No other module holds an ISA number: schedules read ``vector_bytes``, ``vector_registers`` and
the cache sizes from the Target they are given. ``TCPY_TARGET`` (a preset name, or ``host``)
and ``Options(target=...)`` choose one; the default is the host.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import archspec.cpu

from .errors import TCArgumentError

KIB = 1024
MIB = 1024 * KIB


@dataclass(frozen=True)
class CostModel:
    """The contraction planner's measured constants, in cycles (its unit: one vector FMA on one
    of ``fma_pipes`` pipes). Measured on the generated kernels on one AMD Zen 3 (AVX2, two FMA
    pipes); an ISA family measured on a machine of its own (:data:`COST_MODELS`) replaces the
    fields it measured (``benchmarks/calibrate.py`` measures the Winograd ones)."""

    fma_pipes: int = 2  # vector FMAs issued per cycle (Target has no port count)
    loads: float = 2.0  # loads issued per cycle (a broadcast or a vector from L1)
    pack: float = 0.5  # per packed element (one load, one store, no reuse)
    pack_far: float = 1.0  # the same when the operand does not fit in L2 (its loads come from L3)
    # per element of a convolution's window gathered into packed B (image rows that do not line
    # up with the slivers; on AMD Zen 5 the gather kept a 64-channel 3x3 layer at 60-75% of peak),
    # times the window's stride along a row (at stride 2, 128 channels ran 20-40% below the
    # direct convolution)
    pack_window: float = 1.0
    read: float = 0.25  # per element a cell reads in place from beyond L2 (memory bandwidth)
    combine: float = 2.0  # per element and partial of a split-K combination (written, then read)
    spawn: float = 10000.0  # to wake and join an OpenMP team whose threads sleep (a few us)
    # per batch index a direct-path cell starts (a depthwise 3x3 layer of 56x56 images split by
    # rows at two threads, each cell starting every channel instead of half of them, ran 40 us
    # slower: ~1000 cycles per channel)
    direct_batch: float = 1000.0
    # per tap of a direct-convolution tile besides its FMAs and loads (the tap's image offset,
    # the loop)
    direct_conv_tap: float = 1.0
    # per weight vector, tap and row of the direct convolution: the row's first tile takes the
    # weights from L2 (on AMD Zen 5, rows of one 14-pixel tile with 256 channels ran ~10% below
    # the implicit GEMM, rows of four tiles 10-40% above it)
    direct_conv_row: float = 2.0
    # per output element of the direct convolution whose channels are not contiguous in the
    # output (NCHW): gathered from the register tile's buffer, one scalar at a time
    direct_conv_store: float = 1.0
    # the implicit GEMM must cost this much more for the direct convolution to replace it (closer
    # estimates are within the models' error: the GEMM's plans are the better measured)
    direct_conv_gain_min: float = 1.05
    # Winograd's transforms (scalar C: loads, additions, stores): per tile and input channel, per
    # tile and output channel, per pair of channels (the weights')
    winograd_input: float = 16.0
    winograd_output: float = 12.0
    winograd_weights: float = 20.0
    # per call: the phase before the blocks (the operands' scan, the weights' transform, a
    # barrier), which a convolution of a few channels on a small image does not win back
    # (4600-5900 measured on AMD Zen 5, AVX2 and AVX-512 kernels)
    winograd_call: float = 5000.0
    # the direct GEMM must cost this much more for Winograd to be chosen (the estimate ran 0-20%
    # above the measured gains: 1.23 estimated, 1.15 measured for a ResNet layer of 14x14 images)
    winograd_gain_min: float = 1.2
    # F(4x4, 3x3)'s transforms, as the three above (per tile of 4x4 outputs); None: F(2x2)'s
    # scaled by the transforms' operation counts (tcpy.winograd_matrices.operation_counts)
    winograd_f4_input: Optional[float] = None
    winograd_f4_output: Optional[float] = None
    winograd_f4_weights: Optional[float] = None
    # F(2x2, 3x3) must cost this much more for F(4x4, 3x3) to be chosen (its constants are
    # scaled, not measured, and its float32 rounding is larger; on AMD Zen 5 with AVX-512, busy
    # host, one thread: 64 channels 56x56 estimated 1.27x, ran 1.1-1.15x faster (1.17x at N=8);
    # 128 channels 28x28, N=8 1.38x, ran 1.3-1.5x; N=1 1.15x, ran 1.07x; 256 channels 14x14:
    # the same time at N=1, estimated 1.18x at N=8, unmeasured)
    winograd_f4_gain_min: float = 1.25


#: The cost model of targets measured on no machine of their own (see :class:`CostModel`).
DEFAULT_COST_MODEL = CostModel()
#: Cost models measured per ISA family (:attr:`Target.isa_family`): the vector width and
#: instructions set the transforms' and kernels' speed more than the CPU's name does.
COST_MODELS: dict[str, CostModel] = {
    # Winograd's transforms and gain threshold (benchmarks/calibrate.py) measured on one AMD EPYC
    # Zen 5 (2 vCPUs, a busy host): its AVX-512 kernels, and AVX2 kernels (x86-64-v3) on the same
    # CPU. The weights' constant rests on the layers with the fewest tiles and varied 13-26
    # between runs; the gain threshold came out 1.0 in five runs of six (once 1.15 on AVX2).
    "AVX-512": dataclasses.replace(DEFAULT_COST_MODEL, winograd_input=18.1, winograd_output=7.8,
                                   winograd_weights=18.5, winograd_call=5900.0, winograd_gain_min=1.0),
    "AVX2": dataclasses.replace(DEFAULT_COST_MODEL, winograd_input=17.0, winograd_output=5.4,
                                winograd_weights=26.1, winograd_call=4600.0, winograd_gain_min=1.0),
}


def cost_model(target: "Target") -> CostModel:
    """The planner's constants for ``target``: its ISA family's if measured, else the default."""
    return COST_MODELS.get(target.isa_family, DEFAULT_COST_MODEL)


@dataclass(frozen=True)
class Target:
    """A machine to generate and compile kernels for.

    ``name``: a preset name or the host's microarchitecture (``zen3``, ``icelake``).
    ``arch``: ``x86_64`` or ``aarch64``. ``features``: ISA feature names (as in
    ``/proc/cpuinfo``). ``archspec_name``: the archspec microarchitecture whose compiler flags
    build for it. ``vector_bytes`` / ``vector_registers``: the SIMD register file.
    ``fma``: fused multiply-add. ``l1d``, ``l2``: per-core data caches in bytes, ``l1d_ways``
    the L1's associativity; ``l3``: the last-level cache one core shares with ``l3_sharing``
    cores. ``cores``: CPUs this process may run on (the default thread count). ``cache_line``:
    bytes of a cache line (the unit packing prefetches and per-thread buffers are aligned to).
    """

    name: str
    arch: str
    features: frozenset
    archspec_name: str
    vector_bytes: int
    vector_registers: int
    fma: bool
    l1d: int
    l2: int
    l3: int
    l3_sharing: int
    cores: int
    l1d_ways: int = 8
    cache_line: int = 64

    # -- construction ------------------------------------------------------------------------

    @staticmethod
    def host() -> "Target":
        """This machine, detected once per process."""
        return _host()

    @staticmethod
    def preset(name: str) -> "Target":
        """A named ISA level: ``x86-64``, ``x86-64-v3``, ``x86-64-v4`` or ``aarch64``
        (``host`` gives :meth:`host`). Caches are conservative values for that generation; the
        core count is this process's."""
        if name == "host":
            return _host()
        try:
            return _preset(name)
        except KeyError:
            raise TCArgumentError(
                f"unknown target {name!r}; expected 'host' or one of {', '.join(PRESETS)}") from None

    @staticmethod
    def resolve(target: Union[None, str, "Target"]) -> "Target":
        """``None`` -> ``$TCPY_TARGET`` or the host; a name -> its preset; a Target -> itself."""
        if isinstance(target, Target):
            return target
        if target is None:
            target = os.environ.get("TCPY_TARGET", "").strip() or "host"
        if not isinstance(target, str):
            raise TCArgumentError(f"target must be a Target or a preset name, got {type(target).__name__}")
        return Target.preset(target)

    def with_cores(self, cores: int) -> "Target":
        """The same machine with another core count (for simulating large machines)."""
        return dataclasses.replace(self, cores=cores)

    # -- derived facts -----------------------------------------------------------------------

    def lanes(self, element_bytes: int) -> int:
        """Elements of ``element_bytes`` in one vector register."""
        return max(1, self.vector_bytes // max(1, element_bytes))

    @property
    def l3_per_core(self) -> int:
        """The share of the last-level cache one core can count on when all are busy."""
        return self.l3 // max(1, self.l3_sharing)

    def can_run_here(self) -> bool:
        """Whether this machine executes code built for this target."""
        return _runs_on_host(self)

    def compiler_flags(self, compiler: str = "gcc", version: Optional[str] = None) -> tuple[str, ...]:
        """Flags that make ``compiler`` (of ``version``) build for this target."""
        micro = archspec.cpu.TARGETS[self.archspec_name]
        flags: tuple[str, ...] = ()
        if version:
            try:
                flags = tuple(micro.optimization_flags(compiler, version).split())
            except (archspec.cpu.UnsupportedMicroarchitecture, ValueError):
                flags = ()
        if not flags:  # unknown compiler or version: the generic flags of the ISA level
            flags = _GENERIC_FLAGS.get(self.archspec_name) or _GENERIC_FLAGS[self.arch]
        if self.arch == "x86_64" and self.vector_bytes >= 64:
            # gcc's tuning for AVX-512 machines prefers 256-bit vectors; our blocks use 512
            flags += ("-mprefer-vector-width=512",)
        if self.arch == "x86_64":
            # gcc may move 64-bit values through MMX registers (movq2dq) and never clear them
            # (emms): every x87 operation after the kernel, numpy's long double included, is NaN
            flags += ("-mno-mmx",)
        return flags

    @property
    def isa_family(self) -> str:
        """``AVX-512``, ``AVX2``, ``SSE2`` or ``NEON``: the vector instructions the kernels use,
        from the vector width and features (whatever the name: a host or a preset)."""
        if self.arch == "aarch64":
            return "NEON"
        if self.vector_bytes >= 64 and "avx512f" in self.features:
            return "AVX-512"
        return "AVX2" if self.vector_bytes >= 32 and "avx2" in self.features else "SSE2"

    @property
    def cost(self) -> CostModel:
        """The contraction planner's cost model for this target (:func:`cost_model`)."""
        return cost_model(self)

    def key(self) -> str:
        """What the generated code and its build depend on: for cache keys and tuning records."""
        return (f"{self.name}|{self.arch}|{self.archspec_name}|{','.join(sorted(self.features))}|"
                f"v{self.vector_bytes}x{self.vector_registers}|fma{int(self.fma)}|"
                f"c{self.l1d}/{self.l1d_ways},{self.l2},{self.l3},{self.l3_sharing}|line{self.cache_line}")

    def describe(self) -> str:
        """One line for ``explain()`` and the header of generated C."""
        return (f"{self.name} ({self.arch}, {self.isa_family}, {self.vector_registers} x {self.vector_bytes}-byte "
                f"vector registers{', FMA' if self.fma else ''}; L1d {_size(self.l1d)} {self.l1d_ways}-way, "
                f"L2 {_size(self.l2)}, L3 {_size(self.l3)}; {self.cores} cores)")

    def __repr__(self) -> str:
        return f"<tcpy.Target {self.describe()}>"


# ----------------------------------------------------------------------------- presets

_X86_BASE = frozenset({"mmx", "sse", "sse2"})
_X86_V2 = _X86_BASE | {"cx16", "lahf_lm", "popcnt", "sse3", "ssse3", "sse4_1", "sse4_2"}
_X86_V3 = _X86_V2 | {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"}
_X86_V4 = _X86_V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}

# name: (arch, archspec name, features, vector bytes, vector registers, fma, l1d, l2, l3 per core);
# every preset's L1 is 8-way and its lines 64 bytes, the fields' defaults
_PRESETS = {
    "x86-64": ("x86_64", "x86_64", _X86_BASE, 16, 16, False, 32 * KIB, 256 * KIB, 2 * MIB),
    "x86-64-v3": ("x86_64", "x86_64_v3", _X86_V3, 32, 16, True, 32 * KIB, 512 * KIB, 2 * MIB),
    "x86-64-v4": ("x86_64", "x86_64_v4", _X86_V4, 64, 32, True, 32 * KIB, 1 * MIB, 2 * MIB),
    "aarch64": ("aarch64", "aarch64", frozenset({"fp", "asimd"}), 16, 32, True, 64 * KIB, 1 * MIB, 2 * MIB),
}
PRESETS = tuple(_PRESETS)

# Flags for an ISA level when archspec has none for the compiler at hand.
_GENERIC_FLAGS = {
    "x86_64": ("-march=x86-64", "-mtune=generic"),
    "x86_64_v2": ("-march=x86-64-v2", "-mtune=generic"),
    "x86_64_v3": ("-march=x86-64-v3", "-mtune=generic"),
    "x86_64_v4": ("-march=x86-64-v4", "-mtune=generic"),
    "aarch64": ("-march=armv8-a",),
}


@functools.lru_cache(maxsize=None)
def _preset(name: str) -> Target:
    arch, micro, features, vbytes, vregs, fma, l1d, l2, l3 = _PRESETS[name]
    return Target(name, arch, frozenset(features), micro, vbytes, vregs, fma, l1d, l2, l3, 1,
                  available_cpus())


@functools.lru_cache(maxsize=64)  # (asked at every new call shape: archspec's comparison is slow)
def _runs_on_host(target: Target) -> bool:
    host = _host()
    if host.arch != target.arch:
        return False
    return archspec.cpu.TARGETS[host.archspec_name] >= archspec.cpu.TARGETS[target.archspec_name]


@functools.lru_cache(maxsize=None)
def _host() -> Target:
    micro = archspec.cpu.host()
    arch = micro.family.name if micro.family is not None else platform.machine()
    features = frozenset(micro.features) | frozenset(_cpuinfo_flags())
    if arch == "x86_64" and "avx512f" in features:
        vbytes, vregs = 64, 32
    elif arch == "x86_64" and "avx2" in features:
        vbytes, vregs = 32, 16
    elif arch == "x86_64":
        vbytes, vregs = 16, 16
    else:  # aarch64 (NEON): SVE lengths vary per machine, NEON is always 128 bits
        vbytes, vregs = 16, 32
    fma = "fma" in features or arch == "aarch64"
    fallback = _PRESETS["x86-64-v3" if arch == "x86_64" else "aarch64"]
    caches = _sysfs_caches()
    l1d, l2, (l3, sharing) = (caches.get(1, (fallback[6], 1))[0], caches.get(2, (fallback[7], 1))[0],
                              caches.get(3, (fallback[8], 1)))
    ways, line = _sysfs_l1d_geometry()
    return Target(micro.name, arch, features, micro.name, vbytes, vregs, fma, l1d, l2, l3,
                  max(1, sharing), available_cpus(), ways or 8, line or 64)


def available_cpus() -> int:
    """CPUs this process can get: those its affinity allows, fewer under a cgroup CPU quota
    (a container limited to 2 CPUs on a 64-core host gets 2: more threads than that would
    wait for each other's time slices)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return cpus
    if quota.isdigit() and period.isdigit() and int(period) > 0:
        cpus = min(cpus, max(1, -(-int(quota) // int(period))))
    return cpus


def _cpuinfo_flags() -> list[str]:
    """Feature flags of the first processor in /proc/cpuinfo (archspec keeps only those its
    database knows; AVX-512 subsets matter to us)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return value.split()
    except OSError:
        pass
    return []


def _sysfs_caches(root: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> dict[int, tuple[int, int]]:
    """{level: (bytes, CPUs sharing it)} of cpu0's data and unified caches, from sysfs."""
    found: dict[int, tuple[int, int]] = {}
    try:
        entries = sorted(root.glob("index*"))
    except OSError:
        return found
    for entry in entries:
        try:
            if (entry / "type").read_text().strip() == "Instruction":
                continue
            level = int((entry / "level").read_text())
            size = _parse_size((entry / "size").read_text().strip())
            sharing = _count_cpus((entry / "shared_cpu_list").read_text().strip())
        except (OSError, ValueError):
            continue
        if size > 0:
            found[level] = (size, sharing)
    return found


def _sysfs_l1d_geometry(root: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> tuple[int, int]:
    """(associativity, line bytes) of cpu0's level-1 data cache (0 for what sysfs does not say)."""
    for entry in sorted(root.glob("index*")) if root.is_dir() else ():
        try:
            if (entry / "level").read_text().strip() == "1" and (entry / "type").read_text().strip() == "Data":
                return _sysfs_int(entry / "ways_of_associativity"), _sysfs_int(entry / "coherency_line_size")
        except OSError:
            return 0, 0
    return 0, 0


def _sysfs_int(path: Path) -> int:
    """The integer in a sysfs file, 0 when it is missing or not one."""
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return 0


def _parse_size(text: str) -> int:
    """``32K`` / ``1024K`` / ``32M`` -> bytes."""
    units = {"K": KIB, "M": MIB, "G": 1024 * MIB}
    if text and text[-1].upper() in units:
        return int(text[:-1]) * units[text[-1].upper()]
    return int(text)


def _count_cpus(cpu_list: str) -> int:
    """``0-3,8`` -> 5."""
    count = 0
    for part in filter(None, cpu_list.split(",")):
        lo, _, hi = part.partition("-")
        count += int(hi or lo) - int(lo) + 1
    return max(1, count)


def _size(n: int) -> str:
    return f"{n // MIB} MiB" if n >= MIB and n % MIB == 0 else f"{n // KIB} KiB"
