"""A size-generic library's C as translation units that gcc compiles side by side.

A size-generic kernel holds every routine its shapes may need (micro-kernels of several widths,
packing routines, the winograd path's transforms, chains' block products): one file of them
took gcc 1.5-2.2 s, one core, at a def's first call. :func:`units` rewrites such a file into
*units* (see :data:`tcpy.runtime.build.UNIT_MARK`): the declarations every unit needs first
(the header, typedefs, ``static inline`` helpers and a prototype of each routine), then each
routine and the kernel function after a unit mark. :mod:`tcpy.runtime.build` compiles the units
in as many gcc processes as there are cores to run them and links one library; compiled as one
file, the text is the same program.

A routine (a function at file scope, not ``static inline``) becomes a hidden global
(``TCPY_ROUTINE``: visible to the library's other units, not exported), so it is not inlined
into callers in other units: routines are called per block of work, never per element (what is
called per element is ``static inline``). A renderer may put a unit mark with flags directly
before a routine (:data:`HAND_VECTORISED`); the other units get tcpy's default flags.

Routines and typedefs the same but for their names (an online chain's products on one whole row
and on a block of rows, whose contractions differ in their extents only, which they read at run
time) are compiled once: the later names are replaced by the first's.
"""
import re

from tcpy.runtime.build import UNIT_MARK

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CALLED = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*\(")  # a name before its parenthesis
_TYPEDEF = re.compile(r"typedef [A-Za-z0-9_]+ ([A-Za-z_][A-Za-z0-9_]*)[ ;]")  # (of a one-word type)

#: Written by a renderer directly before a routine whose vector code is written out: gcc at -O2
#: runs it as fast as at -O3, whose vectoriser and cloning of functions only add compile time
#: (the run-time engine's micro-kernels, its packing of A and its loops over cells: GEMM,
#: attention and convolutions ran within 1% at -O2, AMD Zen 5).
HAND_VECTORISED = UNIT_MARK + ": -O2 */"


def units(source: str) -> str:
    """``source`` (a kernel's C: declarations, routines and the kernel function at file scope,
    as the renderers write them: a function's first line at column 0 ends with its ``{``, its
    last line is ``}``) as declarations and units; when it is not laid out so, ``source``
    without unit marks (one translation unit)."""
    lines = source.split("\n")
    declarations, inline, routines = [], [], []
    first: dict[tuple[str, str], str] = {}  # a typedef's or routine's text but its name -> its name
    renamed: dict[str, str] = {}  # the names of repeats -> the first's

    def repeats(kind: str, name: str, text: str) -> bool:
        same = (kind, _IDENTIFIER.sub(lambda m: "" if m.group(0) == name else m.group(0), text))
        if same in first:
            renamed[name] = first[same]
            return True
        first[same] = name
        return False

    at, mark = 0, None
    while at < len(lines):
        line = lines[at]
        if line.startswith(UNIT_MARK):
            at, mark = at + 1, line
            continue
        end = _closing_line(lines, at) if _opens_function(line) else at
        if end is None or (mark is not None and end == at):
            return _one_unit(lines)  # (a function not closed, or a mark not right before a routine)
        text = _IDENTIFIER.sub(lambda m: renamed.get(m.group(0), m.group(0)), "\n".join(lines[at:end + 1]))
        typedef = _TYPEDEF.match(text)
        if end == at and not (typedef and repeats("typedef", typedef.group(1), text)):
            declarations.append(text)
        elif line.startswith("static inline "):
            inline.append(text)
        elif end > at and not repeats(mark or UNIT_MARK + " */", _name(line), text):
            routines.append((mark or UNIT_MARK + " */", text))
        at, mark = end + 1, None
    if not routines:
        return _one_unit(lines)
    prototypes = [_global(text.split("\n", 1)[0])[:-1].rstrip() + ";" for _, text in routines]
    out = declarations + prototypes + inline
    for mark, text in routines:
        out += [mark, _global(text)]
    return "\n".join(out)


def _name(first_line: str) -> str:
    """The name of the function whose first line is ``first_line``."""
    return next(name for name in _CALLED.findall(first_line) if name != "__attribute__")


def _opens_function(line: str) -> bool:
    """Whether ``line`` is the first line of a function definition at file scope."""
    return (bool(line) and not line[0].isspace() and line.endswith("{") and "(" in line
            and "=" not in line.split("(", 1)[0] and not line.startswith(("#", "/*", "typedef", "}")))


def _closing_line(lines: list[str], start: int):
    """The index of the line ``}`` that closes the function opened at ``start`` (None if there is none)."""
    for at in range(start + 1, len(lines)):
        if lines[at] == "}":
            return at
        if lines[at] and not lines[at][0].isspace() and not lines[at].startswith("#"):
            return None  # (file scope again without the closing line: not a layout this module knows)
    return None


def _one_unit(lines: list[str]) -> str:
    """The source of ``lines`` without unit marks."""
    return "\n".join(line for line in lines if not line.startswith(UNIT_MARK))


def _global(first_line: str) -> str:
    """A routine's first line with ``static`` replaced by the library-wide linkage."""
    return "TCPY_ROUTINE " + first_line[len("static "):] if first_line.startswith("static ") else first_line
