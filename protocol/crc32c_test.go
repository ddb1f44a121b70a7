package protocol

import (
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

// TestCRCSuffix checks the derivation of crc(B) from crc(A‖B) against
// hash/crc32 over lengths around every power of two up to 4 MiB.
func TestCRCSuffix(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 40+4<<20+1)
	for i := range buf {
		buf[i] = byte(r.Uint32())
	}
	var lens []int
	for n := 1; n <= 4<<20; n *= 2 {
		lens = append(lens, n-1, n, n+1)
	}
	for _, n := range lens {
		whole := buf[:40+n]
		want := crc32.Checksum(whole[40:], castagnoli)
		if got := crcSuffix(crc32.Checksum(whole, castagnoli), whole[:40], n); got != want {
			t.Fatalf("len %d: derived %08x, direct %08x", n, got, want)
		}
	}
}

func BenchmarkCRCSuffix(b *testing.B) {
	a := make([]byte, 40)
	b.ReportAllocs()
	for b.Loop() {
		sinkU32 = crcSuffix(0x12345678, a, 1<<20)
	}
}

var sinkU32 uint32

// TestRecordsFingerprintDerivedMatchesDirect: for valid batches above the
// threshold, the fingerprint derived from the header CRC equals the one
// computed by reading the records.
func TestRecordsFingerprintDerivedMatchesDirect(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{deriveRecordsCRCFrom - 1, deriveRecordsCRCFrom, deriveRecordsCRCFrom + 1, 10000, 1 << 20} {
		recs := make([]byte, n)
		for i := range recs {
			recs[i] = byte(r.Uint32())
		}
		b := make([]byte, batchHeaderSize, batchHeaderSize+n)
		b[16] = 2 // magic
		b = append(b, recs...)
		putU32 := func(off int, v uint32) {
			b[off], b[off+1], b[off+2], b[off+3] = byte(v>>24), byte(v>>16), byte(v>>8), byte(v)
		}
		putU32(8, uint32(len(b)-batchLogOverhead))
		putU32(57, 7)                                                     // numRecords
		putU32(17, crc32.Checksum(b[batchAttributesOffset:], castagnoli)) // crc
		var h BatchHeader
		if _, err := ReadBatch(b, &h); err != nil {
			t.Fatal(err)
		}
		got := RecordsFingerprint(b, &h)
		meta := uint64(uint32(h.NumRecords))<<3 | uint64(h.Attributes&attrCompressionMask)
		x := mix64(uint64(n)<<32 | uint64(crc32.Checksum(recs, castagnoli)) ^ mix64(meta))
		if want := uint32(x) ^ uint32(x>>32); got != want {
			t.Fatalf("records of %d bytes: fingerprint %x, direct %x", n, got, want)
		}
	}
}
