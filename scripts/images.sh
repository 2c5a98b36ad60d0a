#!/usr/bin/env bash
# Builds the container images without a daemon, as OCI image layouts under
# ~/.cache/virtualflow/images/<image> (tag: the project's version), from the binaries of
# build/ (scripts/build.sh first):
#   operator     virtualflow-operator
#   agent        virtualflow-agent, vf, libvirtualflow-cuda.so and the CUDA and NCCL libraries
#                it loads on a GPU
#   torch-agent  the virtualflow Python package, PyTorch from the Python environment
#                (scripts/setup-python.sh), vf, libvirtualflow-cuda.so (on PyTorch's CUDA
#                and NCCL libraries) and examples/torch, for PyTorch jobs
# Each is Debian 12 (mmdebstrap, variant essential, from this machine's apt sources) with
# exactly the packages of docker/packages-<image>.txt (docker/runtime-packages.sh --check holds
# the list to the libraries the binaries link), the files above, the user virtualflow (uid and
# gid 65532) and the OCI annotations org.opencontainers.image.{version,revision,source}.
# Layers: the root file system; the libraries no package holds (agent: CUDA and NCCL); the Python
# packages (torch-agent); the project's files, a few MiB. Each is cached by its content (never
# file times or the checkout's path) and the layer under it, so a fresh clone of the same
# sources reuses every layer, a changed binary repacks only the last, and a run with nothing
# changed only re-tags. Prints each image's size.
#
# usage: scripts/images.sh [IMAGE...]          (default: all three)
#        scripts/images.sh --describe IMAGE   what the image holds and runs, one "KEY VALUE" a line
#        scripts/images.sh --files-key IMAGE  the key of the project's files of the image, of
#                                             which its last layer's key is made
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
FORMAT=2
# Of each kind of layer (and root file system) of an image, how many of the most recently used
# are kept: checkouts sharing the cache (branches, worktrees, fresh clones) keep their own.
KEEP=3

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
      # NCCL collectives (VF_TORCH_COLLECTIVES=nccl), on PyTorch's own CUDA and NCCL libraries.
      [ -f "$build/bin/libvirtualflow-cuda.so" ] &&
        echo "$build/bin/libvirtualflow-cuda.so usr/local/bin/libvirtualflow-cuda.so"
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
      # The job's command (python3 examples/torch/cnn.py) runs from /opt/virtualflow. Its
      # interpreter is the executable, so the CUDA plugin is named (vf run names it too).
      echo "--config.cmd=python3 --config.workingdir=/opt/virtualflow"
      [ -f "$build/bin/libvirtualflow-cuda.so" ] &&
        echo "--config.env=VF_CUDA_PLUGIN=/usr/local/bin/libvirtualflow-cuda.so"
      true ;;
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

# The mmdebstrap arguments of image $1's root file system, one a line: Debian $SUITE, variant
# essential, the package list, no documentation, and the user the image runs as (no passwd
# package, so no useradd, in the essential variant).
mmdebstrap_args() {
  echo "--variant=$VARIANT"
  echo "--include=$(packages "$1" | paste -sd,)"
  echo "--dpkgopt=path-exclude=/usr/share/doc/*"
  echo "--dpkgopt=path-exclude=/usr/share/man/*"
  echo "--dpkgopt=path-exclude=/usr/share/locale/*"
  echo "--dpkgopt=path-include=/usr/share/doc/*/copyright"
  echo "--customize-hook=echo 'virtualflow:x:$USER_ID:$USER_ID:virtualflow:/nonexistent:/usr/sbin/nologin' >> \"\$1/etc/passwd\""
  echo "--customize-hook=echo 'virtualflow:x:$USER_ID:' >> \"\$1/etc/group\""
  echo "--customize-hook=rm -rf \"\$1\"/var/cache/* \"\$1\"/var/log/* \"\$1\"/var/lib/apt/lists/*"
  echo "--quiet"
  echo "$SUITE"
}

# Logs the packages of root file system tarball $2 whose version is not the one installed here,
# which the build linked against (the archive serves its current versions; see installed_versions).
report_versions() {
  local name="$1" tar="$2" differ
  differ="$(tar -xOf "$tar" ./var/lib/dpkg/status |
            awk -v want="$(installed_versions "$name" | paste -sd' ')" '
              BEGIN { n = split(want, w, " "); for (i = 1; i <= n; i++) { split(w[i], pv, "=");
                      v[pv[1]] = substr(w[i], length(pv[1]) + 2) } }
              /^Package: / { p = $2 } /^Version: / && (p in v) && $2 != v[p] {
                printf "%s %s (built against %s); ", p, $2, v[p] }')"
  [ -z "$differ" ] || log "$name: the image's versions that differ from this machine's: $differ"
}

