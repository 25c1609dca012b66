package samplerd

import (
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"samplerd.dev/client/go/samplerdv1"
)

// Regression test: the first message of a chunked step was rebuilt field by field and lost the
// logits processors and the packed seeds and positions (the server then sampled without them).
func TestFirstChunkKeepsEveryFieldButTheRestOfTheData(t *testing.T) {
	data := []byte("0123456789abcdef")
	req := &samplerdv1.SampleRequest{
		RequestId: "step-3",
		Logits: &samplerdv1.Tensor{Dtype: samplerdv1.DType_DTYPE_FP32, Shape: []int64{2, 2},
			RowStride: 2, Data: &samplerdv1.Tensor_InlineData{InlineData: data}},
		Params:       []*samplerdv1.SamplingParams{{Temperature: proto.Float32(0.5)}},
		Device:       "0000:00:06.0",
		Logprobs:     &samplerdv1.LogprobOptions{TopN: 2},
		Output:       &samplerdv1.RegionSlice{Region: "out", Offset: 8},
		ReadyEvent:   []byte{1},
		DoneEvent:    []byte{2},
		RowSeeds:     []uint64{11, 22},
		RowPositions: []uint64{5, 6},
		LogitBias: &samplerdv1.LogitBias{RowOffsets: []uint32{0, 1, 1}, TokenIds: []int32{3},
			Biases: []float32{-1}},
		TokenHistory: &samplerdv1.TokenHistory{RowOffsets: []uint32{0, 0, 1},
			TokenIds: []int32{2}, OutputCounts: []uint32{1}, InPrompt: []bool{true}},
		TokenBitmask: &samplerdv1.TokenBitmask{
			Data: &samplerdv1.TokenBitmask_InlineWords{InlineWords: []byte{7, 0, 0, 0}}},
	}
	// A field added to the proto fails here until this request sets it, so that it is checked.
	for _, m := range []protoreflect.Message{req.ProtoReflect(), req.Logits.ProtoReflect()} {
		fields := m.Descriptor().Fields()
		for i := 0; i < fields.Len(); i++ {
			fd := fields.Get(i)
			if fd.ContainingOneof() == nil && !m.Has(fd) {
				t.Fatalf("the test request does not set %s: set it", fd.FullName())
			}
		}
	}

	first := firstChunk(req, 5)

	want := proto.Clone(req).(*samplerdv1.SampleRequest)
	want.Logits.Data = &samplerdv1.Tensor_InlineData{InlineData: data[:5]}
	if !proto.Equal(first, want) {
		t.Fatalf("first chunk's request:\n got %v\nwant %v", first, want)
	}
	if got := req.GetLogits().GetInlineData(); string(got) != string(data) {
		t.Fatalf("the caller's request was modified: inline data %q, want %q", got, data)
	}
}
