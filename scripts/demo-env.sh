# Sets up a shell to run docs/runbook.md's commands against the demo that
# `make demo` (scripts/demo.sh) runs. Source it, from the repository's root,
# in the shell you paste the commands into (bash or zsh):
#
#   . scripts/demo-env.sh
#
# It puts .demo/bin (where the demo builds orders and notifier) on PATH,
# makes `orders` and `notifier` find their own service (each gets
# ADMIN_API_URL from ORDERS_URL or NOTIFIER_URL) and exports the runbook's
# variables with the demo's values. The demo's settings come from the same
# place as demo.sh's: the environment, else scripts/demo.env. Nothing here
# is read from another environment: ORDERS_URL and the others are always
# the demo's, so a shell set up for production is not used by mistake.
# e2e/runbook_test.go sources this file before every runbook block.

_demo_env() {
  # $0 is the sourced file in zsh; bash names it in BASH_SOURCE.
  local src=${BASH_SOURCE:-$0} root
  case $src in
    */scripts/demo-env.sh) root=$(cd "${src%/scripts/demo-env.sh}" && pwd) ;;
    scripts/demo-env.sh) root=$PWD ;;
    *)
      echo "demo-env.sh: source it as '. scripts/demo-env.sh' from the repository's root" >&2
      return 1
      ;;
  esac
  if [ ! -r "$root/scripts/demo.env" ]; then
    echo "demo-env.sh: $root/scripts/demo.env is missing" >&2
    return 1
  fi

  # setting NAME prints NAME's value: the environment's, else demo.env's.
  setting() {
    local v
    eval "v=\${$1:-}"
    [ -n "$v" ] || v=$(sed -n "s/^$1=//p" "$root/scripts/demo.env")
    printf '%s' "$v"
  }
  local pg
  pg=${DEMO_PG:-postgres://postgres@127.0.0.1:$(setting PG_PORT)}

  case ":$PATH:" in
    *":$root/.demo/bin:"*) ;;
    *) export PATH="$root/.demo/bin:$PATH" ;;
  esac
  export ORDERS_URL="http://127.0.0.1:$(setting ORDERS_PORT)"
  export NOTIFIER_URL="http://127.0.0.1:$(setting NOTIFIER_PORT)"
  # dev-ops is an admin of both services (AUTH_TOKENS in demo.env); the
  # second admin a replay needs is dev-ops2.
  export ADMIN_API_TOKEN=dev-ops
  export ORDERS_DATABASE_URL="$pg/orders?sslmode=disable"
  export NOTIFIER_DATABASE_URL="$pg/notifier?sslmode=disable"
  # The maintenance database the restore procedure connects to.
  export ADMIN_URL="$pg/postgres?sslmode=disable"
  unset -f setting

  if [ ! -x "$root/.demo/bin/orders" ]; then
    echo "demo-env.sh: no $root/.demo/bin/orders yet: start the demo (make demo) to build it" >&2
  fi
}

# Both CLIs read ADMIN_API_URL; in one shell each needs its own service's.
orders() { ADMIN_API_URL=$ORDERS_URL command orders "$@"; }
notifier() { ADMIN_API_URL=$NOTIFIER_URL command notifier "$@"; }

_demo_env
unset -f _demo_env
