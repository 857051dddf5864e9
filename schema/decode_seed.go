package schema

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"time"
)

// Seed (upper-case) column names. The seed data set was exported from a
// warehouse table, so its columns arrive in upper case.
const (
	colCallID      = "CALL_ID"
	colEntityID    = "ENTITY_ID"
	colCompanyName = "COMPANY_NAME"
	colCallName    = "CALL_NAME"
	colDate        = "DATE"
	colVersionID   = "VERSION_ID"
	colEventTime   = "EVENT_DATETIME_UTC"
)

// seedSections lists the upper-case columns that hold sentences; the column
// name becomes the section name.
var seedSections = [...]string{"FILT_MD", "FILT_QA"}

// hasSeedSection reports whether obj has a seed sentence column (FILT_MD,
// FILT_QA) under any letter case.
func hasSeedSection(obj map[string]json.RawMessage) bool {
	for k := range obj {
		for _, col := range seedSections {
			if strings.EqualFold(k, col) {
				return true
			}
		}
	}
	return false
}

// upperKeys returns obj with its keys upper-cased, the seed's column case.
// Two keys that differ only in case are ambiguous and rejected.
func upperKeys(obj map[string]json.RawMessage) (map[string]json.RawMessage, error) {
	out := make(map[string]json.RawMessage, len(obj))
	for k, v := range obj {
		u := strings.ToUpper(k)
		if _, dup := out[u]; dup {
			return nil, decodeErr(ReasonWrongType, u, "column %q appears twice in different letter case", u)
		}
		out[u] = v
	}
	return out, nil
}

func decodeSeed(obj map[string]json.RawMessage, ev *TranscriptEvent, lim Limits) error {
	var err error
	if ev.CallID, err = scalar(obj, colCallID); err != nil {
		return err
	}
	if ev.EntityID, err = scalar(obj, colEntityID); err != nil {
		return err
	}
	if ev.CompanyName, err = stringOnly(obj, colCompanyName); err != nil {
		return err
	}
	if ev.CallName, err = stringOnly(obj, colCallName); err != nil {
		return err
	}
	if ev.VersionID, err = scalar(obj, colVersionID); err != nil {
		return err
	}
	if ev.EventTime, err = seedTime(obj, colEventTime, millisToTime); err != nil {
		return err
	}
	if ev.EventTime == "" {
		if ev.EventTime, err = seedTime(obj, colDate, daysToDate); err != nil {
			return err
		}
	}
	ev.Sections = make(map[string][]string, len(seedSections))
	budget := newSentenceBudget(lim)
	for _, col := range seedSections {
		raw, ok := obj[col]
		if !ok || isNull(raw) {
			continue
		}
		sents, err := sentences(raw, col, budget)
		if err != nil {
			return err
		}
		ev.Sections[col] = sents
	}
	return nil
}

// seedTime reads a time column: a string is kept verbatim; a number is the
// Connect logical-type encoding (Timestamp = epoch millis, Date = epoch days)
// and is rendered as RFC 3339 / YYYY-MM-DD in UTC.
func seedTime(obj map[string]json.RawMessage, key string, conv func(int64) string) (string, error) {
	raw, ok := obj[key]
	if !ok || isNull(raw) {
		return "", nil
	}
	switch jsonKind(raw) {
	case "string":
		return stringOnly(obj, key)
	case "number":
		n, err := strconv.ParseInt(string(bytes.TrimSpace(raw)), 10, 64)
		if err != nil {
			return "", decodeErr(ReasonWrongType, key, "expected an integer time, got %s", raw)
		}
		return conv(n), nil
	default:
		return "", decodeErr(ReasonWrongType, key, "expected a string or integer time, got %s", jsonKind(raw))
	}
}

func millisToTime(ms int64) string { return time.UnixMilli(ms).UTC().Format(time.RFC3339Nano) }

func daysToDate(d int64) string {
	return time.Unix(0, 0).UTC().AddDate(0, 0, int(d)).Format(time.DateOnly)
}
