r"""Brace patterns expanded exactly as bash expands them, so that
``"train-{000..099}.tar"`` names the shards a shell would.

Bash's rules (braces.c), restated: a brace expression is an unescaped `{` with a matching
`}` such that, outside inner braces, the text between them holds a `,` or a `..` not
directly before the `}`. The first such `{` splits the word into preamble, body and
postamble. A body with an unescaped comma anywhere is split at its top-level commas and
each part expanded in turn; a body without one is a sequence `{x..y[..step]}` (integers,
zero-padded to the wider end when either end has a leading zero; or single ASCII letters)
or, when it is not one, stays literal. The results are preamble × body × expanded
postamble, in order; empty words are dropped and backslashes removed (`\{` is a literal
brace). `${` does not open an expression. Quotes have no meaning here (a Python string is
not shell-quoted), and a `{` alone at the start of a word before whitespace, `}` or the end
is literal, as in bash. tests/test_sources.py compares this with bash itself.
"""

from __future__ import annotations

import re

__all__ = ["MAX_EXPANSION", "expand_braces"]

MAX_EXPANSION = 10_000_000  # brace patterns that name more sources than this are refused

_INT_MIN, _INT_MAX = -(1 << 63), (1 << 63) - 1
_NUMBER = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]+)")


def _gobble(text: str, i: int, satisfy: str) -> tuple[int, str]:
    """From i, the index of the first `satisfy` outside inner braces (for '}': only once a
    top-level ',' or '..' was seen), and that character; (len(text), '') when there is none."""
    n = len(text)
    level = 0
    seps = 0 if satisfy == "}" else 1
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "$" and i + 1 < n and text[i + 1] == "{":
            level += 1
            i += 2
            continue
        if c == satisfy and level == 0 and seps > 0:
            if c == "{" and (i == 0 or text[i - 1] in " \t\n") and (i + 1 >= n or text[i + 1] in " \t\n}"):
                i += 1
                continue
            return i, c
        if c == "{":
            level += 1
        elif c == "}" and level:
            level -= 1
        elif satisfy == "}" and level == 0 and (c == "," or (text.startswith("..", i) and text[i + 2 : i + 3] != "}")):
            seps += 1
        i += 1
    return n, ""


def _strtoimax(s: str, pos: int) -> tuple[int, int] | None:
    """C's strtoimax(s + pos, &end, 10): (value, end), or None without digits or on overflow."""
    m = _NUMBER.match(s, pos)
    if not m:
        return None
    v = int(m.group(1))
    return (v, m.end()) if _INT_MIN <= v <= _INT_MAX else None


def _sequence(body: str) -> list[str] | None:
    """The words of `x..y[..step]`, or None when the body is not a valid sequence."""
    k = body.find("..")
    if k < 0:
        return None
    lhs, rhs = body[:k], body[k + 2 :]
    if not lhs or not rhs:
        return None
    num = _strtoimax(lhs, 0)
    if num is not None and lhs[num[1] :].strip(" \t") == "":
        ltype, lval = "int", num[0]
    elif len(lhs) == 1 and lhs.isascii() and lhs.isalpha():
        ltype, lval = "char", ord(lhs)
    else:
        return None
    if rhs[0] in "0123456789" or (rhs[0] in "+-" and rhs[1:2] in tuple("0123456789")):
        num = _strtoimax(rhs, 0)
        if num is None or (num[1] < len(rhs) and rhs[num[1]] != "."):
            return None
        rtype, rval, end = "int", num[0], num[1]
    elif rhs[0].isascii() and rhs[0].isalpha() and rhs[1:2] in ("", "."):
        rtype, rval, end = "char", ord(rhs[0]), 1
    else:
        return None
    rhs_len, step = end, 1
    if rhs.startswith("..", end) and len(rhs) > end + 2:
        num = _strtoimax(rhs, end + 2)
        if num is None:
            return None
        step, end = num
    if end != len(rhs) or ltype != rtype:
        return None
    width, padded = 1, False
    if ltype == "int":
        width = 0
        for side, n in ((lhs, len(lhs)), (rhs, rhs_len)):
            if (n > 1 and side[0] == "0") or (n > 2 and side[:2] == "-0"):
                width, padded = max(width, n), True
        if padded:
            width = max(width, len(lhs), rhs_len)
    return _steps(lval, rval, step, "zint" if padded else ltype, width)


def _steps(start: int, end: int, step: int, kind: str, width: int) -> list[str] | None:
    if step == 0:
        step = 1
    if (start > end and step > 0) or (start < end and step < 0):
        if step == _INT_MIN:
            return None
        step = -step
    if not _INT_MIN + 3 <= end - start <= _INT_MAX - 2:
        return None
    count = abs(end - start) // abs(step)
    if count > (1 << 31) - 4:
        return None
    if count >= MAX_EXPANSION:
        raise ValueError(
            f"brace sequence {start}..{end} names {count + 1} items; more than {MAX_EXPANSION} is surely a mistake"
        )
    out = []
    for v in range(start, end + (1 if step > 0 else -1), step):
        if kind == "int":
            out.append(str(v))
        elif kind == "zint":  # printf("%0*d", width, (int)v), as bash prints it
            out.append(f"{((v + (1 << 31)) % (1 << 32)) - (1 << 31):0{width}d}")
        else:
            out.append(chr(v))
    return out


def _expand(text: str) -> list[str]:
    i = 0
    while True:  # the first `{` that opens a valid brace expression
        i, c = _gobble(text, i, "{")
        if not c or _gobble(text, i + 1, "}")[1]:
            break
        i += 1
    if not c:
        return [text]
    preamble, start = text[:i], i + 1
    i, _ = _gobble(text, start, "}")
    body, post = text[start:i], text[i + 1 :]
    j, comma = 0, False
    while j < len(body):
        if body[j] == "\\":
            j += 2
            continue
        if body[j] == ",":
            comma = True
            break
        j += 1
    if comma:
        parts, k = [], 0
        while True:
            end, sep = _gobble(body, k, ",")
            parts.extend(_expand(body[k:end]))
            if not sep:
                break
            k = end + 1
    else:
        parts = _sequence(body)
        if parts is None:
            if not post:
                return [text]
            parts = ["{" + body + "}"]
    words = [preamble + p for p in parts]
    if post:
        tails = _expand(post)
        if len(words) * len(tails) > MAX_EXPANSION:
            raise ValueError(f"brace pattern {text!r} names more than {MAX_EXPANSION} items")
        words = [w + t for w in words for t in tails]
    return words


def _unescape(word: str) -> str:
    return re.sub(r"\\(.?)", r"\1", word, flags=re.S)  # bash's quote removal of backslashes


def expand_braces(pattern: str) -> list[str]:
    """Expands braces exactly as bash does (the rules in the module docstring).

    >>> expand_braces("train-{000..002}.tar")
    ['train-000.tar', 'train-001.tar', 'train-002.tar']
    >>> expand_braces("x{a,{b,c}}{0..4..2}")
    ['xa0', 'xa2', 'xa4', 'xb0', 'xb2', 'xb4', 'xc0', 'xc2', 'xc4']
    """
    return [_unescape(w) for w in _expand(pattern) if w]
