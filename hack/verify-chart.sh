#!/usr/bin/env bash
# Checks the Helm chart without a cluster: `helm lint --strict` and
# `helm template` with its defaults and with every switch on; the files it
# reads as they are (the CRD, the alert rules) are the manifests' own; its
# version and appVersion are the release in VERSION. test/integration/deploy
# compares its render with manifests/ object by object and applies it to a
# real API server (server-side dry-run).
#
# Usage: hack/verify-chart.sh
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${repo_root}"
chart="charts/attach-detach-controller"

hack/build-helm.sh >/dev/null
helm="${repo_root}/_output/bin/helm"
# Nothing of the user's Helm configuration, nothing written to $HOME.
helm_home="$(mktemp -d)"
trap 'rm -rf "${helm_home}"' EXIT
export HELM_CACHE_HOME="${helm_home}" HELM_CONFIG_HOME="${helm_home}" HELM_DATA_HOME="${helm_home}"

failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

every_switch=(
  --set metrics.serviceMonitor.enabled=true
  --set prometheusRule.enabled=true
  --set shadow.enabled=true
  --set crds.install=false
  --set podDisruptionBudget.enabled=false
  --set serviceAccount.create=false --set serviceAccount.name=attach-detach-controller
  --set leaderElection.enabled=false
  --set image.digest=sha256:0000000000000000000000000000000000000000000000000000000000000000
  --set 'extraArgs[0]=--max-wait-for-unmount=10m'
)

"${helm}" lint --strict "${chart}" --namespace kube-system || fail "helm lint ${chart}"
"${helm}" lint --strict "${chart}" --namespace kube-system "${every_switch[@]}" || fail "helm lint ${chart} with every switch on"

for values in default every-switch; do
  args=()
  [[ "${values}" == every-switch ]] && args=("${every_switch[@]}")
  if ! out="$("${helm}" template attach-detach-controller "${chart}" --namespace kube-system "${args[@]}" 2>&1)"; then
    fail "helm template (${values}): ${out}"
    continue
  fi
  objects="$(grep -c '^kind: ' <<<"${out}" || true)"
  [[ "${objects}" -gt 0 ]] || fail "helm template (${values}) rendered no object"
  if grep -qE '^[[:space:]]+image: [^[:space:]]+:latest$' <<<"${out}"; then
    fail "helm template (${values}) deploys an image tagged latest"
  fi
  echo "${chart} (${values} values): ${objects} objects"
done

# Read by the chart as they are (.Files.Get): a copy of the manifests' own.
for pair in \
  "files/csinodeinfo.yaml manifests/crd/csinodeinfo.yaml" \
  "files/prometheusrule.yaml manifests/overlays/prometheus-operator/prometheusrule.yaml"; do
  read -r file manifest <<<"${pair}"
  cmp -s "${chart}/${file}" "${manifest}" || fail "${chart}/${file} differs from ${manifest}: cp ${manifest} ${chart}/${file}"
done

release="$(cat VERSION)"
app_version="$(awk '$1 == "appVersion:" {print $2}' "${chart}/Chart.yaml")"
chart_version="$(awk '$1 == "version:" {print $2}' "${chart}/Chart.yaml")"
[[ "${app_version}" == "${release}" ]] || fail "${chart}/Chart.yaml appVersion ${app_version}, VERSION says ${release}"
[[ "${chart_version}" == "${release#v}" ]] || fail "${chart}/Chart.yaml version ${chart_version}, VERSION says ${release} (the chart's is ${release#v})"

if [[ "${failures}" -gt 0 ]]; then
  echo "${failures} chart check(s) failed" >&2
  exit 1
fi
