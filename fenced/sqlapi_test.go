package fenced_test

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgcoord/pgcoord/internal/pgtest"
)

// sqlAPIDoc is the page whose examples TestSQLAPIDoc runs.
const sqlAPIDoc = "../docs/sql-api.md"

// block is one fenced code block of a Markdown file.
type block struct {
	lang string
	line int // the line of its first content line, 1-based
	text string
}

// codeBlocks returns the fenced code blocks (```lang ... ```) of a Markdown text.
func codeBlocks(md string) ([]block, error) {
	var out []block
	var cur *block
	var body strings.Builder
	for i, line := range strings.Split(md, "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case cur == nil && strings.HasPrefix(trimmed, "```") && !strings.HasPrefix(trimmed, "````"):
			cur = &block{lang: strings.TrimSpace(strings.TrimPrefix(trimmed, "```")), line: i + 2}
			body.Reset()
		case cur != nil && trimmed == "```":
			cur.text = body.String()
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			body.WriteString(line)
			body.WriteByte('\n')
		}
	}
	if cur != nil {
		return nil, fmt.Errorf("line %d: code block never closed", cur.line-1)
	}
	return out, nil
}

// statement is one SQL statement of a code block, with the expectations written after it.
type statement struct {
	sql    string // the statement's text without comments, ending with ";"
	line   int    // the line of the Markdown file it starts on
	expect []string
}

var dollarTag = regexp.MustCompile(`^\$([A-Za-z_][A-Za-z0-9_]*)?\$`)

// statements splits a block of SQL into statements the way psql does: at semicolons
// outside quotes, dollar quotes and comments. A comment "-- => ..." is an expectation of
// the statement before it.
func statements(b block) ([]statement, error) {
	var (
		out  []statement
		cur  strings.Builder
		line = b.line
		at   int // the line cur started on
	)
	src := b.text
	add := func(s string) {
		if strings.TrimSpace(cur.String()) == "" && strings.TrimSpace(s) != "" {
			at = line + strings.Count(s[:len(s)-len(strings.TrimLeft(s, " \t\n"))], "\n")
			cur.Reset()
		}
		cur.WriteString(s)
		line += strings.Count(s, "\n")
	}
	for i := 0; i < len(src); {
		rest := src[i:]
		switch {
		case strings.HasPrefix(rest, "--"):
			end := strings.IndexByte(rest, '\n')
			if end < 0 {
				end = len(rest)
			}
			comment := rest[:end]
			if e, ok := strings.CutPrefix(comment, "-- =>"); ok {
				if strings.TrimSpace(cur.String()) != "" {
					return nil, fmt.Errorf("line %d: expectation %q inside a statement (missing ;?)", line, comment)
				}
				if len(out) == 0 {
					return nil, fmt.Errorf("line %d: expectation %q before any statement", line, comment)
				}
				out[len(out)-1].expect = append(out[len(out)-1].expect, strings.TrimSpace(e))
			}
			i += end // the newline is copied as text below
		case strings.HasPrefix(rest, "/*"):
			end := strings.Index(rest, "*/")
			if end < 0 {
				return nil, fmt.Errorf("line %d: unterminated /* comment", line)
			}
			line += strings.Count(rest[:end+2], "\n")
			i += end + 2
		case rest[0] == '\'' || rest[0] == '"':
			q := rest[0]
			j := 1
			for ; j < len(rest); j++ {
				if rest[j] == q {
					if j+1 < len(rest) && rest[j+1] == q { // a doubled quote
						j++
						continue
					}
					break
				}
			}
			if j >= len(rest) {
				return nil, fmt.Errorf("line %d: unterminated %c quote", line, q)
			}
			add(rest[:j+1])
			i += j + 1
		case rest[0] == '$' && dollarTag.MatchString(rest):
			tag := dollarTag.FindString(rest)
			end := strings.Index(rest[len(tag):], tag)
			if end < 0 {
				return nil, fmt.Errorf("line %d: unterminated %s quote", line, tag)
			}
			n := len(tag) + end + len(tag)
			add(rest[:n])
			i += n
		case rest[0] == ';':
			add(";")
			if s := strings.TrimSpace(cur.String()); s != ";" {
				out = append(out, statement{sql: s, line: at})
			}
			cur.Reset()
			i++
		default:
			add(rest[:1])
			i++
		}
	}
	if s := strings.TrimSpace(cur.String()); s != "" {
		return nil, fmt.Errorf("line %d: statement without a closing semicolon: %q", at, s)
	}
	return out, nil
}

