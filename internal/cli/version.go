package cli

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgcoord/pgcoord/internal/base"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// Version is the release of this build; set with -ldflags "-X .../internal/cli.Version=v1.2.3".
// When unset, the module version from the build info is used.
var Version = ""

// versionReachLimit bounds how long `version` tries to reach the database.
const versionReachLimit = 5 * time.Second

func version() string {
	if Version != "" {
		return Version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}

// dbVersionJSON is the database part of `version --json`.
type dbVersionJSON struct {
	Reached        bool   `json:"reached"`
	Error          string `json:"error,omitempty"`
	Schema         string `json:"schema,omitempty"`
	CurrentVersion int64  `json:"current_version"`
	Pending        int    `json:"pending"`
	UpToDate       bool   `json:"up_to_date"`
}

func (a *app) versionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the pgcoord version, the schema version it needs and, when reachable, the database's",
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			db := a.databaseVersion(cmd.Context())
			if a.json {
				return a.printJSON(map[string]any{
					"version": version(), "schema_version": pgcoord.LatestVersion(), "go": runtime.Version(), "database": db,
				})
			}
			fmt.Fprintf(a.out, "pgcoord %s (schema version %d, %s)\n", version(), pgcoord.LatestVersion(), runtime.Version())
			var err error
			switch {
			case !db.Reached:
				_, err = fmt.Fprintf(a.out, "database: not reached (%s)\n", base.Printable(db.Error))
			case db.Error != "":
				_, err = fmt.Fprintf(a.out, "database: reached, schema version unknown (%s)\n", base.Printable(db.Error))
			case db.UpToDate:
				_, err = fmt.Fprintf(a.out, "database: schema %s at version %d: current\n", base.Printable(db.Schema), db.CurrentVersion)
			case db.CurrentVersion > pgcoord.LatestVersion():
				_, err = fmt.Fprintf(a.out, "database: schema %s at version %d: newer than this build\n", base.Printable(db.Schema), db.CurrentVersion)
			default:
				_, err = fmt.Fprintf(a.out, "database: schema %s at version %d: %d migration(s) pending ('pgcoord migrate up')\n",
					base.Printable(db.Schema), db.CurrentVersion, db.Pending)
			}
			return err
		},
	}
}

// databaseVersion reads the schema version of the database, if it can be reached within
// versionReachLimit; failing to reach it is part of the answer, not an error.
func (a *app) databaseVersion(ctx context.Context) dbVersionJSON {
	ctx, cancel := context.WithTimeout(ctx, versionReachLimit)
	defer cancel()
	pool, err := a.connect(ctx)
	if err != nil {
		return dbVersionJSON{Error: err.Error()}
	}
	defer pool.Close()
	st, err := pgcoord.CheckSchema(ctx, pool)
	if err != nil && !errors.Is(err, pgcoord.ErrSchemaOutdated) {
		return dbVersionJSON{Reached: true, Error: err.Error()}
	}
	pending := len(st.Pending())
	return dbVersionJSON{Reached: true, Schema: st.Schema, CurrentVersion: st.Current, Pending: pending,
		UpToDate: pending == 0 && st.Current == st.Latest}
}
