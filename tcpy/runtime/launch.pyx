# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""Call compiled kernels from Python with microseconds of overhead.

A :class:`Launcher` belongs to one def. It keeps a table from the call's signature (dtype and
shape of every array argument, the Python type of every number) to a :class:`LaunchEntry`
that says how to call the compiled kernel for that signature. The first call with a new
signature asks ``miss_handler(args)`` for the entry (binding, range inference, codegen and
build happen there, with every argument check); later calls only look up the table, make
inputs C-contiguous, allocate outputs and temporaries, and call the kernel with the GIL
released. Outputs above 32 MiB live in blocks that, once their arrays die, wait (two at most,
for two seconds at most) for the next output of their size: fresh pages would be zero-filled
by the OS on first touch.

Kernel ABI: ``int fn(void *const *buffers, int num_threads, int64_t *err, const volatile int
*stop)``, buffers = inputs in signature order, outputs in return order, temporaries, then the
entry's constant buffers (a size-generic kernel's size block). A
return value k > 0 raises ``TCRuntimeError(error_messages[k - 1].format(*err[0:4]))``; -1 means
the kernel saw ``*stop`` set by Ctrl-C and stopped early: Python's SIGINT handler then raises
(KeyboardInterrupt by default). A kernel that never polls may omit ``stop``.
``num_threads`` 0 lets the kernel
take OpenMP's ``omp_get_max_threads()``, which follows ``OMP_NUM_THREADS`` and threadpoolctl.

