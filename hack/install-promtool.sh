#!/usr/bin/env bash
# Puts promtool (Prometheus' rule checker) at _output/bin/promtool for
# `make verify` (promtool check rules) and test/integration/deploy
# (promtool test rules). Reused when present: a CI cache of _output/bin
# makes a warm run free.
#
# From Debian's `prometheus` package (22 MB, about a minute with apt-get
# update), not built from the Go module proxy: github.com/prometheus/prometheus
# pulls every service-discovery SDK (AWS, Azure, GCP, ...), minutes of
# download and build on a cold cache for one small tool.
#
# Usage: hack/install-promtool.sh      (PROMTOOL=path uses that binary)
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${repo_root}/_output/bin/promtool"
mkdir -p "$(dirname "${out}")"

if [[ -x "${out}" ]]; then
  exit 0
fi
# One install at a time (two make runs may start it together); the second
# finds the first one's promtool.
exec 9>"$(dirname "${out}")/.install-promtool.lock"
flock 9
if [[ -x "${out}" ]]; then
  exit 0
fi
if [[ -n "${PROMTOOL:-}" ]]; then
  cp "${PROMTOOL}" "${out}.tmp" && mv -f "${out}.tmp" "${out}"
  exit 0
fi
if command -v promtool >/dev/null; then
  cp "$(command -v promtool)" "${out}.tmp" && mv -f "${out}.tmp" "${out}"
  exit 0
fi
if command -v apt-get >/dev/null && [[ "$(id -u)" -eq 0 ]]; then
  echo "Installing promtool from Debian's prometheus package" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  cp /usr/bin/promtool "${out}.tmp" && mv -f "${out}.tmp" "${out}"
  exit 0
fi
echo "promtool not found: install Prometheus' promtool (Debian/Ubuntu: apt-get install prometheus), or set PROMTOOL=path" >&2
exit 1
