package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// debianPython is Debian's interpreter: the python3-* packages live in its
// dist-packages, which a python3 earlier on PATH (pyenv, a venv) does not
// see (docs/clients.md §2).
const debianPython = "/usr/bin/python3"

// childReport is the JSON line the Python and Node producers print.
type childReport struct {
	Version     string   `json:"version"`
	Acked       []int    `json:"acked"`
	Failed      []int    `json:"failed"`
	Undelivered int      `json:"undelivered"`
	Errors      []string `json:"errors"`
}

// runReporting runs a producer program that prints a childReport last,
// with env added to its environment.
func runReporting(ctx context.Context, t *testing.T, env []string, name string, args ...string) (produceResult, error) {
	stdout, stderr, err := runChild(ctx, t, nil, env, name, args...)
	if strings.TrimSpace(stderr) != "" {
		t.Logf("%s stderr:\n%s", filepath.Base(args[0]), firstLines(stderr, 20))
	}
	if err != nil {
		return produceResult{}, fmt.Errorf("%s %s: %w", name, args[0], err)
	}
	lines := bytes.Split(bytes.TrimSpace(stdout), []byte("\n"))
	var rep childReport
	if err := json.Unmarshal(lines[len(lines)-1], &rep); err != nil {
		return produceResult{}, fmt.Errorf("%s: report: %w (stdout %q)", args[0], err, firstLines(string(stdout), 5))
	}
	if rep.Undelivered > 0 {
		rep.Errors = append(rep.Errors, fmt.Sprintf("%d messages still undelivered at exit", rep.Undelivered))
	}
	return produceResult{
		version: rep.Version, acked: rep.Acked, perValue: true, ackedCount: len(rep.Acked),
		failed: len(rep.Failed) + rep.Undelivered, errors: rep.Errors,
	}, nil
}

// childEnv is the environment of a child producer run as o says: its
// SASL settings (saslEnv), and E2E_TIMEOUT_MS, the request timeout it sets
// instead of its usual one, when o has one.
func childEnv(o produceOpts) []string {
	env := saslEnv(o.auth)
	if o.timeout > 0 {
		env = append(env, fmt.Sprintf("E2E_TIMEOUT_MS=%d", o.timeout.Milliseconds()))
	}
	return env
}

// pythonModule checks that Debian's python can import module.
func pythonModule(module string) func() error {
	return func() error {
		if _, err := os.Stat(debianPython); err != nil {
			return err
		}
		out, err := exec.Command(debianPython, "-c", "import "+module).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s -c 'import %s': %v: %s", debianPython, module, err, bytes.TrimSpace(out))
		}
		return nil
	}
}

// kcatClient: kcat (librdkafka) reading values from stdin, idempotence off,
// acks=all. kcat reports deliveries only as counts: a failed delivery is a
// "Delivery failed" line on stderr, so the acknowledged values are known one
// by one only when none failed. It exits 0 even when deliveries failed
// (docs/clients.md §2). -E keeps it running when "all brokers are down":
// with one broker, the shim closing the connection is exactly that, and kcat
// would otherwise exit with records still queued. paced: its stdin is a
// live source (pacedLines) and it lingers pacedLinger ms with pacedRetries
// retries.
func kcatClient(paced bool) legacyClient {
	c := legacyClient{
		name: "kcat", clientID: "e2e-kcat", retries: true, dropAt: 10,
		available: func() error { _, err := exec.LookPath("kcat"); return err },
	}
	if paced {
		c.name, c.paced, c.dropAt = c.name+" paced", true, pacedDropEvery
	}
	c.produce = func(ctx context.Context, t *testing.T, bootstrap, topic string, o produceOpts) (produceResult, error) {
		n, auth := o.n, o.auth
		var in io.Reader
		if paced {
			src := pacedLines(ctx, n)
			defer src.Close() // a writer kcat stopped reading returns
			in = src
		} else {
			var b bytes.Buffer
			for i := 0; i < n; i++ {
				b.WriteString(value(i))
				b.WriteByte('\n')
			}
			in = &b
		}
		args := []string{"-P", "-E", "-b", bootstrap, "-t", topic}
		if auth.Mechanism != "" {
			args = append(args, "-X", "security.protocol=SASL_PLAINTEXT", "-X", "sasl.mechanisms="+auth.Mechanism,
				"-X", "sasl.username="+auth.User, "-X", "sasl.password="+auth.Password)
		}
		timeout := int64(5000)
		if o.timeout > 0 {
			timeout = o.timeout.Milliseconds()
		}
		args = append(args,
			"-X", "client.id=e2e-kcat",
			"-X", "enable.idempotence=false",
			"-X", "acks=all",
			"-X", fmt.Sprintf("socket.timeout.ms=%d", timeout),
			"-X", fmt.Sprintf("request.timeout.ms=%d", timeout),
			"-X", "message.timeout.ms=25000",
		)
		if paced {
			for k, v := range pacedConfig() {
				args = append(args, "-X", fmt.Sprintf("%s=%d", k, v))
			}
		} else {
			args = append(args,
				"-X", "linger.ms=5",
				"-X", "batch.num.messages=100", // many Produce requests: the lost acknowledgement is mid-stream
				"-X", "retry.backoff.ms=50",
				"-X", "reconnect.backoff.ms=50",
			)
		}
		_, stderr, err := runChild(ctx, t, in, nil, "kcat", args...)
		if err != nil {
			return produceResult{}, fmt.Errorf("kcat: %w; stderr:\n%s", err, firstLines(stderr, 20))
		}
		failed := strings.Count(stderr, "Delivery failed")
		var errs []string
		for _, l := range strings.Split(stderr, "\n") {
			if strings.Contains(l, "Delivery failed") || strings.Contains(l, "FATAL") || strings.Contains(l, "ERROR") {
				if len(errs) < 5 {
					errs = append(errs, strings.TrimSpace(l))
				}
			}
		}
		return produceResult{version: kcatVersion(), ackedCount: n - failed, failed: failed, errors: errs}, nil
	}
	return c
}

