"""What pyproject.toml declares is what the code needs: every third-party module tbljax imports
(outside an `except ImportError` fallback) is a declared dependency or extra, and every core
dependency has a `>=` floor that .ci/run installs and tests. (The floors themselves are proved
by that CI job: the oldest versions, pinned, pass the tests.) And what the wheel tells users and
tools: one version, the licence, classifiers, extras each installable on its own, the linked
libraries' versions, and a missing system package named."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
IMPORT_NAME_TO_DIST = {"PIL": "pillow", "google": "protobuf"}
# Modules whose imports belong to an extra, not the core: the framework adapters, the PNG
# grid of `tbljax show` (Pillow), the Hugging Face and TFDS sources, conversion on Beam.
EXTRA_OF = {
    "torch.py": "torch",
    "mlx.py": "mlx",
    "show.py": "pil",
    "huggingface.py": "hf",
    "tfds.py": "tfds",
    "tf_example.py": "tfds",
    "beam.py": "beam",
    "fields.py": "pil",
}  # fields.py: a .png mask member or sidecar, read at conversion
# Used when installed, never needed: a progress bar in Jupyter (convert's progress report).
ENHANCEMENTS = {"tqdm", "IPython"}


def _dist(dep: str) -> str:
    return re.split(r"[<>=!~;\[ ]", dep, maxsplit=1)[0].lower().replace("_", "-")


def _guarded(tree: ast.AST) -> set[int]:
    """Line numbers of imports inside `try:` blocks that catch ImportError (optional imports)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
            isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError", "Exception")
            for h in node.handlers
        ):
            for stmt in node.body:
                lines.update(n.lineno for n in ast.walk(stmt) if isinstance(n, (ast.Import, ast.ImportFrom)))
    return lines


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    optional = _guarded(tree)
    mods = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in optional:
            continue
        if isinstance(node, ast.Import):
            mods.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            mods.add(node.module.split(".")[0])
    return {m for m in mods if m not in sys.stdlib_module_names and m != "tbljax" and m not in ENHANCEMENTS}


def test_every_import_is_declared():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    core = {_dist(d) for d in project["dependencies"]}
    extras = {name: {_dist(d) for d in deps} for name, deps in project["optional-dependencies"].items()}
    missing = []
    for path in sorted((REPO / "src" / "tbljax").rglob("*.py")):
        for mod in imported_modules(path):
            dist = IMPORT_NAME_TO_DIST.get(mod, mod).lower().replace("_", "-")
            extra = EXTRA_OF.get(path.name)
            if not (dist in core or (extra is not None and dist in extras.get(extra, set()))):
                missing.append(f"{path.name} imports {mod} ({dist})")
    assert missing == [], missing


def test_core_dependencies_have_floors_that_ci_pins():
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    for d in deps:
        assert re.fullmatch(r"[A-Za-z0-9_.-]+>=[0-9][0-9A-Za-z.]*", d.replace(" ", "")), (
            f"{d!r}: .ci/run pins each core dependency's '>=' floor and tests it"
        )
    floors = {_dist(d): d.split(">=")[1] for d in deps}
    assert floors["jax"] == floors["jaxlib"]  # jax pins its own jaxlib
    ci = (REPO / ".ci" / "run").read_text()
    assert "pyproject.toml" in ci and "venv-floor" in ci


# ---- the wheel's metadata and native linkage (scripts/check-wheel.sh builds and installs the
# wheel itself, in CI) ----

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
# The extras users install on their own; new ones join this list.
USER_EXTRAS = {"torch", "mlx", "gcs", "s3", "http", "pil"}


def test_one_version_source():
    from tbljax import _core

    assert len(re.findall(r"(?m)^version\s*=", (REPO / "pyproject.toml").read_text())) == 1
    version = PYPROJECT["project"]["version"]
    # CMake compiles pyproject's version into the module; __version__ and --version read it.
    assert _core.native_info()["version"] == version
    cmake = (REPO / "CMakeLists.txt").read_text()
    assert "project(tbljax VERSION ${SKBUILD_PROJECT_VERSION}" in cmake and "pyproject.toml" in cmake
    literals = [
        f"{p.relative_to(REPO)}: {line.strip()}"
        for p in sorted((REPO / "src").rglob("*.py"))
        for line in p.read_text().splitlines()
        if re.search(r"""__version__\s*(:\s*str\s*)?=\s*["']""", line)
    ]
    assert literals == []


def test_licence_files_and_expression():
    project = PYPROJECT["project"]
    assert project["license"] == "Apache-2.0"
    assert "Apache License" in (REPO / "LICENSE").read_text()[:200]
    assert "Version 2.0, January 2004" in (REPO / "LICENSE").read_text()[:200]
    for pattern in project["license-files"]:
        assert list(REPO.glob(pattern)), f"license-files {pattern!r} matches no file"
    # The libraries a wheel links statically ship their licences (pyproject: TBLJAX_STATIC_DEPS).
    for name in ("libjpeg-turbo", "lz4"):
        assert (REPO / "LICENSES" / f"{name}.txt").stat().st_size > 1000
    # PEP 639: a licence expression replaces the licence classifiers.
    assert not [c for c in project["classifiers"] if c.startswith("License ::")]


