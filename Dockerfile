# The attach-detach-controller image: a static binary on distroless, run as a
# non-root user.
#
#   docker build --build-arg VERSION="$(git describe --tags --always --dirty)" \
#     -t ghcr.io/kube-attach/attach-detach-controller:TAG .
#
# hack/verify-dockerfile.sh checks the invariants of this file and runs its
# build command locally: keep the `go build` in a single RUN of the build
# stage.

ARG GO_VERSION=1.26

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
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
FROM gcr.io/distroless/static:nonroot
COPY --from=build /out/attach-detach-controller /attach-detach-controller
USER 65532:65532
ENTRYPOINT ["/attach-detach-controller"]
