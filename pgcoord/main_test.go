package pgcoord_test

import (
	"testing"

	"github.com/pgcoord/pgcoord/internal/pgtest"
)

func TestMain(m *testing.M) {
	pgtest.NeedsSessionExamples("^ExampleMigrate$") // goose's session lock: ErrPooler behind a pooler
	pgtest.Main(m)
}
