-- Schedule expressions and zones, judged in the database (issue 30).
--
-- Schedules are rows, written from Go, the CLI and the SQL API. The Go side
-- (internal/cronspec) parses an expression with github.com/robfig/cron/v3 and its own
-- checks; the SQL API must refuse the same expressions before it writes anything, so
-- pgcoord_cron_check accepts the language below, which is cronspec's, and
-- pgcoord_zone_check the zones.
--
-- Spaces and other Unicode white space at either end are ignored (Go's strings.TrimSpace);
-- what remains is
--   * 5 fields (minute hour day-of-month month day-of-week) or 6 (a leading second),
--     separated by spaces (U+0020 only). A field is a comma list of items; an item is *, ?,
--     N or N-M, optionally followed by /step, from 1 to the field's count of values (N/step
--     means N-max/step). Ranges: second and minute 0-59, hour 0-23, day of month 1-31, month
--     1-12 or JAN-DEC, day of week 0-6 or SUN-SAT (7 is not Sunday). Names are
--     case-insensitive; numbers are ASCII digits, leading zeros allowed, no sign.
--   * or a descriptor, in any case: @yearly @annually @monthly @weekly @daily @midnight
--     @hourly, or @every and a Go duration (time.ParseDuration: 1h30m, 90s, 0.5m, no d) of
--     a whole number of seconds, from 1 second to 366 days.
-- Refused with a message of their own: NULL (SQLSTATE 22004), empty or blank, over 255
-- bytes, a control character, a TZ= or CRON_TZ= prefix (the zone is a separate setting),
-- L, W and #, an empty list item (robfig drops them: "1,,2" is "1,2", and "," alone never
-- fires), an item "*-..." or "?-..." (robfig ignores what follows the "-"), and an
-- expression that never fires: when the day of week is unrestricted, the days of month
-- must fall in some allowed month ("0 0 30 2 *" never fires; "0 0 29 2 *" does, in leap
-- years). A day field is unrestricted when its text starts with * or ? ("*/2" too, "1,*"
-- not), as in Vixie cron and cronspec's Next (robfig's own Next differs: to it "*/2"
-- restricts and "1,*" does not); when both day fields are restricted, a day matches when
-- either matches. cronspec also refuses an expression that fires, but not within five
-- years of its anchor, which only a few perverse ones do ("0 0 */31 2 3": February 1 on a
-- Wednesday, in 2023 and 2034): this function, which knows no anchor, accepts them.
--
-- Every refusal but NULL's is SQLSTATE 22023, with a message such as
--   pgcoord: bad schedule expression "61 0 * * *" at column 1 (minute): 61 is above the maximum 59
-- naming the byte column (from 1) where the bad part starts (column 1 when the whole
-- expression is), and the field: second, minute, hour, day of month, month, day of week,
-- descriptor, interval (the duration of @every) or expression. The expression shown and
-- its columns are those of the trimmed expression, as in cronspec's errors.
--
-- The functions run with the caller's rights and search_path, like the other API functions
-- (see 00012), and write nothing.

-- +goose Up
-- pgcoord_cron_refuse raises the error of a bad schedule expression, at character position
-- p_pos of p_expr (shown as a byte column). An expression that is too long or holds a
-- control character is not repeated in the message, which could garble a terminal or a log:
-- its length is shown instead.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_cron_refuse(p_expr text, p_pos int, p_field text, p_detail text) RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    RAISE EXCEPTION 'pgcoord: bad schedule expression % at column % (%): %',
        CASE WHEN p_expr = '' OR pgcoord_name_ok(p_expr) THEN '"' || p_expr || '"'
             ELSE 'of ' || octet_length(p_expr) || ' bytes' END,
        octet_length(left(p_expr, p_pos - 1)) + 1, p_field, p_detail
        USING ERRCODE = '22023';
END
$$;
-- +goose StatementEnd

-- pgcoord_cron_field_check checks one field of an expression, p_field, which starts at
-- character p_pos of p_expr and is the field p_name, and returns the values it allows as
-- bits (bit v for value v).
-- +goose StatementBegin
CREATE FUNCTION pgcoord_cron_field_check(p_expr text, p_field text, p_pos int, p_name text) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    v_min int := CASE p_name WHEN 'day of month' THEN 1 WHEN 'month' THEN 1 ELSE 0 END;
    v_max int := CASE p_name WHEN 'hour' THEN 23 WHEN 'day of month' THEN 31 WHEN 'month' THEN 12
                             WHEN 'day of week' THEN 6 ELSE 59 END;
    v_names text[] := CASE p_name
        WHEN 'month' THEN '{jan,feb,mar,apr,may,jun,jul,aug,sep,oct,nov,dec}'::text[]
        WHEN 'day of week' THEN '{sun,mon,tue,wed,thu,fri,sat}'::text[] END;
    v_item text;
    v_parts text[]; -- the item split at '/': range and step
    v_range text[]; -- the range split at '-': low and high
    v_at int[];     -- where low, high and step start
    v_val numeric[]; -- low and high
    v_step numeric;
    v_star boolean;
    v_bits bigint := 0;
    v numeric;
