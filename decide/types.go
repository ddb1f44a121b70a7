package decide

import (
	"net/netip"
	"time"

	"github.com/dedupproxy/dedupproxy/decide/sent"
	"github.com/dedupproxy/dedupproxy/protocol"
	"github.com/dedupproxy/dedupproxy/seqstate"
)

// Mode is what the proxy does with the batches of a topic.
type Mode uint8

const (
	// Enforce answers retries and drops the records they repeat.
	Enforce Mode = iota
	// Observe decides as Enforce would and says so (Verdict.Would), but
	// forwards every batch as it came.
	Observe
	// Off relays the topic's batches without deciding them.
	Off
)

// Match is how legacy records of a topic are compared (docs/legacy.md,
// "What a record is").
type Match uint8

const (
	// MatchAuto compares a record's key, value, headers and timestamp,
	// and leaves the timestamp out only for a client that stamps a resend
	// anew (restamps): a client that resends byte for byte keeps its
	// timestamps, so a record with a later one is new data whatever its
	// content.
	MatchAuto Match = iota
	// MatchRecords compares a record's key, value and headers: a record
	// resent with a new timestamp (kafka-go, kafkajs) matches.
	MatchRecords
	// MatchExact also compares the record's timestamp.
	MatchExact
	// MatchOff leaves the topic's legacy batches undecided.
	MatchOff
)

// Scope is what makes two connections one client instance (docs/legacy.md,
// "Scope").
type Scope uint8

const (
	// ScopeInstance: the same principal, client id and client host.
	ScopeInstance Scope = iota
	// ScopeClientID: the same principal and client id, whatever the host
	// (clients behind a NAT whose address changes).
	ScopeClientID
)

// Settings are what a running proxy may change (SIGHUP).
type Settings struct {
	Mode   Mode
	Match  Match
	Topics map[string]TopicSettings // by topic name
}

// TopicSettings override Settings for one topic.
type TopicSettings struct {
	Mode      *Mode
	Match     *Match
	KeyHeader string // the idempotency key header, "" for none
}

// Close is how a client connection ended, as far as the proxy can tell
// (docs/legacy.md, "The rule", 1).
type Close uint8

const (
	// Broken: reset, failed, or the proxy cannot tell: the answers written
	// on it may not have been read.
	Broken Close = iota
	// Clean: its client closed it with every answer written on it read:
	// the client's TCP stack had acknowledged them all and it did not
	// reset the connection, which a client closing with answers unread
	// does. (Answers written late may still have been discarded: see
	// lateAnswer.)
	Clean
)

// ConnID is the proxy's number for a client connection.
type ConnID = sent.ConnID

// Conn is a client connection's legacy state. Get one with an EvConnect
// step.
type Conn = sent.Conn

// Client is who a connection's client is: the principal the broker
// authenticated (the caller's number for it), the client id it sent and the
// address it came from.
type Client struct {
	Principal uint32
	ID        string
	Host      netip.Addr
	// Software is the client software name it sent in ApiVersions (v3+,
	// KIP-511), "" when none.
	Software string
}

// Request is a Produce request as the session scanned it. The caller fills
// it (Parts reused) and keeps its bytes unchanged until Decide returns.
type Request struct {
	Conn    *Conn // nil: the connection is not authenticated; nothing is decided
	Version int16
	Acks    int16
	Timeout time.Duration // the request's timeout_ms
	// Arrived is when the request was read from the client; zero means
	// the time of its first decision.
	Arrived time.Time
	Parts   []Part
	// Rounds is how many times this request was decided before (0 the
	// first time); from MaxRounds on it is given up.
	Rounds int
	// Waited is the Until of the Wait this decision comes right after
	// (zero otherwise): from then on the request is given up, its wait
	// over without the outcome it needs.
	Waited time.Time
	// GiveUp gives the request up whatever it waits for: the proxy is
	// stopping.
	GiveUp bool
}

// MaxRounds bounds how often one request is decided again after waits and
// tail reads; past it the request is given up.
const MaxRounds = 64

// GaveUp says why a request was given up: every decided part is answered
// REQUEST_TIMED_OUT, which clients retry, and the retry is decided afresh.
type GaveUp uint8

