"""The package keeps DESIGN.md's map: data flows one way, so a module imports only modules
upstream of it, and no module reaches into another's private names. Read from the source (the
`ast` of every module, imports inside functions included), so a new module must take its place
in `ROOMS` below, and a shortcut fails here before it spreads."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "tbljax"

# Upstream first. A module may import only modules of an earlier line (never its own line or
# a later one). "tbljax" is the public facade (__init__.py).
ROOMS = [
    ["_core", "_ffi_cuda"],                      # native: the core (C++), the CUDA handler
    ["contract", "sharding", "braces", "partition"],  # shared rules; `sharding=`; {a,b}; host parts
    ["remote"],                                  # files at a URL (fsspec), retried and resumed
    ["format", "order", "kernels", "batch", "sources"],  # file bytes; order; kernel; buffers; inputs
    ["reader", "augment"],                       # open a file; crops and flips
    ["conversion", "options", "local_part", "staging"],  # sources -> file; loader options; host part; copy to disk
    ["step"],                                    # positions -> samples -> crops and flips
    ["plan", "ops"],                             # one host batch; the kernel inside jit
    ["producer"],                                # the threads of a pass
    ["host_loader"],                             # cursor, state, metrics
    ["jax_loader", "_adapter"],                  # JAX arrays; what torch and MLX share
    ["torch", "mlx", "resident"],                # adapters; the dataset on device
    ["benchmark", "show"],                       # tools over the loaders
    ["tbljax"],                                  # the public facade
    ["demo"],                                    # the demo program
    ["cli"],                                     # the command line
]
RANK = {m: r for r, line in enumerate(ROOMS) for m in line}


def _modules() -> dict[str, Path]:
    mods = {p.stem: p for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    mods["tbljax"] = PACKAGE / "__init__.py"
    return mods


def _imports(tree: ast.AST) -> list[tuple[str, int, list[str]]]:
    """(tbljax module imported, line, names taken from it) for every import in the tree."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                if parts[0] == "tbljax":
                    found.append((parts[1] if len(parts) > 1 else "tbljax", node.lineno, []))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            parts = node.module.split(".")
            if parts[0] != "tbljax":
                continue
            if len(parts) > 1:
                found.append((parts[1], node.lineno, [a.name for a in node.names]))
            else:  # from tbljax import x, y: modules, or names of the facade
                for a in node.names:
                    target = a.name if a.name in RANK else "tbljax"
                    found.append((target, node.lineno, [] if target != "tbljax" else [a.name]))
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant)
              and str(node.args[0].value).startswith("tbljax.")):
            found.append((str(node.args[0].value).split(".")[1], node.lineno, []))
    return found


def _module_aliases(tree: ast.AST) -> dict[str, str]:
    """Local names bound to tbljax modules: {alias: module}."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "tbljax":
            for a in node.names:
                if a.name in RANK:
                    aliases[a.asname or a.name] = a.name
        elif isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                if parts[0] == "tbljax" and len(parts) == 2 and a.asname:
                    aliases[a.asname] = parts[1]
    return aliases


def test_every_module_has_a_place_on_the_map():
    assert sorted(set(_modules()) - set(RANK)) == []
    assert sorted(set(RANK) - set(_modules()) - set(ROOMS[0])) == []


@pytest.mark.parametrize("module", sorted(_modules()))
def test_imports_flow_downstream_only(module):
    tree = ast.parse(_modules()[module].read_text())
    upward = [f"line {line}: imports {target} (rank {RANK.get(target)} >= {RANK[module]})"
              for target, line, _ in _imports(tree)
              if target in RANK and target != module and RANK[target] >= RANK[module]]
    assert upward == [], f"tbljax/{module}: " + "; ".join(upward)


@pytest.mark.parametrize("module", sorted(_modules()))
def test_no_private_name_of_another_module(module):
    tree = ast.parse(_modules()[module].read_text())
    bad = [f"line {line}: from tbljax.{target} import {name}"
           for target, line, names in _imports(tree) if target != module
           for name in names if name.startswith("_") and name != "__version__"]
    aliases = _module_aliases(tree)
    bad += [f"line {node.lineno}: {node.value.id}.{node.attr}" for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            and node.value.id in aliases and aliases[node.value.id] != module
            and node.attr.startswith("_") and not node.attr.startswith("__")]
    assert bad == [], f"tbljax/{module} uses private names: " + "; ".join(bad)


def test_the_checks_catch_what_they_guard_against():
    # The two rules above, on code that breaks them.
    tree = ast.parse("from tbljax.jax_loader import Loader\nfrom tbljax import kernels as k\n"
                     "k._core\nimport importlib\nimportlib.import_module('tbljax.plan')\n")
    targets = [t for t, _, _ in _imports(tree)]
    assert targets == ["jax_loader", "kernels", "plan"] or sorted(targets) == sorted(
        ["jax_loader", "kernels", "plan"])
    assert _module_aliases(tree) == {"k": "kernels"}


def test_the_readme_files_map_lists_every_module_and_folder():
    repo = PACKAGE.parent
    readme = (repo / "README.md").read_text()
    files = readme[readme.index("## Files"):]
    files = files[:files.find("\n## ", 1)] if "\n## " in files[1:] else files
    mentioned = set(re.findall(r"`([^`]+)`", files))
    expanded = set()
    for m in mentioned:  # "`tbljax/torch.py`, `tbljax/mlx.py`" and "`a`, `b`" rows
        expanded.update(p.strip() for p in m.split(","))
    want = {f"tbljax/{p.name}" for p in PACKAGE.glob("*.py") if p.name != "__init__.py"}
    want |= {f"{p.relative_to(repo)}/" for p in (repo / "ffi").iterdir() if p.is_dir()}
    want |= {f"{p.name}/" for p in repo.iterdir()
             if p.is_dir() and not p.name.startswith(".")
             and p.name not in ("build", "dist", "tbljax", "ffi")}  # those two: by part
    missing = sorted(w for w in want if w not in expanded)
    assert missing == [], f"README.md's Files map does not list {missing}"
