// Package cronspec is the schedule-expression engine of pgcoord's schedules: it parses a cron
// expression or an @every interval for an IANA time zone and computes its fire times. It is
// pure Go and touches no database; every replica computes the same fire times from the same
// expression, zone and anchor.
//
// # Parser
//
// Expressions are parsed by github.com/robfig/cron/v3, the de facto Go cron parser: stable
// (v3.0.1 for years), widely used, and already in pgcoord's module graph through gocron.
// cronspec takes the bit sets of its parsed fields and checks each field itself first, to
// report the field and column of a mistake (robfig's errors carry no position). robfig's
// own Next is not used: it steps through wall-clock time with time.Date and mishandles
// daylight saving transitions; cronspec searches civil time and resolves it to instants
// itself, by the rules below.
//
// # Syntax
//
//   - Five fields, minute hour day-of-month month day-of-week, or six with a seconds field
//     first, separated by spaces. A five-field expression fires at second 0.
//   - Bounds: second and minute 0-59, hour 0-23, day of month 1-31, month 1-12 or JAN-DEC,
//     day of week 0-6 or SUN-SAT (0 is Sunday; 7 is refused, as robfig refuses it). Names
//     are case-insensitive; full names (MONDAY) are not accepted.
//   - In each field a comma-separated list of: * or ? (the same: every value), a value, a
//     range a-b (no wrap-around), and any of these with a step /n (n from 1 to the field's
//     count of values): */15, 10-50/5, and a/n meaning a to the field's maximum by n.
//   - Descriptors, in any case: @yearly and @annually (0 0 1 1 *), @monthly (0 0 1 * *),
//     @weekly (0 0 * * 0), @daily and @midnight (0 0 * * *), @hourly (0 * * * *).
//   - @every <duration> in Go's syntax (90s, 15m, 1h30m): whole seconds, from 1 second to
//     366 days. It ticks at anchor + k·d for integers k ≥ 0, where anchor is Parse's anchor
//     truncated to the second: elapsed time, independent of the zone. When the anchor is in
//     the future the first tick is the anchor itself.
//   - Not supported, and refused with a message naming them: L (last day), W (nearest
//     weekday), # (nth weekday), @reboot, and a CRON_TZ= or TZ= prefix (the zone is a
//     separate argument).
//
// Day of month and day of week follow Vixie cron: when both fields are restricted, a day
// matches if either matches (0 0 1,15 * MON fires on the 1st, the 15th and every Monday).
// A field whose text starts with * or ? counts as unrestricted, even with a step, and then a
// day must match both fields: 0 0 */2 * MON fires on Mondays that are odd days of the month.
// (robfig's own Next would treat */2 as restricted and fire on either.)
//
// # Daylight saving time
//
// Calendar expressions are matched against local wall-clock time in the zone. Each
// matching local time is turned into an instant:
//
//   - a local time that does not exist (the gap when clocks spring forward) fires at the
//     first instant after the gap, the transition instant;
//   - a local time that occurs twice (when clocks fall back) fires at its first occurrence
//     only;
//   - several local times that map to one instant fire once.
//
// So fire times are strictly increasing and Next is monotonic. A consequence: during a
// repeated hour a sub-hourly expression such as */5 * * * * does not fire in the second
// pass; use @every 5m for a frequency in elapsed time.
//
// Local times are resolved from the zone's offsets around that time (time.Time.ZoneBounds),
// not from time.Date, whose choice inside a gap or an overlap is not guaranteed.
//
// # Bounds
//
// An expression is at most 255 bytes, a zone name at most 64 bytes. Next looks at most five
// years ahead and returns the zero time beyond; Parse refuses a calendar expression that
// does not fire within five years from its anchor (0 0 30 2 * never fires; 0 0 29 2 * is
// accepted). Between returns at most max fire times. Next jumps field by field over civil
// time, not second by second: a few microseconds even when it searches all five years.
//
// # Guarantees
//
//   - Next(t) is a whole second after t, in UTC; Next(Next(t)) > Next(t).
//   - Between(nil, a, b, n) is the first n of the chain Next(a), Next(Next(a)), ... up to b.
//   - The fire time of a calendar expression has local fields that match it, except a
//     transition instant that stands for a time in the gap it ends.
//
// # Failure modes
//
//   - Zones come from the system's time zone database if it has one, else from the copy
//     embedded in the binary (time/tzdata). Replicas with different tzdata versions can
//     disagree on fire times around a changed rule; keep them on one version.
//   - A schedule whose next fire time is more than five years away reads as ended (zero):
//     0 0 29 2 * after 29 February 2096 until 2104.
package cronspec
