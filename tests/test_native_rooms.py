"""The C++ core keeps docs/architecture.md's map of its rooms: one folder of `ffi/core/` per room,
each a CMake library that links only the rooms below it, platform -> file -> image -> jpeg ->
serve. Read from the sources: every `#include "..."` under ffi/core must name a header of its
own room or of a lower one (CMakeLists.txt puts only those folders on a room's include path,
so the build refuses the rest too), every file must live in a room listed here, CMakeLists.txt
must link the rooms in this order, and every SIMD kernel must go through the one dispatch
mechanism (platform/simd_dispatch.h)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CORE = REPO / "ffi" / "core"

# Lowest first. A room may include its own headers and those of a room it depends on: file,
# image and jpeg stand on platform alone (and jpeg on image); serve on all of them.
ROOMS = ["platform", "file", "image", "jpeg", "serve"]
DEPENDS = {
    "platform": set(),
    "file": {"platform"},
    "image": {"platform"},
    "jpeg": {"platform", "image"},
    "serve": {"platform", "file", "image", "jpeg"},
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def _sources() -> list[Path]:
    return sorted(p for p in CORE.rglob("*") if p.is_file())


def _room_of(path: Path) -> str:
    return path.relative_to(CORE).parts[0]


def _headers() -> dict[str, str]:
    """Header or .inc file name -> its room (names are unique across the core)."""
    found: dict[str, str] = {}
    for p in _sources():
        if p.suffix in (".h", ".inc"):
            assert p.name not in found, f"{p.name} is in both {found[p.name]}/ and {_room_of(p)}/"
            found[p.name] = _room_of(p)
    return found


def test_every_core_file_lives_in_a_room():
    stray = [
        str(p.relative_to(CORE)) for p in _sources() if len(p.relative_to(CORE).parts) != 2 or _room_of(p) not in ROOMS
    ]
    assert stray == [], f"files outside ffi/core/<room>/: {stray}"


def test_a_room_includes_only_its_own_headers_and_lower_rooms():
    headers = _headers()
    wrong = []
    for p in _sources():
        room = _room_of(p)
        for name in INCLUDE.findall(p.read_text()):
            if "/" in name:  # a path reaches around the include directories
                wrong.append(f"{p.relative_to(CORE)} includes {name!r}: include a header by its name")
                continue
            if name not in headers:
                wrong.append(f"{p.relative_to(CORE)} includes {name!r}, which is not in ffi/core")
                continue
            target = headers[name]
            if target != room and target not in DEPENDS[room]:
                wrong.append(f"{p.relative_to(CORE)} ({room}) includes {target}/{name}")
    assert wrong == [], "\n".join(wrong)


def test_the_order_is_a_chain_upward():
    for room, below in DEPENDS.items():
        assert all(ROOMS.index(b) < ROOMS.index(room) for b in below), room


def _cmake_links() -> dict[str, set[str]]:
    cmake = (REPO / "CMakeLists.txt").read_text()
    links: dict[str, set[str]] = {}
    for m in re.finditer(r"target_link_libraries\(tbljax_(\w+)\s+PUBLIC([^)]*)\)", cmake):
        links[m.group(1)] = set(re.findall(r"\btbljax_(\w+)", m.group(2)))
    return links


def test_cmake_links_each_room_only_to_rooms_below():
    links = _cmake_links()
    for room in ROOMS:
        got = {r for r in links.get(room, set()) if r in ROOMS}
        assert got == DEPENDS[room], f"tbljax_{room} links {sorted(got)}, not {sorted(DEPENDS[room])}"
    # The contract, linked by the CUDA module as well, links no room's code.
    assert not (links.get("contract", set()) & set(ROOMS))


def test_cmake_builds_each_room_as_a_library_with_its_folder_on_the_include_path():
    cmake = (REPO / "CMakeLists.txt").read_text()
    # tbljax_room(name ...) adds ffi/core/<name> to that library's (and its dependents') path.
    assert "target_include_directories(tbljax_${name} PUBLIC ffi/core/${name})" in cmake
    missing = [r for r in ROOMS if not re.search(rf"tbljax_room\({r}\b", cmake)]
    assert missing == [], f"no tbljax_room(...) for {missing} in CMakeLists.txt"


def test_every_simd_kernel_goes_through_the_one_dispatch_header():
    """Per-target code is an .inc compiled by simd_dispatch.h's driver; no file sets a target
    pragma or attribute, or names a target's namespace, by itself."""
    own = []
    for p in _sources():
        text = p.read_text()
        if p.name == "simd_dispatch.h":
            continue
        for pattern in (
            r"__attribute__\(\(target",
            r"TBLJAX_PUSH_TARGET",
            r"pragma GCC target",
            r"simd_(scalar|avx2|avx512)::",
        ):
            if re.search(pattern, text):
                own.append(f"{p.relative_to(CORE)}: {pattern}")
    assert own == [], "\n".join(own)
    incs = [p for p in _sources() if p.suffix == ".inc"]
    assert incs, "no per-target .inc"

    def drivers(inc):
        return [p for p in _sources() if f'#define TBLJAX_SIMD_INC "{inc.name}"' in p.read_text()]

    for inc in incs:
        # A part of a kernel's .inc (one family of its code) is text of that .inc, inside its
        # per-target namespace: included by exactly one .inc, its home, that a driver compiles.
        parents = [p for p in incs if f'#include "{inc.name}"' in p.read_text()]
        home = parents[0] if not drivers(inc) and len(parents) == 1 else inc
        assert len(drivers(home)) == 1, f"{inc.name} is compiled by {drivers(home)}, not one driver"
        assert "TBLJAX_SIMD_NS" in home.read_text(), f"{home.name} (home of {inc.name}) has no per-target namespace"
