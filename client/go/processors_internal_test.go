package samplerd

import (
	"encoding/binary"
	"math"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"samplerd.dev/client/go/samplerdv1"
)

// buildRequest applies opts to an inline fp32 tensor [batch, vocab] of zeros.
func buildRequest(batch, vocab int, opts ...SampleOption) (*samplerdv1.SampleRequest, error) {
	t, err := FP32Tensor(make([]float32, batch*vocab), batch, vocab)
	if err != nil {
		return nil, err
	}
	return NewRequest(t, opts...)
}

func mustRequest(t *testing.T, batch, vocab int, opts ...SampleOption) *samplerdv1.SampleRequest {
	t.Helper()
	req, err := buildRequest(batch, vocab, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

func wantInvalid(t *testing.T, err error, message string) {
	t.Helper()
	e, ok := err.(*Error)
	if !ok || e.Code != codes.InvalidArgument || e.Message != message {
		t.Fatalf("got %v, want INVALID_ARGUMENT %q", err, message)
	}
}

func TestNoProcessorsSendNone(t *testing.T) {
	req := mustRequest(t, 2, 40, Temperature(0))
	if req.TokenBitmask != nil || req.LogitBias != nil || req.TokenHistory != nil {
		t.Errorf("got processors %v %v %v, want none", req.TokenBitmask, req.LogitBias, req.TokenHistory)
	}
	if req.Params[0].RepetitionPenalty != nil {
		t.Errorf("repetition_penalty sent: %v", req.Params[0])
	}
}

func TestTokenBitmaskWordsTravelInlineLittleEndian(t *testing.T) {
	words := []int32{1, -1, 0x10, 0}
	for _, opt := range []SampleOption{TokenBitmask(words), TokenBitmaskRows([][]int32{words[:2], words[2:]})} {
		data := mustRequest(t, 2, 40, opt).GetTokenBitmask().GetInlineWords()
		if len(data) != 16 {
			t.Fatalf("got %d bytes, want 16", len(data))
		}
		for i, w := range words {
			if got := int32(binary.LittleEndian.Uint32(data[4*i:])); got != w {
				t.Errorf("word %d: got %d, want %d", i, got, w)
			}
		}
	}
}

func TestTokenBitmaskWithWrongWordCountIsRefusedBeforeSending(t *testing.T) {
	_, err := buildRequest(2, 40, TokenBitmask(make([]int32, 3)))
	wantInvalid(t, err, "expected a token bitmask of B * ceil(V / 32) = 2 * 2 words, got 3")
	_, err = buildRequest(2, 40, TokenBitmaskRows([][]int32{{1, 2}}))
	wantInvalid(t, err, "expected a token bitmask of B = 2 rows, got 1")
	_, err = buildRequest(2, 40, TokenBitmaskRows([][]int32{{1, 2}, {3}}))
	wantInvalid(t, err, "expected ceil(V / 32) = 2 bitmask words in row 1, got 1")
}

func TestTokenBitmaskRegionNamesTheSlice(t *testing.T) {
	got := mustRequest(t, 2, 40, TokenBitmaskRegion("masks", 64)).GetTokenBitmask().GetRegion()
	if !proto.Equal(got, &samplerdv1.RegionSlice{Region: "masks", Offset: 64}) {
		t.Errorf("got %v", got)
	}
}

func TestLogitBiasIsPackedPerRowInTokenOrder(t *testing.T) {
	inf := float32(math.Inf(1))
	all := mustRequest(t, 2, 40, LogitBias(map[int32]float32{7: inf, 5: -1})).GetLogitBias()
	want := &samplerdv1.LogitBias{RowOffsets: []uint32{0, 2, 4}, TokenIds: []int32{5, 7, 5, 7},
		Biases: []float32{-1, inf, -1, inf}}
	if !proto.Equal(all, want) {
		t.Errorf("one map: got %v, want %v", all, want)
	}
	rows := mustRequest(t, 3, 40, LogitBiasRows([]map[int32]float32{{1: 0.5}, nil, {3: -3, 2: 2}})).GetLogitBias()
	want = &samplerdv1.LogitBias{RowOffsets: []uint32{0, 1, 1, 3}, TokenIds: []int32{1, 2, 3},
		Biases: []float32{0.5, 2, -3}}
	if !proto.Equal(rows, want) {
		t.Errorf("per row: got %v, want %v", rows, want)
	}
	_, err := buildRequest(2, 40, LogitBiasRows([]map[int32]float32{{1: 1}}))
	wantInvalid(t, err, "expected logit bias for B = 2 rows, got 1")
}

func TestTokenHistoryHoldsDistinctTokensWithOutputCountsAndPromptFlags(t *testing.T) {
	req := mustRequest(t, 3, 40, RepetitionPenalty(1.2),
		TokenHistory([][]int32{{1, 2}, nil, {5}}, [][]int32{{2, 2, 3}, {8}, nil}))
	want := &samplerdv1.TokenHistory{RowOffsets: []uint32{0, 3, 4, 5}, TokenIds: []int32{1, 2, 3, 8, 5},
		OutputCounts: []uint32{0, 2, 1, 1, 0}, InPrompt: []bool{true, true, false, false, true}}
	if !proto.Equal(req.TokenHistory, want) {
		t.Errorf("got %v, want %v", req.TokenHistory, want)
	}
	outputsOnly := mustRequest(t, 1, 40, TokenHistory(nil, [][]int32{{4, 4}})).TokenHistory
	want = &samplerdv1.TokenHistory{RowOffsets: []uint32{0, 1}, TokenIds: []int32{4},
		OutputCounts: []uint32{2}, InPrompt: []bool{false}}
	if !proto.Equal(outputsOnly, want) {
		t.Errorf("outputs only: got %v, want %v", outputsOnly, want)
	}
	_, err := buildRequest(2, 40, TokenHistory([][]int32{{1}}, nil))
	wantInvalid(t, err, "expected prompt token ids for B = 2 rows, got 1")
}

func TestPenaltiesAreSamplingParams(t *testing.T) {
	scalar := buildParams(t, 4, RepetitionPenalty(1.3), FrequencyPenalty(0.5))
	want := &samplerdv1.SamplingParams{RepetitionPenalty: proto.Float32(1.3), FrequencyPenalty: 0.5}
	if len(scalar) != 1 || !proto.Equal(scalar[0], want) {
		t.Errorf("scalar: got %v, want [%v]", scalar, want)
	}
	rows := buildParams(t, 3, PresencePenalty(0, 1, -1))
	for i, p := range rows {
		if p.PresencePenalty != []float32{0, 1, -1}[i] || p.RepetitionPenalty != nil {
			t.Errorf("row %d: got %v", i, p)
		}
	}
	var cfg sampleConfig
	RepetitionPenalty(1, 2)(&cfg)
	if _, err := cfg.params(3); err == nil {
		t.Error("2 repetition penalties for 3 rows were accepted")
	}
}
