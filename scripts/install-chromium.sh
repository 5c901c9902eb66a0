#!/usr/bin/env bash
# Installs Debian's chromium package unless /usr/bin/chromium is there. The
# web UI test (e2e/mailpit_ui_test.go) drives it headless to check that the
# demo's Mailpit renders the notifier's emails. It is the distribution's
# browser, from the distribution's package archive: nothing downloads a
# browser build of its own.
#
# Needs root, or sudo without a password; otherwise it says what to run.
set -euo pipefail

want=/usr/bin/chromium
[ -x "$want" ] && exit 0

if ! command -v apt-get >/dev/null; then
  echo "install-chromium.sh: $want is missing and there is no apt-get here; install Chromium with your system's package manager so that $want exists" >&2
  exit 1
fi
sudo=
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    sudo=sudo
  else
    echo "install-chromium.sh: $want is missing; run as root: apt-get update && apt-get install -y chromium" >&2
    exit 1
  fi
fi

echo "installing Debian's chromium package (for the Mailpit web UI test)" >&2
export DEBIAN_FRONTEND=noninteractive
# An install right after a machine is laid out finds no package lists; an
# update is needed first.
$sudo apt-get update -q >&2
$sudo apt-get install -y -q --no-install-recommends chromium >&2
[ -x "$want" ] || { echo "install-chromium.sh: apt-get installed chromium but $want is missing" >&2; exit 1; }
