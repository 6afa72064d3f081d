"""A seeded mutation fuzzer for the Python parsers of a TBL file's record fields: the dataset
metadata (`file/format.py` `parse_dataset_json`, `file/field_meta.py` `check_field_meta`) and the
field blocks (`file/field_columns.py`). No C++ parses them, so this runs in Python, not under
libFuzzer/ASan.

Each run writes a small file with a str, a json, a fixed and a ragged ndarray field (the real
`ColumnWriter`), then mutates either the metadata as JSON (a value of the fields entry replaced,
deleted or renamed), the metadata text's bytes, or a field block's bytes (its CRC-32 made right
or left stale), and writes the file again through the native writer so that every checksum
of the file itself is valid. The oracle: opening it and reading everything (fields, every
value, rows, padded rows, records, verify, describe) either works or raises CorruptFileError
naming the file; any other exception, or a run past 10 s, is a finding, saved with its
metadata under build/fuzz/fields/.

    python fuzz/fuzz_fields.py [RUNS] [SEED]
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import tempfile
import time
import traceback

import numpy as np

import tbljax
from tbljax import _core
from tbljax._src.file.fields import ColumnWriter
from tbljax._src.file.format import FORMATS

N = 6
POOL = [
    None,
    -1,
    0,
    1,
    2,
    7,
    8,
    63,
    64,
    2**31,
    2**62,
    2**63,
    2**64,
    1.5,
    True,
    "",
    "x",
    "<i8",
    "<f2",
    "|b1",
    ">i4",
    "<U3",
    "O",
    "V8",
    "<c16",
    "ndarray",
    "str",
    "json",
    [],
    [None],
    [1],
    [None, 2],
    [2, None],
    [0],
    [3, 2],
    [10**6, 10**6],
    {},
    {"offset": 0, "bytes": 0, "crc32": 0},
]
NAMES = ["label", "index", "image", "valid", "source", "key", "a_length", "é", "1x", "", "ok"]


def values():
    rng = np.random.default_rng(0)
    return {
        "cap": ("str", [f"caption {i} ü" for i in range(N)]),
        "tags": ("json", [{"i": i, "t": [i] * i} for i in range(N)]),
        "emb": ("ndarray", [rng.standard_normal(3).astype(np.float32) for _ in range(N)]),
        "tok": ("ndarray", [np.arange(i % 4, dtype=np.int64) for i in range(N)]),
    }


def write(path, blocks=None, fields=None, text=None, fix_crc=True):
    """The file: N 4x4 RAW records, the field blocks (`blocks`: {(name, which): bytes}) and the
    metadata (`text`, else built from `fields`). Returns (blocks, fields) as written."""
    w = _core.TblWriter(path, N, True)
    for i in range(N):
        w.add(np.full(48, i, np.uint8), FORMATS["RAW_U8"], 4, 4, False)
    if blocks is None:  # the real writer makes the blocks; the bytes are kept for mutation
        fields, blocks = {}, {}

        class W:
            def add_block(self, pieces, align):
                data = np.frombuffer(b"".join(bytes(p) for p in pieces), np.uint8)
                at = int(w.add_extra(data, align))
                blocks[at] = data.tobytes()
                return {"offset": at, "bytes": int(data.size), "crc32": _core.crc32(data, 0)}

        with tempfile.TemporaryDirectory() as spill:
            for name, (kind, vals) in values().items():
                col = ColumnWriter(name, kind, spill)
                for v in vals:
                    col.expect(v)
                    col.append(v)
                fields[name] = col.write(W())
    else:
        for at in sorted(blocks):
            data = np.frombuffer(blocks[at], np.uint8)
            got = int(w.add_extra(data, 64))
            assert got == at, (got, at)
        if fix_crc:
            for meta in fields.values():
                for which in ("values", "offsets"):
                    blk = meta.get(which) if isinstance(meta, dict) else None
                    if isinstance(blk, dict) and isinstance(blk.get("offset"), int) and blk["offset"] in blocks:
                        blk["crc32"] = _core.crc32(np.frombuffer(blocks[blk["offset"]], np.uint8), 0)
    if text is None:
        text = json.dumps({"tbljax_metadata": 1, "num_records": N, "labels": None, "fields": fields})
    w.finalize(text)
    return blocks, fields


def mutate_json(obj, r):
    """A random value in `obj` (a dict/list tree) replaced, deleted, or a key renamed."""
    node, parent, key = obj, None, None
    for _ in range(r.randint(1, 4)):
        if isinstance(node, dict) and node:
            parent, key = node, r.choice(list(node))
        elif isinstance(node, list) and node:
            parent, key = node, r.randrange(len(node))
        else:
            break
        node = parent[key]
    if parent is None:
        return
    op = r.random()
    if op < 0.7:
        parent[key] = (
            r.choice(POOL)
            if r.random() < 0.8
            else (node + r.choice([-1, 1, 8, -8]) if isinstance(node, int) and not isinstance(node, bool) else None)
        )
    elif op < 0.85 and isinstance(parent, dict):
        del parent[key]
    elif isinstance(parent, dict):
        parent[r.choice(NAMES)] = parent.pop(key)


def exercise(path):
    """Everything a user can read of the file's fields."""
    ds = tbljax.open(path)
    infos = ds.fields
    ds.verify()
    ds.describe()
    for i in range(len(ds)):
        ds.read_record(i)
    for name, info in infos.items():
        col = ds.field(name)
        with np.errstate(all="ignore"):  # mutated floats may be NaN
            list(col) if not isinstance(col, np.ndarray) else np.asarray(col).sum()
        ds.field_rows(name, np.arange(len(ds)))
        if info.ragged:
            out = np.zeros((len(ds), 3, *info.shape[1:]), info.dtype)
            ds.field_padded(name, np.arange(len(ds)), 3, out, np.zeros(len(ds), np.int32))


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    out = os.path.join("build", "fuzz", "fields")
    os.makedirs(out, exist_ok=True)
    r = random.Random(seed)
    tmp = tempfile.mkdtemp(prefix="tbljax-fuzz-fields-")
    path = os.path.join(tmp, "f.tbl")
    blocks, fields = write(path)
    base_text = json.dumps({"tbljax_metadata": 1, "num_records": N, "fields": fields})
    exercise(path)  # the seed itself reads
    signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(TimeoutError("over 10 s")))
    start, counts, findings = time.time(), {"ok": 0, "corrupt": 0}, {}
    for run in range(runs):
        b = dict(blocks)
        f = json.loads(json.dumps(fields))
        text, fix = None, True
        mode = r.random()
        if mode < 0.5:
            for _ in range(r.randint(1, 3)):
                mutate_json(f, r)
        elif mode < 0.65:
            t = bytearray(base_text.encode())
            for _ in range(r.randint(1, 4)):
                t[r.randrange(len(t))] = r.randrange(256)
            text = t.decode("utf-8", "replace")
        else:
            at = r.choice(list(b))
            data = bytearray(b[at])
            for _ in range(r.randint(1, 3)):
                if data:
                    data[r.randrange(len(data))] ^= 1 << r.randrange(8)
            b[at], fix = bytes(data), r.random() < 0.7
        try:
            write(path, b, f, text, fix)
        except (ValueError, AssertionError):
            continue  # the writer refused the mutated layout: nothing to read
        signal.alarm(10)
        try:
            exercise(path)
            counts["ok"] += 1
        except _core.CorruptFileError as e:
            counts["corrupt"] += 1
            if path not in str(e):
                findings.setdefault(f"CorruptFileError without the path: {e}"[:160], (run, text, f))
        except Exception as e:  # a finding: anything but CorruptFileError
            tb = traceback.extract_tb(e.__traceback__)[-1]
            sig = f"{type(e).__name__} at {os.path.basename(tb.filename)}:{tb.lineno}"
            if sig not in findings:
                findings[sig] = (run, text, f)
                with open(os.path.join(out, f"finding-{len(findings)}.json"), "w") as fh:
                    json.dump(
                        {
                            "run": run,
                            "seed": seed,
                            "error": f"{type(e).__name__}: {e}"[:500],
                            "text": text,
                            "fields": f,
                        },
                        fh,
                        default=str,
                    )
        finally:
            signal.alarm(0)
    took = time.time() - start
    print(
        f"{runs} runs in {took:.0f} s: {counts['ok']} read, {counts['corrupt']} CorruptFileError, "
        f"{len(findings)} distinct findings"
    )
    for sig, (run, _, _) in findings.items():
        print(f"  run {run}: {sig}")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
