package main

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/dedupproxy/dedupproxy/proxy"
)

// readConfigFile reads a YAML config file. Its mistakes are reported in the
// file's own terms (the key as written, its line, the nearest known key; a
// duration without a unit) rather than as Go types; upstream may be a list
// or the comma-separated string the --upstream flag takes.
func readConfigFile(path string) (proxy.Config, error) {
	var cfg proxy.Config
	raw, err := os.ReadFile(path)
	if err != nil {
		return cfg, err
	}
	var doc yaml.Node
	if err := yaml.NewDecoder(bytes.NewReader(raw)).Decode(&doc); err != nil {
		if err.Error() == "EOF" { // an empty file
			return cfg, nil
		}
		return cfg, fmt.Errorf("config %s: %w", path, err)
	}
	if len(doc.Content) == 0 {
		return cfg, nil
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		if root.Kind == yaml.ScalarNode && root.Tag == "!!null" {
			return cfg, nil
		}
		return cfg, fmt.Errorf("config %s, line %d: want keys (listen: ..., upstream: ...), got %s", path, root.Line, kindName(root))
	}
	upstreamAsList(root)
	if err := checkNode(root, reflect.TypeFor[proxy.Config](), ""); err != nil {
		return cfg, fmt.Errorf("config %s, %w", path, err)
	}
	if err := root.Decode(&cfg); err != nil {
		return cfg, fmt.Errorf("config %s: %w", path, err)
	}
	return cfg, nil
}

// upstreamAsList turns a scalar upstream ("a:9092,b:9092") into the list
// it stands for, so the file takes what the flag takes; likewise replicas
// and replica_admin.
func upstreamAsList(root *yaml.Node) {
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		switch k.Value {
		case "upstream", "replicas", "replica_admin":
		default:
			continue
		}
		if v.Kind != yaml.ScalarNode || v.Tag == "!!null" {
			continue
		}
		seq := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq", Line: v.Line, Column: v.Column}
		for _, part := range splitList(v.Value) {
			seq.Content = append(seq.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: part, Line: v.Line})
		}
		root.Content[i+1] = seq
	}
}

var durationType = reflect.TypeFor[time.Duration]()

// checkNode walks n against typ: every key must name a field (by its yaml
// tag), and every duration must parse. where is the dotted path so far.
func checkNode(n *yaml.Node, typ reflect.Type, where string) error {
	for typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	key := strings.TrimSuffix(where, ".")
	switch {
	case typ == durationType:
		if n.Kind != yaml.ScalarNode {
			return fmt.Errorf("line %d: %s: want a duration such as 30s, got %s", n.Line, key, kindName(n))
		}
		if _, err := time.ParseDuration(n.Value); err != nil {
			if _, numErr := strconv.ParseFloat(n.Value, 64); numErr == nil {
				return fmt.Errorf("line %d: %s: %s is not a duration; write %ss", n.Line, key, n.Value, n.Value)
			}
			return fmt.Errorf("line %d: %s: %q is not a duration; write one like 500ms, 30s, 10m or 24h", n.Line, key, n.Value)
		}
	case typ.Kind() == reflect.Struct:
		if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
			return nil
		}
		if n.Kind != yaml.MappingNode {
			return fmt.Errorf("line %d: %s: want keys under it, got %s", n.Line, key, kindName(n))
		}
		fields := map[string]reflect.Type{}
		for i := range typ.NumField() {
			f := typ.Field(i)
			if tag := strings.Split(f.Tag.Get("yaml"), ",")[0]; tag != "" && tag != "-" {
				fields[tag] = f.Type
			}
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			ft, ok := fields[k.Value]
			if !ok {
				return unknownKey(k, where, fields)
			}
			if err := checkNode(v, ft, where+k.Value+"."); err != nil {
				return err
			}
		}
	case typ.Kind() == reflect.Map:
		if n.Kind != yaml.MappingNode {
			return nil // the decoder names the mismatch
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			if err := checkNode(n.Content[i+1], typ.Elem(), where+n.Content[i].Value+"."); err != nil {
				return err
			}
		}
	}
	return nil
}

func unknownKey(k *yaml.Node, where string, fields map[string]reflect.Type) error {
	best, bestDist := "", 1<<30
	names := make([]string, 0, len(fields))
	for name := range fields {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if d := editDistance(k.Value, name); d < bestDist {
			best, bestDist = name, d
		}
	}
	if bestDist <= max(2, len(k.Value)/3) {
		return fmt.Errorf("line %d: %s%s: unknown key; did you mean %s?", k.Line, where, k.Value, best)
	}
	return fmt.Errorf("line %d: %s%s: unknown key; known keys here: %s", k.Line, where, k.Value, strings.Join(names, ", "))
}

// editDistance is the Damerau-Levenshtein (optimal string alignment)
// distance: a swapped pair of letters ("listne") counts as one edit.
func editDistance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.SequenceNode:
		return "a list"
	case yaml.MappingNode:
		return "keys"
	default:
		return strconv.Quote(n.Value)
	}
}

// errNoUpstream: a config file must say which cluster it proxies, so a
// production config that lost the key cannot accept writes into memory.
var errNoUpstream = errors.New(`upstream is not set: name the cluster's bootstrap brokers (upstream: kafka-1:9092,kafka-2:9092), or write "upstream: embedded" for the in-memory test cluster`)

// placeholderUpstream refuses an upstream under .invalid, a name that
// never resolves (RFC 6761): config.example.yaml names its cluster so, and
// a copy of it left unchanged must fail at once, clearly, rather than
// start a proxy whose every broker connection fails.
func placeholderUpstream(upstream []string) error {
	for _, u := range upstream {
		host, _, err := net.SplitHostPort(u)
		if err != nil {
			continue // Validate has named it
		}
		if h := strings.TrimSuffix(strings.ToLower(host), "."); h == "invalid" || strings.HasSuffix(h, ".invalid") {
			return fmt.Errorf("upstream %s is a placeholder (a name under .invalid never resolves): name your cluster's bootstrap brokers "+
				"(--upstream or upstream in the config file); to try the proxy out, run dedupproxy cluster and pass --upstream 127.0.0.1:%d", u, defaultClusterPort)
		}
	}
	return nil
}

// parseOwners reads --replica-owners, NODE=INDEX[,NODE=INDEX...]. A pair
// it cannot read becomes an entry Validate refuses (index -1), so the
// error names the node.
func parseOwners(v string) map[int32]int {
	owners := map[int32]int{}
	for _, pair := range splitList(v) {
		node, index, _ := strings.Cut(pair, "=")
		id, err := strconv.ParseInt(strings.TrimSpace(node), 10, 32)
		if err != nil {
			id = -1
		}
		i, err := strconv.Atoi(strings.TrimSpace(index))
		if err != nil {
			i = -1
		}
		owners[int32(id)] = i
	}
	return owners
}
