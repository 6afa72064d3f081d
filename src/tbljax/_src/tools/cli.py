"""The `tbljax` command, seven subcommands:

  convert  decode TAR shards, an image folder or image files once into a TBL file
  stage    copy TBL shard files from a URL to a local cache, verified (this host's part)
  info     describe TBL files (records, format, shapes, labels, classes, recipe, skipped items)
  verify   check every record's checksum
  show     draw a PNG grid of samples, as stored or as the loader serves them
  bench    is the input pipeline the bottleneck? loader img/s and a verdict
  demo     make a small dataset, convert it, train a JAX model on it

Exit status: 0 on success; 1 for bad data (a corrupt file, a strict conversion that met a bad
image, a conversion that could write nothing); 2 for usage errors (bad arguments, a missing
input file, an output that exists); 130 when interrupted.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Any



def _cmd_convert(a: argparse.Namespace) -> int:
    from tbljax._src.conversion.convert import convert

    summary = convert(a.sources, a.output, image_size=a.image_size, resize=a.resize,
                             max_long_side=a.max_long_side, format=a.format, quality=a.quality,
                             chroma=a.chroma, raw_budget=a.raw_budget, threads=a.threads, strict=a.strict,
                             overwrite=a.overwrite, shard=a.shard, classes=a.classes,
                             label_ext=a.label_ext, progress=False if a.quiet else None,
                             progress_interval=a.progress_interval, retries=a.retries,
                             retry_backoff=a.retry_backoff, image_column=a.image_column,
                             label_column=a.label_column, image_key=a.image_key, label_key=a.label_key,
                             fields=_field_args(a.field))
    print(summary)
    return 0


def _field_args(pairs: list[str] | None) -> dict[str, str] | None:
    """--field caption=txt --field emb=emb.npy -> {'caption': 'txt', 'emb': 'emb.npy'}."""
    if not pairs:
        return None
    out = {}
    for p in pairs:
        name, sep, ext = p.partition("=")
        if not sep or not name or not ext:
            raise ValueError(f"--field takes NAME=EXT (e.g. caption=txt, emb=emb.npy), got {p!r}")
        if name in out:
            raise ValueError(f"--field {name} given twice")
        out[name] = ext
    return out


def _cmd_stage(a: argparse.Namespace) -> int:
    import os

    from tbljax._src.remote.staging import stage

    if a.partition == "host":
        _join_jax_job()
    paths = stage(a.source, a.cache_dir, partition=a.partition, budget_bytes=a.budget,
                         retries=a.retries, retry_backoff=a.retry_backoff, workers=a.workers)
    for p in paths:  # every file, in the global order: the list a loader takes on every host
        print(p)
    here = sum(os.path.exists(p) for p in paths)
    print(f"tbljax stage: {here} of {len(paths)} files in {a.cache_dir}", file=sys.stderr)
    return 0


def _join_jax_job() -> None:
    """`stage --partition host`: joins the job's JAX runtime as the training processes will
    (cluster detected by jax.distributed.initialize) to learn this process's index and count."""
    import os

    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # copying files needs no accelerator
    import jax

    try:
        jax.distributed.initialize()
    except (ValueError, RuntimeError) as e:
        raise ValueError(f"--partition host: could not join a JAX job to learn this host's part "
                         f"({str(e).splitlines()[0] if str(e) else type(e).__name__}); it is "
                         "detected on Slurm, TPU pods and Open MPI; elsewhere give --partition I/N") from e


def _describe(path: str) -> dict[str, Any]:
    from tbljax._src.datasets import reader

    return {"path": path, **reader.open(path).describe()}


def _cmd_info(a: argparse.Namespace) -> int:
    for path in a.files:
        d = _describe(path)
        if a.json:
            print(json.dumps(d))
            continue
        print(f"{path}")
        recipe = dict(d.pop("recipe"))
        sizes = recipe.pop("source_sizes", None)
        fields = d.pop("fields", {})
        for k, v in d.items():
            if k != "path":
                print(f"  {k:22s} {v}")
        for name, f in fields.items():
            dims = ["n" if x is None else str(x) for x in f["shape"]]
            shape = "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"
            print(f"  field.{name:16s} {f['kind']:8s} {f['dtype'] or '-':8s} {shape:12s} {f['bytes']} bytes")
        for k, v in recipe.items():
            print(f"  recipe.{k:15s} {v}")
        if sizes and sizes.get("count"):
            print(f"  source sizes ({sizes['count']} images; median {sizes['median_wh'][0]}x{sizes['median_wh'][1]}, "
                  f"min {sizes['min_wh'][0]}x{sizes['min_wh'][1]}, max {sizes['max_wh'][0]}x{sizes['max_wh'][1]}):")
            print(_histogram(sizes))
    return 0