BEGIN
    FOREACH v_item IN ARRAY regexp_split_to_array(p_field, ',') LOOP
        IF v_item = '' THEN
            PERFORM pgcoord_cron_refuse(p_expr, p_pos, p_name, 'an empty list item (two commas, or a comma at an end)');
        END IF;
        v_parts := regexp_split_to_array(v_item, '/');
        v_range := regexp_split_to_array(v_parts[1], '-');
        v_at := ARRAY[p_pos, p_pos + length(v_range[1]) + 1, p_pos + length(v_parts[1]) + 1];
        IF cardinality(v_parts) > 2 THEN
            PERFORM pgcoord_cron_refuse(p_expr, v_at[3] + length(v_parts[2]), p_name, 'an item has at most one "/"');
        END IF;
        v_star := v_range[1] IN ('*', '?');
        IF v_star AND cardinality(v_range) > 1 THEN
            PERFORM pgcoord_cron_refuse(p_expr, p_pos, p_name, format('"%s" is the whole range and cannot start one', v_range[1]));
        END IF;
        IF cardinality(v_range) > 2 THEN
            PERFORM pgcoord_cron_refuse(p_expr, v_at[2] + length(v_range[2]), p_name, 'a range has one "-"');
        END IF;

        -- Low and high: numbers, or names in any case.
        v_val := CASE WHEN v_star THEN ARRAY[v_min, v_max] END;
        FOR i IN 1 .. CASE WHEN v_star THEN 0 ELSE cardinality(v_range) END LOOP
            v := CASE WHEN v_range[i] ~ '^[0-9]+$' THEN v_range[i]::numeric
                      ELSE array_position(v_names, lower(v_range[i] COLLATE "C")) - 1 + v_min END;
            IF v IS NULL THEN
                PERFORM pgcoord_cron_refuse(p_expr, v_at[i], p_name,
                    CASE WHEN v_range[i] ~* '#|^[0-9]*[LW]$|^LW$'
                         THEN 'L, W and # (last, nearest weekday, nth weekday) are not supported'
                         WHEN v_range[i] = '' THEN 'a number is missing'
                         ELSE format('"%s" is not a number%s', v_range[i],
                                     CASE p_name WHEN 'month' THEN ' or a month name (JAN-DEC)'
                                                 WHEN 'day of week' THEN ' or a day name (SUN-SAT)' ELSE '' END) END);
            END IF;
            IF v < v_min THEN
                PERFORM pgcoord_cron_refuse(p_expr, v_at[i], p_name, format('%s is below the minimum %s', v, v_min));
            ELSIF v > v_max THEN
                PERFORM pgcoord_cron_refuse(p_expr, v_at[i], p_name, format('%s is above the maximum %s', v, v_max));
            END IF;
            v_val[i] := v;
        END LOOP;
        v_val[2] := coalesce(v_val[2], v_val[1]);
        IF v_val[1] > v_val[2] THEN
            PERFORM pgcoord_cron_refuse(p_expr, p_pos, p_name,
                format('the range %s runs backwards (%s is above %s)', v_parts[1], v_val[1], v_val[2]));
        END IF;

        -- The step: from 1 to the field's count of values; N/step is N-max/step.
        v_step := 1;
        IF cardinality(v_parts) = 2 THEN
            IF v_parts[2] !~ '^[0-9]+$' THEN
                PERFORM pgcoord_cron_refuse(p_expr, v_at[3], p_name,
                    CASE WHEN v_parts[2] = '' THEN 'a step is missing after "/"'
                         ELSE format('the step "%s" is not a number', v_parts[2]) END);
            END IF;
            v_step := v_parts[2]::numeric;
            IF v_step < 1 THEN
                PERFORM pgcoord_cron_refuse(p_expr, v_at[3], p_name, format('the step %s is below 1', v_step));
            ELSIF v_step > v_max - v_min + 1 THEN
                PERFORM pgcoord_cron_refuse(p_expr, v_at[3], p_name,
                    format('the step %s is above the field''s %s values', v_step, v_max - v_min + 1));
            END IF;
            IF cardinality(v_range) = 1 THEN
                v_val[2] := v_max;
            END IF;
        END IF;

        v := v_val[1];
        WHILE v <= v_val[2] LOOP
            v_bits := v_bits | (1::bigint << v::int);
            v := v + v_step;
        END LOOP;
        p_pos := p_pos + length(v_item) + 1;
    END LOOP;
    RETURN v_bits;
