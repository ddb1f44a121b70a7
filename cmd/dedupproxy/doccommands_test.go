package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/dedupproxy/dedupproxy/internal/testskip"
	"github.com/dedupproxy/dedupproxy/proxy"
)

// docCommand is one shell command of a document's ```sh block.
type docCommand struct {
	file string
	line int
	text string // as bash reads it: continuation lines and a heredoc's body included

	needs  string // "# needs ...": not run, for this reason
	exits  int    // "# exits N": the exit code the document states (default 0)
	prints string // "# prints X": what it prints (trimmed), when the document says
	// interrupt: a comment line saying Ctrl-C before it: the reader stops
	// the commands still running in their own terminals first.
	interrupt bool
}

var (
	fenceRE   = regexp.MustCompile("^```(\\w*)\\s*$")
	heredocRE = regexp.MustCompile(`<<-?\s*['"]?(\w+)['"]?`)
	exitsRE   = regexp.MustCompile(`^exits (\d+)\b`)
	printsRE  = regexp.MustCompile(`^prints ([^\s:;,]+)`)
)

// shellLangs are the info strings of the fenced blocks that hold commands.
var shellLangs = map[string]bool{"sh": true, "bash": true, "shell": true, "console": true}

// parseDocCommands returns the commands of every shell block of a
// markdown document, in order.
//
// The conventions, for the reader as much as for the test:
//   - a comment line "# needs REASON" marks the rest of its block as
//     needing what this machine does not have (a real cluster, TLS
//     certificates, Kubernetes): shown to the reader, skipped here;
//   - a comment line naming Ctrl-C stops what runs in other terminals;
//   - a trailing "# exits N" states a command's exit code other than 0,
//     and "# prints X" what it prints.
func parseDocCommands(file, text string) ([]docCommand, error) {
	var out []docCommand
	lines := strings.Split(text, "\n")
	for i := 0; i < len(lines); i++ {
		m := fenceRE.FindStringSubmatch(lines[i])
		if m == nil {
			continue
		}
		lang := m[1]
		start := i
		for i++; i < len(lines) && !strings.HasPrefix(lines[i], "```"); i++ {
		}
		if i == len(lines) {
			return nil, fmt.Errorf("%s:%d: the block never closes", file, start+1)
		}
		if !shellLangs[lang] {
			continue
		}
		block := lines[start+1 : i]
		needs, interrupt := "", false
		for j := 0; j < len(block); j++ {
			line := block[j]
			trimmed := strings.TrimSpace(line)
			switch {
			case trimmed == "":
				continue
			case strings.HasPrefix(trimmed, "#"):
				comment := strings.TrimSpace(strings.TrimPrefix(trimmed, "#"))
				if strings.HasPrefix(comment, "needs ") {
					needs = comment
				}
				if strings.Contains(comment, "Ctrl-C") {
					interrupt = true
				}
				continue
			}
			c := docCommand{file: file, line: start + 2 + j, needs: needs, interrupt: interrupt}
			interrupt = false
			text := line
			for strings.HasSuffix(strings.TrimRight(text, " "), "\\") && j+1 < len(block) {
				j++
				text += "\n" + block[j]
			}
			if hm := heredocRE.FindStringSubmatch(text); hm != nil {
				end := hm[1]
				for j++; j < len(block) && strings.TrimSpace(block[j]) != end; j++ {
					text += "\n" + block[j]
				}
				if j == len(block) {
					return nil, fmt.Errorf("%s:%d: heredoc %s never ends", file, c.line, end)
				}
				text += "\n" + block[j]
			}
			c.text = text
			if comment, ok := trailingComment(strings.Split(text, "\n")[0]); ok {
				if m := exitsRE.FindStringSubmatch(comment); m != nil {
					c.exits, _ = strconv.Atoi(m[1])
				}
				if m := printsRE.FindStringSubmatch(comment); m != nil {
					c.prints = m[1]
				}
			}
			out = append(out, c)
		}
	}
	return out, nil
}

