#!/usr/bin/env bash
# Builds the real control-plane tools the end-to-end tests run (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kubectl, helm, and Kueue's controller manager) from
# their upstream sources, fetched as Go modules, into a cache directory keyed by version:
#
#   ${VF_CACHE_DIR:-$HOME/.cache/virtualflow}/k8s-<kubernetes version>/bin/
#
# The versions are pinned in one place: the Go modules beside this script (k8s/go.mod pins
# Kubernetes, its staging modules and etcd; k8s/helm/go.mod pins Helm; k8s/kueue/go.mod pins
# Kueue), with their go.sum files. Kueue has a stamp of its own (bin/kueue with its CRDs in
# kueue-crds/): a Kueue pin change rebuilds only Kueue, a Kubernetes or Helm pin change only those.
# Idempotent: when the cache already holds a build of exactly these pins it prints the directory
# and exits at once. Prints the bin directory as its last line.
#
#   tests/e2e/build-k8s-tools.sh            # build if needed
#   tests/e2e/build-k8s-tools.sh --print    # only print where the binaries are (or would be)
#   tests/e2e/build-k8s-tools.sh --force    # rebuild even if cached
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
k8s_mod="$here/k8s"
helm_mod="$here/k8s/helm"
kueue_mod="$here/k8s/kueue"
coredns_mod="$here/k8s/coredns"

pin() { # pin FILE MODULE -> the version FILE requires for MODULE
  awk -v m="$2" '$1 == "require" { $1 = ""; $0 = $0 } $1 == m && $2 ~ /^v/ { print $2; exit }' "$1"
}
K8S_VERSION="$(pin "$k8s_mod/go.mod" k8s.io/kubernetes)"
ETCD_VERSION="$(pin "$k8s_mod/go.mod" go.etcd.io/etcd/server/v3)"
HELM_VERSION="$(pin "$helm_mod/go.mod" helm.sh/helm/v3)"
KUEUE_VERSION="$(pin "$kueue_mod/go.mod" sigs.k8s.io/kueue)"
COREDNS_VERSION="$(pin "$coredns_mod/go.mod" github.com/coredns/coredns)"
[ -n "$K8S_VERSION" ] && [ -n "$ETCD_VERSION" ] && [ -n "$HELM_VERSION" ] && [ -n "$KUEUE_VERSION" ] &&
  [ -n "$COREDNS_VERSION" ] ||
  { echo "build-k8s-tools: cannot read the pinned versions from $k8s_mod" >&2; exit 1; }

cache_root="${VF_CACHE_DIR:-$HOME/.cache/virtualflow}"
dest="$cache_root/k8s-$K8S_VERSION"
TOOLS=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy helm)

# The stamp names everything that decides the binaries' content: a change of any pin (or of the
# build flags below) rebuilds, anything else is a cache hit.
stamp_text() {
  echo "kubernetes $K8S_VERSION"
  echo "etcd $ETCD_VERSION"
  echo "helm $HELM_VERSION"
  echo "flags CGO_ENABLED=0 -trimpath -ldflags=-s -w (stamp v2: with the kubelet and kube-proxy)"
  cat "$k8s_mod/go.mod" "$helm_mod/go.mod" | sha256sum | cut -d' ' -f1
}

# Kueue's stamp, kept apart so that adding or moving Kueue leaves the Kubernetes tools cached.
KUEUE_FILES=(bin/kueue kueue-crds kueue.stamp)
kueue_stamp_text() {
  echo "kueue $KUEUE_VERSION"
  echo "flags CGO_ENABLED=0 -trimpath -ldflags=-s -w (stamp v1)"
  sha256sum <"$kueue_mod/go.mod" | cut -d' ' -f1
}

k8s_cached() {
  [ -f "$dest/stamp" ] && [ "$(cat "$dest/stamp")" = "$(stamp_text)" ] || return 1
  local t
  for t in "${TOOLS[@]}"; do [ -x "$dest/bin/$t" ] || return 1; done
}

kueue_cached() {
  [ -f "$dest/kueue.stamp" ] && [ "$(cat "$dest/kueue.stamp")" = "$(kueue_stamp_text)" ] &&
    [ -x "$dest/bin/kueue" ] && [ -d "$dest/kueue-crds" ]
}