END
$$;
-- +goose StatementEnd

-- pgcoord_cron_every_check checks p_duration, the argument of @every in p_expr, which starts
-- at character p_pos, as Go's time.ParseDuration reads it: an optional sign, then one or more
-- numbers (digits, a fraction, or both) each with a unit: ns, us (or µs, μs), ms, s, m, h.
-- A fraction is added as Go adds it — the digits that fit in 2^63, times unit / 10^digits in
-- float8, truncated to a nanosecond — so that "whole seconds" means the same on both sides.
-- The sum must be a whole number of seconds from 1 second to 366 days.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_cron_every_check(p_expr text, p_duration text, p_pos int) RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    v_rest text := p_duration;
    v_pos int := p_pos;
    v_sign int := 1;
    v_ns numeric := 0;
    m text[]; -- integer digits, "." and fraction digits (or NULL), fraction digits, unit
    v_unit numeric;
    v_frac numeric;
    v_scale float8;
    v_digit text;
BEGIN
    IF v_rest ~ '^[-+]' THEN
        v_sign := CASE WHEN v_rest ~ '^-' THEN -1 ELSE 1 END;
        v_rest := substr(v_rest, 2);
        v_pos := v_pos + 1;
    END IF;
    IF v_rest = '' THEN
        PERFORM pgcoord_cron_refuse(p_expr, v_pos, 'interval', 'a number is missing after the sign');
    END IF;
    IF v_rest = '0' THEN -- "0" alone is zero, and needs no unit
        v_rest := '';
    END IF;
    WHILE v_rest <> '' LOOP
        m := regexp_match(v_rest, '^([0-9]*)(\.([0-9]*))?([^0-9.]*)');
        IF m[1] = '' AND coalesce(m[3], '') = '' THEN
            PERFORM pgcoord_cron_refuse(p_expr, v_pos, 'interval', 'a number is missing, as in 90s, 1.5h or 1h30m');
        END IF;
        v_unit := CASE m[4] WHEN 'ns' THEN 1 WHEN 'us' THEN 1e3 WHEN 'µs' THEN 1e3 WHEN 'μs' THEN 1e3
                            WHEN 'ms' THEN 1e6 WHEN 's' THEN 1e9 WHEN 'm' THEN 60e9 WHEN 'h' THEN 3600e9 END;
        IF v_unit IS NULL THEN
            PERFORM pgcoord_cron_refuse(p_expr, v_pos + length(m[1]) + coalesce(length(m[2]), 0), 'interval',
                CASE WHEN m[4] = '' THEN 'a unit is missing after the number (ns, us, ms, s, m or h)'
                     ELSE format('unknown unit "%s" (the units are ns, us, ms, s, m and h: a day is 24h)', m[4]) END);
        END IF;
        v_ns := v_ns + coalesce(nullif(m[1], '')::numeric, 0) * v_unit;
        v_frac := 0;
        v_scale := 1;
        FOREACH v_digit IN ARRAY string_to_array(coalesce(m[3], ''), NULL) LOOP
            EXIT WHEN v_frac * 10 + v_digit::int > 9223372036854775808;
            v_frac := v_frac * 10 + v_digit::int;
            v_scale := v_scale * 10;
        END LOOP;
        v_ns := v_ns + trunc(v_frac::float8 * (v_unit::float8 / v_scale))::numeric;
        v_pos := v_pos + length(m[1]) + coalesce(length(m[2]), 0) + length(m[4]);
        v_rest := substr(v_rest, length(m[1]) + coalesce(length(m[2]), 0) + length(m[4]) + 1);
    END LOOP;
    v_ns := v_sign * v_ns;
    IF v_ns < 1e9 OR v_ns > 366 * 86400e9 OR v_ns % 1e9 <> 0 THEN
        PERFORM pgcoord_cron_refuse(p_expr, p_pos, 'interval',
            format('%s is %s', p_duration,
                   CASE WHEN v_ns < 1e9 THEN 'below the minimum of 1 second'
                        WHEN v_ns > 366 * 86400e9 THEN 'above the maximum of 366 days (8784h)'
                        ELSE 'not a whole number of seconds' END));
    END IF;