// trailingComment returns the comment ending a shell line: a # after
// whitespace, outside quotes.
func trailingComment(line string) (string, bool) {
	var quote byte
	for i := 0; i < len(line); i++ {
		ch := line[i]
		switch {
		case quote != 0:
			if ch == quote {
				quote = 0
			}
		case ch == '\'' || ch == '"':
			quote = ch
		case ch == '#' && i > 0 && (line[i-1] == ' ' || line[i-1] == '\t'):
			return strings.TrimSpace(line[i+1:]), true
		}
	}
	return "", false
}

// words are the command's words before any comment, pipe or redirection.
func (c docCommand) words() []string {
	first := strings.Split(c.text, "\n")[0]
	if comment, ok := trailingComment(first); ok {
		first = strings.TrimSuffix(strings.TrimSpace(strings.TrimSuffix(first, comment)), "#")
	}
	return strings.Fields(first)
}

// server reports whether the command runs until stopped, in a terminal of
// its own: the proxy or dedupproxy cluster, in the foreground.
func (c docCommand) server() bool {
	w := c.words()
	if len(w) == 0 || w[0] != "dedupproxy" && !strings.HasSuffix(w[0], "/dedupproxy") || c.exits != 0 {
		return false
	}
	for _, a := range w[1:] {
		switch {
		case a == "&" || strings.HasSuffix(a, "&") && !strings.HasSuffix(a, "&&"):
			return false // in the background of the reader's shell
		case strings.HasPrefix(a, "-h") || strings.HasPrefix(a, "--h") || a == "--version" || a == "|":
			return false
		}
	}
	return len(w) == 1 || w[1] == "cluster" || strings.HasPrefix(w[1], "-")
}

func stripComment(text string) string {
	first, rest, _ := strings.Cut(text, "\n")
	if comment, ok := trailingComment(first); ok {
		first = strings.TrimSuffix(strings.TrimSpace(strings.TrimSuffix(first, comment)), "#")
	}
	if rest == "" {
		return first
	}
	return first + "\n" + rest
}

// docSubstitutions stand the test's own build in for the commands that
// build or run this repository's command.
var docSubstitutions = []struct{ from, to string }{
	{"go run ./cmd/dedupproxy", "dedupproxy"},
}

// docsWithCommands are the documents TestDocCommands reads: the README
// and every page of docs/.
func docsWithCommands(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	return append([]string{"../../README.md"}, files...)
}

// TestDocCommands runs every shell command of README.md and docs/*.md as
// written, in document order, one shell session per document, as a reader
// on a fresh machine would: against dedupproxy cluster, with the
// documented ports. A command the document marks "# needs ..." (a real
// cluster, TLS files, Kubernetes, systemd) is not run and the reason is
// logged; every other one must exit as the document says (0 unless it
// says "# exits N") and print what it says ("# prints X"). A command that
// runs until stopped (the proxy, dedupproxy cluster, in the foreground) is
// started as in a terminal of its own and waited for until it serves; at
// the document's end it is stopped and must exit 0.
//
// The session runs in a network namespace of its own (unshare), so the
// documented fixed ports are free whatever else runs on the machine.
// Where namespaces are not allowed it runs on this machine's loopback,
// one document at a time across test processes (a lock file), and fails
// naming a documented port that something else holds.
//
// The commands build nothing: "dedupproxy" on the session's PATH is this
// test binary, running main, and "go run ./cmd/dedupproxy" stands for it.
// A program they use that is not installed (kcat) fails the test, as a
// missing client fails e2e, unless E2E_SKIP_MISSING is set outside CI.
func TestDocCommands(t *testing.T) {
	if testing.Short() {
		testskip.Skip(t, "-short: the documents' sessions take a while")
	}
	for _, path := range docsWithCommands(t) {
		raw, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		name := strings.TrimPrefix(path, "../../")
		cmds, err := parseDocCommands(name, string(raw))
		if err != nil {
			t.Fatal(err)
		}
		if len(cmds) == 0 {
			continue
		}
		t.Run(name, func(t *testing.T) { runDocSession(t, cmds) })
	}
}

