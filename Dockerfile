# syntax=docker/dockerfile:1
# The one gputopo image: `gputopo webhook|extender|nodeagent` (and simulate,
# demo, version), and `gputopo-scheduler`, kube-scheduler with the
# GPUTopology plugin compiled in (scheduler.mode: plugin). gputopo-scheduler
# is its own module (cmd/gputopo-scheduler) and static, as kube-scheduler is.
#
# Not static: the node agent reads the NVIDIA driver through go-nvml, which
# uses cgo and dlopen()s libnvidia-ml.so.1 at run time (the driver is never
# linked in, so the image builds and runs without it). `CGO_ENABLED=0 go
# build ./cmd/gputopo` fails in go-nvml. The binary links glibc dynamically,
# so builder and runtime share one Debian release (glibc of the runtime must
# be at least the builder's): golang:*-bookworm with distroless
# base-nossl-debian12 (glibc, no shell, no package manager, no OpenSSL).
#
# The image runs as nonroot (65532). The webhook, extender and scheduler
# pods keep that; the node agent's DaemonSet runs it as root because
# kubelet's device-plugins and pod-resources directories are root-only.

ARG GO_IMAGE=golang:1.26-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/base-nossl-debian12:nonroot

FROM ${GO_IMAGE} AS build
WORKDIR /src
# Dependencies first: this layer is reused until go.mod or go.sum change.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/root/go/pkg/mod go mod download
COPY . .
ARG VERSION=v0.0.0-dev
ARG TARGETOS=linux
ARG TARGETARCH=amd64
RUN --mount=type=cache,target=/root/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=1 GOOS=${TARGETOS} GOARCH=${TARGETARCH} \
    go build -trimpath -tags nodemo \
      -ldflags "-s -w -X github.com/gputopo/gputopo/cmd/gputopo/app.Version=${VERSION}" \
      -o /out/gputopo ./cmd/gputopo
RUN --mount=type=cache,target=/root/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    cd cmd/gputopo-scheduler && kver=$(go list -m -f '{{.Version}}' k8s.io/kubernetes) && \
    CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} \
    go build -trimpath \
      -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=${kver} -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(echo ${kver} | cut -d. -f2) -X k8s.io/component-base/version.gitTreeState=clean -X github.com/gputopo/gputopo/schedplugin.Version=${VERSION}" \
      -o /out/gputopo-scheduler .

FROM ${RUNTIME_IMAGE}
COPY --from=build /out/gputopo /out/gputopo-scheduler /usr/local/bin/
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/gputopo"]
