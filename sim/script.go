package sim

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/dedupproxy/dedupproxy/decide"
	"github.com/dedupproxy/dedupproxy/sim/client"
	"github.com/dedupproxy/dedupproxy/sim/kafka"
)

// recorder writes what the core was told, in the datadriven format of
// decide/testdata (decide/script_test.go), so that a run replays against
// the core alone. Commands are written without their expected output: the
// script runner's -rewrite fills it in. A nil recorder records nothing (a
// run records only when it is replayed to print a failure).
type recorder struct {
	w    *world
	b    strings.Builder
	sent map[int]bool
}

func (r *recorder) line(cmd string) {
	fmt.Fprintf(&r.b, "%s at=%s\n----\n\n", cmd, r.w.now)
}

func (r *recorder) comment(format string, a ...any) {
	if r == nil {
		return
	}
	fmt.Fprintf(&r.b, "# "+format+"\n", a...)
}

func (r *recorder) header() {
	if r == nil {
		return
	}
	r.sent = map[int]bool{}
	w := r.w
	fmt.Fprintf(&r.b, "# The simulation's seed %d (go test ./sim -run TestSimulation -args -seed=%d -seeds=1 -script -v).\n", w.seed, w.seed)
	fmt.Fprintf(&r.b, "# Saved as decide/testdata/sim_seed_%d.txt, its expected output is filled in by\n", w.seed)
	fmt.Fprintf(&r.b, "# go test ./decide -run TestScripts/sim_seed_%d -args -rewrite\n", w.seed)
	match := map[decide.Match]string{decide.MatchAuto: "auto", decide.MatchRecords: "records", decide.MatchExact: "exact", decide.MatchOff: "off"}[w.cfg.match]
	scope := "instance"
	if w.cfg.scope == decide.ScopeClientID {
		scope = "client_id"
	}
	fmt.Fprintf(&r.b, "case name=sim-seed-%d warm=true match=%s scope=%s window=%s\n----\n\n", w.seed, match, scope, w.cfg.window)
}

func (r *recorder) connect(s *session) {
	if r == nil {
		return
	}
	cn := s.cn
	info := cn.Client.Info
	cmd := fmt.Sprintf("connect conn=%d client=%s principal=%d host=%s", cn.ID, info.ID, info.Principal, info.Host)
	if info.Software != "" {
		cmd += " software=" + info.Software
	}
	r.line(cmd + " core=" + s.k.name)
}

// specPart writes one batch as a part or tail batch: NAME,...|ts=...
// (ms after the base time), and its producer fields if it has some.
func specPart(prefix string, b *kafka.Batch) string {
	var sb strings.Builder
	sb.WriteString(prefix)
	ts := make([]string, len(b.Recs))
	same := true
	for i, x := range b.Recs {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(x.Name)
		ts[i] = strconv.FormatInt(x.TS-base.UnixMilli(), 10)
		same = same && ts[i] == ts[0]
	}
	if same {
		ts = ts[:1]
	}
	sb.WriteString("|ts=" + strings.Join(ts, ","))
	if b.PID >= 0 {
		fmt.Fprintf(&sb, "|pid=%d|epoch=%d|seq=%d", b.PID, b.Epoch, b.Seq)
	} else {
		switch {
		case b.W.LegacyEpoch == 0:
			sb.WriteString("|writer=kafkajs")
		case b.W.LeaderEpoch == -1:
			sb.WriteString("|writer=kafka-go")
		}
	}
	return sb.String()
}

// expect writes, for a decision that is Ready, what the simulation saw it
// decide, in the script runner's words (acts only).
func (r *recorder) expect(d *deciding) {
	if r == nil || d.pl.Status != decide.Ready {
		return
	}
	var acts []string
	for i, b := range d.req.Parts {
		pp := &d.pl.Parts[i]
		switch pp.Act {
		case decide.Forward:
			acts = append(acts, fmt.Sprintf("p%d forward", b.Partition))
		case decide.Answer:
			a := fmt.Sprintf("p%d answer offset=%d", b.Partition, pp.Local.BaseOffset)
			if pp.Local.ErrorCode != 0 {
				a = fmt.Sprintf("p%d answer error=%d", b.Partition, pp.Local.ErrorCode)
			}
			acts = append(acts, a)
		case decide.Rebuild:
			acts = append(acts, fmt.Sprintf("p%d rebuild", b.Partition))
		}
	}
	r.comment("sim: %s", strings.Join(acts, "; "))
}

