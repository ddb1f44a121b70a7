package certprincipal

import (
	"encoding/asn1"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// attributeKeyword is the RFC 2253 keyword Java prints for an attribute
// type; any other type is printed as its dotted OID, with its value in
// hex.
var attributeKeyword = map[string]string{
	"2.5.4.3":                    "CN",
	"2.5.4.6":                    "C",
	"2.5.4.7":                    "L",
	"2.5.4.8":                    "ST",
	"2.5.4.9":                    "STREET",
	"2.5.4.10":                   "O",
	"2.5.4.11":                   "OU",
	"0.9.2342.19200300.100.1.1":  "UID",
	"0.9.2342.19200300.100.1.25": "DC",
}

// rawAttribute is one AttributeTypeAndValue with its value undecoded: the
// string tag and the exact bytes matter to the printed name.
type rawAttribute struct {
	Type  asn1.ObjectIdentifier
	Value asn1.RawValue
}

// rawRDNSET is a RelativeDistinguishedName: encoding/asn1 reads a type
// whose name ends in SET as an ASN.1 SET, keeping the encoded order.
type rawRDNSET []rawAttribute

// ErrSubject marks a certificate subject that does not parse.
var ErrSubject = errors.New("certificate subject does not parse")

// Subject returns the RFC 2253 name of a DER-encoded subject as Java's
// X500Principal.getName() prints it.
func Subject(rawSubject []byte) (string, error) {
	var rdns []rawRDNSET
	rest, err := asn1.Unmarshal(rawSubject, &rdns)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrSubject, err)
	}
	if len(rest) != 0 {
		return "", fmt.Errorf("%w: %d bytes after it", ErrSubject, len(rest))
	}
	var b strings.Builder
	for i := len(rdns) - 1; i >= 0; i-- {
		if i != len(rdns)-1 {
			b.WriteByte(',')
		}
		for j, a := range rdns[i] {
			if j > 0 {
				b.WriteByte('+')
			}
			writeAttribute(&b, a)
		}
	}
	return b.String(), nil
}

// directoryStringTags are the value tags Java prints as text; any other
// value is printed as "#" and the hex of its encoding.
var directoryStringTags = map[int]bool{
	asn1.TagPrintableString: true,
	asn1.TagT61String:       true,
	asn1.TagIA5String:       true,
	27:                      true, // GeneralString
	asn1.TagBMPString:       true,
	asn1.TagUTF8String:      true,
}

