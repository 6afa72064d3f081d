"""What each `tbljax` command does with its parsed arguments (`RUN`, by command name); the
parser is `cli_parser`, the entry point and its error handling `cli`."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

__all__ = ["RUN"]


def _cmd_convert(a: argparse.Namespace) -> int:
    from tbljax._src.conversion.convert import convert

    summary = convert(
        a.sources,
        a.output,
        image_size=a.image_size,
        resize=a.resize,
        max_long_side=a.max_long_side,
        format=a.format,
        quality=a.quality,
        chroma=a.chroma,
        raw_budget=a.raw_budget,
        threads=a.threads,
        strict=a.strict,
        overwrite=a.overwrite,
        shard=a.shard,
        classes=a.classes,
        label_ext=a.label_ext,
        progress=False if a.quiet else None,
        progress_interval=a.progress_interval,
        retries=a.retries,
        retry_backoff=a.retry_backoff,
        image_column=a.image_column,
        label_column=a.label_column,
        image_key=a.image_key,
        label_key=a.label_key,
        fields=_field_args(a.fields),
    )
    print(summary.words(a.flags))
    return 0


def _field_args(given: list[str] | None) -> dict[str, Any] | list[str] | None:
    """--field caption=txt --field emb=emb.npy -> {'caption': 'txt', 'emb': 'emb.npy'} (TAR members,
    sidecar files); --field caption --field tags -> ['caption', 'tags'] (columns: Parquet, TFRecord,
    ArrayRecord, Hugging Face); a geometric field adds :ROLE[,OPTION=VALUE]... (`_declaration`):
    --field seg=png:mask,ignore=0 -> {'seg': Mask('png', ignore=0)}. The API checks names,
    extensions and repeats."""
    if not given:
        return None
    parts = []  # (name, '=', ext, role spec): 'seg=png:mask,ignore=0' -> ('seg', '=', 'png', 'mask,ignore=0')
    for g in given:
        head, _, role = g.partition(":")
        parts.append((*head.partition("="), role))
    if not any(sep or role for _, sep, _, role in parts):
        return list(given)
    bad = [g for g, (name, sep, ext, role) in zip(given, parts) if not name or not (role or (sep and ext))]
    if bad or len({p[0] for p in parts}) < len(parts):
        raise ValueError(
            f"--field takes NAME=EXT for TAR shards and image folders (caption=txt, emb=emb.npy), "
            f"NAME for columns (Parquet, TFRecord, ArrayRecord), NAME[=EXT]:ROLE[,OPTION=VALUE]... for "
            f"a geometric field (seg=png:mask,ignore=0), each name once; got {bad or given}"
        )
    return {name: _declaration(name, ext, role) if role else ext for name, _, ext, role in parts}


def _declaration(name: str, ext: str, spec: str) -> Any:
    """EXT and ROLE[,OPTION=VALUE]... -> tbljax.Mask / DenseMap / Boxes / Keypoints (EXT may be
    empty: read by key=, or by the field's name). Values: flip_permutation=1/0/2, normalized=true,
    compress=lz4 (a mask or dense map stored as LZ4 blocks)."""
    import dataclasses

    from tbljax._src.file.fields import GEOMETRIC_ROLES

    role, *options = spec.split(",")
    if role not in GEOMETRIC_ROLES:
        raise ValueError(f"--field {name}: role {role!r} must be one of {list(GEOMETRIC_ROLES)}")
    cls = GEOMETRIC_ROLES[role]
    allowed = {f.name: f.type for f in dataclasses.fields(cls) if f.name != "ext"}
    kw: dict[str, Any] = {}
    for opt in options:
        key, sep, value = opt.partition("=")
        if not sep or key not in allowed:
            raise ValueError(f"--field {name}: {opt!r} is not OPTION=VALUE with OPTION one of {sorted(allowed)}")
        try:
            kw[key] = (
                int(value)
                if key == "ignore"
                else float(value)
                if key == "invalid"
                else tuple(int(k) for k in value.split("/"))
                if key == "flip_permutation"
                else {"true": True, "false": False}[value.lower()]
                if key == "normalized"
                else value
            )
        except (ValueError, KeyError):
            raise ValueError(
                f"--field {name}: {key}={value!r} is not a valid value (ignore: an int, invalid: a "
                "number, flip_permutation: ints joined by /, normalized: true or false)"
            ) from None
    try:
        return cls(ext or None, **kw)
    except ValueError as e:  # the declaration's own check (e.g. compress=zstd): say which --field
        raise ValueError(f"--field {name}: {e}") from None


def _cmd_stage(a: argparse.Namespace) -> int:
    import os

    from tbljax._src.remote.staging import stage

    if a.partition == "host":
        _join_jax_job()
    paths = stage(
        a.source,
        a.cache_dir,
        partition=a.partition,
        budget_bytes=a.budget_bytes,
        retries=a.retries,
        retry_backoff=a.retry_backoff,
        workers=a.workers,
    )
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
        raise ValueError(
            f"--partition host: could not join a JAX job to learn this host's part "
            f"({str(e).splitlines()[0] if str(e) else type(e).__name__}); it is "
            "detected on Slurm, TPU pods and Open MPI; elsewhere give --partition I/N"
        ) from e


def _open(path: str) -> Any:
    """The TBL file a command reads; a folder is a usage error (what was passed), not bad data."""
    from tbljax._src.datasets import reader

    if os.path.isdir(path):
        raise IsADirectoryError(f"{path} is a directory: give TBL files (e.g. {path}/*.tbl)")
    return reader.open(path)


def _describe(path: str) -> dict[str, Any]:
    return {"path": path, **_open(path).describe()}


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
            print(
                f"  source sizes ({sizes['count']} images; median {sizes['median_wh'][0]}x{sizes['median_wh'][1]}, "
                f"min {sizes['min_wh'][0]}x{sizes['min_wh'][1]}, max {sizes['max_wh'][0]}x{sizes['max_wh'][1]}):"
            )
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

    bad_total = 0
    for path in a.files:
        try:
            ds = _open(path)
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


def _augment_of(a: argparse.Namespace, ds: Any) -> Any:
    """The augmentation that --augment, --size and --center-crop ask for (None: as stored). A
    file of records of different sizes needs an output size: the error says what to pass."""
    from tbljax._src.rules.augment import Augment

    if a.center_crop:
        if a.augment is not None or a.size is None:
            raise ValueError("--center-crop takes --size S (the evaluation crop, resized to SxS) and no --augment")
        return Augment(crop="center", flip=False, size=(a.size, a.size))
    if a.size is not None:
        if a.augment != "rrc_flip":
            raise ValueError(
                "--size S resizes a crop to SxS: pass it with --augment rrc_flip "
                "(training crops) or --center-crop (evaluation)"
            )
        return Augment(size=(a.size, a.size))
    if len(ds) and ds.geometry.shape is None:  # the served sizes (not the source photos')
        raise ValueError(
            f"{a.file}: its records have different sizes (converted keeping the "
            "aspect): pass an output size, --augment rrc_flip --size 224 (training "
            "crops) or --center-crop --size 224 (evaluation)"
        )
    return a.augment


def _cmd_bench(a: argparse.Namespace) -> int:
    from tbljax._src.tools.benchmark import bench

    ds = _open(a.file)
    r = bench(
        ds,
        batch_size=a.batch_size,
        step=a.step,
        steps=a.steps,
        dtype=a.dtype,
        layout=a.layout,
        augment=_augment_of(a, ds),
        threads=a.threads,
        prefetch=a.prefetch,
    )
    print(json.dumps(r.asdict()) if a.json else r)
    return 0


def _cmd_show(a: argparse.Namespace) -> int:
    from tbljax._src.tools.show import save_grid_png

    ds = _open(a.file)
    out = save_grid_png(
        ds,
        a.out,
        count=a.count,
        columns=a.columns,
        augment=_augment_of(a, ds),
        seed=a.seed,
        epoch=a.epoch,
        start=a.start,
        shuffle=a.shuffle,
    )
    print(f"wrote {out}")
    return 0


def _cmd_demo(a: argparse.Namespace) -> int:
    from tbljax._src.tools import demo

    return demo.main(steps=a.steps, workdir=a.workdir)


RUN = {
    "convert": _cmd_convert,
    "stage": _cmd_stage,
    "info": _cmd_info,
    "verify": _cmd_verify,
    "bench": _cmd_bench,
    "show": _cmd_show,
    "demo": _cmd_demo,
}
