"""Prints the files of the given Python distributions and of everything they require (their
dependency closure, with the environment markers of this interpreter), one path a line relative
to site-packages, so that an image holds what `import torch` needs and not the tools of the
environment it came from (pip, the compilers, the test runner). Used by scripts/images.sh.

usage: python-files.py [--exclude NAME]... DIST...
"""

from __future__ import annotations

import importlib.metadata as md
import re
import sys


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse(req: str) -> tuple[str, set[str], str]:
    """(name, extras, marker) of a requirement string such as `a[b,c]>=1; extra == "d"`."""
    spec, _, marker = req.partition(";")
    m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?", spec)
    if m is None:
        raise ValueError("cannot parse requirement %r" % req)
    extras = {canonical(e) for e in (m.group(2) or "").split(",") if e.strip()}
    return m.group(1), extras, marker.strip()


def requirements(dist: md.Distribution, extras: set[str]) -> list[tuple[str, set[str]]]:
    """What DIST requires here with EXTRAS asked for: (name, extras) pairs."""
    out = []
    for req in dist.requires or []:
        name, wanted, marker = parse(req)
        if marker and not any(evaluate(marker, e) for e in (extras or {""}) | {""}):
            continue
        out.append((name, wanted))
    return out


def evaluate(marker: str, extra: str) -> bool:
    """An environment marker, with the `packaging` module that pip vendors."""
    from pip._vendor.packaging.markers import Marker

    return Marker(marker).evaluate({"extra": extra})


def closure(roots: list[str], exclude: set[str]) -> list[md.Distribution]:
    seen: dict[str, md.Distribution] = {}
    done: set[tuple[str, str]] = set()  # (name, extra) pairs already expanded
    todo: list[tuple[str, set[str]]] = [(r, set()) for r in roots]
    while todo:
        raw, extras = todo.pop()
        name = canonical(raw)
        if name in exclude:
            continue
        keys = {(name, e) for e in extras | {""}}
        if keys <= done:
            continue
        done |= keys
        dist = seen.setdefault(name, md.distribution(name))
        todo.extend(requirements(dist, extras))
    return [seen[k] for k in sorted(seen)]


def main(argv: list[str]) -> int:
    exclude: set[str] = set()
    roots: list[str] = []
    args = iter(argv)
    for arg in args:
        if arg == "--exclude":
            exclude.add(canonical(next(args)))
        else:
            roots.append(arg)
    for dist in closure(roots, exclude):
        sys.stderr.write("python-files: %s %s\n" % (dist.metadata["Name"], dist.version))
        for f in dist.files or []:
            path = str(f)
            if not path.startswith("..") and "__pycache__" not in path:
                print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
