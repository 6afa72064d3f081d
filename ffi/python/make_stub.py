"""Generates the typed stub of the _core module found in PKG_DIR with nanobind's stubgen.

Usage: python make_stub.py PKG_DIR [stubgen options, e.g. -o PKG_DIR/_core.pyi -M py.typed]

CMakeLists.txt runs it after a developer build (PKG_DIR = src/tbljax/ in the sources) and at
install (PKG_DIR = the installed package); tests/test_native.py runs it again to check that
the stub beside a module is that module's. The module is imported as tbljax._core -- the name
users import it by, which the stub's own imports follow -- from PKG_DIR itself: a stand-in
`tbljax` package whose path is PKG_DIR only, so neither another tbljax installed on sys.path
nor the package's __init__ (jax and the rest) takes part.
"""
import sys
import types

from nanobind.stubgen import main

if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    package = types.ModuleType("tbljax")
    package.__path__ = [sys.argv[1]]
    sys.modules["tbljax"] = package
    main(["-q", "-m", "tbljax._core", *sys.argv[2:]])
