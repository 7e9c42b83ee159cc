//go:build unix

package integration_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgcoord/pgcoord/fenced"
	"github.com/pgcoord/pgcoord/internal/workerproc"
	"github.com/pgcoord/pgcoord/partition"
)

// The partition member: a process that joins the group partChaosGroup (partition.Join)
// and, for each partition granted to it, writes a row of part_ledger every partEvery or so
// until the partition leaves it, each in a transaction guarded by the grant — Member.Check
// or fenced.Check with the partition's resource, picked at random per write — then one
// write more after the partition's context ended (late: what a paused or slow worker does
// when it wakes; the guard must refuse it once the partition was granted again). It says:
//
//	joined                      after Join returned
//	refused <partition> <token> <guard> <late>   a write the guard refused
//	failed <partition> <token> <error>           a write that failed otherwise
//	owned <id>:<token> ...      in answer to "owned": Member.Owned
//	left                        after "leave": Member.Leave returned; then it exits
//
// Stdin closing (the test's cleanup) ends it without leaving, as a crash would.

const partMemberRole = "partition.member"

func init() { workerRoles[partMemberRole] = partMember }

// partOpTimeout bounds each write, so that a write blocked behind a stopped member's lock
// ends (the guard's row locks are held until the writer's transaction ends).
const partOpTimeout = 10 * time.Second

// partMember is the role. Parameters: MEMBER, WEIGHT, TTL, EVERY, SEED.
func partMember(ctx context.Context, w *workerproc.Worker) error {
	name := w.Param("MEMBER")
	weight, err := strconv.Atoi(w.Param("WEIGHT"))
	if err != nil {
		return err
	}
	ttl, err := time.ParseDuration(w.Param("TTL"))
	if err != nil {
		return err
	}
	every, err := time.ParseDuration(w.Param("EVERY"))
	if err != nil {
		return err
	}
	seed, err := strconv.ParseUint(w.Param("SEED"), 10, 64)
	if err != nil {
		return err
	}

	var (
		member  *partition.Member
		joined  = make(chan struct{}) // member is set: OnAssign runs inside Join already
		mu      sync.Mutex
		writers = map[[2]int64]chan struct{}{} // (partition, token) → closed when its writer returned
		all     sync.WaitGroup
	)
	write := func(p partition.Partition, rng *rand.Rand, late bool) {
		guard := "member"
		if rng.IntN(2) == 0 {
			guard = "fence"
		}
		ctx, cancel := context.WithTimeout(context.Background(), partOpTimeout)
		defer cancel()
		err := pgx.BeginFunc(ctx, w.Pool, func(tx pgx.Tx) error {
			var err error
			if guard == "member" {
				err = member.Check(ctx, tx, p)
			} else {
				err = fenced.Check(ctx, tx, p.Resource(), p.Token)
			}
			if err != nil {
				return err
			}
			_, err = tx.Exec(ctx, `INSERT INTO part_ledger (part, token, member, guard, late) VALUES ($1, $2, $3, $4, $5)`,
				p.ID, p.Token, name, guard, late)
			return err
		})
		switch {
		case errors.Is(err, partition.ErrRevoked) || errors.Is(err, fenced.ErrStale):
			w.Say("refused %d %d %s %t", p.ID, p.Token, guard, late)
		case err != nil:
			w.Say("failed %d %d %s", p.ID, p.Token, strings.ReplaceAll(err.Error(), "\n", " "))
		}
	}
	// writer writes for p until p's context ends, then once more.
	writer := func(p partition.Partition, done chan struct{}) {
		defer all.Done()
		defer close(done)
		<-joined
		rng := rand.New(rand.NewPCG(seed, uint64(p.Token)))
		for {
			late := p.Context.Err() != nil
			write(p, rng, late)
			if late {
				return
			}
			t := time.NewTimer(every/2 + time.Duration(rng.Int64N(int64(every))))
			select {
			case <-p.Context.Done():
				t.Stop()
			case <-t.C:
			}
		}
	}
	member, err = partition.Join(ctx, w.Pool, partChaosGroup, &partition.Options{
		Partitions: partChaosPartitions, Member: name, Weight: weight, TTL: ttl,
		OnAssign: func(p partition.Partition) {
			done := make(chan struct{})
			mu.Lock()
			writers[[2]int64{int64(p.ID), p.Token}] = done
			mu.Unlock()
			all.Add(1)
			go writer(p, done)
		},
		OnRevoke: func(ctx context.Context, p partition.Partition) {
			mu.Lock()
			done := writers[[2]int64{int64(p.ID), p.Token}]
			delete(writers, [2]int64{int64(p.ID), p.Token})
			mu.Unlock()
			if done != nil {
				select {
				case <-done:
				case <-ctx.Done():
				}
			}
		},
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		return err
	}
	close(joined)
	w.Say("joined")
	for {
		cmd, err := w.Next()
		if err != nil {
			return nil // stdin closed: end without leaving, as a crash would
		}
		switch cmd {
		case "owned":
			var b strings.Builder
			b.WriteString("owned")
			for _, p := range member.Owned() {
				fmt.Fprintf(&b, " %d:%d", p.ID, p.Token)
			}
			w.Say("%s", b.String())
		case "leave":
			if err := member.Leave(context.Background()); err != nil {
				return err
			}
			all.Wait()
			w.Say("left")
			return nil
		default:
			return fmt.Errorf("unknown instruction %q", cmd)
		}
	}
}
