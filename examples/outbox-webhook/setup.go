package main

import (
	"context"
	"errors"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/pgcoord"
)

// connect opens a pool on $PGCOORD_DATABASE_URL, installs pgcoord's schema (Migrate is safe
// to run from many replicas at once), then the application's tables, under an advisory lock
// so that replicas starting together do not race on CREATE TABLE.
func connect(ctx context.Context, app, tables string) (*pgxpool.Pool, error) {
	url := os.Getenv("PGCOORD_DATABASE_URL")
	if url == "" {
		return nil, errors.New("PGCOORD_DATABASE_URL is not set (e.g. postgres://user:password@localhost:5432/app)")
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := createTables(ctx, pool, app, tables); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// createTables installs pgcoord's schema and the application's tables.
func createTables(ctx context.Context, pool *pgxpool.Pool, app, tables string) error {
	if _, err := pgcoord.Migrate(ctx, pool, nil); err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(pgcoord_lock_key($1))`, app+":tables"); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, tables)
		return err
	})
}
