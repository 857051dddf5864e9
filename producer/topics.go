package producer

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
)

// TopicSpec describes a topic EnsureTopics creates when it is missing.
type TopicSpec struct {
	Name string
	// Partitions defaults to 1.
	Partitions int
	// ReplicationFactor is the topic's replica count; 0 or less leaves it
	// to the cluster's default.replication.factor (CreateTopics v4, Kafka
	// 2.4 and later; an older controller is refused with
	// ErrBrokerDefaultUnsupported), which knows its brokers and its
	// min.insync.replicas where the scorer does not.
	ReplicationFactor int
	// Configs are topic configs such as max.message.bytes.
	Configs map[string]string
}

// EnsureTopicsAttemptTimeout bounds one EnsureTopics call when ctx has no
// earlier deadline: a broker that accepts TCP connections and never answers
// would otherwise block it forever.
const EnsureTopicsAttemptTimeout = 10 * time.Second

// EnsureTopics creates the topics that do not exist yet and leaves existing
// ones untouched; it is PrepareTopics with creation on, its limits
// discarded.
func EnsureTopics(ctx context.Context, brokers []string, dialer *kafka.Dialer, topics ...TopicSpec) error {
	_, err := prepareTopics(ctx, EnsureTopicsAttemptTimeout, brokers, dialer, true, topics...)
	return err
}

// PrepareTopics readies the topics the scorer writes and reads, and returns
// each one's max.message.bytes: the topic's own setting or the broker
// default it inherits, whichever the cluster reports, so the producer can
// size its records to what the broker accepts.
//
// It reads the cluster's metadata through the first bootstrap broker that
// answers (a dead one is skipped, not waited on), then creates the missing
// topics through the cluster controller when create is set, with their
// Configs (a topic that exists keeps its own: nothing is altered, and no
// CREATE permission is needed when every topic exists), or fails naming
// them when it is not. Reading the limits needs DESCRIBE_CONFIGS on the
// topics.
//
// Errors that retrying cannot fix (the cluster refusing the request as
// invalid, unauthorized or against policy, a failed SASL or TLS handshake,
// a missing topic with create off) are a *SetupError (Permanent); others
// (no broker reachable, a leader or controller not available yet, a
// timeout) may heal, and the caller retries them. dialer may be nil
// (kafka.DefaultDialer). ctx bounds the whole operation, and so does
// EnsureTopicsAttemptTimeout: every connection gets the earlier of the two
// as its I/O deadline and is closed as soon as ctx ends, so cancelling ctx
// (SIGTERM) unblocks it. Once ctx has ended the error wraps ctx.Err() (for
// the attempt timeout, context.DeadlineExceeded).
func PrepareTopics(ctx context.Context, brokers []string, dialer *kafka.Dialer, create bool, topics ...TopicSpec) (map[string]int64, error) {
	return prepareTopics(ctx, EnsureTopicsAttemptTimeout, brokers, dialer, create, topics...)
}

// SetupError is a start-up error retrying cannot fix; Permanent reports
// true, the mark consumer.IsPermanent reads.
type SetupError struct{ Err error }

func (e *SetupError) Error() string   { return e.Err.Error() }
func (e *SetupError) Unwrap() error   { return e.Err }
func (e *SetupError) Permanent() bool { return true }