// docSession is one document's shell: a bash reading commands on stdin,
// its output (stdout and stderr) read line by line.
type docSession struct {
	t       *testing.T
	dir     string
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	lines   chan string
	servers []docServer
	n       int
}

type docServer struct {
	c   docCommand
	pid int
	log string
}

const docMark = "__DOC_COMMAND_DONE__"

func runDocSession(t *testing.T, cmds []docCommand) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(self, filepath.Join(dir, "bin", "dedupproxy")); err != nil {
		t.Fatal(err)
	}
	// The documents name config.example.yaml from the repository's root.
	example, err := os.ReadFile("../../config.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.example.yaml"), example, 0o644); err != nil {
		t.Fatal(err)
	}

	isolated := exec.Command("unshare", "--user", "--map-root-user", "--net", "ip", "link", "set", "lo", "up").Run() == nil
	var shell *exec.Cmd
	if isolated {
		shell = exec.Command("unshare", "--user", "--map-root-user", "--net", "bash", "--noprofile", "--norc")
	} else {
		unlock := lockDocPorts(t)
		defer unlock()
		checkDocPorts(t, cmds)
		shell = exec.Command("bash", "--noprofile", "--norc")
	}
	shell.Dir = dir
	shell.Env = append(os.Environ(), "PATH="+filepath.Join(dir, "bin")+":"+os.Getenv("PATH"),
		"DEDUPPROXY_RUN_MAIN=1", "GORACE=atexit_sleep_ms=0", "HOME="+dir)
	// Its own process group: the end of the test ends every process the
	// session started, and nothing else.
	shell.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdin, err := shell.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	pr, pw := io.Pipe()
	shell.Stdout, shell.Stderr = pw, pw
	if err := shell.Start(); err != nil {
		t.Fatal(err)
	}
	s := &docSession{t: t, dir: dir, cmd: shell, stdin: stdin, lines: make(chan string, 1024)}
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			s.lines <- sc.Text()
		}
		close(s.lines)
	}()
	t.Cleanup(func() {
		stdin.Close()
		syscall.Kill(-shell.Process.Pid, syscall.SIGKILL)
		shell.Wait()
		pw.Close()
	})
	if isolated {
		s.mustRun("ip link set lo up")
	} else {
		t.Log("no network namespace here (unshare refused): the commands run on this machine's loopback")
	}
	s.mustRun("exec 2>&1")

	ran, skipped := 0, 0
	for _, c := range cmds {
		if c.interrupt {
			s.stopServers(syscall.SIGINT)
		}
		if c.needs != "" {
			t.Logf("%s:%d: not run: %s", c.file, c.line, c.needs)
			skipped++
			continue
		}
		shown := c.text
		for _, sub := range docSubstitutions {
			c.text = strings.ReplaceAll(c.text, sub.from, sub.to)
		}
		if w := c.words(); len(w) > 0 && w[0] == "go" {
			t.Errorf("%s:%d: %q builds or tests the repository: mark it \"# needs ...\" (the test brings its own build)", c.file, c.line, shown)
			continue
		}
		if w := c.words(); len(w) > 1 && w[0] == "make" && w[1] == "build" {
			t.Logf("%s:%d: %s: the test's own build stands in for it", c.file, c.line, shown)
			ran++
			continue
		}
		ran++
		text := stripComment(c.text)
		c.text = shown
		asRun := c
		asRun.text = text
		if asRun.server() {
			s.startServer(c, text)
			continue
		}
		code, out := s.run(text, 3*time.Minute)
		if code == 127 {
			if skip := os.Getenv("E2E_SKIP_MISSING"); skip != "" && os.Getenv("CI") != "true" {
				testskip.Skipf(t, "%s:%d: %s: a program is missing, and E2E_SKIP_MISSING=%s lets it be:\n%s", c.file, c.line, c.text, skip, out)
			}
			t.Fatalf("%s:%d: %s: a program is missing (bash .ci/deps installs kcat, curl and the clients; E2E_SKIP_MISSING=all skips):\n%s", c.file, c.line, c.text, out)
		}
		if code != c.exits {
			t.Errorf("%s:%d: %s\nexit %d, the document says %d; output:\n%s", c.file, c.line, c.text, code, c.exits, out)
		}
		if c.prints != "" && strings.TrimSpace(out) != c.prints {
			t.Errorf("%s:%d: %s\nprinted %q, the document says %q", c.file, c.line, c.text, strings.TrimSpace(out), c.prints)
		}
	}
	s.stopServers(syscall.SIGTERM)
	// What the document left running in the background goes too.
	s.run("kill $(jobs -p) 2>/dev/null; wait", time.Minute)
	t.Logf("%d commands run, %d not run", ran, skipped)
}

