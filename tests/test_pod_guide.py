"""docs/pods.md matches the code. Its python blocks need a pod (a JAX job, buckets), so they are
not run (tests/test_pod.py runs the same workflow with real processes); here every block
compiles, every call of a tbljax function passes only arguments its signature takes, every
`tbljax ...` command of its shell blocks parses with the real command line parser, and the
staged file names are the names the cluster conversion writes."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import shlex
from pathlib import Path

import pytest

from tbljax._src.rules.braces import expand_braces
from tbljax._src.tools.cli import build_parser

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "pods.md"
TEXT = GUIDE.read_text()


def _blocks(lang):
    return [(TEXT[: m.start()].count("\n") + 2, m.group(1)) for m in re.finditer(rf"```{lang}\n(.*?)```", TEXT, re.S)]


def _target(name):
    """The function a dotted name of a block calls (tbljax.x.y), or None for other packages."""
    parts = name.split(".")
    if parts[0] == "loader" and len(parts) == 2:  # the blocks' JAX loader: its methods
        from tbljax._src.jax.loader import Loader

        return getattr(Loader, parts[1])
    if parts[0] != "tbljax":
        return None
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise AssertionError(f"cannot resolve {name}")


def _dotted(node):
    return (
        f"{_dotted(node.value)}.{node.attr}"
        if isinstance(node, ast.Attribute)
        else node.id
        if isinstance(node, ast.Name)
        else ""
    )


def test_python_blocks_compile_and_call_tbljax_as_its_signatures_allow():
    if "torch" in TEXT:
        pytest.importorskip("torch", reason="the guide's torch block calls tbljax.torch")
    found = _blocks("python")
    assert len(found) >= 4
    calls = 0
    for line, code in found:
        tree = ast.parse(compile(code, f"pods.md:{line}", "exec", ast.PyCF_ONLY_AST))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            fn = _target(_dotted(node.func))
            if fn is None:
                continue
            sig = inspect.signature(fn)
            args = [object()] * (len(node.args) + _dotted(node.func).startswith("loader."))  # + self
            kwargs = {k.arg: object() for k in node.keywords}
            try:
                sig.bind(*args, **kwargs)
            except TypeError as e:
                raise AssertionError(f"pods.md:{line}: {_dotted(node.func)}: {e}") from None
            calls += 1
    assert calls >= 8  # stage and loader for JAX and torch; the JAX loader's state methods


def _commands():
    """Every `tbljax ...` command of the shell blocks, continuations joined, variables set."""
    out = []
    for line, code in _blocks("bash"):
        code = code.replace("\\\n", " ")
        code = re.sub(r"\$\{?SLURM_PROCID\}?", "3", code)
        code = re.sub(r"\$\{?SLURM_(NTASKS|ARRAY_TASK_ID)\}?", "32", code)
        for m in re.finditer(r"\btbljax ([^'&\n]*)", code):
            out.append((line, shlex.split(m.group(1))))
    return out


def test_shell_commands_parse_with_the_real_cli():
    commands = _commands()
    assert {argv[0] for _, argv in commands} == {"convert", "stage"}
    for line, argv in commands:
        try:
            a = build_parser().parse_args(argv)
        except SystemExit:
            raise AssertionError(f"pods.md:{line}: `tbljax {shlex.join(argv)}` does not parse") from None
        if argv[0] == "stage" and a.partition not in (None, "host"):
            assert re.fullmatch(r"\d+/\d+", a.partition), a.partition


def test_staged_names_are_the_names_the_cluster_conversion_writes():
    """convert --shard I/N -o train-{shard}.tbl writes train-IIIII-of-NNNNN.tbl (tbljax.convert's
    docstring); the guide stages exactly those 256 names."""
    staged = {Path(argv[1]).name for _, argv in _commands() if argv[0] == "stage"}
    staged |= {Path(m).name for m in re.findall(r'URL = "([^"]+)"', TEXT)}
    assert staged == {"train-{00000..00255}-of-00256.tbl"}
    names = [Path(p).name for p in expand_braces("gs://b/" + staged.pop())]
    assert names == [f"train-{i:05d}-of-00256.tbl" for i in range(256)]
    converts = [argv for _, argv in _commands() if argv[0] == "convert"]
    assert converts and all(
        a[a.index("-o") + 1].endswith("/train-{shard}.tbl") and a[a.index("--shard") + 1] == "32/256" for a in converts
    )
