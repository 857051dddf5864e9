// Package config is the scorer's configuration: one flat Config read from
// environment variables, overridden by flags of the same names, validated
// as a whole; and the one place it becomes the components' settings (pool
// options, model load options, input limits, consumer and producer
// settings, label configuration), so every subcommand that scores builds
// the same scorer from the same environment.
package config
