#!/usr/bin/env bash
# Builds the binaries the integration tests and benchmarks run against from the
# separate Go module in hack/tools, into _output/bin/NAME.
#
# Usage: hack/build-tools.sh NAME...
#   NAME is one of: etcd kube-apiserver kube-controller-manager kubectl csi-attacher csi-mock-driver
#
# A tool is rebuilt only when its binary is missing or its stamp is stale. The
# stamp (_output/bin/.NAME.stamp) is the sha256 of hack/tools/go.mod, go.sum and
# this script, so bumping a version or changing how we build forces a rebuild.
# For a package inside hack/tools (csi-mock-driver) the stamp also covers its
# source files.
#
# etcd is built in a scratch module (_output/build/etcd) at the version
# hack/tools pins: k8s.io/kubernetes pulls go.etcd.io/etcd/{api,client}/v3 up to
# a release whose generated code no longer matches the pinned etcd server, so
# the server does not compile inside hack/tools itself.
set -euo pipefail

script="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
repo_root="$(dirname "$(dirname "${script}")")"
cd "${repo_root}"

tools_dir="hack/tools"
bin_dir="${repo_root}/_output/bin"

package_for() {
  case "$1" in
    etcd) echo "go.etcd.io/etcd/server/v3" ;;
    kube-apiserver) echo "k8s.io/kubernetes/cmd/kube-apiserver" ;;
    kube-controller-manager) echo "k8s.io/kubernetes/cmd/kube-controller-manager" ;;
    kubectl) echo "k8s.io/kubernetes/cmd/kubectl" ;;
    csi-attacher) echo "github.com/kubernetes-csi/external-attacher/v4/cmd/csi-attacher" ;;
    csi-mock-driver) echo "./csi-mock-driver" ;;
    *) return 1 ;;
  esac
}

# Tools that must be built in their own module, from the module path they
# belong to; the version comes from hack/tools/go.mod.
isolated_module_for() {
  case "$1" in
    etcd) echo "go.etcd.io/etcd/server/v3" ;;
    *) return 1 ;;
  esac
}

build_in_tools_module() {
  local pkg="$1" out="$2"
  (cd "${tools_dir}" && go build -trimpath -o "${out}" "${pkg}")
}

build_in_scratch_module() {
  local name="$1" pkg="$2" module="$3" out="$4"
  local version go_version dir log
  version="$(cd "${tools_dir}" && go list -m -f '{{.Version}}' "${module}")"
  go_version="$(cd "${tools_dir}" && go list -m -f '{{.GoVersion}}')"
  dir="${repo_root}/_output/build/${name}"
  rm -rf "${dir}"
  mkdir -p "${dir}"
  printf 'module build.local/%s\n\ngo %s\n' "${name}" "${go_version}" >"${dir}/go.mod"
  log="${dir}/go-get.log"
  if ! (cd "${dir}" && go get "${module}@${version}") >"${log}" 2>&1; then
    cat "${log}" >&2
    return 1
  fi
  (cd "${dir}" && go build -trimpath -o "${out}" "${pkg}")
}

usage() {
  echo "usage: $0 NAME..." >&2
  echo "  NAME: etcd kube-apiserver kube-controller-manager kubectl csi-attacher csi-mock-driver" >&2
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

# What is stale: tools of the tools module are built together, in one go
# build (their packages compile once, in parallel, and link side by side);
# etcd in its scratch module.
together=()
for name in "$@"; do
  pkg="$(package_for "${name}")"
  bin="${bin_dir}/${name}"
  stamp_file="${bin_dir}/.${name}.stamp"
  stamp="$(stamp_for "${pkg}")"

  if [[ -x "${bin}" && -f "${stamp_file}" && "$(cat "${stamp_file}")" == "${stamp}" ]]; then
    echo "${name}: up to date"
    continue
  fi
  rm -f "${stamp_file}"
  if module="$(isolated_module_for "${name}")"; then
    start=${SECONDS}
    # Build beside the target and rename, so an interrupted build never
    # leaves a truncated binary that a later run would treat as usable.
    build_in_scratch_module "${name}" "${pkg}" "${module}" "${bin}.tmp"
    mv -f "${bin}.tmp" "${bin}"
    echo "${stamp}" >"${stamp_file}"
    echo "${name}: built in $((SECONDS - start))s"
  else
    together+=("${name}")
  fi
done

if [[ ${#together[@]} -gt 0 ]]; then
  start=${SECONDS}
  out="${repo_root}/_output/build/tools-$$"
  rm -rf "${out}"
  mkdir -p "${out}"
  pkgs=()
  for name in "${together[@]}"; do
    pkgs+=("$(package_for "${name}")")
  done
  if [[ ${#pkgs[@]} -eq 1 ]]; then
    build_in_tools_module "${pkgs[0]}" "${out}/${together[0]}"
  else
    # go build -o DIR names each binary after its package's last element.
    (cd "${tools_dir}" && go build -trimpath -o "${out}/" "${pkgs[@]}")
  fi
  for name in "${together[@]}"; do
    pkg="$(package_for "${name}")"
    built="${out}/$(basename "${pkg}")"
    [[ -f "${built}" ]] || built="${out}/${name}"
    mv -f "${built}" "${bin_dir}/${name}"
    stamp_for "${pkg}" >"${bin_dir}/.${name}.stamp"
  done
  rm -rf "${out}"
  echo "${together[*]}: built together in $((SECONDS - start))s"
fi
