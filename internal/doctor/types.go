package doctor

import (
	"strings"
	"time"

	"github.com/scorer/scorer/model/ortenv"
)

// Problem is a diagnosed failure: one line of cause, one of remedy.
type Problem struct {
	Kind   string `json:"kind,omitempty"`
	Cause  string `json:"cause"`
	Remedy string `json:"remedy,omitempty"`
	Error  string `json:"error,omitempty"`
}

func problemOf(err error) *Problem {
	if err == nil {
		return nil
	}
	if p, ok := ortenv.DiagnoseCUDA(err); ok {
		return &Problem{Kind: p.Kind, Cause: p.Cause, Remedy: p.Remedy, Error: err.Error()}
	}
	return &Problem{Cause: firstLine(err.Error()), Error: err.Error()}
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}

// Report is the doctor's finding; JSON field names are stable.
type Report struct {
	// Device is the configured DEVICE, OK whether it works as configured
	// here, and Path where scoring would run: "cuda" or "cpu".
	Device string `json:"device"`
	OK     bool   `json:"ok"`
	Path   string `json:"path"`
	// Verdict is one line; Problem is why not OK (or, when OK on the CPU
	// under auto, why there is no GPU).
	Verdict string   `json:"verdict"`
	Problem *Problem `json:"problem,omitempty"`

	ORT ORTReport `json:"onnxruntime"`
	// CUDALibs is where the dynamic loader finds each CUDA library the
	// CUDA path needs (ortenv.CUDALibraries), cuDNN included: the
	// provider opens cuDNN only at a first run, so a session that opens
	// does not prove it is there. Not checked for DEVICE=cpu.
	CUDALibs []ortenv.LibraryLocation `json:"cuda_libraries,omitempty"`
	// SignalsRestored counts the signal handlers that loading CUDA replaced
	// and the doctor put back (ortenv.SaveSignals, taken before anything
	// touched CUDA); nonzero shows why the guard exists.
	SignalsRestored int `json:"signal_handlers_restored"`

	NVML      NVMLReport       `json:"nvml"`
	CPU       *DeviceCheck     `json:"cpu,omitempty"`
	GPUs      []DeviceCheck    `json:"gpus,omitempty"`
	Recommend Recommendation   `json:"recommend"`
	Sample    SampleDescriptor `json:"sample"`
	// Skipped lists what the budget or the graph left out, each with why;
	// Seconds is how long the doctor took, Budget what it aimed for.
	Skipped []string `json:"skipped,omitempty"`
	Seconds float64  `json:"seconds"`
	Budget  float64  `json:"budget_seconds"`
}

// ORTReport is what the ONNX Runtime library offers.
type ORTReport struct {
	Library   string   `json:"library"`
	Version   string   `json:"version"`
	Providers []string `json:"providers"`
	// CUDA is nil when the CUDA provider loads with its libraries, the
	// CUDA runtime and the driver; else why not.
	CUDA *Problem `json:"cuda_problem,omitempty"`
}

// NVMLReport is what the driver says.
type NVMLReport struct {
	Available         bool     `json:"available"`
	Problem           *Problem `json:"problem,omitempty"`
	DriverVersion     string   `json:"driver_version,omitempty"`
	CUDADriverVersion int      `json:"cuda_driver_version,omitempty"`
	// CUDAVisibleDevices and CUDADeviceOrder are the variables as set
	// ("(unset)" otherwise); GPUs lists the devices CUDA will see, each
	// under its CUDA ordinal with the NVML index it maps to.
	CUDAVisibleDevices string    `json:"cuda_visible_devices"`
	CUDADeviceOrder    string    `json:"cuda_device_order"`
	GPUs               []GPUInfo `json:"gpus,omitempty"`
	Warnings           []string  `json:"warnings,omitempty"`
}

// GPUInfo is one GPU (or MIG instance) as CUDA will number it.
type GPUInfo struct {
	CUDAIndex   int    `json:"cuda_index"`
	NVMLIndex   int    `json:"nvml_index"`
	UUID        string `json:"uuid"`
	Name        string `json:"name"`
	TotalMemory uint64 `json:"total_memory_bytes"`
	PCIBusID    string `json:"pci_bus_id,omitempty"`
	MIG         bool   `json:"mig,omitempty"`
}