def test_python_classifiers_follow_requires_python():
    project = PYPROJECT["project"]
    floor = tuple(int(x) for x in re.fullmatch(r">=(\d+)\.(\d+)", project["requires-python"]).groups())
    listed = sorted(
        tuple(int(x) for x in m.groups())
        for c in project["classifiers"]
        if (m := re.fullmatch(r"Programming Language :: Python :: (\d+)\.(\d+)", c))
    )
    assert listed and listed[0] == floor, (floor, listed)
    assert listed == [(3, m) for m in range(floor[1], listed[-1][1] + 1)]  # no gap


def test_extras_are_each_installable_on_their_own():
    from packaging.requirements import Requirement

    extras = PYPROJECT["project"]["optional-dependencies"]
    assert USER_EXTRAS <= set(extras), USER_EXTRAS - set(extras)
    for name, deps in extras.items():
        reqs = [Requirement(d) for d in deps]  # raises on a malformed requirement
        assert reqs, f"extra {name!r} is empty"
        # An extra that needs another extra of tbljax is not installable on its own.
        assert not [r for r in reqs if r.name == "tbljax"], name


def test_wheels_link_their_native_dependencies_statically():
    # What pip builds (wheels, sdists) links the archives; plain CMake (scripts/dev-build.sh,
    # scripts/sanitize.sh) the system's shared libraries.
    assert PYPROJECT["tool"]["scikit-build"]["cmake"]["define"]["TBLJAX_STATIC_DEPS"] == "ON"
    assert 'option(TBLJAX_STATIC_DEPS "' in (REPO / "CMakeLists.txt").read_text()
    assert "check-wheel.sh" in (REPO / ".ci" / "run").read_text()


def test_build_info_reports_the_linked_libraries():
    """The versions are the linked code's: libjpeg-turbo's own version string in the object
    that holds its functions (read back from that file here), lz4's LZ4_versionString()."""
    import ctypes

    from tbljax import _core

    info = _core.native_info()
    lib = Path(info["libjpeg_library"])
    found = re.search(rb"libjpeg-turbo version (\d+\.\d+\.\d+)", lib.read_bytes())
    assert found and found[1].decode() == info["libjpeg_turbo"], (lib, info["libjpeg_turbo"])
    if info["native_deps"] == "static":
        # Both inside _core (scripts/check-wheel.sh proves the wheel loads neither library).
        assert lib.resolve() == Path(_core.__file__).resolve()
        assert info["lz4"] == info["lz4_headers"]
    else:
        assert info["native_deps"] == "shared" and lib.resolve() != Path(_core.__file__).resolve()
        mapped = {
            line.split()[-1]
            for line in Path("/proc/self/maps").read_text().splitlines()
            if re.search(r"/liblz4\.so", line)
        }
        assert mapped
        for path in mapped:
            version = ctypes.CDLL(path).LZ4_versionString
            version.restype = ctypes.c_char_p
            assert version().decode() == info["lz4"], path


@pytest.mark.slow
@pytest.mark.parametrize("static", ["ON", "OFF"])
@pytest.mark.parametrize("missing, package", [("jpeg", "libjpeg-dev"), ("lz4", "liblz4-dev")])
def test_a_missing_system_package_is_named(tmp_path, static, missing, package):
    """What `pip install` of the sdist prints when a -dev package the README lists is absent:
    the system's include and library folders are hidden from CMake (libjpeg handed over by
    hand when lz4 is the one missing)."""
    cmake = shutil.which("cmake")
    if cmake is None or not Path("/usr/include/jpeglib.h").exists():
        pytest.skip("needs cmake and the system's libjpeg headers")
    hidden = [
        "/usr/include",
        "/usr/local/include",
        *map(str, Path("/usr/include").glob("*-linux-gnu")),
        "/usr/lib",
        "/usr/local/lib",
        "/lib",
        *map(str, Path("/usr/lib").glob("*-linux-gnu")),
        *map(str, Path("/lib").glob("*-linux-gnu")),
    ]
    args = [
        cmake,
        "-S",
        str(REPO),
        "-B",
        str(tmp_path),
        f"-DPython_EXECUTABLE={sys.executable}",
        f"-DCMAKE_IGNORE_PATH={';'.join(hidden)}",
        f"-DTBLJAX_STATIC_DEPS={static}",
    ]
    if missing == "lz4":
        jpeg = sorted(Path("/usr/lib").rglob("libjpeg.a" if static == "ON" else "libjpeg.so"))
        if not jpeg:
            pytest.skip("no system libjpeg to hand over")
        args += ["-DJPEG_INCLUDE_DIR=/usr/include", f"-DJPEG_LIBRARY_RELEASE={jpeg[0]}"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    message = " ".join(r.stderr.split())
    assert f"apt-get install {package}" in message, r.stderr
    assert ("TBLJAX_STATIC_DEPS=OFF" in message) == (static == "ON"), r.stderr


def test_import_tbljax_imports_no_framework_and_no_optional_dependency():
    # `import tbljax` (and so the CLI) stays quick and works without the extras: jax loads with
    # the first loader, the frameworks and format libraries with the sources that need them.
    import subprocess
    import sys

    heavy = ["jax", "torch", "mlx", "google.protobuf", "pyarrow", "datasets", "array_record", "apache_beam", "PIL"]
    code = f"import sys, tbljax; print([m for m in {heavy!r} if m in sys.modules])"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "[]", (r.stdout, r.stderr)