func (r *recorder) decide(s *session, d *deciding) {
	if r == nil {
		return
	}
	req := d.req
	if !r.sent[req.ID] {
		r.sent[req.ID] = true
		var parts []string
		for _, b := range req.Parts {
			parts = append(parts, specPart(fmt.Sprintf("%d:", b.Partition), b))
		}
		c := req.Client
		r.comment("%s (%s, %s) sends req %d on conn %d: %s", c.Name, c.Lib.Name, c.Workload, req.ID, req.Conn.ID, whyOf(req))
		r.line(fmt.Sprintf("send req=%d conn=%d parts=%s acks=%d timeout=%s", req.ID, s.cn.ID, strings.Join(parts, ";"), req.Acks, req.Timeout))
		return
	}
	cmd := fmt.Sprintf("decide req=%d", req.ID)
	if d.pl.GaveUp != decide.NotGivenUp {
		cmd += " giveup" // replayed as asked: the same answer
	}
	r.line(cmd)
}

// whyOf says why each record of req is sent.
func whyOf(req *client.Request) string {
	var out []string
	for i, b := range req.Parts {
		for j, x := range b.Recs {
			if w := req.Whys[i][j]; w != "new" {
				out = append(out, fmt.Sprintf("%s|ts=%d to p%d again (%s)", x.Name, x.TS-base.UnixMilli(), b.Partition, w))
			}
		}
	}
	if len(out) == 0 {
		return "new records"
	}
	return strings.Join(out, ", ")
}

func (r *recorder) unsent(s *session, req *client.Request) {
	if r == nil {
		return
	}
	r.line(fmt.Sprintf("unsent req=%d", req.ID))
}

func (r *recorder) answer(s *session, p *pending) {
	if r == nil {
		return
	}
	cmd := fmt.Sprintf("answer req=%d", p.req.ID)
	for _, x := range p.resp {
		if x.Code != 0 {
			cmd += fmt.Sprintf(" %d=error:%d", x.Partition, x.Code)
			continue
		}
		cmd += fmt.Sprintf(" %d=offset:%d", x.Partition, x.Offset)
		if x.AppendTime >= 0 {
			cmd += fmt.Sprintf(":%d", x.AppendTime-base.UnixMilli())
		}
	}
	r.line(cmd)
}

func (r *recorder) lost(s *session, req *client.Request) {
	if r == nil {
		return
	}
	r.line(fmt.Sprintf("lost req=%d", req.ID))
}

func (r *recorder) deliver(s *session, req *client.Request, ok bool) {
	if r == nil {
		return
	}
	cmd := fmt.Sprintf("deliver req=%d", req.ID)
	if !ok {
		cmd += " ok=false"
	}
	r.line(cmd)
}

func (r *recorder) close(s *session, why string, clean bool) {
	if r == nil {
		return
	}
	r.comment("conn %d ends at the proxy: %s", s.cn.ID, why)
	cmd := fmt.Sprintf("close conn=%d", s.cn.ID)
	if clean {
		cmd += " clean"
	}
	r.line(cmd)
}

func (r *recorder) tail(k *core, p int32, failed bool) {
	if r == nil {
		return
	}
	cmd := fmt.Sprintf("tail p=%d core=%s", p, k.name)
	if failed {
		r.line(cmd + " failed")
		return
	}
	var bs []string
	for _, lb := range r.w.broker.Logs[p].Batches {
		h := kafka.HeaderOf(lb.Raw)
		spec := kafka.Batch{Recs: lb.Recs, PID: h.ProducerID, Epoch: h.ProducerEpoch, Seq: h.BaseSequence}
		if h.ProducerID < 0 {
			spec.W = kafka.Writer{LegacyEpoch: -1} // a log batch's writer does not matter to the core
		}
		bs = append(bs, specPart(fmt.Sprintf("%d:", lb.Base), &spec))
	}
	if len(bs) > 0 {
		cmd += " batches=" + strings.Join(bs, ";")
	}
	r.line(cmd)
}

func (r *recorder) rewarm(k *core, p int32) {
	if r == nil {
		return
	}
	r.line(fmt.Sprintf("rewarm p=%d core=%s", p, k.name))
}

func (r *recorder) handoff(from, to *core, parts []int32) {
	if r == nil {
		return
	}
	ps := make([]string, len(parts))
	for i, p := range parts {
		ps[i] = strconv.Itoa(int(p))
	}
	if len(ps) == 0 {
		ps = []string{"-"}
	}
	r.line(fmt.Sprintf("handoff from=%s to=%s p=%s", from.name, to.name, strings.Join(ps, ",")))
}

func (r *recorder) restart(rp *replica) {
	if r == nil {
		return
	}
	r.comment("replica %d restarted: core %s, a new one", rp.id, rp.core.name)
}
