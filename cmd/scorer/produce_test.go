package main

import (
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/twmb/franz-go/pkg/kfake"
)

// TestProduceOverTLSAndSASL: `scorer produce` takes KAFKA_TLS* and
// KAFKA_SASL* from the same environment as `scorer run`, so it loads a
// cluster that requires TLS with a client certificate and SASL.
func TestProduceOverTLSAndSASL(t *testing.T) {
	pki := newTestPKI(t)
	const topic, user, pw = "produce-sec", "loader", "loader-pw"
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, topic),
		kfake.TLS(&tls.Config{Certificates: []tls.Certificate{pki.server}, ClientCAs: pki.pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}),
		kfake.EnableSASL(), kfake.Superuser("PLAIN", user, pw),
		kfake.ListenFn(func(network, _ string) (net.Listener, error) { return net.Listen(network, "127.0.0.1:0") }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	broker := c.ListenAddrs()[0]

	var lines []string
	for i := range 3 {
		lines = append(lines, fmt.Sprintf(`{"call_id":"PROD-%d","sections":{"FILT_MD":["Demand held up."]}}`, i))
	}
	file := filepath.Join(t.TempDir(), "events.jsonl")
	if err := os.WriteFile(file, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{
		"KAFKA_TLS": "true", "KAFKA_TLS_CA_FILE": pki.caFile, "KAFKA_TLS_CERT_FILE": pki.clientCert, "KAFKA_TLS_KEY_FILE": pki.clientKey,
		"KAFKA_SASL_MECHANISM": "PLAIN", "KAFKA_SASL_USERNAME": user, "KAFKA_SASL_PASSWORD": pw,
	}
	stdout, stderr, err := runCLI(t, env, "", "produce", "--brokers", broker, "--topic", topic, "--file", file)
	if err != nil {
		t.Fatalf("produce over TLS+SASL: %v\n%s", err, stderr)
	}
	if !strings.Contains(stdout, "produced 3 records") {
		t.Errorf("stdout = %q", stdout)
	}
	dialer := &kafka.Dialer{Timeout: 10 * time.Second,
		TLS:           &tls.Config{RootCAs: pki.pool, Certificates: []tls.Certificate{pki.client}, MinVersion: tls.VersionTLS12},
		SASLMechanism: plain.Mechanism{Username: user, Password: pw}}
	watchTopic(t, broker, topic, dialer).waitKeys(t, 3, 30*time.Second)
}

// TestProduceRejectsTLSSettingWithoutTLS: produce validates the security
// variables as run does, before connecting.
func TestProduceRejectsTLSSettingWithoutTLS(t *testing.T) {
	_, _, err := runCLI(t, map[string]string{"KAFKA_TLS_INSECURE_SKIP_VERIFY": "true"}, `{"call_id":"X"}`,
		"produce", "--brokers", freeAddr(t), "--file", "-")
	if err == nil || !strings.Contains(err.Error(), "set KAFKA_TLS=true") {
		t.Fatalf("err = %v, want a config error asking for KAFKA_TLS=true", err)
	}
}
