#!/usr/bin/env bash
# Installs the pinned Mailpit (the demo's SMTP server, with an API listing
# what it received) into GOBIN unless that version is already there, and
# prints the binary's path. The first build takes a minute or two.
#
# A `go install` build has Mailpit's SMTP server and API but not its web
# UI, whose compiled assets are not part of the Go module; compose.yaml's
# Mailpit image has both.
set -euo pipefail
want=${1:?usage: install-mailpit.sh VERSION}
gobin=$(go env GOBIN)
gobin=${gobin:-$(go env GOPATH)/bin}
bin="$gobin/mailpit"
# `mailpit version` says "dev" for a go install build; the module version
# recorded in the binary is exact.
if [ -x "$bin" ] && [ "$(go version -m "$bin" 2>/dev/null | awk '$1 == "mod" { print $3 }')" = "$want" ]; then
  echo "$bin"
  exit 0
fi
echo "installing mailpit $want into $gobin (a minute or two the first time)" >&2
GOBIN="$gobin" go install "github.com/axllent/mailpit@$want"
echo "$bin"
