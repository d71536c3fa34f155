#!/usr/bin/env bash
# Builds the kube-apiserver of each skew module (hack/skew/vMAJOR.MINOR, written
# by hack/skew/update.sh) into _output/skew/VERSION/kube-apiserver, VERSION being
# the k8s.io/kubernetes release the module requires, and prints that path.
#
# Usage: hack/skew/build.sh MINOR...   (MINOR: a directory of hack/skew, e.g. v1.34)
#
# A server is rebuilt only when its binary is missing or its stamp is stale:
# _output/skew/VERSION/.kube-apiserver.stamp holds the sha256 of the module's
# go.mod and go.sum and of this script. The servers are built one after the
# other (each build alone keeps both cores busy for minutes), CGO off and
# -trimpath as hack/build-tools.sh builds, and with the version stamped as a
# release build stamps it: the server's /version and --version say which
# release it is.
set -euo pipefail

script="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
skew_dir="$(dirname "${script}")"
repo_root="$(dirname "$(dirname "${skew_dir}")")"
out_root="${repo_root}/_output/skew"

usage() {
  echo "usage: $0 MINOR...   (MINOR: $(cd "${skew_dir}" && ls -d v1.* | tr '\n' ' '))" >&2
  exit 2
}

[[ $# -gt 0 ]] || usage
for minor in "$@"; do
  [[ -f "${skew_dir}/${minor}/go.mod" ]] || { echo "no module hack/skew/${minor} (hack/skew/update.sh writes it)" >&2; usage; }
done

mkdir -p "${out_root}"
for minor in "$@"; do
  mod_dir="${skew_dir}/${minor}"
  version="$(cd "${mod_dir}" && go list -m -f '{{.Version}}' k8s.io/kubernetes)"
  [[ "${version}" =~ ^v1\.([0-9]+)\.[0-9]+$ ]] || { echo "hack/skew/${minor}: k8s.io/kubernetes ${version} is not a release" >&2; exit 1; }
  bin_dir="${out_root}/${version}"
  bin="${bin_dir}/kube-apiserver"
  stamp_file="${bin_dir}/.kube-apiserver.stamp"
  stamp="$(cat "${mod_dir}/go.mod" "${mod_dir}/go.sum" "${script}" | sha256sum | cut -d' ' -f1)"
  if [[ -x "${bin}" && -f "${stamp_file}" && "$(cat "${stamp_file}")" == "${stamp}" ]]; then
    echo "kube-apiserver ${version}: up to date" >&2
    echo "${bin}"
    continue
  fi

  mkdir -p "${bin_dir}"
  rm -f "${stamp_file}"
  # Serialised per version: make -j or a second make test-skew waits, then
  # finds the server built.
  exec 9>"${bin_dir}/.build.lock"
  if ! flock -n 9; then
    echo "waiting for another build of kube-apiserver ${version}" >&2
    flock 9
  fi
  if [[ -x "${bin}" && -f "${stamp_file}" && "$(cat "${stamp_file}")" == "${stamp}" ]]; then
    echo "kube-apiserver ${version}: up to date" >&2
    echo "${bin}"
    exec 9>&-
    continue
  fi

  # What upstream's release build (hack/lib/version.sh) sets, minus the commit
  # a module zip does not carry.
  pkg="k8s.io/component-base/version"
  ldflags="-w -X ${pkg}.gitVersion=${version} -X ${pkg}.gitMajor=1 -X ${pkg}.gitMinor=${BASH_REMATCH[1]} -X ${pkg}.gitTreeState=clean"
  out="$(mktemp "${bin_dir}/.kube-apiserver.XXXXXX")"
  start=${SECONDS}
  echo "building kube-apiserver ${version} (hack/skew/${minor})" >&2
  if ! (cd "${mod_dir}" && CGO_ENABLED=0 go build -mod=readonly -buildvcs=false -trimpath -ldflags="${ldflags}" -o "${out}" k8s.io/kubernetes/cmd/kube-apiserver); then
    rm -f "${out}"
    exit 1
  fi
  mv -f "${out}" "${bin}"
  echo "${stamp}" >"${stamp_file}.tmp"
  mv -f "${stamp_file}.tmp" "${stamp_file}"
  exec 9>&-
  echo "kube-apiserver ${version}: built in $((SECONDS - start))s" >&2
  echo "${bin}"
done