Thread count of a call, first that applies: the entry's own (``Options(num_threads=)``),
:func:`set_num_threads`, then OpenMP's (this module links the same libgomp as the kernels, so
``threadpoolctl.threadpool_limits`` reaches them). A call runs with at most the CPUs the process
can get that other processes leave free (:mod:`.cpu_load`, sampled by parallel calls) and other
running calls (from other Python threads) have not taken, and at least one: concurrent calls
share the cores instead of oversubscribing them. Kernels claim their work
items dynamically, so fewer threads than planned give the same results.
"""
import os
import threading
import warnings

import numpy as np

cimport numpy as cnp
from cpython.exc cimport PyErr_CheckSignals
from cpython.pythread cimport PyThread_get_thread_ident
from cpython.long cimport PyLong_AsSsize_t
from cpython.object cimport PyObject, Py_TYPE
from cpython.ref cimport Py_INCREF
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE, PyTuple_New, PyTuple_SET_ITEM
from libc.stdint cimport int64_t
from libc.stdlib cimport free, malloc
from posix.stdlib cimport posix_memalign
from libc.string cimport memset
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec
cimport openmp

from ..errors import TCArgumentError, TCOverflowError, TCRuntimeError, TCWarning
from ..options import MAX_THREADS
from ..target import available_cpus
from .cpu_load import SAMPLE_INTERVAL_S, FreeCpus, allowed_cpus, watching_enabled

cnp.import_array()

cdef extern from *:
    """
    #include <signal.h>
    #include <string.h>
    #include <time.h>
    /* Ctrl-C during a kernel: a SIGINT handler in front of Python's sets tcpy_sigint, which the
     * kernel polls, then calls Python's own (which makes Python raise KeyboardInterrupt once the
     * kernel has returned and the launcher calls PyErr_CheckSignals). */
    static volatile int tcpy_sigint = 0;
    static struct sigaction tcpy_chained_sigint;
    static void tcpy_on_sigint(int sig, siginfo_t *info, void *context) {
        tcpy_sigint = 1;
        if (tcpy_chained_sigint.sa_flags & SA_SIGINFO) {
            tcpy_chained_sigint.sa_sigaction(sig, info, context);
        } else if (tcpy_chained_sigint.sa_handler != SIG_DFL && tcpy_chained_sigint.sa_handler != SIG_IGN) {
            tcpy_chained_sigint.sa_handler(sig);
        }
    }
    typedef const volatile int *tcpy_stop_ptr;
    static const volatile int tcpy_never_stop = 0;
    /* The CPUs the process can get, lent to running kernel calls: a call takes those no other
     * call holds (at most what it wants), or waits while every CPU is held, so kernels called
     * from several Python threads never run more threads than CPUs. */
    #include <pthread.h>
    #include <time.h>
    static pthread_mutex_t tcpy_cpu_lock = PTHREAD_MUTEX_INITIALIZER;
    static pthread_cond_t tcpy_cpu_freed = PTHREAD_COND_INITIALIZER;
    static int tcpy_cpus = 1, tcpy_cpus_held = 0, tcpy_cpus_most = 0;
    /* The CPUs calls may hold: those the process can get, or fewer while other processes keep
     * some busy. Calls holding more than a smaller count keep them until they return. */
    static void tcpy_cpus_set(int cpus) {
        pthread_mutex_lock(&tcpy_cpu_lock);
        tcpy_cpus = cpus > 0 ? cpus : 1;
        pthread_cond_broadcast(&tcpy_cpu_freed);
        pthread_mutex_unlock(&tcpy_cpu_lock);
    }
    /* Threads for a call that wants `wanted` (0 when `stop` was set while it waited: Ctrl-C is
     * polled every 0.1 s). */
    static int tcpy_take_cpus(int wanted, const volatile int *stop) {
        int n = 0;
        pthread_mutex_lock(&tcpy_cpu_lock);
        while (tcpy_cpus_held >= tcpy_cpus && !*stop) {
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_nsec += 100000000;
            if (until.tv_nsec >= 1000000000) { until.tv_sec++; until.tv_nsec -= 1000000000; }
            pthread_cond_timedwait(&tcpy_cpu_freed, &tcpy_cpu_lock, &until);
        }
        if (tcpy_cpus_held < tcpy_cpus) {
            n = tcpy_cpus - tcpy_cpus_held;
            if (wanted < n) n = wanted > 0 ? wanted : 1;
            tcpy_cpus_held += n;
            if (tcpy_cpus_held > tcpy_cpus_most) tcpy_cpus_most = tcpy_cpus_held;
        }
        pthread_mutex_unlock(&tcpy_cpu_lock);
        return n;
    }
    static void tcpy_give_cpus(int n) {
        pthread_mutex_lock(&tcpy_cpu_lock);
        tcpy_cpus_held -= n;
        pthread_cond_broadcast(&tcpy_cpu_freed);
        pthread_mutex_unlock(&tcpy_cpu_lock);
    }
    static int tcpy_cpus_peak(int reset) {
        pthread_mutex_lock(&tcpy_cpu_lock);
        const int most = tcpy_cpus_most;
        if (reset) tcpy_cpus_most = tcpy_cpus_held;
        pthread_mutex_unlock(&tcpy_cpu_lock);
        return most;
    }
    /* The flag a kernel polls, cleared. With `watch`, our handler goes in front of the current
     * one if that is a function (Python's) and not ours already; a flag that is never set
     * without `watch`, or when SIGINT is ignored or default. Asking the OS for the handler
     * costs a system call (0.4 us on a virtual machine, a sixth of a 64^3 GEMM), so the answer
     * is kept for TCPY_SIGINT_RECHECK_S: a handler Python installs in that time lets a kernel
     * run to its end before Python handles Ctrl-C. Only the main thread watches. */
    #define TCPY_SIGINT_RECHECK_S 0.1
    static double tcpy_sigint_checked = -1e9;
    static tcpy_stop_ptr tcpy_sigint_answer;
    static tcpy_stop_ptr tcpy_stop_flag_checked(int watch);
    static tcpy_stop_ptr tcpy_stop_flag(int watch) {
        if (!watch) return &tcpy_never_stop;
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        const double t = now.tv_sec + 1e-9 * now.tv_nsec;
        if (t - tcpy_sigint_checked >= TCPY_SIGINT_RECHECK_S) {
            tcpy_sigint_answer = tcpy_stop_flag_checked(watch);
            tcpy_sigint_checked = t;
        }
        tcpy_sigint = 0;
        return tcpy_sigint_answer;
    }
    static tcpy_stop_ptr tcpy_stop_flag_checked(int watch) {
        struct sigaction current, mine;
        if (!watch || sigaction(SIGINT, NULL, &current) != 0) return &tcpy_never_stop;
        if (!((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == tcpy_on_sigint)) {
            if (!(current.sa_flags & SA_SIGINFO)
                    && (current.sa_handler == SIG_DFL || current.sa_handler == SIG_IGN)) return &tcpy_never_stop;
            memset(&mine, 0, sizeof mine);
            mine.sa_sigaction = tcpy_on_sigint;
            mine.sa_flags = SA_SIGINFO | (current.sa_flags & SA_RESTART);
            sigemptyset(&mine.sa_mask);
            tcpy_chained_sigint = current;
            if (sigaction(SIGINT, &mine, NULL) != 0) return &tcpy_never_stop;
        }
        tcpy_sigint = 0;
        return &tcpy_sigint;
    }
    """
    ctypedef const int *tcpy_stop_ptr
    tcpy_stop_ptr tcpy_stop_flag(int watch) nogil
    void tcpy_cpus_set(int cpus)
    int tcpy_take_cpus(int wanted, tcpy_stop_ptr stop) nogil
    void tcpy_give_cpus(int n) nogil
    int tcpy_cpus_peak(int reset)

ctypedef int (*kernel_fn)(void **buffers, int num_threads, int64_t *err, tcpy_stop_ptr stop) noexcept nogil

cdef unsigned long _main_thread = threading.main_thread().ident

cdef enum:
    STACK_BUFFERS = 32  # kernels with more buffers than this use malloc for the pointer array


cdef int _num_threads = 0  # set_num_threads(); 0: OpenMP decides
cdef int _cpus = available_cpus()
tcpy_cpus_set(_cpus)
# Other processes' load, sampled by parallel calls (quick calls never look): calls hold at most
# the CPUs it leaves free. None when there is only one CPU or TCPY_WATCH_LOAD=0.
cdef object _load = FreeCpus(allowed_cpus()) if _cpus > 1 and watching_enabled() else None
cdef double _next_load_sample = 0.0
if _load is not None:
    _load.sample()  # the baseline: the first parallel call after SAMPLE_INTERVAL_S has a window
cdef bint _warned_openmp = False
cdef int _max_threads = MAX_THREADS  # (a C int: compared on every call)


def set_num_threads(n):
    """Threads for every kernel whose options do not fix them (``Options(num_threads=)`` wins).

    ``set_num_threads(None)`` (or 0) goes back to OpenMP's count: ``OMP_NUM_THREADS``, or what
    ``threadpoolctl.threadpool_limits`` sets, else every CPU.
    """
    global _num_threads
    if n is None:
        n = 0
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_THREADS:
        raise TCArgumentError(f"set_num_threads expects a number of threads from 1 to {MAX_THREADS} (or None), "
                              f"got {n!r}")
    _num_threads = n


def get_num_threads():
    """Threads a kernel whose options do not fix them runs with now."""
    return _num_threads if _num_threads > 0 else _openmp_threads()


cdef int _openmp_threads():
    """OpenMP's thread count (``OMP_NUM_THREADS``, threadpoolctl), or, when that is above
    :data:`~tcpy.options.MAX_THREADS`, the CPUs this process may use (with one warning)."""
    global _warned_openmp
    cdef int n = openmp.omp_get_max_threads()
    if n <= _max_threads:
        return n
    cpus = _cpus
    if not _warned_openmp:
        _warned_openmp = True
        warnings.warn(f"OpenMP's thread count (OMP_NUM_THREADS) is {n}, above tcpy's limit of {MAX_THREADS}: "
                      f"kernels run with the {cpus} CPUs this process may use (tcpy.set_num_threads or "
                      "Options(num_threads=) choose another count)", TCWarning, stacklevel=3)
    return cpus


def peak_threads_in_use(reset=False):
    """The most threads kernels ran with at once (summed over concurrent calls) since the last
    reset; ``reset=True`` starts counting anew after reading."""
    return tcpy_cpus_peak(reset)


cdef enum:
    # Outputs' alignment. The launcher loads libraries built for any Target and does not know
    # which one: 64 bytes is a line on every preset and the widest vector (AVX-512's
    # non-temporal stores need it), so it suits every target without asking.
    CACHE_LINE = 64
    ALIGNED_MIN_BYTES = 1 << 20  # below, an output stays in the caches and alignment buys nothing


cdef class _ArraySpec:
    """Shape and dtype of an array the launcher allocates, ready for the NumPy C API.

    ``zero``: the kernel may leave elements unwritten, so the array starts zero-filled.
    Otherwise it is allocated uninitialised, which saves touching every page twice.
    ``keep``: the kernel accumulates into the output's values (TC's ``+=`` without ``!``), so
    a caller's ``out=`` array keeps its values; a fresh one starts zero-filled."""
    cdef public tuple shape
    cdef public object dtype
    cdef public bint zero
    cdef public bint keep
    cdef int nd
    cdef cnp.npy_intp dims[32]
    cdef int typenum
    cdef Py_ssize_t nbytes

    def __init__(self, shape, dtype, zero=True, keep=False):
        self.zero = zero or keep
        self.keep = keep
        self.shape = tuple([int(d) for d in shape])
        self.dtype = np.dtype(dtype)
        if len(self.shape) > 32:
            raise TCArgumentError(f"rank {len(self.shape)} is above the launcher's limit of 32")
        if not self.dtype.isnative or self.dtype.kind not in "biuf":  # float16 is numeric too
            raise ValueError(f"kernels need a native numeric dtype, not {self.dtype}")
        self.nd = len(self.shape)
        self.nbytes = self.dtype.itemsize
        for i, d in enumerate(self.shape):
            self.dims[i] = d
            self.nbytes *= d  # (a new call shape's entry makes several specs: no NumPy call)
        self.typenum = self.dtype.num

    cdef inline cnp.ndarray zeros(self):
        return cnp.PyArray_ZEROS(self.nd, self.dims, self.typenum, 0)

    cdef inline cnp.ndarray empty(self):
        if self.nbytes >= POOLED_MIN_BYTES:
            return self.pooled_empty()
        if self.nbytes >= ALIGNED_MIN_BYTES:
            return self.aligned_empty()
        return cnp.PyArray_EMPTY(self.nd, self.dims, self.typenum, 0)

    cdef cnp.ndarray aligned_empty(self):
        """An uninitialised array whose data starts at a cache line: kernels store whole
        vectors of a large output around the caches (non-temporal stores need alignment)."""
        cdef cnp.npy_intp n = self.nbytes + CACHE_LINE
        cdef cnp.ndarray raw = cnp.PyArray_EMPTY(1, &n, cnp.NPY_UINT8, 0)
        cdef Py_ssize_t skip = (-<Py_ssize_t>cnp.PyArray_DATA(raw)) & (CACHE_LINE - 1)
        return raw[skip:skip + self.nbytes].view(self.dtype).reshape(self.shape)

    cdef cnp.ndarray pooled_empty(self):
        """An uninitialised array in a block of :data:`_pool` (see :class:`_PooledBlock`)."""
        cdef _PooledBlock block = _PooledBlock.take(self.nbytes)
        cdef cnp.ndarray a = cnp.PyArray_SimpleNewFromData(self.nd, self.dims, self.typenum, block.data)
        Py_INCREF(block)  # PyArray_SetBaseObject steals a reference
        cnp.PyArray_SetBaseObject(a, block)
        return a

    cdef inline cnp.ndarray new(self):
        return self.zeros() if self.zero else self.empty()


