package certprincipal

import (
	"encoding/hex"
	"strings"
	"testing"
	"unicode/utf8"
)

// TestSubjectNameAsJava: a certificate subject's name is what Java's
// X500Principal.getName() prints, Kafka's default principal: RDNs in
// reverse of their encoded order, multi-valued RDNs kept in encoded order
// and joined by "+", RFC 2253 keywords only (any other type as its OID,
// valued in hex), non-string values in hex, specials escaped. The
// expected strings were printed by Java 17's X500Principal.getName() for
// these DER subjects.
func TestSubjectNameAsJava(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ der, want string }{
		{"3010310e300c06035504030c05616c696365", "CN=alice"},
		{"3022310e300c06035504030c05616c6963653110300e06035504030c076d616c6c6f7279", "CN=mallory,CN=alice"},
		{"3020311e300c06035504030c05616c696365300e06035504030c076d616c6c6f7279", "CN=alice+CN=mallory"},
		{"301c310e300c06035504030c05616c696365310a3008060355040a0c0178", "O=x,CN=alice"},
		{"301c310a3008060355040a0c0178310e300c06035504030c05616c696365", "CN=alice,O=x"},
		{"3057310b3009060355040613025553310b300906035504080c024d44310f300d06035504070c0646756c746f6e310d300b060355040a0c046d796370310c300a060355040b0c03534d45310d300b06035504030c0444756b65", "CN=Duke,OU=SME,O=mycp,L=Fulton,ST=MD,C=US"},
		{"301e311c301a06035504030c13612c622b633d643c653e6623673b6822695c6a", `CN=a\,b\+c\=d\<e\>f\#g\;h\"i\\j`},
		{"301b3119301706035504030c10206c65616420616e6420747261696c20", `CN=\ lead and trail\ `},
		{"3010310e300c06035504030c052368617368", `CN=\#hash`},
		{"3010310e300c06035504030c056e756c0078", `CN=nul\00x`},
		{"300f310d300b06035504030c040d63720d", "CN=\\\rcr\\\r"},
		{"300d310b300906035504030c022020", `CN=\ \ `},
		{"30173115301306035504030c0cc3a920c3bc20e697a5e69cac", "CN=é ü 日本"},
		{"30133111300f06035504030c08626164e28278ff79", "CN=bad\uFFFDx\uFFFDy"},
		{"30323120301e06092a864886f70d0109011611616c696365406578616d706c652e636f6d310e300c06035504030c05616c696365", "CN=alice,1.2.840.113549.1.9.1=#1611616c696365406578616d706c652e636f6d"},
		{"305431133011060a0992268993f22c6401191603636f6d31173015060a0992268993f22c64011916076578616d706c6531123010060a0992268993f22c6401010c0275313110300e06035504090c074d61696e205374", "STREET=Main St,UID=u1,DC=example,DC=com"},
		{"301e310d300b0603550405130431323334310d300b060355040c0c04626f7373", "2.5.4.12=#0c04626f7373,2.5.4.5=#130431323334"},
		{"3011310f300d06035504031e060062006d0070", `CN=\00b\00m\00p`}, // a BMPString's bytes read as UTF-8
		{"300e310c300a06035504031403743631", "CN=t61"},
		{"300c310a30080603550403020105", "CN=#020105"}, // an INTEGER value
		{"3000", ""},
		{"30133111300f06035504030c08746162096e6c0a78", "CN=tab\tnl\nx"},
	} {
		der, err := hex.DecodeString(c.der)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Subject(der)
		if err != nil || got != c.want {
			t.Errorf("%s: %q, %v; want %q", c.der, got, err, c.want)
		}
	}
	for _, bad := range []string{"", "30", "3003310130", "3010310e300c06035504030c05616c69636500"} {
		der, _ := hex.DecodeString(bad)
		if got, err := Subject(der); err == nil {
			t.Errorf("%s: %q, want an error", bad, got)
		}
	}
}

