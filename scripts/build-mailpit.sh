#!/usr/bin/env bash
# Builds the pinned Mailpit (the demo's SMTP server, with its web UI and an
# API listing what it received) into .demo/bin unless that version is
# already there, and prints the binary's absolute path. Progress and errors
# go to stderr, so a caller can take the path with $(...).
#
#   scripts/build-mailpit.sh v1.33.1
#
# `go install github.com/axllent/mailpit@VERSION` gives a Mailpit whose web
# UI is blank: the UI's JavaScript and CSS (server/ui/dist) are compiled by
# npm and are not part of the Go module, so the page loads and its
# /dist/app.js and /dist/app.css answer 404. The Go module does carry the
# UI's sources, package.json and package-lock.json, so this script builds
# the way Mailpit's own Dockerfile does: `npm ci`, `npm run build`, then
# `go build`, which embeds the compiled assets. It needs Go, Node.js 20.19
# or later and npm; it reaches only the Go module proxy and the npm
# registry. The first build takes a few minutes; later calls return at
# once. Callers running at the same time (make demo and make test) share
# one build: a lock makes the second wait for the first.
#
# BUILD_MAILPIT_DIR overrides where the binary is kept (default .demo).
set -euo pipefail
cd "$(dirname "$0")/.."

want=${1:?usage: build-mailpit.sh VERSION (as in scripts/demo.env: MAILPIT_VERSION)}
module=github.com/axllent/mailpit
state=$(mkdir -p "${BUILD_MAILPIT_DIR:-.demo}" && cd "${BUILD_MAILPIT_DIR:-.demo}" && pwd)
# The version is in the name and the binary is moved there only once it is
# complete, so a file under this name is always a finished build of $want.
bin="$state/bin/mailpit-$want"
[ -x "$bin" ] && { echo "$bin"; exit 0; }

fail() {
  echo "build-mailpit.sh: $*" >&2
  exit 1
}

# A missing or old tool is named before anything is downloaded.
for tool in go node npm; do
  command -v "$tool" >/dev/null || fail "$tool is not installed; building Mailpit $want needs Go, Node.js (20.19 or later) and npm (on Debian: apt-get install nodejs npm)"
done
# Mailpit's build tools (esbuild, vue-router 5, sass) declare Node.js
# ^20.19 || >=22.12; older versions fail part-way with obscure errors.
node -e '
  const [maj, min] = process.versions.node.split(".").map(Number);
  process.exit(maj > 20 || (maj === 20 && min >= 19) ? 0 : 1);
' || fail "Node.js $(node --version) is too old: Mailpit's UI build needs 20.19 or later"

mkdir -p "$state/bin"
exec 9>"$state/mailpit-build.lock"
if ! flock -n 9; then
  echo "another Mailpit build is running; waiting for it" >&2
  flock 9
fi
# The build that held the lock may have finished it.
[ -x "$bin" ] && { echo "$bin"; exit 0; }

start=$SECONDS
echo "building Mailpit $want with its web UI into $state/bin (a few minutes, once)" >&2

# The module cache is read-only and shared, so the build runs in a copy.
dir=$(GOWORK=off GOFLAGS=-mod=mod go mod download -json "$module@$want" |
  sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p') ||
  fail "go mod download $module@$want failed (is the Go module proxy reachable? GOPROXY=$(go env GOPROXY))"
[ -n "$dir" ] && [ -f "$dir/package-lock.json" ] ||
  fail "$module@$want has no package-lock.json in $dir; this script expects Mailpit's UI sources in its Go module"
src="$state/mailpit-src-$want"
rm -rf "$src"
cp -R "$dir" "$src"
chmod -R u+w "$src"

cd "$src"
# Mailpit's lock names two packages that the npm registry this project's
# machines reach does not serve:
#  - sass-embedded 1.108.1, an optional peer of esbuild-sass-plugin. The
#    plugin compiles with the plain `sass` package unless told otherwise, so
#    --omit=peer leaves it (and eslint's peer-only parser) out.
#  - rapidoc 12, which only the API reference page (/api/v1/) imports; the
#    newest the registry serves is 9.3.8, whose <rapi-doc> element that
#    page uses works the same.
# Each entry of $substitutes is used only when the locked version is not
# served (one `npm view`), so a registry that has it gets the exact lock.
substitutes=(rapidoc=9.3.8)
changed=()
for sub in "${substitutes[@]}"; do
  name=${sub%%=*}
  locked=$(node -p "(require('./package-lock.json').packages['node_modules/$name'] || {}).version || ''")
  [ -n "$locked" ] || continue
  if [ -z "$(npm view "$name@$locked" version 2>/dev/null)" ]; then
    echo "the npm registry does not serve $name@$locked (Mailpit's lock); using $name@${sub#*=}" >&2
    npm pkg set "dependencies.$name=${sub#*=}"
    changed+=("$name")
  fi
done
# --ignore-scripts: the build needs no package's install script (esbuild
# and sass find their platform binaries in their optional dependencies),
# and none gets to run code or fetch anything outside the registry.
npm_flags=(--ignore-scripts --omit=peer --no-audit --no-fund --loglevel=error)
if [ ${#changed[@]} = 0 ]; then
  echo "npm ci (Mailpit's locked UI dependencies)" >&2
  npm ci "${npm_flags[@]}" >&2 ||
    fail "npm ci failed in $src (is the npm registry reachable? registry: $(npm config get registry))"
else
  # npm install starts from the lock and re-resolves only what changed.
  echo "npm install (Mailpit's locked UI dependencies, but ${changed[*]})" >&2
  cp package-lock.json package-lock.mailpit.json
  npm install "${npm_flags[@]}" >&2 ||
    fail "npm install failed in $src (is the npm registry reachable? registry: $(npm config get registry))"
  # Every other package must still be at the version Mailpit locked.
  node -e '
    const [locked, got] = ["./package-lock.mailpit.json", "./package-lock.json"].map((f) => require(f).packages);
    const changed = process.argv.slice(1);
    const moved = Object.keys(locked).filter((k) => k in got && got[k].version !== locked[k].version &&
      !changed.some((n) => k === "node_modules/" + n));
    if (moved.length) { console.error("npm install moved packages off Mailpit'"'"'s lock: " + moved.join(", ")); process.exit(1); }
  ' "${changed[@]}" || fail "npm install in $src changed more than ${changed[*]}"
fi
echo "npm run build (the UI's JavaScript and CSS into server/ui/dist)" >&2
npm run build >&2 || fail "npm run build failed in $src"
for asset in app.js app.css; do
  [ -s "server/ui/dist/$asset" ] || fail "npm run build left no server/ui/dist/$asset in $src"
done

echo "go build (the UI assets are embedded)" >&2
# Flags as Mailpit's Dockerfile: static, and `mailpit version` names the
# release. -buildvcs=false: the copy sits inside this repository, whose
# commit is not Mailpit's.
CGO_ENABLED=0 GOWORK=off GOFLAGS=-mod=readonly go build -trimpath -buildvcs=false \
  -ldflags "-s -w -X $module/config.Version=$want" -o "$bin.tmp" . ||
  fail "go build of Mailpit $want failed in $src"
mv -f "$bin.tmp" "$bin"

# node_modules alone is a few hundred megabytes; npm keeps the downloaded
# packages in its own cache, so a rebuild does not fetch them again.
cd "$state"
rm -rf "$src"
echo "built Mailpit $want in $((SECONDS - start))s: $bin" >&2
echo "$bin"