def _histogram(sizes: dict[str, Any], width: int = 40) -> str:
    """Text bars of the source images' shorter and longer sides."""
    edges = sizes["bins"]
    top = max(max(sizes["shorter_side"]), max(sizes["longer_side"]), 1)
    lines = [f"    {'pixels':>11s}  {'shorter side':<{width + 7}s} longer side"]
    for k, lo in enumerate(edges):
        label = f"{lo}-{edges[k + 1] - 1}" if k + 1 < len(edges) else f">={lo}"
        short, long_ = sizes["shorter_side"][k], sizes["longer_side"][k]
        if short == 0 and long_ == 0:
            continue
        bar_s = "#" * round(width * short / top)
        bar_l = "#" * round(width * long_ / top)
        lines.append(f"    {label:>11s}  {bar_s:<{width}s} {short:6d} {bar_l:<{width}s} {long_:6d}")
    return "\n".join(lines)


def _cmd_verify(a: argparse.Namespace) -> int:
    from tbljax import _core
    from tbljax._src.datasets import reader

    bad_total = 0
    for path in a.files:
        try:
            ds = reader.open(path)
        except _core.CorruptFileError as e:
            print(f"FAIL {e}")
            bad_total += 1
            continue
        problems = ds.verify(threads=a.threads or 0)
        bad_total += len(problems)
        for _file, _record, msg in problems[:50]:
            print(f"FAIL {msg}")
        if len(problems) > 50:
            print(f"FAIL ... and {len(problems) - 50} more records in {path}")
        if not problems:
            print(f"ok   {path}: {len(ds)} records, all checksums match")
    return 1 if bad_total else 0


def _augment_of(a: argparse.Namespace) -> Any:
    """The augmentation that --augment, --size and --center-crop ask for (None: as stored). A
    file of records of different sizes needs an output size: the error says what to pass."""
    from tbljax._src.datasets import reader
    from tbljax._src.rules.augment import Augment

    if a.center_crop:
        if a.augment is not None or a.size is None:
            raise ValueError("--center-crop takes --size S (the evaluation crop, resized to SxS) "
                             "and no --augment")
        return Augment(crop="center", flip=False, size=(a.size, a.size))
    if a.size is not None:
        if a.augment != "rrc_flip":
            raise ValueError("--size S resizes a crop to SxS: pass it with --augment rrc_flip "
                             "(training crops) or --center-crop (evaluation)")
        return Augment(size=(a.size, a.size))
    ds = reader.open(a.file)
    if len(ds) and ds.geometry.shape is None:  # the served sizes (not the source photos')
        raise ValueError(f"{a.file}: its records have different sizes (converted keeping the "
                         "aspect): pass an output size, --augment rrc_flip --size 224 (training "
                         "crops) or --center-crop --size 224 (evaluation)")
    return a.augment


def _crop_options(p: argparse.ArgumentParser, what: str) -> None:
    from tbljax._src.rules.augment import PRESETS

    p.add_argument("--augment", default=None, choices=list(PRESETS),
                   help=f"{what} with this augmentation: flip, or random-resized-crop + flip (default none)")
    p.add_argument("--size", type=int, default=None, metavar="S",
                   help="with --augment rrc_flip or --center-crop: resize the crops to SxS (needed for "
                        "files of records of different sizes)")
    p.add_argument("--center-crop", action="store_true",
                   help="the evaluation crop: the central 87.5%% of the shorter side, resized to --size")


def _cmd_bench(a: argparse.Namespace) -> int:
    from tbljax._src.tools.benchmark import bench

    r = bench(a.file, batch_size=a.batch_size, step=a.step, steps=a.steps, dtype=a.dtype, layout=a.layout,
              augment=_augment_of(a), threads=a.threads, prefetch=a.prefetch)
    print(json.dumps(r.asdict()) if a.json else r)
    return 0


def _cmd_show(a: argparse.Namespace) -> int:
    from tbljax._src.tools.show import save_grid_png

    out = save_grid_png(a.file, a.out, count=a.count, columns=a.columns, augment=_augment_of(a),
                        seed=a.seed, epoch=a.epoch)
    print(f"wrote {out}")
    return 0


def _cmd_demo(a: argparse.Namespace) -> int:
    from tbljax._src.tools import demo

    return demo.main(steps=a.steps, workdir=a.workdir)


