package samplerd

import (
	"bytes"
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
	// A longer output would otherwise be cut to B rows without a word.
	_, err = buildRequest(2, 40, TokenHistory([][]int32{{1}, {2}}, [][]int32{{1}, {2}, {3}}))
	wantInvalid(t, err, "expected output token ids for B = 2 rows, got 3")
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

// le returns the little-endian bytes of 4-byte words followed by single bytes: the layouts of
// processors.proto's LogitBias.region and TokenHistory.region, spelled out by hand.
func le(words []uint32, tail ...byte) []byte {
	out := []byte{}
	for _, w := range words {
		out = append(out, byte(w), byte(w>>8), byte(w>>16), byte(w>>24))
	}
	return append(out, tail...)
}

func TestPackLogitBiasLaysOutOffsetsIdsAndBiases(t *testing.T) {
	ninf := float32(math.Inf(-1))
	got := PackLogitBias([]map[int32]float32{{1: 0.5}, nil, {300: -3, 2: 2, 7: ninf}, {}})
	want := []byte{
		0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 4, 0, 0, 0, 4, 0, 0, 0, // row_offsets 0 1 1 4 4
		1, 0, 0, 0, 2, 0, 0, 0, 7, 0, 0, 0, 0x2c, 1, 0, 0, // token_ids 1 2 7 300
		0, 0, 0, 0x3f, 0, 0, 0, 0x40, 0, 0, 0x80, 0xff, 0, 0, 0x40, 0xc0, // 0.5 2 -inf -3
	}
	if !bytes.Equal(got, want) {
		t.Errorf("got  % x\nwant % x", got, want)
	}
	if got := PackLogitBias(nil); !bytes.Equal(got, le([]uint32{0})) {
		t.Errorf("no rows: got % x, want the single offset 0", got)
	}
	if got := PackLogitBias([]map[int32]float32{nil, nil}); !bytes.Equal(got, le([]uint32{0, 0, 0})) {
		t.Errorf("two empty rows: got % x", got)
	}
}

func TestPackTokenHistoryLaysOutDistinctTokensCountsAndPromptFlags(t *testing.T) {
	// Row 0: 2 twice in the prompt and twice in the output; row 1 empty; row 2 prompt only.
	got, err := PackTokenHistory([][]int32{{2, 1, 2}, nil, {5, 5}}, [][]int32{{2, 3, 2}, {}, nil})
	if err != nil {
		t.Fatal(err)
	}
	want := le([]uint32{
		0, 3, 3, 4, // row_offsets
		1, 2, 3, 5, // token_ids
		0, 2, 1, 0, // output_counts
	}, 1, 1, 0, 1) // in_prompt
	if len(got) != (4+2*4)*4+4 || !bytes.Equal(got, want) {
		t.Errorf("got  % x\nwant % x", got, want)
	}
	outputsOnly, err := PackTokenHistory(nil, [][]int32{{9, 9, 9}})
	if err != nil {
		t.Fatal(err)
	}
	if want := le([]uint32{0, 1, 9, 3}, 0); !bytes.Equal(outputsOnly, want) {
		t.Errorf("outputs only: got % x, want % x", outputsOnly, want)
	}
	_, err = PackTokenHistory([][]int32{{1}}, [][]int32{{1}, {2}})
	wantInvalid(t, err, "expected prompt and output token ids for the same number of rows, got 1 and 2")
}

func TestPackedListsAreTheInlineListsOfTheSameInputs(t *testing.T) {
	rows := []map[int32]float32{{4: 1, 3: -1}, nil, {0: 0.25}}
	inline := mustRequest(t, 3, 40, LogitBiasRows(rows)).GetLogitBias()
	if got, want := PackLogitBias(rows), packLogitBias(inline); !bytes.Equal(got, want) {
		t.Errorf("bias: got % x, want % x", got, want)
	}
	prompt, output := [][]int32{{1, 1}, {}, {7}}, [][]int32{{7, 1}, {2, 2}, nil}
	history := mustRequest(t, 3, 40, TokenHistory(prompt, output)).GetTokenHistory()
	got, err := PackTokenHistory(prompt, output)
	if err != nil {
		t.Fatal(err)
	}
	if want := packTokenHistory(history); !bytes.Equal(got, want) {
		t.Errorf("history: got % x, want % x", got, want)
	}
}

func TestListRegionsNameTheSliceAndReplaceInlineLists(t *testing.T) {
	req := mustRequest(t, 2, 40, LogitBias(map[int32]float32{1: 1}), LogitBiasRegion("lists", 8),
		TokenHistory(nil, [][]int32{{1}, {2}}), TokenHistoryRegion("lists", 1024))
	want := &samplerdv1.LogitBias{Region: &samplerdv1.RegionSlice{Region: "lists", Offset: 8}}
	if !proto.Equal(req.LogitBias, want) {
		t.Errorf("bias: got %v, want %v", req.LogitBias, want)
	}
	wantHistory := &samplerdv1.TokenHistory{Region: &samplerdv1.RegionSlice{Region: "lists", Offset: 1024}}
	if !proto.Equal(req.TokenHistory, wantHistory) {
		t.Errorf("history: got %v, want %v", req.TokenHistory, wantHistory)
	}
	// The last option wins: inline lists after a region drop the region.
	req = mustRequest(t, 2, 40, LogitBiasRegion("lists", 8), LogitBiasRows([]map[int32]float32{nil, {3: 1}}),
		TokenHistoryRegion("lists", 0), TokenHistory([][]int32{{5}, nil}, nil))
	if req.LogitBias.GetRegion() != nil || len(req.LogitBias.GetTokenIds()) != 1 {
		t.Errorf("bias after LogitBiasRows: got %v", req.LogitBias)
	}
	if req.TokenHistory.GetRegion() != nil || len(req.TokenHistory.GetTokenIds()) != 1 {
		t.Errorf("history after TokenHistory: got %v", req.TokenHistory)
	}
}
