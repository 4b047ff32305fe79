#!/usr/bin/env bash
# Builds the Kubernetes control plane, etcd and kwok from Go modules into a versioned cache.
# Why a wrapper module: k8s.io/kubernetes requires its staging modules at v0.0.0, so a plain
# `go install` cannot resolve them; a throwaway module that replaces each staging module with its
# published v0.Y.Z release can. etcd's server module gets a wrapper module too. Each binary is
# built once per version and then reused; a binary that is missing, or a Kubernetes binary that
# does not report the wanted version, is (re)built, the others are left alone.
#
# usage: build-go-binaries.sh <bin-dir> <k8s-version> <etcd-version> <kwok-version>
set -euo pipefail
if [ $# -ne 4 ]; then
  echo "usage: $0 <bin-dir> <k8s-version> <etcd-version> <kwok-version>" >&2
  exit 2
fi
bin_dir=$1 k8s_version=$2 etcd_version=$3 kwok_version=$4
command -v go >/dev/null || { echo "error: go is not on PATH (Go >= 1.25 is needed)" >&2; exit 3; }
mkdir -p "$bin_dir"
bin_dir=$(cd "$bin_dir" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/lockgate-gobuild.XXXXXX")
trap 'rm -rf "$work"' EXIT
# GOTOOLCHAIN=local: fail clearly instead of downloading another Go toolchain.
export GOFLAGS="-buildvcs=false -trimpath" CGO_ENABLED=0 GOTOOLCHAIN=local
echo "go: $(go version)"

# A Kubernetes binary is current when it exists and reports the wanted version.
k8s_current() {
  [ -x "$bin_dir/$1" ] && "$bin_dir/$1" --version 2>/dev/null | grep -qx "Kubernetes $k8s_version"
}

k8s_cmds=()
for cmd in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
  if [ "$cmd" = kubectl ]; then
    # kubectl prints client and server versions; only check that it exists and runs.
    [ -x "$bin_dir/$cmd" ] && "$bin_dir/$cmd" version --client 2>/dev/null | grep -q "$k8s_version" \
      && continue
  else
    k8s_current "$cmd" && continue
  fi
  k8s_cmds+=("$cmd")
done

if [ ${#k8s_cmds[@]} -gt 0 ]; then
  echo "building Kubernetes $k8s_version: ${k8s_cmds[*]} (cold build: 10-25 minutes on 2 cores)"
  mkdir -p "$work/k8s" && cd "$work/k8s"
  go mod init lockgate.local/k8s-build >/dev/null 2>&1
  if ! info=$(go mod download -json "k8s.io/kubernetes@$k8s_version" 2>&1); then
    echo "error: cannot download k8s.io/kubernetes@$k8s_version:" >&2
    printf '%s\n' "$info" >&2
    exit 4
  fi
  gomod=$(printf '%s\n' "$info" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  [ -n "$gomod" ] || { echo "error: no go.mod for k8s.io/kubernetes@$k8s_version" >&2; exit 4; }
  minor=${k8s_version#v1.}
  staging_version="v0.${minor}"
  grep -oE '^\s*k8s\.io/[a-z0-9-]+ => \./staging' "$gomod" | awk '{print $1}' | while read -r mod; do
    go mod edit -replace "$mod=$mod@$staging_version"
  done
  go mod edit -require "k8s.io/kubernetes@$k8s_version"
  # Stamp the version the way Kubernetes' release build does, so /version and --version are right.
  major=${k8s_version#v}; major=${major%%.*}
  minor_only=${minor%%.*}
  ldflags="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor_only"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  for cmd in "${k8s_cmds[@]}"; do
    echo "  go build $cmd"
    go build -mod=mod -ldflags "$ldflags" -o "$bin_dir/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd"
    mv "$bin_dir/$cmd.tmp" "$bin_dir/$cmd"
  done
fi

if [ ! -x "$bin_dir/etcd" ]; then
  echo "building etcd $etcd_version"
  mkdir -p "$work/etcd" && cd "$work/etcd"
  go mod init lockgate.local/etcd-build >/dev/null 2>&1
  go mod edit -require "go.etcd.io/etcd/server/v3@$etcd_version"
  go build -mod=mod -ldflags "-s -w" -o "$bin_dir/etcd.tmp" go.etcd.io/etcd/server/v3
  mv "$bin_dir/etcd.tmp" "$bin_dir/etcd"
fi

if [ ! -x "$bin_dir/kwok" ]; then
  echo "building kwok $kwok_version"
  mkdir -p "$work/kwok" && cd "$work/kwok"
  go mod init lockgate.local/kwok-build >/dev/null 2>&1
  go mod edit -require "sigs.k8s.io/kwok@$kwok_version"
  go build -mod=mod -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${kwok_version#v}" \
    -o "$bin_dir/kwok.tmp" sigs.k8s.io/kwok/cmd/kwok
  mv "$bin_dir/kwok.tmp" "$bin_dir/kwok"
fi
echo "binaries ready in $bin_dir"
