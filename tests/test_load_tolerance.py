"""Load-tolerant parallelism: work items claimed dynamically, results that do not depend on which
thread ran what or on how many threads ran, concurrent calls that share the CPUs, no more
threads than the CPUs other processes leave free, and the OpenMP wait policy tcpy loads by
default."""
import os
import re
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tcpy
from tcpy import demo
from tcpy.runtime.cpu_load import FreeCpus, read_proc_stat
from tcpy.runtime.launch import peak_threads_in_use
from tcpy.target import available_cpus

from test_chain import RUNNABLE
from test_conv import PADDED
from tcpy.demo import SOFTMAX

PRESETS = [name for name in RUNNABLE if name != "host"]
ROW_SUMS = "def rows(float(M,K) A) -> (y) { y(m) +=! A(m, k) }"


def _random(rng, shape, dtype=np.float32):
    return rng.uniform(-1, 1, shape).astype(dtype)


@st.composite
def cases(draw):
    """(source, args, extra options): a kernel of each parallel form with small random sizes:
    the engine's cell grid (split K too), a fused chain, a fused row group, a padded
    convolution (Winograd where it pays), a reduction split into parts."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kind = draw(st.sampled_from(["gemm", "long_k", "attention", "softmax", "conv", "rows"]))
    size = lambda lo, hi: draw(st.integers(lo, hi))  # noqa: E731
    if kind == "gemm":
        return demo.GEMM, [_random(rng, (size(1, 130), size(1, 90))), None], {}
    if kind == "long_k":  # few outputs, a long K: split into parts combined in order
        m, k = size(1, 12), size(600, 3000)
        return demo.GEMM, [_random(rng, (m, k)), _random(rng, (k, size(1, 12)))], {}
    if kind == "attention":
        b, h, l, s, d = size(1, 2), size(1, 3), size(1, 70), size(1, 70), size(1, 24)
        return demo.ATTENTION, [_random(rng, (b, h, l, d)), _random(rng, (b, h, s, d)),
                                _random(rng, (b, h, s, d)), 0.125], {}
    if kind == "softmax":
        return SOFTMAX, [_random(rng, (size(1, 300), size(1, 300)))], {}
    if kind == "conv":
        n, c, f, hw = size(1, 2), size(1, 24), size(1, 24), size(3, 20)
        return PADDED, [_random(rng, (n, c, hw, hw)), _random(rng, (f, c, 3, 3))], {}
    return ROW_SUMS, [_random(rng, (size(1, 3), size(20_000, 60_000)))], {"contraction": False}


def _complete(source, args):
    """GEMM's B drawn to match A's K."""
    if args[-1] is None:
        rng = np.random.default_rng(len(args))
        args = [args[0], _random(rng, (args[0].shape[1], 1 + args[0].shape[0] % 77))]
    return args


@given(case=cases(), target=st.sampled_from(PRESETS), threads=st.sampled_from([1, 2, 7]))
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_results_repeat_bitwise_and_match_the_reference(case, target, threads):
    source, args, extra = case
    args = _complete(source, args)
    kernel = tcpy.define(source, options=tcpy.Options(target=target, num_threads=threads, **extra))
    got = kernel(*args)
    want = tcpy.define(source, backend="reference")(*args)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4 * max(1.0, float(np.abs(want).max())))
    for _ in range(3):  # whichever thread claims which item: the same bits
        np.testing.assert_array_equal(kernel(*args), got)


# Plans for 7 threads run with fewer OpenMP threads than planned (OMP_THREAD_LIMIT in a child
# process; the kernels come from the shared cache): the same bits as here.
FEWER_THREADS = {
    "gemm": (demo.GEMM, [(96, 200), (200, 150)], {}),
    "split_k": (demo.GEMM, [(4, 4000), (4000, 5)], {}),
    "attention": (demo.ATTENTION, [(1, 2, 64, 16), (1, 2, 80, 16), (1, 2, 80, 16), 0.25], {}),
    "softmax": (SOFTMAX, [(130, 257)], {}),
    "conv": (PADDED, [(1, 32, 16, 16), (32, 32, 3, 3)], {}),
    "winograd": (PADDED, [(1, 64, 28, 28), (64, 64, 3, 3)], {}),
    "split_rows": (ROW_SUMS, [(2, 50_000)], {"contraction": False}),
}


def _fewer_threads_args(shapes):
    rng = np.random.default_rng(7)
    return [_random(rng, s) if isinstance(s, tuple) else s for s in shapes]


def test_fewer_threads_than_planned_give_the_same_bits(tmp_path):
    target = PRESETS[0]
    expected = {}
    for name, (source, shapes, extra) in FEWER_THREADS.items():
        kernel = tcpy.define(source, options=tcpy.Options(target=target, num_threads=7, **extra))
        expected[name] = kernel(*_fewer_threads_args(shapes))
    script = textwrap.dedent(f"""
        import sys, numpy as np, tcpy
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from test_load_tolerance import FEWER_THREADS, _fewer_threads_args
        out = {{}}
        for name, (source, shapes, extra) in FEWER_THREADS.items():
            kernel = tcpy.define(source, options=tcpy.Options(target={target!r}, num_threads=7, **extra))
            out[name] = kernel(*_fewer_threads_args(shapes))
        np.savez(sys.argv[1], **out)
    """)
    for limit in ("1", "2"):
        path = tmp_path / f"limit{limit}.npz"
        env = {**os.environ, "OMP_THREAD_LIMIT": limit}
        subprocess.run([sys.executable, "-c", script, str(path)], env=env, check=True, timeout=600)
        with np.load(path) as got:
            for name, want in expected.items():
                np.testing.assert_array_equal(got[name], want, err_msg=f"{name} with OMP_THREAD_LIMIT={limit}")


def _claims(text: str) -> list[tuple[int, int]]:
    return [(int(item), int(thread)) for item, thread in re.findall(r"tcpy-claim (\d+) (\d+)", text)]


@pytest.mark.parametrize("late", [False, True])
def test_cells_are_claimed_dynamically(capfd, late):
    """Debugging builds trace each claimed cell; when every thread but the first starts late,
    the first claims every cell (with a static split it would run only its share)."""
    flags = ("-DTCPY_TRACE_CLAIMS",) + (("-DTCPY_LATE_THREADS_US=400000",) if late else ())
    kernel = tcpy.define(demo.GEMM, options=tcpy.Options(target=PRESETS[0], num_threads=7, cflags=flags))
    rng = np.random.default_rng(3)
    A, B = _random(rng, (300, 200)), _random(rng, (200, 300))
    cells = int(re.search(r"tcpy_claim\(&next_cell, (\d+)\)", kernel.c_source(A, B)).group(1))
    assert cells >= 4  # a grid worth claiming
    capfd.readouterr()
    np.testing.assert_allclose(kernel(A, B), A @ B, rtol=1e-4, atol=1e-4)
    claims = _claims(capfd.readouterr().err)
    assert sorted(item for item, _ in claims) == list(range(cells))  # each cell once
    if late:
        assert {thread for _, thread in claims} == {0}


def test_concurrent_calls_share_the_cpus():
    """Python threads calling kernels at once get the results of a lone call, and the kernels
    never run more threads in all than the CPUs the process can get."""
    kernels = [tcpy.define(demo.GEMM), tcpy.define(SOFTMAX), tcpy.define(demo.ATTENTION)]
    rng = np.random.default_rng(5)
    args = [[_random(rng, (160, 120)), _random(rng, (120, 140))], [_random(rng, (200, 300))],
            [_random(rng, (1, 2, 96, 32)), _random(rng, (1, 2, 96, 32)), _random(rng, (1, 2, 96, 32)), 0.2]]
    alone = [k(*a) for k, a in zip(kernels, args)]
    errors = []

    def work(i):
        try:
            for _ in range(8):
                np.testing.assert_array_equal(kernels[i % 3](*args[i % 3]), alone[i % 3])
        except AssertionError as e:  # (reported by the main thread)
            errors.append(e)

    peak_threads_in_use(reset=True)
    workers = [threading.Thread(target=work, args=(i,)) for i in range(5)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not errors, errors[0]
    assert 1 <= peak_threads_in_use() <= available_cpus()


def _stat_text(cpus):
    """A /proc/stat with the given (busy, idle) ticks per CPU (busy as user time)."""
    total = [sum(b for b, _ in cpus), sum(i for _, i in cpus)]
    lines = [f"cpu  {total[0]} 0 0 {total[1]} 0 0 0 0 0 0"]
    lines += [f"cpu{n} {b} 0 0 {i} 0 0 0 0 0 0" for n, (b, i) in enumerate(cpus)]
    return "\n".join(lines + ["intr 1 2 3", "procs_running 2"]) + "\n"


def test_proc_stat_is_read_per_cpu(tmp_path):
    path = tmp_path / "stat"
    path.write_text(_stat_text([(10, 90), (55, 45)]).replace("cpu1 55 0 0 45 0", "cpu1 50 5 0 40 5"))
    assert read_proc_stat(str(path)) == {0: (10, 100), 1: (55, 100)}  # iowait is idle, nice busy
    assert read_proc_stat(str(tmp_path / "missing")) is None
    path.write_text("cpu0 1 2 x 4\n")
    assert read_proc_stat(str(path)) is None


class _FakeMachine:
    """/proc/stat and this process's CPU time, advanced by hand: each tick() gives every CPU
    `window` ticks, `others` (per CPU) of them busy with other processes, and this process
    `own` CPU-ticks in all, spread over the CPUs; `child` ticks on CPU 0 are a child process's,
    counted as this process's only when it is waited for (`wait()`)."""

    def __init__(self, n_cpus, hz=100):
        self.busy, self.total, self.own_ticks, self.hz = [0] * n_cpus, [0] * n_cpus, 0, hz
        self.child_ticks = self.waited_ticks = 0

    def tick(self, others, own=0, window=10, child=0):
        n = len(self.busy)
        for cpu in range(n):
            self.busy[cpu] += others[cpu] + own // n + (child if cpu == 0 else 0)
            self.total[cpu] += window
        self.own_ticks += own
        self.child_ticks += child

    def wait(self):
        self.waited_ticks, self.child_ticks = self.waited_ticks + self.child_ticks, 0

    def read(self):
        return {cpu: (b, t) for cpu, (b, t) in enumerate(zip(self.busy, self.total))}

    def own_seconds(self):
        return self.own_ticks / self.hz

    def children_seconds(self):
        return self.waited_ticks / self.hz

    def free_cpus(self, allowed=None):
        return FreeCpus(allowed, read_stat=self.read, own_seconds=self.own_seconds,
                        children_seconds=self.children_seconds, hz=self.hz)