# The suite's device plugin (k8s/deviceplugin, for the real nodes' GPUs) is the suite's own code
# in the Kubernetes module: its stamp is a hash of its source and of that module's pins, so a
# change of it rebuilds only it (a minute, cold).
DP_FILES=(bin/vf-device-plugin deviceplugin.stamp)
dp_stamp_text() {
  echo "vf-device-plugin (stamp v1)"
  cat "$k8s_mod/deviceplugin/"*.go "$k8s_mod/go.mod" "$k8s_mod/go.sum" | sha256sum | cut -d' ' -f1
}
dp_cached() {
  [ -f "$dest/deviceplugin.stamp" ] && [ "$(cat "$dest/deviceplugin.stamp")" = "$(dp_stamp_text)" ] &&
    [ -x "$dest/bin/vf-device-plugin" ]
}

# CoreDNS (the real nodes' cluster DNS) with the plugins k8s/coredns/main.go links: a module of
# its own, with a stamp of its own.
COREDNS_FILES=(bin/coredns coredns.stamp)
coredns_stamp_text() {
  echo "coredns $COREDNS_VERSION"
  echo "flags CGO_ENABLED=0 -trimpath -ldflags=-s -w (stamp v1)"
  cat "$coredns_mod/go.mod" "$coredns_mod/main.go" | sha256sum | cut -d' ' -f1
}
coredns_cached() {
  [ -f "$dest/coredns.stamp" ] && [ "$(cat "$dest/coredns.stamp")" = "$(coredns_stamp_text)" ] &&
    [ -x "$dest/bin/coredns" ]
}

cached() { k8s_cached && kueue_cached && dp_cached && coredns_cached; }

force=0
case "${1:-}" in
  --print) echo "$dest/bin"; exit 0 ;;
  --force) force=1 ;;
  "") ;;
  *) echo "usage: $0 [--print|--force]" >&2; exit 2 ;;
esac

if [ "$force" = 0 ] && cached; then
  echo "build-k8s-tools: cached: kubernetes $K8S_VERSION, etcd $ETCD_VERSION, helm $HELM_VERSION, kueue $KUEUE_VERSION"
  echo "$dest/bin"
  exit 0
fi

command -v go >/dev/null || {
  echo "build-k8s-tools: needs Go (any version; run scripts/setup.sh, which installs Debian's)" >&2
  exit 1
}
# The Go toolchain is pinned by the `toolchain` line of k8s/go.mod. A Go from 1.21 on that is
# older fetches it by itself (GOTOOLCHAIN=auto); an older one (Debian bookworm's golang-go is
# 1.19) cannot, so fetch it here the same way, as the module golang.org/toolchain.
GO_TOOLCHAIN="$(awk '$1 == "toolchain" { print $2 }' "$k8s_mod/go.mod")"
go_minor="$(go env GOVERSION | sed -E 's/^go1\.([0-9]+).*/\1/')"
if [ "${go_minor:-0}" -lt 21 ] 2>/dev/null; then
  tc="golang.org/toolchain@v0.0.1-$GO_TOOLCHAIN.$(go env GOOS)-$(go env GOARCH)"
  echo "build-k8s-tools: $(go env GOVERSION) cannot switch toolchains; fetching $tc"
  tc_dir="$(cd "$(mktemp -d)" && GO111MODULE=on GOFLAGS=-modcacherw go mod download -json "$tc" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  chmod -R u+x "$tc_dir/bin" "$tc_dir/pkg/tool" 2>/dev/null || true
  [ -f "$tc_dir/bin/go" ] || { echo "build-k8s-tools: could not fetch $tc" >&2; exit 1; }
  export PATH="$tc_dir/bin:$PATH"
  unset GOROOT
fi

# One build at a time per cache (two ctest runs may start together); the second waits and then
# finds the cache filled.
mkdir -p "$cache_root"
exec 9>"$cache_root/.k8s-build.lock"
if ! flock -n 9; then
  echo "build-k8s-tools: another build holds $cache_root/.k8s-build.lock; waiting"
  flock 9
fi
if [ "$force" = 0 ] && cached; then
  echo "build-k8s-tools: cached (built by another process)"
  echo "$dest/bin"
  exit 0
fi