cdef enum:
    # Outputs from this size up live in blocks the launcher keeps for the next call when their
    # arrays die. Smaller ones come from malloc's heap, which reuses freed memory already, but
    # glibc maps blocks above 32 MiB (its largest mmap threshold) afresh on every allocation:
    # the kernel then zero-fills every page on first touch (for a 64 MiB softmax, a quarter of
    # the call).
    POOLED_MIN_BYTES = 32 << 20
    POOL_BLOCKS = 2  # blocks kept at most (the latest freed)
    POOL_IDLE_S = 2  # seconds an unused block is kept at most (checked when blocks come and go)
    HUGE_PAGE = 2 << 20  # a pooled block starts on a (transparent) huge page of x86-64


cdef list _pool = []  # (bytes, address, when freed), oldest first

cdef extern from *:
    """
    #include <sys/mman.h>
    /* Transparent huge pages over a pooled block where the system offers them on request (as
       NumPy asks for its arrays from 4 MiB): the output's first touch then faults a page of
       2 MiB at a time, not 512 pages of 4 KiB (a 32 MiB softmax output's first call: 6 ms, not 15). */
    static void tcpy_advise_huge_pages(void *block, size_t nbytes) {
    #ifdef MADV_HUGEPAGE
        madvise(block, nbytes, MADV_HUGEPAGE);
    #endif
    }
    """
    void tcpy_advise_huge_pages(void *block, size_t nbytes)


