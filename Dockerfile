# syntax=docker/dockerfile:1
# Small, static, non-root image of subscriberd: `docker build -t subscriberd .`
# The binary is built with CGO_ENABLED=0, so the final stage needs nothing but the CA bundle
# (for smtps://, sslmode=verify-full and an https OTLP endpoint).

FROM golang:1.26.8-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w -X main.version=${VERSION}" \
      -o /out/subscriberd ./cmd/subscriberd && mkdir -p /out/data

FROM scratch
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/subscriberd /subscriberd
# Without DATABASE_URL the service keeps an embedded SQLite file in DATA_DIR: a directory the
# non-root user owns (mount a volume there to keep it).
COPY --from=build --chown=65532:65532 /out/data /data
ENV DATA_DIR=/data
# 65532 is the conventional "nonroot" user; the image has no shell and no package manager.
USER 65532:65532
# 8080: the public API (LISTEN_ADDR); 9090: /metrics, /livez, /readyz, pprof (ADMIN_ADDR).
EXPOSE 8080 9090
ENTRYPOINT ["/subscriberd"]
CMD ["serve"]
