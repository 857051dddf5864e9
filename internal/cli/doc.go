// Package cli is the kit every subcommand of the scorer binary shares: the
// process environment a subcommand may touch (Env), usage errors and the
// exit code each error maps to, the one logger, list and path helpers and
// the build's version. It imports no other package of this module, so any
// subcommand can use it without pulling in another's dependencies.
package cli