END
$$;
-- +goose StatementEnd

-- pgcoord_cron_check raises SQLSTATE 22023 for a schedule expression the Go side refuses
-- (22004 for NULL), and returns nothing for one it accepts. See the top of this file.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_cron_check(p_expr text) RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    -- Go's strings.TrimSpace trims the Unicode white space, control characters included.
    c_ends constant text := '^[\x09-\x0d \x85\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+'
                            '|[\x09-\x0d \x85\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+$';
    c_names constant text[] := '{second,minute,hour,day of month,month,day of week}';
    c_month_days constant int[] := '{31,29,31,30,31,30,31,31,30,31,30,31}';
    v_expr text := regexp_replace(p_expr, c_ends, '', 'g');
    v_fields text[] := '{}';
    v_at int[] := '{}'; -- where each field starts
    v_pos int := 1;
    v_word text;
    v_bits bigint[] := '{}';
    v_first_day int;
BEGIN
    IF p_expr IS NULL THEN
        PERFORM pgcoord_refuse('schedule expression', 'a cron expression or a descriptor such as @daily', NULL);
    END IF;
    IF v_expr = '' THEN
        PERFORM pgcoord_cron_refuse(v_expr, 1, 'expression', CASE WHEN p_expr = '' THEN 'it is empty' ELSE 'it is blank' END);
    END IF;
    IF octet_length(v_expr) > 255 THEN
        PERFORM pgcoord_cron_refuse(v_expr, 1, 'expression', format('it is %s bytes long, over the limit of 255', octet_length(v_expr)));
    END IF;
    v_word := substring(v_expr FROM '[\x01-\x1f\x7f-\x9f\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]');
    IF v_word IS NOT NULL THEN
        PERFORM pgcoord_cron_refuse(v_expr, strpos(v_expr, v_word), 'expression',
                                    format('a control character (U+%s)', lpad(upper(to_hex(ascii(v_word))), 4, '0')));
    END IF;

    -- The fields (or a descriptor and its argument), separated by spaces, and where each starts.
    FOREACH v_word IN ARRAY string_to_array(v_expr, ' ') LOOP
        IF v_word <> '' THEN
            v_fields := v_fields || v_word;
            v_at := v_at || v_pos;
        END IF;
        v_pos := v_pos + length(v_word) + 1;
    END LOOP;
    IF v_fields[1] ~* '^(CRON_)?TZ=' THEN
        PERFORM pgcoord_cron_refuse(v_expr, 1, 'expression',
                                    'a TZ= or CRON_TZ= prefix is not part of the expression: the zone is a separate setting');
    END IF;

    -- A descriptor, in any case (as Go's strings.ToLower lowers it: U+0130 to i, the Kelvin
    -- sign to k). The two are named by regular expression escapes, read when the statement
    -- runs, not by string escapes (E'\u...'), which a database whose encoding is not UTF8
    -- (SQL_ASCII) refuses when the function is created.
    IF v_fields[1] LIKE '@%' THEN
        v_word := lower(regexp_replace(regexp_replace(v_fields[1], '\u0130', 'i', 'g'), '\u212a', 'k', 'g') COLLATE "C");
        IF v_word = '@every' THEN
            IF cardinality(v_fields) <> 2 THEN
                PERFORM pgcoord_cron_refuse(v_expr, coalesce(v_at[3], 1), 'interval',
                                            '@every takes one duration, as in @every 1h30m');
            END IF;
            PERFORM pgcoord_cron_every_check(v_expr, v_fields[2], v_at[2]);
        ELSIF v_word NOT IN ('@yearly', '@annually', '@monthly', '@weekly', '@daily', '@midnight', '@hourly') THEN
            PERFORM pgcoord_cron_refuse(v_expr, 1, 'descriptor',
                format('unknown descriptor "%s" (known: @yearly, @annually, @monthly, @weekly, @daily, @midnight, '
                       '@hourly and @every <duration>)', v_fields[1]));
        ELSIF cardinality(v_fields) > 1 THEN
            PERFORM pgcoord_cron_refuse(v_expr, v_at[2], 'descriptor', format('nothing may follow %s', v_fields[1]));
        END IF;
        RETURN;
    END IF;

    IF cardinality(v_fields) NOT IN (5, 6) THEN
        PERFORM pgcoord_cron_refuse(v_expr, CASE WHEN cardinality(v_fields) > 6 THEN v_at[7] ELSE 1 END, 'expression',
            format('expected 5 fields (minute hour day-of-month month day-of-week) or 6 (a second first), found %s',
                   cardinality(v_fields)));
    END IF;
    -- Five fields have no second: the Go side fires them at second 0.
    IF cardinality(v_fields) = 5 THEN
        v_fields := ARRAY['0'] || v_fields;
        v_at := ARRAY[0] || v_at;
    END IF;
    FOR i IN 1 .. 6 LOOP
        v_bits := v_bits || pgcoord_cron_field_check(v_expr, v_fields[i], v_at[i], c_names[i]);
    END LOOP;

    -- Never firing. A day field whose text starts with * or ? is unrestricted (Vixie cron's
    -- rule, which the Go side follows: even */2), and when one of the two is, a day must
    -- match both. So with an unrestricted day of week, the earliest allowed day of month
    -- must exist in some allowed month (February has 29 days in leap years, and any 5 years
    -- hold one). Otherwise the days of week fire in every month, or an unrestricted day of
    -- month holds day 1.
    IF v_fields[6] ~ '^[*?]' THEN
        v_first_day := (SELECT min(d) FROM generate_series(1, 31) d WHERE v_bits[4] & (1::bigint << d) <> 0);
        IF v_first_day > (SELECT max(c_month_days[m]) FROM generate_series(1, 12) m WHERE v_bits[5] & (1::bigint << m) <> 0) THEN
            PERFORM pgcoord_cron_refuse(v_expr, v_at[4], 'day of month',
                format('it never fires: its earliest day of month, %s, is past the end of each of its months', v_first_day));
        END IF;
    END IF;
