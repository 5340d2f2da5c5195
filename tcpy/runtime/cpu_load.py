"""How many of this process's CPUs other processes leave free, from ``/proc/stat``.

A parallel kernel that runs more threads than the cores it can actually get loses a whole
scheduler time slice whenever one of its threads is descheduled (every thread waits for the
last at the region's end). The launcher therefore runs a parallel call with no more threads
than the CPUs other processes leave free.

The estimate: over the time since the previous sample, the busy time of the CPUs this process
may run on (``/proc/stat``: everything but idle and iowait, steal included, since a vCPU the
hypervisor lends away is not ours either) minus the CPU time of this process and of the children
it waited for (a compiler the first call ran), in cores. A child's time is known only once it has
been waited for, all of it at once, while it ran over earlier windows too (a kernel compiled in the
background while calls went on): a window counts at most its own length of it, as if the child
had run through this window alone, so the end of a long compile does not hide other processes'
work. Sampling costs one read of
``/proc/stat`` (microseconds); the launcher samples at most every :data:`SAMPLE_INTERVAL_S`, and
only for parallel calls.

``TCPY_WATCH_LOAD=0`` turns the estimate off (every CPU the process may use counts as free). So
does a system without ``/proc/stat``.
"""
from __future__ import annotations

import os
from typing import Callable, Optional

SAMPLE_INTERVAL_S = 0.1  # a window of ~10 clock ticks a CPU: a tenth of a core is visible
MIN_WINDOW_TICKS = 5  # a shorter window (in ticks a CPU) keeps the previous estimate
_IDLE_FIELDS = (3, 4)  # idle, iowait among "cpuN user nice system idle iowait irq softirq steal ..."
_ACCOUNTED_FIELDS = 8  # user .. steal: guest time is already inside user


def ticks_per_second() -> int:
    """The unit of ``/proc/stat`` (USER_HZ), 100 where the system does not say."""
    try:
        return int(os.sysconf("SC_CLK_TCK"))
    except (AttributeError, ValueError, OSError):
        return 100


def read_proc_stat(path: str = "/proc/stat") -> Optional[dict[int, tuple[int, int]]]:
    """``{cpu: (busy ticks, all ticks)}`` since boot per CPU line of ``/proc/stat``, or None
    when it cannot be read or parsed."""
    try:
        with open(path, "rb") as f:
            text = f.read()
    except OSError:
        return None
    counts = {}
    for line in text.split(b"\n"):
        if not line.startswith(b"cpu") or line.startswith(b"cpu "):
            continue
        fields = line.split()
        try:
            cpu = int(fields[0][3:])
            ticks = [int(v) for v in fields[1:1 + _ACCOUNTED_FIELDS]]
        except ValueError:
            return None
        total = sum(ticks)
        counts[cpu] = (total - sum(ticks[i] for i in _IDLE_FIELDS if i < len(ticks)), total)
    return counts or None


def own_cpu_seconds() -> float:
    """CPU time of this process's threads."""
    t = os.times()
    return t.user + t.system


def children_cpu_seconds() -> float:
    """CPU time of the children this process has waited for."""
    t = os.times()
    return t.children_user + t.children_system


class FreeCpus:
    """Samples of the CPUs other processes leave free, among ``allowed`` (the CPU numbers this
    process may run on; None: every CPU ``/proc/stat`` lists).

    ``read_stat``, ``own_seconds`` and ``children_seconds`` are the sources
    (:func:`read_proc_stat`, :func:`own_cpu_seconds`, :func:`children_cpu_seconds`); tests pass
    their own. The first sample only sets the baseline.
    """

    def __init__(self, allowed: Optional[frozenset[int]] = None,
                 read_stat: Callable[[], Optional[dict[int, tuple[int, int]]]] = read_proc_stat,
                 own_seconds: Callable[[], float] = own_cpu_seconds,
                 children_seconds: Callable[[], float] = children_cpu_seconds,
                 hz: Optional[int] = None):
        self.allowed = allowed
        self.read_stat = read_stat
        self.own_seconds = own_seconds
        self.children_seconds = children_seconds
        self.hz = hz or ticks_per_second()
        # cpus, busy ticks, total ticks; own s, children s
        self._last: Optional[tuple[int, int, int, float, float]] = None

    def sample(self) -> Optional[int]:
        """CPUs free of other processes' work over the window since the previous sample (at
        least 1), or None: no estimate (no ``/proc/stat``, first sample, window too short)."""
        counts = self.read_stat()
        if counts is None:
            return None
        mine = [v for cpu, v in counts.items() if self.allowed is None or cpu in self.allowed]
        if not mine:
            return None
        now = (len(mine), sum(b for b, _ in mine), sum(t for _, t in mine), self.own_seconds(),
               self.children_seconds())
        last, self._last = self._last, now
        if last is None or last[0] != now[0]:
            return None
        window = (now[2] - last[2]) / now[0]  # ticks of one CPU
        if window < MIN_WINDOW_TICKS:
            self._last = last  # keep the baseline: the window grows until it says something
            return None
        own = (now[3] - last[3]) * self.hz + min((now[4] - last[4]) * self.hz, window)
        others = min(max((now[1] - last[1] - own) / window, 0.0), now[0])
        return max(1, int(now[0] - others + 0.5))


def watching_enabled() -> bool:
    """``TCPY_WATCH_LOAD`` is unset or not ``0``."""
    return os.environ.get("TCPY_WATCH_LOAD", "1").strip() != "0"


def allowed_cpus() -> Optional[frozenset[int]]:
    """The CPU numbers this process may run on, None where the system does not say."""
    try:
        return frozenset(os.sched_getaffinity(0))
    except AttributeError:
        return None
