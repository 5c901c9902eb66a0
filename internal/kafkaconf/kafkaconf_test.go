package kafkaconf_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxref/orders/internal/kafkaconf"
)

const topic = "t"

// produce sends one record with the options built from c.
func produce(t *testing.T, c kafkaconf.Config) error {
	t.Helper()
	opts, err := c.Options()
	require.NoError(t, err)
	cl, err := kgo.NewClient(append(opts, kgo.DefaultProduceTopic(topic), kgo.RequestRetries(1))...)
	require.NoError(t, err)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return cl.ProduceSync(ctx, &kgo.Record{Value: []byte("v")}).FirstErr()
}

// ping connects with the options built from c and returns the first
// broker's answer, without the producer's retries.
func ping(t *testing.T, c kafkaconf.Config) error {
	t.Helper()
	opts, err := c.Options()
	require.NoError(t, err)
	cl, err := kgo.NewClient(opts...)
	require.NoError(t, err)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return cl.Ping(ctx)
}

// TestSASL: each mechanism authenticates against a kfake cluster with SASL
// enabled, and a wrong password is refused.
func TestSASL(t *testing.T) {
	t.Parallel()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic), kfake.EnableSASL(),
		kfake.Superuser(kafkaconf.ScramSHA256, "u256", "p256"),
		kfake.Superuser(kafkaconf.ScramSHA512, "u512", "p512"),
		kfake.Superuser(kafkaconf.Plain, "uplain", "pplain"),
	)
	require.NoError(t, err)
	t.Cleanup(c.Close)
	brokers := c.ListenAddrs()

	for _, tc := range []struct{ mech, user, pass string }{
		{kafkaconf.ScramSHA256, "u256", "p256"},
		{"scram-sha-512", "u512", "p512"}, // case-insensitive, as the env var
		{kafkaconf.Plain, "uplain", "pplain"},
	} {
		t.Run(tc.mech, func(t *testing.T) {
			t.Parallel()
			cfg := kafkaconf.Config{Brokers: brokers, SASLMechanism: tc.mech, SASLUsername: tc.user, SASLPassword: tc.pass}
			require.NoError(t, ping(t, cfg))
			require.NoError(t, produce(t, cfg))
			// kfake drops the connection of a failed login (EOF), a real
			// broker answers SASL_AUTHENTICATION_FAILED: either way, no.
			cfg.SASLPassword = "wrong"
			require.Error(t, ping(t, cfg), "a wrong password is refused")
		})
	}
	t.Run("NoSASL", func(t *testing.T) {
		t.Parallel()
		require.Error(t, ping(t, kafkaconf.Config{Brokers: brokers}), "the cluster requires a login")
	})
}

// TestTLSWithSCRAM: TLS with a private CA file plus SCRAM, as for a managed
// cluster; without the CA the server certificate is refused.
func TestTLSWithSCRAM(t *testing.T) {
	t.Parallel()
	caPEM, serverCert := testPKI(t)
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic), kfake.EnableSASL(),
		kfake.Superuser(kafkaconf.ScramSHA512, "relay", "secret"),
		kfake.TLS(&tls.Config{Certificates: []tls.Certificate{serverCert}, MinVersion: tls.VersionTLS12}))
	require.NoError(t, err)
	t.Cleanup(c.Close)
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	require.NoError(t, os.WriteFile(caFile, caPEM, 0o600))

	cfg := kafkaconf.Config{Brokers: c.ListenAddrs(), TLS: true, TLSCAFile: caFile,
		SASLMechanism: kafkaconf.ScramSHA512, SASLUsername: "relay", SASLPassword: "secret"}
	require.NoError(t, produce(t, cfg))

	cfg.TLSCAFile = "" // system roots do not know the test CA
	var unknownCA x509.UnknownAuthorityError
	require.ErrorAs(t, ping(t, cfg), &unknownCA)
}

func TestValidateAndString(t *testing.T) {
	t.Parallel()
	err := kafkaconf.Config{SASLMechanism: "GSSAPI"}.Validate()
	require.ErrorContains(t, err, "at least one broker")
	require.ErrorContains(t, err, `"GSSAPI"`)
	require.ErrorContains(t, kafkaconf.Config{Brokers: []string{"b:9092"}, SASLMechanism: "PLAIN"}.Validate(), "username and a password")

	_, err = kafkaconf.Config{Brokers: []string{"b:9092"}, TLSCAFile: "/does/not/exist"}.Options()
	require.Error(t, err)

	s := kafkaconf.Config{Brokers: []string{"b:9092"}, SASLMechanism: "PLAIN", SASLUsername: "u", SASLPassword: "hunter2"}.String()
	require.NotContains(t, s, "hunter2")
	require.Contains(t, s, "sasl_password=xxxxx")
}

// testPKI makes a CA and a server certificate for 127.0.0.1 signed by it.
func testPKI(t *testing.T) (caPEM []byte, server tls.Certificate) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	caTpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTpl, caTpl, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	ca, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tpl, ca, &key.PublicKey, caKey)
	require.NoError(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}
