"""Autotuning: time a few schedules of one kernel on given shapes and keep the fastest.

``autotune(kernel, *arrays)`` compiles and times each candidate :class:`~tcpy.Options` (with a
progress bar), then records the winner in ``tuned.json`` in the cache directory, keyed by the
def's canonical source, its sizes and the options it was tuned from. Later calls of any kernel
with that def and those sizes, in this process or another, use the recorded options.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Mapping, Optional, Sequence

import numpy as np
from filelock import FileLock
from tqdm.auto import tqdm

from .runtime.build import cache_dir, configured_cache_root
from .errors import TCOptionError
from .options import Options
from .loopir import ContractionNest
from .target import PRESETS

KEEP_DEFAULT_MARGIN = 0.03  # another schedule must beat the first candidate by this share
# A new call shape's lookup reads the store again (a system call: some 30 us right after a kernel
# on a busy VM) when it is older than this: another process's records show up this late at most
STORE_RECHECK_S = 1.0

_memory: dict[str, Optional[Options]] = {}  # key -> tuned options (None: looked up, not tuned)


def _key(kernel, sizes: Mapping[str, int]) -> str:
    definition, options = kernel.tuning_identity
    text = f"({definition}, {sorted(sizes.items())!r}, {options})"  # (the tuple's repr)
    return hashlib.sha256(text.encode()).hexdigest()


def _store_path() -> Path:
    """The store in the cache in use (:func:`~tcpy.runtime.build.cache_dir`: where records are written)."""
    return _store_in(str(cache_dir()))


@functools.lru_cache(maxsize=16)
def _store_in(root: str) -> Path:
    return Path(root) / "tuned.json"  # (made once per root: a new call shape of a generic kernel looks it up)


# the store's path -> ((mtime, size) or None when missing, its records, time.monotonic() when
# looked at): read again when it changes
_loaded: dict = {}


def _load_all(path: Optional[Path] = None) -> dict:
    """The records of the store at ``path`` as it is now; by default those of the store the
    environment names, looked at again once they are :data:`STORE_RECHECK_S` old (a new call
    shape of any kernel looks its sizes up there, read-only: records this process wrote, or wrote
    to a fallback cache, are in :data:`_memory`)."""
    now = time.monotonic()
    if path is None:
        path = _store_in(configured_cache_root())
        known = _loaded.get(path)
        if known is not None and now - known[2] < STORE_RECHECK_S:
            return known[1]
    try:
        stat = os.stat(path)
        stamp = (stat.st_mtime_ns, stat.st_size)
        known = _loaded.get(path)
        if known is None or known[0] != stamp:
            with open(path) as f:
                data = json.load(f)
            known = (stamp, data if isinstance(data, dict) else {})
    except (OSError, ValueError):  # missing or corrupt: nothing tuned yet
        known = (None, {})
    _loaded[path] = (known[0], known[1], now)
    return known[1]


def _to_json(options: Options) -> dict:
    data = {f.name: getattr(options, f.name) for f in dataclasses.fields(options)}
    # the record's key names the machine; a preset is stored by name, the host as "host"
    data["target"] = options.target.name if options.target.name in PRESETS else "host"
    return data


def _from_json(data: dict) -> Optional[Options]:
    try:
        return Options(**data)
    except (TypeError, ValueError):  # written by another version of tcpy
        return None


def tuned_options(kernel, sizes: Mapping[str, int]) -> Optional[Options]:
    """The options ``autotune`` recorded for this kernel's def and these sizes, if any."""
    records = _load_all()
    if not records and not _memory:
        return None  # nothing tuned (a new call shape of a generic kernel asks: no key to make)
    key = _key(kernel, sizes)
    if key not in _memory:
        entry = records.get(key)
        _memory[key] = _from_json(entry) if isinstance(entry, dict) else None
    return _memory[key]


def _record(key: str, options: Options) -> None:
    _memory[key] = options
    path = _store_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(path) + ".lock"):
            data = {**_load_all(path), key: _to_json(options)}
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".json.tmp")
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, indent=1, sort_keys=True)
            os.replace(tmp, path)  # readers never see a half-written file
    except OSError:
        pass  # a read-only cache still tunes this process
    _loaded.pop(path, None)  # (this process's next lookup reads what it wrote)


def clear_tuned() -> bool:
    """Forget every autotuning result (``tuned.json``); True if there was one."""
    _memory.clear()
    _loaded.clear()
    try:
        _store_path().unlink()
        return True
    except FileNotFoundError:
        return False


