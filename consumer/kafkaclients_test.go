package consumer

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	kgosasl "github.com/twmb/franz-go/pkg/sasl"
)

// securedConsumer is a consumer (not run) whose Config carries TLS and
// SASL PLAIN settings for brokers.
func securedConsumer(t *testing.T, brokers []string, tlsCfg *tls.Config, user, pass string) *Consumer {
	t.Helper()
	cfg := testConfig(brokers, "secured", "g-secured")
	cfg.Dialer = &kafka.Dialer{ClientID: "scorer-7", Timeout: 7 * time.Second, TLS: tlsCfg,
		SASLMechanism: plain.Mechanism{Username: user, Password: pass}}
	c, err := New(cfg, &fakeScorer{}, &fakeSink{}, zerolog.Nop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// tlsSettings is what a TLS config says about the connection, for
// comparing configs that are copies of each other.
func tlsSettings(c *tls.Config) string {
	if c == nil {
		return "no TLS"
	}
	return fmt.Sprintf("server %q, versions %#x-%#x, roots %p, insecure %v, certificates %d",
		c.ServerName, c.MinVersion, c.MaxVersion, c.RootCAs, c.InsecureSkipVerify, len(c.Certificates))
}

// firstSASLMessage is what mechanism m sends first for host.
func firstSASLMessage(t *testing.T, m any, host string) (name string, first []byte) {
	t.Helper()
	switch m := m.(type) {
	case sasl.Mechanism:
		_, ir, err := m.Start(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return m.Name(), ir
	case kgosasl.Mechanism:
		_, ir, err := m.Authenticate(context.Background(), host)
		if err != nil {
			t.Fatal(err)
		}
		return m.Name(), ir
	}
	t.Fatalf("%T is no SASL mechanism", m)
	return "", nil
}

// TestClientsShareSecurity: one Config's TLS and SASL settings reach the
// three ways the consumer connects alike: the group's kafka-go dialer, the
// kafka-go dialer of the log-bounds lookup and the franz-go options of a
// partition's fetch client.
func TestClientsShareSecurity(t *testing.T) {
	t.Parallel()
	tlsCfg := &tls.Config{ServerName: "kafka.internal", MinVersion: tls.VersionTLS12, MaxVersion: tls.VersionTLS13}
	c := securedConsumer(t, []string{"127.0.0.1:1"}, tlsCfg, "scorer", "s3cret")
	cl, err := kgo.NewClient(c.fetchOptions(0, kafka.FirstOffset)...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()

	group := (&groupCloser{}).dialer(c.cfg.kafkaDialer())
	for _, side := range []struct {
		name string
		d    *kafka.Dialer
	}{{"group", group}, {"log bounds", c.cfg.kafkaDialer()}} {
		if got, want := tlsSettings(cl.OptValue(kgo.DialTLSConfig).(*tls.Config)), tlsSettings(side.d.TLS); got != want {
			t.Errorf("TLS: fetch client %s, %s dialer %s", got, side.name, want)
		}
		sasls := cl.OptValue(kgo.SASL).([]kgosasl.Mechanism)
		if len(sasls) != 1 {
			t.Fatalf("fetch client SASL mechanisms %d, want 1", len(sasls))
		}
		kname, kfirst := firstSASLMessage(t, sasls[0], "kafka.internal:9093")
		gname, gfirst := firstSASLMessage(t, side.d.SASLMechanism, "")
		if kname != gname || !slices.Equal(kfirst, gfirst) {
			t.Errorf("SASL: fetch client %s %q, %s dialer %s %q", kname, kfirst, side.name, gname, gfirst)
		}
		if id, timeout := cl.OptValue(kgo.ClientID), cl.OptValue(kgo.DialTimeout); id != side.d.ClientID || timeout != side.d.Timeout {
			t.Errorf("fetch client id %v, dial timeout %v; %s dialer %q, %v", id, timeout, side.name, side.d.ClientID, side.d.Timeout)
		}
	}
	if tlsSettings(group.TLS) != tlsSettings(tlsCfg) {
		t.Errorf("group dialer TLS %s, configured %s", tlsSettings(group.TLS), tlsSettings(tlsCfg))
	}
}

// TestClientsAuthenticateAlike: against a broker that requires SASL PLAIN,
// the kafka-go connection of the log-bounds lookup and a franz-go fetch
// client built from the same Config both get in with the right password
// and both are refused with a wrong one.
func TestClientsAuthenticateAlike(t *testing.T) {
	t.Parallel()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "secured"),
		kfake.EnableSASL(), kfake.Superuser("PLAIN", "scorer", "s3cret"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	brokers := cluster.ListenAddrs()
	for _, tc := range []struct {
		pass string
		ok   bool
	}{{"s3cret", true}, {"wrong", false}} {
		c := securedConsumer(t, brokers, nil, "scorer", tc.pass)
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		conn, err := c.cfg.kafkaDialer().DialLeader(ctx, "tcp", brokers[0], "secured", 0)
		if err == nil {
			conn.Close()
		}
		if (err == nil) != tc.ok {
			t.Errorf("password %q: kafka-go leader dial: %v", tc.pass, err)
		}
		cl, err := kgo.NewClient(c.cfg.kgoConnOpts()...)
		if err != nil {
			t.Fatal(err)
		}
		if err := cl.Ping(ctx); (err == nil) != tc.ok {
			t.Errorf("password %q: franz-go ping: %v", tc.pass, err)
		}
		cl.Close()
		cancel()
	}
}

// TestIsPermanentBothLibraries: a record too large is permanent in either
// library's words, wrapped or not, and reported as too large; other
// broker errors, retriable or not, are not (a missing ACL is the
// operator's to fix, not a reason to dead-letter records).
func TestIsPermanentBothLibraries(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{kerr.MessageTooLarge, true},
		{fmt.Errorf("produce: %w", kerr.MessageTooLarge), true},
		{kafka.MessageSizeTooLarge, true},
		{kafka.MessageTooLargeError{}, true},
		{fmt.Errorf("write: %w", kafka.MessageSizeTooLarge), true},
		{kerr.CoordinatorNotAvailable, false},
		{kerr.TopicAuthorizationFailed, false},
		{kafka.TopicAuthorizationFailed, false},
		{errors.New("connection reset"), false},
	} {
		if got := IsPermanent(tc.err); got != tc.want {
			t.Errorf("IsPermanent(%v) = %v, want %v", tc.err, got, tc.want)
		}
		if got := isTooLarge(tc.err); got != tc.want {
			t.Errorf("isTooLarge(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
