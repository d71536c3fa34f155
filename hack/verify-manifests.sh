#!/usr/bin/env bash
# Renders every kustomization under manifests/ with the kustomize build that
# the kubectl hack/tools pins runs for `kubectl kustomize` (hack/tools/kustomize,
# built into _output/bin on first use), so that a manifest kustomize can't
# build fails `make verify` without a cluster. The render is
# applied to a real API server (server-side dry-run), and checked object by
# object, in test/integration/deploy.
#
# Usage: hack/verify-manifests.sh
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${repo_root}"

hack/build-tools.sh kustomize >/dev/null
kustomize="${repo_root}/_output/bin/kustomize"

failures=0
while IFS= read -r kustomization; do
  dir="$(dirname "${kustomization}")"
  # A directory that only groups files for another kustomization (crd/)
  # renders too; rendering it on its own costs nothing.
  if ! out="$("${kustomize}" build "${dir}" 2>&1)"; then
    echo "FAIL: kustomize build ${dir}:" >&2
    echo "${out}" >&2
    failures=$((failures + 1))
    continue
  fi
  objects="$(grep -c '^kind: ' <<<"${out}" || true)"
  if [[ "${objects}" -eq 0 ]]; then
    echo "FAIL: kustomize build ${dir} rendered no object" >&2
    failures=$((failures + 1))
    continue
  fi
  if grep -qE '^[[:space:]]+image: [^[:space:]]+:latest$' <<<"${out}"; then
    echo "FAIL: ${dir} deploys an image tagged latest" >&2
    failures=$((failures + 1))
  fi
  echo "${dir}: ${objects} objects"
done < <(find manifests -name kustomization.yaml | LC_ALL=C sort)

if [[ "${failures}" -gt 0 ]]; then
  echo "${failures} kustomization(s) failed" >&2
  exit 1
fi
