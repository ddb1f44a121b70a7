package protocol

import "hash/crc32"

// CRC-32C arithmetic in GF(2), for deriving the checksum of a batch's records
// from the checksum the batch already carries.
//
// A v2 batch's CRC covers attributes..end: a 40-byte header part A followed
// by the records B (KIP-98). CRCs are linear, so
//
//	crc(A‖B) = crc(A)·x^(8·len(B)) mod P  ⊕  crc(B)
//
// and crc(B) follows from the header's CRC and crc(A) in O(log len(B)) time,
// without reading B. That takes the only per-byte cost out of the
// duplicate-detection path for large batches.
//
// Polynomials are in the reflected form hash/crc32 uses: bit 31 is x^0.

// castagnoliReflected is the reflected Castagnoli polynomial (crc32.Castagnoli).
const castagnoliReflected = 0x82f63b78

// mulModP multiplies two polynomials modulo P.
func mulModP(a, b uint32) uint32 {
	var p uint32
	for m := uint32(1) << 31; m != 0; m >>= 1 {
		if a&m != 0 {
			p ^= b
		}
		// b *= x
		if b&1 != 0 {
			b = b>>1 ^ castagnoliReflected
		} else {
			b >>= 1
		}
	}
	return p
}

// x2n[k] is x^(2^k) mod P.
var x2n = func() (t [64]uint32) {
	p := uint32(1) << 30 // x^1
	for k := range t {
		t[k] = p
		p = mulModP(p, p)
	}
	return t
}()

// xPow8n returns x^(8n) mod P: the operator that appends n zero bytes.
func xPow8n(n int) uint32 {
	p := uint32(1) << 31 // x^0
	for k := 3; n != 0; n, k = n>>1, k+1 {
		if n&1 != 0 {
			p = mulModP(x2n[k&63], p)
		}
	}
	return p
}

// crcSuffix returns crc(B) given crc(A‖B), A and len(B).
func crcSuffix(crcAB uint32, a []byte, lenB int) uint32 {
	return crcAB ^ mulModP(xPow8n(lenB), crc32.Checksum(a, castagnoli))
}
