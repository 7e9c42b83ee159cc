#!/usr/bin/python3
"""A payment worker in Python that uses pgcoord through its SQL API (psycopg 3).

It pays one order: takes the order's lease (a fencing token comes with it), then, in one
transaction, checks the token at the fence, marks the order paid with the token and enqueues
an "order paid" message to the outbox, and releases the lease.

    PGCOORD_DATABASE_URL=postgres://... python3 worker.py --order 42 [--schema coord]

Exit codes: 0 paid, 1 error, 2 usage, 3 the lease is held by another worker (nothing done),
4 fenced out: a newer holder took the lease over while this one stalled (nothing written).
"""
import argparse
import os
import signal
import socket
import sys
from contextlib import contextmanager

import psycopg
from psycopg.types.json import Jsonb

EXIT_HELD, EXIT_FENCED = 3, 4


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--order", type=int, required=True, help="the order to pay (1 to 2^63-1)")
    p.add_argument("--schema", default="", help="the schema pgcoord is installed in (default: search_path)")
    p.add_argument("--holder", default=f"py-{socket.gethostname()}-{os.getpid()}"[:255])
    p.add_argument("--ttl", type=int, default=30, help="lease TTL in seconds (1 to 3600)")
    p.add_argument("--stall", action="store_true",
                   help="stop this process (SIGSTOP) right after taking the lease, as a GC pause "
                        "or a frozen VM would; resume it with kill -CONT")
    args = p.parse_args()
    if not 1 <= args.order < 2**63:
        p.error("--order: want 1 to 2^63-1")
    if not 1 <= args.ttl <= 3600:
        p.error("--ttl: want 1 to 3600 seconds")
    if not 1 <= len(args.holder.encode()) <= 255 or len(args.schema.encode()) > 63:
        p.error("--holder: want 1 to 255 bytes; --schema: at most 63 bytes")
    if not os.environ.get("PGCOORD_DATABASE_URL"):
        p.error("set PGCOORD_DATABASE_URL")
    return args


@contextmanager
def transaction(conn, schema):
    """A transaction on pgcoord's schema. The search_path is set inside the transaction (like
    SET LOCAL), so it holds behind PgBouncer in transaction mode too."""
    with conn.transaction():
        if schema:
            conn.execute("SELECT set_config('search_path', quote_ident(%s), true)", [schema])
        yield


def one(conn, schema, sql, params):
    """The first row of one statement in a transaction of its own, or None."""
    with transaction(conn, schema):
        return conn.execute(sql, params).fetchone()


def main():
    args = parse_args()
    lease = f"order:{args.order}"
    # prepare_threshold=None: no server-side prepared statements, which PgBouncer in
    # transaction mode cannot keep.
    with psycopg.connect(os.environ["PGCOORD_DATABASE_URL"], autocommit=True, prepare_threshold=None,
                         application_name="pgcoord-python-worker") as conn:
        row = one(conn, args.schema,
                  "SELECT fence_token FROM pgcoord_lease_acquire(%s, %s, make_interval(secs => %s))",
                  [lease, args.holder, args.ttl])
        if row is None:
            print(f"{lease}: held by another worker; skipping")
            return EXIT_HELD
        token = row[0]
        print(f"{lease}: leased to {args.holder} with fence token {token}", flush=True)
        if args.stall:
            os.kill(os.getpid(), signal.SIGSTOP)
        try:
            return pay(conn, args, lease, token)
        finally:
            released = one(conn, args.schema, "SELECT fence_token FROM pgcoord_lease_release(%s, %s, %s)",
                           [lease, args.holder, token])
            if released is None:
                print(f"{lease}: released nothing: the grant of token {token} was no longer current")


def pay(conn, args, lease, token):
    """Marks the order paid and enqueues the message, in one transaction, through the fence."""
    try:
        with transaction(conn, args.schema):
            # The fence refuses (SQLSTATE PGC01) a token lower than the lease's newest grant
            # or than a token already written for the resource: the transaction aborts.
            conn.execute("SELECT pgcoord_fence_assert(%s, %s)", [lease, token])
            cur = conn.execute("UPDATE orders SET status = 'paid', fence_token = %s WHERE id = %s",
                               [token, args.order])
            if cur.rowcount != 1:
                raise SystemExit(f"{lease}: no such order")
            payload = Jsonb({"event": "paid", "order_id": args.order, "fence_token": token})
            msg = conn.execute("SELECT id FROM pgcoord_outbox_enqueue('orders', %s, %s)",
                               [f"order-{args.order}", payload]).fetchone()
    except psycopg.Error as e:
        if e.sqlstate != "PGC01":
            raise
        print(f"{lease}: fenced out, nothing written (SQLSTATE {e.sqlstate}: {e.diag.message_primary})")
        return EXIT_FENCED
    print(f"{lease}: paid with fence token {token}; outbox message {msg[0]}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except psycopg.Error as e:
        print(f"worker: {e.sqlstate or ''} {e}".strip(), file=sys.stderr)
        sys.exit(1)
