"""Runs the images scripts/images.sh builds with runc, as a container runtime would: each image's
layers are extracted into a snapshot of its root file system, layer on layer, the lower layers'
snapshot reused (hard links) so that a new project layer costs its own few megabytes; a runtime
bundle (cached by the image's layers and configuration, so a second run starts at once) points
at it, and every container gets that root file system read-only, the image's user, environment
and working directory, a tmpfs on /tmp, the host's network, and the bind mounts a test asks for.
The spec is runc's default with the image's configuration, as `umoci unpack` makes it, without
`rlimits`: the sandboxes these tests run in refuse to set them, and a cluster's runtime sets its
own."""

from __future__ import annotations

import copy
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass, field

SOURCE_DIR = os.environ.get(
    "VF_SOURCE_DIR", os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
)
CACHE_DIR = os.environ.get(
    "VF_CACHE_DIR",
    os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "virtualflow"),
)
IMAGES_DIR = os.environ.get("VF_IMAGES_DIR", os.path.join(CACHE_DIR, "images"))
BUNDLES_DIR = os.path.join(IMAGES_DIR, "bundles")
# How many of an image's bundles are kept: checkouts sharing the cache keep their own.
KEEP = 3


def version() -> str:
    """The project's version, the images' tag."""
    with open(os.path.join(SOURCE_DIR, "CMakeLists.txt")) as f:
        for line in f:
            if line.startswith("project(VirtualFlow VERSION "):
                return line.split()[2]
    raise RuntimeError("no project version in CMakeLists.txt")


def layout(image: str) -> str:
    return os.path.join(IMAGES_DIR, image)


def manifest(image: str, tag: str | None = None) -> tuple[str, dict]:
    """(digest, manifest) of IMAGE's TAG (default: the version) in its OCI layout."""
    tag = tag or version()
    with open(os.path.join(layout(image), "index.json")) as f:
        index = json.load(f)
    for desc in index["manifests"]:
        if desc.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag:
            return desc["digest"], read_blob(image, desc["digest"])
    raise LookupError("%s has no tag %s" % (layout(image), tag))


def read_blob(image: str, digest: str) -> dict:
    algorithm, hex_digest = digest.split(":")
    with open(os.path.join(layout(image), "blobs", algorithm, hex_digest)) as f:
        return json.load(f)


def image_config(image: str) -> dict:
    """The image's configuration (config.User, Entrypoint, Labels, ...)."""
    return read_blob(image, manifest(image)[1]["config"]["digest"])