// TestJavaUTF8: malformed UTF-8 is replaced as Java's decoder replaces it
// (what Java 17 printed for each byte string).
func TestJavaUTF8(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   string
		want []rune
	}{
		{"ff fe", []rune{0xfffd, 0xfffd}},
		{"e0 80", []rune{0xfffd, 0xfffd}},
		{"f0 9f 98", []rune{0xfffd}},
		{"ed a0 80", []rune{0xfffd}},
		{"c0 af", []rune{0xfffd, 0xfffd}},
		{"e2 82 41", []rune{0xfffd, 'A'}},
		{"f4 90 80 80", []rune{0xfffd, 0xfffd, 0xfffd, 0xfffd}},
		{"f0 9f 98 80", []rune{0x1f600}},
		{"80", []rune{0xfffd}},
		{"e1 80", []rune{0xfffd}},
		{"f1 80 80", []rune{0xfffd}},
		{"c2", []rune{0xfffd}},
		{"ef bf bd", []rune{0xfffd}},
		{"f8 88 80 80 80", []rune{0xfffd, 0xfffd, 0xfffd, 0xfffd, 0xfffd}},
	} {
		b, _ := hex.DecodeString(strings.ReplaceAll(c.in, " ", ""))
		if got := javaUTF8(b); string(got) != string(c.want) {
			t.Errorf("%s: %U, want %U", c.in, got, c.want)
		}
	}
}

func mustRules(t *testing.T, rules string) *Mapper {
	t.Helper()
	m, err := ParseRules(rules)
	if err != nil {
		t.Fatalf("%q: %v", rules, err)
	}
	return m
}

// TestPrincipalMappingKafkaExamples: Kafka's documented
// ssl.principal.mapping.rules examples, and those of its own tests, give
// Kafka's principals.
func TestPrincipalMappingKafkaExamples(t *testing.T) {
	t.Parallel()
	docs := mustRules(t, `RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/,
RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L,
RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/L,
DEFAULT`)
	tests := mustRules(t, strings.Join([]string{
		"RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L",
		"RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L",
		"RULE:^cn=(.*?),ou=(.*?),dc=(.*?),dc=(.*?)$/$1@$2/U",
		"RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/U",
		"DEFAULT",
	}, ", "))
	for _, c := range []struct {
		m        *Mapper
		dn, want string
	}{
		{docs, "CN=serviceuser,OU=ServiceUsers,O=Unknown,L=Unknown,ST=Unknown,C=Unknown", "serviceuser"},
		{docs, "CN=adminUser,OU=Admin,O=Unknown,L=Unknown,ST=Unknown,C=Unknown", "adminuser@admin"},
		{tests, "CN=Duke,OU=ServiceUsers,O=Org,C=US", "duke"},
		{tests, "CN=Duke,OU=SME,O=mycp,L=Fulton,ST=MD,C=US", "duke@sme"},
		{tests, "cn=duke,ou=sme,dc=mycp,dc=com", "DUKE@SME"},
		{tests, "cN=duke,OU=JavaSoft,O=Sun Microsystems", "DUKE"},
		{tests, "OU=JavaSoft,O=Sun Microsystems,C=US", "OU=JavaSoft,O=Sun Microsystems,C=US"},
		{mustRules(t, `RULE:^CN=((\\, *|\w)+)(,.*|$)/$1/,DEFAULT`), `CN=Tkac\, Adam,OU=ITZ,DC=geodis,DC=cz`, `Tkac\, Adam`},
		{mustRules(t, ""), "CN=alice,O=x", "CN=alice,O=x"},
	} {
		if got, ok := c.m.Name(c.dn); !ok || got != c.want {
			t.Errorf("%s: %q %v, want %q", c.dn, got, ok, c.want)
		}
	}
	if got, ok := mustRules(t, "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/").Name("CN=adminUser,OU=Admin"); ok {
		t.Errorf("no rule applies, no DEFAULT: got %q, want none (Kafka refuses the connection)", got)
	}
}