# -mod=mod: go.mod carries the replace lines and go.sum is committed, so no vendor directory.
# GOTOOLCHAIN=auto: a Go older than the modules' `go` line fetches that toolchain as a module.
export GOFLAGS="-mod=mod -buildvcs=false -trimpath"
export GOTOOLCHAIN="${GOTOOLCHAIN_FOR_K8S:-auto}"
export CGO_ENABLED=0
# Go's build cache for this build is temporary (the packages compiled for these tools take over
# 4 GiB and serve nothing else); VF_K8S_GOCACHE names one to keep instead. The module cache is
# Go's usual one ($GOMODCACHE).

work="$(mktemp -d "$cache_root/k8s-$K8S_VERSION.build.XXXXXX")"
log="$work/build.log"
# A failed build's log is kept beside the cache.
trap 'if [ -f "$log" ]; then mv -f "$log" "$cache_root/k8s-$K8S_VERSION.failed.log"; fi; rm -rf "$work"' EXIT
mkdir -p "$work/bin"
export GOCACHE="${VF_K8S_GOCACHE:-$work/go-build}"
start=$SECONDS

# Runs `go build -v ARGS` in directory DIR, printing a progress line every 200 compiled packages
# and every 50 fetched modules; on failure prints the end of the log.
go_build() {
  local dir="$1" what="$2"
  shift 2
  local n=0 m=0 line
  echo "build-k8s-tools: [$((SECONDS - start))s] $what"
  if ! (cd "$dir" && go build -v "$@" 2>&1) | tee -a "$log" | while IFS= read -r line; do
    case "$line" in
      "go: downloading "*)
        m=$((m + 1))
        if [ $((m % 50)) = 0 ]; then
          echo "build-k8s-tools: [$((SECONDS - start))s] $what: $m modules fetched"
        fi
        ;;
      *)
        n=$((n + 1))
        if [ $((n % 200)) = 0 ]; then
          echo "build-k8s-tools: [$((SECONDS - start))s] $what: $n packages compiled"
        fi
        ;;
    esac
  done; then
    echo "build-k8s-tools: $what failed; the end of its log (kept in $cache_root/k8s-$K8S_VERSION.failed.log):" >&2
    tail -n 40 "$log" >&2
    return 1
  fi
}

build_k8s() {
  echo "build-k8s-tools: building kubernetes $K8S_VERSION, etcd $ETCD_VERSION, helm $HELM_VERSION"
  echo "build-k8s-tools: into $dest (log: $log); $(go version); GOMODCACHE=$(go env GOMODCACHE)"
  echo "build-k8s-tools: the first build takes a long time (about 10 to 20 minutes on 2 busy cores)"
  local k8s_minor="${K8S_VERSION#v1.}"
  k8s_minor="${k8s_minor%%.*}"
  local vpkg=k8s.io/component-base/version
  local k8s_ldflags="-s -w -X $vpkg.gitVersion=$K8S_VERSION -X $vpkg.gitMajor=1 -X $vpkg.gitMinor=$k8s_minor"
  k8s_ldflags+=" -X $vpkg.gitTreeState=clean -X $vpkg.buildDate=1970-01-01T00:00:00Z"
  # One invocation for all of them so the shared packages compile once and both cores stay busy.
  go_build "$k8s_mod" "kubernetes and etcd" -ldflags "$k8s_ldflags" -o "$work/bin/" \
    k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler \
    k8s.io/kubernetes/cmd/kubectl \
    k8s.io/kubernetes/cmd/kubelet \
    k8s.io/kubernetes/cmd/kube-proxy \
    go.etcd.io/etcd/server/v3
  # `go build -o DIR/` names a module-root main package after its path's last element before /vN.
  mv "$work/bin/server" "$work/bin/etcd"

  local hpkg=helm.sh/helm/v3
  local helm_ldflags="-s -w -X $hpkg/internal/version.version=$HELM_VERSION -X $hpkg/internal/version.gitTreeState=clean"
  helm_ldflags+=" -X $hpkg/pkg/chartutil.k8sVersionMajor=1 -X $hpkg/pkg/chartutil.k8sVersionMinor=$k8s_minor"
  helm_ldflags+=" -X $hpkg/pkg/lint/rules.k8sVersionMajor=1 -X $hpkg/pkg/lint/rules.k8sVersionMinor=$k8s_minor"
  go_build "$helm_mod" "helm" -ldflags "$helm_ldflags" -o "$work/bin/helm" "$hpkg/cmd/helm"

  local t
  for t in "${TOOLS[@]}"; do
    [ -x "$work/bin/$t" ] || { echo "build-k8s-tools: $t was not built" >&2; return 1; }
  done
  "$work/bin/kube-apiserver" --version
  "$work/bin/etcd" --version | sed -n 1p  # not head: SIGPIPE would fail the pipeline
  "$work/bin/helm" version --short

  stamp_text >"$work/stamp"
  # A Kueue build already in place stays (its stamp is its own).
  local keep="$work/keep" f
  mkdir -p "$keep/bin"
  for f in "${KUEUE_FILES[@]}" "${DP_FILES[@]}" "${COREDNS_FILES[@]}"; do
    if [ -e "$dest/$f" ]; then mv "$dest/$f" "$keep/$f"; fi
  done
  rm -rf "$dest"
  mkdir -p "$dest"
  mv "$work/bin" "$work/stamp" "$dest/"
  cp "$log" "$dest/build.log"
  for f in "${KUEUE_FILES[@]}" "${DP_FILES[@]}" "${COREDNS_FILES[@]}"; do
    if [ -e "$keep/$f" ]; then mv "$keep/$f" "$dest/$f"; fi
  done
}

