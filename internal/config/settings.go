package config

import (
	"flag"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/caarlos0/env/v11"

	"github.com/scorer/scorer/model/ortenv"
)

// Group is a set of related settings (Config's group tag). A subcommand
// reads whole groups: those its Set names.
type Group string

// The groups, in the order help and the reference list them.
const (
	GroupKafka    Group = "kafka"
	GroupSecurity Group = "security"
	GroupOutput   Group = "output"
	GroupKeys     Group = "keys"
	GroupConsumer Group = "consumer"
	GroupMemory   Group = "memory"
	GroupLimits   Group = "limits"
	GroupBatches  Group = "batches"
	GroupModel    Group = "model"
	GroupLabels   Group = "labels"
	GroupDevices  Group = "devices"
	GroupService  Group = "service"
	GroupLogging  Group = "logging"
)

// groups is every group in order, with its heading and what it is for.
var groups = []struct {
	g            Group
	title, about string
}{
	{GroupKafka, "Kafka", "Where `scorer run` reads and writes: brokers, topics and how they are created, the consumer group."},
	{GroupSecurity, "Kafka client and security", "How clients identify and authenticate: the client id, TLS and SASL."},
	{GroupOutput, "Output", "What `scorer run` publishes besides the results: the rows topic and the record format."},
	{GroupKeys, "Keys and versions", "What one record or row is keyed on, and so which versions replace each other: `scorer run` keys what it publishes with it (a sink keeps a key's last record), `scorer score` writes Parquet rows of each key's newest version only."},
	{GroupConsumer, "Consumer batches", "How `scorer run` batches input records and how far it reads ahead of its commits."},
	{GroupMemory, "Memory", "What the process may hold: input in flight, the score cache, and the CPU memory budget batches are cut to."},
	{GroupLimits, "Input limits", "What a TranscriptEvent may be; larger input goes to the DLQ (or, offline, is a bad record). The output topics are sized from them."},
	{GroupBatches, "Inference batches", "The shape of one inference batch: a GPU's, and the smaller caps a CPU pool takes instead."},
	{GroupModel, "Model", "Which model scores, with which ONNX Runtime, and how a pair becomes input and logits a score."},
	{GroupLabels, "Labels", "What each sentence is scored against, and when it is flagged."},
	{GroupDevices, "Devices", "Where inference runs: GPUs and their memory, CPU workers and threads."},
	{GroupService, "Service", "`scorer run`'s HTTP endpoints, liveness and shutdown."},
	{GroupLogging, "Logging", "The process's log."},
}

// Title is g's heading in help and the reference.
func (g Group) Title() string {
	for _, x := range groups {
		if x.g == g {
			return x.title
		}
	}
	return string(g)
}

// Set is what one subcommand reads: whole groups of settings, each from
// its environment variable or its flag. Via names variables the subcommand
// takes through a flag of its own instead, defaulting to the variable
// (`scorer produce --brokers` defaults to KAFKA_BROKERS).
type Set struct {
	Command string
	Groups  []Group
	Via     map[string]string
}

// scoring is what every subcommand that scores reads.
var scoring = []Group{GroupMemory, GroupLimits, GroupBatches, GroupModel, GroupLabels, GroupDevices, GroupLogging}

// The subcommands' sets. A subcommand that builds a scorer reads the
// settings of every component it builds, and no other: bench reads the
// consumer's batches (its pipeline runs the service's consumer against a
// broker of its own, on the default topics), doctor no input limits (it
// decodes no input).
var (
	Run      = Set{Command: "run", Groups: []Group{GroupKafka, GroupSecurity, GroupOutput, GroupKeys, GroupConsumer, GroupMemory, GroupLimits, GroupBatches, GroupModel, GroupLabels, GroupDevices, GroupService, GroupLogging}}
	Score    = Set{Command: "score", Groups: append([]Group{GroupKeys}, scoring...)}
	Bench    = Set{Command: "bench", Groups: append([]Group{GroupConsumer}, scoring...)}
	Doctor   = Set{Command: "doctor", Groups: slices.DeleteFunc(slices.Clone(scoring), func(g Group) bool { return g == GroupLimits })}
	Compare  = Set{Command: "compare", Groups: scoring}
	GPUProof = Set{Command: "gpu-proof", Groups: scoring}
	Produce  = Set{Command: "produce", Groups: []Group{GroupSecurity}, Via: map[string]string{"KAFKA_BROKERS": "--brokers", "KAFKA_INPUT_TOPIC": "--topic"}}
	Broker   = Set{Command: "broker"}
	// All reads every setting: tests, and tools that take the whole
	// environment.
	All = Set{Command: "", Groups: Run.Groups}
)