def _version() -> str:
    from tbljax import _core

    return f"tbljax {_core.native_info()['version']}"


class _VersionAction(argparse.Action):
    """--version, reading the version only when asked (the native module loads then)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kw: Any):
        super().__init__(option_strings, dest=dest, nargs=0, default=argparse.SUPPRESS, **kw)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        print(_version())
        parser.exit()


def _retry_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--retries", type=int, default=5, metavar="N",
                   help="failures in a row a read of a URL survives, each re-opened at the byte where "
                        "it broke (default 5)")
    p.add_argument("--retry-backoff", type=float, default=0.5, metavar="SECONDS",
                   help="wait before the first retry, doubled each time up to 30 s (default 0.5)")


THREADS_HELP = "threads for decoding (default: all CPUs this process may use, or TBLJAX_NUM_THREADS)"


class CommandParser(argparse.ArgumentParser):
    """An ArgumentParser that keeps what it was given: `options`, every argument added to it
    (help included), and `commands`, the parsers of its subcommands by name; so the help of
    every option can be checked without argparse's insides. Subcommand parsers are of this
    class too (argparse makes them of the parent's class)."""

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        self.__dict__.setdefault("options", []).append(action)
        if action.option_strings:  # each option's flags by its Python name (`in_cli_words`)
            self.__dict__.setdefault("flags", {})[action.dest] = "/".join(action.option_strings)
        return action

    def add_subparsers(self, **kwargs: Any):
        self._subcommands = super().add_subparsers(**kwargs)
        return self._subcommands

    @property
    def commands(self) -> dict[str, argparse.ArgumentParser]:
        sub = getattr(self, "_subcommands", None)
        return dict(sub.choices) if sub is not None else {}


def in_cli_words(message: str, flags: dict[str, str]) -> str:
    """An error of the Python API in the words of the command line: `overwrite=True` ->
    `--overwrite`, `format='jpeg'` -> `--format jpeg`, `image_size` -> `-s/--image-size`, and
    `image_size must be ..., got None` (the flag was not given) -> `-s/--image-size is required`."""
    for dest, flag in flags.items():
        message = re.sub(rf"\b{dest}=True\b", flag, message)
        message = re.sub(rf"\b{dest}='([^']*)'", rf"{flag} \1", message)
        message = re.sub(rf"\b{dest}=(?![\w'])(?! \(CLI:)", flag, message)  # "pass classes= to ..."
        if "_" in dest:  # a name like image_size is never an ordinary word
            message = re.sub(rf"\b{dest}\b(?!=)", flag, message)
        message = re.sub(rf"{re.escape(flag)} must be (.+), got None\b", rf"{flag} is required (\1)", message)
    return message


def _add_convert(sub) -> None:
    """The `convert` command (tbljax.convert's arguments; its choices are ConvertOptions')."""
    from tbljax._src.conversion.convert_options import CHROMA, RECORD_FORMATS
    from tbljax._src.rules import contract

    c = sub.add_parser("convert", help="decode TAR shards / an image folder / image files into a TBL file",
                       description="Decode a dataset once into a TBL file (tbljax.convert).")
    c.add_argument("sources", nargs="+",
                   help="TAR shards (brace patterns as bash expands them: 'train-{000..099}.tar'), "
                        "an image folder with one subfolder per class, image files, or a TBL file "
                        "(decoded record for record into --format raw or lz4)")
    c.add_argument("-o", "--output", required=True, help="destination .tbl file")
    c.add_argument("-s", "--image-size", type=int, default=None, metavar="SIZE",
                   help="output side in pixels (required, except for a TBL file as the source)")
    c.add_argument("--resize", default=contract.DEFAULT_RESIZE, choices=contract.RESIZE_MODES,
                   help="center_crop: shorter side to SIZE, then the central square (default); "
                        "squash: SIZE x SIZE ignoring aspect; max_side: longer side SIZE, aspect kept; "
                        "shorter_side: shorter side SIZE, aspect kept")
    c.add_argument("--max-long-side", type=int, default=None, metavar="L",
                   help="with --resize shorter_side: cap the longer side at L (default: no cap)")
    c.add_argument("--format", default="raw", choices=RECORD_FORMATS,
                   help="raw: decoded pixels, fastest to serve (default); jpeg: JPEG records, smallest "
                        "(the source bytes, or re-encoded at the converted size with --quality); "
                        "lz4: raw pixels LZ4-compressed. A TBL file as the source converts to raw or lz4")
    c.add_argument("--quality", type=int, default=None, metavar="Q",
                   help="with --format jpeg: re-encode each image at its converted size with JPEG "
                        "quality Q (1-100; 90 is the usual choice): compact records")
    c.add_argument("--chroma", default=None, choices=CHROMA,
                   help="chroma subsampling of --quality records: 420 (default) or 444")
    c.add_argument("--raw-budget", type=float, default=None, metavar="F",
                   help="with --quality: store the records costliest to decode as pixels while the "
                        "records stay within F (e.g. 0.2) of their RAW size; faster to serve")
    c.add_argument("--threads", type=int, default=None, metavar="N", help=THREADS_HELP)
    c.add_argument("--classes", default=None, metavar="FILE",
                   help="class names in id order, one per line: labels that are names take their id "
                        "from it (needed with --shard when TAR labels are names)")
    c.add_argument("--label-ext", default=None, metavar="EXT",
                   help="the TAR member holding the label, e.g. txt (default: the first of "
                        "cls, cls2, label, json)")
    for flag, what in (("--image-column", "the image column of Parquet files (default: the Image feature)"),
                       ("--label-column", "the label column of Parquet files (default: the ClassLabel feature)"),
                       ("--image-key", "the image feature of TFRecord/ArrayRecord Examples (default: image, "
                                       "image/encoded)"),
                       ("--label-key", "the label feature of TFRecord/ArrayRecord Examples (default: label, "
                                       "image/class/label)")):
        c.add_argument(flag, default=None, metavar="NAME", help=what)
    c.add_argument("--field", action="append", default=None, metavar="NAME=EXT",
                   help="a record field from the TAR member (or the image folder's sidecar file) with "
                        "extension EXT: caption=txt (str), tags=json (json), emb=emb.npy (ndarray); repeatable")
    c.add_argument("--strict", action="store_true", help="stop (and write nothing) at the first bad image or label")
    c.add_argument("--overwrite", action="store_true", help="replace an existing output file")
    c.add_argument("--shard", default=None, metavar="I/N",
                   help="convert only share I of N (0-based) of the sources, for parallel jobs; "
                        "'{shard}' in the output name becomes IIIII-of-NNNNN")
    c.add_argument("-q", "--quiet", action="store_true", help="no progress report")
    c.add_argument("--progress-interval", type=float, default=None, metavar="SECONDS",
                   help="seconds between progress reports (default: 0.5 on a terminal, 10 in logs)")
    _retry_options(c)
    c.set_defaults(fn=_cmd_convert)


def _add_stage(sub) -> None:
    """The `stage` command (tbljax.stage's arguments)."""
    g = sub.add_parser("stage", help="copy TBL shard files from a URL to a local cache, verified",
                       description="Copy TBL shard files to a local directory (tbljax.stage): each "
                                   "verified and renamed into place when complete; a rerun resumes.")
    g.add_argument("source", metavar="URL",
                   help="a URL or path, brace pattern or glob: 'gs://bucket/train-{0000..0063}.tbl'")
    g.add_argument("cache_dir", metavar="CACHE_DIR", help="the local directory to copy into")
    g.add_argument("--partition", default=None, metavar="host|I/N",
                   help="copy only a part: 'host' (this process's part of the job, found by joining it "
                        "with jax.distributed.initialize()) or I/N (part I of N); default all")
    g.add_argument("--budget", default=None, metavar="SIZE",
                   help="the most the part may take, e.g. 500G (K, M, G, T: powers of 1024); "
                        "checked, with the disk's free space, before copying")
    g.add_argument("--workers", type=int, default=4, metavar="N", help="files copied at once (default 4)")
    _retry_options(g)
    g.set_defaults(fn=_cmd_stage)


def build_parser() -> CommandParser:
    """The `tbljax` argument parser (every option has a help text; tests hold it to that)."""
    from tbljax._src.rules import contract

    p = CommandParser(prog="tbljax", description="Decode once into a TBL file; serve every epoch to JAX.",
                                epilog="exit status: 0 ok; 1 bad data; 2 usage error; 130 interrupted")
    p.add_argument("--version", action=_VersionAction, help="print the version and exit")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _add_convert(sub)
    _add_stage(sub)

    i = sub.add_parser("info", help="describe TBL files",
                       description="Records, format, shapes, labels, classes, recipe and skipped items of TBL files.")
    i.add_argument("files", nargs="+", metavar="FILE", help="TBL files")
    i.add_argument("--json", action="store_true", help="one JSON object per file, for scripts")
    i.set_defaults(fn=_cmd_info)

    v = sub.add_parser("verify", help="check every record's checksum",
                       description="Check every record's CRC-16; exit 1 naming each bad file or record.")
    v.add_argument("files", nargs="+", metavar="FILE", help="TBL files")
    v.add_argument("--threads", type=int, default=None, metavar="N",
                   help="threads checking records (default: all CPUs, or TBLJAX_NUM_THREADS)")
    v.set_defaults(fn=_cmd_verify)

    b = sub.add_parser("bench", help="is the input pipeline the bottleneck? loader img/s and a verdict",
                       description="Measure the loader alone and, with --step, against your step.")
    b.add_argument("file", metavar="FILE", help="a TBL file")
    b.add_argument("--batch-size", type=int, default=256, metavar="B", help="global batch size (default 256)")
    b.add_argument("--step", default=None, metavar="MODULE:FUNCTION",
                   help="your training step: a callable taking the batch dict (image, label, index) and "
                        "returning something to block on; keep model state in a closure")
    b.add_argument("--steps", type=int, default=30, metavar="N", help="steps to time (default 30)")
    b.add_argument("--dtype", default="float32", choices=contract.OUT_DTYPES,
                   help="batch dtype (default float32)")
    b.add_argument("--layout", default="NHWC", choices=contract.LAYOUTS, help="batch layout (default NHWC)")
    _crop_options(b, "measure the loader")
    b.add_argument("--threads", type=int, default=None, metavar="N",
                   help="threads decoding non-RAW records (default: all CPUs, or TBLJAX_NUM_THREADS)")
    b.add_argument("--prefetch", type=int, default=2, metavar="P", help="batches prepared ahead (default 2)")
    b.add_argument("--json", action="store_true", help="one JSON object, for scripts")
    b.set_defaults(fn=_cmd_bench)

    s = sub.add_parser("show", help="a PNG grid of samples with labels, optionally as augmented for training",
                       description="Draw the first records with their labels or class names as a PNG.")
    s.add_argument("file", metavar="FILE", help="a TBL file")
    s.add_argument("--out", default="grid.png", help="the PNG to write (default grid.png)")
    s.add_argument("--count", type=int, default=16, metavar="N", help="records to draw (default 16)")
    s.add_argument("--columns", type=int, default=8, metavar="C", help="tiles per row (default 8)")
    _crop_options(s, "show the records as the loader serves them")
    s.add_argument("--seed", type=int, default=0, metavar="S", help="the loader seed for --augment (default 0)")
    s.add_argument("--epoch", type=int, default=0, metavar="E", help="the epoch for --augment (default 0)")
    s.set_defaults(fn=_cmd_show)

    d = sub.add_parser("demo", help="make a small dataset, convert it, train a JAX model on it",
                       description="Make labelled JPEG shards, convert them, train a small CNN on the loader.")
    d.add_argument("--steps", type=int, default=300, metavar="N", help="training steps (default 300)")
    d.add_argument("--workdir", default=None, metavar="DIR", help="where to put the demo files (default: a temp dir)")
    d.set_defaults(fn=_cmd_demo)
    for command in sub.choices.values():
        command.set_defaults(flags=command.flags)
    return p


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    from tbljax import _core
    # after parsing: --help and usage errors stay quick
    from tbljax._src.conversion.convert_options import ConversionError

    try:
        return a.fn(a)
    except (ConversionError, _core.CorruptFileError, _core.DecodeError) as e:
        return _fail(a, e, 1)  # bad data (both errors subclass ValueError: caught first)
    except (ValueError, TypeError, FileNotFoundError, FileExistsError, IsADirectoryError,
            NotADirectoryError, PermissionError, ImportError) as e:
        return _fail(a, e, 2)  # usage: bad arguments, a missing input, an existing output
    except BrokenPipeError:  # `tbljax info F | head`: the reader left; not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second one at exit
        return 0
    except OSError as e:
        return _fail(a, e, 1)  # the system failed us (disk full, I/O error)
    except KeyboardInterrupt:
        print(f"tbljax {a.command}: interrupted", file=sys.stderr)
        return 130


def _fail(a: argparse.Namespace, e: BaseException, status: int) -> int:
    """One clear line on stderr in the command's words, no traceback; then the bad items a
    conversion met, one a line."""
    msg = in_cli_words(str(e).splitlines()[0], a.flags) if str(e) else type(e).__name__
    print(f"tbljax {a.command}: error: {msg}", file=sys.stderr)
    skipped = getattr(e, "skipped", None) or []
    for s in skipped[:50]:
        print(f"  {s['key']} ({s['source']}): {s['reason']}", file=sys.stderr)
    if len(skipped) > 50:
        print(f"  ... and {len(skipped) - 50} more", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
