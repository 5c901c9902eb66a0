#!/usr/bin/env bash
# Installs the load generator `go run ./cmd/bench` prefers (wrk) on Debian
# or Ubuntu. Without it the benchmark falls back to its built-in Go
# generator and says so in its output. pgbench comes with the PostgreSQL
# client (postgresql-client).
set -euo pipefail
if command -v wrk >/dev/null 2>&1; then
  echo "wrk already installed: $(command -v wrk)"
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "no apt-get here: install wrk with your package manager, or let the benchmark use its built-in generator" >&2
  exit 1
fi
sudo=
if [ "$(id -u)" != 0 ]; then sudo=sudo; fi
$sudo apt-get update -qq
$sudo apt-get install -y -qq wrk
command -v pgbench >/dev/null 2>&1 || echo "pgbench is missing too: apt-get install postgresql-client" >&2
