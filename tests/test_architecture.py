"""The package keeps docs/architecture.md's map: a public facade over private rooms, one folder
per room under `tbljax/_src/`, data flowing one way. A module imports only modules upstream of
it (an earlier folder, or an earlier module of its own folder), and no module reaches into
another's private names or private attributes. Read from the source (the `ast` of every
module, imports inside functions included), so a new module must take its place in `ROOMS`
below, and a shortcut fails here before it spreads."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "src" / "tbljax"

# Upstream first: (folder, its modules in order). A module may import a module of an earlier
# folder, or an earlier module of its own folder; never a later one. Names are dotted paths
# inside the package ("_src.datasets.reader"); the public facade is the package's top level
# ("tbljax" is its __init__.py), last, so no private room depends on it.
ROOMS = [
    ("native", ["_core", "_ffi_cuda"]),  # the C++ core and the CUDA handler
    (
        "_src/rules",
        [
            "errors",
            "contract",
            "geometry",
            "braces",
            "partition",
            "parts",
            "order",
            "quantiles",
            "resume",
            "mixing",
            "pixel_filters",
            "pixel_ops",
            "image_ops",
            "randaug",
            "erasing",
            "record_geometry",
            "bbox_crop",
            "scale_jitter",
            "augment",
            "buckets",
            "naflex",
            "mixup",
            "dataset",
            "options",
        ],
    ),  # what every path agrees on
    ("_src/file", ["fields", "field_meta", "format", "field_columns"]),  # the TBL file's bytes from Python
    (
        "_src/datasets",
        ["stats", "decoding", "reader", "host_part", "mixture", "opening"],
    ),  # opening and combining datasets
    (
        "_src/engine",
        [
            "memory",
            "pixel_program",
            "kernels",
            "rows",
            "ring",
            "step",
            "views",
            "native_res",
            "naflex_lengths",
            "naflex_pack",
            "canvas",
            "file_sweep",
            "record_source",
            "geometric_serving",
            "batch_fields",
            "plan",
            "producer",
            "host_loader",
        ],
    ),  # the framework-free serving machine
    (
        "_src/jax",
        [
            "collectives",
            "sharding",
            "packed",
            "registration",
            "twin",
            "twin_affine",
            "twin_hue",
            "twin_ops",
            "twin_patch_ops",
            "ffi_call",
            "program",
            "partitioning",
            "ops",
            "mixup",
            "arrays",
            "loader",
            "resident_host",
            "resident_fields",
            "resident_plans",
            "resident_buckets",
            "resident_patch_ops",
            "resident_patches",
            "resident_pack",
            "resident_lengths",
            "resident",
        ],
    ),  # JAX arrays, the kernel inside jit
    ("_src/adapters", ["common", "torch", "mlx"]),  # torch and MLX
    ("_src/remote", ["remote", "staging"]),  # files at URLs, shards staged to local disk
    (
        "_src/sources",
        [
            "items",
            "arrays",
            "tar_shards",
            "files",
            "hf_columns",
            "huggingface",
            "tf_example",
            "tfds_features",
            "tfds",
            "coco",
            "choose",
        ],
    ),  # what a conversion reads
    (
        "_src/conversion",
        [
            "progress",
            "convert_options",
            "label_table",
            "geometric_fields",
            "image_records",
            "record_writer",
            "convert_tbl",
            "convert",
        ],
    ),  # sources -> a TBL file
    (
        "_src/tools",
        ["benchmark", "show", "demo", "beam", "cli_parser", "cli_commands", "cli"],
    ),  # programs over the loaders
    (
        "facade",
        ["kernels", "order", "augment", "show", "demo", "ops", "torch", "mlx", "beam", "tbljax", "__main__"],
    ),  # what users import
]


def _name(folder: str, module: str) -> str:
    if folder in ("native", "facade"):
        return module
    return folder.replace("/", ".") + "." + module


RANK = {_name(f, m): (r, i) for r, (f, mods) in enumerate(ROOMS) for i, m in enumerate(mods)}


def _modules() -> dict[str, Path]:
    mods = {}
    for p in PACKAGE.rglob("*.py"):
        rel = p.relative_to(PACKAGE).with_suffix("")
        if rel.name == "__init__":
            if rel.parent == Path("."):
                mods["tbljax"] = p
            continue  # a room's __init__ holds only its docstring (checked below)
        mods[".".join(rel.parts)] = p
    return mods


def _resolve(dotted: str) -> str:
    """The module a `tbljax...` dotted import names: "tbljax" for the facade itself."""
    parts = dotted.split(".")[1:]
    return ".".join(parts) if parts else "tbljax"


def _imports(tree: ast.AST) -> list[tuple[str, int, list[str]]]:
    """(module imported, line, names taken from it) for every tbljax import in the tree."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "tbljax":
                    found.append((_resolve(a.name), node.lineno, []))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] != "tbljax":
                continue
            base = _resolve(node.module)
            for a in node.names:
                sub = a.name if base == "tbljax" else f"{base}.{a.name}"
                if sub in RANK:  # `from tbljax._src.datasets import reader`: the module itself
                    found.append((sub, node.lineno, []))
                else:
                    found.append((base, node.lineno, [a.name]))
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", "") == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and str(node.args[0].value).startswith("tbljax.")
        ):
            found.append((_resolve(str(node.args[0].value)), node.lineno, []))
    return found


