// Command devbroker runs a single-node, Kafka-compatible broker for local
// development and demos: franz-go's kfake, speaking the Kafka wire
// protocol, so the orders relay, the notifier and kcat talk to it as to a
// real cluster. It is not a production broker: no replication, no
// security, one process.
//
//	devbroker [-addr 127.0.0.1:9092] [-data-dir DIR]
//
// Environment (flags win):
//
//	DEVBROKER_ADDR              listen address (default 127.0.0.1:9092)
//	DEVBROKER_DATA_DIR          persist topics and records here, so the demo
//	                            survives restarts (default: in memory)
//	DEVBROKER_MESSAGE_MAX_BYTES broker message.max.bytes (default 1048588)
//	DEVBROKER_IDLE_TIMEOUT      close a connection that sent nothing for this
//	                            long (default 2m, as Kafka's
//	                            connections.max.idle.ms does after 10m)
//	ORDERS_TOPIC                topic to create (default orders.events)
//	ORDERS_TOPIC_PARTITIONS     its partitions (default 6, as the relay)
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxref/orders/internal/envconfig"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, nil); err != nil {
		fmt.Fprintln(os.Stderr, "devbroker:", err)
		os.Exit(1)
	}
}

// config is the broker's settings, from the environment and flags.
type config struct {
	Addr            string
	DataDir         string
	Topic           string
	Partitions      int
	MessageMaxBytes int
	// IdleTimeout closes a client connection that has sent no byte for this
	// long. Without it, every connection opened and abandoned (a crashed
	// client, a port scan, a hostile peer) would be kept, with its buffers,
	// until the broker stops. Real clients send requests or heartbeats far
	// more often, and franz-go closes its own idle connections after 20s.
	IdleTimeout time.Duration
}

func loadConfig(args []string, getenv func(string) string, stdout io.Writer) (config, error) {
	r := envconfig.New(getenv)
	c := config{
		Addr:            r.String("DEVBROKER_ADDR", "127.0.0.1:9092"),
		DataDir:         r.String("DEVBROKER_DATA_DIR", ""),
		Topic:           r.String("ORDERS_TOPIC", "orders.events"),
		Partitions:      r.Int("ORDERS_TOPIC_PARTITIONS", 6, 1, 10000),
		MessageMaxBytes: r.Int("DEVBROKER_MESSAGE_MAX_BYTES", 1048588, 1024, 1<<30),
		IdleTimeout:     r.Duration("DEVBROKER_IDLE_TIMEOUT", 2*time.Minute),
	}
	fs := flag.NewFlagSet("devbroker", flag.ContinueOnError)
	fs.SetOutput(stdout)
	fs.StringVar(&c.Addr, "addr", c.Addr, "listen address host:port (DEVBROKER_ADDR)")
	fs.StringVar(&c.DataDir, "data-dir", c.DataDir, "directory to persist the broker's state in (DEVBROKER_DATA_DIR)")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if _, port, err := net.SplitHostPort(c.Addr); err != nil {
		r.Fail("DEVBROKER_ADDR=%q: want host:port", c.Addr)
	} else if _, err := strconv.Atoi(port); err != nil {
		r.Fail("DEVBROKER_ADDR=%q: the port must be a number", c.Addr)
	}
	if c.IdleTimeout < time.Second {
		r.Fail("DEVBROKER_IDLE_TIMEOUT=%s: want at least 1s", c.IdleTimeout)
	}
	if err := r.Err(); err != nil {
		return config{}, fmt.Errorf("invalid configuration:\n%w", err)
	}
	return c, nil
}

// idleListener hands out connections that fail a read, and so are closed
// by the broker, once their peer has sent nothing for timeout.
type idleListener struct {
	net.Listener
	timeout time.Duration
}

func (l idleListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return idleConn{Conn: c, timeout: l.timeout}, nil
}

type idleConn struct {
	net.Conn
	timeout time.Duration
}

// Read waits at most timeout for the peer's next bytes. The broker reads
// one request at a time, so a read that times out means the client has
// been silent for that long between requests.
func (c idleConn) Read(b []byte) (int, error) {
	if err := c.SetReadDeadline(time.Now().Add(c.timeout)); err != nil {
		return 0, err
	}
	return c.Conn.Read(b)
}

// run starts the broker, makes sure the topic exists, reports the address
// on ready (tests use it), and serves until ctx ends.
func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer, ready func(addr string)) error {
	cfg, err := loadConfig(args, getenv, stdout)
	if err != nil {
		return err
	}
	_, portStr, _ := net.SplitHostPort(cfg.Addr)
	port, _ := strconv.Atoi(portStr)
	opts := []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.Ports(port),
		// kfake listens on 127.0.0.1 by default; this honours the host of
		// DEVBROKER_ADDR. Clients are told the address actually bound.
		kfake.ListenFn(func(network, _ string) (net.Listener, error) {
			l, err := net.Listen(network, cfg.Addr)
			if err != nil {
				return nil, err
			}
			return idleListener{Listener: l, timeout: cfg.IdleTimeout}, nil
		}),
		kfake.ClusterID("devbroker"),
		kfake.SeedTopics(int32(cfg.Partitions), cfg.Topic),
		kfake.BrokerConfigs(map[string]string{"message.max.bytes": strconv.Itoa(cfg.MessageMaxBytes)}),
	}
	if cfg.DataDir != "" {
		opts = append(opts, kfake.DataDir(cfg.DataDir))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		return fmt.Errorf("start broker on %s: %w", cfg.Addr, err)
	}
	defer c.Close() // with a data dir, Close syncs the segments to disk

	addr := c.ListenAddrs()[0]
	// A restart from a data dir reloads the saved state and seeds nothing,
	// so the topic is created here if it is missing.
	if err := ensureTopic(ctx, addr, cfg.Topic, cfg.Partitions); err != nil {
		return err
	}
	store := "in memory (lost on exit)"
	if cfg.DataDir != "" {
		store = "persisted in " + cfg.DataDir
	}
	fmt.Fprintf(stdout, "devbroker: Kafka protocol on %s, topic %s with %d partitions, %s\n", addr, cfg.Topic, cfg.Partitions, store)
	fmt.Fprintf(stdout, "devbroker: watch the events with:\n  kcat -b %s -C -t %s -o beginning -f 'p%%p@%%o key=%%k headers=%%h\\n%%s\\n\\n'\n", addr, cfg.Topic)
	if ready != nil {
		ready(addr)
	}
	<-ctx.Done()
	fmt.Fprintln(stdout, "devbroker: stopping")
	return nil
}

func ensureTopic(ctx context.Context, addr, topic string, partitions int) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		return err
	}
	defer cl.Close()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = kadm.NewClient(cl).CreateTopic(cctx, int32(partitions), 1, nil, topic)
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		return fmt.Errorf("create topic %s: %w", topic, err)
	}
	return nil
}
