// Package cli is the kit every subcommand of the scorer binary shares: the
// process environment a subcommand may touch (Env), usage errors and the
// exit code each error maps to, the one logger, the build's version, and
// Spec: a subcommand's name, summary, own flags and the settings it reads,
// from which its flag set, its -h, `scorer -h` and README's usage section
// are made, and with which it loads its configuration (package config).
package cli