// TestPrincipalMappingJavaReplacement: a rule replaces as Java's
// String.replaceAll does, with Kafka's treatment of "$n" beyond the
// pattern's groups (the expected strings are Java 17's).
func TestPrincipalMappingJavaReplacement(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ rule, dn, want string }{
		{"RULE:(.*)/$1@x/", "CN=a", "CN=a@x@x"}, // Java also replaces the empty match at the end
		{"RULE:(.*?)/<$1>/", "CN=a", "<>C<>N<>=<>a<>"},
		{"RULE:CN=(.*?),.*/$1/", "CN=alice,O=x", "alice"},
		{"RULE:CN=(.*?)/$1/", "CN=alice", "alice"}, // the lazy group matches "", the rest is kept
		{"RULE:(?<n>.*)/${n}!/", "CN=a", "CN=a!!"},
		{"RULE:.*/$0$0/", "CN=a", "CN=aCN=a"},
		{"RULE:(C)(N)=(a)/$12/", "CN=a", "C2"},
		{"RULE:(C)(N)=(a)/$31/", "CN=a", "a1"},
		{"RULE:^CN=(.*)$/$1$5/", "CN=alice", "alice$5"}, // Kafka makes $5 literal: one group
		{`RULE:^CN=(.*)$/\$1 \\ $1/`, "CN=alice", `$1 \ alice`},
		{`RULE:^CN=(.*)\/(.*)$/$2\/$1/`, "CN=a/b", "b/a"},
		{"RULE:^CN=(.*)$/$1/U", "CN=alice", "ALICE"},
	} {
		if got, ok := mustRules(t, c.rule).Name(c.dn); !ok || got != c.want {
			t.Errorf("%s on %q: %q %v, want %q", c.rule, c.dn, got, ok, c.want)
		}
	}
}