// run sends one command to the session and returns its exit code and
// output.
func (s *docSession) run(text string, timeout time.Duration) (int, string) {
	s.t.Helper()
	if _, err := fmt.Fprintf(s.stdin, "%s\n__rc=$?; printf '\\n%s %%d\\n' \"$__rc\"\n", text, docMark); err != nil {
		s.t.Fatalf("session: %v", err)
	}
	var out []string
	deadline := time.After(timeout)
	for {
		select {
		case line, ok := <-s.lines:
			if !ok {
				s.t.Fatalf("the session ended during %q:\n%s", text, strings.Join(out, "\n"))
			}
			if rest, found := strings.CutPrefix(line, docMark+" "); found {
				code, _ := strconv.Atoi(rest)
				if len(out) > 0 && out[len(out)-1] == "" {
					out = out[:len(out)-1] // the newline printf puts first
				}
				return code, strings.Join(out, "\n")
			}
			out = append(out, line)
		case <-deadline:
			s.t.Fatalf("%q still running after %v:\n%s", text, timeout, strings.Join(out, "\n"))
		}
	}
}

func (s *docSession) mustRun(text string) string {
	s.t.Helper()
	code, out := s.run(text, time.Minute)
	if code != 0 {
		s.t.Fatalf("%s: exit %d:\n%s", text, code, out)
	}
	return out
}

