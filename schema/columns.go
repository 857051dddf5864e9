package schema

import (
	"slices"
	"strings"
)

// InputColumn reports whether DecodeEvent reads a top-level field called
// name: a lower-case TranscriptEvent field, or one of the seed's columns in
// any letter case. Readers of table formats (Parquet) use it to tell a
// column they must map from one they may leave out.
func InputColumn(name string) bool {
	switch name {
	case "call_id", "entity_id", "company_name", "call_name", "event_time", "version_id", "sections":
		return true
	}
	switch u := strings.ToUpper(name); u {
	case colCallID, colEntityID, colCompanyName, colCallName, colDate, colVersionID, colEventTime:
		return true
	default:
		return slices.Contains(seedSections[:], u)
	}
}
