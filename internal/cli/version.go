package cli

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"

	"github.com/pgcoord/pgcoord/pgcoord"
)

// Version is the release of this build; set with -ldflags "-X .../internal/cli.Version=v1.2.3".
// When unset, the module version from the build info is used.
var Version = ""

func version() string {
	if Version != "" {
		return Version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}

func (a *app) versionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the pgcoord version and the schema version it needs",
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if a.json {
				return a.printJSON(map[string]any{
					"version": version(), "schema_version": pgcoord.LatestVersion(), "go": runtime.Version(),
				})
			}
			_, err := fmt.Fprintf(a.out, "pgcoord %s (schema version %d, %s)\n", version(), pgcoord.LatestVersion(), runtime.Version())
			return err
		},
	}
}
