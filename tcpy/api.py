"""The public API: :func:`define`, :class:`Kernel`, :class:`Library`.

``define`` parses and checks TC source and infers ranges once. A kernel is then compiled once
for every shape (size-generic, :mod:`tcpy.generic`) where its def allows, else specialised,
compiled and cached per (dtypes, shapes, options) the first time it sees them; under
``Options(specialize="auto")`` a shape called :data:`SPECIALIZE_AFTER_CALLS` times (fewer when
its calls do much work: :data:`SPECIALIZE_AFTER_POINTS`) also gets a specialised kernel,
compiled in the background. Repeated calls with the same shapes go straight
from the Cython launcher to the compiled function.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import os
import sys
import threading
import warnings
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, TypeVar

import numpy as np

from . import binding, ranges
from .codegen.emit import emit_kernel
from .generic import engine_statements, generic_sizes, size_block, unsupported
from .errors import (TCArgumentError, TCCompilerError, TCLookupError, TCOptionError, TCOverflowError,
                     TCMemoryError, TCProgramError, TCShapeError, TCWarning)
from .lang import ast, parse
from .lang.sema import caller_accumulations, select_def
from .lang.types import ScalarType
from .loopir import BlockChain, ContractionNest, KernelIR, NestKind, describe_group, dump, dump_program
from .loopnest import build_program, lower
from .runtime.build import build_library, check_loadable, debug_level, load_symbol
from .runtime.launch import LaunchEntry, Launcher, get_num_threads
from .runtime import worker
from .options import Options
from .schedule import volume
from .target import PRESETS, Target
from .transform import (attach_epilogues, decide_engines, drop_empty_sums, fuse_statements, pack_operands,
                        plan_chains, register_tiles, runtime_gap, split_phases)

T = TypeVar("T")

BACKENDS = ("compiled", "reference")

#: The passes of :meth:`Kernel.specialize`, in order, each returning new IR: a def bound to sizes
#: (:class:`~tcpy.loopir.Program`) through the program passes, then loop nests
#: (:class:`~tcpy.loopir.KernelIR`) that the renderer turns into C.
PASSES = (
    ("zeros", drop_empty_sums),  # sums over an empty range at these sizes: zeros, not statements
    ("engines", decide_engines),  # how each statement runs (engine plan or loops), decided once
    ("packing", pack_operands),  # operand copies for the loop nests' register tiles
    ("epilogues", attach_epilogues),  # element-wise consumers into a contraction's store
    ("fusion", fuse_statements),  # shared loops, chains over blocks of rows
    ("chains", plan_chains),  # how fused groups and chains run: parallel, blocks, prepacks, products' plans
    ("phases", split_phases),  # parity selects of an interleaving statement resolved per residue
    ("lower", lower),  # loop nests from isl schedules
    ("register_tiles", lambda ir, options: register_tiles(ir)),
)


def _dump_any(ir) -> str:
    return dump(ir) if isinstance(ir, KernelIR) else dump_program(ir)

#: Below this many iterations in all, a kernel runs in microseconds: its call keeps the GIL and
#: does not watch for Ctrl-C (both cost system calls, more than such a kernel).
QUICK_CALL_POINTS = 1 << 12

# Flags every kernel needs for TC's semantics: signed overflow wraps (int arithmetic is modular,
# as in NumPy), math functions may skip errno so gcc can inline and vectorize them, and floating
# point never traps (kernels do not expose exception flags), so gcc may compute both sides of a
# select (a padded window's guarded read) and vectorize it; no value changes.
SEMANTIC_FLAGS = ("-fwrapv", "-fno-math-errno", "-fno-trapping-math")

#: Under ``Options(specialize="auto")``, the calls of one shape served by the generic kernel
#: after which a kernel specialised for that shape is compiled in the background (the shape's
#: calls switch to it when it is ready).
SPECIALIZE_AFTER_CALLS = 100
#: ... or sooner, once the shape's calls have run this many iterations in all: a compile costs
#: a fraction of a second, which a large shape's specialised (fused) kernel soon pays back. A
#: shape called once is never hot: a sweep calling each shape once (variable-length batches of
#: attention) compiles once, not a kernel per large shape in the background beside its calls.
SPECIALIZE_AFTER_POINTS = 1 << 30
#: A shape whose temporaries, each whole as the generic kernel allocates them (those its fused
#: groups and online chains do not shrink), take more than this many times the bytes of its
#: arguments and results (and more than L2) is specialised from its first call under
#: ``Options(specialize="auto")``: fused, such temporaries live in per-thread blocks
#: (attention's gradient: its scores and their cotangents, L x S each, against inputs of L x D).
GENERIC_TEMPORARIES_RATIO = 4


@dataclass(frozen=True)
class Specialization:
    """A kernel bound to concrete sizes: ranges, loop nests and C source."""

    sizes: Mapping[str, int]
    bound: ranges.BoundRanges
    ir: KernelIR
    c_source: str
    error_messages: tuple[str, ...]
    symbol: str

    @functools.cached_property
    def chain_templates(self) -> dict:
        """Its chains' size-independent planning, per fused group index
        (:func:`tcpy.transform.runtime_chains.chain_template`): built once, read at every new
        call shape of a generic kernel."""
        from .transform.runtime_chains import chain_template
        program = self.ir.program
        return {index: chain_template(program, group) for index, group in enumerate(program.groups)
                if group.chain is not None}


class Kernel(Launcher):
    """A compiled TC def. Call it on NumPy arrays: ``C = kernel(A, B)``.

    ``kernel(*arrays, out=None)`` returns one array, or a tuple for several outputs; ``out``
    takes preallocated output arrays (an array or a tuple, exact shape and dtype, C-contiguous).
    The call goes straight to the Cython launcher: after the first call with given shapes and
    dtypes it costs about a microsecond plus the kernel.
    """

    def __init__(self, def_: ast.Def, source: str, options: Optional[Options] = None, *,
                 def_ranges: Optional[ranges.DefRanges] = None):
        self.options = options or Options()
        # options that leave the thread count open are planned for the count each call runs with
        Launcher.__init__(self, self._launch_entry, follow_threads=_follows_threads(self.options))
        self.def_ = def_
        self.source = source
        try:
            self.ranges = def_ranges or ranges.infer(def_)
        except TCProgramError as err:
            raise err.located(source)
        self.types: dict[str, ScalarType] = {t.name: t.scalar for t in def_.tensors}
        self._generic = None  # the generic kernel's Specialization (planned), or why there is none
        self._generic_address = None  # the generic kernel's function, once built (at its first call)
        self._generic_temps = [None]  # the generic kernel's temporaries, shared by its shapes' entries
        self._served: dict[tuple, str] = {}  # sizes -> which kernel serves them, and why
        self._background: list[threading.Thread] = []  # specialisations being compiled

    def with_options(self, options: Options) -> "Kernel":
        """The same def with other options (shares the inferred ranges)."""
        return Kernel(self.def_, self.source, options, def_ranges=self.ranges)

    @property
    def name(self) -> str:
        return self.def_.name

    @functools.cached_property
    def tuning_identity(self) -> tuple[str, str]:
        """What autotuning's records name this kernel by, as text: its def's canonical text and
        its options' key (made once; a new call shape looks up its sizes)."""
        return repr(str(self.def_)), repr(self.options.key())

    def __getattr__(self, attr: str):
        # `tcpy.define(src).matmul` works whether the source has one def or several
        def_ = self.__dict__.get("def_")
        if def_ is not None and attr == def_.name:
            return self
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {attr!r}")

    def __repr__(self) -> str:
        return f"<tcpy.Kernel {self.def_.signature()}>"

    def _repr_html_(self) -> str:
        from .display import kernel_html
        return kernel_html(self)

    # -- specialisation -------------------------------------------------------------------

    def options_for(self, sizes: Mapping[str, int]) -> Options:
        """The options used for these sizes: the autotuned ones if any, else ``self.options``."""
        from .tuning import tuned_options
        options = tuned_options(self, sizes) or self.options
        if _follows_threads(options):
            # the thread grid, chunking and blocks are for the threads the call will run with
            # (tcpy.set_num_threads, OMP_NUM_THREADS, threadpoolctl), not for every core
            options = dataclasses.replace(options, num_threads=get_num_threads())
        return options

    def specialize(self, /, *arrays_or_shapes, **sizes) -> Specialization:
        """Bind sizes (from arrays, shapes or ``name=value`` sizes) and generate the C kernel:
        the :data:`PASSES` in order, then the renderer. ``TCPY_DEBUG=2`` prints the IR after
        each pass to stderr (``loop_ir(after=...)`` returns it)."""
        return self._specialize(arrays_or_shapes, sizes)

    def _specialize(self, arrays_or_shapes, sizes, stop_after: Optional[str] = None,
                    options: Optional[Options] = None, generic: bool = False):
        """:meth:`specialize`, or with ``stop_after`` the IR after that pass (no C); ``options``
        instead of :meth:`options_for`'s; ``generic``: the size-generic kernel planned at these
        sizes (see :mod:`tcpy.generic`)."""
        sizes = self._sizes(arrays_or_shapes, sizes)
        bound = self.ranges.bind(sizes)
        options = options or self.options_for(sizes)
        ir = build_program(self.def_, bound, self.types, generic_sizes(self.def_, self.ranges) if generic else None)
        show_passes = debug_level() >= 2
        for name, run in PASSES:
            if generic and name == "lower":
                # (under "auto" a path the run-time engine lacks is worth a compile per shape;
                # "never" asked for one kernel whatever it costs)
                reason = unsupported(ir) or (runtime_gap(ir) if options.specialize == "auto" else None)
                if reason is not None:
                    return reason
            ir = run(ir, options)
            if show_passes:
                print(f"--- {self.def_.name} after {name}\n{_dump_any(ir)}", file=sys.stderr, end="")
            if name == stop_after:
                break
        if stop_after is not None:
            return ir
        digest = hashlib.sha256(repr((self.def_.name, sorted(sizes.items()))).encode()).hexdigest()[:12]
        symbol = f"tcpy_{self.def_.name}_{'generic' if generic else digest}"
        c_source, errors = emit_kernel(ir, symbol)
        return Specialization(sizes, bound, ir, c_source, errors, symbol)

    def loop_ir(self, /, *arrays_or_shapes, after: Optional[str] = None, **sizes) -> str:
        """The loop nests for these arrays, shapes or sizes, as indented text (no compiler needed);
        ``after``: the IR after that pass of :data:`PASSES` instead (a program before ``lower``)."""
        if after is None:
            return dump(self.specialize(*arrays_or_shapes, **sizes).ir)
        if after not in dict(PASSES):
            raise TCOptionError(f"loop_ir's after= must name a pass ({', '.join(dict(PASSES))}), got {after!r}")
        return _dump_any(self._specialize(arrays_or_shapes, sizes, stop_after=after))

    def c_source(self, /, *arrays_or_shapes, **sizes) -> str:
        """The generated C for these arrays, shapes or sizes."""
        return self.specialize(*arrays_or_shapes, **sizes).c_source

    def explain(self, /, *arrays_or_shapes, **sizes) -> "Explanation":
        """Inferred ranges, output shapes, preconditions and schedule, as text.

        Without arguments the ranges are symbolic; with arrays, shapes (tuples) or sizes
        (``M=64``) they are also bound to numbers.
        """
        bound_sizes = self._sizes(arrays_or_shapes, sizes) if (arrays_or_shapes or sizes) else None
        text = ranges.explain(self.ranges, bound_sizes)
        if bound_sizes is not None:
            choice, generic = self._kernel_choice(bound_sizes)
            spec = self.specialize(**bound_sizes)
            lines = [f"target: {spec.ir.options.target.describe()}", f"kernel: {choice}"]
            if generic is not None:
                planned = ", ".join(f"{k}={v}" for k, v in generic.sizes.items())
                lines.append(f"  planned at {planned or 'no sizes'}, its loops run over each call's sizes; "
                             "the schedule below is the kernel specialised to these sizes")
                from .transform.runtime_plan import describe
                program = generic.ir.program
                for nest in generic.ir.nests:  # its loop nests, as planned
                    if nest.group is not None:
                        lines.append(f"  generic kernel: fused {describe_group(program, nest.group)}")
                    elif nest.kind is NestKind.COMPUTE and nest.schedule is not None:
                        lines.append(f"  generic kernel: {generic.ir.stmts[nest.stmt]}: {nest.schedule.describe()}")
                from .transform.runtime_chains import describe as describe_chained
                chains = {i: group for group in program.groups if group.chain is not None for i in group.products}
                for index, buffer in zip(engine_statements(program), self._engine_plans(generic, bound_sizes)):
                    statement = program.statements[index]
                    what = (describe_chained(buffer, chains[index], index) if index in chains
                            else describe(buffer, statement.engine.plan))
                    lines.append(f"  generic kernel: {statement.stmt}: {what}")
            lines.append("schedule:")
            for nest in spec.ir.nests:
                if nest.group is not None:
                    lines.append(f"  fused {describe_group(spec.ir.program, nest.group)}")
                    for node in nest.body:
                        if isinstance(node, BlockChain):
                            for product in node.heads + node.tails:
                                packed = f"; b packed once per batch ({product.prepacked})" if product.prepacked else ""
                                lines.append(f"    {product.describe()}{packed}")
                elif nest.kind is NestKind.COMPUTE and nest.schedule is not None:
                    lines.append(f"  {spec.ir.stmts[nest.stmt]}: {nest.schedule.describe()}")
                    lines.extend(f"    why: {reason}" for reason in nest.schedule.reasons)
                elif nest.body and isinstance(nest.body[0], ContractionNest):
                    node = nest.body[0]
                    lines.append(f"  {spec.ir.stmts[nest.stmt]}: {node.describe()}")
                    lines.extend(f"    why: {reason}" for reason in node.plan.reasons)
                    if node.epilogue is not None:
                        lines.extend(f"    epilogue: {spec.ir.stmts[i]}: in the store of the last K block "
                                     "(reads the output only at the element it writes)"
                                     for i in node.epilogue.members)
            text = text.rstrip("\n") + "\n" + "\n".join(lines) + "\n"
        return Explanation(text)

    def _sizes(self, /, arrays_or_shapes, sizes: Mapping[str, int]) -> dict[str, int]:
        if arrays_or_shapes:
            args = [_stand_in(a, p, self.types) for a, p in zip(arrays_or_shapes, self.def_.params)]
            args += list(arrays_or_shapes[len(args):])
            _, bound = binding.bind_arguments(self.def_, args)
        else:
            bound = {}
        for name, value in sizes.items():
            if name not in self.def_.size_vars:
                raise TCArgumentError(
                    f"def '{self.def_.name}' has no size variable {name!r}; "
                    f"its sizes are {', '.join(self.def_.size_vars) or 'none'}")
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
                raise TCArgumentError(f"size {name} of def '{self.def_.name}' must be an int, got {value!r}")
            if not 0 <= value <= binding.MAX_SIZE:  # the limit a call's arrays have
                shown = value if abs(value) < 10**20 else f"an int of {int(value).bit_length()} bits"
                raise TCOverflowError(f"size {name} of def '{self.def_.name}' must be from 0 to {binding.MAX_SIZE} "
                                      f"(the int32 index range), got {shown}")
            bound[name] = int(value)
        missing = [s for s in self.def_.size_vars if s not in bound]
        if missing:
            raise TCArgumentError(
                f"def '{self.def_.name}' needs values for sizes {', '.join(missing)} "
                "(pass arrays, shapes, or name=value sizes)")
        return bound

    # -- generic kernels and tiering ---------------------------------------------------------

    def _generic_options(self) -> Options:
        """The options a generic kernel is planned with: for the thread count the options fix,
        else for at least two threads (the kernel serves every count: a call's count runs its
        parallel loops)."""
        return dataclasses.replace(self.options, num_threads=self.options.num_threads or max(2, self.options.threads))

    def _generic_plan(self, sizes: Mapping[str, int]):
        """The generic kernel's Specialization, planned at the first call's ``sizes``; or why
        this def has none (text). It is built when a shape first runs on it
        (:meth:`_launch_entry`), not before: a first shape may still need a specialised kernel."""
        if self._generic is None:
            self._generic = self._specialize((), sizes, options=self._generic_options(), generic=True)
        return self._generic

    def _kernel_choice(self, sizes: Mapping[str, int]) -> tuple[str, Optional[Specialization]]:
        """Which kernel serves calls with ``sizes`` and why; and the generic kernel's
        specialisation (planned, not built, before a call) when it is the one."""
        served = self._served.get(_sizes_key(sizes))
        if served is None:
            forced = self._specialised_by_options(sizes)
            if forced is not None:
                return forced, None
        elif not served.startswith("generic"):
            return served, None
        # (planned here without being kept: the generic kernel is planned at the first call's sizes)
        generic = self._generic or self._specialize((), sizes, options=self._generic_options(), generic=True)
        if isinstance(generic, str):
            return f"specialised to these sizes: no generic kernel, {generic}", None
        plans = self._engine_plans(generic, sizes)
        if isinstance(plans, str):
            return f"specialised to these sizes: no generic kernel, {plans}", None
        return served or _generic_text(self.options.specialize), generic

    def _specialised_by_options(self, sizes: Mapping[str, int]) -> Optional[str]:
        """Why calls with ``sizes`` get a kernel specialised to them whatever the generic kernel
        can run (the options ask for it, fix the engine's plan, or tcpy.autotune chose options
        for these sizes), or None."""
        from .tuning import tuned_options
        if self.options.specialize == "always":
            return "specialised to these sizes (Options(specialize='always'))"
        if self.options.plan:
            return "specialised to these sizes (Options.plan fixes the contraction engine's plan)"
        if tuned_options(self, sizes) is not None:
            return "specialised to these sizes, with the options tcpy.autotune found for them"
        return None

    def finish_specializations(self, timeout: Optional[float] = None) -> None:
        """Wait for the specialised kernels compiled in the background (``specialize="auto"``)."""
        for thread in list(self._background):
            thread.join(timeout)

    def _launch_entry(self, args) -> LaunchEntry:
        """Launcher miss: check arguments, plan (generic kernel) or specialise and build, and
        describe the call."""
        arrays, sizes = binding.bind_arguments(self.def_, args)
        _check_runnable(self.options.target)
        if self._specialised_by_options(sizes) is None:
            generic = self._generic_plan(sizes)
            if not isinstance(generic, str):
                bound = self.ranges.bind(sizes)  # (once: the plans and the entry read it)
                plans = self._engine_plans(generic, sizes, bound)
                if not isinstance(plans, str):
                    if self._generic_address is None:
                        # the first generic call builds the library; planning again after the
                        # compile (which evicts the caches) leaves the planner's code and data warm
                        # for the next new shape: planned cold, it would cost about twice as much
                        self._generic_address = _build_and_load(generic, generic.ir.options)
                        plans = self._engine_plans(generic, sizes, bound)
                    return self._generic_entry(generic, sizes, plans, bound)
                generic = plans
            self._served[_sizes_key(sizes)] = f"specialised to these sizes: no generic kernel, {generic}"
        return self._specialized_entry(self.specialize(**sizes), sizes)

    def _engine_plans(self, generic: Specialization, sizes: Mapping[str, int], bound=None):
        """The plan buffers of the generic kernel's contractions at ``sizes`` (``bound``: its
        ranges bound to them, if at hand) (:func:`tcpy.transform.runtime_plan.plan_buffer`), or
        why these sizes need a specialised kernel (text)."""
        program = generic.ir.program
        bound = bound or self.ranges.bind(sizes)
        shapes = {**{p.name: p.type.shape(sizes) for p in self.def_.params}, **bound.shapes}

        def nbytes(tensors) -> int:
            return sum(volume(shapes[t.name]) * self.types[t.name].bits // 8 for t in tensors)

        whole = [t for t in self.def_.temporaries if t.name not in program.shrunk]  # (not in a fused group)
        temporaries, arguments = nbytes(whole), nbytes(self.def_.params + self.def_.returns)
        if self.options.specialize == "auto" and temporaries > max(GENERIC_TEMPORARIES_RATIO * arguments,
                                                                    self.options.target.l2):
            return (f"its temporaries whole ({_bytes_text(temporaries)}) would take more than "
                    f"{GENERIC_TEMPORARIES_RATIO} times its arguments and results ({_bytes_text(arguments)}): "
                    "fused statements keep them in per-thread blocks")
        engines = engine_statements(program)
        if not engines:
            return ()
        from .transform.runtime_chains import chain_buffers
        from .transform.runtime_plan import plan_buffer
        threads = self.options.num_threads or get_num_threads()
        chained = {}
        for template in generic.chain_templates.values():
            found = chain_buffers(template, bound.statements, shapes, sizes, generic.ir.options, threads)
            if found is None:
                group = template.group
                return f"the chain of statements {group.statements[0] + 1} to {group.statements[-1] + 1} " \
                       "does not run generically at these sizes"
            chained.update(found)
        plans = []
        for index in engines:
            statement = program.statements[index]
            buffer = chained.get(index)
            if buffer is None:
                buffer = plan_buffer(statement, bound.statements[statement.origin], shapes, program.types,
                                     sizes, generic.ir.options, threads)
            if buffer is None:
                return (f"statement {statement.origin + 1} is no contraction the generic kernel's engine runs "
                        "at these sizes")
            plans.append(buffer)
        return tuple(plans)

    def _generic_entry(self, generic: Specialization, sizes: Mapping[str, int],
                       plans: tuple = (), bound=None) -> LaunchEntry:
        """The generic kernel's entry for ``sizes``: their checks, shapes, size block and the
        plan buffers of its contractions (``plans``); ``bound``: the ranges bound to them, if at
        hand (the kernel built: :meth:`_launch_entry`)."""
        address = self._generic_address
        bound = bound or self.ranges.bind(sizes)  # the preconditions, as a specialised kernel's
        key = _sizes_key(sizes)
        self._served.setdefault(key, _generic_text(self.options.specialize))
        statements = [(s.stmt, bound.statements[s.origin]) for s in generic.ir.program.statements]
        auto = self.options.specialize == "auto"
        holder = []
        points = _points(ranges for _, ranges in statements)
        hot_calls = max(2, min(SPECIALIZE_AFTER_CALLS, -(-SPECIALIZE_AFTER_POINTS // max(1, points))))

        def hot(table_key):
            # (options for the calling thread's count, found once the shape is hot: most never are)
            self._specialize_in_background(table_key, holder[0], sizes, self.options_for(sizes), hot_calls)

        entry = self._entry(generic, bound, statements, address, self.options.num_threads or 0, points,
                            constants=(size_block(self.ranges.size_vars, sizes), *plans),
                            on_hot=hot if auto else None, hot_calls=hot_calls, temp_pool=self._generic_temps)
        holder.append(entry)
        return entry

    def _specialize_in_background(self, table_key, generic_entry: LaunchEntry, sizes, options: Options,
                                  calls: int) -> None:
        """Compile the kernel specialised to ``sizes`` (hot after ``calls`` calls) in the worker
        process (:mod:`tcpy.runtime.worker`: planned here, it would hold the interpreter and
        stall the caller's calls), waited for by a thread; the launcher's entry for
        ``table_key`` switches to it when it is built (unless it changed meanwhile)."""

        def built() -> LaunchEntry:
            path, symbol, arguments = worker.run(_build_specialised, self.def_, self.source, self.options,
                                                 options, sizes)
            return LaunchEntry(func_address=load_symbol(path, symbol), **arguments)

        def run():
            try:
                entry = _once_more_if_damaged(built)
            except Exception as err:  # the generic kernel keeps serving
                self._served[_sizes_key(sizes)] += f"; its specialisation failed ({err})"
                return
            self.replace(table_key, generic_entry, entry)
            self._served[_sizes_key(sizes)] = (
                f"specialised to these sizes: compiled in the background after {calls} "
                f"call{'s' if calls > 1 else ''} (Options(specialize='auto'))")

        thread = threading.Thread(target=run, name=f"tcpy specialise {self.def_.name}", daemon=True)
        self._background = [t for t in self._background if t.is_alive()] + [thread]
        thread.start()

    def _specialized_entry(self, spec: Specialization, sizes: Mapping[str, int]) -> LaunchEntry:
        """The entry of a kernel specialised to ``sizes``."""
        arguments = self._specialized_arguments(spec)
        # (the address is found after the memory check: no compile for a call that cannot run)
        return LaunchEntry(func_address=_build_and_load(spec, spec.ir.options), **arguments)

    def _specialized_arguments(self, spec: Specialization) -> dict:
        """:meth:`_entry_arguments` of the kernel ``spec``, specialised to its sizes."""
        statements = [(s.stmt, s.ranges) for s in spec.ir.program.statements]
        return self._entry_arguments(spec, spec.bound, statements,
                                     spec.ir.options.num_threads or 0,  # else tcpy.set_num_threads, then OpenMP's
                                     _points(ranges for _, ranges in statements))

    def _entry(self, spec: Specialization, bound, statements, address: int, num_threads: int, points: int,
               **extra) -> LaunchEntry:
        """A launcher entry for the kernel ``spec`` at ``bound`` sizes (:meth:`_entry_arguments`)
        whose function is at ``address``; ``extra``: more of LaunchEntry's arguments."""
        return LaunchEntry(func_address=address, **self._entry_arguments(spec, bound, statements, num_threads, points),
                           **extra)

    @functools.cached_property
    def _entry_fixed(self) -> tuple[dict, frozenset, tuple]:
        """What a launcher entry's arguments take from the def alone, read at every new call
        shape: each tensor's NumPy dtype, the outputs a caller's ``out=`` array is accumulated
        into, and the inputs' dtypes."""
        dtypes = {name: binding.numpy_dtype(scalar) for name, scalar in self.types.items()}
        return (dtypes, frozenset(s.target for s in caller_accumulations(self.def_)),
                tuple(dtypes[p.name] for p in self.def_.params))

    def _entry_arguments(self, spec: Specialization, bound, statements, num_threads: int, points: int) -> dict:
        """A launcher entry's arguments, but its function's address, for the kernel ``spec`` at
        ``bound`` sizes, once its arrays fit the machine's memory; ``statements``: each statement
        of its program with its ranges at those sizes; ``points``: their iterations
        (:func:`_points`)."""
        shapes = bound.shapes
        program = spec.ir.program
        dtypes, accumulated, input_dtypes = self._entry_fixed

        def array_spec(name):
            if name in program.shrunk:  # replaced by per-thread buffers of a fused group
                return ((0,) * len(shapes[name]), dtypes[name], False)
            return (tuple(shapes[name]), dtypes[name], not _covered(name, statements, shapes[name]), name in accumulated)

        outputs = {r.name: array_spec(r.name) for r in self.def_.returns}
        temporaries = {**{t.name: array_spec(t.name) for t in self.def_.temporaries},
                       **{c: (program.shapes[c], binding.numpy_dtype(program.types[c]), False) for c in program.copies},
                       **{s.name: (s.shape, binding.numpy_dtype(s.type), False) for s in spec.ir.scratch}}
        _check_memory(self.def_.name, bound.sizes, outputs, temporaries)  # before the compiler runs
        return dict(
            n_inputs=len(self.def_.params),
            input_dtypes=input_dtypes,
            output_specs=list(outputs.values()),
            temp_specs=list(temporaries.values()),
            error_messages=list(spec.error_messages),
            num_threads=num_threads,
            single_output=len(self.def_.returns) == 1,
            quick=points < QUICK_CALL_POINTS,
        )


@functools.cache  # (asked at every new call shape)
def _generic_text(mode: str) -> str:
    """What serves a shape from the generic kernel, under ``Options(specialize=mode)``."""
    if mode == "never":
        return "generic (compiled once for every shape, Options(specialize='never'))"
    return (f"generic (compiled once for every shape; specialised in the background after "
            f"{SPECIALIZE_AFTER_CALLS} calls of a shape, fewer for a large one, Options(specialize='auto'))")


def _sizes_key(sizes: Mapping[str, int]) -> tuple:
    return tuple(sorted(sizes.items()))


def _points(statement_ranges) -> int:
    """Iterations of all statements (each given by its ranges) together: a measure of a
    kernel's work."""
    return sum(volume(hi - lo for lo, hi in ranges.values()) for ranges in statement_ranges)


def _check_runnable(target: Target) -> None:
    """Raise :class:`~tcpy.TCOptionError` when kernels built for ``target`` cannot run here
    (another architecture, or an ISA this CPU lacks): gcc could not build them, or they would
    stop on an illegal instruction."""
    if target.can_run_here():
        return
    runnable = ", ".join(repr(name) for name in PRESETS if Target.preset(name).can_run_here())
    raise TCOptionError(
        f"target {target.name!r} ({target.arch}) cannot be built or run on this machine "
        f"({Target.host().describe()}); c_source(), loop_ir() and explain() show its code, calls need a "
        f"target this machine runs: 'host'{', ' + runnable if runnable else ''} (Options(target=) or TCPY_TARGET)")


def _check_memory(def_name: str, sizes: Mapping[str, int], outputs: Mapping[str, tuple],
                  temporaries: Mapping[str, tuple]) -> None:
    """Raise :class:`~tcpy.TCMemoryError` when a call's outputs and temporaries (``name: (shape,
    dtype, ...)``) need more bytes than this machine's memory, naming the largest of them and
    their sizes."""
    needed = [(math.prod(int(d) for d in shape) * dtype.itemsize, kind, name, shape, dtype)
              for kind, specs in (("output", outputs), ("temporary", temporaries))
              for name, (shape, dtype, *_) in specs.items()]
    total, memory = sum(n for n, *_ in needed), _memory_bytes()
    if total <= memory:
        return  # (the text below only for an error: a new call shape of a generic kernel passes here)
    largest = sorted(needed, key=lambda item: -item[0])[:3]
    raise TCMemoryError(
        f"def '{def_name}' at sizes {', '.join(f'{n}={v}' for n, v in sizes.items())} needs "
        f"{_bytes_text(total)} for its outputs and temporaries, more than this machine's {_bytes_text(memory)} "
        f"of memory: " + "; ".join(f"{kind} {name} ({dtype}, shape {tuple(int(d) for d in shape)}) needs "
                                   f"{_bytes_text(n)}" for n, kind, name, shape, dtype in largest))


@functools.cache  # (asked at every new call shape; the machine's memory stays)
def _memory_bytes() -> int:
    """This machine's physical memory (when unknown: the most bytes an array may have)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return sys.maxsize


def _bytes_text(n: int) -> str:
    """``68719476736`` -> ``64.0 GiB``."""
    for unit, scale in (("EiB", 2**60), ("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def _follows_threads(options: Options) -> bool:
    """Whether kernels with these options plan for the calling thread count: it is not fixed,
    and the target has this machine's cores (the host or a preset; a target with other cores
    simulates a larger machine)."""
    return not options.num_threads and options.target.cores == Target.host().cores


def _build_specialised(def_: ast.Def, source: str, kernel_options: Options, options: Options,
                       sizes: Mapping[str, int]) -> tuple[str, str, dict]:
    """(Run in the worker process.) The kernel of ``def_`` (``kernel_options``: its kernel's)
    specialised to ``sizes`` with ``options``, built: its library's path, its symbol and its
    launcher entry's other arguments (:meth:`Kernel._entry_arguments`)."""
    kernel = Kernel(def_, source, kernel_options)
    spec = kernel._specialize((), sizes, options=options)
    arguments = kernel._specialized_arguments(spec)  # (checks the memory before the compiler runs)
    return _build(spec, options), spec.symbol, arguments


def _build(spec: Specialization, options: Options) -> str:
    """The path of the kernel's library, built or found in the cache."""
    flags = list(SEMANTIC_FLAGS) + (["-ffast-math"] if options.fast_math else [])
    check_loadable(options.cflags)
    return build_library(spec.c_source, flags=flags, user_flags=options.cflags, target=options.target)


def _build_and_load(spec: Specialization, options: Options) -> int:
    """The kernel's address: built or found in the cache (:func:`_once_more_if_damaged`)."""
    return _once_more_if_damaged(lambda: load_symbol(_build(spec, options), spec.symbol))


def _once_more_if_damaged(build_and_load: Callable[[], T]) -> T:
    """``build_and_load()``, once more if it raised :class:`TCCompilerError`: a cached library
    that does not load (damaged on disk) has been removed by ``load_symbol``, and the second
    build makes it afresh."""
    try:
        return build_and_load()
    except TCCompilerError:
        return build_and_load()


def _covered(tensor: str, statements, shape) -> bool:
    """Whether the first statement writing ``tensor`` (of ``statements``: each with its ranges)
    writes all of it without reading it (so it needs no zero fill)."""
    for stmt, extents in statements:
        if stmt.target == tensor:
            return (stmt.reduction is None or stmt.init) and all(extents[v][0] <= 0 and extents[v][1] >= extent
                       for v, extent in zip(stmt.output_vars, shape))
    return False


class Explanation(str):
    """Text that shows itself as text at the REPL and in notebooks."""

    def __repr__(self) -> str:
        return str(self)


def _stand_in(arg, param: ast.Param, types):
    """A shape tuple becomes a zero-strided array of the parameter's dtype (no memory)."""
    if isinstance(arg, tuple) and all(isinstance(d, (int, np.integer)) for d in arg):
        if any(d < 0 for d in arg):
            raise TCShapeError(f"the shape of {param.name} must have sizes >= 0, got {arg}")
        dtype = binding.numpy_dtype(types[param.name])
        return np.broadcast_to(np.zeros((), dtype), arg)
    return arg


class Library:
    """All defs of a source with several: ``lib.matmul(A, B)``, ``lib["matmul"]``."""

    def __init__(self, kernels: Mapping[str, object]):
        self._kernels = dict(kernels)

    def __getattr__(self, name: str):
        try:
            return self._kernels[name]
        except KeyError:
            raise AttributeError(name) from None

    def __getitem__(self, name: str):
        try:
            return self._kernels[name]
        except (KeyError, TypeError):
            raise TCLookupError(f"no def named {name!r}; the source defines "
                                f"{', '.join(repr(n) for n in self._kernels)}") from None

    def __iter__(self):
        return iter(self._kernels.values())

    def __dir__(self):
        return list(self._kernels) + list(super().__dir__())

    def __repr__(self) -> str:
        return f"<tcpy.Library {', '.join(self._kernels)}>"


def define(source: str, name: Optional[str] = None, *, options: Optional[Options] = None,
           backend: str = "compiled"):
    """Parse and check TC ``source`` and return a callable kernel.

    ``name`` picks one def when the source has several; without it a single-def source gives
    its :class:`Kernel` and a multi-def source a :class:`Library` (``lib.matmul``).
    ``backend="reference"`` evaluates the def directly in NumPy (slow, exact; for checking).
    Raises a :class:`~tcpy.TCProgramError` subclass for a bad program.
    """
    if backend not in BACKENDS:
        raise TCArgumentError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if options is not None and not isinstance(options, Options):
        raise TCOptionError(f"options must be a tcpy.Options, got {type(options).__name__}")
    program = parse(source)
    for def_ in program.defs:
        for stmt in caller_accumulations(def_):
            warnings.warn(
                f"line {stmt.span.line}: in def '{def_.name}': output '{stmt.target}' is accumulated with "
                f"'{stmt.op}' before anything writes it, so it adds to the values of the caller's out= "
                f"array (zeros without out=); write '{stmt.op}!' to start from the identity",
                TCWarning, stacklevel=2)

    def make(def_: ast.Def):
        if backend == "reference":
            from .reference import define_reference
            return define_reference(def_, source)
        return Kernel(def_, source, options)

    if name is not None or len(program.defs) < 2:
        return make(select_def(program, name))
    return Library({d.name: make(d) for d in program.defs})
