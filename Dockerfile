# One image holds every command of the module (orders, notifier,
# devbroker); compose.yaml builds it once and names the command each
# service runs.

# The Go version matches go.mod (internal/composetest checks it).
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# Static binaries (no cgo), without local paths or VCS stamps, so the same
# tree builds the same bytes.
RUN CGO_ENABLED=0 go build -trimpath -buildvcs=false -ldflags='-s -w' -o /out/ ./cmd/...

# No shell, no package manager: only CA certificates, tzdata and the
# binaries. Health checks run the binaries themselves (`orders healthcheck`).
FROM gcr.io/distroless/static-debian13 AS runtime
COPY --from=build /out/ /usr/local/bin/
# The consumer registry that `orders admin replay plan` reads
# (REPLAY_CONSUMERS_FILE).
COPY deploy/consumers.yaml /etc/outboxref/consumers.yaml
# nobody, numerically, so that Kubernetes' runAsNonRoot can verify it.
USER 65534:65534
# orders serve (HTTP_ADDR), notifier serve (HTTP_ADDR), orders relay (RELAY_METRICS_ADDR).
EXPOSE 8080 8081 9091
ENTRYPOINT ["/usr/local/bin/orders"]
CMD ["serve"]
