package e2e

import (
	"context"
	"fmt"

	"github.com/IBM/sarama"
	kafkagosasl "github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl"

	"github.com/dedupproxy/dedupproxy/config"
	"github.com/dedupproxy/dedupproxy/internal/testcluster"
)

// The clients' SASL on a real cluster that requires it: the clients
// authenticate through the proxy (which relays the exchange) with the
// credentials of DEDUPPROXY_TEST_SASL_*. sarama and kafka-go ship no
// SCRAM of their own without a dependency this module does not have, so
// franz-go's runs behind their interfaces.

// saramaSASL configures sarama's SASL for auth.
func saramaSASL(cfg *sarama.Config, auth testcluster.SASL) {
	if auth.Mechanism == "" {
		return
	}
	cfg.Net.SASL.Enable = true
	cfg.Net.SASL.User, cfg.Net.SASL.Password = auth.User, auth.Password
	cfg.Net.SASL.Mechanism = sarama.SASLMechanism(auth.Mechanism)
	if auth.Mechanism != config.SASLPlain {
		cfg.Net.SASL.SCRAMClientGeneratorFunc = func() sarama.SCRAMClient { return &saramaSCRAM{mechanism: auth.Mechanism} }
	}
}

// saramaSCRAM is sarama's SCRAMClient over franz-go's SCRAM.
type saramaSCRAM struct {
	mechanism string
	sess      sasl.Session
	first     []byte
	done      bool
}

func (s *saramaSCRAM) Begin(user, password, _ string) error {
	mech := kgoSASL(testcluster.SASL{Mechanism: s.mechanism, User: user, Password: password})
	if mech == nil {
		return fmt.Errorf("no SCRAM mechanism %q", s.mechanism)
	}
	sess, first, err := mech.Authenticate(context.Background(), "")
	s.sess, s.first = sess, first
	return err
}

func (s *saramaSCRAM) Step(challenge string) (string, error) {
	if s.first != nil {
		first := s.first
		s.first = nil
		return string(first), nil
	}
	done, resp, err := s.sess.Challenge([]byte(challenge))
	s.done = done
	return string(resp), err
}

func (s *saramaSCRAM) Done() bool { return s.done }

// kafkaGoSASL is kafka-go's mechanism for auth, nil without one.
func kafkaGoSASL(auth testcluster.SASL) kafkagosasl.Mechanism {
	switch auth.Mechanism {
	case "":
		return nil
	case config.SASLPlain:
		return plain.Mechanism{Username: auth.User, Password: auth.Password}
	}
	return kafkaGoSCRAM{kgoSASL(auth)}
}

// kafkaGoSCRAM is kafka-go's Mechanism over franz-go's SCRAM.
type kafkaGoSCRAM struct{ mech sasl.Mechanism }

func (k kafkaGoSCRAM) Name() string { return k.mech.Name() }

func (k kafkaGoSCRAM) Start(ctx context.Context) (kafkagosasl.StateMachine, []byte, error) {
	sess, first, err := k.mech.Authenticate(ctx, "")
	return kafkaGoSession{sess}, first, err
}

type kafkaGoSession struct{ sess sasl.Session }

func (k kafkaGoSession) Next(_ context.Context, challenge []byte) (bool, []byte, error) {
	return k.sess.Challenge(challenge)
}

// saslEnv is the environment of a child client (kcat, Python, Node): the
// testdata programs read E2E_SASL_* and authenticate when it is set.
func saslEnv(auth testcluster.SASL) []string {
	if auth.Mechanism == "" {
		return nil
	}
	return []string{"E2E_SASL_MECHANISM=" + auth.Mechanism, "E2E_SASL_USER=" + auth.User, "E2E_SASL_PASSWORD=" + auth.Password}
}
