// Package ui is the operator dashboard served by `pgcoord ui`: pages for the overview,
// leases, jobs, schedules, partition groups, semaphores, the outbox, idempotency keys and
// rate limits, drawn from the same public API the CLI uses (and, for what it lacks —
// prefix filters, a key's waiters, the relays, trends, the causes of a schedule's runs —
// from bounded read-only statements of its own), plus the Prometheus metrics of package
// metrics at /metrics. Templates, CSS and JavaScript are embedded in the binary (no CDN,
// works offline).
//
// Every page and action is a row of one table, dashboard in routes.go, which New serves:
// reading it shows the whole dashboard (paths, navigation order, Overview cards, actions).
// Each page's code is one file (its loader, its Overview card, its actions) plus one
// template in assets/, or a few for a page with a detail page of its own (schedules,
// partition groups); adding a page touches those and its row. The Overview's findings are
// those of `pgcoord doctor`, so a check added to package doctor shows there by itself.
//
// # Guarantees
//
//   - Every page costs a bounded number of queries whatever the number of rows: lists are
//     paginated (pageSize rows per page, "next" links by name or id), the Jobs page reads
//     at most jobsPageSize jobs and one page of runs for each, the Outbox page's delivery
//     rate reads at most outbox.DefaultRateScan messages, and the Overview reads at most
//     summaryRows rows per primitive (its counts say "at least" when there are more). The
//     Overview's health checks are `pgcoord doctor`'s (package doctor), which page through
//     every row: they run at most every Config.DoctorEvery, whatever the refresh rate.
//   - Filters and details are query parameters, each at most 255 bytes of UTF-8 without
//     control characters (else 400), applied in SQL: an escaped LIKE prefix over the
//     primary key walked in order (filter.go). The details (a lease's fence register and
//     audit rows, a key's permits and waiters, a job's runs, an outbox key's messages) and
//     the Outbox page's relays and trend are bounded reads of pgcoord's own tables; they
//     write nothing, and nothing is recorded for them on any hot path.
//   - Times, ages and expiries are the database clock's (the DBNow the API returns).
//   - Actions (expire a lease, set a semaphore limit, retry a dead outbox message, retry
//     every dead message of a topic, reset a rate limit key, pause, resume or trigger a
//     schedule, rebalance a partition group or drain one of its members) run only when Config.AllowActions is set; otherwise every POST to an
//     action is refused with 403. An action must be a POST carrying the CSRF token of the
//     browser's session (an HMAC of its random cookie under a per-server secret) and the
//     confirmation field that the page's confirm() sets; an Origin header, when sent, must
//     match the Host. It runs in one transaction with exactly one audit row, committed
//     together or not at all: the dashboard's (package audit), or for the schedule and
//     partition actions the one package schedules or partition writes for each change,
//     with the operator as its actor.
//   - With Config.Token set, every request — pages, actions, /metrics — needs
//     "Authorization: Bearer <token>" or the cookie the login form sets; New refuses a
//     weak token (httpsec.CheckToken). Without a token the server must listen on a
//     loopback address (CheckListen; New refuses such an Addr too) and answers only
//     requests addressed to a loopback name at its port (httpsec.HostAllowed: DNS
//     rebinding gets 421).
//   - Sign-ins are limited per client address (loginBurst failures, then one per
//     loginEvery), with no limit shared by all addresses: failures from many addresses
//     never refuse a correct token from an address that has not failed. The limiter's
//     memory is bounded (maxLoginClients addresses, the one idle longest evicted first).
//   - A query parameter is shown back only when it names something that exists; stored
//     text is HTML-escaped, and its control characters are drawn as Go escapes (\x1b).
//   - Cookies are Secure over TLS, or when Config.TrustProxy is set and the proxy says
//     X-Forwarded-Proto: https; with TrustProxy the login limiter counts the address the
//     proxy appended to X-Forwarded-For. Pages carry X-Frame-Options: DENY and a CSP.
//   - Payloads and stored responses (dead outbox messages, a looked-up idempotency key) are
//     never rendered unless Config.ShowPayloads is set.
//
// # Failure modes
//
//   - The token is a shared secret sent in clear over plain HTTP: put the dashboard behind
//     TLS (a reverse proxy) when it listens beyond loopback.
//   - A page is not one snapshot: each list is read in its own statement (a partition
//     group's page is: its group, members and partitions are read in one read-only
//     transaction).
//   - The Outbox page's delivery rate counts only the newest outbox.DefaultRateScan
//     messages: with more in the table it is a lower bound, and the chart says so.
//   - Measurements taken inside worker processes (keep-alive renewal errors, client-side
//     admission latencies, refused fenced writes) are not in the database, so the
//     dashboard cannot show them; the workers' own metrics endpoints can (package
//     metrics, Opts.Leases, Semaphores and Fenced).
package ui
