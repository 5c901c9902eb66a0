#!/usr/bin/env bash
# Installs the pinned sqlc version unless it is already installed. sqlc needs
# cgo; the first build takes a few minutes.
set -euo pipefail
want=${1:?usage: install-sqlc.sh VERSION}
bin="$(go env GOPATH)/bin/sqlc"
if [ -x "$bin" ] && [ "v$("$bin" version | sed 's/^v//')" = "$want" ]; then
  exit 0
fi
echo "installing sqlc $want (cgo build, a few minutes the first time)" >&2
CGO_ENABLED=1 go install "github.com/sqlc-dev/sqlc/cmd/sqlc@$want"
