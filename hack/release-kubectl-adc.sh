#!/usr/bin/env bash
# Builds kubectl-adc for each platform of its krew manifest into
# _output/release/kubectl-adc_<version>_<os>_<arch>.tar.gz (the binary and
# nothing else: krew installs only bin), and
# writes _output/release/adc.yaml: plugins/adc.yaml with the version and
# each archive's sha256 filled in.
#
# Usage: hack/release-kubectl-adc.sh [VERSION]   (default: hack/version.sh)
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${repo_root}"

version="${1:-$(hack/version.sh)}"
out="${repo_root}/_output/release"
mkdir -p "${out}"
manifest="$(sed "s/@VERSION@/${version}/g" plugins/adc.yaml)"
for platform in linux/amd64 linux/arm64 darwin/amd64 darwin/arm64 windows/amd64; do
  os="${platform%/*}" arch="${platform#*/}"
  bin="kubectl-adc"
  [[ "${os}" == windows ]] && bin="kubectl-adc.exe"
  dir="$(mktemp -d)"
  CGO_ENABLED=0 GOOS="${os}" GOARCH="${arch}" go build -trimpath \
    -ldflags "-s -w -X github.com/kube-attach/attach-detach-controller/cmd/kubectl-adc/app.Version=${version}" \
    -o "${dir}/${bin}" ./cmd/kubectl-adc
  archive="${out}/kubectl-adc_${version}_${os}_${arch}.tar.gz"
  tar -C "${dir}" -czf "${archive}" "${bin}"
  rm -rf "${dir}"
  sum="$(sha256sum "${archive}" | cut -d' ' -f1)"
  manifest="${manifest//@SHA256_${os}_${arch}@/${sum}}"
  echo "${archive}"
done
if grep -qE '@[A-Za-z0-9_]+@' <<<"${manifest}"; then
  echo "plugins/adc.yaml has a placeholder this script does not fill: $(grep -oE '@[A-Za-z0-9_]+@' <<<"${manifest}" | sort -u | tr '\n' ' ')" >&2
  exit 1
fi
echo "${manifest}" >"${out}/adc.yaml"
echo "${out}/adc.yaml"
