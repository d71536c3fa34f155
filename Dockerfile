# The attach-detach-controller image: a static binary on distroless, run as a
# non-root user.
#
#   make image       (or: docker build --build-arg VERSION="$(hack/version.sh)" \
#                       -t ghcr.io/kube-attach/attach-detach-controller:"$(hack/version.sh)" .)
#
# The version is the release in VERSION (hack/version.sh adds -dev and the
# commit off the release's tag); the chart's appVersion is the same.
#
# hack/verify-dockerfile.sh checks the invariants of this file and runs its
# build command locally: keep the `go build` in a single RUN of the build
# stage.

# Base images are pinned by digest (multi-arch index digests), so that a
# rebuild of the same commit uses the same bases; the tag stays for readers
# and for tools that bump digests (Renovate, Dependabot). Update both
# together:
#   crane digest golang:1.26    crane digest gcr.io/distroless/static:nonroot
ARG GO_VERSION=1.26

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION}@sha256:3aff6657219a4d9c14e27fb1d8976c49c29fddb70ba835014f477e1c70636647 AS build
# Set by BuildKit from --platform (default: the build machine's).
ARG TARGETOS
ARG TARGETARCH
ARG VERSION=dev
WORKDIR /src
# Dependencies first: this layer is reused until go.mod or go.sum change.
COPY go.mod go.sum ./
RUN go mod download
COPY cmd/ cmd/
COPY pkg/ pkg/
# Cross-compiled on the build platform (no emulation for multi-arch images);
# CGO off, so the binary is static and runs without a libc.
RUN CGO_ENABLED=0 GOOS=${TARGETOS:-linux} GOARCH=${TARGETARCH:-amd64} \
    go build -trimpath \
      -ldflags "-s -w -X github.com/kube-attach/attach-detach-controller/cmd/attach-detach-controller/app.Version=${VERSION}" \
      -o /out/attach-detach-controller ./cmd/attach-detach-controller

# No shell, no package manager: CA certificates, /etc/passwd with nonroot,
# tzdata, and the binary.
FROM gcr.io/distroless/static:nonroot@sha256:f7f8f729987ad0fdf6b05eeeae94b26e6a0f613bdf46feea7fc40f7bd72953e6
COPY --from=build /out/attach-detach-controller /attach-detach-controller
USER 65532:65532
ENTRYPOINT ["/attach-detach-controller"]
