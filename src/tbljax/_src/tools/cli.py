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
input file, an output that exists); 130 when interrupted. The parser is `cli_parser`, what
each command does `cli_commands`.
"""

from __future__ import annotations

import argparse
import os
import sys

from tbljax._src.rules import contract
from tbljax._src.tools import cli_commands
from tbljax._src.tools.cli_parser import build_parser

__all__ = ["build_parser", "main"]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    a = parser.parse_args(argv)
    a.flags = parser.commands[a.command].flags  # the API's argument names -> this command's flags
    from tbljax import _core

    # after parsing: --help and usage errors stay quick
    from tbljax._src.conversion.convert_options import ConversionError

    try:
        return cli_commands.RUN[a.command](a)
    except (ConversionError, _core.CorruptFileError, _core.DecodeError) as e:
        return _fail(a, e, 1)  # bad data (both errors subclass ValueError: caught first)
    except (
        ValueError,
        TypeError,
        FileNotFoundError,
        FileExistsError,
        IsADirectoryError,
        NotADirectoryError,
        PermissionError,
        ImportError,
    ) as e:
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
    msg = (
        contract.worded(e.parts, a.flags)
        if isinstance(e, contract.ArgumentError)
        else f"{e.filename}: {e.strerror}"
        if isinstance(e, OSError) and e.filename and e.strerror
        else str(e)
    ).splitlines()
    msg = msg[0] if msg else type(e).__name__
    print(f"tbljax {a.command}: error: {msg}", file=sys.stderr)
    skipped = getattr(e, "skipped", None) or []
    for s in skipped[:50]:
        print(f"  {s['key']} ({s['source']}): {s['reason']}", file=sys.stderr)
    if len(skipped) > 50:
        print(f"  ... and {len(skipped) - 50} more", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
