#!/usr/bin/env bash
# Builds the binaries the integration tests and benchmarks run against from the
# separate Go module in hack/tools, into _output/bin/NAME.
#
# Usage: hack/build-tools.sh NAME...
#   NAME is one of: etcd kube-apiserver kube-controller-manager kube-scheduler
#   kustomize csi-attacher csi-provisioner csi-mock-driver hollow-node
#
# A tool is rebuilt only when its binary is missing or its stamp is stale. The
# stamp (_output/bin/.NAME.stamp) is the sha256 of hack/tools/go.mod, go.sum and
# this script, so bumping a version or changing how we build forces a rebuild.
# For a package inside hack/tools (csi-mock-driver, hollow-node, kustomize) the stamp also
# covers its source files.
#
# The stale tools are built by one `go build` of all their main packages: the
# packages they share (client-go, apiserver, grpc, ...) compile once, and the
# compiles and links of different tools run side by side.
#
# Builds are serialised with a lock (_output/bin/.build-tools.lock): a second
# run (make test -j starts it from several targets) waits for the first and
# then finds its tools up to date. Tools already up to date
# are not waited for.
set -euo pipefail

script="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
repo_root="$(dirname "$(dirname "${script}")")"
cd "${repo_root}"

tools_dir="hack/tools"
bin_dir="${repo_root}/_output/bin"
all_tools="etcd kube-apiserver kube-controller-manager kube-scheduler kustomize csi-attacher csi-provisioner csi-mock-driver hollow-node"

# etcd is built in hack/tools too: the server module at v3.7.2, the release of
# go.etcd.io/etcd/{api,client}/v3 the controller builds (shared modules stay on
# one version), so `etcd --version` prints 3.7.2.
package_for() {
  case "$1" in
    etcd) echo "go.etcd.io/etcd/server/v3" ;;
    kube-apiserver) echo "k8s.io/kubernetes/cmd/kube-apiserver" ;;
    kube-controller-manager) echo "k8s.io/kubernetes/cmd/kube-controller-manager" ;;
    kube-scheduler) echo "k8s.io/kubernetes/cmd/kube-scheduler" ;;
    kustomize) echo "./kustomize" ;;
    csi-attacher) echo "github.com/kubernetes-csi/external-attacher/v4/cmd/csi-attacher" ;;
    csi-provisioner) echo "github.com/kubernetes-csi/external-provisioner/v6/cmd/csi-provisioner" ;;
    csi-mock-driver) echo "./csi-mock-driver" ;;
    hollow-node) echo "./hollow-node" ;;
    *) return 1 ;;
  esac
}

# The file name `go build -o DIR/` gives a main package: its last path element,
# or the one before a major version suffix (go.etcd.io/etcd/server/v3: server).
output_name() {
  local pkg="$1" base
  base="${pkg##*/}"
  if [[ "${base}" =~ ^v[0-9]+$ ]]; then
    base="$(basename "$(dirname "${pkg}")")"
  fi
  echo "${base}"
}

usage() {
  echo "usage: $0 NAME..." >&2
  echo "  NAME: ${all_tools}" >&2
  exit 2
}

[[ $# -gt 0 ]] || usage
for name in "$@"; do
  package_for "${name}" >/dev/null || { echo "unknown tool: ${name}" >&2; usage; }
done

base_stamp="$(cat "${tools_dir}/go.mod" "${tools_dir}/go.sum" "${script}" | sha256sum | cut -d' ' -f1)"
mkdir -p "${bin_dir}"

stamp_for() {
  local pkg="$1"
  if [[ "${pkg}" != ./* ]]; then
    echo "${base_stamp}"
    return
  fi
  if [[ ! -d "${tools_dir}/${pkg}" ]]; then
    echo "${tools_dir}/${pkg#./}: no such package directory" >&2
    return 1
  fi
  # Hash names and contents so that adding, removing or renaming a file counts.
  {
    echo "${base_stamp}"
    (cd "${tools_dir}" && find "${pkg}" -type f -print0 | LC_ALL=C sort -z | xargs -0r sha256sum)
  } | sha256sum | cut -d' ' -f1
}

up_to_date() {
  local name="$1" stamp="$2"
  [[ -x "${bin_dir}/${name}" && -f "${bin_dir}/.${name}.stamp" && "$(cat "${bin_dir}/.${name}.stamp")" == "${stamp}" ]]
}

# stale_tools prints NAME STAMP for each tool of "$@" that needs a build.
stale_tools() {
  local name stamp
  for name in "$@"; do
    stamp="$(stamp_for "$(package_for "${name}")")"
    up_to_date "${name}" "${stamp}" || echo "${name} ${stamp}"
  done
}

report_up_to_date() {
  local name
  for name in "$@"; do
    grep -q "^${name} " <<<"${stale}" || echo "${name}: up to date"
  done
}

stale="$(stale_tools "$@")"
if [[ -n "${stale}" ]]; then
  exec 9>"${bin_dir}/.build-tools.lock"
  if ! flock -n 9; then
    echo "waiting for another hack/build-tools.sh to finish" >&2
    flock 9
  fi
  # Another run may have built some of them meanwhile.
  stale="$(stale_tools "$@")"
fi
report_up_to_date "$@"
[[ -n "${stale}" ]] || exit 0

names=()
pkgs=()
stamps=()
while read -r name stamp; do
  names+=("${name}")
  pkgs+=("$(package_for "${name}")")
  stamps+=("${stamp}")
  rm -f "${bin_dir}/.${name}.stamp"
done <<<"${stale}"

# Build into a scratch directory beside the targets and rename, so that an
# interrupted build never leaves a truncated binary a later run would use.
out_dir="$(mktemp -d "${bin_dir}/.build.XXXXXX")"
trap 'rm -rf "${out_dir}"' EXIT
start=${SECONDS}
echo "building ${names[*]}" >&2
# CGO off and -trimpath, as the Makefile builds everything: the packages the
# tools share with the controller and its tests (hack/tools/go.mod holds them
# at the controller's versions) compile once. No DWARF (-w): the links take
# a fifth less; stack traces are unchanged.
# The Kubernetes release is stamped as upstream's release build does
# (hack/lib/version.sh, less the commit a module zip does not carry), so that
# `kube-apiserver --version` and the server's /version say it; -X only
# changes the link, so the shared packages still compile once.
k8s_version="$(cd "${tools_dir}" && go list -m -f '{{.Version}}' k8s.io/kubernetes)"
[[ "${k8s_version}" =~ ^v1\.([0-9]+)\. ]] || { echo "unexpected k8s.io/kubernetes version ${k8s_version}" >&2; exit 1; }
version_pkg="k8s.io/component-base/version"
ldflags="-w -X ${version_pkg}.gitVersion=${k8s_version} -X ${version_pkg}.gitMajor=1 -X ${version_pkg}.gitMinor=${BASH_REMATCH[1]} -X ${version_pkg}.gitTreeState=clean"
(cd "${tools_dir}" && CGO_ENABLED=0 go build -trimpath -ldflags="${ldflags}" -o "${out_dir}/" "${pkgs[@]}")
for i in "${!names[@]}"; do
  mv -f "${out_dir}/$(output_name "${pkgs[i]}")" "${bin_dir}/${names[i]}"
  echo "${stamps[i]}" >"${bin_dir}/.${names[i]}.stamp.tmp"
  mv -f "${bin_dir}/.${names[i]}.stamp.tmp" "${bin_dir}/.${names[i]}.stamp"
done
echo "${names[*]}: built in $((SECONDS - start))s"
