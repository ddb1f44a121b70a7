package protocol

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestParseRequestHeaderEveryAPI checks the header parser against kmsg's
// encoder for every API key and version kmsg knows, with and without a
// client id: the body starts exactly where kmsg put it (flexible versions
// carry a tagged-field section after the client id, KIP-482).
func TestParseRequestHeaderEveryAPI(t *testing.T) {
	for k := int16(0); k <= kmsg.MaxKey; k++ {
		req := kmsg.RequestForKey(k)
		if req == nil {
			continue
		}
		for v := int16(0); v <= req.MaxVersion(); v++ {
			if k == int16(kmsg.ControlledShutdown) && v == 0 {
				continue // kmsg's formatter writes no body for it; a broker-to-controller request anyway
			}
			req.SetVersion(v)
			body := req.AppendTo(nil)
			for _, f := range []*kmsg.RequestFormatter{kmsg.NewRequestFormatter(), kmsg.NewRequestFormatter(kmsg.FormatterClientID("client-ü"))} {
				frame := f.AppendRequest(nil, req, 42)[4:]
				h, err := ParseRequestHeader(frame)
				if err != nil {
					t.Fatalf("%s v%d: %v", kmsg.NameForKey(k), v, err)
				}
				if h.APIKey != k || h.APIVersion != v || h.CorrelationID != 42 {
					t.Fatalf("%s v%d: parsed %+v", kmsg.NameForKey(k), v, h)
				}
				if want := len(frame) - len(body); h.BodyOffset != want {
					t.Fatalf("%s v%d: body offset %d, want %d", kmsg.NameForKey(k), v, h.BodyOffset, want)
				}
			}
		}
	}
}

// TestApiVersionsNewerThanKnownIsRelayed pins the KIP-511 rule: a client
// opens with the newest ApiVersions it knows; the broker, not the proxy,
// answers a too-new one, so the proxy must not reject it.
func TestApiVersionsNewerThanKnownIsRelayed(t *testing.T) {
	maxV, _ := KnownAPI(int16(kmsg.ApiVersions))
	frame := binary.BigEndian.AppendUint16(nil, uint16(kmsg.ApiVersions))
	frame = binary.BigEndian.AppendUint16(frame, uint16(maxV+1))
	frame = binary.BigEndian.AppendUint32(frame, 9)
	frame = append(frame, 0xff, 0xff, 0)
	h, err := ParseRequestHeader(frame)
	if err != nil || h.CorrelationID != 9 || h.BodyOffset != 0 {
		t.Fatalf("got %+v, %v", h, err)
	}
	frame[3]++ // Metadata is not special
	binary.BigEndian.PutUint16(frame, uint16(kmsg.Metadata))
	binary.BigEndian.PutUint16(frame[2:], 999)
	if _, err := ParseRequestHeader(frame); !errors.Is(err, ErrUnsupportedVersion) {
		t.Fatalf("Metadata v999: %v", err)
	}
}

func TestProduceAcksEveryVersion(t *testing.T) {
	for v := int16(0); v <= kmsg.NewPtrProduceRequest().MaxVersion(); v++ {
		for _, txn := range []*string{nil, kmsg.StringPtr(""), kmsg.StringPtr("txn-1")} {
			for _, acks := range []int16{-1, 0, 1} {
				req := kmsg.NewPtrProduceRequest()
				req.SetVersion(v)
				req.TransactionID, req.Acks = txn, acks
				frame := kmsg.NewRequestFormatter().AppendRequest(nil, req, 1)[4:]
				h, err := ParseRequestHeader(frame)
				if err != nil {
					t.Fatal(err)
				}
				got, err := ProduceAcks(frame, h)
				if err != nil || got != acks {
					t.Fatalf("v%d txn=%v: acks %d, %v; want %d", v, txn, got, err, acks)
				}
				if _, err := ProduceAcks(frame[:h.BodyOffset+1], h); err == nil && v < 3 {
					t.Fatalf("v%d: truncated acks accepted", v)
				}
			}
		}
	}
}