// prepareTopics is PrepareTopics with the attempt timeout as a parameter.
func prepareTopics(ctx context.Context, timeout time.Duration, brokers []string, dialer *kafka.Dialer, create bool, topics ...TopicSpec) (map[string]int64, error) {
	if len(topics) == 0 {
		return map[string]int64{}, nil
	}
	if len(brokers) == 0 {
		return nil, &SetupError{errors.New("producer: topics: no brokers")}
	}
	cfgs := make([]kafka.TopicConfig, 0, len(topics))
	for _, t := range topics {
		if t.Name == "" {
			return nil, &SetupError{errors.New("producer: topics: empty topic name")}
		}
		rf := t.ReplicationFactor
		if rf <= 0 {
			rf = brokerDefault
		}
		tc := kafka.TopicConfig{Topic: t.Name, NumPartitions: max(t.Partitions, 1), ReplicationFactor: rf}
		for k, v := range t.Configs {
			tc.ConfigEntries = append(tc.ConfigEntries, kafka.ConfigEntry{ConfigName: k, ConfigValue: v})
		}
		cfgs = append(cfgs, tc)
	}
	if dialer == nil {
		dialer = kafka.DefaultDialer
	}
	// WithTimeout keeps ctx's deadline when that is earlier.
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	// Ask first, create only what is missing: on a cluster with ACLs a
	// principal without CREATE is refused even for topics that exist, and
	// an existing topic needs nothing. (Metadata for all topics, because
	// naming them would let a broker with auto.create.topics.enable create
	// them with its defaults instead of ours.)
	view, err := metadata(ctx, dialer, brokers)
	if err != nil {
		return nil, err
	}
	exists := make(map[string]bool, len(view.parts))
	for _, p := range view.parts {
		exists[p.Topic] = true
	}
	cfgs = slices.DeleteFunc(cfgs, func(tc kafka.TopicConfig) bool { return exists[tc.Topic] })
	if len(cfgs) > 0 && !create {
		missing := make([]string, len(cfgs))
		for i, tc := range cfgs {
			missing[i] = tc.Topic
		}
		return nil, &SetupError{fmt.Errorf("producer: topics: %s missing (creating topics is off): %w", strings.Join(missing, ", "), kafka.UnknownTopicOrPartition)}
	}
	if len(cfgs) > 0 {
		if err := createTopics(ctx, dialer, view.controller, cfgs); err != nil {
			return nil, err
		}
	}
	names := make([]string, len(topics))
	for i, t := range topics {
		names[i] = t.Name
	}
	return maxMessageBytes(ctx, dialer, view.via, names)
}

// clusterView is what one bootstrap broker said about the cluster.
type clusterView struct {
	via        string // the broker that answered
	parts      []kafka.Partition
	controller string
}

