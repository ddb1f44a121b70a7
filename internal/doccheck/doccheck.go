// Package doccheck splits the project's documents (markdown, and the
// comments of YAML and systemd files) into sentences, so that tests can
// hold what the documents state to one source: bench's TestDocFigures the
// cost figures to bench/results, cmd/dedupproxy's TestDocsSIGHUPKeys the
// keys SIGHUP applies to the reload code.
//
// It lives under internal/ because those two packages use it.
package doccheck

import (
	"regexp"
	"strings"
)

// Unit is a sentence of a document, or a markdown table row (whose first
// cell says what the others measure).
type Unit struct {
	Line int    // the line it starts on, from 1
	Text string // markdown markup and comment signs kept, lines joined
	// Paragraph numbers the paragraph (or comment block, or table row)
	// the unit belongs to: units of one paragraph share it.
	Paragraph int
	// Key is the dotted YAML key a comment block documents (the key on
	// the line after the block: dedup.max_entries), or empty.
	Key string
}

var sentenceEnd = regexp.MustCompile(`[.;:!?]\s+|\s+—\s+`)

// Units splits text into sentences. In a YAML or systemd file (hashComments)
// the text is its comments, each block read as a paragraph; in markdown a
// heading is a paragraph of its own. Lines from a line starting with
// skipStart to one starting with skipEnd are left out (a generated block
// checked whole); empty skipStart skips nothing.
func Units(text string, hashComments bool, skipStart, skipEnd string) []Unit {
	var (
		out       []Unit
		para      []string
		start     int
		paragraph int
		// path holds the YAML keys enclosing the current line, by indent.
		path []yamlKey
	)
	flush := func(key string) {
		if len(para) > 0 {
			paragraph++
			for _, s := range sentenceEnd.Split(strings.Join(para, " "), -1) {
				if s = strings.TrimSpace(s); s != "" {
					out = append(out, Unit{Line: start, Text: s, Paragraph: paragraph, Key: key})
				}
			}
		}
		para = nil
	}
	skipping, comments := false, false
	for i, line := range strings.Split(text, "\n") {
		switch {
		case skipStart != "" && strings.HasPrefix(line, skipStart):
			flush("")
			skipping = true
			continue
		case skipping && strings.HasPrefix(line, skipEnd):
			skipping = false
			continue
		case skipping:
			continue
		}
		trimmed := strings.TrimSpace(line)
		comment := hashComments && strings.HasPrefix(trimmed, "#")
		if !hashComments && strings.HasPrefix(trimmed, "#") {
			flush("")
			paragraph++
			out = append(out, Unit{Line: i + 1, Text: trimmed, Paragraph: paragraph})
			continue
		}
		if hashComments && !comment && trimmed != "" {
			indent := len(line) - len(strings.TrimLeft(line, " "))
			key, _, isKey := strings.Cut(trimmed, ":")
			for len(path) > 0 && path[len(path)-1].indent >= indent {
				path = path[:len(path)-1]
			}
			if isKey && !strings.ContainsAny(key, " |`") {
				path = append(path, yamlKey{indent, key})
				if comments {
					flush(dotted(path))
				}
			}
		}
		comments = comment
		if hashComments {
			if !comment {
				flush("")
				continue // YAML or a unit file's settings: not prose
			}
			trimmed = strings.TrimSpace(strings.TrimLeft(trimmed, "#"))
		}
		if trimmed == "" || strings.HasPrefix(trimmed, "|") {
			flush("")
		}
		if trimmed == "" {
			continue
		}
		if strings.HasPrefix(trimmed, "|") {
			paragraph++
			out = append(out, Unit{Line: i + 1, Text: trimmed, Paragraph: paragraph})
			continue
		}
		if len(para) == 0 {
			start = i + 1
		}
		para = append(para, trimmed)
	}
	flush("")
	return out
}

type yamlKey struct {
	indent int
	key    string
}

func dotted(path []yamlKey) string {
	keys := make([]string, len(path))
	for i, k := range path {
		keys[i] = k.key
	}
	return strings.Join(keys, ".")
}