cdef double _now():
    cdef timespec now
    clock_gettime(CLOCK_MONOTONIC, &now)
    return now.tv_sec + 1e-9 * now.tv_nsec


cdef class _PooledBlock:
    """A block of memory under a large output array, on huge pages where the system has them; when the array (and every
    view of it) dies, the block goes back to the pool for the next call's output of the same
    size. At most POOL_BLOCKS blocks wait there, none longer than POOL_IDLE_S."""
    cdef void *data
    cdef Py_ssize_t nbytes

    @staticmethod
    cdef _PooledBlock take(Py_ssize_t nbytes):
        cdef _PooledBlock block = _PooledBlock.__new__(_PooledBlock)
        cdef Py_ssize_t i
        _expire(_now())
        for i in range(len(_pool)):
            if _pool[i][0] == nbytes:
                block.data = <void *><size_t>_pool.pop(i)[1]
                block.nbytes = nbytes
                return block
        if posix_memalign(&block.data, HUGE_PAGE, nbytes) != 0:
            block.data = NULL
            raise MemoryError(f"cannot allocate {nbytes} bytes for an output")
        tcpy_advise_huge_pages(block.data, nbytes)
        block.nbytes = nbytes
        return block

    def __dealloc__(self):
        if self.data == NULL:
            return
        if _pool is None:  # the module is being torn down
            free(self.data)
            return
        cdef double now = _now()
        _pool.append((self.nbytes, <size_t>self.data, now))
        if len(_pool) > POOL_BLOCKS:
            free(<void *><size_t>_pool.pop(0)[1])
        _expire(now)


cdef _expire(double now):
    """Free the pool's blocks unused for POOL_IDLE_S."""
    while _pool and now - _pool[0][2] > POOL_IDLE_S:
        free(<void *><size_t>_pool.pop(0)[1])


