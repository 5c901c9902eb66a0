#!/usr/bin/env bash
# Runs the whole chain on this machine: a dev Kafka broker, the orders
# service (API + embedded relay), the notifier and an SMTP sink. It needs Go
# and a PostgreSQL server (DEMO_PG, default 127.0.0.1:5432 as postgres).
# Ctrl-C stops everything; state is kept in .demo/ (delete it to start over).
set -euo pipefail
cd "$(dirname "$0")/.."

PG=${DEMO_PG:-postgres://postgres@127.0.0.1:5432}
ORDERS_PORT=${ORDERS_PORT:-8080}
NOTIFIER_PORT=${NOTIFIER_PORT:-8081}
BROKER=${KAFKA_BROKERS:-127.0.0.1:9092}
SMTP_PORT=${SMTP_PORT:-1025}
MAIL_UI_PORT=${MAIL_UI_PORT:-8025}
export AUTH_TOKENS=${AUTH_TOKENS:-dev-alice=alice:customer,dev-bob=bob:customer,dev-ops=ops:admin,dev-ops2=ops2:admin,dev-notifier=notifier:service}
export ORDERS_TOPIC=${ORDERS_TOPIC:-orders.events}
export ORDERS_TOPIC_PARTITIONS=${ORDERS_TOPIC_PARTITIONS:-6}
export KAFKA_BROKERS=$BROKER

state=.demo
mkdir -p "$state/bin" "$state/logs" "$state/kafka"

if ! command -v pg_isready >/dev/null || ! pg_isready -q -d "$PG/postgres"; then
  echo "PostgreSQL is not reachable at $PG." >&2
  echo "Start it (for example: pg_ctlcluster --skip-systemctl-redirect 15 main start) or set DEMO_PG." >&2
  exit 1
fi

echo "building binaries into $state/bin"
go build -o "$state/bin/" ./cmd/...

pids=()
rm -f "$state/stopping"
cleanup() {
  trap - INT TERM EXIT
  echo; echo "stopping demo"
  touch "$state/stopping"
  for ((i=${#pids[@]}-1; i>=0; i--)); do
    pkill -TERM -P "${pids[i]}" 2>/dev/null || true
    kill "${pids[i]}" 2>/dev/null || true
  done
  wait 2>/dev/null || true
  rm -f "$state/stopping"
}
trap cleanup INT TERM EXIT

# supervise runs a service and restarts it whenever it exits, like a
# container with a restart policy: kill -9 any of them to watch the outbox
# and the inbox recover.
supervise() { # name, command...
  local name=$1; shift
  while [ ! -e "$state/stopping" ]; do
    "$@" >>"$state/logs/$name.log" 2>&1 || true
    [ -e "$state/stopping" ] && break
    echo "$(date +%T) $name exited; restarting it (log $state/logs/$name.log)"
    sleep 1
  done
}

start() { # name, command...
  supervise "$@" &
  pids+=($!)
  echo "started $1 (log $state/logs/$1.log)"
}

wait_http() { # url, name
  for _ in $(seq 1 100); do curl -fsS -o /dev/null "$1" 2>/dev/null && return 0; sleep 0.2; done
  echo "$2 did not come up; see $state/logs/$2.log" >&2; exit 1
}

wait_port() { # host:port, name
  for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/${1%:*}/${1##*:}") 2>/dev/null && return 0; sleep 0.2; done
  echo "$2 did not come up; see $state/logs/$2.log" >&2; exit 1
}

start devbroker env DEVBROKER_ADDR="$BROKER" DEVBROKER_DATA_DIR="$state/kafka" "$state/bin/devbroker"
wait_port "$BROKER" devbroker

start mailsink env MAILSINK_SMTP_ADDR="127.0.0.1:$SMTP_PORT" MAILSINK_HTTP_ADDR="127.0.0.1:$MAIL_UI_PORT" "$state/bin/mailsink"
wait_port "127.0.0.1:$SMTP_PORT" mailsink

DATABASE_URL="$PG/orders?sslmode=disable" "$state/bin/orders" migrate
start orders env DATABASE_URL="$PG/orders?sslmode=disable" HTTP_ADDR="127.0.0.1:$ORDERS_PORT" "$state/bin/orders" serve
wait_http "http://127.0.0.1:$ORDERS_PORT/readyz" orders

DATABASE_URL="$PG/notifier?sslmode=disable" "$state/bin/notifier" migrate
start notifier env DATABASE_URL="$PG/notifier?sslmode=disable" HTTP_ADDR="127.0.0.1:$NOTIFIER_PORT" \
  SMTP_ADDR="127.0.0.1:$SMTP_PORT" ORDERS_API_URL="http://127.0.0.1:$ORDERS_PORT" ORDERS_API_TOKEN=dev-notifier \
  KAFKA_INSTANCE_ID=notifier-demo "$state/bin/notifier" serve
wait_http "http://127.0.0.1:$NOTIFIER_PORT/readyz" notifier

cat <<MSG

The demo is running.
  Orders API     http://127.0.0.1:$ORDERS_PORT   (tokens: dev-alice, dev-bob, dev-ops, dev-ops2, dev-notifier)
  Notifier       http://127.0.0.1:$NOTIFIER_PORT/metrics
  Emails         http://127.0.0.1:$MAIL_UI_PORT   (SMTP on 127.0.0.1:$SMTP_PORT)
  Kafka          $BROKER, topic $ORDERS_TOPIC
  Logs           $state/logs/

Place an order:
  curl -si -X POST http://127.0.0.1:$ORDERS_PORT/orders -H 'Authorization: Bearer dev-alice' \\
    -H 'Content-Type: application/json' \\
    -d '{"email":"alice@example.com","currency":"EUR","items":[{"sku":"BOOK-1","quantity":2,"unit_price_cents":1250}]}'

Watch the events (kcat; on Debian: apt-get install kcat):
  kcat -C -b $BROKER -t $ORDERS_TOPIC -f 'partition %p offset %o key %k\nheaders %h\n%s\n\n'

Crash it: every service is restarted when it exits, so try
  pkill -9 -f '$state/bin/orders serve'
while orders are being created; no committed event is lost (check the outbox
and the topic).

Press Ctrl-C to stop.
MSG

wait