// DeviceCheck is one device's session, parity, memory model and speed.
type DeviceCheck struct {
	Device  string   `json:"device"`
	UUID    string   `json:"uuid,omitempty"`
	OK      bool     `json:"ok"`
	Problem *Problem `json:"problem,omitempty"`
	// Skipped is why this device was not checked at all (the CPU as a
	// parity reference, when the budget was spent on the GPUs).
	Skipped string `json:"skipped,omitempty"`
	// SamplePairs is how many of the sample's pairs this device scored
	// (all of them unless the budget cut it); parity is over the pairs
	// both devices scored.
	SamplePairs int `json:"sample_pairs"`
	// MaxAbsDelta is the largest |p_gpu − p_cpu| over the sample and
	// Agreement the share of pairs on the same side of THRESHOLD (GPU
	// only); TF32MaxAbsDelta is the same delta with TF32 on (or off, when
	// GPU_TF32 is on): what the setting costs in fidelity.
	MaxAbsDelta     *float64 `json:"max_abs_delta,omitempty"`
	Agreement       *float64 `json:"agreement,omitempty"`
	TF32MaxAbsDelta *float64 `json:"tf32_max_abs_delta,omitempty"`
	// Memory is the calibrated model (GPU only).
	Memory *MemoryModel `json:"memory,omitempty"`
	// MaxBatchTokens and MaxBatchRows are the batch caps the pool planned
	// under, Workers its workers on this device and IntraOpThreads each
	// CPU worker's threads: the service's own, from the same settings.
	MaxBatchTokens int `json:"max_batch_tokens,omitempty"`
	MaxBatchRows   int `json:"max_batch_rows,omitempty"`
	Workers        int `json:"workers,omitempty"`
	IntraOpThreads int `json:"intra_op_threads,omitempty"`
	// PairsPerSecond is the throughput of the short run, with its batch
	// shapes.
	PairsPerSecond float64 `json:"pairs_per_second"`
	Batches        uint64  `json:"batches"`
	MeanBatchRows  float64 `json:"mean_batch_rows"`
	Padding        float64 `json:"padding_efficiency"`

	// scores and tf32Scores are the sample's scores, for parity with the
	// CPU's once it has run; opening is how long opening its pool took.
	scores, tf32Scores []float32
	opening            time.Duration
}

// MemoryModel is the pool's gpupool.MemoryModel as the report shows it: the
// calibrated bytes ≈ base + perRow·rows + perToken·rows·len +
// perTokenLen·rows·len² with the fit's held-out error, what admission
// counts beside the weights and the arena, the arena cap, and how many rows
// of the model's longest pairs the planner lets one batch have on an
// otherwise idle GPU (MaxRows in the model's Room of its budget).
type MemoryModel struct {
	BaseBytes           float64 `json:"base_bytes"`
	PerRowBytes         float64 `json:"per_row_bytes"`
	PerTokenBytes       float64 `json:"per_token_bytes"`
	PerTokenLenBytes    float64 `json:"per_token_len_bytes"`
	HeldOutError        float64 `json:"held_out_error"`
	WeightBytes         uint64  `json:"weight_bytes"`
	BesideArenaBytes    float64 `json:"beside_arena_bytes"`
	BesideArenaMeasured bool    `json:"beside_arena_measured"`
	ArenaLimitBytes     uint64  `json:"arena_limit_bytes"`
	MaxRowsAtModelMax   int     `json:"max_rows_at_max_length"`
}

// Recommendation is the settings the doctor suggests for this host.
type Recommendation struct {
	Device         string `json:"DEVICE"`
	MaxBatchTokens int    `json:"MAX_BATCH_TOKENS"`
	Workers        int    `json:"WORKERS"`
	CPUThreads     int    `json:"CPU_THREADS,omitempty"`
	GPUMemLimit    string `json:"GPU_MEM_LIMIT"`
	Note           string `json:"note,omitempty"`
}

// SampleDescriptor says what the parity and throughput runs scored.
type SampleDescriptor struct {
	Pairs     int     `json:"pairs"`
	Threshold float64 `json:"threshold"`
	// PairEncoding is PAIR_ENCODING: the sample is encoded as the service
	// would encode it.
	PairEncoding string `json:"pair_encoding"`
}