cdef class LaunchEntry:
    """How to call one compiled kernel for one call signature.

    ``func_address``: the kernel's address (``tcpy.runtime.build.load_symbol``).
    ``n_inputs``: number of input buffers. ``output_specs`` / ``temp_specs``: ``(shape, dtype)``,
    ``(shape, dtype, zero)`` or ``(shape, dtype, zero, keep)`` per output (return order) /
    temporary; ``zero=False`` says the kernel writes every element, so the array need not be
    zero-filled first; ``keep=True`` that it accumulates into the values of a caller's ``out=``
    array. ``error_messages``: ``str.format`` templates, error
    code k uses ``error_messages[k - 1]`` with ``err[0..3]`` as positional arguments.
    ``num_threads``: passed to the kernel; 0 or None: :func:`get_num_threads` at each call.
    ``single_output``: return the array itself instead of a 1-tuple. ``input_dtypes``: the
    dtype of each input, needed to turn Python numbers into 0-d arrays (None: arrays only).
    ``owner``: any object to keep alive as long as the entry (e.g. the loaded library).
    ``quick``: the kernel does little work (microseconds), so the call keeps the GIL and does not
    watch for Ctrl-C: releasing the GIL and asking the OS for the SIGINT handler (two system
    calls) would cost more than the kernel.
    ``constants``: C-contiguous arrays passed after the temporaries, the same every call (a
    size-generic kernel's size block). ``temp_pool``: a one-element list shared by the entries
    of one size-generic kernel, whose temporaries then live in its blocks (see
    :func:`_shared_temps`), not in spares of each entry's own. ``on_hot``: called once, with the launcher's table key,
    when the entry serves its ``hot_calls``-th call (a generic kernel's shape worth a
    specialised kernel); ``calls`` counts the calls while it waits.
    """
    cdef readonly object func_address
    cdef readonly int n_inputs
    cdef readonly tuple output_specs
    cdef readonly tuple temp_specs
    cdef readonly tuple error_messages
    cdef readonly int num_threads
    cdef readonly bint single_output
    cdef readonly tuple input_dtypes
    cdef readonly object owner
    cdef readonly bint quick
    cdef readonly tuple constants
    cdef public object on_hot
    cdef public long hot_calls
    cdef readonly long calls
    cdef kernel_fn fn
    cdef tuple _outs
    cdef tuple _temps
    cdef list _spare_temps  # temporaries of the last call, reused by the next one (or None)
    cdef readonly object temp_pool

    def __init__(self, func_address, n_inputs, output_specs, temp_specs=(), error_messages=(),
                 num_threads=0, single_output=True, input_dtypes=None, owner=None, quick=False, constants=(),
                 on_hot=None, hot_calls=0, temp_pool=None):
        if not func_address:
            raise ValueError("LaunchEntry needs the kernel's function address")
        self.func_address = int(func_address)
        self.fn = <kernel_fn><size_t>self.func_address
        self.n_inputs = n_inputs
        # (lists made into tuples: Cython runs a list comprehension inline, a generator as an object)
        self._outs = tuple([_ArraySpec(*spec) for spec in output_specs])
        self._temps = tuple([_ArraySpec(*spec) for spec in temp_specs])
        self.output_specs = tuple([(s.shape, s.dtype) for s in self._outs])
        self.temp_specs = tuple([(s.shape, s.dtype) for s in self._temps])
        self.error_messages = tuple(error_messages)
        self.num_threads = num_threads if num_threads and num_threads > 0 else 0
        self.single_output = single_output
        if input_dtypes is not None:
            input_dtypes = tuple([np.dtype(d) for d in input_dtypes])
            if len(input_dtypes) != n_inputs:
                raise ValueError(f"{len(input_dtypes)} input dtypes for {n_inputs} inputs")
        self.input_dtypes = input_dtypes
        self.owner = owner
        self.quick = quick
        self.constants = tuple([np.ascontiguousarray(c) for c in constants])
        self.on_hot = on_hot
        self.hot_calls = hot_calls
        self.calls = 0
        self.temp_pool = temp_pool

    def __repr__(self):
        outs = ", ".join(f"{d}{list(s)}" for s, d in self.output_specs)
        return (f"LaunchEntry(0x{self.func_address:x}, inputs={self.n_inputs}, outputs=[{outs}], "
                f"temps={len(self.temp_specs)}, threads={self.num_threads})")


cdef inline void _put(tuple t, Py_ssize_t i, object x):
    Py_INCREF(x)  # PyTuple_SET_ITEM steals a reference
    PyTuple_SET_ITEM(t, i, x)


cdef tuple _signature(tuple args, int threads):
    """The table key, flat for speed: per array its dtype, rank and dims; per anything else
    (Python numbers) its type. Dtypes, ranks and types are distinct kinds, so it is unambiguous.
    ``threads`` > 0 ends it (a launcher that follows the thread count always passes one)."""
    cdef Py_ssize_t i, k = 0, size = 1 if threads > 0 else 0, n = PyTuple_GET_SIZE(args)
    cdef int d, nd
    cdef cnp.ndarray a
    for i in range(n):
        x = <object>PyTuple_GET_ITEM(args, i)
        size += 2 + cnp.PyArray_NDIM(<cnp.ndarray>x) if cnp.PyArray_Check(x) else 1
    cdef tuple key = PyTuple_New(size)
    if threads > 0:
        _put(key, size - 1, threads)
    for i in range(n):
        x = <object>PyTuple_GET_ITEM(args, i)
        if cnp.PyArray_Check(x):
            a = <cnp.ndarray>x
            nd = cnp.PyArray_NDIM(a)
            _put(key, k, <object>cnp.PyArray_DESCR(a))
            _put(key, k + 1, nd)
            k += 2
            for d in range(nd):
                _put(key, k, cnp.PyArray_DIM(a, d))
                k += 1
        else:
            _put(key, k, type(x))
            k += 1
    return key


cdef bint _matches(tuple key, tuple args, int threads):
    """Whether ``args`` (and ``threads``) have the signature ``key`` (:func:`_signature`'s),
    compared in place: no key is built, hashed or looked up. A dtype compares by identity (an
    equal dtype in another object takes the table's way)."""
    cdef Py_ssize_t i, k = 0, size = PyTuple_GET_SIZE(key), n = PyTuple_GET_SIZE(args)
    cdef int d, nd
    cdef cnp.ndarray a
    if threads > 0:
        size -= 1
        if size < 0 or PyLong_AsSsize_t(<object>PyTuple_GET_ITEM(key, size)) != threads:
            return False
    for i in range(n):
        x = <object>PyTuple_GET_ITEM(args, i)
        if cnp.PyArray_Check(x):
            a = <cnp.ndarray>x
            nd = cnp.PyArray_NDIM(a)
            if (k + 2 + nd > size or PyTuple_GET_ITEM(key, k) != <PyObject *>cnp.PyArray_DESCR(a)
                    or PyLong_AsSsize_t(<object>PyTuple_GET_ITEM(key, k + 1)) != nd):
                return False
            k += 2
            for d in range(nd):
                if PyLong_AsSsize_t(<object>PyTuple_GET_ITEM(key, k)) != cnp.PyArray_DIM(a, d):
                    return False
                k += 1
        else:
            if k >= size or PyTuple_GET_ITEM(key, k) != <PyObject *>Py_TYPE(x):
                return False
            k += 1
    return k == size


