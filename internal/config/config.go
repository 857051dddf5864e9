package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"

	"github.com/scorer/scorer/gpupool"
	"github.com/scorer/scorer/internal/fanout/scorecache"
	"github.com/scorer/scorer/model"
)

// Config is the whole configuration, one flat struct: every field is an
// environment variable (env, with its default in envDefault) and, in each
// subcommand that reads it, a flag of the same name in lower case with
// dashes (KAFKA_BROKERS → --kafka-brokers), which wins. The other tags
// describe it for Validate, the subcommands' help and docs/configuration.md
// (Reference): group is the settings group subcommands read whole (see
// Set), enum the allowed values, min the least value of a number or
// duration, values what else a value may be, and help its meaning. Field
// order is the reference's order.
type Config struct {
	KafkaBrokers     []string      `env:"KAFKA_BROKERS" envSeparator:"," group:"kafka" values:"comma-separated host:port list, or embedded" help:"comma-separated bootstrap brokers, required by scorer run; embedded = an in-memory broker in the scorer's own process (not durable; make run uses it)"`
	InputTopic       string        `env:"KAFKA_INPUT_TOPIC" envDefault:"transcripts" group:"kafka" help:"topic of TranscriptEvents"`
	OutputTopic      string        `env:"KAFKA_OUTPUT_TOPIC" envDefault:"transcripts.scored" group:"kafka" help:"topic of ScoredTranscripts"`
	DLQTopic         string        `env:"KAFKA_DLQ_TOPIC" envDefault:"transcripts.dlq" group:"kafka" help:"dead-letter topic"`
	GroupID          string        `env:"KAFKA_GROUP_ID" envDefault:"scorer" group:"kafka" help:"consumer group"`
	StartOffset      string        `env:"KAFKA_START_OFFSET" envDefault:"earliest" group:"kafka" enum:"earliest,latest" help:"where a partition with no committed offset in the group starts (Kafka's auto.offset.reset): earliest = the log start, every record kept; latest = the log end, only records written from then on. A committed offset past the log end (topic re-created, log truncated) resets the same way; one before the log start (retention deleted records not yet read) resets to the log start with either value, so retained records are never skipped (docs/operating.md)"`
	IsolationLevel   string        `env:"KAFKA_ISOLATION_LEVEL" envDefault:"read_committed" group:"kafka" enum:"read_committed,read_uncommitted" help:"what the consumer reads of transactional input: read_committed (records of aborted transactions are never scored; an open transaction holds back what follows it), or read_uncommitted (every record, aborted ones included)"`
	SessionTimeout   time.Duration `env:"KAFKA_SESSION_TIMEOUT" envDefault:"30s" group:"kafka" min:"6s" help:"group session timeout: how long a dead member keeps its partitions (at least the brokers' group.min.session.timeout.ms)"`
	RebalanceTimeout time.Duration `env:"KAFKA_REBALANCE_TIMEOUT" envDefault:"30s" group:"kafka" min:"1ns" help:"how long the group waits for members to rejoin; at a rebalance in-flight work gets min(10s, half of this minus the heartbeat interval) to finish"`
	InputPartitions  int           `env:"KAFKA_INPUT_PARTITIONS" envDefault:"6" group:"kafka" min:"1" help:"partitions for topics the scorer creates (in-memory broker, or missing topics)"`
	CreateTopics     bool          `env:"KAFKA_CREATE_TOPICS" envDefault:"true" group:"kafka" help:"create missing topics at start (KAFKA_INPUT_PARTITIONS, KAFKA_TOPIC_REPLICATION_FACTOR, a max.message.bytes that fits the input limits); false = topics are managed elsewhere and a missing one stops start-up"`
	TopicReplication int           `env:"KAFKA_TOPIC_REPLICATION_FACTOR" envDefault:"-1" group:"kafka" values:"-1 or ≥ 1" help:"replication factor of topics the scorer creates when they are missing; -1 = the cluster's default.replication.factor (needs Kafka 2.4 or later: an older cluster stops start-up with an error saying so; the in-memory broker always uses 1); a number must be at least your cluster's min.insync.replicas (acks=all writes fail below it), or create topics ahead"`

	ClientID         string `env:"KAFKA_CLIENT_ID" envDefault:"scorer" group:"security" help:"Kafka client id"`
	KafkaTLS         bool   `env:"KAFKA_TLS" group:"security" help:"connect with TLS; required by every other KAFKA_TLS_* setting"`
	KafkaTLSCAFile   string `env:"KAFKA_TLS_CA_FILE" group:"security" values:"file" help:"PEM CA bundle for the brokers' certificates"`
	KafkaTLSCertFile string `env:"KAFKA_TLS_CERT_FILE" group:"security" values:"file" help:"PEM client certificate (mutual TLS)"`
	KafkaTLSKeyFile  string `env:"KAFKA_TLS_KEY_FILE" group:"security" values:"file" help:"PEM client key (mutual TLS)"`
	KafkaTLSInsecure bool   `env:"KAFKA_TLS_INSECURE_SKIP_VERIFY" group:"security" help:"skip broker certificate verification (testing only)"`
	SASLMechanism    string `env:"KAFKA_SASL_MECHANISM" group:"security" values:"PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, or empty" help:"SASL mechanism; empty = no SASL"`
	SASLUsername     string `env:"KAFKA_SASL_USERNAME" group:"security" help:"SASL user"`
	SASLPassword     string `env:"KAFKA_SASL_PASSWORD" group:"security" help:"SASL password (prefer KAFKA_SASL_PASSWORD_FILE)" secret:"true"`
	SASLPasswordFile string `env:"KAFKA_SASL_PASSWORD_FILE" group:"security" values:"file" help:"file holding the SASL password"`

	RowsTopic    string `env:"OUTPUT_ROWS_TOPIC" group:"output" help:"optional topic of flat (call_id, section, sentence_index, label) rows"`
	OutputFormat string `env:"OUTPUT_FORMAT" envDefault:"json" group:"output" enum:"json,connect" help:"json, or connect (JsonConverter envelope, schemas.enable=true)"`

	OutputKey string `env:"OUTPUT_KEY" envDefault:"call_id" group:"keys" enum:"call_id,entity_event" help:"key of results, rows and tombstones: call_id, or entity_event (entity_id + event_time, the seed's ENTITY_ID + EVENT_DATETIME_UTC dedup; records lacking either go to the DLQ, or offline are bad records); scorer score's Parquet rows keep each key's newest version (greatest version_id)"`

	BatchMaxMessages int           `env:"BATCH_MAX_MESSAGES" envDefault:"16" group:"consumer" min:"1" help:"messages per consumer batch"`
	BatchMaxWait     time.Duration `env:"BATCH_MAX_WAIT" envDefault:"200ms" group:"consumer" min:"1ns" help:"longest a batch waits, from its oldest message"`
	MaxUncommitted   int           `env:"MAX_UNCOMMITTED" envDefault:"1000" group:"consumer" min:"1" help:"records per input partition fetched past its last successful commit, acknowledged or not (counted, so offset gaps do not matter); fetching of the partition pauses at this until a commit covers some, so a crash replays at most this many per partition, also while commits fail"`

	BatchMaxBytes      int    `env:"BATCH_MAX_BYTES" envDefault:"8388608" group:"memory" min:"1" unit:"bytes" help:"bytes per consumer batch (never exceeded); twice MAX_INFLIGHT_BATCHES × this is the input the CPU memory budget sets aside"`
	MaxInflightBatches int    `env:"MAX_INFLIGHT_BATCHES" envDefault:"2" group:"memory" min:"1" help:"consumer batches between fetch and ack; fetching pauses beyond"`
	ScoreCacheBytes    int    `env:"SCORE_CACHE_BYTES" envDefault:"268435456" group:"memory" unit:"bytes" values:"0 (off), or at least 3072" help:"memory for the cache of pair scores (revised and repeated sentences skip inference); 0 = off"`
	CPUMemLimit        string `env:"CPU_MEM_LIMIT" envDefault:"auto" group:"memory" values:"auto, 0, bytes (6GiB), or a fraction of auto (0.8)" help:"memory the process may use on a CPU pool; batches are cut so the weights, the score cache, in-flight input and every worker's batch fit: auto = the container's cgroup limit, else physical memory; 0 = none"`
	CPUMaxBatchBytes   string `env:"CPU_MAX_BATCH_BYTES" envDefault:"auto" group:"memory" values:"auto, off, or bytes (512MiB)" help:"most memory one CPU batch may take, from the model's cost measured at start (rows fall as pairs grow longer): auto = what CPU_MAX_BATCH_ROWS pairs of 128 tokens need; off = no memory model (rows and tokens caps only)"`
	// CPUCalibrationCache keeps the CPU memory calibration between starts
	// (CPUMemory, gpupool.CPUMemoryConfig.CacheDir).
	CPUCalibrationCache string `env:"CPU_CALIBRATION_CACHE" envDefault:"auto" group:"memory" values:"auto, off, or a directory" help:"where the model's CPU memory cost measured at start is kept, so the next start with the same model, ONNX Runtime, threads and machine skips measuring it (about 2 s on a production-size model): auto = scorer/cpu-calibration in the user's cache directory ($XDG_CACHE_HOME, else ~/.cache); off = measure at every start"`

	MaxMessageBytes  int `env:"MAX_MESSAGE_BYTES" envDefault:"8388608" group:"limits" min:"1" unit:"bytes" help:"larger input records go to the DLQ; with MAX_SENTENCES and the labels it sizes the output topic (checked at start: every accepted transcript's result must fit its max.message.bytes)"`
	MaxSentences     int `env:"MAX_SENTENCES" envDefault:"100000" group:"limits" min:"1" help:"sentences per transcript (all sections); more goes to the DLQ"`
	MaxSentenceBytes int `env:"MAX_SENTENCE_BYTES" envDefault:"1048576" group:"limits" min:"1" unit:"bytes" help:"bytes per sentence; longer goes to the DLQ (the model truncates to its max length anyway)"`

	MaxBatchTokens    int    `env:"MAX_BATCH_TOKENS" envDefault:"16384" group:"batches" min:"1" unit:"tokens" help:"rows × padded length per inference batch"`
	MaxBatchRows      int    `env:"MAX_BATCH_ROWS" envDefault:"256" group:"batches" min:"1" help:"rows per inference batch"`
	CPUMaxBatchTokens int    `env:"CPU_MAX_BATCH_TOKENS" envDefault:"16384" group:"batches" min:"1" unit:"tokens" help:"on CPU-only pools, MAX_BATCH_TOKENS is capped at this (measured: make bench, CPU batch shapes)"`
	CPUMaxBatchRows   int    `env:"CPU_MAX_BATCH_ROWS" envDefault:"16" group:"batches" min:"1" help:"on CPU-only pools, MAX_BATCH_ROWS is capped at this: small batches stay in the CPU's caches (measured: make bench, CPU batch shapes)"`
	PadToMultipleOf   string `env:"PAD_TO_MULTIPLE_OF" envDefault:"auto" group:"batches" values:"auto or 1..N" help:"each inference batch's length is rounded up to a multiple of this (Hugging Face's pad_to_multiple_of; never past the model's max length), the padded positions masked: ONNX Runtime's fused CUDA attention needs multiples of 8 in fp16. The planner, MAX_BATCH_TOKENS and the memory model count padded lengths. auto = 8 on a GPU, 1 (the longest pair) on the CPU (docs/gpu.md)"`

	ModelDir           string `env:"MODEL_DIR" envDefault:"../shared/models/nli-unigram-small" group:"model" values:"folder" help:"model folder: config.json, tokenizer.json (byte-level BPE, SentencePiece Unigram or WordPiece, as RoBERTa, BART, ModernBERT, DeBERTa-v3, mDeBERTa, XLM-R and BERT export them; README, Tokenizers, lists the parts that load), ONNX file (its weights inline, or in external data files such as model.onnx_data at locations inside the folder)"`
	ModelFile          string `env:"MODEL_FILE" group:"model" values:"path inside MODEL_DIR" help:"ONNX file relative to MODEL_DIR and inside it (no leading /, no ..); empty = model.onnx or the single onnx/model*.onnx"`
	ModelName          string `env:"MODEL_NAME" group:"model" help:"the model's name in results (model.name) and scorer_build_info{model}; empty = config.json's _name_or_path when it is a Hugging Face Hub id (owner/name), else MODEL_DIR's base name"`
	ORTLib             string `env:"ORT_LIB" group:"model" values:"file" help:"ONNX Runtime shared library; empty = .deps/ort-<version>/libonnxruntime.so.1 in the folder above the scorer executable's (what make fetches for bin/scorer), never looked for in the working directory"`
	ScoreMode          string `env:"SCORE_MODE" envDefault:"softmax" group:"model" enum:"softmax,entail_vs_contradiction" help:"softmax (P(entailment) over all classes) or entail_vs_contradiction"`
	PairEncoding       string `env:"PAIR_ENCODING" envDefault:"pair" group:"model" enum:"pair,joined" help:"pair ([CLS] sentence [SEP] hypothesis [SEP], what NLI models are trained on) or joined (sentence + PAIR_SEPARATOR + hypothesis as one sequence, the Spark job's encoding; over the max length only the sentence is cut)"`
	PairSeparator      string `env:"PAIR_SEPARATOR" envDefault:"</s></s>" group:"model" help:"text between sentence and hypothesis when PAIR_ENCODING=joined (ordinary text to DeBERTa-v3's tokenizer; RoBERTa's and BART's read it as two of their special </s> tokens, so there joined gives the ids of pair)"`
	EntailmentIndex    int    `env:"ENTAILMENT_INDEX" envDefault:"-1" group:"model" min:"-1" help:"logit index of entailment; -1 = from id2label"`
	ContradictionIndex int    `env:"CONTRADICTION_INDEX" envDefault:"-1" group:"model" min:"-1" help:"logit index of contradiction, read by SCORE_MODE=entail_vs_contradiction; -1 = from id2label (a contradiction, else a not_entailment label)"`
	RelAttnRewrite     bool   `env:"REL_ATTENTION_REWRITE" envDefault:"true" group:"model" help:"rewrite DeBERTa's disentangled attention at load to compute only the relative positions a batch can use (same logits within 1e-5, less time and memory; docs/design.md); false = run the graph as exported. Graphs without it run as exported either way; the log says which"`
	AttentionRewrites  string `env:"ATTENTION_REWRITES" envDefault:"align,scale,mask,skipln" group:"model" values:"comma-separated: align, scale, mask, skipln, mha; or none" help:"with REL_ATTENTION_REWRITE, DeBERTa's attention rewrites at load (same logits within 1e-5; docs/design.md, \"Attention rewrites\"): align = windows of relative positions a multiple of 8 wide (fp16 tensor-core kernels), scale = the score scale applied to the small windows, not to each [batch, heads, L, L] term, mask = one additive key mask for all layers in place of each layer's Where → Softmax → Where, skipln = each residual Add, its dense bias and LayerNorm as one SkipLayerNormalization, mha (off by default; needs mask and num_attention_heads in config.json) = each attention core as one fused MultiHeadAttention. none = only the relative-attention rewrite. scorer compare --b-rel-attention-rewrite=false checks them all against the graph as exported"`
	// GraphCache keeps ONNX Runtime's optimised graph of the CPU session,
	// with its prepacked weights, between starts
	// (model.SessionOptions.GraphCache).
	GraphCache        string `env:"GRAPH_CACHE" envDefault:"auto" group:"model" values:"auto, off, or a directory" help:"where ONNX Runtime's optimised graph of the CPU session and its prepacked weights are kept, so the next start with the same model version, graph rewrites, ONNX Runtime, session settings and CPU loads them instead of optimising the graph and packing the weights again (a warm start about 3x faster on a production-size model: 3 s instead of 9-11 s for the fp32 DeBERTa-v3-large stand-in on 2 cores; about twice the model's size on disk; per model path, the entries of the last version written, one per set of settings). Written in the background once the scorer is ready, at the lowest CPU priority (as much memory again as the model while it is written); a start checks an entry's owner and modes (see GRAPH_CACHE_TRUSTED), key, model version, sizes and checksums and otherwise ignores it, logging why. auto = scorer/graph-cache in the user's cache directory ($XDG_CACHE_HOME, else ~/.cache); off = optimise at every start"`
	GraphCacheTrusted bool   `env:"GRAPH_CACHE_TRUSTED" group:"model" help:"true = load GRAPH_CACHE's entries whoever wrote them and write them at the modes the umask leaves (a volume shared by pods of several UIDs through a group, each trusted with the graph and weights the others run); false = load only entries that no user but the scorer's own (or root) can have written (the folder, the entry and its files owned by the scorer's UID or root, writable by neither group nor others) and write them so (0755 folders, 0644 files): an entry's checksums are its own, so whoever can write it decides what the scorer runs"`
	GraphCacheWait    bool   `env:"GRAPH_CACHE_WAIT" group:"model" help:"true = scorer score waits for GRAPH_CACHE to be written before it exits, to fill a cache ahead of the starts that use it (an init job, make bench); false = a process that ends first leaves it unwritten (a short scorer score), and the next start writes it"`

	HypothesisTemplate string   `env:"HYPOTHESIS_TEMPLATE" envDefault:"This text is about {}." group:"labels" values:"text with exactly one {}" help:"hypothesis template; {} is replaced by each label"`
	Labels             []string `env:"LABELS" envSeparator:"," envDefault:"consumer strength,consumer weakness,reduced consumer's spending patterns" group:"labels" help:"comma-separated labels"`
	Threshold          float64  `env:"THRESHOLD" envDefault:"0.91" group:"labels" values:"0 to 1" help:"a sentence is flagged when its score is above this"`

	Device         string        `env:"DEVICE" envDefault:"auto" group:"devices" enum:"auto,cpu,cuda" help:"where to score: auto = every working GPU, else the CPU; cpu; cuda = GPUs only (start-up fails without one)"`
	GPUIDs         []string      `env:"GPU_IDS" envSeparator:"," group:"devices" values:"comma-separated CUDA indices or UUIDs" help:"GPUs to use; empty = all"`
	GPUMemFraction float64       `env:"GPU_MEM_FRACTION" envDefault:"0.8" group:"devices" values:"above 0, at most 1" help:"a GPU's used/total memory stays under this"`
	GPUMemLimit    string        `env:"GPU_MEM_LIMIT" envDefault:"0" group:"devices" values:"0, bytes (12GiB), or a fraction of the device (0.45)" help:"this process's memory budget on each GPU (arena cap and admission); 0 = GPU_MEM_FRACTION alone"`
	GPUTF32        bool          `env:"GPU_TF32" envDefault:"true" group:"devices" help:"let CUDA use TF32 tensor cores for float32 matrix products: 3.3x the fp32 pairs/s on an H200, scores within 2.2e-4 of the CPU's, no decision changed; false for bit-faithful comparisons (6e-7)"`
	GPUProbation   time.Duration `env:"GPU_PROBATION" envDefault:"5m" group:"devices" min:"1ns" help:"a degraded GPU is re-probed after this and rejoins when it passes"`
	CPUThreads     int           `env:"CPU_THREADS" group:"devices" min:"0" help:"ONNX Runtime intra-op threads per CPU worker; 0 = cores / workers"`
	Workers        int           `env:"WORKERS" group:"devices" min:"0" help:"workers per device; 0 = auto (CPU: one per core up to 4; GPU: 2)"`
	// GPUCalibrationCache keeps each GPU's memory calibration between
	// starts (gpupool.GPUCalibrationCache).
	GPUCalibrationCache string `env:"GPU_CALIBRATION_CACHE" envDefault:"auto" group:"devices" values:"auto, off, or a directory" help:"where each GPU's memory cost per batch measured at start is kept, so the next start with the same GPU (UUID), model, ONNX Runtime, precision, GPU settings and batch shapes skips measuring it (seconds on a production-size model): auto = scorer/gpu-calibration in the user's cache directory ($XDG_CACHE_HOME, else ~/.cache); off = measure at every start"`

	MetricsAddr          string        `env:"METRICS_ADDR" envDefault:":9464" group:"service" values:"host:port, or off" help:"address of /metrics, /healthz and /readyz; off = no HTTP server"`
	LivenessStallTimeout time.Duration `env:"LIVENESS_STALL_TIMEOUT" envDefault:"10m" group:"service" min:"0s" help:"/healthz fails when records are in flight and no inference batch, publish or dead letter happened for this long, or when one inference run, or one record's publish or dead letter (retried), goes on this long; a long transcript is none of these; 0 = off"`
	ShutdownTimeout      time.Duration `env:"SHUTDOWN_TIMEOUT" envDefault:"30s" group:"service" min:"1ns" help:"bound on the whole stop after SIGTERM: drain, final commit, leaving the group (allow about 10s more before SIGKILL; the Helm chart adds 15s)"`

	LogLevel  string `env:"LOG_LEVEL" envDefault:"info" group:"logging" values:"debug, info, warn, error" help:"least level logged"`
	LogFormat string `env:"LOG_FORMAT" envDefault:"auto" group:"logging" enum:"json,console,auto" help:"json, console, or auto (console on a terminal)"`
}