func TestReadFrameDiagnoses(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []byte
		want error
	}{
		{"tls", []byte{0x16, 0x03, 0x01, 0x00, 0xa5, 0x01}, ErrLooksLikeTLS},
		{"http", []byte("GET / HTTP/1.1\r\n"), ErrLooksLikeHTTP},
		{"too large", []byte{0x10, 0, 0, 0}, ErrFrameTooLarge},
		{"negative", []byte{0xff, 0xff, 0xff, 0xff}, ErrFrameSize},
		{"too small", []byte{0, 0, 0, 3, 1, 2, 3}, ErrFrameSize},
		{"truncated body", []byte{0, 0, 0, 20, 0, 18, 0, 0}, io.ErrUnexpectedEOF},
		{"empty", nil, io.EOF},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := ReadFrame(bytes.NewReader(tc.in), nil, DefaultMaxFrameSize, RequestMinSize)
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
}

func TestReadFrameReusesAndGrows(t *testing.T) {
	small := AppendFrame(nil, bytes.Repeat([]byte{1}, 100))
	big := AppendFrame(nil, bytes.Repeat([]byte{2}, 10000))
	r := bytes.NewReader(append(append(append([]byte{}, small...), big...), small...))
	buf := make([]byte, 0, 256)
	for i, want := range [][]byte{small, big, small} {
		body, nbuf, err := ReadFrame(r, buf, DefaultMaxFrameSize, RequestMinSize)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(nbuf[:4+len(body)], want) {
			t.Fatalf("frame %d: buf[:4+len(body)] is not the frame as sent", i)
		}
		buf = nbuf
	}
}

// FuzzReadFrame: ReadFrame never panics; on success the body has the size
// its prefix says, the whole frame sits in buf[:4+len(body)], and no more
// than that was consumed from the input.
func FuzzReadFrame(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})                      // size -1
	f.Add([]byte{0x06, 0x40, 0x00, 0x01})                      // above the maximum
	f.Add([]byte{0, 0, 0, 10, 0, 3, 0, 0})                     // truncated
	f.Add(append(AppendFrame(nil, make([]byte, 12)), 1, 2, 3)) // trailing garbage
	f.Add([]byte{0x16, 0x03, 0x01, 0x00})
	f.Add([]byte("POST / HTTP/1.1"))
	f.Fuzz(func(t *testing.T, in []byte) {
		r := bytes.NewReader(in)
		body, buf, err := ReadFrame(r, nil, 1<<20, RequestMinSize)
		if err != nil {
			return
		}
		consumed := len(in) - r.Len()
		if consumed != 4+len(body) {
			t.Fatalf("consumed %d for a body of %d", consumed, len(body))
		}
		if int(binary.BigEndian.Uint32(in)) != len(body) || !bytes.Equal(buf[:4+len(body)], in[:consumed]) {
			t.Fatal("frame does not match its input")
		}
	})
}

// FuzzRequestHeader: ParseRequestHeader never panics, never reports a body
// offset beyond the frame, and agrees with kmsg: for a request kmsg encodes,
// the body offset is where kmsg put the body.
func FuzzRequestHeader(f *testing.F) {
	f.Add([]byte{}, int16(0), int16(0))
	f.Add([]byte{0, 3, 0, 12, 0, 0, 0, 1, 0, 1, 'a', 0}, int16(3), int16(12))
	f.Add([]byte{0, 0, 0, 9, 0, 0, 0, 1, 0xff, 0xff, 5, 1, 2}, int16(0), int16(9))
	f.Fuzz(func(t *testing.T, in []byte, key, version int16) {
		h, err := ParseRequestHeader(in)
		if err == nil && (h.BodyOffset > len(in) || h.BodyOffset < 0) {
			t.Fatalf("body offset %d beyond %d bytes", h.BodyOffset, len(in))
		}
		if err == nil {
			ClientSoftware(in, h) // never panics on what a client sends
		}
		req := kmsg.RequestForKey(key)
		if req == nil || version < 0 || version > req.MaxVersion() || (key == int16(kmsg.ControlledShutdown) && version == 0) {
			return
		}
		req.SetVersion(version)
		frame := kmsg.NewRequestFormatter(kmsg.FormatterClientID(string(in))).AppendRequest(nil, req, 7)[4:]
		h, err = ParseRequestHeader(frame)
		if err != nil {
			t.Fatal(err)
		}
		if want := len(frame) - len(req.AppendTo(nil)); h.BodyOffset != want {
			t.Fatalf("body offset %d, kmsg's %d", h.BodyOffset, want)
		}
	})
}