def test_free_cpus_are_those_other_processes_leave():
    machine = _FakeMachine(4)
    load = machine.free_cpus()
    assert load.sample() is None  # the baseline
    machine.tick([0, 0, 0, 0], own=40)  # only this process, on every CPU
    assert load.sample() == 4
    machine.tick([10, 0, 0, 0], own=28)  # a spinner on one CPU, this process on the others
    assert load.sample() == 3
    machine.tick([10, 10, 3, 0], own=8)  # two spinners and a bit: 2.3 CPUs taken
    assert load.sample() == 2
    machine.tick([10, 10, 10, 10])  # every CPU busy elsewhere: still one thread
    assert load.sample() == 1
    machine.tick([0, 0, 0, 0], window=2)  # too short a window to say anything...
    assert load.sample() is None
    machine.tick([0, 0, 0, 0], window=8)  # ... until it has grown
    assert load.sample() == 4


def test_free_cpus_count_only_the_allowed_cpus():
    machine = _FakeMachine(4)
    load = machine.free_cpus(frozenset({2, 3}))
    load.sample()
    machine.tick([10, 10, 0, 0])  # busy CPUs this process may not use
    assert load.sample() == 2
    machine.tick([0, 0, 10, 0])
    assert load.sample() == 1
    assert FreeCpus(None, read_stat=lambda: None).sample() is None  # no /proc/stat: no estimate


