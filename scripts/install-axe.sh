#!/usr/bin/env bash
# Installs the pinned axe-core (the accessibility rules engine) from npm into
# .demo/axe-core-VERSION, outside git, unless it is there, and prints the path
# of its axe.min.js. The console's browser test (e2e/console_test.go) injects
# that file into each page and fails on a serious or critical violation.
set -euo pipefail
version=${1:?usage: install-axe.sh VERSION}
root=$(cd "$(dirname "$0")/.." && pwd)
dir="$root/.demo/axe-core-$version"
js="$dir/node_modules/axe-core/axe.min.js"
if [ ! -f "$js" ]; then
  command -v npm >/dev/null || { echo "install-axe.sh: npm is needed to install axe-core $version" >&2; exit 1; }
  mkdir -p "$dir"
  echo "installing axe-core $version into $dir" >&2
  npm install --prefix "$dir" --no-save --no-audit --no-fund --ignore-scripts "axe-core@$version" >&2
fi
[ -f "$js" ] || { echo "install-axe.sh: $js is missing after npm install" >&2; exit 1; }
echo "$js"
