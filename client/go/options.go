package samplerd

import (
	"google.golang.org/protobuf/proto"

	"samplerd.dev/client/go/samplerdv1"
)

// SampleOption sets sampling parameters or other fields of one request (see Client.Sample).
//
// The per-row parameters (Temperature, TopK, TopP, MinP, Seed, Position and the penalties of
// processors.go: RepetitionPenalty, PresencePenalty, FrequencyPenalty) take one value for
// every row, or B values, one per row (pass a slice with "..."; no values is INVALID_ARGUMENT).
// Parameters not given keep the server's defaults: temperature 1, no top-k / top-p / min-p
// filter, a server-chosen seed (returned in Result.Seeds) and position 0.
type SampleOption func(*sampleConfig)

// sampleConfig collects the options of one request. Per-row slices are the caller's own:
// they are read, never kept, by the request being built.
type sampleConfig struct {
	temperature []float32
	topK        []int32
	topP        []float32
	minP        []float32
	seed        []uint64
	position    []uint64
	jointTopP   bool
	logprobs    *samplerdv1.LogprobOptions
	requestID   string
	device      string
	processorConfig
}

// Temperature sets T >= 0; 0 <= T < 1e-5 is greedy (argmax, lowest index wins).
func Temperature(t ...float32) SampleOption {
	return func(c *sampleConfig) { c.temperature = given(t) }
}

// TopK keeps the tokens whose logit is >= the k-th largest (ties kept); 0 or -1 disables.
func TopK(k ...int32) SampleOption { return func(c *sampleConfig) { c.topK = given(k) } }

// TopP keeps the smallest most-probable set whose mass reaches p, in (0, 1]; 1 disables.
func TopP(p ...float32) SampleOption { return func(c *sampleConfig) { c.topP = given(p) } }

// MinP keeps the tokens whose probability is >= p times the largest, p in [0, 1]; 0 disables.
func MinP(p ...float32) SampleOption { return func(c *sampleConfig) { c.minP = given(p) } }

// Seed sets the seed of each row's random stream. The same (seed, position, logits,
// parameters) always gives the same token.
func Seed(s ...uint64) SampleOption { return func(c *sampleConfig) { c.seed = given(s) } }

// Position sets the position of the draw in each row's stream, e.g. the number of tokens the
// sequence has generated so far.
func Position(p ...uint64) SampleOption { return func(c *sampleConfig) { c.position = given(p) } }

// JointTopP compares top-p with the full row's mass (aiter, SGLang, FlashInfer "joint")
// instead of the mass left after min-p and top-k (vLLM's semantics, the default).
func JointTopP() SampleOption { return func(c *sampleConfig) { c.jointTopP = true } }

// LogprobSource says which distribution Logprobs reports.
type LogprobSource = samplerdv1.LogprobSource

const (
	// LogprobsRaw is log_softmax of the raw logits, before temperature and filters.
	LogprobsRaw = samplerdv1.LogprobSource_LOGPROB_SOURCE_RAW
	// LogprobsProcessed is the distribution the token was drawn from (after temperature and
	// filters, renormalised).
	LogprobsProcessed = samplerdv1.LogprobSource_LOGPROB_SOURCE_PROCESSED
)

// Logprobs asks for the sampled token's logprob and rank and the topN most probable tokens of
// each row (topN in [0, Limits.max_top_logprobs]), from source; see Result.Logprobs.
func Logprobs(topN uint32, source LogprobSource) SampleOption {
	return func(c *sampleConfig) {
		c.logprobs = &samplerdv1.LogprobOptions{TopN: topN, Source: source}
	}
}

// RequestID sets an opaque id (at most 256 bytes) echoed in Result.RequestID and server logs.
func RequestID(id string) SampleOption { return func(c *sampleConfig) { c.requestID = id } }

// Device picks the device to sample on, by PCI bus id or UUID as ServerInfo lists it. Default:
// the region's device, else the server's first.
func Device(id string) SampleOption { return func(c *sampleConfig) { c.device = id } }

// params builds the request's SamplingParams for batch rows: none when no per-row parameter
// was given (the server's defaults), one entry when every parameter has one value, else batch
// entries. Returns INVALID_ARGUMENT when a parameter has neither 1 nor batch values.
func (c *sampleConfig) params(batch int) ([]*samplerdv1.SamplingParams, error) {
	counts := []struct {
		name  string
		given bool
		n     int
	}{
		{"temperature", c.temperature != nil, len(c.temperature)},
		{"top_k", c.topK != nil, len(c.topK)},
		{"top_p", c.topP != nil, len(c.topP)},
		{"min_p", c.minP != nil, len(c.minP)},
		{"seed", c.seed != nil, len(c.seed)},
		{"position", c.position != nil, len(c.position)},
		{"repetition_penalty", c.repetition != nil, len(c.repetition)},
		{"presence_penalty", c.presence != nil, len(c.presence)},
		{"frequency_penalty", c.frequency != nil, len(c.frequency)},
	}
	rows := 0
	for _, p := range counts {
		if p.given && p.n != 1 && p.n != batch {
			return nil, invalidArgument("expected %s with 1 value (all rows) or B = %d values, got %d",
				p.name, batch, p.n)
		}
		if p.n > rows {
			rows = p.n
		}
	}
	if rows == 0 && !c.jointTopP {
		return nil, nil
	}
	if rows == 0 {
		rows = 1
	}
	out := make([]*samplerdv1.SamplingParams, rows)
	for i := range out {
		p := &samplerdv1.SamplingParams{}
		if len(c.temperature) > 0 {
			p.Temperature = proto.Float32(c.temperature[pick(len(c.temperature), i)])
		}
		if len(c.topK) > 0 {
			p.TopK = c.topK[pick(len(c.topK), i)]
		}
		if len(c.topP) > 0 {
			p.TopP = proto.Float32(c.topP[pick(len(c.topP), i)])
		}
		if len(c.minP) > 0 {
			p.MinP = c.minP[pick(len(c.minP), i)]
		}
		if len(c.seed) > 0 {
			p.Seed = proto.Uint64(c.seed[pick(len(c.seed), i)])
		}
		if len(c.position) > 0 {
			p.Position = c.position[pick(len(c.position), i)]
		}
		if len(c.repetition) > 0 {
			p.RepetitionPenalty = proto.Float32(c.repetition[pick(len(c.repetition), i)])
		}
		if len(c.presence) > 0 {
			p.PresencePenalty = c.presence[pick(len(c.presence), i)]
		}
		if len(c.frequency) > 0 {
			p.FrequencyPenalty = c.frequency[pick(len(c.frequency), i)]
		}
		if c.jointTopP {
			p.TopPMode = samplerdv1.TopPMode_TOP_P_MODE_JOINT
		}
		out[i] = p
	}
	return out, nil
}

// given marks a per-row option as given, also with no values (e.g. Temperature(temps...) with
// an empty temps): a non-nil slice, which params refuses unless it holds 1 or B values, rather
// than silently sampling with the server's default.
func given[T any](values []T) []T {
	if values == nil {
		return []T{}
	}
	return values
}

// pick is the index of row i in a parameter with n values (1: shared by every row).
func pick(n, i int) int {
	if n == 1 {
		return 0
	}
	return i
}