def candidates(kernel, sizes: Mapping[str, int]) -> list[Options]:
    """A small search space around the default schedule: for a kernel the contraction engine
    runs, plans around its plan (:func:`plan_candidates`); else tile sizes halved and doubled,
    register tiles on and off, serial vs parallel."""
    base = kernel.options
    spec = kernel.with_options(base).specialize(**sizes)
    engine_plans = [node.plan for nest in spec.ir.nests for node in nest.body if isinstance(node, ContractionNest)]
    if engine_plans and not base.plan:
        return plan_candidates(kernel, sizes, engine_plans[0])
    tiles: dict[str, int] = {}
    for nest in spec.ir.nests:
        if nest.schedule is not None:
            tiles.update(nest.schedule.tiles)
    found = [base, dataclasses.replace(base, register_tile=not base.register_tile)]
    if tiles:
        found.append(dataclasses.replace(base, tile_sizes={v: max(8, t // 2) for v, t in tiles.items()}))
        found.append(dataclasses.replace(base, tile_sizes={v: t * 2 for v, t in tiles.items()}))
        found.append(dataclasses.replace(base, tile_sizes={v: 0 for v in tiles}))
    if base.parallel and base.threads > 1:
        found.append(dataclasses.replace(base, parallel=False))
    return found


def plan_candidates(kernel, sizes: Mapping[str, int], default) -> list[Options]:
    """The default plan first, then ``Options.plan`` overrides around it (the engine's first
    statement's plan ``default``): the micro-tile's other shapes, kc, mc and nc halved and
    doubled, the other paths, the thread grid with K or N split instead; only those the
    statements can run with."""
    base = kernel.options
    lanes = default.lanes
    tries: list[dict] = []
    for mr, nv in ((default.mr - 2, default.nr_vectors), (default.mr + 2, default.nr_vectors),
                   (default.mr, default.nr_vectors + 1), (default.mr + 2, default.nr_vectors - 1)):
        if mr >= 1 and nv >= 1:
            tries.append({"mr": mr, "nr": nv * lanes})
    tries += [{"kc": max(4, default.kc // 2 // 4 * 4)}, {"kc": default.kc * 2},
              {"mc": max(default.mr, default.mc // 2 // default.mr * default.mr)}, {"mc": default.mc * 2},
              {"nc": max(default.nr, default.nc // 2 // default.nr * default.nr)}, {"nc": default.nc * 2}]
    tries += [{"path": path} for path in ("packed", "small", "stream") if path != default.path]
    tb, tm, tn, tk = default.grid
    tries += [{"grid": grid} for grid in ((tb, tn, tm, tk), (tb, 1, tm * tn, tk), (tb, tm * tn, 1, tk),
                                          (tb, tm, tn, tk * 2), (tb * tm * tn * tk, 1, 1, 1))
              if grid != default.grid]
    found, seen = [base], set()
    for overrides in tries:
        options = dataclasses.replace(base, plan=overrides)
        key = repr(sorted(overrides.items()))
        if key in seen:
            continue
        seen.add(key)
        try:
            kernel.with_options(options).specialize(**sizes)
        except TCOptionError:
            continue  # a plan these statements cannot run with
        found.append(options)
    return found


def _time(kernel, arrays, repeat: int) -> float:
    kernel(*arrays)  # compile and warm up
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        kernel(*arrays)
        best = min(best, time.perf_counter() - start)
    return best


def autotune(kernel, *arrays, options: Optional[Sequence[Options]] = None, repeat: int = 5,
             progress: bool = True) -> Options:
    """Time schedule candidates of ``kernel`` on ``arrays``; record and return the fastest.

    ``options``: the candidates (default: :func:`candidates`). After this, calls of ``kernel``
    (and of any kernel of the same def and options, also in later processes) with these shapes
    use the winner. Returns it. The first candidate (the default schedule) is kept unless another
    is faster by ``KEEP_DEFAULT_MARGIN``: a timing's noise never picks a slower schedule.
    """
    from .binding import bind_arguments

    arrays_, sizes = bind_arguments(kernel.def_, arrays)
    if options is not None and (not isinstance(options, (list, tuple)) or not options
                                or not all(isinstance(o, Options) for o in options)):
        raise TCOptionError(f"autotune's options= must list one or more tcpy.Options, got {options!r}")
    if not isinstance(repeat, int) or isinstance(repeat, bool) or repeat < 1:
        raise TCOptionError(f"autotune's repeat= must be an int >= 1, got {repeat!r}")
    trials = list(options) if options is not None else candidates(kernel, sizes)
    timings = []
    for opts in tqdm(trials, desc=f"autotune {kernel.name}", disable=not progress, leave=False):
        timings.append(_time(kernel.with_options(opts), arrays, repeat))
    best = trials[int(np.argmin(timings))]
    if min(timings) * (1 + KEEP_DEFAULT_MARGIN) > timings[0]:
        best = trials[0]
    _record(_key(kernel, sizes), best)
    kernel.clear()  # the next call compiles (or finds) the tuned kernel
    return best
