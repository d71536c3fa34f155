#!/usr/bin/env bash
# Checks that hack/tools holds every module the controller builds at the
# controller's version. Built the same way (CGO off, -trimpath: see the
# Makefile), a package both build then compiles once on a cold cache: the
# controller's dependencies (client-go, apiserver, ...) come almost free with
# the tools. A version that differs compiles that module, and every package
# above it, twice.
#
# Usage: hack/verify-shared-modules.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Each is PATH VERSION, or PATH VERSION=>REPLACEMENT when a replace changes
# the version: -trimpath names a module's files by the version selected, so
# a replaced module compiles apart from the same code selected as itself.
# The modules of every package the controller, its tests and commands build.
built="$(go list -deps -test -f '{{with .Module}}{{if not .Main}}{{$m := .}}{{.Path}} {{.Version}}{{with .Replace}}{{if ne .Version $m.Version}}=>{{.Version}}{{end}}{{end}}{{end}}{{end}}' ./... | sort -u)"
tools="$(cd hack/tools && go list -m -f '{{$m := .}}{{.Path}} {{.Version}}{{with .Replace}}{{if ne .Version $m.Version}}=>{{.Version}}{{end}}{{end}}' all | sort -u)"
differ="$(join <(echo "${built}") <(echo "${tools}") | awk '$2 != $3 {print "  " $1 ": " $2 " here, " $3 " in hack/tools"}')"
if [[ -n "${differ}" ]]; then
  echo "hack/tools holds modules the controller builds at other versions (both must select the same):"
  echo "${differ}"
  exit 1
fi
echo "Shared modules: every module the controller builds that hack/tools also has is at the same version"