# Builds (or finds cached) the root file system of image $1 as tarball; prints its path. Keyed by
# what mmdebstrap is given: its arguments, the apt sources, and the versions installed here of
# the listed packages (an upgrade here rebuilds it).
rootfs_tar() {
  local name="$1" key tar args=() arg
  while IFS= read -r arg; do args+=("$arg"); done < <(mmdebstrap_args "$name")
  key="$(printf '%s\n' "$FORMAT" "${args[@]}" "$(installed_versions "$name")" \
           "$(apt_sources | xargs -r cat)" | sha256sum | cut -c1-16)"
  tar="$out/rootfs/$name-$key.tar"
  if [ -f "$tar" ]; then
    log "$name: root file system cached ($(basename "$tar"))"
    touch "$tar"
    echo "$tar"
    return
  fi
  mkdir -p "$out/rootfs"
  log "$name: building the root file system with mmdebstrap ($(packages "$name" | wc -l) packages)"
  # shellcheck disable=SC2046
  mmdebstrap "${args[@]}" "${tar%.tar}.part.tar" $(apt_sources) || die "$name: mmdebstrap failed"
  mv "${tar%.tar}.part.tar" "$tar"
  report_versions "$name" "$tar"
  # The KEEP most recently used of this image's root file systems stay.
  (cd "$out/rootfs" && ls -t "$name"-????????????????.tar | tail -n +$((KEEP + 1)) | xargs -r rm -f)
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
    --history.created_by="scripts/images.sh" --history.comment="$comment" "$tar" >&2
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
  key="$(printf '%s\n' "$FORMAT" "$from" "$dists" | sha256sum | cut -c1-16)"
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

# Marks tags $2... of image $1 as used now, and removes its tags beyond the KEEP most recently
# used of each kind (base-, cuda-, deps-, app-).
retire_tags() {
  local name="$1" layout="$out/$1" used="$out/used/$1" kind tag
  shift
  mkdir -p "$used"
  for tag in "$@"; do touch "$used/$tag"; done
  for kind in base cuda deps app; do
    for tag in $(cd "$used" && ls -t | grep "^$kind-" | tail -n +$((KEEP + 1))); do
      if has_tag "$layout" "$tag"; then umoci rm --image "$layout:$tag"; fi
      rm -f "$used/$tag"
    done
  done
}

# Deletes the blobs of layout $1 that no tag reaches. Reads index.json and the manifests (small
# JSON), not the blobs themselves: `umoci gc` reads every blob, 2 minutes for the PyTorch image.
collect_garbage() {
  python3 - "$1" <<'PY'
import json, os, sys
layout = sys.argv[1]
def path(digest):
    return os.path.join(layout, "blobs", *digest.split(":"))
reached = set()
for desc in json.load(open(os.path.join(layout, "index.json")))["manifests"]:
    manifest = json.load(open(path(desc["digest"])))
    reached |= {desc["digest"], manifest["config"]["digest"]}
    reached |= {layer["digest"] for layer in manifest["layers"]}
for algorithm in os.listdir(os.path.join(layout, "blobs")):
    for name in os.listdir(os.path.join(layout, "blobs", algorithm)):
        if "%s:%s" % (algorithm, name) not in reached:
            os.remove(os.path.join(layout, "blobs", algorithm, name))
PY
}

# The SHA-256 of file $1, memoised by the file's identity (device, inode, size, and its data's
# and inode's change times to the nanosecond) in $out/sums: the CUDA libraries (~800 MiB) are
# hashed once, not on every run.
file_sum() {
  local id sum
  id="$(stat -L -c '%d:%i:%s:%.9Y:%.9Z' "$1")"
  sum="$(grep -m1 "^$id " "$out/sums" 2>/dev/null | cut -d' ' -f2 || true)"
  if [ -z "$sum" ]; then
    sum="$(sha256sum < "$1" | cut -d' ' -f1)"
    echo "$id $sum" >> "$out/sums"
  fi
  echo "$sum"
}

# A key of what lines "SOURCE TARGET" on stdin make: each file's target path, whether it is
# executable, and its content; not its time or where the checkout is, so a fresh clone that
# builds the same bytes gets the same key.
content_key() {
  local src dst f
  while read -r src dst; do
    [ -e "$src" ] || die "$src is missing (scripts/build.sh builds it)"
    if [ -d "$src" ]; then
      (cd "$src" && find -L . -type f ! -path '*/__pycache__/*' | sort) | while read -r f; do
        echo "$dst/${f#./} $([ -x "$src/$f" ] && echo x) $(file_sum "$src/$f")"
      done
    else
      echo "$dst $([ -x "$src" ] && echo x) $(file_sum "$src")"
    fi
  done | sha256sum | cut -c1-16
}

# "SOURCE NAME" of each library image $1's binaries load from outside /lib and /usr/lib: those
# no package holds (the CUDA runtime, cuBLAS and NCCL of libvirtualflow-cuda.so), which the
# image carries in /usr/local/lib/virtualflow-cuda.
bundled_libraries() {
  local bin
  for bin in $(image_binaries "$1"); do
    ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// && $3 !~ /^\/(usr\/)?lib\// {print $3, $1}'
  done | sort -u
}

# Unpacks root file system tarball $1 into directory $2 with the libraries of
# bundled_libraries ($3: their list) linked in, and ld.so's cache made for them.
check_root() {
  local tar="$1" work="$2" list="$3" src lib
  mkdir -p "$work"
  tar -xf "$tar" -C "$work"
  if [ -s "$list" ]; then
    mkdir -p "$work/usr/local/lib/virtualflow-cuda" "$work/etc/ld.so.conf.d"
    while read -r src lib; do
      ln -f "$(readlink -f "$src")" "$work/usr/local/lib/virtualflow-cuda/$lib" 2>/dev/null ||
        cp -L "$src" "$work/usr/local/lib/virtualflow-cuda/$lib"
    done < "$list"
    echo /usr/local/lib/virtualflow-cuda > "$work/etc/ld.so.conf.d/virtualflow-cuda.conf"
    ldconfig -r "$work"
  fi
}

# The layer of the libraries no package holds (agent: CUDA and NCCL, ~600 MiB compressed) with
# ld.so's configuration and cache for them: tag cuda-KEY on top of tag $3 (the root file
# system $4), keyed by the libraries' contents. Prints the top tag ($3 when there are none).
cuda_layer() {
  local name="$1" list="$2" from="$3" tar="$4" key tag stage
  if [ ! -s "$list" ]; then
    echo "$from"
    return
  fi
  key="$(printf '%s\n' "$FORMAT" "$from" "$(awk '{print $1, "usr/local/lib/virtualflow-cuda/" $2}' "$list" |
         content_key)" | sha256sum | cut -c1-16)"
  tag="cuda-$key"
  if has_tag "$out/$name" "$tag"; then
    log "$name: layer $tag cached"
  else
    stage="$(mktemp -d "$out/tmp.XXXXXX")"
    # shellcheck disable=SC2046
    "$root/docker/runtime-packages.sh" --bundle-into "$stage/files/usr/local/lib/virtualflow-cuda" \
      $(image_binaries "$name") >/dev/null || die "$name: the libraries no package holds"
    check_root "$tar" "$stage/root" "$list"
    mkdir -p "$stage/files/etc/ld.so.conf.d"
    cp "$stage/root/etc/ld.so.conf.d/virtualflow-cuda.conf" "$stage/files/etc/ld.so.conf.d/"
    cp "$stage/root/etc/ld.so.cache" "$stage/files/etc/ld.so.cache"
    chmod -R u=rwX,go=rX "$stage/files"
    layer_tar "$stage/files" "$stage/layer.tar"
    add_layer "$out/$name" "$from" "$stage/layer.tar" "$tag" \
      "CUDA libraries: $(awk '{print $2}' "$list" | paste -sd' ')"
    rm -rf "$stage"
  fi
  echo "$tag"
}

# torch-agent: the CUDA plugin links the CUDA runtime, cuBLAS and NCCL of PyTorch's wheels,
# which `import torch` loads before the plugin is (the Python layer holds them under
# site-packages/nvidia). Links those into root file system $1 where the Python layer puts them,
# and prints their directories, for ldd to resolve the plugin with (nothing without a plugin).
torch_cuda_libraries() {
  local root="$1" plugin="$build/bin/libvirtualflow-cuda.so" src dirs=() dst
  [ -f "$plugin" ] || return 0
  while read -r src; do
    case "$src" in
      "$site_packages"/*) ;;
      *) continue ;;  # a Debian library: the image's packages hold it (ldd checks)
    esac
    dst="$root/usr/local/lib/python3.11/dist-packages/${src#"$site_packages"/}"
    mkdir -p "$(dirname "$dst")"
    ln -f "$src" "$dst" 2>/dev/null || cp -L "$src" "$dst"
    dirs+=("/usr/local/lib/python3.11/dist-packages/$(dirname "${src#"$site_packages"/}")")
  done < <(ldd "$plugin" | awk '$2 == "=>" && $3 ~ /^\// {print $3}')
  [ "${#dirs[@]}" -eq 0 ] || printf '%s\n' "${dirs[@]}" | sort -u | paste -sd:
}

# The project's layer of image $1 (its binaries, stripped, and files): tag app-KEY on top of tag
# $3, keyed by that tag and the files' contents. Before packing, docker/packages-$1.txt is held
# to the libraries the binaries link and every binary's libraries are resolved with ldd in the
# image's root file system ($4, with the libraries of list $2).
app_layer() {
  local name="$1" list="$2" from="$3" tar="$4" key tag stage bin missing ldpath
  key="$(printf '%s\n' "$FORMAT" "$from" "$(image_files "$name" | content_key)" |
         sha256sum | cut -c1-16)"
  tag="app-$key"
  if has_tag "$out/$name" "$tag"; then
    log "$name: layer $tag cached"
    echo "$tag"
    return
  fi
  stage="$(mktemp -d "$out/tmp.XXXXXX")"
  # shellcheck disable=SC2046
  "$root/docker/runtime-packages.sh" --check "$root/docker/packages-$name.txt" \
    --bundle-list "$stage/bundled" $(image_binaries "$name") ||
    die "$name: docker/packages-$name.txt and the binaries disagree"
  sort -u "$stage/bundled" | cmp -s - "$list" ||
    die "$name: the libraries no package holds are not those outside /lib and /usr/lib"
  stage_files "$name" "$stage/files"
  check_root "$tar" "$stage/root" "$list"
  cp -a "$stage/files/." "$stage/root/"
  ldpath=""
  [ "$name" = torch-agent ] && ldpath="$(torch_cuda_libraries "$stage/root")"
  for bin in $(cd "$stage/files" && find . -type f \( -perm -u+x -o -name '*.so' \) | sed 's|^\.||'); do
    is_elf "$stage/root$bin" || continue
    missing="$(LD_LIBRARY_PATH="$ldpath" chroot "$stage/root" /usr/bin/ldd "$bin" | grep 'not found' |
               grep -Ev '^\s*(libcuda|libnvidia-ml|libnvidia-ptxjitcompiler)\.so' || true)"
    [ -z "$missing" ] || die "$name: in the image, $bin does not find: $missing"
  done
  layer_tar "$stage/files" "$stage/layer.tar"
  add_layer "$out/$name" "$from" "$stage/layer.tar" "$tag" "VirtualFlow $version: the project's files"
  rm -rf "$stage"
  echo "$tag"
}

build_image() {
  local name="$1" layout="$out/$1" tar base top app list
  local start=$SECONDS
  tar="$(rootfs_tar "$name")"
  if [ ! -f "$layout/index.json" ]; then
    umoci init --layout "$layout"
    umoci new --image "$layout:empty"
  fi
  base="base-$(basename "$tar" .tar | sed "s/^$name-//")"
  add_layer "$layout" empty "$tar" "$base" "root file system: Debian $SUITE, docker/packages-$name.txt"
  list="$(mktemp "$out/tmp.XXXXXX")"
  bundled_libraries "$name" > "$list"
  top="$(cuda_layer "$name" "$list" "$base" "$tar")"
  if [ "$name" = torch-agent ]; then
    top="$(python_layer "$layout" "$top")"
  fi
  # The tags under the project's layer, for retire_tags.
  local chain=("$base")
  [ "$top" = "$base" ] || chain+=("$top")
  app="$(app_layer "$name" "$list" "$top" "$tar")"
  rm -f "$list"

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
  retire_tags "$name" "${chain[@]}" "$app"
  collect_garbage "$layout"
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
  # One build at a time in a cache (checkouts share it): layouts, tags and blobs are not safe
  # to change from two processes.
  exec 9>"$out/.lock"
  flock 9
  if [ "${1:-}" = --files-key ]; then
    image_files "$2" | content_key
    return
  fi
  rm -rf "$out"/tmp.*
  # The memo of file_sum keeps its newest entries.
  if [ -f "$out/sums" ] && [ "$(wc -l < "$out/sums")" -gt 20000 ]; then
    tail -n 10000 "$out/sums" > "$out/sums.new" && mv "$out/sums.new" "$out/sums"
  fi
  local images=("$@")
  [ "${#images[@]}" -gt 0 ] || images=(operator agent torch-agent)
  for name in "${images[@]}"; do
    build_image "$name"
  done
}

main "$@"
