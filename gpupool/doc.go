// Package gpupool runs NLI inference over a pool of devices: every GPU that
// NVML lists and whose CUDA engine opens, or the CPU when there is none.
//
// A call to (*Pool).ScorePairs is planned first: its pairs are sorted by
// length and packed into batches under a token budget (rows × padded length),
// with fewer rows for long pairs where a GPU's memory model says so, so
// padding stays small and long batches fit. Batches go into one bounded
// queue; each device has one or more workers that pull a batch only when
// idle, so an idle pool adds no delay and a faster device naturally takes
// more work. Before a batch runs on a GPU it passes admission: its calibrated
// estimate (a + d·rows + b·rows·len + c·rows·len², measured at the
// planner's shapes at start) must fit the device's free memory plus
// headroom, its memory fraction, and this process's own budget (GPUMemLimit,
// so several processes can share a GPU) beside its weights and what CUDA
// itself holds, measured once every worker has run.
// Failures split the batch and retry; a device that keeps failing is marked
// degraded and its work moves elsewhere, with the CPU as the last resort
// in ModeAuto (never in ModeCUDA, which means GPUs only), until a re-probe
// after its probation brings it back. Every batch either
// completes or fails its call loudly. ortenv.DiagnoseCUDA (model/ortenv) turns
// the ways CUDA fails to start into one cause and one remedy each.
//
// The package knows nothing about Kafka; it depends only on package model
// for pairs and sessions.
package gpupool