func writeAttribute(b *strings.Builder, a rawAttribute) {
	oid := a.Type.String()
	kw, named := attributeKeyword[oid]
	if !named {
		kw = oid
	}
	b.WriteString(kw)
	b.WriteByte('=')
	v := a.Value
	if !named || v.Class != asn1.ClassUniversal || v.IsCompound || !directoryStringTags[v.Tag] {
		b.WriteByte('#')
		b.WriteString(hex.EncodeToString(v.FullBytes))
		return
	}
	// Java reads every string type's bytes as UTF-8 (a BMPString's too),
	// escapes RFC 2253's specials and "=", "#" anywhere, and NUL as \00,
	// then each leading and trailing space or carriage return.
	var esc []rune
	for _, r := range javaUTF8(v.Bytes) {
		switch r {
		case ',', '=', '+', '<', '>', '#', ';', '"', '\\':
			esc = append(esc, '\\', r)
		case 0:
			esc = append(esc, '\\', '0', '0')
		default:
			esc = append(esc, r)
		}
	}
	lead := 0
	for lead < len(esc) && (esc[lead] == ' ' || esc[lead] == '\r') {
		lead++
	}
	trail := len(esc) - 1
	for trail >= 0 && (esc[trail] == ' ' || esc[trail] == '\r') {
		trail--
	}
	for i, r := range esc {
		if i < lead || i > trail {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
}

// javaUTF8 decodes b as Java's UTF-8 decoder does, each malformed sequence
// replaced by one U+FFFD. Which bytes make up one malformed sequence
// differs from Go's decoder (a surrogate's three bytes are one; a
// truncated sequence at the end is one), and the principal must be
// Kafka's.
func javaUTF8(b []byte) []rune {
	out := make([]rune, 0, len(b))
	cont := func(i int) bool { return i < len(b) && b[i]&0xc0 == 0x80 }
	for i := 0; i < len(b); {
		b1 := b[i]
		n := 1 // bytes taken
		r := utf8.RuneError
		switch {
		case b1 < 0x80:
			r = rune(b1)
		case b1 >= 0xc2 && b1 <= 0xdf:
			if cont(i + 1) {
				r, n = rune(b1&0x1f)<<6|rune(b[i+1]&0x3f), 2
			}
		case b1 >= 0xe0 && b1 <= 0xef:
			bad2 := i+1 < len(b) && (b1 == 0xe0 && b[i+1]&0xe0 == 0x80 || !cont(i+1))
			switch {
			case bad2:
			case i+2 >= len(b):
				n = len(b) - i // truncated at the end: one
			case !cont(i + 2):
				n = 2
			default:
				c := rune(b1&0x0f)<<12 | rune(b[i+1]&0x3f)<<6 | rune(b[i+2]&0x3f)
				n = 3
				if c < 0xd800 || c > 0xdfff {
					r = c
				}
			}
		case b1 >= 0xf0 && b1 <= 0xf4:
			bad2 := i+1 < len(b) && (b1 == 0xf0 && (b[i+1] < 0x90 || b[i+1] > 0xbf) ||
				b1 == 0xf4 && b[i+1]&0xf0 != 0x80 || !cont(i+1))
			switch {
			case bad2:
			case i+2 < len(b) && !cont(i+2):
				n = 2
			case i+3 >= len(b):
				n = len(b) - i // truncated at the end: one
			case !cont(i + 3):
				n = 3
			default:
				r, n = rune(b1&0x07)<<18|rune(b[i+1]&0x3f)<<12|rune(b[i+2]&0x3f)<<6|rune(b[i+3]&0x3f), 4
			}
		}
		out = append(out, r)
		i += n
	}
	return out
}

// Mapper applies ssl.principal.mapping.rules to a subject name.
type Mapper struct {
	rules []mappingRule
}

// mappingRule is one rule: DEFAULT, or RULE:pattern/replacement/[LU].
type mappingRule struct {
	text        string // as written, for messages
	pattern     string
	replacement string
	isDefault   bool
	find        *regexp.Regexp // the pattern, unanchored: what is replaced
	whole       *regexp.Regexp // the pattern over the whole name: whether the rule applies
	after       *regexp.Regexp // one character, then the pattern: an empty match after a match
	repl        []replacePart
	lower       bool
	upper       bool
}

// replacePart is a literal, or (group >= 0) a capturing group's text.
type replacePart struct {
	lit   string
	group int
}

// ParseRules reads Kafka's ssl.principal.mapping.rules:
// rules separated by commas (with any whitespace around them), each
// DEFAULT or RULE:pattern/replacement/ with an optional L or U after the
// last slash; "\" escapes a "/" (or anything) in the pattern and the
// replacement. Empty rules are skipped. An empty value means DEFAULT.
func ParseRules(s string) (*Mapper, error) {
	texts, err := splitMappingRules(s)
	if err != nil {
		return nil, err
	}
	m := &Mapper{}
	for i, t := range texts {
		r, err := parseMappingRule(t)
		if err != nil {
			return nil, fmt.Errorf("rule %d %q: %w", i+1, t, err)
		}
		m.rules = append(m.rules, r)
	}
	if len(m.rules) == 0 {
		m.rules = []mappingRule{{text: "DEFAULT", isDefault: true}}
	}
	return m, nil
}

// isSpace is Java's regular expression \s.
func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'
}

// splitMappingRules splits the value into rules the way Kafka does: each
// rule ends where a comma (or the end) follows it, past any whitespace; a
// RULE's pattern and replacement may hold commas. A line break inside a
// rule is refused (Kafka would silently drop the text before it).
func splitMappingRules(s string) ([]string, error) {
	// Java's String.trim: every character up to U+0020 at either end.
	s = strings.TrimFunc(s, func(r rune) bool { return r <= ' ' })
	var rules []string
	// sepAt reports whether a separator starts at q (whitespace, then a
	// comma or the end) and where the next rule starts after it.
	sepAt := func(q int) (int, bool) {
		for q < len(s) && isSpace(s[q]) {
			q++
		}
		if q == len(s) {
			return q, true
		}
		if s[q] != ',' {
			return 0, false
		}
		q++
		for q < len(s) && isSpace(s[q]) {
			q++
		}
		return q, true
	}
	// endFrom returns the first q >= from where a separator starts,
	// crossing no line break.
	endFrom := func(from int) (end, next int, ok bool) {
		for q := from; q <= len(s); q++ {
			if n, ok := sepAt(q); ok {
				return q, n, true
			}
			if q < len(s) && s[q] == '\n' {
				return 0, 0, false
			}
		}
		return 0, 0, false
	}
	p := 0
	for {
		for p < len(s) && isSpace(s[p]) {
			p++
		}
		if p == len(s) {
			return rules, nil
		}
		var end, next int
		ok := false
		if strings.HasPrefix(s[p:], "DEFAULT") {
			if next, ok = sepAt(p + len("DEFAULT")); ok {
				end = p + len("DEFAULT")
			}
		}
		if !ok && strings.HasPrefix(s[p:], "RULE:") {
			if q, _, _, _, good := ruleBody(s, p+len("RULE:")); good {
				end, next, ok = endFrom(q)
			}
		}
		if !ok {
			if end, next, ok = endFrom(p); !ok {
				return nil, fmt.Errorf("cannot split the rules at %q: a line break inside a rule (separate rules with commas)", s[p:])
			}
		}
		if end > p {
			rules = append(rules, s[p:end])
		}
		p = next
	}
}

// ruleBody reads "pattern/replacement/" and an optional L or U from s[i:],
// returning where it ends: a pattern or replacement runs to the first "/"
// not escaped by "\" (an escape does not take a line break).
func ruleBody(s string, i int) (end int, pattern, replacement string, flag byte, ok bool) {
	part := func(i int) (string, int, bool) {
		start := i
		for i < len(s) {
			switch s[i] {
			case '/':
				return s[start:i], i + 1, true
			case '\\':
				if i+1 >= len(s) || s[i+1] == '\n' {
					return "", 0, false
				}
				_, w := utf8.DecodeRuneInString(s[i+1:])
				i += 1 + w
			default:
				i++
			}
		}
		return "", 0, false
	}
	if pattern, i, ok = part(i); !ok {
		return 0, "", "", 0, false
	}
	if replacement, i, ok = part(i); !ok {
		return 0, "", "", 0, false
	}
	if i < len(s) && (s[i] == 'L' || s[i] == 'U') {
		flag = s[i]
		i++
	}
	return i, pattern, replacement, flag, true
}

func parseMappingRule(t string) (mappingRule, error) {
	if t == "DEFAULT" {
		return mappingRule{text: t, isDefault: true}, nil
	}
	rest, ok := strings.CutPrefix(t, "RULE:")
	if !ok {
		return mappingRule{}, errors.New("want DEFAULT or RULE:pattern/replacement/ (optionally followed by L or U)")
	}
	end, pattern, replacement, flag, ok := ruleBody(rest, 0)
	if !ok {
		return mappingRule{}, errors.New("want RULE:pattern/replacement/ (optionally followed by L or U)")
	}
	if end != len(rest) {
		return mappingRule{}, fmt.Errorf("%q after the rule: only L or U may follow its last slash", rest[end:])
	}
	r := mappingRule{text: t, pattern: pattern, replacement: replacement, lower: flag == 'L', upper: flag == 'U'}
	if strings.Contains(pattern, "&&") {
		// Inside a character class Java reads && as an intersection,
		// Go as two ampersands.
		return mappingRule{}, fmt.Errorf("pattern %q: && (a Java character class intersection) is not supported", pattern)
	}
	var err error
	if r.find, err = regexp.Compile(pattern); err != nil {
		return mappingRule{}, fmt.Errorf("pattern %q: %w (patterns are Go RE2 expressions: no lookaround, backreferences or possessive quantifiers)", pattern, err)
	}
	r.whole = regexp.MustCompile(`\A(?:` + pattern + `)\z`)
	r.after = regexp.MustCompile(`\A(?s:.)(?:` + pattern + `)`)
	if r.repl, err = parseReplacement(replacement, r.find); err != nil {
		return mappingRule{}, fmt.Errorf("replacement %q: %w", replacement, err)
	}
	return r, nil
}

// parseReplacement reads a replacement as Kafka applies it. Kafka first
// makes a "$n" naming a group the pattern does not have a literal "$n",
// after dropping its trailing digits while n is 10 or more and still too
// large; then Java's replacement syntax applies: "$n" (digits taken while
// they name a group), "${name}", "\x" for a literal x. What Kafka would
// fail on at every connection is refused here.
func parseReplacement(repl string, re *regexp.Regexp) ([]replacePart, error) {
	groups := re.NumSubexp()
	u := utf16.Encode([]rune(repl))
	if groups > 0 {
		literal := 0
		var out []uint16
		for i := 0; i < len(u); i++ {
			if u[i] != '$' || i+1 >= len(u) || !isDigit16(u[i+1]) {
				out = append(out, u[i])
				continue
			}
			j := i + 1
			for j < len(u) && isDigit16(u[j]) {
				j++
			}
			digits := string(utf16.Decode(u[i+1 : j]))
			if digits[0] != '0' {
				n, err := strconv.ParseInt(digits, 10, 32)
				if err != nil {
					return nil, fmt.Errorf("$%s: too large a group number", digits)
				}
				for n > int64(groups) && n >= 10 {
					n /= 10
				}
				if n > int64(groups) {
					// Kafka escapes each such "$" at its place in the
					// original text, in a text its earlier escapes
					// have lengthened: the second one lands in the
					// wrong place.
					if literal++; literal > 1 {
						return nil, fmt.Errorf("$%s and another $n name groups the pattern does not have (it has %d), which Kafka mangles: write a literal $ as \\$", digits, groups)
					}
					out = append(out, '\\')
				}
			}
			out = append(out, u[i:j]...)
			i = j - 1
		}
		u = out
	}
	names := re.SubexpNames()
	var parts []replacePart
	var lit []uint16
	flush := func() {
		if len(lit) > 0 {
			parts = append(parts, replacePart{lit: string(utf16.Decode(lit)), group: -1})
			lit = nil
		}
	}
	for i := 0; i < len(u); i++ {
		switch c := u[i]; c {
		case '\\':
			i++
			if i >= len(u) {
				return nil, errors.New(`a "\" ends it: nothing to escape`)
			}
			lit = append(lit, u[i])
		case '$':
			i++
			if i >= len(u) {
				return nil, errors.New(`a "$" ends it: no group named`)
			}
			ref := -1
			if u[i] == '{' {
				j := i + 1
				for j < len(u) && u[j] != '}' {
					j++
				}
				if j >= len(u) {
					return nil, errors.New(`"${" without "}"`)
				}
				name := string(utf16.Decode(u[i+1 : j]))
				for k, n := range names {
					if n == name && n != "" {
						ref = k
					}
				}
				if ref < 0 {
					return nil, fmt.Errorf("${%s}: the pattern has no group of that name", name)
				}
				i = j
			} else {
				if !isDigit16(u[i]) {
					return nil, fmt.Errorf(`"$%c": a "$" must name a group (write a literal $ as \$)`, rune(u[i]))
				}
				ref = int(u[i] - '0')
				for i+1 < len(u) && isDigit16(u[i+1]) && ref*10+int(u[i+1]-'0') <= groups {
					i++
					ref = ref*10 + int(u[i]-'0')
				}
				if ref > groups {
					return nil, fmt.Errorf("$%d: the pattern has %d groups", ref, groups)
				}
			}
			flush()
			parts = append(parts, replacePart{group: ref})
		default:
			lit = append(lit, c)
		}
	}
	flush()
	return parts, nil
}

func isDigit16(c uint16) bool { return c >= '0' && c <= '9' }

// Name maps a subject name to Kafka's principal name: the first rule that
// applies decides. ok is false when none applies (Kafka then refuses the
// connection).
func (m *Mapper) Name(dn string) (string, bool) {
	if m == nil {
		return dn, true // DEFAULT
	}
	for i := range m.rules {
		if out, ok := m.rules[i].apply(dn); ok {
			return out, true
		}
	}
	return "", false
}

// apply is one rule: DEFAULT gives the name itself; a RULE applies when its
// pattern matches the whole name, and then every match of the pattern in
// the name is replaced, as Java's String.replaceAll does it.
func (r *mappingRule) apply(dn string) (string, bool) {
	if r.isDefault {
		return dn, true
	}
	if !r.whole.MatchString(dn) {
		return "", false
	}
	var b strings.Builder
	last := 0
	matches := r.find.FindAllStringSubmatchIndex(dn, -1)
	for k, m := range matches {
		b.WriteString(dn[last:m[0]])
		r.expand(&b, dn, m)
		last = m[1]
		// Java's replaceAll also takes an empty match right where a
		// non-empty match ended; Go's skips it.
		if m[1] > m[0] && (k+1 == len(matches) || matches[k+1][0] != m[1]) {
			_, w := utf8.DecodeLastRuneInString(dn[:m[1]])
			from := m[1] - w
			if e := r.after.FindStringSubmatchIndex(dn[from:]); e != nil && e[1] == w {
				// The probe's groups are the pattern's; its whole match
				// includes the character before, the pattern's is empty.
				e[0] = w
				r.expand(&b, dn[from:], e)
			}
		}
	}
	b.WriteString(dn[last:])
	out := b.String()
	switch {
	case r.lower:
		out = strings.ToLower(out)
	case r.upper:
		out = strings.ToUpper(out)
	}
	return out, true
}

// expand writes the replacement for match m of s.
func (r *mappingRule) expand(b *strings.Builder, s string, m []int) {
	for _, p := range r.repl {
		if p.group < 0 {
			b.WriteString(p.lit)
			continue
		}
		if lo, hi := m[2*p.group], m[2*p.group+1]; lo >= 0 {
			b.WriteString(s[lo:hi])
		}
	}
}
