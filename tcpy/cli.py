"""The ``tcpy`` command line: check, explain and emit TC files, manage the kernel cache, run the demo.

Examples are in ``tcpy --help`` (:data:`EPILOG`).

``python -m tcpy ...`` is the same program. Exit status: 0 on success, 1 when the program is
rejected (the error is printed like a compiler's), 2 for a bad command line (a file that cannot
be read or written, a bad option or size; a one-line error).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from .errors import TCError, TCOptionError, TCOverflowError, TCProgramError

EPILOG = """\
examples:
  tcpy check kernels.tc
  tcpy explain kernels.tc --name matmul --sizes M=64,N=32,K=16
  tcpy emit kernels.tc --name matmul --sizes M=64,N=32,K=16 -o matmul.c
  tcpy tune kernels.tc --name matmul --sizes M=512,N=512,K=512
  tcpy cache info
  tcpy demo

FILE may be '-' to read TC source from standard input."""


class UsageError(Exception):
    """A command line that names something that does not exist (exit status 2)."""


def _read(path: str) -> tuple[str, str]:
    """(source, file name for diagnostics)."""
    if path == "-":
        return sys.stdin.read(), "<stdin>"
    try:
        return Path(path).read_text(encoding="utf-8"), path
    except OSError as err:
        raise UsageError(f"cannot read {path}: {err.strerror}") from None
    except UnicodeDecodeError as err:
        raise UsageError(f"cannot read {path}: expected UTF-8 text, found byte 0x{err.object[err.start]:02x} "
                         f"at offset {err.start}") from None


def _parse_sizes(text: Optional[str]) -> dict[str, int]:
    """``"M=64,N=32"`` -> ``{"M": 64, "N": 32}``."""
    sizes: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in (text or "").split(","))):
        name, eq, value = item.partition("=")
        name = name.strip()
        try:
            if not eq or not name.isidentifier():
                raise ValueError
            sizes[name] = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"bad size {item!r}: expected NAME=INTEGER, e.g. --sizes M=64,N=32") from None
    return sizes


def _positive(text: str) -> int:
    """An argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def _options(args):
    """The tcpy.Options the schedule flags ask for."""
    from .options import Options

    return Options(
        tile_sizes=args.tile or {},
        loop_order=tuple(v.strip() for v in args.order.split(",")) if args.order else (),
        num_threads=args.threads,
        parallel=not args.no_parallel,
        fast_math=args.fast_math,
    )


def _kernel(args):
    """The kernel the command line names (``--name`` picks one def of several)."""
    from .api import Library, define

    source, filename = _read(args.file)
    try:
        defined = define(source, args.name, options=_options(args))
    except TCProgramError as err:
        raise err.located(source, filename) from None
    if isinstance(defined, Library):
        names = ", ".join(k.name for k in defined)
        raise UsageError(f"{filename} defines several defs ({names}); pick one with --name")
    return defined


# ------------------------------------------------------------------------------------ commands


def cmd_check(args) -> int:
    """Parse, check and infer ranges of every def; print each signature."""
    from . import ranges
    from .lang import parse

    status = 0
    for path in args.files:
        source, filename = _read(path)
        try:
            program = parse(source, filename)
            for def_ in program.defs:
                ranges.infer(def_, source, filename)
        except TCProgramError as err:
            print(err.located(source, filename), file=sys.stderr)
            status = 1
            continue
        for def_ in program.defs:
            print(f"{filename}: ok: {def_.signature()}")
    return status


def cmd_explain(args) -> int:
    """Ranges, shapes and preconditions of one def (bound to --sizes when given), and its schedule."""
    kernel = _kernel(args)
    print(kernel.explain(**args.sizes), end="")
    return 0


def cmd_emit(args) -> int:
    """The generated C of one def for --sizes, to stdout or -o FILE."""
    kernel = _kernel(args)
    c_source = kernel.c_source(**args.sizes)
    if args.output:
        try:
            Path(args.output).write_text(c_source)
        except OSError as err:
            raise UsageError(f"cannot write {args.output}: {err.strerror}") from None
        print(f"wrote {args.output} ({len(c_source.splitlines())} lines)", file=sys.stderr)
    else:
        print(c_source, end="" if c_source.endswith("\n") else "\n")
    return 0


def cmd_tune(args) -> int:
    """Autotune one def on random inputs of --sizes; record and print the fastest options."""
    import numpy as np

    from .tuning import autotune

    kernel = _kernel(args)
    missing = [s for s in kernel.def_.size_vars if s not in args.sizes]
    if missing:
        raise UsageError(f"--sizes must give {', '.join(missing)} (the def's sizes are "
                         f"{', '.join(kernel.def_.size_vars)})")
    kernel.specialize(**args.sizes)  # sizes checked (range, preconditions) before allocating
    rng = np.random.default_rng(0)
    arrays = [rng.random(p.type.shape(args.sizes)).astype(kernel.types[p.name].numpy_name)
              for p in kernel.def_.params]
    best = autotune(kernel, *arrays, repeat=args.repeat, progress=not args.quiet)
    print(kernel.explain(**args.sizes).split("schedule:")[1].strip())
    print(f"recorded for these sizes: {best}")
    return 0


