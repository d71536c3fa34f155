#!/usr/bin/env bash
# Builds helm from the separate Go module in hack/helm into _output/bin/helm,
# for `helm lint` and `helm template` in make verify and the chart's tests
# (test/integration/deploy).
#
# Usage: hack/build-helm.sh
#
# hack/helm is a module of its own, not part of hack/tools: Helm follows
# the newest Kubernetes libraries, and holding them at the controller's
# versions (as hack/tools does, hack/verify-shared-modules.sh) would hold
# Helm back. Where hack/tools holds a module Helm needs at a version at least
# Helm's (the Kubernetes libraries, grpc, protobuf, x/net, otel, ...),
# hack/helm selects that same version: those packages then compile once for
# both, beside the tools' build (make -j tools); of Helm's 802 non-standard
# packages, 583 are the tools' own (238 before). A module Helm needs newer
# than hack/tools (Masterminds/semver) stays at Helm's.
#
# As hack/build-tools.sh: rebuilt only when the binary is missing or its
# stamp (_output/bin/.helm.stamp: the sha256 of hack/helm/go.mod, go.sum and
# this script) is stale; builds are serialised by a lock of their own and
# written beside the target, then renamed.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
script="${repo_root}/hack/$(basename "${BASH_SOURCE[0]}")"
cd "${repo_root}"
module_dir="hack/helm"
bin_dir="${repo_root}/_output/bin"
mkdir -p "${bin_dir}"

stamp="$(cat "${module_dir}/go.mod" "${module_dir}/go.sum" "${script}" | sha256sum | cut -d' ' -f1)"
up_to_date() {
  [[ -x "${bin_dir}/helm" && -f "${bin_dir}/.helm.stamp" && "$(cat "${bin_dir}/.helm.stamp")" == "${stamp}" ]]
}
if up_to_date; then
  echo "helm: up to date"
  exit 0
fi
exec 9>"${bin_dir}/.build-helm.lock"
if ! flock -n 9; then
  echo "waiting for another hack/build-helm.sh to finish" >&2
  flock 9
fi
if up_to_date; then
  echo "helm: up to date"
  exit 0
fi

rm -f "${bin_dir}/.helm.stamp"
out_dir="$(mktemp -d "${bin_dir}/.build-helm.XXXXXX")"
trap 'rm -rf "${out_dir}"' EXIT
start=${SECONDS}
version="$(cd "${module_dir}" && go list -m -f '{{.Version}}' helm.sh/helm/v3)"
echo "building helm ${version}" >&2
# As the Makefile builds everything: CGO off, -trimpath, no DWARF. The
# version is what Helm's release build stamps.
(cd "${module_dir}" && CGO_ENABLED=0 go build -trimpath \
  -ldflags "-w -X helm.sh/helm/v3/internal/version.version=${version}" \
  -o "${out_dir}/helm" helm.sh/helm/v3/cmd/helm)
mv -f "${out_dir}/helm" "${bin_dir}/helm"
echo "${stamp}" >"${bin_dir}/.helm.stamp.tmp"
mv -f "${bin_dir}/.helm.stamp.tmp" "${bin_dir}/.helm.stamp"
echo "helm ${version}: built in $((SECONDS - start))s"
