"""Issue 45 item 6: the signatures README.md and docs/reference.md show are held to the real
functions (`inspect.signature`: every parameter documented and nothing documented that is not
there, defaults where the doc shows a literal), and the command-line synopses to the argument
parser (every flag of every command shown, every flag shown real). A new argument fails here
until the docs name it. A documented list ending in `...` is an abridged one: only what it
names is checked."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

from tbljax._src.tools import cli

REPO = Path(__file__).resolve().parents[1]
DOCS = ["README.md", "docs/reference.md"]
FORMER_NAMES = {("HostLoader", "layout")}  # kept for old callers; the reference says so in words


def _functions() -> dict:
    import tbljax.mlx
    import tbljax.torch

    return {
        "convert": tbljax.convert,
        "open": tbljax.open,
        "loader": tbljax.loader,
        "mix": tbljax.mix,
        "stage": tbljax.stage,
        "bench": tbljax.bench,
        "torch.loader": tbljax.torch.loader,
        "mlx.loader": tbljax.mlx.loader,
        "ResidentDataset": tbljax.ResidentDataset,
        "HostLoader": tbljax.HostLoader,
    }


def _split_top(args: str) -> list[str]:
    """Comma-separated parts at bracket depth 0."""
    parts, depth, cur = [], 0, ""
    for ch in args:
        depth += ch in "([{" and 1 or -(ch in ")]}")
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return [p.strip() for p in [*parts, cur] if p.strip()]


def documented(text: str, name: str) -> list[str] | None:
    """The parameter list of the first signature of tbljax.`name` in `text`: a call whose
    parentheses hold a `*` or are followed by `->`; None when the doc shows none."""
    for m in re.finditer(r"tbljax\." + re.escape(name) + r"\(", text):
        depth, i = 1, m.end()
        while depth and i < len(text):
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        inner = re.sub(r"\s+", " ", text[m.end() : i - 1])
        parts = _split_top(inner)
        if "*" in parts or text[i : i + 4].strip().startswith("->"):
            return parts
    return None


def cases():
    for doc in DOCS:
        text = (REPO / doc).read_text()
        for name in (
            "convert",
            "open",
            "loader",
            "mix",
            "stage",
            "bench",
            "torch.loader",
            "mlx.loader",
            "ResidentDataset",
            "HostLoader",
        ):
            params = documented(text, name)
            if params is not None:  # the README shows some; the reference every one (below)
                yield pytest.param(doc, name, params, id=f"{doc}:{name}")


@pytest.mark.parametrize("doc,name,params", list(cases()))
def test_documented_signature_is_the_real_one(doc, name, params):
    real = inspect.signature(_functions()[name]).parameters
    abridged = "..." in params
    shown = {}
    for p in params:
        if p in ("*", "...") or p.startswith("**"):
            continue
        key, _, default = p.partition("=")
        shown[key.strip()] = default.strip()
    assert not set(shown) - set(real), (
        f"{doc}: tbljax.{name} documents {sorted(set(shown) - set(real))}, which it does not take"
    )
    if not abridged:
        missing = [k for k in real if k not in shown and (name, k) not in FORMER_NAMES]
        assert not missing, f"{doc}: tbljax.{name} takes {missing}, not documented"
    for k, d in shown.items():
        try:
            value = ast.literal_eval(d) if d else inspect.Parameter.empty
        except (ValueError, SyntaxError):
            continue  # a name (IMAGENET_MEAN) or words (64 MiB): not a literal to compare
        if d:
            assert real[k].default == value, f"{doc}: tbljax.{name}'s {k} defaults to {real[k].default!r}, not {d}"


def test_reference_shows_every_signature():
    text = (REPO / "docs/reference.md").read_text()
    assert [n for n in _functions() if documented(text, n) is None] == []


def synopsis(doc: str) -> dict[str, set[str]]:
    """The flags a doc's command-line synopsis (the code block after '## Command line') shows, per command."""
    text = (REPO / doc).read_text()
    block = re.search(r"## Command line\n+```\w*\n(.*?)```", text, re.S)[1]
    flags: dict[str, set[str]] = {}
    command = None
    for line in block.splitlines():
        m = re.match(r"tbljax (\S+)", line)
        if m:  # a line of its own command; `tbljax --version` of none
            command = None if m[1].startswith("-") else m[1]
        if command:
            flags.setdefault(command, set()).update(re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", line.split("#")[0]))
    return flags


@pytest.mark.parametrize("doc", DOCS)
def test_cli_synopsis_is_the_parser(doc):
    shown = synopsis(doc)
    for name, parser in cli.build_parser().commands.items():
        options = [a.option_strings for a in parser.options if a.option_strings and a.dest != "help"]
        missing = [o[-1] for o in options if not set(o) & shown.get(name, set())]
        assert not missing, f"{doc}: the synopsis of tbljax {name} leaves out {missing}"
        real = {s for o in options for s in o} | {"-h", "--help"}
        unknown = shown.get(name, set()) - real
        assert not unknown, f"{doc}: the synopsis of tbljax {name} shows {sorted(unknown)}, which it does not take"
    assert "tbljax --version" in (REPO / doc).read_text()


# Issue 44 §4: the loader options are declared once, on LoaderOptions. Each front end's signature
# holds every field (a new option reaches every loader with no edit there), with LoaderOptions'
# default unless the front end says otherwise, and its source declares and passes none of them.
FRONT_ENDS = {
    "loader": ("src/tbljax/_src/jax/loader.py", {}, set()),
    "torch.loader": ("src/tbljax/_src/adapters/torch.py", {"layout": "NCHW"}, {"num_epochs"}),
    "mlx.loader": ("src/tbljax/_src/adapters/mlx.py", {}, {"num_epochs"}),
}  # one epoch a pass


@pytest.mark.parametrize("name", FRONT_ENDS)
def test_loader_options_are_declared_once(name):
    import dataclasses

    import tbljax

    source, overrides, left_out = FRONT_ENDS[name]
    real = inspect.signature(_functions()[name]).parameters
    for f in dataclasses.fields(tbljax.LoaderOptions):
        if f.name in left_out:
            assert f.name not in real
            continue
        assert f.name in real, f"tbljax.{name} does not take the loader option {f.name}"
        want = overrides.get(f.name, f.default)
        assert real[f.name].default == (inspect.Parameter.empty if want is dataclasses.MISSING else want)
    assert list(real)[:2] == ["path_or_paths", "batch_size"]  # both positional, as before
    option_names = {f.name for f in dataclasses.fields(tbljax.LoaderOptions)}
    tree = ast.parse((REPO / source).read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "loader")
    declared = {a.arg for a in fn.args.args + fn.args.kwonlyargs}
    passed = {k.arg for n in ast.walk(ast.Module(fn.body, [])) if isinstance(n, ast.Call) for k in n.keywords}
    assert declared & option_names == set(), f"{source} declares loader options again"
    assert passed & option_names == set(), f"{source} passes loader options one by one"


def test_front_ends_refuse_an_option_they_leave_out_by_name():
    import tbljax.mlx

    with pytest.raises(TypeError, match=r"tbljax\.mlx\.loader\(\): got an unexpected keyword argument 'num_epochs'"):
        tbljax.mlx.loader("x.tbl", 4, num_epochs=2)
