//go:build linux

package cli

import (
	"bytes"
	"errors"
	"os"
	"strconv"
	"strings"
	"syscall"
	"unsafe"
)

// hideSecrets overwrites, in pgcoord's own memory, the bytes of its command line and
// environment that hold the database password, where the kernel shows them to others
// (/proc/PID/cmdline, which every user can read, and ps) and to processes of the same user
// (/proc/PID/environ): the --database-url value when it holds a password, and the values
// of $PGCOORD_DATABASE_URL (when it holds one), $PGPASSWORD and any variable holding the
// connection string in use. pgcoord keeps using its copies of the values (the Go runtime
// copies the environment at start; the flag's value is copied here). Only bytes inside the
// argument and environment areas the kernel set up at exec (named in /proc/self/stat) are
// touched, so a run inside another program, such as a test, leaves its strings alone.
// Until it runs — from the exec until the flags are parsed — the values show.
func hideSecrets(a *app) {
	args, env, err := startAreas()
	if err != nil {
		return
	}
	mem, err := os.OpenFile("/proc/self/mem", os.O_RDWR, 0)
	if err != nil {
		return
	}
	defer mem.Close()
	if connStringHasPassword(a.databaseURL) {
		old := a.databaseURL
		a.databaseURL = strings.Clone(old)
		args.overwrite(mem, old)
	}
	// Go copied the environment at start: no string of pgcoord's is these bytes.
	buf := make([]byte, env.end-env.start)
	if _, err := mem.ReadAt(buf, int64(env.start)); err != nil {
		return
	}
	conn, off := a.connString(), int64(env.start)
	for _, kv := range bytes.Split(buf, []byte{0}) {
		k, v, _ := strings.Cut(string(kv), "=")
		if v != "" && holdsSecret(k, v, conn) {
			_, _ = mem.WriteAt(bytes.Repeat([]byte{'x'}, len(v)), off+int64(len(k)+1))
		}
		off += int64(len(kv)) + 1
	}
}

// holdsSecret reports whether the variable k=v holds the database password: PGPASSWORD,
// $PGCOORD_DATABASE_URL with a password in it, or any variable holding the connection
// string conn when conn has a password.
func holdsSecret(k, v, conn string) bool {
	switch {
	case k == "PGPASSWORD":
		return true
	case k == EnvDatabaseURL:
		return connStringHasPassword(v)
	}
	return conn != "" && connStringHasPassword(conn) && strings.Contains(v, conn)
}

// area is a range of pgcoord's address space.
type area struct{ start, end uintptr }

// holds reports whether the bytes of s lie inside the area.
func (r area) holds(s string) bool {
	p := uintptr(unsafe.Pointer(unsafe.StringData(s)))
	return len(s) > 0 && p >= r.start && p+uintptr(len(s)) <= r.end
}

// overwrite replaces the bytes of s with 'x' through mem (/proc/self/mem), if they lie
// inside the area. s reads "xxx..." afterwards: callers use a copy.
func (r area) overwrite(mem *os.File, s string) {
	if !r.holds(s) {
		return
	}
	p := uintptr(unsafe.Pointer(unsafe.StringData(s)))
	_, _ = mem.WriteAt(bytes.Repeat([]byte{'x'}, len(s)), int64(p))
}

// startAreas reads the argument and environment areas from /proc/self/stat (fields 48 to
// 51: arg_start, arg_end, env_start, env_end).
func startAreas() (args, env area, err error) {
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return args, env, err
	}
	i := bytes.LastIndexByte(b, ')') // the command name, field 2, may hold spaces
	if i < 0 {
		return args, env, errors.New("unexpected /proc/self/stat")
	}
	f := strings.Fields(string(b[i+1:])) // f[0] is field 3
	if len(f) < 51-2 {
		return args, env, errors.New("/proc/self/stat lacks the argument and environment areas")
	}
	var n [4]uintptr
	for j := range n {
		v, err := strconv.ParseUint(f[48-3+j], 10, 64)
		if err != nil {
			return args, env, err
		}
		n[j] = uintptr(v)
	}
	return area{n[0], n[1]}, area{n[2], n[3]}, nil
}

// keepMemoryFromChildren makes pgcoord not dumpable, so that a process of the same user
// without CAP_SYS_PTRACE — the command `leases run` runs — can neither read its memory
// (/proc/PID/mem, ptrace) nor its environment (/proc/PID/environ), where the password
// was or is. The command itself starts dumpable (exec resets it).
func keepMemoryFromChildren() error {
	if _, _, e := syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_DUMPABLE, 0, 0); e != 0 {
		return e
	}
	return nil
}
