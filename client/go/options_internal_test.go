package samplerd

import (
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"samplerd.dev/client/go/samplerdv1"
)

// buildParams applies opts and returns the request's params for batch rows.
func buildParams(t *testing.T, batch int, opts ...SampleOption) []*samplerdv1.SamplingParams {
	t.Helper()
	var cfg sampleConfig
	for _, opt := range opts {
		opt(&cfg)
	}
	params, err := cfg.params(batch)
	if err != nil {
		t.Fatal(err)
	}
	return params
}

func TestNoParametersSendNoParams(t *testing.T) {
	if got := buildParams(t, 4, RequestID("x")); got != nil {
		t.Errorf("got %v, want none (the server's defaults)", got)
	}
}

func TestScalarParametersSendOneEntryWithOnlyTheGivenFields(t *testing.T) {
	got := buildParams(t, 4, Temperature(0.5), TopK(50), Seed(3))
	want := []*samplerdv1.SamplingParams{{Temperature: proto.Float32(0.5), TopK: 50, Seed: proto.Uint64(3)}}
	if len(got) != 1 || !proto.Equal(got[0], want[0]) {
		t.Errorf("got %v, want %v (top_p unset: the server's default 1)", got, want)
	}
}

func TestPerRowParametersSendOneEntryPerRow(t *testing.T) {
	got := buildParams(t, 3, Temperature(0.7), TopP(0.5, 0.6, 0.7), Position(1, 2, 3), JointTopP())
	if len(got) != 3 {
		t.Fatalf("got %d entries, want 3", len(got))
	}
	for i, p := range got {
		want := &samplerdv1.SamplingParams{
			Temperature: proto.Float32(0.7), TopP: proto.Float32([]float32{0.5, 0.6, 0.7}[i]),
			Position: uint64(i + 1), TopPMode: samplerdv1.TopPMode_TOP_P_MODE_JOINT,
		}
		if !proto.Equal(p, want) {
			t.Errorf("row %d: got %v, want %v", i, p, want)
		}
	}
}

func TestParamsDoNotAliasTheCallersSlices(t *testing.T) {
	seeds := []uint64{1, 2}
	got := buildParams(t, 2, Seed(seeds...))
	seeds[0] = 100
	if got[0].GetSeed() != 1 {
		t.Errorf("seed of row 0 followed the caller's slice: %d", got[0].GetSeed())
	}
}

// A per-row option given with no values (say Temperature(temps...) with an empty temps) is an
// error, as it is in the Python client, rather than the server's default for every row.
func TestPerRowOptionWithNoValuesIsInvalidArgument(t *testing.T) {
	for _, c := range []struct {
		name string
		opt  SampleOption
	}{
		{"temperature", Temperature()}, {"top_k", TopK([]int32{}...)}, {"top_p", TopP()},
		{"min_p", MinP()}, {"seed", Seed([]uint64(nil)...)}, {"position", Position()},
		{"repetition_penalty", RepetitionPenalty()}, {"presence_penalty", PresencePenalty()},
		{"frequency_penalty", FrequencyPenalty()},
	} {
		var cfg sampleConfig
		c.opt(&cfg)
		_, err := cfg.params(2)
		want := "expected " + c.name + " with 1 value (all rows) or B = 2 values, got 0"
		if e, ok := err.(*Error); !ok || e.Code != codes.InvalidArgument || e.Message != want {
			t.Errorf("%s(): got %v, want InvalidArgument %q", c.name, err, want)
		}
	}
}