cdef class Launcher:
    """Callable front of a kernel: ``launcher(*args, out=None)`` returns an array or a tuple.

    ``miss_handler(args) -> LaunchEntry`` is called the first time a call signature is seen; it
    must check the arguments (raising a TCError) and build the kernel. Its entry is reused for
    every later call with the same signature. ``follow_threads``: the thread count a call would
    run with (:func:`get_num_threads`) is part of the signature, for kernels planned for it.
    """
    cdef readonly dict table
    cdef readonly object miss_handler
    cdef readonly bint follow_threads
    # (key, entry) of the last call: a call repeating its signature skips building and hashing
    # a key (one assignment, so calls from several Python threads see a consistent pair)
    cdef tuple _last

    def __init__(self, miss_handler, follow_threads=False):
        self.table = {}
        self.miss_handler = miss_handler
        self.follow_threads = follow_threads
        self._last = None

    def __call__(self, *args, out=None, **keywords):
        if keywords:
            raise TCArgumentError(f"kernels take their arrays by position, in the order of the signature; "
                                  f"got keyword argument{'s' if len(keywords) > 1 else ''} "
                                  f"{', '.join(map(repr, keywords))}")
        # one entry (plan) per thread count the calls run with, when the kernel follows it
        cdef int threads = ((_num_threads if _num_threads > 0 else _openmp_threads())
                            if self.follow_threads else 0)
        last = self._last
        if last is not None and _matches(<tuple>PyTuple_GET_ITEM(last, 0), args, threads):
            key, entry = last
        else:
            key = _signature(args, threads)
            entry = self.table.get(key)
            if entry is None:
                entry = self.miss_handler(args)
                if not isinstance(entry, LaunchEntry):
                    raise TypeError(f"miss_handler returned {type(entry).__name__}, not LaunchEntry")
                self.table[key] = entry
            self._last = (key, entry)
        if (<LaunchEntry>entry).on_hot is not None:
            _count_call(<LaunchEntry>entry, key)
        return _launch(<LaunchEntry>entry, args, out)

    def replace(self, key, expected, entry):
        """Make ``entry`` serve the signature ``key`` if ``expected`` still does (a kernel
        specialised in the background taking over from the generic one); whether it did."""
        if self.table.get(key) is not expected:
            return False
        self.table[key] = entry
        self._last = None  # (the last call's pair may hold the replaced entry)
        return True

    def clear(self):
        """Forget every entry (the next call of each signature goes to miss_handler again)."""
        self._last = None
        self.table.clear()


cdef _count_call(LaunchEntry entry, object key):
    """Count a call of an entry that waits to be hot; at its hot call, tell ``on_hot`` (once)."""
    entry.calls += 1
    if entry.calls >= entry.hot_calls:
        on_hot, entry.on_hot = entry.on_hot, None
        on_hot(key)


cdef object _launch(LaunchEntry entry, tuple args, object out):
    cdef Py_ssize_t i, n_in = entry.n_inputs
    cdef Py_ssize_t n_out = PyTuple_GET_SIZE(entry._outs)
    cdef Py_ssize_t n_tmp = PyTuple_GET_SIZE(entry._temps)
    cdef Py_ssize_t n_const = PyTuple_GET_SIZE(entry.constants)
    cdef Py_ssize_t n_buf = n_in + n_out + n_tmp + n_const
    cdef list arrays = [None] * n_buf  # holds every buffer alive through the call
    cdef cnp.ndarray a
    if PyTuple_GET_SIZE(args) != n_in:  # only if a miss handler accepted a different count
        raise TCArgumentError(f"expected {n_in} arguments, got {PyTuple_GET_SIZE(args)}")
    for i in range(n_in):
        x = args[i]
        if cnp.PyArray_Check(x):
            a = <cnp.ndarray>x
            if not cnp.PyArray_ISCARRAY_RO(a):  # strided, reversed or misaligned: copy
                a = np.array(a, order="C", copy=True)
            if cnp.PyArray_TYPE(a) == cnp.NPY_BOOL and _has_non_bool_bytes(a):
                a = a.view(np.uint8) != 0  # C assumes a bool byte is 0 or 1
        else:
            a = _number_to_array(entry, i, x)
        arrays[i] = a
    if out is None:
        for i in range(n_out):
            arrays[n_in + i] = (<_ArraySpec>entry._outs[i]).new()
    else:
        _check_out(entry, out, arrays)
    # Temporaries are reused from call to call: fresh memory costs a page fault per 4 KiB page
    # on first touch, often more than the kernel. A call running while another holds the
    # spares (threads) allocates its own.
    cdef list temps
    cdef list blocks = None
    if entry.temp_pool is not None:
        blocks, temps = _shared_temps(entry)
    else:
        temps = entry._spare_temps
        entry._spare_temps = None
    if temps is None:
        temps = [(<_ArraySpec>entry._temps[i]).new() for i in range(n_tmp)]
    else:
        for i in range(n_tmp):
            if (<_ArraySpec>entry._temps[i]).zero:
                a = <cnp.ndarray>temps[i]
                memset(cnp.PyArray_DATA(a), 0, cnp.PyArray_NBYTES(a))
    for i in range(n_tmp):
        arrays[n_in + n_out + i] = temps[i]
    for i in range(n_const):
        arrays[n_in + n_out + n_tmp + i] = entry.constants[i]
    try:
        _call(entry, arrays, n_buf)
    finally:
        if blocks is not None:
            entry.temp_pool[0] = blocks
        else:
            entry._spare_temps = temps
    if entry.single_output:
        return arrays[n_in]
    return tuple(arrays[n_in:n_in + n_out])


