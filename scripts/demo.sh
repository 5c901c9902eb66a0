#!/usr/bin/env bash
# Runs the whole chain on this machine: a dev Kafka broker, the orders
# service (API + embedded relay), the notifier and Mailpit (an SMTP server
# with a web UI and an API listing what it received). It needs Go, Node.js
# and npm (to build Mailpit's web UI, once: scripts/build-mailpit.sh) and a
# PostgreSQL server (DEMO_PG, default postgres://postgres@127.0.0.1:$PG_PORT).
# Defaults are in scripts/demo.env; the environment overrides them.
#
# Ctrl-C stops everything and exits 0: it is how a demo ends, not an
# error. Kept in .demo/: the binaries, the logs, the broker's topic and
# Mailpit's messages; the orders and notifier databases stay in
# PostgreSQL. .demo/NAME.pid names each service's current process.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each default of demo.env that the environment does not set.
while IFS= read -r line || [ -n "$line" ]; do
  case $line in '' | '#'*) continue ;; esac
  key=${line%%=*}
  [ -n "${!key:-}" ] || printf -v "$key" '%s' "${line#*=}"
done <scripts/demo.env

PG=${DEMO_PG:-postgres://postgres@127.0.0.1:$PG_PORT}
BROKER=127.0.0.1:$BROKER_PORT
export AUTH_TOKENS ORDERS_TOPIC ORDERS_TOPIC_PARTITIONS
export KAFKA_BROKERS=$BROKER
state=.demo

# The ports first: a clash found after some services started would leave
# half a demo running.
busy=0
for name in ORDERS_PORT NOTIFIER_PORT BROKER_PORT SMTP_PORT MAIL_UI_PORT; do
  port=${!name}
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "port $port ($name) is already in use on 127.0.0.1: stop what listens there (ss -ltnp 'sport = :$port') or set $name to a free port" >&2
    busy=1
  fi
done
[ "$busy" = 0 ] || exit 1

if ! command -v pg_isready >/dev/null || ! pg_isready -q -d "$PG/postgres"; then
  echo "PostgreSQL is not reachable at $PG." >&2
  echo "Start it (for example: pg_ctlcluster --skip-systemctl-redirect 15 main start) or set DEMO_PG." >&2
  exit 1
fi

mkdir -p "$state/bin" "$state/logs" "$state/kafka"
echo "building binaries into $state/bin"
go build -o "$state/bin/" ./cmd/...
# The build prints its own error (and leaves no binary) when it fails.
mailpit=$(scripts/build-mailpit.sh "$MAILPIT_VERSION")

pids=()
rm -f "$state/stopping"
cleanup() {
  # A second Ctrl-C must not cut the orderly stop short and leave services
  # running without their supervisors; nor may a closed output (make demo |
  # tee, whose tee the same Ctrl-C ended), so the message may go nowhere.
  trap '' INT TERM HUP PIPE
  trap - EXIT
  [ ${#pids[@]} -gt 0 ] || return 0
  { echo; echo "stopping demo (each service finishes its work in hand; a few seconds)"; } 2>/dev/null || true
  touch "$state/stopping"
  # Newest first: the notifier and orders finish their work (the relay
  # flushes to the broker) before the broker and Mailpit stop.
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill -TERM "${pids[i]}" 2>/dev/null || true
    wait "${pids[i]}" 2>/dev/null || true
  done
  rm -f "$state/stopping"
}
# Ctrl-C is the way to stop the demo, so it exits 0 (make would otherwise
# end it with "Error 130"); TERM and HUP come from elsewhere and keep the
# conventional 128+signal status.
trap 'cleanup; exit 0' INT
trap 'cleanup; exit 143' TERM
trap 'cleanup; exit 129' HUP
trap cleanup EXIT

# Each service runs in a session of its own (setsid, where there is one),
# so Ctrl-C reaches only this script, which stops them in that order.
detach=
if command -v setsid >/dev/null; then detach=setsid; fi

# supervise runs a service and starts it again whenever it exits, like a
# container with a restart policy: kill -9 any of them to watch the outbox
# and the inbox recover. $state/NAME.pid always names the running process
# (setsid execs it in place), so that is the one a kill reaches. On TERM it
# stops the service, waits for it, and returns.
supervise() { # name, command...
  local name=$1
  shift
  local child='' stop='' status=0
  trap '' INT
  trap 'stop=1; [ -z "$child" ] || kill -TERM "$child" 2>/dev/null || true' TERM
  while :; do
    $detach "$@" >>"$state/logs/$name.log" 2>&1 &
    child=$!
    echo "$child" >"$state/$name.pid"
    # A TERM that came before $child was set stopped the previous process.
    [ -z "$stop" ] || kill -TERM "$child" 2>/dev/null || true
    # wait returns early when the trap runs; the service is then still
    # shutting down, so wait again until it is gone.
    while kill -0 "$child" 2>/dev/null; do
      status=0
      wait "$child" 2>/dev/null || status=$?
    done
    [ -z "$stop" ] && [ ! -e "$state/stopping" ] || break
    echo "$(date +%T) $name exited (status $status); restarting it (log $state/logs/$name.log)"
    sleep 1
    [ -z "$stop" ] || break
  done
  rm -f "$state/$name.pid"
}

start() { # name, command...
  supervise "$@" &
  pids+=($!)
  echo "started $1 (log $state/logs/$1.log, pid file $state/$1.pid)"
}

wait_http() { # url, name
  for _ in $(seq 1 100); do curl -fsS -o /dev/null "$1" 2>/dev/null && return 0; sleep 0.2; done
  echo "$2 did not come up; see $state/logs/$2.log" >&2
  exit 1
}

wait_port() { # host:port, name
  for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/${1%:*}/${1##*:}") 2>/dev/null && return 0; sleep 0.2; done
  echo "$2 did not come up; see $state/logs/$2.log" >&2
  exit 1
}

start devbroker env DEVBROKER_ADDR="$BROKER" DEVBROKER_DATA_DIR="$state/kafka" "$state/bin/devbroker"
wait_port "$BROKER" devbroker

start mailpit "$mailpit" --smtp "127.0.0.1:$SMTP_PORT" --listen "127.0.0.1:$MAIL_UI_PORT" \
  --database "$state/mailpit.db" --disable-version-check
wait_http "http://127.0.0.1:$MAIL_UI_PORT/readyz" mailpit

DATABASE_URL="$PG/orders?sslmode=disable" "$state/bin/orders" migrate
# The console reaches the notifier's admin API with an admin token, and
# links each email to Mailpit.
start orders env DATABASE_URL="$PG/orders?sslmode=disable" HTTP_ADDR="127.0.0.1:$ORDERS_PORT" \
  CONSOLE_NOTIFIER_URL="http://127.0.0.1:$NOTIFIER_PORT" CONSOLE_NOTIFIER_TOKEN=dev-ops \
  CONSOLE_MAILPIT_URL="http://127.0.0.1:$MAIL_UI_PORT" "$state/bin/orders" serve
wait_http "http://127.0.0.1:$ORDERS_PORT/readyz" orders

DATABASE_URL="$PG/notifier?sslmode=disable" "$state/bin/notifier" migrate
start notifier env DATABASE_URL="$PG/notifier?sslmode=disable" HTTP_ADDR="127.0.0.1:$NOTIFIER_PORT" \
  SMTP_ADDR="127.0.0.1:$SMTP_PORT" ORDERS_API_URL="http://127.0.0.1:$ORDERS_PORT" ORDERS_API_TOKEN=dev-notifier \
  KAFKA_INSTANCE_ID=notifier-demo "$state/bin/notifier" serve
wait_http "http://127.0.0.1:$NOTIFIER_PORT/readyz" notifier

cat <<MSG

The demo is running.
  Orders API     http://127.0.0.1:$ORDERS_PORT   (tokens: dev-alice, dev-bob, dev-ops, dev-ops2, dev-notifier)
  Console        http://127.0.0.1:$ORDERS_PORT/console/   (sign in with dev-ops or dev-ops2)
  Notifier       http://127.0.0.1:$NOTIFIER_PORT/metrics
  Emails         http://127.0.0.1:$MAIL_UI_PORT   (Mailpit's web UI; API /api/v1/messages; SMTP on 127.0.0.1:$SMTP_PORT)
  Kafka          $BROKER, topic $ORDERS_TOPIC
  Logs           $state/logs/
  Processes      $state/*.pid

Place an order:
  curl -si -X POST http://127.0.0.1:$ORDERS_PORT/orders -H 'Authorization: Bearer dev-alice' \\
    -H 'Content-Type: application/json' -H "Idempotency-Key: \$(cat /proc/sys/kernel/random/uuid)" \\
    -d '{"email":"alice@example.com","currency":"EUR","items":[{"sku":"BOOK-1","quantity":2,"unit_price_cents":1250}]}'

Watch the events (kcat; on Debian: apt-get install kcat):
  kcat -C -b $BROKER -t $ORDERS_TOPIC -f 'partition %p offset %o key %k\nheaders %h\n%s\n\n'

Operate it with the runbook's commands (docs/runbook.md): in another shell,
from $PWD, first run
  . scripts/demo-env.sh
It puts $state/bin on PATH and sets ADMIN_API_TOKEN, ORDERS_URL, NOTIFIER_URL
and the rest for this demo (set the same *_PORT variables there if you
changed any here). Then, for example: orders admin stats

Crash it: every service is restarted when it exits, so try
  kill -9 "\$(cat $state/orders.pid)"
while orders are being created; no committed event is lost (check the outbox
and the topic). Events the killed relay had in flight go out again once its
partitions' leases expire (RELAY_LEASE, 30s by default).

Press Ctrl-C to stop.
MSG

wait