def cmd_cache(args) -> int:
    """Show where compiled kernels are cached and how many, or delete them."""
    from .runtime import build
    from .tuning import clear_tuned

    if args.action == "info":
        info = build.cache_info()
        print(f"directory: {info['dir']}")
        print(f"kernels:   {info['entries']} ({info['generic']} size-generic, "
              f"{info['entries'] - info['generic']} specialised to shapes)")
        print(f"size:      {info['bytes'] / 1e6:.1f} MB")
        print("(set TCPY_CACHE_DIR to use another directory)")
    else:
        removed = build.clear_cache()
        print(f"removed {removed} compiled kernel{'s' if removed != 1 else ''} from {build.cache_dir()}")
        if clear_tuned():
            print("removed the autotuning results (tuned.json)")
    return 0


def cmd_demo(args) -> int:
    """GEMM, conv2d and attention: compile, check against NumPy, time."""
    from . import demo

    return demo.main()


# ---------------------------------------------------------------------------------- argparse


def _kernel_arguments(p: argparse.ArgumentParser, sizes_required: bool) -> None:
    """FILE, --name, --sizes and the schedule options shared by explain and emit."""
    p.add_argument("file", metavar="FILE", help="TC source file ('-' for standard input)")
    p.add_argument("--name", help="which def, when the file has several")
    p.add_argument("--sizes", type=_parse_sizes, default={}, required=sizes_required,
                   metavar="M=64,N=32", help="values of the size variables")
    tuning = p.add_argument_group("schedule options (see tcpy.Options)")
    tuning.add_argument("--tile", type=_parse_sizes, metavar="m=64,k=256",
                        help="tile sizes per index variable (0: do not tile)")
    tuning.add_argument("--order", metavar="m,k,n", help="loop order, outermost first")
    tuning.add_argument("--threads", type=_positive, metavar="N", help="OpenMP threads (default: all CPUs)")
    tuning.add_argument("--no-parallel", action="store_true", help="no OpenMP parallel loops")
    tuning.add_argument("--fast-math", action="store_true", help="compile with -ffast-math")


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of the whole command line (one subcommand per action)."""
    parser = argparse.ArgumentParser(
        prog="tcpy",
        description="Tensor Comprehensions for Python: check, explain and compile TC kernels.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from . import __version__

    parser.add_argument("--version", action="version", version=f"tcpy {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("check", help="parse and check TC files; report errors like a compiler",
                       description="Parse, type-check and infer ranges of every def. Prints each "
                                   "def's signature, or compiler-style errors (exit status 1).")
    p.add_argument("files", nargs="+", metavar="FILE", help="TC source files ('-' for standard input)")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("explain", help="show inferred ranges, output shapes, preconditions, schedule",
                       description="Per statement, each index variable's range (symbolic, and bound "
                                   "to --sizes when given), output shapes and size preconditions.")
    _kernel_arguments(p, sizes_required=False)
    p.set_defaults(func=cmd_explain)

    p = sub.add_parser("emit", help="print the generated C for given sizes",
                       description="Generate the shape-specialised C kernel for --sizes.")
    _kernel_arguments(p, sizes_required=True)
    p.add_argument("-o", "--output", metavar="FILE.c", help="write the C here instead of stdout")
    p.set_defaults(func=cmd_emit)

    p = sub.add_parser("tune", help="autotune one def for --sizes and record the fastest schedule",
                       description="Time a few schedules of one def on random inputs of --sizes "
                                   "(see tcpy.autotune) and record the fastest in the cache, so later "
                                   "calls with these shapes use it.")
    _kernel_arguments(p, sizes_required=True)
    p.add_argument("--repeat", type=_positive, default=5, metavar="R", help="timed calls per candidate")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser("cache", help="show or clear the compiled-kernel cache",
                       description="The disk cache of compiled kernels ($TCPY_CACHE_DIR or the "
                                   "user cache directory).")
    p.add_argument("action", choices=("info", "clear"))
    p.set_defaults(func=cmd_cache)

    p = sub.add_parser("demo", help="compile GEMM, conv2d and attention; check and time vs NumPy",
                       description="Compile GEMM, a convolution and attention written as TC "
                                   "comprehensions, check them against NumPy and print timings.")
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command line; return the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (UsageError, TCOptionError, TCOverflowError) as err:  # the command line asks the impossible
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        parser.exit(2, f"tcpy {args.command}: error: {first}\n")
    except TCProgramError as err:
        print(str(err), file=sys.stderr)
    except TCError as err:
        print(f"tcpy {args.command}: error: {err}", file=sys.stderr)
    return 1
