#!/usr/bin/env bash
# Builds the Kubernetes control plane, etcd and kwok from Go modules into a versioned cache.
# Why a wrapper module: k8s.io/kubernetes requires its staging modules at v0.0.0, so a plain
# `go install` cannot resolve them; a throwaway module that replaces each staging module with its
# published v0.Y.Z release can. Each binary is built once per version and then reused.
#
# usage: build-go-binaries.sh <bin-dir> <k8s-version> <etcd-version> <kwok-version>
set -euo pipefail
bin_dir=$1 k8s_version=$2 etcd_version=$3 kwok_version=$4
mkdir -p "$bin_dir"
work=$(mktemp -d "${TMPDIR:-/tmp}/lockgate-gobuild.XXXXXX")
trap 'rm -rf "$work"' EXIT
export GOFLAGS="-buildvcs=false -trimpath" CGO_ENABLED=0
ldflags="-s -w"

need() { for b in "$@"; do [ -x "$bin_dir/$b" ] || return 0; done; return 1; }

if need kube-apiserver kube-controller-manager kube-scheduler kubectl; then
  echo "building Kubernetes $k8s_version (cold build: 10-25 minutes on 2 cores)"
  mkdir -p "$work/k8s" && cd "$work/k8s"
  go mod init lockgate.local/k8s-build >/dev/null 2>&1
  gomod=$(go mod download -json "k8s.io/kubernetes@$k8s_version" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  minor=${k8s_version#v1.}
  staging_version="v0.${minor}"
  grep -oE '^\s*k8s\.io/[a-z0-9-]+ => \./staging' "$gomod" | awk '{print $1}' | while read -r mod; do
    go mod edit -replace "$mod=$mod@$staging_version"
  done
  go mod edit -require "k8s.io/kubernetes@$k8s_version"
  for cmd in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    [ -x "$bin_dir/$cmd" ] && continue
    echo "  go build $cmd"
    go build -mod=mod -ldflags "$ldflags" -o "$bin_dir/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd"
    mv "$bin_dir/$cmd.tmp" "$bin_dir/$cmd"
  done
fi

if need etcd; then
  echo "building etcd $etcd_version"
  mkdir -p "$work/etcd" && cd "$work/etcd"
  go mod init lockgate.local/etcd-build >/dev/null 2>&1
  go mod edit -require "go.etcd.io/etcd/server/v3@$etcd_version"
  go build -mod=mod -ldflags "$ldflags" -o "$bin_dir/etcd.tmp" go.etcd.io/etcd/server/v3
  mv "$bin_dir/etcd.tmp" "$bin_dir/etcd"
fi

if need kwok; then
  echo "building kwok $kwok_version"
  mkdir -p "$work/kwok" && cd "$work/kwok"
  go mod init lockgate.local/kwok-build >/dev/null 2>&1
  go mod edit -require "sigs.k8s.io/kwok@$kwok_version"
  go build -mod=mod -ldflags "$ldflags" -o "$bin_dir/kwok.tmp" sigs.k8s.io/kwok/cmd/kwok
  mv "$bin_dir/kwok.tmp" "$bin_dir/kwok"
fi
echo "binaries ready in $bin_dir"
