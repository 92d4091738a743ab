# syntax=docker/dockerfile:1
#
# One image for both processes: `kvroute serve` (the default CMD, HTTP on
# 8080) and `kvroute ingest` (override CMD; its /metrics and /healthz on 9091).
#
# Two ways to build it (see infra/README.md):
#
#   1. From source (needs the golang base image):
#        docker build --build-arg VERSION=$(git describe --always --dirty) -t kvroute .
#
#   2. From a binary built outside, for machines that cannot pull any base
#      image (the runtime is FROM scratch, which needs no pull):
#        CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=$(git describe --always --dirty)" \
#            -o bin/kvroute ./cmd/kvroute
#        cp /etc/ssl/certs/ca-certificates.crt bin/
#        podman build --target runtime-local -t kvroute .
#
# BuildKit (docker's default builder since 23.0) and buildah/podman build only
# the stages the chosen target needs, so the default target never reads bin/
# and runtime-local never pulls golang.

# The Go toolchain DEVELOPERS.md pins (GOTOOLCHAIN=go1.27.3). A
# global ARG: only those declared before the first FROM reach a FROM line.
ARG GO_VERSION=1.27.3

# ---- runtime-local: the runtime from a binary and CA bundle in bin/ --------
# Defined before the others so that it is never the default target.
FROM scratch AS runtime-local
COPY bin/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --chmod=0555 bin/kvroute /kvroute
# Numeric, so that Kubernetes' runAsNonRoot can verify it without /etc/passwd.
USER 65532:65532
EXPOSE 8080 9091
ENTRYPOINT ["/kvroute"]
CMD ["serve"]

# ---- build: a static binary from source -------------------------------------
FROM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
# The image's toolchain is the one go.mod asks for: never download another.
ENV CGO_ENABLED=0 GOTOOLCHAIN=local
# Modules first, so that a source change reuses the download layer.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG VERSION=dev
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/kvroute ./cmd/kvroute

# ---- runtime: the default target ---------------------------------------------
# scratch: no shell, no package manager, nothing to patch but the binary.
# kvroute needs only CA certificates (rediss:// to managed Redis, HTTPS
# replicas); it writes no files, so readOnlyRootFilesystem holds.
FROM scratch AS runtime
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build --chmod=0555 /out/kvroute /kvroute
USER 65532:65532
EXPOSE 8080 9091
ENTRYPOINT ["/kvroute"]
CMD ["serve"]
