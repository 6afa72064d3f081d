"""The `tbljax` command as a user meets it: --version, help for every option of every
command, the module docstring naming all commands, one-line errors with the documented exit
status (2 usage, 1 bad data), and the conversion options --classes and --label-ext."""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
import tarfile

import numpy as np
from PIL import Image

import tbljax
from tbljax._src.tools import cli


def run(*args, **kw):
    return subprocess.run(
        [sys.executable, "-m", "tbljax", *map(str, args)], capture_output=True, text=True, timeout=120, **kw
    )


def subcommands() -> dict[str, argparse.ArgumentParser]:
    return cli.build_parser().commands


def test_version():
    r = run("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"tbljax {tbljax.__version__}", r


def test_every_option_of_every_command_has_help():
    commands = subcommands()
    assert sorted(commands) == ["bench", "convert", "demo", "info", "show", "stage", "verify"]
    for name, parser in [("tbljax", cli.build_parser()), *commands.items()]:
        for action in parser.options:
            if action.dest == "help":
                continue
            assert action.help and action.help.strip(), f"{name} {action.option_strings or action.dest}: no help"
    for name, parser in commands.items():
        r = run(name, "--help")
        assert r.returncode == 0, r.stderr
        for action in parser.options:
            for flag in action.option_strings:
                assert flag in r.stdout, f"{name} --help does not show {flag}"


def test_module_docstring_lists_every_command():
    for name in subcommands():
        assert f"\n  {name} " in cli.__doc__, name


def one_line_error(r, status, *words, items=0):
    """One error line (then, for a conversion, one line per bad item), no traceback."""
    assert r.returncode == status, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 + items and "Traceback" not in r.stderr, r.stderr
    assert lines[0].startswith(f"tbljax {r.args[3]}: error: "), lines[0]
    for w in words:
        assert w in lines[0], lines[0]


def test_exit_status_usage_errors_are_2(tmp_path):
    one_line_error(
        run("convert", tmp_path / "nope-{0..3}.tar", "-o", tmp_path / "o.tbl", "-s", "8"), 2, "not found", "nope-0.tar"
    )
    one_line_error(run("convert", tmp_path / "nope.jpg", "-o", tmp_path / "o.tbl", "-s", "8"), 2, "not found")
    one_line_error(run("info", tmp_path / "nope.tbl"), 2, "no such file")
    one_line_error(run("verify", tmp_path / "nope.tbl"), 2, "no such file")
    one_line_error(run("show", tmp_path / "nope.tbl"), 2, "no such file")
    one_line_error(run("bench", tmp_path / "nope.tbl"), 2, "no such file")
    imgs = tmp_path / "imgs"
    imgs.mkdir()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(imgs / "a.png")
    # The command names its own flags, never the Python API's keywords.
    one_line_error(
        run("convert", imgs, "-o", tmp_path / "o.tbl", "-s", "0"),
        2,
        "-s/--image-size must be an int in [1, 65535], got 0",
    )
    r = run("convert", imgs, "-o", tmp_path / "o.tbl")
    one_line_error(r, 2, "-s/--image-size is required (an int in [1, 65535])")
    assert "image_size" not in r.stderr and "None" not in r.stderr, r.stderr
    one_line_error(
        run("convert", imgs, "-o", tmp_path / "o.tbl", "-s", "8", "--chroma", "444"),
        2,
        "--chroma applies to re-encoded JPEG records: pass --quality (e.g. 90) with --format jpeg",
    )
    one_line_error(
        run("convert", imgs, "-o", tmp_path / "o.tbl", "-s", "8", "--classes", tmp_path / "c.txt"),
        2,
        "classes file not found",
    )
    one_line_error(
        run("convert", imgs, "-o", tmp_path / "o.tbl", "-s", "8", "--label-ext", "txt"),
        2,
        "--label-ext is for TAR shards",
    )
    (tmp_path / "exists.tbl").write_bytes(b"x")
    r = run("convert", imgs, "-o", tmp_path / "exists.tbl", "-s", "8")
    one_line_error(r, 2, "exists.tbl already exists (pass --overwrite to replace it)")
    assert "overwrite=True" not in r.stderr
    r = run("convert", imgs, "-s", "8")  # argparse: usage and status 2
    assert r.returncode == 2 and "required" in r.stderr


def test_exit_status_bad_data_is_1(tmp_path):
    (tmp_path / "junk.tbl").write_bytes(b"garbage")
    one_line_error(run("info", tmp_path / "junk.tbl"), 1, "junk.tbl")
    with tarfile.open(tmp_path / "bad.tar", "w") as tf:
        ti = tarfile.TarInfo("a.jpg")
        ti.size = 5
        tf.addfile(ti, io.BytesIO(b"nope!"))
    one_line_error(
        run("convert", tmp_path / "bad.tar", "-o", tmp_path / "o.tbl", "-s", "8", "--strict"),
        1,
        "strict conversion stopped",
        items=1,
    )
    one_line_error(
        run("convert", tmp_path / "bad.tar", "-o", tmp_path / "o.tbl", "-s", "8"), 1, "no record written", items=1
    )
    assert not (tmp_path / "o.tbl").exists()


def test_convert_classes_file_and_label_ext(tmp_path):
    def jpeg(v):
        b = io.BytesIO()
        Image.fromarray(np.full((10, 10, 3), v, np.uint8)).save(b, "JPEG")
        return b.getvalue()

    with tarfile.open(tmp_path / "s.tar", "w") as tf:
        for name, data in [("a.jpg", jpeg(10)), ("a.txt", b"tench"), ("b.jpg", jpeg(20)), ("b.txt", b"goldfish")]:
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    (tmp_path / "classes.txt").write_text("tench\ngoldfish\n")
    r = run(
        "convert",
        tmp_path / "s.tar",
        "-o",
        tmp_path / "o.tbl",
        "-s",
        "8",
        "--label-ext",
        "txt",
        "--classes",
        tmp_path / "classes.txt",
        "-q",
    )
    assert r.returncode == 0 and r.stderr == "", r.stderr
    ds = tbljax.open(tmp_path / "o.tbl")
    assert ds.classes == ["tench", "goldfish"] and ds.labels.tolist() == [0, 1]


def test_output_piped_into_a_reader_that_leaves_is_no_error(tmp_path):
    # `tbljax info FILE | head -1`: head closes the pipe early; the command says nothing.
    tbljax.convert(np.zeros((4, 8, 8, 3), np.uint8), tmp_path / "a.tbl", image_size=8, progress=False)
    r = subprocess.run(
        f"{sys.executable} -m tbljax info {tmp_path / 'a.tbl'} {tmp_path / 'a.tbl'} | head -1",
        shell=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.stdout.strip() == str(tmp_path / "a.tbl") and "Broken pipe" not in r.stderr, r.stderr


def test_issue45_cli_errors_name_flags_and_files(tmp_path):
    # Issue 45 items 9, 11, 12, 13: each error says what is wrong in the command's words.
    tbljax.convert(
        np.arange(4 * 8 * 8 * 3, dtype=np.uint8).reshape(4, 8, 8, 3) % 251,
        tmp_path / "a.tbl",
        image_size=8,
        progress=False,
    )
    one_line_error(run("show", tmp_path / "a.tbl", "--count", "-3"), 2, "--count must be an int >= 1, got -3")
    one_line_error(run("show", tmp_path / "a.tbl", "--out", tmp_path / "nope" / "x.png"), 2, "does not exist")
    assert not (tmp_path / "nope").exists()
    one_line_error(run("show", tmp_path / "a.tbl", "--out", tmp_path / "x.what"), 2, "--out")
    r = run("show", tmp_path / "a.tbl", "--out", tmp_path / "g.jpg", "--start", "2", "--count", "2")
    assert r.returncode == 0, r.stderr
    with Image.open(tmp_path / "g.jpg") as g:
        assert g.format == "JPEG"
    one_line_error(run("info", tmp_path), 2, "is a directory")
    r = run("info", tmp_path / "nosuch.tbl")
    one_line_error(r, 2, "nosuch.tbl")
    assert "[Errno" not in r.stderr, r.stderr
    (tmp_path / "fake.tar").write_text("hello\n")
    one_line_error(run("convert", tmp_path / "fake.tar", "-o", tmp_path / "o.tbl", "-s", "8"), 1, "not a TAR file")
    (tmp_path / "out").mkdir()
    one_line_error(run("convert", tmp_path / "fake.tar", "-o", tmp_path / "out", "-s", "8"), 2, "is a directory")
    imgs = tmp_path / "imgs"
    imgs.mkdir()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(imgs / "a.png")
    r = run("convert", imgs / "a.png", "-o", tmp_path / "f.tbl", "-s", "8", "-q")
    assert r.returncode == 0 and "labels= (Python API only), one per file" in r.stdout, r.stdout


def test_field_name_keeps_a_column(tmp_path):
    # Issue 45 item 5: --field NAME keeps a column of a Parquet file as a record field.
    datasets = __import__("pytest").importorskip("datasets")
    b = io.BytesIO()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(b, "PNG")
    ds = datasets.Dataset.from_dict(
        {"image": [{"bytes": b.getvalue(), "path": None}], "caption": ["a cat"]},
        features=datasets.Features({"image": datasets.Image(), "caption": datasets.Value("string")}),
    )
    ds.to_parquet(str(tmp_path / "d.parquet"))
    r = run("convert", tmp_path / "d.parquet", "-o", tmp_path / "o.tbl", "-s", "8", "--field", "caption", "-q")
    assert r.returncode == 0, r.stderr
    assert tbljax.open(tmp_path / "o.tbl").field("caption")[0] == "a cat"


def test_the_unlabelled_hint_names_the_cli_flag(tmp_path):
    # The conversion summary's hint names --label-ext on the command line (label_ext= in Python).
    buf = io.BytesIO()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(buf, "JPEG")
    with tarfile.open(tmp_path / "u.tar", "w") as tar:
        for name, data in (("a.jpg", buf.getvalue()), ("a.txt", b"a caption")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    r = run("convert", tmp_path / "u.tar", "-o", tmp_path / "u.tbl", "-s", 8, "-q")
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "(--label-ext names another)" in out and "label_ext=" not in out, r


def test_errors_name_the_cli_flags_not_python_arguments(tmp_path, capsys):
    # Issue 45 item 12: no CLI error names a Python argument the command has a flag for, and one it
    # has none for is marked; run in-process (cli.main) to stay fast.
    tbljax.convert(np.zeros((10, 8, 8, 3), np.uint8), tmp_path / "a.tbl", image_size=8, progress=False)
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "x.png")
    a, x, o = str(tmp_path / "a.tbl"), str(tmp_path / "x.png"), str(tmp_path / "o.tbl")
    for argv, want in (
        (
            ["bench", a, "--batch-size", "5000"],
            "tbljax bench: error: --batch-size 5000 is larger than the dataset "
            "(10 samples): no step would run; use a smaller --batch-size, or drop_remainder=False (Python API only) "
            "to serve a padded last batch",
        ),
        (["bench", a, "--batch-size", "4", "--threads", "-1"], "tbljax bench: error: --threads must be None or 0"),
        (
            ["convert", x, "-o", o, "-s", "8", "--shard", "3/2"],
            "tbljax convert: error: --shard 3/2 needs part i of n with 0 <= i < n",
        ),
        (
            ["convert", x, "-o", o, "-s", "8", "--image-column", "img"],
            "tbljax convert: error: --image-column names a column of a Hugging Face dataset or Parquet file "
            "(--image-column, --label-column) or a feature of TFRecord/ArrayRecord tf.train.Examples "
            "(--image-key, --label-key)",
        ),
        (
            ["convert", a, "-o", o, "--format", "jpeg"],
            "tbljax convert: error: a TBL source converts to --format raw or --format lz4;",
        ),
        (
            ["demo", "--steps", "1", "--workdir", str(tmp_path / "d")],
            "tbljax demo: error: --steps must be an integer >= 2, got 1",
        ),
        # Issue 44 §4: the loader options, staging, retries and the augmentation's size.
        (["bench", a, "--batch-size", "0"], "tbljax bench: error: --batch-size must be an integer >= 1, got 0"),
        (
            ["bench", a, "--batch-size", "4", "--prefetch", "0"],
            "tbljax bench: error: --prefetch must be an integer >= 1, got 0",
        ),
        (
            ["show", a, "--out", str(tmp_path / "g.png"), "--shuffle", "--seed", "-1"],
            "tbljax show: error: --seed must be an integer in [0, 2**64), got -1",
        ),
        (
            ["show", a, "--out", str(tmp_path / "g.png"), "--augment", "rrc_flip", "--size", "0"],
            "tbljax show: error: --size must be (height, width)",
        ),
        (
            ["stage", a, str(tmp_path / "c"), "--workers", "0"],
            "tbljax stage: error: --workers must be an integer in [1, 256], got 0",
        ),
        (
            ["stage", a, str(tmp_path / "c"), "--retries", "-1"],
            "tbljax stage: error: --retries must be an integer >= 0, got -1",
        ),
        (
            ["stage", a, str(tmp_path / "c"), "--partition", "x"],
            "tbljax stage: error: --partition must be None, 'host', (i, n) or 'i/n', got 'x'",
        ),
    ):
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith(want) and err.count("\n") == 1, (argv, err)
    assert not (tmp_path / "o.tbl").exists() and not (tmp_path / "d").exists() and not (tmp_path / "g.png").exists()
