#!/usr/bin/env bash
# Prints the version a build stamps: the release in VERSION when the commit
# is that release's tag and the tree is clean; otherwise the release, -dev,
# the commit and -dirty for uncommitted changes (v0.1.0-dev-1b6162b-dirty),
# which is also a valid image tag.
#
# Usage: hack/version.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

release="$(tr -d '[:space:]' <VERSION)"
if ! commit="$(git rev-parse --short HEAD 2>/dev/null)"; then
  echo "${release}-dev"
  exit 0
fi
dirty=""
git diff --quiet HEAD -- 2>/dev/null || dirty="-dirty"
if [[ -z "${dirty}" ]] && git tag --points-at HEAD 2>/dev/null | grep -qxF "${release}"; then
  echo "${release}"
  exit 0
fi
echo "${release}-dev-${commit}${dirty}"
