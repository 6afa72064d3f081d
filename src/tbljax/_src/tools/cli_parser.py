"""The `tbljax` command's argument parser: every command's options, each with its help, named
(`dest`) as the Python API names the argument, so that the parser's `flags` table turns an
error's `contract.Arg` into the flag (`cli.main`)."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["THREADS_HELP", "CommandParser", "build_parser"]


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
    p.add_argument(
        "--retries",
        type=int,
        default=5,
        metavar="N",
        help="failures in a row a read of a URL survives, each re-opened at the byte where it broke (default 5)",
    )
    p.add_argument(
        "--retry-backoff",
        type=float,
        default=0.5,
        metavar="SECONDS",
        help="wait before the first retry, doubled each time up to 30 s (default 0.5)",
    )


def _crop_options(p: argparse.ArgumentParser, what: str) -> None:
    from tbljax._src.rules.augment import PRESETS

    p.add_argument(
        "--augment",
        default=None,
        choices=list(PRESETS),
        help=f"{what} with this augmentation: flip, or random-resized-crop + flip (default none)",
    )
    p.add_argument(
        "--size",
        type=int,
        default=None,
        metavar="S",
        help="with --augment rrc_flip or --center-crop: resize the crops to SxS (needed for "
        "files of records of different sizes)",
    )
    p.add_argument(
        "--center-crop",
        action="store_true",
        help="the evaluation crop: the central 87.5%% of the shorter side, resized to --size",
    )


THREADS_HELP = "threads for decoding (default: all CPUs this process may use, or TBLJAX_NUM_THREADS)"


class CommandParser(argparse.ArgumentParser):
    """An ArgumentParser that keeps what it was given: `options`, every argument added to it
    (help included), and `commands`, the parsers of its subcommands by name; so the help of
    every option can be checked without argparse's insides. Subcommand parsers are of this
    class too (argparse makes them of the parent's class)."""

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        self.__dict__.setdefault("options", []).append(action)
        if action.option_strings:  # each option's flag by its API name (`contract.Arg.words`)
            self.__dict__.setdefault("flags", {})[action.dest] = ("/".join(action.option_strings), action.nargs == 0)
        return action

    def add_subparsers(self, **kwargs: Any):
        self._subcommands = super().add_subparsers(**kwargs)
        return self._subcommands

    @property
    def commands(self) -> dict[str, argparse.ArgumentParser]:
        sub = getattr(self, "_subcommands", None)
        return dict(sub.choices) if sub is not None else {}


def _add_convert(sub) -> None:
    """The `convert` command (tbljax.convert's arguments; its choices are ConvertOptions')."""
    from tbljax._src.conversion.convert_options import CHROMA, RECORD_FORMATS
    from tbljax._src.rules import contract

    c = sub.add_parser(
        "convert",
        help="decode TAR shards / an image folder / image files into a TBL file",
        description="Decode a dataset once into a TBL file (tbljax.convert).",
    )
    c.add_argument(
        "sources",
        nargs="+",
        help="TAR shards (brace patterns as bash expands them: 'train-{000..099}.tar'), "
        "an image folder with one subfolder per class, image files, or a TBL file "
        "(decoded record for record into --format raw or lz4)",
    )
    c.add_argument("-o", "--output", required=True, help="destination .tbl file")
    c.add_argument(
        "-s",
        "--image-size",
        type=int,
        default=None,
        metavar="SIZE",
        help="output side in pixels (required, except for a TBL file as the source)",
    )
    c.add_argument(
        "--resize",
        default=contract.DEFAULT_RESIZE,
        choices=contract.RESIZE_MODES,
        help="center_crop: shorter side to SIZE, then the central square (default); "
        "squash: SIZE x SIZE ignoring aspect; max_side: longer side SIZE, aspect kept; "
        "shorter_side: shorter side SIZE, aspect kept",
    )
    c.add_argument(
        "--max-long-side",
        type=int,
        default=None,
        metavar="L",
        help="with --resize shorter_side: cap the longer side at L (default: no cap)",
    )
    c.add_argument(
        "--format",
        default="raw",
        choices=RECORD_FORMATS,
        help="raw: decoded pixels, fastest to serve (default); jpeg: JPEG records, smallest "
        "(the source bytes, or re-encoded at the converted size with --quality); "
        "lz4: raw pixels LZ4-compressed. A TBL file as the source converts to raw or lz4",
    )
    c.add_argument(
        "--quality",
        type=int,
        default=None,
        metavar="Q",
        help="with --format jpeg: re-encode each image at its converted size with JPEG "
        "quality Q (1-100; 90 is the usual choice): compact records",
    )
    c.add_argument(
        "--chroma", default=None, choices=CHROMA, help="chroma subsampling of --quality records: 420 (default) or 444"
    )
    c.add_argument(
        "--raw-budget",
        type=float,
        default=None,
        metavar="F",
        help="with --quality: store the records costliest to decode as pixels while the "
        "records stay within F (e.g. 0.2) of their RAW size; faster to serve",
    )
    c.add_argument("--threads", type=int, default=None, metavar="N", help=THREADS_HELP)
    c.add_argument(
        "--classes",
        default=None,
        metavar="FILE",
        help="class names in id order, one per line: labels that are names take their id "
        "from it (needed with --shard when TAR labels are names)",
    )
    c.add_argument(
        "--label-ext",
        default=None,
        metavar="EXT",
        help="the TAR member holding the label, e.g. txt (default: the first of cls, cls2, label, json)",
    )
    for flag, what in (
        ("--image-column", "the image column of Parquet files (default: the Image feature)"),
        ("--label-column", "the label column of Parquet files (default: the ClassLabel feature)"),
        ("--image-key", "the image feature of TFRecord/ArrayRecord Examples (default: image, image/encoded)"),
        ("--label-key", "the label feature of TFRecord/ArrayRecord Examples (default: label, image/class/label)"),
    ):
        c.add_argument(flag, default=None, metavar="NAME", help=what)
    c.add_argument(
        "--field",
        dest="fields",
        action="append",
        default=None,
        metavar="NAME[=EXT][:ROLE[,OPT=V]...]",
        help="a record field, repeatable. TAR shards and image folders: NAME=EXT, the member (or "
        "sidecar file) with extension EXT: caption=txt (str), tags=json (json), emb=emb.npy "
        "(ndarray). Parquet, TFRecord, ArrayRecord: NAME, the column or feature. A geometric "
        "field adds :ROLE (mask, dense, boxes, keypoints) and the declaration's options: "
        "seg=png:mask,ignore=0,folder=VOC/SegmentationClass (compress=lz4: stored as LZ4 blocks); "
        "boxes=boxes.json:boxes,format=xywh,"
        "labels=box_labels; kpts=kpts.npy:keypoints,flip_permutation=1/0/2; "
        "bbox:boxes,key=objects/bbox,format=yxyx,normalized=true",
    )
    c.add_argument("--strict", action="store_true", help="stop (and write nothing) at the first bad image or label")
    c.add_argument("--overwrite", action="store_true", help="replace an existing output file")
    c.add_argument(
        "--shard",
        default=None,
        metavar="I/N",
        help="convert only share I of N (0-based) of the sources, for parallel jobs; "
        "'{shard}' in the output name becomes IIIII-of-NNNNN",
    )
    c.add_argument("-q", "--quiet", action="store_true", help="no progress report")
    c.add_argument(
        "--progress-interval",
        type=float,
        default=None,
        metavar="SECONDS",
        help="seconds between progress reports (default: 0.5 on a terminal, 10 in logs)",
    )
    _retry_options(c)


def _add_stage(sub) -> None:
    """The `stage` command (tbljax.stage's arguments)."""
    g = sub.add_parser(
        "stage",
        help="copy TBL shard files from a URL to a local cache, verified",
        description="Copy TBL shard files to a local directory (tbljax.stage): each "
        "verified and renamed into place when complete; a rerun resumes.",
    )
    g.add_argument(
        "source", metavar="URL", help="a URL or path, brace pattern or glob: 'gs://bucket/train-{0000..0063}.tbl'"
    )
    g.add_argument("cache_dir", metavar="CACHE_DIR", help="the local directory to copy into")
    g.add_argument(
        "--partition",
        default=None,
        metavar="host|I/N",
        help="copy only a part: 'host' (this process's part of the job, found by joining it "
        "with jax.distributed.initialize()) or I/N (part I of N); default all",
    )
    g.add_argument(
        "--budget",
        dest="budget_bytes",
        default=None,
        metavar="SIZE",
        help="the most the part may take, e.g. 500G (K, M, G, T: powers of 1024); "
        "checked, with the disk's free space, before copying",
    )
    g.add_argument("--workers", type=int, default=4, metavar="N", help="files copied at once (default 4)")
    _retry_options(g)


def build_parser() -> CommandParser:
    """The `tbljax` argument parser (every option has a help text; tests hold it to that)."""
    from tbljax._src.rules import contract

    p = CommandParser(
        prog="tbljax",
        description="Decode once into a TBL file; serve every epoch to JAX.",
        epilog="exit status: 0 ok; 1 bad data; 2 usage error; 130 interrupted",
    )
    p.add_argument("--version", action=_VersionAction, help="print the version and exit")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _add_convert(sub)
    _add_stage(sub)

    i = sub.add_parser(
        "info",
        help="describe TBL files",
        description="Records, format, shapes, labels, classes, recipe and skipped items of TBL files.",
    )
    i.add_argument("files", nargs="+", metavar="FILE", help="TBL files")
    i.add_argument("--json", action="store_true", help="one JSON object per file, for scripts")

    v = sub.add_parser(
        "verify",
        help="check every record's checksum",
        description="Check every record's CRC-16; exit 1 naming each bad file or record.",
    )
    v.add_argument("files", nargs="+", metavar="FILE", help="TBL files")
    v.add_argument(
        "--threads",
        type=int,
        default=None,
        metavar="N",
        help="threads checking records (default: all CPUs, or TBLJAX_NUM_THREADS)",
    )

    b = sub.add_parser(
        "bench",
        help="is the input pipeline the bottleneck? loader img/s and a verdict",
        description="Measure the loader alone and, with --step, against your step.",
    )
    b.add_argument("file", metavar="FILE", help="a TBL file")
    b.add_argument("--batch-size", type=int, default=256, metavar="B", help="global batch size (default 256)")
    b.add_argument(
        "--step",
        default=None,
        metavar="MODULE:FUNCTION",
        help="your training step: a callable taking the batch dict (image, label, index) and "
        "returning something to block on; keep model state in a closure",
    )
    b.add_argument("--steps", type=int, default=30, metavar="N", help="steps to time (default 30)")
    b.add_argument("--dtype", default="float32", choices=contract.OUT_DTYPES, help="batch dtype (default float32)")
    b.add_argument("--layout", default="NHWC", choices=contract.LAYOUTS, help="batch layout (default NHWC)")
    _crop_options(b, "measure the loader")
    b.add_argument(
        "--threads",
        type=int,
        default=None,
        metavar="N",
        help="threads decoding non-RAW records (default: all CPUs, or TBLJAX_NUM_THREADS)",
    )
    b.add_argument("--prefetch", type=int, default=2, metavar="P", help="batches prepared ahead (default 2)")
    b.add_argument("--json", action="store_true", help="one JSON object, for scripts")

    s = sub.add_parser(
        "show",
        help="a PNG grid of samples with labels, optionally as augmented for training",
        description="Draw the first records with their labels or class names as a PNG.",
    )
    s.add_argument("file", metavar="FILE", help="a TBL file")
    s.add_argument(
        "--out",
        default="grid.png",
        help="the image to write, in the format its extension names (.png, .jpg, ...; default grid.png)",
    )
    s.add_argument("--count", type=int, default=16, metavar="N", help="records to draw (default 16)")
    s.add_argument(
        "--start", type=int, default=0, metavar="I", help="draw from record I on (default 0; a single-file dataset)"
    )
    s.add_argument(
        "--shuffle",
        action="store_true",
        help="draw records in the loader's shuffled order for --seed and --epoch instead of file order",
    )
    s.add_argument("--columns", type=int, default=8, metavar="C", help="tiles per row (default 8)")
    _crop_options(s, "show the records as the loader serves them")
    s.add_argument(
        "--seed", type=int, default=0, metavar="S", help="the loader seed for --augment and --shuffle (default 0)"
    )
    s.add_argument(
        "--epoch", type=int, default=0, metavar="E", help="the epoch for --augment and --shuffle (default 0)"
    )

    d = sub.add_parser(
        "demo",
        help="make a small dataset, convert it, train a JAX model on it",
        description="Make labelled JPEG shards, convert them, train a small CNN on the loader.",
    )
    d.add_argument("--steps", type=int, default=300, metavar="N", help="training steps (default 300)")
    d.add_argument("--workdir", default=None, metavar="DIR", help="where to put the demo files (default: a temp dir)")
    return p
