package config

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"
)

// KafkaSecurity is the TLS and SASL setup shared by the reader and writer,
// built once from Config. Secrets come only from the environment or files
// and are never logged.
type KafkaSecurity struct {
	TLS  *tls.Config
	SASL sasl.Mechanism
}

// NewKafkaSecurity loads the TLS files and the SASL password. TLS is on
// only with KAFKA_TLS=true; Config.validate rejects the other KAFKA_TLS_*
// settings without it.
func NewKafkaSecurity(c *Config) (KafkaSecurity, error) {
	var s KafkaSecurity
	if c.KafkaTLS {
		tc := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: c.KafkaTLSInsecure} //nolint:gosec // opt-in for tests
		if c.KafkaTLSCAFile != "" {
			pem, err := os.ReadFile(c.KafkaTLSCAFile)
			if err != nil {
				return s, fmt.Errorf("kafka tls: CA file: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return s, fmt.Errorf("kafka tls: CA file %s holds no PEM certificate", c.KafkaTLSCAFile)
			}
			tc.RootCAs = pool
		}
		if c.KafkaTLSCertFile != "" {
			cert, err := tls.LoadX509KeyPair(c.KafkaTLSCertFile, c.KafkaTLSKeyFile)
			if err != nil {
				return s, fmt.Errorf("kafka tls: client certificate: %w", err)
			}
			tc.Certificates = []tls.Certificate{cert}
		}
		s.TLS = tc
	}
	if c.SASLMechanism == "" {
		return s, nil
	}
	password := c.SASLPassword
	if c.SASLPasswordFile != "" {
		b, err := os.ReadFile(c.SASLPasswordFile)
		if err != nil {
			return s, fmt.Errorf("kafka sasl: password file: %w", err)
		}
		password = strings.TrimRight(string(b), "\r\n")
	}
	switch strings.ToUpper(c.SASLMechanism) {
	case "PLAIN":
		s.SASL = plain.Mechanism{Username: c.SASLUsername, Password: password}
	case "SCRAM-SHA-256", "SCRAM-SHA-512":
		algo := scram.SHA256
		if strings.ToUpper(c.SASLMechanism) == "SCRAM-SHA-512" {
			algo = scram.SHA512
		}
		m, err := scram.Mechanism(algo, c.SASLUsername, password)
		if err != nil {
			return s, fmt.Errorf("kafka sasl: %w", err)
		}
		s.SASL = m
	}
	return s, nil
}

// dialer is the consumer side's connection settings.
func (s KafkaSecurity) Dialer(clientID string) *kafka.Dialer {
	return &kafka.Dialer{ClientID: clientID, Timeout: 10 * time.Second, DualStack: true, TLS: s.TLS, SASLMechanism: s.SASL}
}

// transport is the producer side's connection settings.
func (s KafkaSecurity) Transport(clientID string) *kafka.Transport {
	return &kafka.Transport{ClientID: clientID, DialTimeout: 10 * time.Second, TLS: s.TLS, SASL: s.SASL, MetadataTTL: 30 * time.Second}
}
