#!/usr/bin/env bash
# Builds one command of a Go module at a version into a cached binary (Jaeger v2 for the compose
# images). Why not `go install module/cmd@version`: the module's go.mod has replace or exclude
# directives, which `go install pkg@version` refuses; building inside a copy of the downloaded
# module honours them.
#
# usage: build-go-tool.sh <out-binary> <module> <version> <package-dir> [ldflags]
set -euo pipefail
if [ $# -lt 4 ] || [ $# -gt 5 ]; then
  echo "usage: $0 <out-binary> <module> <version> <package-dir> [ldflags]" >&2
  exit 2
fi
out=$1 module=$2 version=$3 pkg=$4 ldflags="-s -w ${5:-}"
command -v go >/dev/null || { echo "error: go is not on PATH (Go >= 1.25 is needed)" >&2; exit 3; }
if [ -x "$out" ]; then
  echo "$out already built"
  exit 0
fi
mkdir -p "$(dirname "$out")"
work=$(mktemp -d "${TMPDIR:-/tmp}/lockgate-gotool.XXXXXX")
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
# GOTOOLCHAIN=local: fail clearly instead of downloading another Go toolchain.
export GOFLAGS="-buildvcs=false -trimpath" CGO_ENABLED=0 GOTOOLCHAIN=local
echo "go: $(go version); building $module@$version $pkg"
cd "$work"
go mod init lockgate.local/tool-download >/dev/null 2>&1
if ! info=$(go mod download -json "$module@$version" 2>&1); then
  echo "error: cannot download $module@$version:" >&2
  printf '%s\n' "$info" >&2
  exit 4
fi
dir=$(printf '%s\n' "$info" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
[ -d "$dir" ] || { echo "error: no source directory for $module@$version" >&2; exit 4; }
cp -r "$dir" "$work/src"
chmod -R u+w "$work/src"
cd "$work/src"
go build -mod=mod -ldflags "$ldflags" -o "$out.tmp" "$pkg"
mv "$out.tmp" "$out"
echo "built $out"
