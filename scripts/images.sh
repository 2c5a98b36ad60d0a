#!/usr/bin/env bash
# Builds the container images without a daemon, as OCI image layouts under
# ~/.cache/virtualflow/images/<image> (tag: the project's version), from the binaries of
# build/ (scripts/build.sh first):
#   operator     virtualflow-operator
#   agent        virtualflow-agent, vf, libvirtualflow-cuda.so and the CUDA and NCCL libraries
#                it loads on a GPU
#   torch-agent  the virtualflow Python package, PyTorch from the Python environment
#                (scripts/setup-python.sh), vf and examples/torch, for PyTorch jobs
# Each is Debian 12 (mmdebstrap, variant essential, from this machine's apt sources) with
# exactly the packages of docker/packages-<image>.txt (docker/runtime-packages.sh --check holds
# the list to the libraries the binaries link), the files above, the user virtualflow (uid and
# gid 65532) and the OCI annotations org.opencontainers.image.{version,revision,source}.
# Layers: the root file system, the Python packages (torch-agent), the project's files; each is
# cached by what it is made of, so a second run only re-tags. Prints each image's size.
#
# usage: scripts/images.sh [IMAGE...]          (default: all three)
#        scripts/images.sh --describe IMAGE   what the image holds and runs, one "KEY VALUE" a line
# Push one with skopeo: skopeo copy oci:$HOME/.cache/virtualflow/images/agent:0.1.0 \
#                                   docker://REGISTRY/virtualflow/agent:0.1.0
# Needs root (mmdebstrap installs packages as root), mmdebstrap and umoci (scripts/setup.sh).
# VF_IMAGES_DIR: where the layouts go; VF_IMAGE_SOURCE: the source annotation (default: the
# git remote's URL).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${VF_BUILD_DIR:-$root/build}"
cache="${VF_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/virtualflow}"
out="${VF_IMAGES_DIR:-$cache/images}"
python="${VF_PYTHON:-$cache/py/bin/python3}"
SUITE=bookworm
VARIANT=essential
USER_ID=65532
# The layer format: bump when the way a layer is made changes, so cached layers are rebuilt.
FORMAT=1

log() { echo "images: $*" >&2; }
is_elf() { [ "$(head -c 4 "$1" | tail -c 3)" = ELF ]; }
die() { log "$*"; exit 1; }
# Whether layout $1 has tag $2. Not `umoci ls | grep -q`: grep's early exit can fail umoci with
# SIGPIPE, and pipefail turns that into "no such tag".
has_tag() {
  local tags
  tags="$(umoci ls --layout "$1")"
  grep -qxF "$2" <<<"$tags"
}

version="$(sed -n 's/^project(VirtualFlow VERSION \([0-9.]*\).*/\1/p' "$root/CMakeLists.txt")"
revision="$(git -C "$root" rev-parse HEAD)"
if [ -n "$(git -C "$root" status --porcelain --untracked-files=no)" ]; then
  revision="$revision-dirty"
fi
source_url="${VF_IMAGE_SOURCE:-$(git -C "$root" config --get remote.origin.url || echo "file://$root")}"
site_packages=""

# ------------------------------------------------------------------ what each image holds

# Prints "SOURCE TARGET" lines: the files of image $1 (TARGET relative to /).
image_files() {
  case "$1" in
    operator)
      echo "$build/bin/virtualflow-operator usr/local/bin/virtualflow-operator" ;;
    agent)
      for f in virtualflow-agent vf libvirtualflow-cuda.so; do
        [ "$f" = libvirtualflow-cuda.so ] && [ ! -f "$build/bin/$f" ] && continue
        echo "$build/bin/$f usr/local/bin/$f"
      done ;;
    torch-agent)
      echo "$build/bin/vf usr/local/bin/vf"
      echo "$build/python/virtualflow usr/local/lib/python3.11/dist-packages/virtualflow"
      echo "$root/examples/torch opt/virtualflow/examples/torch" ;;
    *) die "unknown image $1 (operator, agent, torch-agent)" ;;
  esac
}

