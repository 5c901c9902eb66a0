# Builds every command of the module into one small image; compose.yaml
# picks the command per service.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o /out/ ./cmd/...

# A small base with a shell: compose runs "migrate && serve".
FROM alpine:3.20
COPY --from=build /out/ /usr/local/bin/
USER nobody
