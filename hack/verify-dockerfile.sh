#!/usr/bin/env bash
# Checks the Dockerfile without a container engine:
#
#   1. its invariants: a multi-stage build whose final stage is distroless
#      static (or scratch), run as the non-root user 65532, with a Go build
#      that has CGO off, -trimpath and the version stamped with -ldflags from
#      a build argument; every base image pinned by digest; a .dockerignore that keeps the context small, and a
#      binary that needs nothing of the repository but what the image copies;
#   2. its build command, run here as the build stage runs it (only the
#      output directory differs), gives a statically linked binary whose
#      --version prints the stamped version.
#
# Usage: hack/verify-dockerfile.sh      (DOCKERFILE=path checks another file)
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${repo_root}"
dockerfile="${DOCKERFILE:-Dockerfile}"
version_var="github.com/kube-attach/attach-detach-controller/cmd/attach-detach-controller/app.Version"

failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

# Instructions one per line: continuation lines joined, comments dropped.
instructions="$(sed -e '/^[[:space:]]*#/d' "${dockerfile}" | sed -e ':a' -e '/\\$/N; s/\\\n/ /; ta' | sed -e '/^[[:space:]]*$/d')"

stages="$(grep -ciE '^FROM[[:space:]]' <<<"${instructions}" || true)"
[[ "${stages}" -ge 2 ]] || fail "want a multi-stage build, found ${stages} FROM"

final_from="$(grep -iE '^FROM[[:space:]]' <<<"${instructions}" | tail -n1)"
final_image_ref="$(awk '{for (i = 2; i <= NF; i++) if ($i !~ /^--/) {print $i; exit}}' <<<"${final_from}")"
final_image="${final_image_ref%@*}"
# Every base image is pinned by digest (scratch is no image).
while IFS= read -r from; do
  ref="$(awk '{for (i = 2; i <= NF; i++) if ($i !~ /^--/) {print $i; exit}}' <<<"${from}")"
  [[ "${ref}" == scratch ]] && continue
  [[ "${ref}" =~ @sha256:[0-9a-f]{64}$ ]] || fail "base image ${ref} is not pinned by digest (want image:tag@sha256:<64 hex>)"
done < <(grep -iE '^FROM[[:space:]]' <<<"${instructions}")
case "${final_image}" in
  gcr.io/distroless/static:nonroot | gcr.io/distroless/static-debian*:nonroot | scratch) ;;
  *) fail "final stage is ${final_image}, want gcr.io/distroless/static:nonroot or scratch" ;;
esac

# The USER in force in the final stage: the last one after the last FROM.
final_stage="$(awk 'toupper($1) == "FROM" {buf = ""} {buf = buf $0 "\n"} END {printf "%s", buf}' <<<"${instructions}")"
user="$(grep -iE '^USER[[:space:]]' <<<"${final_stage}" | tail -n1 | awk '{print $2}')"
[[ "${user}" == "65532:65532" ]] || fail "final stage runs as user '${user}', want 65532:65532 (nonroot)"
grep -qiE '^ENTRYPOINT[[:space:]]+\["/attach-detach-controller"\]' <<<"${final_stage}" ||
  fail "final stage has no ENTRYPOINT [\"/attach-detach-controller\"]"

build_run="$(grep -iE '^RUN[[:space:]].*go build' <<<"${instructions}" || true)"
[[ "$(grep -c . <<<"${build_run}")" -eq 1 ]] || fail "want exactly one RUN with go build, found: ${build_run:-none}"
grep -q 'CGO_ENABLED=0' <<<"${build_run}" || fail "go build without CGO_ENABLED=0"
grep -q -- '-trimpath' <<<"${build_run}" || fail "go build without -trimpath"
grep -q -- "-X ${version_var}=\${VERSION}" <<<"${build_run}" || fail "go build does not stamp ${version_var} from \${VERSION}"
grep -qE '^ARG[[:space:]]+VERSION(=|$)' <<<"${instructions}" || fail "no ARG VERSION to stamp"
grep -q -- '-o /out/attach-detach-controller ' <<<"${build_run}" || fail "go build does not write /out/attach-detach-controller"
grep -qE '^COPY[[:space:]]+--from=build[[:space:]]+/out/attach-detach-controller[[:space:]]' <<<"${final_stage}" ||
  fail "final stage does not copy /out/attach-detach-controller from the build stage"