// Sets is every subcommand's set, in the binary's order of commands.
func Sets() []Set { return []Set{Run, Score, Broker, Produce, Bench, Doctor, Compare, GPUProof} }

// Reads reports whether the set reads the group.
func (s Set) Reads(g Group) bool { return slices.Contains(s.Groups, g) }

// Setting is one variable as help and the reference describe it.
type Setting struct {
	Env, Flag string
	Group     Group
	// Default is envDefault, or the zero value of a number or boolean
	// without one; "" means empty.
	Default string
	// Values says what a value may be: the enum, a least value, a unit or
	// the values tag.
	Values string
	Help   string
	index  int // the Config field
	sep    string
	secret bool
}

// Settings is every setting in reference order: group by group, each
// group in field order.
func Settings() []Setting {
	settingsOnce.Do(func() {
		t := reflect.TypeFor[Config]()
		var all []Setting
		for i := range t.NumField() {
			f := t.Field(i)
			name := f.Tag.Get("env")
			def, ok := f.Tag.Lookup("envDefault")
			if !ok && f.Type.Kind() != reflect.String && f.Type.Kind() != reflect.Slice {
				def = fmt.Sprint(reflect.Zero(f.Type).Interface()) // false, 0
			}
			all = append(all, Setting{Env: name, Flag: flagName(name), Group: Group(f.Tag.Get("group")),
				Default: def, Values: valuesOf(f), Help: f.Tag.Get("help"),
				index: i, sep: f.Tag.Get("envSeparator"), secret: f.Tag.Get("secret") == "true"})
		}
		for _, g := range groups {
			for _, s := range all {
				if s.Group == g.g {
					settings = append(settings, s)
				}
			}
		}
	})
	return settings
}

var (
	settingsOnce sync.Once
	settings     []Setting
)

// Settings is the settings s reads, in reference order.
func (s Set) Settings() []Setting {
	var out []Setting
	for _, st := range Settings() {
		if s.Reads(st.Group) {
			out = append(out, st)
		}
	}
	return out
}

// valuesOf describes what a field's value may be, from its type and tags.
func valuesOf(f reflect.StructField) string {
	var parts []string
	if e := f.Tag.Get("enum"); e != "" {
		return strings.ReplaceAll(e, ",", ", ")
	}
	switch f.Type {
	case reflect.TypeFor[time.Duration]():
		parts = append(parts, "duration (300ms, 30s, 5m)")
	case reflect.TypeFor[bool]():
		parts = append(parts, "true or false")
	case reflect.TypeFor[[]string]():
		parts = append(parts, "comma-separated list")
	case reflect.TypeFor[int]():
		parts = append(parts, "integer")
	case reflect.TypeFor[float64]():
		parts = append(parts, "number")
	}
	if u := f.Tag.Get("unit"); u != "" {
		parts = append(parts[:0], u)
	}
	if m := f.Tag.Get("min"); m != "" {
		if f.Type == reflect.TypeFor[time.Duration]() && m == "1ns" {
			parts = append(parts, "> 0")
		} else {
			parts = append(parts, "≥ "+m)
		}
	}
	if v := f.Tag.Get("values"); v != "" {
		if k := f.Type.Kind(); k == reflect.String || k == reflect.Slice {
			return v
		}
		parts = append(parts, v)
	}
	return strings.Join(parts, ", ")
}

// flagName turns an environment variable name into its flag name.
func flagName(envName string) string {
	return strings.ReplaceAll(strings.ToLower(envName), "_", "-")
}

