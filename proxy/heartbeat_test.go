package proxy

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

// TestHeartbeatsAcrossReconnect: one client instance sends the same record
// on a timer, reads every answer, reconnects and goes on
// (docs/legacy.md, "The rule"). Every beat is new data, so all are
// written when it reconnects after a clean close, whatever the proxy can
// compare; after a reset, a client that keeps its timestamps loses none
// either (a later beat is a new record), and one that stamps resends anew
// (kafka-go) loses at most the beats of its last 64 requests: the
// documented cost of comparing by content (each may be the answer it did
// not read).
func TestHeartbeatsAcrossReconnect(t *testing.T) {
	const beats = 40
	for _, tc := range []struct {
		name     string
		kafkaGo  bool // written as kafka-go writes: compared by content only
		reset    bool
		minWrite int
	}{
		{"keeps-timestamps/clean", false, false, 2 * beats},
		{"keeps-timestamps/reset", false, true, 2 * beats},
		{"restamps/clean", true, false, 2 * beats},
		{"restamps/reset", true, true, 2*beats - min(beats, 64)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			topic := "hb"
			c := newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
			p := startProxy(t, c, nil)
			ts := time.Now().UnixMilli()
			beat := func(conn *rawConn) {
				t.Helper()
				ts += 20
				b := recordBatchAt(t, -1, -1, -1, 1, "hb=ok", ts)
				if tc.kafkaGo {
					b = asKafkaGo(b)
				}
				if r := onlyPartition(t, conn.roundTrip(produceParts(topic, -1, part{0, b}))); r.ErrorCode != 0 {
					t.Fatalf("beat: %+v", r)
				}
			}
			for round := range 2 {
				conn := dialRaw(t, p.addr())
				conn.clientID = "beater"
				conn.learnTopics(topic)
				for range beats {
					beat(conn)
				}
				if round == 0 {
					if tc.reset {
						conn.abort()
					} else {
						conn.conn.Close()
					}
					clientsGone(t, p)
				}
			}
			written := int(partitionEnd(t, c.ListenAddrs()[0], topic, 0))
			if written < tc.minWrite || written > 2*beats {
				t.Fatalf("%d of %d beats written, want at least %d", written, 2*beats, tc.minWrite)
			}
			t.Logf("%d of %d beats written", written, 2*beats)
		})
	}
}