cdef tuple _shared_temps(LaunchEntry entry):
    """``(blocks, temporaries)``: the entry's temporaries as views of its size-generic kernel's
    blocks (``entry.temp_pool[0]``: one uint8 array per temporary, grown to the largest
    shape called so far), zero-filled where the kernel needs it. Every shape of the kernel
    reuses the same memory: a new shape touches no fresh pages unless it is the largest yet,
    and the kernel keeps one set of temporaries, not one per shape. The blocks are taken
    while the call runs (a concurrent call gets new ones, kept after it if it ends last)."""
    cdef list blocks = entry.temp_pool[0]
    entry.temp_pool[0] = None
    cdef Py_ssize_t i, n = PyTuple_GET_SIZE(entry._temps), skip
    if blocks is None or len(blocks) != n:
        blocks = [None] * n
    cdef list temps = [None] * n
    cdef _ArraySpec spec
    cdef cnp.ndarray block, a
    for i in range(n):
        spec = <_ArraySpec>entry._temps[i]
        if blocks[i] is None or cnp.PyArray_NBYTES(<cnp.ndarray>blocks[i]) < spec.nbytes + CACHE_LINE:
            blocks[i] = np.empty(spec.nbytes + CACHE_LINE, np.uint8)
        block = <cnp.ndarray>blocks[i]
        skip = (-<Py_ssize_t>cnp.PyArray_DATA(block)) & (CACHE_LINE - 1)
        a = block[skip:skip + spec.nbytes].view(spec.dtype).reshape(spec.shape)
        if spec.zero:
            memset(cnp.PyArray_DATA(a), 0, spec.nbytes)
        temps[i] = a
    return blocks, temps


cdef cnp.ndarray _number_to_array(LaunchEntry entry, Py_ssize_t i, object x):
    if entry.input_dtypes is None:
        raise TCArgumentError(f"argument {i} must be a NumPy array, not {type(x).__name__}")
    dtype = entry.input_dtypes[i]
    try:
        return np.array(x, dtype=dtype)
    except (OverflowError, ValueError, TypeError):
        raise TCOverflowError(f"argument {i}: {x!r} does not fit the parameter's type {dtype}") from None


cdef _check_out(LaunchEntry entry, object out, list arrays):
    """Use the caller's output arrays: exact shape and dtype, C-contiguous, writeable, not
    overlapping an input or each other. Unless the kernel writes every element, or accumulates
    into their values, they are zero-filled first, because outputs are defined as zero wherever
    no statement writes them."""
    cdef Py_ssize_t i, j, n_in = entry.n_inputs, n_out = PyTuple_GET_SIZE(entry._outs)
    cdef _ArraySpec spec
    cdef cnp.ndarray o
    outs = (out,) if cnp.PyArray_Check(out) else out
    if not isinstance(outs, (tuple, list)) or len(outs) != n_out:
        if cnp.PyArray_Check(out):
            got = "one array"
        elif isinstance(out, (tuple, list)):
            got = f"{len(out)} array{'' if len(out) == 1 else 's'}"
        else:
            got = f"a {type(out).__name__}"
        raise TCArgumentError(f"out= must be {_count(n_out)}, got {got}")
    for i in range(n_out):
        spec = <_ArraySpec>entry._outs[i]
        if not cnp.PyArray_Check(outs[i]):
            _bad_out(spec, i, n_out, f"got {type(outs[i]).__name__}")
        o = <cnp.ndarray>outs[i]
        if not _same_shape(o, spec) or not _same_dtype(o, spec):
            _bad_out(spec, i, n_out, f"got a {o.dtype} array of shape {(<object>o).shape}")
        if not cnp.PyArray_ISCARRAY(o):
            problem = "read-only" if not cnp.PyArray_ISWRITEABLE(o) else "not C-contiguous"
            _bad_out(spec, i, n_out, f"got an array that is {problem}")
        name = "out" if n_out == 1 else f"out[{i}]"
        for j in range(n_in):
            if _overlap(o, <cnp.ndarray>arrays[j]):
                raise TCArgumentError(f"{name} shares memory with input {j}; kernels do not work in place")
        for j in range(i):
            if _overlap(o, <cnp.ndarray>arrays[n_in + j]):
                raise TCArgumentError(f"{name} shares memory with out[{j}]")
        arrays[n_in + i] = o
    for i in range(n_out):
        spec = <_ArraySpec>entry._outs[i]
        o = <cnp.ndarray>arrays[n_in + i]
        if spec.keep:
            if cnp.PyArray_TYPE(o) == cnp.NPY_BOOL and _has_non_bool_bytes(o):
                np.not_equal(o.view(np.uint8), 0, out=o)
        elif spec.zero:
            memset(cnp.PyArray_DATA(o), 0, cnp.PyArray_NBYTES(o))