// pacedLines is a live source on a child's stdin: the lines value(0) to
// value(n-1), handed over as paceSource hands records, ending early (EOF)
// when ctx ends. Close it once the child is done.
func pacedLines(ctx context.Context, n int) *io.PipeReader {
	r, w := io.Pipe()
	go func() {
		err := paceSource(ctx, n, func(i int) error {
			_, err := io.WriteString(w, value(i)+"\n")
			return err
		})
		w.CloseWithError(err) // nil: EOF
	}()
	return r
}

var kcatVersionRE = regexp.MustCompile(`Version (\S+) .*librdkafka (\S+)`)

// kcatVersion reads "Version 1.7.1 (..., librdkafka 2.0.2 ...)" from kcat -V.
func kcatVersion() string {
	out, err := exec.Command("kcat", "-V").CombinedOutput()
	if err != nil {
		return "unknown"
	}
	m := kcatVersionRE.FindSubmatch(out)
	if m == nil {
		return "unknown"
	}
	return fmt.Sprintf("kcat %s (librdkafka %s)", m[1], m[2])
}

// confluentPythonClient: confluent-kafka-python (Debian's, on librdkafka),
// idempotence off, acks=all. paced: the program paces its own source as
// paceSource does and lingers pacedLinger ms with pacedRetries retries.
func confluentPythonClient(paced bool) legacyClient {
	c := legacyClient{
		name: "confluent-kafka-python", clientID: "e2e-confluent-python", retries: true, dropAt: 10,
		available: pythonModule("confluent_kafka"),
	}
	var pace []string
	if paced {
		c.name, c.paced, c.dropAt = c.name+" paced", true, pacedDropEvery
		conf, err := json.Marshal(pacedConfig())
		if err != nil {
			panic(err) // a map of ints always encodes
		}
		pace = []string{fmt.Sprint(pacedBurst), fmt.Sprint(pacedEvery.Milliseconds()), string(conf)}
	}
	c.produce = func(ctx context.Context, t *testing.T, bootstrap, topic string, o produceOpts) (produceResult, error) {
		args := append([]string{filepath.Join("testdata", "confluent_producer.py"), bootstrap, topic, fmt.Sprint(o.n)}, pace...)
		return runReporting(ctx, t, childEnv(o), debianPython, args...)
	}
	return c
}

// kafkaPythonClient: kafka-python (Debian's 2.0.2), which has no idempotent
// producer. With retries > 0 it resends a batch whose acknowledgement was
// lost, and duplicates like the others. Its default is retries=0: it never
// retries, and reports the lost acknowledgement's records as failed although
// the broker appended them (docs/clients.md §3); the "retries=0" variant
// shows that, and there is nothing for a proxy to deduplicate.
func kafkaPythonClient(retries int) legacyClient {
	name := "kafka-python"
	if retries == 0 {
		name += " retries=0"
	}
	var own map[string]int
	if retries > 0 {
		// Its request timeout bounds a batch's wait in its own queue
		// too: behind a request the broker holds, it expires what it
		// has not sent (docs/legacy.md, "What is left"): all it queued
		// but what its first requests carried. Measured: 472 to 1,239 of
		// 3,000 in the slow run; 1,880 to 3,970 of 5,000 in the
		// slow-broker runs, straight to the broker as through the proxy.
		// (With retries=0 it fails whatever is held as well.)
		own = map[string]int{modeSlow: 2000, modeSlowControl: 4700, modeSlowBroker: 4700}
	}
	return legacyClient{
		// Its requests carry several batches, about 300 records each, so
		// the third one is mid-stream.
		name: name, clientID: "e2e-kafka-python", retries: retries > 0, dropAt: 3, ownFailures: own,
		available: pythonModule("kafka"),
		produce: func(ctx context.Context, t *testing.T, bootstrap, topic string, o produceOpts) (produceResult, error) {
			return runReporting(ctx, t, childEnv(o), debianPython, filepath.Join("testdata", "kafka_python_producer.py"),
				bootstrap, topic, fmt.Sprint(o.n), fmt.Sprint(retries))
		},
	}
}

// kafkajsClient: kafkajs from e2e/node_modules (npm ci in e2e/), idempotent
// false, acks=-1.
func kafkajsClient() legacyClient {
	return legacyClient{
		// One send of 100 records at a time (kafkajs_producer.js).
		name: "kafkajs", clientID: "e2e-kafkajs", retries: true, resendsOnSameSocket: true, restampsResends: true, repartitionsRetries: true, dropAt: 10,
		inFlight: 100, recordsPerRequest: 100,
		available: func() error {
			if _, err := exec.LookPath("node"); err != nil {
				return err
			}
			if _, err := os.Stat(filepath.Join("node_modules", "kafkajs", "package.json")); err != nil {
				return errors.Join(errors.New("kafkajs is not installed: run npm ci in e2e/"), err)
			}
			return nil
		},
		produce: func(ctx context.Context, t *testing.T, bootstrap, topic string, o produceOpts) (produceResult, error) {
			return runReporting(ctx, t, childEnv(o), "node", filepath.Join("testdata", "kafkajs_producer.js"), bootstrap, topic, fmt.Sprint(o.n))
		},
	}
}