// startServer runs c as the reader would in a terminal of its own, and
// waits until it serves: the proxy's "started" log line, the cluster's
// bootstrap line.
func (s *docSession) startServer(c docCommand, text string) {
	s.t.Helper()
	s.n++
	log := filepath.Join(s.dir, fmt.Sprintf("terminal-%d.log", s.n))
	pid, err := strconv.Atoi(strings.TrimSpace(s.mustRun(fmt.Sprintf("%s > %s 2>&1 &\necho $!", text, log))))
	if err != nil {
		s.t.Fatal(err)
	}
	s.servers = append(s.servers, docServer{c, pid, log})
	ready := regexp.MustCompile(`(?m)msg=started |^bootstrap `)
	deadline := time.Now().Add(time.Minute)
	for {
		raw, _ := os.ReadFile(log)
		if ready.Match(raw) {
			return
		}
		if syscall.Kill(pid, 0) != nil || time.Now().After(deadline) {
			s.t.Fatalf("%s:%d: %s\ndid not start serving:\n%s", c.file, c.line, c.text, raw)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stopServers stops what runs in the other terminals, with sig (Ctrl-C is
// SIGINT), and checks each exits 0.
func (s *docSession) stopServers(sig syscall.Signal) {
	s.t.Helper()
	for _, srv := range s.servers {
		out := s.mustRun(fmt.Sprintf("kill -%d %d; wait %d; echo $?", sig, srv.pid, srv.pid))
		if code := strings.TrimSpace(out); code != "0" {
			raw, _ := os.ReadFile(srv.log)
			s.t.Errorf("%s:%d: %s\nexit %s after signal %d; its output:\n%s", srv.c.file, srv.c.line, srv.c.text, code, sig, raw)
		}
	}
	s.servers = nil
}

// lockDocPorts serialises, across test processes on this machine, the
// sessions that use the documented ports on the machine's own loopback.
func lockDocPorts(t *testing.T) func() {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(os.TempDir(), "dedupproxy-doc-commands.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	return func() { f.Close() }
}

// checkDocPorts fails when a port the commands use (as written, or the
// defaults they rely on) is held on this machine's loopback.
func checkDocPorts(t *testing.T, cmds []docCommand) {
	t.Helper()
	ports := map[string]bool{"9080": true, "9092": true, "9093": true, "9094": true, "9095": true, "19092": true, "19093": true, "19094": true}
	for _, c := range cmds {
		for _, m := range regexp.MustCompile(`:(\d{4,5})\b`).FindAllStringSubmatch(c.text, -1) {
			ports[m[1]] = true
		}
	}
	for p := range ports {
		ln, err := net.Listen("tcp", "127.0.0.1:"+p)
		if err != nil {
			t.Fatalf("port %s, which the documents' commands use, is taken on this machine (%v), and this machine allows no network namespace to run them apart: free it", p, err)
		}
		ln.Close()
	}
}

// TestParseDocCommands pins the conventions the documents use.
func TestParseDocCommands(t *testing.T) {
	doc := "text\n```sh\n" +
		"dedupproxy cluster   # a server\n" +
		"dedupproxy cluster > c.log & c=$!\n" +
		"echo 'a # b' | wc -l   # prints 1\n" +
		"dedupproxy --config x.yaml   # exits 2: a placeholder\n" +
		"cat > f.yaml <<'EOF'\nupstream: x\nEOF\n" +
		"# Ctrl-C the servers, then\n" +
		"dedupproxy --upstream a:1 \\\n  --listen 127.0.0.1:9092\n" +
		"# needs a real cluster\n" +
		"dedupproxy audit --upstream kafka:9092 --topic t\n" +
		"```\n```yaml\nnot: run\n```\n"
	cmds, err := parseDocCommands("d.md", doc)
	if err != nil {
		t.Fatal(err)
	}
	if len(cmds) != 7 {
		t.Fatalf("%d commands: %+v", len(cmds), cmds)
	}
	want := []struct {
		line              int
		server, interrupt bool
		exits             int
		prints, needs     string
	}{
		{3, true, false, 0, "", ""},
		{4, false, false, 0, "", ""},
		{5, false, false, 0, "1", ""},
		{6, false, false, 2, "", ""},
		{7, false, false, 0, "", ""},
		{11, true, true, 0, "", ""},
		{14, false, false, 0, "", "needs a real cluster"},
	}
	for i, w := range want {
		c := cmds[i]
		if c.line != w.line || c.server() != w.server || c.interrupt != w.interrupt || c.exits != w.exits || c.prints != w.prints || c.needs != w.needs {
			t.Errorf("command %d: %+v (server %v), want %+v", i, c, c.server(), w)
		}
	}
	if !strings.HasSuffix(cmds[4].text, "\nEOF") || !strings.Contains(cmds[5].text, "--listen") {
		t.Errorf("heredoc or continuation not joined: %q, %q", cmds[4].text, cmds[5].text)
	}
}

// TestDocLinks: every relative link of README.md and docs/*.md names a
// file of the repository, and a link to a section of a markdown page names
// one of its headings (GitHub's anchors: lower case, spaces to dashes,
// punctuation dropped).
func TestDocLinks(t *testing.T) {
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	for _, path := range docsWithCommands(t) {
		raw, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(raw), "\n") {
			for _, m := range link.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				file, anchor, _ := strings.Cut(target, "#")
				resolved := path
				if file != "" {
					resolved = filepath.Join(filepath.Dir(path), file)
				}
				body, err := os.ReadFile(resolved)
				if err != nil {
					if fi, serr := os.Stat(resolved); serr == nil && fi.IsDir() {
						continue
					}
					t.Errorf("%s:%d: link %s: %v", path, i+1, target, err)
					continue
				}
				if anchor != "" && strings.HasSuffix(resolved, ".md") && !hasAnchor(string(body), anchor) {
					t.Errorf("%s:%d: link %s: %s has no heading for #%s", path, i+1, target, resolved, anchor)
				}
			}
		}
	}
}

// TestDocsReadingPaths: docs/README.md, the reading paths, links every
// page of docs/, so that none is left off every path.
func TestDocsReadingPaths(t *testing.T) {
	raw, err := os.ReadFile("../../docs/README.md")
	if err != nil {
		t.Fatal(err)
	}
	pages, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pages {
		name := filepath.Base(p)
		if name != "README.md" && !strings.Contains(string(raw), "]("+name+")") {
			t.Errorf("docs/README.md does not link %s: put it on a reading path", name)
		}
	}
}

func hasAnchor(markdown, anchor string) bool {
	for _, line := range strings.Split(markdown, "\n") {
		if !strings.HasPrefix(line, "#") {
			continue
		}
		heading := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(heading) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
				b.WriteRune(r)
			}
		}
		if b.String() == anchor {
			return true
		}
	}
	return false
}

// TestDocDefaults: where README.md or a page of docs/ states a config
// key's default beside the key (`drain_timeout` (30s), `max_inflight` per
// connection (256), `window` 2m), it is the code's default, which
// config.example.yaml states too (TestConfigExample).
func TestDocDefaults(t *testing.T) {
	var def proxy.Config
	def.EnsureDefaults()
	raw, err := yaml.Marshal(def)
	if err != nil {
		t.Fatal(err)
	}
	var tree map[string]any
	if err := yaml.Unmarshal(raw, &tree); err != nil {
		t.Fatal(err)
	}
	// Each key's default, by its dotted path and by its last name (the
	// docs write `window` as often as `dedup.legacy.window`).
	defaults := map[string][]string{}
	var walk func(m map[string]any, prefix string)
	walk = func(m map[string]any, prefix string) {
		for k, v := range m {
			if sub, ok := v.(map[string]any); ok {
				walk(sub, prefix+k+".")
				continue
			}
			s := fmt.Sprint(v)
			defaults[prefix+k] = append(defaults[prefix+k], s)
			defaults[k] = append(defaults[k], s)
		}
	}
	walk(tree, "")
	stated := regexp.MustCompile("`([a-z_]+(?:\\.[a-z_]+)*)`(?: per connection)?(?: \\(|, | )(-?[0-9][0-9,.]*(?: ?(?:MiB|KiB|ms|seconds?|minutes?|hours?|s|m|h)\\b)?|\"[0-9.]+\")")
	checked := 0
	for _, path := range docsWithCommands(t) {
		doc, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(doc), "\n") {
			for _, m := range stated.FindAllStringSubmatch(line, -1) {
				key, value := m[1], m[2]
				want, ok := defaults[key]
				if !ok {
					continue // not a config key: a client's setting, a metric
				}
				checked++
				if !slices.ContainsFunc(want, func(d string) bool { return sameSetting(value, d) }) {
					t.Errorf("%s:%d: `%s` %s; its default is %s", path, i+1, key, value, strings.Join(slices.Compact(slices.Sorted(slices.Values(want))), " or "))
				}
			}
		}
	}
	t.Logf("%d defaults stated beside their keys", checked)
	if checked < 10 {
		t.Errorf("only %d defaults stated in the docs were found: the pattern no longer reads them", checked)
	}
}

// sameSetting compares a value as a document writes it (30s, 10 s, 8 MiB,
// 1,048,576, "1.2") with the default as YAML writes it (30s, 8388608,
// 1048576, "1.2").
func sameSetting(doc, def string) bool {
	doc = strings.Trim(strings.ReplaceAll(doc, ",", ""), `"`)
	compact := strings.NewReplacer(" ", "", "seconds", "s", "second", "s", "minutes", "m", "minute", "m", "hours", "h", "hour", "h").Replace(doc)
	if d, err := time.ParseDuration(compact); err == nil {
		dd, err := time.ParseDuration(def)
		return err == nil && d == dd
	}
	for unit, n := range map[string]float64{"KiB": 1 << 10, "MiB": 1 << 20} {
		if v, ok := strings.CutSuffix(compact, unit); ok {
			f, err := strconv.ParseFloat(v, 64)
			return err == nil && fmt.Sprint(int64(f*n)) == def
		}
	}
	return doc == def
}
