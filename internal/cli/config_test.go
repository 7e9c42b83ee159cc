package cli

import (
	"testing"
	"time"
)

// Every CLI connection names itself in pg_stat_activity and resolves pgcoord's objects in
// --schema, and sends no statement_timeout startup parameter, which poolers refuse (the
// timeout is applied per statement: TestStatementTimeoutWithAndWithoutPooler).
// (internal/pgconfig's tests show the server applies these parameters.)
func TestPoolConfigNamesAndBoundsConnections(t *testing.T) {
	a := &app{
		databaseURL:      "postgres://u:p@db.example:5433/app",
		schema:           "My Schema",
		statementTimeout: 1500 * time.Millisecond,
		lookupEnv:        func(string) (string, bool) { return "", false },
	}
	cfg, err := a.poolConfig(7)
	if err != nil {
		t.Fatal(err)
	}
	p := cfg.ConnConfig.RuntimeParams
	if p["application_name"] != AppName || p["statement_timeout"] != "" || p["search_path"] != `"My Schema"` {
		t.Fatalf("runtime params = %v", p)
	}
	if cfg.MaxConns != 7 || cfg.ConnConfig.Host != "db.example" || cfg.ConnConfig.Port != 5433 {
		t.Fatalf("config = %+v", cfg)
	}
}
