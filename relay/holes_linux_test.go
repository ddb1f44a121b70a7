package relay

import "testing"

// TestRequestMappingsBounded: the mappings of requests with holes are reused,
// and what idle ones hold stays bounded: one written beyond keptDirtyPages
// is emptied before it is kept, and at most maxIdleMappings are kept.
func TestRequestMappingsBounded(t *testing.T) {
	var pp PipePool
	defer pp.Close()
	const n = 3 << 20
	b, dirty := pp.mapping(n)
	if len(b) < n || dirty != 0 {
		t.Fatalf("new mapping: %d bytes, %d dirty pages; want >= %d, 0", len(b), dirty, n)
	}
	b[100], b[n-1] = 1, 2
	pp.keepMapping(b, 2)
	again, dirty := pp.mapping(n - 1)
	if &again[0] != &b[0] || dirty != 2 || again[100] != 1 || again[n-1] != 2 {
		t.Fatalf("kept mapping not reused as it was: same=%v dirty=%d bytes %d %d", &again[0] == &b[0], dirty, again[100], again[n-1])
	}
	pp.keepMapping(again, keptDirtyPages+1)
	emptied, dirty := pp.mapping(n)
	if &emptied[0] != &b[0] || dirty != 0 || emptied[100] != 0 || emptied[n-1] != 0 {
		t.Fatalf("mapping over keptDirtyPages not emptied: same=%v dirty=%d bytes %d %d", &emptied[0] == &b[0], dirty, emptied[100], emptied[n-1])
	}
	if big, _ := pp.mapping(2 * n); len(big) < 2*n {
		t.Fatalf("mapping for %d bytes has %d", 2*n, len(big))
	} else {
		pp.keepMapping(big, 0)
	}
	pp.keepMapping(emptied, 0)
	var taken [][]byte
	for range maxIdleMappings + 3 {
		m, _ := pp.mapping(n)
		taken = append(taken, m)
	}
	for _, m := range taken {
		pp.keepMapping(m, 1)
	}
	if len(pp.maps) != maxIdleMappings {
		t.Fatalf("%d idle mappings kept, want %d", len(pp.maps), maxIdleMappings)
	}
}
