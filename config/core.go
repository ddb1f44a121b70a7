package config

import "github.com/dedupproxy/dedupproxy/decide"

// The dedup settings as the decision core (package decide) takes them: its
// enums for the keys' strings.

// CoreScope is dedup.legacy.scope as the core takes it.
func (dc *DedupConfig) CoreScope() decide.Scope {
	if dc.Legacy.Scope == ScopeClientID {
		return decide.ScopeClientID
	}
	return decide.ScopeInstance
}

// CoreSettings are the decision core's settings that dc gives, those a
// running proxy may change (dedup.mode, dedup.legacy.match, dedup.topics).
func (dc *DedupConfig) CoreSettings() *decide.Settings {
	s := &decide.Settings{Mode: coreMode(dc.Mode), Match: coreMatch(dc.Legacy.Match)}
	for name, tc := range dc.Topics {
		var ts decide.TopicSettings
		if tc.Mode != "" {
			m := coreMode(tc.Mode)
			ts.Mode = &m
		}
		if tc.LegacyMatch != "" {
			m := coreMatch(tc.LegacyMatch)
			ts.Match = &m
		}
		if tc.IdempotencyKey != nil {
			ts.KeyHeader = tc.IdempotencyKey.Header
		}
		if ts != (decide.TopicSettings{}) {
			if s.Topics == nil {
				s.Topics = map[string]decide.TopicSettings{}
			}
			s.Topics[name] = ts
		}
	}
	return s
}

func coreMode(m string) decide.Mode {
	switch m {
	case DedupObserve:
		return decide.Observe
	case DedupOff:
		return decide.Off
	}
	return decide.Enforce
}

func coreMatch(m string) decide.Match {
	switch m {
	case MatchRecords:
		return decide.MatchRecords
	case MatchExact:
		return decide.MatchExact
	case MatchOff:
		return decide.MatchOff
	}
	return decide.MatchAuto
}
