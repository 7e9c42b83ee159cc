package ratelimit_test

import (
	"context"
	"testing"

	"github.com/pgcoord/pgcoord/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var ctx = context.Background()