def test_a_compile_waited_for_counts_as_this_process_for_its_window_only():
    """A compiler child is another process's work while it runs; once waited for, its time is
    this process's for at most the window it ends in, not for the earlier windows that already
    counted it as others' (a kernel compiled in the background while calls went on)."""
    machine = _FakeMachine(2)
    load = machine.free_cpus()
    load.sample()
    machine.tick([0, 10], child=10)  # a spinner on CPU 1, the compiler on CPU 0
    assert load.sample() == 1
    for _ in range(3):
        machine.tick([0, 10], child=10)
        assert load.sample() == 1
    machine.tick([0, 10], child=10)
    machine.wait()  # 50 ticks of the child's time arrive at once: the spinner is still seen
    assert load.sample() == 1
    machine.tick([0, 0], own=20)
    assert load.sample() == 2
    machine.tick([0, 0], child=10)  # a compile inside one window, waited for in it
    machine.wait()
    assert load.sample() == 2


_WATCHED_CALLS = textwrap.dedent("""
    import subprocess, sys, time, numpy as np, tcpy
    from tcpy import demo
    from tcpy.runtime.launch import peak_threads_in_use
    threads = int(sys.argv[1])
    # (specialised: no compile in the background while the calls are counted)
    kernel = tcpy.define(demo.GEMM, options=tcpy.Options(num_threads=threads, specialize="always"))
    A = np.ones((256, 256), np.float32)
    kernel(A, A)
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        start = time.monotonic()
        while time.monotonic() - start < 0.5:  # samples that see the spinner
            kernel(A, A)
        peak_threads_in_use(reset=True)
        for _ in range(5):
            kernel(A, A)
        print(peak_threads_in_use())
    finally:
        spinner.kill()
""")


@pytest.mark.skipif(not 2 <= available_cpus() <= 64 or read_proc_stat() is None,
                    reason="needs /proc/stat and 2 to 64 CPUs")
@pytest.mark.parametrize("watch", ["1", "0"])
def test_a_busy_cpu_is_left_to_its_process(watch):
    """With a process spinning on one CPU, a kernel that asks for every CPU runs with fewer
    threads; with TCPY_WATCH_LOAD=0 it takes every CPU."""
    cpus = available_cpus()
    env = {**os.environ, "TCPY_WATCH_LOAD": watch}
    done = subprocess.run([sys.executable, "-c", _WATCHED_CALLS, str(cpus)], env=env, check=True,
                          capture_output=True, text=True, timeout=300)
    peak = int(done.stdout.split()[-1])
    if watch == "1":
        assert 1 <= peak < cpus
    else:
        assert peak == cpus