func TestSQLStatementSplitting(t *testing.T) {
	t.Parallel()
	src := "SELECT ';', \"a;b\", 'it''s; fine' -- a comment; not a split\n" +
		"  FROM t;\n" +
		"-- => x | y\n" +
		"-- => z\n" +
		"/* ; */ DO $$ BEGIN PERFORM 1; END $$;\n" +
		"CREATE FUNCTION f() RETURNS int LANGUAGE sql AS $body$ SELECT 1; $body$;\n" +
		"-- => error 42P13\n" +
		"SELECT $1;\n"
	got, err := statements(block{lang: "sql", line: 10, text: src})
	if err != nil {
		t.Fatal(err)
	}
	want := []statement{
		{sql: "SELECT ';', \"a;b\", 'it''s; fine' \n  FROM t;", line: 10, expect: []string{"x | y", "z"}},
		{sql: "DO $$ BEGIN PERFORM 1; END $$;", line: 14},
		{sql: "CREATE FUNCTION f() RETURNS int LANGUAGE sql AS $body$ SELECT 1; $body$;", line: 15, expect: []string{"error 42P13"}},
		{sql: "SELECT $1;", line: 17},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d statements %+v, want %d", len(got), got, len(want))
	}
	for i := range want {
		if got[i].sql != want[i].sql || got[i].line != want[i].line || !slices.Equal(got[i].expect, want[i].expect) {
			t.Errorf("statement %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	for _, bad := range []string{"SELECT 1", "SELECT 'x;", "SELECT 1\n-- => 1\n;", "-- => 1\nSELECT 1;", "SELECT $$;"} {
		if _, err := statements(block{text: bad}); err == nil {
			t.Errorf("statements(%q) succeeded, want an error", bad)
		}
	}
}

// TestSQLAPIDoc runs every ```sql block of docs/sql-api.md, top to bottom, statement by
// statement like psql, in one session on a fresh migrated schema, over the simple query
// protocol. Each statement must succeed, and match the "-- =>" expectations written
// after it: its rows, "no row", "error SQLSTATE", or "notification "payload"" (received on
// the lease channel; any notification not expected fails the test).
func TestSQLAPIDoc(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	md, err := os.ReadFile(sqlAPIDoc)
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := codeBlocks(string(md))
	if err != nil {
		t.Fatalf("%s: %v", sqlAPIDoc, err)
	}

	pool := pgtest.Pool(t)
	cfg := pool.Config().ConnConfig
	var notes []*pgconn.Notification // appended while a statement runs, on this goroutine
	cfg.OnNotification = func(_ *pgconn.PgConn, n *pgconn.Notification) { notes = append(notes, n) }
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var channel string
	if err := conn.QueryRow(ctx, `SELECT pgcoord_channel('leases')`).Scan(&channel); err != nil {
		t.Fatal(err)
	}

	var ran, checkedRows, checkedNoRow, checkedErrors, checkedNotes int
	for _, b := range blocks {
		if b.lang != "sql" {
			continue
		}
		stmts, err := statements(b)
		if err != nil {
			t.Fatalf("%s: %v", sqlAPIDoc, err)
		}
		for _, s := range stmts {
			where := fmt.Sprintf("%s:%d", sqlAPIDoc, s.line)
			var wantRows, wantNotes []string
			var rowsGiven bool
			var wantErr string
			for _, e := range s.expect {
				switch {
				case e == "no row":
					rowsGiven = true
				case strings.HasPrefix(e, "error "):
					wantErr = strings.TrimPrefix(e, "error ")
				case strings.HasPrefix(e, "notification "):
					wantNotes = append(wantNotes, strings.Trim(strings.TrimPrefix(e, "notification "), `"`))
				default:
					rowsGiven = true
					wantRows = append(wantRows, e)
				}
			}

			notes = nil
			results, err := conn.PgConn().Exec(ctx, s.sql).ReadAll()
			ran++
			if wantErr != "" {
				var pgErr *pgconn.PgError
				if !errors.As(err, &pgErr) || pgErr.Code != wantErr {
					t.Fatalf("%s: %s\nerr = %v, want SQLSTATE %s", where, s.sql, err, wantErr)
				}
				checkedErrors++
				continue
			}
			if err != nil {
				t.Fatalf("%s: %s\n%v", where, s.sql, err)
			}
			if rowsGiven {
				var got []string
				for _, r := range results {
					for _, row := range r.Rows {
						cols := make([]string, len(row))
						for i, v := range row {
							if v == nil {
								cols[i] = "NULL"
							} else {
								cols[i] = string(v)
							}
						}
						got = append(got, strings.Join(cols, " | "))
					}
				}
				if !slices.Equal(got, wantRows) {
					t.Fatalf("%s: %s\nrows %q, want %q", where, s.sql, got, wantRows)
				}
				if len(wantRows) == 0 {
					checkedNoRow++
				} else {
					checkedRows++
				}
			}
			var gotNotes []string
			for _, n := range notes {
				if n.Channel != channel {
					t.Fatalf("%s: %s\nnotification on channel %q, want the lease channel %q", where, s.sql, n.Channel, channel)
				}
				gotNotes = append(gotNotes, n.Payload)
			}
			if !slices.Equal(gotNotes, wantNotes) {
				t.Fatalf("%s: %s\nnotifications %q, want %q", where, s.sql, gotNotes, wantNotes)
			}
			checkedNotes += len(wantNotes)
		}
	}
	// The page has examples of every kind of expectation, and they were all checked.
	if ran < 30 || checkedRows < 10 || checkedNoRow < 3 || checkedErrors < 1 || checkedNotes < 1 {
		t.Errorf("ran %d statements, checked %d row results, %d empty results, %d errors, %d notifications: the page lost its examples?",
			ran, checkedRows, checkedNoRow, checkedErrors, checkedNotes)
	}
	t.Logf("ran %d statements; checked %d row results, %d empty results, %d errors, %d notifications",
		ran, checkedRows, checkedNoRow, checkedErrors, checkedNotes)
}

// TestSQLAPIDocSignatures checks that docs/sql-api.md shows the signature of every lease,
// fence and semaphore function (and pgcoord_channel and pgcoord_gc) exactly as the
// migrations define it: argument names, types and defaults, and the return type. Internal
// helpers (pgcoord_semaphore_admit, the *_args validators) are left out.
func TestSQLAPIDocSignatures(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	md, err := os.ReadFile(sqlAPIDoc)
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := codeBlocks(string(md))
	if err != nil {
		t.Fatal(err)
	}
	// Signatures are shown in ```text blocks: name(args) RETURNS type [-- comment].
	sig := regexp.MustCompile(`(?s)(pgcoord_\w+)\(([^)]*)\)\s*RETURNS\s+([^\n]*)`)
	documented := map[string][2]string{}
	for _, b := range blocks {
		if b.lang != "text" {
			continue
		}
		for _, m := range sig.FindAllStringSubmatch(b.text, -1) {
			ret, _, _ := strings.Cut(m[3], "--")
			documented[m[1]] = [2]string{normalizeSignature(m[2]), normalizeSignature(ret)}
		}
	}

	pool := pgtest.Pool(t)
	rows, err := pool.Query(ctx, `
		SELECT p.proname, pg_get_function_arguments(p.oid), pg_get_function_result(p.oid)
		  FROM pg_proc p
		 WHERE p.pronamespace = current_schema()::regnamespace
		   AND (p.proname LIKE 'pgcoord\_lease\_%' OR p.proname LIKE 'pgcoord\_fence\_%' OR p.proname LIKE 'pgcoord\_semaphore\_%'
		        OR p.proname IN ('pgcoord_channel', 'pgcoord_gc'))
		   AND p.proname NOT IN ('pgcoord_semaphore_admit', 'pgcoord_fence_record') AND p.proname NOT LIKE '%\_args'
		 ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	defined, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct {
		Name, Args, Result string
	}])
	if err != nil {
		t.Fatal(err)
	}
	if len(defined) < 9 {
		t.Fatalf("found only %d functions in the schema: %v", len(defined), defined)
	}
	for _, f := range defined {
		doc, ok := documented[f.Name]
		if !ok {
			t.Errorf("%s is not documented with its signature in a ```text block of %s", f.Name, sqlAPIDoc)
			continue
		}
		if want := normalizeSignature(f.Args); doc[0] != want {
			t.Errorf("%s: documented arguments\n  (%s)\nwant\n  (%s)", f.Name, doc[0], want)
		}
		if want := normalizeSignature(f.Result); doc[1] != want {
			t.Errorf("%s: documented to return %q, want %q", f.Name, doc[1], want)
		}
	}
}

var (
	casts  = regexp.MustCompile(`::[a-z_]+(\[\])?`)
	spaces = regexp.MustCompile(`\s+`)
)

// normalizeSignature makes a written signature and Postgres's rendering of it comparable.
func normalizeSignature(s string) string {
	s = strings.ReplaceAll(s, "timestamp with time zone", "timestamptz")
	s = casts.ReplaceAllString(s, "")
	s = spaces.ReplaceAllString(s, " ")
	s = strings.ReplaceAll(s, "( ", "(")
	return strings.TrimSpace(s)
}