// Load reads the settings s reads from the environment through getenv,
// binds a flag for each on fs, parses args over them, and validates the
// whole: every setting s does not read keeps its default. The positional
// arguments left are fs.Args().
func Load(s Set, getenv func(string) string, fs *flag.FlagSet, args []string) (Config, error) {
	cfg, err := s.fromEnv(getenv)
	if err != nil {
		return Config{}, err
	}
	s.bindFlags(fs, &cfg)
	if err := fs.Parse(args); err != nil {
		return Config{}, FlagError{err}
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, err
	}
	if s.Reads(GroupModel) {
		cfg.ORTLib = preferCUDASet(cfg.ORTLib, cfg.Device, ortenv.NVIDIADriverLoaded(), checkoutRoot())
	}
	return cfg, nil
}

// FlagError is a command line the flag package refused (and reported,
// with the usage, on the flag set's output); -h is one, wrapping
// flag.ErrHelp.
type FlagError struct{ Err error }

func (e FlagError) Error() string { return e.Err.Error() }
func (e FlagError) Unwrap() error { return e.Err }

// FromEnv reads every setting from the environment through getenv, without
// flags or validation.
func FromEnv(getenv func(string) string) (Config, error) { return All.fromEnv(getenv) }

// fromEnv reads the settings s reads through getenv; the others keep their
// defaults. List variables are split the way their flags are: every
// element trimmed, empty elements dropped (the env library keeps spaces).
func (s Set) fromEnv(getenv func(string) string) (Config, error) {
	environ := map[string]string{}
	for _, st := range s.Settings() {
		if v := getenv(st.Env); v != "" {
			environ[st.Env] = v
		}
	}
	cfg, err := env.ParseAsWithOptions[Config](env.Options{Environment: environ})
	if err != nil {
		return Config{}, envError(err)
	}
	v := reflect.ValueOf(&cfg).Elem()
	for i := range v.NumField() {
		if l, ok := v.Field(i).Interface().([]string); ok {
			v.Field(i).Set(reflect.ValueOf(cleanList(l)))
		}
	}
	if cfg.ORTLib == "" {
		cfg.ORTLib = DefaultORTLib()
	}
	return cfg, nil
}

// bindFlags registers one flag per setting s reads, whose default is the
// value already read from the environment, so a flag overrides the
// environment.
func (s Set) bindFlags(fs *flag.FlagSet, cfg *Config) {
	v := reflect.ValueOf(cfg).Elem()
	for _, st := range s.Settings() {
		fs.Var(&fieldValue{v: v.Field(st.index), sep: st.sep, secret: st.secret}, st.Flag, st.Help+" (env "+st.Env+")")
	}
}

// tagErrors checks what Config's enum and min tags say of each setting.
func (c *Config) tagErrors() []error {
	var errs []error
	v := reflect.ValueOf(c).Elem()
	t := v.Type()
	for i := range t.NumField() {
		f, fv := t.Field(i), v.Field(i)
		name := f.Tag.Get("env")
		if e := f.Tag.Get("enum"); e != "" && !slices.Contains(strings.Split(e, ","), fv.String()) {
			errs = append(errs, fmt.Errorf("%s must be one of %s, got %q", name, strings.ReplaceAll(e, ",", ", "), fv.String()))
		}
		m := f.Tag.Get("min")
		if m == "" {
			continue
		}
		switch {
		case f.Type == reflect.TypeFor[time.Duration]():
			least, err := time.ParseDuration(m)
			if err != nil {
				panic("config: bad min tag on " + name)
			}
			if d := time.Duration(fv.Int()); d < least {
				what := ">= " + m
				if m == "1ns" {
					what = "> 0"
				}
				errs = append(errs, fmt.Errorf("%s must be %s, got %v", name, what, d))
			}
		case fv.Kind() == reflect.Int:
			least, err := strconv.Atoi(m)
			if err != nil {
				panic("config: bad min tag on " + name)
			}
			if n := fv.Int(); n < int64(least) {
				errs = append(errs, fmt.Errorf("%s must be >= %d, got %d", name, least, n))
			}
		}
	}
	return errs
}
