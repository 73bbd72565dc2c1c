package telemetry

import (
	"context"
	"encoding/hex"
	"log/slog"
	"math"
	"strconv"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// appendJSONRecord appends r as slog.NewJSONHandler (without options) writes it, followed by
// the trace_id and span_id of sc when valid, as traceHandler adds them. It handles the
// records a request logs, the access line first: a plain message and attributes that are
// plain strings, integers, finite floats or booleans. For anything else it returns false,
// and the caller hands the record to slog. FuzzJSONRecord checks the two agree byte for byte.
//
// The access line is written on every request; through slog it cost about 4 µs (a record
// that outgrows its inline attributes, two more for the ids, and encoding/json for the
// duration), here well under one.
func appendJSONRecord(b []byte, r slog.Record, sc trace.SpanContext) ([]byte, bool) {
	b, ok := appendJSONHead(b, r.Time, r.Level, r.Message)
	if !ok {
		return b, false
	}
	r.Attrs(func(a slog.Attr) bool {
		b, ok = appendJSONAttr(b, a)
		return ok
	})
	if !ok {
		return b, false
	}
	return appendJSONTail(b, sc), true
}

// appendJSONHead appends the start of a line as slog's JSON handler writes it, up to the
// message: {"time":"…","level":"…","msg":"…" (no time when t is zero). It returns false for
// what it would not write the same: a message that needs escaping, a year outside 0–9999.
func appendJSONHead(b []byte, t time.Time, level slog.Level, msg string) ([]byte, bool) {
	if !plainJSON(msg) {
		return b, false
	}
	b = append(b, '{')
	if !t.IsZero() {
		if y := t.Year(); y < 0 || y >= 10000 {
			return b, false
		}
		b = append(b, `"time":"`...)
		b = appendRFC3339Nano(b, t)
		b = append(b, `",`...)
	}
	b = append(b, `"level":"`...)
	b = append(b, level.String()...)
	b = append(b, `","msg":"`...)
	b = append(b, msg...)
	return append(b, '"'), true
}

// appendJSONTail ends a line: the trace_id and span_id of sc when it is valid, as
// traceHandler adds them.
func appendJSONTail(b []byte, sc trace.SpanContext) []byte {
	if sc.IsValid() {
		tid, sid := sc.TraceID(), sc.SpanID()
		b = append(b, `,"trace_id":"`...)
		b = hex.AppendEncode(b, tid[:])
		b = append(b, `","span_id":"`...)
		b = hex.AppendEncode(b, sid[:])
		b = append(b, '"')
	}
	return append(b, "}\n"...)
}

// appendJSONAttr appends `,"key":value` for the attribute kinds appendJSONRecord handles.
func appendJSONAttr(b []byte, a slog.Attr) ([]byte, bool) {
	if a.Key == "" || !plainJSON(a.Key) {
		return b, false // slog elides some empty attributes and not others; leave that to it
	}
	b = append(b, ',', '"')
	b = append(b, a.Key...)
	b = append(b, '"', ':')
	v := a.Value
	switch v.Kind() {
	case slog.KindString:
		s := v.String()
		if !plainJSON(s) {
			return b, false
		}
		b = append(b, '"')
		b = append(b, s...)
		return append(b, '"'), true
	case slog.KindInt64:
		return strconv.AppendInt(b, v.Int64(), 10), true
	case slog.KindUint64:
		return strconv.AppendUint(b, v.Uint64(), 10), true
	case slog.KindBool:
		return strconv.AppendBool(b, v.Bool()), true
	case slog.KindFloat64:
		// slog uses encoding/json, which writes %f between 1e-6 and 1e21 (and 0), and an
		// exponent outside; only the first is done here.
		f := v.Float64()
		if abs := math.Abs(f); math.IsNaN(f) || abs >= 1e21 || (abs != 0 && abs < 1e-6) {
			return b, false
		}
		return appendFloat(b, f), true
	}
	return b, false
}

// LogAccess writes a request's access line, at info: the line api's observe would log as the
// record "request" with method, route, status, duration_ms (d in whole microseconds, as
// milliseconds), bytes and request_id, formatted here without a record when the handler
// writes to a LogBuffer, as appendJSONRecord would. A record of more than five attributes
// costs an allocation, and going through it three quarters of the line's instructions. It
// reports false, having written nothing, when the line is not for it to write: another
// writer, or a string that would need escaping.
func (h traceHandler) LogAccess(ctx context.Context, t time.Time, method, route string, status int, d time.Duration, bytes int, requestID string) bool {
	if h.direct == nil || !plainJSON(method) || !plainJSON(route) || !plainJSON(requestID) ||
		d >= 1e15*time.Microsecond || d <= -1e15*time.Microsecond { // beyond where appendThousandths writes what slog does
		return false
	}
	sc := trace.SpanContextFromContext(ctx)
	written, _ := h.writeDirect(func(b []byte) ([]byte, bool) {
		b, ok := appendJSONHead(b, t, slog.LevelInfo, "request")
		if !ok {
			return b, false
		}
		b = append(b, `,"method":"`...)
		b = append(b, method...)
		b = append(b, `","route":"`...)
		b = append(b, route...)
		b = append(b, `","status":`...)
		b = strconv.AppendInt(b, int64(status), 10)
		b = append(b, `,"duration_ms":`...)
		b = appendThousandths(b, d.Microseconds())
		b = append(b, `,"bytes":`...)
		b = strconv.AppendInt(b, int64(bytes), 10)
		b = append(b, `,"request_id":"`...)
		b = append(b, requestID...)
		b = append(b, '"')
		return appendJSONTail(b, sc), true
	})
	return written // an info line that cannot be written has nowhere to be reported
}

// writeDirect formats a line with format into a pooled buffer and, when format reports it
// could, writes it to h.direct (which must be set): whether it wrote, and the write's error.
func (h traceHandler) writeDirect(format func([]byte) ([]byte, bool)) (bool, error) {
	buf := lineBufs.get()
	line, ok := format(*buf)
	defer lineBufs.put(buf, line)
	if !ok {
		return false, nil
	}
	_, err := h.direct.Write(line)
	return true, err
}

// appendFloat is strconv.AppendFloat(b, f, 'f', -1, 64) for a finite f. A whole number of
// thousandths, as the access line's duration_ms always is, is written from that integer: the
// shortest decimal that reads back as f is then that number with its trailing zeros cut,
// since any other decimal of as few digits is at least a thousandth away.
func appendFloat(b []byte, f float64) []byte {
	m := math.Round(f * 1000)
	if f == 0 || math.Abs(m) >= 1e15 || m/1000 != f {
		return strconv.AppendFloat(b, f, 'f', -1, 64)
	}
	return appendThousandths(b, int64(m))
}

// appendThousandths appends n/1000 as strconv.AppendFloat(b, float64(n)/1000, 'f', -1, 64)
// does for |n| < 1e15: the integer part, then up to three decimals without trailing zeros.
func appendThousandths(b []byte, n int64) []byte {
	if n < 0 {
		b = append(b, '-')
		n = -n
	}
	b = strconv.AppendInt(b, n/1000, 10)
	if frac := n % 1000; frac != 0 {
		digits := [4]byte{'.', byte('0' + frac/100), byte('0' + frac/10%10), byte('0' + frac%10)}
		end := 4
		for digits[end-1] == '0' {
			end--
		}
		b = append(b, digits[:end]...)
	}
	return b
}

// appendRFC3339Nano is t.AppendFormat(b, time.RFC3339Nano) for a year of four digits. The
// date, time of day and zone of the last second formatted are kept (lastSecond), so a line
// formats only its fraction; formatting the whole time was a fifth of the access line.
func appendRFC3339Nano(b []byte, t time.Time) []byte {
	sec, loc := t.Unix(), t.Location()
	c := lastSecond.Load()
	if c == nil || c.unix != sec || c.loc != loc {
		text := t.AppendFormat(make([]byte, 0, 32), "2006-01-02T15:04:05Z07:00")
		c = &secondText{unix: sec, loc: loc, date: string(text[:19]), zone: string(text[19:])}
		lastSecond.Store(c)
	}
	b = append(b, c.date...)
	if ns := t.Nanosecond(); ns != 0 {
		frac := [10]byte{'.'}
		for i := 9; i > 0; i-- {
			frac[i] = byte('0' + ns%10)
			ns /= 10
		}
		end := 10
		for frac[end-1] == '0' {
			end--
		}
		b = append(b, frac[:end]...)
	}
	return append(b, c.zone...)
}

// secondText is the text of one second in one location: "2006-01-02T15:04:05" and the zone,
// "Z" or "-07:00".
type secondText struct {
	unix       int64
	loc        *time.Location
	date, zone string
}

var lastSecond atomic.Pointer[secondText]

// plainJSON reports whether s is printable ASCII without '"' or '\': what slog writes into a
// JSON string unchanged.
func plainJSON(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}