# The binaries whose libraries docker/packages-$1.txt must hold.
image_binaries() {
  case "$1" in
    operator) echo "$build/bin/virtualflow-operator" ;;
    agent)
      echo "$build/bin/virtualflow-agent $build/bin/vf"
      # The CUDA device and NCCL communicator, in a build with CUDA (VF_WITH_CUDA).
      [ -f "$build/bin/libvirtualflow-cuda.so" ] && echo "$build/bin/libvirtualflow-cuda.so" ;;
    torch-agent) echo "$build/bin/vf $(ls "$build"/python/virtualflow/_core.*.so)" ;;
  esac
}

# umoci config arguments of image $1: entrypoint, working directory, environment, ports.
image_config() {
  case "$1" in
    operator)
      echo "--config.entrypoint=/usr/local/bin/virtualflow-operator --config.workingdir=/"
      echo "--config.exposedports=7070/tcp --config.exposedports=8080/tcp" ;;
    agent)
      echo "--config.entrypoint=/usr/local/bin/virtualflow-agent --config.workingdir=/tmp" ;;
    torch-agent)
      # The job's command (python3 examples/torch/cnn.py) runs from /opt/virtualflow.
      echo "--config.cmd=python3 --config.workingdir=/opt/virtualflow" ;;
  esac
}

image_description() {
  case "$1" in
    operator) echo "VirtualFlow Kubernetes operator: VirtualFlowJob controller and coordinator" ;;
    agent) echo "VirtualFlow agent: trains a job's virtual nodes on CPUs or CUDA with NCCL" ;;
    torch-agent) echo "VirtualFlow for PyTorch: the virtualflow package, PyTorch and vf" ;;
  esac
}

# ------------------------------------------------------------------ layers

# The package names of docker/packages-$1.txt.
packages() {
  sed -e 's/#.*//' "$root/docker/packages-$1.txt" | tr -s ' \t' '\n' | sed '/^$/d'
}

# Each of them with the version installed here, the one the build linked against: part of the
# root file system's cache key, so an upgrade here rebuilds it. The image gets the apt
# sources' current versions (a stable release's updates keep the libraries' ABI); pinning the
# ones here fails once a security update has replaced them in the archive.
installed_versions() {
  local p v
  for p in $(packages "$1"); do
    v="$(dpkg-query -W -f='${Version}' "$p" 2>/dev/null)" ||
      die "$p (docker/packages-$1.txt) is not installed here; run scripts/setup.sh"
    echo "$p=$v"
  done
}

apt_sources() {
  local f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [ -s "$f" ] && echo "$f"
  done
  return 0
}

# Builds (or finds cached) the root file system of image $1 as tarball; prints its path.
rootfs_tar() {
  local name="$1" key tar hooks
  key="$(printf '%s\n' "$FORMAT $SUITE $VARIANT $USER_ID" "$(installed_versions "$name")" |
         sha256sum | cut -c1-16)"
  tar="$out/rootfs/$name-$key.tar"
  if [ -f "$tar" ]; then
    log "$name: root file system cached ($(basename "$tar"))"
    echo "$tar"
    return
  fi
  mkdir -p "$out/rootfs"
  log "$name: building the root file system with mmdebstrap ($(packages "$name" | wc -l) packages)"
  # The user the image runs as; no passwd package (useradd) in the essential variant.
  hooks=(--customize-hook="echo 'virtualflow:x:$USER_ID:$USER_ID:virtualflow:/nonexistent:/usr/sbin/nologin' >> \"\$1/etc/passwd\""
         --customize-hook="echo 'virtualflow:x:$USER_ID:' >> \"\$1/etc/group\""
         --customize-hook="rm -rf \"\$1\"/var/cache/* \"\$1\"/var/log/* \"\$1\"/var/lib/apt/lists/*")
  mmdebstrap --variant="$VARIANT" --include="$(packages "$name" | paste -sd,)" \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    "${hooks[@]}" --quiet "$SUITE" "${tar%.tar}.part.tar" $(apt_sources) ||
    die "$name: mmdebstrap failed"
  mv "${tar%.tar}.part.tar" "$tar"
  echo "$tar"
}

