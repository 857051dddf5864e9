package config

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Anchor is g's heading's anchor in docs/configuration.md.
func Anchor(g Group) string {
	a := strings.ToLower(g.Title())
	a = strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-':
			return r
		case r == ' ':
			return '-'
		}
		return -1
	}, a)
	return a
}

// Reference is docs/configuration.md: every setting, group by group, with
// its flag, default, allowed values, the subcommands that read it and its
// meaning, written from Config's tags and the subcommands' sets. `make
// docs` writes it; a test in cmd/scorer fails when the file differs.
func Reference() string {
	var b strings.Builder
	b.WriteString(`# Configuration reference

<!-- Generated from internal/config (Config's tags and each subcommand's Set) by ` + "`make docs`" + `; ` + "`go test ./cmd/scorer`" + ` fails when it is stale. Edit the code, not this file. -->

Every setting is an environment variable. A subcommand reads only the groups of settings listed
for it below, and takes each of those as a flag too: the variable's name in lower case with dashes
(` + "`KAFKA_BROKERS` → `--kafka-brokers`" + `), which wins over the environment. A setting a
subcommand does not read keeps its default there, whatever the environment says.
` + "`scorer <command> -h`" + ` lists the flags and settings of one subcommand.

| subcommand | reads |
|---|---|
`)
	for _, s := range Sets() {
		var gs []string
		for _, g := range s.Groups {
			gs = append(gs, fmt.Sprintf("[%s](#%s)", g.Title(), Anchor(g)))
		}
		for _, env := range slices.Sorted(maps.Keys(s.Via)) {
			gs = append(gs, fmt.Sprintf("`%s` (as `%s`)", env, s.Via[env]))
		}
		if len(gs) == 0 {
			gs = []string{"no settings: its flags only"}
		}
		fmt.Fprintf(&b, "| `scorer %s` | %s |\n", s.Command, strings.Join(gs, ", "))
	}
	for _, g := range groups {
		fmt.Fprintf(&b, "\n## %s\n\n%s Read by %s.\n\n", g.title, g.about, readers(g.g))
		b.WriteString("| variable | flag | default | values | meaning |\n|---|---|---|---|---|\n")
		for _, st := range Settings() {
			if st.Group != g.g {
				continue
			}
			def := "(empty)"
			if st.Default != "" {
				def = "`" + st.Default + "`"
			}
			fmt.Fprintf(&b, "| `%s` | `--%s` | %s | %s | %s |\n", st.Env, st.Flag, def, cell(st.Values), cell(st.Help)+via(st.Env))
		}
	}
	return b.String()
}

// readers names the subcommands that read g.
func readers(g Group) string {
	var names []string
	for _, s := range Sets() {
		if s.Reads(g) {
			names = append(names, "`"+s.Command+"`")
		}
	}
	return strings.Join(names, ", ")
}

// via notes the subcommands that read env through a flag of their own.
func via(env string) string {
	var out []string
	for _, s := range Sets() {
		if fl, ok := s.Via[env]; ok {
			out = append(out, fmt.Sprintf("`scorer %s` reads it as the default of `%s`", s.Command, fl))
		}
	}
	if len(out) == 0 {
		return ""
	}
	return " (" + strings.Join(out, "; ") + ")"
}

// cell escapes text for a Markdown table cell.
func cell(s string) string { return strings.ReplaceAll(s, "|", "\\|") }
