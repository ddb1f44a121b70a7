package wire

import "testing"

func TestCountRecords(t *testing.T) {
	batch := func(n int32, extra int) []byte {
		b := make([]byte, 61+extra)
		putU32 := func(off int, v uint32) {
			b[off], b[off+1], b[off+2], b[off+3] = byte(v>>24), byte(v>>16), byte(v>>8), byte(v)
		}
		putU32(8, uint32(len(b)-12))
		putU32(57, uint32(n))
		return b
	}
	two := append(batch(3, 10), batch(4, 0)...)
	if got := countRecords(two); got != 7 {
		t.Errorf("countRecords = %d, want 7", got)
	}
	if got := countRecords(two[:80]); got != 3 {
		t.Errorf("truncated second batch: countRecords = %d, want 3", got)
	}
}