# Makes a tar of directory $1's contents (sorted, root-owned, one timestamp) at $2.
layer_tar() {
  (cd "$1" && find . -mindepth 1 -maxdepth 1 -printf '%P\n' | sort |
     tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf "$2" -T -)
}

# Adds layer tarball $3 to tag $2 of layout $1, as tag $4, unless $4 exists.
add_layer() {
  local layout="$1" from="$2" tar="$3" tag="$4" comment="$5"
  if has_tag "$layout" "$tag"; then
    log "$(basename "$layout"): layer $tag cached"
    return
  fi
  log "$(basename "$layout"): packing layer $tag ($(du -sh "$tar" | cut -f1))"
  umoci raw add-layer --image "$layout:$from" --tag "$tag" \
    --history.created_by="scripts/images.sh" --history.comment="$comment" "$tar"
}

# Copies image $1's files into directory $2 (binaries stripped of debug information).
stage_files() {
  local name="$1" stage="$2" src dst
  while read -r src dst; do
    [ -e "$src" ] || die "$name: $src is missing (scripts/build.sh builds it)"
    mkdir -p "$stage/$(dirname "$dst")"
    if [ -d "$src" ]; then
      cp -rL "$src" "$stage/$dst"
      find "$stage/$dst" -name __pycache__ -prune -exec rm -rf {} +
    elif [[ "$src" == "$build"/* ]] && is_elf "$src"; then
      strip --strip-debug -o "$stage/$dst" "$src"
    else
      cp -L "$src" "$stage/$dst"
    fi
  done < <(image_files "$name")
  chmod -R u=rwX,go=rX "$stage"
}

# Checks in the image's root file system ($2: the base with the files of $1 added) that every
# binary finds all its libraries, and refreshes ld.so's cache there for the layer.
check_libraries() {
  local name="$1" work="$2" stage="$3" bin missing
  ldconfig -r "$work"
  mkdir -p "$stage/etc"
  cp "$work/etc/ld.so.cache" "$stage/etc/ld.so.cache"
  for bin in $(cd "$stage" && find . -type f \( -perm -u+x -o -name '*.so' \) | sed 's|^\.||'); do
    is_elf "$work$bin" || continue
    missing="$(chroot "$work" /usr/bin/ldd "$bin" | grep 'not found' |
               grep -Ev '^\s*(libcuda|libnvidia-ml|libnvidia-ptxjitcompiler)\.so' || true)"
    [ -z "$missing" ] || die "$name: in the image, $bin does not find: $missing"
  done
}

# The layer of the Python packages PyTorch needs (torch-agent): tag deps-KEY on top of tag $2.
python_layer() {
  local layout="$1" from="$2" list dists key tag stage
  [ -x "$python" ] || die "torch-agent: no Python environment with PyTorch at $python (VF_PYTHON)"
  site_packages="$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  list="$(mktemp)"
  # triton is left out: it compiles kernels for torch.compile on a GPU (~1 GB), which eager
  # training does not use.
  dists="$(cd "$site_packages" && "$python" "$root/docker/python-files.py" --exclude triton \
             torch numpy 2>&1 >"$list" | sed 's/^python-files: //')"
  key="$(printf '%s\n' "$FORMAT" "$dists" | sha256sum | cut -c1-16)"
  tag="deps-$key"
  if ! has_tag "$layout" "$tag"; then
    stage="$(mktemp -d "$out/tmp.XXXXXX")"
    mkdir -p "$stage/usr/local/lib/python3.11/dist-packages"
    (cd "$site_packages" && tr '\n' '\0' < "$list" |
       xargs -0 cp --parents -t "$stage/usr/local/lib/python3.11/dist-packages")
    layer_tar "$stage" "$stage.tar"
    rm -rf "$stage"
    add_layer "$layout" "$from" "$stage.tar" "$tag" "Python packages: $(echo $dists | tr '\n' ' ')"
    rm -f "$stage.tar"
  else
    log "$(basename "$layout"): layer $tag cached"
  fi
  rm -f "$list"
  echo "$tag"
}

# The image's size: its layers as stored (compressed) and as unpacked.
report_size() {
  local name="$1" layout="$2"
  python3 - "$layout" "$version" <<'PY'
import json, os, sys
layout, tag = sys.argv[1], sys.argv[2]
def blob(digest):
    return os.path.join(layout, "blobs", *digest.split(":"))
index = json.load(open(os.path.join(layout, "index.json")))
desc = next(m for m in index["manifests"]
            if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag)
manifest = json.load(open(blob(desc["digest"])))
config = json.load(open(blob(manifest["config"]["digest"])))
history = [h for h in config.get("history", []) if not h.get("empty_layer")]
mib = lambda n: "%.0f MiB" % (n / 2**20)
parts = ["%s %s" % (h.get("comment", "?").split(":")[0], mib(l["size"]))
         for l, h in zip(manifest["layers"], history)]
print("%s compressed (%s)" % (mib(sum(l["size"] for l in manifest["layers"])), ", ".join(parts)))
PY
}

# Removes the tags of layers no longer built (older keys) and, when there were some, their blobs
# (umoci gc reads every blob: a minute for the PyTorch image, so not on every run).
collect_garbage() {
  local layout="$1" tag removed=""
  shift
  for tag in $(umoci ls --layout "$layout"); do
    if ! grep -qxF "$tag" <<<"$(printf '%s\n' "$@")"; then
      umoci rm --image "$layout:$tag"
      removed=1
    fi
  done
  [ -z "$removed" ] || umoci gc --layout "$layout"
}

# A key of what the project's layer of image $1 is made of: the files (by name, size and time),
# the libraries no package holds that the binaries load, the package list and these scripts.
inputs_key() {
  local name="$1" src dst bin
  {
    echo "$FORMAT"
    cat "$root/docker/packages-$name.txt" "$0" "$root/docker/runtime-packages.sh"
    image_files "$name" | while read -r src dst; do
      [ -e "$src" ] || die "$name: $src is missing (scripts/build.sh builds it)"
      find -L "$src" -type f ! -path '*/__pycache__/*' -printf "%p %s %T@ $dst\n" | sort
    done
    for bin in $(image_binaries "$name"); do
      ldd "$bin" | awk '$2 == "=>" {print $3}' | { grep -v '^/\(usr/\)\?lib/' || true; } |
        xargs -r stat -L -c '%n %s %Y'
    done
  } | sha256sum | cut -c1-16
}

# Stages the project's files of image $1 into $2, after checking docker/packages-$1.txt against
# the libraries its binaries link. The libraries no package holds (the CUDA runtime, cuBLAS and
# NCCL that libvirtualflow-cuda.so links, from the toolkit it was built with) go into the image
# where ld.so.conf.d/virtualflow-cuda.conf points.
stage_app() {
  local name="$1" files="$2"
  # shellcheck disable=SC2046
  "$root/docker/runtime-packages.sh" --check "$root/docker/packages-$name.txt" \
    --bundle-into "$files/usr/local/lib/virtualflow-cuda" $(image_binaries "$name") ||
    die "$name: docker/packages-$name.txt and the binaries disagree"
  if [ -d "$files/usr/local/lib/virtualflow-cuda" ]; then
    mkdir -p "$files/etc/ld.so.conf.d"
    echo /usr/local/lib/virtualflow-cuda > "$files/etc/ld.so.conf.d/virtualflow-cuda.conf"
  fi
  stage_files "$name" "$files"
}

build_image() {
  local name="$1" layout="$out/$1" tar base top stage="" work key app
  local start=$SECONDS
  key="$(inputs_key "$name")"
  app="app-$key"
  if ! has_tag "$layout" "$app"; then
    stage="$(mktemp -d "$out/tmp.XXXXXX")"
    stage_app "$name" "$stage/files"
  fi
  tar="$(rootfs_tar "$name")"
  if [ ! -f "$layout/index.json" ]; then
    umoci init --layout "$layout"
    umoci new --image "$layout:empty"
  fi
  base="base-$(basename "$tar" .tar | sed "s/^$name-//")"
  add_layer "$layout" empty "$tar" "$base" "root file system: Debian $SUITE, docker/packages-$name.txt"
  top="$base"
  if [ "$name" = torch-agent ]; then
    top="$(python_layer "$layout" "$base")"
  fi
  if [ -n "$stage" ]; then
    work="$stage.root"
    mkdir "$work"
    tar -xf "$tar" -C "$work"
    cp -a "$stage/files/." "$work/"
    check_libraries "$name" "$work" "$stage/files"
    rm -rf "$work"
    layer_tar "$stage/files" "$stage/app.tar"
    add_layer "$layout" "$top" "$stage/app.tar" "$app" "VirtualFlow $version: the project's files"
    rm -rf "$stage"
  else
    log "$name: layer $app cached"
  fi

  if has_tag "$layout" "$version"; then
    umoci rm --image "$layout:$version"
  fi
  local labels=(
    "org.opencontainers.image.title=virtualflow-$name"
    "org.opencontainers.image.description=$(image_description "$name")"
    "org.opencontainers.image.version=$version"
    "org.opencontainers.image.revision=$revision"
    "org.opencontainers.image.source=$source_url")
  local args=() l
  for l in "${labels[@]}"; do
    args+=(--config.label="$l" --manifest.annotation="$l")
  done
  # shellcheck disable=SC2046
  umoci config --no-history --image "$layout:$app" --tag "$version" \
    --config.user="$USER_ID:$USER_ID" \
    --config.env="PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    $(image_config "$name") "${args[@]}"
  collect_garbage "$layout" empty "$base" "$top" "$app" "$version"
  log "$name: oci:$layout:$version, $(report_size "$name" "$layout"), $((SECONDS - start)) s"
}

# What image $1 is, for tests/images/test_dockerfiles.py to compare with its Dockerfile: lines
# "KEY VALUE" (user, entrypoint, cmd, workingdir, exposedports, label, packages, file).
describe() {
  local word
  echo "user $USER_ID:$USER_ID"
  echo "packages docker/packages-$1.txt"
  for word in $(image_config "$1"); do
    word="${word#--config.}"
    echo "${word%%=*} ${word#*=}"
  done
  echo "label org.opencontainers.image.title=virtualflow-$1"
  echo "label org.opencontainers.image.description=$(image_description "$1")"
  echo "label org.opencontainers.image.version=$version"
  image_files "$1" | awk '{print "file /" $2}'
  # What the build adds besides: the CUDA libraries (agent), the Python packages (torch-agent).
  case "$1" in
    agent) echo "file /usr/local/lib/virtualflow-cuda" ;;
    torch-agent) echo "file /usr/local/lib/python3.11/dist-packages" ;;
  esac
}

main() {
  if [ "${1:-}" = --describe ]; then
    describe "$2"
    return
  fi
  [ "$(id -u)" -eq 0 ] || die "needs root (mmdebstrap installs the packages as root)"
  for tool in mmdebstrap umoci; do
    command -v "$tool" >/dev/null || die "no $tool; run scripts/setup.sh"
  done
  mkdir -p "$out"
  rm -rf "$out"/tmp.*
  local images=("$@")
  [ "${#images[@]}" -gt 0 ] || images=(operator agent torch-agent)
  for name in "${images[@]}"; do
    build_image "$name"
  done
}

main "$@"
