"""A worker process for tcpy's background work: the kernels ``specialize="auto"`` specialises
to hot shapes.

Planning and rendering a specialised kernel is Python work of a good part of a second, and
islpy holds the interpreter's lock through its calls: done in a thread of the calling process,
it stalls the caller's own calls (a new shape's planning waited for it by milliseconds). The
worker is a second Python process, started at the first request and then kept for the process's
life, that runs module-level functions on pickled arguments, one request at a time, with the
caller's environment of the moment (its kernel cache, compiler and flags). It runs at the lowest
CPU priority (nice 19, which the compiler it starts inherits): a kernel running on every core
meanwhile keeps them (at normal priority, a background compile on a 2-core machine had made a
2-thread attention call wait 4 ms for a thread it held). It ignores Ctrl-C (meant for the process
that calls kernels) and ends when that process does (its requests' pipe closes).
"""
from __future__ import annotations

import atexit
import os
import pickle
import signal
import struct
import subprocess
import sys
import threading
from typing import BinaryIO, Callable

from ..errors import TCRuntimeError

_HEADER = struct.Struct("<Q")  # a message's length, before it
_lock = threading.Lock()  # one request at a time
_process: subprocess.Popen | None = None


def run(function: Callable, *args):
    """``function(*args)`` in the worker process (``function`` importable by its module and
    name); its result. A failure there (an exception, or the worker ending) raises
    :class:`~tcpy.TCRuntimeError` here, with the worker's error."""
    request = pickle.dumps((dict(os.environ), function, args))
    with _lock:
        process = _worker()
        try:
            _send(process.stdin, request)
            reply = _receive(process.stdout)
        except (OSError, EOFError) as err:
            _stop()
            raise TCRuntimeError(f"tcpy's worker process ended ({err or 'no reply'})") from None
    ok, value = pickle.loads(reply)
    if not ok:
        raise TCRuntimeError(value)
    return value


def _worker() -> subprocess.Popen:
    """The worker process, started if there is none (or it ended)."""
    global _process
    if _process is None or _process.poll() is not None:
        _process = subprocess.Popen([sys.executable, "-c", "from tcpy.runtime.worker import serve; serve()"],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    return _process


@atexit.register
def _stop() -> None:
    """End the worker (its requests' pipe closed, it returns) and wait for it."""
    global _process
    process, _process = _process, None
    if process is not None:
        process.stdin.close()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        process.stdout.close()


def serve() -> None:
    """The worker's loop: a request ``(environment, function, args)`` in, ``(True, result)`` or
    ``(False, "the error")`` out, until the caller closes the pipe."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.nice(19)  # (background work: the caller's kernels first; capped at the lowest priority)
    requests, replies = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # (what the work prints must not land among the replies)
    while True:
        try:
            environment, function, args = pickle.loads(_receive(requests))
        except EOFError:
            return
        os.environ.clear()
        os.environ.update(environment)
        try:
            reply = (True, function(*args))
        except Exception as err:
            reply = (False, f"{type(err).__name__}: {err}")
        _send(replies, pickle.dumps(reply))


def _send(pipe: BinaryIO, message: bytes) -> None:
    pipe.write(_HEADER.pack(len(message)) + message)
    pipe.flush()


def _receive(pipe: BinaryIO) -> bytes:
    header = pipe.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise EOFError
    (length,) = _HEADER.unpack(header)
    message = pipe.read(length)
    if len(message) < length:
        raise EOFError
    return message
