// Package pgcontainer starts a throwaway PostgreSQL server in a container with
// testcontainers-go, for the tests and the demo.
package pgcontainer

import (
	"context"
	"fmt"

	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
)

// DefaultImage is the official Postgres image.
const DefaultImage = "postgres:17"

// Server is a Postgres server in a container.
type Server struct {
	// URL connects to the server's database as its owner, without TLS.
	URL string
	// Container is the running container, for callers that stop or restart it.
	Container *tcpostgres.PostgresContainer
}

// Start runs image (DefaultImage if empty) and waits until the server accepts
// connections.
func Start(ctx context.Context, image string) (*Server, error) {
	if image == "" {
		image = DefaultImage
	}
	c, err := tcpostgres.Run(ctx, image,
		tcpostgres.WithDatabase("pgcoord"),
		tcpostgres.WithUsername("pgcoord"),
		tcpostgres.WithPassword("pgcoord"),
		tcpostgres.BasicWaitStrategies(),
	)
	if err != nil {
		if c != nil {
			_ = testcontainers.TerminateContainer(c)
		}
		return nil, fmt.Errorf("start %s: %w", image, err)
	}
	url, err := c.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		_ = testcontainers.TerminateContainer(c)
		return nil, err
	}
	return &Server{URL: url, Container: c}, nil
}

// Terminate removes the container.
func (s *Server) Terminate() error { return testcontainers.TerminateContainer(s.Container) }
