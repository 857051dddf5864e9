package broker

import (
	"context"
	"flag"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/scorer/scorer/internal/cli"
	"github.com/scorer/scorer/internal/config"
	"github.com/scorer/scorer/producer"
)

// Options describes an in-memory Kafka-protocol broker (franz-go's
// kfake): real Kafka wire protocol, consumer groups and offsets, no
// durability unless DataDir is set.
type Options struct {
	Addr       string // host:port to listen on; port 0 picks a free one
	Partitions int
	// Topics are created at start, with max.message.bytes set to
	// MaxMessageBytes when that is set (kfake reports its default for a
	// topic without its own, whatever the broker's message.max.bytes, and
	// the scorer sizes its records to what a topic reports).
	Topics  []string
	DataDir string // persist to this folder and reload on restart; empty = memory only
	// MaxMessageBytes is the broker's message.max.bytes; 0 keeps kfake's
	// default (about 1 MiB), which is smaller than the scorer's input limit.
	MaxMessageBytes int
}

// Start starts the broker and returns it with its listen address.
func Start(o Options) (*kfake.Cluster, string, error) {
	host, portStr, err := net.SplitHostPort(o.Addr)
	if err != nil {
		return nil, "", fmt.Errorf("broker: address %q: %w", o.Addr, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, "", fmt.Errorf("broker: port %q: %w", portStr, err)
	}
	opts := []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.Ports(port),
		kfake.AllowAutoTopicCreation(),
		kfake.DefaultNumPartitions(o.Partitions),
		kfake.ListenFn(func(network, _ string) (net.Listener, error) {
			return net.Listen(network, net.JoinHostPort(host, strconv.Itoa(port)))
		}),
	}
	if o.DataDir != "" {
		opts = append(opts, kfake.DataDir(o.DataDir))
	}
	if o.MaxMessageBytes > 0 {
		opts = append(opts, kfake.BrokerConfigs(map[string]string{"message.max.bytes": strconv.Itoa(o.MaxMessageBytes)}))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		return nil, "", fmt.Errorf("broker: start: %w", err)
	}
	addrs := c.ListenAddrs()
	if len(addrs) == 0 {
		c.Close()
		return nil, "", fmt.Errorf("broker: no listen address")
	}
	if len(o.Topics) > 0 {
		specs := make([]producer.TopicSpec, len(o.Topics))
		for i, t := range o.Topics {
			specs[i] = producer.TopicSpec{Name: t, Partitions: o.Partitions}
			if o.MaxMessageBytes > 0 {
				specs[i].Configs = map[string]string{"max.message.bytes": strconv.Itoa(o.MaxMessageBytes)}
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), producer.EnsureTopicsAttemptTimeout)
		defer cancel()
		if err := producer.EnsureTopics(ctx, addrs[:1], nil, specs...); err != nil {
			c.Close()
			return nil, "", fmt.Errorf("broker: create topics: %w", err)
		}
	}
	return c, addrs[0], nil
}

// Spec is `scorer broker` for its help and the docs.
var Spec = cli.Spec{
	Name: "broker", Synopsis: "[--addr 127.0.0.1:9092] [flags]",
	Summary: "run an in-memory Kafka-protocol broker (not durable) for development and tests",
	About: "An in-memory Kafka-protocol broker (franz-go's kfake): the real wire protocol, consumer groups and " +
		"offsets, nothing durable unless --data-dir is set. It prints \"broker listening on ADDR\" on stdout once " +
		"it listens and serves until SIGINT/SIGTERM. For development, tests and crash drills; reads no settings.",
	Settings: config.Broker,
	Flags:    func(fs *flag.FlagSet) { new(brokerFlags).register(fs) },
}

// brokerFlags are `scorer broker`'s flags.
type brokerFlags struct {
	addr, topics, dataDir, logLevel string
	partitions, maxMessage          int
}

func (f *brokerFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.addr, "addr", "127.0.0.1:9092", "listen address (port 0 = any free port)")
	fs.IntVar(&f.partitions, "partitions", 6, "partitions of the topics it creates, at start and on first use")
	fs.StringVar(&f.topics, "topics", "transcripts,transcripts.scored,transcripts.dlq", "comma-separated topics to create at start (others are created on first use)")
	fs.StringVar(&f.dataDir, "data-dir", "", "persist the log to this folder (kept across restarts); empty = memory only")
	fs.IntVar(&f.maxMessage, "max-message-bytes", 128<<20, "the broker's message.max.bytes, and max.message.bytes of the --topics it creates (the scorer needs about 71 MB on its output topic at its default limits)")
	fs.StringVar(&f.logLevel, "log-level", "info", "least level logged: debug, info, warn or error")
}

// Command is `scorer broker`: an in-memory Kafka-protocol broker (not
// durable) that serves until ctx is cancelled, for development and tests.
func Command(ctx context.Context, e cli.Env, args []string) error {
	fs := Spec.FlagSet(e)
	var f brokerFlags
	f.register(fs)
	if err := Spec.Parse(fs, args); err != nil {
		return err
	}
	log, err := cli.NewLogger(e.Stderr, f.logLevel, "auto")
	if err != nil {
		return err
	}
	topics := config.SplitList(f.topics, ",")
	c, listen, err := Start(Options{Addr: f.addr, Partitions: f.partitions, Topics: topics, DataDir: f.dataDir, MaxMessageBytes: f.maxMessage})
	if err != nil {
		return err
	}
	defer c.Close()
	// One plain line on stdout, for scripts and tests to read the address.
	fmt.Fprintf(e.Stdout, "broker listening on %s\n", listen)
	durability := "in memory only: data is lost when this process exits"
	if f.dataDir != "" {
		durability = "persisted to " + f.dataDir
	}
	log.Info().Str("addr", listen).Str("topics", strings.Join(topics, ",")).
		Int("partitions", f.partitions).Str("durability", durability).
		Msgf("in-memory Kafka broker ready; try: kcat -b %s -L", listen)
	<-ctx.Done()
	log.Info().Msg("broker stopping")
	return nil
}
