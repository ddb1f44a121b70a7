package auth

import "sync"

// Anonymous is Kafka's principal for a connection that did not authenticate
// (KafkaPrincipal.ANONYMOUS).
const Anonymous = "User:ANONYMOUS"

// PrincipalID is a principal's dense number in [Principals].
// 0 is ANONYMOUS.
type PrincipalID = uint32

// Principals numbers the principals seen, so that state keys hold a
// uint32. Bounded: principals come only from exchanges the broker accepted.
type Principals struct {
	mu    sync.Mutex
	ids   map[string]PrincipalID
	names []string // by id - 1
}

// maxPrincipals bounds the principals numbered; a connection past it is
// relayed undecided.
const maxPrincipals = 1 << 20

// ID numbers name, the first time it is seen; ok is false once
// maxPrincipals are numbered.
func (p *Principals) ID(name string) (PrincipalID, bool) {
	if name == Anonymous {
		return 0, true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ids == nil {
		p.ids = map[string]PrincipalID{}
	}
	if id, ok := p.ids[name]; ok {
		return id, true
	}
	if len(p.ids) >= maxPrincipals {
		return 0, false
	}
	id := PrincipalID(len(p.ids) + 1)
	p.ids[name] = id
	p.names = append(p.names, name)
	return id, true
}

// Name returns the principal numbered id.
func (p *Principals) Name(id PrincipalID) (string, bool) {
	if id == 0 {
		return Anonymous, true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if int(id) > len(p.names) {
		return "", false
	}
	return p.names[id-1], true
}
