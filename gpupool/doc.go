// Package gpupool runs NLI inference over a pool of devices: every GPU that
// NVML lists and whose CUDA engine opens, or the CPU when there is none.
//
// A call to (*Pool).ScorePairs is planned first: its pairs are sorted by
// length and packed into batches under a token budget (rows × padded length),
// so padding stays small. Batches go into one bounded queue; each device has
// one or more workers that pull a batch only when idle, so an idle pool adds
// no delay and a faster device naturally takes more work. Before a batch runs
// on a GPU it passes admission: NVML must show enough free memory for the
// batch's calibrated estimate plus headroom, and the device must stay under
// its memory fraction. Failures split the batch and retry; a device that keeps
// failing is marked degraded and its work moves elsewhere, with the CPU as the
// last resort. Every batch either completes or fails its call loudly.
//
// The package knows nothing about Kafka; it depends only on package model
// for pairs and sessions.
package gpupool
