"""What pyproject.toml declares is what the code needs: every third-party module tbljax imports
(outside an `except ImportError` fallback) is a declared dependency or extra, and every core
dependency has a `>=` floor that .ci/run installs and tests. (The floors themselves are proved
by that CI job: the oldest versions, pinned, pass the tests.)"""
from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
IMPORT_NAME_TO_DIST = {"PIL": "pillow", "google": "protobuf"}
# Modules whose imports belong to an extra, not the core: the framework adapters, the PNG
# grid of `tbljax show` (Pillow), the Hugging Face and TFDS sources, conversion on Beam.
EXTRA_OF = {"torch.py": "torch", "mlx.py": "mlx", "show.py": "pil", "hf_sources.py": "hf",
            "tfds_sources.py": "tfds", "tf_example.py": "tfds", "beam.py": "beam"}
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
                for h in node.handlers):
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
        assert re.fullmatch(r"[A-Za-z0-9_.-]+>=[0-9][0-9A-Za-z.]*", d.replace(" ", "")), \
            f"{d!r}: .ci/run pins each core dependency's '>=' floor and tests it"
    floors = {_dist(d): d.split(">=")[1] for d in deps}
    assert floors["jax"] == floors["jaxlib"]  # jax pins its own jaxlib
    ci = (REPO / ".ci" / "run").read_text()
    assert "pyproject.toml" in ci and "venv-floor" in ci
