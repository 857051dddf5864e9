package tokenizer

import (
	"regexp"
	"testing"

	"golang.org/x/text/unicode/norm"
)

func mustRegex(t *testing.T, s string) *regexp.Regexp {
	t.Helper()
	return regexp.MustCompile(s)
}

func formOf(t *testing.T, name string) norm.Form {
	t.Helper()
	switch name {
	case "NFC":
		return norm.NFC
	case "NFD":
		return norm.NFD
	case "NFKC":
		return norm.NFKC
	case "NFKD":
		return norm.NFKD
	}
	t.Fatalf("unknown form %s", name)
	return 0
}
