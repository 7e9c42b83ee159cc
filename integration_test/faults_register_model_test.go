//go:build unix

package integration_test

import (
	"fmt"
	"math"
	"testing"

	"github.com/anishathalye/porcupine"
)

// porcupineOps returns the register writes and reads for porcupine. A write without a
// reply stays open until the end of the history: accepted if it committed, left out if it
// did not (resolveWrites), and either if unresolved. A read without a reply tells nothing
// and is left out, as are one that saw a write a failover lost and one that a deposed
// primary answered (resolveWrites).
//
// The grants of the registers' leases matter too: the fence refuses a token lower than the
// newest grant even before that grant's holder writes. Each write carries what the grants
// say about it, in real time: it may be refused if a higher grant was called before the write
// returned (it may have committed before the write's check), and it must be refused if a
// higher grant returned before the write was called. Grants whose reply was lost count
// with the token they committed (resolveGrants) and no return: they make a refusal
// possible, never necessary.
func (hi *faultHistory) porcupineOps() []porcupine.Operation {
	grants := map[string][]*faultOp{}
	for _, id := range hi.order {
		if op := hi.ops[id]; op.grant && op.outcome == "granted" {
			grants[op.reg] = append(grants[op.reg], op)
		}
	}
	var ops []porcupine.Operation
	for _, id := range hi.order {
		op := hi.ops[id]
		if op.grant || (op.ret == 0 && !op.write) || op.outcome == "lost" || op.outcome == "read-lost" || op.outcome == "read-deposed" {
			continue
		}
		in := regInput{write: op.write, reg: op.reg, token: op.token, value: op.val}
		ret := op.ret
		if ret == 0 {
			ret = math.MaxInt64
		}
		if op.write {
			for _, g := range grants[op.reg] {
				if g.token > op.token && g.call < ret {
					in.refusable = true
				}
				if g.token > op.token && g.ret != 0 && g.ret < op.call {
					in.mustRefuse = true
				}
			}
		}
		o := porcupine.Operation{ClientId: hi.clients[op.worker], Call: op.call, Return: ret, Input: in}
		switch op.outcome {
		case "":
			o.Output = regOutput{}
		case "read":
			o.Output = regOutput{known: true, token: op.token, value: op.val, server: fmt.Sprintf("%s, timeline %d", op.server, op.timeline)}
		default:
			o.Output = regOutput{known: true, accepted: op.outcome == "ok"}
		}
		ops = append(ops, o)
	}
	return ops
}

// The fenced register's sequential specification: a write is accepted if and only if its
// token is not lower than the register's and no higher grant of the register's lease came
// before it (see porcupineOps), and then sets both; a read returns both.
type (
	regState struct{ token, value int64 }
	regInput struct {
		write        bool
		reg          string
		token, value int64
		// What the lease's grants say: a higher grant may have come before the write's
		// check (it may be refused), or surely did (it must be).
		refusable, mustRefuse bool
	}
	regOutput struct {
		known        bool // false: the write's outcome is unknown (no reply)
		accepted     bool // a write's outcome
		token, value int64
		server       string // a read's server and its timeline, for explanations only
	}
)

var registerModel = (&porcupine.NondeterministicModel{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byReg := map[string][]porcupine.Operation{}
		var regs []string
		for _, op := range history {
			r := op.Input.(regInput).reg
			if _, ok := byReg[r]; !ok {
				regs = append(regs, r)
			}
			byReg[r] = append(byReg[r], op)
		}
		var out [][]porcupine.Operation
		for _, r := range regs {
			out = append(out, byReg[r])
		}
		return out
	},
	Init: func() []any { return []any{regState{}} },
	Step: func(state, input, output any) []any {
		s, in, out := state.(regState), input.(regInput), output.(regOutput)
		if !in.write {
			if out.token == s.token && out.value == s.value {
				return []any{s}
			}
			return nil
		}
		current := in.token >= s.token
		next := regState{in.token, in.value}
		switch {
		case !out.known && current && !in.mustRefuse:
			return []any{s, next} // it may or may not have committed
		case !out.known:
			return []any{s}
		case out.accepted && current && !in.mustRefuse:
			return []any{next}
		case out.accepted:
			return nil // a stale write was accepted
		case !current || in.refusable:
			return []any{s}
		default:
			return nil // a current write was refused
		}
	},
}).ToModel()

// TestRegisterChecksLeaveOutOnlyDeposedReads: a stale read answered by a primary on an
// older timeline than a token acknowledged before it is left out; the same read answered
// on the newest timeline is a violation.
func TestRegisterChecksLeaveOutOnlyDeposedReads(t *testing.T) {
	tl2 := int64(1) << 44 // the first token of timeline 2
	history := func(readTimeline int64) *faultHistory {
		hi := &faultHistory{ops: map[string]*faultOp{}, clients: map[string]int{"w1": 0, "w2": 1, "w3": 2}}
		add := func(id string, op *faultOp) {
			op.reg = "reg-0"
			hi.ops[id] = op
			hi.order = append(hi.order, id)
		}
		add("w1-1", &faultOp{worker: "w1", call: 1, ret: 2, write: true, token: 5, val: 10, outcome: "ok"})
		add("w2-1", &faultOp{worker: "w2", call: 3, ret: 4, grant: true, token: tl2 + 7, outcome: "granted"})
		add("w2-2", &faultOp{worker: "w2", call: 5, ret: 6, write: true, token: tl2 + 7, val: 20, outcome: "ok"})
		add("w3-1", &faultOp{worker: "w3", call: 7, ret: 8, token: 5, val: 10, outcome: "read", server: "old", timeline: readTimeline})
		return hi
	}
	if hi := history(1); porcupine.CheckOperations(registerModel, hi.porcupineOps()) {
		t.Fatal("a read of the value a newer write replaced passes the check")
	}
	old := history(1)
	if n := old.dropDeposedReads(); n != 1 {
		t.Fatalf("dropped %d reads answered on timeline 1 after a token of timeline 2 was acknowledged, want 1", n)
	}
	if !porcupine.CheckOperations(registerModel, old.porcupineOps()) {
		t.Error("the history without the deposed primary's read is not linearizable")
	}
	current := history(2)
	if n := current.dropDeposedReads(); n != 0 {
		t.Fatalf("dropped %d reads answered on the newest timeline, want 0", n)
	}
	if porcupine.CheckOperations(registerModel, current.porcupineOps()) {
		t.Error("a stale read on the newest timeline passes the check")
	}
}