cdef bint _has_non_bool_bytes(cnp.ndarray a):
    """A C-contiguous bool array holds a byte other than 0 and 1 (e.g. a uint8 array viewed as bool)."""
    cdef const unsigned char *p = <const unsigned char *>cnp.PyArray_DATA(a)
    cdef Py_ssize_t i, n = cnp.PyArray_NBYTES(a)
    cdef unsigned char acc = 0
    with nogil:
        for i in range(n):
            acc |= p[i]
    return acc > 1


cdef _bad_out(_ArraySpec spec, Py_ssize_t i, Py_ssize_t n_out, str got):
    name = "out" if n_out == 1 else f"out[{i}]"
    raise TCArgumentError(f"{name}: expected a C-contiguous writeable {spec.dtype} array of shape "
                          f"{spec.shape}, {got}")


cdef inline bint _same_shape(cnp.ndarray a, _ArraySpec spec):
    cdef int d
    if cnp.PyArray_NDIM(a) != spec.nd:
        return False
    for d in range(spec.nd):
        if cnp.PyArray_DIM(a, d) != spec.dims[d]:
            return False
    return True


cdef inline bint _same_dtype(cnp.ndarray a, _ArraySpec spec):
    # Type numbers are equal for equal native builtin dtypes, but one dtype may have two numbers
    # (int64 is both "long" and "longlong" on Linux): only then ask NumPy.
    if cnp.PyArray_TYPE(a) == spec.typenum and cnp.PyArray_ISNOTSWAPPED(a):
        return True
    return a.dtype == spec.dtype


cdef inline bint _overlap(cnp.ndarray a, cnp.ndarray b):
    """Byte ranges intersect (both arrays are C-contiguous here, so a range is exact)."""
    cdef char *a0 = <char *>cnp.PyArray_DATA(a)
    cdef char *b0 = <char *>cnp.PyArray_DATA(b)
    cdef char *a1 = a0 + cnp.PyArray_NBYTES(a)
    cdef char *b1 = b0 + cnp.PyArray_NBYTES(b)
    return a0 < a1 and b0 < b1 and a0 < b1 and b0 < a1  # empty arrays overlap nothing


cdef str _count(Py_ssize_t n):
    return "an array (or a 1-tuple)" if n == 1 else f"a tuple of {n} arrays"


cdef _watch_load():
    """Resize the CPUs calls may hold to what other processes leave free, at most every
    SAMPLE_INTERVAL_S."""
    global _next_load_sample
    cdef double t = _now()
    if t < _next_load_sample:
        return
    _next_load_sample = t + SAMPLE_INTERVAL_S
    free = _load.sample()
    if free is not None:
        tcpy_cpus_set(min(<int>free, _cpus))


cdef _call(LaunchEntry entry, list arrays, Py_ssize_t n_buf):
    cdef void *stack[STACK_BUFFERS]
    cdef void **buffers = stack
    cdef int64_t err[4]
    cdef int rc, threads = entry.num_threads if entry.num_threads > 0 else _num_threads
    if threads == 0:
        threads = _openmp_threads()
    cdef tcpy_stop_ptr stop
    cdef kernel_fn fn = entry.fn
    cdef Py_ssize_t i
    if n_buf > STACK_BUFFERS:
        buffers = <void **>malloc(n_buf * sizeof(void *))
        if buffers == NULL:
            raise MemoryError()
    try:
        for i in range(n_buf):
            buffers[i] = cnp.PyArray_DATA(<cnp.ndarray>arrays[i])
        err[0] = err[1] = err[2] = err[3] = 0
        if entry.quick:  # (microseconds on the calling thread: no CPUs taken)
            rc = fn(buffers, threads if threads < _cpus else _cpus, err, tcpy_stop_flag(0))
        else:
            if _load is not None:
                _watch_load()
            # Ctrl-C reaches a kernel only in the main thread, where Python handles signals
            stop = tcpy_stop_flag(PyThread_get_thread_ident() == _main_thread)
            with nogil:
                threads = tcpy_take_cpus(threads, stop)
                if threads == 0:
                    rc = -1  # interrupted while waiting for CPUs
                else:
                    rc = fn(buffers, threads, err, stop)
                    tcpy_give_cpus(threads)
    finally:
        if buffers != stack:
            free(buffers)
    if rc == -1:  # TCPY_INTERRUPTED: Python's handler has run in C; let it raise
        PyErr_CheckSignals()
        raise TCRuntimeError("the kernel was interrupted (SIGINT) before it finished; its outputs are incomplete")
    if rc != 0:
        _raise_kernel_error(entry, rc, err)


cdef _raise_kernel_error(LaunchEntry entry, int rc, int64_t *err):
    values = (err[0], err[1], err[2], err[3])
    if 0 < rc <= len(entry.error_messages):
        raise TCRuntimeError(entry.error_messages[rc - 1].format(*values))
    raise TCRuntimeError(f"kernel failed with unknown error code {rc} (details: {list(values)})")