// TestPrincipalMappingRulesSplit: rules split as Kafka splits them
// (its own test's cases, each rule shown as Kafka's toString does).
func TestPrincipalMappingRulesSplit(t *testing.T) {
	t.Parallel()
	show := func(m *Mapper) string {
		var parts []string
		for _, r := range m.rules {
			if r.isDefault {
				parts = append(parts, "DEFAULT")
				continue
			}
			s := "RULE:" + r.pattern + "/" + r.replacement
			if r.lower {
				s += "/L"
			} else if r.upper {
				s += "/U"
			}
			parts = append(parts, s)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	}
	for _, c := range []struct{ rules, want string }{
		{"DEFAULT", "[DEFAULT]"},
		{"RULE://", "[RULE:/]"},
		{"RULE:/.*/", "[RULE:/.*]"},
		{"RULE:/.*/L", "[RULE:/.*/L]"},
		{"RULE://,DEFAULT", "[RULE:/, DEFAULT]"},
		{"  RULE:// ,  DEFAULT  ", "[RULE:/, DEFAULT]"},
		{"  RULE:   /     / ,  DEFAULT  ", "[RULE:   /     , DEFAULT]"},
		{"  RULE:  /     /U   ,DEFAULT  ", "[RULE:  /     /U, DEFAULT]"},
		{"  RULE:([A-Z]*)/$1/U   ,RULE:([a-z]+)/$1/,   DEFAULT  ", "[RULE:([A-Z]*)/$1/U, RULE:([a-z]+)/$1, DEFAULT]"},
		{",,RULE://,,,DEFAULT,,", "[RULE:/, DEFAULT]"},
		{",  , RULE: /   /    ,,,   DEFAULT, ,   ", "[RULE: /   , DEFAULT]"},
		{"     ,  , RULE:   /  /U    ,,  ,DEFAULT, ,", "[RULE:   /  /U, DEFAULT]"},
		{`RULE:\/\\\(\)\n\t/\/\//`, `[RULE:\/\\\(\)\n\t/\/\/]`},
		{`RULE:\**\/+/*/L,RULE:\/*\**/**/`, `[RULE:\**\/+/*/L, RULE:\/*\**/**]`},
		{`RULE:,RULE:,/,RULE:,\//U,RULE:,/RULE:,/,RULE:,RULE:,/L,RULE:,/L,RULE:, DEFAULT, /DEFAULT/,DEFAULT`,
			`[RULE:,RULE:,/,RULE:,\//U, RULE:,/RULE:,, RULE:,RULE:,/L,RULE:,/L, RULE:, DEFAULT, /DEFAULT, DEFAULT]`},
		{"RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/,\n  DEFAULT", "[RULE:^CN=(.*?),OU=ServiceUsers.*$/$1, DEFAULT]"},
	} {
		m, err := ParseRules(c.rules)
		if err != nil {
			// Patterns Kafka's test only splits may not compile.
			texts, serr := splitMappingRules(c.rules)
			if serr != nil {
				t.Errorf("%q: %v", c.rules, serr)
			}
			t.Logf("%q split into %q, not compiled: %v", c.rules, texts, err)
			continue
		}
		if got := show(m); got != c.want {
			t.Errorf("%q: %s, want %s", c.rules, got, c.want)
		}
	}
	if m := mustRules(t, ",   , , ,      , , ,   "); len(m.rules) != 1 || !m.rules[0].isDefault {
		t.Errorf("only empty rules: want DEFAULT alone")
	}
}

// TestPrincipalMappingRulesInvalid: what Kafka refuses (its own test's
// cases), and what it would fail on at every connection, is a
// configuration error naming the rule.
func TestPrincipalMappingRulesInvalid(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{
		"default", "DEFAUL", "DEFAULT/L", "DEFAULT/U",
		"RULE:CN=(.*?),OU=ServiceUsers.*/$1",
		"rule:^CN=(.*?),OU=ServiceUsers.*$/$1/",
		"RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L/U",
		"RULE:^CN=(.*?),OU=ServiceUsers.*$/L",
		"RULE:^CN=(.*?),OU=ServiceUsers.*$/U",
		"RULE:^CN=(.*?),OU=ServiceUsers.*$/LU",
		"RULE:^CN=(?=x).*$/$1/",        // lookahead: not in Go's syntax
		"RULE:^CN=.*$/$1/",             // no group 1
		"RULE:^CN=(.*)$/$/",            // "$" names nothing
		"RULE:^CN=(.*)$/$x/",           // "$x"
		`RULE:^CN=(.*)$/$1\/`,          // the replacement's end is escaped: no closing slash
		"RULE:^CN=(.*)$/${nope}/",      // no such named group
		"RULE:^CN=(.*)$/$5$6/",         // two literal $n: Kafka mangles them
		"RULE:^CN=(.*)$/$99999999999/", // too large for Kafka
		"RULE:^CN=([a-z&&[^b]]*)$/$1/", // a Java class intersection
		"RULE:^CN=(.*)$/$1/\nDEFAULT",  // a line break inside a rule
		"DEFAULT, RULE:^CN=(.*)$/$1/x", // text after the flag
	} {
		if _, err := ParseRules(bad); err == nil {
			t.Errorf("%q: parsed, want an error", bad)
		} else {
			t.Logf("%q: %v", bad, err)
		}
	}
}

// FuzzPrincipalMappingRules: any value parses or fails with an error, never
// a panic or a hang; a parsed rule set maps any name (or says no rule
// applies), and each rule's own text parses to the same rule.
func FuzzPrincipalMappingRules(f *testing.F) {
	for _, s := range []string{
		"DEFAULT", "", "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/,DEFAULT",
		"RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L, RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/U",
		`RULE:,RULE:,/,RULE:,\//U,RULE:,/RULE:,/,RULE:,RULE:,/L,RULE:,/L,RULE:, DEFAULT, /DEFAULT/,DEFAULT`,
		`RULE:(.*)/$1@x/`, `RULE:(.*?)/<$1>/`, `RULE:(?<n>.*)/${n}!/`, `RULE:^CN=(.*)$/$1$5/`, "RULE:a/b/\nDEFAULT",
	} {
		f.Add(s, "CN=Duke,OU=SME,O=mycp,L=Fulton,ST=MD,C=US")
	}
	f.Fuzz(func(t *testing.T, rules, dn string) {
		m, err := ParseRules(rules)
		if err != nil {
			return
		}
		if len(m.rules) == 0 {
			t.Fatal("no rules, not even DEFAULT")
		}
		for _, r := range m.rules {
			again, err := ParseRules(r.text)
			if err != nil || len(again.rules) != 1 {
				t.Fatalf("rule %q alone: %v", r.text, err)
			}
			if a := again.rules[0]; a.pattern != r.pattern || a.replacement != r.replacement || a.lower != r.lower || a.upper != r.upper || a.isDefault != r.isDefault {
				t.Fatalf("rule %q alone parses differently", r.text)
			}
		}
		if !utf8.ValidString(dn) {
			return
		}
		if out, ok := m.Name(dn); ok && m.rules[0].isDefault && out != dn {
			t.Fatalf("DEFAULT first: %q became %q", dn, out)
		}
	})
}
