//go:build unix

package integration_test

import (
	"slices"
	"strconv"
	"strings"
	"testing"
)

// faultHistory is what the workers said.
type faultHistory struct {
	ops       map[string]*faultOp
	order     []string // op ids in the order of their calls
	clients   map[string]int
	grants    []faultGrant
	permits   map[string]*faultPermit // by worker/token
	ticks     int
	rlAcked   []string       // ids of acknowledged rate-limited calls
	partOK    []string       // ids of acknowledged partition writes
	partStale int            // partition writes refused by the fence
	partErrs  map[string]int // the partition workload's other failures, by what failed and errorClass
	errs      []faultError   // failed grant attempts
	end       int64          // after the last event
}

// faultError is a grant attempt that failed: when, and what the client saw (errorClass).
type faultError struct {
	at    int64
	class string
}

type faultOp struct {
	worker     string
	call, ret  int64 // ret 0: no reply (unknown outcome)
	write      bool
	grant      bool // an attempt to take the register's lease
	reg        string
	token, val int64  // written, read, or granted
	outcome    string // "ok", "stale", "read", "read-lost", "read-deposed", "granted", "held", "lost", or "" (unknown)
	server     string // the address of the server that answered a read
	timeline   int64  // the timeline that server wrote on (0: a standby)
}

type faultGrant struct {
	worker      string
	reg         string
	token       int64
	from, until int64
}

type faultPermit struct{ start, end int64 }

func (hi *faultHistory) count(outcome string) int {
	n := 0
	for _, op := range hi.ops {
		if op.write && op.outcome == outcome {
			n++
		}
	}
	return n
}

func parseFaultHistory(t *testing.T, lines []workerLine) *faultHistory {
	hi := &faultHistory{ops: map[string]*faultOp{}, clients: map[string]int{}, permits: map[string]*faultPermit{},
		partErrs: map[string]int{}}
	num := func(s string) int64 {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("bad number %q in a worker's line", s)
		}
		return n
	}
	for _, l := range lines {
		f := strings.Fields(l.line)
		if len(f) == 0 {
			continue
		}
		name := l.worker.Name()
		switch {
		case f[0] == "op" && len(f) >= 5 && f[2] == "call":
			op := &faultOp{worker: name, call: num(f[3]), write: f[4] == "write", reg: f[5]}
			if op.write {
				op.token, op.val = num(f[6]), num(f[7])
			}
			hi.ops[f[1]] = op
			hi.order = append(hi.order, f[1])
			hi.end = max(hi.end, op.call)
			if _, ok := hi.clients[name]; !ok {
				hi.clients[name] = len(hi.clients)
			}
		case f[0] == "op" && f[2] == "ret":
			op := hi.ops[f[1]]
			if op == nil {
				t.Fatalf("a reply without a call: %q", l.line)
			}
			op.ret = num(f[3])
			hi.end = max(hi.end, op.ret)
			if op.write {
				op.outcome = f[4]
			} else {
				op.outcome, op.token, op.val = "read", num(f[4]), num(f[5])
				if len(f) > 7 {
					op.server, op.timeline = f[6], num(f[7])
				}
			}
		case f[0] == "acq" && len(f) == 5 && f[2] == "call":
			hi.ops[f[1]] = &faultOp{worker: name, call: num(f[3]), grant: true, reg: f[4]}
			hi.order = append(hi.order, f[1])
			hi.end = max(hi.end, num(f[3]))
			if _, ok := hi.clients[name]; !ok {
				hi.clients[name] = len(hi.clients)
			}
		case f[0] == "acq" && len(f) == 5 && f[2] == "ret":
			op := hi.ops[f[1]]
			if op == nil {
				t.Fatalf("a reply without a call: %q", l.line)
			}
			op.ret = num(f[3])
			hi.end = max(hi.end, op.ret)
			if f[4] == "held" {
				op.outcome = "held"
			} else {
				op.outcome, op.token = "granted", num(f[4])
			}
		case f[0] == "trust":
			hi.grants = append(hi.grants, faultGrant{worker: name, reg: f[1], token: num(f[2]), from: num(f[3]), until: num(f[4])})
		case f[0] == "untrust":
			for i := range slices.Backward(hi.grants) {
				if g := &hi.grants[i]; g.worker == name && g.reg == f[1] && g.token == num(f[2]) {
					g.until = min(g.until, num(f[3]))
					break
				}
			}
		case f[0] == "permit" && f[2] == "start":
			hi.permits[name+"/"+f[1]] = &faultPermit{start: num(f[3]), end: num(f[4])} // until its expiry
		case f[0] == "permit" && f[2] == "end":
			if p := hi.permits[name+"/"+f[1]]; p != nil {
				p.end = min(p.end, num(f[3]))
			}
		case f[0] == "tick":
			hi.ticks++
		case f[0] == "rl" && len(f) == 2:
			hi.rlAcked = append(hi.rlAcked, f[1])
		case f[0] == "pw" && len(f) == 3 && f[2] == "ok":
			hi.partOK = append(hi.partOK, f[1])
		case f[0] == "pw" && len(f) == 3 && f[2] == "stale":
			hi.partStale++
		case f[0] == "perr" && len(f) == 3:
			hi.partErrs[f[1]+" "+f[2]]++
		case f[0] == "err" && len(f) == 3:
			hi.errs = append(hi.errs, faultError{at: num(f[1]), class: f[2]})
		}
	}
	return hi
}