# Kueue's controller manager (cmd/kueue, what its release image runs as /manager) and its CRDs,
# which come from the same module (config/components/crd/bases).
build_kueue() {
  echo "build-k8s-tools: building kueue $KUEUE_VERSION into $dest (log: $log)"
  local kpkg=sigs.k8s.io/kueue
  local kueue_ldflags="-s -w -X $kpkg/pkg/version.GitVersion=$KUEUE_VERSION"
  kueue_ldflags+=" -X $kpkg/pkg/version.GitCommit=none -X $kpkg/pkg/version.BuildDate=1970-01-01"
  mkdir -p "$work/kueue/bin"
  go_build "$kueue_mod" "kueue" -ldflags "$kueue_ldflags" -o "$work/kueue/bin/kueue" "$kpkg/cmd/kueue"
  local src
  src="$(cd "$kueue_mod" && go list -m -f '{{.Dir}}' "$kpkg")"
  [ -d "$src/config/components/crd/bases" ] ||
    { echo "build-k8s-tools: no CRDs in $src/config/components/crd/bases" >&2; return 1; }
  mkdir -p "$work/kueue/kueue-crds"
  cp "$src"/config/components/crd/bases/*.yaml "$work/kueue/kueue-crds/"
  chmod -R u+w "$work/kueue/kueue-crds"
  kueue_stamp_text >"$work/kueue/kueue.stamp"
  mkdir -p "$dest/bin"
  rm -rf "$dest/kueue-crds"
  mv "$work/kueue/bin/kueue" "$dest/bin/kueue"
  mv "$work/kueue/kueue-crds" "$work/kueue/kueue.stamp" "$dest/"
  cp "$log" "$dest/kueue-build.log"
}

build_device_plugin() {
  echo "build-k8s-tools: building vf-device-plugin into $dest (log: $log)"
  mkdir -p "$work/dp"
  go_build "$k8s_mod" "vf-device-plugin" -ldflags "-s -w" -o "$work/dp/vf-device-plugin" ./deviceplugin
  dp_stamp_text >"$work/dp/deviceplugin.stamp"
  mkdir -p "$dest/bin"
  mv "$work/dp/vf-device-plugin" "$dest/bin/vf-device-plugin"
  mv "$work/dp/deviceplugin.stamp" "$dest/"
}

if [ "$force" = 1 ] || ! k8s_cached; then build_k8s; fi
if [ "$force" = 1 ] || ! kueue_cached; then build_kueue; fi
build_coredns() {
  echo "build-k8s-tools: building coredns $COREDNS_VERSION into $dest (log: $log)"
  mkdir -p "$work/coredns"
  go_build "$coredns_mod" "coredns" -ldflags "-s -w" -o "$work/coredns/coredns" .
  coredns_stamp_text >"$work/coredns/coredns.stamp"
  mkdir -p "$dest/bin"
  mv "$work/coredns/coredns" "$dest/bin/coredns"
  mv "$work/coredns/coredns.stamp" "$dest/"
}

if [ "$force" = 1 ] || ! dp_cached; then build_device_plugin; fi
if [ "$force" = 1 ] || ! coredns_cached; then build_coredns; fi
rm -f "$log"
echo "build-k8s-tools: [$((SECONDS - start))s] done: $(du -sh "$dest/bin" | cut -f1) in $dest/bin"
echo "$dest/bin"