END
$$;
-- +goose StatementEnd

COMMENT ON FUNCTION pgcoord_cron_check(text) IS
    'pgcoord: raises 22023 for a schedule expression the Go side refuses (22004 for NULL)';

-- pgcoord_zone_check raises SQLSTATE 22023 for a schedule's time zone that is not the name
-- of a zone PostgreSQL knows, spelled as pg_timezone_names lists it (case matters, as it
-- does for Go's time.LoadLocation on Linux), and 22004 for NULL. Abbreviations and POSIX
-- strings are refused unless the server's tz database has a zone of that name ("UTC+3"
-- never is; "EST5EDT" is on some servers, not others), and so are localtime (the server's
-- own zone, which another machine does not share) and posixrules. Reading
-- pg_timezone_names costs tens of milliseconds (it reads the whole tz database), so the
-- cheap checks come first, and the view is asked about one name only.
-- +goose StatementBegin
CREATE FUNCTION pgcoord_zone_check(p_zone text) RETURNS void LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
BEGIN
    IF p_zone IS NULL OR p_zone = '' THEN
        PERFORM pgcoord_refuse('schedule time zone', 'a zone name such as Europe/Paris or UTC',
                               CASE WHEN p_zone = '' THEN 'an empty string' END);
    END IF;
    IF octet_length(p_zone) > 64 OR p_zone ~ '[\x01-\x1f\x7f-\x9f\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]' THEN
        PERFORM pgcoord_refuse('schedule time zone', 'a zone name of 1 to 64 bytes without control characters',
                               CASE WHEN octet_length(p_zone) > 64 THEN octet_length(p_zone) || ' bytes'
                                    ELSE 'a control character' END);
    END IF;
    IF p_zone ~ '^/' OR strpos(p_zone, '..') > 0 THEN
        PERFORM pgcoord_refuse('schedule time zone', 'a zone name, not a file path', format('"%s"', p_zone));
    END IF;
    IF p_zone IN ('localtime', 'posixrules') THEN
        PERFORM pgcoord_refuse('schedule time zone', 'a zone name, not the tz database''s alias of another zone',
                               format('"%s"', p_zone));
    END IF;
    IF NOT EXISTS (SELECT FROM pg_timezone_names WHERE name = p_zone) THEN
        PERFORM pgcoord_refuse('schedule time zone', 'a zone name PostgreSQL knows, spelled as pg_timezone_names lists it',
                               format('"%s"', p_zone));
    END IF;
END
$$;
-- +goose StatementEnd

COMMENT ON FUNCTION pgcoord_zone_check(text) IS
    'pgcoord: raises 22023 for a schedule time zone that pg_timezone_names does not list (22004 for NULL)';

-- +goose Down
DROP FUNCTION pgcoord_zone_check(text);
DROP FUNCTION pgcoord_cron_check(text);
DROP FUNCTION pgcoord_cron_every_check(text, text, int);
DROP FUNCTION pgcoord_cron_field_check(text, text, int, text);
DROP FUNCTION pgcoord_cron_refuse(text, int, text, text);
