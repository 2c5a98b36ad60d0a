"""The Dockerfiles in docker/ and scripts/images.sh build the same images: each Dockerfile's build
stage installs the build packages of scripts/setup.sh and runs scripts/build.sh, and checks its
binaries against docker/packages-<image>.txt with docker/runtime-packages.sh; its final stage is
Debian 12 slim and installs exactly that list, adds the same user, copies the same files, and
has the same entrypoint or command, working directory, ports and labels as images.sh gives the
image (`scripts/images.sh --describe IMAGE`). Runs without Docker, root or a build.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import unittest

SOURCE_DIR = os.environ.get(
    "VF_SOURCE_DIR", os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
)
DOCKER_DIR = os.path.join(SOURCE_DIR, "docker")
IMAGES_SCRIPT = os.path.join(SOURCE_DIR, "scripts", "images.sh")
SETUP_SCRIPT = os.path.join(SOURCE_DIR, "scripts", "setup.sh")
IMAGES = ("operator", "agent", "torch-agent")
# What setup.sh installs for running jobs and tests, not for building (ccache speeds up
# rebuilds on one machine, an image is built once; the GPT example's corpus is data; iproute2
# gives the end-to-end tests' pods their networks; clang builds the fuzzers, which a build of
# named targets skips; python3-venv is the PyTorch environment's, only the PyTorch image's;
# mmdebstrap, umoci, runc and skopeo build, run and push images).
NOT_FOR_BUILDING = {
    "dataset-fashion-mnist",
    "procps",
    "prometheus",
    "clang-format",
    "clang-tidy",
    "openssl",
    "util-linux",
    "ccache",
    "python3-venv",
    "fortunes",
    "iproute2",
    "clang-14",
    "libclang-rt-14-dev",
    "mmdebstrap",
    "umoci",
    "runc",
    "skopeo",
    "containerd",  # the end-to-end tests' real nodes
    "containernetworking-plugins",
    "iptables",
}
# What each image's build needs besides: pip for the CUDA wheels (setup-cuda.sh) and the venv
# module for the PyTorch environment (setup-python.sh).
BUILD_EXTRAS = {"operator": set(), "agent": {"python3-pip"}, "torch-agent": {"python3-venv"}}
BUILD_TARGETS = {
    "operator": "virtualflow-operator",
    "agent": "virtualflow-agent vf virtualflow-cuda",
    "torch-agent": "vf virtualflow_python virtualflow-cuda",
}


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


def setup_packages() -> set[str]:
    """The PACKAGES of scripts/setup.sh."""
    text = read(SETUP_SCRIPT)
    match = re.search(r"^PACKAGES=\((.*?)^\)", text, re.S | re.M)
    assert match is not None, "no PACKAGES=( ... ) in scripts/setup.sh"
    return set(re.sub(r"#.*", "", match.group(1)).split())


def stages(path: str) -> list[tuple[str, str]]:
    """[(FROM line, the stage's instructions, one a line)]."""
    text = read(path).replace("\\\n", " ")
    out: list[list[str]] = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("FROM "):
            out.append([line, ""])
        elif out and line and not line.startswith("#"):
            out[-1][1] += re.sub(r"\s+", " ", line) + "\n"
    return [(a, b) for a, b in out]


def apt_installed(stage: str) -> set[str]:
    """Packages named on `apt-get install` lines (options and variables left out)."""
    out: set[str] = set()
    for m in re.finditer(r"apt-get install ([^&\n]*)", stage):
        out.update(w for w in m.group(1).split() if not w.startswith(("-", "$")))
    return out


def instructions(stage: str, keyword: str) -> list[str]:
    return [
        line[len(keyword) + 1 :] for line in stage.splitlines() if line.startswith(keyword + " ")
    ]


def labels(stage: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in instructions(stage, "LABEL"):
        out.update(re.findall(r'(\S+?)="([^"]*)"', line))
    return out


def describe(image: str) -> dict[str, list[str]]:
    """scripts/images.sh --describe IMAGE as {key: [values]}."""
    out = subprocess.run(
        [IMAGES_SCRIPT, "--describe", image], capture_output=True, text=True, check=True
    ).stdout
    result: dict[str, list[str]] = {}
    for line in out.splitlines():
        key, _, value = line.partition(" ")
        result.setdefault(key, []).append(value)
    return result


def project_version() -> str:
    match = re.search(
        r"^project\(VirtualFlow VERSION ([0-9.]+)",
        read(os.path.join(SOURCE_DIR, "CMakeLists.txt")),
        re.M,
    )
    assert match is not None
    return match.group(1)


class DockerfilesTest(unittest.TestCase):
    def image(self, image: str) -> tuple[str, str, str, dict[str, list[str]]]:
        path = os.path.join(DOCKER_DIR, image + ".Dockerfile")
        text = read(path)
        self.assertIn("ARG BUILD_IMAGE=debian:bookworm\n", text)
        self.assertIn("ARG RUNTIME_IMAGE=debian:bookworm-slim\n", text)
        found = stages(path)
        self.assertEqual(
            [f for f, _ in found], ["FROM ${BUILD_IMAGE} AS build", "FROM ${RUNTIME_IMAGE}"]
        )
        return text, found[0][1], found[1][1], describe(image)

    def test_build_stages_run_the_readmes_build(self):
        for image in IMAGES:
            with self.subTest(image):
                _, build, _, _ = self.image(image)
                self.assertEqual(
                    apt_installed(build),
                    setup_packages() - NOT_FOR_BUILDING | BUILD_EXTRAS[image],
                    "docker/%s.Dockerfile installs other packages than scripts/setup.sh" % image,
                )
                self.assertIn("./scripts/build.sh %s " % BUILD_TARGETS[image], build)

    def test_both_install_the_images_package_list(self):
        for image in IMAGES:
            with self.subTest(image):
                _, build, final, described = self.image(image)
                packages = "docker/packages-%s.txt" % image
                self.assertEqual(described["packages"], [packages])
                self.assertIn("./docker/runtime-packages.sh --check %s" % packages, build)
                self.assertIn("sed -e 's/#.*//' %s | xargs -n1 > /out/packages" % packages, build)
                self.assertIn("COPY --from=build /out/packages /tmp/packages", final)
                self.assertIn("xargs -a /tmp/packages apt-get install", final)
                self.assertEqual(apt_installed(final), set(), "packages not from the list")
                self.assertTrue(os.path.exists(os.path.join(SOURCE_DIR, packages)))

    def test_same_user_entrypoint_and_working_directory(self):
        images_text = read(IMAGES_SCRIPT)
        for image in IMAGES:
            with self.subTest(image):
                _, _, final, described = self.image(image)
                user = described["user"][0]
                self.assertEqual(instructions(final, "USER"), [user])
                uid, gid = user.split(":")
                self.assertIn("--uid %s --gid %s" % (uid, gid), final)
                self.assertIn("useradd", final)
                self.assertRegex(final, r"useradd .* virtualflow\n")
                self.assertIn("virtualflow:x:$USER_ID:$USER_ID:", images_text)
                self.assertEqual(instructions(final, "WORKDIR"), described["workingdir"])
                for key, keyword in (("entrypoint", "ENTRYPOINT"), ("cmd", "CMD")):
                    self.assertEqual(
                        [json.loads(v) for v in instructions(final, keyword)],
                        [[v] for v in described.get(key, [])],
                        keyword,
                    )
                self.assertEqual(instructions(final, "ENV"), described.get("env", []), "ENV")
                ports = [p.split("/")[0] for p in described.get("exposedports", [])]
                self.assertEqual(" ".join(instructions(final, "EXPOSE")).split(), ports)

    def test_same_labels(self):
        for image in IMAGES:
            with self.subTest(image):
                _, _, final, described = self.image(image)
                expected = dict(v.split("=", 1) for v in described["label"])
                self.assertEqual(expected["org.opencontainers.image.version"], project_version())
                got = labels(final)
                for key, value in expected.items():
                    self.assertEqual(got.get(key), value, key)
                self.assertEqual(got["org.opencontainers.image.revision"], "${VF_REVISION}")
                self.assertEqual(got["org.opencontainers.image.source"], "${VF_SOURCE}")

    def test_same_files(self):
        for image in IMAGES:
            with self.subTest(image):
                _, _, final, described = self.image(image)
                # No sources in the final image: everything comes from the build stage.
                self.assertNotRegex(final, r"(?m)^COPY (?!--from=build )")
                copied = [
                    line.split()[-1]
                    for line in instructions(final, "COPY")
                    if not line.endswith(" /tmp/packages")
                ]
                files = described["file"]
                for f in files:
                    self.assertTrue(
                        any(f == c or f.startswith(c + "/") for c in copied),
                        "%s: images.sh adds %s, the Dockerfile does not" % (image, f),
                    )
                for c in copied:
                    self.assertTrue(
                        any(f == c or f.startswith(c + "/") for f in files),
                        "%s: the Dockerfile adds %s, images.sh does not" % (image, c),
                    )


if __name__ == "__main__":
    unittest.main()