def _module_aliases(tree: ast.AST) -> dict[str, str]:
    """Local names bound to tbljax modules: {alias: module}."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "tbljax":
            base = _resolve(node.module)
            for a in node.names:
                sub = a.name if base == "tbljax" else f"{base}.{a.name}"
                if sub in RANK:
                    aliases[a.asname or a.name] = sub
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "tbljax" and a.asname:
                    aliases[a.asname] = _resolve(a.name)
    return aliases


def _own_private_names(tree: ast.AST) -> set[str]:
    """Private names this module defines: functions, classes, attributes it assigns."""
    own = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            own.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            own.add(node.id)
        elif isinstance(node, ast.arg):
            own.add(node.arg)
    return own


def private_reaches(tree: ast.AST, module: str) -> list[str]:
    """Every use of another module's private name: imported, through a module alias, or as an
    attribute of an object that this module did not define (``ds._files``)."""
    bad = [
        f"line {line}: from tbljax.{target} import {name}"
        for target, line, names in _imports(tree)
        if target != module
        for name in names
        if name.startswith("_") and not name.startswith("__") and target + "." + name not in RANK
    ]
    aliases = _module_aliases(tree)
    own = _own_private_names(tree)
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
            continue
        if isinstance(node.value, ast.Name) and node.value.id in aliases:
            # The native modules' private names are test hooks (_core._set_..._limit): allowed.
            if aliases[node.value.id] not in (module, "_core", "_ffi_cuda"):
                bad.append(f"line {node.lineno}: {node.value.id}.{node.attr}")
        elif node.attr not in own:
            bad.append(f"line {node.lineno}: .{node.attr} (an attribute this module does not define)")
    return bad


def test_every_module_has_a_place_on_the_map():
    assert sorted(set(_modules()) - set(RANK)) == []
    assert sorted(set(RANK) - set(_modules()) - {"_core", "_ffi_cuda"}) == []


def test_private_rooms_are_folders_of_one_layer_each():
    rooms = sorted(p.name for p in (PACKAGE / "_src").iterdir() if p.is_dir() and p.name != "__pycache__")
    assert rooms == sorted(f.split("/")[1] for f, _ in ROOMS if f.startswith("_src/"))
    for room in rooms:  # a room's __init__ says what the room is for and exports nothing
        tree = ast.parse((PACKAGE / "_src" / room / "__init__.py").read_text())
        assert ast.get_docstring(tree), f"_src/{room}/__init__.py has no docstring"
        assert [type(n).__name__ for n in tree.body] == ["Expr"], f"_src/{room}/__init__.py holds code"


@pytest.mark.parametrize("module", sorted(_modules()))
def test_imports_flow_downstream_only(module):
    tree = ast.parse(_modules()[module].read_text())
    upward = [
        f"line {line}: imports {target} {RANK.get(target)} >= {RANK[module]}"
        for target, line, _ in _imports(tree)
        if target in RANK and target != module and RANK[target] >= RANK[module]
    ]
    unknown = [
        f"line {line}: imports {target}, which is not on the map"
        for target, line, _ in _imports(tree)
        if target not in RANK
    ]
    assert upward + unknown == [], f"tbljax/{module}: " + "; ".join(upward + unknown)


@pytest.mark.parametrize("module", sorted(_modules()))
def test_no_private_name_of_another_module(module):
    bad = private_reaches(ast.parse(_modules()[module].read_text()), module)
    assert bad == [], f"tbljax/{module} uses private names: " + "; ".join(bad)


def test_tests_use_public_seams_not_private_attributes():
    # Tests hold the code to its promises through what it offers, not through its insides.
    bad = {}
    for p in sorted((REPO / "tests").glob("*.py")):
        if p.name == Path(__file__).name:
            continue
        found = private_reaches(ast.parse(p.read_text()), "tests")
        if found:
            bad[p.name] = found
    assert bad == {}


def test_the_checks_catch_what_they_guard_against():
    tree = ast.parse(
        "from tbljax._src.jax.loader import Loader\nfrom tbljax._src.engine import kernels as k\n"
        "k._core\nimport importlib\nimportlib.import_module('tbljax._src.engine.plan')\n"
        "from tbljax import order\nds = 1\nds._files\n"
    )
    assert [t for t, _, _ in sorted(_imports(tree), key=lambda x: x[1])] == [
        "_src.jax.loader",
        "_src.engine.kernels",
        "_src.engine.plan",
        "order",
    ]
    assert _module_aliases(tree) == {"k": "_src.engine.kernels", "order": "order"}
    found = private_reaches(tree, "_src.tools.cli")
    assert found == ["line 3: k._core", "line 8: ._files (an attribute this module does not define)"]


def _backticked(section: str) -> set[str]:
    names = set()
    section = re.sub(r"```.*?```", "", section, flags=re.S)  # code blocks hold no names
    for m in re.findall(r"`([^`]+)`", section):  # "`a`, `b`" rows and "`a, b`"
        names.update(p.strip() for p in m.split(","))
    return names


def test_the_readme_files_map_lists_every_folder_and_public_module():
    readme = (REPO / "README.md").read_text()
    files = readme[readme.index("## Files") :]
    files = files[: files.find("\n## ", 1)] if "\n## " in files[1:] else files
    mentioned = _backticked(files)
    want = {f"src/tbljax/{p.name}" for p in PACKAGE.glob("*.py")}
    want |= {
        f"src/tbljax/_src/{p.name}/" for p in (PACKAGE / "_src").iterdir() if p.is_dir() and p.name != "__pycache__"
    }
    want |= {f"{p.relative_to(REPO)}/" for p in (REPO / "ffi").iterdir() if p.is_dir()}
    want |= {
        f"{p.name}/"
        for p in REPO.iterdir()
        if p.is_dir() and not p.name.startswith(".") and p.name not in ("build", "dist", "src", "ffi", "wheelhouse")
    }
    missing = sorted(w for w in want if w not in mentioned)
    assert missing == [], f"README.md's Files map does not list {missing}"


def test_the_architecture_document_maps_every_room_and_module():
    doc = (REPO / "docs" / "architecture.md").read_text()
    mentioned = _backticked(doc)
    missing = [
        f"{folder}/{m}.py"
        for folder, mods in ROOMS
        if folder.startswith("_src/")
        for m in mods
        if f"{folder}/{m}.py" not in mentioned and f"{m}.py" not in mentioned
    ]
    missing += [f"{folder}/" for folder, _ in ROOMS if folder.startswith("_src/") and f"{folder}/" not in mentioned]
    assert missing == [], f"docs/architecture.md does not map {missing}"


FRAMEWORKS = ("jax", "torch", "mlx")
# The rooms upstream of jax/ and adapters/: framework-free, whatever runs them.
FRAMEWORK_FREE = [
    f for f, _ in ROOMS[: ROOMS.index(next(r for r in ROOMS if r[0] == "_src/jax"))] if f.startswith("_src/")
]


def _top_level_imports(tree: ast.AST) -> list[tuple[str, int]]:
    """(top-level package, line) of every import in the tree: statements at any depth, inside
    functions too, and `importlib.import_module("...")` / `__import__("...")` calls."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name.split(".")[0], node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module.split(".")[0], node.lineno))
        elif (
            isinstance(node, ast.Call)
            and (getattr(node.func, "attr", "") == "import_module" or getattr(node.func, "id", "") == "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.args[0].value.split(".")[0], node.lineno))
    return found


@pytest.mark.parametrize("room", FRAMEWORK_FREE)
def test_rooms_upstream_of_the_frameworks_import_none(room):
    bad = [
        f"{p.relative_to(PACKAGE)} line {line}: imports {top}"
        for p in sorted((PACKAGE / room).glob("*.py"))
        for top, line in _top_level_imports(ast.parse(p.read_text()))
        if top in FRAMEWORKS
    ]
    assert bad == []


def _public(dotted: str) -> bool:
    return not any(part.startswith("_") for part in dotted.split(".")[1:])


def _private_tbljax_imports(source: str) -> list[str]:
    tree = ast.parse(source)
    bad = [
        f"line {n.lineno}: {a.name}"
        for n in ast.walk(tree)
        if isinstance(n, ast.Import)
        for a in n.names
        if a.name.split(".")[0] == "tbljax" and not _public(a.name)
    ]
    bad += [
        f"line {n.lineno}: from {n.module} import ..."
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and n.module and n.module.split(".")[0] == "tbljax" and not _public(n.module)
    ]
    bad += [
        f"line {n.lineno}: from tbljax import {a.name}"
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and n.module == "tbljax"
        for a in n.names
        if a.name.startswith("_")
    ]
    return bad


@pytest.mark.parametrize("example", sorted(p.name for p in (REPO / "examples").glob("*.py")))
def test_examples_import_only_public_modules(example):
    assert _private_tbljax_imports((REPO / "examples" / example).read_text()) == []


@pytest.mark.parametrize("doc", ["README.md", "docs/reference.md"])
def test_doc_code_blocks_import_only_public_modules(doc):
    text = (REPO / doc).read_text()
    bad = [
        f"block at line {text[: m.start()].count(chr(10)) + 2}: {b}"
        for m in re.finditer(r"```python\n(.*?)```", text, re.S)
        for b in _private_tbljax_imports(m.group(1))
    ]
    assert bad == []


def test_the_import_checks_catch_what_they_guard_against():
    tree = ast.parse(
        "def f():\n    import jax.numpy as jnp\nimport importlib\nimportlib.import_module('torch')\n"
        "__import__('mlx.core')\nfrom jax import lax\n"
    )
    assert sorted(_top_level_imports(tree), key=lambda x: x[1]) == [
        ("jax", 2),
        ("importlib", 3),
        ("torch", 4),
        ("mlx", 5),
        ("jax", 6),
    ]
    assert _private_tbljax_imports(
        "from tbljax._src.tools import demo\nimport tbljax.ops\nfrom tbljax import _core, demo\n"
    ) == ["line 1: from tbljax._src.tools import ...", "line 3: from tbljax import _core"]


MAX_LINES = 450


def test_no_module_is_longer_than_the_limit():
    long = {
        str(p.relative_to(PACKAGE)): n
        for p in sorted(PACKAGE.rglob("*.py"))
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def test_row_layout_create_is_the_public_call_it_was():
    # Issue 44: the engine imports no framework, yet `tbljax.RowLayout.create(sharding, G)` (the
    # public call before the move) still works: the JAX room registers `tbljax.row_layout` for it.
    import jax

    import tbljax

    mesh = jax.sharding.Mesh(jax.devices()[:1], ("b",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("b"))
    assert tbljax.RowLayout.create(sharding, 8) == tbljax.row_layout(sharding, 8)
    assert tbljax.RowLayout.create(sharding, 8).ranges == ((0, 8),)


def test_error_classes_have_one_home():
    # Issue 44 §4: every public exception class tbljax defines is in rules/errors.py (a private one
    # that never leaves its module, sources/tfds's _Unreadable, may stay); the modules where users
    # meet them import them (the same class, its bases unchanged).
    homes = {}
    for module, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.ClassDef)
                and not node.name.startswith("_")
                and any(
                    getattr(b, "id", getattr(b, "attr", "")).endswith(("Error", "Exception", "NotFound"))
                    for b in node.bases
                )
            ):
                homes.setdefault(module, []).append(node.name)
    assert homes == {
        "_src.rules.errors": [
            "ArgumentError",
            "OutputExistsError",
            "ConversionError",
            "FieldError",
            "FieldsNotFound",
            "RemoteReadError",
        ]
    }
    import tbljax
    from tbljax import _core
    from tbljax._src.conversion import convert_options
    from tbljax._src.file import fields
    from tbljax._src.remote import remote
    from tbljax._src.rules import contract, errors

    assert (tbljax.CorruptFileError, tbljax.DecodeError) == (_core.CorruptFileError, _core.DecodeError)
    assert tbljax.ConversionError is convert_options.ConversionError is errors.ConversionError
    assert convert_options.OutputExistsError.__mro__[1:3] == (contract.ArgumentError, ValueError)
    assert issubclass(convert_options.OutputExistsError, FileExistsError)
    assert fields.FieldError.__bases__ == fields.FieldsNotFound.__bases__ == (ValueError,)
    assert remote.RemoteReadError.__bases__ == (OSError,)
    assert tbljax.ConversionError.__bases__ == (RuntimeError,)