// defaultORTLib is the ONNX Runtime core `make` fetches, relative to the
// repository the binary is built in (bin/scorer → bin/..); the Makefile's
// ORT_VERSION names the same release.
const defaultORTLib = ".deps/ort-1.30.0/libonnxruntime.so.1"

// DefaultORTLib is ORT_LIB when it is unset: defaultORTLib resolved from
// the executable's folder (symlinks followed), as an absolute path, and
// never from the working directory: a library found there would run its
// code in this process, and whoever can write to the folder a scorer is
// started from is not whoever installed it. Images set ORT_LIB to their
// own absolute path. "" when the executable cannot be found (InitORT then
// says ORT_LIB is missing).
func DefaultORTLib() string {
	root := checkoutRoot()
	if root == "" {
		return ""
	}
	return filepath.Join(root, defaultORTLib)
}

// checkoutRoot is the folder above the scorer executable's (bin/..,
// symlinks followed), where `make` puts .deps; "" when the executable
// cannot be found.
func checkoutRoot() string {
	exe, err := os.Executable()
	if err != nil {
		return ""
	}
	if real, err := filepath.EvalSymlinks(exe); err == nil {
		exe = real
	}
	return filepath.Join(filepath.Dir(exe), "..")
}

// Validate checks every setting: what the enum and min tags say, and the
// ranges and combinations they cannot. Compare calls it again on each side
// after overriding the model. Every error is reported, joined.
func (c *Config) Validate() error {
	errs := append(c.tagErrors(), c.kafkaSecurityErrors()...)
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	check(c.InputTopic != "", "KAFKA_INPUT_TOPIC must not be empty")
	check(c.OutputTopic != "", "KAFKA_OUTPUT_TOPIC must not be empty")
	check(c.DLQTopic != "", "KAFKA_DLQ_TOPIC must not be empty")
	check(c.TopicReplication == -1 || c.TopicReplication >= 1, "KAFKA_TOPIC_REPLICATION_FACTOR must be -1 (the cluster's default) or at least 1, got %d", c.TopicReplication)
	// Syntax only: the limit itself is read from the cgroup at start.
	if _, _, err := c.CPUMemory(Host{Memory: MemoryLimit{Bytes: 1 << 50}}); err != nil {
		errs = append(errs, err)
	}
	if _, err := model.ParseAttentionRewrites(c.AttentionRewrites); err != nil {
		errs = append(errs, fmt.Errorf("ATTENTION_REWRITES: %w", err))
	}
	if _, err := gpupool.ParseMemLimit(c.GPUMemLimit); err != nil {
		errs = append(errs, fmt.Errorf("GPU_MEM_LIMIT: %w", err))
	}
	if _, _, err := c.PadMultiples(); err != nil {
		errs = append(errs, err)
	}
	check(c.ScoreCacheBytes == 0 || c.ScoreCacheBytes >= scorecache.MinBytes, "SCORE_CACHE_BYTES must be 0 (off) or at least %d", scorecache.MinBytes)
	check(c.GPUMemFraction > 0 && c.GPUMemFraction <= 1, "GPU_MEM_FRACTION must be in (0, 1]")
	check(strings.Count(c.HypothesisTemplate, "{}") == 1, "HYPOTHESIS_TEMPLATE must contain exactly one {}, got %q", c.HypothesisTemplate)
	check(c.Threshold >= 0 && c.Threshold <= 1, "THRESHOLD must be in [0, 1], got %v", c.Threshold)
	check(c.PairSeparator != "", "PAIR_SEPARATOR must not be empty")
	check(c.ModelFile == "" || filepath.IsLocal(c.ModelFile), "MODEL_FILE must be a path inside MODEL_DIR (relative, no leading /, no ..), got %q", c.ModelFile)
	check(len(c.Labels) > 0, "LABELS must not be empty")
	for _, l := range c.Labels {
		check(strings.TrimSpace(l) != "", "LABELS must not contain an empty label")
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	return nil
}

// kafkaSecurityErrors checks the KAFKA_TLS* and KAFKA_SASL* variables, which
// `scorer produce` shares with `scorer run`. A TLS setting without
// KAFKA_TLS=true is an error rather than an implied TLS: the client would
// otherwise speak plaintext to a TLS listener and retry forever.
func (c *Config) kafkaSecurityErrors() []error {
	var errs []error
	switch strings.ToUpper(c.SASLMechanism) {
	case "", "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512":
	default:
		errs = append(errs, fmt.Errorf("KAFKA_SASL_MECHANISM must be PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512, got %q", c.SASLMechanism))
	}
	if (c.KafkaTLSCertFile == "") != (c.KafkaTLSKeyFile == "") {
		errs = append(errs, errors.New("KAFKA_TLS_CERT_FILE and KAFKA_TLS_KEY_FILE go together"))
	}
	if !c.KafkaTLS {
		var set []string
		for name, on := range map[string]bool{
			"KAFKA_TLS_CA_FILE": c.KafkaTLSCAFile != "", "KAFKA_TLS_CERT_FILE": c.KafkaTLSCertFile != "",
			"KAFKA_TLS_KEY_FILE": c.KafkaTLSKeyFile != "", "KAFKA_TLS_INSECURE_SKIP_VERIFY": c.KafkaTLSInsecure,
		} {
			if on {
				set = append(set, name)
			}
		}
		if len(set) > 0 {
			slices.Sort(set)
			errs = append(errs, fmt.Errorf("%s given without KAFKA_TLS: set KAFKA_TLS=true to connect with TLS", strings.Join(set, ", ")))
		}
	}
	return errs
}

// envError names the environment variable behind each parse failure; the
// env library reports Go field names, which mean nothing to an operator.
func envError(err error) error {
	var agg env.AggregateError
	if !errors.As(err, &agg) {
		return fmt.Errorf("config: %w", err)
	}
	t := reflect.TypeFor[Config]()
	var errs []error
	for _, e := range agg.Errors {
		var pe env.ParseError
		if errors.As(e, &pe) {
			if f, ok := t.FieldByName(pe.Name); ok {
				name, _, _ := strings.Cut(f.Tag.Get("env"), ",")
				errs = append(errs, fmt.Errorf("%s: %w", name, pe.Err))
				continue
			}
		}
		errs = append(errs, e)
	}
	return fmt.Errorf("config: %w", errors.Join(errs...))
}

// fieldValue adapts one Config field to flag.Value.
type fieldValue struct {
	v      reflect.Value
	sep    string
	secret bool
}

func (f *fieldValue) String() string {
	if f.v == (reflect.Value{}) {
		return ""
	}
	if f.secret && !f.v.IsZero() {
		return "<redacted>"
	}
	if f.v.Kind() == reflect.Slice {
		parts := make([]string, f.v.Len())
		for i := range parts {
			parts[i] = fmt.Sprint(f.v.Index(i).Interface())
		}
		return strings.Join(parts, f.sep)
	}
	return fmt.Sprint(f.v.Interface())
}

func (f *fieldValue) Set(s string) error {
	switch f.v.Interface().(type) {
	case string:
		f.v.SetString(s)
	case bool:
		b, err := strconv.ParseBool(s)
		if err != nil {
			return err
		}
		f.v.SetBool(b)
	case int:
		n, err := strconv.Atoi(s)
		if err != nil {
			return err
		}
		f.v.SetInt(int64(n))
	case float64:
		x, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return err
		}
		f.v.SetFloat(x)
	case time.Duration:
		d, err := time.ParseDuration(s)
		if err != nil {
			return err
		}
		f.v.SetInt(int64(d))
	case []string:
		f.v.Set(reflect.ValueOf(SplitList(s, f.sep)))
	case []int:
		var ns []int
		for _, p := range SplitList(s, f.sep) {
			n, err := strconv.Atoi(p)
			if err != nil {
				return err
			}
			ns = append(ns, n)
		}
		f.v.Set(reflect.ValueOf(ns))
	default:
		return fmt.Errorf("unsupported flag type %s", f.v.Type())
	}
	return nil
}

// IsBoolFlag lets boolean flags be given without a value.
func (f *fieldValue) IsBoolFlag() bool { return f.v.Kind() == reflect.Bool }
