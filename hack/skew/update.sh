#!/usr/bin/env bash
# Writes the Go module that builds kube-apiserver VERSION for make test-skew:
# hack/skew/vMAJOR.MINOR/go.mod and go.sum.
#
# Usage: hack/skew/update.sh VERSION...   (VERSION: a k8s.io/kubernetes release, e.g. v1.34.4)
#
# k8s.io/kubernetes builds only with every staging module it replaces by
# ./staging/src/... in its own go.mod replaced here by the matching v0.MINOR.PATCH
# release. The list is read from that version's go.mod, so a module written
# here builds exactly the server of that release. Its go directive and
# godebug default are the release's too: the server runs with the runtime
# behaviour its release was built for.
#
# `go list -m -versions k8s.io/kubernetes` lists the releases the module proxy
# serves. hack/skew/build.sh builds the modules written here.
set -euo pipefail

skew_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

usage() {
  echo "usage: $0 VERSION...   (e.g. v1.34.4)" >&2
  exit 2
}

[[ $# -gt 0 ]] || usage
for version in "$@"; do
  [[ "${version}" =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] || { echo "not a Kubernetes release: ${version}" >&2; usage; }
done

for version in "$@"; do
  [[ "${version}" =~ ^v1\.([0-9]+)\.([0-9]+)$ ]]
  minor="${BASH_REMATCH[1]}"
  patch="${BASH_REMATCH[2]}"
  staging_version="v0.${minor}.${patch}"
  dir="${skew_dir}/v1.${minor}"

  upstream_mod="$(go mod download -json "k8s.io/kubernetes@${version}" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')"
  [[ -f "${upstream_mod}" ]] || { echo "k8s.io/kubernetes@${version}: no go.mod from the module proxy" >&2; exit 1; }
  go_version="$(sed -n 's/^go \([0-9.]*\)$/\1/p' "${upstream_mod}")"
  godebug="$(sed -n 's/^godebug \(.*\)$/\1/p' "${upstream_mod}")"
  staging="$(sed -n 's/^[[:space:]]*\(k8s\.io\/[a-z0-9-]*\) => \.\/staging\/src\/.*$/\1/p' "${upstream_mod}")"
  [[ -n "${staging}" ]] || { echo "k8s.io/kubernetes@${version}: no staging replacements found in its go.mod" >&2; exit 1; }

  mkdir -p "${dir}"
  {
    echo "// Builds kube-apiserver ${version} for make test-skew (hack/skew/build.sh)."
    echo "// Written by hack/skew/update.sh ${version}: the staging modules are those"
    echo "// k8s.io/kubernetes ${version} replaces in its own go.mod, at ${staging_version}."
    echo "module github.com/kube-attach/attach-detach-controller/hack/skew/v1.${minor}"
    echo
    echo "go ${go_version}"
    if [[ -n "${godebug}" ]]; then
      echo
      echo "godebug ${godebug}"
    fi
    echo
    echo "tool k8s.io/kubernetes/cmd/kube-apiserver"
    echo
    echo "require k8s.io/kubernetes ${version}"
    echo
    echo "replace ("
    while read -r mod; do
      printf '\t%s => %s %s\n' "${mod}" "${mod}" "${staging_version}"
    done <<<"${staging}"
    echo ")"
  } >"${dir}/go.mod"
  rm -f "${dir}/go.sum"
  (cd "${dir}" && GOFLAGS=-mod=mod go mod tidy)
  echo "hack/skew/v1.${minor}: kube-apiserver ${version}"
done
