//go:build !cgo

package e2e

import (
	"context"
	"errors"
	"testing"
)

// confluentGoClient without cgo: confluent-kafka-go links librdkafka
// through cgo, so this build has no such client, and says so as a missing
// client does (requireClient fails it, or skips it outside CI when
// E2E_SKIP_MISSING names it).
func confluentGoClient(paced bool) legacyClient {
	c := legacyClient{
		name: "confluent-kafka-go", clientID: "e2e-confluent-go", retries: true, dropAt: 10,
		available: func() error {
			return errors.New("confluent-kafka-go needs cgo, and this test binary was built without it " +
				"(CGO_ENABLED=0, or no C compiler: install gcc, .ci/deps does)")
		},
		produce: func(context.Context, *testing.T, string, string, produceOpts) (produceResult, error) {
			return produceResult{}, errors.New("confluent-kafka-go needs cgo")
		},
	}
	if paced {
		c.name, c.paced, c.dropAt = c.name+" paced", true, pacedDropEvery
	}
	return c
}

// openConfluentGoBeater without cgo: the client is missing (its available
// says so first).
func openConfluentGoBeater(*testing.T, hbEnv) (beater, error) {
	return nil, errors.New("confluent-kafka-go needs cgo")
}
