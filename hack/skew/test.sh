#!/usr/bin/env bash
# Runs the integration and end-to-end tests against the kube-apiserver of each
# skew module, then prints a table: server release, package, result, duration.
#
# Usage: hack/skew/test.sh MINOR...   (MINOR: a directory of hack/skew, e.g. v1.34)
#
# Environment:
#   INTEGRATION_PACKAGES  the packages of make test-integration (required)
#   E2E_PACKAGES          default ./test/e2e/...
#   GO_TEST, TEST_FLAGS   as in the Makefile
#   ADC_*                 passed on to the tests (the Makefile sets the
#                         controller and kubeletsim binaries)
#
# Only the server changes. etcd, kube-controller-manager, the CSI
# external-attacher and the mock driver stay those of _output/bin
# (hack/build-tools.sh), at the controller's release: a CSI driver's sidecars
# are upgraded on their own schedule, and the shadow, guard and cut-over
# tests compare against one kube-controller-manager whatever the server.
#
# The servers are built first, one after the other (hack/skew/build.sh); the
# tests of one release run while no build competes for the CPU. Each
# release's output is in _output/skew/VERSION/test.log, the table in
# _output/skew/results.txt. The exit code is 1 if any package failed.
set -euo pipefail

skew_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo_root="$(dirname "$(dirname "${skew_dir}")")"
cd "${repo_root}"

[[ $# -gt 0 ]] || { echo "usage: $0 MINOR..." >&2; exit 2; }
[[ -n "${INTEGRATION_PACKAGES:-}" ]] || { echo "INTEGRATION_PACKAGES is not set (make test-skew sets it)" >&2; exit 2; }
E2E_PACKAGES="${E2E_PACKAGES:-./test/e2e/...}"
GO_TEST="${GO_TEST:-go test}"
TEST_FLAGS="${TEST_FLAGS:--count=1 -vet=off}"

declare -A server
for minor in "$@"; do
  start=${SECONDS}
  server[${minor}]="$(hack/skew/build.sh "${minor}")"
  echo "kube-apiserver ${minor}: ready after $((SECONDS - start))s" >&2
done

results="${repo_root}/_output/skew/results.txt"
rows="$(mktemp)"
failed_tests="$(mktemp)"
trap 'rm -f "${rows}" "${failed_tests}"' EXIT
status=0

# run_suite SERVER LOG TIMEOUT PACKAGE...: go test -v against the server
# binary, its output appended to LOG, its summary lines printed as they come.
run_suite() {
  local server_bin="$1" log="$2" timeout="$3" rc
  shift 3
  set +e
  # shellcheck disable=SC2086 # GO_TEST and TEST_FLAGS are word lists
  ADC_KUBE_APISERVER_BINARY="${server_bin}" ${GO_TEST} ${TEST_FLAGS} -v -timeout "${timeout}" "$@" 2>&1 |
    tee -a "${log}" | grep --line-buffered -E '^(ok|FAIL|--- FAIL|panic:)'
  rc=${PIPESTATUS[0]}
  set -e
  [[ ${rc} -eq 0 ]] || status=1
}

for minor in "$@"; do
  server_bin="${server[${minor}]}"
  version="$("${server_bin}" --version | awk '{print $2}')"
  if [[ "$(basename "$(dirname "${server_bin}")")" != "${version}" ]]; then
    echo "${server_bin} says it is ${version}" >&2
    exit 1
  fi
  log="$(dirname "${server_bin}")/test.log"
  : >"${log}"
  echo "=== kube-apiserver ${version}: integration and end-to-end tests (log: ${log#"${repo_root}/"})"
  # shellcheck disable=SC2086 # the package lists are word lists
  run_suite "${server_bin}" "${log}" 20m ${INTEGRATION_PACKAGES}
  # shellcheck disable=SC2086
  run_suite "${server_bin}" "${log}" 10m ${E2E_PACKAGES}
  # go test's summary lines: "ok  <pkg> 12.3s", "FAIL <pkg> 12.3s", and
  # "FAIL <pkg> [build failed]"; packages without tests are left out.
  awk -v v="${version}" -F'\t' '
    $1 ~ /^ok/   { printf "%s\t%s\tpass\t%s\n", v, $2, $3 }
    $1 ~ /^FAIL/ && NF >= 3 { printf "%s\t%s\tFAIL\t%s\n", v, $2, $3 }
  ' "${log}" >>"${rows}"
  grep -E '^--- FAIL: ' "${log}" | sed "s/^/${version} /" >>"${failed_tests}" || true
  # Every cluster the tests started logs the release its server reports
  # (test/framework): proof that they ran against this one.
  others="$(grep -o 'Cluster started.* version="[^"]*"' "${log}" | sed 's/.* version="\([^"]*\)"/\1/' | sort | uniq -c | grep -v " ${version}\$" || true)"
  clusters="$(grep -c 'Cluster started.* version="' "${log}" || true)"
  if [[ -n "${others}" || "${clusters}" -eq 0 ]]; then
    echo "${version}: ${clusters} cluster starts logged, not all on kube-apiserver ${version}: ${others}" | tee -a "${failed_tests}"
    status=1
  else
    echo "${version}: ${clusters} cluster starts logged, every one on kube-apiserver ${version}"
  fi
done

{
  printf '%-16s %-72s %-6s %s\n' "kube-apiserver" "package" "result" "duration"
  while IFS=$'\t' read -r version pkg result duration; do
    printf '%-16s %-72s %-6s %s\n' "${version}" "${pkg#github.com/kube-attach/attach-detach-controller/}" "${result}" "${duration}"
  done <"${rows}"
  if [[ -s "${failed_tests}" ]]; then
    echo
    echo "failed tests:"
    cat "${failed_tests}"
  fi
} | tee "${results}"
exit "${status}"