// metadata asks the bootstrap brokers in turn until one answers, each with
// an equal share of the time left, so a silent one cannot use it all. When
// none answers, the error names each broker's failure; it is a *SetupError
// when one of them failed in a way retrying cannot fix.
func metadata(ctx context.Context, dialer *kafka.Dialer, brokers []string) (clusterView, error) {
	var errs []error
	for i, b := range brokers {
		bctx, cancel := ctx, context.CancelFunc(func() {})
		if dl, ok := ctx.Deadline(); ok {
			bctx, cancel = context.WithTimeout(ctx, time.Until(dl)/time.Duration(len(brokers)-i))
		}
		v, err := metadataVia(bctx, dialer, b)
		cancel()
		if err == nil {
			return v, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return clusterView{}, setupErr("producer: topics: no bootstrap broker answered", errs...)
}

// metadataVia reads every topic's partitions and the controller's address
// from broker.
func metadataVia(ctx context.Context, dialer *kafka.Dialer, broker string) (clusterView, error) {
	conn, err := dial(ctx, dialer, broker)
	if err != nil {
		return clusterView{}, fmt.Errorf("dial %s: %w", broker, err)
	}
	defer conn.Close()
	v := clusterView{via: broker}
	if v.parts, err = conn.ReadPartitions(); err != nil {
		return clusterView{}, fmt.Errorf("metadata via %s: %w", broker, ctxErr(ctx, err))
	}
	controller, err := conn.Controller()
	if err != nil {
		return clusterView{}, fmt.Errorf("find controller via %s: %w", broker, ctxErr(ctx, err))
	}
	v.controller = net.JoinHostPort(controller.Host, strconv.Itoa(controller.Port))
	return v, nil
}

// brokerDefault is the replication factor that asks CreateTopics for the
// broker's default.replication.factor (KIP-464).
const brokerDefault = -1

// minCreateTopicsDefaults is the first CreateTopics version whose -1 means
// the broker's default (Kafka 2.4).
const minCreateTopicsDefaults = 4

// ErrBrokerDefaultUnsupported is a controller too old (before Kafka 2.4)
// to create a topic with the broker's default replication factor; the
// topic needs an explicit one.
var ErrBrokerDefaultUnsupported = errors.New("the controller cannot create topics with its default replication factor (CreateTopics v4, Kafka 2.4 and later)")

// createTopics creates cfgs through the cluster controller at addr, with a
// CreateTopics version the controller negotiates: kafka-go's Conn speaks
// v0 to v2 only, where -1 is not the broker's default but an invalid
// count (a broker may happen to accept it; the protocol does not say so).
// A topic asking for the broker's default is refused before anything is
// sent when the controller stops below v4, so that an old cluster's answer
// is an error naming the cause, not an INVALID_REPLICATION_FACTOR.
func createTopics(ctx context.Context, dialer *kafka.Dialer, addr string, cfgs []kafka.TopicConfig) error {
	names := make([]string, len(cfgs))
	for i, tc := range cfgs {
		names[i] = tc.Topic
	}
	what := fmt.Sprintf("producer: topics: create %s on controller %s", strings.Join(names, ", "), addr)
	cl, done := client(dialer, addr)
	defer done()
	if slices.ContainsFunc(cfgs, func(tc kafka.TopicConfig) bool { return tc.ReplicationFactor == brokerDefault }) {
		av, err := cl.ApiVersions(ctx, &kafka.ApiVersionsRequest{})
		if err == nil {
			err = av.Error
		}
		if err != nil {
			return setupErr(what, ctxErr(ctx, err))
		}
		for _, k := range av.ApiKeys {
			if k.ApiKey == int(protocol.CreateTopics) && k.MaxVersion < minCreateTopicsDefaults {
				return &SetupError{fmt.Errorf("%s: %w: it answers up to v%d", what, ErrBrokerDefaultUnsupported, k.MaxVersion)}
			}
		}
	}
	resp, err := cl.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: cfgs})
	if err != nil {
		return setupErr(what, ctxErr(ctx, err))
	}
	var errs []error
	for _, n := range names {
		// An existing topic is what was asked for: creating is idempotent.
		if err := resp.Errors[n]; err != nil && !errors.Is(err, kafka.TopicAlreadyExists) {
			errs = append(errs, fmt.Errorf("%s: %w", n, err))
		}
	}
	if len(errs) > 0 {
		return setupErr(what, errs...)
	}
	return nil
}

// client is a kafka-go Client of the broker at addr with dialer's identity,
// TLS and SASL; done closes its connections.
func client(dialer *kafka.Dialer, addr string) (*kafka.Client, func()) {
	transport := &kafka.Transport{ClientID: dialer.ClientID, DialTimeout: dialer.Timeout, TLS: dialer.TLS, SASL: dialer.SASLMechanism}
	return &kafka.Client{Addr: kafka.TCP(addr), Transport: transport}, transport.CloseIdleConnections
}