# The Go toolchain of the image must be able to build this module.
go_image="$(grep -E '^ARG[[:space:]]+GO_VERSION=' <<<"${instructions}" | head -n1 | cut -d= -f2)"
go_mod="$(awk '$1 == "go" {print $2; exit}' go.mod)"
[[ "${go_mod}" == "${go_image}" || "${go_mod}" == "${go_image}".* ]] ||
  fail "golang:${go_image} builds the image but go.mod says go ${go_mod}"

if [[ ! -f .dockerignore ]]; then
  fail "no .dockerignore: the whole tree (_output, .git) would be sent as the build context"
else
  grep -qxE '\*' .dockerignore || fail ".dockerignore does not start from excluding everything (*)"
fi
# The build stage copies go.mod, go.sum, cmd/ and pkg/ only: the binary must
# need nothing else of this repository.
module="$(go list -m)"
outside="$(go list -deps ./cmd/attach-detach-controller | grep -E "^${module}(/|$)" |
  grep -vE "^${module}/(cmd|pkg)/" || true)"
[[ -z "${outside}" ]] || fail "the binary imports packages the image build does not copy: ${outside}"
if grep -qE '=>[[:space:]]*\.{1,2}/' go.mod; then
  fail "go.mod replaces a module with a local directory the image build does not copy"
fi

if [[ "${failures}" -gt 0 ]]; then
  echo "${failures} Dockerfile check(s) failed" >&2
  exit 1
fi
echo "Dockerfile invariants: ok (final stage ${final_image}, user ${user})"

# Run the build stage's command here, as the image build runs it.
out_dir="$(mktemp -d)"
trap 'rm -rf "${out_dir}"' EXIT
version="verify-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)-${RANDOM}"
build_cmd="${build_run#RUN }"
build_cmd="${build_cmd//\/out\//${out_dir}/}"
echo "Building: ${build_cmd}"
VERSION="${version}" TARGETOS="$(go env GOOS)" TARGETARCH="$(go env GOARCH)" bash -euo pipefail -c "${build_cmd}"
bin="${out_dir}/attach-detach-controller"

# Static: no program interpreter and no shared library needed.
if readelf -lW "${bin}" | grep -q 'INTERP'; then
  fail "binary has a program interpreter (dynamically linked)"
fi
if readelf -dW "${bin}" 2>/dev/null | grep -q 'NEEDED'; then
  fail "binary needs shared libraries: $(readelf -dW "${bin}" | grep NEEDED | tr -s ' ')"
fi
if command -v file >/dev/null; then
  file -b "${bin}" | grep -q 'statically linked' || fail "file(1) does not say statically linked: $(file -b "${bin}")"
fi
build_info="$(go version -m "${bin}")"
grep -qE '^[[:space:]]+build[[:space:]]+CGO_ENABLED=0$' <<<"${build_info}" || fail "go version -m: not built with CGO_ENABLED=0"
grep -qE '^[[:space:]]+build[[:space:]]+-trimpath=true$' <<<"${build_info}" || fail "go version -m: not built with -trimpath"

got="$("${bin}" --version)"
want="attach-detach-controller ${version}"
[[ "${got}" == "${want}" ]] || fail "--version printed '${got}', want '${want}'"

if [[ "${failures}" -gt 0 ]]; then
  echo "${failures} binary check(s) failed" >&2
  exit 1
fi
echo "Binary: ok (static, CGO off, trimpath, --version prints '${got}')"
