package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/scorer/scorer/internal/testenv"
)

// testPKI is a CA made in the test, a server certificate for 127.0.0.1 and
// a client certificate, as PEM files.
type testPKI struct {
	caFile, clientCert, clientKey string
	pool                          *x509.CertPool
	server, client                tls.Certificate
}

func newTestPKI(t *testing.T) testPKI {
	t.Helper()
	dir := t.TempDir()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "scorer test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	issue := func(serial int64, cn string, usage x509.ExtKeyUsage, ips []net.IP) (tls.Certificate, []byte, []byte) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: ips}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kb, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
		keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})
		c, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			t.Fatal(err)
		}
		return c, certPEM, keyPEM
	}
	p := testPKI{pool: x509.NewCertPool(), caFile: filepath.Join(dir, "ca.pem"),
		clientCert: filepath.Join(dir, "client.pem"), clientKey: filepath.Join(dir, "client.key")}
	p.pool.AddCert(ca)
	p.server, _, _ = issue(2, "127.0.0.1", x509.ExtKeyUsageServerAuth, []net.IP{net.ParseIP("127.0.0.1")})
	var certPEM, keyPEM []byte
	p.client, certPEM, keyPEM = issue(3, "scorer", x509.ExtKeyUsageClientAuth, nil)
	for path, b := range map[string][]byte{
		p.caFile: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), p.clientCert: certPEM, p.clientKey: keyPEM,
	} {
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// TestReliabilitySecurity scores end to end over TLS with SASL PLAIN,
// SCRAM-SHA-256 (password from KAFKA_SASL_PASSWORD_FILE) and SCRAM-SHA-512
// with a client certificate (the broker requires one), against kfake with
// TLS and SASL in-process. In every scorer log: the password never
// appears, nor any transcript sentence (info level). A wrong password
// keeps the scorer not ready, logged without the password.
func TestReliabilitySecurity(t *testing.T) {
	if testing.Short() {
		t.Skip("starts four scorer processes")
	}
	pki := newTestPKI(t)
	secret := func() string {
		b := make([]byte, 12)
		_, _ = rand.Read(b)
		return "pw-" + hex.EncodeToString(b)
	}
	users := map[string]string{"PLAIN": secret(), "SCRAM-SHA-256": secret(), "SCRAM-SHA-512": secret()}
	const admin, adminPW = "admin-test", "admin-test-pw"
	startCluster := func(auth tls.ClientAuthType) string {
		opts := []kfake.Opt{kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(2),
			kfake.TLS(&tls.Config{Certificates: []tls.Certificate{pki.server}, ClientCAs: pki.pool, ClientAuth: auth, MinVersion: tls.VersionTLS12}),
			kfake.EnableSASL(), kfake.Superuser("PLAIN", admin, adminPW),
			kfake.ListenFn(func(network, _ string) (net.Listener, error) { return net.Listen(network, "127.0.0.1:0") })}
		for m, pw := range users {
			opts = append(opts, kfake.Superuser(m, "scorer-"+strings.ToLower(m), pw))
		}
		c, err := kfake.NewCluster(opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		return c.ListenAddrs()[0]
	}
	optionalCert := startCluster(tls.VerifyClientCertIfGiven)
	requiredCert := startCluster(tls.RequireAndVerifyClientCert)

	// The test's own clients: TLS with the CA and the client certificate,
	// SASL PLAIN as the admin.
	clientTLS := &tls.Config{RootCAs: pki.pool, Certificates: []tls.Certificate{pki.client}, MinVersion: tls.VersionTLS12}
	var adminMech sasl.Mechanism = plain.Mechanism{Username: admin, Password: adminPW}
	dialer := &kafka.Dialer{Timeout: 10 * time.Second, TLS: clientTLS, SASLMechanism: adminMech}

	sents := corpusSentences(t, 40, 160)
	cases := []struct {
		mech, broker string
		passwordFile bool
		clientCert   bool
	}{
		{mech: "PLAIN", broker: optionalCert},
		{mech: "SCRAM-SHA-256", broker: optionalCert, passwordFile: true},
		{mech: "SCRAM-SHA-512", broker: requiredCert, clientCert: true},
	}
	for i, c := range cases {
		t.Run(c.mech, func(t *testing.T) {
			topic := "sec-" + strings.ToLower(c.mech)
			pw := users[c.mech]
			env := relEnv(t, "KAFKA_BROKERS", c.broker, "KAFKA_INPUT_TOPIC", topic, "KAFKA_OUTPUT_TOPIC", topic+".scored",
				"KAFKA_DLQ_TOPIC", topic+".dlq", "KAFKA_GROUP_ID", topic, "KAFKA_INPUT_PARTITIONS", "2", "LABELS", "consumer weakness",
				"KAFKA_TLS", "true", "KAFKA_TLS_CA_FILE", pki.caFile,
				"KAFKA_SASL_MECHANISM", c.mech, "KAFKA_SASL_USERNAME", "scorer-"+strings.ToLower(c.mech), "LOG_LEVEL", "info")
			if c.passwordFile {
				f := filepath.Join(t.TempDir(), "sasl-password")
				if err := os.WriteFile(f, []byte(pw+"\n"), 0o600); err != nil {
					t.Fatal(err)
				}
				env["KAFKA_SASL_PASSWORD_FILE"] = f
			} else {
				env["KAFKA_SASL_PASSWORD"] = pw
			}
			if c.clientCert {
				env["KAFKA_TLS_CERT_FILE"] = pki.clientCert
				env["KAFKA_TLS_KEY_FILE"] = pki.clientKey
			}
			p := startScorerProcess(t, env)
			waitLog(t, p, "generation started", time.Minute)

			// Five events with real sentences, produced over TLS+SASL.
			var msgs []kafka.Message
			var used []string
			for j := range 5 {
				s := sents[2000+10*i+j]
				used = append(used, s)
				id := fmt.Sprintf("SEC-%s-%d", c.mech, j)
				b, _ := json.Marshal(map[string]any{"call_id": id, "sections": map[string][]string{"FILT_MD": {s}}})
				msgs = append(msgs, kafka.Message{Key: []byte(id), Value: b})
			}
			// One poison record: its dead letter path must not log its text either.
			msgs = append(msgs, kafka.Message{Key: []byte("SEC-BAD"), Value: []byte(`{"sections":{"FILT_MD":["` + sents[2100+i] + `"]}}`)})
			used = append(used, sents[2100+i])
			w := &kafka.Writer{Addr: kafka.TCP(c.broker), Topic: topic, Balancer: &kafka.Hash{}, RequiredAcks: kafka.RequireAll,
				BatchTimeout: 5 * time.Millisecond, Transport: &kafka.Transport{TLS: clientTLS, SASL: adminMech}}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := w.WriteMessages(ctx, msgs...); err != nil {
				t.Fatalf("produce over TLS+SASL: %v", err)
			}
			_ = w.Close()
			out := watchTopic(t, c.broker, topic+".scored", dialer)
			out.waitKeys(t, 5, 2*time.Minute)
			dlq := watchTopic(t, c.broker, topic+".dlq", dialer)
			dlq.waitKeys(t, 1, time.Minute)
			if _, err := signalAndWait(t, p, syscall.SIGTERM, 40*time.Second); err != nil {
				t.Errorf("scorer exit: %v", err)
			}
			logText := p.log.String()
			if strings.Contains(logText, pw) {
				t.Errorf("the SASL password appears in the scorer log")
			}
			for _, s := range used {
				if strings.Contains(logText, s) {
					t.Errorf("transcript text %q appears in the info log", s)
				}
			}
			t.Logf("%s over TLS (client cert %v, password file %v): 5 scored, 1 dead-lettered; log %d bytes, no password, no transcript text",
				c.mech, c.clientCert, c.passwordFile, len(logText))
		})
	}

	t.Run("wrong password", func(t *testing.T) {
		wrong := secret()
		metrics := freeAddr(t)
		p := startScorerProcess(t, relEnv(t, "KAFKA_BROKERS", optionalCert, "METRICS_ADDR", metrics, "KAFKA_GROUP_ID", "sec-wrong",
			"KAFKA_TLS", "true", "KAFKA_TLS_CA_FILE", pki.caFile, "KAFKA_SASL_MECHANISM", "SCRAM-SHA-512",
			"KAFKA_SASL_USERNAME", "scorer-scram-sha-512", "KAFKA_SASL_PASSWORD", wrong))
		// A refused authentication does not heal by retrying (the password
		// is read once, at start): the scorer exits at once, non-zero,
		// naming the cause, and the orchestrator's restart picks up a fixed
		// secret.
		done := make(chan error, 1)
		go func() { done <- p.cmd.Wait() }()
		var exitErr error
		select {
		case exitErr = <-done:
		case <-time.After(time.Minute):
			t.Fatalf("scorer still running a minute after its authentication was refused:\n%s", testenv.Tail(p.log.String(), 2000))
		}
		if exitErr == nil {
			t.Error("scorer exited 0 after its authentication was refused, want non-zero")
		}
		logText := p.log.String()
		if strings.Contains(logText, wrong) {
			t.Errorf("the wrong password appears in the log")
		}
		if strings.Contains(logText, "Kafka not reachable yet") {
			t.Errorf("a refused authentication was retried as unreachable")
		}
		line := ""
		for _, l := range strings.Split(logText, "\n") {
			if strings.HasPrefix(l, "scorer: ") {
				line = l
			}
		}
		if !strings.Contains(strings.ToLower(line), "sasl") || !strings.Contains(strings.ToLower(line), "auth") {
			t.Errorf("the exit line does not say SASL authentication failed: %q", line)
		}
		t.Logf("wrong password: exited (%v) with %s", exitErr, truncate(line, 300))
	})
}
