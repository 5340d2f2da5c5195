"""C code generation: :mod:`.emit` renders a kernel's loop IR as C, :mod:`.contraction` a
contraction engine statement.

The renderer is Python source compiled by Cython (pure-Python mode) when tcpy is installed:
every module of this package but the packages' ``__init__`` files (see setup.py).
``TCPY_PURE_PYTHON=1`` loads the ``.py`` sources instead (:mod:`tcpy.compiled`); each module's
``COMPILED`` says which one runs.
"""
