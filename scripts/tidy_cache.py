#!/usr/bin/env python3
"""The results scripts/tidy.sh remembers: a file clang-tidy found nothing in is not parsed again
while nothing it was checked with has changed. The key of a file is a hash of its compile
command, the content of every file its compilation reads (its own source, every header, the
system's included), the .clang-tidy files that apply to it, clang-tidy's version and this
script's and tidy.sh's text; a file with findings is never remembered, so it is checked again
each time. Paths inside the checkout and the build directory are hashed relative to them, so
another clone of the same commit finds the same keys. Not thread-safe within one process; two
runs at once only ever add the same empty marker files.

  tidy_cache.py pending DB CACHE ROOT BUILD KEYS FILE...  prints the FILEs not remembered,
                                                          writes every FILE's key to KEYS
  tidy_cache.py record CACHE KEYS FILE...                  remembers FILEs as clean
"""

import concurrent.futures
import hashlib
import json
import os
import shlex
import subprocess
import sys

VERSION = "1"


def compile_args(entry: dict) -> list[str]:
    """ENTRY's compile command as arguments, without its output file."""
    args = entry["arguments"] if "arguments" in entry else shlex.split(entry["command"])
    out = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg == "-o":
            skip = True
        elif arg != "-c":
            out.append(arg)
    return out


def dependencies(entry: dict) -> list[str]:
    """every file ENTRY's compilation reads, as the compiler's -M lists them."""
    proc = subprocess.run(
        compile_args(entry) + ["-M", "-MF", "-"],
        cwd=entry["directory"],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError("%s: the compiler's -M failed: %s" % (entry["file"], proc.stderr))
    # "target.o: a.cc b.h \" and so on; a path with a space is written with "\ ".
    text = proc.stdout.replace("\\\n", " ").split(":", 1)[1]
    paths = [p.replace("\0", " ") for p in text.replace("\\ ", "\0").split()]
    return [os.path.normpath(os.path.join(entry["directory"], p)) for p in paths]


class Hasher:
    """Content hashes of files, each file read once; paths under ROOT and BUILD made relative."""

    def __init__(self, root: str, build: str):
        self.places = sorted(
            [(os.path.realpath(build), "<build>"), (os.path.realpath(root), "<root>")],
            key=lambda p: -len(p[0]),
        )
        self.seen: dict[str, str] = {}

    def name(self, path: str) -> str:
        real = os.path.realpath(path)
        for place, label in self.places:
            if real == place or real.startswith(place + os.sep):
                return label + real[len(place) :]
        return real

    def text(self, value: str) -> str:
        for place, label in self.places:
            value = value.replace(place, label)
        return value

    def content(self, path: str) -> str:
        if path not in self.seen:
            with open(path, "rb") as f:
                self.seen[path] = hashlib.sha256(f.read()).hexdigest()
        return self.seen[path]


def tidy_configs(path: str, root: str) -> list[str]:
    """the .clang-tidy files from PATH's directory up to ROOT, as clang-tidy looks for them."""
    found = []
    d = os.path.dirname(os.path.realpath(path))
    top = os.path.realpath(root)
    while True:
        candidate = os.path.join(d, ".clang-tidy")
        if os.path.isfile(candidate):
            found.append(candidate)
        if d == top or d == os.path.dirname(d):
            return found
        d = os.path.dirname(d)


def key(entry: dict, deps: list[str], hasher: Hasher, common: str, root: str) -> str:
    h = hashlib.sha256(common.encode())
    h.update(hasher.text(" ".join(compile_args(entry))).encode() + b"\n")
    # In the order of the names hashed, which is the same in every clone.
    named = sorted((hasher.name(p), p) for p in set(deps) | set(tidy_configs(entry["file"], root)))
    for name, path in named:
        h.update(("%s %s\n" % (name, hasher.content(path))).encode())
    return h.hexdigest()


def pending(db: str, cache: str, root: str, build: str, keys_path: str, files: list[str]) -> int:
    with open(db) as f:
        entries = {os.path.realpath(e["file"]): e for e in json.load(f)}
    here = os.path.dirname(os.path.abspath(__file__))
    common = (
        VERSION
        + "\n"
        + subprocess.run(
            ["clang-tidy", "--version"], capture_output=True, text=True, check=True
        ).stdout
    )
    for script in ("tidy.sh", "tidy_cache.py"):
        with open(os.path.join(here, script)) as f:
            common += f.read()
    wanted = [entries[os.path.realpath(f)] for f in files]
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        deps = list(pool.map(dependencies, wanted))
    hasher = Hasher(root, build)
    keys = {}
    for path, entry, d in zip(files, wanted, deps, strict=True):
        keys[path] = key(entry, d, hasher, common, root)
        if not os.path.exists(os.path.join(cache, keys[path])):
            print(path)
    with open(keys_path, "w") as f:
        json.dump(keys, f)
    return 0


def record(cache: str, keys_path: str, files: list[str]) -> int:
    with open(keys_path) as f:
        keys = json.load(f)
    os.makedirs(cache, exist_ok=True)
    for path in files:
        with open(os.path.join(cache, keys[path]), "w"):
            pass
    return 0


def main(argv: list[str]) -> int:
    if len(argv) >= 7 and argv[1] == "pending":
        return pending(argv[2], argv[3], argv[4], argv[5], argv[6], argv[7:])
    if len(argv) >= 4 and argv[1] == "record":
        return record(argv[2], argv[3], argv[4:])
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