const (
	NotGivenUp   GaveUp = iota
	GaveUpWait          // its wait ended without the outcome it needs (Request.Waited)
	GaveUpRounds        // decided MaxRounds times
	GaveUpAsked         // Request.GiveUp
)

// Part is one partition of a Produce request that carries one v2 batch of
// a topic the proxy knows.
type Part struct {
	TI, PI    int // topic and partition index in the request
	Topic     seqstate.TopicID
	Partition int32
	Header    protocol.BatchHeader
	// Records is the partition's records field.
	Records []byte
	// Unread: Records past the batch header are not in memory yet (held
	// in pipes): the proxy never answers the batch itself.
	Unread bool
}

// Act is what happens to one part.
type Act uint8

const (
	// Forward: upstream as it came; the broker answers it.
	Forward Act = iota
	// Answer: the proxy answers it (PartPlan.Local); nothing goes upstream.
	Answer
	// Rebuild: upstream without the records it repeats
	// (Plan.Rebuilt[At:End]); the proxy answers it from the broker's answer.
	Rebuild
)

// Rule names what decided a part, for logs and counters.
type Rule uint8

const (
	RuleNone          Rule = iota // new data, or not decided
	RuleRetry                     // legacy records a client instance sent before and may not hold the acknowledgement of
	RuleInFlight                  // a retry of records in flight: waited for their outcome
	RuleLog                       // legacy records read back from the log after a restart
	RuleKey                       // records whose idempotency key was written before
	RuleDuplicate                 // an idempotent duplicate (the same sequence numbers)
	RuleSequenceReuse             // an idempotent sequence reused for other records
	RuleOutOfOrder                // counted; the broker decides
	RuleFenced                    // counted; the broker decides
	numRules
)

var ruleNames = [numRules]string{"new", "retry", "in_flight", "log", "idempotency_key", "duplicate", "sequence_reuse", "out_of_order", "fenced"}

func (r Rule) String() string {
	if r < numRules {
		return ruleNames[r]
	}
	return "rule?"
}

// Status says whether a Plan is final.
type Status uint8

const (
	// Ready: carry the plan out.
	Ready Status = iota
	// Wait: an outcome the request needs is not known yet. Wait until
	// Effects wake the request's waiter or Plan.Until passes, then decide
	// it again with Request.Waited set to Plan.Until.
	Wait
	// ReadTails: read the tails of Plan.Tails from the log, hand each to
	// TailRead or TailFailed, then call Decide again.
	ReadTails
	// ReadRecords: an answer needs the records of a part marked Unread:
	// read them into place, clear Unread, then call Decide again.
	ReadRecords
)

// Passthrough reasons: batches relayed without a decision.
const (
	PassLegacy          = iota // producer id -1 with legacy dedup off for the topic, or acks=0
	PassInvalid                // not one well-formed v2 batch: the broker answers
	PassOldFormat              // message format v0/v1
	PassUnknownTopic           // a topic not yet seen in a Metadata response
	PassUnauthenticated        // the connection is not authenticated
	PassDedupOff               // dedup off (globally or for the topic)
	PassKeysCompressed         // idempotency keys not checked in a compressed batch
	NumPass
)

// Verdict is what decided one part and what it would do in enforce mode.
type Verdict struct {
	Rule     Rule
	Would    Act   // the act in enforce mode (Observe forwards whatever it is)
	Dropped  int32 // records not written again (or that would not be)
	Records  int32 // records in the batch
	Original int64 // the original's offset when known, else -1
	Age      time.Duration
	Legacy   bool
	Waited   bool // the request waited for this part's originals
	Pass     int8 // a passthrough reason, -1 when decided
}

// PartPlan is the plan for one Part.
type PartPlan struct {
	Act     Act
	At, End int                           // Rebuild: the rebuilt batch in Plan.Rebuilt
	Local   protocol.LocalPartitionResult // Answer (and Rebuild, once the broker answered)
	Verdict Verdict
}

// TailKey names a partition whose tail is to be read.
type TailKey struct {
	Topic     seqstate.TopicID
	Partition int32
}