def bundle_key(image: str) -> str:
    """What a runtime bundle of IMAGE is made of: its layers and how its process starts, not
    its labels (images.sh re-labels with the revision on every run; the layers stay)."""
    _, found = manifest(image)
    runtime = {k: v for k, v in image_config(image)["config"].items() if k != "Labels"}
    text = json.dumps([[layer["digest"] for layer in found["layers"]], runtime], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def blob_path(image: str, digest: str) -> str:
    algorithm, hex_digest = digest.split(":")
    return os.path.join(layout(image), "blobs", algorithm, hex_digest)


def snapshot(image: str, layers: list[dict]) -> str:
    """The root file system of LAYERS applied in order, as a directory under BUNDLES_DIR/layers
    named for them: made from the snapshot of all but the last (hard links, so the root file
    system and PyTorch are written once, not again for each project layer) with the last layer
    extracted over it. Containers mount it read-only, so the shared files never change."""
    chain = hashlib.sha256(" ".join(d["digest"] for d in layers).encode()).hexdigest()[:16]
    path = os.path.join(BUNDLES_DIR, "layers", "%s-%s" % (image, chain))
    if os.path.isdir(path):
        os.utime(path)
        return path
    partial = path + ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    if len(layers) > 1:
        subprocess.run(["cp", "-al", snapshot(image, layers[:-1]), partial], check=True)
    else:
        os.makedirs(partial)
    # GNU tar replaces a file it extracts over (unlinks it first), so a hard-linked file of the
    # snapshot below is never written through.
    subprocess.run(
        ["tar", "-xpf", blob_path(image, layers[-1]["digest"]), "-C", partial, "--numeric-owner"],
        check=True,
    )
    whiteouts = subprocess.run(
        ["find", partial, "-name", ".wh.*", "-print", "-quit"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    if whiteouts:
        raise RuntimeError(
            "%s: layer %s deletes files (%s); images.sh never makes such layers"
            % (image, layers[-1]["digest"], whiteouts.strip())
        )
    os.rename(partial, path)
    return path


def runtime_spec(image: str, rootfs: str) -> dict:
    """The runtime spec of IMAGE's configuration over ROOTFS, as `umoci unpack` writes it:
    runc's default with the image's user (and its home from the image's /etc/passwd),
    environment, working directory and entrypoint and command."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["runc", "spec", "--bundle", tmp], check=True)
        with open(os.path.join(tmp, "config.json")) as f:
            spec = json.load(f)
    config = image_config(image)["config"]
    uid, _, gid = config.get("User", "0:0").partition(":")
    env = list(config.get("Env", []))
    with open(os.path.join(rootfs, "etc", "passwd")) as f:
        homes = {
            fields[2]: fields[5] for fields in (line.split(":") for line in f) if len(fields) > 5
        }
    if uid in homes and not any(e.startswith("HOME=") for e in env):
        env.append("HOME=" + homes[uid])
    spec["process"].update(
        user={"uid": int(uid), "gid": int(gid or uid)},
        env=env,
        cwd=config.get("WorkingDir") or "/",
        args=config.get("Entrypoint", []) + config.get("Cmd", []),
    )
    spec["root"] = {"path": rootfs, "readonly": True}
    return spec


def bundle(image: str) -> str:
    """A runtime bundle of IMAGE (made once per bundle_key, its root file system a snapshot of
    its layers; the KEEP most recently used of each image's bundles and snapshots stay)."""
    path = os.path.join(BUNDLES_DIR, "%s-%s" % (image, bundle_key(image)))
    if os.path.exists(os.path.join(path, "config.json")):
        os.utime(path)
        return path
    with open(os.path.join(IMAGES_DIR, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        os.makedirs(BUNDLES_DIR, exist_ok=True)
        rootfs = snapshot(image, manifest(image)[1]["layers"])
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "config.json.partial"), "w") as f:
            json.dump(runtime_spec(image, rootfs), f)
        os.rename(os.path.join(path, "config.json.partial"), os.path.join(path, "config.json"))
        retire(BUNDLES_DIR, image, KEEP)
        retire(os.path.join(BUNDLES_DIR, "layers"), image, 2 * KEEP)
    return path


def retire(directory: str, image: str, keep: int) -> None:
    """Removes IMAGE's entries of DIRECTORY (named IMAGE-KEY) beyond the KEEP most recently
    used."""
    mine = [
        e for e in os.listdir(directory) if re.fullmatch(re.escape(image) + r"-[0-9a-f]{16}", e)
    ]
    mine.sort(key=lambda e: os.stat(os.path.join(directory, e)).st_mtime, reverse=True)
    for old in mine[keep:]:
        shutil.rmtree(os.path.join(directory, old), ignore_errors=True)


@dataclass
class Mount:
    """A bind mount of a host path into the container."""

    source: str
    destination: str
    read_only: bool = True


@dataclass
class Container:
    """One `runc run` of an image; not thread-safe (one test drives it)."""

    image: str
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)
    mounts: list[Mount] = field(default_factory=list)
    cwd: str | None = None
    name: str = field(default_factory=lambda: "vf-" + uuid.uuid4().hex[:12])
    proc: subprocess.Popen | None = None

    def spec(self, bundle_path: str) -> dict:
        """The runtime spec: the bundle's, with the test's command, environment and mounts."""
        with open(os.path.join(bundle_path, "config.json")) as f:
            config = json.load(f)
        config = copy.deepcopy(config)
        process = config["process"]
        process.pop("rlimits", None)
        process["terminal"] = False
        process["args"] = self.args
        env = dict(e.split("=", 1) for e in process.get("env", []))
        env.update(self.env)
        process["env"] = ["%s=%s" % kv for kv in env.items()]
        if self.cwd:
            process["cwd"] = self.cwd
        config["root"] = {
            "path": os.path.join(bundle_path, config["root"]["path"]),
            "readonly": True,
        }
        linux = config.setdefault("linux", {})
        linux["namespaces"] = [ns for ns in linux.get("namespaces", []) if ns["type"] != "network"]
        mounts = [m for m in config.get("mounts", []) if m["destination"] != "/tmp"]
        mounts.append(
            {
                "destination": "/tmp",
                "type": "tmpfs",
                "source": "tmpfs",
                "options": ["nosuid", "nodev", "mode=1777", "size=1g"],
            }
        )
        for m in self.mounts:
            mounts.append(
                {
                    "destination": m.destination,
                    "type": "bind",
                    "source": m.source,
                    "options": ["rbind", "ro" if m.read_only else "rw"],
                }
            )
        config["mounts"] = mounts
        return config

    def start(self, stdout: int | None = subprocess.PIPE) -> Container:
        """Starts the container (runc run in the foreground of a child process)."""
        bundle_path = bundle(self.image)
        # The spec goes into a bundle of the container's own whose root is the shared rootfs.
        own = os.path.join(BUNDLES_DIR, "run", self.name)
        os.makedirs(own)
        with open(os.path.join(own, "config.json"), "w") as f:
            json.dump(self.spec(bundle_path), f)
        self.proc = subprocess.Popen(
            ["runc", "run", "--bundle", own, self.name],
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=subprocess.STDOUT,
            text=True,
        )
        return self

    def wait(self, timeout: float) -> tuple[int, str]:
        """Waits for the container's command; (exit status, its output)."""
        assert self.proc is not None
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            out, _ = self.proc.communicate()
            raise AssertionError(
                "%s in %s did not end in %ss:\n%s" % (self.args, self.image, timeout, out)
            ) from None
        self.remove()
        return self.proc.returncode, out or ""

    def stop(self) -> None:
        """Kills the container's processes and removes it."""
        subprocess.run(["runc", "kill", self.name, "KILL"], capture_output=True)
        if self.proc is not None:
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.remove()

    def remove(self) -> None:
        subprocess.run(["runc", "delete", "--force", self.name], capture_output=True)
        shutil.rmtree(os.path.join(BUNDLES_DIR, "run", self.name), ignore_errors=True)


def run(image: str, args: list[str], timeout: float = 300, **kw) -> tuple[int, str]:
    """Runs ARGS in IMAGE to the end; (exit status, output)."""
    return Container(image, args, **kw).start().wait(timeout)