// maxMessageBytes reads the max.message.bytes of topics through broker.
func maxMessageBytes(ctx context.Context, dialer *kafka.Dialer, broker string, topics []string) (map[string]int64, error) {
	client, done := client(dialer, broker)
	defer done()
	req := &kafka.DescribeConfigsRequest{}
	for _, t := range topics {
		req.Resources = append(req.Resources, kafka.DescribeConfigRequestResource{
			ResourceType: kafka.ResourceTypeTopic, ResourceName: t, ConfigNames: []string{"max.message.bytes"}})
	}
	const what = "producer: topics: read max.message.bytes"
	resp, err := client.DescribeConfigs(ctx, req)
	if err != nil {
		return nil, setupErr(fmt.Sprintf("%s via %s", what, broker), ctxErr(ctx, err))
	}
	out := make(map[string]int64, len(topics))
	for _, r := range resp.Resources {
		if r.Error != nil {
			return nil, setupErr(fmt.Sprintf("%s of %s", what, r.ResourceName), r.Error)
		}
		for _, e := range r.ConfigEntries {
			if e.ConfigName != "max.message.bytes" {
				continue
			}
			n, err := strconv.ParseInt(e.ConfigValue, 10, 64)
			if err != nil || n <= 0 {
				return nil, &SetupError{fmt.Errorf("%s of %s: %q is not a size", what, r.ResourceName, e.ConfigValue)}
			}
			out[r.ResourceName] = n
		}
	}
	for _, t := range topics {
		if _, ok := out[t]; !ok {
			return nil, setupErr(fmt.Sprintf("%s of %s", what, t), errors.New("the broker did not report it"))
		}
	}
	return out, nil
}

// setupErr joins errs under msg, as a *SetupError when one of them is one
// retrying cannot fix (see permanentSetup).
func setupErr(msg string, errs ...error) error {
	err := fmt.Errorf("%s: %w", msg, errors.Join(errs...))
	if slices.ContainsFunc(errs, permanentSetup) {
		return &SetupError{err}
	}
	return err
}

// permanentSetup reports whether a start-up error will not heal by waiting:
// a Kafka error code the cluster will keep answering (invalid replication
// factor or config, authorization, SASL authentication, policy), or a TLS
// handshake that failed on the certificates. Unreachable brokers, timeouts,
// a leader or controller not available yet and every other error are worth
// retrying.
func permanentSetup(err error) bool {
	var se *SetupError
	if errors.As(err, &se) {
		return true
	}
	var kerr kafka.Error
	if errors.As(err, &kerr) {
		if kerr.Temporary() {
			return false
		}
		switch kerr {
		case kafka.RequestTimedOut, kafka.BrokerNotAvailable, kafka.LeaderNotAvailable, kafka.NotController,
			kafka.GroupCoordinatorNotAvailable, kafka.ReplicaNotAvailable, kafka.KafkaStorageError:
			return false
		}
		return true
	}
	var (
		unknownCA x509.UnknownAuthorityError
		hostname  x509.HostnameError
		invalid   x509.CertificateInvalidError
		verify    *tls.CertificateVerificationError
		header    tls.RecordHeaderError
	)
	return errors.As(err, &unknownCA) || errors.As(err, &hostname) || errors.As(err, &invalid) ||
		errors.As(err, &verify) || errors.As(err, &header)
}

// dial connects to addr with ctx's deadline (which prepareTopics always sets)
// as the connection's I/O deadline, and closes the connection when ctx ends,
// which unblocks a request waiting on a silent broker. The close is released
// by the connection's own Close.
func dial(ctx context.Context, dialer *kafka.Dialer, addr string) (*closeOnDone, error) {
	conn, err := dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, ctxErr(ctx, err)
	}
	if dl, ok := ctx.Deadline(); ok {
		if err := conn.SetDeadline(dl); err != nil {
			_ = conn.Close()
			return nil, fmt.Errorf("set deadline: %w", err)
		}
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	return &closeOnDone{Conn: conn, stop: stop}, nil
}

// closeOnDone is a kafka.Conn that is also closed when its ctx ends.
type closeOnDone struct {
	*kafka.Conn
	stop func() bool
}

// Close stops the ctx watch and closes the connection.
func (c *closeOnDone) Close() error {
	c.stop()
	return c.Conn.Close()
}

// ctxErr returns err, wrapped with ctx's error once ctx has ended: an I/O
// error caused by the deadline or the close on cancel then says so, and
// errors.Is(err, context.Canceled) holds.
func ctxErr(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("%w (%v)", cerr, err)
	}
	return err
}
