package samplerd

import "samplerd.dev/client/go/samplerdv1"

// RowStatus is the outcome of one row.
type RowStatus = samplerdv1.RowStatus

const (
	// RowOK means a token was sampled.
	RowOK = samplerdv1.RowStatus_ROW_STATUS_OK
	// RowInvalidNaN means the row holds a NaN logit; its token is -1.
	RowInvalidNaN = samplerdv1.RowStatus_ROW_STATUS_INVALID_NAN
	// RowInvalidNoFinite means every logit of the row is -inf; its token is -1.
	RowInvalidNoFinite = samplerdv1.RowStatus_ROW_STATUS_INVALID_NO_FINITE
	// RowInvalidNoAllowed means some logit of the row is above -inf but none is left after the
	// logits processors (TokenBitmask, LogitBias); its token is -1.
	RowInvalidNoAllowed = samplerdv1.RowStatus_ROW_STATUS_INVALID_NO_ALLOWED
)

// Result is the answer to one sample call or session step.
type Result struct {
	// Tokens holds B token ids in [0, V), or -1 for a row whose status is not RowOK.
	Tokens []int32
	// RowStatus holds B row statuses. A bad row never disturbs the others.
	RowStatus []RowStatus
	// Seeds holds the seed each row was sampled with (given, or chosen by the server): pass
	// them back with Seed to replay the draw.
	Seeds []uint64
	// Logprobs holds B entries when Logprobs was given, else nil.
	Logprobs []*samplerdv1.RowLogprobs
	// RequestID echoes RequestID.
	RequestID string
	// Timings are server-side durations, for diagnosis.
	Timings *samplerdv1.Timings
	// Response is the raw response message.
	Response *samplerdv1.SampleResponse
}

// newResult wraps a response (the slices are shared with it, not copied).
func newResult(r *samplerdv1.SampleResponse) *Result {
	return &Result{
		Tokens:    r.GetTokenIds(),
		RowStatus: r.GetRowStatus(),
		Seeds:     r.GetSeeds(),
		Logprobs:  r.GetLogprobs(),
		RequestID: r.GetRequestId(),
		Timings:   r.GetTimings(),
		Response:  r,
	}
}
