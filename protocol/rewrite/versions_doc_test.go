package rewrite

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dedupproxy/dedupproxy/protocol"

	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"
)

var updateVersions = flag.Bool("update-versions", false, "rewrite docs/real-cluster.md's version tables from the caps")

// The version tables of docs/real-cluster.md lie between these lines.
const (
	versionsStart = "<!-- versions:start (written by go test ./protocol -run TestVersionsDoc -args -update-versions) -->"
	versionsEnd   = "<!-- versions:end -->"
)

// versionsTables states what the proxy decodes (MaxVersion, the caps
// CapAPIVersions applies) and, for every Kafka release franz-go's kversion
// knows, what a broker of that release gets: Produce decided or relayed,
// and which APIs its clients are capped on.
func versionsTables() string {
	var b strings.Builder
	maxOf := func(k kmsg.Key) int16 { v, _ := MaxVersion(k.Int16()); return v }
	fmt.Fprintf(&b, "| API | versions the proxy decodes | what it does with them |\n|---|---|---|\n")
	fmt.Fprintf(&b, "| Produce | v%d–v%d | decides each batch (message format v2); v0–v%d (message formats v0/v1) are relayed undecided |\n",
		protocol.ProduceMinVersion, maxOf(kmsg.Produce), protocol.ProduceMinVersion-1)
	for _, k := range []kmsg.Key{kmsg.Metadata, kmsg.FindCoordinator, kmsg.DescribeCluster, kmsg.ShareFetch, kmsg.ShareAcknowledge} {
		fmt.Fprintf(&b, "| %s | v0–v%d | rewrites the broker addresses in the response |\n", kmsg.NameForKey(k.Int16()), maxOf(k))
	}
	fmt.Fprintf(&b, "| Fetch | v0–v%d | relayed; from v16 the KIP-951 NodeEndpoints of the response are rewritten |\n", maxOf(kmsg.Fetch))
	fmt.Fprintf(&b, "| ApiVersions | v0–v%d | every API's maximum is capped to what the proxy decodes, an API it does not know is removed |\n", maxOf(kmsg.ApiVersions))
	fmt.Fprintf(&b, "| every other API | up to kmsg's newest | relayed as bytes; only the request header is read |\n")

	fmt.Fprintf(&b, "\n| Kafka release | Produce | what is deduplicated | APIs its clients are capped on (the release's newest → the proxy's) |\n|---|---|---|---|\n")
	for _, name := range kversion.VersionStrings() {
		vs := kversion.FromString(name)
		if vs == nil {
			continue
		}
		var produce int16 = -1
		var capped []string
		vs.EachMaxKeyVersion(func(k, v int16) {
			if k == kmsg.Produce.Int16() {
				produce = v
			}
			if mv, ok := MaxVersion(k); !ok {
				capped = append(capped, kmsg.NameForKey(k)+" (unknown: removed)")
			} else if v > mv {
				capped = append(capped, fmt.Sprintf("%s v%d→v%d", kmsg.NameForKey(k), v, mv))
			}
		})
		dedup := "relayed undecided (no producer ids before message format v2)"
		if produce >= protocol.ProduceMinVersion {
			dedup = "idempotent and legacy producers"
		}
		cap := "none"
		if len(capped) > 0 {
			cap = strings.Join(capped, ", ")
		}
		fmt.Fprintf(&b, "| %s | up to v%d | %s | %s |\n", strings.TrimPrefix(name, "v"), produce, dedup, cap)
	}
	return b.String()
}

// TestVersionsDoc: docs/real-cluster.md states the versions the proxy
// decodes, and what each Kafka release gets, as the caps give them.
func TestVersionsDoc(t *testing.T) {
	path := filepath.Join("..", "..", "docs", "real-cluster.md")
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := string(raw)
	i, j := strings.Index(s, versionsStart), strings.Index(s, versionsEnd)
	if i < 0 || j < i {
		t.Fatalf("%s: no %q ... %q block", path, versionsStart, versionsEnd)
	}
	want := versionsStart + "\n" + versionsTables() + versionsEnd
	if s[i:j+len(versionsEnd)] == want {
		return
	}
	if *updateVersions {
		if err := os.WriteFile(path, []byte(s[:i]+want+s[j+len(versionsEnd):]), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("%s's version tables are not what the caps give (go test ./protocol -run TestVersionsDoc -args -update-versions):\n%s", path, want)
}
