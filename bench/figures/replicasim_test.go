package figures

import (
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
)

// TestReplicaSimulation: the simulation reads every figure it needs from
// the committed bench results, and scales as its model says: the busiest
// replica's tables and CPU shrink with the replica count, a restart moves
// that replica's share of partitions, each read once per wave.
func TestReplicaSimulation(t *testing.T) {
	in, err := readMeasured(filepath.Join("..", "results"))
	if err != nil {
		t.Fatal(err)
	}
	if in.EntryBytes < 50 || in.EntryBytes > 2000 || in.RecordBytes < 10 || in.WarmMsPerMB <= 0 || in.CPUmsPerMB <= 0 {
		t.Fatalf("implausible measured figures: %+v", in)
	}
	m := replicaModel{Brokers: 100, Partitions: 100000, Producers: 1000000, PartitionsPerProducer: 1, MBps: 1000,
		LegacyShare: 0.5, RecordKB: 1, Hold: 31e9, Window: 120e9, WarmMaxBytes: 4 << 20, FetchMBps: 200, CoresPerReplica: 2, ConnsPerProducer: 1}
	f5, f10 := simulate(m, in, 5), simulate(m, in, 10)
	if f5.NodesMax != 20 || f10.NodesMax != 10 || f5.MovedPartitions != 20000 {
		t.Errorf("shares: %+v %+v", f5, f10)
	}
	if r := f5.EntriesMB / f10.EntriesMB; r < 1.99 || r > 2.01 {
		t.Errorf("tables of 5 replicas ÷ 10: %.3f, want 2", r)
	}
	if f5.WarmGB != 2*float64(f5.MovedPartitions)*f5.TailMB/1000 {
		t.Errorf("a restart reads each moved partition twice: %+v", f5)
	}
	if err := ReplicasMain(t.Context(), []string{"-results", filepath.Join("..", "results"), "-replicas", "3,10"}, io.Discard, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	writeReplicaReport(&b, m, in, []int{3})
	if !strings.Contains(b.String(), "| 3 | 34 |") {
		t.Errorf("report:\n%s", b.String())
	}
}
